#!/usr/bin/python3
"""bench_operator: the operator at 300 jobs, on a real API server (tests/k8s_real/envtest.py:
etcd + kube-apiserver + kube-controller-manager from KUBEBUILDER_ASSETS or build/k8s-assets, the
chart helm-installed, trellis-operator with the chart's ServiceAccount token and RBAC).

  1. N small TrainingJobs (1 server, 1 worker: 3 pods, a Service, a ConfigMap, a Secret each) are
     applied at once (8 client threads). No kubelet: the pods stay Pending. Measured: the time
     until every job's objects exist and every job has a status.
  2. Left alone for --idle-seconds (default 95: three 30 s resyncs). Measured from the API
     server's own apiserver_request_total (delta over the window, by verb/resource): requests per
     second, writes, LIST calls; the operator is the only client of these resources then (the
     control plane alone is measured first, for 20 s, and printed as the floor). Operator RSS
     (VmRSS, VmHWM) and CPU (utime+stime over the window) from /proc.
  3. --changes jobs are changed one at a time (spec.runPolicy.suspend: true); measured: the time
     from the PATCH until the job's status says Suspended (seen on a watch), p50 and p99. Also the
     operator's own trellis_operator_reconcile_duration_seconds and watch restarts.

Each figure is printed next to its goal (issue 36 part 3), met or not. Not a pass/fail test: exit 0
unless the bench itself could not run (77: no API server binaries, as the k8s tests skip).

Usage: bench_operator [--jobs 300] [--idle-seconds 95] [--changes 50] [--bin-dir build/bin]
                      [--operator-args "--resync-seconds 30"]
"""
import argparse
import concurrent.futures
import json
import os
import re
import shlex
import ssl
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "k8s_real"))
import envtest  # noqa: E402

GROUP = "/apis/trellis.io/v1alpha1"
OWNED = ("trainingjobs", "pods", "services", "configmaps", "secrets", "events", "leases")
WRITES = ("POST", "PUT", "PATCH", "DELETE", "DELETECOLLECTION", "CREATE", "UPDATE")
GOAL_P99_S = 1.0
GOAL_RSS_MIB = 150.0


def load():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def proc_cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_mem_mib(pid):
    out = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                out[k] = int(v.split()[0]) / 1024.0
    return out


def delta(after, before):
    d = {}
    for k, v in after.items():
        n = v - before.get(k, 0)
        if n > 0:
            d[k] = n
    return d


def operator_metrics(port):
    """The operator's /metrics as {name{labels}: value} (empty when unreachable)."""
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            try:
                out[k] = float(v)
            except ValueError:
                pass
    return out


def metric_sum(metrics, name):
    """The sum of every series of `name` (whatever its labels)."""
    return sum(v for k, v in metrics.items() if k == name or k.startswith(name + "{"))


def histogram_quantile(metrics, name, q):
    buckets = []
    for k, v in metrics.items():
        m = re.search(r'[{,]le="([^"]+)"', k) if k.startswith(name + "_bucket{") else None
        if m:
            buckets.append((float(m.group(1)), v))
    buckets.sort()
    if not buckets or buckets[-1][1] == 0:
        return None
    want = q * buckets[-1][1]
    for le, n in buckets:
        if n >= want:
            return le
    return None


def percentile(xs, q):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    i = min(len(xs) - 1, max(0, int(round(q * (len(xs) - 1)))))
    return xs[i]


