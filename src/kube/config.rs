//! Where the API server is and how to authenticate: from the in-cluster service account or from
//! a kubeconfig file (current context, or a named one).

use std::path::{Path, PathBuf};

use serde_json::Value;

const SA_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// How requests authenticate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    None,
    Token(String),
    /// Re-read when the file changes (service-account tokens are rotated in place).
    TokenFile(PathBuf),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeConfig {
    pub server: String,
    /// PEM of the CA to trust; with `insecure_skip_tls_verify` false an `https` server needs it.
    pub ca_pem: Option<Vec<u8>>,
    pub insecure_skip_tls_verify: bool,
    pub credentials: Credentials,
    /// PEM certificate and key for client-certificate authentication.
    pub client_cert: Option<(Vec<u8>, Vec<u8>)>,
    /// The namespace of the context or service account.
    pub namespace: String,
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("read {}: {e}", path.display()))
}

fn decode_data(field: &str, text: &str) -> Result<Vec<u8>, String> {
    haptic_agent::base64::decode(text.trim()).map_err(|e| format!("kubeconfig {field}: {e}"))
}

impl KubeConfig {
    /// The kubeconfig file's current context, or without one the in-cluster configuration.
    pub fn load(kubeconfig: Option<&Path>) -> Result<KubeConfig, String> {
        match kubeconfig {
            Some(path) => KubeConfig::from_kubeconfig(path, None),
            None => KubeConfig::in_cluster(),
        }
    }

    /// The in-cluster configuration (service-account token, CA and namespace).
    pub fn in_cluster() -> Result<KubeConfig, String> {
        KubeConfig::in_cluster_from(Path::new(SA_DIR))
    }

