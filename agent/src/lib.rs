//! HAPTIC agent library.
//!
//! The agent binary (`haptic-agent`) applies configuration bundles to the HAProxy beside it. This
//! library holds what the controller shares with it: the bundle and its canonical hash
//! ([`protocol`]), and small encoding helpers.

pub mod protocol;
