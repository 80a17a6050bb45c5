#!/usr/bin/python3
"""A scheduler pod deleted mid-training on a real API server (envtest.py): the operator creates it
again behind the same Service, the new scheduler rebuilds the running job from the agents,
servers and workers (docs/scheduler.md#scheduler-restart), and the MLP job reaches Succeeded
without any server or worker pod being recreated. Prints the time from the deletion to the job's
state being whole again, and to the next epoch finishing (training went on).

Usage: scheduler_restart_test.py REPO BIN_DIR   (exit 77 without KUBEBUILDER_ASSETS)
"""
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import envtest  # noqa: E402
from envtest import wait_for  # noqa: E402

EPOCHS = 20  # long enough that the members come back before the job ends (a loaded CI machine: 2-3 s)


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


class SchedulerRestart(envtest.EnvtestCase):
    prefix = "sched"

    def test_deleted_scheduler_pod_is_recreated_and_the_job_succeeds(self):
        self.start_operator()
        kubelet = self.start_kubelet()
        job = envtest.mlp_job("mlp", epochs=EPOCHS, activeDeadlineSeconds=400)
        args = job["spec"]["workers"]["args"]
        args[args.index("--train-samples") + 1] = "65536"  # 1024 steps an epoch: seconds each
        self.create_job(job)
        worker_log = os.path.join(kubelet.work_dir, "mlp-worker-0.log")
        sched_log = os.path.join(kubelet.work_dir, "mlp-scheduler.log")
        epochs = lambda: len(re.findall(r"epoch \d+/%d .*train loss" % EPOCHS, read(worker_log)))
        # Mid-training: the first epoch is done, the rest is ahead.
        self.assertTrue(wait_for(lambda: epochs() >= 1, 150),
                        "training never got through epoch 1:\n" + read(worker_log)[-2000:])
        before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in self.pods()}
        done_before = epochs()
        self.assertLess(done_before, EPOCHS, "the job trained too fast to be interrupted")

        t0 = time.time()
        self.cp.kubectl("-n", self.ns, "delete", "pod", "mlp-scheduler", "--wait=false")
        recreated = wait_for(lambda: any(p["metadata"]["name"] == "mlp-scheduler" and
                                         p["metadata"]["uid"] != before["mlp-scheduler"]
                                         for p in self.pods()), 60)
        self.assertTrue(recreated, "the operator did not create the scheduler pod again")
        t_pod = time.time()
        # Both clocks at once: the members coming back, and training going on meanwhile.
        t_back = t_epoch = None
        deadline = time.time() + 120
        while time.time() < deadline and (t_back is None or t_epoch is None):
            if t_back is None and "recovered the running job after a scheduler restart" in read(sched_log):
                t_back = time.time()
            if t_epoch is None and epochs() > done_before:
                t_epoch = time.time()
            time.sleep(0.05)
        self.assertIsNotNone(t_back, "the new scheduler never recovered the job:\n" + read(sched_log)[-3000:])
        self.assertIn("all 2 servers and 2 workers are back", read(sched_log))
        progressed = t_epoch is not None

        st = self.wait_phase("mlp", ("Succeeded", "Failed"), 300)
        self.assertEqual(st["phase"], "Succeeded", st)
        self.assertTrue(progressed)
        self.assertRegex(read(worker_log), r"RESULT: test accuracy .* -- reached")
        for w in (0, 1):
            log = read(os.path.join(kubelet.work_dir, "mlp-worker-%d.log" % w))
            self.assertIn("handed back the shard map", log)
        # Nothing but the scheduler was recreated.
        after = {p["metadata"]["name"]: p["metadata"]["uid"] for p in self.pods()}
        for name in ("mlp-worker-0", "mlp-worker-1"):
            self.assertEqual(after.get(name), before[name], name + " was recreated")
        self.assertEqual(st["replicaStatuses"]["worker"].get("restarts", 0), 0, st)
        print("scheduler restart on the real API server: pod deleted -> new scheduler pod %.1f s, "
              "-> every member back with it %.1f s, -> next epoch done %.1f s (training went on); "
              "phases %s" % (t_pod - t0, t_back - t0, t_epoch - t0, self.phases["mlp"]), flush=True)
        print("".join(l for l in read(sched_log).splitlines(True)
                      if re.search(r"listening on|recover|the job was running|is back|ready at|handed", l)), flush=True)


if __name__ == "__main__":
    envtest.main(SchedulerRestart)
