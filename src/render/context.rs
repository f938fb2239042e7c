//! Per-render context objects: `paths`, `files`, `shared` (with `first_seen`), `status` and
//! `current_config`. One set is created for each render and shared by `haproxy.cfg` and every
//! auxiliary template of that render.

use std::collections::BTreeMap;

use super::HashMap;
use crate::store::doc::Passthrough;
use std::collections::hash_map::Entry;
use std::hash::BuildHasherDefault;
use std::sync::{Arc, Mutex};

use crate::lock;

use super::units;

use haptic_agent::protocol::FileKind;
use minijinja::value::{from_args, Enumerator, Object, ObjectRepr, Value, ValueKind};
use minijinja::{Error, ErrorKind, State};

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidOperation, msg.into())
}

/// Where auxiliary files live, relative to haproxy.cfg (templates emit `default-path config`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paths {
    /// Shown to templates as `paths.base`: the directory holding haproxy.cfg.
    pub base: String,
    pub maps_dir: String,
    pub certs_dir: String,
    pub general_dir: String,
}

impl Paths {
    pub fn from_spec(spec: &crate::config::Spec) -> Paths {
        let p = spec.dataplane_paths();
        let last = |dir: &str| {
            dir.trim_end_matches('/')
                .rsplit('/')
                .next()
                .unwrap_or(dir)
                .to_string()
        };
        let base = p
            .config_file
            .rsplit_once('/')
            .map(|(d, _)| d.to_string())
            .unwrap_or_default();
        Paths {
            base,
            maps_dir: last(&p.maps_dir),
            certs_dir: last(&p.ssl_certs_dir),
            general_dir: last(&p.general_storage_dir),
        }
    }

    pub fn with_base(mut self, base: String) -> Paths {
        self.base = base;
        self
    }

    pub fn dir_of(&self, kind: FileKind) -> &str {
        match kind {
            FileKind::Map => &self.maps_dir,
            FileKind::Cert | FileKind::Ca | FileKind::Crl => &self.certs_dir,
            FileKind::CrtList | FileKind::General => &self.general_dir,
        }
    }

    /// The relative path of a file of `kind` called `name`; an empty name gives the directory.
    /// Certificate and crt-list names are sanitised (`api.example.com.pem` →
    /// `api_example_com.pem`) so that any host or Secret name gives a safe file name.
    pub fn get(&self, name: &str, kind: FileKind) -> Result<String, String> {
        if name.is_empty() {
            return Ok(self.dir_of(kind).to_string());
        }
        if name.contains('/') || name == "." || name == ".." || name.contains('\0') {
            return Err(format!(
                "file name {name:?} must not contain '/' or be '.' or '..'"
            ));
        }
        let name = match kind {
            FileKind::Cert | FileKind::CrtList | FileKind::Ca | FileKind::Crl => {
                sanitize_file_name(name)
            }
            _ => name.to_string(),
        };
        Ok(format!("{}/{}", self.dir_of(kind), name))
    }
}

/// Replaces every run of characters outside `[A-Za-z0-9_-]` in the stem with `_`.
pub(crate) fn sanitize_file_name(name: &str) -> String {
    let (stem, ext) = match name.rsplit_once('.') {
        Some((stem, ext)) if !stem.is_empty() => (stem, Some(ext)),
        _ => (name, None),
    };
    let mut out = String::with_capacity(name.len());
    let mut in_run = false;
    for c in stem.chars() {
        if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
            out.push(c);
            in_run = false;
        } else if !in_run {
            out.push('_');
            in_run = true;
        }
    }
    if let Some(ext) = ext {
        out.push('.');
        out.push_str(ext);
    }
    out
}

pub(crate) fn parse_kind(kind: &str) -> Result<FileKind, Error> {
    match kind {
        "file" => Ok(FileKind::General),
        other => FileKind::parse(other).ok_or_else(|| {
            invalid(format!(
                "unknown file kind {other:?} (map, file, cert, crt-list, ca, crl)"
            ))
        }),
    }
}

