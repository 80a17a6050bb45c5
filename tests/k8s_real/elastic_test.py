#!/usr/bin/python3
"""On a real API server (envtest.py): an elastic TrainingJob resized while it trains, the way a
user does it (docs/elastic.md#on-kubernetes): `kubectl scale trainingjob/NAME --replicas=N`
through the CRD's scale subresource. A size outside spec.elastic is refused on the job (an Event,
the Resizing condition) and the job trains on, as does a changed spec.servers.replicas without
spec.elastic's server bounds; a shrink from 2 workers to 1 is asked of the job's
scheduler, the workers switch at a step they agree on, status.world and the scale subresource
say 1, the pod of the worker resized away exits 0 and is deleted. Scaled to 4, beyond the 2 it
started with (docs/elastic.md#growing), the pod of worker 1 is made again and those of workers 2
and 3 for the first time; they join at a step the workers agree on. Scaled to 2, the pods of
workers 2 and 3 exit 0 and go; the job succeeds with 2 and the MLP's target accuracy reached.

A worker lost for good (docs/elastic.md#losing-a-worker): worker 1 of 3 SIGKILLed under
restartPolicy Never; its agent says the scheduler left it out, so the job does not fail: the loss
is followed like a resize (status.world {0, 2}, a WorkerLost event), no pod is made again for
it, and the job succeeds with the other two. With minWorkers 2 of 2, the same kill fails the job
naming spec.elastic.minWorkers. A worker frozen (its agent and program SIGSTOPped: a node gone
silent) is lost after registrationTimeoutSeconds all the same: the operator learns it from the
scheduler, follows the loss and deletes the frozen pod. A lost rank grows back when the replicas
change (`kubectl scale` 2, then 3): its pod is made again and joins the running job. A worker
pod deleted under Never (a spot node reclaimed) is lost the same way, its pod not made again.
With minServers/maxServers, spec.servers.replicas edited 2 -> 3 -> 1 resizes the servers while
the job trains (docs/elastic.md#servers), and a server lost for good (its program SIGKILLed, or
its pod deleted, under Never) is taken over by server 0's pod: the job succeeds
(docs/elastic.md#losing-a-server).

Usage: elastic_test.py REPO BIN_DIR   (exit 77 without KUBEBUILDER_ASSETS)
"""
import os
import re
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import envtest  # noqa: E402

