"""Tensors as PyTorch users have them, for trellis.torch (docs/pytorch.md, "Tensor types" and
"Collectives"): CUDA, float16 / bfloat16 and non-contiguous gradients are staged through a
float32 CPU buffer (pinned for CUDA tensors), and the tensor collectives allreduce / allgather /
broadcast, which need no keys declared in advance (trellis/_collectives.py).
"""

import numpy as np
import torch

import trellis as _trellis
from . import _collectives

# torch dtype -> the name the 16-bit wire setting uses (trellis.declare(..., wire=...)).
_WIRE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}


def wire_name(wire_dtype):
    """None, a torch dtype or one of "float32" / "float16" / "bfloat16" (also "fp16", "bf16")
    -> None or the wire name; ValueError naming the value otherwise."""
    if wire_dtype is None:
        return None
    if isinstance(wire_dtype, torch.dtype):
        if wire_dtype not in _WIRE_NAMES:
            raise ValueError("wire_dtype %s: want torch.float32, torch.float16 or torch.bfloat16"
                             % wire_dtype)
        return _WIRE_NAMES[wire_dtype]
    aliases = {"fp16": "float16", "half": "float16", "bf16": "bfloat16", "fp32": "float32"}
    name = aliases.get(str(wire_dtype), str(wire_dtype))
    if name not in ("float32", "float16", "bfloat16"):
        raise ValueError("wire_dtype %r: want 'float32', 'float16' or 'bfloat16'" % (wire_dtype,))
    return name


def param_wire(p, wire_dtype):
    """The wire type of parameter p's key: the optimizer's setting, else a 16-bit parameter's
    own type (its gradient has no more bits to send), else the job's (None)."""
    if wire_dtype is not None:
        return wire_dtype
    if p.dtype in (torch.float16, torch.bfloat16):
        return _WIRE_NAMES[p.dtype]
    return None


def usable_in_place(t):
    """The library reads and writes float32 C-contiguous CPU memory; anything else is staged."""
    return t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous()


class Stage:
    """One gradient's staging buffer (float32, contiguous, on the CPU; pinned when the gradient
    is on a GPU, so the copies are DMA), kept from step to step."""

    def __init__(self):
        self.buf = None

    def load(self, g):
        """The tensor to push for gradient g: g itself when usable in place, else the buffer
        holding g's values as float32 (a GPU gradient is copied to the host here)."""
        if usable_in_place(g):
            self.buf = None
            return g
        if not g.dtype.is_floating_point:
            raise RuntimeError("trellis.torch: gradient of dtype %s (want a floating point "
                               "dtype)" % g.dtype)
        if self.buf is None or self.buf.shape != g.shape:
            self.buf = torch.empty(g.shape, dtype=torch.float32, device="cpu",
                                   pin_memory=g.device.type == "cuda")
        self.buf.copy_(g)  # synchronous: the push reads the buffer right after
        return self.buf

    def store(self, g, divisor):
        """After the push_pull: g holds the sum divided by `divisor` (the average), in its own
        dtype, layout and device; the division runs in float32, before any rounding to 16 bits."""
        src = g if self.buf is None else self.buf
        if divisor > 1:
            src.div_(divisor)
        if self.buf is not None:
            g.copy_(self.buf)


# --- Collectives on tensors (Horovod's names; synchronous, every rank in the same order).

def _numpy_bytes(t):
    """A contiguous CPU copy's bytes (uint8 NumPy array) of any tensor."""
    c = t.detach().to("cpu").contiguous()
    if c.dtype == torch.bool:
        c = c.to(torch.uint8)
    return c.reshape(-1).view(torch.uint8).numpy() if c.numel() else np.zeros(0, np.uint8)


def _from_bytes(raw, like, shape):
    dtype = torch.uint8 if like.dtype == torch.bool else like.dtype
    t = torch.from_numpy(np.ascontiguousarray(raw).copy()).view(dtype).reshape(shape)
    if like.dtype == torch.bool:
        t = t.to(torch.bool)
    return t.to(like.device)


def allreduce(tensor, average=True, name=None):
    """A new tensor (same dtype, shape, device) with the sum over all workers of `tensor`, or
    its average when `average` (the default, as Horovod's). Values travel and add as float32:
    integers are exact below 2**24, float64 is rounded to float32. Every worker calls it, in
    the same order among the collectives, with the same shape (and `name`, when given)."""
    v = tensor.detach().to("cpu", torch.float32).contiguous().numpy()
    what = "allreduce%s of %s %s" % ("" if name is None else " %r" % name, list(tensor.shape),
                                     str(tensor.dtype).replace("torch.", ""))
    total = _collectives.allreduce_sum(v, name=name, what=what)
    out = torch.from_numpy(total)
    if average:
        out = out / _trellis.size()
    return out.to(tensor.device, tensor.dtype)


def allreduce_(tensor, average=True, name=None):
    """allreduce in place: `tensor` ends with the sum (or average); returns it."""
    with torch.no_grad():
        tensor.copy_(allreduce(tensor, average, name))
    return tensor


def allgather(tensor, name=None):
    """Every worker's `tensor` concatenated along the first dimension, in rank order (the first
    dimension may differ between workers; the others and the dtype may not). A 0-d tensor is
    gathered as a 1-element one."""
    t = tensor.reshape(1) if tensor.dim() == 0 else tensor
    rest = tuple(t.shape[1:])
    what = "allgather%s of %s %s" % ("" if name is None else " %r" % name, list(t.shape),
                                     str(t.dtype).replace("torch.", ""))
    parts = _collectives.allgather_bytes(_numpy_bytes(t), (str(t.dtype), rest), name=name,
                                         what=what)
    row = t.element_size() * int(np.prod(rest, dtype=np.int64))
    pieces = [_from_bytes(p, t, (p.size // row if row else 0,) + rest) for p in parts]
    return torch.cat(pieces, 0)


def broadcast(tensor, root_rank=0, name=None):
    """A new tensor with `root_rank`'s values of `tensor` (bit for bit, any dtype)."""
    what = "broadcast%s of %s %s from %d" % ("" if name is None else " %r" % name,
                                            list(tensor.shape),
                                            str(tensor.dtype).replace("torch.", ""), root_rank)
    raw = _collectives.broadcast_bytes(_numpy_bytes(tensor), root_rank,
                                       (str(tensor.dtype), tuple(tensor.shape)), name=name,
                                       what=what)
    return _from_bytes(raw, tensor, tensor.shape)


def broadcast_(tensor, root_rank=0, name=None):
    """broadcast in place: `tensor` ends with the root's values; returns it."""
    with torch.no_grad():
        tensor.copy_(broadcast(tensor, root_rank, name))
    return tensor
