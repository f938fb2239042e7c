//! A minimal stderr logger for the `log` facade: `LEVEL target: message`, level adjustable at
//! run time (the config's `spec.logging.level` applies without a restart).

use std::io::Write;

struct StderrLogger;

impl log::Log for StderrLogger {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        let _ = writeln!(
            std::io::stderr().lock(),
            "{secs:.3} {:<5} {}: {}",
            record.level(),
            record.target(),
            record.args()
        );
    }

    fn flush(&self) {}
}

static LOGGER: StderrLogger = StderrLogger;

/// Parses TRACE/DEBUG/INFO/WARN/ERROR (any case).
pub fn parse_level(text: &str) -> Option<log::LevelFilter> {
    match text.to_ascii_uppercase().as_str() {
        "TRACE" => Some(log::LevelFilter::Trace),
        "DEBUG" => Some(log::LevelFilter::Debug),
        "INFO" => Some(log::LevelFilter::Info),
        "WARN" | "WARNING" => Some(log::LevelFilter::Warn),
        "ERROR" => Some(log::LevelFilter::Error),
        "OFF" => Some(log::LevelFilter::Off),
        _ => None,
    }
}

/// Installs the logger at the level from `LOG_LEVEL` (default `default`).
pub fn init(default: log::LevelFilter) {
    let level = std::env::var("LOG_LEVEL")
        .ok()
        .and_then(|l| parse_level(&l))
        .unwrap_or(default);
    // set_logger fails only if a logger is already installed, which is then used instead.
    let _ = log::set_logger(&LOGGER);
    log::set_max_level(level);
}

pub fn set_level(level: log::LevelFilter) {
    log::set_max_level(level);
}
