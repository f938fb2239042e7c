//! `haptic`: parse the command line and dispatch; all logic lives in the library.

fn main() -> std::process::ExitCode {
    haptic::cli::main(std::env::args().skip(1).collect())
}
