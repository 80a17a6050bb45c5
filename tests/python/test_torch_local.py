"""trellis.torch in one process (no job): the optimizer's hooks, priorities and bookkeeping."""
import io
import struct
import zipfile

import pytest

torch = pytest.importorskip("torch", reason="PyTorch (python3-torch) is not importable")

import trellis  # noqa: E402
import trellis.torch as tt  # noqa: E402
from trellis import _checkpoint, _state  # noqa: E402
import dp_common as dc  # noqa: E402


@pytest.fixture(autouse=True)
def local_session(monkeypatch):
    monkeypatch.delenv("TRELLIS_SCHEDULER", raising=False)
    trellis.shutdown()
    trellis.init()
    yield
    trellis.shutdown()


def spy_push_pull(monkeypatch, note):
    """From here on each trellis.push_pull(key, array, out, priority) first appends
    note(key, array, priority) to the list returned, then runs the real push_pull."""
    seen = []
    real = trellis.push_pull

    def spy(key, array, out=None, priority=0):
        seen.append(note(key, array, priority))
        return real(key, array, out, priority)
    monkeypatch.setattr(trellis, "push_pull", spy)
    return seen


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
    in_backward = [False]
    calls = spy_push_pull(monkeypatch, lambda key, array, priority: (priority, in_backward[0]))
    x, y = dc.data()
    loss = torch.nn.functional.cross_entropy(model(x[0]), y[0])
    in_backward[0] = True
    loss.backward()
    in_backward[0] = False
    assert len(calls) == 6 and all(during for _, during in calls)
    assert sorted(p for p, _ in calls) == [-5, -4, -3, -2, -1, 0]  # priority = -index
    layers = [(-p) // 2 for p, _ in calls]                        # 2 parameters per layer
    assert layers == sorted(layers, reverse=True)                  # out, fc, conv
    assert not opt._trellis_handles  # the end of backward waited for every one of them
    opt.step()
    assert len(calls) == 6  # step() sent nothing more


def test_backward_returns_with_every_gradient_summed(monkeypatch):
    # The default (sync="backward"): an engine callback waits at the end of backward, so a
    # gradient read right after backward() (clip_grad_norm_, unscale_, logging) is final.
    model = dc.Net()
    opt = tt.DistributedOptimizer(dc.make_optimizer(model), model.named_parameters())
    waited = []
    real = trellis.push_pull

    def spy(key, array, out=None, priority=0):
        h = real(key, array, out, priority)

        class Handle:
            def wait(self):
                waited.append(key)
                return h.wait()
        return Handle()
    monkeypatch.setattr(trellis, "push_pull", spy)
    x, y = dc.data()
    torch.nn.functional.cross_entropy(model(x[0]), y[0]).backward()
    assert len(waited) == 6
    opt.step()
    assert len(waited) == 6


def test_sync_step_waits_in_step_and_refuses_a_second_backward(monkeypatch):
    model = dc.Net()
    opt = tt.DistributedOptimizer(dc.make_optimizer(model), model.named_parameters(), sync="step")
    x, y = dc.data()
    torch.nn.functional.cross_entropy(model(x[0]), y[0]).backward()
    assert len(opt._trellis_handles) == 6  # still in flight: step() or synchronize() waits
    with pytest.raises(RuntimeError, match="produced twice before step"):
        torch.nn.functional.cross_entropy(model(x[1]), y[1]).backward()
    opt.synchronize()
    assert not opt._trellis_handles


def test_model_in_place_of_named_parameters():
    torch.manual_seed(5)
    a, b = dc.BNNet(), dc.BNNet()
    b.load_state_dict(a.state_dict())
    opt_a = dc.make_optimizer(a)
    opt_b = tt.DistributedOptimizer(dc.make_optimizer(b), b)  # the model: its buffers too
    assert [n for n, _, _, _, _ in _state.current().params] == [n for n, _ in b.named_parameters()]
    dc.train_steps(a, opt_a, 0, 2)
    dc.train_steps(b, opt_b, 0, 2)
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k


def buffer_names():
    """The buffers DistributedOptimizer took to keep equal on every worker."""
    return [n for n, _ in _state.current().buffer_sync.candidates]


def test_named_parameters_of_a_model_bring_its_buffers():
    model = dc.BNNet()
    tt.DistributedOptimizer(dc.make_optimizer(model), model.named_parameters())
    assert buffer_names() == [n for n, _ in model.named_buffers()]


def test_model_given_with_a_list_of_named_parameters_brings_its_buffers():
    # A list (or a filtered generator) names no module; model= says whose buffers these are.
    model = dc.BNNet()
    tt.DistributedOptimizer(dc.make_optimizer(model), list(model.named_parameters()), model=model)
    assert buffer_names() == ["bn.running_mean", "bn.running_var", "bn.num_batches_tracked"]


def test_a_generator_of_another_modules_parameters_brings_no_buffers():
    # A module's method that hands out another model's parameters: its own buffers are not
    # the model's, so none are taken (pass model= to name the right one).
    class Lender(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.BatchNorm1d(3)

        def lend(self, other):
            yield from other.named_parameters()
    model = dc.BNNet()
    tt.DistributedOptimizer(dc.make_optimizer(model), Lender().lend(model))
    assert buffer_names() == []


def test_model_must_be_a_module():
    model = dc.Net()
    with pytest.raises(ValueError, match="model must be a torch.nn.Module, got OrderedDict"):
        tt.DistributedOptimizer(dc.make_optimizer(model), model.named_parameters(),
                                model=model.state_dict())


def test_sync_mode_is_checked():
    model = dc.Net()
    with pytest.raises(ValueError, match="sync must be one of backward, step, got 'later'"):
        tt.DistributedOptimizer(dc.make_optimizer(model), model.named_parameters(), sync="later")


def test_no_sync_sends_nothing_until_the_last_backward(monkeypatch):
    model = dc.Net()
    opt = tt.DistributedOptimizer(dc.make_optimizer(model), model.named_parameters())
    keys = spy_push_pull(monkeypatch, lambda key, array, priority: key)
    x, y = dc.data()
    with opt.no_sync():
        torch.nn.functional.cross_entropy(model(x[0]), y[0]).backward()
        torch.nn.functional.cross_entropy(model(x[1]), y[1]).backward()
    assert keys == []
    torch.nn.functional.cross_entropy(model(x[2]), y[2]).backward()
    assert len(keys) == 6
    opt.step()
    assert len(keys) == 6


def test_missing_gradient_is_pushed_as_zeros_in_step(monkeypatch):
    model = dc.Net()
    opt = tt.DistributedOptimizer(dc.make_optimizer(model), model.named_parameters())
    keys = spy_push_pull(monkeypatch, lambda key, array, priority: key)
    opt.step()  # no backward at all: every key still takes its step (the servers wait for it)
    assert len(keys) == 6
    assert torch.count_nonzero(model.out.bias.grad) == 0


def test_gradient_accumulation_equals_the_large_batch_step():
    # Two micro-batches per step, with and without no_sync(), against the whole batch.
    torch.manual_seed(3)
    ref = dc.Net()
    a, b = dc.Net(), dc.Net()
    a.load_state_dict(ref.state_dict())
    b.load_state_dict(ref.state_dict())
    dc.train_steps(ref, dc.make_optimizer(ref), 0, 3)
    opt_a = tt.DistributedOptimizer(dc.make_optimizer(a), a.named_parameters())
    dc.train_steps_accumulated(a, opt_a, 0, 3, 2, use_no_sync=True)
    for k, v in ref.state_dict().items():
        assert torch.allclose(v, a.state_dict()[k], atol=1e-6), k
    trellis.shutdown()
    trellis.init()
    opt_b = tt.DistributedOptimizer(dc.make_optimizer(b), b.named_parameters())
    dc.train_steps_accumulated(b, opt_b, 0, 3, 2, use_no_sync=False)
    for k, v in ref.state_dict().items():
        assert torch.allclose(v, b.state_dict()[k], atol=1e-6), k


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


def test_checkpoint_into_a_directory_that_does_not_exist_yet(tmp_path):
    # spec.checkpoint.path on a fresh volume: the folder is made, not a missing temporary named.
    model = dc.Net()
    opt = tt.DistributedOptimizer(dc.make_optimizer(model), model.named_parameters())
    path = tmp_path / "ckpt" / "run1" / "cnn.pt"
    tt.save_checkpoint(str(path), model, opt, epoch=1)
    assert tt.load_checkpoint(str(path), model, opt) == {"epoch": 1}
    assert sorted(p.name for p in path.parent.iterdir()) == ["cnn.pt"]  # no temporary left


def test_checkpoint_directory_that_cannot_be_made_is_named(tmp_path):
    (tmp_path / "file").write_text("x")
    model = dc.Net()
    with pytest.raises(OSError, match="cannot create its directory .*file/sub: Not a directory"):
        tt.save_checkpoint(str(tmp_path / "file" / "sub" / "c.pt"), model)


def spy_progress(monkeypatch):
    """From here on, (step, samples) of each progress report and each total set, in lists."""
    reports, totals = [], []
    monkeypatch.setattr(trellis, "report_progress",
                        lambda step, samples=0, loss=None: reports.append((step, samples)))
    monkeypatch.setattr(trellis, "set_total_steps", totals.append)
    return reports, totals


def train_epoch(model, opt, loader):
    for xb, yb in loader:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()


def test_progress_comes_from_the_dataloader_and_the_states_epochs(monkeypatch):
    # A plain script passes no batch_size or total_steps: samples per step are the DataLoader's
    # batch, the total is the TrainingState's epochs x len(loader) (docs/pytorch.md#progress).
    reports, totals = spy_progress(monkeypatch)
    x, y = dc.data(steps=2)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x.flatten(0, 1), y.flatten(0, 1)), batch_size=10)
    model = dc.Net()
    opt = tt.DistributedOptimizer(dc.make_optimizer(model), model.named_parameters())
    state = tt.TrainingState(model, opt, epoch=0, batch=0, epochs=2)
    for _ in range(state.epoch, 2):
        train_epoch(model, opt, loader)
    # 32 samples in batches of 10: 10, 10, 10, 2 per epoch.
    assert reports == [(1, 10), (2, 10), (3, 10), (4, 2), (5, 10), (6, 10), (7, 10), (8, 2)]
    assert totals == [8]


