"""Every TrainingJob the docs show runs as a user copies it (issue 38).

A job block that is a shipped file (examples/*.yaml, manifests/examples/*.yaml) must be that
file byte for byte, and the file has a test that runs it (named in SHIPPED); any other block is
written to a file and run here with trellis-launch from the repository root."""
import glob
import os

import pytest

from conftest import launcher_or_skip, run_launcher  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Shipped job files and the ctest entry that runs each exactly as shipped.
SHIPPED = {
    "examples/mlp.yaml": "integration.mlp_twobit (as shipped, then with 2-bit)",
    "examples/pytorch.yaml": "pytorch_example_launch",
    "manifests/examples/pytorch.yaml": "k8s_node.demo (the real-node tier)",
    "manifests/examples/mlp.yaml": "k8s_node.demo (the real-node tier)",
}


def doc_jobs():
    """(doc, index, text) of each ```yaml block that is a TrainingJob in README and docs/."""
    out = []
    for doc in [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))):
        blocks = [b.split("```", 1)[0] for b in open(doc).read().split("```yaml\n")[1:]]
        jobs = [x for x in blocks if x.startswith("apiVersion:") and "\nkind: TrainingJob\n" in x]
        for i, b in enumerate(jobs):
            out.append((os.path.relpath(doc, ROOT), i, b))
    return out


def shipped_text(rel):
    text = open(os.path.join(ROOT, rel)).read()
    return text[text.index("apiVersion:"):]  # the file's leading comment is not shown


def shipped_match(block):
    return [rel for rel in SHIPPED if shipped_text(rel) == block]


def test_the_docs_show_jobs():
    docs = {d for d, _, _ in doc_jobs()}
    assert {"docs/pytorch.md", "docs/job-spec.md", "docs/user-guide.md"} <= docs, docs


def test_pytorch_docs_show_the_local_and_the_kubernetes_example_files():
    blocks = [b for d, _, b in doc_jobs() if d == "docs/pytorch.md"]
    assert [shipped_match(b) for b in blocks] == [["examples/pytorch.yaml"],
                                                  ["manifests/examples/pytorch.yaml"]]


@pytest.mark.parametrize("doc,index,block", doc_jobs(), ids=lambda v: str(v)[:20])
def test_doc_job_runs_as_copied(tmp_path, doc, index, block):
    if shipped_match(block):
        return  # the shipped file's own test runs it (SHIPPED)
    launcher = launcher_or_skip()
    job = tmp_path / "job.yaml"
    job.write_text(block)
    os.chdir(ROOT)  # a user runs the docs' commands from the repository root
    run_launcher("%s#%d" % (doc, index), [launcher, "--quiet", "--log-dir", str(tmp_path / "logs"),
                                         str(job)], 480)
