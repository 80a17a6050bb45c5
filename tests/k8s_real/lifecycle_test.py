#!/usr/bin/python3
"""The TrainingJob lifecycle on a real API server (envtest.py), as OpenShift runs it: the admission
plugin OwnerReferencesPermissionEnforcement on, so every owned object the operator creates with
blockOwnerDeletion needs `update` on trainingjobs/finalizers in the chart's ClusterRole.

Create -> Running -> Succeeded -> TTL (the garbage collector takes the owned objects); restart
policies and backoffLimit; activeDeadlineSeconds; suspend/resume; the operator restarted mid-job
(no pod recreated); two operator replicas with leader election (one reconciles, the other takes
over when it dies); an invalid spec refused by the CRD schema or failed by the operator. Workers are small shell programs under the real agent, scheduler and pserver
(the MLP itself trains in smoke_test.py).

Usage: lifecycle_test.py REPO BIN_DIR   (exit 77 without KUBEBUILDER_ASSETS)
"""
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import envtest  # noqa: E402
from envtest import wait_for  # noqa: E402

PLUGINS = ["OwnerReferencesPermissionEnforcement"]


def shell_job(name, script, servers=1, workers=1, **run_policy):
    """A job whose workers run `sh -c script` under the agent (TRELLIS_RANK is set)."""
    rp = {"restartPolicy": "Never"}
    rp.update(run_policy)
    return {"apiVersion": "trellis.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": name},
            "spec": {"servers": {"replicas": servers},
                     "workers": {"replicas": workers, "command": ["/bin/sh", "-c", script]},
                     "runPolicy": rp}}


