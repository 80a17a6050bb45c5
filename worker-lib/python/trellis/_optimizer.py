"""trellis.torch's DistributedOptimizer: wraps any torch.optim.Optimizer so that step() uses
the gradients averaged over the workers, and reports progress after each step.

The wrapped optimizer's class becomes a subclass of its own with _DistributedMixin in front;
its parameters are registered with the process state (_state), whose seal declares their keys.
When the gradients are exchanged is _grad_sync's business; what a restarted worker needs,
_rejoin's (through the state's keeper).
"""

import inspect
import time

import torch

import trellis as _trellis
from . import _elastic, _exit_checkpoint, _grad_sync, _loader_watch, _state, _torch_tensors


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
        k = _state.current().keeper
        if k is not None and not k.committed:
            k.first_commit()  # step 0, before the first push: a crash in step 1 can rejoin
        # CUDA, 16-bit and non-contiguous gradients go through a float32 host buffer.
        stage = self._trellis_stages.setdefault(p, _torch_tensors.Stage())
        self._trellis_handles[p] = _trellis.push_pull(key, stage.load(g), priority=prio)

    def synchronize(self):
        """Waits for every parameter's summed gradient and averages it. With sync='backward'
        (the default) backward() already did; with sync='step' step() calls this, and a script
        that reads gradients before step() calls it first."""
        st = _state.current()
        if not st.sealed:
            st.seal(in_step=True)  # first step of a lazy model: everything has shapes now
        else:
            st.run_pending()
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
        k = _state.current().keeper
        if closure is None or self._trellis_sync.mode != "backward":
            self.synchronize()  # (sync="backward": each backward inside the closure synchronizes)
        if k is not None and closure is None:
            k.begin_update()  # crash recovery: a rejoin is served outside this window
        elif k is not None:
            k.keep_copy()  # the closure's backward waits for gradients amid the update
        loss = super().step(closure)
        self._trellis_sync.synced = False
        self._trellis_report(loss)
        if k is not None:
            k.after_step()
        # Elastic jobs: a resize takes effect here (a worker resized away exits 0).
        _elastic.at_boundary(_state.current().global_step())
        _exit_checkpoint.after_step()  # rank 0, the job stopping: the exit checkpoint, then waits
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


def reset_progress():
    """Forgets the loss and total of the reports (trellis.shutdown())."""
    _progress.update(loss=None, read_at=float("-inf"), total=None)


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
    state = _state.current()
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
        state.buffer_sync.param_names.add(name)
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
    # Named trellis.torch.<base>, as before this module was split from torch.py.
    optimizer.__class__ = type(base.__name__, (_DistributedMixin, base),
                               {"__module__": "trellis.torch"})
    optimizer._trellis_base = base
    optimizer._trellis_params = {}
    optimizer._trellis_accs = {}
    optimizer._trellis_handles = {}
    optimizer._trellis_sync = _grad_sync.GradSync(optimizer, sync, state)
    optimizer._trellis_stages = {}  # parameter -> _torch_tensors.Stage
    optimizer._trellis_wire = wire
    optimizer._trellis_steps = 0
    optimizer._trellis_batch_size = int(batch_size or 0)
    optimizer._trellis_total_given = bool(total_steps)
    if total_steps:
        _trellis.set_total_steps(int(total_steps))
    _loader_watch.install()
    start = len(state.params)
    state.register(kept, optimizer)
    for name, p, key, prio, _ in state.params[start:]:
        optimizer._trellis_params[p] = (name, key, prio)
    if model is not None:
        state.buffer_sync.offer(list(model.named_buffers()), state.sealed, state.param_ptrs())
    if state.can_seal():
        state.seal()
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
