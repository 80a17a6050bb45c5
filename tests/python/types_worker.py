"""One worker of the tensor-type and collective tests (test_torch_types_launch.py), run by
trellis-launch through trellis-python.

    types_worker.py OUT_DIR collectives     # allreduce / allgather / broadcast of tensors
    types_worker.py OUT_DIR order           # ranks call collectives in a different order
    types_worker.py OUT_DIR wire            # 16-bit keys: float32 sums, half the bytes
    types_worker.py OUT_DIR train WIRE      # DistributedOptimizer(wire_dtype=WIRE), a
                                            # non-contiguous parameter among the others
    types_worker.py OUT_DIR model DTYPE     # the whole model in DTYPE (16-bit gradients)
Writes OUT_DIR/checks<r>.txt (one line per check) and, for training, OUT_DIR/rank<r>.pt.
"""
import math
import os
import sys
import time

import numpy as np
import torch

import trellis
import trellis.torch as tt
import dp_common as dc


def collectives(r, n):
    out = []
    # Before any DistributedOptimizer: the channel is declared by the first collective.
    s = tt.allreduce(torch.tensor([1.0, 2.0]) * (r + 1), average=False, name="sum")
    out.append("sum %s" % s.tolist())
    out.append("average %s" % tt.allreduce(torch.tensor(float(r))).item())
    i = tt.allreduce(torch.full((2, 3), r + 1, dtype=torch.int64), average=False)
    out.append("int64 %s %s" % (i.dtype, i.flatten().tolist()))
    # Bigger than one round of the channel (65536 floats).
    big = torch.arange(200_000, dtype=torch.float32) * (r + 1)
    got = tt.allreduce(big, average=False)
    out.append("big %s" % bool(torch.equal(got, torch.arange(200_000, dtype=torch.float32) * 3)))
    # In place, on a non-contiguous view: only the view's elements change.
    m = torch.zeros(4, 4)
    col = m[:, 1]
    col.fill_(r + 1)
    tt.allreduce_(col, average=False)
    out.append("view %s rest %s" % (m[:, 1].tolist(), float(m.sum() - m[:, 1].sum())))
    # allgather: the first dimension differs between ranks.
    g = tt.allgather(torch.full((r + 1, 2), r, dtype=torch.int32))
    out.append("allgather %s %s" % (list(g.shape), g[:, 0].tolist()))
    out.append("allgather 0-d %s" % tt.allgather(torch.tensor(r + 10.0)).tolist())
    # broadcast: any dtype, bit for bit (a NaN payload, -0.0, float64 beyond float32).
    f = torch.tensor([1 + 2 ** -40, -0.0, float("nan")], dtype=torch.float64) if r == 1 else \
        torch.zeros(3, dtype=torch.float64)
    b = tt.broadcast(f, root_rank=1)
    out.append("broadcast %r %s %s" % (b[0].item(), math.copysign(1, b[1].item()),
                                       math.isnan(b[2].item())))
    flags = torch.tensor([True, False, True]) if r == 0 else torch.zeros(3, dtype=torch.bool)
    tt.broadcast_(flags, 0)
    out.append("bool %s" % flags.tolist())
    h = torch.tensor([1.5, -2.25], dtype=torch.bfloat16) * (1 if r == 0 else 0)
    out.append("bf16 %s" % tt.broadcast(h).tolist())
    # A DistributedOptimizer after collectives: its keys extend the key set, training works.
    torch.manual_seed(100 + r)
    model = dc.Net()
    opt = tt.DistributedOptimizer(dc.make_optimizer(model), model.named_parameters())
    tt.broadcast_parameters(model.state_dict(), root_rank=0)
    dc.train_steps(model, opt, 0, 2, r, n)
    w = tt.allgather(model.out.weight.detach().reshape(1, -1))
    out.append("models equal %s" % bool(torch.equal(w[0], w[1])))
    # A metric averaged after training steps (gradient keys and the channel side by side).
    out.append("loss mean %s" % tt.allreduce(torch.tensor([float(r)]), name="loss").tolist())
    return out


def order(r, n):
    out = []
    t0 = time.monotonic()
    try:
        if r == 0:
            tt.allreduce(torch.ones(3), name="a")
        else:
            tt.allreduce(torch.ones(3), name="b")
        out.append("no error")
    except tt.CollectiveError as e:
        out.append(str(e))
    try:
        if r == 0:
            tt.allreduce(torch.ones(3))
        else:
            tt.allgather(torch.ones(3))
        out.append("no error")
    except tt.CollectiveError as e:
        out.append(str(e))
    out.append("fast %s" % (time.monotonic() - t0 < 20))
    # The channel still works: the next collectives, in the same order, succeed.
    out.append("after %s" % tt.allreduce(torch.tensor([r + 1.0]), average=False).tolist())
    return out


