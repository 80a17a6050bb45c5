#!/usr/bin/python3
"""On a real API server (envtest.py): what a real Kubernetes node showed (issue 32, part 3).

- A command that does not exist fails the job saying so, with no pod recreated (the test kubelet
  hands the agent's termination message over as state.terminated.message, as a kubelet does).
- A program restarted inside its pod by the agent is counted (replicaStatuses, RESTARTS) and gets
  a ProgramRestarted Event.
- A worker OOMKilled whose agent found the job failed at the scheduler: the job fails at once
  naming the OOM kill and the memory limit; no pod is recreated (pod statuses written by hand).
- Two pods failed: a PodRestarted Event each.
- A pod whose image cannot be pulled is named in the status and an Event.
- The pods get no service-account token and a restrictive securityContext the API server
  accepts; a pod template's own securityContext wins.
- `helm uninstall` leaves no Lease behind although the operator's release of it is refused.

Usage: node_findings_test.py REPO BIN_DIR   (exit 77 without KUBEBUILDER_ASSETS)
"""
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import envtest  # noqa: E402


def job(name, command, workers=2, template=None, **run_policy):
    rp = {"restartPolicy": "OnFailure", "backoffLimit": 2}
    rp.update(run_policy)
    w = {"replicas": workers, "command": command, "resources": {"limits": {"memory": "256Mi"}}}
    if template:
        w["template"] = template
    return {"apiVersion": "trellis.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": name},
            "spec": {"servers": {"replicas": 1}, "workers": w, "runPolicy": rp}}


