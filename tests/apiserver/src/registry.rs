//! Which resource types exist: the built-in kinds the project uses plus every type defined by a
//! stored CustomResourceDefinition. Discovery documents and URL routing both read from here.

use std::sync::Arc;

use serde_json::Value;

/// One servable resource type (a group and plural, served at one or more versions).
#[derive(Clone, Debug, PartialEq)]
pub struct ResourceType {
    /// `""` for the core group.
    pub group: String,
    /// Served versions, preferred (storage) version first.
    pub versions: Vec<String>,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    /// Has a `/status` subresource: main-resource writes keep the stored status.
    pub status_subresource: bool,
    /// Compiled into the server (as opposed to defined by a CRD).
    pub builtin: bool,
}

impl ResourceType {
    /// The storage key prefix: `ingresses.networking.k8s.io`, or `services` for the core group.
    pub fn group_resource(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    pub fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_string()
        } else {
            format!("{}/{version}", self.group)
        }
    }

    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }
}

/// All known resource types.
#[derive(Clone, Debug)]
pub struct Registry {
    types: Vec<Arc<ResourceType>>,
}

/// (group, version, plural, kind, namespaced, short names, status subresource)
type Builtin = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    bool,
    &'static [&'static str],
    bool,
);

const BUILTINS: &[Builtin] = &[
    ("", "v1", "namespaces", "Namespace", false, &["ns"], true),
    ("", "v1", "pods", "Pod", true, &["po"], true),
    ("", "v1", "services", "Service", true, &["svc"], true),
    ("", "v1", "secrets", "Secret", true, &[], false),
    ("", "v1", "configmaps", "ConfigMap", true, &["cm"], false),
    ("", "v1", "events", "Event", true, &["ev"], false),
    ("", "v1", "endpoints", "Endpoints", true, &["ep"], false),
    (
        "",
        "v1",
        "serviceaccounts",
        "ServiceAccount",
        true,
        &["sa"],
        false,
    ),
    (
        "discovery.k8s.io",
        "v1",
        "endpointslices",
        "EndpointSlice",
        true,
        &[],
        false,
    ),
    (
        "networking.k8s.io",
        "v1",
        "ingresses",
        "Ingress",
        true,
        &["ing"],
        true,
    ),
    (
        "networking.k8s.io",
        "v1",
        "ingressclasses",
        "IngressClass",
        false,
        &[],
        false,
    ),
    (
        "coordination.k8s.io",
        "v1",
        "leases",
        "Lease",
        true,
        &[],
        false,
    ),
    (
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        false,
        &["crd", "crds"],
        true,
    ),
    (
        "admissionregistration.k8s.io",
        "v1",
        "validatingwebhookconfigurations",
        "ValidatingWebhookConfiguration",
        false,
        &[],
        false,
    ),
    // What the Helm chart installs (the chart test applies it here).
    (
        "apps",
        "v1",
        "deployments",
        "Deployment",
        true,
        &["deploy"],
        true,
    ),
    ("apps", "v1", "daemonsets", "DaemonSet", true, &["ds"], true),
    (
        "autoscaling",
        "v2",
        "horizontalpodautoscalers",
        "HorizontalPodAutoscaler",
        true,
        &["hpa"],
        true,
    ),
    (
        "policy",
        "v1",
        "poddisruptionbudgets",
        "PodDisruptionBudget",
        true,
        &["pdb"],
        true,
    ),
    (
        "networking.k8s.io",
        "v1",
        "networkpolicies",
        "NetworkPolicy",
        true,
        &["netpol"],
        false,
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "clusterroles",
        "ClusterRole",
        false,
        &[],
        false,
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "ClusterRoleBinding",
        false,
        &[],
        false,
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "roles",
        "Role",
        true,
        &[],
        false,
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "rolebindings",
        "RoleBinding",
        true,
        &[],
        false,
    ),
];

impl Registry {
    /// The built-in kinds only.
    pub fn builtin() -> Registry {
        let types = BUILTINS
            .iter()
            .map(
                |(group, version, plural, kind, namespaced, short, status)| {
                    let categories = if matches!(
                        *plural,
                        "pods"
                            | "services"
                            | "deployments"
                            | "daemonsets"
                            | "horizontalpodautoscalers"
                    ) {
                        vec!["all".to_string()]
                    } else {
                        vec![]
                    };
                    Arc::new(ResourceType {
                        group: group.to_string(),
                        versions: vec![version.to_string()],
                        plural: plural.to_string(),
                        singular: kind.to_ascii_lowercase(),
                        kind: kind.to_string(),
                        namespaced: *namespaced,
                        short_names: short.iter().map(|s| s.to_string()).collect(),
                        categories,
                        status_subresource: *status,
                        builtin: true,
                    })
                },
            )
            .collect();
        Registry { types }
    }

    pub fn all(&self) -> &[Arc<ResourceType>] {
        &self.types
    }

    /// The type served at `group`/`version` under `plural`.
    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceType>> {
        self.types
            .iter()
            .find(|t| {
                t.group == group && t.plural == plural && t.versions.iter().any(|v| v == version)
            })
            .cloned()
    }

    /// The type stored under a group-resource key (`ingresses.networking.k8s.io`).
    pub fn find_group_resource(&self, group_resource: &str) -> Option<Arc<ResourceType>> {
        self.types
            .iter()
            .find(|t| t.group_resource() == group_resource)
            .cloned()
    }

    /// Groups in discovery order (core excluded) with their versions, preferred first.
    pub fn groups(&self) -> Vec<(String, Vec<String>)> {
        let mut out: Vec<(String, Vec<String>)> = Vec::new();
        for t in self.types.iter().filter(|t| !t.group.is_empty()) {
            match out.iter_mut().find(|(g, _)| *g == t.group) {
                Some((_, versions)) => {
                    for v in &t.versions {
                        if !versions.contains(v) {
                            versions.push(v.clone());
                        }
                    }
                }
                None => out.push((t.group.clone(), t.versions.clone())),
            }
        }
        out
    }

