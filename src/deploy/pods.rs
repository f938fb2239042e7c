//! HAProxy pod discovery: which pods of the `haproxy-pods` store may receive configuration.
//! A pod qualifies when it is Running, has an IP, is not terminating, and its agent container is
//! ready; it is then admitted once its agent answers `GET /v1/state`.

use crate::store::{Doc, NodeRef, Store};

/// The container whose readiness gates a pod (the agent sidecar).
pub(crate) const AGENT_CONTAINER: &str = "haptic-agent";

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct PodTarget {
    pub namespace: String,
    pub name: String,
    pub ip: String,
    /// The pod's uid and its containers' restart counts: another value under the same name
    /// and IP means a container restarted (HAProxy comes back on its bootstrap configuration),
    /// so what the pod runs must be asked again at once, not at the next drift check.
    pub incarnation: String,
}

/// Why a pod is not a target, for logs and `/debug/pods`.
pub(crate) fn disqualification(pod: &Doc) -> Option<String> {
    let pod = pod.root();
    if pod
        .pointer(&["metadata", "deletionTimestamp"])
        .is_some_and(|v| !v.is_null())
    {
        return Some("terminating".into());
    }
    let phase = pod
        .pointer(&["status", "phase"])
        .and_then(NodeRef::as_str)
        .unwrap_or("Unknown");
    if phase != "Running" {
        return Some(format!("phase {phase}"));
    }
    if pod
        .pointer(&["status", "podIP"])
        .and_then(NodeRef::as_str)
        .is_none_or(str::is_empty)
    {
        return Some("no pod IP".into());
    }
    let agent_ready = pod
        .pointer(&["status", "containerStatuses"])
        .and_then(|list| {
            list.items()
                .find(|c| c.get("name").and_then(NodeRef::as_str) == Some(AGENT_CONTAINER))
        })
        .and_then(|c| c.get("ready").and_then(NodeRef::as_bool));
    match agent_ready {
        Some(true) => None,
        Some(false) => Some(format!("container {AGENT_CONTAINER} not ready")),
        None => Some(format!("no status for container {AGENT_CONTAINER}")),
    }
}

/// The pods that may receive configuration now, in name order.
pub(crate) fn targets(pods: &Store) -> Vec<PodTarget> {
    pods.list()
        .filter(|p| disqualification(p).is_none())
        .filter_map(|p| {
            let p = p.root();
            let text = |path: &[&str]| Some(p.pointer(path)?.as_str()?.to_string());
            let restarts: Vec<String> = p
                .pointer(&["status", "containerStatuses"])
                .map(|list| {
                    list.items()
                        .map(|c| {
                            let name = c.get("name").and_then(NodeRef::as_str).unwrap_or("");
                            let n = c.get("restartCount").and_then(NodeRef::as_u64).unwrap_or(0);
                            format!("{name}={n}")
                        })
                        .collect()
                })
                .unwrap_or_default();
            Some(PodTarget {
                namespace: text(&["metadata", "namespace"])?,
                name: text(&["metadata", "name"])?,
                ip: text(&["status", "podIP"])?,
                incarnation: format!(
                    "{} {}",
                    text(&["metadata", "uid"]).unwrap_or_default(),
                    restarts.join(",")
                ),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, phase: &str, ip: &str, ready: bool) -> serde_json::Value {
        json!({"metadata": {"namespace": "ing", "name": name}, "status": {"phase": phase, "podIP": ip,
            "containerStatuses": [{"name": "haproxy", "ready": true}, {"name": AGENT_CONTAINER, "ready": ready}]}})
    }

    #[test]
    fn only_running_ready_pods_with_ips() {
        let mut store = Store::new(crate::render::pod_index());
        for (name, phase, ip, ready) in [
            ("a", "Running", "10.0.0.1", true),
            ("b", "Pending", "10.0.0.2", true),
            ("c", "Running", "", true),
            ("d", "Running", "10.0.0.4", false),
        ] {
            store.upsert_value(&pod(name, phase, ip, ready)).unwrap();
        }
        let mut e = pod("e", "Running", "10.0.0.5", true);
        e["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        store.upsert_value(&e).unwrap();
        let names: Vec<_> = targets(&store).into_iter().map(|t| t.name).collect();
        assert_eq!(names, ["a"]);
        assert_eq!(
            disqualification(&Doc::from_value(&pod("d", "Running", "1.2.3.4", false)).unwrap())
                .unwrap(),
            "container haptic-agent not ready"
        );
    }
}
