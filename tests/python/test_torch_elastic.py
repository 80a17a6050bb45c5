"""Elastic trellis.torch (docs/elastic.md#pytorch): elastic_train.py under trellis-launch with 3
workers, resized to 2 with `trellis-launch resize` while it trains. The worker resized away
exits 0 at the agreed step; the others re-shard what is left of the epoch with ElasticSampler
(no sample trained twice in the epoch of the resize, none skipped), their on_resize hook
scales the learning rate, and the job succeeds with the accuracy an undisturbed run reaches.
Grown 2 -> 3, the joiner takes the running job's state and the sampler's place; lost for good,
the others go on. Its servers resized 2 -> 3 -> 1, the program trains on unchanged."""
import collections
import contextlib
import datetime
import os
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch", reason="PyTorch (python3-torch) is not importable")

from conftest import HERE, launcher_env, launcher_or_skip  # noqa: E402

sys.path.insert(0, os.path.join(HERE, "..", "..", "bench", "elastic"))
from loss_bench import first_line_time, worker_program  # noqa: E402  (a worker's program, log lines)

N = 960  # elastic_train.py's samples per epoch

JOB = """apiVersion: trellis.io/v1alpha1
kind: TrainingJob
metadata:
  name: {name}
spec:
  servers:
    replicas: 2
  workers:
    replicas: 3
    command: [trellis-python]
    args: ["{script}", "{out}"]
  elastic:
    minWorkers: 1
    maxWorkers: 3
  sliceBytes: 1024
  runPolicy:
    restartPolicy: Never
    activeDeadlineSeconds: 150
"""


def records(out):
    """{slot: [(epoch, step, rank, size, [idx...])]} from the seen files."""
    got = {}
    for f in os.listdir(out):
        if f.startswith("seen"):
            rows = []
            with open(os.path.join(out, f)) as fh:
                for line in fh:
                    p = line.split()
                    if len(p) >= 5:
                        rows.append((int(p[0]), int(p[1]), int(p[2]), int(p[3]), [int(i) for i in p[4:]]))
            got[int(f[4:-4])] = rows
    return got


@contextlib.contextmanager
def launched(folder, name, edit, env=None):
    """elastic_train.py under trellis-launch, its job file (JOB) changed by edit(text), with its
    files in `folder`: yields (the launcher's Popen, out dir, logs dir); the launcher is stopped
    if it still runs at the end."""
    out, logs = folder / "out", folder / "logs"
    out.mkdir(parents=True)
    job = folder / "job.yaml"
    job.write_text(edit(JOB.format(name=name, script=os.path.join(HERE, "elastic_train.py"), out=out)))
    p = subprocess.Popen([launcher_or_skip(), "--log-dir", str(logs), str(job)], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, env=dict(launcher_env(), **(env or {})), text=True)
    try:
        yield p, out, logs
    finally:
        if p.poll() is None:
            p.terminate()
            p.communicate(timeout=30)


def wait_until(p, out, ready, deadline):
    """Until ready(records) holds, the job ends or time.time() passes `deadline`."""
    while time.time() < deadline and p.poll() is None and not ready(records(str(out))):
        time.sleep(0.1)


def launch_and_resize(tmp_path, name, workers, to, ready, env=None):
    """Runs elastic_train.py with `workers` workers under trellis-launch, resizes it to `to` once
    ready(records) holds: (the resize's CompletedProcess, its seconds, the job's output, its exit
    code, out dir, logs dir, when the resize was asked for)."""
    launcher = launcher_or_skip()
    with launched(tmp_path, name, lambda t: t.replace("replicas: 3", "replicas: %d" % workers), env) as (p, out, logs):
        wait_until(p, out, ready, time.time() + 90)
        assert p.poll() is None, "the job ended before the resize:\n" + p.communicate()[0]
        asked = time.time()
        resize = subprocess.run([launcher, "resize", str(logs), str(to)], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=launcher_env(), text=True, timeout=90)
        took = time.time() - asked
        log, _ = p.communicate(timeout=150)
    return resize, took, log, p.returncode, out, logs, asked


