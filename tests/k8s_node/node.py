"""A one-node Kubernetes v1.24.1 cluster for tests, with a real node: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, containerd + runc, kubelet, kube-proxy (iptables mode)
and a cluster DNS (dnsmasq fed from Services and Endpoints), all inside ONE private network and
mount namespace (`unshare --mount --net --propagation private`, held by a long-lived process;
every component joins it with `nsenter -t PID -m -n`). Pods run as real containers from images
imported into containerd; `kubectl logs`/`exec`, probes, Service ClusterIPs, the `kubernetes`
Service and service-account tokens work as on a cluster. The facts it follows are those of
shared/k8s/README.md (each was tried on these machines).

The host is left as it was: its network, sysctls and iptables are never touched (the kubelet's
global sysctls are bind-mounted files inside the namespace; /run, /var/lib and /var/log are
private tmpfs there), and teardown stops every process by its recorded pid (the pods' processes
through their cgroups, kube-scheduler before the API server, SIGKILL after a timeout), removes
the cgroups the kubelet made (all under one cgroup root of this run) and the namespace goes away
with its last process. The test process itself stays outside: it reaches the API server through
a relay on a free loopback port (`relay` below), so `kubectl`, `helm` and the envtest helpers work
unchanged.

Layout inside the namespace: node `trellis-node`, IP 10.99.0.1/32 on `lo` (API server :6443,
kubelet :10250, DNS :53 there), pods on the bridge cni0 in 10.244.0.0/24, Services in
10.0.0.0/24 (`kubernetes` = 10.0.0.1:443 -> 10.99.0.1:6443). Cluster domain cluster.local.

Usage, one cluster per test file (start-up ~25 s on 2 cores):

    import node
    class MyTests(node.NodeCase):
        def test_x(self):
            self.cp.import_image(node.busybox_image(self.cp.dir))     # or any docker-archive
            self.apply(node.pod("hello", node.BUSYBOX, ["echo", "hi"]))
            self.wait_pod("hello", "Succeeded", 60)
            self.assertIn("hi", self.logs("hello"))
    if __name__ == "__main__":
        node.main(MyTests)          # argv: REPO BUILD_DIR

Node (NodeCase.cp) is an envtest.ControlPlane (api/get/create/delete, kubectl, helm,
helm_install, sa_token, namespace, dump_logs work as there) plus:
  import_image(docker_archive, name=None)   `ctr -n k8s.io image import` (name: checked present)
  images()                                  the image names containerd's CRI namespace holds
  in_ns(*argv)                              a command run inside the namespace -> CompletedProcess
  node_name, node_ip, pod_cidr
NodeCase (an envtest.EnvtestCase: self.ns per test): apply(obj_or_yaml, ns=None),
  pod_obj(name), wait_pod(name, phases, timeout), logs(name, container=None), exec_(name, *cmd).
Module: pod(name, image, command, **spec) a Pod dict; busybox_image(dir) a docker-archive of
  Debian's static busybox tagged BUSYBOX; docker_archive(path, tag, files, entrypoint, cmd);
  chart_image(repo) -> "repository:appVersion" (what the chart deploys by default).

Skips (exit 77, saying what is missing) without root, the Kubernetes binaries (KUBEBUILDER_ASSETS
or BUILD_DIR/k8s-assets: scripts/k8s-assets.sh) or the Debian packages (scripts/install-deps.sh);
with TRELLIS_K8S_NODE_REQUIRED=1 (.ci/run) it fails instead. TRELLIS_NODE_TESTS="*pattern*,..."
runs only the tests whose names match.
"""
import ctypes
import hashlib
import io
import json
import os
import select
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import unittest
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "k8s_real"))
import envtest  # noqa: E402
from envtest_procs import free_port, wait_for, make_certs, make_client_cert, write_kubeconfig, \
    free_stale_etcd_dirs  # noqa: E402

SKIP = 77
NODE_NAME = "trellis-node"
NODE_IP = "10.99.0.1"
POD_CIDR = "10.244.0.0/24"
SERVICE_CIDR = "10.0.0.0/24"
SERVICE_IP = "10.0.0.1"          # the `kubernetes` Service: the range's first address
API_PORT = 6443
CLUSTER_DOMAIN = "cluster.local"
PAUSE_IMAGE = "registry.k8s.io/pause:3.6"
BUSYBOX = "trellis.test/busybox:1"
# The kubelet's global sysctls, bind-mounted inside the namespace holding exactly these values:
# the kubelet is content and the host's values never change.
KUBELET_SYSCTLS = {"vm/overcommit_memory": "1", "vm/panic_on_oom": "0", "kernel/panic": "10",
                   "kernel/panic_on_oops": "1", "kernel/keys/root_maxkeys": "1000000",
                   "kernel/keys/root_maxbytes": "25000000"}
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy")
# program -> the Debian package that brings it
TOOLS = {"containerd": "containerd", "containerd-shim-runc-v2": "containerd", "ctr": "containerd",
         "runc": "runc", "dnsmasq": "dnsmasq-base", "unshare": "util-linux", "nsenter": "util-linux",
         "ip": "iproute2", "iptables": "iptables", "iptables-restore": "iptables", "openssl": "openssl",
         "gcc": "gcc"}
