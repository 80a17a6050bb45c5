#!/usr/bin/env bash
# Packs the GPU tests and the GPU benchmark of a CUDA build into a folder that runs on a machine
# with a GPU but none of the build's packages (no gRPC, yaml-cpp, gtest...): the binaries,
# stripped, plus every shared library they load except glibc's, the driver's libcuda and NCCL
# (both must come from the GPU machine), and run.sh, which runs them and writes logs to $OUT.
#
#   scripts/gpu-bundle.sh [BUILD_DIR=build] [BUNDLE_DIR=.gpu]
#   then, on the GPU machine: OUT=/some/dir BUNDLE_DIR/run.sh
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
bundle=${2:-$root/.gpu}
# The CUDA 2-bit codec test, the NCCL local group test and the benchmark with its GPU rows.
targets=(codec_twobit_cuda_test nccl_local_group_test bench_twobit)

if [[ ! -f $build/CMakeCache.txt ]]; then
  echo "gpu-bundle: $build is not a configured build (run make build first)" >&2
  exit 1
fi
if ! grep -q '^TRELLIS_NCCL_LIBRARY:' "$build/CMakeCache.txt"; then
  echo "gpu-bundle: $build was configured without CUDA (nvcc at /usr/local/cuda/bin/nvcc?)" >&2
  exit 1
fi
# Cheap when already built; builds only what the bundle needs otherwise.
cmake --build "$build" -j "${JOBS:-2}" --target "${targets[@]}"
for t in "${targets[@]}"; do
  [[ -x "$build/bin/$t" ]] || { echo "gpu-bundle: $build/bin/$t missing" >&2; exit 1; }
done

# Replaces an earlier bundle only, never some other folder named by mistake.
if [[ -e $bundle && ! -f $bundle/MANIFEST ]]; then
  echo "gpu-bundle: $bundle exists and is not a bundle (no MANIFEST); not touching it" >&2
  exit 1
fi
rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/lib"
for t in "${targets[@]}"; do
  strip --strip-unneeded -o "$bundle/bin/$t" "$build/bin/$t"
done

# Every library ldd resolves, minus the ones the GPU machine must supply itself.
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|libutil\.so|libresolv\.so|libcuda\.so|libnccl\.so)'
missing=0
while read -r name path; do
  [[ $name =~ $skip ]] && continue
  if [[ -z $path || $path == "not" ]]; then
    echo "gpu-bundle: $name is not found on this machine" >&2
    missing=1
    continue
  fi
  # Under its soname, dereferenced: the loader asks for exactly that name.
  [[ -e "$bundle/lib/$name" ]] || strip --strip-unneeded -o "$bundle/lib/$name" "$(readlink -f "$path")"
done < <(for t in "${targets[@]}"; do ldd "$build/bin/$t"; done |
         awk '$2 == "=>" { print $1, $3 } $2 != "=>" { n = $1; sub(".*/", "", n); print n, $1 }' |
         sort -u)
((missing == 0)) || exit 1

cat >"$bundle/run.sh" <<'EOF'
#!/usr/bin/env bash
# Runs the bundled GPU tests and benchmark; logs and gtest XML go to $OUT (default ./gpu-out).
# Every step runs even if one before it failed; the exit status says whether all passed.
set -u
here=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1
echo "== bundle: $(cat "$here/MANIFEST" 2>/dev/null | head -1)"
echo "== $(date -u) on $(uname -srm), $(ldd --version 2>&1 | head -1)"

gpus=0
if command -v nvidia-smi >/dev/null; then
  nvidia-smi 2>&1 | tee "$OUT/nvidia-smi.txt"
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
else
  echo "== nvidia-smi not found: expect every GPU test to skip"
fi

# NCCL comes from the machine (a pip nvidia-nccl wheel, a toolkit...): the first libnccl.so.2.
nccl=""
for d in /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib /usr/local/cuda/lib64 \
         /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu; do
  [[ -e $d/libnccl.so.2 ]] && { nccl=$d/libnccl.so.2; break; }
done
if [[ -z $nccl ]]; then
  nccl=$(timeout 90 find / \( -path /proc -o -path /sys -o -path /dev \) -prune -o \
         -name 'libnccl.so*' -xtype f -print 2>/dev/null | sort | head -1)
