//! Template-facing views of stored data: [`JsonNode`] exposes a shared stored object to minijinja
//! without converting it, and [`StoreView`]/[`Resources`] expose stores with `list`, `fetch`
//! and `get`.

use std::collections::BTreeMap;
use std::sync::Arc;

use minijinja::value::{Enumerator, Object, ObjectRepr, Value};
use minijinja::{Error, ErrorKind, State};

use super::units::StoreMethod;
use crate::store::doc::Kind;
use crate::store::{Doc, NodeRef, Store};

/// The context templates render with: every name a template uses that is not its own variable
/// is looked up here (then in the environment's globals: `unit`, `range`, …), several times per
/// object rendered. A `BTreeMap` value would compare `Value`s on every lookup and
/// `merge_maps` would try each map in turn; this answers from one hash map of plain strings.
#[derive(Debug, Default)]
pub(crate) struct RenderContext {
    names: std::collections::HashMap<String, Value>,
}

impl RenderContext {
    pub(crate) fn value(names: impl IntoIterator<Item = (String, Value)>) -> Value {
        Value::from_object(RenderContext {
            names: names.into_iter().collect(),
        })
    }
}

impl Object for RenderContext {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        self.names.get(key.as_str()?).cloned()
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        let mut names: Vec<&String> = self.names.keys().collect();
        names.sort();
        Enumerator::Values(names.into_iter().map(|n| Value::from(n.as_str())).collect())
    }
}

/// A unit's context: its arguments, then the render's context (arguments win).
#[derive(Debug)]
pub(crate) struct UnitContext {
    args: Vec<(Arc<str>, Value)>,
    root: Value,
}

impl UnitContext {
    pub(crate) fn value(args: &[(Arc<str>, Value)], root: Value) -> Value {
        Value::from_object(UnitContext {
            args: args.to_vec(),
            root,
        })
    }
}

impl Object for UnitContext {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let name = key.as_str()?;
        // The last argument of a name wins, as when they were collected into a map.
        match self.args.iter().rev().find(|(k, _)| &**k == name) {
            Some((_, v)) => Some(v.clone()),
            None => match self.root.downcast_object_ref::<RenderContext>() {
                Some(root) => root.names.get(name).cloned(),
                None => self.root.get_item(key).ok().filter(|v| !v.is_undefined()),
            },
        }
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        let mut names: Vec<Value> = self.args.iter().map(|(k, _)| Value::from(&**k)).collect();
        if let Ok(root) = self.root.try_iter() {
            names.extend(root);
        }
        names.sort();
        names.dedup();
        Enumerator::Values(names)
    }
}

/// An object's annotation keys, each with whether its value is true.
pub(crate) type AnnotationKeys = Box<[(Box<str>, bool)]>;

/// A node inside a shared, immutable stored object. Exposing an object to a template costs
/// nothing until a template touches a field, and the stored object is never copied.
#[derive(Debug)]
pub(crate) struct JsonNode {
    doc: Arc<Doc>,
    idx: u32,
}

impl JsonNode {
    pub(crate) fn value(doc: Arc<Doc>) -> Value {
        let root = doc.root();
        match root.kind() {
            // A whole object is handed out once per lookup (`list()`, `get()`): not worth
            // keeping among the recent nodes.
            Kind::Array | Kind::Object => {
                let idx = root.index();
                Value::from_object(JsonNode { doc, idx })
            }
            _ => json_to_value(&doc, root),
        }
    }

    /// The same stored version of the same object, at the same place.
    pub(crate) fn same_node(&self, other: &JsonNode) -> bool {
        Arc::ptr_eq(&self.doc, &other.doc) && self.idx == other.idx
    }

    /// The field at `path` below this node as a template value; `None` when absent (or when
    /// the path runs through something that is not an object).
    pub(crate) fn field(&self, path: &[&str]) -> Option<Value> {
        let found = path
            .iter()
            .try_fold(self.node(), |node, key| node.get(key))?;
        Some(json_to_value(&self.doc, found))
    }

