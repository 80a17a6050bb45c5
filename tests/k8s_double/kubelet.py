#!/usr/bin/python3
"""A test "kubelet" for the Kubernetes API double: runs the pods the operator created as local
processes. NOT a kubelet: one container per pod, no images, no isolation.

For each pod with the label trellis.io/job-name it: writes the pod's Secret and ConfigMap volumes
into a local folder and rewrites their mount paths in the command and environment; resolves
fieldRef env (metadata.name, status.podIP = 127.0.0.1); runs the scheduler pod on a free local
port and points `<service>:<port>` in the other pods' environment at it; finds programs in
--bin-dir; reports phase Running, then Succeeded/Failed with the container's exit code through
the status subresource; stops the process of a pod that is deleted as a kubelet does: SIGTERM
to every deleted pod at once, SIGKILL after its terminationGracePeriodSeconds, and a recreated
pod of the same name only once the old one's process has exited (its previous log kept as
<name>.previous.log, and every earlier pod's log of that name, oldest first, in <name>.earlier.log).

With --rootfs ROOTFS (an unpacked image: `make image` leaves build/image/bundle/rootfs) each pod's
command runs inside that image instead of from --bin-dir, through tests/image/run_in_image.py:
its own overlay over the image, the image's user, environment and working directory (from the
bundle's config.json), its Secret and ConfigMap volumes bound in at their mountPath (no path
rewriting), programs found on the image's PATH. That is the image the chart deploys.

It talks to the double (plain HTTP) or to a real kube-apiserver (tests/k8s_real/envtest.py):
HTTPS with --ca-file, authenticated by a client certificate or a bearer token. A Service keeps
its local port for the kubelet's lifetime: a recreated scheduler pod listens where the job's
other pods already point (a Service name is stable in a cluster).

Usage: kubelet.py --server URL --bin-dir DIR --work-dir DIR [--namespace NS] [--rootfs ROOTFS]
                  [--full-file PATH] [--ca-file PEM] [--client-cert PEM --client-key PEM | --token-file PATH]
"""
import argparse
import base64
import ctypes
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request

LABEL_JOB = "trellis.io/job-name"
RUN_IN_IMAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "image", "run_in_image.py")


class Api:
    def __init__(self, server, ca_file=None, client_cert=None, client_key=None, token_file=None):
        self.server = server.rstrip("/")
        self.ctx = None
        if self.server.startswith("https://"):
            self.ctx = ssl.create_default_context(cafile=ca_file)
            if client_cert:
                self.ctx.load_cert_chain(client_cert, client_key)
        self.token_file = token_file

    def call(self, method, path, body=None, content_type="application/json"):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", content_type)
        if self.token_file:
            with open(self.token_file) as f:
                req.add_header("Authorization", "Bearer " + f.read().strip())
        try:
            with urllib.request.urlopen(req, timeout=10, context=self.ctx) as r:
                return r.status, json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")
        except (urllib.error.URLError, OSError) as e:  # the server restarting or gone: next round
            return 0, {"message": str(e)}

    def patch_status(self, ns, name, uid, status):
        # The uid is a precondition, as the real kubelet's status patch: a process of a deleted pod
        # must not write its exit onto the pod of the same name created after it.
        return self.call("PATCH", "/api/v1/namespaces/%s/pods/%s/status" % (ns, name),
                         {"metadata": {"uid": uid}, "status": status}, "application/merge-patch+json")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


_libc = ctypes.CDLL(None)


def _die_with_parent():
    _libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: no pod process outlives a killed kubelet


