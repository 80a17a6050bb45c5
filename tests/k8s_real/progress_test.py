#!/usr/bin/python3
"""On a real API server (envtest.py): training progress in the TrainingJob. Worker 1 of the small
MLP sleeps 60 ms per step; the operator (polling every second) must write status.progress with
sane figures, name worker 1 and its pod in the Straggler condition, and `kubectl get tj` must show
the STEP, SAMPLES/S and ETA printer columns of the CRD the chart installed.

Usage: progress_test.py REPO BIN_DIR   (exit 77 without KUBEBUILDER_ASSETS)
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import envtest  # noqa: E402


def straggler_job(name):
    job = envtest.mlp_job(name, epochs=2)
    job["spec"]["workers"]["args"] += ["--slow-rank", "1", "--step-sleep-ms", "60"]
    job["spec"]["monitoring"] = {"straggler": {"factor": 2, "windowSeconds": 3}}
    return job


class Progress(envtest.EnvtestCase):
    prefix = "progress"

    def test_straggler_condition_progress_and_printer_columns(self):
        services = os.path.join(self.cp.dir, self.ns + "-services.json")
        self.start_operator(args=["--progress-seconds", "1", "--scheduler-addresses", services])
        self.start_kubelet(args=["--services-file", services])
        self.create_job(straggler_job("slow"))

        def straggler():
            for c in self.job("slow").get("status", {}).get("conditions", []):
                if c["type"] == "Straggler" and c["status"] == "True":
                    return c
            return None

        cond = envtest.wait_for(straggler, 120)
        st = self.job("slow").get("status", {})
        self.assertTrue(cond, "no Straggler condition; status %s" % st)
        self.assertEqual(cond["reason"], "SlowWorker")
        self.assertIn("worker rank 1 (pod slow-worker-1)", cond["message"])

        p = st.get("progress", {})
        self.assertGreater(p.get("step", 0), 0, p)
        self.assertEqual(p.get("totalSteps"), 2 * 8192 // 2 // 32, p)  # epochs x steps per epoch
        self.assertLessEqual(p["step"], p["totalSteps"], p)
        self.assertGreater(p.get("samplesPerSecond", 0), 0, p)
        self.assertLess(p["samplesPerSecond"], 64 / 0.06 * 1.5, p)  # 2 x 32 samples per >= 60 ms step
        self.assertIn("loss", p)
        self.assertGreaterEqual(p.get("etaSeconds", -1), 0, p)
        self.assertTrue(p.get("eta"), p)
        self.assertEqual(p.get("slowestRank"), 1, p)
        self.assertEqual(p.get("slowestPod"), "slow-worker-1", p)
        self.assertGreater(p.get("skew", 0), 2, p)

        out = self.cp.kubectl("get", "tj", "slow", "-n", self.ns).stdout
        header, row = out.splitlines()[0].split(), out.splitlines()[1].split()
        for col in ("STEP", "SAMPLES/S", "ETA"):
            self.assertIn(col, header, out)
        step = int(row[header.index("STEP")])
        self.assertGreater(step, 0, out)
        self.assertGreater(float(row[header.index("SAMPLES/S")]), 0, out)
        self.assertRegex(row[header.index("ETA")], r"^\d+(s|m\d\ds|h\d\dm)$", out)
        print("kubectl get tj (real API server):\n%s\nstatus.progress: %s\nStraggler: %s"
              % (out, p, cond["message"]), flush=True)


if __name__ == "__main__":
    envtest.main(Progress)
