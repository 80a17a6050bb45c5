#!/usr/bin/env python3
"""docs/metrics.md lists exactly the metrics the code registers, with the same types.

The code side is every MetricsRegistry::Counter/Gauge/Histogram call (and prometheus-cpp
builder .Name) with a literal "trellis_..." name in the parts' sources: registrations are made
once, at start-up, with literal names (STYLE.md), so the source is the list.
usage: metrics_docs_test.py REPO_ROOT
"""
import os
import re
import sys
import unittest

ROOT = sys.argv[1] if len(sys.argv) > 1 else os.getcwd()
PARTS = ["common", "worker-lib", "pserver", "scheduler", "agent", "launcher", "operator"]
CALL = re.compile(r'\b(Counter|Gauge|Histogram|Name)\(\s*"(trellis_[a-z0-9_]+)"')
ROW = re.compile(r'^\| `(trellis_[a-z0-9_]+)` \| (counter|gauge|histogram) \|', re.M)
KIND = {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram", "Name": None}


def code_metrics():
    found = {}  # name -> (type or None, where)
    for part in PARTS:
        for dirpath, _, files in os.walk(os.path.join(ROOT, part)):
            for f in files:
                if not f.endswith((".cc", ".h")):
                    continue
                path = os.path.join(dirpath, f)
                with open(path, encoding="utf-8") as fh:
                    text = fh.read()
                for m in CALL.finditer(text):
                    kind = KIND[m.group(1)]
                    where = os.path.relpath(path, ROOT)
                    prev = found.get(m.group(2))
                    if prev is None or prev[0] is None:
                        found[m.group(2)] = (kind, where)
    return found


def doc_metrics():
    with open(os.path.join(ROOT, "docs", "metrics.md"), encoding="utf-8") as fh:
        text = fh.read()
    rows = ROW.findall(text)
    return rows, {name: kind for name, kind in rows}


class MetricsDocsTest(unittest.TestCase):
    def test_code_and_docs_agree(self):
        code = code_metrics()
        rows, docs = doc_metrics()
        self.assertGreater(len(code), 20, "the scan found too few registrations: did the call style change?")
        missing = sorted(f"{n} ({w})" for n, (_, w) in code.items() if n not in docs)
        stale = sorted(n for n in docs if n not in code)
        self.assertEqual(missing, [], "registered in the code but not in docs/metrics.md")
        self.assertEqual(stale, [], "in docs/metrics.md but registered nowhere")
        wrong = sorted(f"{n}: code {k}, docs {docs[n]}" for n, (k, _) in code.items() if k and docs[n] != k)
        self.assertEqual(wrong, [], "types differ")
        dups = sorted({n for n, _ in rows if [r[0] for r in rows].count(n) > 1})
        self.assertEqual(dups, [], "listed twice in docs/metrics.md")

    def test_names_follow_the_conventions(self):
        for name, kind in doc_metrics()[1].items():
            part = name.split("_")[1]
            # "job": the whole job's figures, aggregated by the scheduler (progress, straggler).
            self.assertIn(part, {"worker", "pserver", "scheduler", "agent", "operator", "metrics", "job"}, name)
            if kind == "counter":
                self.assertTrue(name.endswith("_total"), f"{name}: a counter ends in _total")
            else:
                self.assertFalse(name.endswith("_total"), f"{name}: only counters end in _total")
            if kind == "histogram":
                self.assertTrue(name.endswith(("_seconds", "_bytes")), f"{name}: a histogram has a base unit")


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]])
