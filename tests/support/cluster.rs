//! A whole local system for end-to-end tests: the dev API server with our CRDs, HAProxy "pods"
//! (a real master-worker HAProxy plus `haptic-agent`, each on its own loopback address, as
//! Pod objects whose status the harness fills in), controller replicas (`haptic run`), and
//! echo backends.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use haptic::kube::client::{Client, ResourceRef};
use haptic::kube::config::KubeConfig;
use serde_json::{json, Value};

use super::{wait_for, DevApiServer, TempDir, Tied};

pub const NS: &str = "default";
pub const CONFIG_NAME: &str = "haptic-e2e";

/// A sibling binary of the test executable's target dir, built (or brought up to date) once
/// per test process: `cargo test -p haptic` alone would otherwise run a stale one.
pub fn workspace_binary(package: &str, bin: &str) -> PathBuf {
    static BUILT: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(Path::parent).unwrap().to_path_buf();
    let path = dir.join(bin);
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if !built.iter().any(|b| b == bin) {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let release = dir.file_name().is_some_and(|n| n == "release");
        let status = Command::new(cargo)
            .args(["build", "--quiet", "-p", package, "--bin", bin])
            .args(release.then_some("--release"))
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .unwrap();
        assert!(status.success(), "building {bin} failed");
        built.push(bin.to_string());
    }
    path
}

fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Sends `signal` (`TERM`, `USR1`, …) to `child` and waits up to `limit` for it to exit; it is
/// killed otherwise. How long that took, and whether it exited on its own.
fn signal_and_wait(child: Option<Child>, signal: &str, limit: Duration) -> (Duration, bool) {
    let started = Instant::now();
    let mut exited = false;
    if let Some(mut c) = child {
        let _ = Command::new("kill")
            .args([&format!("-{signal}"), &c.id().to_string()])
            .status();
        while started.elapsed() < limit {
            if c.try_wait().ok().flatten().is_some() {
                exited = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        kill(&mut c);
    }
    (started.elapsed(), exited)
}

/// A tiny HTTP backend answering `NAME` to everything (after a delay for `/slow/MS`).
pub struct Backend {
    pub name: String,
    pub port: u16,
    stop: Arc<AtomicBool>,
}

impl Backend {
    pub fn start(name: &str) -> Backend {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let (stop2, name2) = (stop.clone(), name.to_string());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop2.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(mut conn) = conn else { continue };
                let name = name2.clone();
                std::thread::spawn(move || {
                    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
                    let mut buf = [0u8; 8192];
                    let mut request = Vec::new();
                    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                        match conn.read(&mut buf) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buf[..n]),
                        }
                    }
                    // `GET /slow/MS` answers after MS milliseconds (a long request).
                    let head = String::from_utf8_lossy(&request);
                    let path = head.split_whitespace().nth(1).unwrap_or("/");
                    if let Some(ms) = path.strip_prefix("/slow/").and_then(|m| m.parse().ok()) {
                        std::thread::sleep(Duration::from_millis(ms));
                    }
                    let body = format!("{name}\n");
                    // One write, for the reason given in `http_get`.
                    let response = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = conn.write_all(response.as_bytes());
                });
            }
        });
        Backend {
            name: name.into(),
            port,
            stop,
        }
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// `GET http://ip:port/path` with a Host header: (status, body), or `None` when no answer.
pub fn http_get(ip: &str, port: u16, host: &str, path: &str) -> Option<(u16, String)> {
    let mut conn = TcpStream::connect_timeout(
        &format!("{ip}:{port}").parse().unwrap(),
        Duration::from_secs(2),
    )
    .ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    // One write: `write!` on a bare socket sends each piece as its own segment, and Nagle's
    // algorithm then holds the rest until the first is acknowledged (a delayed ACK, ~40 ms),
    // which made every request, and every latency measured with it, 40 ms slower.
    let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    conn.write_all(request.as_bytes()).ok()?;
    let mut raw = String::new();
    conn.read_to_string(&mut raw).ok()?;
    let status = raw.split_whitespace().nth(1)?.parse().ok()?;
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_string()
    };
    Some((status, body))
}

