"""docs/pytorch.md shows a whole job file, and it is examples/pytorch.yaml (which the test
pytorch_example_launch runs), so the page's example cannot drift into a fragment again."""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_docs_job_file_is_the_example_job():
    doc = open(os.path.join(ROOT, "docs", "pytorch.md")).read()
    blocks = [b.split("```", 1)[0] for b in doc.split("```yaml\n")[1:]]
    jobs = [b for b in blocks if b.startswith("apiVersion:")]
    assert jobs, "docs/pytorch.md has no whole job file (a yaml block starting with apiVersion:)"
    example = open(os.path.join(ROOT, "examples", "pytorch.yaml")).read()
    job = example[example.index("apiVersion:"):]
    assert jobs[0] == job
