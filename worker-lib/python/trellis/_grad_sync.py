"""When the summed gradients are there (docs/pytorch.md, "What is synchronized when").

Default (sync="backward", DDP's guarantee): each gradient's push_pull starts in its hook during
backward, as before, and a callback queued on the autograd engine (what DDP does) waits for all
of them when the backward pass ends. So when backward() returns, p.grad holds the average over
the workers: clip_grad_norm_, GradScaler.unscale_ and gradient logging see final values, and
communication still overlaps the backward pass. A second backward before step() simply sums
again (gradient accumulation works; no_sync() saves the communication of the first ones).

sync="step" (opt-in, the P3 pattern): nothing waits until step() (or synchronize()), so the
tail of the communication also overlaps whatever the script does between backward() and step();
the script must call synchronize() before it reads gradients.

join(): ranks with fewer batches keep taking part in the sums with zeros until every rank has
run out (DDP's Join); then every rank takes the model and optimizer state of the last rank to
finish, so all end identical.
"""

import contextlib

import torch

import trellis as _trellis
from trellis import _broadcast, _keys

CONTROL_KEY = _keys.JOIN_CONTROL  # join: one element per worker, 1 while that worker still trains
MODES = ("backward", "step")


def _queue_callback(fn):
    torch.autograd.Variable._execution_engine.queue_callback(fn)


class GradSync:
    """One DistributedOptimizer's gradient exchange."""

    def __init__(self, opt, mode, state):
        if mode not in MODES:
            raise ValueError("trellis.torch.DistributedOptimizer: sync must be one of %s, got %r"
                             % (", ".join(MODES), mode))
        self.opt = opt
        self.mode = mode
        self.state = state          # _state._State (buffers, keys)
        self.handles = opt._trellis_handles  # parameter -> its push_pull's handle this step
        self.no_sync_depth = 0
        self.queued = False         # the end-of-backward callback is queued
        self.synced = False         # gradients are summed and averaged; step() must not redo it
        self.joining = False        # inside join(): every sync also says "still training"
        self.last_active = None     # join: the control vector of the latest sync

    # -- during backward --------------------------------------------------------------------
    def on_grad(self, p, key, prio, name):
        if self.no_sync_depth:
            return  # accumulate locally; the first backward outside no_sync() sends the sum
        if p in self.handles:
            raise RuntimeError(
                "trellis.torch: the gradient of %s was produced twice before step() (sync='step' "
                "waits in step()); call step() after every backward(), or use no_sync() for "
                "gradient accumulation" % name)
        self.synced = False
        self.opt._trellis_start(p, key, prio, name)
        if self.mode == "backward" and not self.queued:
            self.queued = True
            _queue_callback(self._end_of_backward)

    def _end_of_backward(self):
        self.queued = False
        self.finish(active=True)

    # -- the wait -----------------------------------------------------------------------------
    def finish(self, active=True):
        """Pushes zeros for parameters that got no gradient, waits for every sum, averages.
        With active=False (a joined rank) every gradient pushed is zero."""
        n = _trellis.size()
        for p, (name, key, prio) in self.opt._trellis_params.items():
            if p.requires_grad and p not in self.handles:
                if not active and p.grad is not None:
                    p.grad.zero_()
                self.opt._trellis_start(p, key, prio, name)
        buffers = self.state.buffer_sync.start()
        control = self._start_control(active) if self.joining else None
        for p, h in self.handles.items():
            h.wait()
            self.opt._trellis_stages[p].store(p.grad, n)  # average; unstage (_torch_tensors)
        self.handles.clear()
        self.state.buffer_sync.finish(buffers)
        self.synced = True
        if control is not None:
            control[0].wait()
            self.last_active = control[1].clone()
            return bool(self.last_active.any())
        return True

    def _start_control(self, active):
        v = torch.zeros(self.state.session().slots(), dtype=torch.float32)  # as declared
        if active:
            v[_trellis.rank()] = 1.0
        return _trellis.push_pull(CONTROL_KEY, v, priority=-(1 << 30)), v

    # -- context managers ---------------------------------------------------------------------
    @contextlib.contextmanager
    def no_sync(self):
        self.no_sync_depth += 1
        try:
            yield
        finally:
            self.no_sync_depth -= 1

    @contextlib.contextmanager
    def join(self):
        if self.joining:
            raise RuntimeError("trellis.torch: join() is already active")
        if self.mode != "backward":
            raise RuntimeError("trellis.torch: join() needs sync='backward' (the default)")
        self.joining = True
        self.last_active = None
        try:
            yield
        except BaseException:
            self.joining = False  # a failing rank cannot shadow the others; let it fail
            raise
        try:
            self._shadow_until_all_done()
        finally:
            self.joining = False

    def _shadow_until_all_done(self):
        if _trellis.size() == 1:
            return
        if self.handles or self.queued:
            raise RuntimeError("trellis.torch: join() ended with gradients in flight; call "
                               "step() after the last backward()")
        while True:
            for p in self.opt._trellis_params:
                if p.grad is not None:
                    p.grad.zero_()
            before = self.last_active
            if not self.finish(active=False):
                self.last_active = before
                break
        # The last rank(s) to finish hold the model every rank must end with.
        if self.last_active is None:
            return
        root = int(torch.nonzero(self.last_active)[0])
        keeper = self.state.keeper
        if keeper is not None:
            keeper.keep_copy()  # the broadcasts change the model and wait for every worker
        params = [p for p in self.opt._trellis_params] + list(self.state.buffer_sync.buffers)
        _broadcast.broadcast_tensors_now([p.data for p in params], root)
        sd = _broadcast.broadcast_object(self.opt.state_dict(), root)
        if _trellis.rank() != root:
            self.opt.load_state_dict(sd)
        for p in self.opt._trellis_params:
            if p.grad is not None:
                p.grad.zero_()
