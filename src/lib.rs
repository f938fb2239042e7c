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

/// Frees `value` on a background thread, so the caller does not wait for it. A render at
/// 10,000 Ingresses leaves behind the previous render's splicing index, the unit recordings it
/// replaced and its own shared state: hundreds of thousands of allocations, whose freeing took
/// about a tenth of a full render when done in line. Two values at most wait; a third blocks
/// the caller until one is freed, so memory never piles up behind the thread. If the thread
/// cannot start, values are freed in line.
pub fn drop_later<T: Send + 'static>(value: T) {
    type Garbage = Box<dyn Send>;
    static INBOX: std::sync::OnceLock<Option<crossbeam_channel::Sender<Garbage>>> =
        std::sync::OnceLock::new();
    let inbox = INBOX.get_or_init(|| {
        let (tx, rx) = crossbeam_channel::bounded::<Garbage>(2);
        std::thread::Builder::new()
            .name("drop".into())
            .spawn(move || rx.iter().for_each(drop))
            .ok()
            .map(|_| tx)
    });
    match inbox {
        Some(tx) => {
            if let Err(unsent) = tx.send(Box::new(value)) {
                drop(unsent.into_inner());
            }
        }
        None => drop(value),
    }
}