def test_progress_arguments_win_over_what_the_loader_shows(monkeypatch):
    reports, totals = spy_progress(monkeypatch)
    x, y = dc.data(steps=1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[0], y[0]), batch_size=8)
    model = dc.Net()
    opt = tt.DistributedOptimizer(dc.make_optimizer(model), model.named_parameters(),
                                  batch_size=64, total_steps=100)
    tt.TrainingState(model, opt, epochs=3)
    train_epoch(model, opt, loader)
    assert reports == [(1, 64), (2, 64)]
    assert totals == [100]


def _saved(tmp_path):
    model = dc.Net()
    opt = tt.DistributedOptimizer(dc.make_optimizer(model), model.named_parameters())
    dc.train_steps(model, opt, 0, 1)
    path = tmp_path / "c.pt"
    tt.save_checkpoint(str(path), model, opt, step=1)
    return path, model, opt


def test_checkpoint_file_is_atomic_and_checksummed(tmp_path):
    path, model, _ = _saved(tmp_path)
    data = path.read_bytes()
    assert data[-28:-20] == b"TRLSPYCK"  # the trailer: the zip archive's comment
    assert zipfile.ZipFile(str(path)).comment == data[-28:]
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]  # no temporary file left
    plain = torch.load(str(path))  # plain PyTorch reads it as it is
    assert plain["extra"] == {"step": 1}
    for k, v in model.state_dict().items():
        assert torch.equal(v, plain["model"][k]), k