/// The body of a `Transfer-Encoding: chunked` response (HAProxy's exporter and stats page).
fn dechunk(mut rest: &str) -> Option<String> {
    let mut body = String::new();
    loop {
        let (size, after) = rest.split_once("\r\n")?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            return Some(body);
        }
        body.push_str(after.get(..size)?);
        rest = after.get(size..)?.strip_prefix("\r\n")?;
    }
}

/// One HAProxy pod: HAProxy in master-worker mode and its agent, on a loopback address.
pub struct HaproxyPod {
    pub name: String,
    pub ip: String,
    pub dir: PathBuf,
    haproxy: Option<Child>,
    agent: Option<Child>,
    agent_port: u16,
    status_port: u16,
    certs: PathBuf,
    insecure: bool,
}

impl HaproxyPod {
    fn cfg_dir(&self) -> PathBuf {
        self.dir.join("etc")
    }

    fn master_socket(&self) -> PathBuf {
        self.dir.join("master.sock")
    }

    /// Writes the bootstrap config (as the pod's init step does) and starts HAProxy.
    pub fn start_haproxy(&mut self) {
        let bootstrap = self.dir.join("bootstrap.cfg");
        std::fs::write(&bootstrap, format!("global\n  default-path config\ndefaults\n  mode http\n  timeout client 5s\n  timeout server 5s\n  timeout connect 5s\nfrontend bootstrap\n  bind \"${{POD_IP}}\":{}\n  http-request return status 503\n", self.status_port)).unwrap();
        let status = Command::new(workspace_binary("haptic-agent", "haptic-agent"))
            .args([
                "init",
                "--bootstrap",
                bootstrap.to_str().unwrap(),
                "--config-dir",
                self.cfg_dir().to_str().unwrap(),
            ])
            .status()
            .unwrap();
        assert!(status.success(), "haptic-agent init failed");
        self.spawn_haproxy();
    }

    /// Starts HAProxy on the configuration already in the pod's directory, as a container
    /// restart does (the init step ran once, at pod start).
    pub fn spawn_haproxy(&mut self) {
        let _ = std::fs::remove_file(self.master_socket());
        // The pod's own working directory, as the chart's workingDir: relative UNIX sockets
        // (the TLS-passthrough loopback) are per pod.
        let child = Command::new("haproxy")
            .current_dir(self.cfg_dir())
            .args([
                "-W",
                "-db",
                "-S",
                self.master_socket().to_str().unwrap(),
                "-f",
                self.cfg_dir().join("haproxy.cfg").to_str().unwrap(),
            ])
            .env("POD_IP", &self.ip)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .tied()
            .spawn()
            .unwrap();
        self.haproxy = Some(child);
        let sock = self.master_socket();
        wait_for("HAProxy master socket", Duration::from_secs(10), || {
            sock.exists()
        });
    }

    pub fn stop_haproxy(&mut self) {
        if let Some(mut c) = self.haproxy.take() {
            kill(&mut c);
        }
    }

    /// Sends HAProxy's master SIGUSR1 (soft stop: listeners close, connections in flight
    /// finish, bounded by `hard-stop-after`), as Kubernetes does through the image's
    /// STOPSIGNAL. Returns how long HAProxy took to exit and whether it did within `limit`
    /// (it is killed otherwise).
    pub fn soft_stop_haproxy(&mut self, limit: Duration) -> (Duration, bool) {
        self.signal_haproxy("USR1", limit)
    }

    /// Sends HAProxy's master `signal` (`USR1`, `TERM`, …) and waits up to `limit` for it to
    /// exit (it is killed otherwise): how long it took, and whether it exited on its own.
    pub fn signal_haproxy(&mut self, signal: &str, limit: Duration) -> (Duration, bool) {
        signal_and_wait(self.haproxy.take(), signal, limit)
    }

    pub fn start_agent(&mut self) {
        let child = Command::new(workspace_binary("haptic-agent", "haptic-agent"))
            .args([
                "serve",
                "--config-dir",
                self.cfg_dir().to_str().unwrap(),
                "--master-socket",
                self.master_socket().to_str().unwrap(),
                "--haproxy-bin",
                "haproxy",
                "--listen",
                &format!("{}:{}", self.ip, self.agent_port),
                "--probe-listen",
                &format!("{}:0", self.ip),
                "--log-level",
                "warn",
            ])
            .args(self.transport_args())
            .env("POD_IP", &self.ip)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .tied()
            .spawn()
            .unwrap();
        self.agent = Some(child);
        let addr = format!("{}:{}", self.ip, self.agent_port);
        wait_for("agent listening", Duration::from_secs(10), || {
            TcpStream::connect(&addr).is_ok()
        });
    }