class Kubelet:
    def __init__(self, api, bin_dir, work_dir, namespace=None, rootfs=None, services_file=None, full_file=None):
        self.api, self.bin_dir, self.work_dir, self.namespace = api, bin_dir, work_dir, namespace
        self.full_file = full_file  # while this file exists the node is full: no pod is started
        self.rootfs = rootfs  # run pods inside this unpacked image (None: from bin_dir)
        self.services_file = services_file  # where the operator finds the Services (JSON)
        self.procs = {}      # (ns, name, uid) -> Popen
        self.services = {}   # (ns, "<service>:<port>") -> "127.0.0.1:<local port>", kept for our lifetime
        self.done = set()    # uids that ran to the end
        self.terminating = {}  # (ns, name, uid) -> (Popen, SIGKILL deadline): deleted, not exited yet

    def materialize(self, ns, pod, pod_dir):
        """Volumes -> local folders; returns {mountPath: local path}."""
        mounts = {}
        volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
        for m in pod["spec"]["containers"][0].get("volumeMounts", []):
            v = volumes.get(m["name"], {})
            local = os.path.join(pod_dir, m["name"])
            os.makedirs(local, exist_ok=True)
            if "secret" in v:
                code, obj = self.api.call("GET", "/api/v1/namespaces/%s/secrets/%s" % (ns, v["secret"]["secretName"]))
                if code != 200:
                    return None
                for k, val in (obj.get("data") or {}).items():
                    with open(os.path.join(local, k), "wb") as f:
                        f.write(base64.b64decode(val))
            elif "configMap" in v:
                code, obj = self.api.call("GET", "/api/v1/namespaces/%s/configmaps/%s" % (ns, v["configMap"]["name"]))
                if code != 200:
                    return None
                for k, val in (obj.get("data") or {}).items():
                    with open(os.path.join(local, k), "w") as f:
                        f.write(val)
            mounts[m["mountPath"]] = local
        return mounts

    def start(self, ns, pod):
        name = pod["metadata"]["name"]
        c = pod["spec"]["containers"][0]
        pod_dir = os.path.join(self.work_dir, name)
        os.makedirs(pod_dir, exist_ok=True)
        mounts = self.materialize(ns, pod, pod_dir)
        if mounts is None:
            return False  # its Secret/ConfigMap is not there yet: next round

        def local(s):
            if self.rootfs:
                return s  # the volumes are bound in at their mountPath
            for path, loc in mounts.items():
                s = s.replace(path, loc)
            return s

        argv = [local(a) for a in c.get("command", []) + c.get("args", [])]
        env = {"PATH": self.bin_dir + ":" + os.environ.get("PATH", "/usr/bin:/bin")}
        if "TRELLIS_ENVTEST_MARK" in os.environ:  # lets the envtest fixture find strays
            env["TRELLIS_ENVTEST_MARK"] = os.environ["TRELLIS_ENVTEST_MARK"]
        for e in c.get("env", []):
            if "value" in e:
                env[e["name"]] = local(e["value"])
            else:
                field = e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
                env[e["name"]] = {"metadata.name": name, "status.podIP": "127.0.0.1"}.get(field, "")
        # /metrics ports are fixed on Kubernetes (one pod per IP) but would collide on one host.
        for k in env:
            if k.endswith("METRICS_PORT"):
                env[k] = str(free_port())
        argv = [str(free_port()) if i > 0 and argv[i - 1] == "--metrics-port" else a for i, a in enumerate(argv)]
        role = pod["metadata"].get("labels", {}).get("trellis.io/role")
        if role == "scheduler":
            cport = str(c["ports"][0]["containerPort"])
            svc = (ns, pod["metadata"]["labels"][LABEL_JOB] + "-scheduler:" + cport)
            # The same local port for a recreated scheduler pod: the Service name does not change.
            addr = self.services.setdefault(svc, "127.0.0.1:%d" % free_port())
            self.write_services()
            port = addr.rsplit(":", 1)[1]
            argv = [("127.0.0.1" if a == "0.0.0.0" else a) for a in argv]
            argv = [(port if a == cport else a) for a in argv]
        elif "TRELLIS_SCHEDULER" in env:
            target = self.services.get((ns, env["TRELLIS_SCHEDULER"]))
            if target is None:
                return False  # the scheduler pod has not started yet
            env["TRELLIS_SCHEDULER"] = target
        # The container's terminationMessagePath: what its main process writes there becomes
        # state.terminated.message (the file must exist; the agent never creates it).
        term = os.path.join(pod_dir, "termination-log-" + pod["metadata"]["uid"])
        open(term, "w").close()
        if not self.rootfs:
            env["TRELLIS_TERMINATION_LOG"] = term
        if self.rootfs:
            # A recreated pod (same name, new uid) starts from the image again, like a new container.
            argv, env = self.in_image(argv, env, mounts, c, os.path.join(pod_dir, "fs-" + pod["metadata"]["uid"]))
        else:
            prog = os.path.join(self.bin_dir, argv[0])
            if os.path.exists(prog):
                argv[0] = prog
        log_path = os.path.join(self.work_dir, name + ".log")
        if os.path.exists(log_path):  # the previous pod of this name: `kubectl logs --previous`
            with open(log_path, "rb") as old, open(os.path.join(self.work_dir, name + ".earlier.log"), "ab") as all_:
                all_.write(old.read())
            os.replace(log_path, os.path.join(self.work_dir, name + ".previous.log"))
        log = open(log_path, "wb")
        p = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                             preexec_fn=_die_with_parent)
        log.close()
        p.termination_log = term
        p.grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
        self.procs[(ns, name, pod["metadata"]["uid"])] = p
        self.api.patch_status(ns, name, pod["metadata"]["uid"], {"phase": "Running", "podIP": "127.0.0.1",
                                         "containerStatuses": [{"name": c["name"], "ready": True,
                                                                "state": {"running": {}}}]})
        return True

    def in_image(self, argv, env, mounts, container, state_dir):
        """The pod's command through run_in_image.py: the container's env (the image's first, as a
        runtime merges them; not our PATH), its volumes at their mountPath, its workingDir."""
        wrapped = ["/usr/bin/python3", RUN_IN_IMAGE, self.rootfs, state_dir, "--die-with-parent"]
        for path, loc in mounts.items():
            wrapped += ["--bind", "%s:%s" % (loc, path)]
        for k, v in env.items():
            if k not in ("PATH", "TRELLIS_ENVTEST_MARK"):
                wrapped += ["--env", "%s=%s" % (k, v)]
        if container.get("workingDir"):
            wrapped += ["--workdir", container["workingDir"]]
        outer = {k: env[k] for k in ("TRELLIS_ENVTEST_MARK",) if k in env}
        return wrapped + ["--"] + argv, outer

    def write_services(self):
        """{"<ns>/<service>:<port>": "127.0.0.1:<local port>"}: the operator's --scheduler-addresses."""
        if not self.services_file:
            return
        tmp = self.services_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"%s/%s" % k: v for k, v in self.services.items()}, f)
        os.replace(tmp, self.services_file)

    def stop(self, p):
        try:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(timeout=5)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            self.kill(p)

    @staticmethod
    def kill(p):
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()

    def terminate(self, key, p):
        """A deleted pod, as a kubelet stops it: SIGTERM now, SIGKILL once its
        terminationGracePeriodSeconds are over; every deleted pod at once (`reap` waits)."""
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        self.terminating[key] = (p, time.monotonic() + p.grace)

    def reap(self):
        for key, (p, deadline) in list(self.terminating.items()):
            if p.poll() is None and time.monotonic() < deadline:
                continue
            if p.poll() is None:
                self.kill(p)
            del self.terminating[key]

    def step(self):
        where = "/api/v1/namespaces/%s/pods" % self.namespace if self.namespace else "/api/v1/pods"
        code, lst = self.api.call("GET", where + "?labelSelector=" + LABEL_JOB)
        if code != 200:
            return
        pods = {}
        for pod in lst["items"]:
            m = pod["metadata"]
            pods[(m.get("namespace", "default"), m["name"], m["uid"])] = pod
        # Deleted pods first: a recreated scheduler pod reuses its predecessor's port, so a pod
        # starts only once its same-named predecessor has exited (on a node, the old Pod object
        # stays until then, so nobody can create the new one earlier).
        for key, p in list(self.procs.items()):
            if key not in pods or pods[key]["metadata"].get("deletionTimestamp"):
                self.terminate(key, p)
                del self.procs[key]
                self.done.add(key[2])
        self.reap()
        ending = {(ns, name) for (ns, name, _) in self.terminating}
        full = self.full_file is not None and os.path.exists(self.full_file)
        for (ns, name, uid), pod in pods.items():
            if full:
                break
            if (ns, name, uid) not in self.procs and uid not in self.done and (ns, name) not in ending and \
                    not pod["metadata"].get("deletionTimestamp") and \
                    pod.get("status", {}).get("phase", "Pending") == "Pending":
                self.start(ns, pod)
        for key, p in list(self.procs.items()):
            rc = p.poll()
            if rc is not None:
                code = rc if rc >= 0 else 128 - rc
                terminated = {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}
                try:
                    with open(p.termination_log, errors="replace") as f:
                        message = f.read(4096)
                except OSError:
                    message = ""
                if message:
                    terminated["message"] = message
                self.api.patch_status(key[0], key[1], key[2], {
                    "phase": "Succeeded" if code == 0 else "Failed",
                    "containerStatuses": [{"name": "trellis", "ready": False,
                                           "state": {"terminated": terminated}}]})
                del self.procs[key]
                self.done.add(key[2])

    def shutdown(self, *_):
        for p in self.procs.values():
            self.stop(p)
        for p, _ in self.terminating.values():
            self.kill(p)
        sys.exit(0)


