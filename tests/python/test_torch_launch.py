"""trellis.torch end to end: 2 workers x 2 servers under trellis-launch, against a
single-process reference of the same math (dp_common)."""
import os

import pytest

torch = pytest.importorskip("torch", reason="PyTorch (python3-torch) is not importable")

import dp_common as dc  # noqa: E402


def load(d, rank):
    return torch.load(os.path.join(d, "rank%d.pt" % rank))


def reference(steps, lazy=False):
    """One process, the whole global batch per step, starting from rank 0's weights."""
    torch.manual_seed(100)
    model = dc.Net(lazy=lazy)
    opt = dc.make_optimizer(model)
    dc.train_steps(model, opt, 0, steps)
    return model.state_dict()


def assert_same(a, b, tol):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], rtol=tol, atol=tol), \
            "%s differs: max |diff| %g" % (k, (a[k] - b[k]).abs().max())


def test_workers_match_single_process_and_each_other(launch, tmp_path):
    launch("py-train", str(tmp_path), "train")
    w0, w1 = load(tmp_path, 0), load(tmp_path, 1)
    assert_same(w0, w1, 0)  # bit-identical: same sums, same updates
    assert_same(w0, reference(dc.STEPS), 1e-5)
    # The untrained rank-0 init differs from the result: training did happen.
    init = dc.Net().state_dict()
    assert not torch.allclose(init["out.weight"], w0["out.weight"])
    # An error from the C++ library, as a Python exception with the library's message.
    for r in (0, 1):
        assert (tmp_path / ("checks%d.txt" % r)).read_text().splitlines() == [
            "5 NOT_FOUND PushPull of undeclared key 99",
            "3 push_pull key 2305843009213693957: want a float32 array, got format 'd' with "
            "8-byte items",
            "3 push_pull key 2305843009213693957: array is not C-contiguous",
            "3 push_pull key 2305843009213693957 (out.bias): array has 11 elements, the key has 10"]


def test_lazy_model_identical_after_first_step(launch, tmp_path):
    launch("py-lazy", str(tmp_path), "lazy")
    w0, w1 = load(tmp_path, 0), load(tmp_path, 1)
    assert w0["fc.weight"].shape == (16, 4 * 6 * 6)
    assert_same(w0, w1, 0)


def test_checkpoint_restore_continues_training(launch, tmp_path):
    ckpt = str(tmp_path / "ckpt.pt")
    first = tmp_path / "first"
    first.mkdir()
    launch("py-save", str(first), "save", "3", ckpt)
    assert os.path.exists(ckpt)
    second = tmp_path / "second"
    second.mkdir()
    launch("py-resume", str(second), "resume", ckpt)
    for r in (0, 1):
        assert (second / ("checks%d.txt" % r)).read_text().splitlines() == ["resumed at 3"]
    w0, w1 = load(second, 0), load(second, 1)
    assert_same(w0, w1, 0)
    # Stopping at 3 and resuming (momentum included) equals 6 uninterrupted steps.
    assert_same(w0, reference(dc.STEPS), 1e-5)


def test_damaged_checkpoint_fails_every_worker_not_just_the_root(launch, tmp_path):
    ckpt = str(tmp_path / "ckpt.pt")
    first = tmp_path / "first"
    first.mkdir()
    launch("py-save2", str(first), "save", "2", ckpt)
    data = bytearray(open(ckpt, "rb").read())
    data[-100] ^= 0x40  # inside the archive, before the 28-byte trailer
    open(ckpt, "wb").write(bytes(data))
    second = tmp_path / "second"
    second.mkdir()
    launch("py-damaged", str(second), "resume-damaged", ckpt)
    lines = [(second / ("checks%d.txt" % r)).read_text().splitlines() for r in (0, 1)]
    assert len(lines[0]) == 1 and lines[0][0].startswith("CKPT: payload checksum mismatch"), lines
    assert lines[1] == ["rank 0 could not load the checkpoint: " + lines[0][0]]


def test_worker_api_without_torch_layer(launch, tmp_path):
    launch("py-lowlevel", str(tmp_path), "lowlevel")
    for r in (0, 1):
        assert (tmp_path / ("checks%d.txt" % r)).read_text().splitlines() == [
            "tensor in place True",
            "out True src True",
            "after drop True",
            "broadcast from 1 [1.0, 1.0, 1.0, 1.0, 1.0]",
            "FAILED_PRECONDITION Broadcast key %d (a) after step 3: broadcast before the first push"
            % (1 << 40),
            "gil released True",
            "bytes True"]

