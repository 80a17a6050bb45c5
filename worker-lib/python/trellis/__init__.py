"""Trellis for Python: the worker API over libtrellis (see docs/pytorch.md).

    import trellis
    trellis.init()                      # joins the job from TRELLIS_* (trellis-launch sets them)
    k = trellis.declare("w", w.size)    # every worker declares the same keys, same order
    trellis.broadcast(k, w).wait()      # everyone holds rank 0's values
    trellis.push_pull(k, grad).wait()   # grad now holds the sum over all workers

Arrays are NumPy float32 C-contiguous arrays or CPU float32 torch tensors; they are used in
place, without copies, and must stay unchanged until the handle's wait() returns. Errors from
the library raise trellis.TrellisError (.code, .code_name, and the library's message).

Without TRELLIS_SCHEDULER (no job) init() starts a local session: rank 0 of 1, push_pull is the
identity, broadcast and barrier do nothing, so the same script runs as one plain process.
"""

import atexit
import os
import sys

from ._trellis import Handle, TrellisError  # noqa: F401  (re-exported)
from . import _trellis

__all__ = ["TrellisError", "ConfigurationError", "EXIT_CONFIGURATION_ERROR", "available", "init",
           "shutdown", "is_initialized", "is_local", "rank", "size", "local_rank", "local_size",
           "num_servers", "declare", "finish_declarations", "push_pull",
           "broadcast", "barrier", "bytes_pushed", "bytes_pulled", "report_progress",
           "set_total_steps"]

_NAMED_KEY_BASE = 1 << 40  # ids of keys declared by name; small ids stay free for the user

# The exit code of a process that stopped on a ConfigurationError: the agent never restarts it
# (agent/supervisor.h kExitConfigurationError; sysexits' EX_CONFIG).
EXIT_CONFIGURATION_ERROR = 78


class ConfigurationError(RuntimeError):
    """The job and the script do not fit together; restarting cannot help. Uncaught, the
    process prints the traceback and exits with EXIT_CONFIGURATION_ERROR, so the agent fails the
    job at once instead of retrying it backoffLimit times."""


# The agent's file for this process's last error (docs/operations.md#the-agents-last-words):
# the job's status names it ("worker 1 (pod j-worker-1) failed with exit code 1: ValueError: boom").
# Environment names (here and in _rejoin.py) are those of common/config/env_names.h, the one list
# of the variables the parts exchange (tests/python/test_env_names.py checks the spelling).
_ERROR_FILE_ENV = "TRELLIS_ERROR_FILE"
_MAX_ERROR_CHARS = 1000


def _leave_last_error(kind, value):
    """Writes "ExceptionType: message" (the last line of the formatted exception, at most
    _MAX_ERROR_CHARS) to $TRELLIS_ERROR_FILE. The first error of this start is kept: the agent
    empties the file before each start, and in a pod of several processes (gpusPerWorker > 1)
    the first to fail names the cause, not those stopped after it. Never raises."""
    try:
        path = os.environ.get(_ERROR_FILE_ENV)
        if not path:
            return
        import traceback
        te = traceback.TracebackException(kind, value, None)
        te.__notes__ = None  # add_note() lines come after "Type: message"; only that is wanted
        lines = list(te.format_exception_only())
        text = lines[-1].strip() if lines else getattr(kind, "__name__", "error")
        if len(text) > _MAX_ERROR_CHARS:
            text = text[:_MAX_ERROR_CHARS - 3] + "..."
        with open(path, "x", encoding="utf-8", errors="replace") as f:
            f.write(text + "\n")
    except BaseException:  # noqa: BLE001  the traceback above is what matters; never hide it
        pass


def _excepthook(kind, value, tb, _previous=sys.excepthook):
    _previous(kind, value, tb)
    _leave_last_error(kind, value)
    if isinstance(value, ConfigurationError):
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            shutdown()
        finally:
            os._exit(EXIT_CONFIGURATION_ERROR)


sys.excepthook = _excepthook

# Per-key wire types (docs/compression.md, "16-bit gradients"): None follows the job's
# compression; "float32" is never compressed; the 16-bit types are sent as such.
_WIRE_TYPES = (None, "float32", "float16", "bfloat16")

_session = None
_on_shutdown = []  # callables run by shutdown() (trellis.torch forgets its declarations)


def available():
    """True when this process runs inside a Trellis job (TRELLIS_SCHEDULER is set)."""
    return bool(os.environ.get("TRELLIS_SCHEDULER"))


