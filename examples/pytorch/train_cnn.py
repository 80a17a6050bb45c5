"""A small convolutional network trained data-parallel with trellis.torch.

    build/bin/trellis-launch examples/pytorch.yaml          # 2 servers x 2 workers
    build/bin/trellis-python examples/pytorch/train_cnn.py  # the same script, one process

Synthetic task (no downloads): 16x16 single-channel images, 10 classes; each class is a fixed
random smooth pattern placed at a random shift with noise on top. The lines marked "# trellis"
are everything Trellis adds to a plain PyTorch script; without a job (TRELLIS_SCHEDULER unset)
they do nothing and the script trains alone.

Fault tolerance: the TrainingState lets a worker that was killed (a deleted pod, kill -9, an
out-of-memory kill) rejoin the running job where the others are, bit for bit, with the ordinary
shuffling DataLoader (docs/pytorch.md#fault-tolerance). Progress (step, samples/s, ETA) is
reported without a call: from optimizer.step(), the DataLoader's batches and the state's `epochs`.
"""
import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import trellis                      # trellis
import trellis.torch as tt          # trellis


def make_data(n, seed, templates):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 10, (n,), generator=g)
    x = templates[y]
    shifts = torch.randint(-2, 3, (n, 2), generator=g)
    x = torch.stack([torch.roll(img, (int(s[0]), int(s[1])), dims=(1, 2))
                     for img, s in zip(x, shifts)])
    return x + 0.8 * torch.randn(x.shape, generator=g), y


def templates(seed=7):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(10, 1, 8, 8, generator=g)
    return F.interpolate(t, size=(16, 16), mode="bilinear", align_corners=False)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = torch.nn.Linear(32 * 4 * 4, 64)
        self.fc2 = torch.nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32, help="per worker")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--train-samples", type=int, default=8192)
    ap.add_argument("--test-samples", type=int, default=2000)
    ap.add_argument("--target-accuracy", type=float, default=0.9)
    ap.add_argument("--checkpoint", default="", help="save every epoch; resume when it exists")
    args = ap.parse_args()
    torch.set_num_threads(1)
    start = time.time()

    trellis.init()                                        # trellis: join the job (or run alone)
    rank, size = trellis.rank(), trellis.size()           # trellis: this worker's data shard
    # One seed on every worker (the DDP habit): rank 0's weights reach everyone through the
    # broadcast anyway, and a worker that rejoins continues with a live worker's random states.
    torch.manual_seed(1)

    t = templates()
    x, y = make_data(args.train_samples, 11, t)
    loader = DataLoader(TensorDataset(x[rank::size], y[rank::size]), batch_size=args.batch,
                        shuffle=True, drop_last=True)
    x_test, y_test = make_data(args.test_samples, 12, t)

    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    opt = tt.DistributedOptimizer(opt, model.named_parameters())   # trellis
    tt.broadcast_parameters(model.state_dict(), root_rank=0)       # trellis
    tt.broadcast_optimizer_state(opt, root_rank=0)                 # trellis
    first_epoch = 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        # (None on a worker that rejoined a running job: it holds a live worker's state.)
        first_epoch = (tt.load_checkpoint(args.checkpoint, model, opt) or {}).get("epoch", 0)
        if rank == 0:
            print("resumed from %s at epoch %d" % (args.checkpoint, first_epoch), flush=True)
    state = tt.TrainingState(model, opt, epoch=first_epoch, batch=0,   # trellis: a restarted
                             epochs=args.epochs)                       # worker resumes here

    def evaluate():
        model.eval()
        with torch.no_grad():
            return (model(x_test).argmax(1) == y_test).float().mean().item()

    acc = None
    for epoch in range(state.epoch, args.epochs):
        model.train()
        total, steps = 0.0, 0
        for i, (xb, yb) in enumerate(loader):
            if i < state.batch:
                continue                                  # trellis: done before a rejoin
            opt.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            state.batch = i + 1                           # trellis
            opt.step()
            total, steps = total + loss.item(), steps + 1
        state.epoch, state.batch = epoch + 1, 0           # trellis
        state.commit()                                    # trellis
        acc = evaluate()
        if args.checkpoint:
            tt.save_checkpoint(args.checkpoint, model, opt, epoch=epoch + 1)
        if rank == 0:
            print("epoch %d: train loss %.4f, test accuracy %.1f%%"
                  % (epoch + 1, total / max(steps, 1), 100 * acc), flush=True)
    if acc is None:  # a finished job started again: its restored model is the result
        if rank == 0:
            print("nothing left to train (the checkpoint is of epoch %d, the last): evaluating "
                  "the restored model" % state.epoch, flush=True)
        acc = evaluate()
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        print("RESULT: test accuracy %.1f%% (target %.1f%%) -- %s"
              % (100 * acc, 100 * args.target_accuracy,
                 "reached" if acc >= args.target_accuracy else "missed"))
        print("RESULT: %d parameters, %d worker(s), %.1f s, bytes pushed %d"
              % (params, size, time.time() - start, trellis.bytes_pushed()), flush=True)
    return 0 if acc >= args.target_accuracy else 1


if __name__ == "__main__":
    sys.exit(main())
