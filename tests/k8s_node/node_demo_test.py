#!/usr/bin/python3
"""The user's path on a real node (node.py), with the image `make image` builds: the chart
`helm install`ed as docs/kubernetes.md says (default values, only image.pullPolicy=Never since
no registry is reachable: the image is imported into containerd), the operator running in-cluster
as its Deployment; manifests/examples/mlp.yaml applied -> Running -> Succeeded, `kubectl logs`
of each worker showing its output; `kubectl delete tj` of a running job -> no pod left; `helm
uninstall` -> nothing of the release left. (Evictions and deletions of every role mid-training:
node_ops_test.py.)

Then manifests/examples/pytorch.yaml exactly as shipped (trellis.torch, 2-bit, the script of the
image): progress with samples/s and an ETA in the status, a worker pod deleted mid-training, the
job Succeeded with its target reached and the replacement rejoined.

Usage: node_demo_test.py REPO BUILD_DIR   (exit 77 when a piece is missing, the image included:
ctest's image.build entry, or `make image`, builds BUILD_DIR/trellis-image.docker.tar)
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


def example(name):
    """manifests/examples/mlp.yaml as shipped, named `name` (several jobs run in one namespace)."""
    with open(os.path.join(envtest.REPO, "manifests/examples/mlp.yaml")) as f:
        return re.sub(r"(?m)^  name: mlp$", "  name: " + name, f.read())


class Demo(node.TrellisCase):
    prefix = "demo"

    def job_pods(self, job):
        return {p["metadata"]["name"]: p for p in self.pods() if p["metadata"]["name"].startswith(job + "-")}

    def test_1_mlp_example_runs_to_succeeded_with_worker_logs(self):
        t = time.time()
        self.apply(example("mlp"))
        self.wait_phase("mlp", "Running", 180)
        t_run = time.time()
        st = self.wait_phase("mlp", ("Succeeded", "Failed"), 900)
        self.assertEqual(st["phase"], "Succeeded", json.dumps(st))
        self.assertEqual(st["replicaStatuses"]["worker"]["succeeded"], 2, st)
        images = {c["image"] for p in self.pods() for c in p["spec"]["containers"]}
        self.assertEqual(images, {self.image})
        for i in range(2):
            log = self.logs("mlp-worker-%d" % i)
            self.assertIn("rank %d incarnation 1: starting" % i, log)
            if i == 0:
                self.assertRegex(log, r"RESULT: test accuracy .* -- reached")
        print("demo: mlp.yaml applied -> Running %.1f s -> Succeeded %.1f s later; phases %s" % (
            t_run - t, time.time() - t_run, self.phases["mlp"]), flush=True)
        print("demo: worker 0's log ends:\n" + self.logs("mlp-worker-0")[-1500:], flush=True)

    def test_3_deleting_the_job_leaves_no_pod(self):
        self.apply(example("mlpx"))
        self.wait_phase("mlpx", "Running", 180)
        self.assertTrue(self.job_pods("mlpx"))
        t = time.time()
        self.cp.kubectl("delete", "tj", "mlpx", "-n", self.ns, "--timeout=120s")
        gone = wait_for(lambda: not self.pods() and not self.owned_left("mlpx"), 120, 0.5)
        self.assertTrue(gone, "left after kubectl delete tj: %s" % self.cp.kubectl(
            "get", "pods,svc,cm,secret", "-n", self.ns, check=False).stdout)
        print("demo: kubectl delete tj of a running job -> no pod left after %.1f s" % (time.time() - t), flush=True)

    def test_4_helm_uninstall_leaves_nothing(self):
        t = time.time()
        self.cp.helm("uninstall", RELEASE, "--namespace", CHART_NS, "--wait", "--timeout", "120s")
        sel = "app.kubernetes.io/instance=" + RELEASE

        def left():
            out = []
            for args in (("all,sa,cm,secret,role,rolebinding,lease", "-n", CHART_NS),
                         ("clusterrole,clusterrolebinding",)):
                r = self.cp.kubectl("get", *args, "-l", sel, "-o", "name", check=False)
                out += r.stdout.split()
            out += ["pod/" + p["metadata"]["name"] for p in self.cp.get("/api/v1/namespaces/%s/pods" % CHART_NS)["items"]]
            return out
        self.assertTrue(wait_for(lambda: not left(), 90, 1), "left after helm uninstall: %s" % left())
        # The CRD stays: Helm never deletes what a chart's crds/ folder installed.
        crds = self.cp.kubectl("get", "crd", "-o", "name").stdout.split()
        print("demo: helm uninstall -> nothing of the release left after %.1f s (CRDs kept by Helm's policy: %s)" % (
            time.time() - t, crds), flush=True)

    def test_3b_pytorch_example_as_shipped_survives_a_pod_deletion(self):
        # manifests/examples/pytorch.yaml as shipped (2-bit, restartPolicy OnFailure, the script
        # in the image): a worker pod deleted mid-training is recreated, its worker rejoins
        # where the others are (the script keeps a TrainingState), and the job reaches its target.
        # Progress shows for the plain script: SAMPLES/S and an ETA while it runs.
        # Only longer (15 epochs, not 3): as shipped it trains in ~6 s, about the operator's 5 s
        # progress poll plus a pod deletion, so the deletion could land after the end.
        with open(os.path.join(envtest.REPO, "manifests/examples/pytorch.yaml")) as f:
            y = f.read()
        self.assertIn('args: [--epochs, "3",', y)
        self.apply(y.replace('args: [--epochs, "3",', 'args: [--epochs, "15",'))
        job = "pytorch-cnn"
        self.wait_phase(job, "Running", 240)
        seen = {}

        def progress():
            p = (self.job(job) or {}).get("status", {}).get("progress") or {}
            if p.get("samplesPerSecond") and p.get("etaSeconds") is not None:
                seen.update(p)
            return p
        # Delete at the first step the status shows: the run is short (384 steps).
        self.assertTrue(wait_for(lambda: progress().get("step", 0) > 0, 300, 0.3),
                        "no step in the status: %s" % json.dumps(progress()))
        at_step = progress().get("step")
        old = self.pod_obj(job + "-worker-1")["metadata"]["uid"]
        t = time.time()
        self.cp.kubectl("delete", "pod", job + "-worker-1", "-n", self.ns, "--wait=false")

        def replaced():
            progress()
            p = self.pod_obj(job + "-worker-1")
            return p and p["metadata"]["uid"] != old and p["status"].get("phase") in ("Running", "Succeeded")
        self.assertTrue(wait_for(replaced, 180), "%s-worker-1 not recreated: %s" % (
            job, json.dumps(self.pod_obj(job + "-worker-1"))))
        self.assertTrue(wait_for(lambda: progress() and self.job(job)["status"].get("phase") in
                                 ("Succeeded", "Failed"), 900, 0.5), "the job did not finish")
        st = self.job(job)["status"]
        self.assertEqual(st["phase"], "Succeeded", json.dumps(st))
        log0, log1 = self.logs(job + "-worker-0"), self.logs(job + "-worker-1")
        self.assertRegex(log0, r"RESULT: test accuracy .* -- reached")
        self.assertIn("rejoined the running job after step", log1)
        self.assertTrue(seen, "samples/s and an ETA never showed in the status")
        print("demo: pytorch.yaml as shipped; worker 1 deleted at step %s, job Succeeded %.1f s later;"
              " progress while running %s; rank 0: %s; worker 1: %s" % (
                  at_step, time.time() - t,
                  {k: seen.get(k) for k in ("step", "totalSteps", "samplesPerSecond", "eta")},
                  re.findall(r"epoch \d+: .*|RESULT: test accuracy .*", log0),
                  re.findall(r"rejoined the running job after step \d+", log1)), flush=True)

if __name__ == "__main__":
    node.main_trellis(Demo)
