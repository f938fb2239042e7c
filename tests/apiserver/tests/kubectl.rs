//! The dev API server driven by the real kubectl: create, apply (strategic merge patch with the
//! last-applied annotation), get, watch and delete; CRDs and custom resources; a validating
//! webhook that denies; client-certificate and wrong-token kubeconfigs; the size limits of
//! objects (etcd's) and request bodies.

mod common;

use std::io::Write;
use std::time::Duration;

use common::webhook::{Webhook, DENIAL, WARNING};
use common::{lines_of, Server, DEADLINE};
use serde_json::Value;

fn write_manifest(server: &Server, name: &str, text: &str) -> String {
    let path = server.dir.join(name);
    std::fs::write(&path, text).expect("write manifest");
    path.display().to_string()
}

const APP_V1: &str = r#"
apiVersion: v1
kind: Namespace
metadata:
  name: shop
---
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: shop
  labels: {app: web}
spec:
  selector: {app: web}
  ports:
  - {name: http, port: 80, targetPort: 8080}
  - {name: https, port: 443, targetPort: 8443}
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
  namespace: shop
data:
  mode: blue
  legacy: "yes"
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: web
  namespace: shop
spec:
  rules:
  - host: shop.example.com
    http:
      paths:
      - path: /
        pathType: Prefix
        backend: {service: {name: web, port: {number: 80}}}
"#;

