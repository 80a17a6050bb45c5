#!/usr/bin/python3
"""The real-node tier's own checks (node.py): the one-node cluster comes up with its node Ready;
a pod from a locally built image (Debian's static busybox) runs to Succeeded and `kubectl logs`
shows its output; `kubectl exec` works; Service names resolve from inside a pod through the
cluster DNS (a ClusterIP Service, reached through kube-proxy, and a headless one publishing a
not-ready pod, as the operator's scheduler Service does); a pod reaches the API server through
the `kubernetes` Service with its service-account token; the host's sysctls, iptables and links
are those it had before.

Usage: node_smoke_test.py REPO BUILD_DIR   (exit 77 when a piece is missing: node.py says which)
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import node  # noqa: E402
from envtest_procs import wait_for  # noqa: E402

SH_LOOP = "trap 'exit 0' TERM; while true; do sleep 1; done"   # PID 1 that ends on SIGTERM


def host_state():
    """What the cluster must not change on the host: the kubelet's sysctls, iptables, links."""
    st = {}
    for k in node.KUBELET_SYSCTLS:
        with open("/proc/sys/" + k) as f:
            st[k] = f.read().strip()
    st["iptables"] = subprocess.run(["iptables-save"], capture_output=True, text=True).stdout
    st["links"] = sorted(l.split(":")[1].strip().split("@")[0] for l in
                         subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout.splitlines())
    st["addresses"] = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
    return st


HOST_BEFORE = host_state()