impl Object for Paths {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        match key.as_str()? {
            "base" => Some(Value::from(self.base.as_str())),
            _ => None,
        }
    }

    fn call_method(
        self: &Arc<Self>,
        _state: &mut State<'_, '_>,
        method: &str,
        args: &[Value],
    ) -> Result<Value, Error> {
        match method {
            "get" => {
                let (name, kind): (&str, &str) = from_args(args)?;
                self.get(name, parse_kind(kind)?)
                    .map(Value::from)
                    .map_err(invalid)
            }
            _ => Err(Error::new(
                ErrorKind::UnknownMethod,
                format!("paths has no method {method:?} (get)"),
            )),
        }
    }
}

/// A file registered during rendering through `files.register`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RegisteredFile {
    pub kind: FileKind,
    pub path: String,
    pub content: String,
}

/// `files`: auxiliary files created while rendering.
#[derive(Debug)]
pub(crate) struct FileRegistry {
    paths: Paths,
    files: Mutex<BTreeMap<String, RegisteredFile>>,
}

impl FileRegistry {
    pub(crate) fn new(paths: Paths) -> FileRegistry {
        FileRegistry {
            paths,
            files: Mutex::new(BTreeMap::new()),
        }
    }

    /// Registering the same file twice with the same content is fine; with different content
    /// it is an error (two templates disagree about one file).
    pub(crate) fn register(
        &self,
        kind: FileKind,
        name: &str,
        content: String,
    ) -> Result<String, String> {
        let (path, added) = self.register_file(kind, name, content.clone())?;
        if added.is_some() {
            units::note_effect(
                units::Effect::File(Box::new((kind, name.to_string(), content))),
                units::Undo::File(path.clone()),
            );
        }
        Ok(path)
    }

    pub(super) fn remove(&self, path: &str) {
        lock(&self.files).remove(path);
    }

    pub(super) fn path_of(&self, kind: FileKind, name: &str) -> Result<String, String> {
        self.paths.get(name, kind)
    }

    /// Registers a file; returns its path and, when it was not registered before, the path
    /// again (what undoing the registration removes).
    pub(super) fn register_file(
        &self,
        kind: FileKind,
        name: &str,
        content: String,
    ) -> Result<(String, Option<String>), String> {
        let path = self.paths.get(name, kind)?;
        if name.is_empty() {
            return Err("files.register needs a file name".into());
        }
        let mut files = lock(&self.files);
        if let Some(existing) = files.get(&path) {
            if existing.kind != kind || existing.content != content {
                return Err(format!(
                    "{path} was already registered with different {}",
                    if existing.kind != kind {
                        "kind"
                    } else {
                        "content"
                    }
                ));
            }
            return Ok((path, None));
        }
        files.insert(
            path.clone(),
            RegisteredFile {
                kind,
                path: path.clone(),
                content,
            },
        );
        Ok((path.clone(), Some(path)))
    }

    pub(crate) fn take(&self) -> Vec<RegisteredFile> {
        std::mem::take(&mut *lock(&self.files))
            .into_values()
            .collect()
    }
}

impl Object for FileRegistry {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Plain
    }

    fn call_method(
        self: &Arc<Self>,
        _state: &mut State<'_, '_>,
        method: &str,
        args: &[Value],
    ) -> Result<Value, Error> {
        match method {
            "register" => {
                let (kind, name, content): (&str, &str, Value) = from_args(args)?;
                let content = content
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| content.to_string());
                self.register(parse_kind(kind)?, name, content)
                    .map(Value::from)
                    .map_err(invalid)
            }
            _ => Err(Error::new(
                ErrorKind::UnknownMethod,
                format!("files has no method {method:?} (register)"),
            )),
        }
    }
}

/// `shared`: a per-render map every template of the render can read and write. Writes and
/// reads inside render units are recorded (see `units`).
#[derive(Debug, Default)]
pub(crate) struct Shared {
    values: Mutex<HashMap<String, Value>>,
    seen: Mutex<Seen>,
}

/// `first_seen`'s marks, filed by the [`crate::process_hash`] of each key. The table keeps the
/// hashes, so growing it does not hash every key again: in a large render those are strings
/// that have long left the cache. A lookup compares the keys that share its hash.
#[derive(Debug, Default)]
struct Seen(std::collections::HashMap<u64, SeenKeys, BuildHasherDefault<Passthrough>>);

#[derive(Debug)]
enum SeenKeys {
    One(Box<str>),
    Many(Vec<Box<str>>),
}

