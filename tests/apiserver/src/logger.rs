//! The workspace's one logger (`haptic_agent::logging`: env_logger, one format, `RUST_LOG`).

use log::LevelFilter;

/// Installs the logger at `level` (or `RUST_LOG`). A second call keeps the first logger.
pub fn init(level: LevelFilter) {
    haptic_agent::logging::init(level);
}
