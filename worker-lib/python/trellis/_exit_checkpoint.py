"""trellis.torch's exit checkpoint: when the whole job is stopped from outside (SIGTERM to
trellis-launch, a suspend, every pod deleted), rank 0 writes the program's checkpoint file at the
next optimizer.step() and waits there to be stopped; the same program run again resumes inside
the epoch it was stopped in (docs/checkpoints.md#stopping-a-job-the-exit-checkpoint).

No call of its own in the script: the file is the one the program names to save_checkpoint or
load_checkpoint, and where the loop stands is the TrainingState's (its values, the LR scheduler,
the RNG states the epoch's DataLoader iterator was made from and the current ones). So rank 0
writes exit checkpoints once both are known; until then a stop ends the job at once, as before.

The file is an ordinary save_checkpoint file (model, optimizer, the extra values of the
program's last save or load) with one more top-level entry, "trellis": {"step", "exit"}; every
file save_checkpoint writes carries "trellis": {"step"} (the job's optimizer steps so far).
load_checkpoint hands the "exit" part to the TrainingState the program creates next.
"""

import sys
import time

import trellis as _trellis
from . import _checkpoint, _rng, _state
from ._loader_watch import WATCH as _LOADERS


def _say(msg):
    print("trellis.torch: " + msg, file=sys.stderr, flush=True)


def _worker():
    s = _trellis._get()
    return None if s.local else s.worker


def _blocker(st):
    """Why rank 0 cannot write an exit checkpoint yet, or None."""
    ts = _LOADERS.training_state
    if st.checkpoint_path is None:
        return "the program has named no checkpoint file yet (save_checkpoint or load_checkpoint)"
    if ts is None or ts._model is None or ts._optimizer is None:
        return "the program keeps no TrainingState(model, optimizer, ...)"
    if len(st.params_by_optimizer()) != 1:
        return "the program steps more than one DistributedOptimizer"
    return None


def after_step():
    """DistributedOptimizer.step() is done (the keeper committed): on rank 0, tell the scheduler
    once that exit checkpoints are written, and, when the job is stopping, write one and wait."""
    w = _worker()
    if w is None or w.rank != 0:
        return
    st = _state.current()
    if not st.exit_ready_told:
        if _blocker(st) is not None:
            return
        st.exit_ready_told = True
        told = w.report_checkpoint(0, "", exit_ready=True)
        if told:
            _say("telling the scheduler that rank 0 writes exit checkpoints: " + told)
    if w.job_stopping:
        _stop_here(w, st)


class _AsIs:
    """TrainingState._trellis_pack's packer for a file: torch.save writes the tensors as they are
    (crash recovery's packer copies them into its arena instead)."""

    @staticmethod
    def put(t):
        return t.detach()

    @staticmethod
    def tree(x):
        return x


def _exit_state(ts):
    """Where the loop stands: what the TrainingState commits for a rejoin (its values, model
    buffers, LR scheduler) and the RNG states, as the resumed run restores them."""
    return {"training_state": ts._trellis_pack(_AsIs()), "rng": _rng.state(),
            "iter_rng": _LOADERS.iter_rng}


def _stop_here(w, st):
    ts = _LOADERS.training_state
    step = st.global_step()
    path = st.checkpoint_path
    start = time.monotonic()
    state = {"model": ts._model.state_dict(), "optimizer": ts._optimizer.state_dict(),
             "extra": dict(st.checkpoint_extra or {}),
             "trellis": {"step": step, "exit": _exit_state(ts)}}
    _checkpoint._write_checkpoint_file(path, state)
    _say("saved step %d to %s (%.2f s): the exit checkpoint" % (step, path, time.monotonic() - start))
    # Rank 0 pushes no more, so no worker completes another step: the job stops here, and its
    # launcher or agents stop the processes. One that is never stopped ends after its timeout.
    # Said before the scheduler is told: the agents stop this process as soon as it hears.
    wait = max(w.timeout_ms, 1000) / 1000.0
    _say("the job is being stopped from outside: stopped after step %d (exit checkpoint %s); "
         "waiting to be stopped" % (step, path))
    if step >= 1:
        told = w.report_checkpoint(step, path, on_exit=True, exit_ready=True)
        if told:
            _say("telling the scheduler of the exit checkpoint: " + told)
    time.sleep(wait)
    raise RuntimeError("trellis.torch: the job is being stopped from outside: rank 0 stopped "
                       "after step %d and was not stopped within %.0f s" % (step, wait))


def resumed(ts):
    """TrainingState(...) was just made: when load_checkpoint read an exit checkpoint, where the
    loop stood comes back (the values, the scheduler, then the optimizer again, since the
    scheduler's constructor sets its learning rate, and the RNG states). Returns the exit
    checkpoint's step, or None."""
    st = _state.current()
    resume, st.resume_exit = st.resume_exit, None
    if resume is None:
        return None
    ex = resume["exit"]
    ts._trellis_unpack(None, ex["training_state"], lambda _pool, x: x)
    if ts._optimizer is not None and resume["optimizer"] is not None:
        ts._optimizer.load_state_dict(resume["optimizer"])
    ts._restore_rng(ex["rng"], ex["iter_rng"])
    if _trellis.rank() == 0:
        _say("resuming inside epoch %s after step %d (the exit checkpoint %s): batch %s"
             % (ts._values.get("epoch", "?"), resume["step"], st.checkpoint_path,
                ts._values.get("batch", "?")))
    return resume["step"]
