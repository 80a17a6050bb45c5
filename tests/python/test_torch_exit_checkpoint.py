"""The exit checkpoint from Python: a trellis.torch job stopped from outside (SIGTERM to
trellis-launch) mid-epoch writes rank 0's checkpoint at its next optimizer.step(); the same job
file run again resumes inside that epoch and ends exactly as an undisturbed run (weights, rank
0's BatchNorm statistics and test figures bit for bit), training no step twice.
Runs ft_train.py (BatchNorm, dropout, SGD with momentum, StepLR, a TrainingState, checkpoints
as docs/pytorch.md shows them) as a job file with spec.checkpoint, 1 server x 2 workers."""
import os
import re
import signal
import subprocess
import time

import pytest

torch = pytest.importorskip("torch", reason="PyTorch (python3-torch) is not importable")

from conftest import HERE, launcher_or_skip  # noqa: E402

JOB = """apiVersion: trellis.io/v1alpha1
kind: TrainingJob
metadata:
  name: {name}
spec:
  servers:
    replicas: 1
  workers:
    replicas: 2
    command: [trellis-python]
    args: [{args}]
  checkpoint:
    path: {ckpt}
  scheduler:
    heartbeatIntervalSeconds: 0.2
  runPolicy:
    restartPolicy: {policy}
    activeDeadlineSeconds: 120
"""
STEPS_PER_EPOCH, EPOCHS = 16, 3  # ft_train.py: 512 samples, batch 16, 2 workers


def job_file(tmp_path, name, out, ckpt, policy, loading, *more):
    args = [os.path.join(HERE, "ft_train.py"), str(out), "ckpt=" + str(ckpt / "ft.pt"), "slow"]
    if loading == "shuffle":
        args.append("shuffle")
    args += list(more)
    path = tmp_path / (name + ".yaml")
    text = JOB.format(name=name, ckpt=ckpt, policy=policy, args=", ".join('"%s"' % a for a in args))
    if "killexit" in more:  # rank 0 dies, worker 1 waits on: the grace bounds the stop
        text += "    terminationGracePeriodSeconds: 4\n"
    path.write_text(text)
    return path


def stop_after_first_epoch(tmp_path, job, ckpt, run):
    """Runs `job`, SIGTERMs the launcher once the end of epoch 1's checkpoint exists; returns
    the launcher's exit code and output."""
    p = start(tmp_path, job, run)
    deadline = time.monotonic() + 120
    while not (ckpt / "ft.pt").exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)  # the stop lands in epoch 2
    p.send_signal(signal.SIGTERM)
    return finish(p)


def start(tmp_path, job, run):
    env = dict(os.environ)
    env.pop("TRELLIS_SCHEDULER", None)
    env["PYTHONPATH"] = HERE
    return subprocess.Popen([launcher_or_skip(), "--quiet", "--log-dir",
                             str(tmp_path / ("logs-" + run)), str(job)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)


def finish(p, timeout=150):
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
        pytest.fail("the job did not end within %d s:\n%s" % (timeout, out))
    return p.returncode, out


@pytest.mark.parametrize("policy,loading", [("OnFailure", "shuffle"), ("Never", "sampler")])
def test_sigterm_mid_epoch_writes_an_exit_checkpoint_and_the_rerun_ends_as_undisturbed(
        tmp_path, policy, loading):
    # OnFailure: crash recovery's keeper is on beside it; Never: off. shuffle: the resumed
    # epoch's DataLoader(shuffle=True) must draw the stopped run's order again.
    calm_out, calm_ckpt = tmp_path / "calm", tmp_path / "calm-ckpt"
    calm_out.mkdir()
    rc, out = finish(start(tmp_path, job_file(tmp_path, "ft-calm", calm_out, calm_ckpt, policy,
                                              loading), "calm"))
    assert rc == 0, out

    stop_out, stop_ckpt = tmp_path / "stop", tmp_path / "stop-ckpt"
    stop_out.mkdir()
    job = job_file(tmp_path, "ft-stop", stop_out, stop_ckpt, policy, loading)
    rc, out = stop_after_first_epoch(tmp_path, job, stop_ckpt, "stopped")
    assert rc == 128 + signal.SIGTERM, out
    m = re.search(r"exit checkpoint of step (\d+) written \((\S+), ", out)
    assert m, "no exit checkpoint:\n" + out
    step = int(m.group(1))
    assert m.group(2) == str(stop_ckpt / "ft.pt"), out
    assert STEPS_PER_EPOCH <= step < EPOCHS * STEPS_PER_EPOCH, out
    log = (tmp_path / "logs-stopped" / "worker-0.log").read_text()
    assert "stopped after step %d (exit checkpoint %s)" % (step, stop_ckpt / "ft.pt") in log, log
    saved = torch.load(str(stop_ckpt / "ft.pt"))  # plain torch.load reads it
    assert saved["trellis"]["step"] == step and saved["trellis"]["exit"] is not None
    assert not (stop_out / "result0.txt").exists()

    # The same job file again: it resumes after the exit checkpoint's step.
    rc, out = finish(start(tmp_path, job, "resumed"))
    assert rc == 0, out
    log = (tmp_path / "logs-resumed" / "worker-0.log").read_text()
    assert "resuming inside epoch %d after step %d" % ((step - 1) // STEPS_PER_EPOCH, step) in log, log
    for r in (0, 1):
        a = torch.load(str(calm_out / ("rank%d.pt" % r)))
        b = torch.load(str(stop_out / ("rank%d.pt" % r)))
        for k in a:
            if r == 1 and not k.endswith(("weight", "bias")):
                continue  # rank 1's BatchNorm statistics are rank 0's after the resume
            assert torch.equal(a[k], b[k]), "rank %d %s differs: max |diff| %g" % (
                r, k, (a[k].double() - b[k].double()).abs().max())
        # Nothing trained twice: the resumed run's workers took the steps after the exit one.
        words = (stop_out / ("result%d.txt" % r)).read_text().split()
        assert words[words.index("steps") + 1] == str(EPOCHS * STEPS_PER_EPOCH - step), words
        assert words[words.index("resumed") + 1] == str(step), words
    assert (stop_out / "result0.txt").read_text().split()[:4] == \
        (calm_out / "result0.txt").read_text().split()[:4]


def test_sigkill_during_the_exit_checkpoint_leaves_the_previous_file_and_the_rerun_uses_it(tmp_path):
    # Rank 0 is killed halfway through writing its exit checkpoint (a grace that ran out): the
    # file it replaces atomically is still the end of epoch 1's, and the rerun resumes from it.
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    out.mkdir()
    job = job_file(tmp_path, "ft-killexit", out, ckpt, "Never", "sampler", "killexit")
    rc, log = stop_after_first_epoch(tmp_path, job, ckpt, "stopped")
    assert rc == 128 + signal.SIGTERM, log
    assert "no exit checkpoint within" in log and "exit checkpoint of step" not in log, log
    saved = torch.load(str(ckpt / "ft.pt"))
    assert saved["trellis"] == {"step": STEPS_PER_EPOCH} and saved["extra"] == {"epoch": 1}
    assert [f for f in os.listdir(ckpt) if ".tmp." in f], "the cut-short write left its temporary file"

    rc, log = finish(start(tmp_path, job, "resumed"))
    assert rc == 0, log
    words = (out / "result0.txt").read_text().split()
    assert words[words.index("resumed") + 1] == "None", words  # from the epoch-end file
    assert words[words.index("steps") + 1] == str((EPOCHS - 1) * STEPS_PER_EPOCH), words
