//! Legacy (unaggregated) discovery documents: `/api`, `/api/v1`, `/apis`, `/apis/GROUP` and
//! `/apis/GROUP/VERSION`, built from the registry so CRD-defined types appear as soon as their
//! CRD is stored. Clients asking for aggregated discovery get these documents with a plain
//! `application/json` content type, which client-go and kubectl accept as the fallback.

use serde_json::{json, Value};

use crate::registry::{Registry, ResourceType};

const VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// The document for a discovery path, or `None` when the path is not a discovery path.
pub fn document(registry: &Registry, path: &str, server_address: &str) -> Option<Value> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segments.as_slice() {
        ["api"] => Some(json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
        })),
        ["api", "v1"] => Some(resource_list(registry, "", "v1")),
        ["apis"] => Some(json!({
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": registry.groups().iter().map(|(g, vs)| group(g, vs)).collect::<Vec<_>>(),
        })),
        ["apis", g] => registry
            .groups()
            .into_iter()
            .find(|(name, _)| name == g)
            .map(|(name, vs)| {
                let mut doc = group(&name, &vs);
                doc["kind"] = json!("APIGroup");
                doc["apiVersion"] = json!("v1");
                doc
            }),
        ["apis", g, v] => {
            let served = registry
                .all()
                .iter()
                .any(|t| t.group == *g && t.versions.iter().any(|x| x == v));
            served.then(|| resource_list(registry, g, v))
        }
        _ => None,
    }
}

fn group(name: &str, versions: &[String]) -> Value {
    let entries: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
        .collect();
    json!({
        "name": name,
        "versions": entries,
        "preferredVersion": entries.first().cloned().unwrap_or(Value::Null),
    })
}

fn resource_list(registry: &Registry, group: &str, version: &str) -> Value {
    let mut resources = Vec::new();
    for t in registry
        .all()
        .iter()
        .filter(|t| t.group == group && t.versions.iter().any(|v| v == version))
    {
        resources.push(resource(t));
        if t.status_subresource {
            resources.push(json!({
                "name": format!("{}/status", t.plural),
                "singularName": "",
                "namespaced": t.namespaced,
                "kind": t.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
    }
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    })
}

fn resource(t: &ResourceType) -> Value {
    let mut r = json!({
        "name": t.plural,
        "singularName": t.singular,
        "namespaced": t.namespaced,
        "kind": t.kind,
        "verbs": VERBS,
    });
    if !t.short_names.is_empty() {
        r["shortNames"] = json!(t.short_names);
    }
    if !t.categories.is_empty() {
        r["categories"] = json!(t.categories);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents() {
        let reg = Registry::builtin();
        let core = document(&reg, "/api/v1", "x").unwrap();
        let names: Vec<&str> = core["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert!(names.contains(&"services") && names.contains(&"services/status"));
        let groups = document(&reg, "/apis", "x").unwrap();
        assert!(groups["groups"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["name"] == "networking.k8s.io"));
        assert!(document(&reg, "/apis/networking.k8s.io/v2", "x").is_none());
        assert_eq!(
            document(&reg, "/apis/networking.k8s.io", "x").unwrap()["kind"],
            "APIGroup"
        );
    }
}
