#!/usr/bin/env python3
"""Losing a worker for good on loopback (docs/elastic.md#losing-a-worker): how long the others
are held up, and the job's throughput before and after.

Runs the MLP demo as an elastic job of WORKERS workers (minWorkers WORKERS-1, restartPolicy
Never) under trellis-launch, waits until its first epoch ended, SIGKILLs worker 1's program, and
lets the job finish with the others. Figures, per round:
  noticed   kill -> the scheduler leaves the worker out (its log line "the job goes on without it")
  served    kill -> the first server stops waiting for its pushes ("worker 1 lost for good")
  switch    kill -> the first step of the world without it (worker 0's log line "world N from
            step S", written as it switches)
  before    samples/s of the whole job in its first epoch (trellis-mlp's epoch line)
  after     samples/s over the epochs wholly in the world without it, and after/before (the
            baseline is the same run's first epoch, all workers)
--server loses server 1 of 2 instead (servers elastic 1..3, docs/elastic.md#losing-a-server):
server 0's pod takes it over. Figures then:
  noticed   kill -> the scheduler gives the rank to server 0's pod ("takes its shards over")
  started   kill -> that pod's agent starts the takeover's agent ("taking over server 1")
  served    kill -> the takeover rebuilt the rank's slices from the workers' replays ("server 1:
            rebuilt"): the workers' steps go on from here
  before / after as above (after: the epochs wholly after the kill's)
--load N runs N busy loops beside the job (a busy training host).

usage: bench/elastic/loss_bench.py [--bin build/bin] [--workers 3] [--rounds 3] [--server] [--load 0]
"""
import argparse
import datetime
import os
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import resize_bench  # noqa: E402  (the same job, epoch lines and log times)


def worker_program(job, rank, comm="trellis-mlp", role="worker"):
    """The pid of worker `rank`'s program `comm` (its environment names the job and the rank; a
    server's with role "server"); tests/python/test_torch_elastic.py finds its Python workers with
    it too."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/comm" % pid) as f:
                if not f.read().startswith(comm):
                    continue
            with open("/proc/%s/environ" % pid, "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if (b"TRELLIS_JOB=" + job.encode()) in env and (b"TRELLIS_RANK=%d" % rank) in env \
                and b"TRELLIS_ROLE=" + role.encode() in env:
            return int(pid)
    return None


def first_line_time(path, pattern, day):
    """The time of the first line of `path` matching `pattern`, or None."""
    if not os.path.exists(path):
        return None
    with open(path) as f:
        for line in f:
            if re.search(pattern, line):
                return resize_bench.log_time(line, day)
    return None


def one_round(args, n):
    name = "loss-%d-%d" % (os.getpid(), n)
    text = resize_bench.JOB.format(name=name, workers=args.workers, max_workers=args.workers, min_servers=2,
                                   max_servers=2)
    text = text.replace("minWorkers: 1", "minWorkers: %d" % (args.workers - 1))

    def kill(work, logs, launch):
        pid = worker_program(name, 1)
        if pid is None:
            sys.exit("worker 1's program not found")
        killed = time.time()
        os.kill(pid, signal.SIGKILL)
        return killed

    logs, text, killed = resize_bench.run_job(args, name, text, kill)
    day = datetime.date.today()
    noticed = first_line_time(os.path.join(logs, "scheduler.log"), "the job goes on without it", day)
    served = [first_line_time(os.path.join(logs, "server-%d.log" % s), "worker 1 lost for good", day)
              for s in range(2)]
    served = min(t for t in served if t is not None) if any(served) else None
    m = re.search(r"resized to \d+ worker\(s\) from step (\d+)", text)
    switch = first_line_time(os.path.join(logs, "worker-0.log"),
                             r"worker 0: world [0-9]+ from step %s" % m.group(1), day) if m else None
    rates = resize_bench.epoch_rates(text)
    after_epochs = [rates[e] for e in rates if e >= resize_bench.first_epoch_after_resize(text)]
    since = lambda t: (t - killed) if t else float("nan")  # noqa: E731
    return (since(noticed), since(served), since(switch), rates.get(1, 0.0),
            sum(after_epochs) / len(after_epochs) if after_epochs else 0.0)


def server_round(args, n):
    """Server 1 of 2 SIGKILLed, taken over by server 0's pod: (noticed, started, served, before, after)."""
    name = "sloss-%d-%d" % (os.getpid(), n)
    text = resize_bench.JOB.format(name=name, workers=args.workers, max_workers=args.workers, min_servers=1,
                                   max_servers=3)
    text = text.replace("minWorkers: 1", "minWorkers: %d" % args.workers)
    state = {}

    def kill(work, logs, launch):
        pid = worker_program(name, 1, comm="trellis-pserver", role="server")
        if pid is None:
            sys.exit("server 1's program not found")
        killed = time.time()
        os.kill(pid, signal.SIGKILL)
        with open(os.path.join(work, "launch.out")) as f:
            state["epoch"] = max(resize_bench.epoch_rates(f.read()) or [1])  # the last one ended
        return killed

    logs, text, killed = resize_bench.run_job(args, name, text, kill)
    day = datetime.date.today()
    noticed = first_line_time(os.path.join(logs, "scheduler.log"), "takes its shards over", day)
    started = first_line_time(os.path.join(logs, "server-0.log"), r"taking over server 1 \(lost for good\):", day)
    served = first_line_time(os.path.join(logs, "server-0.log"), "server 1: rebuilt", day)
    rates = resize_bench.epoch_rates(text)
    after_epochs = [rates[e] for e in rates if e >= state.get("epoch", 1) + 2]
    since = lambda t: (t - killed) if t else float("nan")  # noqa: E731
    return (since(noticed), since(started), since(served), rates.get(1, 0.0),
            sum(after_epochs) / len(after_epochs) if after_epochs else 0.0)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default="build/bin")
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--load", type=int, default=0)
    p.add_argument("--server", action="store_true", help="lose server 1 of 2 (taken over) instead of worker 1")
    args = p.parse_args()
    if args.workers < 2:
        sys.exit("--workers must be 2 or more: one is lost")
    hogs = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(args.load)]
    if args.server:
        title = ("server 1 of 2 lost (SIGKILL, restartPolicy Never, servers elastic 1..3), %d workers, MLP "
                 "16-256-256-10 on loopback, %d busy loop(s) beside it" % (args.workers, args.load))
        columns, round_of = ("noticed s", "started s", "served s"), server_round
    else:
        title = ("worker 1 of %d lost (SIGKILL, restartPolicy Never), MLP 16-256-256-10 on loopback, "
                 "%d busy loop(s) beside it" % (args.workers, args.load))
        columns, round_of = ("noticed s", "served s", "switch s"), one_round
    try:
        print(title)
        print("%-6s %10s %10s %10s %14s %14s %8s" % (("round",) + columns + ("before smp/s", "after smp/s", "ratio")))
        for n in range(args.rounds):
            a, b, c, before, after = round_of(args, n)
            print("%-6d %10.2f %10.2f %10.2f %14.0f %14.0f %8.2f" % (
                n + 1, a, b, c, before, after, after / before if before else 0))
            sys.stdout.flush()
    finally:
        for h in hogs:
            h.kill()


if __name__ == "__main__":
    main()
