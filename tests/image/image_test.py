#!/usr/bin/python3
"""The runtime image of `make image` (scripts/image.sh), run for real: every program started
inside the unpacked image (run_in_image.py: chroot into an overlay, the image's user and
environment), `import trellis.torch` there, and whole local jobs with every process inside it.
Plus what the archives promise: labels, entrypoint, user, the chart's tag, runtime packages only.

Usage: image_test.py REPO BUILD_DIR [unittest args, e.g. -k Programs]
Exit 77 (ctest's skip) when the image is not built: the image.build entry builds it, or skipped
saying why (no root, no Debian archive).
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = os.path.join(HERE, "run_in_image.py")
REPO = BUILD = ROOTFS = None
PROGRAMS = ("trellis-operator", "trellis-scheduler", "trellis-agent", "trellis-pserver", "trellis-launch",
            "trellis-mlp", "trellis-python")
SITE = "/usr/local/lib/python3.11/dist-packages"
# The e2e tests' small MLP job (tests/k8s_real/envtest.py mlp_job): seconds of training.
MLP_JOB = """apiVersion: trellis.io/v1alpha1
kind: TrainingJob
metadata: {name: mlp-image}
spec:
  servers: {replicas: 2}
  workers:
    replicas: 2
    command: [trellis-mlp]
    args: [--layers, "16,128,64,10", --latent-dim, "8", --teacher-hidden, "16", --epochs, "3", --batch, "32",
           --lr, "0.02", --train-samples, "8192", --test-samples, "1000", --target-accuracy, "0.85"]
  sliceBytes: 16384
  runPolicy: {restartPolicy: Never, activeDeadlineSeconds: 240}
