//! Kubernetes API access: configuration ([`config`]), a blocking client for the verbs the
//! controller uses ([`client`]), list-watch reflectors that keep stores equal to the server
//! ([`reflector`]), and Lease leader election ([`lease`]).

pub mod client;
pub mod config;
pub mod lease;
pub mod reflector;
