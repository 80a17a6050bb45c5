#!/usr/bin/python3
"""A local double of the Kubernetes API server for the operator's tests. NOT a real API server.

Speaks the real JSON shapes and HTTP semantics for what the operator uses: core/v1 pods,
services, secrets, configmaps, events; coordination.k8s.io/v1 leases; trellis.io/v1alpha1
trainingjobs with the status subresource. Covers: create (409 AlreadyExists, 422 without a
name), get (404), list with labelSelector and list resourceVersion, update with optimistic
concurrency (409 Conflict on a stale metadata.resourceVersion), JSON merge patch, the status
subresource (PUT/PATCH .../status touches only status; the main resource ignores status for
kinds that have the subresource), delete with ownerReference cascading (done at once, where a
real cluster's garbage collector is asynchronous), and watch streams (chunked JSON lines of
{"type","object"}, from a resourceVersion, bookmarks, 410 Gone as an ERROR event when the
resourceVersion is older than the kept history, timeoutSeconds).
Not covered: pod scheduling or a kubelet (tests set pod status themselves), graceful deletion,
field selectors, server-side apply, admission, schema validation, RBAC (one bearer token,
401 without it). HTTPS with a given certificate (--tls-cert/--tls-key), for the CA path.

Test hooks (not Kubernetes API): POST /_double/compact forgets the event history (older
watches get 410), POST /_double/break-watches drops every open watch stream,
POST /_double/fail?method=POST&path=/api/v1/namespaces/default/pods&count=N answers the next N
matching requests with 500 InternalError (or &code=422&reason=Invalid&message=...: that answer, as
a real server refuses an object its validation rejects), POST /_double/expire-watches ends every open watch with a 410 Gone ERROR event (as an API server
does when its watch cache can no longer serve the version), GET /_double/stats
gives per-kind create counts and the names ever created (and "requests": counts by verb and
resource, LIST and WATCH apart from GET), POST /_double/token?value=T makes T the
one bearer token accepted from now on (a rotated service-account token).

Usage: k8s_double.py [--port 0] [--port-file PATH] [--token TOKEN] [--tls-cert PEM --tls-key PEM
                     [--client-ca PEM]]   (--client-ca: require a client certificate signed by it)
"""
import argparse
import copy
import json
import re
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

# plural -> (group/version prefix, kind, namespaced, has status subresource)
RESOURCES = {
    ("", "v1", "pods"): ("Pod", True),
    ("", "v1", "services"): ("Service", False),
    ("", "v1", "secrets"): ("Secret", False),
    ("", "v1", "configmaps"): ("ConfigMap", False),
    ("", "v1", "events"): ("Event", False),
    ("coordination.k8s.io", "v1", "leases"): ("Lease", False),
    ("trellis.io", "v1alpha1", "trainingjobs"): ("TrainingJob", True),
}
HISTORY_LIMIT = 10000


def now_rfc3339():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def status_obj(code, reason, message):
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


def merge_patch(target, patch):
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if not isinstance(target, dict):
        target = {}
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        else:
            target[k] = merge_patch(target.get(k), v)
    return target


def labels_match(obj, selector):
    if not selector:
        return True
    labels = obj.get("metadata", {}).get("labels") or {}
    for term in selector.split(","):
        term = term.strip()
        if not term:
            continue
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k) == v:
                return False
        elif "=" in term:
            k, v = term.split("==", 1) if "==" in term else term.split("=", 1)
            if labels.get(k) != v:
                return False
        elif labels.get(term) is None:
            return False
    return True


