//! Kubernetes API access: client, list-watch reflectors, Lease election.
