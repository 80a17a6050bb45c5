"""trellis.torch's broadcasts: parameters, optimizer state and picklable objects from one rank.

Broadcasts travel through the channel key (_state.CHANNEL_KEY: any dtype, as raw bytes, in
chunks), so they need no keys of their own. Broadcasts asked for before the seal are queued and
run at the seal, in order: for plain models that is before the first forward; for lazy models it
is inside the first step(), before the optimizer update, so every worker ends the first step
with identical parameters.
"""

import io

import numpy as np
import torch

import trellis as _trellis
from . import _state, _torch_tensors

_MAX_OBJECT_BYTES = 1 << 36    # a broadcast_object size beyond this is not a size
_BCAST_MAGIC = 0x5453414342534C54  # "TLSBCAST": the first word of a tensor broadcast's header


def is_sealed():
    """True once the keys are declared (broadcasts then run at once)."""
    return _state.current().sealed


def seal():
    """Declares the keys now and runs the queued broadcasts: for programs that broadcast without
    a DistributedOptimizer (none may be created afterwards)."""
    _state.current().seal()


def broadcast_tensors_now(tensors, root):
    s = _trellis._get()
    if s.size() == 1:
        return
    sizes = [t.numel() * t.element_size() for t in tensors]
    total = sum(sizes)
    st = _state.current()
    header = np.array([_BCAST_MAGIC, total, len(tensors)], dtype=np.int64).view(np.uint8)
    got = st.broadcast_bytes(header, header.size, root).view(np.int64)
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
    data = st.broadcast_bytes(data, total, root)
    if s.rank() != root:
        off = 0
        with torch.no_grad():
            for t, n in zip(tensors, sizes):
                src = torch.from_numpy(data[off:off + n].copy()).view(t.dtype).view(t.shape)
                t.copy_(src)
                off += n


def tensors_of(params):
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
    tensors = tensors_of(params)
    st = _state.current()
    if isinstance(params, dict):  # a state_dict: its buffers stay synchronized (_buffers.py)
        st.buffer_sync.offer([(k, v) for k, v in params.items() if isinstance(v, torch.Tensor)],
                             st.sealed, st.param_ptrs(), st.keeper is not None)
    if st.rejoined():
        return  # the donor's values are here already; the others are not broadcasting
    st.defer_or_run(lambda: not any(_state.is_lazy(t) for t in tensors),
                    lambda: broadcast_tensors_now(tensors, root_rank))


def broadcast_object(obj, root_rank=0):
    """Returns `root_rank`'s `obj` on every worker (pickled with torch.save). Needs the seal."""
    s = _trellis._get()
    if s.size() == 1:
        return obj
    st = _state.current()
    if not st.sealed:
        st.seal() if st.params and st.can_seal() else None
    if not st.sealed:
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
    n = st.broadcast_bytes(n.view(np.uint8), 8, root_rank).view(np.int64)
    if not 0 <= int(n[0]) <= _MAX_OBJECT_BYTES:
        raise RuntimeError("trellis.torch.broadcast_object: rank %d's size word reads %d bytes, "
                           "not a size: this worker is out of step with rank %d"
                           % (root_rank, int(n[0]), root_rank))
    data = st.broadcast_bytes(data, int(n[0]), root_rank)
    if s.rank() == root_rank:
        return obj
    return torch.load(io.BytesIO(data.tobytes()), map_location="cpu")


def broadcast_optimizer_state(optimizer, root_rank=0):
    """Every worker's optimizer ends with `root_rank`'s state and hyper-parameters."""
    def run():
        sd = broadcast_object(optimizer.state_dict(), root_rank)
        if _trellis.rank() != root_rank:
            optimizer.load_state_dict(sd)
    st = _state.current()
    if st.rejoined():
        return
    st.defer_or_run(lambda: True, run)