class PhaseWatch(threading.Thread):
    """Watches the namespace's TrainingJobs and notes when each first shows status.phase == want."""

    def __init__(self, cp, ns, rv, want):
        super().__init__(daemon=True)
        self.cp, self.ns, self.rv, self.want = cp, ns, rv, want
        self.seen = {}
        self.cond = threading.Condition()

    def run(self):
        ctx = ssl.create_default_context(cafile=self.cp.ca_file)
        ctx.load_cert_chain(os.path.join(self.cp.dir, "admin.crt"), os.path.join(self.cp.dir, "admin.key"))
        rv = self.rv
        while True:
            url = "%s%s/namespaces/%s/trainingjobs?watch=true&resourceVersion=%s&timeoutSeconds=600" % (
                self.cp.server, GROUP, self.ns, rv)
            try:
                with urllib.request.urlopen(url, context=ctx, timeout=700) as r:
                    for line in r:
                        ev = json.loads(line)
                        obj = ev.get("object", {})
                        rv = obj.get("metadata", {}).get("resourceVersion", rv)
                        if (obj.get("status") or {}).get("phase") == self.want:
                            with self.cond:
                                self.seen.setdefault(obj["metadata"]["name"], time.time())
                                self.cond.notify_all()
            except Exception:  # noqa: BLE001 - a broken stream is reopened
                time.sleep(0.2)

    def wait(self, name, timeout):
        deadline = time.time() + timeout
        with self.cond:
            while name not in self.seen and time.time() < deadline:
                self.cond.wait(deadline - time.time())
            return self.seen.get(name)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=300)
    ap.add_argument("--idle-seconds", type=float, default=95)
    ap.add_argument("--changes", type=int, default=50)
    ap.add_argument("--bin-dir", default=os.path.join(REPO, "build", "bin"))
    ap.add_argument("--operator-args", default="", help="extra trellis-operator flags, one string")
    ap.add_argument("--create-timeout", type=float, default=600)
    args = ap.parse_args()
    envtest.REPO, envtest.BIN = REPO, os.path.abspath(args.bin_dir)
    if not os.environ.get("KUBEBUILDER_ASSETS") and os.path.isdir(os.path.join(REPO, "build", "k8s-assets")):
        os.environ["KUBEBUILDER_ASSETS"] = os.path.join(REPO, "build", "k8s-assets")
    assets = envtest.find_assets()
    if not assets or not envtest.find_helm() or not os.access(os.path.join(envtest.BIN, "trellis-operator"), os.X_OK):
        print("bench_operator: skipped: needs KUBEBUILDER_ASSETS (or build/k8s-assets), helm and trellis-operator\n"
              + envtest.HOW_TO_GET)
        return 77
    cp = envtest.ControlPlane(assets)
    envtest._current.append(cp)
    try:
        return run(cp, args)
    finally:
        envtest._stop_all()