CNI_PLUGINS = ("bridge", "host-local", "loopback")   # containernetworking-plugins, /usr/lib/cni
CNI_BIN = "/usr/lib/cni"
PAUSE_C = r"""
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
static void stop(int s) { (void)s; _exit(0); }
static void reap(int s) { (void)s; while (waitpid(-1, 0, WNOHANG) > 0) {} }
int main(void) {
  signal(SIGTERM, stop); signal(SIGINT, stop); signal(SIGCHLD, reap);
  for (;;) pause();
}
"""


def _which(prog):
    return shutil.which(prog, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")


def find_binaries(build_dir):
    """The folder with every Kubernetes binary the node needs: KUBEBUILDER_ASSETS, else
    BUILD_DIR/k8s-assets (scripts/k8s-assets.sh). -> (folder or None, what is missing)."""
    for d in (os.environ.get("KUBEBUILDER_ASSETS", ""), os.path.join(build_dir, "k8s-assets")):
        if d and os.path.isdir(d):
            missing = [b for b in BINARIES if not os.access(os.path.join(d, b), os.X_OK)]
            if not missing:
                return os.path.abspath(d), []
            return None, ["%s (in %s)" % (", ".join(missing), d)]
    return None, ["the Kubernetes binaries (KUBEBUILDER_ASSETS or %s/k8s-assets)" % build_dir]


def missing_pieces(build_dir):
    """What this machine lacks to start a node, as readable lines (empty: nothing)."""
    out = []
    if os.geteuid() != 0:
        out.append("root (namespaces, mounts, cgroups, containerd)")
    _, miss = find_binaries(build_dir)
    out += ["%s: scripts/k8s-assets.sh %s unpacks them from shared/k8s" % (m, build_dir) for m in miss]
    pk = sorted({TOOLS[t] for t in TOOLS if not _which(t)} |
                {"containernetworking-plugins" for p in CNI_PLUGINS if not os.access(os.path.join(CNI_BIN, p), os.X_OK)})
    if pk:
        out.append("Debian packages %s (scripts/install-deps.sh installs them)" % " ".join(pk))
    if not os.path.isfile("/usr/lib/x86_64-linux-gnu/libc.a") and not os.path.isfile("/usr/lib/libc.a"):
        out.append("a static C library for the pause image (libc6-dev)")
    if not os.path.isdir("/sys/fs/cgroup/memory"):
        out.append("cgroup v1 hierarchies under /sys/fs/cgroup (the node is set up for those)")
    if not out and subprocess.run(["unshare", "--mount", "--net", "true"], capture_output=True).returncode != 0:
        out.append("permission to create namespaces (unshare --mount --net failed)")
    return out


def chart_image(repo):
    """The image the chart deploys with its default values: "repository:appVersion"."""
    sys.path.insert(0, os.path.join(repo, "tests", "image"))
    from image_test import chart_image as ci
    return "%s:%s" % ci(repo)



def install_trellis(cp, build_dir, release="trellis", namespace="trellis-system", who="node"):
    """The user's install on node `cp`: the image of `make image` imported into containerd, then
    `helm install` of charts/trellis with default values but image.pullPolicy=Never (no registry
    here); waits until the operator Deployment is Available. -> the image name."""
    import envtest
    image = chart_image(envtest.REPO)
    cp.import_image(os.path.join(build_dir, "trellis-image.docker.tar"), image)
    t = time.time()
    cp.helm("install", release, os.path.join(envtest.REPO, "charts/trellis"), "--namespace", namespace,
            "--create-namespace", "--set", "image.pullPolicy=Never")
    r = cp.kubectl("wait", "--for=condition=Available", "deployment/%s-operator" % release, "-n", namespace,
                   "--timeout=180s", check=False)
    if r.returncode != 0:
        print(cp.kubectl("get", "pods,events", "-n", namespace, "-o", "wide", check=False).stdout)
        print(cp.kubectl("logs", "-n", namespace, "deployment/%s-operator" % release, check=False).stdout[-4000:])
        raise AssertionError("the operator Deployment is not Available: %s%s" % (r.stdout, r.stderr))
    print("%s: helm install -> operator Available in %.1f s" % (who, time.time() - t), flush=True)
    return image

# ---- images without a registry ---------------------------------------------------------------------
def docker_archive(path, tag, files, entrypoint=None, cmd=None, env=("PATH=/bin:/usr/bin",)):
    """Writes a docker-archive (what `ctr image import` and `docker load` read) of one layer.
    files: (name, bytes or None for a folder, mode, symlink target or None)."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, data, mode, link in files:
            ti = tarfile.TarInfo(name)
            ti.mode, ti.mtime = mode, 0
            if link is not None:
                ti.type, ti.linkname = tarfile.SYMTYPE, link
                t.addfile(ti)
            elif data is None:
                ti.type = tarfile.DIRTYPE
                t.addfile(ti)
            else:
                ti.size = len(data)
                t.addfile(ti, io.BytesIO(data))
    layer = layer.getvalue()
    diff = hashlib.sha256(layer).hexdigest()
    config = json.dumps({"architecture": "amd64", "os": "linux", "created": "1970-01-01T00:00:00Z",
                         "config": {"Entrypoint": entrypoint, "Cmd": cmd, "Env": list(env)},
                         "rootfs": {"type": "layers", "diff_ids": ["sha256:" + diff]},
                         "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "tests/k8s_node/node.py"}]},
                        sort_keys=True).encode()
    cfg = hashlib.sha256(config).hexdigest()
    manifest = json.dumps([{"Config": cfg + ".json", "RepoTags": [tag], "Layers": [diff + "/layer.tar"]}]).encode()
    with tarfile.open(path, "w") as t:
        for name, data in ((diff + "/layer.tar", layer), (cfg + ".json", config), ("manifest.json", manifest)):
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode = len(data), 0o644
            t.addfile(ti, io.BytesIO(data))
    return path


def pause_image(d):
    """registry.k8s.io/pause:3.6 from a static C program that sleeps until SIGTERM/SIGINT."""
    src, exe = os.path.join(d, "pause.c"), os.path.join(d, "pause")
    with open(src, "w") as f:
        f.write(PAUSE_C)
    r = subprocess.run(["gcc", "-static", "-Os", "-s", "-o", exe, src], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("gcc -static pause.c: " + r.stderr)
    with open(exe, "rb") as f:
        data = f.read()
    return docker_archive(os.path.join(d, "pause.docker.tar"), PAUSE_IMAGE, [("pause", data, 0o755, None)],
                          entrypoint=["/pause"])


BUSYBOX_APPLETS = ("sh", "echo", "cat", "sleep", "nslookup", "wget", "ls", "env", "hostname", "grep", "true",
                   "seq", "httpd", "ip", "timeout", "false")


def busybox_image(d, tag=BUSYBOX):
    """A docker-archive of Debian's static busybox (busybox-static) with its common applets."""
    with open("/bin/busybox", "rb") as f:
        data = f.read()
    files = [("bin", None, 0o755, None), ("bin/busybox", data, 0o755, None), ("tmp", None, 0o1777, None)]
    files += [("bin/" + a, None, 0o777, "busybox") for a in BUSYBOX_APPLETS]
    return docker_archive(os.path.join(d, "busybox.docker.tar"), tag, files, cmd=["sh"])


def pod(name, image, command, restart="Never", **spec):
    """A Pod of one container `main` (imagePullPolicy Never: no registry is reachable)."""
    c = {"name": "main", "image": image, "imagePullPolicy": "Never", "command": list(command)}
    c.update(spec.pop("container", {}))
    s = {"restartPolicy": restart, "containers": [c], "terminationGracePeriodSeconds": 5}
    s.update(spec)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": s}


# ---- the cluster -----------------------------------------------------------------------------------
class Node(envtest.ControlPlane):
    node_name, node_ip, pod_cidr = NODE_NAME, NODE_IP, POD_CIDR

    def __init__(self, assets):
        super().__init__(assets)
        os.rmdir(self.dir)
        self.dir = tempfile.mkdtemp(prefix="trellis-node-%d-" % os.getpid())
        # In every process's environment (the final sweep; containerd's shims inherit it) and the
        # kubelet's cgroupRoot (kubepods below it): named by our pid, so that a later run frees
        # what a killed one left (free_stale).
        self.marker = "trellis-node-%d" % os.getpid()
        self.cgroup_root = "/" + self.marker
        self.holder = None
        self.sock = os.path.join(self.dir, "containerd", "containerd.sock")
        self.by_name = {}

    # ---- processes -----------------------------------------------------------------------------
    def spawn(self, name, argv, env=None, in_ns=True):
        """A Proc; inside the namespace (nsenter execs the program: its pid is the program's)."""
        if in_ns:
            argv = ["nsenter", "-t", str(self.holder.popen.pid), "-m", "-n", "--"] + list(argv)
        p = super().spawn(name, argv, env)
        self.by_name[name] = p
        return p

    def in_ns(self, *argv, check=True, timeout=60, input=None):
        r = subprocess.run(["nsenter", "-t", str(self.holder.popen.pid), "-m", "-n", "--"] + list(argv),
                           capture_output=True, text=True, timeout=timeout, input=input)
        if check and r.returncode != 0:
            raise RuntimeError("%s: %s%s" % (" ".join(argv), r.stdout, r.stderr))
        return r

    def _check_alive(self):
        for p in self.procs:
            if not p.alive():
                raise RuntimeError("%s exited (%s):\n%s" % (p.name, p.popen.returncode, p.text()[-3000:]))

    def _wait(self, what, cond, timeout, interval=0.3):
        def c():
            self._check_alive()
            return cond()
        v = wait_for(c, timeout, interval)
        if not v:
            raise RuntimeError("%s: not after %d s" % (what, timeout))
        return v

    def start(self, before_controller_manager=None):
        t0 = time.time()
        d = self.dir
        steps = []

        def step(what):
            steps.append("%s %.1f" % (what, time.time() - t0))
        free_stale()
        # The namespace, held by a sleeping process; everything else joins it.
        self.holder = super().spawn("namespace", ["unshare", "--mount", "--net", "--propagation", "private",
                                                  "sleep", "infinity"])
        self._wait("the namespace", lambda: os.readlink("/proc/%d/ns/net" % self.holder.popen.pid) !=
                   os.readlink("/proc/self/ns/net") and
                   os.readlink("/proc/%d/exe" % self.holder.popen.pid).endswith("sleep"), 10, 0.05)
        self._setup_namespace()
        step("namespace")
        make_certs(d, serving_sans=("IP:" + NODE_IP, "IP:" + SERVICE_IP, "DNS:kubernetes",
                                    "DNS:kubernetes.default", "DNS:kubernetes.default.svc." + CLUSTER_DOMAIN))
        self.ca_file = os.path.join(d, "ca.crt")
        make_client_cert(d, "kubelet", "/O=system:nodes/CN=system:node:" + NODE_NAME)
        in_server = "https://%s:%d" % (NODE_IP, API_PORT)
        admin = {"client-certificate": os.path.join(d, "admin.crt"), "client-key": os.path.join(d, "admin.key")}
        self.ns_kubeconfig = write_kubeconfig(os.path.join(d, "in-ns-admin.kubeconfig"), in_server, self.ca_file, admin)
        kubelet_kc = write_kubeconfig(os.path.join(d, "kubelet.kubeconfig"), in_server, self.ca_file,
                                      {"client-certificate": os.path.join(d, "kubelet.crt"),
                                       "client-key": os.path.join(d, "kubelet.key")})
        # etcd on the namespace's loopback, its data on tmpfs (named by our pid: freed by a later run)
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else d
        free_stale_etcd_dirs(shm)
        self._etcd_data = tempfile.mkdtemp(prefix="trellis-etcd-%d-" % os.getpid(), dir=shm)
        etcd_url, peer = "http://127.0.0.1:2379", "http://127.0.0.1:2380"
        self.spawn("etcd", [os.path.join(self.assets, "etcd"), "--data-dir", self._etcd_data,
                            "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
                            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                            "--initial-cluster", "default=" + peer, "--log-level", "warn", "--logger", "zap"])
        # containerd meanwhile (it does not need the API server)
        self._start_containerd()
        self.spawn("kube-apiserver", [
            os.path.join(self.assets, "kube-apiserver"), "--etcd-servers", etcd_url,
            "--bind-address=" + NODE_IP, "--advertise-address=" + NODE_IP, "--secure-port=%d" % API_PORT,
            "--cert-dir", d, "--tls-cert-file", os.path.join(d, "apiserver.crt"),
            "--tls-private-key-file", os.path.join(d, "apiserver.key"), "--client-ca-file", self.ca_file,
            "--service-account-issuer=https://kubernetes.default.svc." + CLUSTER_DOMAIN,
            "--service-account-key-file", os.path.join(d, "sa.pub"),
            "--service-account-signing-key-file", os.path.join(d, "sa.key"),
            "--authorization-mode=Node,RBAC", "--service-cluster-ip-range=" + SERVICE_CIDR,
            "--kubelet-client-certificate", os.path.join(d, "admin.crt"),
            "--kubelet-client-key", os.path.join(d, "admin.key"),
            "--kubelet-preferred-address-types=InternalIP",
            "--allow-privileged=true", "--profiling=false", "--v=1"])
        # The test process stays outside: a relay from a free loopback port into the namespace.
        relay_port = free_port()
        self.spawn("relay", [sys.executable, os.path.abspath(__file__), "relay", str(relay_port),
                             str(self.holder.popen.pid), NODE_IP, str(API_PORT)], in_ns=False)
        self.server = "https://127.0.0.1:%d" % relay_port
        self.admin_kubeconfig = write_kubeconfig(os.path.join(d, "admin.kubeconfig"), self.server, self.ca_file, admin)
        self._ssl = ssl.create_default_context(cafile=self.ca_file)
        self._ssl.load_cert_chain(os.path.join(d, "admin.crt"), os.path.join(d, "admin.key"))
        self._wait("kube-apiserver /readyz", lambda: self.api("GET", "/readyz")[0] == 200, 90, 0.5)
        step("API ready")
        if before_controller_manager:
            before_controller_manager(self)
            step("before the controller manager")
        self.spawn("kube-controller-manager", [
            os.path.join(self.assets, "kube-controller-manager"), "--kubeconfig", self.ns_kubeconfig,
            "--leader-elect=false", "--use-service-account-credentials", "--root-ca-file", self.ca_file,
            "--service-account-private-key-file", os.path.join(d, "sa.key"), "--bind-address=127.0.0.1",
            "--controllers=*,-nodeipam,-csrsigning,-csrapproving,-csrcleaner,-bootstrapsigner,-tokencleaner",
            "--v=1"])
        self.spawn("kube-scheduler", [os.path.join(self.assets, "kube-scheduler"), "--kubeconfig", self.ns_kubeconfig,
                                      "--leader-elect=false", "--bind-address=127.0.0.1", "--v=1"])
        self._start_kubelet(kubelet_kc)
        self.spawn("kube-proxy", [
            os.path.join(self.assets, "kube-proxy"), "--kubeconfig", self.ns_kubeconfig, "--proxy-mode=iptables",
            "--cluster-cidr=" + POD_CIDR, "--hostname-override=" + NODE_NAME, "--bind-address=" + NODE_IP,
            "--conntrack-max-per-core=0", "--conntrack-min=0", "--conntrack-tcp-timeout-established=0",
            "--conntrack-tcp-timeout-close-wait=0", "--metrics-bind-address=127.0.0.1:10249",
            "--healthz-bind-address=127.0.0.1:10256", "--v=1"])
        self._start_dns()
        self._wait("node %s Ready" % NODE_NAME, self._node_ready, 90, 0.5)
        step("node Ready")
        self._wait("the default ServiceAccount",
                   lambda: self.api("GET", "/api/v1/namespaces/default/serviceaccounts/default")[0] == 200, 60)
        self._wait("the kubernetes Service's endpoints", lambda: (self.api(
            "GET", "/api/v1/namespaces/default/endpoints/kubernetes")[1].get("subsets") or [None])[0], 60)
        print("node: cluster up in %.1f s (%s)" % (time.time() - t0, ", ".join(steps)), flush=True)
        return self

    def _setup_namespace(self):
        d = self.dir
        sysd = os.path.join(d, "sysctl")
        os.makedirs(sysd)
        script = ["set -e", "ip link set lo up", "ip addr add %s/32 dev lo" % NODE_IP,
                  # private /run (netns, containerd's shim sockets, xtables.lock), /var/lib (CNI's
                  # cache), /var/log (pod logs): nothing of the host's is written or seen
                  "mount -t tmpfs -o mode=755 trellis-run /run", "mkdir -p /run/netns",
                  "mount -t tmpfs -o mode=755 trellis-var-lib /var/lib",
                  "mount -t tmpfs -o mode=755 trellis-var-log /var/log"]
        for k, v in KUBELET_SYSCTLS.items():
            f = os.path.join(sysd, k.replace("/", "."))
            with open(f, "w") as fh:
                fh.write(v + "\n")
            script.append("mount --bind %s /proc/sys/%s" % (f, k))
        self.in_ns("sh", "-c", "\n".join(script))

    def _start_containerd(self):
        d = self.dir
        c = os.path.join(d, "containerd")
        cni = os.path.join(d, "cni")
        os.makedirs(c)
        os.makedirs(cni)
        with open(os.path.join(cni, "10-trellis.conflist"), "w") as f:
            json.dump({"cniVersion": "0.4.0", "name": "trellis", "plugins": [{
                "type": "bridge", "bridge": "cni0", "isGateway": True, "isDefaultGateway": True,
                "hairpinMode": True, "ipMasq": False,
                "ipam": {"type": "host-local", "dataDir": os.path.join(d, "cni-ipam"),
                         "ranges": [[{"subnet": POD_CIDR}]]}}]}, f, indent=1)
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        with open(os.path.join(c, "config.toml"), "w") as f:
            f.write("""version = 2
root = "{c}/root"
state = "{c}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{c}/opt"
[{cri}]
  sandbox_image = "{pause}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
[{cri}.cni]
  bin_dir = "{cni_bin}"
  conf_dir = "{cni}"
""".format(c=c, sock=self.sock, cri=cri, pause=PAUSE_IMAGE, cni_bin=CNI_BIN, cni=cni))
        self.spawn("containerd", ["containerd", "--config", os.path.join(c, "config.toml")])
        self._wait("containerd's socket", lambda: os.path.exists(self.sock) and
                   self.in_ns("ctr", "-a", self.sock, "version", check=False).returncode == 0, 30)
        self.import_image(pause_image(d), PAUSE_IMAGE)

    def _start_kubelet(self, kubeconfig):
        d = self.dir
        k = os.path.join(d, "kubelet")
        os.makedirs(k)
        # the kubelet's cgroupRoot: one folder of this run in every v1 hierarchy (kubepods below it)
        for h in _cgroup_hierarchies():
            p = h + self.cgroup_root
            os.makedirs(p, exist_ok=True)
            if "cpuset" in os.path.basename(h).split(","):
                for f in ("cpuset.cpus", "cpuset.mems"):
                    with open(os.path.join(h, f)) as src, open(os.path.join(p, f), "w") as dst:
                        dst.write(src.read())
        with open(os.path.join(k, "resolv.conf"), "w") as f:
            f.write("nameserver %s\n" % NODE_IP)
        cfg = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "authentication": {"x509": {"clientCAFile": self.ca_file}, "anonymous": {"enabled": False},
                               "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "address": NODE_IP, "port": 10250, "readOnlyPort": 0, "healthzBindAddress": "127.0.0.1", "healthzPort": 10248,
            "cgroupDriver": "cgroupfs", "cgroupsPerQOS": True, "cgroupRoot": self.cgroup_root,
            "failSwapOn": False, "makeIPTablesUtilChains": False, "oomScoreAdj": 0,
            "clusterDNS": [NODE_IP], "clusterDomain": CLUSTER_DOMAIN, "resolvConf": os.path.join(k, "resolv.conf"),
            # a shared, busy disk: no eviction or image garbage collection because of it
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                             "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False, "nodeStatusUpdateFrequency": "4s",
            "volumeStatsAggPeriod": "0s", "fileCheckFrequency": "60s",
        }
        with open(os.path.join(k, "config.json"), "w") as f:
            json.dump(cfg, f, indent=1)   # JSON is YAML
        self.spawn("kubelet", [
            os.path.join(self.assets, "kubelet"), "--config", os.path.join(k, "config.json"),
            "--kubeconfig", kubeconfig, "--root-dir", os.path.join(k, "root"), "--cert-dir", os.path.join(k, "pki"),
            "--container-runtime=remote", "--container-runtime-endpoint=unix://" + self.sock,
            "--pod-infra-container-image=" + PAUSE_IMAGE, "--hostname-override", NODE_NAME,
            "--node-ip", NODE_IP, "--v=1"])

    def _start_dns(self):
        d = self.dir
        hosts = os.path.join(d, "dns-hosts")
        with open(hosts, "w"):
            pass
        os.chmod(hosts, 0o644)
        dns = self.spawn("dnsmasq", [
            "dnsmasq", "--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv", "--no-hosts",
            "--local=/#/", "--listen-address=" + NODE_IP, "--bind-interfaces", "--port=53",
            # as root: a change of user or group would clear its PR_SET_PDEATHSIG
            "--addn-hosts=" + hosts, "--pid-file=", "--user=root", "--group=root", "--log-facility=-", "--local-ttl=1"])
        self.spawn("dns-sync", [sys.executable, os.path.abspath(__file__), "dns-sync", self.ns_kubeconfig,
                                hosts, str(dns.popen.pid)])

    def _node_ready(self):
        code, n = self.api("GET", "/api/v1/nodes/" + NODE_NAME)
        return code == 200 and any(c.get("type") == "Ready" and c.get("status") == "True"
                                   for c in n.get("status", {}).get("conditions", []))

    # ---- images --------------------------------------------------------------------------------
    def import_image(self, archive, name=None, timeout=600):
        """Imports a docker-archive into containerd's CRI namespace (what the kubelet runs)."""
        t = time.time()
        self.in_ns("ctr", "-a", self.sock, "-n", "k8s.io", "images", "import", archive, timeout=timeout)
        if name and name not in self.images() and "docker.io/" + name not in self.images():
            raise RuntimeError("%s imported, but containerd lists %s" % (archive, self.images()))
        print("node: imported %s in %.1f s" % (name or archive, time.time() - t), flush=True)

    def images(self):
        out = self.in_ns("ctr", "-a", self.sock, "-n", "k8s.io", "images", "ls", "-q").stdout
        return set(out.split())

    # ---- teardown ------------------------------------------------------------------------------
    def stop(self):
        order = ["dns-sync", "dnsmasq", "kube-proxy", "kubelet"]
        for name in order:
            self._stop(name)
        self._kill_cgroup_procs()          # the pods' processes
        self._stop("containerd")
        self._sweep()                      # containerd's shims carry the marker
        # kube-scheduler hangs on SIGTERM once the API server is gone: before it.
        for name in ("kube-scheduler", "kube-controller-manager", "relay", "kube-apiserver", "etcd"):
            self._stop(name)
        for p in reversed(self.procs):     # anything else, then the namespace's holder
            p.stop(timeout=10)
        self.procs = []
        self._sweep()
        self._kill_cgroup_procs()
        self._remove_cgroups()
        shutil.rmtree(getattr(self, "_etcd_data", ""), ignore_errors=True)
        # the images and containers (GBs with the Trellis image); the logs stay while cp.dir is kept
        shutil.rmtree(os.path.join(self.dir, "containerd", "root"), ignore_errors=True)
        shutil.rmtree(os.path.join(self.dir, "kubelet", "root"), ignore_errors=True)

    def _stop(self, name):
        p = self.by_name.pop(name, None)
        if p and p in self.procs:
            p.stop(timeout=10)   # SIGTERM, SIGKILL after 10 s
            self.procs.remove(p)

    def _kill_cgroup_procs(self):
        _kill_cgroup_procs(self.cgroup_root)

    def _remove_cgroups(self):
        left = _remove_cgroups(self.cgroup_root)
        if left:
            print("node: cgroups left: %s" % left, flush=True)

    def dump_logs(self, procs=None, tail=4000):
        super().dump_logs(procs, tail)


def _cgroups(root):
    """Every cgroup below `root` (e.g. /trellis-node-PID), deepest first, in every hierarchy."""
    out = []
    for h in _cgroup_hierarchies(with_unified=True):
        top = h + root
        for dirpath, _, _ in os.walk(top) if os.path.isdir(top) else ():
            out.append(dirpath)
    return sorted(out, key=lambda p: -p.count("/"))


def _kill_cgroup_procs(root):
    for _ in range(50):
        pids = set()
        for cg in _cgroups(root):
            try:
                with open(os.path.join(cg, "cgroup.procs")) as f:
                    pids |= {int(x) for x in f.read().split()}
            except OSError:
                pass
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.1)


