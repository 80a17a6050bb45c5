"""Elastic jobs in trellis.torch (docs/elastic.md#pytorch): the step boundary after each
DistributedOptimizer.step(), where a resize of the job's workers is reported and takes effect;
ElasticState, a TrainingState whose hooks hear of the new world; ElasticSampler, a
DistributedSampler whose shards follow the world, mid-epoch included.

At a resize every worker of the old world passes the same boundary (the scheduler decides the
step from their reports, docs/elastic.md#what-happens-at-a-resize); the one resized away ends
its program there with exit code 0 (SystemExit(0) out of step()), the others take their new
rank and size (ranks stay dense: 0..size-1, in the order of the old ranks), re-shard what is
left of the epoch, and call the hooks.
"""

import collections
import sys

import torch

import trellis as _trellis
from ._training_state import TrainingState

World = collections.namedtuple("World", "epoch from_step rank size left")
World.__doc__ = """The workers taking part now: epoch (0 as the job started, +1 per resize), the
first step it counts, this worker's rank in it and its size, and whether this worker left."""

_seen = {"epoch": None}  # the world epoch this process last saw (None: the one it started in)
_states = []  # the ElasticStates of this process (one, in practice)


def seen_epoch():
    """The world epoch whose resize this process has acted on: the step boundaries' last, else
    the world it was created in (a worker restarted or joining after a resize starts there)."""
    if _seen["epoch"] is None:
        s = _trellis._get()
        _seen["epoch"] = 0 if s.local else s.world_epoch_at_start
    return _seen["epoch"]


def world():
    """The world in force (World); a local run (no job) is one worker, epoch 0."""
    s = _trellis._get()
    if s.local:
        return World(0, 1, 0, 1, False)
    return World(*s.worker.world)


def at_boundary(step):
    """DistributedOptimizer.step() is done with `step` (the job's step count): a resize under
    way is reported, or takes effect, here."""
    s = _trellis._get()
    if s.local:
        return
    s.worker.step_boundary(step)
    now = World(*s.worker.world)
    if now.epoch == seen_epoch():
        return
    _seen["epoch"] = now.epoch
    if now.left:
        print("trellis.torch: this worker left the job after step %d (the job was resized to "
              "%d workers); exiting 0" % (step, now.size), file=sys.stderr, flush=True)
        raise SystemExit(0)
    for st in list(_states):
        st._trellis_world_changed(now)


def reset():
    """Forgets the states and the world seen (trellis.shutdown())."""
    _seen["epoch"] = None
    del _states[:]


class ElasticState(TrainingState):
    """A TrainingState for elastic jobs (docs/elastic.md#pytorch), in the spirit of Horovod's
    elastic TorchState:

        sampler = tt.ElasticSampler(dataset, shuffle=True)
        loader = DataLoader(dataset, batch_size=64, sampler=sampler)
        state = tt.ElasticState(model, optimizer, sampler=sampler, epoch=0, batch=0)
        state.on_resize(lambda w: set_lr(optimizer, base_lr * w.size))   # a learning-rate scaler
        for epoch in range(state.epoch, epochs):
            sampler.set_epoch(epoch)
            for i, (x, y) in enumerate(loader):
                ...; loss.backward()
                optimizer.step()       # a resize takes effect here (a worker resized away exits 0)

    At a resize, after the step it takes effect at: the sampler re-shards what is left of the
    epoch over the new world, then each on_resize hook is called with the new World. Keyword
    values, crash recovery and progress are TrainingState's; the sampler's place in its epoch is
    part of what a restarted worker, or a grow's joiner, takes from a live one. When the live
    worker's state predates the resize this worker starts in, the sampler is re-sharded at once;
    then, and on a grow's joiner always, each on_resize hook is called as it is registered."""

    def __init__(self, model=None, optimizer=None, scheduler=None, sampler=None, **values):
        d = self.__dict__
        d["_sampler"] = sampler  # before TrainingState's restore, which unpacks its place
        d["_hooks"] = []
        d["_resize_pending"] = None  # a World the restored state has not acted on yet
        super().__init__(model, optimizer, scheduler, **values)
        _states.append(self)

    def on_resize(self, fn):
        """Calls fn(world) after each resize this worker stays in (World: rank, size, ...); at
        once on a worker whose restored state predates its world (a grow's joiner)."""
        self._hooks.append(fn)
        if self._resize_pending is not None:
            fn(self._resize_pending)
        return fn

    @property
    def world(self):
        return world()

    def _trellis_world_changed(self, now):
        self.__dict__["_resize_pending"] = None  # a later resize: the hooks hear of it below
        if self._sampler is not None:
            self._sampler.reshard(now.rank, now.size)
        for fn in self._hooks:
            fn(now)

    def _trellis_pack(self, packer):
        out = super()._trellis_pack(packer)
        # The world this commit is in (a commit before a resize's switch predates it) and the
        # sampler's place in its epoch (rank-free: the one restoring it has its own rank).
        out["world_epoch"] = seen_epoch()
        out["sampler"] = self._sampler.place() if self._sampler is not None else None
        return out

    def _trellis_unpack(self, pool, packed, unpack):
        super()._trellis_unpack(pool, packed, unpack)
        now = world()
        stale = packed.get("world_epoch", now.epoch) < now.epoch
        place = packed.get("sampler")
        if self._sampler is not None and place is not None:
            # A stale place is the old world's: restored in it, then re-sharded as the members
            # re-sharded at the switch.
            self._sampler.restore_place(place, 0 if stale else now.rank)
            if stale:
                self._sampler.reshard(now.rank, now.size)
        s = _trellis._get()
        if stale or (not s.local and s.worker.joined_from):
            # A grow's joiner hears of its world once, whichever commit it took (one after the
            # members' hooks ran has their learning rate already: a hook sets it again).
            self.__dict__["_resize_pending"] = now


