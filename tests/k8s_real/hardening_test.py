#!/usr/bin/python3
"""What a real cluster does to the operator's robustness (issue #15, items 2.1, 2.2, 2.5), on a
real API server (envtest.py):

- 2.1 odd jobs: a pod template with only spec.nodeSelector (it aborted the operator); a template
  nested deeper than the operator's JSON reader goes (it made every LIST of TrainingJobs fail):
  that job fails with InvalidSpec, the operator stays up and serves the other jobs.
- 2.2 an object the API server refuses (a sidecar port our validation lets through, 422): the job
  is Failed with the server's message and a Warning Event FailedCreate.
- 2.5 credentials: the operator with the ordinary admin kubeconfig (client certificate), and a
  bound service-account token invalidated and rotated on disk while the operator runs
  (/healthz fails meanwhile, and the operator recovers without a restart).

Usage: hardening_test.py REPO BIN_DIR   (exit 77 without KUBEBUILDER_ASSETS)
"""
import os
import ssl
import sys
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import envtest  # noqa: E402
from envtest import wait_for  # noqa: E402
from envtest_procs import free_port, write_kubeconfig  # noqa: E402


def small_job(name, template=None):
    workers = {"replicas": 1, "command": ["/bin/sh", "-c", "exit 0"]}
    if template is not None:
        workers["template"] = template
    return {"apiVersion": "trellis.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": name},
            "spec": {"servers": {"replicas": 1}, "workers": workers, "runPolicy": {"restartPolicy": "Never"}}}


def condition(job, ctype):
    for c in ((job or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype:
            return c
    return {}


def healthz(port):
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/healthz" % port, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


class Hardening(envtest.EnvtestCase):
    prefix = "hard"

    def test_node_selector_only_template_runs(self):
        op = self.start_operator()
        self.start_kubelet()
        self.create_job(small_job("ns-only", {"spec": {"nodeSelector": {"kubernetes.io/os": "linux"}}}))
        self.wait_phase("ns-only", "Succeeded", 120)
        pod = self.cp.get("/api/v1/namespaces/%s/pods/ns-only-worker-0" % self.ns)
        self.assertEqual(pod["spec"]["nodeSelector"], {"kubernetes.io/os": "linux"})
        self.assertTrue(op.alive(), "the operator died")

    def test_deep_template_fails_only_that_job(self):
        op = self.start_operator()
        deep = "x"
        for i in range(150):
            deep = [{"a": deep}]
        self.create_job(small_job("deep", {"metadata": {"annotations": {}}, "spec": {"affinity": {"x": deep}}}))
        self.create_job(small_job("fine"))
        st = self.wait_phase("deep", "Failed", 60)
        c = condition({"status": st}, "Failed")
        self.assertEqual(c.get("reason"), "InvalidSpec", st)
        self.assertIn("spec.workers.template.spec.affinity.x[0].a[0]", c.get("message", ""))
        self.assertIn("nested deeper than 100 levels", c.get("message", ""))
        self.wait_phase("fine", ("Pending", "Running"), 60)
        self.assertTrue(op.alive(), "the operator died")

    def test_refused_pod_fails_the_job_with_the_servers_message(self):
        self.start_operator()
        # A sidecar port the job model does not judge (templates are the user's); the server does.
        tmpl = {"spec": {"containers": [{"name": "side", "image": "busybox", "ports": [{"containerPort": 70000}]}]}}
        self.create_job(small_job("refused", tmpl))
        st = self.wait_phase("refused", "Failed", 60)
        c = condition({"status": st}, "Failed")
        self.assertEqual(c.get("reason"), "FailedCreate", st)
        self.assertIn("the API server refused Pod %s/refused-worker-0: HTTP 422 Invalid" % self.ns, c["message"])
        self.assertIn("containerPort: Invalid value: 70000", c["message"])
        self.assertTrue(wait_for(lambda: "FailedCreate" in self.events("refused"), 20), self.events("refused"))
        self.assertEqual(self.pods("trellis.io/job-name=refused,trellis.io/role=worker"), [])

    def test_admin_kubeconfig_with_client_certificate(self):
        op = self.start_operator(args=["--kubeconfig", self.cp.admin_kubeconfig])
        self.create_job(small_job("cert"))
        self.wait_phase("cert", ("Pending", "Running"), 60)
        self.assertTrue(wait_for(lambda: len(self.pods("trellis.io/job-name=cert")) == 3, 30))
        self.assertTrue(op.alive())

    def test_rotated_token_on_disk_is_picked_up(self):
        # Two tokens of the chart's ServiceAccount, each bound to a Secret: deleting the Secret
        # invalidates its token at once (as an expired token would be).
        for s in ("rot-a", "rot-b"):
            self.cp.create("/api/v1/namespaces/%s/secrets" % envtest.CHART_NS,
                           {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": s + "-" + self.ns}})
        tokens = [self.cp.kubectl("create", "token", envtest.CHART_SA, "-n", envtest.CHART_NS, "--duration", "1h",
                                  "--bound-object-kind", "Secret", "--bound-object-name", s + "-" + self.ns
                                  ).stdout.strip() for s in ("rot-a", "rot-b")]
        token_file = os.path.join(self.cp.dir, self.ns + "-token")
        with open(token_file, "w") as f:
            f.write(tokens[0] + "\n")
        kc = write_kubeconfig(os.path.join(self.cp.dir, self.ns + "-tokenfile.kubeconfig"), self.cp.server,
                              self.cp.ca_file, {"tokenFile": token_file})
        port = free_port()
        op = self.start_operator(args=["--kubeconfig", kc, "--metrics-port", str(port), "--metrics-host", "127.0.0.1",
                                       "--api-unhealthy-seconds", "3"])
        self.assertTrue(wait_for(lambda: healthz(port) == 200, 30))
        self.create_job(small_job("before"))
        self.wait_phase("before", ("Pending", "Running"), 60)

        self.cp.delete("/api/v1/namespaces/%s/secrets/rot-a-%s" % (envtest.CHART_NS, self.ns))

        ca_only = ssl.create_default_context(cafile=self.cp.ca_file)  # no admin client certificate

        def refused(token):
            req = urllib.request.Request(self.cp.server + self.job_url(), headers={"Authorization": "Bearer " + token})
            try:
                with urllib.request.urlopen(req, timeout=10, context=ca_only):
                    return False
            except urllib.error.HTTPError as e:
                return e.code == 401
        # The API server caches a token's authentication for a few seconds.
        self.assertTrue(wait_for(lambda: refused(tokens[0]), 60, interval=1), "the deleted Secret's token still works")
        self.create_job(small_job("during"))  # its reconcile is refused: 401
        self.assertTrue(wait_for(lambda: healthz(port) == 503, 60), "/healthz stayed 200 while every call got 401")
        self.assertIsNone((self.job("during") or {}).get("status"))

        with open(token_file + ".tmp", "w") as f:
            f.write(tokens[1] + "\n")
        os.rename(token_file + ".tmp", token_file)
        self.wait_phase("during", ("Pending", "Running"), 90)
        self.assertTrue(wait_for(lambda: healthz(port) == 200, 30))
        self.assertTrue(op.alive())


if __name__ == "__main__":
    envtest.main(Hardening)
