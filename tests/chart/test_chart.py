"""Chart, CRD and Dockerfile tests, run by scripts/test-chart.sh.

The chart is rendered and linted with the real Helm v4 SDK (helm-python-sdk), every manifest is
checked with kubernetes-validate --strict for Kubernetes 1.29 and 1.33, and the rendered
HAProxyTemplateConfig is compared with `haptic config merge` of the enabled libraries.

Environment (set by scripts/test-chart.sh):
  HAPTIC_BIN             the haptic binary (for `haptic config merge`)
  HAPTIC_DEV_APISERVER   the haptic-dev-apiserver binary (apply test)
  HAPTIC_KUBECTL         kubectl to use (default: kubectl on PATH)
"""

import base64
import copy
import http.client
import http.server
import json
import os
import random
import re
import select
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request
from pathlib import Path

import helm_python
import jsonschema
import kubernetes_validate
import yaml
from helm_python import Chart

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "chart"
sys.path.insert(0, str(Path(__file__).resolve().parent))
import values_doc  # noqa: E402

RELEASE = "edge"
NAMESPACE = "haptic-system"
FULLNAME = "edge-haptic"
KUBE_VERSIONS = ["1.29.0", "1.33.0"]
# Kinds kubernetes-validate has no schema for; ours are checked against our CRDs instead.
THIRD_PARTY_KINDS = {
    ("cert-manager.io/v1", "Issuer"),
    ("cert-manager.io/v1", "Certificate"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("gateway.networking.k8s.io/v1", "GatewayClass"),
}
LIBRARY_ORDER = [
    ("base", "base.yaml"),
    ("ssl", "ssl.yaml"),
    ("ingress", "ingress.yaml"),
    ("gateway", "gateway.yaml"),
    ("haproxytech", "haproxytech.yaml"),
    ("haproxyIngress", "haproxy-ingress.yaml"),
]

VARIANTS = {
    "defaults": {},
    "loadbalancer": {
        "haproxy": {
            "service": {
                "type": "LoadBalancer",
                "externalTrafficPolicy": "Local",
                "loadBalancerSourceRanges": ["10.0.0.0/8"],
                "nodePorts": {"http": 30080, "https": 30443},
            }
        }
    },
    "cert-manager": {"certificates": {"provider": "certManager"}},
    "cert-manager-issuer": {
        "certificates": {
            "provider": "certManager",
            "certManager": {"issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}},
        }
    },
    "libraries-toggled": {
        "libraries": {
            "ssl": {"enabled": False},
            "gateway": {"enabled": True},
            "haproxytech": {"enabled": False},
        }
    },
    "base-only": {
        "libraries": {
            "ssl": {"enabled": False},
            "ingress": {"enabled": False},
            "gateway": {"enabled": False},
            "haproxytech": {"enabled": False},
            "haproxyIngress": {"enabled": False},
        },
        "ingressClass": {"enabled": False},
    },
    "single-replica": {
        "controller": {"replicaCount": 1, "leaderElection": {"enabled": False}},
        "haproxy": {"replicaCount": 1},
    },
    "custom-registry": {
        "global": {"imageRegistry": "registry.internal:5000", "imagePullSecrets": [{"name": "regcred"}, "other"]},
        "controller": {"image": {"digest": "sha256:" + "a" * 64}},
    },
    "everything": {
        "libraries": {"gateway": {"enabled": True}},
        "monitoring": {
            "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
            "podMonitor": {"enabled": True},
            "prometheusRule": {"enabled": True},
            "grafanaDashboard": {"enabled": True},
        },
        "ingressClass": {"default": True},
        "networkPolicy": {
            "metricsFrom": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}],
            "webhookFrom": [{"ipBlock": {"cidr": "172.20.0.0/28"}}],
            "statusFrom": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}, {"ipBlock": {"cidr": "10.0.0.0/8"}}],
        },
    },
    "ipv6": {
        "libraries": {"gateway": {"enabled": True}},
        "haproxy": {
            "ipv6": True,
            "service": {"type": "LoadBalancer", "ipFamilyPolicy": "RequireDualStack", "ipFamilies": ["IPv6", "IPv4"]},
        },
    },
    "high-ports-capability": {
        "haproxy": {"ports": {"http": 8080, "https": 8443}, "privilegedPorts": "capability"},
    },
    "low-ports-capability": {"haproxy": {"privilegedPorts": "capability"}},
    "gateway-ports": {
        "libraries": {"gateway": {"enabled": True}},
        "haproxy": {"ports": {"http": 8080, "https": 8443}, "gatewayPorts": [{"port": 9000}, {"port": 5432, "nodePort": 30432}]},
    },
    "daemonset-host-network": {
        "haproxy": {"kind": "DaemonSet", "hostNetwork": True, "privilegedPorts": "capability", "maxUnavailable": "25%",
                    "stats": False},
    },
    "autoscaled-host-ports": {
        "haproxy": {"autoscaling": {"enabled": True, "minReplicas": 3, "maxReplicas": 12},
                    "hostPorts": True, "gatewayPorts": [{"port": 9000}]},
    },
    "insecure-agent": {"agent": {"insecureHttpWithBasicAuth": True}, "webhook": {"enabled": False}},
    "user-overrides": {
        "controller": {
            "config": {
                "templatingSettings": {"extraContext": {"custom_key": "custom", "http_port": 8081}},
                "logging": {"level": "debug"},
                "watchedResourcesIgnoreFields": ["metadata.managedFields"],
            }
        }
    },
}


class Loader(yaml.SafeLoader):
    """YAML as Kubernetes reads it for our purposes: timestamps stay strings (serde_yaml writes
    creationTimestamp values unquoted; PyYAML would turn them into datetime objects)."""


