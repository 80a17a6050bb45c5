#!/usr/bin/python3
"""On a real API server (envtest.py): an idle operator makes no request but its watches (issue 36
part 3). The operator keeps a cache of its jobs and of the objects they own, fed by watches; its
resync reconciles from that cache and writes only a difference. Asserted from the API server's
own apiserver_request_total (counts, not timings): with N jobs in place and several resyncs
passing, no write and no LIST on any resource the operator uses; one job changed is written and
then the operator is quiet again; an owned object deleted by someone is put back (its watch event,
not a periodic re-create, brings it back). No kubelet: the pods stay Pending.

Usage: idle_test.py REPO BIN_DIR   (exit 77 without KUBEBUILDER_ASSETS)
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import envtest  # noqa: E402

OWNED = ("trainingjobs", "pods", "services", "configmaps", "secrets", "events", "leases")
WRITES = ("POST", "PUT", "PATCH", "DELETE", "DELETECOLLECTION")
JOBS = 12
RESYNC_S = 1  # many resyncs in a short window


class Idle(envtest.EnvtestCase):
    prefix = "idle"

    def requests(self):
        """apiserver_request_total on the operator's resources, without WATCH (its open streams)."""
        return {k: v for k, v in self.cp.request_counts().items() if k[1] in OWNED and k[0] != "WATCH"}

    def window(self, resyncs):
        """The requests on the operator's resources while `resyncs` resync periods pass."""
        before = self.requests()
        time.sleep(resyncs * RESYNC_S + 0.5)
        after = self.requests()
        return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0) > 0}

    def quiet(self):
        """Waits until a window of two resyncs holds no write (the echoes of the creation are
        over); returns False if that never happens."""
        return envtest.wait_for(lambda: not any(k[0] in WRITES for k in self.window(2)), 90, 0)

    def all_there(self):
        sel = "?labelSelector=trellis.io/job-name"
        got = [len(self.cp.get("/api/v1/namespaces/%s/%s%s" % (self.ns, r, sel))["items"])
               for r in ("pods", "services", "configmaps", "secrets")]
        phases = [(j.get("status") or {}).get("phase") for j in self.cp.get(self.job_url())["items"]]
        return got == [3 * JOBS, JOBS, JOBS, JOBS] and all(phases)

    def test_idle_operator_makes_no_write_and_no_list_and_repairs_from_watch_events(self):
        self.start_operator(args=["--resync-seconds", str(RESYNC_S)])
        for i in range(JOBS):
            self.create_job(envtest.sleeping_job("j%02d" % i))
        self.assertTrue(envtest.wait_for(self.all_there, 120, 0.5), "the jobs' objects were not all created")
        self.assertTrue(self.quiet(), "the operator kept writing while nothing changed: %s" % self.window(2))

        # Left alone for five resyncs: not one write, not one LIST (nor GET: it reads its cache).
        idle = self.window(5)
        self.assertEqual({k: v for k, v in idle.items() if k[0] in WRITES}, {}, idle)
        self.assertEqual({k: v for k, v in idle.items() if k[0] == "LIST"}, {}, idle)
        # (kube-apiserver GETs its own "kubernetes" Service now and then: services are left out.)
        self.assertEqual({k: v for k, v in idle.items() if k[0] == "GET" and k[1] != "services"}, {}, idle)

        # One job changes: it is written (status, its pods deleted), then quiet again.
        before = self.requests()
        code, obj = self.cp.api("PATCH", self.job_url("j03"), {"spec": {"runPolicy": {"suspend": True}}},
                                content_type="application/merge-patch+json")
        self.assertEqual(code, 200, obj)
        self.wait_phase("j03", "Suspended", 60)
        after = self.requests()
        status_writes = after.get(("PUT", "trainingjobs", "status", "200"), 0) - \
            before.get(("PUT", "trainingjobs", "status", "200"), 0)
        self.assertGreaterEqual(status_writes, 1)
        self.assertTrue(self.quiet(), "not quiet after one change: %s" % self.window(2))
        idle = self.window(3)
        self.assertEqual({k: v for k, v in idle.items() if k[0] in WRITES or k[0] == "LIST"}, {}, idle)

        # Someone deletes a job's Service, ConfigMap and token Secret: the watch events bring
        # them back (no resync re-creates blindly any more).
        for res, name in (("services", "j05-scheduler"), ("configmaps", "j05-config"), ("secrets", "j05-token")):
            uid = self.cp.get("/api/v1/namespaces/%s/%s/%s" % (self.ns, res, name))["metadata"]["uid"]
            self.assertEqual(self.cp.delete("/api/v1/namespaces/%s/%s/%s" % (self.ns, res, name)), 200)

            def back(res=res, name=name, uid=uid):
                code, o = self.cp.api("GET", "/api/v1/namespaces/%s/%s/%s" % (self.ns, res, name))
                return code == 200 and o["metadata"]["uid"] != uid
            self.assertTrue(envtest.wait_for(back, 30), "%s %s was not recreated" % (res, name))
        # A deleted pod of a running job is recreated too (restartPolicy OnFailure).
        uid = self.cp.get("/api/v1/namespaces/%s/pods/j06-worker-0" % self.ns)["metadata"]["uid"]
        self.cp.delete("/api/v1/namespaces/%s/pods/j06-worker-0" % self.ns)

        def pod_back():
            code, o = self.cp.api("GET", "/api/v1/namespaces/%s/pods/j06-worker-0" % self.ns)
            return code == 200 and o["metadata"]["uid"] != uid
        self.assertTrue(envtest.wait_for(pod_back, 60), "j06-worker-0 was not recreated")
        self.assertTrue(self.quiet(), "not quiet after the repairs: %s" % self.window(2))


if __name__ == "__main__":
    envtest.main(Idle)
