"""trellis.torch tensor types and collectives in one process (no job): staging of gradients
the library cannot use in place (non-contiguous, 16-bit, CUDA), the wire settings' checks,
and the collectives' single-process answers. The CUDA test runs where a GPU is visible."""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch (python3-torch) is not importable")

import trellis  # noqa: E402
import trellis.torch as tt  # noqa: E402
from trellis import _optimizer  # noqa: E402
import dp_common as dc  # noqa: E402
from test_torch_local import local_session  # noqa: E402,F401  (autouse: a fresh local session)
from test_torch_local import spy_push_pull  # noqa: E402


def pushed_arrays(monkeypatch):
    """Records what each push_pull got (the library needs float32 contiguous CPU memory)."""
    return spy_push_pull(monkeypatch, lambda key, array, priority: array)


def train_pair(make, steps=3):
    """Trains two copies of a model, one plain and one under DistributedOptimizer."""
    torch.manual_seed(7)
    a = make()
    b = make()
    b.load_state_dict(a.state_dict())
    opt_a = dc.make_optimizer(a)
    opt_b = tt.DistributedOptimizer(dc.make_optimizer(b), b.named_parameters())
    dc_x, dc_y = dc.data()
    for s in range(steps):
        for m, o in ((a, opt_a), (b, opt_b)):
            o.zero_grad()
            dt = m.conv.weight.dtype
            loss = torch.nn.functional.cross_entropy(m(dc_x[s].to(m.conv.weight.device, dt))
                                                     .float(), dc_y[s].to(m.conv.weight.device))
            loss.backward()
            o.step()
    return a, b


def test_non_contiguous_gradients_are_staged(monkeypatch):
    seen = pushed_arrays(monkeypatch)

    def make():
        m = dc.Net()
        m.out.weight = torch.nn.Parameter(m.out.weight.detach().t().contiguous().t())
        return m
    a, b = train_pair(make)
    assert not b.out.weight.grad.is_contiguous()  # the gradient kept its layout
    assert all(t.is_contiguous() and t.dtype == torch.float32 for t in seen)
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k


def test_bfloat16_gradients_are_staged_and_keep_their_dtype(monkeypatch):
    seen = pushed_arrays(monkeypatch)
    a, b = train_pair(lambda: dc.Net().to(torch.bfloat16))
    assert b.conv.weight.grad.dtype == torch.bfloat16
    assert seen and all(t.dtype == torch.float32 for t in seen)
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k


def test_wire_settings_are_checked():
    model = dc.Net()
    with pytest.raises(ValueError, match="wire_dtype 'float8': want 'float32', 'float16' or "
                                         "'bfloat16'"):
        tt.DistributedOptimizer(dc.make_optimizer(model), model.named_parameters(),
                                wire_dtype="float8")
    assert not isinstance(model, _optimizer._DistributedMixin)
    with pytest.raises(trellis.TrellisError, match="DeclareKey k: wire 'fp8'"):
        trellis.declare("k", 3, wire="fp8")
    trellis.declare("h", 3, wire="bfloat16")


def test_collectives_alone():
    t = torch.tensor([[1.0, 2.0]])
    assert torch.equal(tt.allreduce(t), t) and tt.allreduce(t) is not t
    assert torch.equal(tt.allgather(t), t)
    assert tt.allgather(torch.tensor(3)).tolist() == [3]
    assert torch.equal(tt.broadcast(t, 0), t)
    with pytest.raises(tt.CollectiveError, match="root 1 outside"):
        tt.broadcast(t, 1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_gradients_and_collectives_go_through_pinned_host_memory(monkeypatch):
    seen = pushed_arrays(monkeypatch)

    class Mlp(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Linear(64, 32)  # named conv: train_pair reads its dtype
            self.out = torch.nn.Linear(32, 10)

        def forward(self, x):
            return self.out(torch.relu(self.conv(x.flatten(1))))
    a, b = train_pair(lambda: Mlp().cuda())
    assert b.conv.weight.grad.is_cuda
    assert seen and all(t.device.type == "cpu" and t.is_pinned() for t in seen)
    for k, v in a.state_dict().items():
        assert torch.allclose(v, b.state_dict()[k]), k
    g = torch.arange(4.0, device="cuda")
    for out in (tt.allreduce(g), tt.allgather(g), tt.broadcast(g)):
        assert out.is_cuda and torch.equal(out, g)
