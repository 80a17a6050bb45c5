"""Crash recovery for trellis.torch: a restarted worker rejoins from a live worker's last step.

The C++ RejoinKeeper (worker-lib/src/rejoin_keeper.h; docs/checkpoints.md#crash-recovery-workers)
hands the parameters (on their gradient keys) and one "arena" buffer on its own key, as they
were at a live worker's (the donor's) last step boundary, to a restarted one. This module fills
the arena with everything else a PyTorch program needs to continue bit for bit: the optimizer's
state tensors and hyper-parameters, model buffers (BatchNorm statistics), the LR scheduler, the
RNG states and the program's own values (epoch, batch) of a TrainingState.

The keeper runs live: nothing the size of the model is copied at a step boundary. The
parameters and the optimizer's state change only inside DistributedOptimizer.step(), which the
keeper brackets (begin_update ... commit), so between two steps they are the last commit's; a
serve waits outside that window and the next step's update waits for the serve. A commit lays
the arena out (sizes, offsets, the pickled metadata: the "outgrew" error comes here, at the
step, not at a rejoin) and copies only what the next forward changes: model buffers, the
TrainingState's tensors, the RNG states. The tensors are written into the arena when a rejoin
is served (_prepare, on the keeper's thread).

Arena layout (bytes): a 32-byte header (magic, step, metadata offset, metadata length, as
int64), then the raw bytes of every tensor (8-byte aligned), then the pickled metadata that
names where each tensor lies. Its size is fixed at the seal (every worker, the restarted one
too, declares the same key): the optimizer's state per parameter (measured on a probe optimizer
of the same class), plus TRELLIS_TORCH_REJOIN_EXTRA_BYTES (default 4 MiB) for buffers and
metadata.
"""

import os
import pickle
import struct

import numpy as np
import torch

import trellis as _trellis
from trellis import _keys, _rng, _torch_tensors
from trellis._loader_watch import WATCH as _LOADERS

ARENA_KEY = _keys.REJOIN_ARENA
_MAGIC = 0x314E494F4A455254  # "TREJOIN1"
_HEADER = struct.Struct("<qqqq")
_EXTRA_ENV = "TRELLIS_TORCH_REJOIN_EXTRA_BYTES"
_DEFAULT_EXTRA = 4 << 20


def _align(n):
    return (n + 7) & ~7


def enabled_by_env(elastic=False):
    """On when this worker's crash is followed by a restart (TRELLIS_RESTART_POLICY from the
    agent, not Never), and in an elastic job (a grow's joiner takes the state from a live worker
    the same way); TRELLIS_TORCH_REJOIN=0/1 overrides."""
    forced = os.environ.get("TRELLIS_TORCH_REJOIN", "")
    if forced in ("0", "1"):
        return forced == "1"
    policy = os.environ.get("TRELLIS_RESTART_POLICY", "")
    return elastic or policy not in ("", "Never")


# Parameter types a commit keeps exactly: the keeper moves float32 values, and these convert to
# float32 and back without loss (float64 would not).
_KEEPABLE = (torch.float32, torch.float16, torch.bfloat16)


def keepable(p):
    """Whether crash recovery can keep parameter p: float32, float16 or bfloat16, on the CPU or
    a GPU. The keeper reads float32 C-contiguous CPU memory; any other parameter is staged
    through a float32 host copy of its own at each commit."""
    return p.dtype in _KEEPABLE


def blocker(named_params, in_step):
    """Why crash recovery cannot run for these (name, parameter) pairs, or None."""
    if in_step:
        return ("the parameters were declared inside the first step (a lazy module): run one "
                "forward pass on a sample batch before DistributedOptimizer(...), so that every "
                "parameter has its shape")
    for name, p in named_params:
        if not keepable(p):
            return ("parameter %s is %s (a commit keeps float32 values: float32, float16 and "
                    "bfloat16 are kept)" % (name, str(p.dtype).replace("torch.", "")))
    return None


def _state_bytes(state):
    return sum(v.numel() * v.element_size() for v in state.values() if isinstance(v, torch.Tensor))


