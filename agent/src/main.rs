//! `haptic-agent`: the sidecar that applies HAPTIC bundles to the HAProxy beside it.
//!
//! ```text
//! haptic-agent serve --config-dir DIR --master-socket PATH [--worker-socket PATH]
//!                    [--haproxy-bin PATH] [--listen ADDR] [--probe-listen ADDR]
//!                    --tls-cert F --tls-key F --client-ca F [--client-name NAME]
//!                    | --insecure-http-with-basic-auth --credentials PATH
//!                    [--max-body-bytes N] [--reload-timeout-secs N] [--log-level LEVEL]
//! haptic-agent init --bootstrap FILE --config-dir DIR
//! ```
//! Argument parsing is hand-written: a dozen flags do not need a crate. Logging is the
//! workspace's one logger (`haptic_agent::logging`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use haptic_agent::apply::Agent;
use haptic_agent::haproxy::Haproxy;
use haptic_agent::http::Limits;
use haptic_agent::server::{self, CredentialFiles, ServerLimits, Transport};
use haptic_agent::state::StateDir;
use haptic_agent::tls::{ReloadingTls, TlsFiles};

const USAGE: &str = "usage:
  haptic-agent serve --config-dir DIR --master-socket PATH [--worker-socket PATH]
                     [--haproxy-bin PATH] [--listen ADDR] [--probe-listen ADDR]
                     (--tls-cert F --tls-key F --client-ca F [--client-name NAME]
                      | --insecure-http-with-basic-auth --credentials PATH)
                     [--max-body-bytes N] [--reload-timeout-secs N] [--log-level error|warn|info|debug]
  haptic-agent init --bootstrap FILE --config-dir DIR";

/// Parsed `--flag value` pairs and bare `--switch`es.
struct Args {
    values: Vec<(String, String)>,
    switches: Vec<String>,
}

impl Args {
    fn parse(raw: &[String], switches: &[&str]) -> Result<Args, String> {
        let mut args = Args {
            values: Vec::new(),
            switches: Vec::new(),
        };
        let mut it = raw.iter();
        while let Some(flag) = it.next() {
            if !flag.starts_with("--") {
                return Err(format!("unexpected argument {flag:?}"));
            }
            if switches.contains(&flag.as_str()) {
                args.switches.push(flag.clone());
                continue;
            }
            let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
            args.values.push((flag.clone(), value.clone()));
        }
        Ok(args)
    }

    fn get(&self, flag: &str) -> Option<&str> {
        self.values
            .iter()
            .rev()
            .find(|(f, _)| f == flag)
            .map(|(_, v)| v.as_str())
    }

    fn required(&self, flag: &str) -> Result<&str, String> {
        self.get(flag).ok_or_else(|| format!("{flag} is required"))
    }

    fn has(&self, switch: &str) -> bool {
        self.switches.iter().any(|s| s == switch)
    }

    fn check_known(&self, known: &[&str]) -> Result<(), String> {
        match self
            .values
            .iter()
            .find(|(f, _)| !known.contains(&f.as_str()))
        {
            Some((f, _)) => Err(format!("unknown flag {f}")),
            None => Ok(()),
        }
    }
}

fn main() {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    // `haptic-agent serve --help` as well as `haptic-agent --help`.
    if raw.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return;
    }
    let result = match raw.first().map(String::as_str) {
        Some("serve") => serve(&raw[1..]),
        Some("init") => init(&raw[1..]),
        Some("--help" | "-h" | "help") => {
            println!("{USAGE}");
            Ok(())
        }
        _ => Err(format!("expected a subcommand\n{USAGE}")),
    };
    if let Err(e) = result {
        eprintln!("haptic-agent: {e}");
        std::process::exit(2);
    }
}

fn setup_logging(level: Option<&str>) -> Result<(), String> {
    let level = level.unwrap_or("info");
    let filter = haptic_agent::logging::parse_level(level)
        .ok_or_else(|| format!("unknown log level {level:?}"))?;
    haptic_agent::logging::init(filter);
    Ok(())
}