def _as_buffer(x):
    """A buffer-protocol view of x: torch tensors via .numpy() (shares memory), else x itself."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        if x.device.type != "cpu":
            raise TrellisError(3, "INVALID_ARGUMENT",
                               "want a CPU tensor, got one on " + str(x.device))
        if x.dtype != torch.float32:
            raise TrellisError(3, "INVALID_ARGUMENT", "want a float32 tensor, got " + str(x.dtype))
        if not x.is_contiguous():
            raise TrellisError(3, "INVALID_ARGUMENT", "tensor is not contiguous")
        return x.detach().numpy()
    return x


class _LocalHandle:
    def __init__(self, result):
        self._result = result

    def wait(self):
        return self._result

    def done(self):
        return True


class _Session:
    """One process's membership in a job: the C++ worker (or nothing, when local)."""

    def __init__(self, worker):
        self.worker = worker  # None: local single process
        self.names = {}       # declared name -> key id
        self.sizes = {}       # key id -> element count
        self.finished = False
        # Elastic jobs: the world this process was created in (a restart or a join after a
        # resize starts past epoch 0).
        self.world_epoch_at_start = 0 if worker is None else worker.world[0]

    @property
    def local(self):
        return self.worker is None

    def rank(self):
        return 0 if self.local else self.worker.rank

    def size(self):
        return 1 if self.local else self.worker.size

    def slots(self):
        """The job's worker ranks for its life: no world is larger (= size() but in elastic
        jobs). What is kept per rank is sized by this, so every world declares the same keys."""
        return 1 if self.local else self.worker.slots

    def key_id(self, key):
        if isinstance(key, str):
            if key not in self.names:
                raise TrellisError(5, "NOT_FOUND", "unknown key name '%s' (declare it first)" % key)
            return self.names[key]
        return int(key)

    def declare(self, key, num_elements, name=None, wire=None):
        if wire not in _WIRE_TYPES:
            raise TrellisError(3, "INVALID_ARGUMENT", "DeclareKey %s: wire %r: want None (the "
                               "job's compression), 'float32', 'float16' or 'bfloat16'"
                               % (name or key, wire))
        if isinstance(key, str):
            if name is None:
                name = key
            if key in self.names:
                raise TrellisError(6, "ALREADY_EXISTS", "DeclareKey %s: declared twice" % key)
            kid = _NAMED_KEY_BASE + len(self.names)
        else:
            kid = int(key)
        num_elements = int(num_elements)
        if self.local:
            if self.finished:
                raise TrellisError(9, "FAILED_PRECONDITION",
                                   "DeclareKey %s after FinishDeclarations" % (name or kid))
            if num_elements < 1:
                raise TrellisError(3, "INVALID_ARGUMENT",
                                   "DeclareKey %s: num_elements must be >= 1, got %d"
                                   % (name or kid, num_elements))
        else:
            self.worker.declare_key(kid, num_elements, name or "", wire or "")
        if isinstance(key, str):
            self.names[key] = kid
        self.sizes[kid] = num_elements
        return kid

    def finish(self):
        if not self.local:
            self.worker.finish_declarations()
        self.finished = True

    def _ensure_finished(self):
        if not self.finished:
            self.finish()

    def push_pull(self, key, array, out=None, priority=0):
        kid = self.key_id(key)
        self._ensure_finished()
        src = _as_buffer(array)
        dst = None if out is None else _as_buffer(out)
        if self.local:
            if out is not None and out is not array:
                import numpy as np
                np.copyto(np.asarray(dst), np.asarray(src))
                return _LocalHandle(out)
            return _LocalHandle(array)
        h = self.worker.push_pull(kid, src, dst, int(priority))
        return _TensorHandle(h, array if out is None else out)

    def broadcast(self, key, array, root=0):
        kid = self.key_id(key)
        self._ensure_finished()
        if self.local:
            if root != 0:
                raise TrellisError(3, "INVALID_ARGUMENT",
                                   "Broadcast key %d: root %d outside [0, 1)" % (kid, root))
            return _LocalHandle(array)
        return _TensorHandle(self.worker.broadcast(kid, _as_buffer(array), int(root)), array)

    def barrier(self, name):
        if not self.local:
            self.worker.barrier(name)


class _TensorHandle:
    """Completion of an operation; wait() returns the array or tensor the result landed in."""

    def __init__(self, handle, result):
        self._h = handle
        self._result = result  # keeps a torch tensor (not only its NumPy view) alive

    def wait(self):
        self._h.wait()
        return self._result

    def done(self):
        return self._h.done()


