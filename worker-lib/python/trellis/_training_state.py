"""trellis.torch.TrainingState: what a program commits at each step so that a restarted worker
continues where the others are (docs/pytorch.md#fault-tolerance). The mechanism (the arena, the
donor, the keeper) is _rejoin's; this is the program's side of it.
"""

import torch

from . import _exit_checkpoint, _rng, _state
from ._loader_watch import WATCH as _LOADERS


class TrainingState:
    """What a restarted worker needs to continue where the others are (Horovod's TorchState
    habit); see docs/pytorch.md#fault-tolerance.

        state = tt.TrainingState(model, optimizer, scheduler, epoch=0, batch=0)
        for epoch in range(state.epoch, epochs):
            sampler.set_epoch(epoch)
            for i, (x, y) in enumerate(loader):
                if i < state.batch:
                    continue                  # a rejoined worker skips what the job has done
                ...; loss.backward()
                state.batch = i + 1
                optimizer.step()              # commits: weights, optimizer, buffers, RNG, values
            scheduler.step()
            state.epoch, state.batch = epoch + 1, 0
            state.commit()                    # the end-of-epoch changes, at the same step

    Keyword values (epoch, batch, anything picklable) are attributes; an int `epochs` value (the
    number of epochs the loop runs) gives progress its total steps (epochs x len(loader)). On a
    worker that rejoined a running job, creating the state restores the donor's model buffers,
    scheduler, optimizer and values, and its RNG states: at once when `batch` is 0, else in two
    parts: the states the donor's current DataLoader iterator was made from, just before this
    worker makes its first iterator (a shuffled order comes out the same), and the donor's
    current states just before the model's next forward pass. After load_checkpoint read an
    exit checkpoint (the job was stopped from outside mid-epoch), creating the state restores
    the stopped rank 0's values, scheduler, optimizer and RNG states from it the same way
    (`resumed_step`: its step). Everywhere else it only records what to commit."""

    def __init__(self, model=None, optimizer=None, scheduler=None, **values):
        d = self.__dict__
        d["_model"], d["_optimizer"], d["_scheduler"] = model, optimizer, scheduler
        d["_values"] = dict(values)
        d["_keeper"] = None
        d["rejoined_step"] = None
        d["resumed_step"] = None
        _LOADERS.training_state = self  # progress reads its `epochs` value
        keeper = _state.current().keeper  # the process's keeper lives with the keys
        if keeper is not None:
            if keeper.training_state is not None:
                raise RuntimeError("trellis.torch: one TrainingState per process")
            d["_keeper"] = keeper
            keeper.training_state = self
            if keeper.rejoined is not None:
                rng, iter_rng = keeper.restore_training_state(self)
                d["rejoined_step"] = keeper.rejoined
                self._restore_rng(rng, iter_rng)
                return
        # A run resumed from an exit checkpoint (load_checkpoint read one): inside its epoch.
        d["resumed_step"] = _exit_checkpoint.resumed(self)

    def _restore_rng(self, rng, iter_rng):
        """The RNG states where the loop stood: at once when `batch` is 0, else in two parts.
        Mid-epoch, the resumed epoch's DataLoader iterator is made from the states the stopped
        worker made its own from (a shuffled order is drawn there), then the skipped batches
        are fetched, then its current states apply, just before the model's next forward."""
        if self._values.get("batch", 0) == 0 or self._model is None:
            _rng.set_state(rng)
            return
        _LOADERS.pending_rng = iter_rng
        holder = {}

        def restore(*_):
            _rng.set_state(rng)
            holder["h"].remove()
        holder["h"] = self._model.register_forward_pre_hook(restore)

    def __getattr__(self, name):
        try:
            return self.__dict__["_values"][name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name, value):
        if name.startswith("_"):
            raise AttributeError("TrainingState: %s is reserved" % name)
        self._values[name] = value

    def commit(self):
        """Commits the current state again at the current step (after end-of-step changes such
        as scheduler.step(); optimizer.step() commits by itself). No-op without crash recovery."""
        if self._keeper is not None:
            self._keeper.commit(again=True)

    def _trellis_pack(self, packer):
        out = {"values": packer.tree(self._values), "buffers": None, "scheduler": None}
        if self._model is not None:
            out["buffers"] = [(n, packer.put(b)) for n, b in self._model.named_buffers()]
        if self._scheduler is not None:
            out["scheduler"] = packer.tree(self._scheduler.state_dict())
        return out

    def _trellis_unpack(self, pool, packed, unpack):
        self._values.update(unpack(pool, packed["values"]))
        if self._model is not None and packed["buffers"] is not None:
            mine = dict(self._model.named_buffers())
            with torch.no_grad():
                for n, ref in packed["buffers"]:
                    if n not in mine:
                        raise RuntimeError("trellis.torch: rejoin: the donor's model has buffer "
                                           "%s, this one does not" % n)
                    mine[n].copy_(unpack(pool, ref))
        if self._scheduler is not None and packed["scheduler"] is not None:
            self._scheduler.load_state_dict(unpack(pool, packed["scheduler"]))