def run_killing_worker_1(tmp_path, name, edit, before_kill):
    """Runs elastic_train.py with 3 workers (the job file changed by edit(text)) under
    trellis-launch, calls before_kill(launcher, logs dir, until) (until(ready) waits for
    ready(records)), SIGKILLs worker 1's program and waits for the job: (its output, its exit
    code, out dir, logs dir)."""
    deadline = time.time() + 90
    with launched(tmp_path, name, edit) as (p, out, logs):
        before_kill(launcher_or_skip(), logs, lambda ready: wait_until(p, out, ready, deadline))
        pid = worker_program(name, 1, comm="python3")
        assert pid, "worker 1's program not found"
        os.kill(pid, 9)
        log, _ = p.communicate(timeout=150)
    return log, p.returncode, out, logs


def test_resized_3_to_2_mid_epoch_no_sample_twice_and_the_job_succeeds(tmp_path):
    # Into epoch 1 (rank 0 at its 10th step of 40 there): the resize lands mid-epoch.
    resize, _, log, code, out, _, _ = launch_and_resize(
        tmp_path, "tt-elastic", 3, 2, lambda got: sum(1 for r in got.get(0, []) if r[0] == 1) >= 10)
    assert resize.returncode == 0, resize.stdout
    assert "3 -> 2 workers asked for" in resize.stdout, resize.stdout
    assert code == 0, log
    assert "worker-2 left the job: resized away" in log, log

    got = records(str(out))
    assert sorted(got) == [0, 1, 2], got.keys()
    # Worker 2 trained in the world of 3 only, and stopped at the agreed step.
    last3 = max(r[1] for r in got[2])
    assert all(r[3] == 3 for r in got[2])
    for slot in (0, 1):
        sizes = [(r[1], r[3]) for r in got[slot]]
        assert all(s == 3 for st, s in sizes if st <= last3), sizes
        assert all(s == 2 for st, s in sizes if st > last3), sizes
        assert [r[2] for r in got[slot] if r[1] > last3] == [slot] * sum(1 for r in got[slot] if r[1] > last3)
        # The hook ran once, with the new world, and scaled the learning rate.
        lines = (out / ("resized%d.txt" % slot)).read_text().split("\n")
        assert lines[0].split() == [str(slot), "2", "0.1"], lines
    assert not (out / "resized2.txt").exists()

    # Every epoch, the resized one included: each sample trained exactly once.
    per_epoch = collections.defaultdict(collections.Counter)
    for rows in got.values():
        for epoch, _, _, _, idx in rows:
            per_epoch[epoch].update(idx)
    resized_epoch = [r[0] for r in got[2] if r[1] == last3][0]
    assert sorted(per_epoch) == [0, 1, 2, 3], sorted(per_epoch)
    for epoch, seen in per_epoch.items():
        assert set(seen) == set(range(N)), "epoch %d: %d samples never trained" % (epoch, N - len(seen))
        twice = [i for i, c in seen.items() if c > 1]
        assert not twice, "epoch %d (resized in %d): %d samples trained twice" % (epoch, resized_epoch, len(twice))
    # Where it landed (an epoch is 40 steps in the world of 3): shown, not judged (a resize at
    # an epoch's end is as valid, and the checks above hold either way).
    print("resized after step %d, in epoch %d (rank 0 took %d steps in it)"
          % (last3, resized_epoch, sum(1 for r in got[0] if r[0] == resized_epoch)))

    acc, _ = (out / "result.txt").read_text().split()
    assert float(acc) >= 0.9, acc


