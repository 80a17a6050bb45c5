"""What the process's DataLoaders tell trellis.torch, with no call in the script.

- Progress (docs/pytorch.md#progress): the size of the last batch a DataLoader yielded before
  optimizer.step() is this worker's samples per step, and that loader's len() times the
  TrainingState's `epochs` value is the number of steps (the ETA).
- Crash recovery (docs/pytorch.md#fault-tolerance): a shuffling DataLoader (shuffle=True, a
  RandomSampler without its own generator) draws its order, and its workers' seeds, from the
  global RNG when its iterator is made. The RNG states just before the iterator that yielded the
  last training batch was made are committed with each step; a worker that rejoins mid-epoch gets
  them back just before it makes its first iterator, so it draws the same order as the worker it
  replaces did (bit for bit, when every worker seeds alike).

The watch patches DataLoader.__iter__ and the iterator's __next__ once, when the first
DistributedOptimizer is made; it costs one RNG snapshot per iterator and an attribute read per
batch.
"""

import torch
from torch.utils.data import DataLoader
from torch.utils.data.dataloader import _BaseDataLoaderIter

from . import _rng


class LoaderWatch:
    def __init__(self):
        self.batch_len = 0       # samples in the last batch yielded (0: no DataLoader seen)
        self.loader_len = None   # len() of the loader that yielded it (None: no len)
        self.iter_rng = None     # RNG states just before that batch's iterator was made
        self.pending_rng = None  # a rejoined worker: set these before its next iterator is made
        self.training_state = None  # the process's TrainingState (for its `epochs` value)

    def total_steps(self):
        """epochs x batches per epoch, when the TrainingState has an int `epochs` value and the
        loader has a length; else None."""
        ts = self.training_state
        epochs = ts._values.get("epochs") if ts is not None else None
        if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs <= 0:
            return None
        if not self.loader_len:
            return None
        return epochs * self.loader_len


WATCH = LoaderWatch()
_installed = False


def reset():
    """trellis.shutdown(): what was seen belongs to the session that ended (the patches stay)."""
    WATCH.__init__()


def _batch_len(batch):
    """Samples in a batch: the first dimension of its first tensor (tuple, list or dict)."""
    for _ in range(4):  # nested a few levels at most: ((x, y), meta), {"input": x}
        if isinstance(batch, torch.Tensor):
            return int(batch.shape[0]) if batch.dim() > 0 else 1
        if isinstance(batch, (tuple, list)) and batch:
            batch = batch[0]
        elif isinstance(batch, dict) and batch:
            batch = next(iter(batch.values()))
        else:
            break
    return 0


def install():
    global _installed
    if _installed:
        return
    _installed = True
    make_iter = DataLoader.__iter__
    next_batch = _BaseDataLoaderIter.__next__

    def __iter__(loader):
        if WATCH.pending_rng is not None:
            _rng.set_state(WATCH.pending_rng)
            WATCH.pending_rng = None
        made_with = _rng.state()
        it = make_iter(loader)
        it._trellis_made = (made_with, loader)
        return it

    def __next__(it):
        batch = next_batch(it)
        made = getattr(it, "_trellis_made", None)
        if made is not None:
            WATCH.iter_rng = made[0]
            WATCH.batch_len = _batch_len(batch)
            try:
                WATCH.loader_len = len(made[1])
            except TypeError:  # an IterableDataset without __len__
                WATCH.loader_len = None
        return batch

    DataLoader.__iter__ = __iter__
    _BaseDataLoaderIter.__next__ = __next__