def _remove_cgroups(root):
    """rmdir of every cgroup below root, root included -> those left after ~5 s."""
    left = []
    for _ in range(20):
        left = []
        for cg in _cgroups(root):
            try:
                os.rmdir(cg)
            except OSError:
                left.append(cg)
        if not left:
            break
        time.sleep(0.25)
    return left


def free_stale():
    """What a killed run left: processes carrying its marker (dnsmasq, containerd's shims), then
    its pods' processes and cgroups (trellis-node-PID roots, PID gone)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % pid, "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        for e in env:
            if e.startswith(b"TRELLIS_ENVTEST_MARK=trellis-node-"):
                owner = e.split(b"-")[-1].decode()
                if owner.isdigit() and not os.path.exists("/proc/" + owner):
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except OSError:
                        pass
    tmp = tempfile.gettempdir()
    for name in os.listdir(tmp):   # in its folder the images and containers (GBs with Trellis's)
        parts = name.split("-")
        if name.startswith("trellis-node-") and len(parts) >= 4 and parts[2].isdigit() and \
                not os.path.exists("/proc/" + parts[2]):
            for big in ("containerd/root", "kubelet/root"):
                shutil.rmtree(os.path.join(tmp, name, big), ignore_errors=True)
    for h in _cgroup_hierarchies():
        for name in os.listdir(h):
            pid = name[len("trellis-node-"):]
            if name.startswith("trellis-node-") and pid.isdigit() and not os.path.exists("/proc/" + pid):
                _kill_cgroup_procs("/" + name)
                _remove_cgroups("/" + name)


def _cgroup_hierarchies(with_unified=False):
    out = []
    with open("/proc/self/mounts") as f:
        for line in f:
            parts = line.split()
            if parts[2] == "cgroup" or (with_unified and parts[2] == "cgroup2"):
                out.append(parts[1])
    return out


# ---- tests -----------------------------------------------------------------------------------------
class NodeCase(envtest.EnvtestCase):
    """A test on the shared one-node cluster `cp`, in its own namespace `ns`."""
    prefix = "node"

    def tearDown(self):
        result = self._outcome.result
        if any(t is self for t, _ in result.failures + result.errors):
            print(self.cp.kubectl("get", "pods,svc,endpoints,events", "-n", self.ns, "-o", "wide", check=False).stdout)
            for p in self.pods():
                for c in p["spec"]["containers"]:
                    r = self.cp.kubectl("logs", "-n", self.ns, p["metadata"]["name"], "-c", c["name"], "--tail=40",
                                        check=False)
                    print("\n===== kubectl logs %s -c %s =====\n%s%s" % (p["metadata"]["name"], c["name"], r.stdout,
                                                                         r.stderr), flush=True)
            self.cp.dump_logs([p for p in self.cp.procs if p.name in ("kubelet", "containerd", "dns-sync")], 3000)
        super().tearDown()

    def apply(self, obj, ns=None):
        text = obj if isinstance(obj, str) else json.dumps(obj)
        return self.cp.kubectl("apply", "-n", ns or self.ns, "-f", "-", input=text).stdout

    def pod_obj(self, name, ns=None):
        code, obj = self.cp.api("GET", "/api/v1/namespaces/%s/pods/%s" % (ns or self.ns, name))
        return obj if code == 200 else None

    def wait_pod(self, name, phases, timeout, ns=None):
        """Waits until pod `name` is in one of `phases` ("Running", "Succeeded", ... or "Ready");
        returns the pod."""
        want = (phases,) if isinstance(phases, str) else tuple(phases)

        def check():
            p = self.pod_obj(name, ns)
            if not p:
                return None
            st = p.get("status", {})
            ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions", []))
            return p if st.get("phase") in want or ("Ready" in want and ready) else None
        p = wait_for(check, timeout, 0.3)
        if p is None:
            self.fail("pod %s/%s not %s after %d s: %s" % (ns or self.ns, name, "/".join(want), timeout,
                                                           json.dumps((self.pod_obj(name, ns) or {}).get("status"))))
        return p

    def logs(self, name, container=None, ns=None):
        args = ["logs", "-n", ns or self.ns, name] + (["-c", container] if container else [])
        return self.cp.kubectl(*args).stdout

    def exec_(self, name, *cmd, ns=None, check=True):
        return self.cp.kubectl("exec", "-n", ns or self.ns, name, "--", *cmd, check=check)


RELEASE, CHART_NS = "trellis", "trellis-system"


def build_dir():
    """BUILD_DIR of argv (REPO BUILD_DIR), else REPO/build."""
    return os.path.abspath(sys.argv[2]) if len(sys.argv) >= 3 else os.path.join(envtest.REPO, "build")


class TrellisCase(NodeCase):
    """A test of Trellis as a user installs it: the class's cluster gets the image of `make image`
    and the chart (install_trellis) once; a failing test prints the operator's log and its jobs."""

    @classmethod
    def setUpClass(cls):
        cls.image = install_trellis(cls.cp, build_dir(), RELEASE, CHART_NS, cls.prefix)

    def tearDown(self):
        result = self._outcome.result
        if any(t is self for t, _ in result.failures + result.errors):
            print(self.cp.kubectl("logs", "-n", CHART_NS, "deployment/%s-operator" % RELEASE, "--tail=80",
                                  check=False).stdout)
            print(self.cp.kubectl("get", "tj", "-n", self.ns, "-o", "json", check=False).stdout[-4000:])
        super().tearDown()

    def status(self, job):
        return (self.job(job) or {}).get("status") or {}

    def step(self, job):
        return (self.status(job).get("progress") or {}).get("step", 0)

    def owned_left(self, job):
        """The Services, ConfigMaps and Secrets of `job` still in self.ns (by their names)."""
        return [o["metadata"]["name"] for kind in ("services", "configmaps", "secrets")
                for o in self.cp.get("/api/v1/namespaces/%s/%s" % (self.ns, kind))["items"]
                if o["metadata"]["name"].startswith(job + "-")]


