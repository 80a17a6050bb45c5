#!/usr/bin/env python3
"""Elastic resize on loopback (docs/elastic.md): how long from `trellis-launch resize` to the
first step of the new world, and the job's throughput before and after.

Runs the MLP demo (examples/mlp's trellis-mlp) as an elastic job of WORKERS workers under
trellis-launch, waits until it trains, shrinks it to --to workers with `trellis-launch resize`,
and lets it finish. Figures, per round:
  decided   the resize command's own figure: request -> the step boundary agreed on
  switch    request -> the first step of the new world (rank 0's log line "world N from step
            S", written as it switches; the step starts right after)
  before    samples/s of the whole job in its first epoch, before the request (trellis-mlp's
            own epoch line: all workers' samples over the epoch's time)
  after     samples/s over the epochs wholly in the new world (the same lines), and the ratio
            after/before (the baseline is the same run's old world)
--back grows the job back to WORKERS once an epoch ran wholly in the small world (docs/elastic.md
#growing), and adds, per round:
  grow decided  the grow's resize command figure
  grow switch   request -> the joiners hold the model and push the new world's first step
                (the latest joiner's log line "rejoined the running job after step F-1")
  regrown       samples/s over the epochs wholly after the grow, and its ratio to `before`
--to above --workers grows the job beyond its first size (maxWorkers = --to; ranks never used
join); `switch` is then request -> the latest joiner holds the model for the new world's first
step, as `grow switch` below.
--servers N resizes the job's parameter servers instead, 2 -> N (docs/elastic.md#servers),
with `trellis-launch resize LOGS --servers N`; the workers stay. `switch` is then request -> the
first step on the new servers (rank 0's "world N from step S" line, written once its slices
moved).
--load N runs N busy loops beside the job (a busy training host).

usage: bench/elastic/resize_bench.py [--bin build/bin] [--workers 2] [--to 1] [--rounds 3]
                                     [--back] [--servers N] [--load 0]
"""
import argparse
import datetime
import os
import re
import subprocess
import sys
import tempfile
import time

JOB = """apiVersion: trellis.io/v1alpha1
kind: TrainingJob
metadata:
  name: {name}
spec:
  servers:
    replicas: 2
  workers:
    replicas: {workers}
    command: [trellis-mlp]
    args: [--layers, "16,256,256,10", --epochs, "6", --batch, "32", --lr, "0.02",
           --train-samples, "32768", --test-samples, "1000", --target-accuracy, "0.5"]
  elastic: {{minWorkers: 1, maxWorkers: {max_workers}, minServers: {min_servers}, maxServers: {max_servers}}}
  sliceBytes: 65536
  runPolicy:
    restartPolicy: Never
    activeDeadlineSeconds: 600
"""


def epoch_rates(text):
    """epoch number -> samples/s, from trellis-mlp's epoch lines."""
    out = {}
    for m in re.finditer(r"epoch (\d+)/\d+ .*\| ([0-9]+) samples/s \|", text):
        out[int(m.group(1))] = float(m.group(2))
    return out


def log_time(line, day):
    """The wall time of a log line "[... HH:MM:SS.mmm ...]" on `day` (seconds since the epoch)."""
    m = re.search(r"(\d\d):(\d\d):(\d\d)\.(\d\d\d)", line)
    if not m:
        return None
    t = datetime.datetime.combine(day, datetime.time(int(m.group(1)), int(m.group(2)),
                                                     int(m.group(3)), int(m.group(4)) * 1000))
    return t.timestamp()


