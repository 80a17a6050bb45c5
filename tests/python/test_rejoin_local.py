"""trellis.torch crash recovery pieces that need no cluster: the arena's size probe, packing
and unpacking an optimizer's state, and TrainingState in a local session."""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch (python3-torch) is not importable")

import trellis  # noqa: E402
import trellis.torch as tt  # noqa: E402
from trellis import _rejoin  # noqa: E402


def test_probe_measures_the_optimizer_state():
    assert _rejoin.probe_optimizer(torch.optim.SGD, {"lr": 0.1}) == (0, 0)
    # Momentum: one float32 buffer per element.
    assert _rejoin.probe_optimizer(torch.optim.SGD, {"lr": 0.1, "momentum": 0.9})[0] == 4
    # Adam: two buffers per element, plus its step counter per parameter.
    per_elem, _ = _rejoin.probe_optimizer(torch.optim.Adam, {"lr": 0.1})
    assert per_elem == 8


def test_pack_and_unpack_give_back_the_same_state():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.BatchNorm1d(4))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(8, 5)).sum().backward()
    opt.step()
    pool = torch.zeros(1 << 16, dtype=torch.uint8)
    packer = _rejoin._Packer(pool)
    packed = packer.tree(opt.state_dict())
    packer.write()
    got = _rejoin._unpack(pool, packed)
    want = opt.state_dict()
    for i, s in want["state"].items():
        for k, v in s.items():
            assert torch.equal(got["state"][i][k], v), k
    assert got["param_groups"] == want["param_groups"]
    # The pool is bounded: a state that does not fit says so instead of writing past it.
    small = _rejoin._Packer(torch.zeros(64, dtype=torch.uint8))
    with pytest.raises(_rejoin._Full):
        small.tree(opt.state_dict())


class _FakeWorker:
    """The binding's rejoin calls, recorded (the C++ keeper's side is tests/python/test_torch_rejoin.py)."""

    def __init__(self):
        self.calls = []
        self.prepare = None

    def rejoin_start(self, arrays, key, arena, prepare):
        self.prepare = prepare

    def rejoin_begin_update(self):
        self.calls.append("begin")

    def rejoin_commit(self, step, again=False, copy=False):
        self.calls.append(("commit", step, again, copy))


class _Buffers:
    """What a TrainingState commits of a model: its buffers (BatchNorm statistics)."""

    def __init__(self, model):
        self.model = model

    def _trellis_pack(self, packer):
        return {"buffers": [(n, packer.put(b)) for n, b in self.model.named_buffers()]}


def _served(keeper, step):
    """What a rejoiner would read: the arena after the keeper's thread prepared `step`."""
    import pickle
    keeper.worker.prepare(step)
    magic, got, off, n = _rejoin._HEADER.unpack(keeper.pool[:_rejoin._HEADER.size].numpy().tobytes())
    assert (magic, got) == (_rejoin._MAGIC, step)
    meta = pickle.loads(keeper.pool[off:off + n].numpy().tobytes())
    return (_rejoin._unpack(keeper.pool, meta["optimizers"][0]),
            dict((k, _rejoin._unpack(keeper.pool, r)) for k, r in meta["training_state"]["buffers"]))


def test_a_commit_copies_only_what_the_next_forward_changes_and_serves_its_step():
    # The live keeper: at a step boundary the optimizer's state is laid out, not copied (it
    # changes only inside the next update window); the model buffers, which the next forward
    # changes, are copied. A serve after that forward hands out the boundary's values.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.BatchNorm1d(4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt._trellis_base = torch.optim.SGD  # what DistributedOptimizer sets
    worker = _FakeWorker()
    params = [(n, p, i) for i, (n, p) in enumerate(model.named_parameters())]
    keeper = _rejoin.Keeper(worker, params, [opt], _rejoin.arena_bytes([(opt, [p for _, p, _ in params])]))
    keeper.training_state = _Buffers(model)
    model(torch.randn(8, 5)).sum().backward()
    keeper.begin_update()
    opt.step()
    keeper.after_step()
    assert worker.calls == ["begin", "begin", ("commit", 1, False, False)]
    momentum = {i: s["momentum_buffer"].clone() for i, s in opt.state_dict()["state"].items()}
    running = model[1].running_mean.clone()
    model(torch.randn(8, 5))  # the next step's forward: buffers move, the optimizer does not
    assert not torch.equal(model[1].running_mean, running)
    state, buffers = _served(keeper, 1)
    assert torch.equal(buffers["1.running_mean"], running)
    for i, m in momentum.items():
        assert torch.equal(state["state"][i]["momentum_buffer"], m)
    with pytest.raises(RuntimeError, match="last commit is step 1"):
        worker.prepare(2)
    # keep_copy (step(closure), join): the boundary's state is written and copied by the keeper.
    keeper.keep_copy()
    assert worker.calls[-2:] == ["begin", ("commit", 1, True, True)]
    # A state that outgrows the arena fails at the step, not at a later rejoin.
    small = _rejoin.Keeper(_FakeWorker(), params, [opt], 256)
    small.training_state = _Buffers(model)
    with pytest.raises(RuntimeError, match="outgrew"):
        small.commit()


def test_parameters_a_commit_keeps_exactly():
    # float32 read in place; 16-bit ones staged through float32 (exact both ways); float64 not.
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        assert _rejoin.keepable(torch.zeros(3, dtype=dtype))
        assert _rejoin.keepable(torch.zeros(3, 2, dtype=dtype).t())  # not contiguous: staged
    assert not _rejoin.keepable(torch.zeros(3, dtype=torch.float64))
    # The staging is exact: every bfloat16 value survives float32 and back.
    b = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    back = b.float().to(torch.bfloat16)
    keep = ~torch.isnan(b.float())  # NaN payloads may be canonicalized
    assert keep.sum() > 65000
    assert torch.equal(back.view(torch.int16)[keep], b.view(torch.int16)[keep])


def test_what_keeps_crash_recovery_off_is_named():
    ok = [("fc.weight", torch.zeros(3)), ("fc.bias", torch.zeros(3, dtype=torch.bfloat16))]
    assert _rejoin.blocker(ok, in_step=False) is None
    why = _rejoin.blocker(ok + [("head.weight", torch.zeros(2, dtype=torch.float64))], False)
    assert "head.weight" in why and "float64" in why
    assert "lazy module" in _rejoin.blocker(ok, in_step=True)


def test_training_state_is_plain_values_without_a_job():
    trellis.init(local=True)
    try:
        st = tt.TrainingState(None, None, None, epoch=3, batch=0)
        assert (st.epoch, st.batch, st.rejoined_step) == (3, 0, None)
        st.batch = 7
        assert st.batch == 7
        st.commit()  # no crash recovery in a local session: nothing to do
        with pytest.raises(AttributeError):
            st.missing
    finally:
        trellis.shutdown()