def main():
    ap = argparse.ArgumentParser(description="run the double's pods as local processes")
    ap.add_argument("--server", required=True)
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--work-dir", required=True)
    ap.add_argument("--namespace", help="only this namespace's pods (default: all)")
    ap.add_argument("--ca-file", help="PEM bundle that verifies an https server")
    ap.add_argument("--client-cert", help="client certificate (PEM), with --client-key")
    ap.add_argument("--client-key")
    ap.add_argument("--token-file", help="bearer token, re-read for every request")
    ap.add_argument("--rootfs", help="run each pod inside this unpacked image (build/image/bundle/rootfs)")
    ap.add_argument("--services-file", help="write the Services' local addresses here (JSON) for "
                    "the operator's --scheduler-addresses")
    ap.add_argument("--full-file", help="while this file exists the node has no room: new pods stay Pending "
                    "(a replacement waiting for a node)")
    args = ap.parse_args()
    api = Api(args.server, args.ca_file, args.client_cert, args.client_key, args.token_file)
    rootfs = os.path.abspath(args.rootfs) if args.rootfs else None
    if rootfs and not os.path.isfile(os.path.join(rootfs, "..", "config.json")):
        ap.error("--rootfs %s: not the rootfs of an unpacked image (no ../config.json)" % rootfs)
    k = Kubelet(api, os.path.abspath(args.bin_dir), os.path.abspath(args.work_dir), args.namespace, rootfs,
                args.services_file, args.full_file)
    signal.signal(signal.SIGTERM, k.shutdown)
    signal.signal(signal.SIGINT, k.shutdown)
    while True:
        k.step()
        time.sleep(0.1 if api.ctx is None else 0.2)  # a helper's poll loop, not test synchronisation


if __name__ == "__main__":
    main()
