"""trellis.torch against torch.nn.parallel.DistributedDataParallel (gloo), same run.

    build/bin/bench_torch            # every row (a few minutes on an idle 2-core machine)
    build/bin/bench_torch --quick    # fewer steps: checks that every row runs (about a minute)

Both sides train the same model on the same synthetic data, 2 worker processes, each with
torch.set_num_threads(1): DDP over gloo on loopback, and trellis.torch under trellis-launch
(the command form: --workers 2 --servers S [--compression 2bit]). Models: a small CNN
(32x32x3 images) and a ~25M-parameter MLP. A row's figure is samples/s over both workers
(rank 0's clock, from a barrier after the warm-up steps to the end of the timed steps); DDP runs
first and again last for each model, and the ratios are to the mean of those two figures.
"""
import argparse
import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


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


def train(model, opt, x, y, warmup, steps, barrier):
    """Runs warmup + steps steps; returns seconds of the timed ones (after a barrier)."""
    import torch.nn.functional as F
    for i in range(warmup + steps):
        if i == warmup:
            barrier()
            t0 = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    barrier()
    return time.perf_counter() - t0


def run_ddp(args):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % args.port,
                            rank=args.rank, world_size=args.world)
    model = torch.nn.parallel.DistributedDataParallel(build_model(args.model))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = batch_for(args.model, args.rank, args.batch)
    secs = train(model, opt, x, y, args.warmup, args.steps, dist.barrier)
    if args.rank == 0:
        print("RESULT %.3f" % (args.world * args.batch * args.steps / secs), flush=True)
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
    secs = train(model, opt, x, y, args.warmup, args.steps, barrier)
    if trellis.rank() == 0:
        print("RESULT %.3f" % (trellis.size() * args.batch * args.steps / secs), flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_result(out, what):
    for line in out.splitlines():
        if "RESULT " in line:
            return float(line.split("RESULT ")[1].split()[0])
    raise RuntimeError("%s printed no RESULT line:\n%s" % (what, out[-4000:]))


def common_args(model, a):
    return ["--model", model, "--batch", str(a.batch[model]), "--warmup", str(a.warmup),
            "--steps", str(a.steps[model])]


def bench_ddp(model, a):
    port = free_port()
    procs = [subprocess.Popen([sys.executable, __file__, "--role", "ddp", "--rank", str(r),
                               "--world", "2", "--port", str(port)] + common_args(model, a),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=a.timeout)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise RuntimeError("DDP %s: no result within %d s" % (model, a.timeout))
    if any(p.returncode != 0 for p in procs):
        raise RuntimeError("DDP %s failed:\n%s" % (model, "\n".join(outs)[-4000:]))
    return parse_result(outs[0], "DDP " + model)


def bench_trellis(model, servers, compression, a, policy="Never"):
    cmd = [os.path.join(a.bin_dir, "trellis-launch"), "--quiet", "--no-metrics",
           "--workers", "2", "--servers", str(servers), "--restart-policy", policy,
           "--name", "bench-torch", "--compression", compression, "--",
           os.path.join(a.bin_dir, "trellis-python"), __file__, "--role", "trellis"] + \
        common_args(model, a)
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=a.timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError("trellis %s: no result within %d s" % (model, a.timeout))
    if p.returncode != 0:
        raise RuntimeError("trellis %s failed (rc %d):\n%s" % (model, p.returncode, p.stdout[-4000:]))
    return parse_result(p.stdout, "trellis " + model)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--role", choices=["main", "ddp", "trellis"], default="main")
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--models", default="cnn,mlp", help="main: which models")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--batch", type=int, default=0, help="per worker (default: the model's)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=0, help="timed steps (default: the model's)")
    ap.add_argument("--quick", action="store_true", help="main: few steps, to check it runs")
    ap.add_argument("--bin-dir", default=os.path.dirname(os.path.abspath(sys.argv[0]))
                    if os.path.basename(sys.argv[0]) == "bench_torch" else "",
                    help="where trellis-launch and trellis-python are (default: the build's bin)")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per row")
    ap.add_argument("--blas-dir", default="",
                    help="a directory with another libblas.so.3 for every process, DDP and "
                         "trellis alike (e.g. /usr/lib/x86_64-linux-gnu/openblas-pthread from "
                         "libopenblas0-pthread); OPENBLAS_NUM_THREADS=1 is set with it")
    a = ap.parse_args()
    if a.role == "ddp":
        return run_ddp(a)
    if a.role == "trellis":
        return run_trellis(a)
    if not a.bin_dir:
        a.bin_dir = os.path.join(HERE, "..", "..", "build", "bin")
    if not os.path.exists(os.path.join(a.bin_dir, "trellis-launch")):
        sys.exit("bench_torch: no trellis-launch in %s (build first, or give --bin-dir)" % a.bin_dir)
    a.batch = {"cnn": a.batch or 64, "mlp": a.batch or 64}
    default_steps = {"cnn": 4, "mlp": 2} if a.quick else {"cnn": 30, "mlp": 12}
    a.steps = {m: a.steps or default_steps[m] for m in default_steps}
    if a.quick:
        a.warmup = min(a.warmup, 1)
    if a.blas_dir:
        if not os.path.exists(os.path.join(a.blas_dir, "libblas.so.3")):
            sys.exit("bench_torch: no libblas.so.3 in --blas-dir %s" % a.blas_dir)
        old = os.environ.get("LD_LIBRARY_PATH", "")
        os.environ["LD_LIBRARY_PATH"] = a.blas_dir + (":" + old if old else "")
        os.environ["OPENBLAS_NUM_THREADS"] = "1"  # one thread per process, as torch's
    blas = a.blas_dir or os.path.realpath("/usr/lib/x86_64-linux-gnu/libblas.so.3")
    load = os.getloadavg()[0]
    print("bench_torch: 2 workers, torch.set_num_threads(1) each, SGD momentum 0.9, batch %d "
          "per worker; %d + %d (cnn) and %d + %d (mlp) warm-up + timed steps; load average %.2f "
          "at the start" % (a.batch["mlp"], a.warmup, a.steps["cnn"], a.warmup, a.steps["mlp"],
                            load))
    print("BLAS: %s (the MLP is matrix products: Debian's reference BLAS is ~20x slower than "
          "OpenBLAS, which leaves communication a small share of a step)" % blas, flush=True)
    print("%-5s %-26s %12s %9s" % ("model", "configuration", "samples/s", "vs DDP"), flush=True)
    failed = False
    for model in a.models.split(","):
        rows = [("DDP gloo", lambda: bench_ddp(model, a)),
                ("trellis 1 server", lambda: bench_trellis(model, 1, "none", a)),
                ("trellis 2 servers", lambda: bench_trellis(model, 2, "none", a))]
        if model == "mlp":
            rows += [("trellis 1 server 2-bit", lambda: bench_trellis(model, 1, "2bit", a)),
                     ("trellis 2 servers 2-bit", lambda: bench_trellis(model, 2, "2bit", a)),
                     # The default restart policy: per-step commits for crash recovery.
                     ("trellis 1 server OnFailure",
                      lambda: bench_trellis(model, 1, "none", a, "OnFailure"))]
        # DDP first and again last: the ratio is to the mean of the two, so a load that drifts
        # during the model's rows biases no row (the two DDP figures show how much it drifted).
        rows.append(("DDP gloo (again)", rows[0][1]))
        results = []
        for label, fn in rows:
            try:
                results.append((label, fn()))
            except RuntimeError as e:
                print("%-5s %-26s %12s   %s" % (model, label, "FAILED", e), flush=True)
                failed = True
                results.append((label, None))
                continue
            print("%-5s %-26s %12.1f" % (model, label, results[-1][1]), flush=True)
        ddp = [v for label, v in results if label.startswith("DDP") and v]
        base = sum(ddp) / len(ddp) if ddp else None
        print("%-5s ratios to DDP (mean of %s samples/s):" % (
            model, " and ".join("%.1f" % v for v in ddp) or "no DDP figure"), flush=True)
        for label, v in results:
            if v and base and not label.startswith("DDP"):
                print("%-5s %-26s %12.1f %8.2fx" % (model, label, v, v / base), flush=True)
    print("load average %.2f at the end" % os.getloadavg()[0])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
