//! `haptic run`: the controller. Flags fall back to environment variables (as the Helm chart
//! sets them), then to defaults.

use std::path::PathBuf;

use super::args::{opt, parse, usage, Spec};
use super::{haproxy_bin, CommandResult};
use crate::controller::{run as run_controller, Options};

const OPTIONS: &[Spec] = &[
    opt("config-name", None, "HAProxyTemplateConfig to run (env CONFIG_NAME; default haptic-config)"),
    opt("namespace", None, "The controller's namespace (env POD_NAMESPACE; default: from the kubeconfig or service account)"),
    opt("pod-name", None, "This replica's identity for leader election (env POD_NAME; default: hostname)"),
    opt("kubeconfig", None, "kubeconfig file (env KUBECONFIG); absent: in-cluster service account"),
    opt("health-port", None, "Port (or ADDR:PORT) of /healthz, /readyz, /debug/* (env HEALTH_PORT; default 8080)"),
    opt("metrics-port", None, "Port (or ADDR:PORT) of /metrics (env METRICS_PORT; default 9090)"),
    opt("webhook-port", None, "Port (or ADDR:PORT) of the admission webhook, 0 to disable (env WEBHOOK_PORT; default 9443)"),
    opt("haproxy-bin", None, "HAProxy binary for validation (env HAPROXY_BIN; default haproxy on PATH)"),
    opt("agent-client-cert-dir", None, "Directory with tls.crt, tls.key, ca.crt for talking to agents (env AGENT_CLIENT_CERT_DIR; default /etc/haptic/agent-client)"),
    opt("agent-server-name", None, "DNS name the agents' certificate must carry (env AGENT_SERVER_NAME; default haptic-agent)"),
    opt("agent-credentials-dir", None, "Plain HTTP with basic auth from DIR/username and DIR/password, for agents run with --insecure-http-with-basic-auth (env AGENT_CREDENTIALS_DIR; default: mutual TLS)"),
    opt("webhook-cert-dir", None, "Directory with the webhook's tls.crt and tls.key (env WEBHOOK_CERT_DIR; default /etc/haptic/webhook)"),
    opt("webhook-client-ca", None, "Require a client certificate issued by this CA (PEM) of the webhook's callers: the API server's, from its AdmissionConfiguration (env WEBHOOK_CLIENT_CA; default: any caller)"),
    opt("check-sandbox", None, "auto: haproxy -c runs in a Landlock sandbox where the kernel has Landlock, unsandboxed elsewhere; required: it does not run without one; off: never sandboxed (env CHECK_SANDBOX, also read by render and validate; default auto)"),
    opt("log-level", None, "TRACE, DEBUG, INFO, WARN or ERROR (env LOG_LEVEL; default INFO; spec.logging.level overrides)"),
];

const SUMMARY: &str =
    "Run the controller: watch the cluster, render, validate, deploy to the HAProxy pods.";

pub(super) fn flag_or_env(parsed: &super::args::Parsed, flag: &str, env: &str) -> Option<String> {
    parsed
        .last(flag)
        .or_else(|| std::env::var(env).ok())
        .filter(|v| !v.is_empty())
}

/// `9090` → `[::]:9090` (both address families; `0.0.0.0:9090` where the kernel has no IPv6,
/// `haptic_agent::net`); `127.0.0.1:9090` as is.
fn listen_addr(value: Option<String>, default: u16) -> Result<Option<String>, String> {
    match value {
        None => Ok(Some(format!("[::]:{default}"))),
        Some(v) if v == "0" => Ok(None),
        Some(v) if v.contains(':') => Ok(Some(v)),
        Some(v) => v
            .parse::<u16>()
            .map(|p| Some(format!("[::]:{p}")))
            .map_err(|_| format!("bad port {v:?}")),
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "haptic".into())
}

pub(super) fn run(args: &[String]) -> CommandResult {
    let parsed = parse(args, OPTIONS)?;
    if parsed.help {
        println!("{}", usage("run", SUMMARY, OPTIONS));
        return Ok(());
    }
    if let Some(extra) = parsed.positional.first() {
        return Err(format!("unexpected argument {extra:?}").into());
    }
    let level = flag_or_env(&parsed, "log-level", "LOG_LEVEL").unwrap_or_else(|| "INFO".into());
    let level =
        crate::logger::parse_level(&level).ok_or_else(|| format!("unknown log level {level:?}"))?;
    crate::logger::set_level(level);
    let sandbox = flag_or_env(&parsed, "check-sandbox", "CHECK_SANDBOX").unwrap_or_default();
    let sandbox = crate::validate::sandbox::Mode::parse(&sandbox)
        .map_err(|e| format!("--check-sandbox: {e}"))?;
    crate::validate::sandbox::set_mode(sandbox);
    if sandbox == crate::validate::sandbox::Mode::Required {
        // Says at start, not at the first check, when no check will run.
        let _ = crate::validate::sandbox::abi();
    }
    let health = listen_addr(flag_or_env(&parsed, "health-port", "HEALTH_PORT"), 8080)?
        .ok_or("the health port cannot be disabled")?;
    let metrics = listen_addr(flag_or_env(&parsed, "metrics-port", "METRICS_PORT"), 9090)?
        .ok_or("the metrics port cannot be disabled")?;
    let options = Options {
        config_name: flag_or_env(&parsed, "config-name", "CONFIG_NAME")
            .unwrap_or_else(|| "haptic-config".into()),
        namespace: flag_or_env(&parsed, "namespace", "POD_NAMESPACE"),
        pod_name: flag_or_env(&parsed, "pod-name", "POD_NAME").unwrap_or_else(hostname),
        kubeconfig: flag_or_env(&parsed, "kubeconfig", "KUBECONFIG").map(PathBuf::from),
        health_addr: health,
        metrics_addr: metrics,
        webhook_addr: listen_addr(flag_or_env(&parsed, "webhook-port", "WEBHOOK_PORT"), 9443)?,
        haproxy_bin: haproxy_bin(parsed.last("haproxy-bin")),
        agent_cert_dir: flag_or_env(&parsed, "agent-client-cert-dir", "AGENT_CLIENT_CERT_DIR")
            .unwrap_or_else(|| "/etc/haptic/agent-client".into())
            .into(),
        agent_credentials_dir: flag_or_env(
            &parsed,
            "agent-credentials-dir",
            "AGENT_CREDENTIALS_DIR",
        )
        .map(PathBuf::from),
        agent_server_name: flag_or_env(&parsed, "agent-server-name", "AGENT_SERVER_NAME")
            .unwrap_or_else(|| "haptic-agent".into()),
        webhook_cert_dir: flag_or_env(&parsed, "webhook-cert-dir", "WEBHOOK_CERT_DIR")
            .unwrap_or_else(|| "/etc/haptic/webhook".into())
            .into(),
        webhook_client_ca: flag_or_env(&parsed, "webhook-client-ca", "WEBHOOK_CLIENT_CA")
            .filter(|p| !p.is_empty())
            .map(PathBuf::from),
    };
    run_controller(options).map_err(|e| e.into())
}
