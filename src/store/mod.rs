//! Indexed stores of watched Kubernetes objects.
//!
//! A [`Store`] holds the objects of one watched resource type, keyed by the composite key its
//! `indexBy` expressions produce, and answers exact and prefix lookups in namespace-then-name
//! order. Objects are `Arc`-shared, so cloning a store for a render snapshot copies pointers,
//! never objects. [`ObjectFilter`] prepares objects on arrival (ignored fields stripped,
//! client-side field selector applied).

mod common;
pub mod doc;
pub mod parse;
pub mod path;
pub(crate) mod selector;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde_json::Value;

use crate::config::model::WatchedResource;
use crate::config::Spec;
pub use doc::{Doc, NodeRef};
pub use parse::{Parsed, Shape};
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

/// [`object_key`] of a stored object.
pub fn doc_key(object: &Doc) -> Option<ObjectKey> {
    let meta = object.root().get("metadata")?;
    let name = meta.get("name")?.as_str()?.to_string();
    let namespace = meta
        .get("namespace")
        .and_then(NodeRef::as_str)
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
    /// The object is beyond what a compact document holds (256 MiB of text).
    TooLarge,
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Unnamed => write!(f, "object has no metadata.name"),
            StoreError::MissingIndexValue { object, expression } => {
                write!(f, "object {object} has no scalar value at indexBy expression {expression:?}; not stored")
            }
            StoreError::TooLarge => write!(f, "{}", doc::TooLarge),
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
    /// The packed index key and object key (see [`pack`]), shared with `Store::index`; `None`
    /// while the store has no separate index.
    indexed: Option<Arc<str>>,
    object: Arc<Doc>,
}

/// Several strings as one, order preserved: each part is followed by `\0`, and a `\0` or
/// `\x01` inside a part is written `\x01\x01` or `\x01\x02`. Comparing packed strings compares
/// the parts in turn, and the parts of a prefix pack to a prefix. Stores keep their keys
/// packed: one allocation per key instead of one per part and one per list.
fn pack<S: AsRef<str>>(parts: &[S], out: &mut String) {
    for part in parts {
        for c in part.as_ref().chars() {
            match c {
                '\0' => out.push_str("\x01\x01"),
                '\x01' => out.push_str("\x01\x02"),
                c => out.push(c),
            }
        }
        out.push('\0');
    }
}

fn packed_key(key: &ObjectKey) -> Arc<str> {
    let mut out = String::with_capacity(key.0.len() + key.1.len() + 2);
    pack(&[&key.0, &key.1], &mut out);
    Arc::from(out)
}

/// The parts of a packed string.
fn unpack(packed: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut part = String::new();
    let mut chars = packed.chars();
    while let Some(c) = chars.next() {
        match c {
            '\0' => parts.push(std::mem::take(&mut part)),
            '\x01' => part.push(if chars.next() == Some('\x01') {
                '\0'
            } else {
                '\x01'
            }),
            c => part.push(c),
        }
    }
    parts
}

/// The hash of a packed index key ([`crate::process_hash`]: no one can choose keys that share
/// a bucket).
fn key_hash(packed: &str) -> u64 {
    #[cfg(test)]
    if COLLIDE.with(std::cell::Cell::get) {
        return 0;
    }
    crate::process_hash(packed)
}

/// [`key_hash`] of a whole index key, packed.
fn index_key_hash(index_key: &[String]) -> u64 {
    let mut whole = String::new();
    pack(index_key, &mut whole);
    key_hash(&whole)
}