def run_job(args, name, job_text, disturb):
    """Runs `job_text` under trellis-launch in a fresh directory; once its first epoch ended (its
    rate is the baseline), calls disturb(work, logs, launch) and waits for the job's end. Returns
    (logs, the launcher's output, disturb's result); exits when the job failed."""
    work = tempfile.mkdtemp(prefix="trellis-%s-bench-" % name.split("-")[0])
    logs = os.path.join(work, "logs")
    job = os.path.join(work, "job.yaml")
    with open(job, "w") as f:
        f.write(job_text)
    out = open(os.path.join(work, "launch.out"), "w")
    launch = subprocess.Popen([os.path.join(args.bin, "trellis-launch"), "--log-dir", logs, job],
                              stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and launch.poll() is None:
            out.flush()
            with open(os.path.join(work, "launch.out")) as f:
                if 1 in epoch_rates(f.read()):
                    break
            time.sleep(0.02)
        result = disturb(work, logs, launch)
        launch.wait(timeout=600)
    finally:
        if launch.poll() is None:
            launch.kill()
        out.close()
    with open(os.path.join(work, "launch.out")) as f:
        text = f.read()
    if launch.returncode != 0:
        sys.exit("the job failed:\n" + text)
    return logs, text, result


def first_epoch_after_resize(text, default=3):
    """The first epoch wholly after the first resize in trellis-mlp's output (the one it landed in
    is mixed)."""
    m = re.search(r"resized to \d+ worker\(s\) from step \d+.*\n(?:.*\n)*?.*epoch (\d+)/", text)
    return int(m.group(1)) + 1 if m else default


def one_round(args, n):
    # Resize once the first epoch ended: it lands in the second.
    def disturb(work, logs, launch):
        if args.servers:
            return resize(args, logs, args.servers, servers=True) + (None,)
        asked, from_step, decided = resize(args, logs, args.to)
        return asked, from_step, decided, grow_back(args, work, logs, launch) if args.back else None

    name = "rsz-%d-%d" % (os.getpid(), n)
    servers_to = args.servers or 2
    job = JOB.format(name=name, workers=args.workers, max_workers=max(args.workers, args.to),
                     min_servers=min(2, servers_to), max_servers=max(2, servers_to))
    logs, text, (asked, from_step, decided, grow) = run_job(args, name, job, disturb)
    switch = None
    day = datetime.date.today()
    if args.to > args.workers and not args.servers:  # a grow: the joiners are the last to be ready
        switch = joined_at(logs, range(args.workers, args.to), from_step, day)
    else:
        with open(os.path.join(logs, "worker-0.log")) as f:
            for line in f:
                if re.search(r"worker 0: world [0-9]+ from step %d" % from_step, line):
                    switch = log_time(line, day)
    rates = epoch_rates(text)
    first_new = first_epoch_after_resize(text)
    after_epochs = [rates[e] for e in rates if e >= first_new]
    before = rates.get(1, 0.0)
    after = sum(after_epochs) / len(after_epochs) if after_epochs else 0.0
    if grow is None:
        return decided, (switch - asked) if switch else float("nan"), before, after, None
    grow_asked, grow_from, grow_decided = grow
    joined = joined_at(logs, range(args.to, args.workers), grow_from, day)
    grow_switch = (joined - grow_asked) if joined else float("nan")
    m = re.search(r"resized to %d worker\(s\) from step %d.*\n(?:.*\n)*?.*epoch (\d+)/" % (args.workers, grow_from),
                  text)
    regrown_epochs = [rates[e] for e in rates if m and e >= int(m.group(1)) + 1]
    regrown = sum(regrown_epochs) / len(regrown_epochs) if regrown_epochs else 0.0
    after_epochs = [rates[e] for e in rates if e >= first_new and (not m or e <= int(m.group(1)) - 1)]
    after = sum(after_epochs) / len(after_epochs) if after_epochs else 0.0
    return (decided, (switch - asked) if switch else float("nan"), before, after,
            (grow_decided, grow_switch, regrown))


def joined_at(logs, ranks, from_step, day):
    """When the latest of `ranks` held the model for step `from_step` (its log line "rejoined the
    running job after step from_step-1"); None if one has no such line."""
    times = []
    for w in ranks:
        with open(os.path.join(logs, "worker-%d.log" % w)) as f:
            t = [log_time(line, day) for line in f
                 if "rejoined the running job after step %d" % (from_step - 1) in line]
        if not t:
            return None
        times.append(t[-1])
    return max(times)


def grow_back(args, work, logs, launch):
    """Once an epoch ran wholly in the small world, resizes back to --workers: (asked, from step,
    decided s)."""
    deadline = time.time() + 300
    while time.time() < deadline and launch.poll() is None:
        with open(os.path.join(work, "launch.out")) as f:
            text = f.read()
        m = re.search(r"resized to \d+ worker\(s\) from step \d+.*\n(?:.*\n)*?.*epoch (\d+)/", text)
        if m and int(m.group(1)) + 1 in epoch_rates(text):
            break
        time.sleep(0.02)
    return resize(args, logs, args.workers)


def resize(args, logs, count, servers=False):
    """`trellis-launch resize LOGS WORKERS` (or `--servers SERVERS`): (when it was asked, the new
    world's first step, the command's decided seconds)."""
    asked = time.time()
    r = subprocess.run([os.path.join(args.bin, "trellis-launch"), "resize", logs] +
                       (["--servers"] if servers else []) + [str(count)],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        sys.exit("resize to %d %s failed: %s%s" % (count, "servers" if servers else "workers", r.stdout,
                                                   r.stderr))
    m = re.search(r"from step ([0-9]+) \(decided ([0-9.]+) s", r.stdout)
    return asked, int(m.group(1)), float(m.group(2))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default="build/bin")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--to", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--load", type=int, default=0)
    p.add_argument("--back", action="store_true")
    p.add_argument("--servers", type=int, default=0)
    args = p.parse_args()
    if args.servers and (args.back or args.to != 1):
        sys.exit("--servers resizes the servers only (no --back, no --to)")
    if args.back and args.to > args.workers:
        sys.exit("--back follows a shrink (--to below --workers)")
    hogs = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(args.load)]
    try:
        what = ("2 -> %d servers (%d workers)" % (args.servers, args.workers) if args.servers
                else "%d -> %d workers" % (args.workers, args.to))
        print("resize %s, MLP 16-256-256-10 on loopback, %d busy loop(s) beside it" % (what, args.load))
        print("%-6s %10s %10s %14s %14s %8s" % ("round", "decided s", "switch s", "before smp/s",
                                                "after smp/s", "ratio") +
              ("  %12s %12s %14s %8s" % ("grow decided", "grow switch", "regrown smp/s", "ratio")
               if args.back else ""))
        for n in range(args.rounds):
            decided, switch, before, after, grow = one_round(args, n)
            line = "%-6d %10.2f %10.2f %14.0f %14.0f %8.2f" % (n + 1, decided, switch, before, after,
                                                             after / before if before else 0)
            if grow:
                line += "  %12.2f %12.2f %14.0f %8.2f" % (grow[0], grow[1], grow[2],
                                                          grow[2] / before if before else 0)
            print(line)
            sys.stdout.flush()
    finally:
        for h in hogs:
            h.kill()


if __name__ == "__main__":
    main()
