"""trellis.torch's checkpoint files: save_checkpoint / load_checkpoint (docs/pytorch.md) and
their file format (docs/checkpoints.md, "Python (trellis.torch)", which also says why this is a
format of its own beside the C++ TRLSCKPT files).
"""

import io
import os
import struct
import sys

import torch

import trellis as _trellis
from . import _broadcast, _state


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used; the message names the file and what is wrong."""


# Named by its public path, as before this module was split from torch.py: tracebacks and the
# $TRELLIS_ERROR_FILE line read "trellis.torch.CheckpointError: ...".
CheckpointError.__module__ = "trellis.torch"


# Checkpoint files (version 2): torch.save's zip archive whose zip comment is a 28-byte trailer,
# so plain torch.load (and any zip tool) reads the file as it is. Trailer (little-endian): magic,
# u32 version, u64 payload bytes (everything before the trailer), u32 CRC32C of the payload,
# u32 CRC32C of the trailer before it. The same checksum as the C++ format (docs/checkpoints.md),
# so a flipped bit or a short file is caught before torch.load sees it. Version 1 (written by
# earlier builds) had the same fields as a header in front of the archive; it still loads.
_CKPT_MAGIC = b"TRLSPYCK"
_CKPT_VERSION = 2
_CKPT_VERSION_HEADER = 1
_ZIP_END = b"PK\x05\x06"  # end of central directory record: 22 bytes, comment length last
_CKPT_HEAD = struct.Struct("<8sIQI")
_CKPT_HEADER_BYTES = _CKPT_HEAD.size + 4


def _crc32c(data):
    return _trellis._trellis.crc32c(bytes(data))


def _write_checkpoint_file(path, state):
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = bytearray(buf.getbuffer())
    if payload[-22:-18] != _ZIP_END or payload[-2:] != b"\0\0":
        raise RuntimeError("trellis.torch.save_checkpoint: torch.save did not write a zip archive")
    payload[-2:] = struct.pack("<H", _CKPT_HEADER_BYTES)  # the trailer is the zip comment
    head = _CKPT_HEAD.pack(_CKPT_MAGIC, _CKPT_VERSION, len(payload), _crc32c(payload))
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)  # spec.checkpoint.path on a fresh volume is empty
    except OSError as e:
        raise OSError(e.errno, "trellis.torch.save_checkpoint(%r): cannot create its directory "
                      "%s: %s" % (path, folder, e.strerror)) from None
    tmp = os.path.join(folder, ".%s.tmp.%d" % (os.path.basename(path), os.getpid()))
    try:
        with open(tmp, "wb") as f:
            f.write(payload)
            f.write(head)
            f.write(struct.pack("<I", _crc32c(head)))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    # The rename itself is durable only once the directory is synced.
    dfd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _read_checkpoint_file(path):
    """The state saved by save_checkpoint; CheckpointError naming the file if it is unusable.
    A plain torch.save file (a zip archive without the trailer) is read as it is."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise CheckpointError("%s: cannot read: %s" % (path, e.strerror)) from None
    if data[:4] == b"PK\x03\x04":
        return _read_zip_checkpoint(path, data)
    if len(data) < _CKPT_HEADER_BYTES:
        raise CheckpointError("%s: truncated: %d bytes, shorter than the %d-byte header"
                              % (path, len(data), _CKPT_HEADER_BYTES))
    magic, version, size, crc = _CKPT_HEAD.unpack_from(data)
    if magic != _CKPT_MAGIC:
        raise CheckpointError("%s: not a trellis.torch checkpoint (magic %r)" % (path, magic))
    (head_crc,) = struct.unpack_from("<I", data, _CKPT_HEAD.size)
    if _crc32c(data[:_CKPT_HEAD.size]) != head_crc:
        raise CheckpointError("%s: header checksum mismatch" % path)
    if version != _CKPT_VERSION_HEADER:
        raise CheckpointError("%s: checkpoint format version %d in a header, this build reads "
                              "version %d there" % (path, version, _CKPT_VERSION_HEADER))
    payload = memoryview(data)[_CKPT_HEADER_BYTES:]
    if len(payload) != size:
        raise CheckpointError("%s: %s: the header says %d payload bytes, the file has %d"
                              % (path, "truncated" if len(payload) < size else "trailing bytes",
                                 size, len(payload)))
    got = _crc32c(payload)
    if got != crc:
        raise CheckpointError("%s: payload checksum mismatch (stored 0x%08x, computed 0x%08x)"
                              % (path, crc, got))
    return torch.load(io.BytesIO(payload), map_location="cpu")


