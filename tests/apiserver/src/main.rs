//! `haptic-dev-apiserver`: a stand-in for the Kubernetes API server for development, tests and
//! the local demo. It is a separate crate that the production binary never links.
//!
//! ```text
//! haptic-dev-apiserver --listen 127.0.0.1:0 --kubeconfig-out /tmp/dev/kubeconfig [--load DIR]
//!     [--plain-http] [--token TOKEN]... [--token-file PATH] [--cert-dir DIR] [--authorization-mode RBAC]
//!     [--bookmark-interval 60s] [--watch-timeout 30m] [--history 10000]
//!     [--namespace-deletion-delay 1s] [--log-level info] [--admission-control-config-file PATH]
//! ```
//!
//! Once serving it prints `ready <url>` on stdout. See `docs/dev-apiserver.md` for behaviour,
//! the `/_dev/` control endpoints and what is not implemented.

mod admission;
mod api;
mod auth;
mod discovery;
mod faults;
mod http;
mod kubeconfig;
mod logger;
mod objects;
mod patch;
mod protobuf;
mod rbac;
mod registry;
mod seed;
mod selectors;
mod server;
mod status;
mod storage;
mod tls;
mod util;
mod watch;
mod write;

use std::io::Write;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use crate::auth::Auth;
use crate::faults::Faults;
use crate::server::{Config, Ctx};
use crate::storage::{Expect, Store};

const USAGE: &str = "usage: haptic-dev-apiserver --listen HOST:PORT [--kubeconfig-out PATH] \
[--load DIR]... [--plain-http] [--token TOKEN]... [--token-file PATH] [--cert-dir DIR] [--authorization-mode RBAC] \
[--bookmark-interval DURATION] [--watch-timeout DURATION] [--history EVENTS] \
[--namespace-deletion-delay DURATION] [--log-level LEVEL] [--admission-control-config-file PATH]";

/// Command-line options.
struct Args {
    listen: String,
    kubeconfig_out: Option<PathBuf>,
    load: Vec<PathBuf>,
    plain_http: bool,
    tokens: Vec<String>,
    token_file: Option<PathBuf>,
    cert_dir: Option<PathBuf>,
    bookmark_interval: Duration,
    watch_timeout: Duration,
    history: usize,
    namespace_deletion_delay: Duration,
    log_level: log::LevelFilter,
    admission_config: Option<PathBuf>,
    /// `--authorization-mode RBAC`: stored RBAC objects decide; otherwise every authenticated
    /// user may do everything.
    rbac: bool,
}

