#!/usr/bin/python3
"""What idle (never authenticated) connections cost a parameter server: its threads and RSS
before and after N connections that open the data port and say nothing.

Runs a standalone trellis-pserver (no scheduler) on loopback, opens the connections from this
process, waits, reads /proc/<pid>/status, and prints the figures. Compare two builds by
passing their binaries:

  bench/idle_connections/idle_connections.py build/bin/trellis-pserver [other/trellis-pserver]
"""
import argparse
import os
import re
import resource
import socket
import subprocess
import sys
import tempfile
import time

JOB = """apiVersion: trellis.io/v1alpha1
kind: TrainingJob
metadata:
  name: idle-bench
spec:
  servers: {replicas: 1}
  workers: {replicas: 1, command: ["true"]}
"""


def status(pid):
    with open(f"/proc/{pid}/status") as f:
        text = f.read()
    threads = int(re.search(r"^Threads:\s+(\d+)", text, re.M).group(1))
    rss_kib = int(re.search(r"^VmRSS:\s+(\d+)", text, re.M).group(1))
    return threads, rss_kib


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(binary, n, settle):
    port, tcp_port = free_port(), free_port()
    with tempfile.TemporaryDirectory() as d:
        job = os.path.join(d, "job.yaml")
        with open(job, "w") as f:
            f.write(JOB)
        token = os.path.join(d, "token")
        with open(token, "w") as f:
            f.write("bench-token")
        proc = subprocess.Popen([binary, "--rank", "0", "--listen", "127.0.0.1",
                                 "--port", str(port), "--tcp-port", str(tcp_port),
                                 "--job", job, "--token-file", token],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.time() + 60
            while True:
                try:
                    socket.create_connection(("127.0.0.1", tcp_port), timeout=1).close()
                    break
                except OSError:
                    if proc.poll() is not None or time.time() > deadline:
                        raise SystemExit(f"{binary} did not start (exit {proc.poll()})")
                    time.sleep(0.1)
            time.sleep(settle)
            before = status(proc.pid)
            conns = []
            for _ in range(n):
                conns.append(socket.create_connection(("127.0.0.1", tcp_port), timeout=10))
            time.sleep(settle)
            alive = proc.poll() is None
            after = status(proc.pid) if alive else (0, 0)
            for c in conns:
                c.close()
            return before, after, alive
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("binaries", nargs="+", help="trellis-pserver binaries to compare")
    ap.add_argument("--connections", type=int, default=500)
    ap.add_argument("--settle", type=float, default=2.0, help="seconds to wait before reading")
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, a.connections + 256)), hard))
    print(f"{'binary':<50} {'threads':>8} {'threads':>8} {'RSS MiB':>8} {'RSS MiB':>8}")
    print(f"{'':<50} {'before':>8} {'+' + str(a.connections):>8} {'before':>8} "
          f"{'+' + str(a.connections):>8}")
    for b in a.binaries:
        before, after, alive = measure(b, a.connections, a.settle)
        print(f"{b:<50} {before[0]:>8} {after[0]:>8} {before[1] / 1024:>8.1f} "
              f"{after[1] / 1024:>8.1f}" + ("" if alive else "  (server died)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
