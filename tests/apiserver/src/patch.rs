//! PATCH bodies: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and the subset of
//! Kubernetes strategic merge patch that `kubectl apply` and `kubectl patch` produce for the
//! built-in kinds this server serves.
//!
//! Strategic merge support: maps merge recursively and `null` deletes a key; the directives
//! `$patch: replace|delete|merge`, `$retainKeys`, `$setElementOrder/<field>` and
//! `$deleteFromPrimitiveList/<field>` are honoured. Lists merge by their Kubernetes patch merge
//! key where this server knows one (see [`merge_key`]): `name` for containers, initContainers,
//! ephemeralContainers, env, volumes, imagePullSecrets; `containerPort` for container ports,
//! `port` for Service `spec.ports`; `mountPath` for volumeMounts; `type` for conditions; `uid`
//! for ownerReferences; `name` for webhook configurations' `webhooks`; `metadata.finalizers`
//! merge as a set. Every other list is replaced as a whole,
//! which is what Kubernetes does for lists without a patch strategy (Ingress rules, EndpointSlice
//! endpoints and ports, tolerations). Custom resources get JSON merge patch, as in Kubernetes.

use serde_json::{Map, Value};

/// How a list field merges under strategic merge patch.
#[derive(Debug, PartialEq)]
enum ListMerge {
    /// Replace the whole list.
    Atomic,
    /// Merge objects that share this key's value.
    Key(&'static str),
    /// Union of scalar values.
    Set,
}

/// The merge strategy for list `field` found under `parent` (dot-joined path of map keys).
fn merge_key(parent: &str, field: &str) -> ListMerge {
    let last_parent = parent.rsplit('.').next().unwrap_or("");
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "imagePullSecrets" => ListMerge::Key("name"),
        "ports"
            if matches!(
                last_parent,
                "containers" | "initContainers" | "ephemeralContainers"
            ) =>
        {
            ListMerge::Key("containerPort")
        }
        "ports" if parent == "spec" => ListMerge::Key("port"),
        "volumeMounts" => ListMerge::Key("mountPath"),
        "volumeDevices" => ListMerge::Key("devicePath"),
        "conditions" => ListMerge::Key("type"),
        "ownerReferences" => ListMerge::Key("uid"),
        "hostAliases" => ListMerge::Key("ip"),
        "webhooks" => ListMerge::Key("name"),
        "finalizers" if last_parent == "metadata" => ListMerge::Set,
        _ => ListMerge::Atomic,
    }
}

