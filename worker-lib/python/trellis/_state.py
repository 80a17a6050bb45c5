"""trellis.torch's process state: the keys it declares, the seal, and the broadcast channel.

libtrellis needs every key declared, identically on every worker, before the collective
FinishDeclarations, and accepts no declaration after it. So trellis.torch declares once, at the
"seal": one key per trainable parameter of every DistributedOptimizer (in named_parameters
order) plus one fixed-size broadcast channel (and the internal channels of _collectives,
_buffers, _grad_sync's join and _rejoin's arena). The seal happens when a DistributedOptimizer
is created and all its parameters have shapes; with lazy modules (torch.nn.LazyLinear, ...) it
waits for the first step(), after the first forward/backward materialized them. Broadcasts
asked for before the seal are queued here and run at the seal, in order.

One _State per process (like the session); trellis.shutdown() replaces it (reset()). Every other
module of the package reads it through current() at the moment it needs it. This module imports
none of the modules that use it (_broadcast, _grad_sync, _optimizer, _checkpoint,
_training_state), so the package's imports form a DAG (tests/python/test_import_graph.py).
"""

import sys

import numpy as np
import torch

import trellis as _trellis
from . import _buffers, _collectives, _keys, _loader_watch, _rejoin, _torch_tensors

CHANNEL_KEY = _keys.BROADCAST_CHANNEL  # the broadcast channel's key id
CHANNEL_FLOATS = 1 << 18      # 1 MiB per broadcast round
GRAD_KEY_BASE = 1 << 61       # gradient keys: base + declaration index
_BARRIER = "trellis.torch.broadcast"


def is_lazy(t):
    return isinstance(t, torch.nn.parameter.UninitializedTensorMixin)


