//! A blocking Kubernetes API client: raw HTTPS with ureq 3 and rustls (ring), JSON with
//! serde_json, and only the verbs the controller uses. Errors carry the verb, the URL path, the
//! HTTP code and the API server's `Status` message.

use std::fmt;
use std::io::{BufRead, BufReader, Read};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde_json::Value;
use ureq::tls::{Certificate, ClientCert, PemItem, RootCerts, TlsConfig};

use super::config::{Credentials, KubeConfig};
use crate::store::{Parsed, Shape};

/// Largest response body read (a list page); pages are requested with `limit` well below this.
const MAX_BODY: u64 = 256 * 1024 * 1024;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest watch the client asks for.
pub const MAX_WATCH: Duration = Duration::from_secs(300);

/// A resource type: `(group, version, plural)` and whether it lives in namespaces.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ResourceRef {
    pub group: String,
    pub version: String,
    pub resource: String,
    pub namespaced: bool,
}

impl ResourceRef {
    pub fn new(api_version: &str, resource: &str, namespaced: bool) -> ResourceRef {
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        ResourceRef {
            group: group.into(),
            version: version.into(),
            resource: resource.into(),
            namespaced,
        }
    }

    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    fn prefix(&self) -> String {
        if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        }
    }

    /// The collection path, in one namespace or across all (`namespace` `None`).
    pub fn collection_path(&self, namespace: Option<&str>) -> String {
        match namespace.filter(|_| self.namespaced) {
            Some(ns) => format!("{}/namespaces/{ns}/{}", self.prefix(), self.resource),
            None => format!("{}/{}", self.prefix(), self.resource),
        }
    }

    pub fn object_path(&self, namespace: Option<&str>, name: &str) -> String {
        format!("{}/{name}", self.collection_path(namespace))
    }
}

/// Why a call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeError {
    /// The API server answered with an error status.
    Api {
        verb: &'static str,
        path: String,
        code: u16,
        reason: String,
        message: String,
        /// `details.name` of the Status: the object the error is about (a 404 with it means
        /// that object does not exist; without it, that the resource is not served).
        object: Option<String>,
    },
    /// No answer (connection, TLS, timeout) or an unreadable one.
    Transport {
        verb: &'static str,
        path: String,
        error: String,
    },
}

impl KubeError {
    pub fn code(&self) -> Option<u16> {
        match self {
            KubeError::Api { code, .. } => Some(*code),
            KubeError::Transport { .. } => None,
        }
    }

    pub fn is_not_found(&self) -> bool {
        self.code() == Some(404)
    }

    /// 404 for the named object: its type is served, the object does not exist.
    pub fn is_missing_object(&self, name: &str) -> bool {
        matches!(self, KubeError::Api { code: 404, object: Some(o), .. } if o == name)
    }

    /// 404 about no object: the API server does not serve the resource (a CRD not installed).
    pub fn is_unserved_resource(&self) -> bool {
        matches!(
            self,
            KubeError::Api {
                code: 404,
                object: None,
                ..
            }
        )
    }

    pub fn is_conflict(&self) -> bool {
        self.code() == Some(409)
    }

    pub fn is_bad_request(&self) -> bool {
        self.code() == Some(400)
    }

    pub fn is_gone(&self) -> bool {
        self.code() == Some(410)
    }

    /// The object is larger than the API server stores: 413 for a request body above its limit
    /// (3 MiB), or etcd's "request is too large" (about 1.5 MiB), which the API server passes
    /// on as a 500.
    pub fn is_too_large(&self) -> bool {
        matches!(self, KubeError::Api { code: 413, .. })
            || matches!(self, KubeError::Api { code: 500, message, .. } if message.contains("request is too large"))
    }
}

impl fmt::Display for KubeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KubeError::Api {
                verb,
                path,
                code,
                reason,
                message,
                ..
            } => {
                write!(f, "{verb} {path}: {code}")?;
                if !reason.is_empty() {
                    write!(f, " {reason}")?;
                }
                if !message.is_empty() {
                    write!(f, ": {message}")?;
                }
                Ok(())
            }
            KubeError::Transport { verb, path, error } => write!(f, "{verb} {path}: {error}"),
        }
    }
}

