//! Kubernetes API access. So far: where the API server is and how to authenticate
//! ([`config`]). The client, list-watch reflectors and Lease election are tracked in the
//! Kubernetes-access issue.

pub mod config;
