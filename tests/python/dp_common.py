"""Model, data and training loop shared by the multi-worker scripts and the single-process
references of the tests (so both run exactly the same math)."""
import torch

STEPS = 6
GLOBAL_BATCH = 16


class Net(torch.nn.Module):
    """A small conv net on 8x8 single-channel images (4 parameters, 3 layers of keys)."""

    def __init__(self, lazy=False):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3)
        self.fc = torch.nn.LazyLinear(16) if lazy else torch.nn.Linear(4 * 6 * 6, 16)
        self.out = torch.nn.Linear(16, 10)

    def forward(self, x):
        x = torch.relu(self.conv(x)).flatten(1)
        return self.out(torch.relu(self.fc(x)))


def data(steps=STEPS):
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(steps, GLOBAL_BATCH, 1, 8, 8, generator=g)
    y = torch.randint(0, 10, (steps, GLOBAL_BATCH), generator=g)
    return x, y


def shard(t, rank, size):
    """This rank's contiguous part of a global batch (dim 0)."""
    n = t.shape[0] // size
    return t[rank * n:(rank + 1) * n]


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def train_steps(model, opt, first, last, rank=0, size=1):
    x, y = data()
    for s in range(first, last):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(shard(x[s], rank, size)),
                                                 shard(y[s], rank, size))
        loss.backward()
        opt.step()


class BNNet(torch.nn.Module):
    """Net with a BatchNorm layer: its running statistics are buffers, not parameters."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)
        self.out = torch.nn.Linear(4 * 6 * 6, 10)

    def forward(self, x):
        return self.out(torch.relu(self.bn(self.conv(x))).flatten(1))


MAX_NORM = 0.5


def train_steps_clipped(model, opt, first, last, rank=0, size=1, norms=None):
    """train_steps with clip_grad_norm_ between backward() and step() (no synchronize()); the
    norm it returns is recorded (gradient logging)."""
    x, y = data()
    dev = next(model.parameters()).device  # a model on the GPU gets its batches there
    for s in range(first, last):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(shard(x[s], rank, size).to(dev)),
                                                 shard(y[s], rank, size).to(dev))
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        if norms is not None:
            norms.append(float(norm))
        opt.step()


def train_steps_accumulated(model, opt, first, last, micro, rank=0, size=1, use_no_sync=True):
    """Each step: `micro` micro-batches of this rank's shard, loss / micro each, one step()."""
    x, y = data()
    for s in range(first, last):
        opt.zero_grad()
        xs, ys = shard(x[s], rank, size), shard(y[s], rank, size)
        for m in range(micro):
            xm, ym = shard(xs, m, micro), shard(ys, m, micro)
            loss = torch.nn.functional.cross_entropy(model(xm), ym) / micro
            if use_no_sync and m < micro - 1:
                with opt.no_sync():
                    loss.backward()
            else:
                loss.backward()
        opt.step()


def grad_scaler(init_scale=2.0 ** 12):
    """The CUDA GradScaler of this torch: torch.amp's (2.x), else torch.cuda.amp's (1.13)."""
    amp = getattr(torch, "amp", None)
    if amp is not None and hasattr(amp, "GradScaler"):
        return amp.GradScaler("cuda", init_scale=init_scale)
    return torch.cuda.amp.GradScaler(init_scale=init_scale)


def train_steps_amp(model, opt, scaler, first, last, rank=0, size=1, norms=None):
    """Mixed precision as the PyTorch AMP recipe writes it, on CUDA: autocast(float16), the
    scaled loss's backward, unscale_, clip_grad_norm_ (recorded), scaler.step and update."""
    x, y = data()
    for s in range(first, last):
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(model(shard(x[s], rank, size).cuda()),
                                                     shard(y[s], rank, size).cuda())
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        if norms is not None:
            norms.append(float(norm))
        scaler.step(opt)
        scaler.update()
