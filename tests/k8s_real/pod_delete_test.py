#!/usr/bin/python3
"""On a real API server (envtest.py): `kubectl delete pod` of a worker or a server mid-training,
what a node drain or an eviction does. The test kubelet stops the deleted pod's agent with
SIGTERM; the agent tells the scheduler its pod was stopped from outside; the operator recreates
the pod under the same name; its agent registers under the same rank and rejoins the running job.
The job must still reach Succeeded, with no restart counted toward backoffLimit (under
restartPolicy Always too: a worker that finished is not started again). Under
restartPolicy Never the job fails instead, saying that the pod was deleted
(docs/kubernetes.md "What survives a pod deletion, an eviction, a drain"). A suspended job
(the whole job stopped from outside) gets an exit checkpoint before its pods go, and resumes
from it (docs/checkpoints.md "Stopping a job: the exit checkpoint").

Usage: pod_delete_test.py REPO BIN_DIR   (exit 77 without KUBEBUILDER_ASSETS)
"""
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import envtest  # noqa: E402

EPOCHS = 12  # of 128 steps: long enough (seconds) that the deletion lands mid-training
STEPS = EPOCHS * 128
DELETE_AFTER = 160  # in epoch 2


class PodDelete(envtest.EnvtestCase):
    prefix = "pd"

    def start_job(self, name, policy, backoff_limit=1, **run_policy):
        """The MLP job with checkpoints (its progress record); returns the checkpoint folder."""
        ckpt = os.path.join(self.cp.dir, self.ns + "-" + name + "-ckpt")
        job = envtest.mlp_job(name, epochs=EPOCHS, restartPolicy=policy, backoffLimit=backoff_limit,
                              activeDeadlineSeconds=240, **run_policy)
        job["spec"]["checkpoint"] = {"path": ckpt, "intervalSteps": 32, "keep": 2}
        # Rank 0 sleeps 5 ms a step (about 8 s in all on an idle machine): a deleted pod's agent
        # waits up to 2 s for the rest of the job to follow, and the stops must land mid-training.
        job["spec"]["workers"]["args"] += ["--slow-rank", "0", "--step-sleep-ms", "5"]
        # The operator reaches each job's scheduler (progress, the exit checkpoint of a suspend)
        # where the test kubelet runs it.
        services = os.path.join(self.cp.dir, self.ns + "-services.json")
        self.start_operator(args=["--progress-seconds", "1", "--scheduler-addresses", services])
        self.kubelet = self.start_kubelet(args=["--services-file", services])
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

    @staticmethod
    def log_time(log, pattern, after):
        """Wall time of the first line of `log` matching `pattern` (its "I HH:MM:SS.mmm" local time
        of day, on the day of `after`, a time.time())."""
        m = re.search(r"^[DIWE] (\d\d):(\d\d):(\d\d\.\d\d\d) .*" + pattern, log, re.M)
        if not m:
            return None
        day = time.localtime(after)
        midnight = time.mktime((day.tm_year, day.tm_mon, day.tm_mday, 0, 0, 0, 0, 0, -1))
        return midnight + int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3))

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

    def test_under_always_a_deleted_worker_pod_is_recreated_and_the_job_succeeds(self):
        """restartPolicy Always, as many Kubeflow jobs set it (docs/operations.md#restart-policies):
        a deleted worker pod is recreated and rejoins, and at the end each worker that finished
        its training is not started again (before, the last one started again failed the job)."""
        ckpt = self.start_job("mlpa", "Always")
        uid = self.delete_mid_training("mlpa", "mlpa-worker-1", ckpt)
        log = self.check_replaced_and_succeeded("mlpa", "mlpa-worker-1", uid)
        self.assertRegex(log, r"rejoined the running job after step")
        self.assertIn("not restarting the program: worker 1 exited 0, its training finished", log)
        self.assertIn("not restarting the program: worker 0 exited 0", self.pod_log("mlpa-worker-0"))

    def test_deleted_pod_under_never_fails_the_job_saying_so(self):
        ckpt = self.start_job("mlpn", "Never")
        self.delete_mid_training("mlpn", "mlpn-worker-1", ckpt)
        st = self.wait_phase("mlpn", ("Succeeded", "Failed"), 120)
        self.assertEqual(st["phase"], "Failed", st)
        failed = [c for c in st["conditions"] if c["type"] == "Failed"][0]
        self.assertEqual(failed["reason"], "PodDeleted", st)
        self.assertIn("worker 1 (pod mlpn-worker-1) was deleted or evicted while the job ran", failed["message"])

    def test_suspended_job_writes_an_exit_checkpoint_and_resumes_from_it(self):
        """Suspend mid-training (what a queue such as Kueue does): the operator asks the scheduler
        to stop the job; rank 0 writes the exit checkpoint of the step it completed; only then
        are the pods deleted. Resumed, the job starts after that very step and succeeds."""
        ckpt = self.start_job("mlpx", "OnFailure")
        self.wait_phase("mlpx", "Running", 90)
        self.assertTrue(envtest.wait_for(lambda: self.newest_step(ckpt) >= DELETE_AFTER, 120),
                        "no progress to suspend at (newest checkpoint step %d)" % self.newest_step(ckpt))
        t_suspend = time.time()
        code, _ = self.cp.api("PATCH", self.job_url("mlpx"), {"spec": {"runPolicy": {"suspend": True}}},
                              content_type="application/merge-patch+json")
        self.assertEqual(code, 200)
        self.wait_phase("mlpx", "Suspended", 30)
        self.assertTrue(envtest.wait_for(lambda: not self.pods("trellis.io/job-name=mlpx"), 60), "pods left after suspend")
        t_gone = time.time()
        st = self.job("mlpx")["status"]
        stopping = [c for c in st["conditions"] if c["type"] == "Stopping"][0]
        self.assertEqual((stopping["status"], stopping["reason"]), ("False", "ExitCheckpointWritten"), st)
        exit_step = st["checkpoint"]["step"]
        self.assertTrue(st["checkpoint"]["onExit"], st)
        self.assertLess(exit_step, STEPS, "suspended after the end")
        self.assertEqual(self.newest_step(ckpt), exit_step, "the exit checkpoint is the newest file")
        self.assertTrue(st["checkpoint"]["path"].endswith("model-%012d.ckpt" % exit_step), st)
        log = self.pod_log("mlpx-worker-0")
        # Rank 0 says so whether it wrote the file at the stop or its periodic save of that very
        # step already was the exit checkpoint (one stop in `every` steps lands there).
        said = r"stopped after step %d \(exit checkpoint \S+model-%012d\.ckpt\)" % (exit_step, exit_step)
        self.assertRegex(log, said)
        t_written = self.log_time(log, said, t_suspend)
        self.assertIn("ExitCheckpointWritten", self.events("mlpx"))

        code, _ = self.cp.api("PATCH", self.job_url("mlpx"), {"spec": {"runPolicy": {"suspend": False}}},
                              content_type="application/merge-patch+json")
        self.assertEqual(code, 200)
        t_resume = time.time()
        self.wait_phase("mlpx", "Running", 90)
        st = self.wait_phase("mlpx", ("Succeeded", "Failed"), 240)
        self.assertEqual(st["phase"], "Succeeded", st)
        self.assertEqual(st["resumedFrom"]["step"], exit_step, st)
        log = self.pod_log("mlpx-worker-0")
        self.assertRegex(log, r"restored step %d from " % exit_step)
        self.assertRegex(log, r"RESULT: test accuracy .* -- reached")
        self.assertIn("Resumed", self.events("mlpx"))
        t_restored = self.log_time(log, r"restored step %d from " % exit_step, t_resume)
        print("suspend with an exit checkpoint (real API server, test kubelet): suspend -> exit checkpoint of step "
              "%d written %.1f s, every pod gone %.1f s; resume -> rank 0 restored it (training again) %.1f s, "
              "Succeeded %.1f s" % (exit_step, (t_written or 0) - t_suspend, t_gone - t_suspend,
                                     (t_restored or 0) - t_resume, time.time() - t_resume), flush=True)

    def test_every_pod_deleted_at_once_gets_an_exit_checkpoint_and_the_job_resumes_from_it(self):
        """`kubectl delete pods` of the whole job (what a queue, an admin or a drained node pool
        does): every agent tells the scheduler, which finds every worker's pod going and stops the
        job as a suspend would; rank 0 writes the exit checkpoint while every program runs on; the
        operator's replacement pods resume from it."""
        ckpt = self.start_job("mlpd", "OnFailure")
        self.wait_phase("mlpd", "Running", 90)
        self.assertTrue(envtest.wait_for(lambda: self.newest_step(ckpt) >= DELETE_AFTER, 120),
                        "no progress to delete at (newest checkpoint step %d)" % self.newest_step(ckpt))
        t_delete = time.time()
        self.cp.kubectl("delete", "pods", "-l", "trellis.io/job-name=mlpd", "-n", self.ns, "--wait=false")
        st = self.wait_phase("mlpd", ("Succeeded", "Failed"), 300)
        self.assertEqual(st["phase"], "Succeeded", st)
        before = ""
        # Rank 0 is whichever worker registered first, pod 0 or pod 1. Its log is among the earlier
        # pods' of that name, not always the previous one: a replacement the operator made before
        # the exit checkpoint was written cannot join the stopping world and is made once more.
        for i in (0, 1):
            path = os.path.join(self.kubelet.work_dir, "mlpd-worker-%d.earlier.log" % i)
            if os.path.exists(path):
                with open(path, errors="replace") as f:
                    before += f.read()
        m = re.search(r"stopped after step (\d+) \(exit checkpoint \S+\.ckpt\)", before)
        self.assertIsNotNone(m, "no exit checkpoint in the deleted rank 0's log:\n" + before[-3000:])
        exit_step = int(m.group(1))
        with open(os.path.join(self.kubelet.work_dir, "mlpd-scheduler.earlier.log"), errors="replace") as f:
            self.assertIn("every worker's pod is being stopped from outside", f.read())
        self.assertEqual(st["resumedFrom"]["step"], exit_step, st)
        log = self.pod_log("mlpd-worker-0") + self.pod_log("mlpd-worker-1")  # ranks go by arrival
        self.assertRegex(log, r"restored step %d from " % exit_step)
        self.assertRegex(log, r"RESULT: test accuracy .* -- reached")
        self.assertEqual(st["restarts"], 0, "deleted pods are not failures")
        print("every pod deleted at once (real API server, test kubelet): exit checkpoint of step %d, resumed from "
              "it, Succeeded %.1f s after the deletion" % (exit_step, time.time() - t_delete), flush=True)

    def test_every_worker_program_killed_restarts_the_whole_job_under_restartjob(self):
        """Both workers' programs SIGKILLed at once (an OOM of their node, a crash in both): no
        worker holds the model, so in-job recovery cannot heal it; the scheduler fails the job at
        the first rejoin and, under runPolicy.failurePolicy RestartJob, the operator deletes every
        pod and, once all are gone, creates the job again, which resumes from the newest
        checkpoint, counted as one restart (docs/checkpoints.md "Whole-job restart")."""
        ckpt = self.start_job("mlpk", "OnFailure", backoff_limit=2, failurePolicy="RestartJob")
        self.wait_phase("mlpk", "Running", 90)
        self.assertTrue(envtest.wait_for(lambda: self.newest_step(ckpt) >= DELETE_AFTER, 120),
                        "no progress to kill at (newest checkpoint step %d)" % self.newest_step(ckpt))
        self.assertTrue(envtest.wait_for(lambda: len(envtest.worker_programs("mlpk")) == 2, 10), "no worker programs")
        killed_after = self.newest_step(ckpt)
        t_kill = time.time()
        for pid in envtest.worker_programs("mlpk"):
            os.kill(pid, 9)
        st = self.wait_phase("mlpk", ("Succeeded", "Failed"), 240)
        self.assertEqual(st["phase"], "Succeeded", st)
        self.assertEqual(st.get("jobRestarts"), 1, st)
        last = st["lastRestart"]
        self.assertEqual((last["reason"], last["wholeJob"], last["oldPodsGoing"]), ("JobRestarted", True, False), st)
        self.assertIn("every worker that held the model is gone", last["message"])
        self.assertIn("JobRestarted", self.events("mlpk"))
        self.assertGreaterEqual(st["resumedFrom"]["step"], killed_after, st)
        log = self.pod_log("mlpk-worker-0") + self.pod_log("mlpk-worker-1")  # ranks go by arrival
        self.assertRegex(log, r"restored step %d from " % st["resumedFrom"]["step"])
        self.assertRegex(log, r"RESULT: test accuracy .* -- reached")
        print("whole-job restart (real API server, test kubelet): both worker programs killed after checkpoint %d, "
              "the job resumed from step %d, Succeeded %.1f s after the kill"
              % (killed_after, st["resumedFrom"]["step"], time.time() - t_kill), flush=True)

    def test_every_worker_pod_deleted_restarts_the_whole_job_uncounted(self):
        """Every worker pod deleted, the scheduler and servers kept (a drained worker node pool):
        the scheduler stops the job as a whole (exit checkpoint) and takes no replacement into
        it; the operator deletes the rest and creates the whole job again once every old pod is
        gone, under the default failurePolicy, not counted."""
        ckpt = self.start_job("mlpw", "OnFailure")
        self.wait_phase("mlpw", "Running", 90)
        self.assertTrue(envtest.wait_for(lambda: self.newest_step(ckpt) >= DELETE_AFTER, 120),
                        "no progress to delete at (newest checkpoint step %d)" % self.newest_step(ckpt))
        t_delete = time.time()
        self.cp.kubectl("delete", "pods", "-l", "trellis.io/job-name=mlpw,trellis.io/role=worker", "-n", self.ns,
                        "--wait=false")
        st = self.wait_phase("mlpw", ("Succeeded", "Failed"), 240)
        self.assertEqual(st["phase"], "Succeeded", st)
        self.assertEqual(st["restarts"], 0, "a deletion is not a failure")
        self.assertEqual((st["lastRestart"]["reason"], st["lastRestart"]["wholeJob"]), ("JobPreempted", True), st)
        before = ""
        for i in (0, 1):  # rank 0 is whichever worker registered first; its replacement was deleted too
            with open(os.path.join(self.kubelet.work_dir, "mlpw-worker-%d.earlier.log" % i), errors="replace") as f:
                before += f.read()
        m = re.search(r"stopped after step (\d+) \(exit checkpoint \S+\.ckpt\)", before)
        self.assertIsNotNone(m, "no exit checkpoint in the deleted rank 0's log")
        self.assertEqual(st["resumedFrom"]["step"], int(m.group(1)), st)
        self.assertRegex(self.pod_log("mlpw-worker-0") + self.pod_log("mlpw-worker-1"),
                         r"RESULT: test accuracy .* -- reached")
        print("every worker pod deleted (real API server, test kubelet): exit checkpoint of step %s, the whole job "
              "recreated and resumed from it, Succeeded %.1f s after the deletion"
              % (m.group(1), time.time() - t_delete), flush=True)


if __name__ == "__main__":
    envtest.main(PodDelete)
