"""trellis.torch against torch.nn.parallel.DistributedDataParallel (gloo), same run.

    build/bin/bench_torch                  # every default row, 3 rounds (~7 min, idle 2 cores)
    build/bin/bench_torch --quick          # 1 round, few steps: checks that every row runs
    build/bin/bench_torch --models mlp --configs 1s-2bit,2s-2bit --repeats 5 --threads
    sudo build/bin/bench_torch --models mlp --link 1gbit   # every byte over one shaped link

Both sides train the same model on the same synthetic data, 2 worker processes, each with
torch.set_num_threads(1): DDP over gloo on loopback, and trellis.torch under trellis-launch
(the command form: --workers 2 --servers S [--compression 2bit]). Models: a small CNN
(32x32x3 images) and a ~25M-parameter MLP. A run's figure is samples/s over both workers
(rank 0's clock, from a barrier after the warm-up steps to the end of the timed steps). Every
configuration runs once per round, DDP first, and the rounds repeat (DDP, A, B, DDP, A, B...),
so a drifting load hits every configuration alike; each row shows the median and the range of
its runs and the ratio of its median to DDP's. Each process also measures the CPU time it used
during the timed steps (all its threads, from /proc), which a shared machine does not distort
as it does wall-clock time: CPU ms per step per worker and of the parameter servers.

--link RATE (root) runs the whole bench in a private network namespace whose loopback is shaped
to RATE (tc tbf): every byte any process sends, DDP's and trellis's alike, crosses that one link,
in both directions together. It stands for a network a training job's bytes share; it is not a
model of per-host NICs (there a parameter server's link, not the sum, is what limits it).
"""
import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from bench_common import fmt, run_ranks

HERE = os.path.dirname(os.path.abspath(__file__))

# name -> (servers, compression, restart policy, local socket); "ddp" is the baseline and always
# runs. The local socket (docs/architecture.md) is on by default on one host; "-tcp" turns it off
# (TRELLIS_LOCAL_SOCKET=off) to measure what it brings in the same run.
CONFIGS = {
    "1s": (1, "none", "Never", True),
    "2s": (2, "none", "Never", True),
    "1s-2bit": (1, "2bit", "Never", True),
    "2s-2bit": (2, "2bit", "Never", True),
    # The default restart policy: per-step commits for crash recovery.
    "1s-onfailure": (1, "none", "OnFailure", True),
    "1s-tcp": (1, "none", "Never", False),
    "2s-tcp": (2, "none", "Never", False),
}
DEFAULT_CONFIGS = {"cnn": "1s,2s", "mlp": "1s,2s,1s-2bit,2s-2bit"}


def config_label(name):
    if name == "ddp":
        return "DDP gloo"
    servers, compression, policy, local = CONFIGS[name]
    return "trellis %d server%s%s%s%s" % (servers, "s" if servers > 1 else "",
                                          " 2-bit" if compression == "2bit" else "",
                                          " OnFailure" if policy == "OnFailure" else "",
                                          "" if local else " TCP only")


# --- CPU time from /proc (ns of run time per thread: schedstat, else utime+stime ticks) ------

