"""A training script as a PyTorch user writes it, with trellis.torch's crash recovery:
BatchNorm, dropout, SGD with momentum and weight decay, StepLR, a DistributedSampler, a
TrainingState. Run by test_torch_rejoin.py under trellis-launch (the command form).

    ft_train.py OUT_DIR [kill] [bf16] [cuda] [shuffle] [closure] [nostate] [ckpt=FILE] [slow]

kill: worker 1's first incarnation SIGKILLs itself in epoch 1, between backward() (its pushes
in flight) and step(); its agent restarts it and it rejoins. bf16: the model and its inputs in
bfloat16 (parameters the keeper stages through float32 host copies). cuda: the model on the
GPU (staged through pinned host copies). shuffle: DataLoader(shuffle=True) over each rank's shard
instead of a DistributedSampler. closure: opt.step(closure), the closure doing the forward and
backward (the update then changes the model while it waits for gradients). nostate: no TrainingState (the rejoined worker must stop, saying
why). ckpt=FILE: checkpoints as docs/pytorch.md shows them (load_checkpoint when FILE exists,
save_checkpoint at each epoch end). slow: rank 0 sleeps 80 ms a step (the same values; a stop
from outside lands mid-epoch). killexit: rank 0 SIGKILLs itself halfway through writing its exit
checkpoint (what a grace that runs out does). Every rank writes
OUT_DIR/rank<r>.pt (its final state_dict), OUT_DIR/result<r>.txt (test accuracy and loss)
and OUT_DIR/incarnation<r>.txt."""
import os
import signal
import sys
import time
import types

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import trellis
import trellis.torch as tt

EPOCHS, BATCH, KILL_AT = 3, 16, (1, 5)  # kill in epoch 1 before the 6th step's update


def data(n, seed):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    centers = torch.randn(4, 1, 12, 12, generator=torch.Generator().manual_seed(3))
    return centers[y] + 0.9 * torch.randn(n, 1, 12, 12, generator=g), y


def main():
    out, modes = sys.argv[1], set(sys.argv[2:])
    dtype = torch.bfloat16 if "bf16" in modes else torch.float32
    device = "cuda" if "cuda" in modes else "cpu"
    if device == "cuda":  # the undisturbed and the disturbed run must compute alike
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    torch.set_num_threads(1)
    trellis.init()
    rank, size = trellis.rank(), trellis.size()
    incarnation = os.environ.get("TRELLIS_INCARNATION", "1")
    with open(os.path.join(out, "incarnation%d.txt" % rank), "w") as f:
        f.write(incarnation + "\n")
    torch.manual_seed(10)  # the DDP habit: one seed everywhere (so a rejoiner's RNG is its own)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Dropout(0.3),
        torch.nn.Linear(8 * 6 * 6, 4)).to(device=device, dtype=dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    opt = tt.DistributedOptimizer(opt, model.named_parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    tt.broadcast_parameters(model.state_dict(), root_rank=0)
    tt.broadcast_optimizer_state(opt, root_rank=0)
    ckpt = next((m[len("ckpt="):] for m in modes if m.startswith("ckpt=")), "")
    if "killexit" in modes and rank == 0:
        from trellis import _checkpoint
        write = _checkpoint._write_checkpoint_file

        def killed_halfway(path, state):
            if "exit" not in state.get("trellis", {}):
                return write(path, state)
            import io
            buf = io.BytesIO()
            torch.save(state, buf)
            tmp = os.path.join(os.path.dirname(path), ".%s.tmp.%d" % (os.path.basename(path), os.getpid()))
            with open(tmp, "wb") as f:  # as _write_checkpoint_file does, cut short
                f.write(buf.getvalue()[:len(buf.getvalue()) // 2])
                f.flush()
                os.fsync(f.fileno())
            os.kill(os.getpid(), signal.SIGKILL)
        _checkpoint._write_checkpoint_file = killed_halfway
    first_epoch = 0
    if ckpt and os.path.exists(ckpt):
        first_epoch = (tt.load_checkpoint(ckpt, model, opt) or {}).get("epoch", 0)
    if "nostate" in modes:  # a script written without crash recovery in mind
        state = types.SimpleNamespace(epoch=0, batch=0, commit=lambda: None, rejoined_step=None,
                                      resumed_step=None)
    else:
        state = tt.TrainingState(model, opt, sched, epoch=first_epoch, batch=0)
    steps = 0

    x, y = data(512, 1)
    if "shuffle" in modes:
        # The most common loading: each rank's shard in a shuffling DataLoader, whose order is
        # drawn from the global RNG each time its iterator is made.
        sampler = None
        loader = DataLoader(TensorDataset(x[rank::size], y[rank::size]), batch_size=BATCH,
                            shuffle=True)
    else:
        train = TensorDataset(x, y)
        sampler = DistributedSampler(train, num_replicas=size, rank=rank, shuffle=True, seed=5)
        loader = DataLoader(train, batch_size=BATCH, sampler=sampler)
    for epoch in range(state.epoch, EPOCHS):
        if sampler is not None:
            sampler.set_epoch(epoch)
        model.train()
        for i, (xb, yb) in enumerate(loader):
            if i < state.batch:
                continue
            def closure():
                opt.zero_grad()
                loss = F.cross_entropy(model(xb.to(device=device, dtype=dtype)).float(),
                                       yb.to(device))
                loss.backward()
                if "kill" in modes and rank == 1 and incarnation == "1" and (epoch, i) == KILL_AT:
                    os.kill(os.getpid(), signal.SIGKILL)
                return loss
            if "closure" in modes:
                state.batch = i + 1
                opt.step(closure)
            else:
                closure()
                state.batch = i + 1
                if "slow" in modes and rank == 0:
                    time.sleep(0.08)
                opt.step()
            steps += 1
        sched.step()
        state.epoch, state.batch = epoch + 1, 0
        state.commit()
        if ckpt:
            tt.save_checkpoint(ckpt, model, opt, epoch=epoch + 1)

    model.eval()
    tx, ty = data(256, 2)
    with torch.no_grad():
        logits = model(tx.to(device=device, dtype=dtype)).float().cpu()
    acc = (logits.argmax(1) == ty).float().mean().item()
    loss = F.cross_entropy(logits, ty).item()
    torch.save(model.state_dict(), os.path.join(out, "rank%d.pt" % rank))
    with open(os.path.join(out, "result%d.txt" % rank), "w") as f:
        f.write("accuracy %.6f loss %.9f rejoined %s steps %d resumed %s\n"
                % (acc, loss, state.rejoined_step, steps, state.resumed_step))
    print("rank %d: accuracy %.4f loss %.6f (incarnation %s)" % (rank, acc, loss, incarnation))


if __name__ == "__main__":
    main()
