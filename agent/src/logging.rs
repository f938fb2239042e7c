//! One logger for the controller, the agent and the dev API server: `env_logger`, one format
//! on stderr (`2026-12-03T11:50:29Z INFO  haptic::controller: message`), `RUST_LOG` filters,
//! and a level that can be changed while running (the controller applies
//! `spec.logging.level` without a restart).
//!
//! Without `RUST_LOG`, every module logs at the one level given (a flag, `LOG_LEVEL`, the
//! config) and [`set_level`] moves it. With `RUST_LOG` (for example
//! `info,haptic::kube=debug`), its directives decide, and [`set_level`] can only lower the
//! ceiling under them.

use std::io::Write;

use log::LevelFilter;

/// Parses `trace`, `debug`, `info`, `warn` (or `warning`), `error`, `off`, in any case.
pub fn parse_level(text: &str) -> Option<LevelFilter> {
    match text.to_ascii_lowercase().as_str() {
        "trace" => Some(LevelFilter::Trace),
        "debug" => Some(LevelFilter::Debug),
        "info" => Some(LevelFilter::Info),
        "warn" | "warning" => Some(LevelFilter::Warn),
        "error" => Some(LevelFilter::Error),
        "off" => Some(LevelFilter::Off),
        _ => None,
    }
}

/// Installs the logger: `RUST_LOG` when set, otherwise everything at `level`. A second call
/// keeps the first logger (tests start several components in one process).
pub fn init(level: LevelFilter) {
    let mut builder = env_logger::Builder::new();
    builder
        .format(|out, record| {
            writeln!(
                out,
                "{} {:<5} {}: {}",
                crate::time::now_rfc3339_millis(),
                record.level(),
                record.target(),
                record.args()
            )
        })
        .target(env_logger::Target::Stderr);
    let rust_log = std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty());
    match &rust_log {
        Some(spec) => {
            builder.parse_filters(spec);
        }
        // Let every record through the logger's own filter: the level lives in
        // `log::max_level`, which `set_level` moves.
        None => {
            builder.filter_level(LevelFilter::Trace);
        }
    }
    let logger = builder.build();
    let ceiling = match rust_log {
        Some(_) => logger.filter(),
        None => level,
    };
    if log::set_boxed_logger(Box::new(logger)).is_ok() {
        log::set_max_level(ceiling);
    }
}

/// Changes the level while running (with `RUST_LOG` set: the ceiling under its directives).
pub fn set_level(level: LevelFilter) {
    log::set_max_level(level);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_in_any_case() {
        assert_eq!(parse_level("DEBUG"), Some(LevelFilter::Debug));
        assert_eq!(parse_level("Warning"), Some(LevelFilter::Warn));
        assert_eq!(parse_level("loud"), None);
    }
}