impl SeenKeys {
    fn contains(&self, key: &str) -> bool {
        match self {
            SeenKeys::One(k) => **k == *key,
            SeenKeys::Many(keys) => keys.iter().any(|k| **k == *key),
        }
    }
}

impl Seen {
    fn contains(&self, hash: u64, key: &str) -> bool {
        self.0.get(&hash).is_some_and(|keys| keys.contains(key))
    }

    /// Marks `key` (whose hash is `hash`); false if it was marked already.
    fn insert(&mut self, hash: u64, key: String) -> bool {
        match self.0.entry(hash) {
            Entry::Vacant(slot) => {
                slot.insert(SeenKeys::One(key.into_boxed_str()));
            }
            Entry::Occupied(mut slot) => {
                let keys = slot.get_mut();
                if keys.contains(&key) {
                    return false;
                }
                let key = key.into_boxed_str();
                match keys {
                    SeenKeys::One(first) => {
                        *keys = SeenKeys::Many(vec![std::mem::take(first), key])
                    }
                    SeenKeys::Many(all) => all.push(key),
                }
            }
        }
        true
    }

    fn remove(&mut self, hash: u64, key: &str) {
        let Entry::Occupied(mut slot) = self.0.entry(hash) else {
            return;
        };
        match slot.get_mut() {
            SeenKeys::One(k) if **k == *key => {
                slot.remove();
            }
            SeenKeys::Many(all) => {
                all.retain(|k| **k != *key);
                if all.is_empty() {
                    slot.remove();
                }
            }
            SeenKeys::One(_) => {}
        }
    }
}

impl Shared {
    /// `first_seen`: true the first time a key is seen in this render.
    pub(crate) fn first_seen(&self, key: String) -> bool {
        let hash = crate::process_hash(key.as_str());
        if !units::in_unit() {
            return lock(&self.seen).insert(hash, key);
        }
        // Inside a unit, the answer is an input of the unit and the mark its effect.
        let fresh = lock(&self.seen).insert(hash, key.clone());
        units::note_seen(&key, fresh);
        if fresh {
            units::note_effect(units::Effect::Seen(key.clone()), units::Undo::Seen(key));
        }
        fresh
    }

    pub(super) fn has_seen(&self, key: &str) -> bool {
        lock(&self.seen).contains(crate::process_hash(key), key)
    }

    pub(super) fn mark_seen(&self, key: &str) {
        lock(&self.seen).insert(crate::process_hash(key), key.to_string());
    }

    pub(super) fn unmark_seen(&self, key: &str) {
        lock(&self.seen).remove(crate::process_hash(key), key);
    }

    /// The value under `key`, without recording a read.
    pub(super) fn peek(&self, key: &str) -> Option<Value> {
        lock(&self.values).get(key).cloned()
    }

    pub(super) fn set_value(&self, key: &str, value: Value) -> Option<Value> {
        lock(&self.values).insert(key.to_string(), value)
    }

    pub(super) fn remove(&self, key: &str) {
        lock(&self.values).remove(key);
    }

    /// Appends to the list under `key` (a collector, created when missing; an existing plain
    /// list becomes one).
    pub(super) fn append_value(&self, key: &str, item: Value) {
        let collector = {
            let mut values = lock(&self.values);
            let existing = values.get(key).cloned();
            match existing
                .as_ref()
                .and_then(|v| v.downcast_object::<Collector>())
            {
                Some(c) => c,
                None => {
                    let items: Vec<Value> = existing
                        .filter(|v| !v.is_undefined() && !v.is_none())
                        .and_then(|v| v.try_iter().ok().map(|i| i.collect()))
                        .unwrap_or_default();
                    let c = Arc::new(Collector::shared(key, items));
                    values.insert(key.to_string(), Value::from_dyn_object(c.clone()));
                    c
                }
            }
        };
        collector.push(item);
    }

    pub(super) fn pop(&self, key: &str) {
        let existing = lock(&self.values).get(key).cloned();
        if let Some(c) = existing
            .as_ref()
            .and_then(|v| v.downcast_object_ref::<Collector>())
        {
            c.pop();
        }
    }
}