def thread_cpu(pid):
    """{(tid, name): CPU seconds} of every thread of pid that is alive now."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return out
    for tid in tids:
        base = "/proc/%d/task/%s/" % (pid, tid)
        try:
            with open(base + "comm") as f:
                name = f.read().strip()
            try:
                with open(base + "schedstat") as f:
                    secs = int(f.read().split()[0]) / 1e9
            except (OSError, ValueError, IndexError):
                with open(base + "stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                secs = (int(fields[11]) + int(fields[12])) / tick
        except OSError:
            continue  # the thread ended meanwhile
        out[(int(tid), name)] = secs
    return out


def process_table():
    """{pid: (ppid, comm)} of every process."""
    table = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                s = f.read()
        except OSError:
            continue
        comm = s[s.index("(") + 1:s.rindex(")")]
        table[int(d)] = (int(s[s.rindex(")") + 2:].split()[1]), comm)
    return table


def job_servers():
    """The pids of this job's trellis-pserver processes: descendants of the trellis-launch
    process above this worker."""
    table = process_table()
    launch, pid = None, os.getpid()
    while pid in table and pid > 1:
        pid = table[pid][0]
        if table.get(pid, (0, ""))[1] == "trellis-launch":
            launch = pid
            break
    if launch is None:
        return []

    def under(p):
        while p in table and p > 1:
            p = table[p][0]
            if p == launch:
                return True
        return False
    return sorted(p for p, (_, comm) in table.items() if comm.startswith("trellis-pserv") and
                  under(p))


class CpuWindow:
    """CPU seconds used between start() and stop() by each thread of some processes."""

    def __init__(self, pids):
        self.pids = pids

    def start(self):
        self.before = {p: thread_cpu(p) for p in self.pids}

    def stop(self):
        """{pid: {thread name: CPU seconds}} (threads of one name summed)."""
        out = {}
        for p in self.pids:
            after, before = thread_cpu(p), self.before.get(p, {})
            per = {}
            for (tid, name), secs in after.items():
                used = secs - before.get((tid, name), 0.0)
                name = "main" if tid == p else name
                per[name] = per.get(name, 0.0) + used
            out[p] = per
        return out


# --- the training processes ----------------------------------------------------------------

def build_model(name):
    import torch
    import torch.nn as nn
    torch.manual_seed(1)
    if name == "cnn":
        return nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(64 * 4 * 4, 256), nn.ReLU(), nn.Linear(256, 10))
    if name == "mlp":  # 1024-4096-4096-1024-10: 25.2M parameters
        return nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                             nn.Linear(4096, 1024), nn.ReLU(), nn.Linear(1024, 10))
    raise ValueError(name)


def batch_for(name, rank, batch):
    import torch
    g = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn((batch, 3, 32, 32) if name == "cnn" else (batch, 1024), generator=g)
    return x, torch.randint(0, 10, (batch,), generator=g)


def train(model, opt, x, y, warmup, steps, barrier, cpu):
    """Runs warmup + steps steps; returns seconds of the timed ones (after a barrier) and the
    CPU the watched processes used meanwhile."""
    import torch.nn.functional as F
    for i in range(warmup + steps):
        if i == warmup:
            barrier()
            cpu.start()
            t0 = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    barrier()
    secs = time.perf_counter() - t0
    return secs, cpu.stop()


def report(args, rank, world, secs, cpu):
    """Writes this worker's result for the main process (--out)."""
    me = os.getpid()
    res = {"rank": rank, "samples_per_s": world * args.batch * args.steps / secs,
           "steps": args.steps, "worker": cpu.pop(me),
           "servers": [cpu[p] for p in sorted(cpu)]}
    path = os.path.join(args.out, "rank%d.json" % rank)
    with open(path + ".tmp", "w") as f:
        json.dump(res, f)
    os.rename(path + ".tmp", path)


def run_ddp(args):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % args.port,
                            rank=args.rank, world_size=args.world)
    model = torch.nn.parallel.DistributedDataParallel(build_model(args.model))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = batch_for(args.model, args.rank, args.batch)
    secs, cpu = train(model, opt, x, y, args.warmup, args.steps, dist.barrier,
                      CpuWindow([os.getpid()]))
    report(args, args.rank, args.world, secs, cpu)
    dist.destroy_process_group()


def run_trellis(args):
    import torch
    import trellis
    import trellis.torch as tt
    torch.set_num_threads(1)
    trellis.init()
    model = build_model(args.model)
    opt = tt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                  model.named_parameters())
    tt.broadcast_parameters(model.state_dict(), root_rank=0)
    x, y = batch_for(args.model, trellis.rank(), args.batch)
    n = [0]

    def barrier():
        n[0] += 1
        trellis.barrier("bench.%d" % n[0])
    # Rank 0 also watches the servers (every process of the job is on this machine).
    pids = [os.getpid()] + (job_servers() if trellis.rank() == 0 else [])
    secs, cpu = train(model, opt, x, y, args.warmup, args.steps, barrier, CpuWindow(pids))
    report(args, trellis.rank(), trellis.size(), secs, cpu)


# --- the main process ----------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def common_args(model, a, out):
    return ["--model", model, "--batch", str(a.batch[model]), "--warmup", str(a.warmup[model]),
            "--steps", str(a.steps[model]), "--out", out]


def read_results(out, what, log):
    res = []
    for rank in range(2):
        try:
            with open(os.path.join(out, "rank%d.json" % rank)) as f:
                res.append(json.load(f))
        except (OSError, ValueError):
            raise RuntimeError("%s: rank %d wrote no result:\n%s" % (what, rank, log[-4000:]))
    return res


