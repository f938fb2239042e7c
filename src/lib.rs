//! HAPTIC, the HAProxy Template Ingress Controller.
//!
//! The library behind the `haptic` binary: configuration model ([`config`]), indexed stores
//! ([`store`]), template rendering ([`render`]), validation ([`validate`]), Kubernetes access
//! ([`kube`]) and the command line ([`cli`]). `src/main.rs` only dispatches to [`cli::main`].

#![warn(unreachable_pub)]

pub mod cli;
pub mod config;
pub mod controller;
pub(crate) mod deploy;
#[doc(hidden)]
pub mod fuzzing;
pub(crate) mod kinds;
pub mod kube;
pub mod logger;
pub(crate) mod metrics;
pub mod render;
pub(crate) mod serve;
pub mod store;
pub mod validate;

/// Locks a mutex whether or not another thread panicked while holding it. Release builds abort
/// on panic, so a poisoned lock is only ever seen in tests; the data is still consistent for
/// every use here (plain replacement of values).
pub fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The next number of a xorshift64 sequence (`state` must not start at 0): repeatable
/// pseudo-random choices for randomized tests.
#[cfg(test)]
pub(crate) fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// A hash seeded at random once per process, for values hashed once and looked up by that
/// hash later in the same process (never stored or sent anywhere): no one outside can choose
/// values that share a hash.
pub(crate) fn process_hash<T: std::hash::Hash + ?Sized>(value: &T) -> u64 {
    use std::hash::BuildHasher;
    static STATE: std::sync::OnceLock<foldhash::fast::RandomState> = std::sync::OnceLock::new();
    STATE.get_or_init(Default::default).hash_one(value)
}
