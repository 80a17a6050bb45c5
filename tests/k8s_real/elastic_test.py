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


if __name__ == "__main__":
    envtest.main(Elastic)
