//! What the API server does to an object between the request body and the store: metadata
//! defaults on create (uid, creationTimestamp, generation, generateName), the carry-over rules on
//! update (immutable metadata, status owned by the `/status` subresource, generation bumped when
//! anything but metadata and status changes), and name validation.

use serde_json::{json, Map, Value};

use crate::registry::ResourceType;
use crate::status::ApiError;
use crate::util::{name_suffix, new_uid, now_rfc3339};

/// Parses a request body as JSON, or YAML when the content type says so.
pub fn parse_body(body: &[u8], content_type: Option<&str>) -> Result<Value, ApiError> {
    if content_type.is_some_and(|c| c.contains("protobuf")) {
        return crate::protobuf::decode(body).map_err(|e| {
            ApiError::new(
                415,
                "UnsupportedMediaType",
                format!("protobuf request body: {e}"),
            )
        });
    }
    if content_type.is_some_and(|c| c.contains("cbor")) {
        return Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: \
                 application/json, application/yaml (got {})",
                content_type.unwrap_or("")
            ),
        ));
    }
    let yaml = content_type.is_some_and(|c| c.contains("yaml"));
    let parsed: Result<Value, String> = if yaml {
        serde_yaml::from_slice(body).map_err(|e| e.to_string())
    } else {
        serde_json::from_slice(body).map_err(|e| e.to_string())
    };
    parsed.map_err(|e| ApiError::bad_request(format!("error decoding request body: {e}")))
}

fn metadata_mut(obj: &mut Value) -> Result<&mut Map<String, Value>, ApiError> {
    let map = obj
        .as_object_mut()
        .ok_or_else(|| ApiError::bad_request("the request body must be a JSON object"))?;
    let meta = map.entry("metadata").or_insert_with(|| json!({}));
    if !meta.is_object() {
        *meta = json!({});
    }
    meta.as_object_mut()
        .ok_or_else(|| ApiError::internal("metadata is not an object"))
}

/// Checks `kind` and `apiVersion` of a body against the endpoint it was sent to, and fills them.
fn check_type(rt: &ResourceType, version: &str, obj: &mut Value) -> Result<(), ApiError> {
    let api_version = rt.api_version(version);
    if let Some(kind) = obj.get("kind").and_then(Value::as_str) {
        if kind != rt.kind {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({kind}) does not match the expected kind ({})",
                rt.kind
            )));
        }
    }
    if let Some(av) = obj.get("apiVersion").and_then(Value::as_str) {
        if av != api_version {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({av}) does not match the expected API version ({api_version})"
            )));
        }
    }
    if let Some(map) = obj.as_object_mut() {
        map.insert("kind".into(), Value::String(rt.kind.clone()));
        map.insert("apiVersion".into(), Value::String(api_version));
    }
    Ok(())
}

const SUBDOMAIN_HELP: &str = "a lowercase RFC 1123 subdomain must consist of lower case \
alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character \
(e.g. 'example.com', regex used for validation is \
'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

const LABEL_HELP: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric \
characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or \
'123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

/// Why `name` is not a valid object name for this type, if it is not.
fn name_problem(rt: &ResourceType, name: &str) -> Option<String> {
    let label = |s: &str| {
        !s.is_empty()
            && s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !s.starts_with('-')
            && !s.ends_with('-')
    };
    let is_namespace = rt.group.is_empty() && rt.plural == "namespaces";
    if is_namespace {
        return (!label(name)).then(|| format!("Invalid value: {name:?}: {LABEL_HELP}"));
    }
    let ok = name.len() <= 253 && name.split('.').all(label);
    // CRD objects are validated as subdomains too; custom resources in Kubernetes use the
    // same rule, so one check serves every type here.
    (!ok).then(|| format!("Invalid value: {name:?}: {SUBDOMAIN_HELP}"))
}

/// Fills a new object's server-side metadata. Returns its name.
pub fn prepare_create(
    rt: &ResourceType,
    version: &str,
    namespace: &str,
    obj: &mut Value,
) -> Result<String, ApiError> {
    check_type(rt, version, obj)?;
    let meta = metadata_mut(obj)?;
    let mut name = meta
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if name.is_empty() {
        match meta.get("generateName").and_then(Value::as_str) {
            Some(prefix) if !prefix.is_empty() => name = format!("{prefix}{}", name_suffix()),
            _ => {
                return Err(ApiError::invalid(
                    &rt.group,
                    &rt.kind,
                    "",
                    "metadata.name",
                    "Required value: name or generateName is required",
                ))
            }
        }
    }
    if let Some(problem) = name_problem(rt, &name) {
        return Err(ApiError::invalid(
            &rt.group,
            &rt.kind,
            &name,
            "metadata.name",
            &problem,
        ));
    }
    if rt.namespaced {
        match meta.get("namespace").and_then(Value::as_str) {
            Some(ns) if !ns.is_empty() && ns != namespace => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ))
            }
            _ => {}
        }
        meta.insert("namespace".into(), Value::String(namespace.to_string()));
    } else {
        meta.remove("namespace");
    }
    meta.insert("name".into(), Value::String(name.clone()));
    meta.insert("uid".into(), Value::String(new_uid()));
    meta.insert("creationTimestamp".into(), Value::String(now_rfc3339()));
    meta.insert("generation".into(), json!(1));
    for gone in [
        "resourceVersion",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "selfLink",
    ] {
        meta.remove(gone);
    }
    if rt.status_subresource {
        if let Some(map) = obj.as_object_mut() {
            map.remove("status");
        }
    }
    if rt.group.is_empty() && rt.plural == "namespaces" {
        obj["status"] = json!({"phase": "Active"});
        if obj["spec"]["finalizers"].is_null() {
            obj["spec"] = json!({"finalizers": ["kubernetes"]});
        }
    }
    Ok(name)
}