Loader.yaml_implicit_resolvers = {
    k: [r for r in v if r[0] != "tag:yaml.org,2002:timestamp"] for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def deep_merge(base, overlay):
    out = copy.deepcopy(base)
    for k, v in overlay.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


_render_cache = {}


def render(variant, extra=None):
    """Renders a variant; returns (values, {template: [docs]}, [docs])."""
    values = copy.deepcopy(VARIANTS[variant])
    if extra:
        values = deep_merge(values, extra)
    key = json.dumps(values, sort_keys=True)
    if key not in _render_cache:
        ch = Chart.load(str(CHART))
        try:
            out = ch.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
        finally:
            ch.close()
        by_template = {}
        docs = []
        for path, text in out.items():
            if path.endswith("NOTES.txt"):
                by_template[path] = text
                continue
            parsed = [d for d in yaml.load_all(text, Loader=Loader) if d]
            by_template[path] = parsed
            docs.extend(parsed)
        _render_cache[key] = (values, by_template, docs)
    return _render_cache[key]


def find(docs, kind, name=None):
    hits = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    return hits


def one(docs, kind, name):
    hits = find(docs, kind, name)
    assert len(hits) == 1, f"expected one {kind} {name}, found {len(hits)}"
    return hits[0]


def containers(deploy, init=True):
    spec = deploy["spec"]["template"]["spec"]
    return list(spec.get("initContainers", []) if init else []) + list(spec["containers"])


def container(deploy, name):
    return next(c for c in containers(deploy) if c["name"] == name)


def openssl(*args, stdin=None):
    return subprocess.run(["openssl", *args], input=stdin, capture_output=True, text=True)


def crd_schema(plural):
    crd = yaml.safe_load((ROOT / "crds" / f"{plural}.yaml").read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


class Crds(unittest.TestCase):
    def test_chart_copy_is_identical(self):
        top = sorted(p.name for p in (ROOT / "crds").glob("*.yaml"))
        chart = sorted(p.name for p in (CHART / "crds").glob("*.yaml"))
        self.assertEqual(top, chart, "crds/ and chart/crds/ hold different files")
        for name in top:
            self.assertEqual(
                (ROOT / "crds" / name).read_bytes(),
                (CHART / "crds" / name).read_bytes(),
                f"chart/crds/{name} differs from crds/{name}: cp crds/*.yaml chart/crds/",
            )

    def test_crds_validate_and_are_complete(self):
        for path in sorted((ROOT / "crds").glob("*.yaml")):
            crd = yaml.safe_load(path.read_text())
            for v in KUBE_VERSIONS:
                kubernetes_validate.validate(crd, v, strict=True)
            spec = crd["spec"]
            self.assertEqual(spec["group"], "haproxy-haptic.org")
            self.assertTrue(spec["names"].get("shortNames"), path.name)
            (version,) = spec["versions"]
            self.assertEqual(version["name"], "v1alpha1")
            self.assertIn("status", version["subresources"])
            self.assertTrue(version["additionalPrinterColumns"])
            self.assert_structural(version["schema"]["openAPIV3Schema"], path.name)

    def assert_structural(self, node, where, top=True):
        """Every node has a type (or preserves unknown fields); every property is described."""
        self.assertNotIn("$ref", node, where)
        if not node.get("x-kubernetes-preserve-unknown-fields"):
            self.assertIn("type", node, f"{where}: no type")
        for name, child in node.get("properties", {}).items():
            path = f"{where}.{name}"
            if not (top and name in ("apiVersion", "kind", "metadata")) and name != "metadata":
                self.assertTrue(child.get("description"), f"{path}: no description")
            self.assert_structural(child, path, top=False)
        if isinstance(node.get("additionalProperties"), dict):
            self.assert_structural(node["additionalProperties"], where + ".*", top=False)
        if "items" in node:
            self.assert_structural(node["items"], where + "[]", top=False)

    def test_example_config_matches_schema(self):
        example = yaml.safe_load((ROOT / "examples" / "haproxy-template-config.yaml").read_text())
        jsonschema.validate(example, crd_schema("haproxytemplateconfigs"))


class Lint(unittest.TestCase):
    def test_lint_strict_is_clean(self):
        for variant in ["defaults", "cert-manager", "everything", "single-replica", "daemonset-host-network", "autoscaled-host-ports", "ipv6"]:
            for kube in ["v1.29.0", "v1.33.0"]:
                report = helm_python.lint(
                    str(CHART), VARIANTS[variant], strict=True, namespace=NAMESPACE, kube_version=kube
                )
                problems = [m for m in report["messages"] if m["severity"] >= 2]
                self.assertEqual(report["errors"], [], f"{variant} {kube}: {report}")
                self.assertEqual(problems, [], f"{variant} {kube}")

    def test_schema_rejects_unknown_and_bad_values(self):
        ch = Chart.load(str(CHART))
        try:
            for bad in [
                {"controller": {"replicaCount": "two"}},
                {"controler": {}},
                {"haproxy": {"service": {"type": "External"}}},
                {"certificates": {"provider": "vault"}},
                {"controller": {"image": {"digest": "latest"}}},
            ]:
                with self.assertRaises(helm_python.HelmValuesError, msg=str(bad)):
                    ch.render(bad, name=RELEASE, namespace=NAMESPACE)
        finally:
            ch.close()


class Manifests(unittest.TestCase):
    def test_every_manifest_validates_strictly(self):
        tpl_schema = crd_schema("haproxytemplateconfigs")
        for variant in VARIANTS:
            _, _, docs = render(variant)
            self.assertTrue(docs, variant)
            for doc in docs:
                gvk = (doc["apiVersion"], doc["kind"])
                where = f"{variant}: {doc['kind']} {doc['metadata']['name']}"
                if doc["kind"] == "HAProxyTemplateConfig":
                    jsonschema.validate(doc, tpl_schema)
                    continue
                if gvk in THIRD_PARTY_KINDS:
                    continue
                for v in KUBE_VERSIONS:
                    try:
                        kubernetes_validate.validate(doc, v, strict=True)
                    except kubernetes_validate.ValidationError as e:
                        self.fail(f"{where} (Kubernetes {v}): {e.message} at {list(e.path)}")

    def test_names_labels_and_namespaces(self):
        _, _, docs = render("everything")
        cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "ValidatingWebhookConfiguration", "IngressClass", "GatewayClass"}
        for doc in docs:
            meta = doc["metadata"]
            self.assertEqual(meta["labels"]["app.kubernetes.io/instance"], RELEASE, doc["kind"])
            self.assertEqual(meta["labels"]["app.kubernetes.io/managed-by"], "Helm")
            if doc["kind"] in cluster_scoped:
                self.assertNotIn("namespace", meta, doc["kind"])
            else:
                self.assertEqual(meta["namespace"], NAMESPACE, f"{doc['kind']} {meta['name']}")

    def test_security_context(self):
        for variant in ["defaults", "high-ports-capability", "low-ports-capability", "single-replica"]:
            _, _, docs = render(variant)
            for deploy in find(docs, "Deployment"):
                pod = deploy["spec"]["template"]["spec"]
                psc = pod["securityContext"]
                self.assertTrue(psc["runAsNonRoot"])
                self.assertNotEqual(psc["runAsUser"], 0)
                self.assertEqual(psc["seccompProfile"]["type"], "RuntimeDefault")
                for c in containers(deploy):
                    sc = c["securityContext"]
                    where = f"{variant}: {deploy['metadata']['name']}/{c['name']}"
                    self.assertIs(sc["allowPrivilegeEscalation"], False, where)
                    self.assertIs(sc["readOnlyRootFilesystem"], True, where)
                    self.assertIs(sc.get("privileged", False), False, where)
                    self.assertEqual(sc["capabilities"]["drop"], ["ALL"], where)
                    added = sc["capabilities"].get("add", [])
                    if variant == "low-ports-capability" and c["name"] == "haproxy":
                        self.assertEqual(added, ["NET_BIND_SERVICE"], where)
                    else:
                        self.assertEqual(added, [], where)
                    self.assertIn("limits", c["resources"], where)
                    self.assertIn("requests", c["resources"], where)
            haproxy = one(docs, "Deployment", f"{FULLNAME}-haproxy")
            sysctls = haproxy["spec"]["template"]["spec"]["securityContext"].get("sysctls", [])
            if variant in ("defaults", "single-replica"):
                self.assertEqual(sysctls, [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}])
            else:
                self.assertEqual(sysctls, [], variant)
            self.assertIs(haproxy["spec"]["template"]["spec"]["automountServiceAccountToken"], False)

    def test_controller_pod(self):
        _, _, docs = render("defaults")
        deploy = one(docs, "Deployment", f"{FULLNAME}-controller")
        self.assertEqual(deploy["spec"]["replicas"], 2)
        pod = deploy["spec"]["template"]["spec"]
        self.assertIn("podAntiAffinity", pod["affinity"])
        c = container(deploy, "controller")
        self.assertEqual(c["args"][0], "run")
        self.assertEqual(
            {p["name"]: p["containerPort"] for p in c["ports"]}, {"health": 8080, "metrics": 9090, "webhook": 9443}
        )
        self.assertEqual(c["livenessProbe"]["httpGet"], {"path": "/healthz", "port": "health"})
        self.assertEqual(c["readinessProbe"]["httpGet"], {"path": "/readyz", "port": "health"})
        env = {e["name"]: e for e in c["env"]}
        self.assertEqual(env["CONFIG_NAME"]["value"], FULLNAME)
        self.assertEqual(env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"], "metadata.name")
        self.assertEqual(env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"], "metadata.namespace")
        self.assertEqual(env["HAPROXY_BIN"]["value"], "/usr/local/sbin/haproxy")
        for name, port in [("HEALTH_PORT", "8080"), ("METRICS_PORT", "9090"), ("WEBHOOK_PORT", "9443")]:
            self.assertEqual(env[name]["value"], port)
        mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
        self.assertIn("/tmp", mounts)
        self.assertTrue(mounts["/etc/haptic/agent-client"]["readOnly"])
        self.assertTrue(mounts["/etc/haptic/webhook"]["readOnly"])
        volumes = {v["name"]: v for v in pod["volumes"]}
        self.assertIn("emptyDir", volumes["tmp"])
        self.assertEqual(volumes["agent-client-tls"]["secret"]["secretName"], f"{FULLNAME}-agent-client-tls")
        self.assertEqual(volumes["webhook-tls"]["secret"]["secretName"], f"{FULLNAME}-webhook-tls")
        pdb = one(docs, "PodDisruptionBudget", f"{FULLNAME}-controller")
        self.assertEqual(pdb["spec"]["minAvailable"], 1)
        svc = one(docs, "Service", f"{FULLNAME}-controller")
        self.assertEqual({p["name"]: p["targetPort"] for p in svc["spec"]["ports"]}, {"webhook": "webhook", "metrics": "metrics", "health": "health"})

    def test_haproxy_pod(self):
        _, _, docs = render("defaults")
        deploy = one(docs, "Deployment", f"{FULLNAME}-haproxy")
        self.assertEqual(deploy["spec"]["replicas"], 2)
        pod = deploy["spec"]["template"]["spec"]
        (init,) = pod["initContainers"]
        self.assertEqual(init["args"][:3], ["init", "--bootstrap", "/etc/haptic/bootstrap/haproxy.cfg"])
        self.assertIn("--config-dir", init["args"])
        haproxy = container(deploy, "haproxy")
        self.assertEqual(
            haproxy["command"],
            ["/usr/local/sbin/haproxy", "-W", "-db", "-S", "/run/haproxy/master.sock", "-f", "/etc/haproxy/haproxy.cfg"],
        )
        self.assertEqual({p["name"]: p["containerPort"] for p in haproxy["ports"]}, {"http": 80, "https": 443, "status": 8404})
        # Relative UNIX sockets (the TLS-passthrough loopback) are created in the working
        # directory: it must be a writable mount of the pod's own, as the root is read-only.
        writable = {m["mountPath"] for m in haproxy["volumeMounts"] if not m.get("readOnly")}
        self.assertIn(haproxy["workingDir"], writable)
        # bind_address '"${POD_IP}"' (base library) binds the pod's own address.
        self.assertIn({"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}, haproxy["env"])
        self.assertEqual(haproxy["livenessProbe"]["httpGet"], {"path": "/healthz", "port": "status"})
        self.assertEqual(haproxy["readinessProbe"]["httpGet"], {"path": "/ready", "port": "status"})
        agent = container(deploy, "haptic-agent")
        args = agent["args"]
        self.assertEqual(args[0], "serve")
        flags = dict(zip(args[1::2], args[2::2]))
        self.assertEqual(flags["--config-dir"], "/etc/haproxy")
        self.assertEqual(flags["--master-socket"], "/run/haproxy/master.sock")
        self.assertEqual(flags["--listen"], "[::]:5555")
        self.assertEqual(flags["--probe-listen"], "[::]:5556")
        self.assertEqual(flags["--tls-cert"], "/etc/haptic/agent-tls/tls.crt")
        self.assertEqual(flags["--client-ca"], "/etc/haptic/agent-tls/ca.crt")
        self.assertEqual(flags["--client-name"], "haptic-controller")
        self.assertEqual({p["name"]: p["containerPort"] for p in agent["ports"]}, {"agent": 5555, "agent-probes": 5556})
        self.assertEqual(agent["livenessProbe"]["httpGet"]["port"], "agent-probes")
        # The config directory is shared; HAProxy only reads it.
        config_mounts = {c["name"]: m for c in containers(deploy) for m in c["volumeMounts"] if m["name"] == "config"}
        self.assertEqual(set(config_mounts), {"bootstrap", "haproxy", "haptic-agent"})
        self.assertTrue(config_mounts["haproxy"]["readOnly"])
        self.assertFalse(config_mounts["haptic-agent"].get("readOnly", False))
        # The controller pushes to a pod once the container it looks for by name is ready.
        pods_rs = (ROOT / "src" / "deploy" / "pods.rs").read_text()
        gate = re.search(r'pub\(crate\) const AGENT_CONTAINER: &str = "([^"]+)";', pods_rs).group(1)
        self.assertEqual(agent["name"], gate, "the controller would never deploy to the chart's pods")
        svc = one(docs, "Service", f"{FULLNAME}-haproxy")
        self.assertEqual(svc["spec"]["type"], "NodePort")
        self.assertEqual(
            {p["name"]: (p["port"], p["targetPort"]) for p in svc["spec"]["ports"]},
            {"http": (80, "http"), "https": (443, "https")},
        )
        # The bootstrap config is valid HAProxy configuration.
        cm = one(docs, "ConfigMap", f"{FULLNAME}-haproxy-bootstrap")
        self.assert_haproxy_valid(cm["data"]["haproxy.cfg"])

    def test_haproxy_drain(self):
        """A deleted pod keeps serving for the preStop delay (endpoints are withdrawn meanwhile),
        then soft-stops within hard-stop-after, all inside the grace period."""
        _, _, docs = render("defaults")
        deploy = one(docs, "Deployment", f"{FULLNAME}-haproxy")
        haproxy = container(deploy, "haproxy")
        self.assertEqual(haproxy["lifecycle"], {"preStop": {"sleep": {"seconds": 5}}})
        self.assertNotIn("lifecycle", container(deploy, "haptic-agent"))
        self.assertEqual(deploy["spec"]["template"]["spec"]["terminationGracePeriodSeconds"], 30)
        config = one(docs, "HAProxyTemplateConfig", f"{FULLNAME}")
        # No hard-stop-after by default: it would also cut long connections on every reload.
        self.assertEqual(config["spec"]["templatingSettings"]["extraContext"]["hard_stop_after_seconds"], 0)
        _, _, docs = render("defaults", {"haproxy": {"drain": {"preStopSeconds": 0}}})
        self.assertNotIn("lifecycle", container(one(docs, "Deployment", f"{FULLNAME}-haproxy"), "haproxy"))
        # A drain longer than the grace period would end in SIGKILL: refused, naming the values.
        ch = Chart.load(str(CHART))
        try:
            bad = {"haproxy": {"drain": {"preStopSeconds": 10, "hardStopAfterSeconds": 25}}}
            with self.assertRaises(helm_python.HelmError) as e:
                ch.render(bad, name=RELEASE, namespace=NAMESPACE)
            self.assertIn("haproxy.drain.preStopSeconds (10) + haproxy.drain.hardStopAfterSeconds (25)", str(e.exception))
            with self.assertRaises(helm_python.HelmError) as e:
                ch.render({"haproxy": {"drain": {"preStopSeconds": 30}}}, name=RELEASE, namespace=NAMESPACE)
            self.assertIn("haproxy.drain.preStopSeconds (30) + haproxy.drain.hardStopAfterSeconds (0)", str(e.exception))
        finally:
            ch.close()

    def render_refused(self, values):
        """The message of a render the chart refuses."""
        ch = Chart.load(str(CHART))
        try:
            with self.assertRaises(helm_python.HelmError) as e:
                ch.render(values, name=RELEASE, namespace=NAMESPACE)
            return str(e.exception)
        finally:
            ch.close()

    def test_haproxy_as_a_daemonset_on_the_host_network(self):
        _, by_template, docs = render("daemonset-host-network")
        self.assertEqual(find(docs, "Deployment", f"{FULLNAME}-haproxy"), [])
        ds = one(docs, "DaemonSet", f"{FULLNAME}-haproxy")
        self.assertEqual(ds["spec"]["updateStrategy"], {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%"}})
        self.assertEqual(ds["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"], "haproxy")
        pod = ds["spec"]["template"]["spec"]
        self.assertIs(pod["hostNetwork"], True)
        self.assertEqual(pod["dnsPolicy"], "ClusterFirstWithHostNet")
        # The sysctl cannot be set on the host's namespace: the capability binds 80 and 443.
        self.assertNotIn("sysctls", pod["securityContext"])
        self.assertEqual(container(ds, "haproxy")["securityContext"]["capabilities"]["add"], ["NET_BIND_SERVICE"])
        self.assertNotIn("affinity", pod, "one per node already; no anti-affinity of its own")
        self.assertTrue(all("hostPort" not in p for c in pod["containers"] for p in c["ports"]))
        # No budget: it needs a workload with a scale subresource, and drains skip DaemonSets.
        self.assertEqual(find(docs, "PodDisruptionBudget", f"{FULLNAME}-haproxy"), [])
        self.assertIn("HAProxy:    a DaemonSet (one per node) on the nodes' network", by_template["haptic/templates/NOTES.txt"])
        # The controller finds the pods by the same labels whatever their workload.
        cfg = one(docs, "HAProxyTemplateConfig", FULLNAME)["spec"]
        selector = cfg["podSelector"]["matchLabels"]
        self.assertLessEqual(selector.items(), ds["spec"]["template"]["metadata"]["labels"].items())
        # Bound to the nodes' ports: with no Service address, status publishes the nodes.
        self.assertIs(cfg["templatingSettings"]["extraContext"]["status_node_addresses"], True)
        _, _, docs = render("defaults")
        cfg = one(docs, "HAProxyTemplateConfig", FULLNAME)["spec"]
        self.assertIs(cfg["templatingSettings"]["extraContext"]["status_node_addresses"], False)

    def test_haproxy_autoscaled_with_host_ports(self):
        _, by_template, docs = render("autoscaled-host-ports")
        deploy = one(docs, "Deployment", f"{FULLNAME}-haproxy")
        self.assertNotIn("replicas", deploy["spec"], "the autoscaler owns the replica count")
        # Bound to their nodes' ports, old pods go first: a surge pod could not start beside one.
        self.assertEqual(deploy["spec"]["strategy"]["rollingUpdate"], {"maxUnavailable": 1, "maxSurge": 0})
        ports = {p["name"]: p.get("hostPort") for p in container(deploy, "haproxy")["ports"]}
        self.assertEqual(ports, {"http": 80, "https": 443, "status": None, "gw-9000": 9000})
        self.assertNotIn("hostNetwork", deploy["spec"]["template"]["spec"])
        hpa = one(docs, "HorizontalPodAutoscaler", f"{FULLNAME}-haproxy")["spec"]
        self.assertEqual(hpa["scaleTargetRef"], {"apiVersion": "apps/v1", "kind": "Deployment", "name": f"{FULLNAME}-haproxy"})
        self.assertEqual((hpa["minReplicas"], hpa["maxReplicas"]), (3, 12))
        self.assertEqual(hpa["metrics"][0]["resource"]["target"], {"type": "Utilization", "averageUtilization": 70})
        self.assertEqual(one(docs, "PodDisruptionBudget", f"{FULLNAME}-haproxy")["spec"]["minAvailable"], 1)
        cfg = one(docs, "HAProxyTemplateConfig", FULLNAME)["spec"]
        self.assertIs(cfg["templatingSettings"]["extraContext"]["status_node_addresses"], True)
        self.assertIn("HAProxy:    3–12 replicas (autoscaled) with host ports", by_template["haptic/templates/NOTES.txt"])
        # The defaults: a Deployment of fixed size, no autoscaler, surge first.
        _, _, docs = render("defaults")
        deploy = one(docs, "Deployment", f"{FULLNAME}-haproxy")
        self.assertEqual(deploy["spec"]["replicas"], 2)
        self.assertEqual(deploy["spec"]["strategy"]["rollingUpdate"], {"maxUnavailable": 0, "maxSurge": 1})
        self.assertEqual(find(docs, "HorizontalPodAutoscaler") + find(docs, "DaemonSet"), [])
        # An autoscaler whose minimum is one replica gets no PDB (it would block node drains).
        _, _, docs = render("autoscaled-host-ports", {"haproxy": {"autoscaling": {"minReplicas": 1}}})
        self.assertEqual(find(docs, "PodDisruptionBudget", f"{FULLNAME}-haproxy"), [])

    def test_ipv6_binds_both_families(self):
        """IPv6-only and dual-stack clusters: the pods take connections of both families (HAProxy
        with haproxy.ipv6 on [::], the agent always on [::]), the Service asks for both."""
        _, _, docs = render("ipv6")
        cfg = one(docs, "HAProxyTemplateConfig", FULLNAME)["spec"]
        self.assertEqual(cfg["templatingSettings"]["extraContext"]["bind_address"], "[::]")
        bootstrap = one(docs, "ConfigMap", f"{FULLNAME}-haproxy-bootstrap")["data"]["haproxy.cfg"]
        self.assertEqual(re.findall(r"bind (\S+)", bootstrap), ["[::]:8404", "[::]:80"])
        self.assert_haproxy_valid(bootstrap)
        svc = one(docs, "Service", f"{FULLNAME}-haproxy")["spec"]
        self.assertEqual((svc["ipFamilyPolicy"], svc["ipFamilies"]), ("RequireDualStack", ["IPv6", "IPv4"]))
        deploy = one(docs, "Deployment", f"{FULLNAME}-haproxy")
        args = container(deploy, "haptic-agent")["args"]
        self.assertEqual(args[args.index("--listen") + 1], "[::]:5555")
        self.assertEqual(args[args.index("--probe-listen") + 1], "[::]:5556")
        # The defaults: HAProxy on * (IPv4; a kernel without IPv6 cannot bind [::]), the agent
        # on [::] all the same (it falls back to 0.0.0.0 by itself), the cluster's families.
        _, _, docs = render("defaults")
        cfg = one(docs, "HAProxyTemplateConfig", FULLNAME)["spec"]
        self.assertEqual(cfg["templatingSettings"]["extraContext"]["bind_address"], "", "the library default: *")
        bootstrap = one(docs, "ConfigMap", f"{FULLNAME}-haproxy-bootstrap")["data"]["haproxy.cfg"]
        self.assertEqual(re.findall(r"bind (\S+)", bootstrap), ["*:8404", "*:80"])
        svc = one(docs, "Service", f"{FULLNAME}-haproxy")["spec"]
        self.assertNotIn("ipFamilyPolicy", svc)
        self.assertNotIn("ipFamilies", svc)
        args = container(one(docs, "Deployment", f"{FULLNAME}-haproxy"), "haptic-agent")["args"]
        self.assertEqual(args[args.index("--listen") + 1], "[::]:5555")

    def test_haproxy_workload_refusals_name_the_values(self):
        self.assertIn("haproxy.hostNetwork with ports below 1024 needs haproxy.privilegedPorts: capability",
                      self.render_refused({"haproxy": {"hostNetwork": True, "stats": False}}))
        self.assertIn("haproxy.hostNetwork with haproxy.stats would serve HAProxy's /stats and /metrics",
                      self.render_refused({"haproxy": {"hostNetwork": True, "privilegedPorts": "capability"}}))
        self.assertIn("haproxy.hostNetwork with agent.insecureHttpWithBasicAuth would serve the agent's plain-HTTP API",
                      self.render_refused({"haproxy": {"hostNetwork": True, "privilegedPorts": "capability", "stats": False},
                                           "agent": {"insecureHttpWithBasicAuth": True}}))
        # The controller runs without privileges: a port below 1024 would stop it at start.
        self.assertIn("minimum",
                      self.render_refused({"controller": {"ports": {"webhook": 443}}}))
        self.assertIn("haproxy.autoscaling is for haproxy.kind: Deployment",
                      self.render_refused({"haproxy": {"kind": "DaemonSet", "autoscaling": {"enabled": True}}}))
        self.assertIn("haproxy.autoscaling.minReplicas (5) is above maxReplicas (4)",
                      self.render_refused({"haproxy": {"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 4}}}))
        self.assertIn("needs a CPU request in agent.resources",
                      self.render_refused({"agent": {"resources": {"requests": {"cpu": None}}},
                                           "haproxy": {"autoscaling": {"enabled": True}}}))
        # Ports of 1024 and above need neither the sysctl nor the capability on the host network.
        _, _, docs = render("defaults", {"haproxy": {"hostNetwork": True, "stats": False, "ports": {"http": 8080, "https": 8443}}})
        pod = one(docs, "Deployment", f"{FULLNAME}-haproxy")["spec"]["template"]["spec"]
        self.assertNotIn("sysctls", pod["securityContext"])
        self.assertIs(pod["hostNetwork"], True)
        self.assertIn("monitoring.podMonitor scrapes HAProxy's /metrics, which haproxy.stats: false turns off",
                      self.render_refused({"haproxy": {"stats": False}, "monitoring": {"podMonitor": {"enabled": True}}}))
        self.assertIn("controller.leaderElection.enabled: false needs controller.replicaCount: 1",
                      self.render_refused({"controller": {"leaderElection": {"enabled": False}}}))
        # One controller without election: the old one stops before the new one starts.
        _, _, docs = render("single-replica")
        self.assertEqual(one(docs, "Deployment", f"{FULLNAME}-controller")["spec"]["strategy"]["rollingUpdate"],
                         {"maxUnavailable": 1, "maxSurge": 0})
        _, _, docs = render("defaults")
        self.assertEqual(one(docs, "Deployment", f"{FULLNAME}-controller")["spec"]["strategy"]["rollingUpdate"],
                         {"maxUnavailable": 0, "maxSurge": 1})
        for bad in [{"haproxy": {"kind": "StatefulSet"}}, {"haproxy": {"maxUnavailable": 0}},
                    {"haproxy": {"maxUnavailable": "0%"}},
                    {"haproxy": {"autoscaling": {"enabled": True, "targetCPUUtilizationPercentage": 0}}}]:
            ch = Chart.load(str(CHART))
            try:
                with self.assertRaises(helm_python.HelmValuesError, msg=str(bad)):
                    ch.render(bad, name=RELEASE, namespace=NAMESPACE)
            finally:
                ch.close()

    def assert_haproxy_valid(self, cfg):
        haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
        if not os.path.exists(haproxy):
            self.skipTest("haproxy not installed")
        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / "haproxy.cfg"
            p.write_text(cfg)
            r = subprocess.run([haproxy, "-c", "-f", str(p)], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_service_variants(self):
        _, _, docs = render("loadbalancer")
        svc = one(docs, "Service", f"{FULLNAME}-haproxy")["spec"]
        self.assertEqual(svc["type"], "LoadBalancer")
        self.assertEqual(svc["externalTrafficPolicy"], "Local")
        self.assertEqual({p["name"]: p["nodePort"] for p in svc["ports"]}, {"http": 30080, "https": 30443})
        _, _, docs = render("high-ports-capability")
        haproxy = container(one(docs, "Deployment", f"{FULLNAME}-haproxy"), "haproxy")
        self.assertEqual({p["name"]: p["containerPort"] for p in haproxy["ports"]}, {"http": 8080, "https": 8443, "status": 8404})

    def test_gateway_ports(self):
        """haproxy.gatewayPorts: each port is a containerPort and a Service port gw-<port>, open
        in the traffic NetworkPolicy, and the only other ports Gateways may open; the agent's
        and the controller's ports are reserved."""
        _, _, docs = render("gateway-ports")
        haproxy = container(one(docs, "Deployment", f"{FULLNAME}-haproxy"), "haproxy")
        self.assertEqual(
            {p["name"]: p["containerPort"] for p in haproxy["ports"]},
            {"http": 8080, "https": 8443, "status": 8404, "gw-9000": 9000, "gw-5432": 5432},
        )
        svc = one(docs, "Service", f"{FULLNAME}-haproxy")["spec"]
        ports = {p["name"]: (p["port"], p["targetPort"], p.get("nodePort")) for p in svc["ports"]}
        self.assertEqual(ports["gw-9000"], (9000, "gw-9000", None))
        self.assertEqual(ports["gw-5432"], (5432, "gw-5432", 30432))
        policy = one(docs, "NetworkPolicy", f"{FULLNAME}-haproxy")["spec"]
        traffic = next(r for r in policy["ingress"] if any(p["port"] == "http" for p in r["ports"]))
        self.assertEqual([p["port"] for p in traffic["ports"]], ["http", "https", "gw-9000", "gw-5432"])
        # A port HAProxy already binds stops the install.
        with self.assertRaises(Exception):
            render("gateway-ports", {"haproxy": {"gatewayPorts": [{"port": 8404}]}})

    def test_single_replica(self):
        _, _, docs = render("single-replica")
        self.assertEqual(one(docs, "Deployment", f"{FULLNAME}-controller")["spec"]["replicas"], 1)
        self.assertEqual(one(docs, "Deployment", f"{FULLNAME}-haproxy")["spec"]["replicas"], 1)
        self.assertEqual(find(docs, "PodDisruptionBudget"), [], "a PDB with one replica blocks node drains")
        cfg = one(docs, "HAProxyTemplateConfig", FULLNAME)
        self.assertIs(cfg["spec"]["controller"]["leaderElection"]["enabled"], False)

    def test_images(self):
        _, _, docs = render("defaults")
        images = {c["name"]: c["image"] for d in find(docs, "Deployment") for c in containers(d)}
        self.assertEqual(images["controller"], "ghcr.io/haproxy-haptic/haptic-controller:0.1.0")
        self.assertEqual(images["haptic-agent"], "ghcr.io/haproxy-haptic/haptic-agent:0.1.0")
        self.assertEqual(images["bootstrap"], images["haptic-agent"])
        self.assertEqual(images["haproxy"], "docker.io/library/haproxy:3.2")
        _, _, docs = render("custom-registry")
        for d in find(docs, "Deployment"):
            pod = d["spec"]["template"]["spec"]
            self.assertEqual(pod["imagePullSecrets"], [{"name": "regcred"}, {"name": "other"}])
            for c in containers(d):
                self.assertTrue(c["image"].startswith("registry.internal:5000/"), c["image"])
        controller = container(one(docs, "Deployment", f"{FULLNAME}-controller"), "controller")
        self.assertTrue(controller["image"].endswith("@sha256:" + "a" * 64))

    def test_no_external_urls(self):
        """Air-gapped: nothing rendered points at an external URL (images aside; redirect
        templates inside the HAProxyTemplateConfig are HAProxy configuration, not fetches)."""
        for variant in VARIANTS:
            _, by_template, _ = render(variant)
            for path, docs in by_template.items():
                if path.endswith("NOTES.txt"):
                    continue
                text = yaml.safe_dump_all([d for d in docs if d["kind"] != "HAProxyTemplateConfig"])
                for url in re.findall(r"https?://[^\s\"']+", text):
                    self.fail(f"{variant} {path}: external URL {url}")

    def test_check_sandbox(self):
        """controller.checkSandbox reaches the controller as CHECK_SANDBOX (auto by default)."""
        for extra, expected in ((None, "auto"), ({"controller": {"checkSandbox": "required"}}, "required")):
            _, _, docs = render("defaults", extra)
            deploy = one(docs, "Deployment", f"{FULLNAME}-controller")
            env = {e["name"]: e.get("value") for c in containers(deploy, init=False) for e in c.get("env", [])}
            self.assertEqual(env["CHECK_SANDBOX"], expected)

    def test_webhook_client_ca(self):
        """With webhook.clientCA the controller requires the API server's client certificate."""
        pem = "-----BEGIN CERTIFICATE-----\nMIIBdummy\n-----END CERTIFICATE-----"
        _, _, docs = render("defaults", {"webhook": {"clientCA": pem}})
        cm = one(docs, "ConfigMap", f"{FULLNAME}-webhook-client-ca")
        self.assertEqual(cm["data"]["ca.crt"].strip(), pem)
        deploy = one(docs, "Deployment", f"{FULLNAME}-controller")
        ctrl = next(c for c in containers(deploy, init=False) if any(e["name"] == "WEBHOOK_CLIENT_CA" for e in c.get("env", [])))
        path = next(e["value"] for e in ctrl["env"] if e["name"] == "WEBHOOK_CLIENT_CA")
        mount = next(m for m in ctrl["volumeMounts"] if m["name"] == "webhook-client-ca")
        self.assertEqual(path, mount["mountPath"] + "/ca.crt")
        volume = next(v for v in deploy["spec"]["template"]["spec"]["volumes"] if v["name"] == "webhook-client-ca")
        self.assertEqual(volume["configMap"]["name"], cm["metadata"]["name"])
        # Without it (the default), or without the webhook, none of this is rendered.
        for extra in (None, {"webhook": {"enabled": False, "clientCA": pem}}):
            _, _, docs = render("defaults", extra)
            self.assertEqual(find(docs, "ConfigMap", f"{FULLNAME}-webhook-client-ca"), [])
            deploy = one(docs, "Deployment", f"{FULLNAME}-controller")
            for c in containers(deploy, init=False):
                self.assertNotIn("WEBHOOK_CLIENT_CA", [e["name"] for e in c.get("env", [])])

    def test_network_policies(self):
        _, _, docs = render("everything")
        controller = one(docs, "NetworkPolicy", f"{FULLNAME}-controller")["spec"]
        ports = {p["port"] for rule in controller["ingress"] for p in rule["ports"]}
        self.assertEqual(ports, {"webhook", "health", "metrics"})
        metrics_rule = next(r for r in controller["ingress"] if r["ports"][0]["port"] == "metrics")
        self.assertEqual(metrics_rule["from"], VARIANTS["everything"]["networkPolicy"]["metricsFrom"])
        webhook_rule = next(r for r in controller["ingress"] if r["ports"][0]["port"] == "webhook")
        self.assertEqual(webhook_rule["from"], VARIANTS["everything"]["networkPolicy"]["webhookFrom"])
        self.assertEqual([p["port"] for p in webhook_rule["ports"]], ["webhook"], "webhookFrom limits the webhook port only")
        health_rule = next(r for r in controller["ingress"] if r["ports"][0]["port"] == "health")
        self.assertNotIn("from", health_rule, "the kubelet's probes stay allowed")
        haproxy = one(docs, "NetworkPolicy", f"{FULLNAME}-haproxy")["spec"]
        status_rule = next(r for r in haproxy["ingress"] if r["ports"][0]["port"] == "status")
        self.assertEqual(status_rule["from"], VARIANTS["everything"]["networkPolicy"]["statusFrom"])
        self.assertEqual([p["port"] for p in status_rule["ports"]], ["status"], "statusFrom limits the status port only")
        _, _, default_docs = render("defaults")
        default_controller = one(default_docs, "NetworkPolicy", f"{FULLNAME}-controller")["spec"]
        self.assertNotIn("from", next(r for r in default_controller["ingress"] if r["ports"][0]["port"] == "webhook"))
        default_haproxy = one(default_docs, "NetworkPolicy", f"{FULLNAME}-haproxy")["spec"]
        self.assertNotIn("from", next(r for r in default_haproxy["ingress"] if r["ports"][0]["port"] == "status"))
        agent_rule = next(r for r in haproxy["ingress"] if r["ports"][0]["port"] == "agent")
        self.assertEqual(agent_rule["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"], "controller")
        # Every named port in a policy exists on the selected pods.
        for policy, deploy in [(controller, f"{FULLNAME}-controller"), (haproxy, f"{FULLNAME}-haproxy")]:
            names = {p["name"] for c in containers(one(docs, "Deployment", deploy), init=False) for p in c.get("ports", [])}
            for rule in policy["ingress"]:
                for p in rule["ports"]:
                    self.assertIn(p["port"], names)

    def test_classes_and_monitoring(self):
        _, _, docs = render("everything")
        ic = one(docs, "IngressClass", "haproxy")
        self.assertEqual(ic["metadata"]["annotations"]["ingressclass.kubernetes.io/is-default-class"], "true")
        self.assertEqual(ic["spec"]["controller"], "haproxy-haptic.org/controller")
        gc = one(docs, "GatewayClass", "haproxy")
        self.assertEqual(gc["spec"]["controllerName"], "haproxy-haptic.org/controller")
        sm = one(docs, "ServiceMonitor", f"{FULLNAME}-controller")
        self.assertEqual(sm["spec"]["endpoints"][0]["port"], "metrics")
        self.assertEqual(sm["metadata"]["labels"]["release"], "prom")
        pm = one(docs, "PodMonitor", f"{FULLNAME}-haproxy")
        self.assertEqual(pm["spec"]["podMetricsEndpoints"][0]["port"], "status")
        self.assertEqual(pm["spec"]["podMetricsEndpoints"][0]["path"], "/metrics")
        # The controller Service exposes health next to the webhook and metrics (the seed's table).
        svc = one(docs, "Service", f"{FULLNAME}-controller")["spec"]
        self.assertEqual({p["name"]: (p["port"], p["targetPort"]) for p in svc["ports"]},
                         {"webhook": (443, "webhook"), "metrics": (9090, "metrics"), "health": (8080, "health")})
        rule = one(docs, "PrometheusRule", FULLNAME)
        exprs = " ".join(r["expr"] for g in rule["spec"]["groups"] for r in g["rules"])
        self.assertTrue(set(re.findall(r"haptic_[a-z_]+", exprs)))
        dash = one(docs, "ConfigMap", f"{FULLNAME}-dashboard")
        json.loads(dash["data"]["haptic.json"])
        _, _, docs = render("defaults")
        self.assertEqual(find(docs, "GatewayClass"), [], "gateway is auto: off without the Gateway API")
        self.assertEqual(find(docs, "ServiceMonitor") + find(docs, "PrometheusRule"), [])


JOB = f"{FULLNAME}-controller"
POD = f"{FULLNAME}-controller-7d9f-abcde"


def exported_metrics():
    """The metric names the controller exports (src/metrics.rs), with the series a histogram
    adds, and Prometheus's own `up`."""
    text = (ROOT / "src" / "metrics.rs").read_text()
    names = set(re.findall(r'name: "(haptic_[a-z_]+)"', text))
    histograms = set(re.findall(r'Histogram<\d+> = Histogram \{\s*name: "(haptic_[a-z_]+)"', text))
    for h in histograms:
        names |= {h + "_bucket", h + "_sum", h + "_count"}
    return names | {"up", "process_resident_memory_bytes"}


def expand(text, labels, value):
    """An alert annotation as Prometheus expands it, for the two forms the chart's rules use."""
    out = text
    for k, v in labels.items():
        out = out.replace("{{ $labels.%s }}" % k, v)
    return out.replace("{{ $value }}", value)


class Alerts(unittest.TestCase):
    """The chart's PrometheusRule, checked and unit-tested by the real promtool: every alert
    fires on the series that should raise it, after its `for`, and stays silent otherwise."""

    def rules(self, extra=None):
        _, _, docs = render("everything", extra)
        return one(docs, "PrometheusRule", FULLNAME)["spec"]

    def promtool(self, *args, cwd):
        promtool = shutil.which("promtool")
        self.assertIsNotNone(promtool, "promtool (Debian: prometheus) is needed; scripts/test.sh installs it")
        return subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True)

    def test_rules_reference_only_exported_metrics(self):
        exprs = " ".join(r["expr"] for g in self.rules()["groups"] for r in g["rules"])
        dashboard = (CHART / "dashboards" / "haptic.json").read_text()
        exported = exported_metrics()
        self.assertIn("haptic_check_sandbox", exported)
        for where, text in (("PrometheusRule", exprs), ("dashboard", dashboard)):
            used = set(re.findall(r"\b(haptic_[a-z_]+|up)\b(?=\{|\[|\)| )", text))
            self.assertTrue(used, where)
            self.assertEqual(used - exported, set(), f"{where} queries metrics the controller does not export")

    def test_alerts_fire_when_they_should_and_only_then(self):
        spec = self.rules()
        alerts = {r["alert"]: r for g in spec["groups"] for r in g["rules"]}
        pod = {"job": JOB, "pod": POD}

        def sel(name, labels):
            return name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"

        def expect(alert, labels, value=""):
            rule = alerts[alert]
            all_labels = {**labels, **rule.get("labels", {})}
            return {
                "exp_labels": all_labels,
                "exp_annotations": {k: expand(v, all_labels, value) for k, v in rule["annotations"].items()},
            }

        # Per alert: its series; the last minute at which it must not fire yet (its `for`, or
        # its threshold, not passed); the minute by which it fires, with its labels and $value;
        # and the series of a healthy case in which it never fires. Counters start at 0, as the
        # controller exports them.
        ns = {"namespace": NAMESPACE}
        pod = {**pod, **ns}
        other = {**pod, "pod": POD + "2"}
        counter_up = "0+1x40"  # an error every minute
        cases = {
            "HapticControllerDown": ([(sel("up", pod), "0x40")], 4, 6, {}, "", [(sel("up", pod), "1x40")]),
            "HapticNoLeader": (
                [(sel("haptic_leader_election_is_leader", pod), "0x40"),
                 (sel("haptic_leader_election_is_leader", other), "0x40")], 4, 6, ns, "",
                [(sel("haptic_leader_election_is_leader", pod), "1x40"),
                 (sel("haptic_leader_election_is_leader", other), "0x40")],
            ),
            "HapticReconciliationErrors": (
                [(sel("haptic_reconciliation_errors_total", {**pod, "stage": "render"}), counter_up)], 9, 12,
                {**pod, "stage": "render"}, "",
                [(sel("haptic_reconciliation_errors_total", {**pod, "stage": "render"}), "0x40")],
            ),
            "HapticDeploymentErrors": (
                [(sel("haptic_deployment_errors_total", pod), counter_up)], 9, 12, pod, "",
                [(sel("haptic_deployment_errors_total", pod), "0x40")],
            ),
            "HapticNoHAProxyPods": (
                [(sel("haptic_resource_objects", {**pod, "type": "haproxy-pods"}), "0x40"),
                 (sel("haptic_resource_objects", {**pod, "type": "ingresses"}), "5x40")], 4, 6, ns, "",
                [(sel("haptic_resource_objects", {**pod, "type": "haproxy-pods"}), "2x40")],
            ),
            "HapticFrequentLeaderChanges": (
                [(sel("haptic_leader_election_transitions_total", pod), "0+1x40")], 3, 10, pod, "",
                [(sel("haptic_leader_election_transitions_total", pod), "0+0.05x40")],
            ),
            "HapticWebhookAdmitsUnchecked": (
                [(sel("haptic_webhook_requests_total", {**pod, "result": "error"}), counter_up),
                 (sel("haptic_webhook_requests_total", {**pod, "result": "allowed"}), counter_up)], 14, 17,
                {**pod, "result": "error"}, "",
                [(sel("haptic_webhook_requests_total", {**pod, "result": "error"}), "0x40"),
                 (sel("haptic_webhook_requests_total", {**pod, "result": "denied"}), counter_up)],
            ),
            "HapticObjectsLeftOut": (
                [(sel("haptic_dropped_objects", pod), "3x40")], 29, 31, ns, "3",
                [(sel("haptic_dropped_objects", pod), "0x40")],
            ),
            # Drifts split between two replicas (a leader change) add up.
            "HapticConfigDrift": (
                [(sel("haptic_drift_detected_total", pod), "0+0.06x40"),
                 (sel("haptic_drift_detected_total", other), "0+0.06x40")], 15, 38, ns, "",
                [(sel("haptic_drift_detected_total", pod), "0+0.06x40")],
            ),
            "HapticCheckUnsandboxed": (
                [(sel("haptic_check_sandbox", pod), "0x40")], 14, 16, pod, "",
                [(sel("haptic_check_sandbox", pod), "6x40")],
            ),
        }
        self.assertEqual(set(cases), set(alerts), "every alert has a case, every case an alert")
        tests = []
        for alert, (series, quiet, at, labels, value, healthy) in cases.items():
            tests.append({
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in series],
                "alert_rule_test": [
                    {"eval_time": f"{quiet}m", "alertname": alert, "exp_alerts": []},
                    {"eval_time": f"{at}m", "alertname": alert, "exp_alerts": [expect(alert, labels, value)]},
                ],
            })
            tests.append({
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in healthy],
                "alert_rule_test": [{"eval_time": f"{t}m", "alertname": alert, "exp_alerts": []} for t in (at, 40)],
            })
        with tempfile.TemporaryDirectory(prefix="haptic-test-rules.") as d:
            Path(d, "rules.yaml").write_text(yaml.safe_dump(spec))
            Path(d, "tests.yaml").write_text(yaml.safe_dump({"rule_files": ["rules.yaml"], "tests": tests}))
            checked = self.promtool("check", "rules", "rules.yaml", cwd=d)
            self.assertEqual(checked.returncode, 0, checked.stdout + checked.stderr)
            tested = self.promtool("test", "rules", "tests.yaml", cwd=d)
            self.assertEqual(tested.returncode, 0, tested.stdout + tested.stderr)

    def test_dashboard_queries_parse_and_panels_are_distinct(self):
        dashboard = json.loads((CHART / "dashboards" / "haptic.json").read_text())
        panels = dashboard["panels"]
        self.assertEqual(len({p["id"] for p in panels}), len(panels), "panel ids are unique")
        cells = [(p["gridPos"]["x"], p["gridPos"]["y"]) for p in panels]
        self.assertEqual(len(set(cells)), len(cells), "no two panels in one place")
        exprs = [t["expr"] for p in panels for t in p["targets"]]
        # As recording rules, with Grafana's variable filled in, promtool parses each query.
        rules = {"groups": [{"name": "dashboard", "rules": [
            {"record": f"dashboard:query{i}", "expr": e.replace("$namespace", NAMESPACE)} for i, e in enumerate(exprs)
        ]}]}
        with tempfile.TemporaryDirectory(prefix="haptic-test-dashboard.") as d:
            Path(d, "rules.yaml").write_text(yaml.safe_dump(rules))
            checked = self.promtool("check", "rules", "rules.yaml", cwd=d)
            self.assertEqual(checked.returncode, 0, checked.stdout + checked.stderr)

    def test_every_metric_and_alert_is_documented(self):
        ops = (ROOT / "docs" / "operations.md").read_text()
        documented = set(re.findall(r"^\| `(haptic_[a-z_]+)` \|", ops, re.M))
        self.assertEqual(set(re.findall(r'name: "(haptic_[a-z_]+)"', (ROOT / "src" / "metrics.rs").read_text())),
                         documented, "docs/operations.md's metric table against src/metrics.rs")
        alerts = {r["alert"] for g in self.rules()["groups"] for r in g["rules"]}
        self.assertEqual(set(re.findall(r"^\| `(Haptic[A-Za-z]+)` \|", ops, re.M)), alerts,
                         "docs/operations.md's alert table against the PrometheusRule")

    def test_no_sandbox_alert_when_the_sandbox_is_off(self):
        names = lambda spec: {r["alert"] for g in spec["groups"] for r in g["rules"]}
        self.assertIn("HapticCheckUnsandboxed", names(self.rules()))
        self.assertIn("HapticCheckUnsandboxed", names(self.rules({"controller": {"checkSandbox": "required"}})))
        self.assertNotIn("HapticCheckUnsandboxed", names(self.rules({"controller": {"checkSandbox": "off"}})))


class Rbac(unittest.TestCase):
    def rules(self, docs, kind, name):
        return one(docs, kind, name)["rules"]

    def allows(self, rules, group, resource, verbs):
        for verb in verbs:
            if not any(
                group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in rules
            ):
                return False
        return True

    def test_rbac_covers_every_watched_resource(self):
        for variant in VARIANTS:
            _, _, docs = render(variant)
            cluster = self.rules(docs, "ClusterRole", f"{FULLNAME}-{NAMESPACE}")
            cfg = one(docs, "HAProxyTemplateConfig", FULLNAME)["spec"]
            for name, w in cfg.get("watchedResources", {}).items():
                group = w["apiVersion"].split("/")[0] if "/" in w["apiVersion"] else ""
                self.assertTrue(
                    self.allows(cluster, group, w["resources"], ["get", "list", "watch"]),
                    f"{variant}: watchedResources.{name} ({group}/{w['resources']}) not readable",
                )
                # Kinds the libraries report status on (ReferenceGrants have no status).
                reports = group == "gateway.networking.k8s.io" and w["resources"] != "referencegrants"
                if (group, w["resources"]) == ("networking.k8s.io", "ingresses") or reports:
                    self.assertTrue(
                        self.allows(cluster, group, w["resources"] + "/status", ["patch"]),
                        f"{variant}: cannot write {w['resources']}/status",
                    )
            # Nothing writable cluster-wide except status subresources, and Events (created on
            # objects left out of the configuration, in their namespace).
            for r in cluster:
                if set(r["verbs"]) - {"get", "list", "watch"}:
                    if r["resources"] == ["events"]:
                        self.assertEqual((r["apiGroups"], sorted(r["verbs"])), ([""], ["create"]), r)
                        continue
                    self.assertTrue(all(res.endswith("/status") for res in r["resources"]), r)
                    self.assertEqual(r["verbs"], ["patch"], r)
            self.assertTrue(
                any(r["resources"] == ["events"] and "create" in r["verbs"] for r in cluster),
                f"{variant}: cannot create Events on objects left out",
            )
            # Exactly what the code calls in the release namespace (least privilege): the lease
            # (src/kube/lease.rs: get, create, update), the HAProxy pods (a reflector: list,
            # watch), Events (create), the config (a reflector, and a get before its status is
            # written; status: merge patch), the published HAProxyCfg (get, create, update;
            # status: merge patch). Certificates and credentials are mounted files.
            ns = self.rules(docs, "Role", f"{FULLNAME}-controller")
            granted = {(g, res, v) for r in ns for g in r["apiGroups"] for res in r["resources"] for v in r["verbs"]}
            needed = {
                (group, resource, verb)
                for group, resource, verbs in [
                    ("coordination.k8s.io", "leases", ["get", "create", "update"]),
                    ("", "pods", ["list", "watch"]),
                    ("", "events", ["create"]),
                    ("haproxy-haptic.org", "haproxytemplateconfigs", ["get", "list", "watch"]),
                    ("haproxy-haptic.org", "haproxytemplateconfigs/status", ["patch"]),
                    ("haproxy-haptic.org", "haproxycfgs", ["get", "create", "update"]),
                    ("haproxy-haptic.org", "haproxycfgs/status", ["patch"]),
                ]
                for verb in verbs
            }
            self.assertEqual(granted, needed, variant)
            for binding, role_kind in [("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")]:
                (b,) = find(docs, binding)
                self.assertEqual(b["roleRef"]["kind"], role_kind)
                self.assertEqual(b["subjects"][0]["name"], f"{FULLNAME}-controller")

    def test_rbac_from_a_library_set(self):
        """A temporary chart copy with synthetic libraries: RBAC follows whatever is watched."""
        with tempfile.TemporaryDirectory() as d:
            chart = Path(d) / "haptic"
            shutil.copytree(CHART, chart)
            shutil.rmtree(chart / "libraries", ignore_errors=True)
            (chart / "libraries").mkdir()
            (chart / "libraries" / "base.yaml").write_text(
                "haproxyConfig:\n  template: |\n    global\nwatchedResources:\n"
                "  services: {apiVersion: v1, resources: services, indexBy: [metadata.name]}\n"
            )
            (chart / "libraries" / "gateway.yaml").write_text(
                "apiVersion: haproxy-haptic.org/v1alpha1\nkind: HAProxyTemplateConfig\nmetadata: {name: x}\nspec:\n"
                "  watchedResources:\n"
                "    httproutes: {apiVersion: gateway.networking.k8s.io/v1, resources: httproutes, indexBy: [metadata.name], enableValidationWebhook: true}\n"
                "    tlsroutes: {apiVersion: gateway.networking.k8s.io/v1alpha2, resources: tlsroutes, indexBy: [metadata.name]}\n"
                "---\n"
                "watchedResources:\n"
                "  widgets: {apiVersion: example.com/v1, resources: widgets, indexBy: [metadata.name]}\n"
            )
            ch = Chart.load(str(chart))
            try:
                out = ch.render({"libraries": {"gateway": {"enabled": True}}}, name=RELEASE, namespace=NAMESPACE)
            finally:
                ch.close()
        docs = [x for path, t in out.items() if not path.endswith("NOTES.txt") for x in yaml.safe_load_all(t) if x]
        cluster = self.rules(docs, "ClusterRole", f"{FULLNAME}-{NAMESPACE}")
        self.assertTrue(self.allows(cluster, "", "services", ["list", "watch"]))
        self.assertTrue(self.allows(cluster, "example.com", "widgets", ["list", "watch"]))
        self.assertTrue(self.allows(cluster, "gateway.networking.k8s.io", "httproutes", ["list", "watch"]))
        self.assertTrue(self.allows(cluster, "gateway.networking.k8s.io", "tlsroutes/status", ["patch"]))
        self.assertFalse(self.allows(cluster, "", "services/status", ["update"]))
        spec = one(docs, "HAProxyTemplateConfig", FULLNAME)["spec"]
        self.assertEqual(set(spec["watchedResources"]), {"services", "httproutes", "tlsroutes", "widgets"})
        webhook = one(docs, "ValidatingWebhookConfiguration", f"{FULLNAME}-{NAMESPACE}")
        rules = [r for w in webhook["webhooks"] if w["name"].startswith("resources.") for r in w["rules"]]
        self.assertEqual([(r["apiGroups"], r["resources"]) for r in rules], [(["gateway.networking.k8s.io"], ["httproutes"])])


class Certificates(unittest.TestCase):
    def secret_pem(self, docs, name, key):
        return base64.b64decode(one(docs, "Secret", name)["data"][key]).decode()

    def test_webhook_ca_bundle_and_certificates(self):
        _, _, docs = render("defaults")
        ca = self.secret_pem(docs, f"{FULLNAME}-agent-client-tls", "ca.crt")
        webhook = one(docs, "ValidatingWebhookConfiguration", f"{FULLNAME}-{NAMESPACE}")
        self.assertEqual({w["name"].split(".")[0] for w in webhook["webhooks"]}, {"resources", "config"})
        for w in webhook["webhooks"]:
            self.assertEqual(base64.b64decode(w["clientConfig"]["caBundle"]).decode(), ca, w["name"])
            self.assertEqual(w["clientConfig"]["service"]["name"], f"{FULLNAME}-controller")
            self.assertEqual(w["clientConfig"]["service"]["path"], "/validate")
            self.assertEqual(w["sideEffects"], "None")
            self.assertLessEqual(w["timeoutSeconds"], 10)
        resources = next(w for w in webhook["webhooks"] if w["name"].startswith("resources."))
        self.assertEqual(resources["failurePolicy"], "Fail")
        spec = one(docs, "HAProxyTemplateConfig", FULLNAME)["spec"]
        hooked = sorted(w["resources"] for w in spec["watchedResources"].values() if w.get("enableValidationWebhook"))
        self.assertEqual(sorted(r["resources"][0] for r in resources["rules"]), hooked)
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "ca.crt").write_text(ca)
            checks = [
                (f"{FULLNAME}-agent-server-tls", "haptic-agent", "sslserver"),
                # The agents accept only a client certificate naming the controller.
                (f"{FULLNAME}-agent-client-tls", "haptic-controller", "sslclient"),
                (f"{FULLNAME}-webhook-tls", f"{FULLNAME}-controller.{NAMESPACE}.svc", "sslserver"),
            ]
            for secret, host, purpose in checks:
                self.assertEqual(self.secret_pem(docs, secret, "ca.crt"), ca, secret)
                crt = Path(d) / f"{secret}.crt"
                crt.write_text(self.secret_pem(docs, secret, "tls.crt"))
                args = ["verify", "-CAfile", str(Path(d) / "ca.crt"), "-purpose", purpose]
                if host:
                    args += ["-verify_hostname", host]
                r = openssl(*args, str(crt))
                self.assertEqual(r.returncode, 0, f"{secret}: {r.stdout}{r.stderr}")
                key = self.secret_pem(docs, secret, "tls.key")
                pub_crt = openssl("x509", "-noout", "-pubkey", "-in", str(crt)).stdout
                pub_key = openssl("pkey", "-pubout", stdin=key).stdout
                self.assertEqual(pub_crt, pub_key, f"{secret}: key does not match certificate")
        creds = one(docs, "Secret", f"{FULLNAME}-credentials")["data"]
        self.assertGreaterEqual(len(base64.b64decode(creds["password"])), 24)

    def test_cert_manager(self):
        for variant in ["cert-manager", "cert-manager-issuer"]:
            _, _, docs = render(variant)
            names = {s["metadata"]["name"] for s in find(docs, "Secret")}
            self.assertNotIn(f"{FULLNAME}-webhook-tls", names)
            certs = {c["spec"]["secretName"]: c for c in find(docs, "Certificate")}
            for secret in ["agent-server-tls", "agent-client-tls", "webhook-tls"]:
                self.assertIn(f"{FULLNAME}-{secret}", certs)
            self.assertEqual(certs[f"{FULLNAME}-agent-server-tls"]["spec"]["dnsNames"], ["haptic-agent"])
            self.assertIn("client auth", certs[f"{FULLNAME}-agent-client-tls"]["spec"]["usages"])
            self.assertEqual(certs[f"{FULLNAME}-agent-client-tls"]["spec"]["dnsNames"], ["haptic-controller"])
            self.assertIn(f"{FULLNAME}-controller.{NAMESPACE}.svc", certs[f"{FULLNAME}-webhook-tls"]["spec"]["dnsNames"])
            webhook = one(docs, "ValidatingWebhookConfiguration", f"{FULLNAME}-{NAMESPACE}")
            self.assertEqual(
                webhook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"], f"{NAMESPACE}/{FULLNAME}-webhook-tls"
            )
            for w in webhook["webhooks"]:
                self.assertNotIn("caBundle", w["clientConfig"])
            issuers = find(docs, "Issuer")
            if variant == "cert-manager":
                self.assertEqual(len(issuers), 2)
                self.assertEqual(certs[f"{FULLNAME}-webhook-tls"]["spec"]["issuerRef"]["name"], f"{FULLNAME}-ca")
            else:
                self.assertEqual(issuers, [])
                self.assertEqual(certs[f"{FULLNAME}-webhook-tls"]["spec"]["issuerRef"]["kind"], "ClusterIssuer")

    def test_insecure_agent_transport(self):
        _, _, docs = render("insecure-agent")
        agent = container(one(docs, "Deployment", f"{FULLNAME}-haproxy"), "haptic-agent")
        self.assertIn("--insecure-http-with-basic-auth", agent["args"])
        self.assertNotIn("--tls-cert", agent["args"])
        controller = container(one(docs, "Deployment", f"{FULLNAME}-controller"), "controller")
        self.assertIn("--agent-credentials-dir=/etc/haptic/credentials", controller["args"])
        self.assertEqual(find(docs, "ValidatingWebhookConfiguration"), [])


class Config(unittest.TestCase):
    """The rendered HAProxyTemplateConfig is `haptic config merge` of the enabled libraries,
    the chart's settings and controller.config."""

    def expected_libraries(self, values):
        libs = deep_merge(yaml.safe_load((CHART / "values.yaml").read_text())["libraries"], values.get("libraries", {}))
        out = []
        for key, file in LIBRARY_ORDER:
            if not (CHART / "libraries" / file).exists():
                continue
            if libs[key]["enabled"] is True:  # "auto" is off in an offline render
                out.append(file)
        return out

    def chart_fragment(self, values):
        v = deep_merge(yaml.safe_load((CHART / "values.yaml").read_text()), values)
        h = v["haproxy"]["ports"]
        on_node = v["haproxy"]["hostNetwork"] or v["haproxy"]["hostPorts"]
        le = v["controller"]["leaderElection"]
        return {
            "credentialsSecretRef": {"name": f"{FULLNAME}-credentials"},
            "podSelector": {
                "matchLabels": {
                    "app.kubernetes.io/name": "haptic",
                    "app.kubernetes.io/instance": RELEASE,
                    "app.kubernetes.io/component": "haproxy",
                }
            },
            "controller": {
                "leaderElection": {
                    "enabled": le["enabled"],
                    "leaseName": f"{FULLNAME}-leader",
                    "leaseDuration": le["leaseDuration"],
                    "renewDeadline": le["renewDeadline"],
                    "retryPeriod": le["retryPeriod"],
                }
            },
            "dataplane": {
                "port": v["agent"]["port"],
                "configFile": "/etc/haproxy/haproxy.cfg",
                "mapsDir": "/etc/haproxy/maps",
                "sslCertsDir": "/etc/haproxy/ssl",
                "generalStorageDir": "/etc/haproxy/general",
            },
            "templatingSettings": {
                "extraContext": {
                    "http_port": h["http"],
                    "https_port": h["https"],
                    "status_port": h["status"],
                    "status_stats": v["haproxy"]["stats"],
                    "gateway_listener_ports": [p["port"] for p in v["haproxy"]["gatewayPorts"]],
                    "gateway_reserved_ports": [
                        v["agent"]["port"],
                        v["agent"]["probePort"],
                        v["controller"]["ports"]["health"],
                        v["controller"]["ports"]["metrics"],
                        v["controller"]["ports"]["webhook"],
                    ],
                    "default_ssl_cert_namespace": v["defaultSSLCertificate"]["namespace"] or NAMESPACE,
                    "default_ssl_cert_name": v["defaultSSLCertificate"]["name"],
                    "ingress_class": v["ingressClass"]["name"],
                    "ingress_controller": v["ingressClass"]["controllerName"],
                    "gateway_class": v["gatewayClass"]["name"],
                    "gateway_controller": v["gatewayClass"]["controllerName"],
                    "haproxy_service_namespace": NAMESPACE,
                    "haproxy_service_name": f"{FULLNAME}-haproxy",
                    "status_node_addresses": bool(v["haproxy"]["hostNetwork"] or v["haproxy"]["hostPorts"]),
                    "public_http_port": (v["haproxy"]["ports"] if on_node else v["haproxy"]["service"]["port"])["http"],
                    "public_https_port": (v["haproxy"]["ports"] if on_node else v["haproxy"]["service"]["port"])["https"],
                }
            },
            "validationTests": None,
        }

    def haptic_merge(self, files):
        haptic = os.environ.get("HAPTIC_BIN")
        if not haptic:
            self.skipTest("HAPTIC_BIN not set (run scripts/test-chart.sh)")
        args = [haptic, "config", "merge"]
        for f in files:
            args += ["-f", str(f)]
        r = subprocess.run(args, capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        merged = yaml.load(r.stdout, Loader=Loader)
        return merged.get("spec", merged) if "kind" in merged else merged

    def check(self, variant, extra=None):
        values, _, docs = render(variant, extra)
        cfg = one(docs, "HAProxyTemplateConfig", FULLNAME)
        libs = self.expected_libraries(values)
        self.assertEqual(cfg["metadata"]["annotations"]["haproxy-haptic.org/libraries"], ",".join(libs))
        with tempfile.TemporaryDirectory() as d:
            chart_file = Path(d) / "chart.yaml"
            chart_file.write_text(yaml.safe_dump(self.chart_fragment(values)))
            files = [CHART / "libraries" / f for f in libs] + [chart_file]
            user = values.get("controller", {}).get("config")
            if user:
                user_file = Path(d) / "user.yaml"
                user_file.write_text(yaml.safe_dump(user))
                files.append(user_file)
            expected = self.haptic_merge(files)
        self.assertEqual(cfg["spec"], expected, f"{variant}: rendered spec differs from haptic config merge")
        return cfg["spec"]

    def test_config_equals_haptic_config_merge(self):
        for variant in ["defaults", "libraries-toggled", "base-only", "single-replica", "user-overrides", "high-ports-capability",
                        "daemonset-host-network"]:
            with self.subTest(variant=variant):
                self.check(variant)

    def test_user_null_removes_library_keys(self):
        spec = self.check("defaults")
        snippets = sorted(spec.get("templateSnippets", {}))
        watched = sorted(spec.get("watchedResources", {}))
        if not snippets or not watched:
            self.skipTest("no library with snippets and watched resources")
        extra = {
            "controller": {
                "config": {
                    "templateSnippets": {snippets[0]: None, "my-extra": {"template": "# mine\n"}},
                    "watchedResources": {watched[0]: None},
                    "watchedResourcesIgnoreFields": [],
                }
            }
        }
        spec = self.check("defaults", extra)
        self.assertNotIn(snippets[0], spec["templateSnippets"])
        self.assertIn("my-extra", spec["templateSnippets"])
        self.assertNotIn(watched[0], spec["watchedResources"])

    def test_extra_context_from_values(self):
        spec = self.check("high-ports-capability")
        ctx = spec["templatingSettings"]["extraContext"]
        self.assertEqual((ctx["http_port"], ctx["https_port"], ctx["status_port"]), (8080, 8443, 8404))
        # Clients reach the Service's ports (redirects and Gateway listeners use them), or the
        # pods' own when they hold their nodes' ports.
        self.assertEqual((ctx["public_http_port"], ctx["public_https_port"]), (80, 443))
        ctx = self.check("defaults", {"haproxy": {"service": {"port": {"http": 8000, "https": 8443}}}})["templatingSettings"]["extraContext"]
        self.assertEqual((ctx["public_http_port"], ctx["public_https_port"]), (8000, 8443))
        ctx = self.check("high-ports-capability", {"haproxy": {"hostPorts": True}})["templatingSettings"]["extraContext"]
        self.assertEqual((ctx["public_http_port"], ctx["public_https_port"]), (8080, 8443))
        self.assertIs(ctx["status_stats"], True, "stats and the exporter are on by default")
        spec = self.check("defaults", {"haproxy": {"stats": False}})
        self.assertIs(spec["templatingSettings"]["extraContext"]["status_stats"], False)
        spec = self.check("user-overrides")
        self.assertEqual(spec["templatingSettings"]["extraContext"]["http_port"], 8081)
        self.assertEqual(spec["templatingSettings"]["extraContext"]["custom_key"], "custom")
        # The classes' controller names reach the libraries (the GatewayClass is served under
        # the name the chart gives it), and so does the HAProxy Service (route and Gateway
        # status addresses come from its load balancer).
        ctx = spec["templatingSettings"]["extraContext"]
        self.assertEqual(ctx["gateway_controller"], "haproxy-haptic.org/controller")
        self.assertEqual((ctx["haproxy_service_namespace"], ctx["haproxy_service_name"]), (NAMESPACE, f"{FULLNAME}-haproxy"))

    def test_gateway_ports_reach_the_libraries(self):
        """haproxy.gatewayPorts are the only other ports Gateways may open; the agent's and the
        controller's ports are reserved."""
        ctx = self.check("gateway-ports")["templatingSettings"]["extraContext"]
        self.assertEqual(ctx["gateway_listener_ports"], [9000, 5432])
        self.assertEqual(ctx["gateway_reserved_ports"], [5555, 5556, 8080, 9090, 9443])
        ctx = self.check("defaults")["templatingSettings"]["extraContext"]
        self.assertEqual(ctx["gateway_listener_ports"], [], "without the value no other port may be opened")

    def test_rendered_config_passes_haptic_validation(self):
        """The config the chart installs is one the controller accepts, it renders, HAProxy accepts
        it, and the enabled libraries' tests pass against it."""
        haptic = os.environ.get("HAPTIC_BIN")
        if not haptic:
            self.skipTest("HAPTIC_BIN not set (run scripts/test-chart.sh)")
        for variant in ("defaults", "everything", "libraries-toggled", "base-only", "ipv6"):
            values, _, docs = render(variant)
            cfg = one(docs, "HAProxyTemplateConfig", FULLNAME)
            self.assertNotIn("validationTests", cfg["spec"], "the libraries' tests stay in their files")
            with tempfile.TemporaryDirectory() as d:
                p = Path(d) / "cfg.yaml"
                p.write_text(yaml.safe_dump(cfg))
                # What the controller checks before it runs a config (haptic config merge
                # validates like validate_config_object).
                r = subprocess.run([haptic, "config", "merge", "-f", str(p)], capture_output=True, text=True)
                self.assertEqual(r.returncode, 0, f"{variant}: the controller would refuse it: {r.stderr}")
                r = subprocess.run(
                    [haptic, "render", "-f", str(p), "-o", str(Path(d) / "out"), "--validate"], capture_output=True, text=True
                )
                self.assertEqual(r.returncode, 0, f"{variant}: {r.stdout}{r.stderr}")
                if variant in ("defaults", "everything"):
                    # The installed config under the enabled libraries' own tests.
                    libs = [str(CHART / "libraries" / f) for f in self.expected_libraries(values)]
                    args = [a for f in libs + [str(p)] for a in ("-f", f)]
                    r = subprocess.run([haptic, "validate", *args], capture_output=True, text=True)
                    self.assertEqual(r.returncode, 0, f"{variant}: {r.stdout[-3000:]}{r.stderr}")
                    self.assertRegex(r.stdout, r"Tests: [1-9][0-9]* passed, 0 failed")


class Binaries(unittest.TestCase):
    """Every flag and environment variable the chart hands the binaries is one they take (a
    renamed flag would stop the pods at start; a renamed variable would be ignored)."""

    def help_text(self, *args):
        r = subprocess.run(list(args), capture_output=True, text=True)
        return r.stdout + r.stderr

    def test_every_flag_and_variable_the_chart_passes_is_one_the_binaries_take(self):
        static = os.environ.get("HAPTIC_STATIC_DIR")
        if not static:
            self.skipTest("HAPTIC_STATIC_DIR not set (run scripts/test-chart.sh)")
        controller_help = self.help_text(f"{static}/haptic", "run", "--help")
        controller_flags = set(re.findall(r"(?m)^\s+(--[a-z][a-z-]*)", controller_help))
        controller_env = set(re.findall(r"\(env ([A-Z_]+)", controller_help))
        self.assertIn("--agent-client-cert-dir", controller_flags, controller_help)
        self.assertIn("CONFIG_NAME", controller_env, controller_help)
        agent_help = self.help_text(f"{static}/haptic-agent", "serve", "--help")
        # One usage text for both subcommands: serve's lines, then init's.
        serve_part, _, init_part = agent_help.partition("haptic-agent init")
        agent_flags = set(re.findall(r"--[a-z][a-z-]*", serve_part))
        init_flags = set(re.findall(r"--[a-z][a-z-]*", init_part))
        self.assertIn("--client-name", agent_flags, agent_help)
        self.assertIn("--bootstrap", init_flags, agent_help)
        self.assertNotIn("--bootstrap", agent_flags, agent_help)

        def flags(args):
            return {a.split("=", 1)[0] for a in args if a.startswith("--")}

        seen = set()
        for variant in ("defaults", "everything", "insecure-agent", "ipv6", "daemonset-host-network"):
            _, _, docs = render(variant)
            controller = container(one(docs, "Deployment", f"{FULLNAME}-controller"), "controller")
            self.assertEqual(controller["args"][0], "run")
            self.assertLessEqual(flags(controller["args"]), controller_flags, variant)
            env = {e["name"] for e in controller.get("env", [])}
            self.assertLessEqual(env, controller_env, f"{variant}: variables haptic run does not read")
            haproxy = find(docs, "Deployment", f"{FULLNAME}-haproxy") or find(docs, "DaemonSet", f"{FULLNAME}-haproxy")
            pod = haproxy[0]["spec"]["template"]["spec"]
            agent = next(c for c in pod["containers"] if c["name"] == "haptic-agent")
            self.assertEqual(agent["args"][0], "serve")
            self.assertLessEqual(flags(agent["args"]), agent_flags, variant)
            for init in pod.get("initContainers", []):
                self.assertEqual(init["args"][0], "init", init)
                self.assertLessEqual(flags(init["args"]), init_flags, variant)
            seen |= flags(controller["args"]) | flags(agent["args"]) | env
        # The check looks at something: the flags of the mutual-TLS and plain-HTTP modes.
        self.assertLessEqual({"--client-name", "--insecure-http-with-basic-auth", "--agent-credentials-dir", "HEALTH_PORT"}, seen)


class Dockerfile(unittest.TestCase):
    def stages(self):
        text = (ROOT / "Dockerfile").read_text()
        lines = re.sub(r"\\\n", " ", text).splitlines()
        stages, current = [], None
        for line in lines:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            word, _, rest = line.partition(" ")
            if word.upper() == "FROM":
                m = re.match(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?$", rest.strip(), re.I)
                self.assertIsNotNone(m, line)
                current = {"from": m.group(1), "name": m.group(2), "instructions": []}
                stages.append(current)
            elif current is None:
                self.assertEqual(word.upper(), "ARG", f"only ARG may precede the first FROM: {line}")
            else:
                current["instructions"].append((word.upper(), rest.strip()))
        return text, stages

    def test_stages(self):
        text, stages = self.stages()
        names = [s["name"] for s in stages]
        for needed in ["haproxy-build", "rust-build", "controller", "agent"]:
            self.assertIn(needed, names)
        by_name = {s["name"]: s for s in stages}
        for final, binaries in [("controller", ["haptic", "haproxy"]), ("agent", ["haptic-agent", "haproxy"])]:
            stage = by_name[final]
            self.assertEqual(stage["from"], "scratch", f"{final} must start from scratch")
            instr = stage["instructions"]
            copies = [rest for word, rest in instr if word == "COPY"]
            # Only from `dist`, which is either the source build or scripts/build-images.sh's files.
            self.assertTrue(all(c.startswith("--from=dist ") for c in copies), f"{final}: COPY only from the dist stage")
            copied = " ".join(copies)
            for b in binaries:
                self.assertRegex(copied, rf"/{re.escape(b)}\b", f"{final}: {b} not copied")
            users = [rest for word, rest in instr if word == "USER"]
            self.assertTrue(users and re.fullmatch(r"[1-9][0-9]*(:[1-9][0-9]*)?", users[-1]), f"{final}: numeric non-root USER")
            labels = " ".join(rest for word, rest in instr if word == "LABEL")
            for key in ["org.opencontainers.image.title", "org.opencontainers.image.source", "org.opencontainers.image.version",
                        "org.opencontainers.image.licenses"]:
                self.assertIn(key, labels, final)
            self.assertTrue(any(word == "ENTRYPOINT" for word, _ in instr), final)
            self.assertFalse(any(word in ("RUN", "ADD") for word, _ in instr), f"{final}: scratch stages cannot RUN")
        # The HAProxy build is static and its version matches the chart's HAProxy image.
        build = " ".join(rest for _, rest in by_name["haproxy-build"]["instructions"])
        self.assertIn("-static", build)
        self.assertIn("haproxy -vv", build)
        chart_tag = yaml.safe_load((CHART / "values.yaml").read_text())["haproxy"]["image"]["tag"]
        m = re.search(r"ARG HAPROXY_VERSION=(\d+\.\d+)\.\d+", text)
        self.assertIsNotNone(m)
        self.assertEqual(m.group(1), chart_tag, "the static haproxy and the chart's HAProxy image differ in major.minor")
        self.assertEqual(by_name["dist"]["from"], "${DIST}")
        self.assertRegex(text, r"(?m)^ARG DIST=dist-source$", "the release path builds from source by default")
        self.assertIn("dist-local", names)
        rust = " ".join(rest for _, rest in by_name["rust-build"]["instructions"])
        self.assertIn("x86_64-unknown-linux-musl", rust)
        # Image paths the chart relies on.
        self.assertIn("/usr/local/sbin/haproxy", text)

    def test_dockerignore(self):
        ignored = (ROOT / ".dockerignore").read_text().split()
        for entry in ["target", ".git", ".venv"]:
            self.assertTrue(any(entry in line for line in ignored), entry)


class Docs(unittest.TestCase):
    def test_values_reference_in_sync(self):
        doc = (ROOT / "docs" / "install.md").read_text()
        generated = values_doc.render_table(json.loads((CHART / "values.schema.json").read_text()),
                                            yaml.safe_load((CHART / "values.yaml").read_text()))
        current = values_doc.extract(doc)
        self.assertIsNotNone(current, "docs/install.md lacks the values reference markers")
        self.assertEqual(current, generated, "values reference out of date: run python3 tests/chart/values_doc.py --write")

    def test_every_value_is_in_the_schema(self):
        values = yaml.safe_load((CHART / "values.yaml").read_text())
        schema = json.loads((CHART / "values.schema.json").read_text())

        def walk(v, s, path):
            self.assertTrue(s.get("description"), f"{path}: no description in the schema")
            if isinstance(v, dict) and s.get("properties"):
                for k, child in v.items():
                    self.assertIn(k, s["properties"], f"{path}.{k} not in values.schema.json")
                    walk(child, s["properties"][k], f"{path}.{k}")

        for k, v in values.items():
            walk(v, schema["properties"][k], k)

    def test_notes(self):
        _, by_template, _ = render("defaults")
        notes = by_template["haptic/templates/NOTES.txt"]
        self.assertIn(f"kubectl -n {NAMESPACE} get haproxytemplateconfig {FULLNAME}", notes)


MONITORING_CRDS = [("monitoring.coreos.com", "servicemonitors", "ServiceMonitor"),
                   ("monitoring.coreos.com", "podmonitors", "PodMonitor"),
                   ("monitoring.coreos.com", "prometheusrules", "PrometheusRule"),
                   ("cert-manager.io", "certificates", "Certificate"),
                   ("cert-manager.io", "issuers", "Issuer")]


def minimal_crd(group, plural, kind, scope="Namespaced", version="v1"):
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": scope,
            "names": {"plural": plural, "kind": kind, "singular": kind.lower()},
            "versions": [{"name": version, "served": True, "storage": True,
                          "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}],
        },
    }


class DevApiserver(unittest.TestCase):
    """The rendered chart applied with kubectl to the dev API server creates every object."""

    @classmethod
    def setUpClass(cls):
        binary = os.environ.get("HAPTIC_DEV_APISERVER")
        if not binary:
            raise unittest.SkipTest("HAPTIC_DEV_APISERVER not set (run scripts/test-chart.sh)")
        cls.kubectl = os.environ.get("HAPTIC_KUBECTL") or shutil.which("kubectl")
        if not cls.kubectl:
            raise unittest.SkipTest("kubectl not found")
        cls.dir = tempfile.mkdtemp(prefix="haptic-chart-")
        cls.kubeconfig = os.path.join(cls.dir, "kubeconfig")
        cls.proc = subprocess.Popen(
            [binary, "--listen", "127.0.0.1:0", "--kubeconfig-out", cls.kubeconfig, "--log-level", "warn"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        ready, _, _ = select.select([cls.proc.stdout], [], [], 30)
        line = cls.proc.stdout.readline() if ready else ""
        if not line.startswith("ready "):
            cls.proc.kill()
            raise RuntimeError(f"dev apiserver did not print its ready line within 30 s: {line!r}")

    @classmethod
    def tearDownClass(cls):
        cls.proc.kill()
        cls.proc.wait()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def run_kubectl(self, *args, stdin=None):
        r = subprocess.run([self.kubectl, "--kubeconfig", self.kubeconfig, *args], input=stdin,
                           capture_output=True, text=True, timeout=120)
        return r

    def apply(self, docs):
        text = yaml.safe_dump_all(docs)
        r = self.run_kubectl("apply", "--validate=false", "-f", "-", stdin=text)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return r.stdout

    def test_apply_rendered_chart(self):
        r = self.run_kubectl("create", "namespace", NAMESPACE)
        self.assertEqual(r.returncode, 0, r.stderr)
        crds = [yaml.safe_load(p.read_text()) for p in sorted((CHART / "crds").glob("*.yaml"))]
        crds += [minimal_crd(*c) for c in MONITORING_CRDS]
        crds.append(minimal_crd("gateway.networking.k8s.io", "gatewayclasses", "GatewayClass", scope="Cluster"))
        self.apply(crds)
        for variant in ["defaults", "everything", "cert-manager", "daemonset-host-network", "autoscaled-host-ports"]:
            _, _, docs = render(variant)
            out = self.apply(docs)
            for doc in docs:
                kind, name = doc["kind"], doc["metadata"]["name"]
                ns = ["-n", doc["metadata"]["namespace"]] if "namespace" in doc["metadata"] else []
                resource = kind.lower() + ("." + doc["apiVersion"].split("/")[0] if "/" in doc["apiVersion"] else "")
                r = self.run_kubectl("get", resource, name, *ns, "-o", "json")
                self.assertEqual(r.returncode, 0, f"{variant}: {kind} {name} not created: {r.stderr}\n{out}")
                stored = json.loads(r.stdout)
                if kind in ("Deployment", "ConfigMap", "HAProxyTemplateConfig"):
                    self.assertEqual(stored.get("spec", stored.get("data")), doc.get("spec", doc.get("data")), f"{kind} {name}")


GATEWAY_KINDS = {
    "gatewayclasses": ("GatewayClass", "Cluster"),
    "gateways": ("Gateway", "Namespaced"),
    "httproutes": ("HTTPRoute", "Namespaced"),
    "grpcroutes": ("GRPCRoute", "Namespaced"),
    "tlsroutes": ("TLSRoute", "Namespaced"),
    "tcproutes": ("TCPRoute", "Namespaced"),
    "referencegrants": ("ReferenceGrant", "Namespaced"),
    "backendtlspolicies": ("BackendTLSPolicy", "Namespaced"),
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Pod:
    """A pod of a rendered workload run as local processes: its volumes as directories
    (ConfigMaps and Secrets written out from the rendered objects, emptyDirs empty), its init
    containers run in order, then its containers, each with its command, arguments, environment
    and working directory, mount paths mapped to those directories and image binaries to local
    ones."""

    def __init__(self, test, d, docs, workload, entrypoints, paths, fields, procs, extra_env=None):
        # procs: where each started process goes at once (the caller stops them).
        self.test, self.d, self.procs = test, d, procs
        spec = workload["spec"]["template"]["spec"]
        self.volume_dirs = {}
        for v in spec.get("volumes", []):
            local = d / f"vol-{workload['metadata']['name']}-{v['name']}"
            local.mkdir(parents=True)
            if "configMap" in v:
                for key, value in one(docs, "ConfigMap", v["configMap"]["name"]).get("data", {}).items():
                    (local / key).write_text(value)
            if "secret" in v:
                for key, value in one(docs, "Secret", v["secret"]["secretName"]).get("data", {}).items():
                    (local / key).write_bytes(base64.b64decode(value))
            self.volume_dirs[v["name"]] = local
        # entrypoints: by image repository, the binary of a container without a command (its
        # image's entrypoint); paths: image paths to local ones.
        self.spec, self.entrypoints, self.paths = spec, entrypoints, paths
        self.fields, self.extra_env = fields, extra_env or {}

    def local(self, c, text):
        """`text` with the container's mount paths (longest first) and image binaries mapped."""
        mapped = {m["mountPath"]: str(self.volume_dirs[m["name"]]) for m in c.get("volumeMounts", [])}
        mapped.update(self.paths)
        # One pass, so that a mapped path is not mapped again; a path only where one starts.
        alternatives = "|".join(re.escape(p) for p in sorted(mapped, key=len, reverse=True))
        return re.sub(rf"(?<![\w.-])({alternatives})(?=/|$|[^\w.-])", lambda m: mapped[m.group(1)], text)

    def command(self, c):
        if c.get("command"):
            argv = [self.local(c, a) for a in c["command"]] + [self.local(c, a) for a in c.get("args", [])]
        else:
            repository = c["image"].rsplit("@", 1)[0].rsplit(":", 1)[0].rsplit("/", 1)[-1]
            argv = [self.entrypoints[repository]] + [self.local(c, a) for a in c.get("args", [])]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        for e in c.get("env", []):
            env[e["name"]] = self.local(c, e["value"]) if "value" in e else self.fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
        env.update(self.extra_env.get(c["name"], {}))
        cwd = self.local(c, c["workingDir"]) if c.get("workingDir") else str(self.d)
        return argv, env, cwd

    def start(self):
        for c in self.spec.get("initContainers", []):
            argv, env, cwd = self.command(c)
            r = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=60)
            self.test.assertEqual(r.returncode, 0, f"init container {c['name']}: {r.stdout}{r.stderr}")
        for c in self.spec["containers"]:
            argv, env, cwd = self.command(c)
            with open(self.d / f"{c['name']}.log", "w") as log:
                self.procs.append(subprocess.Popen(argv, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT))
    def log(self, name):
        return (self.d / f"{name}.log").read_text()


class ChartPodsUnderItsRbac(unittest.TestCase):
    """The chart's controller and HAProxy pods as the chart runs them, as local processes (their
    commands, arguments, environment, mounted Secrets and ConfigMaps, init container, service
    account), against an API server that enforces the chart's RBAC: the controller leads,
    watches every resource, deploys to the HAProxy pod through its agent, publishes the
    HAProxyCfg, writes the statuses, and traffic flows, with no request refused. The chart's
    RBAC grants only the verbs the code calls, so a call added without its grant fails here, as
    does a renamed flag, container, port or mount path."""

    def test_the_charts_pods_deploy_and_serve_with_exactly_the_charts_permissions(self):
        apiserver = os.environ.get("HAPTIC_DEV_APISERVER")
        haptic = os.environ.get("HAPTIC_BIN")
        kubectl = os.environ.get("HAPTIC_KUBECTL") or shutil.which("kubectl")
        haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
        if not (apiserver and haptic and kubectl and os.path.exists(haproxy)):
            self.skipTest("needs HAPTIC_DEV_APISERVER, HAPTIC_BIN, kubectl and haproxy (run scripts/test-chart.sh)")
        d = Path(tempfile.mkdtemp(prefix="haptic-chart-rbac-"))
        procs = []
        try:
            self.run_controller(d, procs, apiserver, haptic, kubectl, haproxy)
        finally:
            for p in procs:
                p.kill()
                p.wait()
                if p.stdout:
                    p.stdout.close()
            shutil.rmtree(d, ignore_errors=True)

    def run_controller(self, d, procs, apiserver, haptic, kubectl, haproxy):
        admin = d / "kubeconfig"
        server = subprocess.Popen(
            [apiserver, "--listen", "127.0.0.1:0", "--kubeconfig-out", str(admin), "--log-level", "warn",
             "--authorization-mode", "RBAC"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        procs.append(server)
        ready, _, _ = select.select([server.stdout], [], [], 30)
        line = server.stdout.readline() if ready else ""
        self.assertTrue(line.startswith("ready "), line)
        url = line.split()[1]

        def k(*args, stdin=None, config=admin):
            r = subprocess.run([kubectl, "--kubeconfig", str(config), *args], input=stdin,
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, f"kubectl {args}: {r.stderr}")
            return r.stdout

        def apply(docs):
            k("apply", "--validate=false", "-f", "-", stdin=yaml.safe_dump_all(docs))

        ports = {name: free_port() for name in ("agent", "probe", "http", "https", "status")}
        # HAProxy binds with SO_REUSEPORT: its frontends on an address of this run's own, so
        # that a run at the same time never shares them.
        address = f"127.{random.randint(1, 254)}.{random.randint(0, 255)}.{random.randint(1, 254)}"
        _, _, docs = render("defaults", {
            "libraries": {"gateway": {"enabled": True}},
            "agent": {"port": ports["agent"], "probePort": ports["probe"]},
            "haproxy": {"ports": {"http": ports["http"], "https": ports["https"], "status": ports["status"]}},
            "controller": {"config": {"templatingSettings": {"extraContext": {"bind_address": address}}}},
        })
        spec = one(docs, "HAProxyTemplateConfig", FULLNAME)["spec"]
        k("create", "namespace", NAMESPACE)
        crds = [yaml.safe_load(p.read_text()) for p in sorted((CHART / "crds").glob("*.yaml"))]
        versions = {}
        for w in spec["watchedResources"].values():
            group, _, version = w["apiVersion"].rpartition("/")
            if group == "gateway.networking.k8s.io":
                versions.setdefault(w["resources"], []).append(version)
        for plural, served in versions.items():
            kind, scope = GATEWAY_KINDS[plural]
            crd = minimal_crd("gateway.networking.k8s.io", plural, kind, scope=scope, version=served[0])
            schema = crd["spec"]["versions"][0]["schema"]
            crd["spec"]["versions"] = [
                {"name": v, "served": True, "storage": i == 0, "schema": schema, "subresources": {"status": {}}}
                for i, v in enumerate(served)
            ]
            crds.append(crd)
        apply(crds)
        # Not the webhook's registration: this API server calls webhooks by URL only, and the
        # webhook is not what this test is about.
        apply([doc for doc in docs if doc["kind"] != "ValidatingWebhookConfiguration"])

        # A backend for the routes.
        token = os.urandom(8).hex().encode()

        class Echo(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = token
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        echo = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Echo)
        threading.Thread(target=echo.serve_forever, daemon=True).start()
        self.addCleanup(echo.server_close)
        self.addCleanup(echo.shutdown)
        echo_port = echo.server_address[1]

        # Objects whose statuses the templates write, and the address they report.
        k("patch", "service", f"{FULLNAME}-haproxy", "-n", NAMESPACE, "--subresource=status", "--type=merge",
          "-p", json.dumps({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.7"}]}}}))
        apply([
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "default"},
             "spec": {"ports": [{"name": "http", "port": 80, "targetPort": echo_port}]}},
            {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
             "metadata": {"name": "web-1", "namespace": "default", "labels": {"kubernetes.io/service-name": "web"}},
             "addressType": "IPv4", "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}],
             "ports": [{"name": "http", "port": echo_port}]},
            {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "web", "namespace": "default"},
             "spec": {"ingressClassName": "haproxy", "rules": [{"host": "web.test", "http": {"paths": [
                 {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "web", "port": {"number": 80}}}}]}}]}},
            {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass", "metadata": {"name": "haproxy"},
             "spec": {"controllerName": "haproxy-haptic.org/controller"}},
            {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": {"name": "gw", "namespace": "default"},
             "spec": {"gatewayClassName": "haproxy", "listeners": [{"name": "http", "protocol": "HTTP", "port": 80}]}},
            {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": "route", "namespace": "default"},
             "spec": {"parentRefs": [{"name": "gw"}], "hostnames": ["gw.test"], "rules": [{"backendRefs": [{"name": "web", "port": 80}]}]}},
        ])

        # The chart's service account, with a token of its own.
        sa = f"{FULLNAME}-controller"
        self.assertEqual(one(docs, "Deployment", f"{FULLNAME}-controller")["spec"]["template"]["spec"]["serviceAccountName"], sa)
        config = yaml.safe_load(admin.read_text())
        ca = base64.b64decode(config["clusters"][0]["cluster"]["certificate-authority-data"]).decode()
        ctx = ssl.create_default_context(cadata=ca)
        body = json.dumps({"users": {"sa-token": {"username": f"system:serviceaccount:{NAMESPACE}:{sa}",
                                                  "groups": ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}"]}}})
        req = urllib.request.Request(f"{url}/_dev/tokens", data=body.encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
            self.assertEqual(r.status, 200)
        config["users"][0]["user"] = {"token": "sa-token"}
        sa_config = d / "kubeconfig-sa"
        sa_config.write_text(yaml.safe_dump(config))
        denied = subprocess.run([kubectl, "--kubeconfig", str(sa_config), "get", "deployments", "-n", NAMESPACE],
                                capture_output=True, text=True, timeout=60)
        self.assertIn("forbidden", denied.stderr, "the API server enforces RBAC on the service account")

        # The controller container as the pod runs it: its mounted Secrets as files, its
        # environment (downward API, ports moved to free ones), its arguments.
        deploy = one(docs, "Deployment", f"{FULLNAME}-controller")
        pod = deploy["spec"]["template"]["spec"]
        c = container(deploy, "controller")
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {}
        for m in c["volumeMounts"]:
            local = d / ("mount-" + m["name"])
            local.mkdir()
            secret = volumes[m["name"]].get("secret")
            if secret:
                for key, value in one(docs, "Secret", secret["secretName"])["data"].items():
                    (local / key).write_bytes(base64.b64decode(value))
            mounts[m["mountPath"]] = str(local)
        args = []
        for a in c["args"]:
            for path, local in mounts.items():
                a = a.replace(path, local)
            args.append(a)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "KUBECONFIG": str(sa_config), "TMPDIR": mounts.get("/tmp", str(d))}
        fields = {"metadata.namespace": NAMESPACE, "metadata.name": "controller-0", "status.podIP": "127.0.0.1"}
        for e in c["env"]:
            env[e["name"]] = e["value"] if "value" in e else fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
        for name in ("HEALTH_PORT", "METRICS_PORT", "WEBHOOK_PORT"):
            env[name] = str(free_port())
        env["HAPROXY_BIN"] = haproxy
        log = d / "controller.log"
        with open(log, "w") as out:
            procs.append(subprocess.Popen([haptic, *args], env=env, stdout=out, stderr=subprocess.STDOUT))

        # An HAProxy pod of the chart's workload, and its Pod object as the kubelet reports it.
        haproxy_workload = one(docs, "Deployment", f"{FULLNAME}-haproxy")
        agent = str(Path(haptic).resolve().with_name("haptic-agent"))
        pod_ip = "127.0.0.1"
        haproxy_pod = Pod(self, d, docs, haproxy_workload, {"haptic-agent": agent},
                          {"/usr/local/sbin/haproxy": haproxy}, {"status.podIP": pod_ip}, procs)
        haproxy_pod.start()
        labels = haproxy_workload["spec"]["template"]["metadata"]["labels"]
        apply([{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "haproxy-0", "namespace": NAMESPACE, "labels": labels},
                "spec": {"containers": [{"name": c["name"], "image": c["image"]} for c in haproxy_workload["spec"]["template"]["spec"]["containers"]]}}])
        k("patch", "pod", "haproxy-0", "-n", NAMESPACE, "--subresource=status", "--type=merge", "-p", json.dumps({"status": {
            "phase": "Running", "podIP": pod_ip, "podIPs": [{"ip": pod_ip}],
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": c["name"], "ready": True, "restartCount": 0, "image": c["image"], "imageID": "", "started": True,
                                   "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}
                                  for c in haproxy_workload["spec"]["template"]["spec"]["containers"]]}}))

        def serves(host):
            conn = http.client.HTTPConnection(address, ports["http"], timeout=2)
            try:
                conn.request("GET", "/", headers={"Host": host})
                r = conn.getresponse()
                return r.status == 200 and r.read() == token
            except OSError:
                return False
            finally:
                conn.close()

        def get(*args):
            r = subprocess.run([kubectl, "--kubeconfig", str(admin), "get", *args], capture_output=True, text=True, timeout=60)
            return r.stdout.strip()

        deadline = time.time() + 60
        wanted = {
            "Ingress status": lambda: get("ingress", "web", "-n", "default", "-o", "jsonpath={.status.loadBalancer.ingress[0].ip}") == "192.0.2.7",
            "HTTPRoute status": lambda: get("httproute", "route", "-n", "default", "-o",
                                            "jsonpath={.status.parents[0].conditions[?(@.type=='Accepted')].status}") == "True",
            "GatewayClass status": lambda: get("gatewayclass", "haproxy", "-o", "jsonpath={.status.conditions[0].status}") == "True",
            "HAProxyTemplateConfig status": lambda: get("haproxytemplateconfig", FULLNAME, "-n", NAMESPACE, "-o",
                                                        "jsonpath={.status.conditions[?(@.type=='Rendered')].status}") == "True",
            "leader Lease": lambda: "controller-0" in get("lease", "-n", NAMESPACE, "-o", "jsonpath={.items[*].spec.holderIdentity}"),
            "Ingress traffic": lambda: serves("web.test"),
            "HTTPRoute traffic": lambda: serves("gw.test"),
            "HAProxyCfg published": lambda: "backend" in get("haproxycfg", f"{FULLNAME}-haproxycfg", "-n", NAMESPACE,
                                                             "-o", "jsonpath={.spec.content}"),
        }
        missing = list(wanted)
        while missing and time.time() < deadline:
            missing = [w for w in missing if not wanted[w]()]
            time.sleep(0.3)
        # The leader renews its Lease (an update) every retryPeriod.
        renewed = lambda: get("lease", "-n", NAMESPACE, "-o", "jsonpath={.items[*].spec.renewTime}")
        first = renewed()
        while renewed() == first and time.time() < deadline + 15:
            time.sleep(0.3)
        if renewed() == first:
            missing.append("Lease renewal")
        text = log.read_text()
        pod_logs = "".join(f"\n--- {c['name']}\n" + haproxy_pod.log(c["name"])[-2000:] for c in haproxy_pod.spec["containers"])
        self.assertEqual(missing, [], text[-4000:] + pod_logs)
        refused = [l for l in text.splitlines() if "forbidden" in l.lower() or " 403" in l]
        self.assertEqual(refused, [], "requests the chart's RBAC does not allow")


if __name__ == "__main__":
    unittest.main()
