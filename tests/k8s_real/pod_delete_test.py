#!/usr/bin/python3
"""On a real API server (envtest.py): `kubectl delete pod` of a worker or a server mid-training,
what a node drain or an eviction does. The test kubelet stops the deleted pod's agent with
SIGTERM; the agent tells the scheduler its pod was stopped from outside; the operator recreates
the pod under the same name; its agent registers under the same rank and rejoins the running job.
The job must still reach Succeeded, with no restart counted toward backoffLimit. Under
restartPolicy Never the job fails instead, saying that the pod was deleted
(docs/kubernetes.md "What survives a pod deletion, an eviction, a drain").

Usage: pod_delete_test.py REPO BIN_DIR   (exit 77 without KUBEBUILDER_ASSETS)
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import envtest  # noqa: E402

EPOCHS = 12  # of 128 steps: long enough (seconds) that the deletion lands mid-training
STEPS = EPOCHS * 128
DELETE_AFTER = 160  # in epoch 2


class PodDelete(envtest.EnvtestCase):
    prefix = "pd"

    def start_job(self, name, policy, backoff_limit=1):
        """The MLP job with checkpoints (its progress record); returns the checkpoint folder."""
        ckpt = os.path.join(self.cp.dir, self.ns + "-" + name + "-ckpt")
        job = envtest.mlp_job(name, epochs=EPOCHS, restartPolicy=policy, backoffLimit=backoff_limit, activeDeadlineSeconds=240)
        job["spec"]["checkpoint"] = {"path": ckpt, "intervalSteps": 32, "keep": 2}
        self.start_operator()
        self.kubelet = self.start_kubelet()
        self.create_job(job)
        return ckpt

    def newest_step(self, ckpt):
        if not os.path.isdir(ckpt):
            return 0
        return max((int(f[6:18]) for f in os.listdir(ckpt) if f.startswith("model-") and f.endswith(".ckpt")),
                   default=0)

    def delete_mid_training(self, name, pod, ckpt):
        """Waits for progress, then `kubectl delete pod`; returns the deleted pod's uid."""
        self.wait_phase(name, "Running", 90)
        self.assertTrue(envtest.wait_for(lambda: self.newest_step(ckpt) >= DELETE_AFTER, 120),
                        "no progress to delete a pod at (newest checkpoint step %d)" % self.newest_step(ckpt))
        self.assertLess(self.newest_step(ckpt), STEPS, "the job ended before the deletion")
        uid = self.cp.get("/api/v1/namespaces/%s/pods/%s" % (self.ns, pod))["metadata"]["uid"]
        self.t_delete = time.time()
        self.cp.kubectl("delete", "pod", pod, "-n", self.ns, "--wait=false")
        return uid

    def pod_log(self, pod):
        with open(os.path.join(self.kubelet.work_dir, pod + ".log"), errors="replace") as f:
            return f.read()  # the replacement's: the kubelet starts each pod's log afresh

    def check_replaced_and_succeeded(self, name, pod, old_uid):
        def replaced():
            code, obj = self.cp.api("GET", "/api/v1/namespaces/%s/pods/%s" % (self.ns, pod))
            return code == 200 and obj["metadata"]["uid"] != old_uid
        self.assertTrue(envtest.wait_for(replaced, 60), "the operator did not recreate " + pod)
        st = self.wait_phase(name, ("Succeeded", "Failed"), 200)
        self.assertEqual(st["phase"], "Succeeded", st)
        # A deletion is not a failure: nothing counted toward backoffLimit.
        self.assertEqual(st["restarts"], 0, st)
        self.assertEqual(st["replicaStatuses"]["worker"]["succeeded"], 2, st)
        seen = self.phases[name]
        self.assertNotIn("Pending", seen[seen.index("Running"):], "a running job is not Pending again")
        log = self.pod_log(pod)
        self.assertRegex(log, r"rank 1 incarnation 2: starting")
        self.assertRegex(self.pod_log(name + "-worker-0"), r"RESULT: test accuracy .* -- reached")
        print("pod deletion (real API server): %s deleted at step >= %d, the job Succeeded %.1f s later; "
              "phases %s" % (pod, DELETE_AFTER, time.time() - self.t_delete, self.phases[name]), flush=True)
        return log

    def test_deleted_worker_pod_is_recreated_and_rejoins(self):
        ckpt = self.start_job("mlp", "OnFailure")
        uid = self.delete_mid_training("mlp", "mlp-worker-1", ckpt)
        log = self.check_replaced_and_succeeded("mlp", "mlp-worker-1", uid)
        self.assertRegex(log, r"rejoined the running job after step")

    def test_deleted_server_pod_is_recreated_and_rebuilt(self):
        ckpt = self.start_job("mlps", "ExitCode")
        uid = self.delete_mid_training("mlps", "mlps-server-1", ckpt)
        self.check_replaced_and_succeeded("mlps", "mlps-server-1", uid)

    def test_deleted_pod_under_never_fails_the_job_saying_so(self):
        ckpt = self.start_job("mlpn", "Never")
        self.delete_mid_training("mlpn", "mlpn-worker-1", ckpt)
        st = self.wait_phase("mlpn", ("Succeeded", "Failed"), 120)
        self.assertEqual(st["phase"], "Failed", st)
        failed = [c for c in st["conditions"] if c["type"] == "Failed"][0]
        self.assertEqual(failed["reason"], "PodDeleted", st)
        self.assertIn("worker 1 (pod mlpn-worker-1) was deleted or evicted while the job ran", failed["message"])


if __name__ == "__main__":
    envtest.main(PodDelete)
