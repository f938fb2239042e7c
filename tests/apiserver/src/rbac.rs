//! RBAC authorization (`--authorization-mode RBAC`), as kube-apiserver's authorizer decides a
//! resource request from the stored Roles, ClusterRoles and their bindings: a request is
//! allowed when a rule of a role bound to the user (or one of its groups, or its service
//! account) names its verb, API group and resource (`resource/subresource` for a subresource)
//! and, when the rule lists `resourceNames`, the object's name. A ClusterRoleBinding grants in
//! every namespace and at the cluster scope, a RoleBinding in its own namespace only. Members of
//! `system:masters` may do everything. Not modelled: aggregated ClusterRoles, `escalate`/`bind`
//! checks on RBAC writes, non-resource URLs (discovery stays open to every authenticated user).

use serde_json::Value;

use crate::auth::User;
use crate::status::ApiError;
use crate::storage::Store;

/// What a resource request asks for.
pub struct Attributes<'a> {
    pub verb: &'a str,
    pub group: &'a str,
    pub resource: &'a str,
    pub subresource: Option<&'a str>,
    /// `None` for cluster-scoped objects and requests across all namespaces.
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
}

const RBAC: &str = "rbac.authorization.k8s.io";

/// Ok when RBAC allows the request; `403 Forbidden` with Kubernetes' message otherwise.
pub fn authorize(store: &Store, user: &User, a: &Attributes) -> Result<(), ApiError> {
    if user.groups.iter().any(|g| g == "system:masters") || allowed(store, user, a) {
        return Ok(());
    }
    let resource = match a.subresource {
        Some(sub) => format!("{}/{sub}", a.resource),
        None => a.resource.to_string(),
    };
    let object = match (a.group, a.name) {
        ("", Some(n)) => format!("{} \"{n}\"", a.resource),
        ("", None) => a.resource.to_string(),
        (g, Some(n)) => format!("{}.{g} \"{n}\"", a.resource),
        (g, None) => format!("{}.{g}", a.resource),
    };
    let scope = match a.namespace {
        Some(ns) => format!("in the namespace \"{ns}\""),
        None => "at the cluster scope".to_string(),
    };
    Err(ApiError::forbidden(
        a.group,
        a.resource,
        a.name.unwrap_or(""),
        format!(
            "{object} is forbidden: User \"{}\" cannot {} resource \"{resource}\" in API group \"{}\" {scope}",
            user.name, a.verb, a.group
        ),
    ))
}

fn allowed(store: &Store, user: &User, a: &Attributes) -> bool {
    let items = |resource: &str, namespace: Option<&str>| -> Vec<std::sync::Arc<Value>> {
        store
            .list(&format!("{resource}.{RBAC}"), namespace, None)
            .map(|(_, items)| items)
            .unwrap_or_default()
    };
    let role_rules = |kind: &str, name: &str, namespace: &str| -> Vec<Value> {
        let found = match kind {
            "ClusterRole" => store.get(&format!("clusterroles.{RBAC}"), "", name),
            "Role" => store.get(&format!("roles.{RBAC}"), namespace, name),
            _ => None,
        };
        found
            .and_then(|r| r["rules"].as_array().cloned())
            .unwrap_or_default()
    };
    let cluster_wide = items("clusterrolebindings", None)
        .into_iter()
        .flat_map(|b| {
            let rules = if binds(&b, user, "") {
                role_rules(
                    b["roleRef"]["kind"].as_str().unwrap_or(""),
                    b["roleRef"]["name"].as_str().unwrap_or(""),
                    "",
                )
            } else {
                Vec::new()
            };
            rules.into_iter()
        });
    let rules: Vec<Value> = match a.namespace {
        Some(ns) => cluster_wide
            .chain(items("rolebindings", Some(ns)).into_iter().flat_map(|b| {
                let rules = if binds(&b, user, ns) {
                    role_rules(
                        b["roleRef"]["kind"].as_str().unwrap_or(""),
                        b["roleRef"]["name"].as_str().unwrap_or(""),
                        ns,
                    )
                } else {
                    Vec::new()
                };
                rules.into_iter()
            }))
            .collect(),
        None => cluster_wide.collect(),
    };
    rules.iter().any(|rule| rule_allows(rule, a))
}