def main_trellis(*cases):
    """main() for TrellisCase files: they also need the image of `make image` and helm."""
    b = build_dir()
    main(*cases, needs=[(os.path.join(b, "trellis-image.docker.tar"),
                         "the Trellis image %s/trellis-image.docker.tar (make image, or ctest's image.build)" % b),
                        (envtest.find_helm() or "/nonexistent/helm",
                         "helm (charts/install-helm.sh installs it into build-tools/helm)")])

def main(*cases, before_controller_manager=None, needs=()):
    """argv: REPO BUILD_DIR. Skips (77) or, with TRELLIS_K8S_NODE_REQUIRED=1, fails when a piece
    is missing (`needs`: more (path, what) pairs); otherwise one cluster for every case."""
    if len(sys.argv) >= 3:
        envtest.REPO = os.path.abspath(sys.argv[1])
        envtest.BIN = os.path.join(os.path.abspath(sys.argv[2]), "bin")
    build = os.path.dirname(envtest.BIN)
    missing = missing_pieces(build) + [what for path, what in needs if not os.path.exists(path)]
    if missing:
        required = os.environ.get("TRELLIS_K8S_NODE_REQUIRED") == "1"
        print("real-node tests %s: missing\n  %s" % ("FAIL (TRELLIS_K8S_NODE_REQUIRED=1)" if required else "skipped",
                                                     "\n  ".join(missing)), flush=True)
        sys.exit(1 if required else SKIP)
    assets, _ = find_binaries(build)
    if os.environ.get("TRELLIS_NODE_TESTS"):   # e.g. "*test_1*,*helm*": only the tests matching these
        unittest.defaultTestLoader.testNamePatterns = os.environ["TRELLIS_NODE_TESTS"].split(",")
    envtest.run_cases(Node(assets), cases, lambda cp: cp.start(before_controller_manager), "node")