def test_grown_2_to_3_mid_epoch_the_joiner_takes_the_state_and_no_sample_twice(tmp_path):
    """A trellis.torch job grown 2 -> 3 mid-epoch (docs/elastic.md#pytorch). Worker 2's program
    starts, joins the grow, takes a member's commit (parameters, momentum, the ElasticState's
    values and the sampler's place in the epoch), and trains from the agreed step as rank 2 of 3:
    the members re-shard what is left of the epoch over 3, the joiner draws its share of the
    same order, so every sample is trained exactly once in every epoch; every on_resize hook,
    the joiner's included, scales the learning rate to 3 workers; and all three end with the
    same model, bit for bit."""
    resize, took, log, code, out, logs, asked = launch_and_resize(
        tmp_path, "tt-grow", 2, 3, lambda got: sum(1 for r in got.get(0, []) if r[0] == 1) >= 10)
    assert resize.returncode == 0, resize.stdout
    assert "2 -> 3 workers asked for" in resize.stdout, resize.stdout
    assert code == 0, log
    joiner = (logs / "worker-2.log").read_text()
    assert "joins world 1 from step" in joiner, joiner
    assert "rejoined the running job after step" in joiner, joiner

    got = records(str(out))
    assert sorted(got) == [0, 1, 2], got.keys()
    first3 = min(r[1] for r in got[2])
    assert all(r[3] == 3 and r[2] == 2 for r in got[2]), got[2][:3]
    for slot in (0, 1):
        sizes = [(r[1], r[3]) for r in got[slot]]
        assert all(s == 2 for st, s in sizes if st < first3), sizes
        assert all(s == 3 for st, s in sizes if st >= first3), sizes
        assert first3 - 1 in [st for st, _ in sizes], "the joiner's first step follows the members'"
    for slot in (0, 1, 2):
        lines = (out / ("resized%d.txt" % slot)).read_text().split("\n")
        assert lines[0].split() == [str(slot), "3", "0.15"], (slot, lines)

    per_epoch = collections.defaultdict(collections.Counter)
    for rows in got.values():
        for epoch, _, _, _, idx in rows:
            per_epoch[epoch].update(idx)
    grown_epoch = [r[0] for r in got[2] if r[1] == first3][0]
    assert sorted(per_epoch) == [0, 1, 2, 3], sorted(per_epoch)
    for epoch, seen in per_epoch.items():
        assert set(seen) == set(range(N)), "epoch %d: %d samples never trained" % (epoch, N - len(seen))
        # What is left of the grown epoch is padded to a multiple of 3, as DistributedSampler
        # pads: at most 2 samples repeat there (docs/elastic.md#pytorch); none anywhere else.
        twice = sum(seen.values()) - N
        assert twice < (3 if epoch == grown_epoch else 1), \
            "epoch %d (grown in %d): %d samples trained twice" % (epoch, grown_epoch, twice)
    finals = {slot: (out / ("final%d.txt" % slot)).read_text() for slot in (0, 1, 2)}
    assert len(set(finals.values())) == 1, finals
    # The figure of docs/elastic.md#pytorch: the request -> the joiner holding the model, ready
    # to push the new world's first step (its keeper's log line).
    held = first_line_time(str(logs / "worker-2.log"), "rejoined the running job after step",
                           datetime.date.fromtimestamp(asked))
    print("grown before step %d, in epoch %d; resize decided in %.1f s, the joiner held the model "
          "%.1f s after the request" % (first3, grown_epoch, took, held - asked))
    assert float((out / "result.txt").read_text().split()[0]) >= 0.9


def test_a_grow_whose_joiner_cannot_take_the_state_is_given_up_and_the_job_runs_on(tmp_path):
    """Crash recovery turned off (TRELLIS_TORCH_REJOIN=0): no worker keeps the state a joiner
    takes, so the worker a grow starts stays out of the world, exits 0 saying why, the grow is
    given up at once (not after the 60 s a joiner gets to start), and the job trains on with 2."""
    resize, took, log, code, out, logs, _ = launch_and_resize(
        tmp_path, "tt-grow-off", 2, 3, lambda got: len(got.get(0, [])) >= 10,
        env={"TRELLIS_TORCH_REJOIN": "0"})
    assert resize.returncode == 1, resize.stdout
    assert "the job's scheduler gave the resize up" in resize.stdout, resize.stdout
    assert took < 30, "given up after %.1f s, not at once" % took
    assert code == 0, log
    assert "trellis-launch: worker-2 did not join: the grow was given up" in log, log
    joiner = (logs / "worker-2.log").read_text()
    assert "only a trellis.torch program with crash recovery on can join" in joiner, joiner
    assert "program exited with code 0" in joiner, joiner
    scheduler = (logs / "scheduler.log").read_text()
    assert "worker 2 exited (exit code 0) before it asked to join" in scheduler, scheduler
    assert float((out / "result.txt").read_text().split()[0]) >= 0.9
    assert all(r[3] == 2 for rows in records(str(out)).values() for r in rows), "no world of 3"


