#!/usr/bin/python3
"""Under trellis-launch every listening socket of the job is where --listen-host says, loopback
by default (docs/operations.md#listen-address): a small MLP job (scheduler, 2 servers, 2
workers, their agents, /metrics everywhere) runs, and once every worker trains,
/proc/net/tcp{,6} must show each socket the job's processes listen on bound to 127.0.0.1 -- the
scheduler's gRPC and /metrics, the servers' data ports and every /metrics port included (they
listened on every address before). Then the same job with `--listen-host 127.0.0.2` (another
loopback address: nothing leaves the machine) must have every one of them on 127.0.0.2 and
still train (the processes reach each other there). Each job is stopped (SIGINT) and nothing of
it is left.

The servers' local sockets (docs/operations.md#the-local-socket) are Unix sockets, not on any
address: in the first job each server listens on exactly one, an abstract "@trellis-<32 hex>"
(no file, nothing else of the job listens on a Unix socket), and both workers connect to every
server through it (the servers' logs say "connected from local socket"). The second job runs with
TRELLIS_LOCAL_SOCKET=off: no Unix listener at all, and the workers connect over TCP (from a
loopback address).

Usage: listen_loopback_test.py BIN_DIR   (exit 77: skipped, a program is missing)
"""
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

BIN = sys.argv[1]
JOB_YAML = """apiVersion: trellis.io/v1alpha1
kind: TrainingJob
metadata:
  name: {job}
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
# /proc/net/tcp{,6} spellings of an IPv4 address: plain, and v4-mapped (gRPC's listener).
ADDRS = {"127.0.0.1": ("0100007F", "0000000000000000FFFF00000100007F"),
         "127.0.0.2": ("0200007F", "0000000000000000FFFF00000200007F")}


def job_pids(job, job_file):
    """The job's agents and programs (TRELLIS_JOB in their environment) and its scheduler (its
    command line names the job file)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if f"TRELLIS_JOB={job}".encode() in env or (
                argv and argv[0].endswith(b"trellis-scheduler") and job_file.encode() in argv):
            out.append(int(d))
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


def unix_listeners():
    """inode -> name of every Unix socket in LISTEN (flag __SO_ACCEPTCON); abstract names start
    with '@'."""
    out = {}
    try:
        with open("/proc/net/unix") as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return out
    for line in lines:
        cols = line.split()
        if len(cols) >= 7 and int(cols[3], 16) & 0x10000:
            out[cols[6]] = cols[7] if len(cols) > 7 else ""
    return out


def comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def run(bin_dir, work, job, extra, want, local):
    """Runs the job with `extra` launcher flags (and TRELLIS_LOCAL_SOCKET=off unless `local`);
    returns (failures, what listened)."""
    job_file = os.path.join(work, job + ".yaml")
    with open(job_file, "w") as f:
        f.write(JOB_YAML.format(job=job))
    out_file = os.path.join(work, job + ".out")
    log = open(out_file, "w")
    env = dict(os.environ)
    env.pop("TRELLIS_LOCAL_SOCKET", None)  # on: trellis-launch's default
    if not local:
        env["TRELLIS_LOCAL_SOCKET"] = "off"
    logs = os.path.join(work, "logs-" + job)
    launch = subprocess.Popen([os.path.join(bin_dir, "trellis-launch"), "--quiet", "--log-dir",
                               logs] + extra + [job_file],
                              stdout=log, stderr=subprocess.STDOUT, env=env)
    failures = []
    seen = {}
    unix_seen = {}
    try:
        # Every process that should listen does: the scheduler (gRPC + metrics), 2 servers
        # (data + metrics), 4 agents and 2 workers (metrics), and the workers train.
        deadline = time.time() + 180
        while time.time() < deadline:
            if launch.poll() is not None:
                break
            table = listeners()
            unix_table = unix_listeners()
            seen = {}
            unix_seen = {}
            for pid in job_pids(job, job_file):
                for inode in socket_inodes(pid):
                    if inode in table:
                        seen.setdefault((pid, comm(pid)), []).append(table[inode])
                    if inode in unix_table:
                        unix_seen.setdefault((pid, comm(pid)), []).append(unix_table[inode])
            names = [name for (_, name) in seen]
            with open(out_file) as f:
                trained = "[worker-0] epoch" in f.read()
            if (names.count("trellis-pserver") >= 2 and names.count("trellis-mlp") >= 2 and
                    names.count("trellis-agent") >= 4 and names.count("trellis-schedul") >= 1 and
                    trained):
                break
            time.sleep(0.5)
        names = [name for (_, name) in seen]
        if (names.count("trellis-pserver") < 2 or names.count("trellis-mlp") < 2 or
                names.count("trellis-schedul") < 1):
            failures.append("the job's processes never all listened: %r" % seen)
        with open(out_file) as f:
            if "[worker-0] epoch" not in f.read():
                failures.append("the workers never finished an epoch")
        for (pid, name), socks in sorted(seen.items()):
            for addr, port in socks:
                if addr not in ADDRS[want]:
                    failures.append(f"{name} (pid {pid}) listens on {addr}:{port}, not {want}")
        for prog in ("trellis-pserver", "trellis-schedul"):
            if not any(name == prog and len(s) >= 2 for (_, name), s in seen.items()):
                failures.append(f"no {prog} showed both its own port and its /metrics port: {seen!r}")
        # The local sockets: one abstract name per server, or none at all when turned off.
        servers = [pid for (pid, name) in seen if name == "trellis-pserver"]
        for (pid, name), socks in sorted(unix_seen.items()):
            if not local or name != "trellis-pserver":
                failures.append(f"{name} (pid {pid}) listens on Unix sockets {socks}")
            elif len(socks) != 1 or not re.fullmatch(r"@trellis-[0-9a-f]{32}", socks[0]):
                failures.append(f"server pid {pid} listens on Unix sockets {socks}, not one "
                                "abstract @trellis-<32 hex>")
        if local and len([p for p in servers if (p, "trellis-pserver") in unix_seen]) < 2:
            failures.append(f"not every server listened on a local socket: {unix_seen!r}")
        for s in range(2):
            try:
                with open(os.path.join(logs, f"server-{s}.log")) as f:
                    text = f.read()
            except OSError:
                text = ""
            for w in range(2):
                peer = "local socket, pid " if local else "127.0.0."  # TCP: a loopback peer
                if f"worker {w} connected from {peer}" not in text:
                    failures.append(f"server {s}'s log lacks 'worker {w} connected from {peer}'")
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
    while job_pids(job, job_file) and time.time() < left:
        time.sleep(0.2)
    for pid in job_pids(job, job_file):
        failures.append(f"process {pid} ({comm(pid)}) of the job left behind")
        os.kill(pid, signal.SIGKILL)
    if failures:
        with open(out_file) as f:
            print(f.read()[-3000:])
    return failures, seen


def main():
    for prog in ("trellis-launch", "trellis-agent", "trellis-scheduler", "trellis-pserver", "trellis-mlp"):
        if not os.access(os.path.join(BIN, prog), os.X_OK):
            print("skipped: no " + prog)
            return 77
    work = tempfile.mkdtemp(prefix="trellis-listen-")
    failures = []
    for job, extra, want, local in (
            ("listen-%d" % os.getpid(), [], "127.0.0.1", True),
            ("listen2-%d" % os.getpid(), ["--listen-host", "127.0.0.2"], "127.0.0.2", False)):
        f, seen = run(BIN, work, job, extra, want, local)
        failures += f
        if not f:
            print(f"{' '.join(extra) or 'default'}, local socket {'on' if local else 'off'}: "
                  f"every listening socket of the job is on {want}: " +
                  ", ".join(f"{name}:{len(s)}" for (_, name), s in sorted(seen.items())))
    if failures:
        print("\n".join(failures))
        return 1
    subprocess.run(["rm", "-rf", work])
    return 0


if __name__ == "__main__":
    sys.exit(main())
