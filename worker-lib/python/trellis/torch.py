"""trellis.torch: data-parallel PyTorch training over Trellis (see docs/pytorch.md).

    import trellis, trellis.torch as tt
    trellis.init()
    optimizer = tt.DistributedOptimizer(optimizer, model.named_parameters())
    tt.broadcast_parameters(model.state_dict(), root_rank=0)
    tt.broadcast_optimizer_state(optimizer, root_rank=0)

This module is the public surface only; each idea lives in a private module of its own:

    _state            the keys this process declares, the seal, the broadcast channel
    _optimizer        DistributedOptimizer (and report_loss, progress after each step)
    _grad_sync        when the summed gradients are there (backward / step, no_sync, join)
    _broadcast        broadcast_parameters, broadcast_optimizer_state, broadcast_object, seal
    _checkpoint       save_checkpoint / load_checkpoint and their file format
    _exit_checkpoint  rank 0's checkpoint when the whole job is stopped from outside
    _training_state   TrainingState: what a restarted worker resumes from
    _elastic          elastic jobs: the step boundary, ElasticState, ElasticSampler, world()
    _rejoin           crash recovery: the arena a restarted worker takes from a live one
    _torch_tensors    allreduce, allgather, broadcast of tensors (over _collectives)

Their imports form a DAG: none imports this module, and none imports back a module that
imports it (tests/python/test_import_graph.py).
"""

import trellis as _trellis
from . import _elastic, _optimizer, _state
from ._broadcast import (broadcast_object, broadcast_optimizer_state, broadcast_parameters,
                         is_sealed, seal)
from ._checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from ._collectives import CollectiveError
from ._elastic import ElasticSampler, ElasticState, World, world
from ._optimizer import DistributedOptimizer, report_loss
from ._torch_tensors import allgather, allreduce, allreduce_, broadcast, broadcast_
from ._training_state import TrainingState

__all__ = ["DistributedOptimizer", "broadcast_parameters", "broadcast_optimizer_state",
           "broadcast_object", "save_checkpoint", "load_checkpoint", "CheckpointError", "is_sealed",
           "seal", "report_loss", "TrainingState", "allreduce", "allreduce_", "allgather",
           "broadcast", "broadcast_", "CollectiveError", "ElasticState", "ElasticSampler", "World",
           "world"]


def _reset():
    _state.reset()  # also forgets the DataLoaders seen (_loader_watch)
    _optimizer.reset_progress()
    _elastic.reset()


_trellis._on_shutdown.append(_reset)
