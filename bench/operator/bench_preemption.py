#!/usr/bin/python3
"""bench_preemption: what a preemption costs a job on Kubernetes (issue 35's figures), on a real
API server (tests/k8s_real/envtest.py: etcd, kube-apiserver, kube-controller-manager, the chart
helm-installed, trellis-operator) with the test kubelet running the pods as processes here.

For each workload, one job:
  mlp      trellis-mlp (C++, a trellis::Checkpointer: it writes exit checkpoints), 2 x 2,
           checkpoints every 32 steps, rank 0 sleeping 5 ms a step (training lasts ~8 s);
  pytorch  examples/pytorch/train_cnn.py through trellis.torch, 2 x 2, --checkpoint at every
           epoch end (the docs' periodic checkpoint) in spec.checkpoint.path: rank 0 writes the
           exit checkpoint to that file at its next step (it has a TrainingState).
Measured, mid-training (the mlp after its checkpoint of step 160, the pytorch job 1 s into epoch 2):
  cold start   job created -> rank 0 has trained a first stretch (mlp: 32 steps, its first
               periodic checkpoint; pytorch: one epoch, its first epoch line): the baseline;
  suspend      spec.runPolicy.suspend: true -> every pod gone, and the exit checkpoint's step
               when one was written first (mlp);
  resume       suspend: false -> the same stretch trained after the step the job resumed at
               (mlp: 32 steps; pytorch: the rest of the epoch it was stopped in, its steps
               printed), and its ratio to the cold start;
  trained again  the steps between the stop and the resumed step (0 with an exit checkpoint).
Prints each figure with the load average. Exit 0 unless the bench could not run (77: no API
server binaries, as the k8s tests skip).

Usage: bench_preemption [--workloads mlp,pytorch] [--bin-dir build/bin]
"""
import argparse
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "k8s_real"))
import envtest  # noqa: E402

def load():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def job_for(workload, name, ckpt):
    if workload == "mlp":
        job = envtest.mlp_job(name, epochs=12, restartPolicy="OnFailure", backoffLimit=1, activeDeadlineSeconds=300)
        job["spec"]["workers"]["args"] += ["--slow-rank", "0", "--step-sleep-ms", "5"]
        job["spec"]["checkpoint"] = {"path": ckpt, "intervalSteps": 32, "keep": 2}
        return job
    os.makedirs(ckpt, exist_ok=True)
    return {"apiVersion": "trellis.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": name},
            "spec": {"servers": {"replicas": 2},
                     "workers": {"replicas": 2, "command": ["trellis-python"],
                                 "args": [os.path.join(REPO, "examples/pytorch/train_cnn.py"), "--epochs", "6",
                                          "--batch", "32", "--lr", "0.05", "--target-accuracy", "0.5",
                                          "--checkpoint", os.path.join(ckpt, "cnn.pt")]},
                     "sliceBytes": 65536, "checkpoint": {"path": ckpt},
                     "runPolicy": {"restartPolicy": "OnFailure", "backoffLimit": 1, "activeDeadlineSeconds": 600}}}


# Rank 0 has trained a stretch: the mlp's first periodic checkpoint of a run (32 steps), the
# pytorch job's first epoch line of a run (128 steps). The same stretch after a cold start and
# after a resume makes the two times comparable.
STRETCH = {"mlp": r"saved step (\d+) to ", "pytorch": r"epoch (\d+): train loss"}
# Where the resumed run starts: mlp "restored step N" (the exit checkpoint), pytorch "resuming
# inside epoch E after step N" (trellis.torch read an exit checkpoint).
RESUMED = {"mlp": r"restored step (\d+) from ", "pytorch": r"resuming inside epoch \d+ after step (\d+)"}
STEPS_PER_EPOCH = {"pytorch": 128}