class Lifecycle(envtest.EnvtestCase):
    prefix = "life"

    def owned(self, name):
        """The job's owned objects present now: {"Pod": [...], "Service": [...], ...}."""
        out = {}
        for kind, path in (("Pod", "pods"), ("Service", "services"), ("Secret", "secrets"),
                           ("ConfigMap", "configmaps")):
            for o in self.cp.get("/api/v1/namespaces/%s/%s" % (self.ns, path))["items"]:
                if any(r.get("kind") == "TrainingJob" and r.get("name") == name
                       for r in o["metadata"].get("ownerReferences", [])):
                    out.setdefault(kind, []).append(o["metadata"]["name"])
        return {k: sorted(v) for k, v in out.items()}

    def uids(self, selector):
        return {p["metadata"]["name"]: p["metadata"]["uid"] for p in self.pods(selector)}

    def test_1_charts_rbac_may_own_objects_under_owner_reference_enforcement(self):
        # What the admission plugin asks the authorizer for the chart's ServiceAccount.
        review = self.cp.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": "system:serviceaccount:%s:%s" % (envtest.CHART_NS, envtest.CHART_SA),
                     "groups": ["system:serviceaccounts"],
                     "resourceAttributes": {"group": "trellis.io", "resource": "trainingjobs",
                                            "subresource": "finalizers", "verb": "update",
                                            "namespace": self.ns}}})
        self.assertTrue(review["status"].get("allowed"), review["status"])
        # And the operator, with exactly that RBAC, gets every owned object created.
        self.start_operator()
        self.create_job(shell_job("owned", "sleep 600"))
        want = {"Pod": ["owned-scheduler", "owned-server-0", "owned-worker-0"], "Service": ["owned-scheduler"],
                "Secret": ["owned-token"], "ConfigMap": ["owned-config"]}
        got = wait_for(lambda: self.owned("owned") == want and self.owned("owned"), 30)
        self.assertEqual(got, want, "owned objects refused? operator log:\n" + self._procs[0].text()[-2000:])
        pod = self.cp.get("/api/v1/namespaces/%s/pods/owned-worker-0" % self.ns)
        self.assertTrue(pod["metadata"]["ownerReferences"][0]["blockOwnerDeletion"])

    def test_2_create_run_succeed_then_ttl_deletes_job_and_gc_takes_owned_objects(self):
        # Watches the server ends every 2 s: each resumes from its resourceVersion, nothing missed.
        op = self.start_operator(args=["--watch-timeout-seconds", "2"])
        self.start_kubelet()
        t0 = time.time()
        # The TTL counts from status.completionTime, the workers' end (whole seconds): the operator
        # may see the end a second or two late on a loaded machine, so 3 s left a window too short
        # to see Succeeded before the job was gone (it failed so once in make test).
        self.create_job(shell_job("life", "sleep 2", workers=2, ttlSecondsAfterFinished=10))
        self.wait_phase("life", ("Running", "Succeeded"), 60)
        t_run = time.time()
        st = self.wait_phase("life", ("Succeeded", "Failed"), 60)
        t_done = time.time()
        self.assertEqual(st["phase"], "Succeeded", st)
        self.assertIn("JobRunning", self.events("life"))  # a phase may pass between two polls; its Event stays
        self.assertEqual(st["replicaStatuses"]["worker"]["succeeded"], 2, st)
        self.assertEqual(st["workers"], "2/2")
        self.assertTrue(st.get("startTime") and st.get("completionTime"), st)
        self.assertIn("JobSucceeded", self.events("life"))
        # TTL: the job is deleted, and the garbage collector deletes what it owned.
        self.assertTrue(wait_for(lambda: self.job("life") is None, 30), "the TTL did not delete the job")
        t_ttl = time.time()
        self.assertTrue(wait_for(lambda: self.owned("life") == {}, 60), self.owned("life"))
        self.assertNotRegex(op.text(), r"(?m)^[EW] ")  # no error or warning (a refused resourceVersion, say)
        print("lifecycle timings (real API server, shell workers): apply -> Running %.1f s, -> Succeeded %.1f s, "
              "-> deleted by TTL (10 s) %.1f s" % (t_run - t0, t_done - t0, t_ttl - t0), flush=True)

    def test_3_restart_policies_and_backoff_limit(self):
        self.start_operator()
        kubelet = self.start_kubelet()
        marker = os.path.join(kubelet.work_dir, "failed-once")
        # The agent restarts a failing program in its pod under OnFailure; a pod that fails after
        # that is recreated by the operator until backoffLimit.
        self.create_job(shell_job("never", "exit 3", restartPolicy="Never"))
        self.create_job(shell_job("exitcode", "exit 3", restartPolicy="ExitCode"))
        self.create_job(shell_job("onfailure", "[ -e %s ] && exit 0; touch %s; exit 1" % (marker, marker),
                                  restartPolicy="OnFailure", backoffLimit=2))
        # A server that keeps failing: its pod is recreated until backoffLimit (a server's exit does
        # not fail the job at its scheduler).
        backoff_job = shell_job("backoff", "sleep 60", restartPolicy="OnFailure", backoffLimit=1)
        backoff_job["spec"]["servers"]["command"] = ["/bin/sh", "-c", "exit 1"]
        self.create_job(backoff_job)
        # A worker that fails for good fails the job at its scheduler: no pod could join it any
        # more, so none is recreated (its agent says so in its termination message).
        self.create_job(shell_job("workerfail", "exit 1", restartPolicy="OnFailure", backoffLimit=1))
        never = self.wait_phase("never", ("Succeeded", "Failed"), 90)
        self.assertEqual(never["phase"], "Failed")
        failed = [c for c in never["conditions"] if c["type"] == "Failed"][0]
        self.assertEqual(failed["reason"], "PodFailed")
        self.assertIn("exit code 3", failed["message"])
        self.assertIn("restartPolicy Never", failed["message"])
        exitcode = self.wait_phase("exitcode", ("Succeeded", "Failed"), 90)
        self.assertEqual(exitcode["phase"], "Failed")
        self.assertIn("restartPolicy ExitCode", [c for c in exitcode["conditions"] if c["type"] == "Failed"][0]["message"])
        onfailure = self.wait_phase("onfailure", ("Succeeded", "Failed"), 90)
        self.assertEqual(onfailure["phase"], "Succeeded", onfailure)
        backoff = self.wait_phase("backoff", ("Succeeded", "Failed"), 120)
        self.assertEqual(backoff["phase"], "Failed", backoff)
        self.assertEqual([c for c in backoff["conditions"] if c["type"] == "Failed"][0]["reason"],
                         "BackoffLimitExceeded")
        self.assertEqual(backoff["restarts"], 1)
        self.assertIn("PodRestarted", self.events("backoff"))  # it went through Restarting
        # The failed pod is kept for its logs, the rest cleaned up (cleanPodPolicy Running).
        self.assertTrue(wait_for(lambda: sorted(self.uids("trellis.io/job-name=backoff")) == ["backoff-server-0"], 30),
                        sorted(self.uids("trellis.io/job-name=backoff")))
        workerfail = self.wait_phase("workerfail", ("Succeeded", "Failed"), 90)
        self.assertEqual(workerfail["phase"], "Failed", workerfail)
        failed = [c for c in workerfail["conditions"] if c["type"] == "Failed"][0]
        self.assertEqual(failed["reason"], "PodFailed", failed)
        self.assertIn("worker 0 (pod workerfail-worker-0) failed with exit code 1 after 1 restart inside the pod",
                      failed["message"])
        self.assertIn("the job's scheduler failed the job", failed["message"])
        self.assertEqual(workerfail["restarts"], 0, workerfail)
        self.assertNotIn("PodRestarted", self.events("workerfail"))

    def test_4_active_deadline_fails_the_job_and_stops_its_pods(self):
        self.start_operator()
        self.start_kubelet()
        self.create_job(shell_job("slow", "sleep 600", activeDeadlineSeconds=10))
        st = self.wait_phase("slow", ("Succeeded", "Failed"), 60)
        self.assertEqual(st["phase"], "Failed")
        self.assertEqual([c for c in st["conditions"] if c["type"] == "Failed"][0]["reason"], "DeadlineExceeded")
        self.assertTrue(wait_for(lambda: self.pods("trellis.io/job-name=slow") == [], 30))
        self.assertEqual(self.events("slow")[-1], "DeadlineExceeded")

    def test_5_suspend_deletes_pods_and_resume_runs_the_job_to_the_end(self):
        self.start_operator()
        kubelet = self.start_kubelet()
        marker = os.path.join(kubelet.work_dir, "ran-once")
        # The first pods run until suspended; the resumed job's new pods end at once.
        self.create_job(shell_job("susp", "[ -e %s ] && exit 0; touch %s; sleep 600" % (marker, marker)))
        self.wait_phase("susp", "Running", 60)
        self.cp.api("PATCH", self.job_url("susp"), {"spec": {"runPolicy": {"suspend": True}}},
                    "application/merge-patch+json")
        st = self.wait_phase("susp", "Suspended", 30)
        self.assertEqual([c for c in st["conditions"] if c["type"] == "Suspended"][0]["status"], "True")
        self.assertTrue(wait_for(lambda: self.pods("trellis.io/job-name=susp") == [], 30))
        time.sleep(2)  # nothing may recreate the pods while suspended
        self.assertEqual(self.job("susp")["status"]["phase"], "Suspended")
        self.assertEqual(self.pods("trellis.io/job-name=susp"), [])
        code, _ = self.cp.api("PATCH", self.job_url("susp"), {"spec": {"runPolicy": {"suspend": False}}},
                              "application/merge-patch+json")
        self.assertEqual(code, 200)
        st = self.wait_phase("susp", ("Succeeded", "Failed"), 60)
        self.assertEqual(st["phase"], "Succeeded", st)
        self.assertEqual([c for c in st["conditions"] if c["type"] == "Suspended"][0]["status"], "False")

    def test_6_operator_restarted_mid_job_recreates_nothing(self):
        op = self.start_operator()
        self.start_kubelet()
        self.create_job(shell_job("mid", "sleep 8", workers=2))
        self.wait_phase("mid", "Running", 60)
        before = self.uids("trellis.io/job-name=mid")
        self.assertEqual(len(before), 4, before)
        op.stop(signal.SIGKILL)  # no goodbye: a crashed or evicted operator
        self.start_operator(name="operator-2")
        st = self.wait_phase("mid", ("Succeeded", "Failed"), 60)
        self.assertEqual(st["phase"], "Succeeded", st)
        after = self.uids("trellis.io/job-name=mid")
        # The workers are kept after the end (cleanPodPolicy Running): the very pods of before.
        self.assertEqual({k: after[k] for k in ("mid-worker-0", "mid-worker-1")},
                         {k: before[k] for k in ("mid-worker-0", "mid-worker-1")})
        self.assertEqual(st["restarts"], 0)
        self.assertEqual(self.events("mid").count("JobCreated"), 1, self.events("mid"))

    def test_7_two_replicas_with_leader_election_one_reconciles_the_other_takes_over(self):
        lease_path = "/apis/coordination.k8s.io/v1/namespaces/%s/leases/trellis-operator" % envtest.CHART_NS
        a = self.start_operator(name="replica-a", args=["--leader-elect=true"])
        self.assertTrue(wait_for(lambda: "holding the Lease" in a.text(), 30), a.text())
        b = self.start_operator(name="replica-b", args=["--leader-elect=true"])
        self.assertTrue(wait_for(lambda: "waiting for the Lease" in b.text(), 30), b.text())
        self.start_kubelet()
        self.create_job(shell_job("led", "sleep 1"))
        self.assertEqual(self.wait_phase("led", ("Succeeded", "Failed"), 60)["phase"], "Succeeded")
        lease = self.cp.get(lease_path)
        holder_a = lease["spec"]["holderIdentity"]
        self.assertNotIn("holding the Lease", b.text())
        self.assertNotIn("watching TrainingJobs", b.text())  # the standby reconciles nothing
        transitions = lease["spec"].get("leaseTransitions", 0)
        # The leader dies without releasing the Lease: b takes over once it expires (15 s).
        a.stop(signal.SIGKILL)
        t0 = time.time()
        self.assertTrue(wait_for(lambda: "holding the Lease" in b.text(), 40), b.text())
        took = time.time() - t0
        lease = self.cp.get(lease_path)
        self.assertNotEqual(lease["spec"]["holderIdentity"], holder_a)
        self.assertEqual(lease["spec"].get("leaseTransitions", 0), transitions + 1)
        self.create_job(shell_job("led2", "sleep 1"))
        self.assertEqual(self.wait_phase("led2", ("Succeeded", "Failed"), 60)["phase"], "Succeeded")
        print("leader handover after SIGKILL: %.1f s" % took, flush=True)

    def test_8_invalid_spec_refused_by_the_crd_schema_or_failed_with_the_launchers_message(self):
        self.start_operator()
        # The CRD's schema refuses what it can at apply time (the double accepts anything)...
        bad = shell_job("neg", "true")
        bad["spec"]["workers"]["replicas"] = -2
        code, obj = self.cp.api("POST", self.job_url(), bad)
        self.assertEqual(code, 422, obj)
        self.assertIn("spec.workers.replicas", obj.get("message", ""))
        # ... the rest reaches the operator, which fails the job with trellis-launch's message.
        bad = shell_job("size", "true")
        bad["spec"]["sliceBytes"] = "4MB"
        self.create_job(bad)
        st = self.wait_phase("size", ("Failed", "Running", "Succeeded"), 30)
        self.assertEqual(st["phase"], "Failed", st)
        failed = [c for c in st["conditions"] if c["type"] == "Failed"][0]
        self.assertEqual(failed["reason"], "InvalidSpec")
        self.assertEqual(failed["message"], "spec.sliceBytes: must be a number of bytes or a quantity such as 512Ki, "
                                            "4Mi or 1Gi, got \"4MB\"")
        self.assertEqual(self.pods("trellis.io/job-name=size"), [])


if __name__ == "__main__":
    envtest.main(Lifecycle, admission_plugins=PLUGINS)
