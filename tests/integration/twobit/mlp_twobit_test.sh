#!/usr/bin/env bash
# The MLP example (examples/mlp.yaml) trained twice through trellis-launch: as it is, and with
# `compression: {type: 2bit, threshold, warmupSteps}` added. Passes when the 2-bit run's test
# accuracy is within 1 percentage point of the uncompressed run's (both also reach the example's
# own target), the bytes the workers pushed dropped at least 15x and the bytes they pulled at
# least 6x (packed pull answers, on by default; their byte counters, as the RESULT lines report
# them: a ratio of bytes, not a timing).
#   mlp_twobit_test.sh <trellis-launch> <job.yaml> <threshold> <warmupSteps>
set -euo pipefail
launch=$1 job=$2 threshold=$3 warmup=$4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

sed 's/^  name: mlp$/  name: mlp-full/' "$job" > "$work/full.yaml"
{
  sed 's/^  name: mlp$/  name: mlp-2bit/' "$job"
  printf '  compression:\n    type: 2bit\n    threshold: %s\n    warmupSteps: %s\n' "$threshold" "$warmup"
} > "$work/2bit.yaml"

run() {  # run <name>
  if ! "$launch" "$work/$1.yaml" > "$work/$1.out" 2>&1; then
    cat "$work/$1.out"
    echo "FAIL: the $1 run failed"
    exit 1
  fi
  grep 'RESULT' "$work/$1.out" | sed "s/^/[$1] /"
}
run full
run 2bit

accuracy() { sed -n 's/.*RESULT: test accuracy \([0-9.]*\)%.*/\1/p' "$work/$1.out"; }
pushed() { sed -n 's/.*RESULT: pushed \([0-9]*\) B.*/\1/p' "$work/$1.out"; }
pulled() { sed -n 's/.*RESULT: pushed [0-9]* B, pulled \([0-9]*\) B.*/\1/p' "$work/$1.out"; }
a_full=$(accuracy full) a_2bit=$(accuracy 2bit) p_full=$(pushed full) p_2bit=$(pushed 2bit)
l_full=$(pulled full) l_2bit=$(pulled 2bit)
if [ -z "$a_full" ] || [ -z "$a_2bit" ] || [ -z "$p_full" ] || [ -z "$p_2bit" ] ||
   [ -z "$l_full" ] || [ -z "$l_2bit" ]; then
  echo "FAIL: RESULT lines missing"
  exit 1
fi
grep -q 'compression: .* B of gradients sent as' "$work/2bit.out" ||
  { echo "FAIL: the 2-bit run compressed nothing"; exit 1; }
awk -v af="$a_full" -v ab="$a_2bit" -v pf="$p_full" -v pb="$p_2bit" -v lf="$l_full" \
    -v lb="$l_2bit" 'BEGIN {
  printf "accuracy: full %.1f%%, 2bit %.1f%% (difference %.1f points, limit 1.0)\n", af, ab, af - ab
  printf "bytes pushed: full %.0f B, 2bit %.0f B (%.2fx less, need >= 15)\n", pf, pb, pf / pb
  printf "bytes pulled: full %.0f B, 2bit %.0f B (%.2fx less, need >= 6)\n", lf, lb, lf / lb
  ok = (af - ab <= 1.0) && (pf >= 15 * pb) && (lf >= 6 * lb)
  print ok ? "PASS" : "FAIL"
  exit ok ? 0 : 1
}'
