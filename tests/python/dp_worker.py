"""One worker of the multi-worker tests (run by trellis-launch through trellis-python).

    dp_worker.py OUT_DIR train                 # broadcast init, STEPS steps, save parameters
    dp_worker.py OUT_DIR lazy                  # LazyLinear, per-rank seeds, 1 step
    dp_worker.py OUT_DIR save K CKPT           # K steps, checkpoint, exit
    dp_worker.py OUT_DIR resume CKPT           # restore, train to STEPS
    dp_worker.py OUT_DIR lowlevel              # the trellis API without trellis.torch
    dp_worker.py OUT_DIR clip                  # clip_grad_norm_ with no synchronize()
    dp_worker.py OUT_DIR bn                    # BatchNorm, per-rank data: buffers
    dp_worker.py OUT_DIR bn-cuda               # the same with the model on the GPU
    dp_worker.py OUT_DIR accum                 # 2 micro-batches per step (no_sync, then plain)
    dp_worker.py OUT_DIR save0 K CKPT          # K steps, save on rank 0 only, train to STEPS
    dp_worker.py OUT_DIR join                  # rank r has STEPS - 3 + 2r batches, join()
    dp_worker.py OUT_DIR update                # DistributedOptimizer in serverMode: update
    dp_worker.py OUT_DIR amp                   # CUDA: autocast, GradScaler, unscale_, clipping
Writes OUT_DIR/rank<r>.pt (the final state_dict) and OUT_DIR/checks<r>.txt.
"""
import os
import sys
import threading

import torch

import trellis
import trellis.torch as tt
import dp_common as dc


def lowlevel(r, n):
    """Each check appends one line; the test compares them."""
    import numpy as np
    out = []
    ka = trellis.declare("a", 1000)
    kb = trellis.declare(7, 10, "b")
    kc = trellis.declare("c", 5)
    kd = trellis.declare("d", 4)
    # A torch tensor is summed in its own memory (no copy): wait() returns the tensor itself.
    t = torch.full((1000,), float(r + 1))
    h = trellis.push_pull(ka, t, priority=1)
    out.append("tensor in place %s" % (h.wait() is t and bool((t == n * (n + 1) / 2).all())))
    # A separate output array; the input stays as it was.
    src, dst = np.full(10, r + 1, np.float32), np.zeros(10, np.float32)
    trellis.push_pull(kb, src, out=dst).wait()
    out.append("out %s src %s" % (dst.tolist() == [3.0] * 10, src.tolist() == [r + 1.0] * 10))
    # A handle dropped before completion keeps its array alive (the drop waits).
    x = np.full(1000, 2.0, np.float32)
    trellis.push_pull(ka, x)
    del x
    y = np.ones(1000, np.float32)
    out.append("after drop %s" % (trellis.push_pull(ka, y).wait()[0] == n))
    c = np.full(5, float(r), np.float32)
    trellis.broadcast(kc, c, root=1).wait()
    out.append("broadcast from 1 %s" % c.tolist())
    try:
        trellis.broadcast(ka, t).wait()
    except trellis.TrellisError as e:
        out.append("%s %s" % (e.code_name, e))
    # wait() releases the GIL: rank 0 waits in a thread for rank 1's push, which comes only
    # after a barrier that rank 0's main thread enters meanwhile (else: deadlock, job fails).
    d = np.ones(4, np.float32)
    if r == 0:
        h = trellis.push_pull(kd, d)
        th = threading.Thread(target=h.wait, name="waiter")
        th.start()
        trellis.barrier("gil")
        th.join()
    else:
        trellis.barrier("gil")
        trellis.push_pull(kd, d).wait()
    out.append("gil released %s" % (d.tolist() == [float(n)] * 4))
    trellis.barrier("done")
    out.append("bytes %s" % (trellis.bytes_pushed() > 0 and trellis.bytes_pulled() > 0))
    return out


