#!/usr/bin/env bash
# The MLP demo (trellis-mlp, `make run`) in one of the server modes the job spec offers,
# through trellis-launch (real scheduler, agents, servers, workers on loopback). Passes when the
# job succeeds and its RESULT line says the demo's own target accuracy was reached.
#   mlp_modes_test.sh <trellis-launch> <job.yaml> aggregate
#   mlp_modes_test.sh <trellis-launch> <job.yaml> update <optimizer type> <learningRate> [momentum]
set -euo pipefail
launch=$1 job=$2 mode=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

{
  # The job file's spec is its last block: serverMode (and optimizer) are appended to it.
  sed -e "s/^  name: \(.*\)\$/  name: \1-$mode/" -e '/^  serverMode:/d' "$job"
  printf '  serverMode: %s\n' "$mode"
  if [ "$mode" = update ]; then
    printf '  optimizer:\n    type: %s\n    learningRate: %s\n' "$4" "$5"
    [ -z "${6:-}" ] || printf '    momentum: %s\n' "$6"
  fi
} > "$work/job.yaml"

if ! "$launch" "$work/job.yaml" > "$work/out" 2>&1; then
  cat "$work/out"
  echo "FAIL: the $mode run failed"
  exit 1
fi
grep 'RESULT' "$work/out"
if ! grep -q 'RESULT: test accuracy [0-9.]*% (target [0-9.]*%) -- reached' "$work/out"; then
  cat "$work/out"
  echo "FAIL: the $mode run did not reach the demo's target accuracy"
  exit 1
fi
if [ "$mode" = update ] && ! grep -q 'serverMode update: the servers run' "$work/out"; then
  echo "FAIL: the demo did not train in update mode"
  exit 1
fi
echo PASS
