//! The controller's logging: the workspace's one logger (`haptic_agent::logging`, env_logger),
//! at the level from `LOG_LEVEL` unless `RUST_LOG` is set; `spec.logging.level` moves it at
//! run time.

pub use haptic_agent::logging::{parse_level, set_level};

/// Installs the logger at the level from `LOG_LEVEL` (default `default`).
pub fn init(default: log::LevelFilter) {
    let level = std::env::var("LOG_LEVEL")
        .ok()
        .and_then(|l| parse_level(&l))
        .unwrap_or(default);
    haptic_agent::logging::init(level);
}
