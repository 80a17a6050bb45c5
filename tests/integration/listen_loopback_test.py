#!/usr/bin/python3
"""Under trellis-launch every listening socket of the job is on loopback (docs/operations.md):
a small MLP job (scheduler, 2 servers, 2 workers, their agents, /metrics everywhere) runs, and
once every worker trains, /proc/net/tcp{,6} must show each socket the job's processes listen on
bound to 127.0.0.1 -- the servers' data ports and every /metrics port included (they listened on
every address before). Then the job is stopped (SIGINT) and nothing of it is left.

Usage: listen_loopback_test.py BIN_DIR   (exit 77: skipped, a program is missing)
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

BIN = sys.argv[1]
JOB = "listen-%d" % os.getpid()
JOB_YAML = f"""apiVersion: trellis.io/v1alpha1
kind: TrainingJob
metadata:
  name: {JOB}
spec:
  servers:
    replicas: 2
  workers:
    replicas: 2
    command: [trellis-mlp]
    args: [--layers, "16,64,10", --latent-dim, "8", --teacher-hidden, "16", --epochs, "100000",
           --batch, "32", --train-samples, "4096", --test-samples, "500"]
  sliceBytes: 16384
  runPolicy:
    restartPolicy: Never
    activeDeadlineSeconds: 300
"""


def job_pids():
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                if f"TRELLIS_JOB={JOB}".encode() in f.read().split(b"\0"):
                    out.append(int(d))
        except OSError:
            pass
    return out


def socket_inodes(pid):
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    except OSError:
        pass
    return inodes


def listeners():
    """inode -> (address hex, port) of every TCP socket in LISTEN (state 0A)."""
    out = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if cols[3] != "0A":
                continue
            addr, port = cols[1].split(":")
            out[cols[9]] = (addr, int(port, 16))
    return out


def comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def main():
    for prog in ("trellis-launch", "trellis-agent", "trellis-scheduler", "trellis-pserver", "trellis-mlp"):
        if not os.access(os.path.join(BIN, prog), os.X_OK):
            print("skipped: no " + prog)
            return 77
    work = tempfile.mkdtemp(prefix="trellis-listen-")
    job_file = os.path.join(work, "job.yaml")
    with open(job_file, "w") as f:
        f.write(JOB_YAML)
    log = open(os.path.join(work, "launch.out"), "w")
    launch = subprocess.Popen([os.path.join(BIN, "trellis-launch"), "--quiet", "--log-dir",
                               os.path.join(work, "logs"), job_file], stdout=log, stderr=subprocess.STDOUT)
    failures = []
    try:
        # Every process that should listen does: 2 servers (data + metrics), 4 agents
        # and 2 workers (metrics).
        deadline = time.time() + 180
        seen = {}
        while time.time() < deadline:
            if launch.poll() is not None:
                break
            table = listeners()
            seen = {}
            for pid in job_pids():
                for inode in socket_inodes(pid):
                    if inode in table:
                        seen.setdefault((pid, comm(pid)), []).append(table[inode])
            names = [name for (_, name) in seen]
            if (names.count("trellis-pserver") >= 2 and names.count("trellis-mlp") >= 2 and
                    names.count("trellis-agent") >= 4):
                break
            time.sleep(0.5)
        names = [name for (_, name) in seen]
        if names.count("trellis-pserver") < 2 or names.count("trellis-mlp") < 2:
            failures.append("the job's processes never all listened: %r" % seen)
        for (pid, name), socks in sorted(seen.items()):
            for addr, port in socks:
                # 127.0.0.1, ::1, or 127.0.0.1 as a v4-mapped IPv6 address (gRPC's listener).
                if addr not in ("0100007F", "00000000000000000000000001000000",
                                "0000000000000000FFFF00000100007F"):
                    failures.append(f"{name} (pid {pid}) listens on {addr}:{port}, not loopback")
        if not any(name == "trellis-pserver" and len(s) >= 2 for (_, name), s in seen.items()):
            failures.append("no server showed both its data port and its /metrics port: %r" % seen)
    finally:
        if launch.poll() is None:
            launch.send_signal(signal.SIGINT)
            try:
                launch.wait(60)
            except subprocess.TimeoutExpired:
                launch.kill()
                launch.wait()
        log.close()
    left = time.time() + 30
    while job_pids() and time.time() < left:
        time.sleep(0.2)
    for pid in job_pids():
        failures.append(f"process {pid} ({comm(pid)}) of the job left behind")
        os.kill(pid, signal.SIGKILL)
    if failures:
        with open(os.path.join(work, "launch.out")) as f:
            print(f.read()[-3000:])
        print("\n".join(failures))
        return 1
    print("every listening socket of the job is on 127.0.0.1: " +
          ", ".join(f"{name}:{len(s)}" for (_, name), s in sorted(seen.items())))
    subprocess.run(["rm", "-rf", work])
    return 0


if __name__ == "__main__":
    sys.exit(main())