class ElasticSampler(torch.utils.data.Sampler):
    """DistributedSampler's shards (the same padding: every rank the same number of samples),
    following the job's world: after a resize mid-epoch the samples no worker has drawn yet are
    sharded over the new world, so no sample is seen twice in the epoch and none is skipped.

    Exact with DataLoader(num_workers=0). With worker processes, the batches a DataLoader has
    prefetched (num_workers x prefetch_factor) were drawn from the old shard: this worker still
    trains them, and nobody else gets them. The padding of the last shard repeats a few samples,
    as DistributedSampler's does. Call set_epoch(epoch) at the start of each epoch."""

    def __init__(self, dataset, shuffle=True, seed=0):
        self._n = len(dataset)
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0
        self._rank, self._size = 0, 1  # until trellis.init(): one worker
        self._start_epoch()

    def _start_epoch(self):
        if _trellis.is_initialized():  # the world in force (a sampler made before init too)
            w = world()
            self._rank, self._size = w.rank, w.size
        self._start_epoch_order()
        self._ended = False
        self._reshards = []  # (drawn, size) of each re-shard in this epoch: place()
        self._restored = None  # the epoch of a restored place, kept by set_epoch of that epoch
        self._shard_over_world()

    def _start_epoch_order(self):
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            self._order = torch.randperm(self._n, generator=g).tolist()
        else:
            self._order = list(range(self._n))

    def _shard_over_world(self):
        """Splits self._order (what is left of the epoch) over the world, padded as
        DistributedSampler pads."""
        order = self._order
        total = -(-len(order) // self._size) * self._size
        padded = list(order)
        while order and len(padded) < total:
            padded += order[:total - len(padded)]
        self._padded = padded
        self._shard = padded[self._rank::self._size]
        self._drawn = 0  # of self._shard: every rank of the world draws as many (lockstep)

    def set_epoch(self, epoch):
        if self._restored is not None and self._restored == epoch:
            self._restored = None  # a restored place in this epoch: the loop goes on from it
            return
        self.epoch = epoch
        self._start_epoch()

    def reshard(self, rank, size):
        """The world changed at a step boundary: what no rank of the old world has drawn is
        sharded over the new one (ElasticState calls this)."""
        self._reshards.append((self._drawn, self._size))
        drawn = set()
        for r in range(self._size):
            drawn.update(self._padded[r::self._size][:self._drawn])
        self._order = [i for i in self._order if i not in drawn]
        self._rank, self._size = rank, size
        self._shard_over_world()

    def place(self):
        """Where the world stands in the epoch, the same on every rank (they draw in lockstep):
        small, whatever the dataset's size (the order is rebuilt from the seed)."""
        return {"n": self._n, "epoch": self.epoch, "seed": self.seed, "shuffle": self.shuffle,
                "reshards": list(self._reshards), "size": self._size, "drawn": self._drawn,
                "ended": self._ended}

    def restore_place(self, place, rank):
        """Takes a live worker's place() as this worker's, at `rank` of the place's world: its
        epoch's order again, and its re-shards replayed as they happened."""
        if place["n"] != self._n:
            raise RuntimeError("trellis.torch: rejoin: the live worker's ElasticSampler has %d "
                               "samples, this one %d" % (place["n"], self._n))
        self.seed, self.shuffle, self.epoch = place["seed"], place["shuffle"], place["epoch"]
        sizes = [size for _, size in place["reshards"]] + [place["size"]]
        self._start_epoch_order()
        self._reshards = []
        self._rank, self._size = 0, sizes[0]
        self._shard_over_world()
        for (drawn, _), size in zip(place["reshards"], sizes[1:]):
            self._drawn = drawn
            self.reshard(0, size)
        self._rank = rank
        self._shard_over_world()
        self._drawn, self._ended, self._restored = place["drawn"], place["ended"], self.epoch

    def __iter__(self):
        if self._ended:  # a new pass without set_epoch: the same epoch's order again
            self._start_epoch()
        while self._drawn < len(self._shard):
            i = self._shard[self._drawn]
            self._drawn += 1
            yield i
        self._ended = True

    def __len__(self):
        return len(self._shard)