/// `500ms`, `2s`, `5m`, or plain seconds.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("invalid duration {text:?} (examples: 500ms, 2s, 5m)");
    let (num, unit) = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .map(|i| text.split_at(i))
        .unwrap_or((text, "s"));
    let value: f64 = num.parse().map_err(|_| bad())?;
    let secs = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(bad()),
    };
    Duration::try_from_secs_f64(secs).map_err(|_| bad())
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        listen: "127.0.0.1:6443".into(),
        kubeconfig_out: None,
        load: Vec::new(),
        plain_http: false,
        tokens: Vec::new(),
        token_file: None,
        cert_dir: None,
        bookmark_interval: Duration::from_secs(60),
        watch_timeout: Duration::from_secs(1800),
        history: 10_000,
        namespace_deletion_delay: Duration::from_secs(1),
        log_level: log::LevelFilter::Info,
        admission_config: None,
        rbac: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let (flag, inline) = match flag.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (flag, None),
        };
        let mut value = |name: &str| -> Result<String, String> {
            inline
                .clone()
                .or_else(|| it.next())
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match flag.as_str() {
            "--listen" => args.listen = value("--listen")?,
            "--kubeconfig-out" => args.kubeconfig_out = Some(value("--kubeconfig-out")?.into()),
            "--load" => args.load.push(value("--load")?.into()),
            "--plain-http" => args.plain_http = true,
            "--token" => args.tokens.push(value("--token")?),
            "--token-file" => args.token_file = Some(value("--token-file")?.into()),
            "--cert-dir" => args.cert_dir = Some(value("--cert-dir")?.into()),
            "--authorization-mode" => {
                args.rbac = match value("--authorization-mode")?.as_str() {
                    "RBAC" => true,
                    "AlwaysAllow" => false,
                    other => {
                        return Err(format!(
                            "--authorization-mode: RBAC or AlwaysAllow, not {other:?}"
                        ))
                    }
                }
            }
            "--admission-control-config-file" => {
                args.admission_config = Some(value("--admission-control-config-file")?.into())
            }
            "--bookmark-interval" => {
                args.bookmark_interval = parse_duration(&value("--bookmark-interval")?)?
            }
            "--watch-timeout" => args.watch_timeout = parse_duration(&value("--watch-timeout")?)?,
            "--namespace-deletion-delay" => {
                args.namespace_deletion_delay =
                    parse_duration(&value("--namespace-deletion-delay")?)?
            }
            "--history" => {
                args.history = value("--history")?
                    .parse()
                    .map_err(|_| "--history needs a number of events".to_string())?
            }
            "--log-level" => {
                args.log_level = value("--log-level")?
                    .parse()
                    .map_err(|_| "--log-level: error, warn, info, debug or trace".to_string())?
            }
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    if args.bookmark_interval.is_zero() {
        return Err("--bookmark-interval must be positive".into());
    }
    Ok(args)
}

fn run(args: Args) -> Result<(), String> {
    if let Some(path) = &args.admission_config {
        admission::load_admission_config(path)?;
    }
    let listener =
        TcpListener::bind(&args.listen).map_err(|e| format!("listen on {}: {e}", args.listen))?;
    let local = listener
        .local_addr()
        .map_err(|e| format!("local address: {e}"))?;
    let scheme = if args.plain_http { "http" } else { "https" };
    let url = format!("{scheme}://{local}");

    let mut tokens = args.tokens.clone();
    if tokens.is_empty() && args.token_file.is_none() {
        tokens.push(util::random_hex(16));
    }
    let cert_dir = args.cert_dir.clone().or_else(|| {
        args.kubeconfig_out.as_ref().and_then(|k| {
            k.parent().map(|p| {
                if p.as_os_str().is_empty() {
                    PathBuf::from(".")
                } else {
                    p.to_path_buf()
                }
            })
        })
    });
    let tls = if args.plain_http {
        None
    } else {
        let dir = cert_dir.clone().unwrap_or_else(|| {
            std::env::temp_dir().join(format!("haptic-dev-apiserver-{}", std::process::id()))
        });
        Some(tls::Pki::load_or_create(&dir, &[local.ip().to_string()])?)
    };
    if let Some(path) = &args.kubeconfig_out {
        let cred = match (tokens.first(), &args.token_file) {
            (Some(t), _) => kubeconfig::Credential::Token(t.clone()),
            (None, Some(f)) => kubeconfig::Credential::TokenFile(f.clone()),
            (None, None) => unreachable!("a token is generated above when none is configured"),
        };
        kubeconfig::write(path, &url, tls.as_ref(), &cred)?;
        if let Some(pki) = &tls {
            let client = pki.dir.join("kubeconfig-client-cert");
            kubeconfig::write(
                &client,
                &url,
                Some(pki),
                &kubeconfig::Credential::ClientCert,
            )?;
        }
    }
    let server_tls = tls.as_ref().map(tls::Pki::server_config).transpose()?;

    let (reaper_tx, reaper_rx) = crossbeam_channel::unbounded();
    let ctx = Arc::new(Ctx {
        store: Store::new(args.history),
        auth: Auth::new(tokens, args.token_file.clone()),
        faults: Faults::default(),
        config: Config {
            bookmark_interval: args.bookmark_interval,
            watch_timeout: args.watch_timeout,
            address: local.to_string(),
            namespace_deletion_delay: args.namespace_deletion_delay,
            rbac: args.rbac,
        },
        namespace_reaper: reaper_tx,
    });
    {
        let ctx = ctx.clone();
        std::thread::Builder::new()
            .name("namespace-reaper".into())
            .spawn(move || server::reap_namespaces(ctx, reaper_rx))
            .map_err(|e| format!("start namespace reaper: {e}"))?;
    }
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        let obj = json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": ns, "uid": util::new_uid(), "creationTimestamp": util::now_rfc3339(),
                         "labels": {"kubernetes.io/metadata.name": ns}},
            "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}});
        ctx.store
            .commit("namespaces", "", ns, Expect::Absent, Some(obj))
            .map_err(|e| format!("create namespace {ns}: {e:?}"))?;
    }
    for dir in &args.load {
        let n = seed::load_dir(&ctx, dir)?;
        log::info!("loaded manifests dir={} objects={n}", dir.display());
    }
    log::info!("serving url={url} tls={}", tls.is_some());
    let mut stdout = std::io::stdout();
    writeln!(stdout, "ready {url}")
        .and_then(|_| stdout.flush())
        .map_err(|e| format!("stdout: {e}"))?;
    server::serve(listener, ctx, server_tls);
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("haptic-dev-apiserver: {e}");
            return ExitCode::from(2);
        }
    };
    logger::init(args.log_level);
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("haptic-dev-apiserver: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert!(parse_duration("5x").is_err());
    }
}