@pytest.mark.parametrize("damage, message", [
    (lambda d: d[:20], r"no trellis.torch trailer and not a readable torch.save file "
                       r"\(truncated\?\)"),
    (lambda d: d[:-7], r"truncated: the trailer at byte \d+ is cut short"),
    (lambda d: d[:-100], r"no trellis.torch trailer and not a readable torch.save file"),
    (lambda d: d[:200] + d[300:], r"truncated: the trailer says \d+ payload bytes, the file has"),
    (lambda d: d + b"x", r"trailing bytes: 1 bytes after the trailer"),
    (lambda d: d[:100] + bytes([d[100] ^ 1]) + d[101:], r"payload checksum mismatch \(stored 0x"),
    (lambda d: d[:-19] + bytes([d[-19] ^ 1]) + d[-18:], r"trailer checksum mismatch"),
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
    data[-20] = 9  # version 9 ...
    head = bytes(data[-28:-4])
    data[-4:] = _checkpoint._crc32c(head).to_bytes(4, "little")  # ... with a valid trailer checksum
    path.write_bytes(bytes(data))
    with pytest.raises(tt.CheckpointError, match="checkpoint format version 9, this build reads "
                                                 "version 2"):
        tt.load_checkpoint(str(path), model, opt)


def test_version_1_checkpoint_still_loads(tmp_path):
    # Earlier builds put the same fields in a header in front of torch.save's bytes.
    path, model, opt = _saved(tmp_path)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                "extra": {"step": 7}}, buf)
    payload = buf.getvalue()
    head = struct.pack("<8sIQI", b"TRLSPYCK", 1, len(payload), _checkpoint._crc32c(payload))
    path.write_bytes(head + struct.pack("<I", _checkpoint._crc32c(head)) + payload)
    assert tt.load_checkpoint(str(path), model, opt) == {"step": 7}


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
    assert _checkpoint._crc32c(b"123456789") == 0xE3069283  # RFC 3720 vector, as common/checkpoint/crc32c


