//! Validating admission webhooks. Every write to a resource (except the admissionregistration
//! types themselves, as in Kubernetes) is checked against the stored
//! ValidatingWebhookConfigurations: rules (apiGroups, apiVersions, resources including
//! subresources, operations, scope), namespaceSelector and objectSelector. Matching webhooks get
//! an `admission.k8s.io/v1` AdmissionReview over HTTPS at `clientConfig.url`, trusting
//! `clientConfig.caBundle`, within `timeoutSeconds`. A denial becomes the Status the real API
//! server returns (`admission webhook "NAME" denied the request: MSG`); a call that fails is
//! ignored or refused according to `failurePolicy`. `clientConfig.service` (no cluster DNS here)
//! and `matchConditions` (CEL) are not supported: the former counts as a failed call.
//!
//! As `kube-apiserver --admission-control-config-file`, the server can present a client
//! certificate to webhooks: the file is an AdmissionConfiguration whose
//! ValidatingAdmissionWebhook plugin names a `kubeConfigFile` (an absolute path), and that
//! kubeconfig's `users` are matched as kube-apiserver matches them: by `host:port` (port 443
//! when the URL has none), then `*.` wildcards of its leading labels; for port 443 the same
//! again without the port; then `*`; then the user of the kubeconfig's current context. Only
//! client certificates are supported (`client-certificate[-data]` and `client-key[-data]`).

use std::path::Path;
use std::sync::OnceLock;

use std::time::Duration;

use serde_json::{json, Value};

use crate::auth::User;
use crate::registry::ResourceType;
use crate::selectors::LabelSelector;
use crate::server::Ctx;
use crate::status::ApiError;
use crate::util::{base64_decode, new_uid};

const WEBHOOK_CONFIGS: &str = "validatingwebhookconfigurations.admissionregistration.k8s.io";

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Operation {
    Create,
    Update,
    Delete,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
        }
    }

    fn options_kind(self) -> &'static str {
        match self {
            Operation::Create => "CreateOptions",
            Operation::Update => "UpdateOptions",
            Operation::Delete => "DeleteOptions",
        }
    }
}

/// One write to be reviewed.
pub struct Review<'a> {
    pub operation: Operation,
    pub rtype: &'a ResourceType,
    pub version: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
    pub subresource: Option<&'a str>,
    pub user: &'a User,
    pub dry_run: bool,
    pub object: Option<&'a Value>,
    pub old_object: Option<&'a Value>,
}

/// Runs every matching webhook; the first denial or failing call (with `failurePolicy: Fail`)
/// refuses the write.
pub fn validate(ctx: &Ctx, review: &Review) -> Result<(), ApiError> {
    if review.rtype.group == "admissionregistration.k8s.io" {
        return Ok(());
    }
    let (_, configs) = ctx.store.list(WEBHOOK_CONFIGS, None, None)?;
    for config in &configs {
        for hook in config["webhooks"].as_array().into_iter().flatten() {
            if !matches_rules(hook, review) || !matches_selectors(ctx, hook, review) {
                continue;
            }
            let name = hook["name"].as_str().unwrap_or("");
            match call(hook, review) {
                Ok(response) => {
                    add_warnings(&response);
                    check_response(name, &response)?
                }
                Err(e) => {
                    let ignore = hook["failurePolicy"].as_str() == Some("Ignore");
                    log::info!("webhook call failed webhook={name} ignored={ignore} error={e}");
                    if !ignore {
                        return Err(ApiError::internal(format!(
                            "Internal error occurred: failed calling webhook \"{name}\": {e}"
                        )));
                    }
                }
            }
        }
    }
    Ok(())
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn matches_rules(hook: &Value, r: &Review) -> bool {
    let resource = match r.subresource {
        Some(sub) => format!("{}/{sub}", r.rtype.plural),
        None => r.rtype.plural.clone(),
    };
    hook["rules"].as_array().into_iter().flatten().any(|rule| {
        let any_or = |field: &str, value: &str| {
            strings(&rule[field])
                .iter()
                .any(|x| *x == "*" || *x == value)
        };
        let resource_ok = strings(&rule["resources"]).iter().any(|x| {
            *x == resource
                || (*x == "*" && r.subresource.is_none())
                || *x == "*/*"
                || r.subresource.is_some_and(|s| {
                    *x == format!("*/{s}") || *x == format!("{}/*", r.rtype.plural)
                })
        });
        let scope_ok = match rule["scope"].as_str().unwrap_or("*") {
            "Cluster" => !r.rtype.namespaced,
            "Namespaced" => r.rtype.namespaced,
            _ => true,
        };
        any_or("operations", r.operation.as_str())
            && any_or("apiGroups", &r.rtype.group)
            && any_or("apiVersions", r.version)
            && resource_ok
            && scope_ok
    })
}

fn matches_selectors(ctx: &Ctx, hook: &Value, r: &Review) -> bool {
    let selector = |field: &str| -> Option<LabelSelector> {
        hook.get(field)
            .filter(|v| v.is_object())
            .map(|v| LabelSelector::from_label_selector_object(v).unwrap_or_default())
    };
    if let Some(sel) = selector("objectSelector") {
        let hit = [r.object, r.old_object]
            .iter()
            .flatten()
            .any(|o| sel.matches(o));
        if !hit {
            return false;
        }
    }
    if let Some(sel) = selector("namespaceSelector") {
        let is_namespace = r.rtype.group.is_empty() && r.rtype.plural == "namespaces";
        let labels = if is_namespace {
            r.object
                .or(r.old_object)
                .map(|o| o["metadata"]["labels"].clone())
        } else if r.rtype.namespaced {
            ctx.store
                .get("namespaces", "", r.namespace)
                .map(|ns| ns["metadata"]["labels"].clone())
        } else {
            return true;
        };
        if !sel.matches_labels(&labels.unwrap_or(Value::Null)) {
            return false;
        }
    }
    true
}

fn request_body(r: &Review, uid: &str) -> Value {
    let gvk = json!({"group": r.rtype.group, "version": r.version, "kind": r.rtype.kind});
    let gvr = json!({"group": r.rtype.group, "version": r.version, "resource": r.rtype.plural});
    let mut req = json!({
        "uid": uid,
        "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
        "name": r.name,
        "operation": r.operation.as_str(),
        "userInfo": r.user.to_json(),
        "object": r.object.cloned().unwrap_or(Value::Null),
        "oldObject": r.old_object.cloned().unwrap_or(Value::Null),
        "dryRun": r.dry_run,
        "options": {"kind": r.operation.options_kind(), "apiVersion": "meta.k8s.io/v1"},
    });
    if r.rtype.namespaced {
        req["namespace"] = json!(r.namespace);
    }
    if let Some(sub) = r.subresource {
        req["subResource"] = json!(sub);
        req["requestSubResource"] = json!(sub);
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req})
}

