"""trellis.torch: data-parallel PyTorch training over Trellis (see docs/pytorch.md).

    import trellis, trellis.torch as tt
    trellis.init()
    optimizer = tt.DistributedOptimizer(optimizer, model.named_parameters())
    tt.broadcast_parameters(model.state_dict(), root_rank=0)
    tt.broadcast_optimizer_state(optimizer, root_rank=0)

Keys. libtrellis needs every key declared, identically on every worker, before the collective
FinishDeclarations, and accepts no declaration after it. So this module declares once, at the
"seal": one key per trainable parameter of every DistributedOptimizer (in named_parameters
order) plus one fixed-size broadcast channel. The seal happens when a DistributedOptimizer is
created and all its parameters have shapes; with lazy modules (torch.nn.LazyLinear, ...) it
waits for the first step(), after the first forward/backward materialized them.

Broadcasts travel through the channel key (any dtype, as raw bytes, in chunks), so they need no
keys of their own. Broadcasts asked for before the seal are queued and run at the seal, in order:
for plain models that is before the first forward; for lazy models it is inside the first step(),
before the optimizer update, so every worker ends the first step with identical parameters.
"""

import inspect
import io
import os
import struct
import sys
import time

import numpy as np
import torch

import trellis as _trellis
from . import _buffers, _collectives, _grad_sync, _keys, _loader_watch, _rejoin, _torch_tensors
from ._collectives import CollectiveError
from ._rejoin import TrainingState
from ._torch_tensors import allgather, allreduce, allreduce_, broadcast, broadcast_

__all__ = ["DistributedOptimizer", "broadcast_parameters", "broadcast_optimizer_state",
           "broadcast_object", "save_checkpoint", "load_checkpoint", "CheckpointError", "is_sealed",
           "seal", "report_loss", "TrainingState", "allreduce", "allreduce_", "allgather",
           "broadcast", "broadcast_", "CollectiveError"]

_CHANNEL_KEY = _keys.BROADCAST_CHANNEL  # the broadcast channel's key id
_CHANNEL_FLOATS = 1 << 18     # 1 MiB per broadcast round
_GRAD_KEY_BASE = 1 << 61      # gradient keys: base + declaration index
_BARRIER = "trellis.torch.broadcast"
_MAX_OBJECT_BYTES = 1 << 36    # a broadcast_object size beyond this is not a size
_BCAST_MAGIC = 0x5453414342534C54  # "TLSBCAST": the first word of a tensor broadcast's header