/// The object a write to an existing one produces. `status_only` is a write to `/status`.
pub fn prepare_update(
    rt: &ResourceType,
    version: &str,
    current: &Value,
    mut new: Value,
    status_only: bool,
) -> Result<Value, ApiError> {
    check_type(rt, version, &mut new)?;
    let cur_name = current["metadata"]["name"].as_str().unwrap_or("");
    let new_name = new["metadata"]["name"].as_str().unwrap_or("");
    if !new_name.is_empty() && new_name != cur_name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({new_name}) does not match the name on the URL ({cur_name})"
        )));
    }
    let mut out = if status_only {
        let mut out = current.clone();
        match new.get("status") {
            Some(s) => out["status"] = s.clone(),
            None => {
                if let Some(map) = out.as_object_mut() {
                    map.remove("status");
                }
            }
        }
        out
    } else {
        let mut out = new;
        if rt.status_subresource {
            match current.get("status") {
                Some(s) => out["status"] = s.clone(),
                None => {
                    if let Some(map) = out.as_object_mut() {
                        map.remove("status");
                    }
                }
            }
        }
        let meta = metadata_mut(&mut out)?;
        for keep in [
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "generation",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
        ] {
            match current["metadata"].get(keep) {
                Some(v) => meta.insert(keep.into(), v.clone()),
                None => meta.remove(keep),
            };
        }
        out
    };
    out["apiVersion"] = Value::String(rt.api_version(version));
    if !status_only && spec_changed(rt, current, &out) {
        let generation = current["metadata"]["generation"].as_i64().unwrap_or(0) + 1;
        out["metadata"]["generation"] = json!(generation);
    }
    Ok(out)
}

/// Whether anything besides metadata (and status, when the subresource owns it) changed.
fn spec_changed(rt: &ResourceType, old: &Value, new: &Value) -> bool {
    let strip = |v: &Value| -> Value {
        let mut v = v.clone();
        if let Some(map) = v.as_object_mut() {
            map.remove("metadata");
            map.remove("apiVersion");
            map.remove("kind");
            if rt.status_subresource {
                map.remove("status");
            }
        }
        v
    };
    strip(old) != strip(new)
}

/// The status a stored CRD shows: names accepted and established at once.
pub fn crd_status(crd: &Value) -> Value {
    let now = now_rfc3339();
    let stored: Vec<Value> = crd["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["storage"].as_bool().unwrap_or(false))
        .filter_map(|v| v.get("name").cloned())
        .collect();
    json!({
        "acceptedNames": crd["spec"]["names"],
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
             "message": "no conflicts found", "lastTransitionTime": now},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
             "message": "the initial names have been accepted", "lastTransitionTime": now},
        ],
        "storedVersions": stored,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Registry;

    fn ingress_type() -> ResourceType {
        (*Registry::builtin()
            .find("networking.k8s.io", "v1", "ingresses")
            .unwrap())
        .clone()
    }

    #[test]
    fn create_fills_metadata_and_drops_status() {
        let rt = ingress_type();
        let mut obj = json!({"metadata": {"generateName": "web-"}, "spec": {}, "status": {"x": 1}});
        let name = prepare_create(&rt, "v1", "default", &mut obj).unwrap();
        assert!(name.starts_with("web-") && name.len() == 9);
        assert_eq!(obj["metadata"]["namespace"], "default");
        assert_eq!(obj["metadata"]["generation"], 1);
        assert_eq!(obj["kind"], "Ingress");
        assert!(obj.get("status").is_none());
        let mut bad = json!({"metadata": {"name": "Web"}});
        let err = prepare_create(&rt, "v1", "default", &mut bad).unwrap_err();
        assert_eq!(err.code, 422);
        assert!(err
            .message
            .starts_with("Ingress.networking.k8s.io \"Web\" is invalid: metadata.name"));
    }

    #[test]
    fn update_keeps_status_and_bumps_generation() {
        let rt = ingress_type();
        let mut cur = json!({"metadata": {"name": "a"}, "spec": {"x": 1}});
        prepare_create(&rt, "v1", "default", &mut cur).unwrap();
        cur["status"] = json!({"lb": 1});
        let new = json!({"metadata": {"name": "a", "labels": {"l": "1"}}, "spec": {"x": 1}, "status": {"lb": 2}});
        let out = prepare_update(&rt, "v1", &cur, new, false).unwrap();
        assert_eq!(out["status"]["lb"], 1);
        assert_eq!(out["metadata"]["generation"], 1);
        assert_eq!(out["metadata"]["uid"], cur["metadata"]["uid"]);
        let new = json!({"metadata": {"name": "a"}, "spec": {"x": 2}});
        assert_eq!(
            prepare_update(&rt, "v1", &cur, new, false).unwrap()["metadata"]["generation"],
            2
        );
        let new = json!({"metadata": {"name": "a"}, "spec": {"x": 9}, "status": {"lb": 3}});
        let out = prepare_update(&rt, "v1", &cur, new, true).unwrap();
        assert_eq!(out["spec"]["x"], 1);
        assert_eq!(out["status"]["lb"], 3);
        assert_eq!(out["metadata"]["generation"], 1);
    }
}
