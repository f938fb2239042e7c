//! Indexed stores of watched Kubernetes objects.
//!
//! A [`Store`] holds the objects of one watched resource type, keyed by the composite key its
//! `indexBy` expressions produce, and answers exact and prefix lookups in namespace-then-name
//! order. Objects are `Arc`-shared, so cloning a store for a render snapshot copies pointers,
//! never objects. [`ObjectFilter`] prepares objects on arrival (ignored fields stripped,
//! client-side field selector applied).

pub mod path;
pub mod selector;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde_json::Value;

use crate::config::model::WatchedResource;
use crate::config::Spec;
use path::PathExpr;
use selector::FieldSelector;

/// `(namespace, name)`; cluster-scoped objects have an empty namespace.
pub type ObjectKey = (String, String);

pub fn object_key(object: &Value) -> Option<ObjectKey> {
    let meta = object.get("metadata")?;
    let name = meta.get("name")?.as_str()?.to_string();
    let namespace = meta
        .get("namespace")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    Some((namespace, name))
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// The object has no `metadata.name`.
    Unnamed,
    /// An `indexBy` expression found nothing (or a non-scalar) in the object.
    MissingIndexValue { object: String, expression: String },
    /// A lookup passed more keys than there are `indexBy` expressions.
    TooManyKeys { given: usize, index_by: usize },
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Unnamed => write!(f, "object has no metadata.name"),
            StoreError::MissingIndexValue { object, expression } => {
                write!(f, "object {object} has no scalar value at indexBy expression {expression:?}; not stored")
            }
            StoreError::TooManyKeys { given, index_by } => {
                write!(
                    f,
                    "lookup with {given} keys, but the store is indexed by {index_by} expressions"
                )
            }
        }
    }
}

impl std::error::Error for StoreError {}

#[derive(Debug, Clone)]
struct Entry {
    index_key: Vec<String>,
    object: Arc<Value>,
}

/// Objects of one resource type, indexed by their `indexBy` composite key.
#[derive(Debug, Clone)]
pub struct Store {
    index_by: Arc<[PathExpr]>,
    objects: BTreeMap<ObjectKey, Entry>,
    index: BTreeMap<(Vec<String>, ObjectKey), Arc<Value>>,
}

impl Store {
    pub fn new(index_by: Vec<PathExpr>) -> Store {
        Store {
            index_by: index_by.into(),
            objects: BTreeMap::new(),
            index: BTreeMap::new(),
        }
    }

    pub fn index_by(&self) -> &[PathExpr] {
        &self.index_by
    }