impl std::error::Error for KubeError {}

/// One event of a watch stream.
#[derive(Debug)]
pub struct WatchEvent {
    /// ADDED, MODIFIED, DELETED, BOOKMARK or ERROR.
    pub kind: String,
    /// The object, parsed by the stream's [`Shape`].
    pub object: Parsed,
}

#[derive(Debug, Clone, Default)]
pub struct ListParams {
    pub label_selector: Option<String>,
    pub field_selector: Option<String>,
    pub limit: Option<u32>,
}

/// The bearer token, re-read from its file whenever the file changes.
#[derive(Debug)]
struct TokenSource {
    credentials: Credentials,
    cached: Mutex<Option<(SystemTime, u64, String)>>,
}

impl TokenSource {
    fn token(&self) -> Result<Option<String>, String> {
        match &self.credentials {
            Credentials::None => Ok(None),
            Credentials::Token(t) => Ok(Some(t.clone())),
            Credentials::TokenFile(path) => self.read_file(path).map(Some),
        }
    }

    fn read_file(&self, path: &std::path::Path) -> Result<String, String> {
        let meta =
            std::fs::metadata(path).map_err(|e| format!("token file {}: {e}", path.display()))?;
        let stamp = (
            meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            meta.len(),
        );
        let mut cached = crate::lock(&self.cached);
        if let Some((modified, len, token)) = cached.as_ref() {
            if (*modified, *len) == stamp {
                return Ok(token.clone());
            }
        }
        let token = std::fs::read_to_string(path)
            .map_err(|e| format!("token file {}: {e}", path.display()))?
            .trim()
            .to_string();
        *cached = Some((stamp.0, stamp.1, token.clone()));
        Ok(token)
    }
}

/// A client for one API server. Cheap to clone; safe to share between threads.
#[derive(Clone)]
pub struct Client {
    server: Arc<str>,
    tls: TlsConfig,
    agent: ureq::Agent,
    watch_agent: ureq::Agent,
    token: Arc<TokenSource>,
    namespace: Arc<str>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("server", &self.server)
            .finish()
    }
}

fn tls_config(config: &KubeConfig) -> Result<TlsConfig, String> {
    let mut builder = TlsConfig::builder();
    if config.insecure_skip_tls_verify {
        log::warn!(
            "insecure-skip-tls-verify is set for {}: the API server's certificate is NOT verified; anyone on the path can impersonate it",
            config.server
        );
        builder = builder.disable_verification(true);
    } else if let Some(pem) = &config.ca_pem {
        let certs: Vec<Certificate<'static>> = ureq::tls::parse_pem(pem)
            .filter_map(|item| match item {
                Ok(PemItem::Certificate(c)) => Some(c),
                _ => None,
            })
            .collect();
        if certs.is_empty() {
            return Err("the API server CA contains no PEM certificate".into());
        }
        builder = builder.root_certs(RootCerts::new_with_certs(&certs));
    } else if config.server.starts_with("https://") {
        // No public root store is built in (air-gapped clusters have their own CA).
        return Err(format!(
            "{}: the kubeconfig gives no certificate-authority for this cluster; add              certificate-authority(-data), or set insecure-skip-tls-verify",
            config.server
        ));
    }
    if let Some((cert_pem, key_pem)) = &config.client_cert {
        let chain: Vec<Certificate<'static>> = ureq::tls::parse_pem(cert_pem)
            .filter_map(|item| match item {
                Ok(PemItem::Certificate(c)) => Some(c),
                _ => None,
            })
            .collect();
        let key =
            ureq::tls::PrivateKey::from_pem(key_pem).map_err(|e| format!("client key: {e}"))?;
        if chain.is_empty() {
            return Err("the client certificate contains no PEM certificate".into());
        }
        builder = builder.client_cert(Some(ClientCert::new_with_certs(&chain, key)));
    }
    Ok(builder.build())
}

