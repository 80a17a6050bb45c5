"""Real PyTorch models through trellis.torch, each process on its own shaped test host, against
DDP (gloo) on the same hosts and links; same run, alternating.

    sudo build/bin/bench_models                          # resnet50,vgg19,transformer at 1gbit
    sudo build/bin/bench_models --rate 10gbit --models resnet50 --repeats 3
    sudo build/bin/bench_models --accuracy               # 2-bit against float32: accuracy after N steps
    sudo build/bin/bench_models --quick                  # 1 round, 1 timed step: every row runs

Hosts: bench/common/testhosts.sh brings up 4 network namespaces, each with one link of --rate to
a switch (tc tbf both ways): host 0 runs the scheduler and server 0, host 1 server 1, hosts 2 and
3 worker 0 and 1 (netns_job_run). DDP's two ranks run on hosts 2 and 3. So every worker's and
every server's bytes cross their own link, as on separate machines with one NIC each. Each host
also gets its own CPU budget (a cgroup with the machine's cores split evenly, --cpu-per-host), so
a server's summing does not take a worker's CPU, as it could not across machines; with
--cpu-per-host 0 every process shares all cores (DDP, which has no servers, then gets more).

Rows (each round runs every row once, in this order, so a drifting load hits all alike):
  ddp        torch.nn.parallel.DistributedDataParallel, gloo, its default 25 MiB buckets
  fifo       trellis, whole tensors (sliceBytes 1Gi), priority and bulking off: FIFO order
  p3         trellis, the job's defaults: 1 MiB slices, priority, bulking (P3)
  p3-2bit    p3 with compression: 2bit (--threshold, --warmup-steps)
  p3-never   p3 with restartPolicy Never: no crash recovery, so no per-step commits and no
             retained pushes (what they cost; DDP has no crash recovery at all)
Every row is the same training script, written as docs/pytorch.md tells a user: trellis.init(),
DistributedOptimizer(optimizer, model.named_parameters()), broadcast_parameters; the job's other
settings are the defaults (restartPolicy OnFailure: crash recovery of workers and servers).

Models (torchvision 0.14, random init, synthetic inputs; sized so that a step's compute on half
a core (the 2-core VM's budget per host) and its communication at 1 Gbit/s are of the same order):
  resnet50     25.6M parameters, 3x64x64 images, batch 4 (about 0.8 s of compute against the
               0.8 s its 102 MB take at 1 Gbit/s; batch 8 doubles the compute: --batch-of)
  vgg19        143.7M parameters, 3x32x32 images
  transformer  Sockeye's transformer-base: nn.Transformer 6+6 layers, d_model 512, 32k source and
               target vocabularies, untied output layer (93M parameters), 32+32 tokens a sample

Each worker uses torch.set_num_threads(1). A run's figure is samples/s over both workers (rank
0's clock, from a barrier after the warm-up to a barrier after the timed steps). Rank 0 also
reads the machine's CPU busy share over the timed steps (/proc/stat): near 100% means the
figure is bounded by this machine's cores (all hosts share them), not by the links.

--accuracy trains ResNet-18 on a synthetic 10-class task (noisy class templates, 16x16) for a
fixed number of steps with ddp, p3 and p3-2bit and prints each one's held-out accuracy.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from bench_common import fmt, run_ranks

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.abspath(os.path.join(HERE, "..", ".."))
TESTHOSTS = os.path.join(SOURCE, "bench", "common", "testhosts.sh")
SERVERS, WORKERS = 2, 2

ROWS = {  # name -> job-file lines besides the defaults
    "fifo": "  sliceBytes: 1Gi\n  priority:\n    enabled: false\n  bulking:\n    enabled: false\n",
    "p3": "",
    "p3-2bit": "  compression:\n    type: 2bit\n    threshold: {threshold}\n"
               "    warmupSteps: {warmup_steps}\n",
    # P3 without crash recovery (workers' commits, servers' retained pushes): what it costs.
    "p3-never": "  runPolicy:\n    restartPolicy: Never\n",
}
LABELS = {"ddp": "DDP gloo", "fifo": "trellis FIFO whole tensors",
          "p3": "trellis P3 (defaults)", "p3-2bit": "trellis P3 + 2-bit",
          "p3-never": "trellis P3, restartPolicy Never"}
# model -> (batch per worker, warm-up steps, timed steps, quick timed steps)
SIZES = {"resnet50": (4, 2, 8, 1), "vgg19": (4, 2, 3, 1), "transformer": (8, 2, 4, 1),
         "resnet18": (32, 0, 0, 0)}
# P3 paper (Jayarajan et al., SysML 2019): P3 over the MXNet parameter-server baseline.
PAPER_GAIN = {"resnet50": 1.25, "vgg19": 1.66, "transformer": 1.38}
ACCURACY_STEPS, ACCURACY_QUICK_STEPS = 150, 10


# --- the training processes ----------------------------------------------------------------

def build_model(name):
    import torch
    import torchvision
    torch.manual_seed(1)
    if name == "resnet50":
        return torchvision.models.resnet50()
    if name == "vgg19":
        return torchvision.models.vgg19()
    if name == "resnet18":
        return torchvision.models.resnet18(num_classes=10)
    if name == "transformer":
        return Seq2Seq()
    raise ValueError(name)


def Seq2Seq():
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self, vocab=32000, d=512):
            super().__init__()
            self.src = nn.Embedding(vocab, d)
            self.tgt = nn.Embedding(vocab, d)
            self.core = nn.Transformer(d, 8, 6, 6, 2048, dropout=0.0, batch_first=True)
            self.out = nn.Linear(d, vocab)

        def forward(self, src, tgt):
            return self.out(self.core(self.src(src), self.tgt(tgt)))
    return Model()


def batch_for(model, rank, batch, step):
    """Inputs and targets of one step of one rank (synthetic, reproducible)."""
    import torch
    g = torch.Generator().manual_seed(1000 * rank + step)
    if model == "transformer":
        src = torch.randint(0, 32000, (batch, 32), generator=g)
        tgt = torch.randint(0, 32000, (batch, 32), generator=g)
        return (src, tgt), torch.randint(0, 32000, (batch, 32), generator=g)
    if model == "resnet18":
        return templates_batch(g, batch)
    side = 64 if model == "resnet50" else 32
    return (torch.randn(batch, 3, side, side, generator=g),), torch.randint(0, 1000, (batch,),
                                                                            generator=g)


def templates_batch(g, batch, noise=2.5):
    """The accuracy task: 10 fixed random 3x16x16 templates; a sample is its class's template
    plus Gaussian noise (hard enough that a few dozen steps do not reach 100%)."""
    import torch
    t = torch.randn(10, 3, 16, 16, generator=torch.Generator().manual_seed(7))
    y = torch.randint(0, 10, (batch,), generator=g)
    return (t[y] + noise * torch.randn(batch, 3, 16, 16, generator=g),), y


def held_out_accuracy(model):
    """The accuracy task's 2000 held-out samples (the same for every run); leaves train mode."""
    import torch
    model.eval()
    with torch.no_grad():
        x, y = templates_batch(torch.Generator().manual_seed(99), 2000)
        acc = float((model(*x).argmax(1) == y).float().mean())
    model.train()
    return acc