fn serve(raw: &[String]) -> Result<(), String> {
    let args = Args::parse(raw, &["--insecure-http-with-basic-auth"])?;
    args.check_known(&[
        "--config-dir",
        "--master-socket",
        "--worker-socket",
        "--haproxy-bin",
        "--listen",
        "--probe-listen",
        "--tls-cert",
        "--tls-key",
        "--client-ca",
        "--client-name",
        "--credentials",
        "--max-body-bytes",
        "--reload-timeout-secs",
        "--log-level",
    ])?;
    setup_logging(args.get("--log-level"))?;
    let config_dir = PathBuf::from(args.required("--config-dir")?);
    let reload_secs: u64 = args
        .get("--reload-timeout-secs")
        .unwrap_or("15")
        .parse()
        .map_err(|_| "--reload-timeout-secs must be a number")?;
    let haproxy = Haproxy {
        master_socket: PathBuf::from(args.required("--master-socket")?),
        worker_socket: args.get("--worker-socket").map(PathBuf::from),
        binary: PathBuf::from(args.get("--haproxy-bin").unwrap_or("haproxy")),
        command_timeout: Duration::from_secs(10),
        reload_timeout: Duration::from_secs(reload_secs),
    };
    let transport = if args.has("--insecure-http-with-basic-auth") {
        let creds = CredentialFiles::new(PathBuf::from(args.required("--credentials")?))?;
        log::warn!(
            "serving the API over plain HTTP with basic auth (--insecure-http-with-basic-auth)"
        );
        Transport::InsecureBasicAuth(Arc::new(creds))
    } else {
        let files = TlsFiles {
            cert: args.required("--tls-cert")?.into(),
            key: args.required("--tls-key")?.into(),
            client_ca: args.required("--client-ca")?.into(),
            client_name: match args.get("--client-name") {
                Some(n)
                    if n.is_empty()
                        || !n
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.') =>
                {
                    return Err(format!("--client-name {n:?}: expected a DNS name"));
                }
                n => n.map(str::to_string),
            },
        };
        Transport::MutualTls(Arc::new(ReloadingTls::new(files)?))
    };
    let mut limits = ServerLimits::default();
    if let Some(n) = args.get("--max-body-bytes") {
        limits.http = Limits {
            max_body_bytes: n.parse().map_err(|_| "--max-body-bytes must be a number")?,
            ..limits.http
        };
    }
    let listen = args.get("--listen").unwrap_or("[::]:5555");
    let probe_listen = args.get("--probe-listen").unwrap_or("[::]:5556");
    // Fault injection for the crash-recovery tests; compiled out of release builds.
    #[cfg(debug_assertions)]
    let fault = std::env::var("HAPTIC_AGENT_FAULT").ok();
    #[cfg(not(debug_assertions))]
    let fault = None;
    let agent = Arc::new(Agent::open(&config_dir, haproxy, fault)?);
    let (api, listen) =
        haptic_agent::net::listen(listen).map_err(|e| format!("listen on {listen}: {e}"))?;
    let (probes, probe_listen) = haptic_agent::net::listen(probe_listen)
        .map_err(|e| format!("listen on {probe_listen}: {e}"))?;
    log::info!(
        "haptic-agent serving api={listen} probes={probe_listen} config_dir={}",
        config_dir.display()
    );
    let probe_agent = agent.clone();
    std::thread::Builder::new()
        .name("probes".into())
        .spawn(move || server::serve_probes(probe_agent, probes, limits))
        .map_err(|e| format!("start probe thread: {e}"))?;
    server::serve_api(agent, api, transport, limits);
    Ok(())
}

/// Writes the bootstrap configuration for the pod's init step and marks the state `bootstrap`
/// (the highest leader epoch and the file manifest are kept: fencing and cleanup stay correct).
fn init(raw: &[String]) -> Result<(), String> {
    let args = Args::parse(raw, &[])?;
    args.check_known(&["--bootstrap", "--config-dir", "--log-level"])?;
    setup_logging(args.get("--log-level"))?;
    let bootstrap = args.required("--bootstrap")?;
    let config_dir = PathBuf::from(args.required("--config-dir")?);
    let text = std::fs::read(bootstrap).map_err(|e| format!("read {bootstrap}: {e}"))?;
    let state_dir = StateDir::new(&config_dir);
    let mut state = state_dir.load_state()?;
    // An apply a stop interrupted (the node restarted while it ran) is not finished at the
    // next start: this step replaces haproxy.cfg, so its journal no longer describes the disk,
    // and finishing it would reload HAProxy with the bootstrap configuration while the agent
    // reported the interrupted bundle as applied. Its files are left for the next apply,
    // which replaces or deletes them (they join the manifest it cleans up after).
    if let Some(journal) = state_dir.load_journal()? {
        log::warn!(
            "an apply was interrupted bundle={}; discarded, the next apply starts from the bootstrap configuration",
            journal.bundle
        );
        for (path, entry) in journal.manifest {
            state.files.entry(path).or_insert(entry);
        }
    }
    haptic_agent::state::write_atomic(&config_dir.join(haptic_agent::files::CONFIG_FILE), &text)?;
    if let Some(pending) = state.pending_reload.take() {
        for (path, entry) in pending.manifest {
            state.files.entry(path).or_insert(entry);
        }
    }
    state.forget_bundle();
    state.master_pid = None;
    // The state (with the manifest the next apply cleans up after) before the journal goes:
    // stopped in between, the next init finds the journal again.
    state_dir.save_state(&state)?;
    state_dir.clear_journal()?;
    // Backups and staged files of an interrupted apply (private keys among them) are not kept.
    let disk = haptic_agent::files::Disk {
        root: config_dir.clone(),
        stage: state_dir.stage(),
        prev: state_dir.prev(),
    };
    disk.clean_work_areas()?;
    let next = config_dir.join(haptic_agent::files::NEXT_CONFIG_FILE);
    if let Err(e) = std::fs::remove_file(&next) {
        if e.kind() != std::io::ErrorKind::NotFound {
            return Err(format!("remove {}: {e}", next.display()));
        }
    }
    log::info!(
        "wrote bootstrap configuration to {}",
        config_dir.join("haproxy.cfg").display()
    );
    Ok(())
}