def _is_lazy(t):
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

    def param_ptrs(self):
        return [p.data_ptr() for _, p, _, _, _ in self.params if not _is_lazy(p)]

    def session(self):
        return _trellis._get()

    def register(self, named, optimizer):
        if self.sealed:
            raise RuntimeError(
                "trellis.torch: keys were already declared (a DistributedOptimizer or a "
                "broadcast sealed them); create every DistributedOptimizer before the first "
                "broadcast and before training")
        for i, (name, p) in enumerate(named):
            self.params.append((name, p, _GRAD_KEY_BASE + len(self.params), -i, optimizer))

    def params_by_optimizer(self):
        out = {}
        for _, p, _, _, o in self.params:
            out.setdefault(id(o), (o, []))[1].append(p)
        return list(out.values())

    def rejoin_wanted(self, s, in_step):
        """Crash recovery on (the same answer on every worker): a job whose workers restart,
        parameters in float32, float16 or bfloat16 (CPU or GPU), keys sealed before training
        (not inside a lazy first step)."""
        if s.local or s.size() == 1 or not _rejoin.enabled_by_env():
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
        return all(not _is_lazy(p) for _, p, _, _, _ in self.params)

    def seal(self, in_step=False):
        if self.sealed:
            return
        s = self.session()
        for name, p, key, _, o in self.params:
            if _is_lazy(p):
                raise RuntimeError("trellis.torch: parameter %s is still uninitialized (lazy); "
                                   "run a forward pass before step()" % name)
            s.declare(key, p.numel(), name, _torch_tensors.param_wire(p, o._trellis_wire))
        s.declare(_CHANNEL_KEY, _CHANNEL_FLOATS, "trellis.broadcast")
        if s.size() > 1:
            s.declare(_grad_sync.CONTROL_KEY, s.size(), "trellis.join", wire="float32")
        _collectives.declare_channel(s)
        self.buffer_sync.declare(self.param_ptrs(), finish=False)
        rejoin = self.rejoin_wanted(s, in_step)
        if rejoin:
            arena = _rejoin.arena_bytes(self.params_by_optimizer())
            s.declare(_rejoin.ARENA_KEY, arena // 4, "trellis.rejoin")
        s.finish()
        self.channel = np.zeros(_CHANNEL_FLOATS, dtype=np.float32)
        self.sealed = True
        if rejoin:
            self.keeper = _rejoin.Keeper(s.worker, [(n, p, k) for n, p, k, _, _ in self.params],
                                         [o for o, _ in self.params_by_optimizer()], arena)
            if s.worker.incarnation > 1:
                self.keeper.fetch()  # a restarted worker: the donor's last step
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
        chunk = _CHANNEL_FLOATS * 4
        view = self.channel.view(np.uint8)
        for off in range(0, max(nbytes, 1), chunk):
            n = min(chunk, nbytes - off)
            if s.rank() == root:
                view[:n] = data[off:off + n]
                s.broadcast(_CHANNEL_KEY, self.channel, root).wait()
                s.barrier(_BARRIER)
            else:
                s.barrier(_BARRIER)
                s.broadcast(_CHANNEL_KEY, self.channel, root).wait()
            out[off:off + n] = view[:n]
            s.barrier(_BARRIER)
        return out


_state = _State()


def _reset():
    global _state
    _state = _State()
    _loader_watch.reset()
    _progress.update(loss=None, read_at=float("-inf"), total=None)


_trellis._on_shutdown.append(_reset)


def _rejoin_keeper():
    return _state.keeper


def is_sealed():
    """True once the keys are declared (broadcasts then run at once)."""
    return _state.sealed


def seal():
    """Declares the keys now and runs the queued broadcasts: for programs that broadcast without
    a DistributedOptimizer (none may be created afterwards)."""
    _state.seal()


def _broadcast_tensors_now(tensors, root):
    s = _trellis._get()
    if s.size() == 1:
        return
    sizes = [t.numel() * t.element_size() for t in tensors]
    total = sum(sizes)
    header = np.array([_BCAST_MAGIC, total, len(tensors)], dtype=np.int64).view(np.uint8)
    got = _state.broadcast_bytes(header, header.size, root).view(np.int64)
    if int(got[0]) != _BCAST_MAGIC:
        # Not a header at all: the ranks are out of step (validate before reading sizes).
        raise RuntimeError(
            "trellis.torch: broadcast from rank %d: the channel holds no broadcast header, so "
            "this worker is out of step with rank %d (a broadcast called on some ranks only, or "
            "a restarted worker in a job without crash recovery: docs/pytorch.md#fault-tolerance)"
            % (root, root))
    if int(got[1]) != total or int(got[2]) != len(tensors):
        raise RuntimeError("trellis.torch: broadcast from rank %d carries %d tensors (%d bytes); "
                           "this worker has %d tensors (%d bytes): models differ"
                           % (root, got[2], got[1], len(tensors), total))
    data = None
    if s.rank() == root:
        data = np.concatenate([_torch_tensors._numpy_bytes(t) for t in tensors]) if tensors else \
            np.zeros(0, np.uint8)
    data = _state.broadcast_bytes(data, total, root)
    if s.rank() != root:
        off = 0
        with torch.no_grad():
            for t, n in zip(tensors, sizes):
                src = torch.from_numpy(data[off:off + n].copy()).view(t.dtype).view(t.shape)
                t.copy_(src)
                off += n


def _tensors_of(params):
    if isinstance(params, dict):
        items = list(params.items())
    else:
        items = list(params)
    out = []
    for it in items:
        t = it[1] if isinstance(it, tuple) else it
        if t is None or not isinstance(t, torch.Tensor):
            continue
        out.append(t)
    return out


def broadcast_parameters(params, root_rank=0):
    """Every worker ends with `root_rank`'s values of these tensors (a state_dict, or
    named_parameters / a list of tensors), copied in place. Queued until the seal (see the
    module doc); lazy (uninitialized) tensors are broadcast right after they materialize."""
    tensors = _tensors_of(params)
    if isinstance(params, dict):  # a state_dict: its buffers stay synchronized (_buffers.py)
        _state.buffer_sync.offer([(k, v) for k, v in params.items()
                                  if isinstance(v, torch.Tensor)],
                                 _state.sealed, _state.param_ptrs(), _state.keeper is not None)
    if _state.rejoined():
        return  # the donor's values are here already; the others are not broadcasting
    _state.defer_or_run(lambda: not any(_is_lazy(t) for t in tensors),
                        lambda: _broadcast_tensors_now(tensors, root_rank))


def broadcast_object(obj, root_rank=0):
    """Returns `root_rank`'s `obj` on every worker (pickled with torch.save). Needs the seal."""
    s = _trellis._get()
    if s.size() == 1:
        return obj
    if not _state.sealed:
        _state.seal() if _state.params and _state.can_seal() else None
    if not _state.sealed:
        raise RuntimeError("trellis.torch.broadcast_object: keys not declared yet; call it after "
                           "DistributedOptimizer(...) (after the first step for lazy modules)")
    data = None
    if s.rank() == root_rank:
        buf = io.BytesIO()
        torch.save(obj, buf)
        data = np.frombuffer(buf.getvalue(), dtype=np.uint8)
        n = np.array([data.size], dtype=np.int64)
    else:
        n = np.zeros(1, dtype=np.int64)
    n = _state.broadcast_bytes(n.view(np.uint8), 8, root_rank).view(np.int64)
    if not 0 <= int(n[0]) <= _MAX_OBJECT_BYTES:
        raise RuntimeError("trellis.torch.broadcast_object: rank %d's size word reads %d bytes, "
                           "not a size: this worker is out of step with rank %d"
                           % (root_rank, int(n[0]), root_rank))
    data = _state.broadcast_bytes(data, int(n[0]), root_rank)
    if s.rank() == root_rank:
        return obj
    return torch.load(io.BytesIO(data.tobytes()), map_location="cpu")


def broadcast_optimizer_state(optimizer, root_rank=0):
    """Every worker's optimizer ends with `root_rank`'s state and hyper-parameters."""
    def run():
        sd = broadcast_object(optimizer.state_dict(), root_rank)
        if _trellis.rank() != root_rank:
            optimizer.load_state_dict(sd)
    if _state.rejoined():
        return
    _state.defer_or_run(lambda: True, run)


class _DistributedMixin:
    """Mixed into the wrapped optimizer's class: step() first sums the gradients."""

    def _trellis_attach_hooks(self):
        for p, (name, key, prio) in self._trellis_params.items():
            if p in self._trellis_accs or not p.requires_grad:
                continue
            hook = self._trellis_make_hook(p, key, prio, name)
            if hasattr(p, "register_post_accumulate_grad_hook"):  # torch >= 2.1
                self._trellis_accs[p] = p.register_post_accumulate_grad_hook(hook)
            else:  # torch 1.x: a hook on the parameter's AccumulateGrad node
                with torch.enable_grad():  # no grad_fn inside a no_grad block
                    acc = p.expand_as(p).grad_fn.next_functions[0][0]
                acc.register_hook(hook)
                self._trellis_accs[p] = acc  # the hook lives as long as the accumulator

    def _trellis_make_hook(self, p, key, prio, name):
        def hook(*_):
            self._trellis_sync.on_grad(p, key, prio, name)
        return hook

    def _trellis_start(self, p, key, prio, name):
        g = p.grad
        if g is None:
            g = torch.zeros_like(p, memory_format=torch.contiguous_format)
            p.grad = g
        k = _state.keeper
        if k is not None and not k.committed:
            k.first_commit()  # step 0, before the first push: a crash in step 1 can rejoin
        # CUDA, 16-bit and non-contiguous gradients go through a float32 host buffer.
        stage = self._trellis_stages.setdefault(p, _torch_tensors.Stage())
        self._trellis_handles[p] = _trellis.push_pull(key, stage.load(g), priority=prio)

    def synchronize(self):
        """Waits for every parameter's summed gradient and averages it. With sync='backward'
        (the default) backward() already did; with sync='step' step() calls this, and a script
        that reads gradients before step() calls it first."""
        if not _state.sealed:
            _state.seal(in_step=True)  # first step of a lazy model: everything has shapes now
        else:
            _state.run_pending()
        if not self._trellis_sync.synced:
            self._trellis_sync.finish()  # also pushes zeros for parameters without a gradient

    def no_sync(self):
        """Context manager: backward passes inside it accumulate gradients locally, without
        communication (gradient accumulation); the first backward after it sends the sum."""
        return self._trellis_sync.no_sync()

    def join(self):
        """Context manager around the training loop for ranks with different numbers of
        batches (DDP's Join): a rank that runs out keeps adding zeros to the others' sums until
        every rank is done, then all take the last finisher's model and optimizer state."""
        return self._trellis_sync.join()

    def step(self, closure=None):
        if closure is not None and self._trellis_sync.mode == "backward":
            loss = super().step(closure)  # each backward inside the closure synchronizes
        else:
            self.synchronize()
            loss = super().step(closure)
        self._trellis_sync.synced = False
        self._trellis_report(loss)
        if _state.keeper is not None:
            _state.keeper.after_step()
        return loss

    def _trellis_report(self, loss):
        """Progress after each step (docs/pytorch.md#progress): the step count, batch_size
        samples, and the loss from step(closure) or report_loss(). The loss is read (float(),
        a device sync on a GPU) at most twice a second; the library batches the rest."""
        self._trellis_steps += 1
        if loss is None:
            loss = _progress["loss"]
        _progress["loss"] = None
        value = None
        now = time.monotonic()
        if loss is not None and now - _progress["read_at"] >= 0.5:
            _progress["read_at"] = now
            value = float(loss)
        watch = _loader_watch.WATCH
        if not self._trellis_total_given:
            total = watch.total_steps()
            if total and total != _progress["total"]:
                _progress["total"] = total
                _trellis.set_total_steps(total)
        _trellis.report_progress(self._trellis_steps, self._trellis_batch_size or watch.batch_len,
                                 value)


_progress = {"loss": None, "read_at": float("-inf"), "total": None}


def report_loss(loss):
    """Gives the loss of the current step (a number or a 0-d tensor) to the progress report
    the next DistributedOptimizer.step() sends; step(closure) reports the closure's loss itself."""
    _progress["loss"] = loss


def DistributedOptimizer(optimizer, named_parameters=None, batch_size=None, total_steps=None,
                         sync="backward", wire_dtype=None, model=None):
    """Makes `optimizer` (any torch.optim.Optimizer) data-parallel; returns the same object.

    `named_parameters`: model.named_parameters(), or the model itself. The model's float32
    buffers are then kept equal on every worker too, as broadcast_parameters(model.state_dict())
    also does, and their key is declared with the others. `model`: the module whose buffers to
    keep equal, given explicitly; needed when named_parameters is not a module's own
    named_parameters() generator (a list, a filtered generator) and buffers must be known at
    the seal (crash recovery: see _buffers.py).
    `sync`: "backward" (default): when backward() returns, every gradient is the average over
    the workers; "step": the wait happens in step() (call synchronize() before reading
    gradients). See _grad_sync.py.

    Every step() also reports progress (docs/pytorch.md#progress): the step count, the samples
    per step on this worker (`batch_size` when given, else the size of the last batch a
    DataLoader yielded), the loss from step(closure) or report_loss(), and the total steps for
    the ETA (`total_steps` when given, else a TrainingState's `epochs` x the DataLoader's len()).

    During backward each parameter's gradient starts its push_pull the moment it is
    accumulated (priority -index: the first layers, needed first by the next forward, go
    first); the end of backward (or step(), with sync="step") waits for each and divides by the
    number of workers, then step() runs the original update. Parameter order and names come
    from named_parameters (default: the optimizer's).

    `wire_dtype` (torch.float16 / torch.bfloat16 / torch.float32, or "float16", "bfloat16",
    "float32"): how these gradients travel to the servers, which sum in float32; default: a
    16-bit parameter's own type, else the job's spec.compression (docs/compression.md)."""
    _trellis._get()
    wire = _torch_tensors.wire_name(wire_dtype)  # ValueError before anything changes
    _refuse_update_mode()
    if model is not None and not isinstance(model, torch.nn.Module):
        raise ValueError("trellis.torch.DistributedOptimizer: model must be a torch.nn.Module, "
                         "got %s" % type(model).__name__)
    owner = None
    if isinstance(named_parameters, torch.nn.Module):
        owner, named_parameters = named_parameters, named_parameters.named_parameters()
    elif model is None:
        owner = _caller_of(named_parameters)  # read before the generator runs
    if named_parameters is None:
        named = [("param.%d" % i, p) for i, p in
                 enumerate(p for g in optimizer.param_groups for p in g["params"])]
    else:
        named = list(named_parameters)
    if model is None and owner is not None and _owns(owner, named):
        model = owner
    in_opt = {id(p) for g in optimizer.param_groups for p in g["params"]}
    seen = set()
    kept = []
    for name, p in named:
        _state.buffer_sync.param_names.add(name)
        if id(p) in seen:
            continue  # shared (tied) parameters: one key
        seen.add(id(p))
        if id(p) in in_opt and p.requires_grad:
            kept.append((name, p))
    missing = in_opt - seen
    if missing:
        raise ValueError("trellis.torch.DistributedOptimizer: named_parameters lacks %d of the "
                         "optimizer's parameters" % len(missing))
    if isinstance(optimizer, _DistributedMixin):
        raise ValueError("trellis.torch.DistributedOptimizer: optimizer is already distributed")
    base = optimizer.__class__
    optimizer.__class__ = type(base.__name__, (_DistributedMixin, base), {})
    optimizer._trellis_base = base
    optimizer._trellis_params = {}
    optimizer._trellis_accs = {}
    optimizer._trellis_handles = {}
    optimizer._trellis_sync = _grad_sync.GradSync(optimizer, sync, _state)
    optimizer._trellis_stages = {}  # parameter -> _torch_tensors.Stage
    optimizer._trellis_wire = wire
    optimizer._trellis_steps = 0
    optimizer._trellis_batch_size = int(batch_size or 0)
    optimizer._trellis_total_given = bool(total_steps)
    if total_steps:
        _trellis.set_total_steps(int(total_steps))
    _loader_watch.install()
    start = len(_state.params)
    _state.register(kept, optimizer)
    for name, p, key, prio, _ in _state.params[start:]:
        optimizer._trellis_params[p] = (name, key, prio)
    if model is not None:
        _state.buffer_sync.offer(list(model.named_buffers()), _state.sealed, _state.param_ptrs())
    if _state.can_seal():
        _state.seal()
    return optimizer


def _caller_of(named_parameters):
    """The module a named_parameters() generator was called on (model.named_parameters() hands
    over no module, only its parameters), else None. Read through inspect.getgeneratorlocals,
    the standard library's accessor, which answers {} where an interpreter has no frame for it;
    DistributedOptimizer keeps the answer only when that module owns every parameter given
    (_owns), so a generator built otherwise never names the wrong module: pass model= then."""
    if not inspect.isgenerator(named_parameters):
        return None
    owner = inspect.getgeneratorlocals(named_parameters).get("self")
    return owner if isinstance(owner, torch.nn.Module) else None


def _owns(module, named):
    """True when every parameter of `named` ((name, parameter) pairs) is one of module's."""
    mine = {id(p) for p in module.parameters()}
    return all(id(p) in mine for _, p in named)


def _refuse_update_mode():
    """serverMode: update returns weights, not sums; DistributedOptimizer averages sums and
    runs the script's optimizer, so it cannot run in that mode. Deterministic: refused at
    once, as a ConfigurationError (exit code 78, which the agent does not restart)."""
    s = _trellis._get()
    if not s.local and s.worker.update_mode:
        raise _trellis.ConfigurationError(
            "trellis.torch.DistributedOptimizer needs serverMode: aggregate (the default); this "
            "job has serverMode: update, where the servers apply the optimizer and answer with "
            "weights. Remove serverMode: update (and its optimizer settings) from the job file.")


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used; the message names the file and what is wrong."""


# Checkpoint files (version 2): torch.save's zip archive whose zip comment is a 28-byte trailer,
# so plain torch.load (and any zip tool) reads the file as it is. Trailer (little-endian): magic,
# u32 version, u64 payload bytes (everything before the trailer), u32 CRC32C of the payload,
# u32 CRC32C of the trailer before it. The same checksum as the C++ format (docs/checkpoints.md),
# so a flipped bit or a short file is caught before torch.load sees it. Version 1 (written by
# earlier builds) had the same fields as a header in front of the archive; it still loads.
_CKPT_MAGIC = b"TRLSPYCK"
_CKPT_VERSION = 2
_CKPT_VERSION_HEADER = 1
_ZIP_END = b"PK\x05\x06"  # end of central directory record: 22 bytes, comment length last
_CKPT_HEAD = struct.Struct("<8sIQI")
_CKPT_HEADER_BYTES = _CKPT_HEAD.size + 4


def _crc32c(data):
    return _trellis._trellis.crc32c(bytes(data))


def _write_checkpoint_file(path, state):
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = bytearray(buf.getbuffer())
    if payload[-22:-18] != _ZIP_END or payload[-2:] != b"\0\0":
        raise RuntimeError("trellis.torch.save_checkpoint: torch.save did not write a zip archive")
    payload[-2:] = struct.pack("<H", _CKPT_HEADER_BYTES)  # the trailer is the zip comment
    head = _CKPT_HEAD.pack(_CKPT_MAGIC, _CKPT_VERSION, len(payload), _crc32c(payload))
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)  # spec.checkpoint.path on a fresh volume is empty
    except OSError as e:
        raise OSError(e.errno, "trellis.torch.save_checkpoint(%r): cannot create its directory "
                      "%s: %s" % (path, folder, e.strerror)) from None
    tmp = os.path.join(folder, ".%s.tmp.%d" % (os.path.basename(path), os.getpid()))
    try:
        with open(tmp, "wb") as f:
            f.write(payload)
            f.write(head)
            f.write(struct.pack("<I", _crc32c(head)))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    # The rename itself is durable only once the directory is synced.
    dfd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _read_checkpoint_file(path):
    """The state saved by save_checkpoint; CheckpointError naming the file if it is unusable.
    A plain torch.save file (a zip archive without the trailer) is read as it is."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise CheckpointError("%s: cannot read: %s" % (path, e.strerror)) from None
    if data[:4] == b"PK\x03\x04":
        return _read_zip_checkpoint(path, data)
    if len(data) < _CKPT_HEADER_BYTES:
        raise CheckpointError("%s: truncated: %d bytes, shorter than the %d-byte header"
                              % (path, len(data), _CKPT_HEADER_BYTES))
    magic, version, size, crc = _CKPT_HEAD.unpack_from(data)
    if magic != _CKPT_MAGIC:
        raise CheckpointError("%s: not a trellis.torch checkpoint (magic %r)" % (path, magic))
    (head_crc,) = struct.unpack_from("<I", data, _CKPT_HEAD.size)
    if _crc32c(data[:_CKPT_HEAD.size]) != head_crc:
        raise CheckpointError("%s: header checksum mismatch" % path)
    if version != _CKPT_VERSION_HEADER:
        raise CheckpointError("%s: checkpoint format version %d in a header, this build reads "
                              "version %d there" % (path, version, _CKPT_VERSION_HEADER))
    payload = memoryview(data)[_CKPT_HEADER_BYTES:]
    if len(payload) != size:
        raise CheckpointError("%s: %s: the header says %d payload bytes, the file has %d"
                              % (path, "truncated" if len(payload) < size else "trailing bytes",
                                 size, len(payload)))
    got = _crc32c(payload)
    if got != crc:
        raise CheckpointError("%s: payload checksum mismatch (stored 0x%08x, computed 0x%08x)"
                              % (path, crc, got))
    return torch.load(io.BytesIO(payload), map_location="cpu")


def _read_zip_checkpoint(path, data):
    """A version 2 file (a zip whose comment is the trailer), or a plain torch.save file."""
    tail = len(data) - _CKPT_HEADER_BYTES
    at = data.rfind(_CKPT_MAGIC, max(0, tail - 65536))
    if at < 0:  # no trailer: a plain torch.save file, or one cut short
        try:
            return torch.load(io.BytesIO(data), map_location="cpu")
        except Exception as e:  # torch raises RuntimeError or pickle errors for damaged zips
            raise CheckpointError("%s: no trellis.torch trailer and not a readable torch.save "
                                  "file (truncated?): %s" % (path, e)) from None
    if at > tail:
        raise CheckpointError("%s: truncated: the trailer at byte %d is cut short" % (path, at))
    if at < tail:
        raise CheckpointError("%s: trailing bytes: %d bytes after the trailer" % (path, tail - at))
    magic, version, size, crc = _CKPT_HEAD.unpack_from(data, at)
    (head_crc,) = struct.unpack_from("<I", data, at + _CKPT_HEAD.size)
    if _crc32c(data[at:at + _CKPT_HEAD.size]) != head_crc:
        raise CheckpointError("%s: trailer checksum mismatch" % path)
    if version != _CKPT_VERSION:
        raise CheckpointError("%s: checkpoint format version %d, this build reads version %d"
                              % (path, version, _CKPT_VERSION))
    payload = memoryview(data)[:at]
    if size != at:
        raise CheckpointError("%s: truncated: the trailer says %d payload bytes, the file has %d"
                              % (path, size, at))
    got = _crc32c(payload)
    if got != crc:
        raise CheckpointError("%s: payload checksum mismatch (stored 0x%08x, computed 0x%08x)"
                              % (path, crc, got))
    return torch.load(io.BytesIO(data), map_location="cpu")


def save_checkpoint(path, model, optimizer=None, **extra):
    """Writes {model, optimizer, extra} to `path` when called on rank 0 (other ranks return at
    once, so both `if trellis.rank() == 0: save_checkpoint(...)` and calling it everywhere work).
    The file is a plain torch.save zip archive (torch.load reads it) whose zip comment carries a
    checksum trailer; written to a temporary file, fsynced, renamed, directory fsynced."""
    if _trellis.rank() != 0:
        return
    state = {"model": model.state_dict(), "extra": extra}
    if optimizer is not None:
        state["optimizer"] = optimizer.state_dict()
    _write_checkpoint_file(path, state)


def load_checkpoint(path, model, optimizer=None, root_rank=0):
    """`root_rank` reads the checkpoint, then every worker receives its model and optimizer
    state; returns the `extra` values saved with it. Call it after DistributedOptimizer(...).
    A damaged file raises CheckpointError on every worker (the root tells the others), so no
    worker waits for a broadcast that will not come."""
    extra = None
    problem = None
    state = None
    if _state.rejoined():
        return None  # the donor's state is here already; the others are training
    if _trellis.rank() == root_rank:
        try:
            state = _read_checkpoint_file(path)
        except CheckpointError as e:
            problem = str(e)
    if _trellis.size() > 1:
        if not _state.sealed:
            raise RuntimeError("trellis.torch.load_checkpoint: call it after DistributedOptimizer(...)"
                               " (after the first step for lazy modules)")
        problem = broadcast_object(problem, root_rank)
    if problem is not None:
        if _trellis.rank() == root_rank:
            raise CheckpointError(problem)
        raise CheckpointError("rank %d could not load the checkpoint: %s" % (root_rank, problem))
    if _trellis.rank() == root_rank:
        model.load_state_dict(state["model"])
        if optimizer is not None and "optimizer" in state:
            optimizer.load_state_dict(state["optimizer"])
        extra = state.get("extra", {})
    if _trellis.size() == 1:
        return extra
    _broadcast_tensors_now(_tensors_of(model.state_dict()), root_rank)
    if optimizer is not None:
        sd = broadcast_object(optimizer.state_dict(), root_rank)
        if _trellis.rank() != root_rank:
            optimizer.load_state_dict(sd)
    return broadcast_object(extra, root_rank)