    pub fn in_cluster_from(dir: &Path) -> Result<KubeConfig, String> {
        let host = std::env::var("KUBERNETES_SERVICE_HOST").map_err(|_| {
            "KUBERNETES_SERVICE_HOST is not set (not running in a cluster?)".to_string()
        })?;
        let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".into());
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host
        };
        let namespace = std::fs::read_to_string(dir.join("namespace"))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "default".into());
        Ok(KubeConfig {
            server: format!("https://{host}:{port}"),
            ca_pem: Some(read(&dir.join("ca.crt"))?),
            insecure_skip_tls_verify: false,
            credentials: Credentials::TokenFile(dir.join("token")),
            client_cert: None,
            namespace,
        })
    }

    /// Reads a kubeconfig file; `context` overrides its `current-context`.
    pub fn from_kubeconfig(path: &Path, context: Option<&str>) -> Result<KubeConfig, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("read kubeconfig {}: {e}", path.display()))?;
        let doc: Value = serde_yaml::from_str(&text)
            .map_err(|e| format!("parse kubeconfig {}: {e}", path.display()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        KubeConfig::from_kubeconfig_value(&doc, base, context)
            .map_err(|e| format!("kubeconfig {}: {e}", path.display()))
    }

    pub(crate) fn from_kubeconfig_value(
        doc: &Value,
        base: &Path,
        context: Option<&str>,
    ) -> Result<KubeConfig, String> {
        let context_name = context
            .map(str::to_string)
            .or_else(|| {
                doc.get("current-context")
                    .and_then(Value::as_str)
                    .map(str::to_string)
            })
            .ok_or("no current-context and no context given")?;
        let named = |list: &str, name: &str, inner: &str| -> Result<Value, String> {
            doc.get(list)
                .and_then(Value::as_array)
                .and_then(|items| {
                    items
                        .iter()
                        .find(|i| i.get("name").and_then(Value::as_str) == Some(name))
                })
                .and_then(|i| i.get(inner))
                .cloned()
                .ok_or_else(|| format!("{list}: no entry named {name:?}"))
        };
        let ctx = named("contexts", &context_name, "context")?;
        let cluster_name = ctx
            .get("cluster")
            .and_then(Value::as_str)
            .ok_or("context has no cluster")?;
        let cluster = named("clusters", cluster_name, "cluster")?;
        let user = match ctx.get("user").and_then(Value::as_str) {
            Some(name) => named("users", name, "user")?,
            None => Value::Null,
        };
        let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
        let resolve = |p: String| {
            if Path::new(&p).is_absolute() {
                PathBuf::from(p)
            } else {
                base.join(p)
            }
        };

        let server = s(&cluster, "server").ok_or("cluster has no server")?;
        let ca_pem = match (
            s(&cluster, "certificate-authority-data"),
            s(&cluster, "certificate-authority"),
        ) {
            (Some(data), _) => Some(decode_data("certificate-authority-data", &data)?),
            (None, Some(file)) => Some(read(&resolve(file))?),
            _ => None,
        };
        let insecure = cluster
            .get("insecure-skip-tls-verify")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let credentials = match (s(&user, "token"), s(&user, "tokenFile")) {
            (Some(token), _) => Credentials::Token(token),
            (None, Some(file)) => Credentials::TokenFile(resolve(file)),
            _ => Credentials::None,
        };
        let cert = match (
            s(&user, "client-certificate-data"),
            s(&user, "client-certificate"),
        ) {
            (Some(data), _) => Some(decode_data("client-certificate-data", &data)?),
            (None, Some(file)) => Some(read(&resolve(file))?),
            _ => None,
        };
        let key = match (s(&user, "client-key-data"), s(&user, "client-key")) {
            (Some(data), _) => Some(decode_data("client-key-data", &data)?),
            (None, Some(file)) => Some(read(&resolve(file))?),
            _ => None,
        };
        let client_cert =
            match (cert, key) {
                (Some(c), Some(k)) => Some((c, k)),
                (None, None) => None,
                _ => return Err(
                    "user has a client certificate without a key, or a key without a certificate"
                        .into(),
                ),
            };
        Ok(KubeConfig {
            server: server.trim_end_matches('/').to_string(),
            ca_pem,
            insecure_skip_tls_verify: insecure,
            credentials,
            client_cert,
            namespace: s(&ctx, "namespace").unwrap_or_else(|| "default".into()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_current_context_with_inline_data_and_files() {
        let dir = std::env::temp_dir().join(format!("haptic-kubeconfig-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("ca.crt"), "CA PEM").unwrap();
        let doc: Value = serde_yaml::from_str(
            "current-context: dev\n\
             contexts:\n- name: dev\n  context: {cluster: c1, user: u1, namespace: ingress}\n- name: other\n  context: {cluster: c2, user: u2}\n\
             clusters:\n- name: c1\n  cluster: {server: 'https://127.0.0.1:6443/', certificate-authority: ca.crt}\n\
             - name: c2\n  cluster: {server: 'https://x', certificate-authority-data: Q0E=, insecure-skip-tls-verify: true}\n\
             users:\n- name: u1\n  user: {tokenFile: token}\n- name: u2\n  user: {client-certificate-data: Q0VSVA==, client-key-data: S0VZ}\n",
        )
        .unwrap();
        let cfg = KubeConfig::from_kubeconfig_value(&doc, &dir, None).unwrap();
        assert_eq!(cfg.server, "https://127.0.0.1:6443");
        assert_eq!(cfg.ca_pem.as_deref(), Some(&b"CA PEM"[..]));
        assert_eq!(cfg.credentials, Credentials::TokenFile(dir.join("token")));
        assert_eq!(cfg.namespace, "ingress");
        let other = KubeConfig::from_kubeconfig_value(&doc, &dir, Some("other")).unwrap();
        assert!(other.insecure_skip_tls_verify);
        assert_eq!(other.ca_pem.as_deref(), Some(&b"CA"[..]));
        assert_eq!(other.client_cert, Some((b"CERT".to_vec(), b"KEY".to_vec())));
        assert_eq!(other.namespace, "default");
        let err = KubeConfig::from_kubeconfig_value(&doc, &dir, Some("nope")).unwrap_err();
        assert!(err.contains("contexts: no entry named \"nope\""), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
