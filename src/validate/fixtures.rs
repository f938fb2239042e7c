//! Fixture objects → stores: for validation tests (keyed by watched-resource name) and for
//! `haptic render --fixtures` (Kubernetes manifests, placed by apiVersion and kind).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use serde_json::Value;

use crate::config::model::HAPROXY_PODS;
use crate::config::Spec;
use crate::kinds::{kind_of, plural_of};
use crate::store::selector::LabelSelector;
use crate::store::{ObjectFilter, Store};

/// Fixture objects by watched-resource name.
pub type Placement = BTreeMap<String, Vec<Value>>;

/// Builds one store per watched resource (plus `haproxy-pods`) from fixtures keyed by
/// watched-resource name. Objects go through the same selectors and ignored fields as live
/// objects; missing `apiVersion`/`kind` are filled in from the watched resource. Objects that
/// cannot be stored (no name, no value for an `indexBy` expression) are skipped and reported.
pub fn build_stores(
    spec: &Spec,
    mut fixtures: Placement,
) -> (BTreeMap<String, Arc<Store>>, Vec<String>) {
    let mut stores = BTreeMap::new();
    let mut skipped = Vec::new();
    for (name, resource) in &spec.watched_resources {
        let mut store = Store::for_resource(resource);
        let filter = ObjectFilter::for_resource(spec, resource);
        let labels = resource
            .label_selector
            .as_deref()
            .and_then(|s| LabelSelector::parse(s).ok());
        for mut object in fixtures.remove(name).into_iter().flatten() {
            if let Some(map) = object.as_object_mut() {
                map.entry("apiVersion")
                    .or_insert_with(|| Value::from(resource.api_version.clone()));
                map.entry("kind")
                    .or_insert_with(|| Value::from(kind_of(&resource.resources)));
            }
            if labels.as_ref().is_some_and(|l| !l.matches(&object)) {
                continue;
            }
            let Some(object) = filter.prepare(object) else {
                continue;
            };
            if let Err(e) = store.upsert_value(&object) {
                skipped.push(format!("{name}: {e}"));
            }
        }
        stores.insert(name.clone(), Arc::new(store));
    }
    let mut pods = Store::new(crate::render::pod_index());
    for object in fixtures.remove(HAPROXY_PODS).into_iter().flatten() {
        if let Err(e) = pods.upsert_value(&object) {
            skipped.push(format!("{HAPROXY_PODS}: {e}"));
        }
    }
    stores.insert(HAPROXY_PODS.to_string(), Arc::new(pods));
    (stores, skipped)
}

/// Places manifest objects under the watched resource whose apiVersion and plural resource
/// match their apiVersion and kind. Returns the placement and one warning per object that
/// matches nothing (manifest directories hold all sorts of objects).
pub fn place_manifests(spec: &Spec, objects: Vec<Value>) -> (Placement, Vec<String>) {
    let mut placed: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let mut warnings = Vec::new();
    for object in objects {
        // `List` documents (kubectl get -o yaml) hold their objects in `items`.
        if object
            .get("kind")
            .and_then(Value::as_str)
            .is_some_and(|k| k.ends_with("List"))
        {
            if let Some(items) = object.get("items").and_then(Value::as_array) {
                let (more, more_warnings) = place_manifests(spec, items.clone());
                for (k, v) in more {
                    placed.entry(k).or_default().extend(v);
                }
                warnings.extend(more_warnings);
                continue;
            }
        }
        let api_version = object
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let kind = object
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let plural = plural_of(kind);
        // Pods the podSelector picks are the HAProxy pods (`controller.haproxy_pods`).
        let pod_selector = LabelSelector::from_match_labels(&spec.pod_selector.match_labels);
        if api_version == "v1"
            && kind == "Pod"
            && !pod_selector.is_empty()
            && pod_selector.matches(&object)
        {
            placed
                .entry(HAPROXY_PODS.to_string())
                .or_default()
                .push(object.clone());
        }
        let target = spec
            .watched_resources
            .iter()
            .find(|(_, r)| r.api_version == api_version && r.resources == plural)
            .map(|(name, _)| name.clone());
        match target {
            Some(name) => placed.entry(name).or_default().push(object),
            None if kind == "Pod"
                && placed
                    .get(HAPROXY_PODS)
                    .is_some_and(|p| p.last() == Some(&object)) => {}
            None => {
                let name = object
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or("<unnamed>");
                let ns = object
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str);
                let id = ns
                    .map(|ns| format!("{ns}/{name}"))
                    .unwrap_or_else(|| name.to_string());
                warnings.push(format!("skipping {kind} {id} ({api_version}): no watched resource has apiVersion {api_version} and resources {plural}"));
            }
        }
    }
    (placed, warnings)
}

/// Reads YAML documents from a file, or from every `.yaml`/`.yml`/`.json` file of a directory
/// (sorted by name).
pub fn read_documents(path: &Path) -> Result<Vec<(String, Value)>, String> {
    let mut files = Vec::new();
    if path.is_dir() {
        let entries = std::fs::read_dir(path)
            .map_err(|e| format!("read directory {}: {e}", path.display()))?;
        for entry in entries {
            let p = entry
                .map_err(|e| format!("read directory {}: {e}", path.display()))?
                .path();
            if p.extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"))
            {
                files.push(p);
            }
        }
        files.sort();
    } else {
        files.push(path.to_path_buf());
    }
    let mut docs = Vec::new();
    for file in files {
        let text =
            std::fs::read_to_string(&file).map_err(|e| format!("read {}: {e}", file.display()))?;
        for (i, doc) in serde_yaml::Deserializer::from_str(&text).enumerate() {
            use serde::Deserialize;
            let value = Value::deserialize(doc)
                .map_err(|e| format!("{} document {}: {e}", file.display(), i + 1))?;
            if !value.is_null() {
                docs.push((file.display().to_string(), value));
            }
        }
    }
    Ok(docs)
}

/// Loads `--fixtures` inputs: manifest files/directories, or a file in the validation-test
/// layout (`fixtures: {resourceName: [objects]}`, or that mapping bare).
pub fn load_fixture_inputs(
    spec: &Spec,
    paths: &[impl AsRef<Path>],
) -> Result<(Placement, Vec<String>), String> {
    let mut placed: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let mut warnings = Vec::new();
    let mut manifests = Vec::new();
    for path in paths {
        for (source, doc) in read_documents(path.as_ref())? {
            if doc.get("kind").is_some() || doc.get("apiVersion").is_some() {
                manifests.push(doc);
                continue;
            }
            let layout = doc.get("fixtures").cloned().unwrap_or(doc);
            let Value::Object(map) = layout else {
                return Err(format!(
                    "{source}: expected Kubernetes manifests or a `fixtures:` mapping"
                ));
            };
            for (name, objects) in map {
                if name != HAPROXY_PODS && !spec.watched_resources.contains_key(&name) {
                    return Err(format!(
                        "{source}: fixtures.{name} is not a watched resource"
                    ));
                }
                let Value::Array(objects) = objects else {
                    return Err(format!(
                        "{source}: fixtures.{name} must be a list of objects"
                    ));
                };
                placed.entry(name).or_default().extend(objects);
            }
        }
    }
    let (more, more_warnings) = place_manifests(spec, manifests);
    for (k, v) in more {
        placed.entry(k).or_default().extend(v);
    }
    warnings.extend(more_warnings);
    Ok((placed, warnings))
}