def run(cp, args):
    n = args.jobs
    print("bench_operator: %d jobs, idle window %.0f s, %d changes; load %s; %d CPUs" % (
        n, args.idle_seconds, args.changes, load(), os.cpu_count()), flush=True)
    cp.start(lambda c: c.helm_install())
    ns = cp.namespace("bench")
    port = envtest.free_port()
    rows = []  # (figure, value, goal, met)

    # The control plane alone (controller manager, the API server's own loops): the floor.
    floor_s = 20.0
    before = cp.request_counts()
    time.sleep(floor_s)
    floor = delta(cp.request_counts(), before)
    floor_owned = sum(v for k, v in floor.items() if k[1] in OWNED)

    op = cp.start_operator(name="operator", namespace=ns,
                           args=["--metrics-port", str(port), "--metrics-host", "127.0.0.1"] +
                           shlex.split(args.operator_args))
    pid = op.popen.pid
    if not envtest.wait_for(lambda: operator_metrics(port), 30):
        raise RuntimeError("the operator's /metrics did not come up:\n" + op.text()[-3000:])

    # 1. N jobs at once.
    url = "%s/namespaces/%s/trainingjobs" % (GROUP, ns)
    t0 = time.time()
    load_create = load()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for f in [pool.submit(cp.create, url, envtest.sleeping_job("j%03d" % i)) for i in range(n)]:
            f.result()
    t_applied = time.time() - t0
    sel = "?labelSelector=trellis.io/job-name"

    def counts():
        c = {}
        for r in ("pods", "services", "configmaps", "secrets"):
            c[r] = len(cp.get("/api/v1/namespaces/%s/%s%s" % (ns, r, sel))["items"])
        c["status"] = sum(1 for j in cp.get(url)["items"] if (j.get("status") or {}).get("phase"))
        return c
    want = {"pods": 3 * n, "services": n, "configmaps": n, "secrets": n, "status": n}
    last = {}

    def all_there():
        last.update(counts())
        return last == want
    if not envtest.wait_for(all_there, args.create_timeout, 1.0):
        raise RuntimeError("after %.0f s: %s, want %s\n%s" % (args.create_timeout, last, want, op.text()[-3000:]))
    t_objects = time.time() - t0
    print("created: %d jobs POSTed in %.1f s; every object and status there after %.1f s (load %s)" % (
        n, t_applied, t_objects, load_create), flush=True)
    rows.append(("time until every job's objects exist (%d jobs)" % n, "%.1f s" % t_objects, "(none)", "-"))

    # 2. Left alone.
    time.sleep(10)  # the last creations' echoes (watch events of our own writes)
    m0 = operator_metrics(port)
    load_idle = load()
    before = cp.request_counts()
    cpu0, w0 = proc_cpu_seconds(pid), time.time()
    time.sleep(args.idle_seconds)
    after = cp.request_counts()
    cpu1, w1 = proc_cpu_seconds(pid), time.time()
    window = w1 - w0
    mem = proc_mem_mib(pid)
    d = {k: v for k, v in delta(after, before).items() if k[1] in OWNED}
    total = sum(d.values())
    writes = sum(v for k, v in d.items() if k[0] in WRITES)
    lists = sum(v for k, v in d.items() if k[0] == "LIST")
    status_writes = sum(v for k, v in d.items() if k[0] in WRITES and k[2] == "status")
    print("\nidle window %.0f s (load %s at its start, %s at its end): API requests on %s by verb/resource/code:" % (
        window, load_idle, load(), "/".join(OWNED)))
    by = {}
    for (verb, res, sub, code), v in sorted(d.items()):
        by_key = "%s %s%s %s" % (verb, res, "/" + sub if sub else "", code)
        by[by_key] = v
        print("  %-40s %6d  (%.2f/s)" % (by_key, v, v / window))
    if not d:
        print("  (none)")
    print("  control plane alone before the operator started: %.0f requests on these resources in %.0f s" % (
        floor_owned, floor_s), flush=True)
    m_idle = operator_metrics(port)
    own = {k: v - m0.get(k, 0) for k, v in m_idle.items() if k.startswith("trellis_operator_api_requests_total")}
    if own:
        print("  the operator's own count (trellis_operator_api_requests_total) over the window: " + (", ".join(
            "%s %d" % (k.split("{", 1)[1].rstrip("}"), v) for k, v in sorted(own.items()) if v > 0) or "none"))
    else:
        print("  (this operator has no trellis_operator_api_requests_total)")
    # The API server counts every client; the operator's own count (when it has one) says which
    # of these are its own (kube-apiserver GETs its "kubernetes" Service itself, ~0.1/s).
    own_total = sum(v for v in own.values()) if own else None
    own_watch = sum(v for k, v in own.items() if 'verb="WATCH"' in k) if own else None
    rows.append(("API requests/s while idle (API server's count, every client)",
                 "%.2f/s (%d in %.0f s)" % (total / window, total, window), "(the control plane's own: %d in %.0f s "
                 "before the operator)" % (floor_owned, floor_s), "-"))
    if own is not None and own:
        rows.append(("API requests/s while idle (the operator's own count)",
                     "%.2f/s (%d in %.0f s, %d of them watches)" % (own_total / window, own_total, window, own_watch),
                     "watches only", "met" if own_total == own_watch else "not met"))
    else:
        rows.append(("API requests/s while idle (the operator's own count)", "n/a (no such metric)", "watches only",
                     "not met" if total - floor_owned * window / floor_s > 1 else "-"))
    rows.append(("writes while idle", "%d (%.2f/s)" % (writes, writes / window), "0", "met" if writes == 0 else "not met"))
    rows.append(("LIST calls while idle", "%d (%.2f/s)" % (lists, lists / window), "0", "met" if lists == 0 else "not met"))
    rows.append(("status writes while idle", "%d" % status_writes, "0", "met" if status_writes == 0 else "not met"))
    cpu = (cpu1 - cpu0) / window
    rows.append(("operator CPU while idle", "%.1f%% of a core" % (100 * cpu), "(none)", "-"))
    print("operator: CPU %.1f%% of a core over the idle window; RSS %.1f MiB, peak %.1f MiB" % (
        100 * cpu, mem.get("VmRSS", 0), mem.get("VmHWM", 0)), flush=True)
    rows.append(("operator RSS (now / peak)", "%.1f / %.1f MiB" % (mem.get("VmRSS", 0), mem.get("VmHWM", 0)),
                 "< %.0f MiB" % GOAL_RSS_MIB, "met" if mem.get("VmHWM", 1e9) < GOAL_RSS_MIB else "not met"))

    # 3. One job changes at a time.
    rv = cp.get(url)["metadata"]["resourceVersion"]
    watch = PhaseWatch(cp, ns, rv, "Suspended")
    watch.start()
    time.sleep(0.5)
    load_changes = load()
    lat = []
    missed = 0
    step = max(1, n // max(1, args.changes))
    for i in range(min(args.changes, n)):
        name = "j%03d" % ((i * step) % n)
        t = time.time()
        code, obj = cp.api("PATCH", "%s/%s" % (url, name), {"spec": {"runPolicy": {"suspend": True}}},
                           content_type="application/merge-patch+json")
        if code != 200:
            raise RuntimeError("PATCH %s: %d %s" % (name, code, obj))
        seen = watch.wait(name, 60)
        if seen is None:
            missed += 1
        else:
            lat.append(seen - t)
        time.sleep(0.7)  # spread over the resync period
    m1 = operator_metrics(port)
    p50, p99 = percentile(lat, 0.50), percentile(lat, 0.99)
    print("\nchanges: %d jobs suspended one at a time (load %s at the start, %s at the end): change -> status "
          "Suspended p50 %.3f s, p99 %.3f s, max %.3f s%s" % (
              len(lat), load_changes, load(), p50, p99, max(lat) if lat else float("nan"),
              ", %d not seen within 60 s" % missed if missed else ""), flush=True)
    rows.append(("change -> status written, p50", "%.3f s" % p50, "(none)", "-"))
    rows.append(("change -> status written, p99 (%d changes)" % len(lat), "%.3f s" % p99, "< %.0f s" % GOAL_P99_S,
                 "met" if p99 < GOAL_P99_S and not missed else "not met"))
    name = "trellis_operator_reconcile_duration_seconds"
    q50, q99 = histogram_quantile(m1, name, 0.5), histogram_quantile(m1, name, 0.99)
    rows.append(("one reconcile call (operator histogram, bucket bound) p50 / p99",
                 "<= %s / <= %s s" % (q50, q99), "(none)", "-"))
    restarts = metric_sum(m1, "trellis_operator_watch_restarts_total")
    rows.append(("watch restarts (whole run)", "%d" % restarts, "0", "met" if restarts == 0 else "not met"))
    reconciles_idle = metric_sum(m_idle, "trellis_operator_reconciles_total") - metric_sum(m0, "trellis_operator_reconciles_total")
    print("operator: %d reconciles in the idle window (the resyncs)" % reconciles_idle)
    if not op.alive():
        raise RuntimeError("the operator exited:\n" + op.text()[-3000:])

    print("\n| figure | value | goal | met |\n| --- | --- | --- | --- |")
    for r in rows:
        print("| %s | %s | %s | %s |" % r)
    print("\nload at the end: %s; operator flags: %s" % (load(), args.operator_args or "(defaults)"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