impl Object for Shared {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Plain
    }

    fn call_method(
        self: &Arc<Self>,
        _state: &mut State<'_, '_>,
        method: &str,
        args: &[Value],
    ) -> Result<Value, Error> {
        match method {
            "get" => {
                let (key, default): (&str, Option<Value>) = from_args(args)?;
                let found = self.peek(key);
                units::note_shared_read(key, found.as_ref());
                Ok(found.or(default).unwrap_or(Value::from(())))
            }
            "set" => {
                let (key, value): (&str, Value) = from_args(args)?;
                let value = compact(&value);
                let old = self.set_value(key, value.clone());
                units::note_effect(
                    units::Effect::SharedSet(key.to_string(), value),
                    units::Undo::SharedSet(key.to_string(), old),
                );
                Ok(Value::from(""))
            }
            "append" => {
                let (key, item): (&str, Value) = from_args(args)?;
                let item = compact(&item);
                self.refuse_cycle(key, &item)?;
                self.append_value(key, item.clone());
                units::note_collector_append(Some(key), &item);
                Ok(Value::from(""))
            }
            "extend" => {
                let (key, items): (&str, Value) = from_args(args)?;
                for item in items.try_iter()? {
                    let item = compact(&item);
                    self.refuse_cycle(key, &item)?;
                    self.append_value(key, item.clone());
                    units::note_collector_append(Some(key), &item);
                }
                Ok(Value::from(""))
            }
            "has" => {
                let (key,): (&str,) = from_args(args)?;
                let found = self.peek(key);
                units::note_shared_read(key, found.as_ref());
                Ok(Value::from(found.is_some()))
            }
            _ => Err(Error::new(
                ErrorKind::UnknownMethod,
                format!("shared has no method {method:?} (get, set, append, extend, has)"),
            )),
        }
    }
}

/// `collector()`: a list that grows in place. `{% do c.append(x) %}` costs O(1), where
/// `{% set x = x + [item] %}` in a loop copies the list every time (quadratic). Iterates,
/// indexes and measures like a list. `shared.append(key, x)` keeps one under a shared key.
#[derive(Debug, Default)]
pub(crate) struct Collector {
    items: Mutex<Vec<Value>>,
    /// Set when the collector lives in `shared`: appends to it are effects units record.
    shared_key: Option<String>,
    /// The annotations of the items while they stay as they are, when every item is a stored
    /// object (see [`Collector::annotated`]). Locked after `items`, never before.
    annotations: Mutex<Option<Arc<Annotations>>>,
}

/// The annotations of a list of stored objects: for each object whose `metadata.annotations`
/// is a map (by its position in the list), the map's keys and whether each value is true.
#[derive(Debug)]
pub(crate) struct Annotations(Vec<(usize, super::objects::AnnotationKeys)>);

impl Collector {
    pub(crate) fn shared(key: &str, items: Vec<Value>) -> Collector {
        Collector {
            items: Mutex::new(items),
            shared_key: Some(key.to_string()),
            annotations: Mutex::new(None),
        }
    }

    /// The items whose annotations `pick` accepts, in order; `None` when an item is not a
    /// stored object. Annotation libraries select from one list of all Ingresses many times a
    /// render: the annotations are read once for all of them, so that each selection does not
    /// go through every object again (in a large render, a cache miss or more per object).
    pub(crate) fn annotated(
        &self,
        pick: impl Fn(&[(Box<str>, bool)]) -> bool,
    ) -> Option<Vec<Value>> {
        let items = lock(&self.items);
        let mut annotations = lock(&self.annotations);
        let index = match &*annotations {
            Some(index) => index.clone(),
            None => {
                let mut rows = Vec::new();
                for (at, item) in items.iter().enumerate() {
                    let node = item.downcast_object_ref::<super::objects::JsonNode>()?;
                    if let Some(keys) = node.annotations() {
                        rows.push((at, keys));
                    }
                }
                annotations.insert(Arc::new(Annotations(rows))).clone()
            }
        };
        Some(
            index
                .0
                .iter()
                .filter(|(_, keys)| pick(keys))
                .filter_map(|(at, _)| items.get(*at).cloned())
                .collect(),
        )
    }

    pub(crate) fn snapshot(&self) -> Vec<Value> {
        lock(&self.items).clone()
    }

    /// `f` of the items, locked meanwhile (`f` must not reach this collector).
    pub(crate) fn with_items<R>(&self, f: impl FnOnce(&[Value]) -> R) -> R {
        f(&lock(&self.items))
    }