def init(scheduler_address=None, token_file=None, rank=None, slice_bytes=None, water_mark=None,
         timeout_ms=None, local=None):
    """Joins the job (Worker::Create); arguments override the environment.

    local=None: a local single-process session when no scheduler address is known;
    local=False: always join a job (raises TrellisError without one); local=True: never.
    Calling init() again returns without doing anything.
    """
    global _session
    if _session is not None:
        return
    if local is None:
        local = not (scheduler_address or available())
    if local:
        _session = _Session(None)
        return
    # Elastic jobs: a worker created outside the world joins a grow under way only when its
    # program can take the running job's state (trellis.torch's rejoin keeper; not turned off).
    joins = "trellis.torch" in sys.modules and os.environ.get("TRELLIS_TORCH_REJOIN", "") != "0"
    w = _trellis.Worker.create(scheduler_address=scheduler_address or "",
                               token_file=token_file or "",
                               rank=-1 if rank is None else int(rank),
                               slice_bytes=int(slice_bytes or 0), water_mark=int(water_mark or 0),
                               timeout_ms=int(timeout_ms or 0), join_grows=joins)
    if w.world[4]:  # outside the elastic job's world, and not joining it
        if joins:
            why = "resized away, or no grow under way takes it in"
        else:
            why = ("brought in by a grow, which only a trellis.torch program with crash recovery "
                   "on can join: docs/elastic.md#pytorch")
        print("trellis: this worker (pod %s) is outside the running elastic job's world (%s): "
              "exiting 0; the job runs on without it"
              % (os.environ.get("TRELLIS_POD_NAME", "?"), why), file=sys.stderr, flush=True)
        w.close()
        raise SystemExit(0)
    _session = _Session(w)


def shutdown():
    """Leaves the job: closes the connections (operations still running fail)."""
    global _session
    if _session is not None and _session.worker is not None:
        _session.worker.close()
    _session = None
    for fn in _on_shutdown:
        fn()


atexit.register(shutdown)  # close the connections before the interpreter tears down


def _get():
    if _session is None:
        raise TrellisError(9, "FAILED_PRECONDITION", "trellis.init() was not called")
    return _session


def is_initialized():
    return _session is not None


def is_local():
    """True for the single-process session (no job)."""
    return _get().local


def rank():
    return _get().rank()


def size():
    return _get().size()


def local_rank():
    """This process's index inside its pod (TRELLIS_LOCAL_RANK: the GPU it drives in a pod of
    gpusPerWorker > 1); 0 otherwise. torchrun's LOCAL_RANK habit: pick the device with it."""
    return int(os.environ.get("TRELLIS_LOCAL_RANK", "0") or 0)


def local_size():
    """Processes in this pod (TRELLIS_LOCAL_SIZE, gpusPerWorker); 1 otherwise."""
    return int(os.environ.get("TRELLIS_LOCAL_SIZE", "1") or 1)


def num_servers():
    s = _get()
    return 0 if s.local else s.worker.num_servers


def declare(key, num_elements, name=None, wire=None):
    """Declares a key: an int id, or a name (an id is assigned); returns the id.

    Every worker declares the same keys in the same order before the first operation (the
    first push_pull/broadcast finishes the declarations collectively). `wire`: how this key's
    pushes travel: None, the job's spec.compression; "float32", always full precision (for
    values that must sum exactly); "float16" / "bfloat16", as 16-bit values, summed in float32
    by the servers (docs/compression.md)."""
    return _get().declare(key, num_elements, name, wire)


def finish_declarations():
    """Collective: ends the declarations (else the first push_pull/broadcast does)."""
    _get().finish()


def push_pull(key, array, out=None, priority=0):
    """Starts summing `array` over all workers into `out` (default: in place); returns a handle.

    Higher priority goes first (convention: -layer index). Keep `array` unchanged until
    handle.wait() returns; wait() returns the output."""
    return _get().push_pull(key, array, out, priority)


def broadcast(key, array, root=0):
    """Starts copying `root`'s `array` into everyone's `array` (once per key, before its first
    push_pull); returns a handle."""
    return _get().broadcast(key, array, root)


def barrier(name):
    """Blocks until every worker reached the barrier `name`."""
    _get().barrier(name)


def bytes_pushed():
    s = _get()
    return 0 if s.local else s.worker.bytes_pushed


def bytes_pulled():
    s = _get()
    return 0 if s.local else s.worker.bytes_pulled


def report_progress(step, samples=0, loss=None):
    """Records training progress after a step (docs/user-guide.md#progress): the step number,
    the samples this worker processed in it (0: not known) and its loss (None: none). Cheap:
    the library sends one batched report to the scheduler about once a second. trellis.torch's
    DistributedOptimizer calls this from step() for you. A local session records nothing."""
    s = _get()
    if s.local:
        if int(step) < 0 or int(samples) < 0:
            raise TrellisError(3, "INVALID_ARGUMENT", "ReportProgress: step and samples must be "
                               ">= 0, got step %d, samples %d" % (int(step), int(samples)))
        return
    s.worker.report_progress(int(step), int(samples), float("nan") if loss is None else float(loss))


def set_total_steps(total_steps):
    """The number of steps the job will run, for the ETA in the job's status (0: not known)."""
    s = _get()
    if not s.local:
        s.worker.set_total_steps(int(total_steps))