def torch_blas():
    """Which BLAS the workers' torch multiplies with: Debian's torch (BLAS_INFO=generic) loads
    the system's libblas.so.3, a pip wheel carries its own (mkl, open...)."""
    try:
        import torch
        m = re.search(r"BLAS_INFO=([^,\s]+)", torch.__config__.show())
    except ImportError:
        m = None
    if m and m.group(1) != "generic":
        return "torch's own (BLAS_INFO=%s, torch %s)" % (m.group(1), torch.__version__)
    return os.path.realpath("/usr/lib/x86_64-linux-gnu/libblas.so.3")


def run_once(model, config, a):
    """One run of one configuration: the two ranks' results."""
    with tempfile.TemporaryDirectory(prefix="bench_torch.") as out:
        if config == "ddp":
            port = free_port()
            # trellis-python: the interpreter (and so the torch) the trellis rows use, whatever
            # python3 started this bench (pyenv's, without torch, comes first on some PATHs).
            python = os.path.join(a.bin_dir, "trellis-python")
            try:
                log = run_ranks([[python, __file__, "--role", "ddp", "--rank", str(r), "--world",
                                  "2", "--port", str(port)] + common_args(model, a, out)
                                 for r in range(2)], a.timeout)
            except RuntimeError as e:
                raise RuntimeError("DDP %s: %s" % (model, e))
        else:
            servers, compression, policy, local = CONFIGS[config]
            env = dict(os.environ)
            env["TRELLIS_LOCAL_SOCKET"] = "on" if local else "off"
            cmd = [os.path.join(a.bin_dir, "trellis-launch"), "--quiet", "--no-metrics",
                   "--workers", "2", "--servers", str(servers), "--restart-policy", policy,
                   "--name", "bench-torch", "--compression", compression, "--",
                   os.path.join(a.bin_dir, "trellis-python"), __file__, "--role", "trellis"] + \
                common_args(model, a, out)
            try:
                p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, timeout=a.timeout, env=env)
            except subprocess.TimeoutExpired:
                raise RuntimeError("trellis %s: no result within %d s" % (model, a.timeout))
            log = p.stdout
            if p.returncode != 0:
                raise RuntimeError("trellis %s failed (rc %d):\n%s" % (model, p.returncode,
                                                                       log[-4000:]))
        return read_results(out, "%s %s" % (config, model), log)


def summarize(runs):
    """runs: the two ranks' results of each run -> samples/s and CPU ms per step (medians and
    ranges), and the per-thread CPU ms per step (medians)."""
    def ms_per_step(per_thread, steps):
        return 1000.0 * sum(per_thread.values()) / steps
    s = {"sps": [r[0]["samples_per_s"] for r in runs]}
    s["w0"] = [ms_per_step(r[0]["worker"], r[0]["steps"]) for r in runs]
    s["w1"] = [ms_per_step(r[1]["worker"], r[1]["steps"]) for r in runs]
    s["srv"] = [sum(ms_per_step(t, r[0]["steps"]) for t in r[0]["servers"]) for r in runs]
    s["total"] = [a + b + c for a, b, c in zip(s["w0"], s["w1"], s["srv"])]
    threads = {}
    for r in runs:
        for who, per in [("worker0", r[0]["worker"]), ("worker1", r[1]["worker"])] + \
                [("server%d" % i, t) for i, t in enumerate(r[0]["servers"])]:
            for name, secs in per.items():
                threads.setdefault((who, name), []).append(1000.0 * secs / r[0]["steps"])
    s["threads"] = {k: statistics.median(v) for k, v in threads.items()}
    return s