/// Whether a binding (in `namespace`, `""` for a ClusterRoleBinding) names the user, one of its
/// groups, or its service account.
fn binds(binding: &Value, user: &User, namespace: &str) -> bool {
    binding["subjects"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|s| {
            let name = s["name"].as_str().unwrap_or("");
            match s["kind"].as_str() {
                Some("User") => name == user.name,
                Some("Group") => user.groups.iter().any(|g| g == name),
                Some("ServiceAccount") => {
                    let ns = s["namespace"].as_str().unwrap_or(namespace);
                    user.name == format!("system:serviceaccount:{ns}:{name}")
                }
                _ => false,
            }
        })
}

fn rule_allows(rule: &Value, a: &Attributes) -> bool {
    let list = |key: &str| -> Vec<&str> {
        rule[key]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect()
    };
    let verbs = list("verbs");
    let groups = list("apiGroups");
    let resources = list("resources");
    let names = list("resourceNames");
    let resource = match a.subresource {
        Some(sub) => format!("{}/{sub}", a.resource),
        None => a.resource.to_string(),
    };
    let resource_ok = resources.iter().any(|r| {
        *r == "*"
            || *r == resource
            || a.subresource.is_some_and(|sub| *r == format!("*/{sub}"))
            || a.subresource.is_some() && *r == format!("{}/*", a.resource)
    });
    (verbs.contains(&"*") || verbs.contains(&a.verb))
        && (groups.contains(&"*") || groups.contains(&a.group))
        && resource_ok
        && (names.is_empty() || a.name.is_some_and(|n| names.contains(&n)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn attrs<'a>(verb: &'a str, resource: &'a str, sub: Option<&'a str>) -> Attributes<'a> {
        Attributes {
            verb,
            group: "",
            resource,
            subresource: sub,
            namespace: Some("a"),
            name: Some("x"),
        }
    }

    #[test]
    fn rules_match_verb_group_resource_subresource_and_names() {
        let rule = json!({"apiGroups": [""], "resources": ["pods", "ingresses/status"], "verbs": ["get", "list"]});
        assert!(rule_allows(&rule, &attrs("get", "pods", None)));
        assert!(!rule_allows(&rule, &attrs("patch", "pods", None)));
        assert!(
            !rule_allows(&rule, &attrs("get", "pods", Some("status"))),
            "a subresource is named on its own"
        );
        assert!(rule_allows(
            &rule,
            &attrs("list", "ingresses", Some("status"))
        ));
        assert!(!rule_allows(&rule, &attrs("get", "ingresses", None)));
        let named =
            json!({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"], "resourceNames": ["y"]});
        assert!(!rule_allows(&named, &attrs("get", "pods", None)));
        let subresources = json!({"apiGroups": [""], "resources": ["pods/*"], "verbs": ["get"]});
        assert!(rule_allows(
            &subresources,
            &attrs("get", "pods", Some("log"))
        ));
        assert!(
            !rule_allows(&subresources, &attrs("get", "pods", None)),
            "pods/* is not pods"
        );
        let any = json!({"apiGroups": ["*"], "resources": ["*/status"], "verbs": ["patch"]});
        assert!(rule_allows(&any, &attrs("patch", "pods", Some("status"))));
        assert!(!rule_allows(&any, &attrs("patch", "pods", None)));
    }

    #[test]
    fn subjects_are_users_groups_and_service_accounts() {
        let user = User {
            name: "system:serviceaccount:ns1:ctrl".into(),
            groups: vec![
                "system:serviceaccounts".into(),
                "system:authenticated".into(),
            ],
        };
        let binding = |subject: Value| json!({"subjects": [subject]});
        assert!(binds(
            &binding(json!({"kind": "ServiceAccount", "name": "ctrl", "namespace": "ns1"})),
            &user,
            ""
        ));
        assert!(binds(
            &binding(json!({"kind": "ServiceAccount", "name": "ctrl"})),
            &user,
            "ns1"
        ));
        assert!(!binds(
            &binding(json!({"kind": "ServiceAccount", "name": "ctrl"})),
            &user,
            "ns2"
        ));
        assert!(binds(
            &binding(json!({"kind": "Group", "name": "system:serviceaccounts"})),
            &user,
            ""
        ));
        assert!(!binds(
            &binding(json!({"kind": "User", "name": "ctrl"})),
            &user,
            ""
        ));
    }
}