    pub fn len(&self) -> usize {
        self.objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    fn index_key(&self, object: &Value, key: &ObjectKey) -> Result<Vec<String>, StoreError> {
        self.index_by
            .iter()
            .map(|expr| {
                expr.key_of(object)
                    .ok_or_else(|| StoreError::MissingIndexValue {
                        object: if key.0.is_empty() {
                            key.1.clone()
                        } else {
                            format!("{}/{}", key.0, key.1)
                        },
                        expression: expr.to_string(),
                    })
            })
            .collect()
    }

    /// Adds or replaces an object. An object whose index value is missing is not stored, and a
    /// previous version of it is removed (it would otherwise linger under a stale key).
    pub fn upsert(&mut self, object: Arc<Value>) -> Result<(), StoreError> {
        let key = object_key(&object).ok_or(StoreError::Unnamed)?;
        let index_key = match self.index_key(&object, &key) {
            Ok(k) => k,
            Err(e) => {
                self.delete(&key);
                return Err(e);
            }
        };
        if let Some(old) = self.objects.remove(&key) {
            self.index.remove(&(old.index_key, key.clone()));
        }
        self.index
            .insert((index_key.clone(), key.clone()), object.clone());
        self.objects.insert(key, Entry { index_key, object });
        Ok(())
    }

    /// Removes exactly this object; others sharing its index key stay.
    pub fn delete(&mut self, key: &ObjectKey) -> bool {
        match self.objects.remove(key) {
            Some(old) => {
                self.index.remove(&(old.index_key, key.clone()));
                true
            }
            None => false,
        }
    }

    pub fn get_by_key(&self, key: &ObjectKey) -> Option<&Arc<Value>> {
        self.objects.get(key).map(|e| &e.object)
    }

    pub fn keys(&self) -> impl Iterator<Item = &ObjectKey> {
        self.objects.keys()
    }

    /// Every object, ordered by namespace then name.
    pub fn list(&self) -> impl ExactSizeIterator<Item = &Arc<Value>> {
        self.objects.values().map(|e| &e.object)
    }

    /// Objects whose composite key equals `keys` (all expressions given) or starts with it
    /// (fewer given), ordered by namespace then name.
    pub fn fetch(&self, keys: &[String]) -> Result<Vec<Arc<Value>>, StoreError> {
        if keys.len() > self.index_by.len() {
            return Err(StoreError::TooManyKeys {
                given: keys.len(),
                index_by: self.index_by.len(),
            });
        }
        let start = (keys.to_vec(), (String::new(), String::new()));
        let mut found: Vec<(&ObjectKey, &Arc<Value>)> = self
            .index
            .range(start..)
            .take_while(|((index_key, _), _)| index_key.starts_with(keys))
            .map(|((_, object_key), object)| (object_key, object))
            .collect();
        if keys.len() < self.index_by.len() {
            // Prefix matches span several composite keys; restore namespace/name order.
            found.sort_by(|a, b| a.0.cmp(b.0));
        }
        Ok(found.into_iter().map(|(_, o)| o.clone()).collect())
    }

    /// The single object matching `keys`; `None` when there are none or several.
    pub fn get_one(&self, keys: &[String]) -> Result<Option<Arc<Value>>, StoreError> {
        let mut found = self.fetch(keys)?;
        Ok(if found.len() == 1 { found.pop() } else { None })
    }
}

/// Prepares objects on arrival: strips `watchedResourcesIgnoreFields` and applies the
/// client-side field selector.
#[derive(Debug, Clone, Default)]
pub struct ObjectFilter {
    pub ignore_fields: Vec<PathExpr>,
    pub field_selector: Option<FieldSelector>,
}

impl ObjectFilter {
    /// `None` when the object does not pass the field selector (it must then not be stored).
    pub fn prepare(&self, mut object: Value) -> Option<Value> {
        if let Some(sel) = &self.field_selector {
            if !sel.matches(&object) {
                return None;
            }
        }
        for path in &self.ignore_fields {
            path.remove(&mut object);
        }
        Some(object)
    }
}

impl Store {
    /// An empty store indexed the way a watched resource asks.
    pub fn for_resource(resource: &WatchedResource) -> Store {
        Store::new(
            resource
                .index_by
                .iter()
                .filter_map(|e| PathExpr::parse(e).ok())
                .collect(),
        )
    }
}

impl ObjectFilter {
    /// The arrival filter of a watched resource (expressions were checked by config validation).
    pub fn for_resource(spec: &Spec, resource: &WatchedResource) -> ObjectFilter {
        ObjectFilter {
            ignore_fields: spec
                .watched_resources_ignore_fields
                .iter()
                .filter_map(|e| PathExpr::parse(e).ok())
                .collect(),
            field_selector: resource
                .field_selector
                .as_deref()
                .and_then(|s| FieldSelector::parse(s).ok()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn slice(ns: &str, name: &str, service: &str) -> Arc<Value> {
        Arc::new(
            json!({"metadata": {"namespace": ns, "name": name, "labels": {"kubernetes.io/service-name": service}}}),
        )
    }

    fn store() -> Store {
        Store::new(vec![
            PathExpr::parse("metadata.namespace").unwrap(),
            PathExpr::parse(r"metadata.labels.kubernetes\.io/service-name").unwrap(),
        ])
    }

    fn names(objects: &[Arc<Value>]) -> Vec<String> {
        objects
            .iter()
            .map(|o| {
                format!(
                    "{}/{}",
                    o["metadata"]["namespace"].as_str().unwrap(),
                    o["metadata"]["name"].as_str().unwrap()
                )
            })
            .collect()
    }

    fn k(parts: &[&str]) -> Vec<String> {
        parts.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn exact_and_prefix_fetch_in_namespace_name_order() {
        let mut s = store();
        for (ns, name, svc) in [
            ("b", "z", "web"),
            ("a", "y", "web"),
            ("a", "x", "api"),
            ("a", "w", "web"),
            ("ab", "v", "web"),
        ] {
            s.upsert(slice(ns, name, svc)).unwrap();
        }
        assert_eq!(names(&s.fetch(&k(&["a", "web"])).unwrap()), ["a/w", "a/y"]);
        assert_eq!(
            names(&s.fetch(&k(&["a"])).unwrap()),
            ["a/w", "a/x", "a/y"],
            "prefix is per key, not per string"
        );
        assert_eq!(
            names(&s.fetch(&[]).unwrap()),
            ["a/w", "a/x", "a/y", "ab/v", "b/z"]
        );
        assert_eq!(
            names(&s.list().cloned().collect::<Vec<_>>()),
            ["a/w", "a/x", "a/y", "ab/v", "b/z"]
        );
        assert!(
            s.get_one(&k(&["a", "web"])).unwrap().is_none(),
            "two matches → none"
        );
        assert!(s.get_one(&k(&["a", "api"])).unwrap().is_some());
        assert!(s.get_one(&k(&["c"])).unwrap().is_none());
        assert_eq!(
            s.fetch(&k(&["a", "web", "x"])),
            Err(StoreError::TooManyKeys {
                given: 3,
                index_by: 2
            })
        );
    }

    #[test]
    fn delete_under_shared_key_removes_only_that_object() {
        let mut s = store();
        s.upsert(slice("a", "one", "web")).unwrap();
        s.upsert(slice("a", "two", "web")).unwrap();
        assert!(s.delete(&("a".into(), "one".into())));
        assert_eq!(names(&s.fetch(&k(&["a", "web"])).unwrap()), ["a/two"]);
        assert!(!s.delete(&("a".into(), "one".into())));
    }

    #[test]
    fn update_moves_object_between_keys() {
        let mut s = store();
        s.upsert(slice("a", "one", "web")).unwrap();
        s.upsert(slice("a", "one", "api")).unwrap();
        assert!(s.fetch(&k(&["a", "web"])).unwrap().is_empty());
        assert_eq!(s.len(), 1);
        let unindexable = Arc::new(json!({"metadata": {"namespace": "a", "name": "one"}}));
        let err = s.upsert(unindexable).unwrap_err();
        assert!(
            err.to_string().contains("a/one") && err.to_string().contains("service-name"),
            "{err}"
        );
        assert!(s.is_empty(), "the stale version is gone");
    }

    #[test]
    fn filter_strips_fields_and_selects() {
        let filter = ObjectFilter {
            ignore_fields: vec![PathExpr::parse("metadata.managedFields").unwrap()],
            field_selector: Some(FieldSelector::parse("metadata.namespace=prod").unwrap()),
        };
        let kept = filter
            .prepare(json!({"metadata": {"namespace": "prod", "managedFields": [1]}}))
            .unwrap();
        assert_eq!(kept, json!({"metadata": {"namespace": "prod"}}));
        assert!(filter
            .prepare(json!({"metadata": {"namespace": "dev"}}))
            .is_none());
    }
}
