#!/usr/bin/env bash
# Installs the Debian packages Trellis needs to build and test, only those missing.
# Idempotent and quiet when everything is present; runs `apt-get update` only when it must install.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libyaml-cpp-dev prometheus-cpp-dev libssl-dev libcpprest-dev
  prometheus  # the server and promtool: the metrics, dashboard and alert-rule tests
  libgtest-dev libgmock-dev
  clang-14 libclang-rt-14-dev
  python3-dev pybind11-dev python3-numpy python3-torch python3-pytest python3-yaml
  etcd-server kubectl xz-utils openssl  # the real-API-server tests (tests/k8s_real, KUBEBUILDER_ASSETS)
  mmdebstrap umoci skopeo  # make image (scripts/image.sh), built by the tests too (tests/image)
  # the real-node tier (tests/k8s_node): containerd + runc under the kubelet, the CNI bridge, the
  # cluster DNS, kube-proxy's iptables, the namespace (unshare/nsenter), a static busybox image
  containerd runc containernetworking-plugins dnsmasq-base iptables conntrack iproute2 util-linux busybox-static
)

# Helm 3 CLI for the chart tests, project-local (build-tools/helm); optional: those tests skip without it.
"$(dirname "$0")/../charts/install-helm.sh" >/dev/null 2>&1 || echo "install-deps: helm not installed; chart tests will skip" >&2

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
