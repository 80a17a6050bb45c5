#!/usr/bin/env bash
# The project's own test hosts for rate-limited benchmarks: N network namespaces, each with one
# shaped link to a switch (a Linux bridge in a hub namespace), like N machines with one NIC each.
#
#   bench/common/testhosts.sh up   --prefix p3 --hosts 4 --rate 1gbit [--delay 50us] [--cpu 0.5]
#   ip netns exec p3-h0 <command>          # runs on host 0, address 198.18.0.1
#   bench/common/testhosts.sh down --prefix p3
#   bench/common/testhosts.sh check        # exit 0 if namespaces + tc work here (needs root)
#
# Host i is namespace <prefix>-h<i> with address 198.18.0.<i+1>/24 on eth0. Every link is shaped
# in both directions (tbf on the host's egress and on the switch port's egress), so each host
# sends and receives at most --rate, whatever the others do. 198.18.0.0/15 is the range reserved
# for benchmarking (RFC 2544); traffic never leaves these namespaces. Idempotent: `up` first
# removes what an earlier run with the same prefix left.
#
# --cpu F also gives each host its own CPU budget: a cgroup (v1 cpu controller)
# /sys/fs/cgroup/cpu/<prefix>-h<i> with F cores (CFS quota), so that processes of different
# hosts do not take each other's CPU, as on separate machines. Whoever starts a process on a host
# puts it there (bench/p3/netns_job.cc and bench/pytorch/bench_models.py do when the cgroup
# exists), before entering the namespace (ip netns exec mounts its own /sys):
#   sh -c 'echo $$ > /sys/fs/cgroup/cpu/<prefix>-h<i>/tasks && exec "$@"' sh ip netns exec <prefix>-h<i> <command>
set -euo pipefail

cmd=${1:-}
shift || true
prefix=trellis
hosts=2
rate=1gbit
delay=""
cpu=""
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix=$2; shift 2 ;;
    --hosts) hosts=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --delay) delay=$2; shift 2 ;;
    --cpu) cpu=$2; shift 2 ;;
    *) echo "testhosts: unknown argument $1" >&2; exit 2 ;;
  esac
done

hub="${prefix}-hub"

# tbf needs a bucket of at least one (GSO) packet and about a millisecond of traffic at the rate.
burst_for() {
  case "$1" in
    *gbit) echo $(( ${1%gbit} * 256 ))kb ;;
    *mbit) b=$(( ${1%mbit} / 4 )); [ "$b" -lt 96 ] && b=96; echo "${b}kb" ;;
    *) echo 512kb ;;
  esac
}

shape() {  # shape <netns> <dev>
  local ns=$1 dev=$2 burst
  burst=$(burst_for "$rate")
  if [ -n "$delay" ]; then
    ip netns exec "$ns" tc qdisc add dev "$dev" root handle 1: netem delay "$delay"
    ip netns exec "$ns" tc qdisc add dev "$dev" parent 1: handle 2: tbf rate "$rate" burst "$burst" latency 100ms
  else
    ip netns exec "$ns" tc qdisc add dev "$dev" root tbf rate "$rate" burst "$burst" latency 100ms
  fi
}

down() {
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^${prefix}-(hub|h[0-9]+)$" || true); do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
  for cg in /sys/fs/cgroup/cpu/"${prefix}"-h*; do
    [ -d "$cg" ] || continue
    xargs -r kill -9 < "$cg/tasks" 2>/dev/null || true
    for _ in 1 2 3 4 5 6 7 8 9 10; do rmdir "$cg" 2>/dev/null && break; sleep 0.1; done
  done
}

up() {
  down
  ip netns add "$hub"
  ip -n "$hub" link set lo up
  ip -n "$hub" link add br0 type bridge
  ip -n "$hub" link set br0 up
  for ((i = 0; i < hosts; i++)); do
    local ns="${prefix}-h${i}"
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip link add "${prefix}v${i}" type veth peer name "${prefix}p${i}"
    ip link set "${prefix}v${i}" netns "$ns"
    ip link set "${prefix}p${i}" netns "$hub"
    ip -n "$ns" link set "${prefix}v${i}" name eth0
    ip -n "$ns" addr add "198.18.0.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$hub" link set "${prefix}p${i}" master br0
    ip -n "$hub" link set "${prefix}p${i}" up
    shape "$ns" eth0
    shape "$hub" "${prefix}p${i}"
    if [ -n "$cpu" ]; then
      local cg="/sys/fs/cgroup/cpu/${ns}"
      mkdir -p "$cg"
      echo 100000 > "$cg/cpu.cfs_period_us"
      awk -v c="$cpu" 'BEGIN { printf "%d\n", c * 100000 }' > "$cg/cpu.cfs_quota_us"
    fi
  done
}

check() {
  [ "$(id -u)" -eq 0 ] || { echo "testhosts: needs root" >&2; return 1; }
  command -v tc >/dev/null || { echo "testhosts: tc (iproute2) missing" >&2; return 1; }
  local p="trchk$$"
  if ! "$0" up --prefix "$p" --hosts 1 --rate 100mbit >/dev/null 2>&1; then
    "$0" down --prefix "$p" >/dev/null 2>&1 || true
    echo "testhosts: network namespaces or tc are not permitted here" >&2
    return 1
  fi
  "$0" down --prefix "$p"
}

case "$cmd" in
  up) up ;;
  down) down ;;
  check) check ;;
  *) echo "usage: testhosts.sh up|down|check [--prefix P] [--hosts N] [--rate R] [--delay D] [--cpu F]" >&2; exit 2 ;;
esac
