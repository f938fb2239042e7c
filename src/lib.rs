//! HAPTIC, the HAProxy Template Ingress Controller.
//!
//! The library behind the `haptic` binary: configuration model, stores, template rendering,
//! validation, Kubernetes access and the controller's threads. `src/main.rs` only parses the
//! command line and dispatches to [`cli`].

pub mod kube;
