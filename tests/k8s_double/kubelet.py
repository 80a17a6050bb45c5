#!/usr/bin/python3
"""A test "kubelet" for the Kubernetes API double: runs the pods the operator created as local
processes. NOT a kubelet: one container per pod, no images, no isolation.

For each pod with the label trellis.io/job-name it: writes the pod's Secret and ConfigMap volumes
into a local folder and rewrites their mount paths in the command and environment; resolves
fieldRef env (metadata.name, status.podIP = 127.0.0.1); runs the scheduler pod on a free local
port and points `<service>:<port>` in the other pods' environment at it; finds programs in
--bin-dir; reports phase Running, then Succeeded/Failed with the container's exit code through
the status subresource; stops the process of a pod that is deleted.

Usage: kubelet.py --server URL --bin-dir DIR --work-dir DIR
"""
import argparse
import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

LABEL_JOB = "trellis.io/job-name"


class Api:
    def __init__(self, server):
        self.server = server.rstrip("/")

    def call(self, method, path, body=None, content_type="application/json"):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def patch_status(self, ns, name, status):
        return self.call("PATCH", "/api/v1/namespaces/%s/pods/%s/status" % (ns, name), {"status": status},
                         "application/merge-patch+json")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Kubelet:
    def __init__(self, api, bin_dir, work_dir):
        self.api, self.bin_dir, self.work_dir = api, bin_dir, work_dir
        self.procs = {}      # (ns, name, uid) -> Popen
        self.services = {}   # "<service>:<port>" -> "127.0.0.1:<local port>"
        self.done = set()    # uids that ran to the end

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
            for path, loc in mounts.items():
                s = s.replace(path, loc)
            return s

        argv = [local(a) for a in c.get("command", []) + c.get("args", [])]
        env = {"PATH": self.bin_dir + ":" + os.environ.get("PATH", "/usr/bin:/bin")}
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
            port = free_port()
            cport = str(c["ports"][0]["containerPort"])
            argv = [("127.0.0.1" if a == "0.0.0.0" else a) for a in argv]
            argv = [(str(port) if a == cport else a) for a in argv]
            svc = pod["metadata"]["labels"][LABEL_JOB] + "-scheduler:" + cport
            self.services[svc] = "127.0.0.1:%d" % port
        elif "TRELLIS_SCHEDULER" in env:
            target = self.services.get(env["TRELLIS_SCHEDULER"])
            if target is None:
                return False  # the scheduler pod has not started yet
            env["TRELLIS_SCHEDULER"] = target
        prog = os.path.join(self.bin_dir, argv[0])
        if os.path.exists(prog):
            argv[0] = prog
        log = open(os.path.join(self.work_dir, name + ".log"), "wb")
        p = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.procs[(ns, name, pod["metadata"]["uid"])] = p
        self.api.patch_status(ns, name, {"phase": "Running", "podIP": "127.0.0.1",
                                         "containerStatuses": [{"name": c["name"], "ready": True,
                                                                "state": {"running": {}}}]})
        return True

    def stop(self, p):
        try:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(timeout=5)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()

    def step(self):
        code, lst = self.api.call("GET", "/api/v1/pods?labelSelector=" + LABEL_JOB)
        if code != 200:
            return
        live = set()
        for pod in lst["items"]:
            ns, name, uid = pod["metadata"].get("namespace", "default"), pod["metadata"]["name"], pod["metadata"]["uid"]
            live.add((ns, name, uid))
            if (ns, name, uid) not in self.procs and uid not in self.done and \
                    pod.get("status", {}).get("phase", "Pending") == "Pending":
                self.start(ns, pod)
        for key, p in list(self.procs.items()):
            if key not in live:  # deleted: stop its process
                self.stop(p)
                del self.procs[key]
                self.done.add(key[2])
                continue
            rc = p.poll()
            if rc is not None:
                code = rc if rc >= 0 else 128 - rc
                self.api.patch_status(key[0], key[1], {
                    "phase": "Succeeded" if code == 0 else "Failed",
                    "containerStatuses": [{"name": "trellis", "ready": False,
                                           "state": {"terminated": {"exitCode": code}}}]})
                del self.procs[key]
                self.done.add(key[2])

    def shutdown(self, *_):
        for p in self.procs.values():
            self.stop(p)
        sys.exit(0)


def main():
    ap = argparse.ArgumentParser(description="run the double's pods as local processes")
    ap.add_argument("--server", required=True)
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--work-dir", required=True)
    args = ap.parse_args()
    k = Kubelet(Api(args.server), os.path.abspath(args.bin_dir), os.path.abspath(args.work_dir))
    signal.signal(signal.SIGTERM, k.shutdown)
    signal.signal(signal.SIGINT, k.shutdown)
    while True:
        k.step()
        time.sleep(0.1)  # a poll loop of a helper process, not test synchronisation


if __name__ == "__main__":
    main()
