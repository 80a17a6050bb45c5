#!/usr/bin/python3
"""The image the chart deploys, on a real API server (envtest.py): trellis-operator runs inside the
unpacked image of `make image` as its Deployment would (the image's user, in-cluster config from a
service-account folder at /var/run/secrets/kubernetes.io/serviceaccount, the chart's token), and
the test kubelet runs every pod inside the image (--rootfs; --bin-dir points nowhere, so nothing
comes from the build tree). The small MLP TrainingJob goes to Succeeded.

Usage: image_e2e_test.py REPO BIN_DIR   (exit 77 without KUBEBUILDER_ASSETS or without the image:
ctest's image.build entry builds it into BUILD/image/bundle)
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import envtest  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "image"))
from image_test import chart_image  # noqa: E402

RUN_IN_IMAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "image", "run_in_image.py")
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def rootfs():
    return os.path.join(os.path.dirname(envtest.BIN), "image", "bundle", "rootfs")


class FromTheImage(envtest.EnvtestCase):
    prefix = "image"

    def start_operator_in_image(self):
        """trellis-operator of the image, configured the way the chart's Deployment is: in-cluster."""
        sa = tempfile.mkdtemp(prefix="sa-", dir=self.cp.dir)
        os.chmod(sa, 0o755)  # a Secret volume: readable by the image's user
        with open(self.cp.ca_file) as src, open(os.path.join(sa, "ca.crt"), "w") as dst:
            dst.write(src.read())
        with open(os.path.join(sa, "token"), "w") as f:
            f.write(self.cp.sa_token())
        with open(os.path.join(sa, "namespace"), "w") as f:
            f.write(envtest.CHART_NS)
        port = self.cp.server.rsplit(":", 1)[1]
        argv = ["/usr/bin/python3", RUN_IN_IMAGE, rootfs(), os.path.join(self.cp.dir, self.ns + "-operator-fs"),
                "--die-with-parent", "--bind", sa + ":" + SA_DIR,
                "--env", "KUBERNETES_SERVICE_HOST=127.0.0.1", "--env", "KUBERNETES_SERVICE_PORT=" + port,
                "--env", "TRELLIS_LOG_LEVEL=info", "--",
                "trellis-operator", "--metrics-port", str(envtest.free_port()), "--leader-elect=false",
                "--lease-namespace", envtest.CHART_NS, "--namespace", self.ns]
        p = self.cp.spawn(self.ns + "-operator", argv)
        self._procs.append(p)
        return p

    def test_mlp_job_from_the_image_succeeds(self):
        op = self.start_operator_in_image()
        kubelet = self.start_kubelet(args=["--rootfs", rootfs(), "--bin-dir", "/nonexistent"])
        self.create_job(envtest.mlp_job("mlp"))
        st = self.wait_phase("mlp", ("Succeeded", "Failed"), 240)
        self.assertEqual(st["phase"], "Succeeded", st)
        self.assertEqual(st["replicaStatuses"]["worker"]["succeeded"], 2, st)
        with open(os.path.join(kubelet.work_dir, "mlp-worker-0.log"), errors="replace") as f:
            self.assertRegex(f.read(), r"RESULT: test accuracy .* -- reached")
        self.assertTrue(op.alive(), op.text())
        # The operator's default image is the one make image builds and the chart deploys.
        images = {p["spec"]["containers"][0]["image"] for p in self.pods()}
        self.assertEqual(images, {"%s:%s" % chart_image(envtest.REPO)})


if __name__ == "__main__":
    if len(sys.argv) >= 3:
        envtest.BIN = os.path.abspath(sys.argv[2])
    if not os.path.isfile(os.path.join(rootfs(), "..", "config.json")):
        print("no image in %s (make image; ctest's image.build entry builds it): skipped" % os.path.dirname(rootfs()))
        sys.exit(77)
    if os.geteuid() != 0:
        print("running the image (chroot) needs root: skipped")
        sys.exit(77)
    envtest.main(FromTheImage)