# ---- helper processes (run as `node.py relay ...` / `node.py dns-sync ...`) -------------------------
def relay(listen_port, ns_pid, host, port):
    """Listens on 127.0.0.1:listen_port of the host's network namespace, then joins the node's and
    relays each connection to host:port there."""
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", listen_port))
    ls.listen(64)
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open("/proc/%d/ns/net" % ns_pid, os.O_RDONLY)
    if libc.setns(fd, 0x40000000) != 0:   # CLONE_NEWNET
        raise OSError(ctypes.get_errno(), "setns")
    os.close(fd)

    def pump(a, b):
        try:
            while True:
                r, _, _ = select.select([a, b], [], [], 600)
                if not r:
                    break
                for s in r:
                    data = s.recv(65536)
                    if not data:
                        return
                    (b if s is a else a).sendall(data)
        except OSError:
            pass
        finally:
            a.close()
            b.close()
    while True:
        c, _ = ls.accept()
        try:
            u = socket.create_connection((host, port), timeout=10)
            u.settimeout(None)
        except OSError:
            c.close()
            continue
        threading.Thread(target=pump, args=(c, u), daemon=True).start()


def _catches_sighup(pid):
    """Whether process `pid` has a handler for SIGHUP (bit 0 of SigCgt in /proc/PID/status)."""
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return int(line.split()[1], 16) & 1 == 1
    except OSError:
        return True  # gone: the kill below fails or is harmless, and the fixture notices
    return False


