#!/usr/bin/python3
"""End to end on one machine: the API double, trellis-operator against it, and the test kubelet
(tests/k8s_double/kubelet.py) running the pods the operator creates as local processes. A
TrainingJob applied to the double trains the MLP (real scheduler, agents, servers, workers) and
its status must end Succeeded, with rank 0 reporting the reached accuracy. A job whose worker 1
sleeps in every step gets status.progress and a Straggler condition naming that worker and pod.

Usage: e2e_mlp_test.py REPO BIN_DIR
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

REPO, BIN = sys.argv[1], sys.argv[2]
JOB = {
    "apiVersion": "trellis.io/v1alpha1", "kind": "TrainingJob",
    "metadata": {"name": "mlp-tiny"},
    "spec": {
        "servers": {"replicas": 2},
        "workers": {"replicas": 2, "command": ["trellis-mlp"],
                    "args": ["--layers", "16,128,64,10", "--latent-dim", "8", "--teacher-hidden", "16",
                             "--epochs", "3", "--batch", "32", "--lr", "0.02", "--train-samples", "8192",
                             "--test-samples", "1000", "--target-accuracy", "0.85"]},
        "sliceBytes": 16384,
        "runPolicy": {"restartPolicy": "Never", "activeDeadlineSeconds": 90},
    },
}


def wait_for(cond, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.1)
    return cond()


class E2E(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="trellis-e2e-")
        self.procs = []
        port_file = os.path.join(self.dir, "port")
        self.spawn("double", ["/usr/bin/python3", os.path.join(REPO, "tests/k8s_double/k8s_double.py"),
                              "--port-file", port_file])
        self.assertTrue(wait_for(lambda: os.path.exists(port_file), 20), "the API double did not start")
        self.server = "http://127.0.0.1:" + open(port_file).read().strip()
        # The kubelet tells the operator where the schedulers' Services listen (no cluster DNS here).
        services = os.path.join(self.dir, "services.json")
        self.spawn("operator", [os.path.join(BIN, "trellis-operator"), "--server", self.server, "--metrics-port", "0",
                                "--progress-seconds", "1", "--scheduler-addresses", services])
        os.makedirs(os.path.join(self.dir, "pods"))
        self.spawn("kubelet", ["/usr/bin/python3", os.path.join(REPO, "tests/k8s_double/kubelet.py"),
                               "--server", self.server, "--bin-dir", BIN, "--work-dir", os.path.join(self.dir, "pods"),
                               "--services-file", services])

    def spawn(self, name, argv):
        log = open(os.path.join(self.dir, name + ".log"), "wb")
        self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        log.close()

    def tearDown(self):
        for p in reversed(self.procs):  # kubelet first: it stops the pods' processes
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            except ProcessLookupError:
                pass
        if sys.exc_info()[0] is None and self._outcome.success:
            shutil.rmtree(self.dir, ignore_errors=True)
        else:
            print("logs kept in", self.dir)

    def get(self, path):
        with urllib.request.urlopen(self.server + path, timeout=10) as r:
            return json.loads(r.read())

    def create(self, job):
        req = urllib.request.Request(self.server + "/apis/trellis.io/v1alpha1/namespaces/default/trainingjobs",
                                     data=json.dumps(job).encode(), method="POST")
        req.add_header("Content-Type", "application/json")
        urllib.request.urlopen(req, timeout=10).read()

    def test_mlp_trains_to_succeeded(self):
        self.create(JOB)
        phases = []

        def finished():
            st = self.get("/apis/trellis.io/v1alpha1/namespaces/default/trainingjobs/mlp-tiny").get("status", {})
            if st.get("phase") and (not phases or phases[-1] != st["phase"]):
                phases.append(st["phase"])
            return st.get("phase") in ("Succeeded", "Failed") and st

        st = wait_for(finished, 120)
        self.assertTrue(st, "the job did not finish; phases seen: %s (logs in %s)" % (phases, self.dir))
        self.assertEqual(st["phase"], "Succeeded", json.dumps(st, indent=1) + "\nlogs in " + self.dir)
        self.assertIn("Running", phases)
        self.assertEqual(st["replicaStatuses"]["worker"]["succeeded"], 2)
        with open(os.path.join(self.dir, "pods", "mlp-tiny-worker-0.log"), errors="replace") as f:
            log = f.read()
        self.assertRegex(log, r"RESULT: test accuracy .* -- reached")
        # cleanPodPolicy Running: the scheduler and servers are deleted, the workers kept.
        pods = wait_for(lambda: sorted(p["metadata"]["name"] for p in self.get(
            "/api/v1/namespaces/default/pods")["items"]) == ["mlp-tiny-worker-0", "mlp-tiny-worker-1"], 20)
        self.assertTrue(pods)

    def test_slow_worker_is_named_in_the_straggler_condition(self):
        job = json.loads(json.dumps(JOB))
        job["metadata"]["name"] = "slow"
        job["spec"]["workers"]["args"] += ["--slow-rank", "1", "--step-sleep-ms", "60"]
        job["spec"]["monitoring"] = {"straggler": {"factor": 2, "windowSeconds": 3}}
        self.create(job)
        url = "/apis/trellis.io/v1alpha1/namespaces/default/trainingjobs/slow"
        running = []

        def straggler():
            st = self.get(url).get("status", {})
            if st.get("phase") == "Running" and st.get("progress"):
                running.append(st["progress"])
            for c in st.get("conditions", []):
                if c["type"] == "Straggler" and c["status"] == "True":
                    return st, c
            return None

        found = wait_for(straggler, 120)
        self.assertTrue(found, "no Straggler condition (logs in %s); progress seen: %s" % (self.dir, running[-3:]))
        st, cond = found
        self.assertEqual(cond["reason"], "SlowWorker")
        self.assertIn("worker rank 1 (pod slow-worker-1)", cond["message"])
        # status.progress while running: present and sane.
        self.assertTrue(running, st)
        p = running[-1]
        self.assertGreater(p["step"], 0, p)
        self.assertEqual(p["totalSteps"], 384, p)
        self.assertLessEqual(p["step"], p["totalSteps"], p)
        self.assertGreater(p["samplesPerSecond"], 0, p)
        self.assertLess(p["samplesPerSecond"], 64 / 0.06 * 1.5, p)  # 2 x 32 samples per >= 60 ms step
        self.assertIn("loss", p)
        self.assertGreaterEqual(p["etaSeconds"], 0, p)
        self.assertEqual(st["progress"]["slowestRank"], 1, st)
        self.assertEqual(st["progress"]["slowestPod"], "slow-worker-1", st)
        self.assertGreater(st["progress"]["skew"], 2, st)
        # Steps advance between polls: the operator keeps writing while the job runs.
        steps = [q["step"] for q in running]
        self.assertGreater(max(steps), min(steps), steps)


if __name__ == "__main__":
    for b in ("trellis-operator", "trellis-agent", "trellis-scheduler", "trellis-pserver", "trellis-mlp"):
        if not os.access(os.path.join(BIN, b), os.X_OK):
            print("%s not built: skipped" % b)
            sys.exit(77)
    ok = unittest.TextTestRunner(verbosity=2).run(unittest.defaultTestLoader.loadTestsFromTestCase(E2E)).wasSuccessful()
    sys.exit(0 if ok else 1)