def probe_optimizer(opt_class, defaults):
    """(per-element bytes, per-parameter bytes) of the optimizer's state after one step,
    measured on two tiny parameters; a generous guess when the probe cannot run."""
    try:
        got = []
        for n in (1, 3):
            p = torch.zeros(n, requires_grad=True)
            p.grad = torch.full((n,), 1e-3)
            o = opt_class([p], **defaults)
            o.step()
            got.append(_state_bytes(o.state[p]))
        per_elem = max(0, (got[1] - got[0]) // 2)
        return per_elem, max(0, got[0] - per_elem)
    except Exception:  # noqa: BLE001 (any optimizer of the user's: fall back to Adam's size)
        return 12, 64


def arena_bytes(params_by_opt, extra=None):
    """The arena's size for these optimizers' parameters (identical on every worker)."""
    if extra is None:
        extra = int(os.environ.get(_EXTRA_ENV, "") or _DEFAULT_EXTRA)
    total = _HEADER.size + extra
    for opt, params in params_by_opt:
        per_elem, per_param = probe_optimizer(opt._trellis_base, opt.defaults)
        for p in params:
            total += _align(per_elem * p.numel() + per_param) + 8 * 4  # a few tensors' padding
    return _align(total)


class _Ref:
    """A tensor in the arena: where, and how to rebuild it."""

    def __init__(self, off, dtype, shape):
        self.off, self.dtype, self.shape = off, dtype, shape


class _Packer:
    """Lays tensors out in the arena: tree() and put() give each its _Ref (offset, type, shape)
    and remember it; write() copies them in. With clone=True put() keeps a copy of the tensor as
    it is now (for what changes before a later write()); else the tensor itself."""

    def __init__(self, pool, clone=False, start=_HEADER.size):
        self.pool = pool  # uint8 torch tensor over the arena
        self.off = start
        self.clone = clone
        self.puts = []    # (tensor, offset)

    def put(self, t):
        t = t.detach()
        n = t.numel() * t.element_size()
        if self.off + n > self.pool.numel():
            raise _Full()
        if n:
            self.puts.append((t.clone() if self.clone else t, self.off))
        ref = _Ref(self.off, t.dtype, tuple(t.shape))
        self.off = _align(self.off + n)
        return ref

    def tree(self, x):
        """x with every tensor replaced by its _Ref (dicts, lists, tuples walked)."""
        if isinstance(x, torch.Tensor):
            return self.put(x)
        if isinstance(x, dict):
            return {k: self.tree(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return type(x)(self.tree(v) for v in x)
        return x

    def write(self):
        """Copies every tensor laid out so far to its offset."""
        for t, off in self.puts:
            if t.device.type != "cpu":
                t = t.cpu()
            n = t.numel() * t.element_size()
            self.pool[off:off + n].copy_(t.reshape(-1).view(torch.uint8))


class _Full(Exception):
    pass


def _unpack(pool, x):
    if isinstance(x, _Ref):
        n = int(np.prod(x.shape, dtype=np.int64)) * torch.empty(0, dtype=x.dtype).element_size()
        raw = pool[x.off:x.off + n].clone()
        return raw.view(x.dtype).reshape(x.shape)
    if isinstance(x, dict):
        return {k: _unpack(pool, v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_unpack(pool, v) for v in x)
    return x


class Keeper:
    """This process's rejoin state: the C++ keeper over the parameters and the arena."""

    def __init__(self, worker, params, optimizers, size):
        self.worker = worker
        self.optimizers = optimizers    # in declaration order
        self.arena = np.zeros(size // 4, dtype=np.float32)
        self.pool = torch.from_numpy(self.arena).view(torch.uint8)
        self.step = 0
        self.training_state = None      # the program's TrainingState, once made
        self.rejoined = None            # the donor's step on a worker that rejoined
        self.meta = None                # the donor's metadata (rejoined worker)
        self.committed = False
        self.layout = None              # (step, packers, blob) of the last commit (_prepare)
        self.no_window = False          # this step changes the model outside a window
        self.base_step = 0              # the loaded checkpoint's step (_state.global_step)
        # (parameter, its Stage) for parameters the keeper cannot read in place (16-bit, on a
        # GPU, not contiguous): a float32 host buffer as a staged gradient has (pinned for a GPU
        # parameter), refreshed before each commit and copied back after a rejoin.
        self.staged = []
        arrays = []
        for n, p, k in params:
            stage = _torch_tensors.Stage()
            arrays.append((n, k, stage.load(p.detach()).numpy()))
            if stage.buf is not None:
                self.staged.append((p, stage))
        worker.rejoin_start(arrays, ARENA_KEY, self.arena, self._prepare)

    def first_commit(self):
        """Before the first push of a step with nothing committed yet: what the worker holds
        now (step 0 after the start-up broadcasts, or the step a rejoined worker took over)."""
        self.commit(copy=self.no_window)  # in a closure the update follows outside a window

    def begin_update(self):
        """DistributedOptimizer.step() is about to update the parameters and the optimizer's
        state (after the gradients are in: waiting for them inside the window would keep a
        serve, and with it the rejoiner those gradients wait for, out)."""
        self.worker.rejoin_begin_update()

    def keep_copy(self):
        """The program is about to change the parameters or the optimizer's state while it may
        wait for the other workers (step(closure): the closure's backward waits for gradients;
        join()'s last broadcast), where no window can be open: the last commit is copied, and a
        serve hands out the copy until the next commit."""
        self.no_window = True
        if self.layout is None:
            return
        self.begin_update()
        step = self.layout[0]
        self._prepare(step)
        self.worker.rejoin_commit(step, again=True, copy=True)

    def after_step(self):
        """DistributedOptimizer.step() is done: every update of this step is applied."""
        if self.rejoined is not None and self.training_state is None:
            # ConfigurationError (exit 78): every restart would end the same way.
            raise _trellis.ConfigurationError(
                "trellis.torch: this worker rejoined the running job after step %d, but the "
                "program keeps no trellis.torch.TrainingState, so it cannot know where to resume "
                "(its loop starts over); create one after the optimizer "
                "(docs/pytorch.md#fault-tolerance), or turn crash recovery off with "
                "TRELLIS_TORCH_REJOIN=0" % self.rejoined)
        self.step += 1
        self.no_window = False
        self.commit()

    def commit(self, again=False, copy=False):
        """The current state as the commit of self.step (no push of the next step started).
        copy: the program changes the state next without a window (keep_copy)."""
        self.begin_update()  # a serve of the previous commit ends first
        live = _Packer(self.pool)           # the optimizers' tensors: unchanged until the next update
        try:
            meta = {"optimizers": [live.tree(o.state_dict()) for o in self.optimizers],
                    "rng": _rng.state(), "iter_rng": _LOADERS.iter_rng,
                    "training_state": None, "base_step": self.base_step}
            # Buffers, values: the next forward changes them.
            copied = _Packer(self.pool, clone=True, start=live.off)
            if self.training_state is not None:
                meta["training_state"] = self.training_state._trellis_pack(copied)
            blob = pickle.dumps(meta, protocol=4)
            if copied.off + len(blob) > self.pool.numel():
                raise _Full()
        except _Full:
            raise RuntimeError(
                "trellis.torch: the rejoin state (optimizer state, buffers, metadata) outgrew its "
                "%d-byte buffer; set %s to more bytes (every worker alike), or turn crash "
                "recovery off with TRELLIS_TORCH_REJOIN=0" % (self.pool.numel(), _EXTRA_ENV)) \
                from None
        self.layout = (self.step, (live, copied), blob)
        if copy:
            self._prepare(self.step)
        self.worker.rejoin_commit(self.step, again, copy)
        self.committed = True

    def _prepare(self, step):
        """The keeper's thread, serving a rejoin: the arena (and the staged parameters) as the
        commit of `step` laid them out."""
        got, packers, blob = self.layout
        if got != step:
            raise RuntimeError("trellis.torch: rejoin: the last commit is step %d, the keeper "
                               "serves step %d" % (got, step))
        for packer in packers:
            packer.write()
        off = packers[-1].off
        self.pool[off:off + len(blob)].copy_(torch.frombuffer(bytearray(blob), dtype=torch.uint8))
        self.pool[:_HEADER.size].copy_(torch.frombuffer(
            bytearray(_HEADER.pack(_MAGIC, step, off, len(blob))), dtype=torch.uint8))
        for p, stage in self.staged:
            stage.load(p.detach())

    def fetch(self):
        """Restarted worker: the donor's commit into the parameters and the arena. Returns the
        donor's step, or None (nobody committed yet: start as on a first start). A grow's joiner
        takes the members' commit of the step before its world's first (the library's keeper
        also tells the servers the world it joined)."""
        step = self.worker.rejoin_fetch()
        if step is None:
            self.worker.rejoin_mark_servers()
            return None
        magic, got_step, off, n = _HEADER.unpack(self.pool[:_HEADER.size].numpy().tobytes())
        if magic != _MAGIC or got_step != step or not (_HEADER.size <= off <= off + n <= self.pool.numel()):
            raise RuntimeError("trellis.torch: rejoin: the donor's state is not a trellis.torch "
                               "commit of step %d (header: magic 0x%x, step %d, %d bytes at %d)"
                               % (step, magic, got_step, n, off))
        self.meta = pickle.loads(self.pool[off:off + n].numpy().tobytes())
        self.base_step = self.meta.get("base_step", 0)
        with torch.no_grad():
            for p, stage in self.staged:
                stage.store(p, 1)
        self.rejoined = step
        self.step = step
        self.restore_optimizers()
        return step

    def restore_optimizers(self):
        for o, sd in zip(self.optimizers, self.meta["optimizers"]):
            o.load_state_dict(_unpack(self.pool, sd))
            o._trellis_steps = self.rejoined

    def restore_training_state(self, ts):
        packed = self.meta.get("training_state")
        if packed is None:
            raise RuntimeError("trellis.torch: rejoin: the donor kept no TrainingState; every "
                               "worker must create the same TrainingState")
        ts._trellis_unpack(self.pool, packed, _unpack)
        self.restore_optimizers()  # after the scheduler: its constructor may have set the lr
        return self.meta["rng"], self.meta.get("iter_rng")

    def close(self):
        self.worker.rejoin_stop()
