#!/usr/bin/env bash
# `make image`: the one Trellis runtime image, built without a container engine.
#
#   layer 1  Debian 12 + the runtime packages + the user trellis (scripts/image-base.sh; cached in
#            BUILD/image/base-<key>.tar while its definition does not change).
#   layer 2  Trellis from its own CPU-only build, BUILD/image/cmake (the host's CUDA is not in the
#            image; no tests), `cmake --install --strip` under /usr/local (cmake/Install.cmake): the
#            programs, the Python package (libtrellis inside its module), trellis-python, examples.
#   config   entrypoint trellis-agent, user 1000:1000, workdir /home/trellis, the
#            org.opencontainers.image.* labels; created = SOURCE_DATE_EPOCH (default: the commit
#            time), so the same inputs give the same layer and manifest digests.
#
# Writes BUILD/trellis-image.tar (oci-archive, tag = the chart's appVersion),
# BUILD/trellis-image.docker.tar (docker-archive tagged as the chart's default image, for
# `kind load image-archive` / `ctr images import`) and BUILD/image/bundle (`umoci unpack`: what the
# image tests and the test kubelet's --rootfs mode run). Unchanged inputs are not redone.
#
# Needs root (mmdebstrap --mode=root, umoci unpack), mmdebstrap, umoci and skopeo
# (scripts/install-deps.sh), and the Debian archive for the first base. Exit 77 (ctest's skip)
# without root or the archive, unless TRELLIS_IMAGE_REQUIRED=1 (CI), which fails instead.
# Usage: scripts/image.sh [BUILD_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/image-lib.sh"
build=$(mkdir -p "${1:-$root/build}" && cd "${1:-$root/build}" && pwd)
out=$build/image
mkdir -p "$out"
t_start=$(date +%s)
[ "$(id -u)" = 0 ] || cannot "needs root (mmdebstrap --mode=root, umoci unpack)"
for tool in mmdebstrap umoci skopeo; do
  command -v $tool >/dev/null || fail "$tool not found: run scripts/install-deps.sh"
done

version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' "$root/charts/trellis/Chart.yaml")
repository=$(sed -n 's/^  repository: *//p' "$root/charts/trellis/values.yaml" | head -1)
[ -n "$version" ] && [ -n "$repository" ] || fail "no appVersion / image.repository in charts/trellis"
revision=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)
epoch=${SOURCE_DATE_EPOCH:-$(git -C "$root" log -1 --format=%ct 2>/dev/null || echo 0)}

base_info=$("$root/scripts/image-base.sh" "$out")
read -r base base_epoch <<<"$base_info"

ib=$out/cmake
# Release at -O2 (the main build's optimisation) without -g: the install strips debug info anyway,
# and not making it saves a fifth of the image's compile time, the longest step of CI.
if ! { cmake -S "$root" -B "$ib" -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=-O2 -DNDEBUG" \
         -DCMAKE_C_FLAGS_RELEASE="-O2 -DNDEBUG" -DTRELLIS_CUDA=OFF \
         -DTRELLIS_BUILD_TESTS=OFF -DTRELLIS_BUILD_BENCH=OFF && cmake --build "$ib" -j "$(nproc)"; } >"$out/build.log" 2>&1; then
  tail -30 "$out/build.log" >&2
  fail "the image's build failed (log: $out/build.log)"
fi
stage=$out/stage
rm -rf "$stage"
cmake --install "$ib" --prefix "$stage/usr/local" --strip >/dev/null
layer_tar "$stage" "$epoch" "$out/trellis.tar"
rm -rf "$stage"

labels=(
  "org.opencontainers.image.title=trellis"
  "org.opencontainers.image.description=Trellis distributed training: operator, scheduler, agent, parameter server, launcher, Python binding"
  "org.opencontainers.image.source=https://github.com/trellis-ml/trellis"
  "org.opencontainers.image.version=$version"
  "org.opencontainers.image.revision=$revision"
  "org.opencontainers.image.created=$(iso "$epoch")"
  "org.opencontainers.image.base.name=docker.io/library/debian:bookworm"
)
inputs=$( (sha256sum "$base" "$out/trellis.tar" | cut -d' ' -f1; printf '%s\n' "$version" "$repository" "$epoch" "${labels[@]}") |
         sha256sum | cut -d' ' -f1)
oci=$out/oci
if [ "$(cat "$out/oci.stamp" 2>/dev/null)" != "$inputs" ] || [ ! -f "$build/trellis-image.tar" ] ||
   [ ! -f "$build/trellis-image.docker.tar" ]; then
  rm -rf "$oci" "$out/oci.stamp"
  umoci init --layout "$oci"
  umoci new --image "$oci:$version"
  umoci raw add-layer --image "$oci:$version" --history.created "$(iso "$base_epoch")" \
    --history.created_by "scripts/image-base.sh: mmdebstrap --variant=apt bookworm, scripts/image-packages.txt" "$base"
  umoci raw add-layer --image "$oci:$version" --history.created "$(iso "$epoch")" \
    --history.created_by "cmake -DTRELLIS_CUDA=OFF; cmake --install --prefix /usr/local --strip" "$out/trellis.tar"
  cfg=(--no-history --created "$(iso "$epoch")" --architecture amd64 --os linux
       --config.user 1000:1000 --config.workingdir /home/trellis --config.entrypoint trellis-agent
       --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
       --config.env LANG=C.UTF-8)
  for l in "${labels[@]}"; do
    cfg+=(--config.label "$l" --manifest.annotation "$l")
  done
  umoci config --image "$oci:$version" "${cfg[@]}"
  umoci gc --layout "$oci"
  layer_tar "$oci" "$epoch" "$build/trellis-image.tar.tmp"
  mv "$build/trellis-image.tar.tmp" "$build/trellis-image.tar"
  rm -f "$build/trellis-image.docker.tar"
  skopeo copy --quiet "oci:$oci:$version" "docker-archive:$build/trellis-image.docker.tar:$repository:$version"
  echo "$inputs" >"$out/oci.stamp"
fi

manifest=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["manifests"][0]["digest"])' "$oci/index.json")
if [ "$(cat "$out/bundle.stamp" 2>/dev/null)" != "$manifest" ] || [ ! -d "$out/bundle/rootfs" ]; then
  rm -rf "$out/bundle" "$out/bundle.stamp"
  umoci unpack --image "$oci:$version" "$out/bundle" >/dev/null
  echo "$manifest" >"$out/bundle.stamp"
fi

layers=$(python3 -c 'import json,sys
d=sys.argv[1]; m=json.load(open(d+"/index.json"))["manifests"][0]["digest"].split(":")[1]
print(" ".join(l["digest"] for l in json.load(open(d+"/blobs/sha256/"+m))["layers"]))' "$oci")
say "$repository:$version (revision $revision)"
say "manifest $manifest"
say "layers   $layers"
say "oci-archive    $build/trellis-image.tar ($(du -m "$build/trellis-image.tar" | cut -f1) MiB)"
say "docker-archive $build/trellis-image.docker.tar ($(du -m "$build/trellis-image.docker.tar" | cut -f1) MiB)"
say "unpacked       $out/bundle/rootfs ($(du -sm "$out/bundle/rootfs" | cut -f1) MiB); $(( $(date +%s) - t_start )) s"
