#!/usr/bin/env bash
# Makes the KUBEBUILDER_ASSETS folder of the real-API-server tests (tests/k8s_real) and prints it:
# the xz-compressed Kubernetes server binaries of shared/k8s (../shared/k8s beside the clone, or
# ../../shared/k8s beside a worktree folder) unpacked into BUILD_DIR/k8s-assets, etcd (Debian
# etcd-server) linked beside them. Prints nothing when there is no shared/k8s or no etcd.
# Usage: scripts/k8s-assets.sh [BUILD_DIR]   (default: build)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
src=""
for d in "$root/../shared/k8s" "$root/../../shared/k8s"; do
  if [ -f "$d/kube-apiserver.xz" ]; then
    src=$(cd "$d" && pwd)
    break
  fi
done
etcd=$(command -v etcd || true)
if [ -z "$src" ] || [ -z "$etcd" ]; then
  exit 0
fi
out="$(mkdir -p "$build/k8s-assets" && cd "$build/k8s-assets" && pwd)"
for f in "$src"/*.xz; do
  bin="$out/$(basename "$f" .xz)"
  if [ ! -x "$bin" ] || [ "$f" -nt "$bin" ]; then
    xz -dc "$f" > "$bin.tmp"
    chmod +x "$bin.tmp"
    mv "$bin.tmp" "$bin"
  fi
done
ln -sf "$etcd" "$out/etcd"
echo "$out"