def now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class NodeFindings(envtest.EnvtestCase):
    prefix = "node"

    def pod_status(self, pod, status):
        code, obj = self.cp.api("PATCH", "/api/v1/namespaces/%s/pods/%s/status" % (self.ns, pod),
                                {"status": status}, content_type="application/merge-patch+json")
        self.assertEqual(code, 200, obj)

    def fail_pod(self, pod, code, reason, message=""):
        terminated = {"exitCode": code, "reason": reason, "startedAt": now(), "finishedAt": now()}
        if message:
            terminated["message"] = message
        self.pod_status(pod, {"phase": "Failed", "containerStatuses": [
            {"name": "trellis", "image": "img", "imageID": "", "ready": False, "restartCount": 0,
             "state": {"terminated": terminated}}]})

    def wait_pods(self, name, n):
        self.assertTrue(envtest.wait_for(lambda: len(self.pods("trellis.io/job-name=" + name)) == n, 30),
                        self.pods("trellis.io/job-name=" + name))

    def test_command_not_found_is_named_and_not_retried(self):
        self.start_operator()
        self.start_kubelet()
        self.create_job(job("nocmd", ["/no/such/train"], workers=1))
        st = self.wait_phase("nocmd", ("Succeeded", "Failed"), 90)
        failed = self.condition("nocmd", "Failed")
        self.assertEqual(st["phase"], "Failed", st)
        self.assertEqual(failed["reason"], "CommandNotFound", failed)
        self.assertIn("worker 0 (pod nocmd-worker-0) failed: command not found: /no/such/train", failed["message"])
        self.assertNotIn("PodRestarted", self.events("nocmd"))  # a new pod of the image cannot find it either
        self.assertEqual(st["replicaStatuses"]["worker"]["restarts"], 0, st)

    def test_restarts_inside_the_pod_are_counted_with_an_event(self):
        services = os.path.join(self.cp.dir, self.ns + "-services.json")
        self.start_operator(args=["--progress-seconds", "1", "--scheduler-addresses", services])
        self.start_kubelet(args=["--services-file", services])
        mark = os.path.join(self.cp.dir, self.ns + "-started-")
        # Each worker's program fails on its first start, then runs a few seconds and succeeds.
        script = 'm=%s$TRELLIS_RANK; if [ ! -e $m ]; then touch $m; exit 1; fi; sleep 6' % mark
        self.create_job(job("inpod", ["/bin/sh", "-c", script], workers=1))

        def counted():
            st = (self.job("inpod") or {}).get("status", {})
            return st if st.get("replicaStatuses", {}).get("worker", {}).get("programRestarts") == 1 else None

        st = envtest.wait_for(counted, 60)
        self.assertTrue(st, self.job("inpod"))
        self.assertEqual(st["replicaStatuses"]["worker"]["restarts"], 1, st)
        self.assertGreaterEqual(st["restarts"], 1, st)
        self.assertTrue(envtest.wait_for(lambda: self.event_messages("inpod", "ProgramRestarted"), 10),
                        self.events("inpod"))
        msg = self.event_messages("inpod", "ProgramRestarted")[0]
        self.assertIn("worker 0 (pod inpod-worker-0): its program was restarted inside the pod", msg)
        st = self.wait_phase("inpod", ("Succeeded", "Failed"), 60)
        self.assertEqual(st["phase"], "Succeeded", st)
        self.assertEqual(st["replicaStatuses"]["worker"]["restarts"], 1, st)  # kept after the end

    def test_oom_killed_worker_of_a_failed_job_is_named_and_not_recreated(self):
        self.start_operator()
        self.create_job(job("oom", ["trellis-mlp"]))
        self.wait_pods("oom", 4)
        uid = [p for p in self.pods() if p["metadata"]["name"] == "oom-worker-0"][0]["metadata"]["uid"]
        self.fail_pod("oom-worker-0", 137, "OOMKilled",
                      "exit: program killed by SIGKILL (code 137)\nrestarts: 2\n"
                      "job-failed: worker 0 (pod oom-worker-0) failed: killed by SIGKILL (code 137)\n")
        st = self.wait_phase("oom", ("Failed",), 30)
        failed = self.condition("oom", "Failed")
        self.assertEqual(failed["reason"], "OOMKilled", failed)
        self.assertIn("worker 0 (pod oom-worker-0) was OOMKilled (memory limit 256Mi; exit code 137)",
                      failed["message"])
        self.assertIn("no pod is recreated", failed["message"])
        self.assertIn("OOMKilled", st.get("firstFailure", ""), st)
        self.assertTrue(any("memory limit 256Mi" in m for m in self.event_messages("oom", "OOMKilled")),
                        self.events("oom"))
        self.assertNotIn("PodRestarted", self.events("oom"))
        time.sleep(2)  # nothing follows: the pod is not replaced
        self.assertIn(uid, [p["metadata"]["uid"] for p in self.pods()])
        self.assertEqual(st["restarts"], 0, st)

    def test_two_failed_pods_get_an_event_each(self):
        self.start_operator()
        self.create_job(job("two", ["trellis-mlp"], backoffLimit=5))
        self.wait_pods("two", 4)
        self.fail_pod("two-worker-0", 1, "Error")
        self.fail_pod("two-worker-1", 1, "Error")
        self.assertTrue(envtest.wait_for(lambda: len(self.event_messages("two", "PodRestarted")) >= 2, 30),
                        self.events("two"))
        msgs = self.event_messages("two", "PodRestarted")
        self.assertTrue(any("worker 0 (pod two-worker-0) failed with exit code 1" in m for m in msgs), msgs)
        self.assertTrue(any("worker 1 (pod two-worker-1) failed with exit code 1" in m for m in msgs), msgs)

    def test_image_that_cannot_be_pulled_is_named(self):
        self.start_operator()
        self.create_job(job("pull", ["trellis-mlp"], workers=1))
        self.wait_pods("pull", 3)
        self.pod_status("pull-worker-0", {"phase": "Pending", "containerStatuses": [
            {"name": "trellis", "image": "reg.example/nope:1", "imageID": "", "ready": False, "restartCount": 0,
             "state": {"waiting": {"reason": "ImagePullBackOff",
                                   "message": 'Back-off pulling image "reg.example/nope:1"'}}}]})
        cond = envtest.wait_for(lambda: (self.condition("pull", "CannotStart") or {}).get("status") == "True"
                                and self.condition("pull", "CannotStart"), 30)
        self.assertTrue(cond, self.job("pull"))
        self.assertEqual(cond["reason"], "ImagePullBackOff")
        self.assertIn('pod pull-worker-0 cannot start: ImagePullBackOff: Back-off pulling image "reg.example/nope:1"',
                      cond["message"])
        self.assertTrue(envtest.wait_for(lambda: self.event_messages("pull", "ImagePullBackOff"), 10),
                        self.events("pull"))

    def test_pods_get_no_token_and_a_restrictive_security_context(self):
        self.start_operator()
        tmpl = {"spec": {"securityContext": {"runAsUser": 0}}}
        self.create_job(job("sec", ["trellis-mlp"], workers=1, template=tmpl))
        self.wait_pods("sec", 3)  # the API server accepted every pod
        pods = {p["metadata"]["name"]: p["spec"] for p in self.pods("trellis.io/job-name=sec")}
        for name, spec in pods.items():
            self.assertIs(spec.get("automountServiceAccountToken"), False, name)
            c = [c for c in spec["containers"] if c["name"] == "trellis"][0]
            self.assertEqual(c["securityContext"], {"allowPrivilegeEscalation": False,
                                                    "capabilities": {"drop": ["ALL"]}}, name)
            mounts = [m["mountPath"] for m in c.get("volumeMounts", [])]
            self.assertNotIn("/var/run/secrets/kubernetes.io/serviceaccount", mounts, name)
        for name in ("sec-scheduler", "sec-server-0"):
            self.assertEqual(pods[name]["securityContext"],
                             {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}, name)
        self.assertEqual(pods["sec-worker-0"]["securityContext"], {"runAsUser": 0})  # the template's


class Uninstall(envtest.EnvtestCase):
    prefix = "uninst"

    def test_helm_uninstall_leaves_no_lease(self):
        ns, release = "lease-test", "leasetest"
        self.cp.helm_install(release=release, ns=ns, values={"operator.leaderElect": "true"})
        lease = "/apis/coordination.k8s.io/v1/namespaces/%s/leases/trellis-operator" % ns
        op = self.start_operator(name="op-lease", token=self.cp.sa_token(sa=release + "-operator", ns=ns),
                                 args=["--leader-elect=true", "--lease-namespace", ns])
        self.assertTrue(envtest.wait_for(lambda: "holding the Lease" in op.text(), 30), op.text())
        self.assertEqual(self.cp.api("GET", lease)[0], 200)
        # helm deletes the RBAC while the operator still runs; it is stopped afterwards (SIGTERM),
        # when releasing the Lease is refused.
        self.cp.helm("uninstall", release, "--namespace", ns)
        op.stop(signal.SIGTERM)
        gone = envtest.wait_for(lambda: self.cp.api("GET", lease)[0] == 404, 20)
        self.assertTrue(gone, "the Lease %s/trellis-operator outlived helm uninstall:\n%s" % (ns, op.text()))


if __name__ == "__main__":
    envtest.main(NodeFindings, Uninstall)