/// RFC 7386 JSON merge patch.
pub fn merge_patch(target: &Value, patch: &Value) -> Value {
    match patch {
        Value::Object(p) => {
            let mut out = match target {
                Value::Object(t) => t.clone(),
                _ => Map::new(),
            };
            for (k, v) in p {
                if v.is_null() {
                    out.remove(k);
                } else {
                    let merged = merge_patch(out.get(k).unwrap_or(&Value::Null), v);
                    out.insert(k.clone(), merged);
                }
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}

/// Kubernetes strategic merge patch (the subset described in the module documentation).
pub fn strategic_merge_patch(target: &Value, patch: &Value) -> Result<Value, String> {
    Ok(smp_map(target, patch, "")?.unwrap_or(Value::Object(Map::new())))
}

/// Merges a patch map into a target; `None` means the map itself is deleted (`$patch: delete`).
fn smp_map(target: &Value, patch: &Value, path: &str) -> Result<Option<Value>, String> {
    let Some(p) = patch.as_object() else {
        return Ok(Some(patch.clone()));
    };
    match p.get("$patch").and_then(Value::as_str) {
        Some("delete") => return Ok(None),
        Some("replace") => return Ok(Some(strip_directives(patch))),
        Some("merge") | None => {}
        Some(other) => return Err(format!("unknown patch directive $patch: {other}")),
    }
    let mut out = match target {
        Value::Object(t) => t.clone(),
        _ => Map::new(),
    };
    let mut orders: Vec<(String, Vec<Value>)> = Vec::new();
    for (k, v) in p {
        if k == "$patch" || k == "$retainKeys" {
            continue;
        }
        if let Some(field) = k.strip_prefix("$setElementOrder/") {
            orders.push((field.to_string(), v.as_array().cloned().unwrap_or_default()));
            continue;
        }
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            let remove = v.as_array().cloned().unwrap_or_default();
            if let Some(Value::Array(list)) = out.get_mut(field) {
                list.retain(|x| !remove.contains(x));
            }
            continue;
        }
        let child_path = if path.is_empty() {
            k.clone()
        } else {
            format!("{path}.{k}")
        };
        match v {
            Value::Null => {
                out.remove(k);
            }
            Value::Object(_) => {
                let current = out.get(k).cloned().unwrap_or(Value::Null);
                match smp_map(&current, v, &child_path)? {
                    Some(merged) => out.insert(k.clone(), merged),
                    None => out.remove(k),
                };
            }
            Value::Array(items) => {
                let current = out
                    .get(k)
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                let merged = smp_list(&current, items, path, k, &child_path)?;
                out.insert(k.clone(), Value::Array(merged));
            }
            scalar => {
                out.insert(k.clone(), scalar.clone());
            }
        }
    }
    for (field, order) in orders {
        if let (Some(Value::Array(list)), ListMerge::Key(key)) =
            (out.get_mut(&field), merge_key(path, &field))
        {
            apply_order(list, &order, key);
        }
    }
    if let Some(keep) = p.get("$retainKeys").and_then(Value::as_array) {
        let keep: Vec<&str> = keep.iter().filter_map(Value::as_str).collect();
        out.retain(|k, _| keep.contains(&k.as_str()));
    }
    Ok(Some(Value::Object(out)))
}

fn smp_list(
    current: &[Value],
    patch: &[Value],
    parent: &str,
    field: &str,
    path: &str,
) -> Result<Vec<Value>, String> {
    if patch
        .iter()
        .any(|i| i.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        return Ok(patch
            .iter()
            .filter(|i| i.get("$patch").is_none())
            .map(strip_directives)
            .collect());
    }
    match merge_key(parent, field) {
        ListMerge::Atomic => Ok(patch.iter().map(strip_directives).collect()),
        ListMerge::Set => {
            let mut out = current.to_vec();
            for item in patch {
                if !out.contains(item) {
                    out.push(item.clone());
                }
            }
            Ok(out)
        }
        ListMerge::Key(key) => {
            let mut out = current.to_vec();
            for item in patch {
                let Some(id) = item.get(key) else {
                    return Err(format!(
                        "{path}: map in list does not contain the merge key {key:?}"
                    ));
                };
                let pos = out.iter().position(|x| x.get(key) == Some(id));
                let deleting = item.get("$patch").and_then(Value::as_str) == Some("delete");
                match (pos, deleting) {
                    (Some(i), true) => {
                        out.remove(i);
                    }
                    (None, true) => {}
                    (Some(i), false) => match smp_map(&out[i], item, path)? {
                        Some(merged) => out[i] = merged,
                        None => {
                            out.remove(i);
                        }
                    },
                    (None, false) => {
                        if let Some(merged) = smp_map(&Value::Null, item, path)? {
                            out.push(merged);
                        }
                    }
                }
            }
            Ok(out)
        }
    }
}

/// Orders `list` as `$setElementOrder` asks; items it does not name keep their place at the end.
fn apply_order(list: &mut [Value], order: &[Value], key: &str) {
    let rank = |v: &Value| {
        order
            .iter()
            .position(|o| o.get(key).is_some() && o.get(key) == v.get(key))
            .unwrap_or(usize::MAX)
    };
    list.sort_by_key(rank);
}

fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

/// RFC 6902 JSON patch.
pub fn json_patch(target: &Value, ops: &Value) -> Result<Value, String> {
    let ops = ops
        .as_array()
        .ok_or("a JSON patch must be an array of operations")?;
    let mut doc = target.clone();
    for op in ops {
        let name = op["op"]
            .as_str()
            .ok_or("JSON patch operation without \"op\"")?;
        let path = op["path"]
            .as_str()
            .ok_or("JSON patch operation without \"path\"")?;
        match name {
            "add" => pointer_add(&mut doc, path, op["value"].clone())?,
            "remove" => {
                pointer_remove(&mut doc, path)?;
            }
            "replace" => {
                pointer_remove(&mut doc, path)?;
                pointer_add(&mut doc, path, op["value"].clone())?;
            }
            "move" | "copy" => {
                let from = op["from"].as_str().ok_or("move/copy without \"from\"")?;
                let value = if name == "move" {
                    pointer_remove(&mut doc, from)?
                } else {
                    doc.pointer(from)
                        .cloned()
                        .ok_or_else(|| format!("path {from} not found"))?
                };
                pointer_add(&mut doc, path, value)?;
            }
            "test" => {
                if doc.pointer(path) != Some(&op["value"]) {
                    return Err(format!("test operation failed at {path}"));
                }
            }
            other => return Err(format!("unknown JSON patch operation {other:?}")),
        }
    }
    Ok(doc)
}

fn split_pointer(path: &str) -> Result<(String, String), String> {
    let idx = path
        .rfind('/')
        .ok_or_else(|| format!("invalid JSON pointer {path:?}"))?;
    let last = path[idx + 1..].replace("~1", "/").replace("~0", "~");
    Ok((path[..idx].to_string(), last))
}

fn pointer_add(doc: &mut Value, path: &str, value: Value) -> Result<(), String> {
    if path.is_empty() {
        *doc = value;
        return Ok(());
    }
    let (parent, last) = split_pointer(path)?;
    match doc.pointer_mut(&parent) {
        Some(Value::Object(m)) => {
            m.insert(last, value);
            Ok(())
        }
        Some(Value::Array(a)) => {
            let idx = if last == "-" {
                a.len()
            } else {
                last.parse::<usize>()
                    .map_err(|_| format!("bad array index in {path}"))?
            };
            if idx > a.len() {
                return Err(format!("array index out of range in {path}"));
            }
            a.insert(idx, value);
            Ok(())
        }
        _ => Err(format!("path {parent} not found")),
    }
}

fn pointer_remove(doc: &mut Value, path: &str) -> Result<Value, String> {
    let (parent, last) = split_pointer(path)?;
    match doc.pointer_mut(&parent) {
        Some(Value::Object(m)) => m
            .remove(&last)
            .ok_or_else(|| format!("path {path} not found")),
        Some(Value::Array(a)) => {
            let idx: usize = last
                .parse()
                .map_err(|_| format!("bad array index in {path}"))?;
            if idx < a.len() {
                Ok(a.remove(idx))
            } else {
                Err(format!("path {path} not found"))
            }
        }
        _ => Err(format!("path {path} not found")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_deletes_and_replaces() {
        let t = json!({"a": 1, "b": {"c": 2, "d": 3}, "l": [1, 2]});
        let p = json!({"a": null, "b": {"c": 5}, "l": [3]});
        assert_eq!(
            merge_patch(&t, &p),
            json!({"b": {"c": 5, "d": 3}, "l": [3]})
        );
    }

    #[test]
    fn smp_merges_containers_by_name_and_deletes() {
        let t = json!({"spec": {"containers": [
            {"name": "a", "image": "a:1", "env": [{"name": "X", "value": "1"}]},
            {"name": "b", "image": "b:1"}]}});
        let p = json!({"spec": {
            "$setElementOrder/containers": [{"name": "b"}, {"name": "a"}],
            "containers": [
                {"name": "a", "env": [{"name": "Y", "value": "2"}]},
                {"name": "b", "$patch": "delete"}]}});
        let out = strategic_merge_patch(&t, &p).unwrap();
        assert_eq!(
            out,
            json!({"spec": {"containers": [{"name": "a", "image": "a:1",
                "env": [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}]}]}})
        );
    }

    #[test]
    fn smp_service_ports_and_atomic_lists() {
        let t = json!({"spec": {"ports": [{"port": 80, "name": "http"}], "rules": [{"host": "a"}]},
                       "metadata": {"finalizers": ["x"]}});
        let p = json!({"spec": {"ports": [{"port": 80, "targetPort": 8080}, {"port": 443}],
                                "rules": [{"host": "b"}]},
                       "metadata": {"finalizers": ["y"], "$deleteFromPrimitiveList/finalizers": ["x"]}});
        let out = strategic_merge_patch(&t, &p).unwrap();
        assert_eq!(
            out["spec"]["ports"],
            json!([{"port": 80, "name": "http", "targetPort": 8080}, {"port": 443}])
        );
        assert_eq!(out["spec"]["rules"], json!([{"host": "b"}]));
        assert_eq!(out["metadata"]["finalizers"], json!(["y"]));
    }

    #[test]
    fn smp_replace_directive_and_retain_keys() {
        let t = json!({"data": {"a": "1", "b": "2"}, "s": {"x": 1, "y": 2}});
        let p =
            json!({"data": {"$patch": "replace", "c": "3"}, "s": {"$retainKeys": ["x"], "x": 5}});
        let out = strategic_merge_patch(&t, &p).unwrap();
        assert_eq!(out, json!({"data": {"c": "3"}, "s": {"x": 5}}));
    }

    #[test]
    fn json_patch_operations() {
        let t = json!({"a": [1, 2], "b": {"c": 1}});
        let ops = json!([
            {"op": "add", "path": "/a/-", "value": 3},
            {"op": "replace", "path": "/b/c", "value": 2},
            {"op": "test", "path": "/b/c", "value": 2},
            {"op": "move", "from": "/b/c", "path": "/d"},
            {"op": "remove", "path": "/a/0"}]);
        assert_eq!(
            json_patch(&t, &ops).unwrap(),
            json!({"a": [2, 3], "b": {}, "d": 2})
        );
        assert!(json_patch(&t, &json!([{"op": "remove", "path": "/zz"}])).is_err());
    }
}