def loss_of(model, x, y):
    import torch.nn.functional as F
    out = model(*x)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def cpu_busy():
    """(busy, total) jiffies of the whole machine."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]
    return sum(v) - idle, sum(v)


def train(a, rank, world, model, opt, barrier):
    """Warm-up, then the timed steps between two barriers; rank 0 writes the result."""
    import torch
    batches = [batch_for(a.model, rank, a.batch, s) for s in range(min(a.warmup + a.steps, 4))]
    curve = []  # (step, held-out accuracy) every --eval-every steps (the accuracy task)
    model.train()
    for i in range(a.warmup + a.steps):
        if i == a.warmup:
            barrier()
            busy0, jiffies0 = cpu_busy()
            t0 = time.perf_counter()
        x, y = batches[i % len(batches)] if a.model != "resnet18" else \
            batch_for(a.model, rank, a.batch, i)
        opt.zero_grad()
        loss_of(model, x, y).backward()
        opt.step()
        if a.model == "resnet18" and a.eval_every and (i + 1) % a.eval_every == 0 \
                and i + 1 < a.warmup + a.steps and rank == 0:
            curve.append((i + 1, held_out_accuracy(model)))
    barrier()
    secs = time.perf_counter() - t0
    busy1, jiffies1 = cpu_busy()
    res = {"samples_per_s": world * a.batch * a.steps / secs,
           "cpu_busy": (busy1 - busy0) / max(1, jiffies1 - jiffies0)}
    if a.model == "resnet18":
        res["accuracy"] = held_out_accuracy(model)
        res["curve"] = curve + [(a.warmup + a.steps, res["accuracy"])]
    if rank == 0:
        with open(os.path.join(a.out, "result.json.tmp"), "w") as f:
            json.dump(res, f)
        os.rename(os.path.join(a.out, "result.json.tmp"), os.path.join(a.out, "result.json"))


def run_ddp(a):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://%s:%d" % (a.master, a.port),
                            rank=a.rank, world_size=WORKERS)
    model = torch.nn.parallel.DistributedDataParallel(build_model(a.model))
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    train(a, a.rank, WORKERS, model, opt, dist.barrier)
    dist.destroy_process_group()


def run_trellis(a):
    import torch
    import trellis
    import trellis.torch as tt
    torch.set_num_threads(1)
    trellis.init()
    model = build_model(a.model)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    opt = tt.DistributedOptimizer(opt, model.named_parameters())
    tt.broadcast_parameters(model.state_dict(), root_rank=0)
    n = [0]

    def barrier():
        n[0] += 1
        trellis.barrier("bench.%d" % n[0])
    train(a, trellis.rank(), trellis.size(), model, opt, barrier)


# --- the main process ----------------------------------------------------------------------

def host_address(host):
    return "198.18.0.%d" % (host + 1)


def in_host(a, host):
    """The command prefix that runs a program on test host `host`: its CPU cgroup when there is
    one (--cpu-per-host; entered first: ip netns exec mounts its own /sys), its namespace."""
    ns = "%s-h%d" % (a.prefix, host)
    cgroup = "/sys/fs/cgroup/cpu/" + ns
    pre = ["sh", "-c", 'echo $$ > %s/tasks && exec "$@"' % cgroup, "sh"] \
        if os.path.isdir(cgroup) else []
    return pre + ["ip", "netns", "exec", ns]


def sh(cmd, **kw):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def worker_args(a, model, out, steps):
    batch, warmup, _, _ = SIZES[model]
    batch = a.batch_of.get(model, batch)
    return ["--model", model, "--batch", str(batch), "--warmup", str(warmup), "--steps",
            str(steps), "--lr", str(a.lr_of(model)), "--out", out] + \
        (["--eval-every", str(a.eval_every)] if model == "resnet18" and a.eval_every else [])


def run_once(a, model, row, steps):
    """One run of one row: rank 0's result (a dict), or raises RuntimeError."""
    with tempfile.TemporaryDirectory(prefix="bench_models.", dir=a.log_dir) as out:
        os.chmod(out, 0o755)
        python = os.path.join(a.bin_dir, "trellis-python")
        if row == "ddp":
            port = 29500 + int(time.time()) % 1000
            run_ranks([in_host(a, SERVERS + r) +
                       [python, __file__, "--role", "ddp", "--rank", str(r), "--master",
                        host_address(SERVERS), "--port", str(port)] +
                       worker_args(a, model, out, steps) for r in range(WORKERS)],
                      a.timeout, env=dict(os.environ, GLOO_SOCKET_IFNAME="eth0"))
        else:
            job = os.path.join(out, "job.yaml")
            with open(job, "w") as f:
                f.write("apiVersion: trellis.io/v1alpha1\nkind: TrainingJob\nmetadata:\n"
                        "  name: bench-models\nspec:\n"
                        "  servers:\n    replicas: %d\n  workers:\n    replicas: %d\n"
                        "    command: [%s, %s, --role, trellis, %s]\n" % (
                            SERVERS, WORKERS, python, __file__,
                            ", ".join(worker_args(a, model, out, steps))))
                f.write(ROWS[row].format(threshold=a.threshold, warmup_steps=a.warmup_steps))
            r = sh([os.path.join(a.bin_dir, "netns_job_run"), "--prefix", a.prefix, "--job",
                    job, "--run-dir", os.path.join(out, "run"), "--deadline", str(a.timeout)])
            if r.returncode != 0:
                tail = ""
                for name in ("worker-0.log", "worker-1.log"):
                    try:
                        with open(os.path.join(out, "run", name)) as f:
                            tail += f.read()[-1500:]
                    except OSError:
                        pass
                raise RuntimeError(r.stdout.strip() + "\n" + tail)
            if a.keep_logs:
                sh(["cp", "-r", os.path.join(out, "run"),
                    os.path.join(a.log_dir, "%s-%s-%d" % (model, row, time.time()))])
        try:
            with open(os.path.join(out, "result.json")) as f:
                return json.load(f)
        except (OSError, ValueError):
            raise RuntimeError("rank 0 wrote no result")


