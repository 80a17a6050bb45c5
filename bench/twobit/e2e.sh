#!/usr/bin/env bash
# bench/twobit end to end: step rate of an FC-heavy model (trellis-bench-fc: big fully connected
# layers, simulated compute) with 2 workers and 2 parameter servers, each process on its own
# shaped test host (bench/common/testhosts.sh: namespaces, 1 Gbit/s per host and direction),
# three times: float32, 2-bit pushes with float32 answers (packedPulls: false), and 2-bit with
# packed answers (the default); prints each row and its ratios against float32.
#
#   bench/twobit/e2e.sh [--bin build/bin] [--prefix tb5] [--rate 1gbit] [--transport tcp]
#                       [--layers N,N,...] [--steps 8] [--compute-ms 20]
# Needs root (namespaces, tc). Hosts: workers on <prefix>-h0/h1 (198.18.0.1-2), scheduler and
# server 0 on h2 (198.18.0.3), server 1 on h3 (198.18.0.4). Everything is torn down at exit.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
bin=$here/../../build/bin
prefix=tb5
rate=1gbit
transport=tcp
layers=8388608,8388608   # 2 x 32 MiB of float32 gradients
steps=8
compute_ms=20
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --prefix) prefix=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --transport) transport=$2; shift 2 ;;
    --layers) layers=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --compute-ms) compute_ms=$2; shift 2 ;;
    *) echo "e2e: unknown argument $1" >&2; exit 2 ;;
  esac
done
bin=$(cd "$bin" && pwd)
hosts=$here/../common/testhosts.sh
work=$(mktemp -d)
pids=()

cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  "$hosts" down --prefix "$prefix" || true
  rm -rf "$work"
}
trap cleanup EXIT

"$hosts" up --prefix "$prefix" --hosts 4 --rate "$rate" >/dev/null
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$work/token"
chmod 600 "$work/token"

# run_job <name> <compression yaml or empty>: prints "steps_per_s pushed_bytes pulled_bytes".
run_job() {
  local name=$1 compression=$2 job=$work/$1.yaml
  cat > "$job" <<YAML
apiVersion: trellis.io/v1alpha1
kind: TrainingJob
metadata:
  name: fc-$name
spec:
  servers:
    replicas: 2
  workers:
    replicas: 2
    command: [trellis-bench-fc]
  transport: $transport
  sliceBytes: 4194304
$compression
YAML
  pids=()
  rm -f "$work/port"
  ip netns exec "$prefix-h2" "$bin/trellis-scheduler" --job-file "$job" --host 198.18.0.3 --port 0 \
    --port-file "$work/port" --token-file "$work/token" > "$work/$name-scheduler.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do [ -s "$work/port" ] && break; sleep 0.1; done
  [ -s "$work/port" ] || { cat "$work/$name-scheduler.log"; echo "e2e: no scheduler" >&2; exit 1; }
  local sched=198.18.0.3:$(cat "$work/port")
  start() {  # start <role> <index> <host index> [command...]
    local role=$1 i=$2 h=$3
    shift 3
    ip netns exec "$prefix-h$h" env PATH="$bin:$PATH" TRELLIS_JOB="fc-$name" \
      TRELLIS_SCHEDULER="$sched" TRELLIS_ROLE="$role" TRELLIS_NUM_SERVERS=2 TRELLIS_NUM_WORKERS=2 \
      TRELLIS_TOKEN_FILE="$work/token" TRELLIS_POD_NAME="fc-$name-$role-$i" \
      TRELLIS_HOST="198.18.0.$((h + 1))" \
      "$bin/trellis-agent" --restart-policy Never --backoff-limit 0 --stop-grace-ms 2000 "$@" \
      > "$work/$name-$role-$i.log" 2>&1 &
    pids+=($!)
  }
  start server 0 2
  start server 1 3
  start worker 0 0 -- trellis-bench-fc --layers="$layers" --steps="$steps" --compute-ms="$compute_ms"
  local w0=${pids[-1]}
  start worker 1 1 -- trellis-bench-fc --layers="$layers" --steps="$steps" --compute-ms="$compute_ms"
  local w1=${pids[-1]}
  if ! wait "$w0" || ! wait "$w1"; then
    tail -n 20 "$work/$name"-*.log >&2
    echo "e2e: the $name run failed" >&2
    exit 1
  fi
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  sed -n 's/.*RESULT: steps_per_s \([0-9.]*\) pushed_bytes \([0-9]*\) pulled_bytes \([0-9]*\).*/\1 \2 \3/p' \
    "$work/$name-worker-0.log"
}

twobit="  compression:
    type: 2bit
    threshold: 0.5
    warmupSteps: 0"
read -r full_rate full_push full_pull < <(run_job full "")
read -r tb_rate tb_push tb_pull < <(run_job 2bit "$twobit
    packedPulls: false")
read -r pk_rate pk_push pk_pull < <(run_job 2bit-packed "$twobit
    packedPulls: true")

echo "bench/twobit end to end: 2 workers x 2 servers, one test host each, $rate per host and"
echo "direction ($prefix-h*), transport $transport, layers $layers (float32), compute ${compute_ms} ms/step,"
echo "$steps timed steps after 2 warm-up steps; worker 0's figures (bytes: all steps, on the wire);"
echo "x: ratio against float32 in this run (step rate: faster; bytes: less)"
row() {  # row <name> <rate> <pushed> <pulled>
  awk -v n="$1" -v r="$2" -v pu="$3" -v pl="$4" -v r0="$full_rate" -v pu0="$full_push" \
      -v pl0="$full_pull" \
    'BEGIN { printf "%-24s %8.4f %7.2fx %12.0f %7.2fx %12.0f %7.2fx\n", n, r, r / r0, pu, pu0 / pu, pl, pl0 / pl }'
}
printf '%-24s %8s %8s %12s %8s %12s %8s\n' "run" "steps/s" "" "bytes pushed" "" "bytes pulled" ""
row "float32" "$full_rate" "$full_push" "$full_pull"
row "2bit, float32 answers" "$tb_rate" "$tb_push" "$tb_pull"
row "2bit, packed answers" "$pk_rate" "$pk_push" "$pk_pull"
