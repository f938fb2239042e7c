//! Shared harness for the dev API server's integration tests: start the binary on a free
//! loopback port, wait for its `ready` line with a deadline, talk to it over HTTPS with ureq or
//! with the real kubectl, and read watch streams line by line with deadlines. The server is
//! killed when the handle drops.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

pub mod webhook;

/// How long anything in these tests may take before it counts as a failure.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// A running `haptic-dev-apiserver`.
pub struct Server {
    child: Child,
    pub url: String,
    pub dir: PathBuf,
    pub kubeconfig: PathBuf,
    pub token: String,
    agent: ureq::Agent,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A fresh temporary directory.
pub fn temp_dir(tag: &str) -> PathBuf {
    static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let dir = std::env::temp_dir().join(format!(
        "haptic-dev-apiserver-test-{tag}-{}-{n}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

impl Server {
    /// Starts a server over HTTPS with a fixed token and fast bookmarks, plus `extra` flags.
    pub fn start(extra: &[&str]) -> Server {
        Server::start_with(extra, true)
    }

    pub fn start_with(extra: &[&str], tls: bool) -> Server {
        let dir = temp_dir("srv");
        let kubeconfig = dir.join("kubeconfig");
        let token = "test-token-0123456789".to_string();
        let mut args: Vec<String> = vec![
            // Port 0: the kernel picks a free port, and the ready line reports it.
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--kubeconfig-out".into(),
            kubeconfig.display().to_string(),
            "--bookmark-interval".into(),
            "300ms".into(),
            "--log-level".into(),
            "warn".into(),
        ];
        if !extra.contains(&"--token-file") {
            args.extend(["--token".into(), token.clone()]);
        }
        if !tls {
            args.push("--plain-http".into());
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut child = Command::new(env!("CARGO_BIN_EXE_haptic-dev-apiserver"))
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start haptic-dev-apiserver");
        let stdout = child.stdout.take().expect("stdout is piped");
        let (tx, rx) = channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let line = rx
            .recv_timeout(DEADLINE)
            .expect("haptic-dev-apiserver did not print its ready line in time");
        let url = line
            .strip_prefix("ready ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_string();
        let agent = agent_for(&dir, tls, None);
        Server {
            child,
            url,
            dir,
            kubeconfig,
            token,
            agent,
        }
    }

    /// A request with the test token; answers (status, body as JSON or Null).
    pub fn call(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        self.call_as(method, path, body, Some(&self.token), "application/json")
    }

    pub fn call_as(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        token: Option<&str>,
        content_type: &str,
    ) -> (u16, Value) {
        let url = format!("{}{path}", self.url);
        let auth = token.map(|t| format!("Bearer {t}"));
        let mut resp = match method {
            "GET" | "DELETE" if body.is_none() => {
                let mut r = if method == "GET" {
                    self.agent.get(&url)
                } else {
                    self.agent.delete(&url)
                };
                if let Some(a) = &auth {
                    r = r.header("Authorization", a);
                }
                r.call()
            }
            _ => {
                let text = body.map(Value::to_string).unwrap_or_default();
                let mut r = match method {
                    "POST" => self.agent.post(&url),
                    "PUT" => self.agent.put(&url),
                    "PATCH" => self.agent.patch(&url),
                    "DELETE" => self.agent.delete(&url).force_send_body(),
                    other => panic!("method {other}"),
                };
                r = r.header("Content-Type", content_type);
                if let Some(a) = &auth {
                    r = r.header("Authorization", a);
                }
                r.send(text)
            }
        }
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let code = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        (code, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// Starts a watch (or any streaming GET) and returns its event lines.
    pub fn stream(&self, path: &str) -> EventStream {
        EventStream::open(
            &self.agent,
            &format!("{}{path}", self.url),
            Some(&self.token),
        )
    }

    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_with(&self.kubeconfig, args)
    }

    pub fn kubectl_with(&self, kubeconfig: &Path, args: &[&str]) -> Output {
        kubectl_command(kubeconfig, &self.dir.join("kubectl-cache"), args)
            .output()
            .expect("run kubectl")
    }

    /// Runs kubectl and panics with its output unless it succeeds; returns stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn spawn_kubectl(&self, args: &[&str]) -> Child {
        kubectl_command(&self.kubeconfig, &self.dir.join("kubectl-cache"), args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn kubectl")
    }
}

/// The real kubectl: `$HAPTIC_KUBECTL`, else `/usr/bin/kubectl` (the gcloud dispatcher picks a
/// matching version), else `kubectl` on PATH.
pub fn kubectl_binary() -> String {
    if let Ok(k) = std::env::var("HAPTIC_KUBECTL") {
        return k;
    }
    if Path::new("/usr/bin/kubectl").exists() {
        return "/usr/bin/kubectl".into();
    }
    "kubectl".into()
}

fn kubectl_command(kubeconfig: &Path, cache: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(kubectl_binary());
    c.arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--cache-dir")
        .arg(cache)
        .arg("--request-timeout=20s")
        .args(args)
        .env_remove("KUBECONFIG");
    c
}

/// A ureq agent trusting the server's CA (from `dir/ca.crt`), optionally with a client cert.
pub fn agent_for(dir: &Path, tls: bool, client: Option<(&[u8], &[u8])>) -> ureq::Agent {
    use ureq::tls::{Certificate, ClientCert, PrivateKey, RootCerts, TlsConfig};
    let mut builder = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_connect(Some(Duration::from_secs(5)));
    if tls {
        let ca = std::fs::read(dir.join("ca.crt")).expect("server wrote ca.crt");
        let mut t =
            TlsConfig::builder()
                .root_certs(RootCerts::new_with_certs(&[
                    Certificate::from_pem(&ca).expect("CA PEM")
                ]));
        if let Some((cert, key)) = client {
            t = t.client_cert(Some(ClientCert::new_with_certs(
                &[Certificate::from_pem(cert).expect("client cert PEM")],
                PrivateKey::from_pem(key).expect("client key PEM"),
            )));
        }
        builder = builder.tls_config(t.build());
    }
    builder.build().into()
}

/// Lines of a streaming response, read by a background thread.
pub struct EventStream {
    pub status: u16,
    lines: Receiver<Option<String>>,
}

impl EventStream {
    pub fn open(agent: &ureq::Agent, url: &str, token: Option<&str>) -> EventStream {
        let mut req = agent.get(url);
        if let Some(t) = token {
            req = req.header("Authorization", &format!("Bearer {t}"));
        }
        let resp = req.call().unwrap_or_else(|e| panic!("GET {url}: {e}"));
        let status = resp.status().as_u16();
        let (tx, rx) = channel();
        let reader = resp.into_body().into_reader();
        thread::spawn(move || {
            let mut reader = BufReader::new(reader);
            loop {
                let mut line = String::new();
                match reader.read_line(&mut line) {
                    Ok(0) | Err(_) => {
                        let _ = tx.send(None);
                        return;
                    }
                    Ok(_) => {
                        if tx.send(Some(line)).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        EventStream { status, lines: rx }
    }

    /// The next event, or `None` when the stream ended. Panics after the deadline.
    pub fn next(&self) -> Option<Value> {
        match self.lines.recv_timeout(DEADLINE) {
            Ok(Some(line)) => Some(
                serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("bad event line {line:?}: {e}")),
            ),
            Ok(None) => None,
            Err(_) => panic!("no watch event within {DEADLINE:?}"),
        }
    }

    /// The next event that is not a bookmark.
    pub fn next_change(&self) -> Option<Value> {
        loop {
            let e = self.next()?;
            if e["type"] != "BOOKMARK" {
                return Some(e);
            }
        }
    }

    /// Whether the stream stays silent (no non-bookmark event) for `quiet`.
    pub fn no_change_within(&self, quiet: Duration) -> bool {
        let end = Instant::now() + quiet;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return true;
            }
            match self.lines.recv_timeout(left) {
                Ok(Some(line)) if line.contains("\"BOOKMARK\"") => continue,
                Ok(_) => return false,
                Err(_) => return true,
            }
        }
    }
}

/// Polls `f` until it returns `Some`, panicking after the deadline.
pub fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + DEADLINE;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < end, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(20));
    }
}

/// Reads a child's stdout lines into a channel.
pub fn lines_of(stream: impl Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = channel();
    thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Names of the items of a list response.
pub fn names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|i| i["metadata"]["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

pub fn configmap(name: &str, labels: Value) -> Value {
    serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "labels": labels}, "data": {"k": "v"}})
}
