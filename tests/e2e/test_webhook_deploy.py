"""deploy/: the kustomize manifests render with the real kubectl and say what
docs/WEBHOOK.md promises (failurePolicy Ignore, annotation conditions,
least-privilege RBAC, a privileged hostPID agent with its tenancy
ConfigMap), and deploy/webhook-cert.sh
makes a certificate the webhook serves and the caBundle that verifies it.

Uses test_webhook's kubectl (exit 77 without one) and server harness."""
import base64
import json
import os
import subprocess
import unittest

import yaml

import test_webhook as tw

DEPLOY = os.path.join(tw.REPO, "deploy")
SERVICE_HOST = "gpusnap-webhook.gpusnap-system.svc"


def render(path):
    p = subprocess.run([tw.KUBECTL, "kustomize", path], capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise AssertionError(f"kubectl kustomize {path} failed: {p.stderr}")
    return [d for d in yaml.safe_load_all(p.stdout) if d]


def find(objs, kind, name=None):
    hits = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    if len(hits) != 1:
        raise AssertionError(f"{len(hits)} objects of kind {kind} named {name}")
    return hits[0]


class Manifests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.objs = render(DEPLOY)

    def test_everything_in_its_namespace(self):
        find(self.objs, "Namespace", "gpusnap-system")
        for o in self.objs:
            if o["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration"):
                self.assertEqual(o["metadata"].get("namespace"), "gpusnap-system", o["metadata"]["name"])

    def test_webhook_configuration(self):
        mwc = find(self.objs, "MutatingWebhookConfiguration")
        (wh,) = mwc["webhooks"]
        self.assertEqual(wh["failurePolicy"], "Ignore")
        self.assertEqual(wh["sideEffects"], "None")
        self.assertEqual(wh["admissionReviewVersions"], ["v1"])
        self.assertLessEqual(wh["timeoutSeconds"], 10)
        self.assertEqual(wh["rules"], [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                                        "resources": ["pods"], "scope": "Namespaced"}])
        conditions = " ".join(c["expression"] for c in wh["matchConditions"])
        for annotation in ("gpusnap.io/gpushare", "gpusnap.io/restore-from"):
            self.assertIn(f"'{annotation}' in object.metadata.annotations", conditions)
        excluded = wh["namespaceSelector"]["matchExpressions"][0]
        self.assertEqual((excluded["key"], excluded["operator"]), ("kubernetes.io/metadata.name", "NotIn"))
        self.assertIn("gpusnap-system", excluded["values"])
        svc = wh["clientConfig"]["service"]
        service = find(self.objs, "Service", svc["name"])
        self.assertEqual((svc["namespace"], svc["path"], svc["port"]),
                         (service["metadata"]["namespace"], "/mutate", service["spec"]["ports"][0]["port"]))

    def test_service_reaches_the_webhook_pods(self):
        service = find(self.objs, "Service", "gpusnap-webhook")
        dep = find(self.objs, "Deployment", "gpusnap-webhook")
        labels = dep["spec"]["template"]["metadata"]["labels"]
        self.assertTrue(service["spec"]["selector"].items() <= labels.items())
        (c,) = dep["spec"]["template"]["spec"]["containers"]
        port = service["spec"]["ports"][0]["targetPort"]
        self.assertIn(port, [p["name"] for p in c["ports"]])
        self.assertEqual(c["readinessProbe"]["httpGet"], {"path": "/healthz", "port": port, "scheme": "HTTPS"})

    def test_webhook_pod_unprivileged_with_secret_certificate(self):
        dep = find(self.objs, "Deployment", "gpusnap-webhook")
        spec = dep["spec"]["template"]["spec"]
        self.assertIs(spec["automountServiceAccountToken"], False)
        self.assertIs(spec["securityContext"]["runAsNonRoot"], True)
        (c,) = spec["containers"]
        self.assertIs(c["securityContext"]["allowPrivilegeEscalation"], False)
        self.assertEqual(c["securityContext"]["capabilities"]["drop"], ["ALL"])
        (tls,) = [v for v in spec["volumes"] if "secret" in v]
        self.assertEqual(tls["secret"]["secretName"], "gpusnap-webhook-tls")
        mount = next(m for m in c["volumeMounts"] if m["name"] == tls["name"])
        self.assertIn(f"--cert={mount['mountPath']}/tls.crt", c["args"])
        self.assertIn(f"--key={mount['mountPath']}/tls.key", c["args"])

    def test_agent_daemonset(self):
        ds = find(self.objs, "DaemonSet", "gpusnap-agent")
        spec = ds["spec"]["template"]["spec"]
        self.assertIs(spec["hostPID"], True)
        (agent,) = spec["containers"]
        self.assertIs(agent["securityContext"]["privileged"], True)
        self.assertNotIn("nvidia.com/gpu", json.dumps(agent.get("resources", {})))
        host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
        self.assertEqual(sorted(host.values()), ["/run/gpusnap", "/run/gpusnap-agent", "/sys/fs/cgroup",
                                                 "/var/lib/gpusnap", "/var/log/containers"])
        mounts = {m["mountPath"]: m for m in agent["volumeMounts"]}
        for read_only in ("/sys/fs/cgroup", "/var/log/containers", "/gpusnap"):
            self.assertIs(mounts[read_only].get("readOnly"), True, read_only)
        # The Kubernetes mode, on this node, with CRIU where placeholder pods see the bundle.
        self.assertIn("--kube", agent["args"])
        node = next(e for e in agent["env"] if e["name"] == "NODE_NAME")
        self.assertEqual(node["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName")
        self.assertEqual(mounts["/gpusnap"]["subPath"], "bundle")
        self.assertIn("--criu=/gpusnap/criu-bundle", agent["args"])
        # The administrator's tenancy rules: the ConfigMap, mounted read-only where --tenancy reads it.
        (tenancy,) = [a.split("=", 1)[1] for a in agent["args"] if a.startswith("--tenancy=")]
        (volume,) = [v for v in spec["volumes"] if "configMap" in v]
        self.assertEqual(volume["configMap"]["name"], "gpusnap-tenancy")
        mount = next(m for m in agent["volumeMounts"] if m["name"] == volume["name"])
        self.assertIs(mount.get("readOnly"), True)
        self.assertEqual(tenancy, os.path.join(mount["mountPath"], "tenancy.json"))
        config = find(self.objs, "ConfigMap", "gpusnap-tenancy")
        self.assertEqual(config["metadata"]["namespace"], "gpusnap-system")
        self.assertEqual(json.loads(config["data"]["tenancy.json"]), {"namespaces": {}})
        # The socket where gpusnap looks for it by default, on the node too.
        self.assertFalse([a for a in agent["args"] if a.startswith("--socket")])
        self.assertEqual(mounts["/run/gpusnap-agent"]["name"],
                         next(n for n, p in host.items() if p == "/run/gpusnap-agent"))

    def test_rbac_least_privilege(self):
        agent_role = find(self.objs, "ClusterRole", "gpusnap-agent")
        # Exactly what the agent's --kube mode uses: watch and annotate pods,
        # create Events, and get each namespace's Secret `gpusnap` by that
        # name alone (its opt-in and credentials), never any other Secret.
        granted = {}
        for rule in agent_role["rules"]:
            self.assertLessEqual(set(rule), {"apiGroups", "resources", "verbs", "resourceNames"}, rule)  # no URLs
            names = tuple(rule.get("resourceNames", ()))
            for group in rule["apiGroups"]:
                for res in rule["resources"]:
                    granted.setdefault((group, res, names), set()).update(rule["verbs"])
        self.assertEqual(granted, {("", "pods", ()): {"get", "list", "watch", "patch"},
                                   ("", "events", ()): {"create"},
                                   ("", "secrets", ("gpusnap",)): {"get"}})
        for kind in ("Role", "RoleBinding"):
            self.assertEqual([o for o in self.objs if o["kind"] == kind], [])
        (binding,) = [o for o in self.objs if o["kind"] == "ClusterRoleBinding"]
        self.assertEqual(binding["subjects"], [{"kind": "ServiceAccount", "name": "gpusnap-agent",
                                                "namespace": "gpusnap-system"}])
        webhook_sa = find(self.objs, "ServiceAccount", "gpusnap-webhook")
        self.assertIs(webhook_sa["automountServiceAccountToken"], False)


class OverlayCertificate:
    """A WebhookCase mixin: the webhook serves deploy/webhook-cert.sh's
    certificate; self.ca is the overlay's caBundle and self.overlay the objects
    `kubectl kustomize` renders from the overlay."""

    server_name = SERVICE_HOST

    def make_certificate(self):
        self.out = os.path.join(self.tmp, "overlay")
        self.cert_script()
        self.overlay = overlay = render(self.out)
        wh = find(overlay, "MutatingWebhookConfiguration")["webhooks"][0]
        self.ca = os.path.join(self.tmp, "cabundle.pem")
        with open(self.ca, "wb") as f:
            f.write(base64.b64decode(wh["clientConfig"]["caBundle"]))
        secret = find(overlay, "Secret", "gpusnap-webhook-tls")
        self.assertEqual(secret["type"], "kubernetes.io/tls")
        paths = []
        for name in ("tls.crt", "tls.key"):
            paths.append(os.path.join(self.tmp, name))
            with open(paths[-1], "wb") as f:
                f.write(base64.b64decode(secret["data"][name]))
        return paths

    def cert_script(self, *args):
        p = subprocess.run([os.path.join(DEPLOY, "webhook-cert.sh"), "--out", self.out, *args],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr + p.stdout)
        return p.stdout


class CertificateScript(OverlayCertificate, tw.WebhookCase):
    """deploy/webhook-cert.sh's certificate, served by the webhook and verified
    with the overlay's caBundle under the Service's DNS name."""

    def test_served_certificate_verifies_with_ca_bundle(self):
        served = self.admit(tw.fixture("gpushare-vllm.json"))[0]
        self.assertIs(served["allowed"], True)

    def test_second_run_keeps_the_certificate(self):
        with open(os.path.join(self.out, "tls.crt")) as f:
            before = f.read()
        self.assertIn("still good", self.cert_script())
        with open(os.path.join(self.out, "tls.crt")) as f:
            self.assertEqual(f.read(), before)
        self.cert_script("--force")
        with open(os.path.join(self.out, "tls.crt")) as f:
            self.assertNotEqual(f.read(), before)


if __name__ == "__main__":
    unittest.main()