class Smoke(node.NodeCase):
    prefix = "smoke"

    @classmethod
    def setUpClass(cls):
        cls.cp.import_image(node.busybox_image(cls.cp.dir), node.BUSYBOX)

    def client(self, name="client"):
        """A long-running busybox pod to exec in."""
        self.apply(node.pod(name, node.BUSYBOX, ["sh", "-c", SH_LOOP]))
        self.wait_pod(name, "Running", 60)

    def retry_exec(self, pod, cmd, want, timeout=30):
        """Runs `cmd` in `pod` until its output contains `want` (DNS records follow within ~1 s)."""
        last = []

        def ok():
            r = self.exec_(pod, "sh", "-c", cmd, check=False)
            last[:] = [r.returncode, r.stdout + r.stderr]
            return r.returncode == 0 and want in r.stdout
        if not wait_for(ok, timeout, 1):
            self.fail("%s in %s: no %r after %d s; last: %s" % (cmd, pod, want, timeout, last))
        return last[1]

    def test_node_is_ready_with_its_address(self):
        n = self.cp.get("/api/v1/nodes/" + node.NODE_NAME)
        conds = {c["type"]: c["status"] for c in n["status"]["conditions"]}
        self.assertEqual(conds.get("Ready"), "True", conds)
        self.assertIn({"type": "InternalIP", "address": node.NODE_IP}, n["status"]["addresses"])
        self.assertEqual(n["status"]["nodeInfo"]["kubeletVersion"], "v1.24.1")
        self.assertTrue(n["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://"))

    def test_pod_runs_to_succeeded_and_logs_show_its_output(self):
        self.apply(node.pod("hello", node.BUSYBOX, ["sh", "-c", "echo hello from $(hostname); cat /etc/resolv.conf"]))
        p = self.wait_pod("hello", ("Succeeded", "Failed"), 60)
        self.assertEqual(p["status"]["phase"], "Succeeded", json.dumps(p["status"]))
        out = self.logs("hello")
        self.assertIn("hello from hello", out)
        self.assertIn("nameserver " + node.NODE_IP, out)       # the kubelet's clusterDNS
        self.assertIn("search %s.svc.cluster.local" % self.ns, out)
        self.assertTrue(p["status"]["podIP"].startswith("10.244.0."), p["status"])
        # a failing container is Failed with its exit code
        self.apply(node.pod("fails", node.BUSYBOX, ["sh", "-c", "echo bye; exit 3"]))
        p = self.wait_pod("fails", ("Succeeded", "Failed"), 60)
        self.assertEqual(p["status"]["phase"], "Failed")
        self.assertEqual(p["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"], 3)
        self.assertIn("bye", self.logs("fails"))

    def test_service_names_resolve_through_cluster_dns(self):
        # a web server behind a ClusterIP Service (kube-proxy) ...
        web = node.pod("web", node.BUSYBOX, ["sh", "-c", "echo web-ok > /tmp/index.html; exec httpd -f -p 8080 -h /tmp"],
                       container={"ports": [{"containerPort": 8080}],
                                  "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1}})
        web["metadata"]["labels"] = {"app": "web"}
        self.apply(web)
        self.apply({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
                    "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}})
        # ... and a headless Service publishing a pod that never becomes ready (the operator's
        # scheduler Service is one: clusterIP None, publishNotReadyAddresses)
        lazy = node.pod("lazy", node.BUSYBOX, ["sh", "-c", SH_LOOP],
                        container={"readinessProbe": {"exec": {"command": ["false"]}, "periodSeconds": 1}})
        lazy["metadata"]["labels"] = {"app": "lazy"}
        self.apply(lazy)
        self.apply({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "lazy"},
                    "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": {"app": "lazy"},
                             "ports": [{"port": 7000}]}})
        self.client()
        web_ip = self.wait_pod("web", "Ready", 60)["status"]["podIP"]
        lazy_ip = self.wait_pod("lazy", "Running", 60)["status"]["podIP"]
        svc_ip = self.cp.get("/api/v1/namespaces/%s/services/web" % self.ns)["spec"]["clusterIP"]
        fq = "web.%s.svc.cluster.local" % self.ns
        self.retry_exec("client", "nslookup " + fq, svc_ip)
        self.retry_exec("client", "nslookup lazy.%s.svc.cluster.local" % self.ns, lazy_ip)
        # through the Service's ClusterIP, by name (kube-proxy's rules, DNS)
        self.retry_exec("client", "timeout 10 wget -q -O- http://%s/index.html" % fq, "web-ok")
        self.retry_exec("client", "timeout 10 wget -q -O- http://%s:8080/index.html" % web_ip, "web-ok")
        self.assertNotIn("True", [c["status"] for c in self.pod_obj("lazy")["status"]["conditions"]
                                  if c["type"] == "Ready"])

    def test_pod_reaches_the_api_server_through_the_kubernetes_service(self):
        self.client("api-client")
        sa = "/var/run/secrets/kubernetes.io/serviceaccount"
        env = self.exec_("api-client", "env").stdout
        self.assertIn("KUBERNETES_SERVICE_HOST=" + node.SERVICE_IP, env)
        self.assertEqual(self.exec_("api-client", "cat", sa + "/namespace").stdout, self.ns)
        get = ('timeout 15 wget -q -O- --no-check-certificate --header "Authorization: Bearer $(cat %s/token)" '
               'https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT' % sa)
        out = self.retry_exec("api-client", get + "/api", '"APIVersions"')
        self.assertIn('"serverAddress": "%s:%d"' % (node.NODE_IP, node.API_PORT), out)
        # by name too, and the token is what lets it in (anonymous: 403)
        self.retry_exec("api-client", get.replace("$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT",
                                                  "kubernetes.default.svc.cluster.local") + "/version", '"v1.24.1"')
        r = self.exec_("api-client", "sh", "-c", "timeout 15 wget -q -O- --no-check-certificate "
                       "https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT/api", check=False)
        self.assertNotEqual(r.returncode, 0, r.stdout)
        # the serving certificate is valid for the Service's address (what in-cluster clients check)
        cert = subprocess.run(["openssl", "x509", "-noout", "-ext", "subjectAltName", "-in",
                               os.path.join(self.cp.dir, "apiserver.crt")], capture_output=True, text=True).stdout
        self.assertIn("IP Address:" + node.SERVICE_IP, cert)
        self.assertIn("IP Address:" + node.NODE_IP, cert)

    def test_the_host_is_untouched(self):
        now = host_state()
        for k in HOST_BEFORE:
            self.assertEqual(now[k], HOST_BEFORE[k], k)
        self.assertNotIn("cni0", now["links"])
        inside = self.cp.in_ns("iptables-save").stdout
        self.assertIn("KUBE-SERVICES", inside)     # kube-proxy's rules are there, not on the host
        inside = self.cp.in_ns("cat", "/proc/sys/vm/overcommit_memory").stdout.strip()
        self.assertEqual(inside, node.KUBELET_SYSCTLS["vm/overcommit_memory"])


if __name__ == "__main__":
    node.main(Smoke)
