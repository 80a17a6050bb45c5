"""The trellis package without a cluster: errors from the C++ library, local (no job) mode."""
import os
import subprocess

import numpy as np
import pytest

import trellis
from trellis import _trellis


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.delenv("TRELLIS_SCHEDULER", raising=False)
    trellis.shutdown()
    yield
    trellis.shutdown()


def test_no_scheduler_is_the_library_error():
    assert not trellis.available()
    with pytest.raises(trellis.TrellisError) as e:
        trellis.init(local=False)
    # Worker::Create's Status, code and message unchanged.
    assert e.value.code == 3 and e.value.code_name == "INVALID_ARGUMENT"
    assert str(e.value) == ("no scheduler address: set TRELLIS_SCHEDULER=host:port "
                            "(trellis-launch and the agent do)")
    assert isinstance(e.value, RuntimeError)


def test_missing_token_file_names_the_file(tmp_path):
    path = str(tmp_path / "no-such-token")
    with pytest.raises(trellis.TrellisError) as e:
        _trellis.Worker.create(scheduler_address="127.0.0.1:1", token_file=path)
    assert e.value.code == 5
    assert e.value.message == "token file " + path + ": cannot open"


def test_empty_token_file(tmp_path, monkeypatch):
    tok = tmp_path / "tok"
    tok.write_text("\n")
    monkeypatch.setenv("TRELLIS_SCHEDULER", "127.0.0.1:1")
    monkeypatch.setenv("TRELLIS_TOKEN_FILE", str(tok))
    assert trellis.available()
    with pytest.raises(trellis.TrellisError) as e:
        trellis.init()
    assert (e.value.code, str(e.value)) == (3, "token file %s: empty" % tok)
    assert not trellis.is_initialized()


def test_calls_before_init_raise():
    with pytest.raises(trellis.TrellisError, match=r"trellis.init\(\) was not called"):
        trellis.rank()


def test_local_mode_is_one_worker():
    trellis.init()
    assert trellis.is_local() and (trellis.rank(), trellis.size()) == (0, 1)
    k = trellis.declare("w", 4)
    a = np.arange(4, dtype=np.float32)
    assert trellis.push_pull(k, a).wait() is a
    np.testing.assert_array_equal(a, [0, 1, 2, 3])  # the sum over one worker
    out = np.zeros(4, np.float32)
    assert trellis.push_pull("w", a, out=out, priority=3).wait() is out
    np.testing.assert_array_equal(out, a)
    trellis.broadcast(k, a).wait()
    trellis.barrier("b")
    assert trellis.bytes_pushed() == 0
    trellis.set_total_steps(10)         # progress: nothing to report to, and no error
    trellis.report_progress(1, samples=4, loss=0.5)
    with pytest.raises(trellis.TrellisError, match="step and samples must be >= 0"):
        trellis.report_progress(-1)


def test_local_mode_errors_read_like_the_library():
    trellis.init()
    with pytest.raises(trellis.TrellisError, match="num_elements must be >= 1, got 0"):
        trellis.declare(1, 0)
    trellis.declare("w", 2)
    with pytest.raises(trellis.TrellisError, match="declared twice"):
        trellis.declare("w", 2)
    with pytest.raises(trellis.TrellisError) as e:
        trellis.push_pull("nope", np.zeros(2, np.float32))
    assert e.value.code == 5 and "unknown key name 'nope'" in str(e.value)
    with pytest.raises(trellis.TrellisError, match=r"root 1 outside \[0, 1\)"):
        trellis.broadcast("w", np.zeros(2, np.float32), root=1)
    trellis.finish_declarations()
    with pytest.raises(trellis.TrellisError, match="after FinishDeclarations"):
        trellis.declare("v", 2)


def test_error_class_is_shared():
    assert trellis.TrellisError is _trellis.TrellisError
    e = trellis.TrellisError(4, "DEADLINE_EXCEEDED", "too slow")
    assert (e.code, e.code_name, e.message, str(e)) == (4, "DEADLINE_EXCEEDED", "too slow",
                                                         "too slow")


def _run_python(code, env_extra, tmp_path):
    """`trellis-python -c code` as the agent starts a program: without a job, with env_extra."""
    exe = os.path.join(os.environ.get("TRELLIS_BUILD_DIR", ""), "bin", "trellis-python")
    if not os.environ.get("TRELLIS_BUILD_DIR") or not os.path.exists(exe):
        pytest.skip("trellis-python not built (set TRELLIS_BUILD_DIR to the build tree)")
    env = dict(os.environ)
    env.pop("TRELLIS_SCHEDULER", None)
    env.pop("TRELLIS_ERROR_FILE", None)
    env.update(env_extra)
    return subprocess.run([exe, "-c", code], env=env, cwd=str(tmp_path), capture_output=True,
                          text=True, timeout=60)


def test_an_uncaught_exception_is_left_in_the_error_file(tmp_path):
    err = tmp_path / "program-error"
    p = _run_python("import trellis; raise ValueError('boom')", {"TRELLIS_ERROR_FILE": str(err)},
                    tmp_path)
    assert p.returncode == 1  # unchanged: Python's own code for an uncaught exception
    assert "Traceback" in p.stderr and "ValueError: boom" in p.stderr  # the traceback still shows
    assert err.read_text() == "ValueError: boom\n"


def test_a_configuration_error_is_left_and_exits_78(tmp_path):
    err = tmp_path / "program-error"
    p = _run_python("import trellis\n"
                    "e = trellis.ConfigurationError('trellis.torch: the job and the script differ')\n"
                    "e.add_note('a note is not the error')\n"
                    "raise e", {"TRELLIS_ERROR_FILE": str(err)}, tmp_path)
    assert p.returncode == trellis.EXIT_CONFIGURATION_ERROR == 78
    assert "the job and the script differ" in p.stderr
    assert err.read_text() == ("trellis.ConfigurationError: trellis.torch: the job and the "
                               "script differ\n")


def test_the_error_file_is_bounded_and_never_in_the_way(tmp_path):
    err = tmp_path / "program-error"
    p = _run_python("import trellis; raise RuntimeError('x' * 5000)",
                    {"TRELLIS_ERROR_FILE": str(err)}, tmp_path)
    assert p.returncode == 1
    text = err.read_text()
    assert len(text) == 1001 and text.startswith("RuntimeError: xxx") and text.endswith("...\n")
    # An error already there (a sibling process of the pod failed first) is kept.
    p = _run_python("import trellis; raise KeyError('second')", {"TRELLIS_ERROR_FILE": str(err)},
                    tmp_path)
    assert p.returncode == 1 and err.read_text() == text
    # A file that cannot be written hides nothing: the traceback and the exit code stay.
    p = _run_python("import trellis; raise ValueError('boom')",
                    {"TRELLIS_ERROR_FILE": str(tmp_path / "no-such-dir" / "e")}, tmp_path)
    assert p.returncode == 1
    assert p.stderr.rstrip().endswith("ValueError: boom") and "Error in sys.excepthook" not in p.stderr
    # Without the variable nothing is written anywhere.
    p = _run_python("import trellis; raise ValueError('boom')", {}, tmp_path)
    assert p.returncode == 1 and os.listdir(tmp_path) == ["program-error"]