    fn push(&self, item: Value) {
        let mut items = lock(&self.items);
        items.push(item);
        *lock(&self.annotations) = None;
    }

    fn pop(&self) {
        let mut items = lock(&self.items);
        items.pop();
        *lock(&self.annotations) = None;
    }
}

/// A template map (`{"map": …, "key": …}`) as kept in `shared` and collectors: a sorted row of
/// entries instead of a B-tree node sized for eleven. Renders keep tens of thousands of them
/// (one per route and backend) in their state and in the render cache; they behave as the
/// maps they came from (same keys, order, lookups, equality and JSON).
#[derive(Debug)]
pub(super) struct CompactMap(Box<[(Value, Value)]>);

impl CompactMap {
    /// Whether a collector (mutable) is among its values, at any depth.
    pub(super) fn holds_collector(&self) -> bool {
        fn holds(v: &Value) -> bool {
            if v.downcast_object_ref::<Collector>().is_some() {
                return true;
            }
            if let Some(m) = v.downcast_object_ref::<CompactMap>() {
                return m.holds_collector();
            }
            v.downcast_object_ref::<Vec<Value>>()
                .is_some_and(|items| items.iter().any(holds))
        }
        self.0.iter().any(|(_, v)| holds(v))
    }
}

impl Object for CompactMap {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let i = self.0.binary_search_by(|(k, _)| k.cmp(key)).ok()?;
        Some(self.0[i].1.clone())
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Values(self.0.iter().map(|(k, _)| k.clone()).collect())
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        Some(self.0.len())
    }
}

/// `value` with its template maps (and those inside lists and maps) as [`CompactMap`]s;
/// anything else as it is.
pub(super) fn compact(value: &Value) -> Value {
    if let Some(map) = value.downcast_object_ref::<std::collections::BTreeMap<Value, Value>>() {
        let entries: Box<[(Value, Value)]> =
            map.iter().map(|(k, v)| (k.clone(), compact(v))).collect();
        return Value::from_object(CompactMap(entries));
    }
    if let Some(items) = value.downcast_object_ref::<Vec<Value>>() {
        if items.iter().any(|i| {
            i.downcast_object_ref::<std::collections::BTreeMap<Value, Value>>()
                .is_some()
        }) {
            return Value::from(items.iter().map(compact).collect::<Vec<_>>());
        }
    }
    value.clone()
}

/// Refuses to put into `target` an item that holds `target` (at any depth, through lists, maps,
/// collectors and namespaces): a collector that holds itself has no end, and every walk over
/// it (recording a unit's arguments, comparing them, printing it) would recurse until the stack
/// overflows, which aborts the controller. Items nested deeper than a template can mean are
/// refused as well.
fn refuse_cycle(target: &Collector, item: &Value) -> Result<(), Error> {
    fn holds(v: &Value, target: &Collector, depth: usize) -> bool {
        if depth > 64 {
            return true;
        }
        if let Some(c) = v.downcast_object_ref::<Collector>() {
            return std::ptr::eq(c, target)
                || c.snapshot().iter().any(|i| holds(i, target, depth + 1));
        }
        if let Some(m) = v.downcast_object_ref::<CompactMap>() {
            return m.0.iter().any(|(_, x)| holds(x, target, depth + 1));
        }
        if v.as_object().is_none()
            || v.downcast_object_ref::<super::objects::JsonNode>()
                .is_some()
        {
            // Plain values, and stored objects (immutable JSON), hold no collector.
            return false;
        }
        match v.kind() {
            ValueKind::Seq | ValueKind::Iterable => v
                .try_iter()
                .is_ok_and(|mut items| items.any(|i| holds(&i, target, depth + 1))),
            ValueKind::Map => v.try_iter().is_ok_and(|mut keys| {
                keys.any(|k| holds(&v.get_item(&k).unwrap_or_default(), target, depth + 1))
            }),
            _ => false,
        }
    }
    if holds(item, target, 0) {
        return Err(invalid(
            "a collector cannot hold itself (nor hold items nested more than 64 deep)",
        ));
    }
    Ok(())
}

impl Shared {
    /// [`refuse_cycle`] for the collector under `key`, when there is one.
    fn refuse_cycle(&self, key: &str, item: &Value) -> Result<(), Error> {
        match self.peek(key) {
            Some(v) => match v.downcast_object_ref::<Collector>() {
                Some(c) => refuse_cycle(c, item),
                None => Ok(()),
            },
            None => Ok(()),
        }
    }
}

