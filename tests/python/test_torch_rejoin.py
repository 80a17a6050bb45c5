"""Crash recovery from Python: kill -9 of a trellis.torch worker mid-epoch; its agent restarts it
(restartPolicy OnFailure), it rejoins from a live worker's last step, and the job ends exactly
as an undisturbed run: same weights and BatchNorm buffers bit for bit, same test accuracy.
Runs ft_train.py with the command form of trellis-launch (2 workers, 1 server)."""
import os

import pytest

torch = pytest.importorskip("torch", reason="PyTorch (python3-torch) is not importable")

from conftest import HERE, launcher_or_skip, run_launcher  # noqa: E402


def run_job(tmp_path, name, *args, ok=True):
    launcher = launcher_or_skip()
    out = tmp_path / name
    out.mkdir()
    cmd = [launcher, "--quiet", "--log-dir", str(tmp_path / ("logs-" + name)), "--name", name,
           "--workers", "2", "--servers", "1", "--restart-policy", "OnFailure",
           "--backoff-limit", "2", "--", "trellis-python", os.path.join(HERE, "ft_train.py"),
           str(out)] + list(args)
    return out, run_launcher(name, cmd, 150, ok)


@pytest.mark.parametrize("dtype,device,loading", [
    ("float32", "cpu", "sampler"), ("bfloat16", "cpu", "sampler"), ("float32", "cuda", "sampler"),
    ("float32", "cpu", "shuffle"), ("float32", "cpu", "closure")])
def test_killed_worker_rejoins_and_job_ends_as_undisturbed(tmp_path, dtype, device, loading):
    # bfloat16 and cuda: parameters the keeper cannot read in place, staged through float32
    # host copies (pinned on a GPU). The CUDA case runs where a GPU is. shuffle: a plain
    # DataLoader(shuffle=True), whose order of the resumed epoch the rejoiner must draw alike.
    # closure: opt.step(closure), whose backward waits for the gradients inside step(): the
    # donor serves a copy of its last commit then, not its live tensors.
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    extra = (["bf16"] if dtype == "bfloat16" else []) + (["cuda"] if device == "cuda" else []) + \
        ([loading] if loading != "sampler" else [])
    calm, calm_log = run_job(tmp_path, "ft-calm", *extra)
    hit, hit_log = run_job(tmp_path, "ft-kill", "kill", *extra)
    # The command form printed the job it ran.
    assert "kind: TrainingJob" in hit_log and "restartPolicy: OnFailure" in hit_log, hit_log
    # Worker 1 was killed and came back; worker 0 was not.
    assert (hit / "incarnation1.txt").read_text().strip() == "2", hit_log
    assert (hit / "incarnation0.txt").read_text().strip() == "1"
    # It died after backward() of step 22: its pushes may or may not all have reached the
    # server, so the donor's last commit is step 21 (still waiting) or 22 (already done).
    rejoined = (hit / "result1.txt").read_text().split()[5]
    assert rejoined in ("21", "22"), hit_log
    for r in (0, 1):
        a, b = torch.load(str(calm / ("rank%d.pt" % r))), torch.load(str(hit / ("rank%d.pt" % r)))
        assert a.keys() == b.keys()
        assert a["0.weight"].dtype == b["0.weight"].dtype == getattr(torch, dtype)
        for k in a:
            if r == 1 and not k.endswith(("weight", "bias")):
                # The rejoiner's BatchNorm statistics are the donor's (rank 0's): its own died
                # with it. They equal the undisturbed run's where workers keep buffers in sync.
                continue
            # Weights (the momentum updates behind them) and rank 0's statistics: bit for bit.
            assert torch.equal(a[k], b[k]), "rank %d %s differs: max |diff| %g" % (
                r, k, (a[k].double() - b[k].double()).abs().max())
    # Rank 0 evaluates the same model: the same test accuracy and loss, to the last digit.
    assert (hit / "result0.txt").read_text().split()[:4] == \
        (calm / "result0.txt").read_text().split()[:4]
    # Both workers of the disturbed job hold the same weights (buffers are per worker).
    w0, w1 = torch.load(str(hit / "rank0.pt")), torch.load(str(hit / "rank1.pt"))
    for k in w0:
        if k.endswith(("weight", "bias")):
            assert torch.equal(w0[k], w1[k]), k


def test_a_script_without_training_state_stops_the_rejoined_worker_saying_why(tmp_path):
    # Restarting it again could not help (its loop would start over at epoch 0 while the others
    # are elsewhere): a ConfigurationError, exit code 78, which the agent does not restart.
    _, (rc, log) = run_job(tmp_path, "ft-nostate", "kill", "nostate", ok=False)
    assert rc != 0, log
    assert "keeps no trellis.torch.TrainingState" in log, log
    assert "exited with code 78" in log, log