def bench_model(model, configs, a):
    """Runs the rounds of one model; prints each run as it ends and the table at the end.
    Returns whether every run succeeded."""
    order = ["ddp"] + configs
    runs = {c: [] for c in order}
    ok = True
    for rnd in range(a.repeats):
        for c in order:
            t = time.monotonic()
            try:
                res = run_once(model, c, a)
            except RuntimeError as e:
                print("%-5s round %d %-26s FAILED: %s" % (model, rnd + 1, config_label(c), e),
                      flush=True)
                ok = False
                continue
            runs[c].append(res)
            print("%-5s round %d %-26s %8.1f samples/s  (%.0f s)" % (
                model, rnd + 1, config_label(c), res[0]["samples_per_s"], time.monotonic() - t),
                flush=True)
    print()
    print("%-5s %-26s %-22s %7s   %-18s %-18s %-18s %s" % (
        "model", "configuration", "samples/s median (range)", "vs DDP",
        "CPU ms/step: rank 0", "rank 1", "servers", "DDP/this CPU"))
    summ = {c: summarize(runs[c]) for c in order if runs[c]}
    base = statistics.median(summ["ddp"]["sps"]) if "ddp" in summ else None
    # What the ratio would be if every process's CPU per step stayed as measured and the cores
    # were always busy (a saturated machine): DDP's CPU per step over this configuration's.
    cpu_base = statistics.median(summ["ddp"]["total"]) if "ddp" in summ else None
    for c in order:
        if c not in summ:
            print("%-5s %-26s %s" % (model, config_label(c), "FAILED"))
            continue
        s = summ[c]
        ratio = "%.2fx" % (statistics.median(s["sps"]) / base) if base and c != "ddp" else ""
        cpu_ratio = "%.2fx" % (cpu_base / statistics.median(s["total"])) \
            if cpu_base and c != "ddp" else ""
        print("%-5s %-26s %-22s %7s   %-18s %-18s %-18s %s" % (
            model, config_label(c), fmt(s["sps"]), ratio, fmt(s["w0"], 0), fmt(s["w1"], 0),
            fmt(s["srv"], 0) if c != "ddp" else "-", cpu_ratio), flush=True)
    if a.threads:
        print("%-5s CPU ms per step by thread (median of the runs; threads of one name summed):"
              % model)
        for c in order:
            if c not in summ:
                continue
            items = sorted(summ[c]["threads"].items(), key=lambda kv: (kv[0][0], -kv[1]))
            print("  %s: %s" % (config_label(c), ", ".join(
                "%s/%s %.0f" % (who, name, v) for (who, name), v in items if v >= 0.5)))
    print(flush=True)
    return ok


LINK_ENV = "TRELLIS_BENCH_LINK"  # set inside the shaped namespace: the rate it was shaped to


def link_bytes_per_s(rate):
    """'10gbit', '1gbit', '500mbit' -> bytes per second, or None."""
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)(g|m)bit", rate)
    if not m:
        return None
    return float(m.group(1)) * (1e9 if m.group(2) == "g" else 1e6) / 8


def enter_shaped_namespace(rate):
    """Re-runs this bench in a fresh network namespace (unshare --net) whose loopback is shaped
    to `rate`; returns the exit code, or exits with a message when that cannot be done."""
    if link_bytes_per_s(rate) is None:
        sys.exit("bench_torch: --link %r: give a rate like 10gbit, 1gbit or 500mbit" % rate)
    if os.geteuid() != 0:
        sys.exit("bench_torch: --link needs root (a network namespace and tc)")
    for tool in ("unshare", "ip", "tc"):
        if shutil.which(tool) is None:
            sys.exit("bench_torch: --link needs %s (util-linux / iproute2)" % tool)
    env = dict(os.environ, **{LINK_ENV: rate})
    return subprocess.call(["unshare", "--net", "--", sys.executable] + sys.argv, env=env)