impl Object for Collector {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Seq
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let items = lock(&self.items);
        let i = key.as_i64()?;
        let i = if i < 0 { items.len() as i64 + i } else { i };
        items.get(usize::try_from(i).ok()?).cloned()
    }

    fn enumerate(self: &Arc<Self>) -> minijinja::value::Enumerator {
        minijinja::value::Enumerator::Values(self.snapshot())
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        Some(lock(&self.items).len())
    }

    fn call_method(
        self: &Arc<Self>,
        _state: &mut State<'_, '_>,
        method: &str,
        args: &[Value],
    ) -> Result<Value, Error> {
        match method {
            "append" => {
                let (item,): (Value,) = from_args(args)?;
                let item = compact(&item);
                refuse_cycle(self, &item)?;
                units::note_collector_append(self.shared_key.as_deref(), &item);
                self.push(item);
                Ok(Value::from(""))
            }
            "extend" => {
                let (items,): (Value,) = from_args(args)?;
                for item in items.try_iter()? {
                    let item = compact(&item);
                    refuse_cycle(self, &item)?;
                    units::note_collector_append(self.shared_key.as_deref(), &item);
                    self.push(item);
                }
                Ok(Value::from(""))
            }
            _ => Err(Error::new(
                ErrorKind::UnknownMethod,
                format!("collector has no method {method:?} (append, extend)"),
            )),
        }
    }
}

/// A status a template wants written to a watched object (`status.set`).
#[derive(Debug, Clone, PartialEq)]
pub struct StatusUpdate {
    pub api_version: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    /// Shared: objects given the same status (every Ingress's load-balancer addresses) hold one.
    pub status: Arc<serde_json::Value>,
}

/// (apiVersion, kind, namespace, name)
pub(crate) type StatusKey = (String, String, String, String);

/// `status`: collects desired statuses; the last `set` for an object wins.
#[derive(Debug, Default)]
pub(crate) struct StatusCollector {
    updates: Mutex<super::PrehashedMap<StatusKey, Arc<serde_json::Value>>>,
    /// The last status set, reused when the next one is equal.
    last: Mutex<Option<Arc<serde_json::Value>>>,
}

impl StatusCollector {
    /// The desired statuses, ordered by apiVersion, kind, namespace and name.
    pub(crate) fn take(&self) -> Vec<StatusUpdate> {
        let mut updates: Vec<_> = std::mem::take(&mut *lock(&self.updates))
            .into_iter()
            .map(|(key, status)| (key.into_key(), status))
            .collect();
        // The keys are a map's: unique, so an unstable sort gives the one order.
        updates.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        updates
            .into_iter()
            .map(
                |((api_version, kind, namespace, name), status)| StatusUpdate {
                    api_version,
                    kind,
                    namespace,
                    name,
                    status,
                },
            )
            .collect()
    }

    pub(super) fn set_status(
        &self,
        key: StatusKey,
        status: Arc<serde_json::Value>,
    ) -> Option<Arc<serde_json::Value>> {
        lock(&self.updates).insert(super::Prehashed::new(key), status)
    }

    /// `status` as an `Arc`, the one of the last status set when they are equal.
    fn shared(&self, status: serde_json::Value) -> Arc<serde_json::Value> {
        let mut last = lock(&self.last);
        match &*last {
            Some(l) if **l == status => l.clone(),
            _ => {
                let status = Arc::new(status);
                *last = Some(status.clone());
                status
            }
        }
    }

    pub(super) fn restore(&self, key: StatusKey, old: Option<Arc<serde_json::Value>>) {
        let mut updates = lock(&self.updates);
        match old {
            Some(v) => {
                updates.insert(super::Prehashed::new(key), v);
            }
            None => {
                updates.remove(&super::Prehashed::new(key));
            }
        }
    }
}