"""


def chart_image(repo_dir):
    """(repository, appVersion): the image the chart deploys by default."""
    with open(os.path.join(repo_dir, "charts/trellis/values.yaml")) as f:
        repo = re.search(r"^  repository: *(\S+)", f.read(), re.M).group(1)
    with open(os.path.join(repo_dir, "charts/trellis/Chart.yaml")) as f:
        version = re.search(r'^appVersion: *"?([^"\s]+)"?', f.read(), re.M).group(1)
    return repo, version


class ImageCase(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="trellis-image-test-")
        os.chmod(self.tmp, 0o755)  # bound into the image: the image's user must read it
        self.runs = 0

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def run_in_image(self, *cmd, binds=(), env=(), workdir=None, root=False, timeout=120):
        """`cmd` inside the image, each call on a fresh overlay -> CompletedProcess (text)."""
        self.runs += 1
        argv = ["/usr/bin/python3", RUN, ROOTFS, os.path.join(self.tmp, "state%d" % self.runs), "--die-with-parent"]
        for b in binds:
            argv += ["--bind", b]
        for e in env:
            argv += ["--env", e]
        if workdir:
            argv += ["--workdir", workdir]
        if root:
            argv.append("--root")
        return subprocess.run(argv + ["--"] + list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout, env={"PATH": "/usr/bin:/bin"})

    def check(self, *cmd, **kw):
        r = self.run_in_image(*cmd, **kw)
        self.assertEqual(r.returncode, 0, "%s in the image: exit %d\n%s" % (" ".join(cmd), r.returncode, r.stdout))
        return r.stdout


class Archives(unittest.TestCase):
    """What a registry, kind or the chart sees: the two archives and the image's config."""

    def inspect(self, ref, config=False):
        out = subprocess.run(["skopeo", "inspect"] + (["--config"] if config else []) + [ref],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stdout)
        return json.loads(out.stdout)

    def test_oci_archive_config_labels_and_tag(self):
        repo, version = chart_image(REPO)
        ref = "oci-archive:" + os.path.join(BUILD, "trellis-image.tar")
        info = self.inspect(ref)
        labels = info["Labels"]
        for k in ("title", "source", "version", "revision", "created"):
            self.assertIn("org.opencontainers.image." + k, labels)
        self.assertEqual(labels["org.opencontainers.image.version"], version)
        head = subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], stdout=subprocess.PIPE, text=True).stdout.strip()
        if head:
            self.assertEqual(labels["org.opencontainers.image.revision"], head)
            when = subprocess.run(["git", "-C", REPO, "log", "-1", "--format=%cd", "--date=format-local:%Y-%m-%dT%H:%M:%SZ"],
                                  stdout=subprocess.PIPE, text=True, env={"TZ": "UTC"}).stdout.strip()
            # Created from the commit time, not the build time: the same commit gives the same image.
            self.assertEqual(labels["org.opencontainers.image.created"], when)
            self.assertTrue(info["Created"].startswith(when[:-1]), info["Created"])
        self.assertEqual(len(info["Layers"]), 2, "Debian + Trellis layers")
        cfg = self.inspect(ref, config=True)["config"]
        self.assertEqual(cfg["Entrypoint"], ["trellis-agent"])
        self.assertEqual(cfg["User"], "1000:1000")
        with tarfile.open(os.path.join(BUILD, "trellis-image.tar")) as t:
            index = json.load(t.extractfile("index.json"))
        self.assertEqual(index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"], version)

    def test_docker_archive_carries_the_charts_default_image(self):
        repo, version = chart_image(REPO)
        with tarfile.open(os.path.join(BUILD, "trellis-image.docker.tar")) as t:
            manifest = json.load(t.extractfile("manifest.json"))
        # `kind load image-archive` / `ctr images import` tag it so: the chart's default, unchanged.
        self.assertEqual(manifest[0]["RepoTags"], ["%s:%s" % (repo, version)])
        self.assertEqual(len(manifest[0]["Layers"]), 2)

    def test_runtime_packages_only(self):
        with open(os.path.join(ROOTFS, "var/lib/dpkg/status")) as f:
            installed = [m.group(1) for m in re.finditer(r"^Package: (\S+)\nStatus: install ok installed", f.read(), re.M)]
        self.assertIn("python3-torch", installed)
        self.assertIn("libgrpc++1.51", installed)
        dev = [p for p in installed if p.endswith("-dev") or re.match(r"^(gcc|g\+\+|cpp|clang|build-essential|cmake)(-\d+)?$", p)]
        self.assertEqual(dev, [], "build-time packages in the runtime image")
        for cc in ("usr/bin/gcc", "usr/bin/g++", "usr/bin/cc", "usr/bin/c++"):
            self.assertFalse(os.path.lexists(os.path.join(ROOTFS, cc)), cc)


class Programs(ImageCase):
    def test_every_program_links_and_starts_as_the_image_user(self):
        self.assertEqual(self.check("id", "-u").strip(), "1000")  # config.json's user, not root
        # Every ELF program and the Python module (trellis-python is a shell script: ldd refuses it).
        libs = self.check("sh", "-c", "ldd $(ls /usr/local/bin/trellis-* | grep -v trellis-python) "
                          "%s/trellis/_trellis*.so 2>&1" % SITE)
        self.assertNotIn("not found", libs)
        for p in PROGRAMS:
            out = self.check(p, "--help")
            self.assertTrue(out.strip(), p + " --help printed nothing")

    def test_entrypoint_is_the_agent(self):
        # No command: the image's entrypoint, trellis-agent, which without a pod's environment
        # says what is missing and fails (as a pod without the operator's env would).
        r = self.run_in_image()
        self.assertNotEqual(r.returncode, 0, r.stdout)
        self.assertIn("TRELLIS_JOB", r.stdout)
        self.assertNotIn("run_in_image:", r.stdout)

    def test_import_trellis_torch(self):
        out = self.check("python3", "-c", "import trellis, trellis.torch, torch; print(trellis.__file__); "
                         "print(torch.ones(3).sum().item())")
        self.assertIn(SITE + "/trellis/__init__.py", out)
        self.assertIn("3.0", out)
        self.check("trellis-python", "-c", "import trellis.torch")

    def test_mlp_worker_trains_alone(self):
        out = self.check("trellis-mlp", "--local", "--layers", "16,128,64,10", "--latent-dim", "8",
                         "--teacher-hidden", "16", "--epochs", "2", "--train-samples", "4096",
                         "--test-samples", "500", "--target-accuracy", "0.5")
        self.assertRegex(out, r"RESULT: test accuracy .* -- reached")


class LocalJobs(ImageCase):
    def test_mlp_job_every_process_inside_the_image(self):
        job = os.path.join(self.tmp, "job")
        os.makedirs(job)
        with open(os.path.join(job, "mlp.yaml"), "w") as f:
            f.write(MLP_JOB)
        # trellis-launch runs the scheduler, agents, servers and workers from its own directory:
        # /usr/local/bin of the image, inside the same chroot (nothing of the build tree is there).
        out = self.check("trellis-launch", "--quiet", "/job/mlp.yaml", binds=[job + ":/job"], timeout=300)
        self.assertRegex(out, r"RESULT: test accuracy .* -- reached")

    def test_pytorch_example_job(self):
        # The shipped example, unchanged: trellis-python + trellis.torch, 2 servers x 2 workers.
        out = self.check("trellis-launch", "--quiet", "examples/pytorch.yaml",
                         workdir="/usr/local/share/trellis", timeout=500)
        self.assertRegex(out, r"RESULT: test accuracy .* -- reached")


def main():
    global REPO, BUILD, ROOTFS
    REPO, BUILD = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    ROOTFS = os.path.join(BUILD, "image", "bundle", "rootfs")
    if not os.path.isfile(os.path.join(ROOTFS, "..", "config.json")):
        print("image_test: no image in %s (make image; ctest's image.build entry builds it or says why "
              "it skipped): skipped" % os.path.dirname(ROOTFS))
        sys.exit(77)
    if os.geteuid() != 0:
        print("image_test: needs root to chroot into the image: skipped")
        sys.exit(77)
    unittest.main(argv=[sys.argv[0]] + sys.argv[3:], verbosity=2)


if __name__ == "__main__":
    main()
