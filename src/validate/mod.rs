//! Proving configurations: `haproxy -c` on rendered bundles ([`haproxy`]), fixtures for offline
//! renders ([`fixtures`]) and the embedded validation tests (`suite`).

pub mod fixtures;
pub mod haproxy;
pub(crate) mod isolate;
pub mod sandbox;
pub(crate) mod suite;