/// Client certificates for webhook calls, by kubeconfig user name, as PEM certificate chain
/// and key; and the user of the kubeconfig's current context.
struct Credentials {
    users: Vec<(String, Vec<u8>, Vec<u8>)>,
    current: Option<String>,
}

static CREDENTIALS: OnceLock<Credentials> = OnceLock::new();

/// Reads `--admission-control-config-file`: the ValidatingAdmissionWebhook plugin's
/// kubeconfig, and from it the users with a client certificate.
pub fn load_admission_config(path: &Path) -> Result<(), String> {
    let read = |p: &Path| std::fs::read(p).map_err(|e| format!("read {}: {e}", p.display()));
    let config: Value =
        serde_yaml::from_slice(&read(path)?).map_err(|e| format!("{}: {e}", path.display()))?;
    if config["kind"] != "AdmissionConfiguration" {
        return Err(format!("{}: not an AdmissionConfiguration", path.display()));
    }
    let plugin = config["plugins"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == "ValidatingAdmissionWebhook");
    let Some(kubeconfig) = plugin.and_then(|p| p["configuration"]["kubeConfigFile"].as_str())
    else {
        return Err(format!(
            "{}: no ValidatingAdmissionWebhook plugin with a kubeConfigFile",
            path.display()
        ));
    };
    let kubeconfig = Path::new(kubeconfig);
    if !kubeconfig.is_absolute() {
        return Err(format!(
            "{}: kubeConfigFile {:?}: must be an absolute file path",
            path.display(),
            kubeconfig
        ));
    }
    let doc: Value = serde_yaml::from_slice(&read(kubeconfig)?)
        .map_err(|e| format!("{}: {e}", kubeconfig.display()))?;
    // Files a kubeconfig names are relative to the kubeconfig, as kube-apiserver reads them.
    let base = kubeconfig.parent().unwrap_or(Path::new("/"));
    let mut users = Vec::new();
    for user in doc["users"].as_array().into_iter().flatten() {
        let name = user["name"].as_str().unwrap_or_default().to_string();
        let pem = |field: &str| -> Result<Option<Vec<u8>>, String> {
            if let Some(data) = user["user"][format!("{field}-data")].as_str() {
                return base64_decode(data)
                    .map(Some)
                    .map_err(|e| format!("{name}: {field}-data: {e}"));
            }
            match user["user"][field].as_str() {
                Some(file) => read(&base.join(file)).map(Some),
                None => Ok(None),
            }
        };
        match (pem("client-certificate")?, pem("client-key")?) {
            (Some(cert), Some(key)) => users.push((name, cert, key)),
            _ => {
                return Err(format!(
                    "{}: user {name:?} has no client certificate and key (the only credentials supported)",
                    kubeconfig.display()
                ))
            }
        }
    }
    let current = doc["current-context"].as_str().and_then(|context| {
        doc["contexts"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["name"] == context)
            .and_then(|c| c["context"]["user"].as_str())
            .map(str::to_string)
    });
    CREDENTIALS
        .set(Credentials { users, current })
        .map_err(|_| "admission configuration loaded twice".to_string())
}