def test_seal_without_optimizer_runs_queued_broadcasts():
    ran = []
    model = dc.Net()
    tt.broadcast_parameters(model.state_dict())
    _state.current().pending.append((lambda: True, lambda: ran.append(1)))
    assert not tt.is_sealed() and not ran
    tt.seal()
    assert tt.is_sealed() and ran == [1] and _state.current().pending == []


def test_internal_channels_have_distinct_key_ids():
    # The collective channel once shared the rejoin arena's id: every job with crash recovery
    # failed at start-up with "key id declared twice".
    from trellis import _buffers, _collectives, _grad_sync, _keys, _rejoin
    used = [_state.CHANNEL_KEY, _rejoin.ARENA_KEY, _collectives.KEY, _buffers.BUFFER_KEY,
            _grad_sync.CONTROL_KEY]
    assert sorted(used) == sorted(_keys.ALL)
    assert len(set(used)) == len(used)
    assert all(k >= 1 << 62 for k in used)


def test_save_checkpoint_records_the_jobs_step_and_a_load_continues_its_count(tmp_path):
    # status.checkpoint and the exit checkpoint number steps across runs: a file says after how
    # many optimizer steps of the job it was saved, and a run that loads it counts on from there.
    model = dc.Net()
    opt = tt.DistributedOptimizer(dc.make_optimizer(model), model.named_parameters())
    dc.train_steps(model, opt, 0, 3)
    path = str(tmp_path / "c.pt")
    tt.save_checkpoint(path, model, opt, epoch=1)
    assert torch.load(path)["trellis"] == {"step": 3}  # plain torch.load reads it
    trellis.shutdown()
    trellis.init()
    other = dc.Net()
    opt2 = tt.DistributedOptimizer(dc.make_optimizer(other), other.named_parameters())
    assert tt.load_checkpoint(path, other, opt2) == {"epoch": 1}
    dc.train_steps(other, opt2, 3, 5)
    tt.save_checkpoint(path, other, opt2, epoch=2)
    assert torch.load(path)["trellis"] == {"step": 5}


def test_an_exit_checkpoint_restores_where_the_loop_stood_in_the_training_state(tmp_path):
    # What rank 0 writes when the job is stopped mid-epoch (_exit_checkpoint), read back by the
    # documented resume: load_checkpoint, then TrainingState(..., epoch=<from extra>, batch=0).
    from trellis import _exit_checkpoint
    model = dc.Net()
    opt = tt.DistributedOptimizer(dc.make_optimizer(model), model.named_parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    state = tt.TrainingState(model, opt, sched, epoch=0, batch=0, seen=[])
    dc.train_steps(model, opt, 0, 2)
    sched.step()
    state.epoch, state.batch, state.seen = 1, 2, ["a", "b"]
    saved = {"model": model.state_dict(), "optimizer": opt.state_dict(), "extra": {"epoch": 1},
             "trellis": {"step": 9, "exit": _exit_checkpoint._exit_state(state)}}
    path = str(tmp_path / "c.pt")
    _checkpoint._write_checkpoint_file(path, saved)
    after_stop = torch.rand(4)  # the RNG draws of the stopped run from here on
    trellis.shutdown()
    trellis.init()
    torch.manual_seed(123)  # another state: the resumed run must not keep it
    other = dc.Net()
    opt2 = tt.DistributedOptimizer(dc.make_optimizer(other), other.named_parameters())
    sched2 = torch.optim.lr_scheduler.StepLR(opt2, step_size=1, gamma=0.5)
    first_epoch = tt.load_checkpoint(path, other, opt2)["epoch"]
    resumed = tt.TrainingState(other, opt2, sched2, epoch=first_epoch, batch=0, seen=[])
    assert resumed.resumed_step == 9 and resumed.rejoined_step is None
    assert (resumed.epoch, resumed.batch, resumed.seen) == (1, 2, ["a", "b"])
    assert sched2.state_dict()["last_epoch"] == 1
    # The scheduler's constructor set the base rate; the optimizer's decayed one is back.
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"] == 0.05
    other(torch.zeros(1, 1, 8, 8))
    assert torch.equal(torch.rand(4), after_stop), "mid-epoch: the RNG is the stopped run's at the next forward"
    # A file without an exit part (a periodic save) resumes nothing.
    tt.save_checkpoint(path, other, opt2, epoch=2)
    trellis.shutdown()
    trellis.init()
    third = dc.Net()
    opt3 = tt.DistributedOptimizer(dc.make_optimizer(third), third.named_parameters())
    tt.load_checkpoint(path, third, opt3)
    plain = tt.TrainingState(third, opt3, epoch=2, batch=0)
    assert plain.resumed_step is None and (plain.epoch, plain.batch) == (2, 0)