def bench_speed(a, model):
    rows = ["ddp"] + a.rows
    runs = {r: [] for r in rows}
    ok = True
    for rnd in range(a.repeats):
        for row in rows:
            t = time.monotonic()
            try:
                res = run_once(a, model, row, a.steps_of(model))
            except RuntimeError as e:
                print("%-11s round %d %-27s FAILED: %s" % (model, rnd + 1, LABELS[row], e),
                      flush=True)
                ok = False
                continue
            runs[row].append(res)
            print("%-11s round %d %-27s %7.2f samples/s  CPU busy %3.0f%%  (%.0f s)" % (
                model, rnd + 1, LABELS[row], res["samples_per_s"], 100 * res["cpu_busy"],
                time.monotonic() - t), flush=True)
    med = {r: statistics.median([x["samples_per_s"] for x in runs[r]]) for r in rows if runs[r]}
    print()
    print("%-11s %-27s %-22s %8s %8s %8s  %s" % ("model", "row", "samples/s median (range)",
                                                   "vs DDP", "vs FIFO", "vs P3", "CPU busy"))
    for row in rows:
        if row not in med:
            print("%-11s %-27s FAILED" % (model, LABELS[row]))
            continue
        sps = [x["samples_per_s"] for x in runs[row]]

        def ratio(base):
            return "%.2fx" % (med[row] / med[base]) if base in med and base != row else "-"
        print("%-11s %-27s %-22s %8s %8s %8s  %s%%" % (
            model, LABELS[row], fmt(sps, 2), ratio("ddp"), ratio("fifo"),
            ratio("p3") if row in ("p3-2bit", "p3-never") else "-",
            fmt([100 * x["cpu_busy"] for x in runs[row]], 0)))
    goals = []
    if "p3" in med and "fifo" in med:
        g = med["p3"] / med["fifo"]
        goals.append("P3/FIFO %.2fx (paper %.2fx: %s)" % (
            g, PAPER_GAIN[model], "met" if g >= PAPER_GAIN[model] else "not met"))
    for p3 in ("p3", "p3-never"):
        if p3 in med and "ddp" in med:
            g = med[p3] / med["ddp"]
            goals.append("%s/DDP %.2fx (goal >= 1: %s)" % (
                LABELS[p3].replace("trellis ", ""), g, "met" if g >= 1 else "not met"))
    if "p3-2bit" in med and "p3" in med:
        g = med["p3-2bit"] / med["p3"]
        goals.append("2-bit/P3 %.2fx (goal >= 1.3 at 1 Gbit/s: %s)" % (
            g, "met" if g >= 1.3 else "not met"))
    for goal in goals:
        print("%-11s %s" % (model, goal))
    print(flush=True)
    return ok