/// The kubeconfig user names kube-apiserver tries for a webhook at `url`, in order.
fn user_names(url: &str) -> Vec<String> {
    let authority = url
        .split("://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_default();
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => (h, p),
        _ => (authority, "443"),
    };
    let exact_and_wildcards = |target: &str| {
        let labels: Vec<&str> = target.split('.').collect();
        let mut names = vec![target.to_string()];
        names.extend((1..labels.len()).map(|i| format!("*.{}", labels[i..].join("."))));
        names
    };
    let mut names = exact_and_wildcards(&format!("{host}:{port}"));
    if port == "443" {
        names.extend(exact_and_wildcards(host));
    }
    names.push("*".into());
    names
}

/// The client certificate for a webhook at `url`, as kube-apiserver picks it.
fn credentials_for(url: &str) -> Option<&'static (String, Vec<u8>, Vec<u8>)> {
    let all = CREDENTIALS.get()?;
    let by_name = |n: &str| all.users.iter().find(|(name, _, _)| name == n);
    user_names(url)
        .iter()
        .find_map(|n| by_name(n))
        .or_else(|| all.current.as_deref().and_then(by_name))
}

/// Sends the review and returns the webhook's `response` object.
fn call(hook: &Value, r: &Review) -> Result<Value, String> {
    let client = &hook["clientConfig"];
    let url = match client["url"].as_str() {
        Some(u) => u,
        None if client["service"].is_object() => {
            return Err(
                "failed to call webhook: clientConfig.service is not supported by \
                        haptic-dev-apiserver (use clientConfig.url)"
                    .into(),
            )
        }
        None => return Err("failed to call webhook: clientConfig has no url".into()),
    };
    let timeout = Duration::from_secs(hook["timeoutSeconds"].as_u64().unwrap_or(10).clamp(1, 30));
    let mut tls = ureq::tls::TlsConfig::builder();
    if let Some(bundle) = client["caBundle"].as_str().filter(|b| !b.is_empty()) {
        let pem = base64_decode(bundle).map_err(|e| format!("caBundle: {e}"))?;
        let certs: Vec<ureq::tls::Certificate<'static>> = ureq::tls::parse_pem(&pem)
            .filter_map(|item| match item {
                Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
                _ => None,
            })
            .collect();
        if certs.is_empty() {
            return Err("caBundle holds no PEM certificate".into());
        }
        tls = tls.root_certs(ureq::tls::RootCerts::new_with_certs(&certs));
    } else {
        // Like the real API server without a caBundle: the system roots, which hold no
        // cluster CA (this server has none built in).
        tls = tls.root_certs(ureq::tls::RootCerts::new_with_certs(&[]));
    }
    if let Some((name, cert, key)) = credentials_for(url) {
        let chain: Vec<ureq::tls::Certificate<'static>> = ureq::tls::parse_pem(cert)
            .filter_map(|item| match item {
                Ok(ureq::tls::PemItem::Certificate(c)) => Some(c.to_owned()),
                _ => None,
            })
            .collect();
        let key = ureq::tls::PrivateKey::from_pem(key)
            .map_err(|e| format!("client key of user {name:?}: {e}"))?
            .to_owned();
        tls = tls.client_cert(Some(ureq::tls::ClientCert::new_with_certs(&chain, key)));
    }
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .tls_config(tls.build())
        .timeout_global(Some(timeout))
        .http_status_as_error(false)
        .build()
        .into();
    let uid = new_uid();
    let body = request_body(r, &uid).to_string();
    let failed = |e: String| format!("failed to call webhook: Post \"{url}\": {e}");
    // As kube-apiserver, the wait it will give the webhook (clientConfig.url has no query).
    let mut resp = agent
        .post(format!("{url}?timeout={}s", timeout.as_secs()))
        .header("Content-Type", "application/json")
        .send(body)
        .map_err(|e| failed(e.to_string()))?;
    let code = resp.status().as_u16();
    let text = resp
        .body_mut()
        .read_to_string()
        .map_err(|e| failed(e.to_string()))?;
    if !(200..300).contains(&code) {
        return Err(format!(
            "failed to call webhook: the server responded with status {code}"
        ));
    }
    let review: Value = serde_json::from_str(&text)
        .map_err(|e| format!("received invalid webhook response: {e}"))?;
    let response = review
        .get("response")
        .filter(|r| r.is_object())
        .ok_or("received invalid webhook response: no response object")?;
    if response["uid"].as_str() != Some(uid.as_str()) {
        return Err(format!(
            "expected response.uid={uid:?}, got {:?}",
            response["uid"].as_str().unwrap_or("")
        ));
    }
    Ok(response.clone())
}