#[cfg(test)]
thread_local! {
    /// Every key hashes alike (tests of the buckets' checks).
    static COLLIDE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// An object with its key in the store's ordered index: the packed object key in `objects`, or
/// the packed index key and object key in `index`. Either starts with the packed index key.
type Keyed = (Arc<str>, Arc<Doc>);

/// Buckets by [`key_hash`] of the whole index key: the keys are hashes already.
type Exact = HashMap<u64, Bucket, BuildHasherDefault<doc::Passthrough>>;

/// The objects whose whole index key has one hash, by their keys (so by index key, then
/// namespace and name): nearly always one object. Many share one index key when `indexBy`
/// groups them (a Service's EndpointSlices, or every object of a namespace): a B-tree keeps
/// adding and removing one of them logarithmic.
#[derive(Debug, Clone)]
enum Bucket {
    One(Keyed),
    /// Boxed, so that a bucket is as small as one object and its key (24 bytes): there is a
    /// bucket per object in the common case, and this one is rare.
    #[allow(clippy::box_collection)]
    Many(Box<BTreeMap<Arc<str>, Arc<Doc>>>),
}

impl Bucket {
    fn insert(&mut self, (key, object): Keyed) {
        match self {
            Bucket::One((first, first_object)) => {
                let many = BTreeMap::from([(first.clone(), first_object.clone()), (key, object)]);
                *self = Bucket::Many(Box::new(many));
            }
            Bucket::Many(objects) => {
                objects.insert(key, object);
            }
        }
    }

    /// Files `keyed` under `hash`, the hash of its whole index key, in `exact`.
    fn file(exact: &mut Exact, hash: u64, keyed: Keyed) {
        match exact.entry(hash) {
            std::collections::hash_map::Entry::Occupied(mut bucket) => {
                bucket.get_mut().insert(keyed)
            }
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(Bucket::One(keyed));
            }
        }
    }

    /// Takes out the object under `key`; whether the bucket is empty now.
    fn remove(&mut self, key: &str) -> bool {
        match self {
            Bucket::One((first, _)) => **first == *key,
            Bucket::Many(objects) => {
                objects.remove(key);
                if objects.len() == 1 {
                    if let Some((key, object)) = objects.pop_first() {
                        *self = Bucket::One((key, object));
                    }
                    return false;
                }
                objects.is_empty()
            }
        }
    }

    /// The objects whose key starts with `prefix`, in order.
    fn starting_with(&self, prefix: &str) -> Vec<Arc<Doc>> {
        match self {
            Bucket::One((key, object)) if key.starts_with(prefix) => vec![object.clone()],
            Bucket::One(_) => Vec::new(),
            Bucket::Many(objects) => objects
                .range::<str, _>((
                    std::ops::Bound::Included(prefix),
                    std::ops::Bound::Unbounded,
                ))
                .take_while(|(key, _)| key.starts_with(prefix))
                .map(|(_, object)| object.clone())
                .collect(),
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        match self {
            Bucket::One(_) => 1,
            Bucket::Many(objects) => objects.len(),
        }
    }
}

/// How many recent changes a store remembers for [`Store::changed_since`].
const CHANGE_LOG: usize = 1024;

/// Versions are unique across all stores: a store that passed through version `v` descends
/// from the store that had it.
static VERSIONS: AtomicU64 = AtomicU64::new(1);

fn next_version() -> u64 {
    VERSIONS.fetch_add(1, Ordering::Relaxed)
}

/// Objects of one resource type, indexed by their `indexBy` composite key.
#[derive(Debug, Clone)]
pub struct Store {
    index_by: Arc<[PathExpr]>,
    /// By packed object key (namespace, name).
    objects: BTreeMap<Arc<str>, Entry>,
    /// By packed index key followed by the object key. `None` while every object's index key
    /// is its object key (`indexBy` namespace and name, the common case): `objects` is then
    /// in index order already and serves as the index, saving a second entry per object.
    index: Option<BTreeMap<Arc<str>, Arc<Doc>>>,
    /// Every object again, with its key in the ordered index, by the hash of its whole packed
    /// index key: a lookup by a whole key (a Service by namespace and name, a Service's
    /// EndpointSlices) is one probe and one key comparison, where a B-tree descent compares
    /// key strings that each lie elsewhere in memory (in a large store, a cache miss each).
    exact: Exact,
    /// Stamped on every change.
    version: u64,
    /// The index keys the latest changes touched (old and new), by version, oldest first;
    /// every change after `log_floor` is here.
    log: VecDeque<(u64, Arc<[String]>)>,
    log_floor: u64,
}

impl Store {
    pub fn new(index_by: Vec<PathExpr>) -> Store {
        let version = next_version();
        let by_object_key = index_by.len() == 2
            && index_by[0].to_string() == "metadata.namespace"
            && index_by[1].to_string() == "metadata.name";
        Store {
            index_by: index_by.into(),
            objects: BTreeMap::new(),
            index: (!by_object_key).then(BTreeMap::new),
            exact: HashMap::default(),
            version,
            log: VecDeque::new(),
            log_floor: version,
        }
    }

    /// The version of this state of the store (unique across stores and changes).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Whether a lookup by `keys` (all or a prefix of the index key; none for `list()`) may
    /// answer differently now than when this store's history was at `since`. `None` when
    /// that is unknown: `since` is not a state this store passed through, or too long ago.
    pub fn changed_since(&self, since: u64, keys: &[String]) -> Option<bool> {
        if since == self.version {
            return Some(false);
        }
        let after = self.log.partition_point(|(v, _)| *v <= since);
        let passed = since == self.log_floor || (after > 0 && self.log[after - 1].0 == since);
        if !passed {
            return None;
        }
        Some(
            self.log
                .range(after..)
                .any(|(_, changed)| changed.starts_with(keys)),
        )
    }

    /// The index keys changed since this store's history was at `since` (old and new keys of
    /// updated objects); `None` when unknown (as for [`Store::changed_since`]).
    pub fn changes_since(&self, since: u64) -> Option<impl Iterator<Item = &[String]>> {
        let after = self.log.partition_point(|(v, _)| *v <= since);
        let passed = since == self.version
            || since == self.log_floor
            || (after > 0 && self.log[after - 1].0 == since);
        passed.then(|| self.log.range(after..).map(|(_, k)| &k[..]))
    }

    fn log_change(&mut self, index_keys: &[&[String]]) {
        self.version = next_version();
        for key in index_keys {
            self.log.push_back((self.version, Arc::from(*key)));
        }
        while self.log.len() > CHANGE_LOG {
            if let Some((v, _)) = self.log.pop_front() {
                // A version's entries are all dropped before a lookup may start after it.
                self.log_floor = v;
                while self.log.front().is_some_and(|(w, _)| *w == v) {
                    self.log.pop_front();
                }
            }
        }
    }

    /// Every object's index key is its object key (namespace, name): the change log names
    /// the objects that changed.
    pub fn indexed_by_object_key(&self) -> bool {
        self.index.is_none()
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

    fn index_key(&self, object: &Doc, key: &ObjectKey) -> Result<Vec<String>, StoreError> {
        self.index_by
            .iter()
            .map(|expr| {
                expr.key_of_node(object.root())
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

    /// [`Store::upsert`] of a parsed object, kept as a compact [`Doc`].
    pub fn upsert_value(&mut self, object: &Value) -> Result<(), StoreError> {
        let doc = Doc::from_value(object).map_err(|_| StoreError::TooLarge)?;
        self.upsert(Arc::new(doc))
    }

    /// Adds or replaces an object. An object whose index value is missing is not stored, and a
    /// previous version of it is removed (it would otherwise linger under a stale key).
    pub fn upsert(&mut self, object: Arc<Doc>) -> Result<(), StoreError> {
        let key = doc_key(&object).ok_or(StoreError::Unnamed)?;
        let index_key = match self.index_key(&object, &key) {
            Ok(k) => k,
            Err(e) => {
                self.delete(&key);
                return Err(e);
            }
        };
        if self.index.is_none() && (index_key[0] != key.0 || index_key[1] != key.1) {
            // The namespace is there but not a string: index it on its own from now on.
            self.separate_index();
        }
        let packed = packed_key(&key);
        let old = self.objects.remove(&packed);
        let old_key = old.as_ref().map(|old| self.unindex(&packed, old));
        match old_key {
            Some(old_key) if old_key != index_key => self.log_change(&[&old_key, &index_key]),
            _ => self.log_change(&[&index_key]),
        }
        let indexed = self.index.as_mut().map(|index| {
            let mut indexed = String::new();
            pack(&index_key, &mut indexed);
            indexed.push_str(&packed);
            let indexed: Arc<str> = Arc::from(indexed);
            index.insert(indexed.clone(), object.clone());
            indexed
        });
        let keyed = (
            indexed.clone().unwrap_or_else(|| packed.clone()),
            object.clone(),
        );
        self.objects.insert(packed, Entry { indexed, object });
        Bucket::file(&mut self.exact, index_key_hash(&index_key), keyed);
        Ok(())
    }

    /// Removes the index entries of an object taken out of `objects` (under `packed`); its
    /// index key.
    fn unindex(&mut self, packed: &str, old: &Entry) -> Vec<String> {
        let index_key = match &old.indexed {
            None => unpack(packed),
            Some(indexed) => {
                if let Some(index) = &mut self.index {
                    index.remove(indexed);
                }
                let mut index_key = unpack(indexed);
                index_key.truncate(index_key.len().saturating_sub(2));
                index_key
            }
        };
        let hash = index_key_hash(&index_key);
        if self
            .exact
            .get_mut(&hash)
            .is_some_and(|bucket| bucket.remove(old.indexed.as_deref().unwrap_or(packed)))
        {
            self.exact.remove(&hash);
        }
        index_key
    }

    /// Gives the store an index of its own (every object's index key was its object key).
    fn separate_index(&mut self) {
        let mut index = BTreeMap::new();
        // Buckets hold each object's key in the index, which changes here; an index key is
        // still its object key, packed alike.
        self.exact.clear();
        for (packed, entry) in &mut self.objects {
            let indexed: Arc<str> = Arc::from(format!("{packed}{packed}"));
            index.insert(indexed.clone(), entry.object.clone());
            let keyed = (indexed.clone(), entry.object.clone());
            Bucket::file(&mut self.exact, key_hash(packed), keyed);
            entry.indexed = Some(indexed);
        }
        self.index = Some(index);
    }

    /// Removes exactly this object; others sharing its index key stay.
    pub fn delete(&mut self, key: &ObjectKey) -> bool {
        let packed = packed_key(key);
        match self.objects.remove(&packed) {
            Some(old) => {
                let index_key = self.unindex(&packed, &old);
                self.log_change(&[&index_key]);
                true
            }
            None => false,
        }
    }

    pub fn get_by_key(&self, key: &ObjectKey) -> Option<&Arc<Doc>> {
        self.objects.get(&packed_key(key)).map(|e| &e.object)
    }

    /// The (namespace, name) of every object, in that order.
    pub fn keys(&self) -> impl Iterator<Item = ObjectKey> + '_ {
        self.objects.keys().map(|k| {
            let mut parts = unpack(k).into_iter();
            let namespace = parts.next().unwrap_or_default();
            (namespace, parts.next().unwrap_or_default())
        })
    }

    /// Every object, ordered by namespace then name.
    pub fn list(&self) -> impl ExactSizeIterator<Item = &Arc<Doc>> {
        self.objects.values().map(|e| &e.object)
    }

    /// Objects whose composite key equals `keys` (all expressions given) or starts with it
    /// (fewer given), ordered by namespace then name.
    pub fn fetch(&self, keys: &[String]) -> Result<Vec<Arc<Doc>>, StoreError> {
        if keys.len() > self.index_by.len() {
            return Err(StoreError::TooManyKeys {
                given: keys.len(),
                index_by: self.index_by.len(),
            });
        }
        let mut prefix = String::new();
        pack(keys, &mut prefix);
        if keys.len() == self.index_by.len() {
            let Some(bucket) = self.exact.get(&key_hash(&prefix)) else {
                return Ok(Vec::new());
            };
            // Each key starts with its whole packed index key, which ends where the object
            // key starts: a key that starts with `prefix` is of an object under `keys`.
            return Ok(bucket.starting_with(&prefix));
        }
        let Some(index) = &self.index else {
            // Index keys are object keys: `objects` is the index, in namespace/name order.
            return Ok(self
                .objects
                .range::<str, _>((
                    std::ops::Bound::Included(&*prefix),
                    std::ops::Bound::Unbounded,
                ))
                .take_while(|(packed, _)| packed.starts_with(&*prefix))
                .map(|(_, e)| e.object.clone())
                .collect());
        };
        let prefix: Arc<str> = Arc::from(prefix);
        let found = index
            .range(prefix.clone()..)
            .take_while(|(indexed, _)| indexed.starts_with(&*prefix));
        // Prefix matches span several composite keys; restore namespace/name order.
        let mut found: Vec<(ObjectKey, &Arc<Doc>)> =
            found.filter_map(|(_, o)| Some((doc_key(o)?, o))).collect();
        found.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(found.into_iter().map(|(_, o)| o.clone()).collect())
    }

    /// The single object matching `keys`; `None` when there are none or several.
    pub fn get_one(&self, keys: &[String]) -> Result<Option<Arc<Doc>>, StoreError> {
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
        if !self.selects(&object) {
            return None;
        }
        for path in &self.ignore_fields {
            path.remove(&mut object);
        }
        Some(object)
    }

    /// Whether the object passes the field selector.
    pub fn selects(&self, object: &Value) -> bool {
        self.field_selector
            .as_ref()
            .is_none_or(|s| s.matches(object))
    }
}

/// Path expressions from config text (checked by config validation; a bad one is skipped).
fn paths(exprs: &[String]) -> Vec<PathExpr> {
    exprs
        .iter()
        .filter_map(|e| PathExpr::parse(e).ok())
        .collect()
}

impl Store {
    /// An empty store indexed by `indexBy` expressions.
    pub fn indexed_by(index_by: &[String]) -> Store {
        Store::new(paths(index_by))
    }

    /// An empty store indexed the way a watched resource asks.
    pub fn for_resource(resource: &WatchedResource) -> Store {
        Store::indexed_by(&resource.index_by)
    }
}

impl ObjectFilter {
    /// The arrival filter from ignored-field expressions and a field selector.
    pub fn new(ignore_fields: &[String], field_selector: Option<&str>) -> ObjectFilter {
        ObjectFilter {
            ignore_fields: paths(ignore_fields),
            field_selector: field_selector.and_then(|s| FieldSelector::parse(s).ok()),
        }
    }

    /// The arrival filter of a watched resource.
    pub fn for_resource(spec: &Spec, resource: &WatchedResource) -> ObjectFilter {
        ObjectFilter::new(
            &spec.watched_resources_ignore_fields,
            resource.field_selector.as_deref(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn slice(ns: &str, name: &str, service: &str) -> Arc<Doc> {
        let v = json!({"metadata": {"namespace": ns, "name": name, "labels": {"kubernetes.io/service-name": service}}});
        Arc::new(Doc::from_value(&v).unwrap())
    }

    fn store() -> Store {
        Store::new(vec![
            PathExpr::parse("metadata.namespace").unwrap(),
            PathExpr::parse(r"metadata.labels.kubernetes\.io/service-name").unwrap(),
        ])
    }

    fn names(objects: &[Arc<Doc>]) -> Vec<String> {
        objects
            .iter()
            .map(|o| {
                let (ns, name) = doc_key(o).unwrap();
                format!("{ns}/{name}")
            })
            .collect()
    }

    fn k(parts: &[&str]) -> Vec<String> {
        parts.iter().map(|s| s.to_string()).collect()
    }

    /// The objects whose index key is `keys`, found the slow way: every object, in order.
    fn scanned(s: &Store, keys: &[String]) -> Vec<String> {
        let found: Vec<Arc<Doc>> = s
            .list()
            .filter(|o| {
                s.index_by
                    .iter()
                    .map(|e| e.key_of_node(o.root()))
                    .eq(keys.iter().map(|k| Some(k.clone())))
            })
            .cloned()
            .collect();
        names(&found)
    }

    /// Random upserts (moving objects between keys, making a namespace a number) and deletes,
    /// with every whole-key lookup checked against a scan after each step: in stores keyed by
    /// namespace and name and by a label, and with every key hashed alike, so that each
    /// lookup must tell apart the objects of other keys in its bucket.
    #[test]
    fn whole_key_lookups_answer_as_a_scan_of_every_object() {
        for collide in [false, true] {
            COLLIDE.with(|c| c.set(collide));
            let mut rng: u64 = 0x2545_f491_4f6c_dd1d;
            let mut next = |n: u64| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng % n
            };
            let mut by_label = store();
            let mut by_name = Store::indexed_by(&k(&["metadata.namespace", "metadata.name"]));
            // Every object of a namespace under one key: large buckets.
            let mut by_namespace = Store::indexed_by(&k(&["metadata.namespace"]));
            let namespaces = ["a", "b", "a\0", "7"];
            for _ in 0..600 {
                let ns = namespaces[next(4) as usize];
                let name = format!("n{}", next(6));
                let service = format!("s{}", next(3));
                match next(5) {
                    0 => {
                        let key = (ns.to_string(), name);
                        by_label.delete(&key);
                        by_name.delete(&key);
                        by_namespace.delete(&key);
                    }
                    1 if ns == "7" => {
                        // A namespace the API server would never send: a number. It is
                        // still a key, in decimal.
                        let v = json!({"metadata": {"namespace": 7, "name": name,
                            "labels": {"kubernetes.io/service-name": service}}});
                        let doc = Arc::new(Doc::from_value(&v).unwrap());
                        let _ = by_label.upsert(doc.clone());
                        let _ = by_namespace.upsert(doc.clone());
                        let _ = by_name.upsert(doc);
                    }
                    _ => {
                        by_label.upsert(slice(ns, &name, &service)).unwrap();
                        by_name.upsert(slice(ns, &name, &service)).unwrap();
                        by_namespace.upsert(slice(ns, &name, &service)).unwrap();
                    }
                }
                for ns in namespaces {
                    let keys = [ns.to_string()];
                    assert_eq!(
                        names(&by_namespace.fetch(&keys).unwrap()),
                        scanned(&by_namespace, &keys),
                        "{keys:?} (every key hashed alike: {collide})"
                    );
                    for second in ["s0", "s1", "s2", "n0", "n1", "n2", "n3", "n4", "n5"] {
                        let keys = [ns.to_string(), second.to_string()];
                        for s in [&by_label, &by_name] {
                            assert_eq!(
                                names(&s.fetch(&keys).unwrap()),
                                scanned(s, &keys),
                                "{keys:?} (every key hashed alike: {collide})"
                            );
                        }
                    }
                }
            }
            assert!(by_label.len() > 10 && by_name.len() > 10 && by_namespace.len() > 10);
            assert_eq!(std::mem::size_of::<Bucket>(), 24);
            let buckets: usize = by_label.exact.values().map(Bucket::len).sum();
            assert_eq!(buckets, by_label.len(), "every object once in the buckets");
        }
        COLLIDE.with(|c| c.set(false));
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
        let unindexable = json!({"metadata": {"namespace": "a", "name": "one"}});
        let err = s.upsert_value(&unindexable).unwrap_err();
        assert!(
            err.to_string().contains("a/one") && err.to_string().contains("service-name"),
            "{err}"
        );
        assert!(s.is_empty(), "the stale version is gone");
    }

    #[test]
    fn index_values_with_control_characters_keep_their_order_and_prefixes() {
        // Values the packed keys must escape: a prefix lookup for "a" must not see "a\0b" or
        // "a\x01", and every object is found under its own key.
        let mut s = store();
        let services = ["a", "a\0b", "a\x01", "a\x01\x01", "", "\0", "b"];
        for (i, svc) in services.iter().enumerate() {
            s.upsert(slice("ns", &format!("s{i}"), svc)).unwrap();
        }
        for (i, svc) in services.iter().enumerate() {
            assert_eq!(
                names(&s.fetch(&k(&["ns", svc])).unwrap()),
                [format!("ns/s{i}")],
                "{svc:?}"
            );
        }
        assert_eq!(s.fetch(&k(&["ns"])).unwrap().len(), services.len());
        assert_eq!(
            s.keys().collect::<Vec<_>>(),
            (0..services.len())
                .map(|i| ("ns".to_string(), format!("s{i}")))
                .collect::<Vec<_>>()
        );
        // Moving between such keys logs both the old and the new key.
        let before = s.version();
        s.upsert(slice("ns", "s1", "b")).unwrap();
        assert_eq!(s.changed_since(before, &k(&["ns", "a\0b"])), Some(true));
        assert_eq!(s.changed_since(before, &k(&["ns", "a"])), Some(false));
        assert_eq!(
            names(&s.fetch(&k(&["ns", "b"])).unwrap()),
            ["ns/s1", "ns/s6"]
        );
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

    #[test]
    fn change_log_answers_which_lookups_changed() {
        let mut s = store();
        s.upsert(slice("a", "one", "web")).unwrap();
        s.upsert(slice("b", "two", "api")).unwrap();
        let since = s.version();
        assert_eq!(s.changed_since(since, &k(&["a"])), Some(false));
        s.upsert(slice("a", "one", "web")).unwrap();
        assert_eq!(s.changed_since(since, &k(&["a", "web"])), Some(true));
        assert_eq!(s.changed_since(since, &k(&["a"])), Some(true));
        assert_eq!(s.changed_since(since, &[]), Some(true), "list() changed");
        assert_eq!(s.changed_since(since, &k(&["b", "api"])), Some(false));
        assert_eq!(s.changed_since(since, &k(&["a", "api"])), Some(false));
        // Moving between keys changes both; deleting changes the old one.
        let moved = s.version();
        s.upsert(slice("a", "one", "api")).unwrap();
        assert_eq!(s.changed_since(moved, &k(&["a", "web"])), Some(true));
        assert_eq!(s.changed_since(moved, &k(&["a", "api"])), Some(true));
        let deleted = s.version();
        s.delete(&("b".into(), "two".into()));
        assert_eq!(s.changed_since(deleted, &k(&["b", "api"])), Some(true));
        assert_eq!(
            s.changes_since(since).unwrap().count(),
            4,
            "one update, one move (two keys), one delete"
        );
    }

    #[test]
    fn stores_by_namespace_and_name_answer_as_stores_with_a_separate_index() {
        let by_key = || Store::indexed_by(&k(&["metadata.namespace", "metadata.name"]));
        let mut shared = by_key();
        assert!(shared.index.is_none(), "objects serve as the index");
        let mut separate = by_key();
        separate.separate_index();
        let mut seed = 7u64;
        let mut next = |n: u64| {
            crate::xorshift(&mut seed);
            seed % n
        };
        let lookups = [
            k(&[]),
            k(&["a"]),
            k(&["b"]),
            k(&["a", "n1"]),
            k(&["", "n2"]),
        ];
        let mut versions = Vec::new();
        for step in 0..400 {
            let (ns, name) = (
                ["a", "b", "ab", ""][next(4) as usize],
                format!("n{}", next(6)),
            );
            if step == 300 {
                // A namespace that is not a string: its index key is no longer the object key.
                let odd = json!({"metadata": {"namespace": 5, "name": "odd"}});
                assert!(shared.upsert_value(&odd).is_ok());
                assert!(separate.upsert_value(&odd).is_ok());
                assert!(shared.index.is_some());
            }
            if next(3) == 0 {
                let key = (ns.to_string(), name.clone());
                assert_eq!(shared.delete(&key), separate.delete(&key));
            } else {
                let v = if ns.is_empty() {
                    json!({"metadata": {"name": name}, "v": next(3)})
                } else {
                    json!({"metadata": {"namespace": ns, "name": name}, "v": next(3)})
                };
                assert_eq!(shared.upsert_value(&v), separate.upsert_value(&v));
            }
            versions.push((shared.version(), separate.version()));
            assert_eq!(
                shared.keys().collect::<Vec<_>>(),
                separate.keys().collect::<Vec<_>>()
            );
            for keys in lookups.iter().chain([&k(&["5"]), &k(&["5", "odd"])]) {
                let (a, b) = (shared.fetch(keys).unwrap(), separate.fetch(keys).unwrap());
                assert_eq!(a, b, "{keys:?}");
                for &(va, vb) in versions.iter().rev().take(5) {
                    assert_eq!(
                        shared.changed_since(va, keys),
                        separate.changed_since(vb, keys)
                    );
                }
            }
        }
    }

    #[test]
    fn change_log_refuses_unknown_history() {
        let mut s = store();
        s.upsert(slice("a", "one", "web")).unwrap();
        let base = s.version();
        // Two stores derived from one: neither knows the other's change.
        let mut left = s.clone();
        let mut right = s.clone();
        left.upsert(slice("a", "two", "web")).unwrap();
        right.upsert(slice("b", "three", "api")).unwrap();
        assert_eq!(right.changed_since(left.version(), &k(&["b"])), None);
        assert_eq!(right.changed_since(base, &k(&["a"])), Some(false));
        // Another store with the same contents never shares a version.
        let mut other = store();
        other.upsert(slice("a", "one", "web")).unwrap();
        assert_eq!(other.changed_since(base, &k(&["a"])), None);
        // Past the log's reach the answer is unknown.
        for i in 0..=CHANGE_LOG {
            s.upsert(slice("c", &format!("n{i}"), "x")).unwrap();
        }
        assert_eq!(s.changed_since(base, &k(&["a"])), None);
    }
}