#[test]
fn kubectl_apply_get_update_and_delete() {
    let server = Server::start(&[]);
    let manifest = write_manifest(&server, "app.yaml", APP_V1);
    let out = server.kubectl_ok(&["apply", "--validate=false", "-f", &manifest]);
    assert!(out.contains("service/web created"), "{out}");
    assert!(
        out.contains("ingress.networking.k8s.io/web created"),
        "{out}"
    );

    let svc: Value = serde_json::from_str(
        &server.kubectl_ok(&["-n", "shop", "get", "svc", "web", "-o", "json"]),
    )
    .unwrap();
    assert_eq!(svc["metadata"]["generation"], 1);
    assert!(
        svc["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
            .is_string()
    );
    assert_eq!(svc["spec"]["ports"].as_array().unwrap().len(), 2);

    // Second apply: drop a port and a key, change a value. kubectl sends a strategic merge patch
    // with `$setElementOrder` and `$patch: delete` entries computed from the annotation.
    let v2 = APP_V1
        .replace("  - {name: https, port: 443, targetPort: 8443}\n", "")
        .replace("mode: blue", "mode: green")
        .replace("  legacy: \"yes\"\n", "")
        .replace("shop.example.com", "store.example.com");
    let manifest2 = write_manifest(&server, "app-v2.yaml", &v2);
    let out = server.kubectl_ok(&["apply", "--validate=false", "-f", &manifest2]);
    assert!(out.contains("service/web configured"), "{out}");
    assert!(out.contains("namespace/shop unchanged"), "{out}");

    let svc: Value = serde_json::from_str(
        &server.kubectl_ok(&["-n", "shop", "get", "svc", "web", "-o", "json"]),
    )
    .unwrap();
    let ports = svc["spec"]["ports"].as_array().unwrap();
    assert_eq!(ports.len(), 1, "{ports:?}");
    assert_eq!(ports[0]["port"], 80);
    assert_eq!(svc["metadata"]["generation"], 2);
    let data = server.kubectl_ok(&[
        "-n",
        "shop",
        "get",
        "cm",
        "settings",
        "-o",
        "jsonpath={.data}",
    ]);
    assert_eq!(
        serde_json::from_str::<Value>(&data).unwrap(),
        serde_json::json!({"mode": "green"})
    );
    let host = server.kubectl_ok(&[
        "-n",
        "shop",
        "get",
        "ingress",
        "web",
        "-o",
        "jsonpath={.spec.rules[0].host}",
    ]);
    assert_eq!(host, "store.example.com");

    // Table output, selectors and short names work as with a real cluster.
    let table = server.kubectl_ok(&["-n", "shop", "get", "svc", "-l", "app=web"]);
    assert!(table.lines().any(|l| l.starts_with("web ")), "{table}");
    let none = server.kubectl_ok(&["-n", "shop", "get", "svc", "-l", "app!=web", "-o", "name"]);
    assert!(none.trim().is_empty(), "{none}");

    let out = server.kubectl_ok(&["delete", "-f", &manifest2]);
    assert!(out.contains("service \"web\" deleted"), "{out}");
    let gone = server.kubectl(&["-n", "shop", "get", "svc", "web"]);
    assert!(!gone.status.success());
    let err = String::from_utf8_lossy(&gone.stderr);
    assert!(
        err.contains("Error from server (NotFound)") && err.contains("not found"),
        "{err}"
    );
}

#[test]
fn kubectl_create_conflicts_and_patch() {
    let server = Server::start(&[]);
    server.kubectl_ok(&["create", "configmap", "one", "--from-literal=a=1"]);
    let again = server.kubectl(&["create", "configmap", "one", "--from-literal=a=1"]);
    assert!(!again.status.success());
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(
        err.contains("AlreadyExists") || err.contains("already exists"),
        "{err}"
    );
    server.kubectl_ok(&[
        "patch",
        "configmap",
        "one",
        "--type=merge",
        "-p",
        r#"{"data":{"b":"2"}}"#,
    ]);
    server.kubectl_ok(&[
        "patch",
        "configmap",
        "one",
        "--type=json",
        "-p",
        r#"[{"op":"remove","path":"/data/a"}]"#,
    ]);
    server.kubectl_ok(&["label", "configmap", "one", "tier=front"]);
    let got: Value =
        serde_json::from_str(&server.kubectl_ok(&["get", "cm", "one", "-o", "json"])).unwrap();
    assert_eq!(got["data"], serde_json::json!({"b": "2"}));
    assert_eq!(got["metadata"]["labels"]["tier"], "front");
    let missing = server.kubectl(&["create", "configmap", "x", "-n", "nowhere"]);
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(err.contains("namespaces \"nowhere\" not found"), "{err}");
}

/// Field selectors take the fields the real API server lets each type be selected by.
#[test]
fn kubectl_field_selectors_by_type() {
    let server = Server::start(&[]);
    server.kubectl_ok(&[
        "create",
        "secret",
        "generic",
        "cert",
        "--type=kubernetes.io/tls",
        "--from-literal=tls.crt=x",
        "--from-literal=tls.key=y",
    ]);
    server.kubectl_ok(&["create", "secret", "generic", "plain", "--from-literal=a=1"]);
    let names = |selector: &str| {
        server.kubectl_ok(&[
            "get",
            "secrets",
            "--field-selector",
            selector,
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ])
    };
    assert_eq!(names("type=kubernetes.io/tls"), "cert");
    assert_eq!(names("type!=kubernetes.io/tls,metadata.name!=x"), "plain");
    let refused = server.kubectl(&["get", "configmaps", "--field-selector", "type=x"]);
    let err = String::from_utf8_lossy(&refused.stderr);
    // ConfigMaps have no field labels of their own: apimachinery's default words.
    assert!(
        !refused.status.success()
            && err.contains(
                r#""type" is not a known field selector: only "metadata.name", "metadata.namespace""#
            ),
        "{err}"
    );
    let refused = server.kubectl(&["get", "secrets", "--field-selector", "data=x"]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && err.contains("field label not supported: data"),
        "{err}"
    );
}

#[test]
fn kubectl_watch_sees_adds_updates_and_deletes() {
    let server = Server::start(&[]);
    let mut child = server.spawn_kubectl(&[
        "get",
        "configmaps",
        "--watch",
        "--output-watch-events",
        "-o",
        "jsonpath={.type} {.object.metadata.name}{\"\\n\"}",
    ]);
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let lines = lines_of(child.stdout.take().expect("stdout"));
    let _guard = Kill(child);
    // kubectl prints nothing for an empty namespace, so wait for a marker object to show up
    // before changing things: that proves the watch is established.
    server.kubectl_ok(&["create", "configmap", "marker"]);
    let next = || {
        lines
            .recv_timeout(DEADLINE)
            .expect("kubectl printed the next watch event")
    };
    assert_eq!(next(), "ADDED marker");
    server.kubectl_ok(&["create", "configmap", "w", "--from-literal=a=1"]);
    server.kubectl_ok(&["label", "configmap", "w", "x=y"]);
    let version = || {
        server.kubectl_ok(&[
            "get",
            "cm",
            "w",
            "-o",
            "jsonpath={.metadata.resourceVersion}",
        ])
    };
    let before = version();
    // Writes that change nothing are not written (the real API server's storage skips them):
    // the same resourceVersion, and no watch event between the label and the delete.
    server.kubectl_ok(&["label", "configmap", "w", "x=y", "--overwrite"]);
    server.kubectl_ok(&[
        "patch",
        "configmap",
        "w",
        "--type=merge",
        "-p",
        r#"{"data":{"a":"1"}}"#,
    ]);
    server.kubectl_ok(&[
        "replace",
        "--validate=false",
        "-f",
        &write_manifest(
            &server,
            "w.json",
            &server.kubectl_ok(&["get", "cm", "w", "-o", "json"]),
        ),
    ]);
    assert_eq!(version(), before);
    server.kubectl_ok(&["delete", "configmap", "w"]);
    assert_eq!(next(), "ADDED w");
    assert_eq!(next(), "MODIFIED w");
    assert_eq!(next(), "DELETED w");
}

#[test]
fn kubectl_crd_and_custom_resources() {
    let server = Server::start(&[]);
    let crd = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, shortNames: [wd]}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
"#;
    let path = write_manifest(&server, "crd.yaml", crd);
    server.kubectl_ok(&["apply", "--validate=false", "-f", &path]);
    let established = server.kubectl_ok(&[
        "get",
        "crd",
        "widgets.example.com",
        "-o",
        "jsonpath={.status.conditions[?(@.type==\"Established\")].status}",
    ]);
    assert_eq!(established, "True");
    let widget =
        "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w1}\nspec: {size: 1}\n";
    let wpath = write_manifest(&server, "w.yaml", widget);
    server.kubectl_ok(&["apply", "--validate=false", "-f", &wpath]);
    let w2 = write_manifest(&server, "w2.yaml", &widget.replace("size: 1", "size: 2"));
    let out = server.kubectl_ok(&["apply", "--validate=false", "-f", &w2]);
    assert!(out.contains("widget.example.com/w1 configured"), "{out}");
    let size = server.kubectl_ok(&[
        "get",
        "wd",
        "w1",
        "-o",
        "jsonpath={.spec.size} {.metadata.generation}",
    ]);
    assert_eq!(size, "2 2");
    let resources = server.kubectl_ok(&["api-resources", "--api-group=example.com"]);
    assert!(
        resources.contains("widgets") && resources.contains("wd"),
        "{resources}"
    );

    // Size limits as a real API server with etcd's defaults: an object above 1.5 MiB is
    // refused by etcd (passed on as a 500 without a reason), a request body above 3 MiB by
    // the API server itself (413); `create` sends the object as it is, `apply` would add the
    // last-applied annotation and double it.
    let sized = |name: &str, bytes: usize| {
        let blob = "x".repeat(bytes);
        let text = format!("apiVersion: example.com/v1\nkind: Widget\nmetadata: {{name: {name}}}\nspec: {{blob: {blob}}}\n");
        write_manifest(&server, &format!("{name}.yaml"), &text)
    };
    server.kubectl_ok(&[
        "create",
        "--validate=false",
        "-f",
        &sized("fits", 1_500_000),
    ]);
    let big = server.kubectl(&["create", "--validate=false", "-f", &sized("big", 2 << 20)]);
    let err = String::from_utf8_lossy(&big.stderr);
    assert!(!big.status.success());
    assert!(
        err.starts_with("Error from server: ")
            && err.contains(": etcdserver: request is too large"),
        "{err}"
    );
    let huge = server.kubectl(&["create", "--validate=false", "-f", &sized("huge", 4 << 20)]);
    let err = String::from_utf8_lossy(&huge.stderr);
    assert!(
        err.contains("(RequestEntityTooLarge)")
            && err.contains("Request entity too large: limit is 3145728"),
        "{err}"
    );
    // An update past the limit is refused the same way, and the stored object stays.
    let patch = write_manifest(
        &server,
        "grow.json",
        &format!(r#"{{"spec":{{"more":"{}"}}}}"#, "y".repeat(200_000)),
    );
    let grown = server.kubectl(&[
        "patch",
        "wd",
        "fits",
        "--type=merge",
        "--patch-file",
        &patch,
    ]);
    assert!(!grown.status.success());
    assert!(String::from_utf8_lossy(&grown.stderr).contains("request is too large"));
    let kept = server.kubectl_ok(&["get", "wd", "fits", "-o", "jsonpath={.spec.more}"]);
    assert_eq!(kept, "");
    server.kubectl_ok(&["delete", "crd", "widgets.example.com"]);
    let gone = server.call(
        "GET",
        "/apis/example.com/v1/namespaces/default/widgets",
        None,
    );
    assert_eq!(gone.0, 404);
}

#[test]
fn kubectl_validating_webhook_denies() {
    let server = Server::start(&[]);
    let hook = Webhook::start();
    let config = format!(
        r#"apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: test-policy
webhooks:
- name: deny.haptic.test
  admissionReviewVersions: [v1]
  sideEffects: None
  failurePolicy: Fail
  timeoutSeconds: 5
  clientConfig:
    url: {url}
    caBundle: {ca}
  rules:
  - apiGroups: [""]
    apiVersions: [v1]
    resources: [configmaps]
    operations: [CREATE, UPDATE]
- name: broken.haptic.test
  admissionReviewVersions: [v1]
  sideEffects: None
  failurePolicy: Ignore
  clientConfig:
    url: https://127.0.0.1:1/unreachable
  rules:
  - apiGroups: [""]
    apiVersions: [v1]
    resources: [configmaps]
    operations: ["*"]
"#,
        url = hook.url,
        ca = base64(hook.ca_pem.as_bytes())
    );
    let path = write_manifest(&server, "vwc.yaml", &config);
    server.kubectl_ok(&["apply", "--validate=false", "-f", &path]);

    let denied = server.kubectl(&["create", "configmap", "deny-me", "--from-literal=a=b"]);
    assert!(
        !denied.status.success(),
        "creation should have been refused"
    );
    let err = String::from_utf8_lossy(&denied.stderr);
    assert!(
        err.contains(&format!(
            "admission webhook \"deny.haptic.test\" denied the request: {DENIAL}"
        )),
        "{err}"
    );
    server.kubectl_ok(&["create", "configmap", "allowed", "--from-literal=a=b"]);
    // A webhook's warnings reach kubectl as Warning headers, each cut at 256 characters.
    let warned = server.kubectl(&["create", "configmap", "warn-me"]);
    let err = String::from_utf8_lossy(&warned.stderr);
    assert!(warned.status.success(), "{err}");
    assert!(err.contains(&format!("Warning: {WARNING}\n")), "{err}");
    assert!(
        err.contains(&format!("Warning: {}\n", "w".repeat(256))),
        "{err}"
    );
    assert!(hook.reviews.load(std::sync::atomic::Ordering::SeqCst) >= 2);
    let absent = server.call("GET", "/api/v1/namespaces/default/configmaps/deny-me", None);
    assert_eq!(absent.0, 404);

    // With failurePolicy Fail, an unreachable webhook refuses the write.
    let failing = config.replace("failurePolicy: Ignore", "failurePolicy: Fail");
    let path = write_manifest(&server, "vwc2.yaml", &failing);
    server.kubectl_ok(&["apply", "--validate=false", "-f", &path]);
    let refused = server.kubectl(&["create", "configmap", "other"]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        err.contains("failed calling webhook \"broken.haptic.test\""),
        "{err}"
    );
}

#[test]
fn kubectl_client_certificate_and_bad_token() {
    let server = Server::start(&[]);
    let cert_config = server.dir.join("kubeconfig-client-cert");
    let ok = server.kubectl_with(&cert_config, &["get", "namespaces", "-o", "name"]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(String::from_utf8_lossy(&ok.stdout).contains("namespace/default"));

    let text = std::fs::read_to_string(&server.kubeconfig).unwrap();
    let bad = server.dir.join("kubeconfig-bad");
    let mut f = std::fs::File::create(&bad).unwrap();
    f.write_all(text.replace(&server.token, "wrong-token").as_bytes())
        .unwrap();
    let refused = server.kubectl_with(&bad, &["get", "namespaces"]);
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("Unauthorized"), "{err}");
    let _ = Duration::ZERO;
}

fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in data.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            out.push(if i <= c.len() {
                T[((n >> (18 - 6 * i)) & 63) as usize] as char
            } else {
                '='
            });
        }
    }
    out
}