thread_local! {
    /// The warnings webhooks gave for the request this thread answers.
    static WARNINGS: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// What the API server keeps of a webhook's warnings (allowed or denied): each cut at 256
/// characters, and none past 4096 characters in all.
fn add_warnings(response: &Value) {
    const EACH: usize = 256;
    const ALL: usize = 4096;
    WARNINGS.with(|kept| {
        let mut kept = kept.borrow_mut();
        for warning in response["warnings"].as_array().into_iter().flatten() {
            let Some(text) = warning.as_str().filter(|t| !t.is_empty()) else {
                continue;
            };
            let text: String = text.chars().take(EACH).collect();
            let used: usize = kept.iter().map(|w| w.chars().count()).sum();
            if used + text.chars().count() > ALL {
                return;
            }
            kept.push(text);
        }
    });
}

/// The warnings gathered for this thread's request, as `Warning` headers (code 299, as
/// kube-apiserver sends them; kubectl prints each as `Warning: TEXT`). Taking them clears them.
pub fn take_warning_headers() -> Vec<(&'static str, String)> {
    WARNINGS.with(|kept| {
        std::mem::take(&mut *kept.borrow_mut())
            .into_iter()
            .map(|text| {
                let quoted = text
                    .chars()
                    .map(|c| if c.is_control() { ' ' } else { c })
                    .collect::<String>()
                    .replace('\\', "\\\\")
                    .replace('"', "\\\"");
                ("Warning", format!("299 - \"{quoted}\""))
            })
            .collect()
    })
}

fn check_response(name: &str, response: &Value) -> Result<(), ApiError> {
    if response["allowed"].as_bool() == Some(true) {
        return Ok(());
    }
    let status = &response["status"];
    let denied = format!("admission webhook \"{name}\" denied the request");
    let message = match (status["message"].as_str(), status["reason"].as_str()) {
        (Some(m), _) if !m.is_empty() => format!("{denied}: {m}"),
        (_, Some(reason)) if !reason.is_empty() => format!("{denied}: {reason}"),
        _ => format!("{denied} without explanation"),
    };
    let code = status["code"]
        .as_u64()
        .map(|c| c as u16)
        .filter(|c| *c >= 400)
        .unwrap_or(403);
    let reason = status["reason"]
        .as_str()
        .filter(|r| !r.is_empty())
        .unwrap_or("Forbidden");
    Err(ApiError::new(code, reason, message))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Registry;

    #[test]
    fn rules_and_denials() {
        let reg = Registry::builtin();
        let rt = reg.find("", "v1", "configmaps").unwrap();
        let user = User {
            name: "u".into(),
            groups: vec![],
        };
        let review = Review {
            operation: Operation::Create,
            rtype: &rt,
            version: "v1",
            namespace: "default",
            name: "x",
            subresource: None,
            user: &user,
            dry_run: false,
            object: None,
            old_object: None,
        };
        let hook = json!({"rules": [{"apiGroups": [""], "apiVersions": ["v1"],
            "resources": ["configmaps"], "operations": ["CREATE"]}]});
        assert!(matches_rules(&hook, &review));
        let other = json!({"rules": [{"apiGroups": ["*"], "apiVersions": ["*"],
            "resources": ["secrets"], "operations": ["*"]}]});
        assert!(!matches_rules(&other, &review));
        let err = check_response(
            "deny.example.com",
            &json!({"allowed": false, "status": {"message": "nope"}}),
        )
        .unwrap_err();
        assert_eq!(
            err.message,
            "admission webhook \"deny.example.com\" denied the request: nope"
        );
        assert_eq!(err.code, 403);
    }

    #[test]
    fn webhook_users_are_tried_as_kube_apiserver_tries_them() {
        assert_eq!(
            user_names("https://hook.ns.svc:8443/validate"),
            ["hook.ns.svc:8443", "*.ns.svc:8443", "*.svc:8443", "*"]
        );
        assert_eq!(
            user_names("https://hook.ns.svc/validate"),
            [
                "hook.ns.svc:443",
                "*.ns.svc:443",
                "*.svc:443",
                "hook.ns.svc",
                "*.ns.svc",
                "*.svc",
                "*"
            ]
        );
        assert_eq!(
            user_names("https://127.0.0.9:9443/validate"),
            [
                "127.0.0.9:9443",
                "*.0.0.9:9443",
                "*.0.9:9443",
                "*.9:9443",
                "*"
            ]
        );
    }
}
