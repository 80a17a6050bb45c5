"""Tensor types and collectives end to end: 2 workers x 2 servers under trellis-launch
(types_worker.py), and the PyTorch example with 16-bit gradients on the wire."""
import os
import re
import subprocess

import pytest

torch = pytest.importorskip("torch", reason="PyTorch (python3-torch) is not importable")

from conftest import HERE, JOB as DP_JOB, launcher_or_skip  # noqa: E402
import dp_common as dc  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
# conftest's 2 servers x 2 workers job ({extra}: spec.compression), bigger slices, more time.
JOB = DP_JOB.replace("  sliceBytes: 1024\n", "  sliceBytes: 4096\n") \
            .replace("activeDeadlineSeconds: 60", "activeDeadlineSeconds: 120")
assert "{extra}" in JOB and "4096" in JOB and "120" in JOB


def run_job(tmp_path, name, text, cwd=None, timeout=150):
    launcher = launcher_or_skip()
    job = tmp_path / (name + ".yaml")
    job.write_text(text)
    env = dict(os.environ)
    env.pop("TRELLIS_SCHEDULER", None)
    env["PYTHONPATH"] = HERE
    p = subprocess.Popen([launcher, "--quiet", "--log-dir", str(tmp_path / ("logs-" + name)),
                          str(job)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                         text=True, cwd=cwd)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.terminate()
        out, _ = p.communicate(timeout=30)
        pytest.fail("job %s timed out after %d s:\n%s" % (name, timeout, out))
    assert p.returncode == 0, "job %s failed (rc %d):\n%s" % (name, p.returncode, out)
    return out


@pytest.fixture
def types_job(tmp_path):
    """types_job(name, *args, compression=None): runs types_worker.py OUT_DIR *args; returns
    the per-rank check lines."""
    def run(name, *args, compression=None):
        out_dir = tmp_path / name
        out_dir.mkdir()
        quoted = ", ".join('"%s"' % a for a in
                           (os.path.join(HERE, "types_worker.py"), str(out_dir)) + args)
        extra = "  compression:\n    type: %s\n" % compression if compression else ""
        run_job(tmp_path, name, JOB.format(name=name, args=quoted, extra=extra, policy="Never"))
        return out_dir, [(out_dir / ("checks%d.txt" % r)).read_text().splitlines()
                         for r in (0, 1)]
    return run


def test_collectives_on_tensors_without_declared_keys(types_job):
    _, checks = types_job("py-coll", "collectives")
    for r in (0, 1):
        assert checks[r] == [
            "sum [3.0, 6.0]",
            "average 0.5",
            "int64 torch.int64 [3, 3, 3, 3, 3, 3]",
            "big True",
            "view [3.0, 3.0, 3.0, 3.0] rest 0.0",
            "allgather [3, 2] [0, 1, 1]",
            "allgather 0-d [10.0, 11.0]",
            "broadcast 1.0000000000009095 -1.0 True",
            "bool [True, False, True]",
            "bf16 [1.5, -2.25]",
            "models equal True",
            "loss mean [0.5]"], "rank %d" % r


def test_collectives_in_a_different_order_fail_at_once_on_every_rank(types_job):
    _, checks = types_job("py-order", "order")
    tail = "called another collective here (its kind, name, dtype or shape differ); every " \
           "rank must call the same collectives in the same order"
    assert checks[0] == [
        "allreduce 'a' of [3] float32: collectives out of order: rank 1 " + tail,
        "allreduce of [3] float32: collectives out of order: rank 1 " + tail,
        "fast True", "after [3.0]"]
    assert checks[1] == [
        "allreduce 'b' of [3] float32: collectives out of order: rank 0 " + tail,
        "allgather of [3] float32: collectives out of order: rank 0 " + tail,
        "fast True", "after [3.0]"]


def half_sum(dtype, a, b):
    """What the servers answer: each push rounded to `dtype`, added in float32."""
    t = lambda v: torch.tensor(v, dtype=torch.float32).to(dtype).float()  # noqa: E731
    return repr(float(t(a) + t(b)))


def test_16bit_keys_are_summed_in_float32_with_half_the_bytes(types_job):
    _, checks = types_job("py-wire", "wire")
    for r in (0, 1):
        c = checks[r]
        assert c[0] == "INVALID_ARGUMENT DeclareKey bad: wire 'float8': want None (the job's " \
                       "compression), 'float32', 'float16' or 'bfloat16'"
        # 120000 does not exist in float16 (max 65504): the sum was made in float32.
        assert c[1] == "f16 120000.0 -1.5 %s" % half_sum(torch.float16, 0.1, 0.2)
        # 257 does not exist in bfloat16 (8 significant bits).
        assert c[2] == "bf16 257.0 257.0 %s" % half_sum(torch.bfloat16, 3.0, 0.01)
        ratio = re.match(r"bytes ratio ([0-9.]+) sums 2.0 2.0$", c[3]).group(1)
        assert float(ratio) < 0.52, c[3]


def reference(steps):
    torch.manual_seed(100)
    model = dc.Net()
    opt = dc.make_optimizer(model)
    dc.train_steps(model, opt, 0, steps)
    return model.state_dict()


def max_diff(a, b):
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


@pytest.mark.parametrize("wire,compression,tol", [
    ("float32", None, 1e-5), ("float16", None, 2e-3), ("bfloat16", None, 2e-2),
    ("job", "fp16", 2e-3), ("job", "bf16", 2e-2)])
def test_optimizer_16bit_gradients_and_non_contiguous_parameters(types_job, wire, compression,
                                                                 tol):
    out, checks = types_job("py-train-%s-%s" % (wire, compression or "none"), "train", wire,
                            compression=compression)
    assert checks[0] == checks[1] == ["grad contiguous False"]
    w0, w1 = (torch.load(str(out / ("rank%d.pt" % r))) for r in (0, 1))
    assert max_diff(w0, w1) == 0  # every worker applies the same sums
    ref = reference(dc.STEPS)
    d = max_diff(w0, ref)
    assert d <= tol, "%s: max |diff| %g from float32 single-process training" % (wire, d)
    if wire != "float32":
        assert d > 0, "16-bit gradients trained bit-identically to float32: not on the wire?"


def test_bfloat16_model_gradients(types_job):
    out, checks = types_job("py-model-bf16", "model", "bfloat16")
    assert checks[0] == checks[1] == ["grad dtype torch.bfloat16"]
    w0, w1 = (torch.load(str(out / ("rank%d.pt" % r))) for r in (0, 1))
    assert w0["conv.weight"].dtype == torch.bfloat16
    assert max_diff(w0, w1) == 0


def example_accuracy(tmp_path, compression):
    """Runs examples/pytorch.yaml (2 servers x 2 workers) with spec.compression.type set;
    returns the test accuracy (percent) rank 0 printed."""
    text = open(os.path.join(ROOT, "examples", "pytorch.yaml")).read()
    text = text.replace("name: pytorch-cnn", "name: pytorch-cnn-%s" % compression)
    text = text.replace("  serverMode: aggregate",
                        "  compression:\n    type: %s\n  serverMode: aggregate" % compression)
    out = run_job(tmp_path, "example-" + compression, text, cwd=ROOT, timeout=240)
    m = re.search(r"RESULT: test accuracy ([0-9.]+)%", out)
    assert m, out
    return float(m.group(1))


def test_example_converges_with_16bit_gradients(tmp_path):
    """The example's accuracy with float16 and bfloat16 gradients on the wire is within 0.5
    percentage points of float32's."""
    base = example_accuracy(tmp_path, "none")
    for c in ("fp16", "bf16"):
        acc = example_accuracy(tmp_path, c)
        print("example accuracy: float32 %.1f%%, %s %.1f%%" % (base, c, acc))
        assert abs(acc - base) <= 0.5, "%s: %.1f%% vs float32 %.1f%%" % (c, acc, base)
