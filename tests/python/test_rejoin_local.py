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