class Store:
    def __init__(self):
        self.cv = threading.Condition()
        self.rv = 100
        self.objects = {}  # (res, ns, name) -> obj   GUARDED_BY(cv)
        self.history = []  # (rv, res, type, obj)     GUARDED_BY(cv)
        self.oldest = 100  # watches from an older resourceVersion get 410
        self.epoch = 0  # bumped by break-watches
        self.created = {}  # kind -> [names ever created]
        self.open_watches = 0  # GUARDED_BY(cv)
        self.failures = []  # [method, path prefix, count, code, reason, message]: injected   GUARDED_BY(cv)
        self.expired = set()  # epochs whose watches end with 410 Gone instead of a dropped stream
        self.requests = {}  # "VERB resource[/sub]" -> count (VERB as the API server counts: LIST, WATCH, GET...)

    def _emit(self, res, typ, obj):
        self.history.append((int(obj["metadata"]["resourceVersion"]), res, typ, copy.deepcopy(obj)))
        if len(self.history) > HISTORY_LIMIT:
            self.history.pop(0)
            self.oldest = self.history[0][0] - 1
        self.cv.notify_all()

    def _bump(self, obj):
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)

    def create(self, res, ns, body):
        kind, _ = RESOURCES[res]
        meta = body.setdefault("metadata", {})
        name = meta.get("name")
        if not name:
            return 422, status_obj(422, "Invalid", "%s \"\" is invalid: metadata.name: Required value" % kind)
        with self.cv:
            key = (res, ns, name)
            if key in self.objects:
                return 409, status_obj(409, "AlreadyExists", '%s "%s" already exists' % (res[2], name))
            obj = copy.deepcopy(body)
            obj["apiVersion"] = res[1] if not res[0] else res[0] + "/" + res[1]
            obj["kind"] = kind
            m = obj["metadata"]
            if ns is not None:
                m["namespace"] = ns
            m["uid"] = str(uuid.uuid4())
            m["creationTimestamp"] = now_rfc3339()
            m["generation"] = 1
            for k in ("resourceVersion", "deletionTimestamp"):
                m.pop(k, None)
            if kind == "Pod":
                obj["status"] = {"phase": "Pending"}
            elif RESOURCES[res][1]:
                obj.pop("status", None)
            if kind == "Secret" and "stringData" in obj:
                import base64
                data = obj.setdefault("data", {})
                for k, v in obj.pop("stringData").items():
                    data[k] = base64.b64encode(v.encode()).decode()
            self._bump(obj)
            self.objects[key] = obj
            self.created.setdefault(kind, []).append(name)
            self._emit(res, "ADDED", obj)
            return 201, obj

    def get(self, res, ns, name):
        with self.cv:
            obj = self.objects.get((res, ns, name))
            if obj is None:
                return 404, status_obj(404, "NotFound", '%s "%s" not found' % (res[2], name))
            return 200, copy.deepcopy(obj)

    def update(self, res, ns, name, body, subresource, patch):
        kind, has_status = RESOURCES[res]
        with self.cv:
            cur = self.objects.get((res, ns, name))
            if cur is None:
                return 404, status_obj(404, "NotFound", '%s "%s" not found' % (res[2], name))
            want_rv = (body.get("metadata") or {}).get("resourceVersion") if isinstance(body, dict) else None
            if want_rv and want_rv != cur["metadata"]["resourceVersion"]:
                return 409, status_obj(409, "Conflict",
                                       'Operation cannot be fulfilled on %s "%s": the object has been modified; '
                                       'please apply your changes to the latest version and try again' %
                                       (res[2], name))
            want_uid = (body.get("metadata") or {}).get("uid") if isinstance(body, dict) else None
            if want_uid and want_uid != cur["metadata"]["uid"]:
                # What kube-apiserver answers: the uid cannot change, so a stale uid is a precondition.
                return 422, status_obj(422, "Invalid", '%s "%s" is invalid: metadata.uid: Invalid value: "%s": '
                                       'field is immutable' % (res[2], name, want_uid))
            new = merge_patch(copy.deepcopy(cur), body) if patch else copy.deepcopy(body)
            if subresource == "status":
                obj = copy.deepcopy(cur)
                if "status" in new:
                    obj["status"] = new["status"]
                else:
                    obj.pop("status", None)
            else:
                obj = new
                obj["apiVersion"], obj["kind"] = cur["apiVersion"], cur["kind"]
                for k in ("uid", "creationTimestamp", "namespace", "name", "generation"):
                    if k in cur["metadata"]:
                        obj.setdefault("metadata", {})[k] = cur["metadata"][k]
                if has_status:
                    if "status" in cur:
                        obj["status"] = cur["status"]
                    else:
                        obj.pop("status", None)
                if obj.get("spec") != cur.get("spec"):
                    obj["metadata"]["generation"] = cur["metadata"].get("generation", 1) + 1
            if obj == cur:
                return 200, copy.deepcopy(cur)
            self._bump(obj)
            self.objects[(res, ns, name)] = obj
            self._emit(res, "MODIFIED", obj)
            return 200, copy.deepcopy(obj)

    def delete(self, res, ns, name):
        with self.cv:
            obj = self.objects.pop((res, ns, name), None)
            if obj is None:
                return 404, status_obj(404, "NotFound", '%s "%s" not found' % (res[2], name))
            self._bump(obj)
            self._emit(res, "DELETED", obj)
            self._cascade(obj["metadata"]["uid"])
            return 200, obj

    def _cascade(self, uid):
        for key, o in list(self.objects.items()):
            owners = o["metadata"].get("ownerReferences") or []
            if any(r.get("uid") == uid for r in owners) and key in self.objects:
                self.delete(key[0], key[1], key[2])

    def list(self, res, ns, selector):
        with self.cv:
            items = []
            for (r, n, _), o in sorted(self.objects.items()):
                if r == res and (ns is None or n == ns) and labels_match(o, selector):
                    item = copy.deepcopy(o)
                    item.pop("apiVersion", None)  # list items carry no kind/apiVersion
                    item.pop("kind", None)
                    items.append(item)
            kind, _ = RESOURCES[res]
            return 200, {"kind": kind + "List", "apiVersion": res[1] if not res[0] else res[0] + "/" + res[1],
                         "metadata": {"resourceVersion": str(self.rv)}, "items": items}