def test_a_worker_killed_for_good_is_lost_and_the_others_finish(tmp_path):
    """A worker lost for good (docs/elastic.md#losing-a-worker): worker 1's program SIGKILLed
    mid-epoch under restartPolicy Never. The job goes on with workers 0 and 2 (ranks 0 and 1 of
    2, their on_resize hook scaling the learning rate), no sample is trained twice in any epoch
    (the lost worker's share of the steps before the switch is skipped in the epoch of the loss,
    every other epoch trains each sample once), and the job succeeds at the usual accuracy."""
    log, code, out, _ = run_killing_worker_1(
        tmp_path, "tt-lost", lambda job: job.replace("minWorkers: 1", "minWorkers: 2"),
        lambda launcher, logs, until: until(lambda got: sum(1 for r in got.get(0, []) if r[0] == 1) >= 10))
    assert code == 0, log
    assert "trellis-launch: worker-1 lost (" in log, log
    got = records(str(out))
    last3 = max(r[1] for r in got[1])
    for slot, rank in ((0, 0), (2, 1)):
        after = [r for r in got[slot] if r[3] == 2]
        assert after, "worker %d never trained in the world of 2" % slot
        assert all(r[2] == rank for r in after), after[:3]
        lines = (out / ("resized%d.txt" % slot)).read_text().split("\n")
        assert lines[0].split() == [str(rank), "2", "0.1"], lines
    per_epoch = collections.defaultdict(collections.Counter)
    for rows in got.values():
        for epoch, _, _, _, idx in rows:
            per_epoch[epoch].update(idx)
    lost_epoch = [r[0] for r in got[1] if r[1] == last3][0]
    for epoch, seen in per_epoch.items():
        twice = [i for i, c in seen.items() if c > 1]
        assert not twice, "epoch %d (lost in %d): %d samples trained twice" % (epoch, lost_epoch, len(twice))
        if epoch != lost_epoch:
            assert set(seen) == set(range(N)), "epoch %d: %d samples never trained" % (epoch, N - len(seen))
    print("worker 1 lost after its step %d, in epoch %d; %d samples of that epoch skipped"
          % (last3, lost_epoch, N - len(per_epoch[lost_epoch])))
    assert float((out / "result.txt").read_text().split()[0]) >= 0.9


def test_a_worker_restarted_after_a_resize_goes_on_from_the_samplers_place(tmp_path):
    """Crash recovery after a resize (docs/elastic.md#what-survives-what): 3 workers resized to
    2, then worker 1's program SIGKILLed mid-epoch in the world of 2 (restartPolicy OnFailure).
    It rejoins with a live worker's state, the ElasticSampler's place in the epoch included, and
    draws on from where the world is: counting each (worker, step) once (a step the kill cut
    short is trained again by the restarted program, its pushes counted once by the servers),
    every sample is trained exactly once in every epoch, and the job succeeds."""
    def shrink_then_train(launcher, logs, until):
        until(lambda got: sum(1 for r in got.get(0, []) if r[0] == 1) >= 5)
        resize = subprocess.run([launcher, "resize", str(logs), "2"], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=launcher_env(), text=True, timeout=90)
        assert resize.returncode == 0, resize.stdout
        until(lambda got: sum(1 for r in got.get(1, []) if r[3] == 2) >= 8)

    log, code, out, logs = run_killing_worker_1(
        tmp_path, "tt-restart", lambda job: job.replace("restartPolicy: Never", "restartPolicy: OnFailure"),
        shrink_then_train)
    assert code == 0, log
    assert "rejoined the running job after step" in (logs / "worker-1.log").read_text()
    got = records(str(out))
    per_epoch = collections.defaultdict(collections.Counter)
    for rows in got.values():
        for epoch, _, _, _, idx in {r[1]: r for r in rows}.values():  # a step once per worker
            per_epoch[epoch].update(idx)
    assert sorted(per_epoch) == [0, 1, 2, 3], sorted(per_epoch)
    for epoch, seen in per_epoch.items():
        assert set(seen) == set(range(N)), "epoch %d: %d samples never trained" % (epoch, N - len(seen))
        twice = [i for i, c in seen.items() if c > 1]
        assert not twice, "epoch %d: %d samples trained twice" % (epoch, len(twice))
    assert float((out / "result.txt").read_text().split()[0]) >= 0.9