def wire(r, n):
    out = []
    k16 = trellis.declare("f16", 4, wire="float16")
    kb = trellis.declare("bf16", 4, wire="bfloat16")
    k32 = trellis.declare("f32", 4096, wire="float32")
    kh = trellis.declare("f16big", 4096, wire="float16")
    try:
        trellis.declare("bad", 4, wire="float8")
    except trellis.TrellisError as e:
        out.append("%s %s" % (e.code_name, e))
    # The servers add the 16-bit pushes in float32: 60000 + 60000 is past float16's 65504,
    # 256 + 1 needs more bits than bfloat16 has; the answers (float32) hold them exactly.
    a = np.array([60000.0, 0.1, -3.0, 1e-8], np.float32) if r == 0 else \
        np.array([60000.0, 0.2, 1.5, 0.0], np.float32)
    trellis.push_pull(k16, a).wait()
    out.append("f16 %r %r %r" % (float(a[0]), float(a[2]), float(a[1])))
    c = np.array([256.0, 1.0, 3.0, 0.0], np.float32) if r == 0 else \
        np.array([1.0, 256.0, 0.01, 0.0], np.float32)
    trellis.push_pull(kb, c).wait()
    out.append("bf16 %r %r %r" % (float(c[0]), float(c[1]), float(c[2])))
    # Half the bytes on the way up (frame header: 16 bytes per slice).
    x = np.ones(4096, np.float32)
    before = trellis.bytes_pushed()
    trellis.push_pull(k32, x).wait()
    full = trellis.bytes_pushed() - before
    y = np.ones(4096, np.float32)
    before = trellis.bytes_pushed()
    trellis.push_pull(kh, y).wait()
    half = trellis.bytes_pushed() - before
    out.append("bytes ratio %.2f sums %s %s" % (half / full, float(x[0]), float(y[0])))
    return out


def train(r, n, wire_dtype):
    torch.manual_seed(100 + r)
    model = dc.Net()
    # A non-contiguous parameter: its gradient is non-contiguous too (same strides).
    w = model.out.weight.detach().t().contiguous().t()
    model.out.weight = torch.nn.Parameter(w)
    opt = tt.DistributedOptimizer(dc.make_optimizer(model), model.named_parameters(),
                                  wire_dtype=None if wire_dtype == "job" else wire_dtype)
    tt.broadcast_parameters(model.state_dict(), root_rank=0)
    x, y = dc.data()
    contiguous = []
    for s in range(dc.STEPS):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(dc.shard(x[s], r, n)),
                                                 dc.shard(y[s], r, n))
        loss.backward()
        contiguous.append(model.out.weight.grad.is_contiguous())
        opt.step()
    torch.save({k: v.contiguous() for k, v in model.state_dict().items()},
               os.path.join(OUT, "rank%d.pt" % r))
    return ["grad contiguous %s" % any(contiguous)]


def model16(r, n, dtype):
    torch.manual_seed(100 + r)
    model = dc.Net().to(getattr(torch, dtype))
    opt = tt.DistributedOptimizer(dc.make_optimizer(model), model.named_parameters())
    tt.broadcast_parameters(model.state_dict(), root_rank=0)
    x, y = dc.data()
    for s in range(dc.STEPS):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(
            model(dc.shard(x[s], r, n).to(model.conv.weight.dtype)).float(),
            dc.shard(y[s], r, n))
        loss.backward()
        opt.step()
    torch.save(model.state_dict(), os.path.join(OUT, "rank%d.pt" % r))
    return ["grad dtype %s" % model.conv.weight.grad.dtype]


def main():
    global OUT
    OUT, mode = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    trellis.init()
    r, n = trellis.rank(), trellis.size()
    if mode == "collectives":
        out = collectives(r, n)
    elif mode == "order":
        out = order(r, n)
    elif mode == "wire":
        out = wire(r, n)
    elif mode == "train":
        out = train(r, n, sys.argv[3])
    else:
        out = model16(r, n, sys.argv[3])
    with open(os.path.join(OUT, "checks%d.txt" % r), "w") as f:
        f.write("\n".join(out) + "\n")
    trellis.shutdown()


if __name__ == "__main__":
    main()
