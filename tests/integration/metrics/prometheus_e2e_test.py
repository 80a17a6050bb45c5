#!/usr/bin/python3
"""The dashboards against a real Prometheus (Debian's `prometheus`) scraping a real local job.

trellis-launch runs a small MLP job (scheduler, 2 servers, 2 workers, their agents) and writes
its file-SD targets; the trellis-operator runs against the API double beside it. Prometheus, on
a free loopback port with its own temporary storage, discovers them through the file-SD files.
Once every target was scraped a few times, while the job still runs:
  - `promtool check metrics` passes on every target's /metrics;
  - every PromQL expression of every panel (and every variable's metric) of every dashboard in
    charts/trellis/dashboards/ evaluates without error and returns at least one series;
  - the trellis_* metric names Prometheus holds are exactly those docs/metrics.md lists.
Then the job is stopped (SIGINT) and every process, Prometheus included, is ended.

Usage: prometheus_e2e_test.py REPO BIN_DIR   (exit 77: skipped, a program is missing)
"""
import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.parse
import urllib.request

REPO, BIN = sys.argv[1], sys.argv[2]
JOB_NAME = "metrics-e2e"
JOB_YAML = f"""apiVersion: trellis.io/v1alpha1
kind: TrainingJob
metadata:
  name: {JOB_NAME}
spec:
  servers:
    replicas: 2
  workers:
    replicas: 2
    command: [trellis-mlp]
    # Small and long: it trains until the test stops it.
    args: [--layers, "16,128,64,10", --latent-dim, "8", --teacher-hidden, "16", --epochs, "100000",
           --batch, "32", --lr, "0.02", --train-samples, "4096", --test-samples, "500"]
  sliceBytes: 16384
  # Checkpoints (CHECKPOINT_DIR: the test's directory), so the checkpoint panels have data.
  checkpoint:
    path: CHECKPOINT_DIR
    intervalSteps: 20
    keep: 1
  runPolicy:
    restartPolicy: Never
    activeDeadlineSeconds: 600
"""
# Grafana's variables, as the test substitutes them.
VARIABLES = {"$__rate_interval": "30s", "$job": JOB_NAME, "$rank": ".*"}
WAIT = 180  # seconds for the job and the scrapes to come up (a loaded 2-core machine is slow)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(cond, timeout, interval=0.2):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(interval)
    return cond()


def http_get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def dashboard_queries():
    """(dashboard, panel title, PromQL) for every panel target and variable of every dashboard."""
    out = []
    for path in sorted(glob.glob(os.path.join(REPO, "charts/trellis/dashboards/*.json"))):
        with open(path) as f:
            d = json.load(f)
        name = os.path.basename(path)
        for p in d.get("panels", []):
            for t in p.get("targets", []):
                out.append((name, p["title"], t["expr"]))
        for v in d.get("templating", {}).get("list", []):
            if v.get("type") != "query":
                continue
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", q.strip())
            assert m, f"{name}: variable {v['name']}: only label_values(metric, label) is understood: {q}"
            # The variable's metric must carry its label.
            out.append((name, "variable " + v["name"], f"count by ({m.group(2)}) ({m.group(1)})"))
    return out


def substitute(expr):
    for k in sorted(VARIABLES, key=len, reverse=True):
        expr = expr.replace(k, VARIABLES[k])
    return expr


def documented_metrics(required=False):
    """Every metric of docs/metrics.md; `required`: leaves out sections marked "(only ...)", whose
    processes a plain local job does not run (multi-GPU pods)."""
    with open(os.path.join(REPO, "docs/metrics.md")) as f:
        sections = re.split(r"^## ", f.read(), flags=re.M)
    return {name for sec in sections if not (required and "(only" in sec.split("\n", 1)[0])
            for name in re.findall(r"^\| `(trellis_[a-z0-9_]+)` \|", sec, re.M)}