def run_servers_resized(tmp_path, name, schedule):
    """elastic_train.py with 2 workers and 2 servers (the servers elastic 1..3) under
    trellis-launch; each count of `schedule` in turn asked for with `trellis-launch resize
    --servers N` once rank 0 trained 12 more steps of epoch 1 or later: (the resizes'
    CompletedProcesses, the job's output, its exit code, out dir, logs dir)."""
    launcher = launcher_or_skip()
    servers_elastic = lambda text: text.replace("replicas: 3", "replicas: 2").replace(  # noqa: E731
        "    minWorkers: 1\n    maxWorkers: 3\n",
        "    minWorkers: 2\n    maxWorkers: 2\n    minServers: 1\n    maxServers: 3\n")
    resizes = []
    with launched(tmp_path / name, name, servers_elastic) as (p, out, logs):
        mark = 0
        for to in schedule:
            def ready(got):
                steps = [r[1] for r in got.get(0, []) if r[0] >= 1]
                return len(steps) >= 12 and steps[-1] >= mark + 12
            wait_until(p, out, ready, time.time() + 90)
            assert p.poll() is None, "the job ended before the resize to %d servers:\n%s" % (to, p.communicate()[0])
            resizes.append(subprocess.run([launcher, "resize", str(logs), "--servers", str(to)],
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          env=launcher_env(), text=True, timeout=90))
            mark = max(r[1] for r in records(str(out))[0])
        log, _ = p.communicate(timeout=150)
    return resizes, log, p.returncode, out, logs


def test_servers_resized_under_a_torch_program_end_with_the_undisturbed_model(tmp_path):
    """A server resize under trellis.torch (docs/elastic.md#servers): the servers taken 2 -> 3 ->
    1 mid-epoch while the program trains. The program does nothing for it: every step trains in a
    world of the same 2 workers with the same ranks, the on_resize hooks are called with them (the
    learning rate stays), the sampler's shards go on (no sample twice in an epoch, none skipped),
    and both workers end with the model of the same job left alone, bit for bit (aggregate mode,
    2 workers: the sums do not change)."""
    _, log, code, still, _ = run_servers_resized(tmp_path, "tt-srv-still", [])
    assert code == 0, log
    resizes, log, code, out, logs = run_servers_resized(tmp_path, "tt-srv", [3, 1])
    for r, to in zip(resizes, (3, 1)):
        assert r.returncode == 0, r.stdout
        assert "trellis-launch resize: %d servers from step" % to in r.stdout, r.stdout
    assert code == 0, log
    assert "server-2 starts: the job grows to 3 servers" in log, log
    assert "server-1 left the job: resized away" in log, log
    w0 = (logs / "worker-0.log").read_text()
    assert "rank 0 of 2, 3 servers" in w0 and "rank 0 of 2, 1 servers" in w0, w0

    got = records(str(out))
    assert sorted(got) == [0, 1], got.keys()
    for slot, rows in got.items():
        assert all(r[2] == slot and r[3] == 2 for r in rows), (slot, rows[:3])
    per_epoch = collections.defaultdict(collections.Counter)
    for rows in got.values():
        for epoch, _, _, _, idx in rows:
            per_epoch[epoch].update(idx)
    assert sorted(per_epoch) == [0, 1, 2, 3], sorted(per_epoch)
    for epoch, seen in per_epoch.items():
        assert set(seen) == set(range(N)) and sum(seen.values()) == N, "epoch %d" % epoch
    finals = {(run, slot): (d / ("final%d.txt" % slot)).read_text()
              for run, d in (("still", still), ("resized", out)) for slot in (0, 1)}
    assert len(set(finals.values())) == 1, finals
    # The hooks hear of each new world (its epoch changed) with the same rank and size: a
    # learning-rate scaler keeps the rate.
    for slot in (0, 1):
        calls = (out / ("resized%d.txt" % slot)).read_text().split("\n")[:-1]
        assert calls == ["%d 2 0.1" % slot] * 2, (slot, calls)
    print("servers 2 -> 3 from step %s, 3 -> 1 from step %s" % tuple(
        r.stdout.split("servers from step ")[1].split()[0] for r in resizes))