fi
libpath=$here/lib
if [[ -n $nccl ]]; then
  echo "== NCCL: $nccl"
  if [[ $(basename "$nccl") != libnccl.so.2 ]]; then
    # Only a differently named copy: give the loader the name it asks for.
    mkdir -p "$OUT/nccl-lib" && ln -sf "$(readlink -f "$nccl")" "$OUT/nccl-lib/libnccl.so.2"
    libpath=$libpath:$OUT/nccl-lib
  else
    libpath=$libpath:$(dirname "$nccl")
  fi
else
  echo "== NCCL: no libnccl.so* on this machine"
fi
export LD_LIBRARY_PATH=$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}

failed=()
for b in "$here"/bin/*; do
  echo "== ldd $(basename "$b")"
  ldd "$b" | grep -v -E 'linux-vdso|ld-linux'
done | tee "$OUT/ldd.txt"

# A gtest binary, bounded; one whose libraries do not load is reported, not run.
run_test() {
  local name=$1 limit=$2
  echo "== $name"
  if ldd "$here/bin/$name" | grep -q 'not found'; then
    echo "== $name SKIPPED: $(ldd "$here/bin/$name" | grep 'not found' | tr -s ' \t' ' ')"
    failed+=("$name(libraries)")
    return
  fi
  timeout -k 10 "$limit" "$here/bin/$name" --gtest_output="xml:$OUT/$name.xml" \
    --gtest_color=no 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "== $name exit $rc: $(grep -c 'result="completed"' "$OUT/$name.xml" 2>/dev/null) ran," \
       "$(grep -c 'result="skipped"' "$OUT/$name.xml" 2>/dev/null) skipped"
  ((rc == 0)) || failed+=("$name(exit $rc)")
  # A skip for want of a device while nvidia-smi lists one means CUDA did not load.
  if ((gpus > 0)) && grep -q 'no CUDA device\|found 0' "$OUT/$name.log"; then
    failed+=("$name(nvidia-smi lists $gpus GPUs, CUDA saw none)")
  fi
}
run_test codec_twobit_cuda_test 60
# G = 1 runs every NCCL call; G = 2 on NCCL needs 2 devices (NCCL refuses two ranks on one GPU)
# and skips with a message on a one-GPU machine, where G = 2 through OpenLocalGroup must fall
# back to shared memory.
run_test nccl_local_group_test 90

# Benchmark: CPU rows (64 MiB, one core) with GPU rows of 256 MiB, then GPU rows of 1 GiB (CPU
# rows of 1 MiB only, to keep the run short); ~0.5 s per measurement.
for sizes in "64M 256M" "1M 1G"; do
  read -r cb gb <<<"$sizes"
  echo "== bench_twobit --bytes=$cb --gpu-bytes=$gb"
  timeout -k 10 60 "$here/bin/bench_twobit" --bytes=$cb --gpu-bytes=$gb --seconds=0.5 2>&1 |
    tee "$OUT/bench_twobit_$gb.txt"
  rc=${PIPESTATUS[0]}
  echo "== bench_twobit exit $rc"
  ((rc == 0)) || failed+=("bench_twobit-$gb(exit $rc)")
  grep -q 'GPU rows failed' "$OUT/bench_twobit_$gb.txt" && failed+=("bench_twobit-$gb(GPU rows)")
  if ((gpus > 0)) && grep -q 'no CUDA device' "$OUT/bench_twobit_$gb.txt"; then
    failed+=("bench_twobit-$gb(nvidia-smi lists $gpus GPUs, CUDA saw none)")
  fi
done

if ((${#failed[@]})); then
  echo "== FAILED: ${failed[*]}"
  exit 1
fi
echo "== all passed (skips counted above; without a GPU everything skips)"
EOF
chmod +x "$bundle/run.sh"

{
  echo "$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown) built $(date -u +%FT%TZ)"
  for t in "${targets[@]}"; do echo "bin/$t"; done
  (cd "$bundle" && ls lib | sed 's|^|lib/|')
} >"$bundle/MANIFEST"
echo "gpu-bundle: $bundle ($(du -sh "$bundle" | cut -f1)): $(ls "$bundle/bin" | tr '\n' ' ')+ $(ls "$bundle/lib" | wc -l) libraries"
