#!/usr/bin/python3
"""On a real API server (envtest.py): the chart helm-installed, trellis-operator run with the
chart's ServiceAccount token (its RBAC only), the test kubelet running the pods. The small MLP
TrainingJob goes Pending -> Running -> Succeeded, rank 0 reaches the target accuracy, and the
apply -> Running -> Succeeded timings are printed.

Usage: smoke_test.py REPO BIN_DIR   (exit 77 without KUBEBUILDER_ASSETS)
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import envtest  # noqa: E402


class Smoke(envtest.EnvtestCase):
    prefix = "smoke"

    def test_mlp_job_trains_to_succeeded_with_the_charts_rbac(self):
        self.start_operator()
        kubelet = self.start_kubelet()
        t0 = time.time()
        self.create_job(envtest.mlp_job("mlp"))
        self.wait_phase("mlp", ("Running", "Succeeded", "Failed"), 90)
        t_running = time.time()
        st = self.wait_phase("mlp", ("Succeeded", "Failed"), 150)
        t_done = time.time()
        self.assertEqual(st["phase"], "Succeeded", st)
        self.assertIn("JobRunning", self.events("mlp"))  # a phase may pass between two polls; its Event stays
        self.assertEqual(st["replicaStatuses"]["worker"]["succeeded"], 2, st)
        with open(os.path.join(kubelet.work_dir, "mlp-worker-0.log"), errors="replace") as f:
            self.assertRegex(f.read(), r"RESULT: test accuracy .* -- reached")
        print("k8s timings (real API server): apply -> Running %.1f s, Running -> Succeeded %.1f s, "
              "apply -> Succeeded %.1f s; phases %s" % (t_running - t0, t_done - t_running, t_done - t0,
                                                      self.phases["mlp"]), flush=True)
        # The owned objects exist on the server with their owner (the garbage collector's input).
        svc = self.cp.get("/api/v1/namespaces/%s/services/mlp-scheduler" % self.ns)
        self.assertEqual(svc["metadata"]["ownerReferences"][0]["kind"], "TrainingJob")
        # cleanPodPolicy Running (default): the scheduler and servers go, the workers stay.
        left = envtest.wait_for(lambda: sorted(p["metadata"]["name"] for p in self.pods()) ==
                                ["mlp-worker-0", "mlp-worker-1"], 30)
        self.assertTrue(left, [p["metadata"]["name"] for p in self.pods()])


if __name__ == "__main__":
    envtest.main(Smoke)