    /// The keys of `metadata.annotations` when it is a map, each with whether its value is
    /// true (as `obj.metadata.annotations[key]` is in a template).
    pub(crate) fn annotations(&self) -> Option<AnnotationKeys> {
        let map = self.node().get("metadata")?.get("annotations")?;
        (map.kind() == Kind::Object).then(|| {
            map.members()
                .map(|(key, value)| (key.into(), json_to_value(&self.doc, value).is_true()))
                .collect()
        })
    }

    /// Whether any key of this object node starts with `prefix`.
    pub(crate) fn has_key_prefixed(&self, prefix: &str) -> bool {
        self.node()
            .members()
            .any(|(key, _)| key.starts_with(prefix))
    }

    fn node(&self) -> NodeRef<'_> {
        // `idx` was taken from a node of this document.
        self.doc.node(self.idx).unwrap_or_else(|| self.doc.root())
    }
}

fn json_to_value(doc: &Arc<Doc>, node: NodeRef<'_>) -> Value {
    match node.kind() {
        Kind::Null => Value::from(()),
        Kind::Bool => Value::from(node.as_bool().unwrap_or_default()),
        Kind::Number => {
            if let Some(i) = node.as_i64() {
                Value::from(i)
            } else if let Some(u) = node.as_u64() {
                Value::from(u)
            } else {
                let f = node.as_f64().unwrap_or(f64::NAN);
                // Integral floats (YAML/JSON `80.0`) behave as integers, as users expect of ports.
                if f.fract() == 0.0 && f.abs() < 9e15 {
                    Value::from(f as i64)
                } else {
                    Value::from(f)
                }
            }
        }
        Kind::String => Value::from(node.as_str().unwrap_or_default()),
        Kind::Array | Kind::Object => recent_node(doc, node.index()),
    }
}

impl Object for JsonNode {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        if self.node().kind() == Kind::Array {
            ObjectRepr::Seq
        } else {
            ObjectRepr::Map
        }
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let node = self.node();
        let found = match node.kind() {
            Kind::Object => node.get(key.as_str()?)?,
            Kind::Array => {
                let len = node.len() as i64;
                let i = key.as_i64()?;
                let i = if i < 0 { len + i } else { i };
                node.at(usize::try_from(i).ok()?)?
            }
            _ => return None,
        };
        Some(json_to_value(&self.doc, found))
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        let node = self.node();
        match node.kind() {
            Kind::Object => {
                Enumerator::Values(node.members().map(|(k, _)| Value::from(k)).collect())
            }
            Kind::Array => Enumerator::Seq(node.len()),
            _ => Enumerator::Empty,
        }
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        Some(self.node().len())
    }
}

/// How many object and array nodes each thread keeps handing out again ([`recent_node`]).
const RECENT_NODES: usize = 32;

/// The nodes a thread handed out last, with their document's address and index.
#[derive(Default)]
struct RecentNodes {
    nodes: Vec<(usize, u32, Value)>,
    next: usize,
}

thread_local! {
    static RECENT: std::cell::RefCell<RecentNodes> = std::cell::RefCell::new(RecentNodes::default());
}

/// The template value of an object or array node. Templates read the same few objects field by
/// field (`ing.metadata.name`, `ing.metadata.namespace`, `ing.spec.rules`, …), and every read of
/// an object field would allocate its node again: the last [`RECENT_NODES`] nodes are handed out
/// again instead (a node is immutable, and equal to a fresh one). The ring keeps that many nodes
/// and their documents alive past their use; a document's address cannot be reused while the
/// ring holds it, so the address identifies it.
fn recent_node(doc: &Arc<Doc>, idx: u32) -> Value {
    let addr = Arc::as_ptr(doc) as usize;
    RECENT.with(|recent| {
        let mut recent = recent.borrow_mut();
        if let Some((_, _, value)) = recent
            .nodes
            .iter()
            .find(|(a, i, _)| *a == addr && *i == idx)
        {
            return value.clone();
        }
        let value = Value::from_object(JsonNode {
            doc: doc.clone(),
            idx,
        });
        if recent.nodes.len() < RECENT_NODES {
            recent.nodes.push((addr, idx, value.clone()));
        } else {
            let next = recent.next;
            recent.nodes[next] = (addr, idx, value.clone());
            recent.next = (next + 1) % RECENT_NODES;
        }
        value
    })
}

