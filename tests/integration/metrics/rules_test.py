#!/usr/bin/env python3
"""The alert rules: `promtool check rules` on the plain rules file, `promtool test rules` on
alerts_test.yaml (a firing and a quiet case per alert), and every alert of the file has a test.
usage: rules_test.py REPO_ROOT   (exit 77: no promtool)
"""
import os
import re
import shutil
import subprocess
import sys
import unittest

ROOT = sys.argv[1] if len(sys.argv) > 1 else os.getcwd()
RULES = os.path.join(ROOT, "charts/trellis/rules/trellis-alerts.yaml")
TESTS = os.path.join(ROOT, "tests/integration/metrics/alerts_test.yaml")


def run(*argv):
    r = subprocess.run(list(argv), capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


class RulesTest(unittest.TestCase):
    def test_check_rules(self):
        code, out = run("promtool", "check", "rules", RULES)
        self.assertEqual(code, 0, out)

    def test_unit_tests_pass(self):
        code, out = run("promtool", "test", "rules", TESTS)
        self.assertEqual(code, 0, out)

    def test_every_alert_has_a_test(self):
        with open(RULES) as f:
            alerts = set(re.findall(r"^\s*- alert: (\w+)", f.read(), re.M))
        with open(TESTS) as f:
            tested = set(re.findall(r"^\s*alertname: (\w+)", f.read(), re.M))
        self.assertGreaterEqual(len(alerts), 4)
        self.assertEqual(sorted(alerts - tested), [], "alerts without a promtool test")


if __name__ == "__main__":
    if shutil.which("promtool") is None:
        print("promtool not installed (scripts/install-deps.sh installs prometheus): skipped")
        sys.exit(77)
    ok = unittest.TextTestRunner(verbosity=2).run(
        unittest.defaultTestLoader.loadTestsFromTestCase(RulesTest)).wasSuccessful()
    sys.exit(0 if ok else 1)