def shape_loopback(rate):
    """Inside the namespace: lo up, shaped to `rate` (the burst holds a 64 KiB loopback packet
    and 2 ms at the rate; 50 ms of queue)."""
    burst = max(256 << 10, int(link_bytes_per_s(rate) * 0.002))
    for cmd in (["ip", "link", "set", "lo", "up"],
                ["tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", rate, "burst", str(burst),
                 "latency", "50ms"]):
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0:
            sys.exit("bench_torch: --link: %s failed: %s" % (" ".join(cmd), r.stdout.strip()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--role", choices=["main", "ddp", "trellis"], default="main")
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--models", default="cnn,mlp", help="main: which models (cnn, mlp)")
    ap.add_argument("--configs", default="",
                    help="main: the trellis configurations besides DDP, from %s (default: %s)" % (
                        ", ".join(CONFIGS), "; ".join("%s: %s" % kv
                                                      for kv in DEFAULT_CONFIGS.items())))
    ap.add_argument("--repeats", type=int, default=0,
                    help="main: rounds over all configurations (default 3; 1 with --quick)")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--out", default="")
    ap.add_argument("--batch", type=int, default=0, help="per worker (default 64)")
    ap.add_argument("--warmup", type=int, default=-1,
                    help="warm-up steps per run (default: cnn 2, mlp 1)")
    ap.add_argument("--steps", type=int, default=0,
                    help="timed steps per run (default: cnn 20, mlp 3)")
    ap.add_argument("--quick", action="store_true", help="main: 1 round, few steps")
    ap.add_argument("--threads", action="store_true",
                    help="main: also print CPU ms per step of each thread (by name)")
    ap.add_argument("--bin-dir", default=os.path.dirname(os.path.abspath(sys.argv[0]))
                    if os.path.basename(sys.argv[0]) == "bench_torch" else "",
                    help="where trellis-launch and trellis-python are (default: the build's bin)")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per run")
    ap.add_argument("--blas-dir", default="",
                    help="a directory with another libblas.so.3 for every process, DDP and "
                         "trellis alike (e.g. .../openblas-pthread from libopenblas0-pthread, "
                         "unpacked with dpkg -x); OPENBLAS_NUM_THREADS=1 is set with it")
    ap.add_argument("--link", default="",
                    help="root: run in a private network namespace whose loopback is shaped to "
                         "this rate (e.g. 10gbit, 1gbit): all traffic shares that one link")
    a = ap.parse_args()
    if a.role == "main" and a.link and os.environ.get(LINK_ENV) != a.link:
        return enter_shaped_namespace(a.link)
    if a.role == "ddp":
        return run_ddp(a)
    if a.role == "trellis":
        return run_trellis(a)
    if not a.bin_dir:
        a.bin_dir = os.path.join(HERE, "..", "..", "build", "bin")
    if not os.path.exists(os.path.join(a.bin_dir, "trellis-launch")):
        sys.exit("bench_torch: no trellis-launch in %s (build first, or give --bin-dir)" % a.bin_dir)
    models = [m for m in a.models.split(",") if m]
    for m in models:
        if m not in DEFAULT_CONFIGS:
            sys.exit("bench_torch: unknown model %r (cnn, mlp)" % m)
    configs = {}
    for m in models:
        names = [c for c in (a.configs or DEFAULT_CONFIGS[m]).split(",") if c and c != "ddp"]
        for c in names:
            if c not in CONFIGS:
                sys.exit("bench_torch: unknown configuration %r (%s)" % (c, ", ".join(CONFIGS)))
        configs[m] = names
    a.repeats = a.repeats or (1 if a.quick else 3)
    a.batch = {m: a.batch or 64 for m in DEFAULT_CONFIGS}
    steps = {"cnn": 4, "mlp": 2} if a.quick else {"cnn": 20, "mlp": 3}
    a.steps = {m: a.steps or steps[m] for m in steps}
    warmup = {"cnn": 1, "mlp": 1} if a.quick else {"cnn": 2, "mlp": 1}
    a.warmup = {m: warmup[m] if a.warmup < 0 else a.warmup for m in warmup}
    if a.blas_dir:
        if not os.path.exists(os.path.join(a.blas_dir, "libblas.so.3")):
            sys.exit("bench_torch: no libblas.so.3 in --blas-dir %s" % a.blas_dir)
        old = os.environ.get("LD_LIBRARY_PATH", "")
        os.environ["LD_LIBRARY_PATH"] = a.blas_dir + (":" + old if old else "")
        os.environ["OPENBLAS_NUM_THREADS"] = "1"  # one thread per process, as torch's
    blas = a.blas_dir or torch_blas()
    if a.link:
        shape_loopback(a.link)
    start = time.monotonic()
    print("bench_torch: 2 workers, torch.set_num_threads(1) each, SGD momentum 0.9, batch %d "
          "per worker; %s; %d round%s; load average %.2f at the start" % (
              a.batch["mlp"], ", ".join("%s %d + %d warm-up + timed steps" % (
                  m, a.warmup[m], a.steps[m]) for m in models), a.repeats,
              "s" if a.repeats > 1 else "", os.getloadavg()[0]))
    print("BLAS: %s (the MLP is matrix products: Debian's reference BLAS is ~20x slower than "
          "OpenBLAS, which leaves communication a small share of a step)" % blas, flush=True)
    print("network: %s" % ("loopback shaped to %s in a private namespace, shared by every process "
                           "(--link)" % a.link if a.link else "loopback, unshaped"), flush=True)
    ok = True
    for m in models:
        ok = bench_model(m, configs[m], a) and ok
    print("load average %.2f at the end; %.0f s in all" % (os.getloadavg()[0],
                                                         time.monotonic() - start))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