def _read_zip_checkpoint(path, data):
    """A version 2 file (a zip whose comment is the trailer), or a plain torch.save file."""
    tail = len(data) - _CKPT_HEADER_BYTES
    at = data.rfind(_CKPT_MAGIC, max(0, tail - 65536))
    if at < 0:  # no trailer: a plain torch.save file, or one cut short
        try:
            return torch.load(io.BytesIO(data), map_location="cpu")
        except Exception as e:  # torch raises RuntimeError or pickle errors for damaged zips
            raise CheckpointError("%s: no trellis.torch trailer and not a readable torch.save "
                                  "file (truncated?): %s" % (path, e)) from None
    if at > tail:
        raise CheckpointError("%s: truncated: the trailer at byte %d is cut short" % (path, at))
    if at < tail:
        raise CheckpointError("%s: trailing bytes: %d bytes after the trailer" % (path, tail - at))
    magic, version, size, crc = _CKPT_HEAD.unpack_from(data, at)
    (head_crc,) = struct.unpack_from("<I", data, at + _CKPT_HEAD.size)
    if _crc32c(data[at:at + _CKPT_HEAD.size]) != head_crc:
        raise CheckpointError("%s: trailer checksum mismatch" % path)
    if version != _CKPT_VERSION:
        raise CheckpointError("%s: checkpoint format version %d, this build reads version %d"
                              % (path, version, _CKPT_VERSION))
    payload = memoryview(data)[:at]
    if size != at:
        raise CheckpointError("%s: truncated: the trailer says %d payload bytes, the file has %d"
                              % (path, size, at))
    got = _crc32c(payload)
    if got != crc:
        raise CheckpointError("%s: payload checksum mismatch (stored 0x%08x, computed 0x%08x)"
                              % (path, crc, got))
    return torch.load(io.BytesIO(data), map_location="cpu")


def save_checkpoint(path, model, optimizer=None, **extra):
    """Writes {model, optimizer, extra} to `path` when called on rank 0 (other ranks return at
    once, so both `if trellis.rank() == 0: save_checkpoint(...)` and calling it everywhere work).
    The file is a plain torch.save zip archive (torch.load reads it) whose zip comment carries a
    checksum trailer; written to a temporary file, fsynced, renamed, directory fsynced."""
    st = _state.current()
    st.checkpoint_path, st.checkpoint_extra = path, dict(extra)  # the exit checkpoint's file
    if _trellis.rank() != 0:
        return
    step = st.global_step()
    state = {"model": model.state_dict(), "extra": extra, "trellis": {"step": step}}
    if optimizer is not None:
        state["optimizer"] = optimizer.state_dict()
    _write_checkpoint_file(path, state)
    _tell(step, path)


def _tell(step, path, restored=False):
    """The job's status shows the newest checkpoint and the one it resumed from."""
    s = _trellis._get()
    if s.local or step < 1:
        return
    told = s.worker.report_checkpoint(step, os.path.abspath(path), restored=restored)
    if told:
        print("trellis.torch: telling the scheduler of checkpoint %s: %s" % (path, told),
              file=sys.stderr, flush=True)


def _note_loaded(st, extra, meta, optimizer_state):
    """What the exit checkpoint and the step count need of a loaded file (every rank)."""
    st.checkpoint_extra = dict(extra or {})
    st.base_step = int(meta.get("step", 0))
    if meta.get("exit") is not None:
        st.resume_exit = {"step": st.base_step, "exit": meta["exit"], "optimizer": optimizer_state}


def load_checkpoint(path, model, optimizer=None, root_rank=0):
    """`root_rank` reads the checkpoint, then every worker receives its model and optimizer
    state; returns the `extra` values saved with it. Call it after DistributedOptimizer(...).
    A damaged file raises CheckpointError on every worker (the root tells the others), so no
    worker waits for a broadcast that will not come."""
    extra = None
    problem = None
    state = None
    st = _state.current()
    st.checkpoint_path = path  # the exit checkpoint's file
    if st.rejoined():
        return None  # the donor's state is here already; the others are training
    if _trellis.rank() == root_rank:
        try:
            state = _read_checkpoint_file(path)
        except CheckpointError as e:
            problem = str(e)
    if _trellis.size() > 1:
        if not st.sealed:
            raise RuntimeError("trellis.torch.load_checkpoint: call it after DistributedOptimizer(...)"
                               " (after the first step for lazy modules)")
        problem = _broadcast.broadcast_object(problem, root_rank)
    if problem is not None:
        if _trellis.rank() == root_rank:
            raise CheckpointError(problem)
        raise CheckpointError("rank %d could not load the checkpoint: %s" % (root_rank, problem))
    meta = None
    sd = None
    if _trellis.rank() == root_rank:
        model.load_state_dict(state["model"])
        sd = state.get("optimizer")
        if optimizer is not None and sd is not None:
            optimizer.load_state_dict(sd)
        extra = state.get("extra", {})
        meta = state.get("trellis") or {}
    if _trellis.size() > 1:
        _broadcast.broadcast_tensors_now(_broadcast.tensors_of(model.state_dict()), root_rank)
        if optimizer is not None:
            sd = _broadcast.broadcast_object(optimizer.state_dict(), root_rank)
            if _trellis.rank() != root_rank:
                optimizer.load_state_dict(sd)
        extra, meta = _broadcast.broadcast_object((extra, meta), root_rank)
    _note_loaded(st, extra, meta, sd if optimizer is not None else None)
    if _trellis.rank() == root_rank:
        _tell(st.base_step, path, restored=True)
    return extra
