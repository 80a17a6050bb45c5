"""Module buffers (BatchNorm's running statistics) kept equal on every worker.

DDP broadcasts buffers from rank 0 at every forward; here every synchronized step ends with
rank 0's float32 buffers on every worker: rank 0 pushes its values and the others push zeros
on one key, so the sum the servers return is rank 0's values, with no barrier and overlapped
with the gradients' tail. Integer buffers (num_batches_tracked) count forwards and are equal
anyway when every worker runs the same steps.

Which tensors: the non-parameter float32 tensors of a state_dict given to broadcast_parameters
(the docs' conversion already does that) or the buffers of a model given to DistributedOptimizer
(as named_parameters, as model=, or as the module model.named_parameters() was called on).
The key is declared at the seal when they are known by then, else when they are registered
(libtrellis accepts declarations after FinishDeclarations, collectively, like lazy layers).
"""

import torch

import trellis as _trellis
from trellis import _keys

BUFFER_KEY = _keys.BUFFERS


class BufferSync:
    def __init__(self):
        self.candidates = []    # (name or None, tensor) not yet sorted out
        self.param_names = set()
        self.buffers = []       # the synchronized tensors, declaration order
        self.stage = None       # the flat float32 tensor pushed each step
        self.declared = False

    def offer(self, named_tensors, sealed, param_ptrs, rejoin=False):
        """Tensors from a state_dict or model.buffers(); declares now when already sealed
        (not with crash recovery on: a restarted worker's seal must declare every key)."""
        if self.declared:
            return
        self.candidates.extend(named_tensors)
        if sealed and not rejoin:
            self.declare(param_ptrs, finish=True)

    def declare(self, param_ptrs, finish):
        s = _trellis._get()
        if self.declared or s.size() == 1:
            return
        seen = set(param_ptrs)
        picked = []
        for name, t in self.candidates:
            if (isinstance(t, torch.nn.parameter.UninitializedTensorMixin)
                    or t.dtype != torch.float32 or t.numel() == 0
                    or (name is not None and name in self.param_names)
                    or t.data_ptr() in seen):
                continue
            seen.add(t.data_ptr())
            picked.append(t)
        self.candidates = []
        if not picked:
            return
        self.buffers = picked
        self.stage = torch.zeros(sum(t.numel() for t in picked), dtype=torch.float32)
        s.declare(BUFFER_KEY, self.stage.numel(), "trellis.buffers", wire="float32")
        if finish:
            s.finish()  # collective: every worker registers the same buffers at the same point
        self.declared = True

    def start(self):
        """Starts this step's broadcast of rank 0's buffers; returns a handle or None."""
        if not self.buffers:
            return None
        with torch.no_grad():
            if _trellis.rank() == 0:
                # .to("cpu"): buffers of a model on the GPU (a no-op for CPU ones).
                torch.cat([t.reshape(-1).to("cpu") for t in self.buffers], out=self.stage)
            else:
                self.stage.zero_()
        return _trellis.push_pull(BUFFER_KEY, self.stage, priority=-(1 << 30))

    def finish(self, handle):
        if handle is None:
            return
        handle.wait()
        off = 0
        with torch.no_grad():
            for t in self.buffers:
                n = t.numel()
                t.copy_(self.stage[off:off + n].view_as(t))
                off += n