    /// Mutual TLS, or plain HTTP with basic auth when the cluster uses insecure agents.
    fn transport_args(&self) -> Vec<String> {
        let path = |f: &str| self.certs.join(f).display().to_string();
        if self.insecure {
            vec![
                "--insecure-http-with-basic-auth".into(),
                "--credentials".into(),
                path("credentials"),
            ]
        } else {
            vec![
                "--tls-cert".into(),
                path("agent.crt"),
                "--tls-key".into(),
                path("agent.key"),
                "--client-ca".into(),
                path("ca.crt"),
                // As the chart starts them: only the controller's certificate.
                "--client-name".into(),
                "haptic-controller".into(),
            ]
        }
    }

    /// Freezes the agent (SIGSTOP), as a hung process or node: the kernel still accepts its
    /// connections, and nothing answers them until [`HaproxyPod::resume_agent`].
    pub fn pause_agent(&self) {
        self.signal_agent("STOP");
    }

    pub fn resume_agent(&self) {
        self.signal_agent("CONT");
    }

    fn signal_agent(&self, signal: &str) {
        let pid = self.agent.as_ref().expect("the agent runs").id();
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -{signal} {pid}");
    }

    pub fn stop_agent(&mut self) {
        if let Some(mut c) = self.agent.take() {
            kill(&mut c);
        }
    }

    /// The HAProxy worker pid, from the master CLI.
    pub fn worker_pid(&self) -> Option<u32> {
        let mut s = std::os::unix::net::UnixStream::connect(self.master_socket()).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        s.write_all(b"show proc\n").ok()?;
        // The master CLI keeps a connection open until the client stops writing.
        s.shutdown(std::net::Shutdown::Write).ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        // Skip the `# workers` heading: the worker line starts with its pid.
        out.lines()
            .filter(|l| l.contains(" worker "))
            .find_map(|l| l.split_whitespace().next()?.parse().ok())
    }
}

impl Drop for HaproxyPod {
    fn drop(&mut self) {
        self.stop_agent();
        self.stop_haproxy();
    }
}

/// A `haptic run` replica; its health and metrics ports listen on an address of its own.
pub struct Controller {
    pub name: String,
    pub ip: String,
    pub health_port: u16,
    pub metrics_port: u16,
    child: Option<Child>,
}

impl Controller {
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    /// SIGKILL, and the `haproxy -c` directories it may have left mid-check (a killed process
    /// removes nothing).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let pid = c.id();
            kill(&mut c);
            let prefix = format!("haptic-check-{pid}-");
            if let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) {
                for entry in entries.flatten() {
                    if entry.file_name().to_string_lossy().starts_with(&prefix) {
                        let _ = std::fs::remove_dir_all(entry.path());
                    }
                }
            }
        }
    }

    /// SIGTERM; returns how long the controller took to exit and whether it exited on its own
    /// (it is killed after 30 s).
    pub fn terminate(&mut self) -> (Duration, bool) {
        signal_and_wait(self.child.take(), "TERM", Duration::from_secs(30))
    }

    pub fn get(&self, port: u16, path: &str) -> Option<(u16, String)> {
        http_get(&self.ip, port, "localhost", path)
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.kill();
    }
}

pub struct Cluster {
    pub api: DevApiServer,
    pub client: Client,
    pub certs: PathBuf,
    pub agent_port: u16,
    pub http_port: u16,
    pub status_port: u16,
    pub pods: Vec<HaproxyPod>,
    pub controllers: Vec<Controller>,
    /// Webhook certificate directory and the address controller replicas serve it on.
    pub webhook: Option<(PathBuf, String, u16)>,
    /// The CA whose client certificates the webhook requires (`--webhook-client-ca`).
    pub webhook_client_ca: Option<PathBuf>,
    /// Agents run `--insecure-http-with-basic-auth`; controllers use `--agent-credentials-dir`.
    pub insecure_agents: bool,
    /// The HAProxy binary controllers validate with.
    pub controller_haproxy: String,
    /// Extra environment of the controllers started from now on.
    pub controller_env: Vec<(String, String)>,
    /// Last, so dropped last (fields drop in order): the pods' agents and the controllers stop
    /// before their directory goes, or an agent's last state write leaves it behind.
    pub dir: TempDir,
}

