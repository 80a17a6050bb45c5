"""Collectives on arrays of any shape without keys declared in advance (docs/pytorch.md,
"Collectives"): trellis.torch's allreduce / allgather / broadcast run on these.

Every collective of a process travels through one channel key (declared with the first
collective, or at trellis.torch's seal) as push_pull rounds of a fixed-size float32 buffer:

  1. a header round: each rank writes, in its own slot, a fingerprint of the call (kind, name,
     dtype, shape) and its element count; the sum gives every rank every rank's slot. A
     fingerprint that differs from this rank's means the ranks called collectives in a
     different order (or with other names or shapes): every rank raises at once, naming the
     ranks, instead of waiting for a push that will not come.
  2. data rounds of at most CHANNEL_FLOATS values: allreduce sums float32 values; broadcast and
     allgather move raw bytes as 16-bit pieces (each exact in float32: the sum of one piece and
     zeros is the piece), so any dtype arrives bit for bit.

A rank's collectives form one sequence: call them from one thread, in the same order on every
rank. The channel's pushes are never compressed (not 2-bit, not 16-bit).
"""

import zlib

import numpy as np

import trellis as _trellis
from trellis import _keys

KEY = _keys.COLLECTIVES       # the collective channel's key id
CHANNEL_FLOATS = 1 << 16      # 256 KiB per round
_SLOT = 6                     # header floats per rank: marker, fingerprint (2), count (3)


class CollectiveError(RuntimeError):
    """Ranks disagree about a collective (order, name, dtype or shape)."""


class _Channel:
    def __init__(self):
        self.declared_in = None   # the session whose worker has the key
        self.buf = None

    def ensure(self, s):
        """Declares the channel in session `s` (collective on first use: every rank's first
        collective, or the seal, reaches this point together)."""
        if self.declared_in is s:
            return
        if KEY not in s.sizes:
            s.declare(KEY, CHANNEL_FLOATS, "trellis.collective", wire="float32")
            s.finish()  # the first FinishDeclarations, or one that extends the key set
        self.declared_in = s
        self.buf = np.zeros(CHANNEL_FLOATS, dtype=np.float32)


_channel = _Channel()


def declare_channel(s):
    """For a caller about to FinishDeclarations anyway (trellis.torch's seal): declares the
    channel key alongside its own keys, so no later collective extends the key set."""
    if KEY not in s.sizes and not s.local:
        s.declare(KEY, CHANNEL_FLOATS, "trellis.collective", wire="float32")
        _channel.declared_in = s
        _channel.buf = np.zeros(CHANNEL_FLOATS, dtype=np.float32)


def _forget():
    _channel.declared_in = None
    _channel.buf = None


_trellis._on_shutdown.append(_forget)


def _fingerprint(kind, name, dtype, shape):
    return zlib.crc32(repr((kind, name, str(dtype), tuple(shape))).encode())


def _round(s, fill):
    """One push_pull of the channel: fill(buf) writes this rank's part (buf starts zeroed);
    returns the summed buffer (valid until the next round)."""
    buf = _channel.buf
    buf[:] = 0
    fill(buf)
    s.push_pull(KEY, buf).wait()
    return buf


