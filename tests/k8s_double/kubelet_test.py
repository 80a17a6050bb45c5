#!/usr/bin/python3
"""The test kubelet reports a process's exit onto its own pod only: after a pod is deleted and one
of the same name created (a suspended job resumed, a restarted rank), the old process's exit must
not mark the new pod Failed. It did, and a resumed Kueue job failed on its predecessor's exit.

Runs the API double and the kubelet's Kubelet class in this process; the race (the kubelet's
list taken before the replacement, the patch sent after it) is forced, not waited for.

Usage: kubelet_test.py REPO
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

REPO = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
sys.path.insert(0, os.path.join(REPO, "tests", "k8s_double"))
import kubelet  # noqa: E402

PODS = "/api/v1/namespaces/default/pods"


def pod(name, command):
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {kubelet.LABEL_JOB: "j"}},
            "spec": {"containers": [{"name": "trellis", "image": "x", "command": command}]}}


class KubeletDouble(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="trellis-kubelet-")
        port_file = os.path.join(self.dir, "port")
        self.double = subprocess.Popen(["/usr/bin/python3", os.path.join(REPO, "tests/k8s_double/k8s_double.py"),
                                        "--port-file", port_file], start_new_session=True)
        deadline = time.monotonic() + 20
        while not (os.path.exists(port_file) and os.path.getsize(port_file)):
            self.assertLess(time.monotonic(), deadline, "the API double did not start")
            time.sleep(0.05)
        with open(port_file) as f:
            self.api = kubelet.Api("http://127.0.0.1:" + f.read().strip())
        os.makedirs(os.path.join(self.dir, "pods"))
        self.kubelet = kubelet.Kubelet(self.api, "/usr/bin", os.path.join(self.dir, "pods"))

    def tearDown(self):
        for p in self.kubelet.procs.values():
            self.kubelet.stop(p)
        for p, _ in self.kubelet.terminating.values():
            self.kubelet.kill(p)
        os.killpg(self.double.pid, signal.SIGTERM)
        self.double.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)

    def get(self, name):
        code, obj = self.api.call("GET", PODS + "/" + name)
        self.assertEqual(code, 200, obj)
        return obj

    def test_an_exit_is_reported_on_its_own_pod(self):
        code, _ = self.api.call("POST", PODS, pod("w", ["/bin/sh", "-c", "sleep 1; exit 3"]))
        self.assertEqual(code, 201)
        self.kubelet.step()  # starts it (it runs a second: the next step reports the exit)
        self.assertEqual(len(self.kubelet.procs), 1)
        next(iter(self.kubelet.procs.values())).wait(timeout=10)
        self.kubelet.step()  # reports the exit
        st = self.get("w")["status"]
        self.assertEqual(st["phase"], "Failed")
        self.assertEqual(st["containerStatuses"][0]["state"]["terminated"]["exitCode"], 3)

    def test_the_exit_of_a_deleted_pods_process_does_not_mark_its_successor(self):
        code, _ = self.api.call("POST", PODS, pod("w", ["/bin/sh", "-c", "sleep 1; exit 4"]))
        self.assertEqual(code, 201)
        self.kubelet.step()
        old = next(iter(self.kubelet.procs.values()))
        old.wait(timeout=10)
        # The kubelet's next list is taken now, before the operator replaces the pod ...
        code, before = self.api.call("GET", PODS + "?labelSelector=" + kubelet.LABEL_JOB)
        self.assertEqual(code, 200)
        # ... which then deletes it and creates one of the same name that has not started yet.
        self.assertEqual(self.api.call("DELETE", PODS + "/w")[0], 200)
        code, new = self.api.call("POST", PODS, pod("w", ["/bin/sh", "-c", "sleep 30"]))
        self.assertEqual(code, 201)
        real_call = self.api.call
        self.api.call = lambda method, path, *a, **kw: (200, before) if method == "GET" and "/pods?" in path \
            else real_call(method, path, *a, **kw)
        try:
            self.kubelet.step()  # sees the old pod and its process's exit 4
        finally:
            self.api.call = real_call
        now = self.get("w")
        self.assertEqual(now["metadata"]["uid"], new["metadata"]["uid"])
        self.assertEqual(now["status"].get("phase"), "Pending", "the old process's exit landed on the new pod")
        self.assertEqual(self.kubelet.procs, {})
        self.kubelet.step()  # the new pod starts and runs
        self.assertEqual(self.get("w")["status"]["phase"], "Running")

    def test_deleted_pods_stop_together_and_a_successor_waits_for_its_predecessor(self):
        """As a kubelet: every deleted pod gets SIGTERM at once (a pod waiting for the others, e.g.
        for the job's exit checkpoint, is not stopped alone), one that ignores it is killed after
        its terminationGracePeriodSeconds, and a recreated pod of the same name starts only once
        its predecessor has exited, the old log kept."""
        slow = "trap 'echo got-term; sleep 2; exit 0' TERM; echo up; while :; do sleep 0.1; done"
        for name in ("a", "b"):
            self.assertEqual(self.api.call("POST", PODS, pod(name, ["/bin/sh", "-c", slow]))[0], 201)
        stubborn = pod("c", ["/bin/sh", "-c", "trap '' TERM; while :; do sleep 0.1; done"])
        stubborn["spec"]["terminationGracePeriodSeconds"] = 1
        self.assertEqual(self.api.call("POST", PODS, stubborn)[0], 201)
        self.kubelet.step()
        self.assertEqual(len(self.kubelet.procs), 3)
        time.sleep(0.5)  # the shells set their traps
        for name in ("a", "b", "c"):
            self.assertEqual(self.api.call("DELETE", PODS + "/" + name)[0], 200)
        self.assertEqual(self.api.call("POST", PODS, pod("a", ["/bin/sh", "-c", "echo second; sleep 30"]))[0], 201)
        t0 = time.monotonic()
        self.kubelet.step()
        self.assertLess(time.monotonic() - t0, 1.0, "a step does not wait for pods to exit")
        self.assertEqual(self.kubelet.procs, {}, "the new a waits for the old one to exit")
        self.assertEqual(len(self.kubelet.terminating), 3)
        deadline = time.monotonic() + 20
        while self.kubelet.terminating and time.monotonic() < deadline:
            self.kubelet.step()
            time.sleep(0.1)
        self.assertEqual(self.kubelet.terminating, {})
        self.assertLess(time.monotonic() - t0, 5, "a and b were stopped together, c killed after 1 s")
        logs = os.path.join(self.dir, "pods")
        for name in ("a", "b"):
            path = os.path.join(logs, name + (".previous.log" if name == "a" else ".log"))
            with open(path) as f:
                self.assertIn("got-term", f.read(), name)
        self.kubelet.step()  # the new a starts now
        self.assertEqual(len(self.kubelet.procs), 1)
        self.assertEqual(self.get("a")["status"]["phase"], "Running")


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
