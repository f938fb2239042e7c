//! End to end: dev API server, two controller replicas, two HAProxy pods (real HAProxy and
//! `haptic-agent`), echo backends, real HTTP requests.

mod support;

use std::time::Duration;

use support::cluster::{Backend, Cluster};
use support::wait_for;

const DEADLINE: Duration = Duration::from_secs(30);

fn ingress(name: &str, host: &str, service: &str) -> String {
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: {name}, namespace: default}}\n\
         spec:\n  ingressClassName: haproxy\n  rules:\n  - host: {host}\n    http:\n      paths:\n      - path: /\n        pathType: Prefix\n        backend: {{service: {{name: {service}, port: {{number: 80}}}}}}\n"
    )
}

fn require_haproxy() {
    let ok = std::process::Command::new("haproxy")
        .arg("-v")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        ok,
        "haproxy is not installed: run scripts/test.sh (it installs it)"
    );
}

/// Two pods, two controllers, one Service with one backend, all synced.
fn running_cluster() -> (Cluster, Backend) {
    require_haproxy();
    let mut c = Cluster::start(&[]);
    c.apply_config(&c.config_object(""));
    c.add_pod();
    c.add_pod();
    c.start_controller("ctrl-a");
    c.start_controller("ctrl-b");
    let web = Backend::start("web-1");
    c.create_service("web", &[&web]);
    (c, web)
}

#[test]
fn ingress_routes_and_deletion_stops_routing() {
    let (c, _web) = running_cluster();
    let (ok, out) = c.kubectl(
        &["apply", "--validate=false", "-f", "-"],
        Some(&ingress("web", "web.example.com", "web")),
    );
    assert!(ok, "{out}");
    c.wait_route("web.example.com", "/", 200, "web-1", DEADLINE);
    let (ok, out) = c.kubectl(&["delete", "ingress", "web"], None);
    assert!(ok, "{out}");
    c.wait_route("web.example.com", "/", 404, "", DEADLINE);
    wait_for("a leader", DEADLINE, || c.lease_holder().is_some());
}