def dns_sync(kubeconfig, hosts, dnsmasq_pid):
    """Every second: <svc>.<ns>.svc.cluster.local -> ClusterIP, or for a headless Service its
    endpoints' addresses (not-ready ones too when it publishes them) and <hostname>.<svc>... for
    those with a hostname; written to `hosts` and dnsmasq sent SIGHUP when that changed."""
    with open(kubeconfig) as f:
        kc = json.load(f)
    server = kc["clusters"][0]["cluster"]["server"]
    user = kc["users"][0]["user"]
    ctx = ssl.create_default_context(cafile=kc["clusters"][0]["cluster"]["certificate-authority"])
    ctx.load_cert_chain(user["client-certificate"], user["client-key"])

    def get(path):
        with urllib.request.urlopen(server + path, context=ctx, timeout=10) as r:
            return json.load(r)["items"]
    last = None
    while True:
        try:
            svcs, eps = get("/api/v1/services"), get("/api/v1/endpoints")
        except Exception as e:   # the API server starting or going: try again
            print("dns-sync: %s" % e, flush=True)
            time.sleep(1)
            continue
        by = {(e["metadata"]["namespace"], e["metadata"]["name"]): e for e in eps}
        lines = set()
        for s in svcs:
            ns, name = s["metadata"]["namespace"], s["metadata"]["name"]
            fq = "%s.%s.svc.%s" % (name, ns, CLUSTER_DOMAIN)
            spec = s.get("spec", {})
            ip = spec.get("clusterIP")
            if ip and ip != "None":
                lines.add("%s %s" % (ip, fq))
                continue
            for sub in by.get((ns, name), {}).get("subsets") or []:
                addrs = list(sub.get("addresses") or [])
                if spec.get("publishNotReadyAddresses"):
                    addrs += sub.get("notReadyAddresses") or []
                for a in addrs:
                    lines.add("%s %s" % (a["ip"], fq))
                    if a.get("hostname"):
                        lines.add("%s %s.%s" % (a["ip"], a["hostname"], fq))
        text = "".join(l + "\n" for l in sorted(lines))
        if text != last:
            with open(hosts + ".tmp", "w") as f:
                f.write(text)
            os.chmod(hosts + ".tmp", 0o644)
            os.rename(hosts + ".tmp", hosts)
            # A SIGHUP before dnsmasq has its handler would end it (the first records come while
            # it may still be starting): wait, bounded, until it catches SIGHUP.
            wait_for(lambda: _catches_sighup(dnsmasq_pid), 10, 0.05)
            os.kill(dnsmasq_pid, signal.SIGHUP)
            print("dns-sync: %d records" % len(lines), flush=True)
            last = text
        time.sleep(1)


if __name__ == "__main__":
    if sys.argv[1] == "relay":
        relay(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5]))
    elif sys.argv[1] == "dns-sync":
        dns_sync(sys.argv[2], sys.argv[3], int(sys.argv[4]))
