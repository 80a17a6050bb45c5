#!/usr/bin/python3
"""On a real API server (envtest.py): an elastic TrainingJob resized while it trains, the way a
user does it (docs/elastic.md#on-kubernetes): `kubectl scale trainingjob/NAME --replicas=N`
through the CRD's scale subresource. A size outside spec.elastic is refused on the job (an Event,
the Resizing condition) and the job trains on; a shrink from 2 workers to 1 is asked of the job's
scheduler, the workers switch at a step they agree on, status.world and the scale subresource
say 1, the pod of the worker resized away exits 0 and is deleted. Scaled to 4, beyond the 2 it
started with (docs/elastic.md#growing), the pod of worker 1 is made again and those of workers 2
and 3 for the first time; they join at a step the workers agree on. Scaled to 2, the pods of
workers 2 and 3 exit 0 and go; the job succeeds with 2 and the MLP's target accuracy reached.

A worker lost for good (docs/elastic.md#losing-a-worker): worker 1 of 3 SIGKILLed under
restartPolicy Never; its agent says the scheduler left it out, so the job does not fail: the loss
is followed like a resize (status.world {0, 2}, a WorkerLost event), no pod is made again for
it, and the job succeeds with the other two. With minWorkers 2 of 2, the same kill fails the job
naming spec.elastic.minWorkers.

Usage: elastic_test.py REPO BIN_DIR   (exit 77 without KUBEBUILDER_ASSETS)
"""
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import envtest  # noqa: E402

EPOCHS = 16  # of 128 steps per worker with 2 workers: a few seconds of training before the resize


