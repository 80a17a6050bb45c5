"""trellis.torch in one process (no job): the optimizer's hooks, priorities and bookkeeping."""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch (python3-torch) is not importable")

import trellis  # noqa: E402
import trellis.torch as tt  # noqa: E402
import dp_common as dc  # noqa: E402


@pytest.fixture(autouse=True)
def local_session(monkeypatch):
    monkeypatch.delenv("TRELLIS_SCHEDULER", raising=False)
    trellis.shutdown()
    trellis.init()
    yield
    trellis.shutdown()


def test_local_training_equals_plain_optimizer():
    torch.manual_seed(7)
    a = dc.Net()
    b = dc.Net()
    b.load_state_dict(a.state_dict())
    opt_a = dc.make_optimizer(a)
    opt_b = tt.DistributedOptimizer(dc.make_optimizer(b), b.named_parameters())
    assert isinstance(opt_b, torch.optim.SGD)  # LR schedulers still accept it
    tt.broadcast_parameters(b.state_dict())
    tt.broadcast_optimizer_state(opt_b)
    dc.train_steps(a, opt_a, 0, 3)
    dc.train_steps(b, opt_b, 0, 3)
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k


def test_pushes_start_during_backward_last_layer_first(monkeypatch):
    model = dc.Net()
    with torch.no_grad():  # the hooks do not depend on the caller's grad mode
        opt = tt.DistributedOptimizer(dc.make_optimizer(model), model.named_parameters())
    assert tt.is_sealed()
    calls = []
    real = trellis.push_pull
    in_backward = [False]

    def spy(key, array, out=None, priority=0):
        calls.append((priority, in_backward[0]))
        return real(key, array, out, priority)
    monkeypatch.setattr(trellis, "push_pull", spy)
    x, y = dc.data()
    loss = torch.nn.functional.cross_entropy(model(x[0]), y[0])
    in_backward[0] = True
    loss.backward()
    in_backward[0] = False
    assert len(calls) == 6 and all(during for _, during in calls)
    assert sorted(p for p, _ in calls) == [-5, -4, -3, -2, -1, 0]  # priority = -index
    layers = [(-p) // 2 for p, _ in calls]                        # 2 parameters per layer
    assert layers == sorted(layers, reverse=True)                  # out, fc, conv
    opt.step()
    assert len(calls) == 6  # step() only waited


def test_missing_gradient_is_pushed_as_zeros_in_step(monkeypatch):
    model = dc.Net()
    opt = tt.DistributedOptimizer(dc.make_optimizer(model), model.named_parameters())
    keys = []
    real = trellis.push_pull
    monkeypatch.setattr(trellis, "push_pull",
                        lambda k, a, out=None, priority=0: keys.append(k) or real(k, a, out, priority))
    opt.step()  # no backward at all: every key still takes its step (the servers wait for it)
    assert len(keys) == 6
    assert torch.count_nonzero(model.out.bias.grad) == 0


def test_second_backward_before_step_is_refused():
    model = dc.Net()
    dc.train_steps(model, tt.DistributedOptimizer(dc.make_optimizer(model),
                                                 model.named_parameters()), 0, 1)
    x, y = dc.data()
    torch.nn.functional.cross_entropy(model(x[1]), y[1]).backward()
    with pytest.raises(RuntimeError, match="produced twice before step"):
        torch.nn.functional.cross_entropy(model(x[1]), y[1]).backward()


def test_lazy_model_seals_at_first_step():
    model = dc.Net(lazy=True)
    opt = tt.DistributedOptimizer(dc.make_optimizer(model), model.named_parameters())
    tt.broadcast_parameters(model.state_dict())
    assert not tt.is_sealed()  # fc has no shape yet
    dc.train_steps(model, opt, 0, 2)
    assert tt.is_sealed()
    assert model.fc.weight.shape == (16, 144)


def test_second_optimizer_after_seal_is_a_clear_error():
    model = dc.Net()
    tt.DistributedOptimizer(dc.make_optimizer(model), model.named_parameters())
    other = dc.Net()
    with pytest.raises(RuntimeError, match="keys were already declared"):
        tt.DistributedOptimizer(dc.make_optimizer(other), other.named_parameters())


def test_named_parameters_must_cover_the_optimizer():
    model = dc.Net()
    with pytest.raises(ValueError, match="lacks 2 of the optimizer's parameters"):
        tt.DistributedOptimizer(dc.make_optimizer(model),
                                [(n, p) for n, p in model.named_parameters() if "out" not in n])


def test_checkpoint_round_trip(tmp_path):
    model = dc.Net()
    opt = tt.DistributedOptimizer(dc.make_optimizer(model), model.named_parameters())
    dc.train_steps(model, opt, 0, 2)
    path = str(tmp_path / "c.pt")
    tt.save_checkpoint(path, model, opt, step=2)
    other = dc.Net()
    trellis.shutdown()
    trellis.init()
    opt2 = tt.DistributedOptimizer(dc.make_optimizer(other), other.named_parameters())
    assert tt.load_checkpoint(path, other, opt2) == {"step": 2}
    dc.train_steps(model, opt, 2, 4)
    dc.train_steps(other, opt2, 2, 4)
    for k, v in model.state_dict().items():
        assert torch.equal(v, other.state_dict()[k]), k


def _saved(tmp_path):
    model = dc.Net()
    opt = tt.DistributedOptimizer(dc.make_optimizer(model), model.named_parameters())
    dc.train_steps(model, opt, 0, 1)
    path = tmp_path / "c.pt"
    tt.save_checkpoint(str(path), model, opt, step=1)
    return path, model, opt


def test_checkpoint_file_is_atomic_and_checksummed(tmp_path):
    path, _, _ = _saved(tmp_path)
    data = path.read_bytes()
    assert data[:8] == b"TRLSPYCK"
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]  # no temporary file left


