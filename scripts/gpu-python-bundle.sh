#!/usr/bin/env bash
# Packs the Python binding and the job binaries (trellis-launch, -scheduler, -pserver, -agent)
# for a GPU machine whose Python differs from Debian's (a CUDA PyTorch in a venv, say) and which
# has none of the build's packages: the binding's module is compiled again against that Python's
# headers and pybind11 (copied from that machine), then the binaries, the module and every shared
# library they load except glibc's, the driver's libcuda and NCCL go into one folder, with
# run.sh, which runs the Python tests (tests/python: CPU and CUDA) under the machine's python3.
#
#   scripts/gpu-python-bundle.sh HEADERS_DIR [BUILD_DIR=build] [BUNDLE_DIR=.gpu-python]
#     HEADERS_DIR: the target's Python include dir and pybind11 include dir, unpacked under it
#     with their absolute paths (tar czf h.tgz -C / usr/include/python3.12 <pybind11>/include);
#     a missing multiarch pyconfig.h is taken from this machine's Python 3 (same x86-64 ABI).
#   then, on the GPU machine, in a checkout of this tree: OUT=/some/dir BUNDLE_DIR/run.sh
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
headers=${1:?usage: gpu-python-bundle.sh HEADERS_DIR [BUILD_DIR] [BUNDLE_DIR]}
headers=$(cd "$headers" && pwd)
build=$(realpath -m "${2:-$root/build}")
bundle=$(realpath -m "${3:-$root/.gpu-python}")
binaries=(trellis-launch trellis-scheduler trellis-pserver trellis-agent)

pyinc=$(find "$headers" -name Python.h -path '*python3.*' -printf '%h\n' | head -1)
pbinc=$(find "$headers" -path '*pybind11/include/pybind11/pybind11.h' -printf '%h\n' | head -1)
[[ -n $pyinc && -n $pbinc ]] || { echo "gpu-python-bundle: no Python.h or pybind11 under $headers" >&2; exit 1; }
pbinc=$(dirname "$pbinc")
pyver=$(basename "$pyinc")                       # python3.12
suffix=".cpython-${pyver#python}-x86_64-linux-gnu.so"
suffix=${suffix/3./3}                            # .cpython-312-x86_64-linux-gnu.so
# Ubuntu's and Debian's Python.h include <x86_64-linux-gnu/pythonX.Y/pyconfig.h>.
multiarch=$headers/usr/include/x86_64-linux-gnu/$pyver
if grep -q 'x86_64-linux-gnu' "$pyinc/pyconfig.h" && [[ ! -f $multiarch/pyconfig.h ]]; then
  mkdir -p "$multiarch"
  cp "$(ls /usr/include/x86_64-linux-gnu/python3.*/pyconfig.h | head -1)" "$multiarch/"
fi

cmake --build "$build" -j "${JOBS:-2}" --target trellis_python_module "${binaries[@]}"
link=$build/worker-lib/python/CMakeFiles/trellis_python_module.dir/link.txt
flags=$build/worker-lib/python/CMakeFiles/trellis_python_module.dir/flags.make
[[ -f $link && -f $flags ]] || { echo "gpu-python-bundle: $build has no Python binding" >&2; exit 1; }

if [[ -e $bundle && ! -f $bundle/MANIFEST ]]; then
  echo "gpu-python-bundle: $bundle exists and is not a bundle (no MANIFEST); not touching it" >&2
  exit 1
fi
rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/lib" "$bundle/python/trellis"

# The module: this build's compile flags with the target's headers instead of Debian's Python's;
# the link line CMake wrote, with only the output renamed.
includes=$(sed -n 's/^CXX_INCLUDES = //p' "$flags" | sed -E 's#-isystem /usr/include/python3\.[0-9]+##')
cxxflags=$(sed -n 's/^CXX_FLAGS = //p' "$flags")
obj=$bundle/module.o
# shellcheck disable=SC2086
c++ -Dtrellis_python_module_EXPORTS $includes -isystem "$pbinc" -isystem "$pyinc" \
    -isystem "$headers/usr/include" $cxxflags -c "$root/worker-lib/python/src/module.cc" -o "$obj"
out=$bundle/python/trellis/_trellis$suffix
linkcmd=$(sed -E "s#-o [^ ]*_trellis[^ ]*\.so#-o $out#; s# CMakeFiles/trellis_python_module.dir/src/module.cc.o# $obj#" "$link")
(cd "$build/worker-lib/python" && eval "$linkcmd")
rm -f "$obj"
strip --strip-unneeded "$out"  # 42 MiB of debug info otherwise; the device tool carries 64
cp "$root"/worker-lib/python/trellis/*.py "$bundle/python/trellis/"

for b in "${binaries[@]}"; do
  strip --strip-unneeded -o "$bundle/bin/$b" "$build/bin/$b"
done
cat >"$bundle/bin/trellis-python" <<'EOF'
#!/bin/sh
# The machine's python3 with this bundle's `trellis` package importable.
here=$(dirname "$(readlink -f "$0")")
PYTHONPATH="$here/../python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONPATH
exec python3 "$@"
EOF
chmod +x "$bundle/bin/trellis-python"

skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|libutil\.so|libresolv\.so|libcuda\.so|libnccl\.so|libpython)'
while read -r name path; do
  [[ $name =~ $skip ]] && continue
  [[ -n $path && $path != "not" ]] || { echo "gpu-python-bundle: $name not found here" >&2; exit 1; }
  [[ -e "$bundle/lib/$name" ]] || strip --strip-unneeded -o "$bundle/lib/$name" "$(readlink -f "$path")"
done < <(for f in "${binaries[@]/#/$bundle/bin/}" "$out"; do ldd "$f"; done |
         awk '$2 == "=>" { print $1, $3 }' | sort -u)

cat >"$bundle/run.sh" <<'EOF'
#!/usr/bin/env bash
# Runs the Python tests (tests/python) with this bundle under the machine's python3; the CUDA
# tests run where torch sees a GPU. Logs and JUnit XML go to $OUT (default ./gpu-python-out).
set -u
here=$(cd "$(dirname "$0")" && pwd)
tree=$(cd "$here/.." && pwd)
OUT=${OUT:-$PWD/gpu-python-out}
mkdir -p "$OUT"
nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=$here/lib${nccl:+:$nccl}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export TRELLIS_BUILD_DIR=$here PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__,
            "cuda", torch.cuda.is_available())' | tee "$OUT/versions.txt"
cd "$tree"
timeout -k 10 "${PYTEST_LIMIT:-480}" python3 -m pytest -p no:cacheprovider -rs -q \
    --junitxml="$OUT/pytest.xml" "${@:-tests/python}" 2>&1 | tee "$OUT/pytest.log"
exit "${PIPESTATUS[0]}"
EOF
chmod +x "$bundle/run.sh"
{
  echo "$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown) built $(date -u +%FT%TZ) for $pyver"
  (cd "$bundle" && find bin python lib -type f | sort)
} >"$bundle/MANIFEST"
echo "gpu-python-bundle: $bundle ($(du -sh "$bundle" | cut -f1)): module for $pyver, $(ls "$bundle/lib" | wc -l) libraries"