fn make_agent(
    tls: &TlsConfig,
    timeout: Option<Duration>,
    per_read: Option<Duration>,
) -> ureq::Agent {
    ureq::Agent::config_builder()
        .tls_config(tls.clone())
        .http_status_as_error(false)
        .timeout_global(timeout)
        .timeout_per_read(per_read)
        .timeout_connect(Some(
            timeout
                .unwrap_or(Duration::from_secs(10))
                .min(Duration::from_secs(10)),
        ))
        .user_agent(format!("haptic/{}", env!("CARGO_PKG_VERSION")))
        .build()
        .into()
}

impl Client {
    pub fn new(config: &KubeConfig) -> Result<Client, String> {
        let tls = tls_config(config)?;
        let make = |timeout: Option<Duration>, per_read: Option<Duration>| {
            make_agent(&tls, timeout, per_read)
        };
        Ok(Client {
            server: config.server.trim_end_matches('/').into(),
            tls: tls.clone(),
            agent: make(Some(REQUEST_TIMEOUT), None),
            // Watches are long; the server ends them (timeoutSeconds, at most MAX_WATCH). A read
            // that waits longer than that means a silently dead connection.
            watch_agent: make(None, Some(MAX_WATCH + Duration::from_secs(60))),
            token: Arc::new(TokenSource {
                credentials: config.credentials.clone(),
                cached: Mutex::new(None),
            }),
            namespace: config.namespace.as_str().into(),
        })
    }

    /// The same client with a shorter bound on each (non-watch) request; leader election uses
    /// this so a hanging API server cannot keep it from stepping down in time.
    pub fn with_timeout(&self, timeout: Duration) -> Client {
        let mut client = self.clone();
        client.agent = make_agent(&self.tls, Some(timeout), None);
        client
    }

    /// The namespace of the kubeconfig context or service account.
    pub fn default_namespace(&self) -> &str {
        &self.namespace
    }

    fn url(&self, path_and_query: &str) -> String {
        format!("{}{path_and_query}", self.server)
    }

    fn authorize<B>(
        &self,
        verb: &'static str,
        path: &str,
        req: ureq::RequestBuilder<B>,
    ) -> Result<ureq::RequestBuilder<B>, KubeError> {
        let req = req.header("Accept", "application/json");
        match self.token.token() {
            Ok(Some(token)) => Ok(req.header("Authorization", format!("Bearer {token}"))),
            Ok(None) => Ok(req),
            Err(error) => Err(KubeError::Transport {
                verb,
                path: path.to_string(),
                error,
            }),
        }
    }

    fn finish(
        verb: &'static str,
        path: &str,
        result: Result<http_response::Response, ureq::Error>,
    ) -> Result<Value, KubeError> {
        let text = Self::finish_text(verb, path, result)?;
        serde_json::from_str(&text).map_err(|e| KubeError::Transport {
            verb,
            path: path.to_string(),
            error: format!("decode JSON: {e}"),
        })
    }

    /// The body of a successful answer, as text.
    fn finish_text(
        verb: &'static str,
        path: &str,
        result: Result<http_response::Response, ureq::Error>,
    ) -> Result<String, KubeError> {
        let transport = |error: String| KubeError::Transport {
            verb,
            path: path.to_string(),
            error,
        };
        let response = result.map_err(|e| transport(e.to_string()))?;
        let code = response.status().as_u16();
        let text = response
            .into_body()
            .with_config()
            .limit(MAX_BODY)
            .read_to_string()
            .map_err(|e| transport(format!("read body: {e}")))?;
        if (200..300).contains(&code) {
            return Ok(text);
        }
        Err(api_error(verb, path, code, &text))
    }