@pytest.mark.parametrize("damage, message", [
    (lambda d: d[:20], r"truncated: 20 bytes, shorter than the 28-byte header"),
    (lambda d: d[:-7], r"truncated: the header says \d+ payload bytes, the file has \d+"),
    (lambda d: d + b"x", r"trailing bytes: the header says"),
    (lambda d: d[:100] + bytes([d[100] ^ 1]) + d[101:], r"payload checksum mismatch \(stored 0x"),
    (lambda d: d[:9] + bytes([d[9] ^ 1]) + d[10:], r"header checksum mismatch"),
    (lambda d: b"NOTTRLS!" + d[8:], r"not a trellis.torch checkpoint"),
    (lambda d: b"", r"truncated: 0 bytes"),
])
def test_damaged_checkpoint_is_rejected_naming_the_file(tmp_path, damage, message):
    path, model, opt = _saved(tmp_path)
    path.write_bytes(damage(path.read_bytes()))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(tt.CheckpointError, match=str(path).replace(".", r"\.") + ": " + message):
        tt.load_checkpoint(str(path), model, opt)
    for k, v in model.state_dict().items():  # nothing half-loaded
        assert torch.equal(v, before[k]), k


def test_other_checkpoint_version_is_rejected(tmp_path):
    path, model, opt = _saved(tmp_path)
    data = bytearray(path.read_bytes())
    data[8] = 9  # version 9 ...
    head = bytes(data[:24])
    data[24:28] = tt._crc32c(head).to_bytes(4, "little")  # ... with a valid header checksum
    path.write_bytes(bytes(data))
    with pytest.raises(tt.CheckpointError, match="checkpoint format version 9, this build reads "
                                                 "version 1"):
        tt.load_checkpoint(str(path), model, opt)


def test_missing_checkpoint_names_the_file(tmp_path):
    model = dc.Net()
    opt = tt.DistributedOptimizer(dc.make_optimizer(model), model.named_parameters())
    with pytest.raises(tt.CheckpointError, match="nope.pt: cannot read"):
        tt.load_checkpoint(str(tmp_path / "nope.pt"), model, opt)


def test_plain_torch_save_file_still_loads(tmp_path):
    path, model, opt = _saved(tmp_path)
    plain = tmp_path / "plain.pt"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                "extra": {"step": 5}}, str(plain))
    assert tt.load_checkpoint(str(plain), model, opt) == {"step": 5}


def test_crc32c_matches_the_cpp_checksum():
    assert tt._crc32c(b"123456789") == 0xE3069283  # RFC 3720 vector, as common/crc32c


def test_seal_without_optimizer_runs_queued_broadcasts():
    ran = []
    model = dc.Net()
    tt.broadcast_parameters(model.state_dict())
    tt._state.pending.append((lambda: True, lambda: ran.append(1)))
    assert not tt.is_sealed() and not ran
    tt.seal()
    assert tt.is_sealed() and ran == [1] and tt._state.pending == []