STORE = Store()
TOKEN = None
BOOKMARK_SECONDS = 0.5


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # quiet
        pass

    def _send(self, code, obj):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        try:
            return json.loads(raw or b"{}")
        except ValueError as e:
            self._send(400, status_obj(400, "BadRequest", "invalid JSON body: %s" % e))
            return None

    def _route(self):
        u = urlparse(self.path)
        q = {k: v[-1] for k, v in parse_qs(u.query).items()}
        parts = [p for p in u.path.split("/") if p]
        if parts[:1] == ["api"] and len(parts) >= 2:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return None, q
        ns = None
        if len(rest) >= 2 and rest[0] == "namespaces":
            ns, rest = rest[1], rest[2:]
        if not rest or (group, version, rest[0]) not in RESOURCES:
            return None, q
        res = (group, version, rest[0])
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if sub not in (None, "status") or (sub == "status" and not RESOURCES[res][1]):
            return None, q
        verb = self.command
        if verb == "GET" and name is None:
            verb = "WATCH" if q.get("watch") in ("true", "1") else "LIST"
        key = "%s %s%s" % (verb, rest[0], "/" + sub if sub else "")
        with STORE.cv:
            STORE.requests[key] = STORE.requests.get(key, 0) + 1
        return (res, ns, name, sub), q

    def _auth(self):
        if TOKEN is not None and self.headers.get("Authorization") != "Bearer " + TOKEN:
            self._send(401, status_obj(401, "Unauthorized", "Unauthorized"))
            return False
        with STORE.cv:
            for f in STORE.failures:
                if f[2] > 0 and f[0] == self.command and self.path.startswith(f[1]):
                    f[2] -= 1
                    n = int(self.headers.get("Content-Length") or 0)
                    if n:
                        self.rfile.read(n)
                    self._send(f[3], status_obj(f[3], f[4], f[5]))
                    return False
        return True

    def _hook(self):
        if self.path.startswith("/_double/"):
            what = self.path[len("/_double/"):]
            with STORE.cv:
                if what == "compact":
                    STORE.history.clear()
                    STORE.oldest = STORE.rv
                elif what in ("break-watches", "expire-watches"):
                    if what == "expire-watches":
                        STORE.expired.add(STORE.epoch)
                    STORE.epoch += 1
                    STORE.cv.notify_all()
                elif what.startswith("fail?"):
                    q = {k: v[-1] for k, v in parse_qs(what[5:]).items()}
                    STORE.failures.append([q["method"], q["path"], int(q.get("count", "1")), int(q.get("code", "500")),
                                           q.get("reason", "InternalError"), q.get("message", "injected failure")])
                elif what.startswith("token?"):
                    global TOKEN
                    TOKEN = parse_qs(what[6:])["value"][-1]
                elif what == "stats":
                    return self._send(200, {"created": STORE.created, "resourceVersion": str(STORE.rv),
                                            "openWatches": STORE.open_watches, "requests": STORE.requests})
                else:
                    return self._send(404, status_obj(404, "NotFound", "no such hook"))
            self._send(200, {})
            return True
        return False

    def do_GET(self):
        if self._hook() or not self._auth():
            return
        if self.path == "/healthz":
            return self._send(200, {})
        route, q = self._route()
        if route is None:
            return self._send(404, status_obj(404, "NotFound", "the server could not find the requested resource"))
        res, ns, name, sub = route
        if name is None and q.get("watch") in ("true", "1"):
            return self._watch(res, ns, q)
        if name is None:
            return self._send(*STORE.list(res, ns, q.get("labelSelector")))
        self._send(*STORE.get(res, ns, name))

    def do_POST(self):
        if self._hook() or not self._auth():
            return
        route, _ = self._route()
        body = self._body()
        if body is None:
            return
        if route is None or route[2] is not None or route[1] is None:
            return self._send(405 if route else 404, status_obj(405, "MethodNotAllowed", "cannot create here"))
        res, ns, _, _ = route
        if (body.get("metadata") or {}).get("namespace") not in (None, ns):
            return self._send(400, status_obj(400, "BadRequest", "the namespace of the object does not match"))
        self._send(*STORE.create(res, ns, body))

    def _update(self, patch):
        if not self._auth():
            return
        route, _ = self._route()
        body = self._body()
        if body is None:
            return
        if route is None or route[2] is None:
            return self._send(404, status_obj(404, "NotFound", "the server could not find the requested resource"))
        res, ns, name, sub = route
        if patch and "merge-patch" not in (self.headers.get("Content-Type") or ""):
            return self._send(415, status_obj(415, "UnsupportedMediaType", "only merge-patch+json is supported"))
        self._send(*STORE.update(res, ns, name, body, sub, patch))

    def do_PUT(self):
        self._update(patch=False)

    def do_PATCH(self):
        self._update(patch=True)

    def do_DELETE(self):
        if not self._auth():
            return
        route, _ = self._route()
        if route is None or route[2] is None:
            return self._send(404, status_obj(404, "NotFound", "the server could not find the requested resource"))
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            self.rfile.read(n)
        res, ns, name, _ = route
        self._send(*STORE.delete(res, ns, name))

    def _chunk(self, obj):
        data = (json.dumps(obj) + "\n").encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _watch(self, res, ns, q):
        selector = q.get("labelSelector")
        bookmarks = q.get("allowWatchBookmarks") in ("true", "1")
        deadline = time.time() + float(q.get("timeoutSeconds") or 1800)
        rv_text = q.get("resourceVersion") or "0"
        kind, _ = RESOURCES[res]
        api_version = res[1] if not res[0] else res[0] + "/" + res[1]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        with STORE.cv:
            STORE.open_watches += 1
        try:
            self._stream(res, ns, q, selector, bookmarks, deadline, rv_text, kind, api_version)
        finally:
            with STORE.cv:
                STORE.open_watches -= 1

    def _stream(self, res, ns, q, selector, bookmarks, deadline, rv_text, kind, api_version):
        try:
            with STORE.cv:
                epoch = STORE.epoch
                if rv_text == "0":
                    initial = [copy.deepcopy(o) for (r, n, _), o in sorted(STORE.objects.items())
                               if r == res and (ns is None or n == ns) and labels_match(o, selector)]
                    rv = STORE.rv
                else:
                    initial = []
                    rv = int(rv_text) if rv_text.isdigit() else -1
                    if rv < STORE.oldest:
                        initial = None
            if initial is None:
                self._chunk({"type": "ERROR", "object": status_obj(
                    410, "Expired", "too old resource version: %s (%d)" % (rv_text, STORE.oldest))})
                self.wfile.write(b"0\r\n\r\n")
                return
            for o in initial:
                self._chunk({"type": "ADDED", "object": o})
            last_bookmark = time.time()
            while True:
                with STORE.cv:
                    def scan():
                        return [(v, t, o) for (v, r, t, o) in STORE.history
                                if v > rv and r == res and (ns is None or o["metadata"].get("namespace") == ns)]
                    pending = scan()
                    if not pending and STORE.epoch == epoch:
                        STORE.cv.wait(timeout=0.2)
                        pending = scan()
                    broken = STORE.epoch != epoch
                    current_rv = STORE.rv  # read with `pending`: nothing between them is skipped
                if broken and epoch in STORE.expired:
                    self._chunk({"type": "ERROR", "object": status_obj(
                        410, "Expired", "too old resource version: %d" % rv)})
                    self.wfile.write(b"0\r\n\r\n")
                    return
                if broken:
                    self.close_connection = True
                    return  # no terminating chunk: the stream breaks like a dropped connection
                for v, t, o in pending:
                    rv = max(rv, v)
                    if labels_match(o, selector):
                        self._chunk({"type": t, "object": o})
                if bookmarks and time.time() - last_bookmark > BOOKMARK_SECONDS:
                    rv = max(rv, current_rv) if not pending else rv
                    self._chunk({"type": "BOOKMARK", "object": {"kind": kind, "apiVersion": api_version,
                                                                "metadata": {"resourceVersion": str(rv)}}})
                    last_bookmark = time.time()
                if time.time() >= deadline:
                    self.wfile.write(b"0\r\n\r\n")
                    return
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


def main():
    global TOKEN, BOOKMARK_SECONDS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file")
    ap.add_argument("--token")
    ap.add_argument("--bookmark-seconds", type=float, default=0.5, help="bookmark interval of watches")
    ap.add_argument("--tls-cert", help="serve HTTPS with this PEM certificate (and --tls-key)")
    ap.add_argument("--tls-key")
    ap.add_argument("--client-ca", help="with --tls-cert: require client certificates signed by this CA")
    args = ap.parse_args()
    TOKEN = args.token
    BOOKMARK_SECONDS = args.bookmark_seconds
    srv = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    if args.tls_cert:
        import ssl
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(args.tls_cert, args.tls_key)
        if args.client_ca:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(args.client_ca)
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    srv.daemon_threads = True
    port = srv.server_address[1]
    if args.port_file:
        with open(args.port_file + ".tmp", "w") as f:
            f.write(str(port))
        import os
        os.rename(args.port_file + ".tmp", args.port_file)
    print("k8s double listening on 127.0.0.1:%d" % port, flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