    pub fn get(
        &self,
        res: &ResourceRef,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Value, KubeError> {
        let path = res.object_path(namespace, name);
        let req = self.authorize("get", &path, self.agent.get(self.url(&path)))?;
        Self::finish("get", &path, req.call())
    }

    /// GET of an arbitrary path (discovery).
    pub fn get_path(&self, path: &str) -> Result<Value, KubeError> {
        let req = self.authorize("get", path, self.agent.get(self.url(path)))?;
        Self::finish("get", path, req.call())
    }

    /// One page of a list; pass the previous page's `metadata.continue` to get the next.
    pub fn list_page(
        &self,
        res: &ResourceRef,
        namespace: Option<&str>,
        params: &ListParams,
        continue_token: Option<&str>,
    ) -> Result<String, KubeError> {
        let path = res.collection_path(namespace);
        let mut req = self.authorize("list", &path, self.agent.get(self.url(&path)))?;
        if let Some(sel) = params.label_selector.as_deref().filter(|s| !s.is_empty()) {
            req = req.query("labelSelector", sel);
        }
        if let Some(sel) = params.field_selector.as_deref().filter(|s| !s.is_empty()) {
            req = req.query("fieldSelector", sel);
        }
        if let Some(limit) = params.limit {
            req = req.query("limit", limit.to_string());
        }
        if let Some(token) = continue_token.filter(|t| !t.is_empty()) {
            req = req.query("continue", token);
        }
        Self::finish_text("list", &path, req.call())
    }

    /// Every object across pages, and the list's resourceVersion (to watch from).
    pub fn list_all(
        &self,
        res: &ResourceRef,
        namespace: Option<&str>,
        params: &ListParams,
    ) -> Result<(Vec<Value>, String), KubeError> {
        let mut items = Vec::new();
        let shape = Shape::default();
        let rv = self.list_docs(res, namespace, params, &shape, &[], |item| {
            if let Ok(doc) = item.doc {
                items.push(doc.to_value());
            }
        })?;
        Ok((items, rv))
    }

    /// Lists every page, parsing each item straight into a document shaped by `shape` (the
    /// whole list is never held as parsed JSON) and handing it to `each`. Items get the
    /// `defaults` members they lack. Returns the list's resourceVersion.
    pub fn list_docs(
        &self,
        res: &ResourceRef,
        namespace: Option<&str>,
        params: &ListParams,
        shape: &Shape,
        defaults: &[(&str, &str)],
        mut each: impl FnMut(Parsed),
    ) -> Result<String, KubeError> {
        let mut token: Option<String> = None;
        loop {
            let page = self.list_page(res, namespace, params, token.as_deref())?;
            let meta =
                shape
                    .parse_list(&page, defaults, &mut each)
                    .map_err(|e| KubeError::Transport {
                        verb: "list",
                        path: res.collection_path(namespace),
                        error: format!("decode JSON: {e}"),
                    })?;
            token = meta.continue_token.filter(|t| !t.is_empty());
            if token.is_none() {
                return Ok(meta.resource_version.unwrap_or_default());
            }
        }
    }

    /// Starts a watch from `resource_version`; events stream through the returned iterator
    /// until the server ends the watch (after `timeout_seconds`) or the connection breaks.
    pub fn watch(
        &self,
        res: &ResourceRef,
        namespace: Option<&str>,
        params: &ListParams,
        resource_version: &str,
        timeout_seconds: u32,
    ) -> Result<WatchStream, KubeError> {
        let path = res.collection_path(namespace);
        let mut req = self
            .authorize("watch", &path, self.watch_agent.get(self.url(&path)))?
            .query("watch", "true")
            .query("allowWatchBookmarks", "true")
            .query(
                "timeoutSeconds",
                timeout_seconds.min(MAX_WATCH.as_secs() as u32).to_string(),
            )
            .query("resourceVersion", resource_version);
        if let Some(sel) = params.label_selector.as_deref().filter(|s| !s.is_empty()) {
            req = req.query("labelSelector", sel);
        }
        if let Some(sel) = params.field_selector.as_deref().filter(|s| !s.is_empty()) {
            req = req.query("fieldSelector", sel);
        }
        let response = req.call().map_err(|e| KubeError::Transport {
            verb: "watch",
            path: path.clone(),
            error: e.to_string(),
        })?;
        let code = response.status().as_u16();
        if !(200..300).contains(&code) {
            let text = response.into_body().read_to_string().unwrap_or_default();
            return Err(api_error("watch", &path, code, &text));
        }
        Ok(WatchStream::from_reader(
            &path,
            Box::new(response.into_body().into_reader()),
        ))
    }

    fn send(
        &self,
        verb: &'static str,
        path: &str,
        method: ureq::RequestBuilder<ureq::typestate::WithBody>,
        content_type: &str,
        body: &Value,
    ) -> Result<Value, KubeError> {
        let req = self
            .authorize(verb, path, method)?
            .header("Content-Type", content_type);
        let bytes = serde_json::to_vec(body).map_err(|e| KubeError::Transport {
            verb,
            path: path.to_string(),
            error: format!("encode JSON: {e}"),
        })?;
        Self::finish(verb, path, req.send(&bytes[..]))
    }

    pub fn create(
        &self,
        res: &ResourceRef,
        namespace: Option<&str>,
        object: &Value,
    ) -> Result<Value, KubeError> {
        let path = res.collection_path(namespace);
        self.send(
            "create",
            &path,
            self.agent.post(self.url(&path)),
            "application/json",
            object,
        )
    }

    /// PUT of the whole object; its `metadata.resourceVersion` makes it conditional (409 when
    /// someone else changed it first).
    pub fn update(
        &self,
        res: &ResourceRef,
        namespace: Option<&str>,
        name: &str,
        object: &Value,
    ) -> Result<Value, KubeError> {
        let path = res.object_path(namespace, name);
        self.send(
            "update",
            &path,
            self.agent.put(self.url(&path)),
            "application/json",
            object,
        )
    }

    pub fn merge_patch(
        &self,
        res: &ResourceRef,
        namespace: Option<&str>,
        name: &str,
        patch: &Value,
    ) -> Result<Value, KubeError> {
        let path = res.object_path(namespace, name);
        self.send(
            "patch",
            &path,
            self.agent.patch(self.url(&path)),
            "application/merge-patch+json",
            patch,
        )
    }

    pub fn update_status(
        &self,
        res: &ResourceRef,
        namespace: Option<&str>,
        name: &str,
        object: &Value,
    ) -> Result<Value, KubeError> {
        let path = format!("{}/status", res.object_path(namespace, name));
        self.send(
            "update status",
            &path,
            self.agent.put(self.url(&path)),
            "application/json",
            object,
        )
    }

    pub fn merge_patch_status(
        &self,
        res: &ResourceRef,
        namespace: Option<&str>,
        name: &str,
        patch: &Value,
    ) -> Result<Value, KubeError> {
        let path = format!("{}/status", res.object_path(namespace, name));
        self.send(
            "patch status",
            &path,
            self.agent.patch(self.url(&path)),
            "application/merge-patch+json",
            patch,
        )
    }

    pub fn delete(
        &self,
        res: &ResourceRef,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Value, KubeError> {
        let path = res.object_path(namespace, name);
        let req = self.authorize("delete", &path, self.agent.delete(self.url(&path)))?;
        Self::finish("delete", &path, req.call())
    }

    /// Whether `resource` of `api_version` is namespaced, from the API server's discovery.
    pub fn is_namespaced(&self, api_version: &str, resource: &str) -> Result<bool, KubeError> {
        let probe = ResourceRef::new(api_version, resource, false);
        let path = probe.prefix();
        let doc = self.get_path(&path)?;
        doc.get("resources")
            .and_then(Value::as_array)
            .and_then(|list| {
                list.iter()
                    .find(|r| r.get("name").and_then(Value::as_str) == Some(resource))
            })
            .and_then(|r| r.get("namespaced").and_then(Value::as_bool))
            .ok_or_else(|| KubeError::Api {
                verb: "discover",
                path,
                code: 404,
                reason: "NotFound".into(),
                message: format!("the server does not serve {resource} in {api_version}"),
                object: None,
            })
    }
}

mod http_response {
    pub(super) type Response = ureq::http::Response<ureq::Body>;
}

fn api_error(verb: &'static str, path: &str, code: u16, body: &str) -> KubeError {
    let status: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    let field = |k: &str| {
        status
            .get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let message = if status.is_null() {
        body.trim().chars().take(300).collect()
    } else {
        field("message")
    };
    KubeError::Api {
        verb,
        path: path.to_string(),
        code,
        reason: field("reason"),
        message,
        object: status
            .pointer("/details/name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .map(str::to_string),
    }
}

/// The largest watch event line read (etcd refuses objects over 1.5 MiB by default; this leaves
/// room for much larger limits while keeping one line's memory bounded).
const MAX_EVENT_BYTES: usize = 64 * 1024 * 1024;

/// The events of one watch, in order.
pub struct WatchStream {
    path: String,
    reader: BufReader<Box<dyn std::io::Read + Send>>,
    line: String,
    shape: Arc<Shape>,
}

impl WatchStream {
    /// A watch stream over any reader of newline-delimited events (`path` names it in errors).
    pub fn from_reader(path: &str, reader: Box<dyn std::io::Read + Send>) -> WatchStream {
        WatchStream {
            path: path.to_string(),
            reader: BufReader::new(reader),
            line: String::new(),
            shape: Arc::default(),
        }
    }

    /// Parses the events' objects by `shape` (ignored fields, field selector).
    pub fn shaped(mut self, shape: Arc<Shape>) -> WatchStream {
        self.shape = shape;
        self
    }
}

impl Iterator for WatchStream {
    type Item = Result<WatchEvent, KubeError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            self.line.clear();
            let limit = MAX_EVENT_BYTES as u64 + 1;
            match (&mut self.reader).take(limit).read_line(&mut self.line) {
                Ok(0) => return None,
                Ok(n) if n > MAX_EVENT_BYTES => {
                    return Some(Err(KubeError::Transport {
                        verb: "watch",
                        path: self.path.clone(),
                        error: format!("an event is larger than {MAX_EVENT_BYTES} bytes"),
                    }))
                }
                Ok(_) if self.line.trim().is_empty() => continue,
                Ok(_) => {
                    return Some(match self.shape.parse_event(self.line.trim()) {
                        Ok((kind, object)) => Ok(WatchEvent { kind, object }),
                        Err(e) => Err(KubeError::Transport {
                            verb: "watch",
                            path: self.path.clone(),
                            error: format!("bad event: {e}"),
                        }),
                    });
                }
                Err(e) => {
                    return Some(Err(KubeError::Transport {
                        verb: "watch",
                        path: self.path.clone(),
                        error: e.to_string(),
                    }))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_object_and_an_unserved_resource_are_told_apart() {
        let missing = api_error(
            "get",
            "/apis/haproxy-haptic.org/v1alpha1/namespaces/d/haproxycfgs/x",
            404,
            r#"{"kind":"Status","reason":"NotFound","code":404,"message":"haproxycfgs.haproxy-haptic.org \"x\" not found","details":{"name":"x","group":"haproxy-haptic.org","kind":"haproxycfgs"}}"#,
        );
        assert!(missing.is_missing_object("x") && !missing.is_missing_object("y"));
        assert!(!missing.is_unserved_resource());
        let unserved = api_error(
            "get",
            "/apis/haproxy-haptic.org/v1alpha1/namespaces/d/haproxycfgs/x",
            404,
            r#"{"kind":"Status","reason":"NotFound","code":404,"message":"the server could not find the requested resource"}"#,
        );
        assert!(unserved.is_unserved_resource() && !unserved.is_missing_object("x"));
        // A proxy's plain-text 404 names no object either.
        assert!(api_error("get", "/x", 404, "404 page not found").is_unserved_resource());
    }

    #[test]
    fn an_https_server_without_a_ca_is_a_clear_error_not_a_panic() {
        let doc: Value = serde_yaml::from_str(
            "clusters: [{name: c, cluster: {server: 'https://10.0.0.1:6443'}}]\n\
             users: [{name: u, user: {token: t}}]\n\
             contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n",
        )
        .unwrap();
        let config =
            KubeConfig::from_kubeconfig_value(&doc, std::path::Path::new("."), None).unwrap();
        let Err(err) = Client::new(&config) else {
            panic!("an https server without a CA was accepted");
        };
        assert!(err.contains("no certificate-authority"), "{err}");
        // Plain HTTP (a local development server) needs no CA.
        let plain = KubeConfig {
            server: "http://127.0.0.1:1".into(),
            ..config
        };
        assert!(Client::new(&plain).is_ok());
    }
}
