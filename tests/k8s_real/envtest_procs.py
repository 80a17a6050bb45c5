"""Processes, certificates and kubeconfigs for the envtest fixture (envtest.py): what it needs
below the Kubernetes API. Stdlib only; openssl makes the certificates."""
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import time


def wait_for(cond, timeout, interval=0.2):
    """Polls cond() until it returns something truthy (returned) or `timeout` s pass (None)."""
    deadline = time.time() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.time() >= deadline:
            return None
        time.sleep(interval)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent():
    # PR_SET_PDEATHSIG: the child is killed when the test process dies, even by SIGKILL.
    _libc.prctl(1, signal.SIGKILL)


class Proc:
    """A process of the fixture, in its own session, output to `log`."""

    def __init__(self, name, argv, log, env=None):
        self.name, self.argv, self.log = name, argv, log
        with open(log, "ab") as f:
            self.popen = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          env=env, start_new_session=True, preexec_fn=_die_with_parent)

    def alive(self):
        return self.popen.poll() is None

    def stop(self, sig=signal.SIGTERM, timeout=10):
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, sig)
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
            except ProcessLookupError:
                pass
        try:  # whatever is left of its group
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self.popen.poll() is None:
            self.popen.wait()
        return self.popen.returncode

    def text(self):
        try:
            with open(self.log, errors="replace") as f:
                return f.read()
        except OSError:
            return ""


def free_stale_etcd_dirs(parent):
    for name in os.listdir(parent):
        parts = name.split("-")
        if name.startswith("trellis-etcd-") and len(parts) >= 4 and parts[2].isdigit() and \
                not os.path.exists("/proc/" + parts[2]):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def _openssl(*args, cwd):
    r = subprocess.run(["openssl"] + list(args), cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("openssl %s: %s" % (" ".join(args), r.stderr))


def make_certs(d, serving_sans=()):
    """A CA, the API server's serving cert (127.0.0.1/localhost, plus `serving_sans` such as
    "IP:10.0.0.1"), an admin client cert (O=system:masters) and the service-account signing key,
    as PEM files in d."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=envtest-ca",
             cwd=d)
    with open(os.path.join(d, "serving.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc%s\n"
                "extendedKeyUsage=serverAuth\n" % "".join("," + s for s in serving_sans))
    with open(os.path.join(d, "client.ext"), "w") as f:
        f.write("extendedKeyUsage=clientAuth\n")
    for name, subj, ext in (("apiserver", "/CN=kube-apiserver", "serving.ext"),
                            ("admin", "/O=system:masters/CN=envtest-admin", "client.ext")):
        _sign(d, name, subj, ext)
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=d)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)


def make_client_cert(d, name, subj):
    """NAME.crt/NAME.key in d (after make_certs): a client certificate of its CA for `subj`,
    e.g. "/O=system:nodes/CN=system:node:NODE"."""
    _sign(d, name, subj, "client.ext")
    return os.path.join(d, name + ".crt"), os.path.join(d, name + ".key")


def _sign(d, name, subj, ext):
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-new", *ec, "-keyout", name + ".key", "-out", name + ".csr", "-subj", subj, cwd=d)
    _openssl("x509", "-req", "-in", name + ".csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "2", "-extfile", ext, "-out", name + ".crt", cwd=d)


def write_kubeconfig(path, server, ca, user):
    cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "envtest",
           "clusters": [{"name": "envtest", "cluster": {"server": server, "certificate-authority": ca}}],
           "users": [{"name": "envtest", "user": user}],
           "contexts": [{"name": "envtest", "context": {"cluster": "envtest", "user": "envtest"}}]}
    with open(path, "w") as f:
        json.dump(cfg, f, indent=1)  # JSON is YAML
    return path
