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
    let mut builder = StoreBuilder::new(spec);
    for name in spec.watched_resources.keys() {
        for object in fixtures.remove(name).into_iter().flatten() {
            builder.add(name, object);
        }
    }
    for object in fixtures.remove(HAPROXY_PODS).into_iter().flatten() {
        builder.add(HAPROXY_PODS, object);
    }
    builder.finish()
}

/// Stores filled one object at a time, each kept compact as soon as it is added.
struct StoreBuilder<'s> {
    spec: &'s Spec,
    stores: BTreeMap<String, Store>,
    filters: BTreeMap<String, (ObjectFilter, Option<LabelSelector>)>,
    skipped: Vec<String>,
}

impl<'s> StoreBuilder<'s> {
    fn new(spec: &'s Spec) -> StoreBuilder<'s> {
        let mut stores = BTreeMap::new();
        let mut filters = BTreeMap::new();
        for (name, resource) in &spec.watched_resources {
            stores.insert(name.clone(), Store::for_resource(resource));
            let labels = resource
                .label_selector
                .as_deref()
                .and_then(|s| LabelSelector::parse(s).ok());
            filters.insert(
                name.clone(),
                (ObjectFilter::for_resource(spec, resource), labels),
            );
        }
        stores.insert(
            HAPROXY_PODS.to_string(),
            Store::new(crate::render::pod_index()),
        );
        StoreBuilder {
            spec,
            stores,
            filters,
            skipped: Vec::new(),
        }
    }

    /// Adds an object to the store `name` (a watched resource or `haproxy-pods`).
    fn add(&mut self, name: &str, mut object: Value) {
        let Some(store) = self.stores.get_mut(name) else {
            return;
        };
        if let (Some(resource), Some((filter, labels))) = (
            self.spec.watched_resources.get(name),
            self.filters.get(name),
        ) {
            if let Some(map) = object.as_object_mut() {
                map.entry("apiVersion")
                    .or_insert_with(|| Value::from(resource.api_version.clone()));
                map.entry("kind")
                    .or_insert_with(|| Value::from(kind_of(&resource.resources)));
            }
            if labels.as_ref().is_some_and(|l| !l.matches(&object)) {
                return;
            }
            let Some(prepared) = filter.prepare(object) else {
                return;
            };
            object = prepared;
        }
        if let Err(e) = store.upsert_value(&object) {
            self.skipped.push(format!("{name}: {e}"));
        }
    }

    fn finish(self) -> (BTreeMap<String, Arc<Store>>, Vec<String>) {
        let stores = self
            .stores
            .into_iter()
            .map(|(name, store)| (name, Arc::new(store)))
            .collect();
        (stores, self.skipped)
    }
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
/// Each document is handed to `each` (with its file name) as it is parsed.
pub fn read_documents(
    path: &Path,
    each: &mut dyn FnMut(&str, Value) -> Result<(), String>,
) -> Result<(), String> {
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
    for file in files {
        let text =
            std::fs::read_to_string(&file).map_err(|e| format!("read {}: {e}", file.display()))?;
        for (i, doc) in serde_yaml::Deserializer::from_str(&text).enumerate() {
            use serde::Deserialize;
            let value = Value::deserialize(doc)
                .map_err(|e| format!("{} document {}: {e}", file.display(), i + 1))?;
            if !value.is_null() {
                each(&file.display().to_string(), value)?;
            }
        }
    }
    Ok(())
}

/// Loads `--fixtures` inputs: manifest files/directories, or a file in the validation-test
/// layout (`fixtures: {resourceName: [objects]}`, or that mapping bare).
/// Stores loaded from `--fixtures` files.
pub struct FixtureStores {
    pub stores: BTreeMap<String, Arc<Store>>,
    /// Objects no watched resource takes.
    pub warnings: Vec<String>,
    /// Objects that could not be stored (no name, no value for an `indexBy` expression).
    pub skipped: Vec<String>,
}

/// Each document goes into its store as it is read, so the objects are never all held as
/// parsed JSON at once.
pub fn load_fixture_stores(
    spec: &Spec,
    paths: &[impl AsRef<Path>],
) -> Result<FixtureStores, String> {
    let mut builder = StoreBuilder::new(spec);
    let mut warnings = Vec::new();
    for path in paths {
        read_documents(path.as_ref(), &mut |source, doc| {
            let (placed, more_warnings) = place_document(spec, source, doc)?;
            warnings.extend(more_warnings);
            for (name, objects) in placed {
                for object in objects {
                    builder.add(&name, object);
                }
            }
            Ok(())
        })?;
    }
    let (stores, skipped) = builder.finish();
    Ok(FixtureStores {
        stores,
        warnings,
        skipped,
    })
}

/// Where one `--fixtures` document's objects go: a manifest (or List) by its apiVersion and
/// kind, or a mapping in the validation-test layout (`fixtures: {resourceName: [objects]}`,
/// or that mapping bare).
fn place_document(
    spec: &Spec,
    source: &str,
    doc: Value,
) -> Result<(Placement, Vec<String>), String> {
    if doc.get("kind").is_some() || doc.get("apiVersion").is_some() {
        return Ok(place_manifests(spec, vec![doc]));
    }
    let mut placed: Placement = BTreeMap::new();
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
    Ok((placed, Vec::new()))
}