def main():
    out_dir, mode = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    trellis.init()
    if mode == "lowlevel":
        with open(os.path.join(out_dir, "checks%d.txt" % trellis.rank()), "w") as f:
            f.write("\n".join(lowlevel(trellis.rank(), trellis.size())) + "\n")
        trellis.shutdown()
        return
    r, n = trellis.rank(), trellis.size()
    checks = []
    torch.manual_seed(100 + r)  # every worker starts from different weights
    model = dc.BNNet() if mode.startswith("bn") else dc.Net(lazy=(mode == "lazy"))
    if mode in ("amp", "bn-cuda"):
        model = model.cuda()
    opt = dc.make_optimizer(model)
    if mode.startswith("bn"):
        # docs/pytorch.md's order and calls: the optimizer first (it declares the keys, the
        # buffers' too: named_parameters() tells the module), then the broadcasts.
        opt = tt.DistributedOptimizer(opt, model.named_parameters())
        tt.broadcast_parameters(model.state_dict(), root_rank=0)
        tt.broadcast_optimizer_state(opt, root_rank=0)
    else:
        # Horovod's order: broadcasts first (queued until the keys are declared).
        tt.broadcast_parameters(model.state_dict(), root_rank=0)
        tt.broadcast_optimizer_state(opt, root_rank=0)
        opt = tt.DistributedOptimizer(opt, model.named_parameters())
    if mode == "train":
        # A C++ error arrives as a TrellisError with the library's message.
        try:
            trellis.push_pull(99, torch.zeros(3)).wait()
            checks.append("no error")
        except trellis.TrellisError as e:
            checks.append("%d %s %s" % (e.code, e.code_name, e))
        # Arrays the library cannot use are refused before anything is sent.
        import numpy as np
        grad_key = (1 << 61) + 5  # out.bias: 10 elements
        for bad in (np.zeros(10, np.float64), np.zeros(20, np.float32)[::2],
                    np.zeros(11, np.float32)):
            try:
                trellis.push_pull(grad_key, bad).wait()
                checks.append("accepted")
            except trellis.TrellisError as e:
                checks.append("%d %s" % (e.code, e))
        dc.train_steps(model, opt, 0, dc.STEPS, r, n)
    elif mode == "lazy":
        dc.train_steps(model, opt, 0, 1, r, n)
    elif mode in ("clip", "bn", "bn-cuda"):
        norms = []
        dc.train_steps_clipped(model, opt, 0, dc.STEPS, r, n, norms)
        checks.extend("%.9g" % v for v in norms)
        model = model.cpu()
    elif mode == "amp":
        norms = []
        scaler = dc.grad_scaler()
        dc.train_steps_amp(model, opt, scaler, 0, dc.STEPS, r, n, norms)
        checks.extend("%.9g" % v for v in norms)
        checks.append("scale %g" % scaler.get_scale())
        model = model.cpu()
    elif mode == "accum":
        dc.train_steps_accumulated(model, opt, 0, 3, 2, r, n, use_no_sync=True)
        dc.train_steps_accumulated(model, opt, 3, dc.STEPS, 2, r, n, use_no_sync=False)
    elif mode == "save0":
        k = int(sys.argv[3])
        dc.train_steps(model, opt, 0, k, r, n)
        if r == 0:  # the usual PyTorch habit
            tt.save_checkpoint(sys.argv[4], model, opt, step=k)
        dc.train_steps(model, opt, k, dc.STEPS, r, n)
    elif mode == "update":
        dc.train_steps(model, opt, 0, 1, r, n)  # not reached: DistributedOptimizer refuses
    elif mode == "join":
        with opt.join():
            dc.train_steps(model, opt, 0, dc.STEPS - 3 + 2 * r, r, n)
        checks.append("joined")
    elif mode == "save":
        k = int(sys.argv[3])
        dc.train_steps(model, opt, 0, k, r, n)
        tt.save_checkpoint(sys.argv[4], model, opt, step=k)
    elif mode == "resume-damaged":
        # The root cannot read the file: every worker must get the error, none may hang.
        try:
            tt.load_checkpoint(sys.argv[3], model, opt)
            checks.append("loaded")
        except tt.CheckpointError as e:
            checks.append(str(e).replace(sys.argv[3], "CKPT"))
    elif mode == "resume":
        # Every worker but the root forgets its state: the restore must bring it back.
        extra = tt.load_checkpoint(sys.argv[3], model, opt)
        checks.append("resumed at %d" % extra["step"])
        dc.train_steps(model, opt, extra["step"], dc.STEPS, r, n)
    torch.save(model.state_dict(), os.path.join(out_dir, "rank%d.pt" % r))
    with open(os.path.join(out_dir, "checks%d.txt" % r), "w") as f:
        f.write("\n".join(checks) + "\n")
    trellis.shutdown()


if __name__ == "__main__":
    main()