impl Object for StatusCollector {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Plain
    }

    fn call_method(
        self: &Arc<Self>,
        _state: &mut State<'_, '_>,
        method: &str,
        args: &[Value],
    ) -> Result<Value, Error> {
        match method {
            "set" => {
                let (api_version, kind, namespace, name, status): (&str, &str, &str, &str, Value) =
                    from_args(args)?;
                if api_version.is_empty() || kind.is_empty() || name.is_empty() {
                    return Err(invalid("status.set(apiVersion, kind, namespace, name, status) needs apiVersion, kind and name"));
                }
                let status = serde_json::to_value(&status)
                    .map_err(|e| invalid(format!("status.set: status is not JSON-like: {e}")))?;
                if !status.is_object() {
                    return Err(invalid("status.set: status must be a mapping"));
                }
                let key: StatusKey = (
                    api_version.into(),
                    kind.into(),
                    namespace.into(),
                    name.into(),
                );
                let status = self.shared(status);
                let old = self.set_status(key.clone(), status.clone());
                units::note_effect(
                    units::Effect::Status(Box::new(key.clone()), status),
                    units::Undo::Status(Box::new(key), old),
                );
                Ok(Value::from(""))
            }
            _ => Err(Error::new(
                ErrorKind::UnknownMethod,
                format!("status has no method {method:?} (set)"),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitises_cert_names() {
        assert_eq!(
            sanitize_file_name("api.example.com.pem"),
            "api_example_com.pem"
        );
        assert_eq!(sanitize_file_name("a b..c.pem"), "a_b_c.pem");
        assert_eq!(sanitize_file_name("plain"), "plain");
    }

    #[test]
    fn paths_are_relative_to_the_config_dir() {
        let paths = Paths::from_spec(&crate::config::Spec::default());
        assert_eq!(paths.base, "/etc/haproxy");
        assert_eq!(
            paths.get("host.map", FileKind::Map).unwrap(),
            "maps/host.map"
        );
        assert_eq!(
            paths.get("a.example.com.pem", FileKind::Cert).unwrap(),
            "ssl/a_example_com.pem"
        );
        assert_eq!(
            paths.get("list.txt", FileKind::CrtList).unwrap(),
            "general/list.txt"
        );
        assert_eq!(paths.get("", FileKind::Cert).unwrap(), "ssl");
        assert!(paths.get("../etc/passwd", FileKind::General).is_err());
    }

    #[test]
    fn registry_is_idempotent_but_rejects_conflicts() {
        let reg = FileRegistry::new(Paths::from_spec(&crate::config::Spec::default()));
        assert_eq!(
            reg.register(FileKind::Map, "a.map", "x\n".into()).unwrap(),
            "maps/a.map"
        );
        assert_eq!(
            reg.register(FileKind::Map, "a.map", "x\n".into()).unwrap(),
            "maps/a.map"
        );
        assert!(reg
            .register(FileKind::Map, "a.map", "y\n".into())
            .unwrap_err()
            .contains("different content"));
        assert_eq!(reg.take().len(), 1);
    }

    /// `first_seen`'s marks answer as a plain set of strings does, also when keys share a hash
    /// (hashes here are chosen to collide: one of three for every key).
    #[test]
    fn seen_marks_answer_as_a_set_also_when_hashes_collide() {
        let mut seen = Seen::default();
        let mut model = std::collections::HashSet::new();
        let keys = ["a", "b", "c", "d", "e", "", "a\u{1f}b", "ab"];
        let hash = |k: &str| (k.len() % 3) as u64;
        let mut state: u64 = 0x2545_f491_4f6c_dd1d;
        for step in 0..2000 {
            crate::xorshift(&mut state);
            let key = keys[(state % keys.len() as u64) as usize];
            if state % 3 == 0 {
                seen.remove(hash(key), key);
                model.remove(key);
            } else {
                assert_eq!(
                    seen.insert(hash(key), key.to_string()),
                    model.insert(key),
                    "step {step}: {key:?}"
                );
            }
            for k in keys {
                assert_eq!(
                    seen.contains(hash(k), k),
                    model.contains(k),
                    "step {step}: {k:?}"
                );
            }
            // Removing the last key of a hash leaves no empty bucket behind.
            let marked: usize = seen
                .0
                .values()
                .map(|keys| match keys {
                    SeenKeys::One(_) => 1,
                    SeenKeys::Many(all) => {
                        assert!(!all.is_empty(), "step {step}");
                        all.len()
                    }
                })
                .sum();
            assert_eq!(marked, model.len(), "step {step}");
        }
    }
}
