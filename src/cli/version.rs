//! `haptic version`.

use super::CommandResult;

pub(super) const VERSION: &str = env!("CARGO_PKG_VERSION");

pub(super) fn build_info() -> String {
    format!(
        "haptic {VERSION} (commit {}, target {}, profile {})",
        env!("HAPTIC_GIT_COMMIT"),
        env!("HAPTIC_TARGET"),
        env!("HAPTIC_PROFILE")
    )
}

pub(super) fn run(args: &[String]) -> CommandResult {
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("Print version and build information.\n\nUsage: haptic version");
        return Ok(());
    }
    if let Some(extra) = args.first() {
        return Err(format!("version takes no arguments, got {extra:?}").into());
    }
    println!("{}", build_info());
    Ok(())
}
