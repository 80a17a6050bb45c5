#!/usr/bin/python3
"""Gang scheduling and Kueue on a real API server (envtest.py), with the two PodGroup CRDs of
tests/k8s_real/crds/ installed (Volcano scheduling.volcano.sh/v1beta1, scheduler-plugins
scheduling.x-k8s.io/v1alpha1; their fields as upstream, unknown fields pruned) and the
operator running with the chart's RBAC:

- each gang scheduler: the PodGroup is accepted, owned by the job, minMember = every pod, with
  the queue / priority / timeout; every pod carries schedulerName, the group annotation or label
  and the priority class (resolved by the Priority admission plugin); the job still trains to
  Succeeded (the test kubelet runs pods whatever their schedulerName) and the PodGroup is then
  deleted;
- a gang that cannot be placed (the test plays Volcano: its PodGroup condition Unschedulable;
  and kube-scheduler: pods PodScheduled=False) shows in the job's status and Events, and clears
  once the pods run;
- a PodGroup API the cluster does not serve: no pod, the reason in the status, and the job runs
  once the CRD is installed;
- Kueue's cycle on a job labelled kueue.x-k8s.io/queue-name: created suspended -> nothing exists;
  unsuspended -> runs (pods without the Kueue label, the PodGroup); suspended -> every pod and the
  PodGroup freed, Suspended; resumed -> runs again.

Usage: gang_test.py REPO BIN_DIR   (exit 77 without KUBEBUILDER_ASSETS)
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import envtest  # noqa: E402

CRDS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "crds")
VOLCANO = "/apis/scheduling.volcano.sh/v1beta1"
COSCHED = "/apis/scheduling.x-k8s.io/v1alpha1"
PRIORITY_CLASS = "trellis-gang-high"
GANG = 5  # mlp_job: the scheduler, 2 servers, 2 workers
MERGE = "application/merge-patch+json"


def install_crds(cp):
    cp.kubectl("apply", "-f", CRDS)
    for api in (VOLCANO, COSCHED):
        if not envtest.wait_for(lambda: cp.api("GET", api + "/podgroups")[0] == 200, 30):
            raise AssertionError(api + " podgroups not served")


class Gang(envtest.EnvtestCase):
    prefix = "gang"

    @classmethod
    def setUpClass(cls):
        install_crds(cls.cp)
        code, obj = cls.cp.api("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", {
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": PRIORITY_CLASS}, "value": 1000})
        assert code in (201, 409), obj

    # ---- helpers -----------------------------------------------------------------------------------
    def pod_group(self, api, name):
        code, obj = self.cp.api("GET", "%s/namespaces/%s/podgroups/%s" % (api, self.ns, name))
        return obj if code == 200 else None

    def wait_pods(self, n, timeout=60):
        pods = envtest.wait_for(lambda: (lambda p: p if len(p) == n else None)(self.pods()), timeout)
        self.assertTrue(pods, "expected %d pods, have %s" % (n, [p["metadata"]["name"] for p in self.pods()]))
        return pods

    def condition(self, name, type_):
        for c in ((self.job(name) or {}).get("status") or {}).get("conditions", []):
            if c.get("type") == type_:
                return c
        return None

    def wait_condition(self, name, type_, status, timeout=60):
        c = envtest.wait_for(lambda: (lambda c: c if c and c["status"] == status else None)(
            self.condition(name, type_)), timeout)
        self.assertTrue(c, "job %s: condition %s never %s; status %s" % (
            name, type_, status, (self.job(name) or {}).get("status")))
        return c

    def warnings(self, name):
        """The reasons of the Warning Events about `name` (EnvtestCase.events has every type)."""
        items = self.cp.get("/api/v1/namespaces/%s/events" % self.ns)["items"]
        return [e["reason"] for e in items if e["involvedObject"]["name"] == name and e["type"] == "Warning"]

    def patch_job(self, name, patch):
        code, obj = self.cp.api("PATCH", self.job_url(name), patch, MERGE)
        self.assertEqual(code, 200, obj)

    def assert_owned(self, obj, job):
        owners = obj["metadata"].get("ownerReferences", [])
        self.assertEqual(len(owners), 1, owners)
        self.assertEqual((owners[0]["kind"], owners[0]["name"], owners[0]["uid"], owners[0]["controller"]),
                         ("TrainingJob", job["metadata"]["name"], job["metadata"]["uid"], True))

    # ---- the two gang schedulers -------------------------------------------------------------------
    def test_volcano_podgroup_owned_by_the_job_every_pod_joins_and_the_job_succeeds(self):
        self.start_operator()
        self.start_kubelet()
        job = self.create_job(envtest.mlp_job("vj", schedulingPolicy={
            "gangScheduler": "volcano", "queue": "research", "priorityClass": PRIORITY_CLASS}))
        pg = envtest.wait_for(lambda: self.pod_group(VOLCANO, "vj"), 30)
        self.assertTrue(pg, "no Volcano PodGroup vj")
        # Exactly these fields survived the CRD's schema: a misspelled one would be pruned.
        self.assertEqual(pg["spec"], {"minMember": GANG, "queue": "research", "priorityClassName": PRIORITY_CLASS})
        self.assert_owned(pg, job)
        st = self.wait_phase("vj", ("Succeeded", "Failed"), 150)
        self.assertEqual(st["phase"], "Succeeded", st)
        names = set()
        for p in self.pods():  # the workers are kept (cleanPodPolicy Running)
            names.add(p["metadata"]["name"])
            self.assertEqual(p["spec"]["schedulerName"], "volcano")
            self.assertEqual(p["metadata"]["annotations"]["scheduling.k8s.io/group-name"], "vj")
            self.assertEqual(p["spec"]["priorityClassName"], PRIORITY_CLASS)
            self.assertEqual(p["spec"]["priority"], 1000)  # the Priority admission plugin resolved it
        self.assertTrue({"vj-worker-0", "vj-worker-1"} <= names, names)
        # Over: the PodGroup goes, so that it holds no place in Volcano's queue.
        self.assertTrue(envtest.wait_for(lambda: self.pod_group(VOLCANO, "vj") is None, 30),
                        "PodGroup vj still there after the job ended")

    def test_coscheduling_podgroup_owned_by_the_job_every_pod_joins_and_the_job_succeeds(self):
        self.start_operator()
        self.start_kubelet()
        job = self.create_job(envtest.mlp_job("cj", schedulingPolicy={
            "gangScheduler": "scheduler-plugins", "scheduleTimeoutSeconds": 45}))
        pg = envtest.wait_for(lambda: self.pod_group(COSCHED, "cj"), 30)
        self.assertTrue(pg, "no coscheduling PodGroup cj")
        self.assertEqual(pg["spec"], {"minMember": GANG, "scheduleTimeoutSeconds": 45})
        self.assert_owned(pg, job)
        pods = self.wait_pods(GANG)
        for p in pods:
            self.assertEqual(p["spec"]["schedulerName"], "scheduler-plugins-scheduler")
            self.assertEqual(p["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"], "cj")
            self.assertNotIn("priorityClassName", p["spec"])
        st = self.wait_phase("cj", ("Succeeded", "Failed"), 150)
        self.assertEqual(st["phase"], "Succeeded", st)
        self.assertTrue(envtest.wait_for(lambda: self.pod_group(COSCHED, "cj") is None, 30))

    # ---- a gang that waits -------------------------------------------------------------------------
    def test_unschedulable_volcano_gang_shows_in_the_status_until_it_runs(self):
        # No kubelet yet: the pods stay Pending, as on a cluster without room for the gang. The
        # operator reads the PodGroup when it reconciles (events, resync): a short resync here.
        self.start_operator(args=["--resync-seconds", "2"])
        self.create_job(envtest.mlp_job("uj", schedulingPolicy={"gangScheduler": "volcano"}))
        self.assertTrue(envtest.wait_for(lambda: self.pod_group(VOLCANO, "uj"), 30))
        self.wait_pods(GANG)
        # Volcano's verdict, written as Volcano writes it (no status subresource on its CRD).
        msg = "5/5 tasks in gang unschedulable: pod group is not ready, 5 Pending, 5 minAvailable"
        code, obj = self.cp.api("PATCH", "%s/namespaces/%s/podgroups/uj" % (VOLCANO, self.ns), {"status": {
            "phase": "Pending", "conditions": [{"type": "Unschedulable", "status": "True",
                                                "reason": "NotEnoughResources", "message": msg}]}}, MERGE)
        self.assertEqual(code, 200, obj)
        c = self.wait_condition("uj", "Unschedulable", "True")
        self.assertEqual(c["reason"], "PodGroupUnschedulable")
        self.assertEqual(c["message"], "job uj: PodGroup uj: NotEnoughResources: " + msg)
        self.assertEqual(self.job("uj")["status"]["phase"], "Pending")
        self.assertTrue(envtest.wait_for(lambda: "PodGroupUnschedulable" in self.warnings("uj"), 10),
                        self.events("uj"))
        # Room at last: Volcano places the gang (here: the kubelet runs it).
        self.cp.api("PATCH", "%s/namespaces/%s/podgroups/uj" % (VOLCANO, self.ns), {"status": {
            "phase": "Running", "conditions": [{"type": "Unschedulable", "status": "False"}]}}, MERGE)
        self.start_kubelet()
        self.wait_phase("uj", ("Running", "Succeeded"), 90)
        c = self.wait_condition("uj", "Unschedulable", "False")
        self.assertEqual(c["reason"], "PodsScheduled")

    def test_pods_the_scheduler_cannot_place_show_in_the_status(self):
        self.start_operator()
        self.create_job(envtest.mlp_job("pj", schedulingPolicy={"gangScheduler": "scheduler-plugins"}))
        pods = self.wait_pods(GANG)
        # What kube-scheduler (with the coscheduling plugin) writes on a pod it cannot place.
        msg = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
        for p in pods:
            code, obj = self.cp.api("PATCH", "/api/v1/namespaces/%s/pods/%s/status" % (self.ns, p["metadata"]["name"]),
                                    {"status": {"conditions": [{"type": "PodScheduled", "status": "False",
                                                                "reason": "Unschedulable", "message": msg}]}}, MERGE)
            self.assertEqual(code, 200, obj)
        c = envtest.wait_for(lambda: (lambda c: c if c and "5 of 5" in c.get("message", "") else None)(
            self.condition("pj", "Unschedulable")), 60)
        self.assertTrue(c, self.job("pj").get("status"))
        self.assertEqual((c["status"], c["reason"]), ("True", "PodsUnschedulable"))
        self.assertTrue(c["message"].startswith("job pj: 5 of 5 pods cannot be scheduled; "), c["message"])
        self.assertTrue(c["message"].endswith(": " + msg), c["message"])
        self.assertEqual(self.job("pj")["status"]["phase"], "Pending")

    def test_a_podgroup_api_the_cluster_lacks_creates_no_pod_and_says_why(self):
        self.start_operator(args=["--resync-seconds", "2"])
        self.cp.kubectl("delete", "crd", "podgroups.scheduling.volcano.sh", "--wait=true")
        try:
            self.assertTrue(envtest.wait_for(lambda: self.cp.api("GET", VOLCANO + "/podgroups")[0] == 404, 30))
            self.create_job(envtest.mlp_job("mj", schedulingPolicy={"gangScheduler": "volcano"}))
            c = self.wait_condition("mj", "Unschedulable", "True")
            self.assertEqual(c["reason"], "PodGroupNotCreated")
            self.assertIn("cannot create PodGroup mj (scheduling.volcano.sh/v1beta1) (the API server does not "
                          "serve it: is Volcano installed?)", c["message"])
            time.sleep(3)  # more reconciles (resync 2 s): still no pod
            self.assertEqual(self.pods(), [])
            self.assertEqual(self.job("mj")["status"]["phase"], "Pending")
        finally:
            install_crds(self.cp)
        # Volcano installed: the next resync creates the PodGroup, then the pods.
        self.start_kubelet()
        self.assertTrue(envtest.wait_for(lambda: self.pod_group(VOLCANO, "mj"), 30))
        st = self.wait_phase("mj", ("Succeeded", "Failed"), 150)
        self.assertEqual(st["phase"], "Succeeded", st)
        self.assertEqual(self.condition("mj", "Unschedulable")["status"], "False")

    # ---- Kueue -------------------------------------------------------------------------------------
    def test_kueue_created_suspended_runs_when_admitted_frees_everything_when_suspended_and_resumes(self):
        self.start_operator()
        self.start_kubelet()
        j = envtest.mlp_job("kj", epochs=100000, suspend=True, activeDeadlineSeconds=600,
                            schedulingPolicy={"gangScheduler": "volcano"})
        j["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-a"}
        self.create_job(j)
        self.wait_phase("kj", "Suspended", 30)
        time.sleep(2)  # had anything been created, it would be there by now
        self.assertEqual(self.pods(), [])
        for path in ("/api/v1/namespaces/%s/secrets/kj-token", "/api/v1/namespaces/%s/configmaps/kj-config",
                     "/api/v1/namespaces/%s/services/kj-scheduler", VOLCANO + "/namespaces/%s/podgroups/kj"):
            self.assertEqual(self.cp.api("GET", path % self.ns)[0], 404, path % self.ns)

        def admitted(round_):
            self.patch_job("kj", {"spec": {"runPolicy": {"suspend": False}}})  # what Kueue does on admission
            self.wait_phase("kj", "Running", 90)
            pods = self.wait_pods(GANG)
            for p in pods:
                self.assertNotIn("kueue.x-k8s.io/queue-name", p["metadata"]["labels"], round_)
                self.assertEqual(p["metadata"]["annotations"]["scheduling.k8s.io/group-name"], "kj")
            pg = self.pod_group(VOLCANO, "kj")
            self.assertTrue(pg, round_)
            self.assertEqual(pg["spec"]["minMember"], GANG)
            return {p["metadata"]["uid"] for p in pods}

        def evicted(round_):
            self.patch_job("kj", {"spec": {"runPolicy": {"suspend": True}}})  # preemption / eviction
            self.wait_phase("kj", "Suspended", 30)
            self.assertTrue(envtest.wait_for(lambda: self.pods() == [], 30),
                            "%s: pods left %s" % (round_, [p["metadata"]["name"] for p in self.pods()]))
            self.assertTrue(envtest.wait_for(lambda: self.pod_group(VOLCANO, "kj") is None, 30), round_)
            self.assertEqual(self.condition("kj", "Suspended")["status"], "True")
            # What a Kueue integration reads as "still active": nothing once the pods are gone.
            rs = envtest.wait_for(lambda: (lambda r: r if r and all(
                r.get(k, {}).get("active", 0) == 0 for k in ("scheduler", "server", "worker")) else None)(
                self.job("kj")["status"].get("replicaStatuses")), 30)
            self.assertTrue(rs, "%s: %s" % (round_, self.job("kj")["status"]))

        first = admitted("first admission")
        evicted("first eviction")
        second = admitted("second admission")
        self.assertFalse(first & second, "the resumed job runs new pods")
        self.assertEqual(self.job("kj")["metadata"]["labels"]["kueue.x-k8s.io/queue-name"], "team-a")
        evicted("second eviction")


if __name__ == "__main__":
    envtest.main(Gang)