EPOCHS = 16  # of 128 steps per worker with 2 workers: a few seconds of training before the resize
STEPS = EPOCHS * 128  # per worker


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

        # Servers are not resized while the job runs: refused on the job, no server pod made.
        self.cp.kubectl("patch", "trainingjob/el", "-n", self.ns, "--type=merge",
                        "-p", '{"spec":{"servers":{"replicas":3}}}')
        self.assertTrue(envtest.wait_for(
            lambda: any("spec.servers.replicas is 3" in m for m in self.event_messages("el", "ResizeRefused")), 30),
            "no refusal of the servers: %s" % self.events("el"))
        self.assertEqual(self.job("el")["status"]["world"]["servers"], 2)
        self.assertEqual(len(self.pods("trellis.io/job-name=el,trellis.io/role=server")), 2)
        self.cp.kubectl("patch", "trainingjob/el", "-n", self.ns, "--type=merge",
                        "-p", '{"spec":{"servers":{"replicas":2}}}')

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

    def test_spec_servers_replicas_resizes_an_elastic_jobs_servers_within_its_bounds(self):
        """docs/elastic.md#servers: with minServers/maxServers, an edit of spec.servers.replicas
        resizes the running job's servers: 2 -> 3 makes the pod of server 2 and the slices move
        at a step the workers agree on; 3 -> 1 removes servers 1 and 2, whose programs hand
        their slices over and exit 0, and whose pods go; 1 -> 2 makes server 1's pod again, a
        fresh server the slices move to. The job succeeds, reaching the MLP's target accuracy."""
        services = os.path.join(self.cp.dir, self.ns + "-services.json")
        self.start_operator(args=["--progress-seconds", "1", "--scheduler-addresses", services])
        kubelet = self.start_kubelet(args=["--services-file", services])
        job = envtest.mlp_job("es", epochs=EPOCHS, activeDeadlineSeconds=300)
        job["spec"]["elastic"] = {"minWorkers": 2, "maxWorkers": 2, "minServers": 1, "maxServers": 3}
        job["spec"]["workers"]["args"] += ["--slow-rank", "0", "--step-sleep-ms", "10"]
        self.create_job(job)
        st = self.wait_phase("es", "Running", 90)
        self.assertEqual(st.get("world", {}).get("servers"), 2, st)
        self.assertTrue(envtest.wait_for(
            lambda: ((self.job("es").get("status") or {}).get("progress") or {}).get("step", 0) >= 20, 90),
            "no progress before the resize: %s" % self.job("es").get("status"))

        def patch_servers(n):
            self.cp.kubectl("patch", "trainingjob/es", "-n", self.ns, "--type=merge",
                            "-p", '{"spec":{"servers":{"replicas":%d}}}' % n)

        def done(n):
            last = self.last_resize("es")
            return last.get("kind") == "Servers" and last.get("to") == n and last.get("outcome") == "Done"

        asked = time.time()
        patch_servers(3)
        self.assertTrue(envtest.wait_for(lambda: done(3), 90),
                        "the server grow did not take effect: %s" % self.job("es").get("status"))
        grew = time.time() - asked
        st = self.job("es")["status"]
        self.assertEqual((st["world"]["servers"], st["world"]["workers"]), (3, 2), st)
        self.assertEqual(sorted(p["metadata"]["name"] for p in self.pods("trellis.io/job-name=es,trellis.io/role=server")),
                         ["es-server-0", "es-server-1", "es-server-2"])
        resized = self.event_messages("es", "Resized")
        self.assertTrue(any(re.search(r"from 2 servers to 3; the new world trains from step \d+", m) for m in resized),
                        resized)

        asked = time.time()
        patch_servers(1)
        self.assertTrue(envtest.wait_for(lambda: done(1), 60),
                        "the server shrink did not take effect: %s" % self.job("es").get("status"))
        shrank = time.time() - asked
        self.assertEqual(self.job("es")["status"]["world"]["servers"], 1)
        self.assertTrue(envtest.wait_for(
            lambda: len(self.pods("trellis.io/job-name=es,trellis.io/role=server")) == 1, 60),
            "servers 1 and 2 are still there: %s" % [(p["metadata"]["name"], p["status"].get("phase"))
                                                     for p in self.pods()])
        for r in (1, 2):
            with open(os.path.join(kubelet.work_dir, "es-server-%d.log" % r), errors="replace") as f:
                self.assertIn("resized away in world", f.read())

        # Grown back into the rank the shrink removed: server 1's pod made again, a fresh server
        # the slices are handed to.
        step = ((self.job("es").get("status") or {}).get("progress") or {}).get("step", 0)
        self.assertLess(step, STEPS - 400, "too little training left to grow back in")
        asked = time.time()
        patch_servers(2)
        self.assertTrue(envtest.wait_for(lambda: done(2), 90),
                        "the grow back did not take effect: %s" % self.job("es").get("status"))
        regrew = time.time() - asked
        self.assertEqual(sorted(p["metadata"]["name"] for p in self.pods("trellis.io/job-name=es,trellis.io/role=server")),
                         ["es-server-0", "es-server-1"])

        st = self.wait_phase("es", ("Succeeded", "Failed"), 240)
        self.assertEqual(st["phase"], "Succeeded", st)
        self.assertEqual(st["world"]["servers"], 2, st)
        with open(os.path.join(kubelet.work_dir, "es-worker-0.log"), errors="replace") as f:
            log = f.read()
        self.assertRegex(log, r"RESULT: test accuracy \S+ \(target \S+\) -- reached", log[-2000:])
        self.assertRegex(log, r"world \d+ from step \d+: rank 0 of 2, 3 servers")
        self.assertRegex(log, r"world \d+ from step \d+: rank 0 of 2, 1 servers")
        self.assertRegex(log, r"world \d+ from step \d+: rank 0 of 2, 2 servers")
        print("servers 2 -> 3 -> 1 -> 2 on the real API server (grown back at step %d): spec.servers.replicas -> "
              "status.world 3: %.2f s, -> 1: %.2f s, -> 2: %.2f s; last resize %s"
              % (step, grew, shrank, regrew, st["lastResize"]), flush=True)

    def start_lost_job(self, name, workers, min_workers, scheduler=None, policy="Never", kubelet_args=(), **run_policy):
        """An elastic job of `workers` under restartPolicy `policy`, trained a few steps; the
        operator and the test kubelet running. Returns the kubelet."""
        services = os.path.join(self.cp.dir, self.ns + "-services.json")
        self.start_operator(args=["--progress-seconds", "1", "--scheduler-addresses", services])
        kubelet = self.start_kubelet(args=["--services-file", services] + list(kubelet_args))
        job = envtest.mlp_job(name, epochs=EPOCHS, activeDeadlineSeconds=300, restartPolicy=policy, **run_policy)
        job["spec"]["workers"]["replicas"] = workers
        job["spec"]["elastic"] = {"minWorkers": min_workers, "maxWorkers": workers}
        job["spec"]["workers"]["args"] += ["--slow-rank", "0", "--step-sleep-ms", "10"]
        if scheduler:
            job["spec"]["scheduler"] = scheduler
        self.create_job(job)
        self.wait_phase(name, "Running", 90)
        self.assertTrue(envtest.wait_for(
            lambda: ((self.job(name).get("status") or {}).get("progress") or {}).get("step", 0) >= 20, 90),
            "no progress before the kill: %s" % self.job(name).get("status"))
        return kubelet

    def wait_loss_followed(self, name):
        """Waits (60 s) until the operator followed worker 1's loss to Done."""
        self.assertTrue(envtest.wait_for(lambda: self.last_resize(name).get("lostWorker") == 1 and
                                         self.last_resize(name).get("outcome") == "Done", 60),
                        "the loss was not followed: %s" % self.job(name).get("status"))

    def kill_worker_program(self, name, rank):
        pod = "%s-worker-%d" % (name, rank)
        self.assertTrue(envtest.wait_for(lambda: envtest.worker_programs(name, pod), 10), "no program in " + pod)
        for pid in envtest.worker_programs(name, pod):
            os.kill(pid, 9)

    def test_a_worker_lost_for_good_leaves_a_gap_in_the_world_and_the_job_succeeds_with_the_others(self):
        kubelet = self.start_lost_job("lost", workers=3, min_workers=2)
        killed = time.time()
        self.kill_worker_program("lost", 1)
        self.wait_loss_followed("lost")
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

    def test_a_lost_worker_is_grown_back_once_the_replicas_change(self):
        """docs/elastic.md#on-kubernetes-a-lost-worker: the world a loss left runs on (the
        operator does not ask for spec.workers.replicas again by itself); `kubectl scale` to 2 and
        back to 3 grows the lost rank back: its failed pod is deleted and made again, and it joins
        the running job."""
        kubelet = self.start_lost_job("back", workers=3, min_workers=2)
        self.kill_worker_program("back", 1)
        self.wait_loss_followed("back")
        time.sleep(3)  # nothing asks for 3 again on its own
        last = self.last_resize("back")
        self.assertEqual((last.get("lostWorker"), last.get("outcome"), last.get("to")), (1, "Done", 2), last)
        self.scale("back", 2)  # the world already: nothing to do
        time.sleep(1)
        self.scale("back", 3)
        self.assertTrue(envtest.wait_for(lambda: self.last_resize("back").get("to") == 3 and
                                         self.last_resize("back").get("outcome") == "Done", 90),
                        "the grow back did not take effect: %s" % self.job("back").get("status"))
        st = self.job("back")["status"]
        self.assertEqual(st["world"]["members"], [0, 1, 2], st)
        self.assertNotIn("lost", st["world"], st)
        from_step = st["lastResize"]["fromStep"]
        st = self.wait_phase("back", ("Succeeded", "Failed"), 240)
        self.assertEqual(st["phase"], "Succeeded", st)
        self.assertEqual(self.condition("back", "Succeeded")["message"], "job back: all 3 workers succeeded")
        with open(os.path.join(kubelet.work_dir, "back-worker-1.log"), errors="replace") as f:
            log = f.read()
        self.assertIn("rejoined the running job after step %d" % (from_step - 1), log, log[-3000:])

    def freeze_worker_1(self, job_name):
        """SIGSTOPs worker 1's agent and program (a node gone silent); returns their pids and when."""
        pod = job_name + "-worker-1"
        self.assertTrue(envtest.wait_for(lambda: len(envtest.pod_processes(job_name, pod)) >= 2, 10),
                        "no agent and program in " + pod)
        pids = envtest.pod_processes(job_name, pod)
        stopped = time.time()
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        return pids, stopped

    @staticmethod
    def kill_all(pids):
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def test_a_silent_worker_under_on_failure_is_replaced_and_grows_back(self):
        """A node gone under OnFailure: the silent worker is lost after registrationTimeoutSeconds
        and its frozen pod deleted, as under Never; once that pod is gone a replacement is made
        (on a cluster, on another node), it runs, its program asks to join, and the world grows
        back to 3 by itself; the job succeeds with 3."""
        pids = []
        try:
            kubelet = self.start_lost_job("node", workers=3, min_workers=2, policy="OnFailure",
                                          scheduler={"heartbeatIntervalSeconds": 0.5, "heartbeatTimeoutSeconds": 3,
                                                     "registrationTimeoutSeconds": 5},
                                          terminationGracePeriodSeconds=2)
            pids, stopped = self.freeze_worker_1("node")
            self.wait_loss_followed("node")
            self.assertTrue(envtest.wait_for(lambda: self.last_resize("node").get("to") == 3 and
                                             self.last_resize("node").get("outcome") == "Done", 90),
                            "the world did not grow back: %s" % self.job("node").get("status"))
            back = time.time() - stopped
            st = self.job("node")["status"]
            self.assertEqual(st["world"]["members"], [0, 1, 2], st)
            self.assertNotIn("lost", st["world"], st)
            self.assertIn("worker 1 came back after it was lost", st["lastResize"]["reason"], st)
            from_step = st["lastResize"]["fromStep"]
            st = self.wait_phase("node", ("Succeeded", "Failed"), 240)
            self.assertEqual(st["phase"], "Succeeded", st)
            self.assertEqual(self.condition("node", "Succeeded")["message"], "job node: all 3 workers succeeded")
            with open(os.path.join(kubelet.work_dir, "node-worker-1.log"), errors="replace") as f:
                log = f.read()
            self.assertIn("rejoined the running job after step %d" % (from_step - 1), log, log[-3000:])
            print("a silent worker under OnFailure on the real API server: SIGSTOP -> lost, its pod replaced, "
                  "status.world {0, 1, 2} Done: %.2f s (registration timeout 5 s, grace 2 s)" % back, flush=True)
        finally:
            self.kill_all(pids)

    def test_a_silent_worker_is_lost_after_the_registration_timeout_and_its_pod_deleted(self):
        """A worker whose node is gone neither exits nor heartbeats: here its agent and program
        are frozen (SIGSTOP). The scheduler loses it after registrationTimeoutSeconds; the
        operator learns it from the scheduler (no pod failed), follows the loss, deletes the
        frozen pod (it would never finish) and makes none again; the job succeeds with 2."""
        job_name = "silent"
        pids = []
        try:
            self.start_lost_job(job_name, workers=3, min_workers=2,
                                scheduler={"heartbeatIntervalSeconds": 0.5, "heartbeatTimeoutSeconds": 3,
                                           "registrationTimeoutSeconds": 5})
            pids, stopped = self.freeze_worker_1(job_name)
            self.wait_loss_followed(job_name)
            followed = time.time() - stopped
            st = self.job(job_name)["status"]
            self.assertEqual(st["world"]["members"], [0, 2], st)
            lost = st["world"]["lost"]
            self.assertEqual([(e["worker"], e["pod"], e.get("silent")) for e in lost], [(1, "silent-worker-1", True)], st)
            self.assertIn("was silent for", lost[0]["reason"], st)
            self.assertIn("registrationTimeoutSeconds (5.0 s)", lost[0]["reason"], st)
            self.assertTrue(any("worker 1 (pod silent-worker-1) is lost for good" in m
                                for m in self.event_messages(job_name, "WorkerLost")), self.events(job_name))
            # The frozen pod is deleted (it would never end), and none is made again.
            def worker_1_going():
                pods = {p["metadata"]["name"]: p for p in self.pods("trellis.io/job-name=silent,trellis.io/role=worker")}
                return "silent-worker-1" not in pods or pods["silent-worker-1"]["metadata"].get("deletionTimestamp")
            self.assertTrue(envtest.wait_for(worker_1_going, 30),
                            [p["metadata"]["name"] for p in self.pods("trellis.io/job-name=silent")])
            st = self.wait_phase(job_name, ("Succeeded", "Failed"), 240)
            self.assertEqual(st["phase"], "Succeeded", st)
            self.assertEqual(self.condition(job_name, "Succeeded")["message"], "job silent: all 2 workers succeeded")
            self.assertNotIn("PodRestarted", self.events(job_name))
            print("worker 1 of 3 frozen on the real API server: SIGSTOP -> status.world {0, 2} Done: %.2f s "
                  "(heartbeat timeout 3 s, registration timeout 5 s)" % followed, flush=True)
        finally:
            self.kill_all(pids)

    def test_a_worker_pod_deleted_under_never_is_lost_and_the_job_goes_on(self):
        """A spot node reclaimed, a drain, `kubectl delete pod`: under restartPolicy Never no
        replacement comes. The pod's agent (SIGTERM) stops the program and tells the scheduler,
        which loses the worker; the operator neither fails the job nor makes the pod again, notes
        the loss from the scheduler's view and follows it; the job succeeds with 2."""
        self.start_lost_job("spot", workers=3, min_workers=2)
        deleted = time.time()
        self.cp.kubectl("delete", "pod", "spot-worker-1", "-n", self.ns, "--wait=false")
        self.wait_loss_followed("spot")
        followed = time.time() - deleted
        st = self.job("spot")["status"]
        self.assertEqual(st["phase"], "Running", st)
        self.assertEqual(st["world"]["members"], [0, 2], st)
        lost = st["world"]["lost"]
        self.assertEqual([(e["worker"], e["pod"], e.get("silent")) for e in lost], [(1, "spot-worker-1", None)], st)
        self.assertIn("after the agent got SIGTERM (the pod was deleted, evicted or drained)", lost[0]["reason"], st)
        self.assertTrue(any("worker 1 (pod spot-worker-1) is lost for good" in m
                            for m in self.event_messages("spot", "WorkerLost")), self.events("spot"))
        st = self.wait_phase("spot", ("Succeeded", "Failed"), 240)
        self.assertEqual(st["phase"], "Succeeded", st)
        self.assertEqual(self.condition("spot", "Succeeded")["message"], "job spot: all 2 workers succeeded")
        workers = [p["metadata"]["name"] for p in self.pods("trellis.io/job-name=spot,trellis.io/role=worker")]
        self.assertNotIn("spot-worker-1", workers, "no pod is made again under restartPolicy Never")
        self.assertNotIn("Restarting", self.phases["spot"], self.phases["spot"])
        self.assertNotIn("PodRestarted", self.events("spot"))
        print("worker pod 1 of 3 deleted under Never on the real API server: kubectl delete -> status.world "
              "{0, 2} Done: %.2f s" % followed, flush=True)

    def test_a_late_replacement_grows_the_world_back(self):
        """Under OnFailure a deleted worker pod is made again, but here the node is full (the
        test kubelet starts no pod meanwhile): no replacement registers within
        registrationTimeoutSeconds, so the scheduler loses the worker and the other two train on.
        The Pending replacement is kept; once the node has room it starts, its program asks to
        join, and the scheduler grows the world back to 3 on its own; the operator follows it
        (a WorkerBack or Resized event) and the job succeeds with 3."""
        full = os.path.join(self.cp.dir, self.ns + "-node-full")
        kubelet = self.start_lost_job("late", workers=3, min_workers=2, policy="OnFailure",
                                      scheduler={"heartbeatIntervalSeconds": 0.5, "registrationTimeoutSeconds": 4},
                                      kubelet_args=["--full-file", full])
        old = self.cp.get("/api/v1/namespaces/%s/pods/late-worker-1" % self.ns)["metadata"]["uid"]
        open(full, "w").close()
        try:
            self.cp.kubectl("delete", "pod", "late-worker-1", "-n", self.ns, "--wait=false")
            self.wait_loss_followed("late")
            st = self.job("late")["status"]
            self.assertEqual(st["world"]["members"], [0, 2], st)
            self.assertIn("no replacement pod registered within 4 s", st["world"]["lost"][0]["reason"], st)
            time.sleep(2)  # the replacement waits for room; the operator keeps it
            pod = self.cp.get("/api/v1/namespaces/%s/pods/late-worker-1" % self.ns)
            self.assertNotEqual(pod["metadata"]["uid"], old)
            self.assertEqual(pod["status"].get("phase", "Pending"), "Pending", pod["status"])
            self.assertFalse(pod["metadata"].get("deletionTimestamp"), pod["metadata"])
        finally:
            os.unlink(full)
        room = time.time()
        self.assertTrue(envtest.wait_for(lambda: self.last_resize("late").get("to") == 3 and
                                         self.last_resize("late").get("outcome") == "Done", 90),
                        "the world did not grow back: %s" % self.job("late").get("status"))
        back = time.time() - room
        st = self.job("late")["status"]
        self.assertEqual(st["world"]["members"], [0, 1, 2], st)
        self.assertNotIn("lost", st["world"], st)
        self.assertIn("worker 1 came back after it was lost", st["lastResize"]["reason"], st)
        # WorkerBack when a poll saw the grow under way, else Resized once it was decided.
        self.assertTrue(any("worker 1 came back after it was lost" in m
                            for m in self.event_messages("late", "WorkerBack") + self.event_messages("late", "Resized")),
                        self.events("late"))
        from_step = st["lastResize"]["fromStep"]
        st = self.wait_phase("late", ("Succeeded", "Failed"), 240)
        self.assertEqual(st["phase"], "Succeeded", st)
        self.assertEqual(self.condition("late", "Succeeded")["message"], "job late: all 3 workers succeeded")
        with open(os.path.join(kubelet.work_dir, "late-worker-1.log"), errors="replace") as f:
            log = f.read()
        self.assertIn("rejoined the running job after step %d" % (from_step - 1), log, log[-3000:])
        print("a late replacement on the real API server: room on the node -> status.world {0, 1, 2} Done: "
              "%.2f s" % back, flush=True)

    def start_server_takeover_job(self, name):
        """An elastic-servers job (2 servers, 1..3) under restartPolicy Never, trained a few steps;
        the operator and the test kubelet running. Returns the kubelet."""
        services = os.path.join(self.cp.dir, self.ns + "-services.json")
        self.start_operator(args=["--progress-seconds", "1", "--scheduler-addresses", services])
        kubelet = self.start_kubelet(args=["--services-file", services])
        job = envtest.mlp_job(name, epochs=EPOCHS, activeDeadlineSeconds=300)
        job["spec"]["elastic"] = {"minWorkers": 2, "maxWorkers": 2, "minServers": 1, "maxServers": 3}
        job["spec"]["workers"]["args"] += ["--slow-rank", "0", "--step-sleep-ms", "10"]
        self.create_job(job)
        self.wait_phase(name, "Running", 90)
        self.assertTrue(envtest.wait_for(
            lambda: ((self.job(name).get("status") or {}).get("progress") or {}).get("step", 0) >= 20, 90),
            "no progress before the loss: %s" % self.job(name).get("status"))
        return kubelet

    def assert_taken_over_and_succeeds(self, name, kubelet, since):
        """Server 1 of `name` taken over by server 0's pod: noted in status.world.takenOver with a
        ServerTakenOver event, no pod made again for it, and the job succeeds. Returns the seconds
        from `since` to the note."""
        def noted():
            return ((self.job(name).get("status") or {}).get("world") or {}).get("takenOver")
        self.assertTrue(envtest.wait_for(noted, 60), "no takeover noted: %s" % self.job(name).get("status"))
        took = time.time() - since
        taken = noted()
        self.assertEqual([(e["server"], e["pod"]) for e in taken], [(1, name + "-server-1")], taken)
        self.assertIn("taken over by pod %s-server-0" % name, taken[0]["reason"], taken)
        self.assertTrue(any("server 1 (pod %s-server-1) is lost for good" % name in m
                            for m in self.event_messages(name, "ServerTakenOver")), self.events(name))
        st = self.wait_phase(name, ("Succeeded", "Failed"), 240)
        self.assertEqual(st["phase"], "Succeeded", st)
        servers = {p["metadata"]["name"]: p["status"].get("phase")
                   for p in self.pods("trellis.io/job-name=%s,trellis.io/role=server" % name)}
        self.assertNotIn(servers.get(name + "-server-1"), ("Pending", "Running"), servers)
        with open(os.path.join(kubelet.work_dir, name + "-server-0.log"), errors="replace") as f:
            log = f.read()
        self.assertIn("taking over server 1 (lost for good)", log)
        self.assertIn("server 1: rebuilt ", log)
        with open(os.path.join(kubelet.work_dir, name + "-worker-0.log"), errors="replace") as f:
            log = f.read()
        self.assertRegex(log, r"RESULT: test accuracy \S+ \(target \S+\) -- reached", log[-2000:])
        self.assertNotIn("Restarting", self.phases[name], self.phases[name])
        return took

    def test_a_server_lost_for_good_is_taken_over_by_another_servers_pod(self):
        """docs/elastic.md#losing-a-server: with elastic servers, server 1's program SIGKILLed
        under restartPolicy Never does not fail the job: server 0's pod runs rank 1 from then on,
        the workers rebuild its slices there, the failed pod's agent says so (taken-over) and the
        operator neither fails the job nor makes the pod again; the job succeeds."""
        kubelet = self.start_server_takeover_job("to")
        pod = "to-server-1"
        self.assertTrue(envtest.wait_for(
            lambda: envtest._processes_with(["TRELLIS_JOB=to", "TRELLIS_POD_NAME=" + pod], program="trellis-pserver"),
            10), "no server program in " + pod)
        killed = time.time()
        for pid in envtest._processes_with(["TRELLIS_JOB=to", "TRELLIS_POD_NAME=" + pod], program="trellis-pserver"):
            os.kill(pid, 9)
        killed_took = self.assert_taken_over_and_succeeds("to", kubelet, killed)
        servers = {p["metadata"]["name"]: p["status"].get("phase")
                   for p in self.pods("trellis.io/job-name=to,trellis.io/role=server")}
        self.assertEqual(servers.get("to-server-1"), "Failed", servers)
        print("server 1 of 2 SIGKILLed under Never on the real API server, taken over by server 0's pod: "
              "-> status.world.takenOver %.2f s" % killed_took, flush=True)

    def test_a_server_pod_deleted_under_never_is_taken_over_and_not_made_again(self):
        """A spot node reclaimed, `kubectl delete pod`: under Never the server's agent (SIGTERM)
        tells the scheduler, which has server 0's pod take rank 1 over; the operator neither fails
        the job (PodDeleted) nor makes the pod again, and notes the takeover from the scheduler's
        view."""
        kubelet = self.start_server_takeover_job("tod")
        deleted = time.time()
        self.cp.kubectl("delete", "pod", "tod-server-1", "-n", self.ns, "--wait=false")
        took = self.assert_taken_over_and_succeeds("tod", kubelet, deleted)
        servers = [p["metadata"]["name"] for p in self.pods("trellis.io/job-name=tod,trellis.io/role=server")]
        self.assertNotIn("tod-server-1", servers, "no pod is made again under restartPolicy Never")
        print("server pod 1 of 2 deleted under Never on the real API server, taken over by server 0's pod: "
              "-> status.world.takenOver %.2f s" % took, flush=True)

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
