//! `--load DIR`: applies every manifest in a directory at start, through the same code path as
//! a client's create (so metadata, CRD registration and validation behave identically).
//! Files ending in `.yaml`, `.yml` or `.json` are read in name order; multi-document YAML and
//! `kind: List` are understood. Namespaces and CRDs go first; a missing namespace is created.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use serde::Deserialize;
use serde_json::{json, Value};

use crate::api;
use crate::http::Request;
use crate::server::{system_user, Ctx, Reply};

/// Loads the manifests; returns how many objects were created.
pub fn load_dir(ctx: &Ctx, dir: &Path) -> Result<usize, String> {
    let mut files: Vec<_> = fs::read_dir(dir)
        .map_err(|e| format!("read {}: {e}", dir.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.extension()
                .and_then(|x| x.to_str())
                .is_some_and(|x| matches!(x, "yaml" | "yml" | "json"))
        })
        .collect();
    files.sort();
    let mut docs = Vec::new();
    for file in &files {
        let text = fs::read_to_string(file).map_err(|e| format!("read {}: {e}", file.display()))?;
        for de in serde_yaml::Deserializer::from_str(&text) {
            let doc =
                Value::deserialize(de).map_err(|e| format!("parse {}: {e}", file.display()))?;
            flatten(doc, &mut docs);
        }
    }
    let rank = |d: &Value| match d["kind"].as_str() {
        Some("Namespace") => 0,
        Some("CustomResourceDefinition") => 1,
        _ => 2,
    };
    docs.sort_by_key(rank);
    let mut created = 0;
    for doc in docs {
        create(ctx, doc)?;
        created += 1;
    }
    Ok(created)
}

fn flatten(doc: Value, out: &mut Vec<Value>) {
    if doc.is_null() {
        return;
    }
    if doc["kind"].as_str().is_some_and(|k| k.ends_with("List")) && doc["items"].is_array() {
        for item in doc["items"].as_array().into_iter().flatten() {
            flatten(item.clone(), out);
        }
    } else {
        out.push(doc);
    }
}

fn post(ctx: &Ctx, path: String, body: &Value) -> Result<Reply, crate::status::ApiError> {
    let req = Request {
        method: "POST".into(),
        path,
        query: BTreeMap::new(),
        headers: BTreeMap::from([("content-type".to_string(), "application/json".to_string())]),
        body: body.to_string().into_bytes(),
    };
    api::handle(ctx, &req, &system_user())
}

fn create(ctx: &Ctx, doc: Value) -> Result<(), String> {
    let api_version = doc["apiVersion"].as_str().unwrap_or("");
    let kind = doc["kind"].as_str().unwrap_or("");
    let name = doc["metadata"]["name"].as_str().unwrap_or("");
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let rtype = ctx
        .store
        .registry()
        .all()
        .iter()
        .find(|t| t.group == group && t.kind == kind && t.versions.iter().any(|v| v == version))
        .cloned()
        .ok_or_else(|| format!("--load: no resource type for {api_version} {kind} ({name})"))?;
    let prefix = if group.is_empty() {
        "/api/v1".to_string()
    } else {
        format!("/apis/{group}/{version}")
    };
    let path = if rtype.namespaced {
        let ns = doc["metadata"]["namespace"].as_str().unwrap_or("default");
        if ctx.store.get("namespaces", "", ns).is_none() {
            let ns_obj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
            post(ctx, "/api/v1/namespaces".into(), &ns_obj)
                .map_err(|e| format!("--load: create namespace {ns}: {e}"))?;
        }
        format!("{prefix}/namespaces/{ns}/{}", rtype.plural)
    } else {
        format!("{prefix}/{}", rtype.plural)
    };
    post(ctx, path, &doc).map_err(|e| format!("--load: create {kind} {name}: {e}"))?;
    Ok(())
}