class _State:
    """This process's declarations and queued broadcasts (one per process, like the session)."""

    def __init__(self):
        self.sealed = False
        self.params = []    # (name, parameter, key id, priority, optimizer), declaration order
        self.pending = []   # callables run at the seal
        self.channel = None
        self.keeper = None  # crash recovery (_rejoin.Keeper), when on
        self.buffer_sync = _buffers.BufferSync()
        # The exit checkpoint (_exit_checkpoint): the program's checkpoint file (the path it last
        # gave save_checkpoint or load_checkpoint) and that call's extra values; the steps of
        # the run the loaded file ended (its "trellis" step); an exit checkpoint load_checkpoint
        # read, for the TrainingState made next; whether rank 0 told the scheduler it writes them.
        self.checkpoint_path = None
        self.checkpoint_extra = None
        self._base_step = 0
        self.resume_exit = None
        self.exit_ready_told = False

    @property
    def base_step(self):
        """The steps of the run the loaded checkpoint ended. With crash recovery the keeper holds
        it (its commits carry it to a worker that rejoins)."""
        return self.keeper.base_step if self.keeper is not None else self._base_step

    @base_step.setter
    def base_step(self, step):
        if self.keeper is not None:
            self.keeper.base_step = step
        else:
            self._base_step = step

    def global_step(self):
        """The job's optimizer steps: those of the run the loaded checkpoint ended, plus this
        process's (a rejoined worker counts from the donor's)."""
        return self.base_step + max([o._trellis_steps for o, _ in self.params_by_optimizer()] or [0])

    def param_ptrs(self):
        return [p.data_ptr() for _, p, _, _, _ in self.params if not is_lazy(p)]

    def session(self):
        return _trellis._get()

    def register(self, named, optimizer):
        if self.sealed:
            raise RuntimeError(
                "trellis.torch: keys were already declared (a DistributedOptimizer or a "
                "broadcast sealed them); create every DistributedOptimizer before the first "
                "broadcast and before training")
        for i, (name, p) in enumerate(named):
            self.params.append((name, p, GRAD_KEY_BASE + len(self.params), -i, optimizer))

    def params_by_optimizer(self):
        out = {}
        for _, p, _, _, o in self.params:
            out.setdefault(id(o), (o, []))[1].append(p)
        return list(out.values())

    def rejoin_wanted(self, s, in_step):
        """Crash recovery on (the same answer on every worker): a job whose workers restart,
        or an elastic one (a grow's joiner takes the state the same way), parameters in float32,
        float16 or bfloat16 (CPU or GPU), keys sealed before training (not inside a lazy first
        step)."""
        if s.local or s.slots() == 1 or not _rejoin.enabled_by_env(s.worker.elastic):
            return False
        why = _rejoin.blocker([(n, p) for n, p, _, _, _ in self.params], in_step)
        if why is not None:
            # The job asked for restarts; say once, in every worker's log, why they cannot rejoin.
            print("trellis.torch: crash recovery is off: %s; a worker that dies will not rejoin "
                  "the running job (docs/pytorch.md#fault-tolerance)" % why, file=sys.stderr,
                  flush=True)
            return False
        return True

    def rejoined(self):
        """True on a worker that rejoined a running job: the start-up collectives (broadcasts,
        load_checkpoint) are skipped, it already holds the donor's values."""
        k = self.keeper
        return k is not None and k.rejoined is not None and k.step == k.rejoined

    def can_seal(self):
        return all(not is_lazy(p) for _, p, _, _, _ in self.params)

    def seal(self, in_step=False):
        if self.sealed:
            return
        s = self.session()
        for name, p, key, _, o in self.params:
            if is_lazy(p):
                raise RuntimeError("trellis.torch: parameter %s is still uninitialized (lazy); "
                                   "run a forward pass before step()" % name)
            s.declare(key, p.numel(), name, _torch_tensors.param_wire(p, o._trellis_wire))
        s.declare(CHANNEL_KEY, CHANNEL_FLOATS, "trellis.broadcast")
        if s.slots() > 1:  # sized by the ranks, not the world: a joiner declares the same
            s.declare(_keys.JOIN_CONTROL, s.slots(), "trellis.join", wire="float32")
        _collectives.declare_channel(s)
        self.buffer_sync.declare(self.param_ptrs(), finish=False)
        rejoin = self.rejoin_wanted(s, in_step)
        joined_from = 0 if s.local else s.worker.joined_from
        if joined_from and not rejoin:
            # ConfigurationError (exit 78): every restart would end the same way.
            raise _trellis.ConfigurationError(
                "trellis.torch: this worker joined the running elastic job from step %d, but it "
                "cannot take the job's state: crash recovery is off (the message above says why)"
                % joined_from)
        if rejoin:
            arena = _rejoin.arena_bytes(self.params_by_optimizer())
            s.declare(_rejoin.ARENA_KEY, arena // 4, "trellis.rejoin")
        s.finish()
        self.channel = np.zeros(CHANNEL_FLOATS, dtype=np.float32)
        self.sealed = True
        if rejoin:
            self.keeper = _rejoin.Keeper(s.worker, [(n, p, k) for n, p, k, _, _ in self.params],
                                         [o for o, _ in self.params_by_optimizer()], arena)
            if s.worker.incarnation > 1 or joined_from:
                # A restarted worker, or a grow's joiner: a live worker's last commit.
                self.keeper.fetch()
        for opt in {id(o): o for _, _, _, _, o in self.params}.values():
            opt._trellis_attach_hooks()
        self.run_pending()

    def run_pending(self):
        """Runs queued broadcasts whose tensors all have shapes now (lazy ones wait on)."""
        waiting = []
        for ready, fn in self.pending:
            if ready():
                fn()
            else:
                waiting.append((ready, fn))
        self.pending = waiting

    def defer_or_run(self, ready, fn):
        if self.sealed and ready():
            fn()
        else:
            self.pending.append((ready, fn))
            if not self.sealed and self.params and self.can_seal():
                self.seal()

    def broadcast_bytes(self, data, nbytes, root):
        """Broadcasts `nbytes` bytes (a uint8 array on the root, ignored elsewhere) through the
        channel key; returns the bytes on every rank. Each round: the root sets the channel,
        a barrier, the others read it, a barrier (the next round may overwrite it)."""
        s = self.session()
        if s.size() == 1:
            return data
        out = np.empty(nbytes, dtype=np.uint8)
        chunk = CHANNEL_FLOATS * 4
        view = self.channel.view(np.uint8)
        for off in range(0, max(nbytes, 1), chunk):
            n = min(chunk, nbytes - off)
            if s.rank() == root:
                view[:n] = data[off:off + n]
                s.broadcast(CHANNEL_KEY, self.channel, root).wait()
                s.barrier(_BARRIER)
            else:
                s.barrier(_BARRIER)
                s.broadcast(CHANNEL_KEY, self.channel, root).wait()
            out[off:off + n] = view[:n]
            s.barrier(_BARRIER)
        return out


_current = _State()


def current():
    """This process's _State (a new one after each trellis.shutdown())."""
    return _current


def reset():
    """Forgets every declaration and queued broadcast (trellis.shutdown())."""
    global _current
    _current = _State()
    _loader_watch.reset()
