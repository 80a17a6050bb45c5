"""What a DDP user relies on without extra calls (issue 19), under trellis-launch (2 workers x
2 servers): gradients final when backward() returns, BatchNorm buffers equal, gradient
accumulation, a rank-0-only checkpoint that plain torch.load reads, uneven batches with join(),
and serverMode: update refused at once without restarts."""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch (python3-torch) is not importable")

import dp_common as dc  # noqa: E402
from test_torch_launch import assert_same, load, reference  # noqa: E402


def reference_clipped(steps):
    torch.manual_seed(100)
    model = dc.Net()
    norms = []
    dc.train_steps_clipped(model, dc.make_optimizer(model), 0, steps, norms=norms)
    return model.state_dict(), norms


def test_gradients_are_final_when_backward_returns(launch, tmp_path):
    # clip_grad_norm_ between backward() and step(), no synchronize(): both workers clip the
    # same averaged gradient, log the same norm, and train like one process on the whole batch.
    launch("py-clip", str(tmp_path), "clip")
    w0, w1 = load(tmp_path, 0), load(tmp_path, 1)
    assert_same(w0, w1, 0)
    ref, ref_norms = reference_clipped(dc.STEPS)
    assert_same(w0, ref, 1e-5)
    norms = [[float(v) for v in (tmp_path / ("checks%d.txt" % r)).read_text().split()]
             for r in (0, 1)]
    assert norms[0] == norms[1]
    assert norms[0] == pytest.approx(ref_norms, rel=1e-5)
    assert max(ref_norms) > dc.MAX_NORM  # clipping did act


@pytest.mark.parametrize("mode", ["bn", pytest.param("bn-cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device"))])
def test_batchnorm_buffers_equal_on_every_worker(launch, tmp_path, mode):
    # bn-cuda: the model on the GPU (parameters, buffers and the broadcasts staged on the host).
    launch("py-" + mode, str(tmp_path), mode)
    w0, w1 = load(tmp_path, 0), load(tmp_path, 1)
    assert_same(w0, w1, 0)  # running_mean and running_var included
    assert not torch.allclose(w0["bn.running_mean"], torch.zeros(4))  # they did move


def test_gradient_accumulation_equals_the_large_batch_step(launch, tmp_path):
    # Steps 0-2: two micro-batches, the first inside no_sync(); steps 3-5: two plain backwards.
    launch("py-accum", str(tmp_path), "accum")
    w0, w1 = load(tmp_path, 0), load(tmp_path, 1)
    assert_same(w0, w1, 0)
    assert_same(w0, reference(dc.STEPS), 1e-5)


def test_checkpoint_saved_on_rank_0_only_loads_with_plain_torch_load(launch, tmp_path):
    ckpt = str(tmp_path / "ckpt.pt")
    launch("py-save0", str(tmp_path), "save0", "3", ckpt)
    state = torch.load(ckpt)  # plain PyTorch, no trellis
    assert state["extra"] == {"step": 3}
    assert_same(state["model"], reference(3), 1e-5)
    assert "optimizer" in state
    w0, w1 = load(tmp_path, 0), load(tmp_path, 1)
    assert_same(w0, w1, 0)
    assert_same(w0, reference(dc.STEPS), 1e-5)


def test_uneven_batches_with_join_end_identical(launch, tmp_path):
    # Rank 0 has 3 batches, rank 1 has 5: steps 3 and 4 average rank 1's gradient with rank 0's
    # zeros (divided by 2, as DDP's join does), then rank 0 takes rank 1's final state.
    launch("py-join", str(tmp_path), "join")
    w0, w1 = load(tmp_path, 0), load(tmp_path, 1)
    assert_same(w0, w1, 0)
    torch.manual_seed(100)
    model = dc.Net()
    opt = dc.make_optimizer(model)
    dc.train_steps(model, opt, 0, 3)
    x, y = dc.data()
    for s in (3, 4):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(dc.shard(x[s], 1, 2)), dc.shard(y[s], 1, 2))
        (loss / 2).backward()
        opt.step()
    assert_same(w0, model.state_dict(), 1e-5)
    for r in (0, 1):
        assert (tmp_path / ("checks%d.txt" % r)).read_text().splitlines() == ["joined"]


def test_update_mode_is_refused_at_once_and_not_restarted(launch, tmp_path):
    rc, out = launch("py-update", str(tmp_path), "update",
                     extra="  serverMode: update\n  optimizer:\n    type: sgd\n    learningRate: 0.1\n",
                     policy="OnFailure", ok=False)
    assert rc != 0, out
    assert "DistributedOptimizer needs serverMode: aggregate" in out, out
    assert "exited with code 78 after 0 restarts (restartPolicy OnFailure)" in out, out
    assert "before the key was initialized" not in out, out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_amp_on_cuda_unscale_and_clip_see_the_averaged_gradient(launch, tmp_path):
    # The AMP recipe on CUDA gradients (staged through pinned host memory): both workers
    # unscale and clip the same averaged gradient, skip or take the same steps, and end equal
    # and close to one process on the whole batch (float16 autocast: not bit-equal to it).
    launch("py-amp", str(tmp_path), "amp")
    w0, w1 = load(tmp_path, 0), load(tmp_path, 1)
    assert_same(w0, w1, 0)
    checks = [(tmp_path / ("checks%d.txt" % r)).read_text().split("\n") for r in (0, 1)]
    assert checks[0] == checks[1]  # every norm and the final loss scale
    torch.manual_seed(100)
    model = dc.Net().cuda()
    norms = []
    dc.train_steps_amp(model, dc.make_optimizer(model), dc.grad_scaler(), 0, dc.STEPS, norms=norms)
    assert_same(w0, {k: v.cpu() for k, v in model.state_dict().items()}, 5e-3)
    got = [float(v) for v in checks[0][:dc.STEPS]]
    assert got == pytest.approx(norms, rel=5e-3)
    assert max(norms) > dc.MAX_NORM  # clipping did act
