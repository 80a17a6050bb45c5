"""Shared fixtures: the build tree (TRELLIS_BUILD_DIR, set by ctest) and a trellis-launch runner."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.environ.get("TRELLIS_BUILD_DIR", "")
if BUILD:
    sys.path.insert(0, os.path.join(BUILD, "python"))
sys.path.insert(0, HERE)

JOB = """apiVersion: trellis.io/v1alpha1
kind: TrainingJob
metadata:
  name: {name}
spec:
  servers:
    replicas: 2
  workers:
    replicas: 2
    command: [trellis-python]
    args: [{args}]
  sliceBytes: 1024
{extra}  runPolicy:
    restartPolicy: {policy}
    activeDeadlineSeconds: 60
"""


def launcher_or_skip():
    """The build tree's trellis-launch, or the test is skipped saying how to point at one."""
    launcher = os.path.join(BUILD, "bin", "trellis-launch")
    if not BUILD or not os.path.exists(launcher):
        pytest.skip("trellis-launch not built (set TRELLIS_BUILD_DIR to the build tree)")
    return launcher


@pytest.fixture
def launch(tmp_path):
    """launch(name, *args): runs dp_worker.py with args under trellis-launch (2 servers x 2
    workers); returns the launcher's output; fails the test unless the job succeeded.
    launch(name, *args, extra="  serverMode: update\n", policy="OnFailure", ok=False): other
    spec lines and restart policy; returns (exit code, output) without judging them."""
    launcher = launcher_or_skip()

    def run(name, *args, extra="", policy="Never", ok=True):
        job = tmp_path / (name + ".yaml")
        quoted = ", ".join('"%s"' % a for a in (os.path.join(HERE, "dp_worker.py"),) + args)
        job.write_text(JOB.format(name=name, args=quoted, extra=extra, policy=policy))
        return run_launcher(name, [launcher, "--quiet", "--log-dir",
                                    str(tmp_path / ("logs-" + name)), str(job)], 90, ok)
    return run


def launcher_env():
    """The environment trellis-launch runs in: no outer job's scheduler, this folder importable."""
    env = dict(os.environ)
    env.pop("TRELLIS_SCHEDULER", None)
    env["PYTHONPATH"] = HERE  # dp_common; trellis-python adds the package
    return env


def run_launcher(name, argv, timeout, ok=True):
    """Runs trellis-launch (argv) without an outer job's environment; returns its output; fails
    the test unless the job succeeded within `timeout` seconds (then stops it: no leftovers).
    ok=False: returns (exit code, output) whatever the job's outcome."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=launcher_env(),
                         text=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.terminate()  # the launcher stops its scheduler, agents and workers on SIGTERM
        try:
            out, _ = p.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
        pytest.fail("job %s timed out after %d s:\n%s" % (name, timeout, out))
    if not ok:
        return p.returncode, out
    assert p.returncode == 0, "job %s failed (rc %d):\n%s" % (name, p.returncode, out)
    return out