def _header(s, what, fp, count):
    """The header round: returns every rank's element count; raises CollectiveError on every
    rank when the ranks' fingerprints differ."""
    size, rank = s.size(), s.rank()
    if size * _SLOT > CHANNEL_FLOATS:
        raise CollectiveError("trellis collectives support at most %d workers"
                              % (CHANNEL_FLOATS // _SLOT))

    def fill(buf):
        o = rank * _SLOT
        buf[o:o + _SLOT] = [1.0, fp & 0xFFFF, fp >> 16, count & 0xFFFF, (count >> 16) & 0xFFFF,
                            count >> 32]
    got = _round(s, fill)[:size * _SLOT].reshape(size, _SLOT).astype(np.int64)
    fps = got[:, 1] | (got[:, 2] << 16)
    counts = got[:, 3] | (got[:, 4] << 16) | (got[:, 5] << 32)
    if (got[:, 0] != 1).any() or (fps != fp).any():
        others = [r for r in range(size) if got[r, 0] != 1 or fps[r] != fp]
        raise CollectiveError(
            "%s: collectives out of order: rank%s %s called another collective here (its kind, "
            "name, dtype or shape differ); every rank must call the same collectives in the same "
            "order" % (what, "s" if len(others) > 1 else "", ", ".join(map(str, others))))
    return [int(c) for c in counts]


def _session():
    s = _trellis._get()
    if not s.local and s.size() > 1:
        _channel.ensure(s)
    return s


def allreduce_sum(values, name=None, what=None):
    """The sum over all ranks of a float32 array (any shape), as a new float32 array."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    s = _session()
    if s.local or s.size() == 1:
        return values.copy()
    flat = values.reshape(-1)
    what = what or "allreduce of %s float32" % (list(values.shape),)
    _header(s, what, _fingerprint("allreduce", name, "float32", values.shape),
            flat.size)
    out = np.empty_like(flat)
    for off in range(0, flat.size, CHANNEL_FLOATS):
        n = min(CHANNEL_FLOATS, flat.size - off)

        def fill(buf, off=off, n=n):
            buf[:n] = flat[off:off + n]
        out[off:off + n] = _round(s, fill)[:n]
    return out.reshape(values.shape)


def _to_pieces(raw):
    """Raw bytes as float32 values of their 16-bit pieces (an odd length is padded)."""
    if raw.size % 2:
        raw = np.concatenate([raw, np.zeros(1, np.uint8)])
    return raw.view("<u2").astype(np.float32)


def _from_pieces(vals, nbytes):
    return vals.astype("<u2").view(np.uint8)[:nbytes]


def _move_pieces(s, parts, total):
    """Data rounds of raw 16-bit pieces: `parts` is [(global offset, float32 pieces)] this rank
    contributes; returns the `total` summed pieces."""
    out = np.empty(total, dtype=np.float32)
    for off in range(0, total, CHANNEL_FLOATS):
        n = min(CHANNEL_FLOATS, total - off)

        def fill(buf, off=off, n=n):
            for start, pieces in parts:
                lo, hi = max(start, off), min(start + pieces.size, off + n)
                if lo < hi:
                    buf[lo - off:hi - off] = pieces[lo - start:hi - start]
        out[off:off + n] = _round(s, fill)[:n]
    return out


def broadcast_bytes(raw, root, desc, name=None, what="broadcast"):
    """`root`'s bytes (a uint8 array; every rank passes one of the same length) on every rank.
    `desc` (dtype, shape) goes into the call's fingerprint."""
    s = _session()
    if not 0 <= root < s.size():
        raise CollectiveError("broadcast: root %d outside [0, %d)" % (root, s.size()))
    if s.local or s.size() == 1:
        return raw.copy()
    fp = _fingerprint("broadcast", name, desc[0], tuple(desc[1]) + (root,))
    _header(s, what, fp, raw.size)
    pieces = _to_pieces(raw)
    mine = [(0, pieces)] if s.rank() == root else []
    return _from_pieces(_move_pieces(s, mine, pieces.size), raw.size)


def allgather_bytes(raw, desc, name=None, what="allgather"):
    """Every rank's bytes (uint8 arrays, lengths may differ), in rank order, on every rank.
    `desc` (dtype, shape without the first dimension) goes into the call's fingerprint."""
    s = _session()
    if s.local or s.size() == 1:
        return [raw.copy()]
    fp = _fingerprint("allgather", name, desc[0], desc[1])
    sizes = _header(s, what, fp, raw.size)
    lens = [(b + 1) // 2 for b in sizes]  # 16-bit pieces per rank
    starts = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    pieces = _move_pieces(s, [(int(starts[s.rank()]), _to_pieces(raw))], int(starts[-1]))
    return [_from_pieces(pieces[starts[r]:starts[r + 1]], sizes[r]) for r in range(s.size())]
