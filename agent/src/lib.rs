//! HAPTIC agent library.
//!
//! The agent binary (`haptic-agent`) applies configuration bundles to the HAProxy beside it. This
//! library holds what the controller shares with it: the bundle, its canonical hash and the wire
//! types ([`protocol`]), the runtime/reload [`classify`]er with its configuration view
//! ([`haproxy_cfg`]), [`base64`], [`time`], [`logging`], and the HTTP pieces the controller's
//! webhook serves with ([`http`], [`accept`]). The modules after those are the agent itself.
//!
//! ```
//! use haptic_agent::classify::{classify, Classification};
//! use haptic_agent::protocol::Bundle;
//!
//! let old = Bundle::new("backend be\n  server SRV_1 10.0.0.1:80 enabled\n".to_string(), vec![]);
//! let new = Bundle::new("backend be\n  server SRV_1 10.0.0.2:80 enabled # moved\n".to_string(), vec![]);
//! let plan = classify(&old, &new);
//! assert_eq!(plan.commands(), ["set server be/SRV_1 addr 10.0.0.2 port 80"]);
//! assert!(matches!(plan, Classification::Runtime(_)));
//! ```

pub mod base64;
pub mod classify;
pub mod haproxy_cfg;
pub mod logging;
pub mod net;
pub mod protocol;
pub mod reload;
pub mod time;
// The small HTTP/1.1 reader and writer of the agent's API and bounded TLS accepting, also
// serving the controller's admission webhook.
pub mod accept;
pub mod http;

// The agent itself (used by the `haptic-agent` binary; public for its integration tests).
pub mod apply;
pub mod files;
#[doc(hidden)]
pub mod fuzzing;
pub mod haproxy;
mod recover;
pub mod runtime;
pub mod server;
pub mod state;
mod status;
pub mod tls;
