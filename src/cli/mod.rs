//! The `haptic` command line: one file per subcommand. Each returns its exit code; errors are
//! printed here, once, as `error: …`.

mod args;
mod config;
mod render;
mod run;
mod validate;
mod version;

use std::process::ExitCode;

const TOP_USAGE: &str = "haptic: HAProxy Template Ingress Controller

Usage: haptic <command> [options]

Commands:
  run        Run the controller (in a cluster, or against a kubeconfig)
  render     Render a config against fixture manifests into a directory (offline)
  validate   Run a config's embedded validation tests (offline)
  config     Config utilities: `config merge -f A -f B` prints the merged config
  version    Print version and build information

Run `haptic <command> --help` for a command's options.";

/// A command failure that has already been explained to the user (exit 1, no extra message).
pub struct Reported;

pub type CommandResult = Result<(), CommandError>;

pub enum CommandError {
    Message(String),
    Reported,
}

impl From<String> for CommandError {
    fn from(s: String) -> Self {
        CommandError::Message(s)
    }
}

impl From<&str> for CommandError {
    fn from(s: &str) -> Self {
        CommandError::Message(s.to_string())
    }
}

impl From<Reported> for CommandError {
    fn from(_: Reported) -> Self {
        CommandError::Reported
    }
}

/// The haproxy binary to use: `--haproxy-bin`, else `HAPROXY_BIN`, else `haproxy` on PATH.
pub(crate) fn haproxy_bin(flag: Option<String>) -> String {
    flag.or_else(|| std::env::var("HAPROXY_BIN").ok())
        .unwrap_or_else(|| "haproxy".into())
}

pub fn main(args: Vec<String>) -> ExitCode {
    // Warnings by default; LOG_LEVEL or RUST_LOG (with per-module filters) for more.
    crate::logger::init(log::LevelFilter::Warn);
    let Some(command) = args.first() else {
        eprintln!("{TOP_USAGE}");
        return ExitCode::from(2);
    };
    let rest = &args[1..];
    let result = match command.as_str() {
        "run" => run::run(rest),
        "render" => render::run(rest),
        "validate" => validate::run(rest),
        "config" => config::run(rest),
        "version" | "--version" => version::run(rest),
        "help" | "--help" | "-h" => {
            println!("{TOP_USAGE}");
            Ok(())
        }
        other => Err(CommandError::Message(format!(
            "unknown command {other:?}\n\n{TOP_USAGE}"
        ))),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(CommandError::Reported) => ExitCode::from(1),
        Err(CommandError::Message(message)) => {
            eprintln!("error: {message}");
            ExitCode::from(1)
        }
    }
}