pub fn pods_resource() -> ResourceRef {
    ResourceRef::new("v1", "pods", true)
}

impl Cluster {
    /// API server with CRDs, agent certificates, and the HAProxyTemplateConfig built from the
    /// chart's base and ingress libraries plus test overrides.
    pub fn start(api_args: &[&str]) -> Cluster {
        let api = DevApiServer::start(api_args);
        let client =
            Client::new(&KubeConfig::from_kubeconfig(&api.kubeconfig(), None).unwrap()).unwrap();
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        for crd in ["crds/haproxytemplateconfigs.yaml", "crds/haproxycfgs.yaml"] {
            let text = std::fs::read_to_string(root.join(crd)).unwrap();
            let object: Value = serde_yaml::from_str(&text).unwrap();
            client
                .create(
                    &ResourceRef::new(
                        "apiextensions.k8s.io/v1",
                        "customresourcedefinitions",
                        false,
                    ),
                    None,
                    &object,
                )
                .unwrap();
        }
        let dir = TempDir::new("e2e");
        let certs = dir.0.join("certs");
        let status = Command::new(root.join("scripts/gen-certs.sh"))
            .arg(&certs)
            .env("AGENT_SANS", "DNS:haptic-agent")
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "gen-certs.sh failed");
        let client_dir = certs.join("controller");
        std::fs::create_dir_all(&client_dir).unwrap();
        for (from, to) in [
            ("controller.crt", "tls.crt"),
            ("controller.key", "tls.key"),
            ("ca.crt", "ca.crt"),
        ] {
            std::fs::copy(certs.join(from), client_dir.join(to)).unwrap();
        }
        let credentials = certs.join("credentials");
        std::fs::create_dir_all(&credentials).unwrap();
        std::fs::write(credentials.join("username"), "haptic\n").unwrap();
        std::fs::write(credentials.join("password"), "s3cret-for-tests\n").unwrap();
        // Every pod has an address of its own (`add_pod`), so the ports can be fixed.
        let (agent_port, http_port, status_port) = (5555, 8080, 8404);
        Cluster {
            api,
            client,
            dir,
            certs,
            agent_port,
            http_port,
            status_port,
            pods: Vec::new(),
            controllers: Vec::new(),
            webhook: None,
            webhook_client_ca: None,
            insecure_agents: false,
            controller_haproxy: "haproxy".into(),
            controller_env: Vec::new(),
        }
    }

    /// The config: base + ingress libraries, merged by `haptic config merge`, plus overrides.
    pub fn config_object(&self, extra_yaml: &str) -> Value {
        self.config_object_with(&["base", "ingress", "haproxytech"], extra_yaml)
    }

    /// [`Cluster::config_object`] from these libraries of `chart/libraries/`, in this order.
    pub fn config_object_with(&self, libraries: &[&str], extra_yaml: &str) -> Value {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let overrides = self.dir.0.join("overrides.yaml");
        std::fs::write(
            &overrides,
            format!(
                "podSelector: {{matchLabels: {{app: haproxy-e2e}}}}\n\
                 controller:\n  leaderElection: {{leaseDuration: 3s, renewDeadline: 2s, retryPeriod: 300ms}}\n  reconciliation: {{debounceInterval: 50ms}}\n\
                 dataplane: {{port: {}, minDeploymentInterval: 500ms, driftPreventionInterval: 2s, deploymentTimeout: 20s}}\n\
                 templatingSettings:\n  extraContext: {{http_port: {}, status_port: {}, bind_address: '\"${{POD_IP}}\"', server_slots: 4, server_checks: false, status_addresses: ['192.0.2.10']}}\n\
                 validationTests: null\n{extra_yaml}",
                self.agent_port, self.http_port, self.status_port
            ),
        )
        .unwrap();
        let mut merge = Command::new(env!("CARGO_BIN_EXE_haptic"));
        merge.args(["config", "merge"]);
        for library in libraries {
            merge
                .arg("-f")
                .arg(root.join(format!("chart/libraries/{library}.yaml")));
        }
        let out = merge.arg("-f").arg(&overrides).output().unwrap();
        assert!(
            out.status.success(),
            "config merge: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let spec: Value = serde_yaml::from_slice(&out.stdout).unwrap();
        let spec = spec.get("spec").cloned().unwrap_or(spec);
        json!({"apiVersion": "haproxy-haptic.org/v1alpha1", "kind": "HAProxyTemplateConfig", "metadata": {"name": CONFIG_NAME, "namespace": NS}, "spec": spec})
    }

    pub fn config_resource() -> ResourceRef {
        ResourceRef::new(
            "haproxy-haptic.org/v1alpha1",
            "haproxytemplateconfigs",
            true,
        )
    }

    /// Creates or replaces the config, as `kubectl apply` would: the controllers write its
    /// status, which can change its resourceVersion between the read and the write, so a
    /// conflict (409) reads it again and retries.
    pub fn apply_config(&self, object: &Value) {
        let res = Self::config_resource();
        for _ in 0..20 {
            let existing = match self.client.get(&res, Some(NS), CONFIG_NAME) {
                Ok(existing) => existing,
                Err(_) => {
                    self.client.create(&res, Some(NS), object).unwrap();
                    return;
                }
            };
            let mut updated = object.clone();
            updated["metadata"]["resourceVersion"] =
                existing["metadata"]["resourceVersion"].clone();
            match self.client.update(&res, Some(NS), CONFIG_NAME, &updated) {
                Ok(_) => return,
                Err(e) if e.code() == Some(409) => continue,
                Err(e) => panic!("update the config: {e:?}"),
            }
        }
        panic!("the config kept changing under 20 updates");
    }

    /// Starts a HAProxy pod on a loopback address of its own and registers it as a Running
    /// Pod object.
    pub fn add_pod(&mut self) -> usize {
        let n = self.pods.len();
        let name = format!("haproxy-{n}");
        let ip = super::unique_loopback();
        let dir = self.dir.0.join(&name);
        std::fs::create_dir_all(dir.join("etc")).unwrap();
        let mut pod = HaproxyPod {
            name: name.clone(),
            ip: ip.clone(),
            dir,
            haproxy: None,
            agent: None,
            agent_port: self.agent_port,
            status_port: self.status_port,
            certs: self.certs.clone(),
            insecure: self.insecure_agents,
        };
        pod.start_haproxy();
        pod.start_agent();
        let object = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS, "labels": {"app": "haproxy-e2e", "app.kubernetes.io/component": "haproxy"}},
            "spec": {"containers": [{"name": "haproxy", "image": "haproxy"}, {"name": "haptic-agent", "image": "haptic-agent"}]}});
        self.client
            .create(&pods_resource(), Some(NS), &object)
            .unwrap();
        let status = json!({"status": {"phase": "Running", "podIP": ip, "containerStatuses": [
            {"name": "haproxy", "ready": true, "restartCount": 0, "image": "haproxy", "imageID": "", "started": true, "state": {"running": {}}, "lastState": {}},
            {"name": "haptic-agent", "ready": true, "restartCount": 0, "image": "haptic-agent", "imageID": "", "started": true, "state": {"running": {}}, "lastState": {}}]}});
        self.client
            .merge_patch_status(&pods_resource(), Some(NS), &name, &status)
            .unwrap();
        self.pods.push(pod);
        n
    }

    /// Registers a ValidatingWebhookConfiguration for Ingresses pointing at the controller
    /// replica started next (its webhook listens on an address of its own, with a certificate
    /// for it).
    pub fn enable_webhook(&mut self) {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let dir = self.dir.0.join("webhook-certs");
        let (ip, port) = (super::unique_loopback(), 9443);
        let status = Command::new(root.join("scripts/gen-certs.sh"))
            .arg(&dir)
            .env("AGENT_SANS", format!("IP:{ip}"))
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success());
        let tls = dir.join("serving");
        std::fs::create_dir_all(&tls).unwrap();
        std::fs::copy(dir.join("agent.crt"), tls.join("tls.crt")).unwrap();
        std::fs::copy(dir.join("agent.key"), tls.join("tls.key")).unwrap();
        let ca = haptic_agent::base64::encode(&std::fs::read(dir.join("ca.crt")).unwrap());
        let hook = json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration", "metadata": {"name": "haptic"},
            "webhooks": [{"name": "ingresses.haproxy-haptic.org", "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Fail", "timeoutSeconds": 10,
                "clientConfig": {"url": format!("https://{ip}:{port}/validate"), "caBundle": ca},
                "rules": [{"apiGroups": ["networking.k8s.io"], "apiVersions": ["v1"], "resources": ["ingresses"], "operations": ["CREATE", "UPDATE"]}]}]});
        self.client
            .create(
                &ResourceRef::new(
                    "admissionregistration.k8s.io/v1",
                    "validatingwebhookconfigurations",
                    false,
                ),
                None,
                &hook,
            )
            .unwrap();
        self.webhook = Some((tls, ip, port));
    }

    /// The webhook's address, when enabled.
    pub fn webhook_addr(&self) -> Option<(String, u16)> {
        self.webhook
            .as_ref()
            .map(|(_, ip, port)| (ip.clone(), *port))
    }

    pub fn start_controller(&mut self, name: &str) -> usize {
        let (ip, health_port, metrics_port) = (super::unique_loopback(), 8080, 9090);
        // Only the first replica gets the registered webhook port; others run without one.
        let webhook = match (&self.webhook, self.controllers.is_empty()) {
            (Some((dir, hook_ip, port)), true) => {
                let mut args = vec![
                    "--webhook-port".to_string(),
                    format!("{hook_ip}:{port}"),
                    "--webhook-cert-dir".into(),
                    dir.display().to_string(),
                ];
                if let Some(ca) = &self.webhook_client_ca {
                    args.extend(["--webhook-client-ca".into(), ca.display().to_string()]);
                }
                args
            }
            _ => vec!["--webhook-port".to_string(), "0".to_string()],
        };
        let log = std::fs::File::create(self.dir.0.join(format!("{name}.log"))).unwrap();
        // The benchmarks can measure another build of the controller (the static binary that
        // ships): HAPTIC_BENCH_BIN names it.
        let bin = std::env::var_os("HAPTIC_BENCH_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_haptic")));
        let child = Command::new(bin)
            .args([
                "run",
                "--kubeconfig",
                self.api.kubeconfig().to_str().unwrap(),
                "--namespace",
                NS,
                "--pod-name",
                name,
                "--config-name",
                CONFIG_NAME,
            ])
            .args([
                "--health-port",
                &format!("{ip}:{health_port}"),
                "--metrics-port",
                &format!("{ip}:{metrics_port}"),
            ])
            .args(&webhook)
            .args([
                "--agent-client-cert-dir",
                self.certs.join("controller").to_str().unwrap(),
                "--haproxy-bin",
                &self.controller_haproxy,
            ])
            .args(if self.insecure_agents {
                vec![
                    "--agent-credentials-dir".to_string(),
                    self.certs.join("credentials").display().to_string(),
                ]
            } else {
                vec![]
            })
            .env("LOG_LEVEL", "info")
            .envs(self.controller_env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(log)
            .tied()
            .spawn()
            .unwrap();
        let registered_webhook = match (&self.webhook, self.controllers.is_empty()) {
            (Some((_, hook_ip, port)), true) => Some(format!("{hook_ip}:{port}")),
            _ => None,
        };
        self.controllers.push(Controller {
            name: name.into(),
            ip,
            health_port,
            metrics_port,
            child: Some(child),
        });
        // The API server calls the registered webhook for every Ingress write from now on
        // (failurePolicy Fail): wait until it listens, which is once the controller has read
        // its first config.
        if let Some(addr) = registered_webhook {
            let addr: std::net::SocketAddr = addr.parse().unwrap();
            let deadline = Instant::now() + Duration::from_secs(30);
            while std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
                assert!(
                    Instant::now() < deadline,
                    "the webhook of {name} never listened on {addr}:\n{}",
                    self.controller_log(name)
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        self.controllers.len() - 1
    }

    pub fn controller_log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.0.join(format!("{name}.log"))).unwrap_or_default()
    }

    /// Which controller leads, from the Lease.
    pub fn lease_holder(&self) -> Option<String> {
        let lease = self
            .client
            .get(
                &ResourceRef::new("coordination.k8s.io/v1", "leases", true),
                Some(NS),
                "haptic-leader",
            )
            .ok()?;
        lease
            .pointer("/spec/holderIdentity")
            .and_then(Value::as_str)
            .filter(|h| !h.is_empty())
            .map(str::to_string)
    }

    /// `GET` through pod `n`'s HAProxy.
    pub fn request(&self, n: usize, host: &str, path: &str) -> Option<(u16, String)> {
        http_get(&self.pods[n].ip, self.http_port, host, path)
    }

    /// Waits until every pod answers `host`/`path` with `expected` in the body (and status).
    pub fn wait_route(&self, host: &str, path: &str, status: u16, body: &str, timeout: Duration) {
        for n in 0..self.pods.len() {
            wait_for(
                &format!("pod {n}: {host}{path} → {status} {body:?}"),
                timeout,
                || {
                    self.request(n, host, path)
                        .is_some_and(|(s, b)| s == status && b.contains(body))
                },
            );
        }
    }

    /// The status condition `kind` of the HAProxyTemplateConfig: (status, message).
    pub fn condition(&self, kind: &str) -> Option<(String, String)> {
        let cfg = self
            .client
            .get(&Self::config_resource(), Some(NS), CONFIG_NAME)
            .ok()?;
        let conditions = cfg.pointer("/status/conditions")?.as_array()?.clone();
        let c = conditions.into_iter().find(|c| c["type"] == kind)?;
        Some((
            c["status"].as_str()?.to_string(),
            c["message"].as_str().unwrap_or_default().to_string(),
        ))
    }

    /// The leading controller replica's index.
    pub fn leader_index(&self) -> Option<usize> {
        let holder = self.lease_holder()?;
        self.controllers.iter().position(|c| c.name == holder)
    }

    pub fn create_service(&self, name: &str, backends: &[&Backend]) {
        let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NS},
            "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}});
        self.client
            .create(&ResourceRef::new("v1", "services", true), Some(NS), &svc)
            .unwrap();
        self.set_endpoints(name, backends);
    }

    /// Creates or replaces the EndpointSlice of a Service (all backends listen on 127.0.0.1).
    pub fn set_endpoints(&self, service: &str, backends: &[&Backend]) {
        let res = ResourceRef::new("discovery.k8s.io/v1", "endpointslices", true);
        let name = format!("{service}-slice");
        // One port per slice: give each backend its own slice when ports differ.
        let _ = self.client.delete(&res, Some(NS), &name);
        for i in 0..8 {
            let _ = self.client.delete(&res, Some(NS), &format!("{name}-{i}"));
        }
        for (i, b) in backends.iter().enumerate() {
            self.add_endpoint_slice(service, i, b);
        }
    }

    /// Creates EndpointSlice `<service>-slice-<i>` with one backend, leaving the others.
    pub fn add_endpoint_slice(&self, service: &str, i: usize, b: &Backend) {
        let res = ResourceRef::new("discovery.k8s.io/v1", "endpointslices", true);
        let slice = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("{service}-slice-{i}"), "namespace": NS, "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4", "ports": [{"name": "http", "port": b.port, "protocol": "TCP"}],
            "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": true}}]});
        self.client.create(&res, Some(NS), &slice).unwrap();
    }

    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> (bool, String) {
        let mut child = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(self.api.kubeconfig())
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        if let Some(input) = stdin {
            child
                .stdin
                .take()
                .unwrap()
                .write_all(input.as_bytes())
                .unwrap();
        }
        drop(child.stdin.take());
        let out = child.wait_with_output().unwrap();
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for c in &self.controllers {
                let log = self.controller_log(&c.name);
                let tail: Vec<&str> = log.lines().rev().take(40).collect();
                eprintln!("---- last lines of controller {} ----", c.name);
                for line in tail.into_iter().rev() {
                    eprintln!("{line}");
                }
            }
        }
    }
}
