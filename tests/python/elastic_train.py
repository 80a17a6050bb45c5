"""An elastic PyTorch training script as docs/elastic.md#pytorch shows it: an ElasticSampler
behind a plain DataLoader, an ElasticState with an on_resize hook scaling the learning rate,
gradient clipping, SGD with momentum. Run by test_torch_elastic.py under trellis-launch; the
test resizes the job while it trains.

    elastic_train.py OUT_DIR

Each worker appends to OUT_DIR/seen<slot>.txt (slot: its rank at the start) one line per step:
"epoch step rank size idx idx ...", the samples it trained; OUT_DIR/resized<slot>.txt gets
"rank size lr" per resize hook call; every worker that trains to the end writes
OUT_DIR/final<slot>.txt (the SHA-1 of its parameters' bytes); rank 0 of the last world writes
OUT_DIR/result.txt ("accuracy loss")."""
import hashlib
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

import trellis
import trellis.torch as tt

EPOCHS, BATCH, N, LR = 4, 8, 960, 0.05


class Indexed(Dataset):
    """A 4-class problem whose items carry their index (what the test checks)."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.y = torch.randint(0, 4, (n,), generator=g)
        centers = torch.randn(4, 16, generator=torch.Generator().manual_seed(3))
        self.x = centers[self.y] + 0.8 * torch.randn(n, 16, generator=g)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return i, self.x[i], self.y[i]


def main():
    out = sys.argv[1]
    torch.set_num_threads(1)
    trellis.init()
    slot = trellis.rank()
    torch.manual_seed(10)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=LR * trellis.size(), momentum=0.9)
    opt = tt.DistributedOptimizer(opt, model.named_parameters())
    tt.broadcast_parameters(model.state_dict(), root_rank=0)
    tt.broadcast_optimizer_state(opt, root_rank=0)

    ds = Indexed(N, seed=1)
    sampler = tt.ElasticSampler(ds, shuffle=True, seed=7)
    loader = DataLoader(ds, batch_size=BATCH, sampler=sampler)
    state = tt.ElasticState(model, opt, sampler=sampler, epoch=0, batch=0, epochs=EPOCHS)

    @state.on_resize
    def scale_lr(world):  # the linear scaling rule, as a learning-rate scaler does
        for g in opt.param_groups:
            g["lr"] = LR * world.size
        with open(os.path.join(out, "resized%d.txt" % slot), "a") as f:
            f.write("%d %d %g\n" % (world.rank, world.size, opt.param_groups[0]["lr"]))

    seen = open(os.path.join(out, "seen%d.txt" % slot), "a", buffering=1)
    step = state.rejoined_step or 0  # a grow's joiner continues from the members' step
    for epoch in range(state.epoch, EPOCHS):
        sampler.set_epoch(epoch)
        for i, (idx, x, y) in enumerate(loader):
            w = tt.world()  # the world this step trains in
            step += 1
            # Before backward() pushes: a program killed after its push still recorded the step
            # (its restart, from the step before, trains the same samples again).
            seen.write("%d %d %d %d %s\n" % (epoch, step, w.rank, w.size, " ".join(map(str, idx.tolist()))))
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            time.sleep(0.03)  # a few seconds of training: the test's resize lands mid-epoch
            state.batch = i + 1
            opt.step()  # a resize takes effect here; the worker resized away exits 0 here
        state.epoch, state.batch = epoch + 1, 0
        state.commit()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    with open(os.path.join(out, "final%d.txt" % slot), "w") as f:
        f.write(hashlib.sha1(flat.numpy().tobytes()).hexdigest() + "\n")
    if trellis.rank() == 0:
        with torch.no_grad():
            test = Indexed(400, seed=2)
            logits = model(test.x)
            acc = (logits.argmax(1) == test.y).float().mean().item()
            with open(os.path.join(out, "result.txt"), "w") as f:
                f.write("%.4f %.4f\n" % (acc, F.cross_entropy(logits, test.y).item()))


if __name__ == "__main__":
    main()