class PrometheusE2E(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="trellis-prom-")
        self.procs = {}
        self.sd = os.path.join(self.dir, "sd")
        os.makedirs(self.sd)

    def tearDown(self):
        # The launcher first (SIGINT: it stops its agents and the scheduler), then the rest.
        for name in ["launch", "operator", "double", "prometheus"]:
            p = self.procs.get(name)
            if p is None:
                continue
            try:
                os.killpg(p.pid, signal.SIGINT if name == "launch" else signal.SIGTERM)
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            except ProcessLookupError:
                pass
        if self._outcome.success:
            shutil.rmtree(self.dir, ignore_errors=True)
        else:
            print("logs kept in", self.dir)

    def spawn(self, name, argv, **kw):
        log = open(os.path.join(self.dir, name + ".log"), "wb")
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **kw)
        log.close()
        return self.procs[name]

    def log(self, name):
        with open(os.path.join(self.dir, name + ".log"), errors="replace") as f:
            return f.read()[-3000:]

    # --- Prometheus HTTP API
    def api(self, path, **params):
        url = f"{self.prom}/api/v1/{path}?" + urllib.parse.urlencode(params)
        try:
            body = http_get(url)
        except urllib.error.HTTPError as e:  # 400/422: a bad query; the body says why
            body = e.read().decode()
        return json.loads(body)

    def query(self, expr, at=None):
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self.api("query", **params)

    def start_prometheus(self):
        config = os.path.join(self.dir, "prometheus.yml")
        with open(config, "w") as f:
            f.write(f"""global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: trellis
    honor_labels: true
    file_sd_configs:
      - files: ['{self.sd}/*.json']
        refresh_interval: 1s
""")
        for _ in range(3):  # the picked port may be taken meanwhile: try another
            port = free_port()
            self.prom = f"http://127.0.0.1:{port}"
            p = self.spawn("prometheus", ["prometheus", f"--config.file={config}",
                                          f"--storage.tsdb.path={os.path.join(self.dir, 'tsdb')}",
                                          f"--web.listen-address=127.0.0.1:{port}"])

            def ready():
                if p.poll() is not None:
                    return "exited"
                try:
                    return http_get(self.prom + "/-/ready", timeout=2) and "ready"
                except OSError:
                    return None
            state = wait_for(ready, 60)
            if state == "ready":
                return
            p.wait()
        self.fail("prometheus did not start:\n" + self.log("prometheus"))

    def start_operator(self):
        port_file = os.path.join(self.dir, "double.port")
        self.spawn("double", ["/usr/bin/python3", os.path.join(REPO, "tests/k8s_double/k8s_double.py"),
                              "--port-file", port_file])
        self.assertTrue(wait_for(lambda: os.path.exists(port_file), 30), "the API double did not start")
        server = "http://127.0.0.1:" + open(port_file).read().strip()
        port = free_port()
        self.spawn("operator", [os.path.join(BIN, "trellis-operator"), "--server", server,
                                "--metrics-host", "127.0.0.1", "--metrics-port", str(port)])
        with open(os.path.join(self.sd, "operator.json"), "w") as f:
            json.dump([{"targets": [f"127.0.0.1:{port}"], "labels": {"role": "operator",
                                                                     "trellis_process": "operator"}}], f)

    def test_dashboards_show_data_from_a_local_job(self):
        self.start_prometheus()
        self.start_operator()
        job_file = os.path.join(self.dir, "job.yaml")
        with open(job_file, "w") as f:
            f.write(JOB_YAML.replace("CHECKPOINT_DIR", os.path.join(self.dir, "ckpt")))
        targets_file = os.path.join(self.sd, "job.json")
        env = dict(os.environ, PATH=BIN + ":" + os.environ.get("PATH", ""))
        launch = self.spawn("launch", [os.path.join(BIN, "trellis-launch"), "--quiet", "--log-dir",
                                       os.path.join(self.dir, "job"), "--metrics-targets", targets_file, job_file],
                            env=env)
        self.assertTrue(wait_for(lambda: os.path.exists(targets_file) or launch.poll() is not None, 60),
                        "no targets file:\n" + self.log("launch"))
        with open(targets_file) as f:
            job_targets = json.load(f)
        # scheduler + (program + agent) per server and worker
        self.assertEqual(len(job_targets), 1 + 2 * 4, job_targets)
        expected = len(job_targets) + 1  # and the operator

        def scraped_enough():
            if launch.poll() is not None:
                self.fail("the job ended early:\n" + self.log("launch"))
            r = self.query('count(up == 1) >= %d and min(count_over_time(up[1m])) >= 5 '
                           'and sum(trellis_worker_steps_total) - sum(trellis_worker_steps_total offset 3s) > 0'
                           % expected)
            return r.get("status") == "success" and r["data"]["result"]
        ok = wait_for(scraped_enough, WAIT, interval=0.5)
        if not ok:
            up = self.query("up")
            self.fail("targets not all up and stepping within %d s: %s\n%s" % (WAIT, json.dumps(up.get("data")),
                                                                              self.log("launch")))
        at = time.time()

        # promtool check metrics on every process's /metrics.
        addresses = [t["targets"][0] for t in job_targets] + \
                    [json.load(open(os.path.join(self.sd, "operator.json")))[0]["targets"][0]]
        for address in addresses:
            text = http_get(f"http://{address}/metrics")
            self.assertIn("trellis_", text, address)
            r = subprocess.run(["promtool", "check", "metrics"], input=text.encode(), capture_output=True)
            self.assertEqual(r.returncode, 0, "promtool check metrics on %s:\n%s%s" % (
                address, r.stdout.decode(), r.stderr.decode()))

        # Every dashboard query has data.
        queries = dashboard_queries()
        self.assertGreater(len(queries), 20)
        failures = []
        for dash, title, expr in queries:
            q = substitute(expr)
            r = self.query(q, at)
            if r.get("status") != "success":
                failures.append(f"{dash} / {title}: {q}: error {r.get('error')}")
            elif not r["data"]["result"]:
                failures.append(f"{dash} / {title}: {q}: no series")
        self.assertEqual(failures, [], "\n".join(failures))

        # What the processes export is what docs/metrics.md lists.
        names = self.api("label/__name__/values")["data"]
        exported = {re.sub(r"_(bucket|sum|count)$", "", n) if n.endswith(("_bucket", "_sum", "_count")) and
                    re.sub(r"_(bucket|sum|count)$", "", n) + "_bucket" in names else n
                    for n in names if n.startswith("trellis_")}
        self.assertEqual(sorted(exported - documented_metrics()), [], "exported but not in docs/metrics.md")
        self.assertEqual(sorted(documented_metrics(required=True) - exported), [],
                         "documented but no process exported it")
        # The job is still healthy: the metrics were read from a running job.
        self.assertIsNone(launch.poll(), self.log("launch"))


if __name__ == "__main__":
    missing = [b for b in ("trellis-launch", "trellis-agent", "trellis-scheduler", "trellis-pserver", "trellis-mlp",
                           "trellis-operator") if not os.access(os.path.join(BIN, b), os.X_OK)]
    missing += [t for t in ("prometheus", "promtool") if shutil.which(t) is None]
    if missing:
        print("not available: %s: skipped" % ", ".join(missing))
        sys.exit(77)
    result = unittest.TextTestRunner(verbosity=2).run(
        unittest.defaultTestLoader.loadTestsFromTestCase(PrometheusE2E))
    sys.exit(0 if result.wasSuccessful() else 1)