class Elastic(envtest.EnvtestCase):
    prefix = "el"

    def scale(self, name, n):
        self.cp.kubectl("scale", "trainingjob/" + name, "--replicas=%d" % n, "-n", self.ns)

    def last_resize(self, name):
        return ((self.job(name) or {}).get("status") or {}).get("lastResize") or {}

    def test_kubectl_scale_shrinks_and_grows_a_running_job_and_refuses_what_it_cannot_do(self):
        services = os.path.join(self.cp.dir, self.ns + "-services.json")
        self.start_operator(args=["--progress-seconds", "1", "--scheduler-addresses", services])
        kubelet = self.start_kubelet(args=["--services-file", services])
        job = envtest.mlp_job("el", epochs=EPOCHS, activeDeadlineSeconds=300)
        job["spec"]["elastic"] = {"minWorkers": 1, "maxWorkers": 4}
        # Rank 0 sleeps 10 ms a step: the resizes land mid-training on an idle machine too.
        job["spec"]["workers"]["args"] += ["--slow-rank", "0", "--step-sleep-ms", "10"]
        self.create_job(job)
        st = self.wait_phase("el", "Running", 90)
        self.assertEqual(st.get("world", {}).get("workers"), 2, st)
        self.assertTrue(envtest.wait_for(
            lambda: ((self.job("el").get("status") or {}).get("progress") or {}).get("step", 0) >= 20, 90),
            "no progress before the resize: %s" % self.job("el").get("status"))

        # Outside spec.elastic: refused on the job, which trains on with its 2 workers.
        self.scale("el", 5)
        self.assertTrue(envtest.wait_for(lambda: self.last_resize("el").get("outcome") == "Refused", 30),
                        "no refusal: %s" % self.job("el").get("status"))
        msgs = self.event_messages("el", "ResizeRefused")
        self.assertTrue(any("outside spec.elastic [1, 4]" in m for m in msgs), msgs)
        self.assertEqual(self.condition("el", "Resizing")["reason"], "ResizeRefused")
        self.assertIn(self.job("el")["status"]["phase"], ("Running",))

        # 2 -> 1: asked of the scheduler, done at a step boundary.
        asked = time.time()
        self.scale("el", 1)
        self.assertTrue(envtest.wait_for(lambda: self.last_resize("el").get("outcome") == "Done", 60),
                        "the resize did not take effect: %s" % self.job("el").get("status"))
        took = time.time() - asked  # within the 0.1 s polls of wait_for
        st = self.job("el")["status"]
        self.assertEqual(st["world"]["workers"], 1, st)
        self.assertGreater(st["world"]["fromStep"], 0, st)
        self.assertEqual(st["lastResize"]["from"], 2, st)
        self.assertEqual(st["lastResize"]["to"], 1, st)
        self.assertEqual(self.condition("el", "Resizing")["reason"], "Resized")
        scale = self.cp.get(self.job_url("el") + "/scale")
        self.assertEqual((scale["spec"]["replicas"], scale["status"]["replicas"]), (1, 1), scale)
        resized = self.event_messages("el", "Resized")
        self.assertTrue(any(re.search(r"from 2 workers to 1; the new world trains from step \d+", m)
                            for m in resized), resized)

        # The worker resized away exits 0 and its pod goes.
        self.assertTrue(envtest.wait_for(lambda: not self.pods("trellis.io/job-name=el,trellis.io/role=worker,"
                                                               "trellis.io/rank=1"), 60),
                        "worker 1's pod is still there: %s" % [
                            (p["metadata"]["name"], p["status"].get("phase")) for p in self.pods()])
        with open(os.path.join(kubelet.work_dir, "el-worker-1.log"), errors="replace") as f:
            self.assertIn("left the job", f.read())

        # 1 -> 4: grown back into worker 1's rank and beyond the first size into 2 and 3. Their
        # pods are made once the scheduler took the resize; they join at the step the members
        # agree on.
        asked = time.time()
        self.scale("el", 4)
        self.assertTrue(envtest.wait_for(lambda: self.last_resize("el").get("to") == 4 and
                                         self.last_resize("el").get("outcome") == "Done", 90),
                        "the grow did not take effect: %s" % self.job("el").get("status"))
        grew = time.time() - asked
        st = self.job("el")["status"]
        self.assertEqual(st["world"]["workers"], 4, st)
        grown_from = st["world"]["fromStep"]
        resized = self.event_messages("el", "Resized")
        self.assertTrue(any(re.search(r"from 1 worker to 4; the new world trains from step \d+", m)
                            for m in resized), resized)
        self.assertEqual(sorted(p["metadata"]["name"] for p in self.pods("trellis.io/job-name=el,trellis.io/role=worker")),
                         ["el-worker-%d" % i for i in range(4)])

        # 4 -> 2: workers 2 and 3 leave; their pods exit 0 and go.
        self.assertTrue(envtest.wait_for(
            lambda: ((self.job("el").get("status") or {}).get("progress") or {}).get("step", 0) >= grown_from + 20, 60),
            "no progress in the world of 4: %s" % self.job("el").get("status"))
        self.scale("el", 2)
        self.assertTrue(envtest.wait_for(lambda: self.last_resize("el").get("to") == 2 and
                                         self.last_resize("el").get("outcome") == "Done", 60),
                        "the shrink to 2 did not take effect: %s" % self.job("el").get("status"))
        shrunk_from = self.job("el")["status"]["world"]["fromStep"]
        self.assertTrue(envtest.wait_for(
            lambda: len(self.pods("trellis.io/job-name=el,trellis.io/role=worker")) == 2, 60),
            "workers 2 and 3 are still there: %s" % [(p["metadata"]["name"], p["status"].get("phase"))
                                                     for p in self.pods()])

        st = self.wait_phase("el", ("Succeeded", "Failed"), 240)
        self.assertEqual(st["phase"], "Succeeded", st)
        self.assertEqual(st["world"]["workers"], 2, st)
        with open(os.path.join(kubelet.work_dir, "el-worker-0.log"), errors="replace") as f:
            log = f.read()
        self.assertRegex(log, r"RESULT: test accuracy \S+ \(target \S+\) -- reached", log[-2000:])
        self.assertIn("resized to 4 worker(s) from step %d" % grown_from, log)
        self.assertIn("resized to 2 worker(s) from step %d" % shrunk_from, log)
        for w in (1, 2, 3):
            with open(os.path.join(kubelet.work_dir, "el-worker-%d.log" % w), errors="replace") as f:
                joined = f.read()
            self.assertIn("rejoined the running job after step %d" % (grown_from - 1), joined)
            if w > 1:
                self.assertIn("left the job", joined)
        print("resized 2 -> 1 -> 4 -> 2 on the real API server: kubectl scale -> status.world 1: %.2f s, -> 4: %.2f s; "
              "last resize %s; events %s" % (took, grew, st["lastResize"], self.events("el")), flush=True)

    def start_lost_job(self, name, workers, min_workers):
        """An elastic job of `workers` under restartPolicy Never, trained a few steps; the
        operator and the test kubelet running. Returns the kubelet."""
        services = os.path.join(self.cp.dir, self.ns + "-services.json")
        self.start_operator(args=["--progress-seconds", "1", "--scheduler-addresses", services])
        kubelet = self.start_kubelet(args=["--services-file", services])
        job = envtest.mlp_job(name, epochs=EPOCHS, activeDeadlineSeconds=300)
        job["spec"]["workers"]["replicas"] = workers
        job["spec"]["elastic"] = {"minWorkers": min_workers, "maxWorkers": workers}
        job["spec"]["workers"]["args"] += ["--slow-rank", "0", "--step-sleep-ms", "10"]
        self.create_job(job)
        self.wait_phase(name, "Running", 90)
        self.assertTrue(envtest.wait_for(
            lambda: ((self.job(name).get("status") or {}).get("progress") or {}).get("step", 0) >= 20, 90),
            "no progress before the kill: %s" % self.job(name).get("status"))
        return kubelet

    def kill_worker_program(self, name, rank):
        pod = "%s-worker-%d" % (name, rank)
        self.assertTrue(envtest.wait_for(lambda: envtest.worker_programs(name, pod), 10), "no program in " + pod)
        for pid in envtest.worker_programs(name, pod):
            os.kill(pid, 9)

    def test_a_worker_lost_for_good_leaves_a_gap_in_the_world_and_the_job_succeeds_with_the_others(self):
        kubelet = self.start_lost_job("lost", workers=3, min_workers=2)
        killed = time.time()
        self.kill_worker_program("lost", 1)
        self.assertTrue(envtest.wait_for(lambda: self.last_resize("lost").get("lostWorker") == 1 and
                                         self.last_resize("lost").get("outcome") == "Done", 60),
                        "the loss was not followed: %s" % self.job("lost").get("status"))
        followed = time.time() - killed
        st = self.job("lost")["status"]
        self.assertEqual(st["phase"], "Running", st)
        self.assertEqual((st["world"]["workers"], st["world"]["members"]), (2, [0, 2]), st)
        self.assertEqual([(e["worker"], e["pod"]) for e in st["world"]["lost"]], [(1, "lost-worker-1")], st)
        self.assertIn("killed by SIGKILL", st["world"]["lost"][0]["reason"], st)
        self.assertEqual((st["lastResize"]["from"], st["lastResize"]["to"]), (3, 2), st)
        lost = self.event_messages("lost", "WorkerLost")
        self.assertTrue(any("worker 1 (pod lost-worker-1) is lost for good" in m and
                            "the job goes on with 2 workers" in m for m in lost), lost)
        scale = self.cp.get(self.job_url("lost") + "/scale")
        self.assertEqual((scale["spec"]["replicas"], scale["status"]["replicas"]), (3, 2), scale)

        # Nothing is made again for it (restartPolicy Never): its failed pod stays for its logs.
        st = self.wait_phase("lost", ("Succeeded", "Failed"), 240)
        self.assertEqual(st["phase"], "Succeeded", st)
        self.assertEqual(self.condition("lost", "Succeeded")["message"], "job lost: all 2 workers succeeded")
        self.assertEqual(st["lastResize"]["outcome"], "Done", st)
        workers = {p["metadata"]["name"]: p["status"].get("phase")
                   for p in self.pods("trellis.io/job-name=lost,trellis.io/role=worker")}
        self.assertEqual(workers.get("lost-worker-1"), "Failed", workers)
        with open(os.path.join(kubelet.work_dir, "lost-worker-0.log"), errors="replace") as f:
            log = f.read()
        self.assertRegex(log, r"RESULT: test accuracy \S+ \(target \S+\) -- reached", log[-2000:])
        self.assertIn("resized to 2 worker(s)", log)
        print("worker 1 of 3 lost on the real API server: SIGKILL -> status.world {0, 2} Done: %.2f s; "
              "events %s" % (followed, self.events("lost")), flush=True)

    def test_a_worker_lost_below_min_workers_fails_the_job_naming_why(self):
        self.start_lost_job("few", workers=2, min_workers=2)
        self.kill_worker_program("few", 1)
        st = self.wait_phase("few", ("Succeeded", "Failed"), 120)
        self.assertEqual(st["phase"], "Failed", st)
        failed = self.condition("few", "Failed")["message"]
        self.assertIn("worker 1 (pod few-worker-1) failed", failed, st)
        self.assertIn("fewer than spec.elastic.minWorkers (2)", failed, st)
        self.assertNotIn("lost", (st.get("world") or {}), st)


if __name__ == "__main__":
    envtest.main(Elastic)
