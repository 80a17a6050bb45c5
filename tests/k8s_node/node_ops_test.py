#!/usr/bin/python3
"""What a platform team does to running jobs on a real node (node.py), with the image `make image`
builds and the chart `helm install`ed as a user installs it (default values, image.pullPolicy=Never):

- disruptions mid-training, one after another in one job: a worker pod and a server pod evicted
  through the Eviction API (policy/v1, what `kubectl drain` uses), the scheduler pod deleted, the
  operator pod evicted; every member back, the job Succeeded with its target reached, no restart
  counted against it;
- suspend (what Kueue does to preempt) -> rank 0's exit checkpoint written onto a
  PersistentVolumeClaim (spec.checkpoint.volume; a local PersistentVolume), then every pod gone, `Suspended`; resume -> pods back, the
  job resumed from exactly that checkpoint (status.resumedFrom) and Succeeded;
- ttlSecondsAfterFinished -> the finished job and all it owns deleted;
- what keeps a job from running or makes it fail, in its status and events in words a user can
  act on: a job that does not fit the node (`Unschedulable`), an image that cannot be pulled, a
  command that does not exist, a worker killed for memory (OOMKilled, with its limit), a program
  restarted inside its pod (counted, with an Event), and no zombie left by a program's children;
- a real Prometheus (Debian's) beside the cluster discovering every process through the operator
  (HTTP service discovery from the pods it watches: Debian's build has no Kubernetes discovery)
  with the scrape configuration docs/metrics.md gives, scraping every process of a running job
  and the operator, and every dashboard query returning data for it.

Usage: node_ops_test.py REPO BUILD_DIR   (exit 77 when a piece is missing, the image included)
"""
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import node  # noqa: E402
import envtest  # noqa: E402
from envtest_procs import wait_for  # noqa: E402

RELEASE, CHART_NS = node.RELEASE, node.CHART_NS


def mlp_job(name, epochs=3, samples=32768):
    """manifests/examples/mlp.yaml as shipped, renamed, with its training length set."""
    with open(os.path.join(envtest.REPO, "manifests/examples/mlp.yaml")) as f:
        y = f.read()
    y = re.sub(r"(?m)^  name: mlp$", "  name: " + name, y)
    y = y.replace('--epochs, "3"', '--epochs, "%d"' % epochs).replace('"32768"', '"%d"' % samples)
    return y