/// With `--authorization-mode RBAC`, a service account may do what its Roles and ClusterRoles
/// bound to it allow, and gets Kubernetes' Forbidden message otherwise; the administrator may
/// do everything.
#[test]
fn kubectl_rbac_authorizes_a_service_account() {
    let server = Server::start(&["--authorization-mode", "RBAC"]);
    let (code, _) = server.call(
        "POST",
        "/_dev/tokens",
        Some(&serde_json::json!({"users": {"sa-token": {"username": "system:serviceaccount:default:ctrl", "groups": ["system:serviceaccounts", "system:serviceaccounts:default"]}}})),
    );
    assert_eq!(code, 200);
    let rbac = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: reader, namespace: default}
rules:
  - {apiGroups: [""], resources: ["configmaps"], verbs: ["get", "list"]}
  - {apiGroups: ["networking.k8s.io"], resources: ["ingresses/status"], verbs: ["patch"]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: reader, namespace: default}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: reader}
subjects: [{kind: ServiceAccount, name: ctrl, namespace: default}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: ns-reader}
rules: [{apiGroups: [""], resources: ["namespaces"], verbs: ["list"]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: ns-reader}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: ns-reader}
subjects: [{kind: Group, name: "system:serviceaccounts:default"}]
"#;
    server.kubectl_ok(&[
        "apply",
        "--validate=false",
        "-f",
        &write_manifest(&server, "rbac.yaml", rbac),
    ]);
    server.kubectl_ok(&["create", "configmap", "one", "--from-literal=a=1"]);
    let text = std::fs::read_to_string(&server.kubeconfig).unwrap();
    let as_sa = server.dir.join("kubeconfig-sa");
    std::fs::write(&as_sa, text.replace(&server.token, "sa-token")).unwrap();
    let run = |args: &[&str]| {
        let out = server.kubectl_with(&as_sa, args);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    assert!(run(&["get", "configmap", "one"]).0);
    assert!(run(&["get", "configmaps"]).0);
    assert!(
        run(&["get", "namespaces"]).0,
        "through the group's ClusterRoleBinding"
    );
    let (ok, out) = run(&["create", "configmap", "two"]);
    assert!(!ok && out.contains(r#"configmaps is forbidden: User "system:serviceaccount:default:ctrl" cannot create resource "configmaps" in API group "" in the namespace "default""#), "{out}");
    let (ok, out) = run(&["get", "configmaps", "-n", "kube-system"]);
    assert!(
        !ok && out.contains(
            r#"cannot list resource "configmaps" in API group "" in the namespace "kube-system""#
        ),
        "{out}"
    );
    let (ok, out) = run(&["get", "secrets"]);
    assert!(!ok && out.contains("forbidden"), "{out}");
    let (ok, out) = run(&["get", "configmaps", "-A"]);
    assert!(
        !ok && out
            .contains(r#"cannot list resource "configmaps" in API group "" at the cluster scope"#),
        "{out}"
    );
    // The administrator is not bound by RBAC.
    server.kubectl_ok(&["create", "configmap", "three"]);
}