    /// Adds or replaces the type a CRD defines. Built-in types cannot be replaced.
    pub fn apply_crd(&mut self, crd: &Value) -> Result<Arc<ResourceType>, String> {
        let t = Arc::new(crd_type(crd)?);
        if let Some(pos) = self
            .types
            .iter()
            .position(|x| x.group_resource() == t.group_resource())
        {
            if BUILTINS.iter().any(|b| b.0 == t.group && b.2 == t.plural) {
                return Err(format!("{} is a built-in resource", t.group_resource()));
            }
            self.types[pos] = t.clone();
        } else {
            self.types.push(t.clone());
        }
        Ok(t)
    }

    /// Removes the type a deleted CRD defined.
    pub fn remove_crd(&mut self, group_resource: &str) {
        let builtin = BUILTINS.iter().any(|b| {
            (if b.0.is_empty() {
                b.2.to_string()
            } else {
                format!("{}.{}", b.2, b.0)
            }) == group_resource
        });
        if !builtin {
            self.types.retain(|t| t.group_resource() != group_resource);
        }
    }
}

/// Reads the served type out of an `apiextensions.k8s.io/v1` CustomResourceDefinition.
pub fn crd_type(crd: &Value) -> Result<ResourceType, String> {
    let spec = &crd["spec"];
    let text = |v: &Value, what: &str| -> Result<String, String> {
        v.as_str()
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .ok_or_else(|| format!("spec.{what}: Required value"))
    };
    let group = text(&spec["group"], "group")?;
    let names = &spec["names"];
    let plural = text(&names["plural"], "names.plural")?;
    let kind = text(&names["kind"], "names.kind")?;
    let singular = names["singular"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| kind.to_ascii_lowercase());
    let list_strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let scope = spec["scope"].as_str().unwrap_or("Namespaced");
    let versions = spec["versions"]
        .as_array()
        .ok_or("spec.versions: Required value")?;
    // Storage version first (it is the preferred one in discovery), then the other served ones.
    let mut served: Vec<(bool, String, bool)> = versions
        .iter()
        .filter(|v| v["served"].as_bool().unwrap_or(false))
        .filter_map(|v| {
            let name = v["name"].as_str()?.to_string();
            let storage = v["storage"].as_bool().unwrap_or(false);
            let status = v["subresources"]["status"].is_object();
            Some((storage, name, status))
        })
        .collect();
    if served.is_empty() {
        return Err("spec.versions: Invalid value: must have at least one served version".into());
    }
    served.sort_by_key(|(storage, _, _)| !*storage);
    let status_subresource = served[0].2;
    if plural != plural.to_ascii_lowercase() {
        return Err("spec.names.plural: Invalid value: must be lowercase".into());
    }
    if crd["metadata"]["name"].as_str() != Some(&format!("{plural}.{group}")) {
        return Err(format!(
            "metadata.name: Invalid value: must be spec.names.plural+\".\"+spec.group ({plural}.{group})"
        ));
    }
    Ok(ResourceType {
        group,
        versions: served.into_iter().map(|(_, n, _)| n).collect(),
        plural,
        singular,
        kind,
        namespaced: scope != "Cluster",
        short_names: list_strings(&names["shortNames"]),
        categories: list_strings(&names["categories"]),
        status_subresource,
        builtin: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn chart_kinds_are_built_in() {
        let reg = Registry::builtin();
        for (group, plural, namespaced) in [
            ("apps", "deployments", true),
            ("apps", "daemonsets", true),
            ("policy", "poddisruptionbudgets", true),
            ("networking.k8s.io", "networkpolicies", true),
            ("rbac.authorization.k8s.io", "clusterroles", false),
            ("rbac.authorization.k8s.io", "clusterrolebindings", false),
            ("rbac.authorization.k8s.io", "roles", true),
            ("rbac.authorization.k8s.io", "rolebindings", true),
        ] {
            let t = reg.find(group, "v1", plural).expect(plural);
            assert_eq!(t.namespaced, namespaced, "{plural}");
        }
        assert!(
            reg.find("apps", "v1", "deployments")
                .unwrap()
                .status_subresource
        );
        let hpa = reg
            .find("autoscaling", "v2", "horizontalpodautoscalers")
            .expect("hpa");
        assert!(hpa.namespaced && hpa.status_subresource);
        assert_eq!(hpa.short_names, ["hpa"]);
    }

    #[test]
    fn crd_defines_a_type() {
        let crd = json!({
            "metadata": {"name": "widgets.example.com"},
            "spec": {"group": "example.com", "scope": "Cluster",
                "names": {"plural": "widgets", "kind": "Widget", "shortNames": ["wd"]},
                "versions": [
                    {"name": "v1alpha1", "served": true, "storage": false},
                    {"name": "v1", "served": true, "storage": true, "subresources": {"status": {}}},
                    {"name": "v0", "served": false, "storage": false}]}
        });
        let mut reg = Registry::builtin();
        let t = reg.apply_crd(&crd).unwrap();
        assert_eq!(t.versions, vec!["v1", "v1alpha1"]);
        assert!(!t.namespaced && t.status_subresource);
        assert_eq!(t.singular, "widget");
        assert!(reg.find("example.com", "v1alpha1", "widgets").is_some());
        assert!(reg.find("example.com", "v0", "widgets").is_none());
        reg.remove_crd("widgets.example.com");
        assert!(reg.find("example.com", "v1", "widgets").is_none());
    }
}