class Bench(envtest.EnvtestCase):
    prefix = "bp"
    workloads = ("mlp", "pytorch")
    results = []

    def log_paths(self, job):
        return [os.path.join(self.kubelet.work_dir, "%s-worker-%d.log" % (job, i)) for i in (0, 1)]

    def logs(self, job):
        text = ""
        for path in self.log_paths(job):  # rank 0 is whichever worker registered first
            try:
                with open(path, errors="replace") as f:
                    text += f.read()
            except OSError:
                pass
        return text

    def until(self, job, pattern, timeout):
        """Time at which `pattern` first appears in the workers' logs (polled every 50 ms); the match."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            m = re.search(pattern, self.logs(job))
            if m:
                return time.time(), m
            time.sleep(0.05)
        self.fail("%s: no %r in the workers' logs within %d s" % (job, pattern, timeout))

    def patch_suspend(self, name, value):
        self.cp.api("PATCH", "/apis/trellis.io/v1alpha1/namespaces/%s/trainingjobs/%s" % (self.ns, name),
                    {"spec": {"runPolicy": {"suspend": value}}}, content_type="application/merge-patch+json")

    def test_preemption(self):
        services = os.path.join(self.cp.dir, self.ns + "-services.json")
        self.start_operator(args=["--progress-seconds", "1", "--scheduler-addresses", services])
        self.kubelet = self.start_kubelet(args=["--services-file", services])
        for w in self.workloads:
            self.measure(w)
        print("\nbench_preemption (real API server, test kubelet; load after: %s)" % load())
        print("%-8s %11s %12s %10s %11s %7s  %s" % ("workload", "cold start", "exit ckpt", "pods gone",
                                                    "resume", "ratio", "trained again"))
        for r in self.results:
            print("%-8s %10.1fs %12s %9.1fs %10.1fs %6.2fx  %s" % (
                r["w"], r["cold"], r["exit"], r["gone"], r["resume"], r["resume"] / r["cold"], r["lost"]))
        print("cold start: created -> the first stretch trained (mlp 32 steps, pytorch 1 epoch); resume: "
              "suspend false -> the same stretch trained after the resumed step (pytorch: the rest of its "
              "epoch); exit ckpt: written before the pods went (none: the program writes none)")
        sys.stdout.flush()

    def measure(self, w):
        name = "bp" + w[:2]
        ckpt = os.path.join(self.cp.dir, self.ns + "-" + name + "-ckpt")
        t0 = time.time()
        self.cp.create("/apis/trellis.io/v1alpha1/namespaces/%s/trainingjobs" % self.ns, job_for(w, name, ckpt))
        t_cold, _ = self.until(name, STRETCH[w], 240)
        # Mid-training: the mlp after its checkpoint of step 160, the pytorch job 1 s into epoch 2.
        self.until(name, r"saved step 160 to " if w == "mlp" else r"epoch 1: train loss", 240)
        if w == "pytorch":
            time.sleep(1.0)
        t_s = time.time()
        self.patch_suspend(name, True)
        self.assertTrue(envtest.wait_for(lambda: not self.pods("trellis.io/job-name=" + name), 120, 0.05),
                        "pods left after the suspend")
        t_gone = time.time()
        st = self.job(name)["status"]
        stopping = [c for c in st.get("conditions", []) if c["type"] == "Stopping"]
        exit_desc = "none"
        if stopping and stopping[0]["reason"] == "ExitCheckpointWritten":
            exit_desc = "step %d" % st["checkpoint"]["step"]
        time.sleep(0.5)  # the stopped processes' last lines
        before = self.logs(name)
        for path in self.log_paths(name):  # what follows is the resumed run's
            if os.path.exists(path):
                os.replace(path, path + ".suspended")
        self.patch_suspend(name, False)
        t_r = time.time()
        t_again, _ = self.until(name, STRETCH[w], 240)
        _, m = self.until(name, RESUMED[w], 10)
        resumed = int(m.group(1))
        stops = re.findall(r"stopped after step (\d+)", before)
        lost = "%d steps" % (int(stops[-1]) - resumed) if stops else "?"
        if w in STEPS_PER_EPOCH:
            lost += " (resume: the last %d steps of the epoch)" % (
                STEPS_PER_EPOCH[w] - resumed % STEPS_PER_EPOCH[w])
        st = self.wait_phase(name, ("Succeeded", "Failed"), 600)
        self.assertEqual(st["phase"], "Succeeded", st)
        self.results.append({"w": w, "cold": t_cold - t0, "gone": t_gone - t_s, "resume": t_again - t_r,
                             "exit": exit_desc, "lost": lost})


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default="mlp,pytorch")
    ap.add_argument("--bin-dir", default=os.path.join(REPO, "build", "bin"))
    args = ap.parse_args()
    Bench.workloads = tuple(w for w in args.workloads.split(",") if w)
    sys.argv = [sys.argv[0], REPO, args.bin_dir]
    if not os.environ.get("KUBEBUILDER_ASSETS") and os.path.isdir(os.path.join(REPO, "build", "k8s-assets")):
        os.environ["KUBEBUILDER_ASSETS"] = os.path.join(REPO, "build", "k8s-assets")
    envtest.main(Bench, programs=envtest.PROGRAMS + ("trellis-python",))


if __name__ == "__main__":
    main()