/// Turns template arguments into index keys the way stores compute them.
fn keys_from_args(args: &[Value]) -> Result<Vec<String>, Error> {
    args.iter()
        .map(|a| {
            if let Some(s) = a.as_str() {
                Ok(s.to_string())
            } else if a.is_number() || a.kind() == minijinja::value::ValueKind::Bool {
                Ok(a.to_string())
            } else {
                Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("store keys must be strings or numbers, got {}", a.kind()),
                ))
            }
        })
        .collect()
}

/// One store as seen by templates: `list()`, `fetch(k1, …)`, `get(k1, …)`.
#[derive(Debug)]
pub(crate) struct StoreView {
    pub name: String,
    pub store: Arc<Store>,
}

impl StoreView {
    fn to_values<'a>(objects: impl Iterator<Item = &'a Arc<Doc>>) -> Value {
        Value::from(
            objects
                .map(|o| JsonNode::value(o.clone()))
                .collect::<Vec<_>>(),
        )
    }
}

impl Object for StoreView {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Plain
    }

    fn call_method(
        self: &Arc<Self>,
        _state: &mut State<'_, '_>,
        method: &str,
        args: &[Value],
    ) -> Result<Value, Error> {
        let store_error = |e: crate::store::StoreError| {
            Error::new(
                ErrorKind::InvalidOperation,
                format!("resources.{}: {e}", self.name),
            )
        };
        match method {
            "list" => {
                if !args.is_empty() {
                    return Err(Error::new(
                        ErrorKind::TooManyArguments,
                        "list() takes no arguments; use fetch(keys…)",
                    ));
                }
                if super::units::recording() {
                    let all: Vec<_> = self.store.list().cloned().collect();
                    super::units::note_store_read(
                        &self.name,
                        self.store.version(),
                        StoreMethod::List,
                        &[],
                        &all,
                    );
                }
                Ok(Self::to_values(self.store.list()))
            }
            "fetch" => {
                let keys = keys_from_args(args)?;
                let found = self.store.fetch(&keys).map_err(store_error)?;
                super::units::note_store_read(
                    &self.name,
                    self.store.version(),
                    StoreMethod::Fetch,
                    &keys,
                    &found,
                );
                Ok(Self::to_values(found.iter()))
            }
            "get" => {
                let keys = keys_from_args(args)?;
                if keys.is_empty() {
                    return Err(Error::new(
                        ErrorKind::MissingArgument,
                        format!("resources.{}.get() needs at least one key", self.name),
                    ));
                }
                let found = self.store.get_one(&keys).map_err(store_error)?;
                super::units::note_store_read(
                    &self.name,
                    self.store.version(),
                    StoreMethod::Get,
                    &keys,
                    found.as_slice(),
                );
                Ok(found.map(JsonNode::value).unwrap_or(Value::from(())))
            }
            _ => Err(Error::new(
                ErrorKind::UnknownMethod,
                format!(
                    "resources.{} has no method {method:?} (list, fetch, get)",
                    self.name
                ),
            )),
        }
    }

    fn render(self: &Arc<Self>, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<store {} ({} objects)>", self.name, self.store.len())
    }
}

/// `resources`: every watched store by name.
#[derive(Debug)]
pub(crate) struct Resources {
    pub stores: BTreeMap<String, Value>,
}

impl Resources {
    pub(crate) fn new(stores: &BTreeMap<String, Arc<Store>>) -> Resources {
        let stores = stores
            .iter()
            .map(|(name, store)| {
                (
                    name.clone(),
                    Value::from_object(StoreView {
                        name: name.clone(),
                        store: store.clone(),
                    }),
                )
            })
            .collect();
        Resources { stores }
    }
}

impl Object for Resources {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        self.stores.get(key.as_str()?).cloned()
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Values(
            self.stores
                .keys()
                .map(|k| Value::from(k.as_str()))
                .collect(),
        )
    }
}