def bench_accuracy(a):
    steps = ACCURACY_QUICK_STEPS if a.quick else a.accuracy_steps
    print("accuracy: ResNet-18, synthetic 10-class task (3x16x16 noisy templates), batch %d per "
          "worker, SGD lr %.2f momentum 0.9, %d steps, held-out 2000 samples; 2-bit threshold "
          "%g, warmupSteps %d" % (SIZES["resnet18"][0], a.lr_of("resnet18"), steps, a.threshold,
                                  a.warmup_steps), flush=True)
    acc, curves, ok = {}, {}, True
    for row in [r for r in ["ddp", "p3", "p3-2bit"] if r == "ddp" or r in a.rows]:
        t = time.monotonic()
        try:
            res = run_once(a, "resnet18", row, steps)
        except RuntimeError as e:
            print("  %-27s FAILED: %s" % (LABELS[row], e), flush=True)
            ok = False
            continue
        acc[row] = res["accuracy"]
        curves[row] = [tuple(p) for p in res.get("curve", [])]
        print("  %-27s accuracy %5.1f%%  (%.0f s)" % (LABELS[row], 100 * res["accuracy"],
                                                      time.monotonic() - t), flush=True)
    if a.eval_every and len(curves) > 1:
        rows = [r for r in ["ddp", "p3", "p3-2bit"] if r in curves]
        print("  %-6s %s%s" % ("step", "".join("%-28s" % LABELS[r] for r in rows),
                              "2-bit minus float32" if "p3" in curves and "p3-2bit" in curves
                              else ""))
        at = {r: dict(curves[r]) for r in rows}
        for step in sorted(set.intersection(*[set(at[r]) for r in rows])):
            gap = ("%+.1f points" % (100 * (at["p3-2bit"][step] - at["p3"][step]))
                   if "p3" in at and "p3-2bit" in at else "")
            print("  %-6d %s%s" % (step, "".join("%-28s" % ("%5.1f%%" % (100 * at[r][step]))
                                                 for r in rows), gap))
    if "p3" in acc and "p3-2bit" in acc:
        d = 100 * (acc["p3-2bit"] - acc["p3"])
        print("  2-bit minus float32: %+.1f points (goal: no more than 1 point below: %s)" % (
            d, "met" if d >= -1.0 else "not met"), flush=True)
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--role", choices=["main", "ddp", "trellis"], default="main")
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--out", default="")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--master", default="")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--models", default="resnet50,vgg19,transformer")
    ap.add_argument("--rows", default="fifo,p3,p3-2bit,p3-never",
                    help="besides ddp: fifo, p3, p3-2bit, p3-never")
    ap.add_argument("--rate", default="1gbit", help="each test host's link (tc tbf)")
    ap.add_argument("--cpu-per-host", type=float, default=-1,
                    help="each test host's own CPU budget in cores (a cgroup), as on separate "
                         "machines (default: the machine's cores split evenly over the 4 hosts; "
                         "0: every process shares all of the machine's cores)")
    ap.add_argument("--repeats", type=int, default=2, help="rounds over the rows")
    ap.add_argument("--threshold", type=float, default=0.001,
                    help="2-bit threshold (the workers' advice for these models: about 0.001)")
    ap.add_argument("--warmup-steps", type=int, default=0,
                    help="p3-2bit: spec.compression.warmupSteps (float32 steps first)")
    ap.add_argument("--accuracy", action="store_true",
                    help="only the accuracy check (ddp, and p3, p3-2bit when in --rows)")
    ap.add_argument("--accuracy-steps", type=int, default=ACCURACY_STEPS)
    ap.add_argument("--eval-every", type=int, default=0,
                    help="--accuracy: also the held-out accuracy every N steps (a curve)")
    ap.add_argument("--batch-of", default="",
                    help="MODEL=N,...: another batch per worker for these models (a step's "
                         "compute against its transfer; e.g. resnet50=4)")
    ap.add_argument("--quick", action="store_true", help="1 round, 1 timed step")
    ap.add_argument("--prefix", default="tm", help="test host names: <prefix>-h<i>")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per run")
    ap.add_argument("--keep-logs", action="store_true", help="keep each trellis run's logs")
    ap.add_argument("--log-dir", default="/tmp/bench_models")
    ap.add_argument("--bin-dir", default=os.path.join(SOURCE, "build", "bin"))
    ap.add_argument("--blas-dir", default="",
                    help="a directory with another libblas.so.3 for every process, DDP and "
                         "trellis alike (as bench_torch's --blas-dir); OPENBLAS_NUM_THREADS=1")
    a = ap.parse_args()
    if a.role == "ddp":
        return run_ddp(a)
    if a.role == "trellis":
        return run_trellis(a)
    for tool in ("netns_job_run", "trellis-python"):
        if not os.path.exists(os.path.join(a.bin_dir, tool)):
            sys.exit("bench_models: no %s in %s (build first, or give --bin-dir)" % (tool, a.bin_dir))
    try:
        import torchvision  # noqa: F401
    except ImportError:
        print("bench_models: needs torchvision (apt install python3-torchvision); nothing measured")
        return 0
    models = [m for m in a.models.split(",") if m]
    for m in models:
        if m not in PAPER_GAIN:
            sys.exit("bench_models: unknown model %r (%s)" % (m, ", ".join(PAPER_GAIN)))
    if a.blas_dir:
        if not os.path.exists(os.path.join(a.blas_dir, "libblas.so.3")):
            sys.exit("bench_models: no libblas.so.3 in --blas-dir %s" % a.blas_dir)
        old = os.environ.get("LD_LIBRARY_PATH", "")
        os.environ["LD_LIBRARY_PATH"] = a.blas_dir + (":" + old if old else "")
        os.environ["OPENBLAS_NUM_THREADS"] = "1"  # one thread per process, as torch's
    a.rows = [r for r in a.rows.split(",") if r and r != "ddp"]
    for r in a.rows:
        if r not in ROWS:
            sys.exit("bench_models: unknown row %r (%s)" % (r, ", ".join(ROWS)))
    try:
        a.batch_of = {m: int(n) for m, n in (kv.split("=") for kv in a.batch_of.split(",") if kv)}
    except ValueError:
        sys.exit("bench_models: --batch-of takes MODEL=N,... (got %r)" % a.batch_of)
    for m, n in a.batch_of.items():
        if m not in SIZES or n < 1:
            sys.exit("bench_models: --batch-of: unknown model or batch %s=%d" % (m, n))
    if a.cpu_per_host < 0:
        a.cpu_per_host = os.cpu_count() / (SERVERS + WORKERS)
    if a.quick:
        a.repeats = 1
    a.steps_of = lambda m: SIZES[m][3] if a.quick else SIZES[m][2]
    a.lr_of = lambda m: 0.05 if m == "resnet18" else 0.01
    if sh([TESTHOSTS, "check"]).returncode != 0:
        print("bench_models: network namespaces or tc are not available here (needs root); "
              "nothing measured")
        return 0
    os.makedirs(a.log_dir, exist_ok=True)
    up = sh([TESTHOSTS, "up", "--prefix", a.prefix, "--hosts", str(SERVERS + WORKERS),
             "--rate", a.rate] + (["--cpu", str(a.cpu_per_host)] if a.cpu_per_host else []))
    if up.returncode != 0:
        sys.exit("bench_models: testhosts.sh up failed:\n" + up.stdout)
    start = time.monotonic()
    ok = True
    try:
        print("bench_models: %d workers x %d servers, one test host each, links of %s (tc tbf), "
              "%s; " % (WORKERS, SERVERS, a.rate, "%g cores each (cgroup)" % a.cpu_per_host
                        if a.cpu_per_host else "sharing the machine's cores"), end="")
        print("torch.set_num_threads(1) per worker; SGD momentum 0.9; %d round%s; this machine "
              "has %d cores; BLAS %s; load average %.2f at the start" % (
                  a.repeats, "s" if a.repeats > 1 else "",
                  os.cpu_count(), a.blas_dir or "the system's libblas.so.3", os.getloadavg()[0]),
              flush=True)
        if a.accuracy:
            ok = bench_accuracy(a)
        else:
            for m in models:
                b, w, _, _ = SIZES[m]
                b = a.batch_of.get(m, b)
                print("%s: batch %d per worker, %d warm-up + %d timed steps a run" % (
                    m, b, w, a.steps_of(m)), flush=True)
                ok = bench_speed(a, m) and ok
    finally:
        sh([TESTHOSTS, "down", "--prefix", a.prefix])
    print("load average %.2f at the end; %.0f s in all" % (os.getloadavg()[0],
                                                         time.monotonic() - start))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
