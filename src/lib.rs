//! HAPTIC, the HAProxy Template Ingress Controller.
//!
//! The library behind the `haptic` binary: configuration model ([`config`]), indexed stores
//! ([`store`]), template rendering ([`render`]), validation ([`validate`]), Kubernetes access
//! ([`kube`]) and the command line ([`cli`]). `src/main.rs` only dispatches to [`cli::main`].

pub mod cli;
pub mod config;
pub mod controller;
pub mod deploy;
pub mod kinds;
pub mod kube;
pub mod logger;
pub mod metrics;
pub mod render;
pub mod serve;
pub mod store;
pub mod validate;