class Ops(node.TrellisCase):
    prefix = "ops"

    def evict(self, pod, ns=None):
        """The Eviction API (policy/v1), as `kubectl drain` evicts."""
        ns = ns or self.ns
        code, obj = self.cp.api("POST", "/api/v1/namespaces/%s/pods/%s/eviction" % (ns, pod), {
            "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": ns}})
        self.assertIn(code, (200, 201), "eviction of %s/%s refused: %s" % (ns, pod, obj))

    def replaced(self, pod, old_uid, timeout, ns=None):
        """Waits until pod `pod` is a new one (uid) and Running; -> seconds waited."""
        t = time.time()

        def new_running():
            p = self.pod_obj(pod, ns)
            return p and p["metadata"]["uid"] != old_uid and p["status"].get("phase") == "Running"
        self.assertTrue(wait_for(new_running, timeout, 0.2), "%s not replaced and Running after %d s: %s" % (
            pod, timeout, json.dumps((self.pod_obj(pod, ns) or {}).get("status"))))
        return time.time() - t

    def advances(self, job, past, timeout):
        """Waits until the job's status step passes `past`; -> seconds waited."""
        t = time.time()
        self.assertTrue(wait_for(lambda: self.step(job) > past, timeout, 0.2),
                        "job %s: step stuck at %d for %d s" % (job, self.step(job), timeout))
        return time.time() - t

    # ---- disruptions ------------------------------------------------------------------------------
    def test_1_evictions_and_deletions_mid_training(self):
        job = "ops"
        self.apply(mlp_job(job, epochs=4))
        self.wait_phase(job, "Running", 240)
        self.assertTrue(wait_for(lambda: self.step(job) > 0, 240, 0.3), "no progress in the job's status")
        pods = {p["metadata"]["name"]: p for p in self.pods()}
        # Job pods need no API access and run hardened (finding 5): no token, no privilege escalation.
        for name, p in pods.items():
            self.assertIs(p["spec"].get("automountServiceAccountToken"), False, name)
            for c in p["spec"]["containers"]:
                self.assertIs((c.get("securityContext") or {}).get("allowPrivilegeEscalation"), False, name)
        timeline = []

        # A worker evicted (a drain): its replacement rejoins under the same rank.
        at = self.step(job)
        uid = pods[job + "-worker-1"]["metadata"]["uid"]
        self.evict(job + "-worker-1")
        back = self.replaced(job + "-worker-1", uid, 180)
        self.assertTrue(wait_for(lambda: "rejoined the running job after step" in self.logs(job + "-worker-1"),
                                 180, 1), "worker 1's replacement did not rejoin")
        timeline.append("worker-1 evicted at step %d, replacement Running %.1f s later" % (at, back))
        at = self.step(job)
        timeline.append("step %d advanced %.1f s later" % (at, self.advances(job, at, 180)))

        # A server evicted: the replacement takes its shards back; training goes on.
        at = self.step(job)
        uid = self.pod_obj(job + "-server-0")["metadata"]["uid"]
        self.evict(job + "-server-0")
        back = self.replaced(job + "-server-0", uid, 180)
        timeline.append("server-0 evicted at step %d, replacement Running %.1f s later, step advanced %.1f s "
                        "after that" % (at, back, self.advances(job, at, 180)))

        # The scheduler pod deleted: the replacement has a new IP; every member finds it (finding 3).
        at = self.step(job)
        uid = self.pod_obj(job + "-scheduler")["metadata"]["uid"]
        self.cp.kubectl("delete", "pod", job + "-scheduler", "-n", self.ns, "--wait=false")
        back = self.replaced(job + "-scheduler", uid, 180)
        moved = self.advances(job, at, 180)
        timeline.append("scheduler deleted at step %d, replacement Running %.1f s later, step advanced %.1f s "
                        "after that" % (at, back, moved))
        # Every member found the replacement within seconds of its start (finding 3: 11-31 s before
        # the client replaced a failing channel; the scheduler's own window is 30 s).
        # The step can advance before the scheduler has every member back (training needs no
        # scheduler between barriers), so its log line is awaited, not read once.
        back_re = r"all 2 servers and 2 workers are back after ([0-9.]+) s"
        wait_for(lambda: re.search(back_re, self.logs(job + "-scheduler")), 60, 1)
        sched_log = self.logs(job + "-scheduler")
        m = re.search(back_re, sched_log)
        self.assertTrue(m, "the new scheduler did not recover the job:\n" + sched_log[-3000:])
        # Within the scheduler's recovery window (30 s). Seen: 1-3 s, and once 20.4 s, when the
        # one member whose pod was not touched (server 1) took 20 s to find the new scheduler.
        self.assertLess(float(m.group(1)), 30.0, sched_log[-3000:])
        timeline.append("the new scheduler had every member back %.1f s after it started" % float(m.group(1)))

        # The operator evicted: the Deployment's new pod takes the lease and the status goes on.
        op = [p for p in self.cp.get("/api/v1/namespaces/%s/pods?labelSelector=app.kubernetes.io/instance=%s"
                                     % (CHART_NS, RELEASE))["items"]]
        self.assertEqual(len(op), 1, [p["metadata"]["name"] for p in op])
        at = self.step(job)
        self.evict(op[0]["metadata"]["name"], CHART_NS)
        timeline.append("operator evicted at step %d, the status moved on %.1f s later" % (
            at, self.advances(job, at + 1, 240)))

        st = self.wait_phase(job, ("Succeeded", "Failed"), 1200)
        self.assertEqual(st["phase"], "Succeeded", json.dumps(st))
        self.assertEqual(st["restarts"], 0, st)
        self.assertRegex(self.logs(job + "-worker-0"), r"RESULT: test accuracy .* -- reached")
        print("ops: one job through four disruptions -> Succeeded:\n  " + "\n  ".join(timeline), flush=True)

    # ---- suspend, resume, TTL ---------------------------------------------------------------------
    def suspend(self, job, value):
        self.cp.kubectl("patch", "tj", job, "-n", self.ns, "--type=merge",
                        "-p", json.dumps({"spec": {"runPolicy": {"suspend": value}}}))

    def test_3_suspend_resume_then_ttl_deletes_everything(self):
        job = "susp"
        # The checkpoints on a real volume: a hostPath directory of the node, writable by the
        # image's user (1000).
        host_ckpt = os.path.join(self.cp.dir, "ckpt-" + self.ns)
        os.makedirs(host_ckpt, exist_ok=True)
        os.chmod(host_ckpt, 0o777)
        y = mlp_job(job, epochs=3, samples=16384).replace("ttlSecondsAfterFinished: 3600", "ttlSecondsAfterFinished: 5")
        self.assertIn("ttlSecondsAfterFinished: 5", y)
        # What a platform team hands a job: a PersistentVolumeClaim, bound here to a local
        # PersistentVolume on that directory (pre-bound both ways: no provisioner on this node;
        # the controller manager's binder marks them Bound).
        pv = "ckpt-" + self.ns
        self.apply({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
                    "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                             "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "trellis-test",
                             "hostPath": {"path": host_ckpt, "type": "Directory"},
                             "claimRef": {"namespace": self.ns, "name": "ckpt"}}})
        self.addCleanup(self.cp.kubectl, "delete", "pv", pv, "--wait=false", check=False)
        self.apply({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "ckpt"},
                    "spec": {"storageClassName": "trellis-test", "accessModes": ["ReadWriteOnce"],
                             "volumeName": pv, "resources": {"requests": {"storage": "1Gi"}}}})
        self.assertTrue(wait_for(lambda: (self.cp.api("GET", "/api/v1/namespaces/%s/persistentvolumeclaims/ckpt" %
                                                      self.ns)[1].get("status") or {}).get("phase") == "Bound", 60, 0.5),
                        "the claim was not bound")
        y = y.replace("  sliceBytes: 1Mi\n", "  sliceBytes: 1Mi\n  checkpoint:\n    path: /ckpt\n    intervalSteps: 32\n"
                      "    volume:\n      persistentVolumeClaim: {claimName: ckpt}\n")
        self.assertIn("persistentVolumeClaim", y)
        self.apply(y)
        self.wait_phase(job, "Running", 240)
        self.assertTrue(wait_for(lambda: self.step(job) > 0, 240, 0.3), "no progress in the job's status")
        t = time.time()
        self.suspend(job, True)   # what Kueue does to preempt
        self.wait_phase(job, "Suspended", 60)
        self.assertTrue(wait_for(lambda: not self.pods(), 120, 0.5), "pods left while suspended: %s" % [
            p["metadata"]["name"] for p in self.pods()])
        t_gone = time.time() - t
        # The exit checkpoint came first, onto the volume.
        st = self.job(job)["status"]
        stopping = [c for c in st["conditions"] if c["type"] == "Stopping"][0]
        self.assertEqual((stopping["status"], stopping["reason"]), ("False", "ExitCheckpointWritten"), json.dumps(st))
        exit_step = st["checkpoint"]["step"]
        self.assertTrue(st["checkpoint"]["onExit"], st)
        self.assertEqual(st["checkpoint"]["path"], "/ckpt/model-%012d.ckpt" % exit_step)
        self.assertIn("model-%012d.ckpt" % exit_step, os.listdir(host_ckpt))
        time.sleep(2)
        self.assertEqual(self.pods(), [], "a suspended job's pods came back")
        self.suspend(job, False)
        t = time.time()
        self.wait_phase(job, "Running", 240)
        t_back = time.time() - t
        st = self.wait_phase(job, ("Succeeded", "Failed"), 900)
        self.assertEqual(st["phase"], "Succeeded", json.dumps(st))
        seen = self.phases[job]
        self.assertIn("Suspended", seen)
        self.assertEqual(seen[seen.index("Suspended"):], ["Suspended", "Pending", "Running", "Succeeded"], seen)
        self.assertRegex(self.logs(job + "-worker-0"), r"RESULT: test accuracy .* -- reached")
        self.assertEqual(st["resumedFrom"]["step"], exit_step, json.dumps(st))
        self.assertTrue(any("restored step %d from /ckpt/model-%012d.ckpt" % (exit_step, exit_step) in
                            self.logs(job + "-worker-%d" % i) for i in (0, 1)), "no worker restored the exit checkpoint")
        # A finished job's progress is its end, not a running job's last sample (finding 5).
        progress = st.get("progress") or {}
        self.assertEqual(progress.get("step"), progress.get("totalSteps"), progress)
        self.assertNotIn("etaSeconds", progress)
        self.assertNotIn("samplesPerSecond", progress)
        # ttlSecondsAfterFinished: the job and everything it owns deleted (by the operator, then by
        # the garbage collector through the owner references).
        t = time.time()

        self.assertTrue(wait_for(lambda: self.job(job) is None and not self.pods() and not self.owned_left(job), 120,
                                 0.5), "left %ds after the end with a 5 s TTL: %s" % (
            time.time() - t, self.cp.kubectl("get", "tj,pods,svc,cm,secret", "-n", self.ns, check=False).stdout))
        print("ops: suspend -> exit checkpoint of step %d on the PersistentVolumeClaim, no pod %.1f s later; resume -> "
              "Running %.1f s later, resumed from step %d -> Succeeded; ttl 5 s -> job and all it owns gone %.1f s "
              "after the end" % (exit_step, t_gone, t_back, exit_step, time.time() - t), flush=True)

    # ---- Prometheus -------------------------------------------------------------------------------
    def prom_query(self, address, expr):
        """A PromQL query from inside the node's namespace (where Prometheus and the pods are)."""
        code = ("import json,sys,urllib.parse,urllib.request;"
                "u='http://%s/api/v1/query?'+urllib.parse.urlencode({'query':sys.argv[1]});"
                "print(urllib.request.urlopen(u,timeout=10).read().decode())" % address)
        r = self.cp.in_ns("/usr/bin/python3", "-c", code, expr, check=False, timeout=30)
        try:
            return json.loads(r.stdout)
        except ValueError:
            return {"status": "error", "error": r.stdout + r.stderr}

    def test_4_prometheus_discovers_and_scrapes_every_process(self):
        import yaml
        sys.path.insert(0, os.path.join(envtest.REPO, "tests", "integration", "metrics"))
        import prometheus_e2e_test as e2e
        job = "prom"
        # Small and long: it trains until the test deletes it (as the local end-to-end test's job).
        self.apply({"apiVersion": "trellis.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": job},
                    "spec": {"servers": {"replicas": 2, "resources": {"requests": {"cpu": "50m"}}},
                             "workers": {"replicas": 2, "command": ["trellis-mlp"],
                                         "args": ["--layers", "16,128,64,10", "--latent-dim", "8",
                                                  "--teacher-hidden", "16", "--epochs", "100000", "--batch", "32",
                                                  "--lr", "0.02", "--train-samples", "4096", "--test-samples", "500"],
                                         "resources": {"requests": {"cpu": "50m"}}},
                             "sliceBytes": 16384,
                             "runPolicy": {"restartPolicy": "Never", "activeDeadlineSeconds": 900}}})
        # The scrape configuration docs/metrics.md gives, as a user pastes it (Debian's Prometheus
        # has no Kubernetes discovery: it discovers through the operator). This Prometheus runs on
        # the node, outside the cluster's DNS and without a route to Service addresses: the
        # Service's name becomes the pod address behind it; it scrapes every 2 s to be quick.
        with open(os.path.join(envtest.REPO, "docs", "metrics.md")) as f:
            blocks = re.findall(r"```yaml\n(.*?)```", f.read(), re.S)
        documented = [b for b in blocks if "http_sd_configs" in b]
        self.assertEqual(len(documented), 1, "docs/metrics.md: one http_sd_configs block")
        cfg = yaml.safe_load(documented[0])
        sc = cfg["scrape_configs"][0]
        sc["scrape_interval"] = "2s"
        svc = "%s-operator-metrics" % RELEASE
        def endpoint():
            eps = self.cp.get("/api/v1/namespaces/%s/endpoints/%s" % (CHART_NS, svc))
            return [a["ip"] for sub in eps.get("subsets") or [] for a in sub.get("addresses") or []]
        self.assertTrue(wait_for(endpoint, 60, 0.5), "the operator's metrics Service has no ready endpoint")
        ip = endpoint()[0]
        for sd in sc["http_sd_configs"]:
            self.assertIn("%s.%s.svc:" % (svc, CHART_NS), sd["url"])
            sd["url"] = sd["url"].replace("%s.%s.svc" % (svc, CHART_NS), ip)
            sd["refresh_interval"] = "2s"
        d = os.path.join(self.cp.dir, "prometheus")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "prometheus.yml"), "w") as f:
            yaml.safe_dump(cfg, f)
        address = "%s:%d" % (node.NODE_IP, 9090)
        prom = self.cp.spawn("prometheus", ["prometheus", "--config.file=" + os.path.join(d, "prometheus.yml"),
                                            "--storage.tsdb.path=" + os.path.join(d, "data"),
                                            "--web.listen-address=" + address, "--log.level=warn"])
        try:
            self.wait_phase(job, "Running", 240)
            expected = 1 + 2 * 2 + 2 * 2 + 1   # scheduler, program + agent per server and worker, operator
            e2e.VARIABLES["$job"] = job

            def scraped_enough():
                r = self.prom_query(address, 'count(up == 1) >= %d and min(count_over_time(up[1m])) >= 5 and '
                                             'sum(trellis_worker_steps_total) - sum(trellis_worker_steps_total '
                                             'offset 4s) > 0' % expected)
                return r.get("status") == "success" and r["data"]["result"]
            if not wait_for(scraped_enough, 240, 1):
                self.fail("not every process up and stepping in Prometheus: %s\n%s" % (
                    json.dumps(self.prom_query(address, "up")), prom.text()[-3000:]))
            up = self.prom_query(address, "up")["data"]["result"]
            ups = sorted("%s %s" % (r["metric"].get("pod"), r["metric"].get("role")) for r in up)
            self.assertEqual(len(up), expected, ups)
            failures = []
            queries = e2e.dashboard_queries()
            for dash, title, expr in queries:
                q = e2e.substitute(expr)
                r = self.prom_query(address, q)
                if r.get("status") != "success":
                    failures.append("%s / %s: %s: error %s" % (dash, title, q, r.get("error")))
                elif not r["data"]["result"]:
                    failures.append("%s / %s: %s: no series" % (dash, title, q))
            self.assertEqual(failures, [], "\n".join(failures))
            print("ops: Prometheus with docs/metrics.md's http_sd_configs: %d targets up (%s); %d dashboard "
                  "queries all with data" % (len(up), ", ".join(ups), len(queries)), flush=True)
        finally:
            prom.stop(timeout=10)
            self.cp.procs.remove(prom)
            self.cp.by_name.pop("prometheus", None)
            self.cp.kubectl("delete", "tj", job, "-n", self.ns, "--wait=false")

    # ---- what keeps a job from running, or makes it fail -------------------------------------------
    def small_job(self, name, command, image=None, memory_limit=None, cpu="20m", **run_policy):
        """One server, one worker running `command`; small requests (several such jobs share the node)."""
        rp = {"restartPolicy": "OnFailure", "backoffLimit": 2, "activeDeadlineSeconds": 600}
        rp.update(run_policy)
        res = {"requests": {"cpu": cpu, "memory": "64Mi"}}
        if memory_limit:
            res["limits"] = {"memory": memory_limit}
        spec = {"servers": {"replicas": 1, "resources": {"requests": {"cpu": "20m", "memory": "64Mi"}}},
                "workers": {"replicas": 1, "command": command, "resources": res}, "runPolicy": rp}
        if image:
            spec["image"] = image
        return {"apiVersion": "trellis.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": name},
                "spec": spec}

    def test_2_what_stops_a_job_is_named_in_its_status(self):
        # Five jobs at once, each kept from running or made to fail in its own way by the real node.
        mark = "/tmp/started-once"
        # Fails on its first start leaving an orphan behind (a shell's background child, as
        # DataLoader workers are), then runs: the agent restarts it inside the pod; PID 1 reaps.
        flaky = ("if [ ! -e %s ]; then touch %s; (sleep 0.2 &); (sleep 0.2 &); exit 1; fi; "
                 "(sleep 0.2 &); sleep 25" % (mark, mark))
        # Grows past its 128Mi limit (a shell variable of ~400 MB).
        hog = "x=$(head -c 400000000 /dev/zero | tr '\\0' a); echo ${#x}"
        jobs = {
            "unfit": self.small_job("unfit", ["trellis-mlp"], cpu="64"),
            "pull": self.small_job("pull", ["trellis-mlp"], image="trellis.invalid/nope:1"),
            "nocmd": self.small_job("nocmd", ["/no/such/train"]),
            "oom": self.small_job("oom", ["/bin/sh", "-c", hog], memory_limit="128Mi"),
            "inpod": self.small_job("inpod", ["/bin/sh", "-c", flaky]),
        }
        for obj in jobs.values():
            self.apply(obj)
        t0 = time.time()
        found = {}

        # A job that does not fit the node: Pending, condition Unschedulable with the scheduler's words.
        def unfit():
            c = self.condition("unfit", "Unschedulable")
            return c if c and c["status"] == "True" else None
        c = wait_for(unfit, 120, 0.5)
        self.assertTrue(c, self.status("unfit"))
        self.assertEqual(c["reason"], "PodsUnschedulable", c)
        self.assertIn("Insufficient cpu", c["message"])
        self.assertEqual(self.status("unfit").get("phase"), "Pending")
        found["unfit"] = c["message"]

        # An image that cannot be pulled: CannotStart naming the image.
        def pull():
            c = self.condition("pull", "CannotStart")
            return c if c and c["status"] == "True" else None
        c = wait_for(pull, 180, 0.5)
        self.assertTrue(c, self.status("pull"))
        self.assertIn(c["reason"], ("ErrImagePull", "ImagePullBackOff"), c)
        self.assertIn("trellis.invalid/nope:1", c["message"])
        self.assertTrue(self.event_messages("pull", c["reason"]), self.events("pull"))
        found["pull"] = c["message"]

        # A command that does not exist: Failed, CommandNotFound, the command named, no pod recreated.
        st = self.wait_phase("nocmd", ("Failed", "Succeeded"), 240)
        failed = self.condition("nocmd", "Failed")
        self.assertEqual(failed["reason"], "CommandNotFound", failed)
        self.assertIn("command not found: /no/such/train", failed["message"])
        self.assertNotIn("PodRestarted", self.events("nocmd"))
        found["nocmd"] = failed["message"]

        # A worker over its memory limit: the status and an Event name the OOM kill and the limit.
        st = self.wait_phase("oom", ("Failed", "Succeeded"), 300)
        self.assertEqual(st["phase"], "Failed", st)
        failed = self.condition("oom", "Failed")
        self.assertEqual(failed["reason"], "OOMKilled", failed)
        self.assertIn("memory limit 128Mi", failed["message"])
        self.assertIn("OOMKilled", st.get("firstFailure", ""), st)
        self.assertTrue(any("128Mi" in m for m in self.event_messages("oom", "OOMKilled")), self.events("oom"))
        found["oom"] = failed["message"]

        # A program restarted inside its pod: counted, with an Event; the orphans it left reaped.
        def counted():
            w = self.status("inpod").get("replicaStatuses", {}).get("worker", {})
            return w if w.get("programRestarts", 0) >= 1 else None
        self.assertTrue(wait_for(counted, 240, 0.5), self.status("inpod"))
        self.assertTrue(wait_for(lambda: self.event_messages("inpod", "ProgramRestarted"), 30), self.events("inpod"))
        time.sleep(1)   # the second start's orphan ends too
        ps = self.exec_("inpod-worker-0", "/bin/sh", "-c",
                        "for f in /proc/[0-9]*/stat; do read -r l < $f && echo \"$l\"; done").stdout
        zombies = [l for l in ps.splitlines() if re.match(r"^\d+ \(.*\) Z ", l)]
        self.assertEqual(zombies, [], "zombies in the worker's container:\n" + ps)
        st = self.wait_phase("inpod", ("Succeeded", "Failed"), 120)
        self.assertEqual(st["phase"], "Succeeded", st)
        self.assertGreaterEqual(st["replicaStatuses"]["worker"]["restarts"], 1, st)
        found["inpod"] = self.event_messages("inpod", "ProgramRestarted")[0]
        print("ops: five jobs kept from running or failed, %.1f s in all; their status says:\n  %s" % (
            time.time() - t0, "\n  ".join("%s: %s" % kv for kv in found.items())), flush=True)
        for name in jobs:
            self.cp.kubectl("delete", "tj", name, "-n", self.ns, "--wait=false")


if __name__ == "__main__":
    node.main_trellis(Ops)
