//! Render units: memoized, fault-isolated pieces of a render (DESIGN §4).
//!
//! A template calls `unit("template-name", owner=obj, key=…, var=…)` to render one object's
//! share of the configuration (one Ingress, one backend, one route). The engine then:
//!
//! - **records** what the unit read (store lookups, `shared` keys written by others,
//!   `first_seen` answers, `current_config` backends) and what it did (its output text,
//!   `shared` writes and appends, `first_seen` marks, `status.set`, `files.register`);
//! - **replays** the recording in later renders while the unit's arguments and every recorded
//!   read are unchanged, so a change costs in proportion to the units it touches;
//! - **isolates faults**: a unit that fails (`fail()`, a refused tenant value, an unsafe
//!   value printed raw) is dropped — its effects undone, its output empty — and the failure is
//!   reported against its owner object, so one tenant's bad value never stops the others;
//! - **marks its output** with private-use delimiters, so that after rendering the engine knows
//!   which lines of which file each unit wrote (used to map `haproxy -c` errors back to units).
//!
//! Correctness is defined by the full render: replaying is byte-for-byte equal to rendering
//! from scratch (checked by the differential test in `tests.rs`).
//!
//! The recorder is thread-local: a render runs on one thread, and nested units stack.

use super::{HashMap, HashSet};
use std::cell::RefCell;
use std::fmt;
use std::sync::Arc;

use haptic_agent::protocol::FileKind;
use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Error, ErrorKind, State};

use super::context::{Collector, FileRegistry, Shared, StatusCollector};
use super::current_config::Backend;
use super::objects::JsonNode;
use crate::process_hash;
use crate::store::Store;

/// Starts a unit's output; followed by the unit's instance number and [`MARK_ID_END`].
pub const MARK_START: char = '\u{E000}';
pub const MARK_ID_END: char = '\u{E001}';
/// Ends a unit's output.
pub const MARK_END: char = '\u{E002}';

/// Identifies a unit across renders: its template and its key.
#[derive(Debug, Clone)]
pub struct UnitKey {
    template: String,
    key: String,
    /// [`process_hash`] of both, taken once: a unit's key is hashed several times a render
    /// (cache lookups, the splicing index), mostly long after its strings left the cache.
    hash: u64,
}

impl UnitKey {
    pub fn new(template: String, key: String) -> UnitKey {
        let hash = process_hash(&(template.as_str(), key.as_str()));
        UnitKey {
            template,
            key,
            hash,
        }
    }

    pub fn template(&self) -> &str {
        &self.template
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    /// The hash taken at creation (equal keys have equal hashes, in this process).
    pub(super) fn prehash(&self) -> u64 {
        self.hash
    }
}

impl PartialEq for UnitKey {
    fn eq(&self, other: &UnitKey) -> bool {
        self.hash == other.hash && self.template == other.template && self.key == other.key
    }
}

impl Eq for UnitKey {}

impl std::hash::Hash for UnitKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl PartialOrd for UnitKey {
    fn partial_cmp(&self, other: &UnitKey) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for UnitKey {
    fn cmp(&self, other: &UnitKey) -> std::cmp::Ordering {
        (&self.template, &self.key).cmp(&(&other.template, &other.key))
    }
}

impl fmt::Display for UnitKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}]", self.template, self.key)
    }
}

/// The object a unit renders for: errors and drops are reported against it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Owner {
    pub api_version: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.kind.is_empty() {
            "object"
        } else {
            &self.kind
        };
        if self.namespace.is_empty() {
            write!(f, "{kind} {}", self.name)
        } else {
            write!(f, "{kind} {}/{}", self.namespace, self.name)
        }
    }
}

impl Owner {
    fn from_value(v: &Value) -> Option<Owner> {
        if let Some(s) = v.as_str() {
            return Some(Owner {
                name: s.to_string(),
                ..Owner::default()
            });
        }
        let text = |v: Value| v.as_str().map(str::to_string).unwrap_or_default();
        let meta = v.get_attr("metadata").ok()?;
        let name = text(meta.get_attr("name").ok()?);
        if name.is_empty() {
            return None;
        }
        Some(Owner {
            api_version: text(v.get_attr("apiVersion").unwrap_or_default()),
            kind: text(v.get_attr("kind").unwrap_or_default()),
            namespace: text(meta.get_attr("namespace").unwrap_or_default()),
            name,
        })
    }
}

/// An object left out of the configuration, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    pub owner: Owner,
    /// The first failure: a `fail()` or refusal message verbatim, a template error with its
    /// line, or why `haproxy -c` rejected the object's lines.
    pub message: String,
}

impl fmt::Display for Dropped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: left out of the configuration: {}",
            self.owner, self.message
        )
    }
}

/// Where one unit's output landed: lines `first..=last` (1-based) of an output file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitSpan {
    pub unit: Arc<UnitKey>,
    pub owner: Arc<Owner>,
    /// The output template (`haproxy.cfg`, a map, …).
    pub output: Arc<str>,
    pub first: usize,
    pub last: usize,
    /// Rendered from scratch in this render (not replayed), so not proven by an earlier check.
    pub fresh: bool,
}

// ---------------------------------------------------------------------------------------
// Recording

/// A read whose answer a unit's output depends on.
#[derive(Debug, Clone)]
pub(super) enum Read {
    /// Boxed, as the rarer large variants are: every unit keeps its reads for as long as it
    /// is cached, and most are `Shared` and `Seen`.
    Store(Box<StoreRead>),
    Shared {
        key: String,
        value: Option<Value>,
    },
    Seen {
        key: String,
        fresh: bool,
    },
    Current {
        backend: String,
        value: Option<Box<Backend>>,
    },
}

/// A store lookup and its answer.
#[derive(Debug, Clone)]
pub(super) struct StoreRead {
    pub store: String,
    pub method: StoreMethod,
    pub keys: Vec<String>,
    /// [`read_hash`] of the store, and of the store and keys: taken while they are at hand,
    /// so that indexing the readers of a large render does not chase every key's string.
    pub store_hash: u64,
    pub keys_hash: u64,
    pub result: Vec<Arc<crate::store::Doc>>,
    /// The store's version when the answer was last known to hold (0: no such store).
    pub version: Stamp,
}

/// A store version, moved forward when a read is found to still hold at a later one (so the
/// next check looks at few changes).
#[derive(Debug)]
pub(super) struct Stamp(std::sync::atomic::AtomicU64);

impl Stamp {
    fn get(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn set(&self, version: u64) {
        self.0.store(version, std::sync::atomic::Ordering::Relaxed)
    }
}

impl Clone for Stamp {
    fn clone(&self) -> Stamp {
        Stamp(std::sync::atomic::AtomicU64::new(self.get()))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreMethod {
    List,
    Fetch,
    Get,
}

/// A change a unit made to the render's state, replayable in order.
#[derive(Debug, Clone)]
pub enum Effect {
    SharedSet(String, Value),
    SharedAppend(String, Value),
    Seen(String),
    /// Boxed (as is `File`'s): cached units keep their effects, and most are the small kinds.
    Status(Box<super::context::StatusKey>, Arc<serde_json::Value>),
    File(Box<(FileKind, String, String)>),
}

/// How to take an effect back when its unit fails.
#[derive(Debug)]
pub enum Undo {
    SharedSet(String, Option<Value>),
    SharedAppend(String),
    Seen(String),
    Status(
        Box<super::context::StatusKey>,
        Option<Arc<serde_json::Value>>,
    ),
    File(String),
    Nothing,
}

#[derive(Debug, Default, Clone)]
pub(super) struct Recording {
    pub reads: Vec<Read>,
    pub effects: Vec<Effect>,
    pub children: Vec<UnitKey>,
}

#[derive(Default)]
struct Frame {
    rec: Recording,
    undo: Vec<Undo>,
    /// Shared keys and first_seen keys this unit wrote: its later reads of them follow from
    /// its own inputs and need no recording.
    wrote_shared: HashSet<String>,
    wrote_seen: HashSet<String>,
    /// Set on the frame of an output template's top level (not a unit): the units it called,
    /// in order. Its own store and `current_config` reads are kept; `shared` and `first_seen`
    /// reads and all effects are not (they follow from the units' effects, see `splice`).
    top: Option<Vec<TopCall>>,
}

/// A unit called from the top level of an output template.
#[derive(Debug, Clone)]
pub(super) struct TopCall {
    pub unit: Arc<UnitKey>,
    /// The output instance, or `None` when the owner was left out (excluded).
    pub instance: Option<usize>,
}

/// What the top level of one output template read and called.
#[derive(Debug, Default)]
pub(super) struct TopTrace {
    pub reads: Vec<Read>,
    pub calls: Vec<TopCall>,
}

/// One memoized unit (recording and outcome shared: a replay clones pointers, not text).
pub(super) struct Entry {
    /// The unit's key and owner, shared with its instances and spans in every render.
    pub unit: Arc<UnitKey>,
    pub owner: Arc<Owner>,
    pub args: Vec<(Arc<str>, Value)>,
    pub rec: Arc<Recording>,
    pub outcome: Arc<Result<String, String>>,
    pub generation: u64,
    /// Part of a render whose configuration passed `haproxy -c`.
    pub validated: bool,
}

/// Memoized units of one engine, kept by the caller between renders (the reconciler and the
/// webhook each keep theirs). Entries unused by a render are dropped after it.
#[derive(Default)]
pub struct RenderCache {
    engine_id: u64,
    context: Option<serde_json::Map<String, serde_json::Value>>,
    base_dir: Option<String>,
    pub(super) entries: HashMap<Arc<UnitKey>, Entry>,
    pub(super) generation: u64,
    /// Owners left out because `haproxy -c` rejected their lines, with the reason; they stay
    /// out while their units would replay unchanged.
    pub(super) excluded: HashMap<Owner, String>,
    /// The last render, kept for splicing the next one (`splice`).
    pub(super) last: Option<Box<super::splice::LastRender>>,
    /// The caller renders once (`haptic render`): no last render is kept.
    pub(super) once: bool,
    pub stats: CacheStats,
}

impl fmt::Debug for RenderCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RenderCache")
            .field("entries", &self.entries.len())
            .field("excluded", &self.excluded.len())
            .field("stats", &self.stats)
            .finish()
    }
}

/// Counters of the last render.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CacheStats {
    pub replayed: usize,
    pub rendered: usize,
    pub dropped: usize,
    /// The render spliced the changed units into the last output instead of evaluating the
    /// output templates again.
    pub spliced: bool,
}

impl RenderCache {
    pub fn new() -> RenderCache {
        RenderCache::default()
    }

    /// For a process that renders one configuration and exits (`haptic render`): units are
    /// memoized (re-renders that leave rejected objects out replay the rest), but the last
    /// render is not kept for splicing, which only a later change would use. At 10,000
    /// Ingresses that index and its copy of the unmarked texts are about 10 MB.
    pub fn once() -> RenderCache {
        RenderCache {
            once: true,
            ..RenderCache::default()
        }
    }

    /// Whether the entries belong to this engine and extraContext.
    pub(super) fn compatible(
        &self,
        engine_id: u64,
        context: &serde_json::Map<String, serde_json::Value>,
        base_dir: &Option<String>,
    ) -> bool {
        self.engine_id == engine_id
            && self.context.as_ref() == Some(context)
            && &self.base_dir == base_dir
    }

    /// Forgets entries that belong to another engine or another extraContext.
    pub(super) fn prepare(
        &mut self,
        engine_id: u64,
        context: &serde_json::Map<String, serde_json::Value>,
        base_dir: &Option<String>,
    ) {
        self.last = None;
        if !self.compatible(engine_id, context, base_dir) {
            self.entries.clear();
            self.excluded.clear();
            self.engine_id = engine_id;
            self.context = Some(context.clone());
            self.base_dir = base_dir.clone();
        }
        self.generation += 1;
        self.stats = CacheStats::default();
    }

    pub(super) fn sweep(&mut self) {
        let generation = self.generation;
        self.entries.retain(|_, e| e.generation == generation);
    }

    /// Marks every unit of the last render as proven by `haproxy -c`.
    pub fn mark_validated(&mut self) {
        if let Some(last) = &mut self.last {
            last.mark_validated();
        }
        let generation = self.generation;
        for e in self.entries.values_mut() {
            if e.generation == generation {
                e.validated = true;
            }
        }
    }

    /// Leaves an owner's units out of later renders while they are unchanged.
    pub fn exclude(&mut self, owner: &Owner, reason: String) {
        self.excluded.insert(owner.clone(), reason);
    }

    /// Takes back an exclusion.
    pub fn include(&mut self, owner: &Owner) {
        self.excluded.remove(owner);
    }

    /// The exclusions as they are now, to [`RenderCache::restore_exclusions`] later.
    pub fn exclusions(&self) -> HashMap<Owner, String> {
        self.excluded.clone()
    }

    /// Puts back exclusions taken with [`RenderCache::exclusions`]: a render for another state
    /// of the stores (the webhook's, without a change) does not inherit those made since.
    pub fn restore_exclusions(&mut self, exclusions: HashMap<Owner, String>) {
        self.excluded = exclusions;
    }

    pub fn excluded(&self) -> impl Iterator<Item = (&Owner, &str)> {
        self.excluded.iter().map(|(k, r)| (k, r.as_str()))
    }
}

/// Everything the `unit` function needs during one render.
pub(super) struct Scope {
    pub root: Value,
    pub shared: Arc<Shared>,
    pub status: Arc<StatusCollector>,
    pub files: Arc<FileRegistry>,
    pub stores: std::collections::BTreeMap<String, Arc<Store>>,
    pub current: Option<Arc<super::current_config::CurrentConfig>>,
    pub cache: RenderCache,
    pub instances: Vec<Instance>,
    pub dropped: Vec<Dropped>,
    /// Owners whose units failed in an earlier pass of this render: left out entirely.
    pub failed: HashMap<Owner, String>,
    /// Owners whose units failed in this pass.
    pub newly_failed: HashMap<Owner, String>,
    /// Owners already reported in `dropped` in this pass.
    pub reported: HashSet<Owner>,
    /// Which owner's unit registered each auxiliary file (maps `haproxy -c` errors that name a
    /// file, such as a certificate, back to an object).
    pub file_owners: Vec<(String, Owner)>,
    /// With debug logging: calls and time per unit template.
    pub timings: HashMap<String, (usize, std::time::Duration)>,
    /// Per output template, in order: what its top level read and called.
    pub traces: Vec<TopTrace>,
    /// A template used a unit's output other than by printing it.
    pub inspected: bool,
}

impl Scope {
    pub(super) fn new(
        root: Value,
        shared: Arc<Shared>,
        status: Arc<StatusCollector>,
        files: Arc<FileRegistry>,
        inputs: &super::RenderInputs,
        cache: RenderCache,
        failed: HashMap<Owner, String>,
    ) -> Scope {
        Scope {
            root,
            shared,
            status,
            files,
            stores: inputs.stores.clone(),
            current: inputs.current_config.clone(),
            cache,
            instances: Vec::new(),
            dropped: failed
                .iter()
                .map(|(owner, message)| Dropped {
                    owner: owner.clone(),
                    message: message.clone(),
                })
                .collect(),
            reported: failed.keys().cloned().collect(),
            failed,
            newly_failed: HashMap::default(),
            file_owners: Vec::new(),
            timings: HashMap::default(),
            traces: Vec::new(),
            inspected: false,
        }
    }
}

#[derive(Clone)]
pub(super) struct Instance {
    /// Shared with the render's unit spans.
    pub unit: Arc<UnitKey>,
    pub owner: Arc<Owner>,
    pub fresh: bool,
}

thread_local! {
    static SCOPE: RefCell<Option<Scope>> = const { RefCell::new(None) };
    static FRAMES: RefCell<Vec<Frame>> = const { RefCell::new(Vec::new()) };
    /// [`Scope::inspected`] while the scope is installed: set without borrowing the scope,
    /// because a unit's output may be printed while the scope is borrowed (the engine compares
    /// a replay candidate's arguments, which may hold another unit's output).
    static INSPECTED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Installs the render scope for the duration of a render on this thread.
pub(super) fn enter(scope: Scope) {
    SCOPE.with(|s| *s.borrow_mut() = Some(scope));
    FRAMES.with(|f| f.borrow_mut().clear());
    INSPECTED.with(|i| i.set(false));
}

/// Ends the render; returns the scope (with the cache) to the caller.
pub(super) fn leave() -> Option<Scope> {
    FRAMES.with(|f| f.borrow_mut().clear());
    let inspected = INSPECTED.with(|i| i.replace(false));
    SCOPE.with(|s| s.borrow_mut().take()).map(|mut scope| {
        scope.inspected |= inspected;
        scope
    })
}

/// Whether reads are being recorded: callers skip costly bookkeeping otherwise.
pub(super) fn recording() -> bool {
    FRAMES.with(|f| !f.borrow().is_empty())
}

/// Whether the innermost frame is a unit's (not an output's top level): only there are effects
/// and `first_seen` answers recorded.
pub(super) fn in_unit() -> bool {
    FRAMES.with(|f| f.borrow().last().is_some_and(|f| f.top.is_none()))
}

/// Starts recording the top level of an output template.
pub(super) fn begin_output() {
    FRAMES.with(|f| {
        f.borrow_mut().push(Frame {
            top: Some(Vec::new()),
            ..Frame::default()
        })
    });
}

/// Ends the top level of an output template; keeps its trace in the scope.
pub(super) fn end_output() {
    let frame = FRAMES.with(|f| f.borrow_mut().pop());
    if let Some(Frame {
        rec,
        top: Some(calls),
        ..
    }) = frame
    {
        with_scope(|s| {
            s.traces.push(TopTrace {
                reads: rec.reads,
                calls,
            })
        });
    }
}

/// Notes a unit called from an output's top level.
fn note_top_call(unit: &Arc<UnitKey>, instance: Option<usize>) {
    with_frame(|frame| {
        if let Some(calls) = &mut frame.top {
            calls.push(TopCall {
                unit: Arc::clone(unit),
                instance,
            });
        }
    });
}

/// Runs `f` on the innermost unit's frame (no-op outside units).
fn with_frame(f: impl FnOnce(&mut Frame)) {
    FRAMES.with(|frames| {
        if let Some(frame) = frames.borrow_mut().last_mut() {
            f(frame);
        }
    });
}

fn record_read(read: Read) {
    with_frame(|frame| frame.push_read(read));
}

/// Records an effect that has just been applied (no-op outside units).
pub(super) fn note_effect(effect: Effect, undo: Undo) {
    with_frame(|frame| frame.push_effect(effect, undo));
}

/// The hash of a store read's target (a store, or a store and the keys looked up) under which
/// the splicing index files its readers. Seeded at random once per process; two targets that
/// collide only make a splice check a reader more (each candidate's reads are checked).
pub(super) fn read_hash(store: &str, keys: &[String]) -> u64 {
    process_hash(&(store, keys))
}

pub(super) fn note_store_read(
    store: &str,
    version: u64,
    method: StoreMethod,
    keys: &[String],
    result: &[Arc<crate::store::Doc>],
) {
    if recording() {
        record_read(Read::Store(Box::new(StoreRead {
            store: store.to_string(),
            method,
            keys: keys.to_vec(),
            store_hash: read_hash(store, &[]),
            keys_hash: read_hash(store, keys),
            result: result.to_vec(),
            version: Stamp(std::sync::atomic::AtomicU64::new(version)),
        })));
    }
}

pub(super) fn note_shared_read(key: &str, value: Option<&Value>) {
    if in_unit() {
        record_read(Read::Shared {
            key: key.to_string(),
            value: value.map(freeze),
        });
    }
}

pub(super) fn note_seen(key: &str, fresh: bool) {
    if in_unit() {
        record_read(Read::Seen {
            key: key.to_string(),
            fresh,
        });
    }
}

pub(super) fn note_current_read(backend: &str, value: Option<&Backend>) {
    if recording() {
        record_read(Read::Current {
            backend: backend.to_string(),
            value: value.map(|b| Box::new(b.clone())),
        });
    }
}

/// A deep copy of mutable containers (collectors), so a recorded value cannot change later.
fn freeze(v: &Value) -> Value {
    if let Some(c) = v.downcast_object_ref::<Collector>() {
        return Value::from(c.snapshot().iter().map(freeze).collect::<Vec<_>>());
    }
    match v.kind() {
        ValueKind::Seq
            if v.as_object().is_none() || v.downcast_object_ref::<JsonNode>().is_none() =>
        {
            match v.try_iter() {
                Ok(items) => Value::from(items.map(|i| freeze(&i)).collect::<Vec<_>>()),
                Err(_) => v.clone(),
            }
        }
        ValueKind::Map if v.downcast_object_ref::<JsonNode>().is_none() => {
            if let Some(m) = v.downcast_object_ref::<super::context::CompactMap>() {
                // Immutable already, unless it holds a collector somewhere.
                if !m.holds_collector() {
                    return v.clone();
                }
            }
            let Ok(keys) = v.try_iter() else {
                return v.clone();
            };
            let mut map = std::collections::BTreeMap::new();
            for k in keys {
                let item = v.get_item(&k).unwrap_or_default();
                map.insert(k, freeze(&item));
            }
            super::context::compact(&Value::from(map))
        }
        _ => v.clone(),
    }
}

/// Equality that is cheap for shared objects: two views of stored objects are equal when they
/// are the same stored version and path.
fn same(a: &Value, b: &Value) -> bool {
    if let (Some(x), Some(y)) = (
        a.downcast_object_ref::<JsonNode>(),
        b.downcast_object_ref::<JsonNode>(),
    ) {
        return x.same_node(y);
    }
    if a.kind() != b.kind() {
        return false;
    }
    if let (Some(x), Some(y)) = (a.as_object(), b.as_object()) {
        if std::ptr::eq(x as *const _ as *const u8, y as *const _ as *const u8) {
            return true;
        }
    }
    match a.kind() {
        ValueKind::Seq | ValueKind::Map => {
            // Lengths first: most arguments that differ differ in length, and an empty list
            // (a unit's argument built afresh on every render) is then equal at once.
            match (a.len(), b.len()) {
                (Some(0), Some(0)) => return true,
                (Some(x), Some(y)) if x != y => return false,
                _ => {}
            }
            let (Ok(x), Ok(y)) = (a.try_iter(), b.try_iter()) else {
                return false;
            };
            let mut x = x.fuse();
            let mut y = y.fuse();
            let seq = a.kind() == ValueKind::Seq;
            loop {
                match (x.next(), y.next()) {
                    (None, None) => return true,
                    (Some(p), Some(q)) => {
                        let equal = if seq {
                            same(&p, &q)
                        } else {
                            p == q
                                && same(
                                    &a.get_item(&p).unwrap_or_default(),
                                    &b.get_item(&q).unwrap_or_default(),
                                )
                        };
                        if !equal {
                            return false;
                        }
                    }
                    _ => return false,
                }
            }
        }
        _ => a == b && a.is_safe() == b.is_safe(),
    }
}

fn same_opt(a: Option<&Value>, b: Option<&Value>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(x), Some(y)) => same(x, y),
        _ => false,
    }
}

fn same_args(a: &[(Arc<str>, Value)], b: &[(Arc<str>, Value)]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|((k1, v1), (k2, v2))| k1 == k2 && same(v1, v2))
}

/// Whether a recorded read gives the same answer now.
fn still_true(scope: &Scope, read: &Read) -> bool {
    match read {
        Read::Shared { key, value } => {
            let now = scope.shared.peek(key);
            same_opt(now.map(|v| freeze(&v)).as_ref(), value.as_ref())
        }
        Read::Seen { key, fresh } => scope.shared.has_seen(key) != *fresh,
        _ => input_unchanged(&scope.stores, scope.current.as_deref(), read),
    }
}

/// Whether a read of the render's inputs (stores, `current_config`) gives the same answer
/// now; reads of the render's own state (`shared`, `first_seen`) count as unchanged.
pub(super) fn input_unchanged(
    stores: &std::collections::BTreeMap<String, Arc<Store>>,
    current: Option<&super::current_config::CurrentConfig>,
    read: &Read,
) -> bool {
    match read {
        Read::Store(r) => {
            let StoreRead {
                store,
                method,
                keys,
                result,
                version,
                ..
            } = &**r;
            let Some(s) = stores.get(store) else {
                return result.is_empty();
            };
            let keys: &[String] = match method {
                StoreMethod::List => &[],
                _ => keys,
            };
            // Usually answered from the store's change log, without a lookup.
            if s.changed_since(version.get(), keys) == Some(false) {
                version.set(s.version());
                return true;
            }
            let now: Vec<Arc<crate::store::Doc>> = match method {
                StoreMethod::List => s.list().cloned().collect(),
                StoreMethod::Fetch => match s.fetch(keys) {
                    Ok(v) => v,
                    Err(_) => return false,
                },
                StoreMethod::Get => match s.get_one(keys) {
                    Ok(v) => v.into_iter().collect(),
                    Err(_) => return false,
                },
            };
            let same =
                now.len() == result.len() && now.iter().zip(result).all(|(x, y)| Arc::ptr_eq(x, y));
            if same {
                version.set(s.version());
            }
            same
        }
        Read::Current { backend, value } => {
            let now = current.and_then(|c| c.backend(backend));
            now == value.as_deref()
        }
        Read::Shared { .. } | Read::Seen { .. } => true,
    }
}

/// Applies a recorded effect again (replay), recording it into an enclosing unit.
fn replay(scope: &Scope, effect: &Effect) -> Result<(), String> {
    let undo = match effect {
        Effect::SharedSet(k, v) => Undo::SharedSet(k.clone(), scope.shared.set_value(k, v.clone())),
        Effect::SharedAppend(k, v) => {
            scope.shared.append_value(k, v.clone());
            Undo::SharedAppend(k.clone())
        }
        Effect::Seen(k) => {
            scope.shared.mark_seen(k);
            Undo::Seen(k.clone())
        }
        Effect::Status(key, v) => Undo::Status(
            key.clone(),
            scope.status.set_status((**key).clone(), v.clone()),
        ),
        Effect::File(file) => {
            let (kind, name, content) = &**file;
            let (_, new_path) = scope.files.register_file(*kind, name, content.clone())?;
            match new_path {
                Some(p) => Undo::File(p),
                None => Undo::Nothing,
            }
        }
    };
    note_effect(effect.clone(), undo);
    Ok(())
}

fn undo(scope: &Scope, undo: Undo) {
    match undo {
        Undo::SharedSet(k, old) => match old {
            Some(v) => {
                scope.shared.set_value(&k, v);
            }
            None => scope.shared.remove(&k),
        },
        Undo::SharedAppend(k) => scope.shared.pop(&k),
        Undo::Seen(k) => scope.shared.unmark_seen(&k),
        Undo::Status(key, old) => scope.status.restore(*key, old),
        Undo::File(path) => scope.files.remove(&path),
        Undo::Nothing => {}
    }
}

/// The render's stores and `current_config`, for engine functions that read them natively
/// (they record their reads with `note_store_read` / `note_current_read`).
pub(super) fn with_inputs<R>(
    f: impl FnOnce(
        &std::collections::BTreeMap<String, Arc<Store>>,
        Option<Arc<super::current_config::CurrentConfig>>,
    ) -> R,
) -> Option<R> {
    SCOPE.with(|s| s.borrow().as_ref().map(|s| f(&s.stores, s.current.clone())))
}

fn with_scope<R>(f: impl FnOnce(&mut Scope) -> R) -> Option<R> {
    SCOPE.with(|s| s.borrow_mut().as_mut().map(f))
}

fn marked(id: usize, text: &str) -> Value {
    let mut out = String::with_capacity(text.len() + 12);
    out.push(MARK_START);
    out.push_str(&id.to_string());
    out.push(MARK_ID_END);
    out.push_str(text);
    out.push(MARK_END);
    Value::from_object(UnitOutput(out))
}

/// What `unit()` returns: its output, marked, to be printed. The formatter prints it as is;
/// using it any other way (as text, in a test or a filter, or printed into a `{% set %}`
/// block or a macro) makes the render's top level depend on it, which rules out splicing
/// (`splice`): the engine then notes that it was inspected.
#[derive(Debug)]
pub struct UnitOutput(String);

impl UnitOutput {
    pub(super) fn text(&self) -> &str {
        &self.0
    }
}

impl minijinja::value::Object for UnitOutput {
    fn repr(self: &Arc<Self>) -> minijinja::value::ObjectRepr {
        minijinja::value::ObjectRepr::Plain
    }

    fn is_true(self: &Arc<Self>) -> bool {
        note_inspected();
        true
    }

    fn render(self: &Arc<Self>, f: &mut fmt::Formatter<'_>) -> fmt::Result
    where
        Self: Sized + 'static,
    {
        note_inspected();
        f.write_str(&self.0)
    }
}

/// Notes that a template used a unit's output other than by printing it.
pub(super) fn note_inspected() {
    INSPECTED.with(|i| i.set(true));
}

/// Whether an error inside a unit is the unit's own (its data: `fail()`, a refused value, a
/// type error on a tenant value, an exhausted budget), which drops the unit's owner, rather than
/// a bug in the template itself (a missing template, an unknown filter or function, wrong
/// arguments), which stops the render so the last good configuration stays.
fn is_unit_fault(err: &Error) -> bool {
    let chain: Vec<&(dyn std::error::Error + 'static)> =
        std::iter::successors(Some(err as &(dyn std::error::Error + 'static)), |e| {
            e.source()
        })
        .collect();
    if chain.iter().any(|e| {
        e.is::<super::filters::FailMarker>()
            || e.is::<super::safe::RefusalMarker>()
            || e.is::<super::safe::UnsafeOutputMarker>()
    }) {
        return true;
    }
    // Includes wrap the real error (BadInclude): judge by the innermost template error.
    let innermost = chain.iter().rev().find_map(|e| e.downcast_ref::<Error>());
    !innermost.is_some_and(|m| {
        matches!(
            m.kind(),
            ErrorKind::SyntaxError
                | ErrorKind::TemplateNotFound
                | ErrorKind::UnknownFilter
                | ErrorKind::UnknownFunction
                | ErrorKind::UnknownTest
                | ErrorKind::UnknownMethod
                | ErrorKind::MissingArgument
                | ErrorKind::TooManyArguments
        )
    })
}

/// `unit(template, owner=…, key=…, **vars)`: renders `template` with the globals plus `vars`
/// as one unit of `owner` (an object, or a string naming it), memoized under `key` (default:
/// the owner). A unit that fails drops every unit of its owner from the configuration (a
/// half-configured object could fail open: routes kept, an access rule lost).
pub(super) fn unit(state: &State, template: &str, kwargs: Kwargs) -> Result<Value, Error> {
    if !log::log_enabled!(log::Level::Debug) {
        return unit_inner(state, template, kwargs);
    }
    // Time spent per unit template (inclusive of nested units), logged after each render.
    let started = std::time::Instant::now();
    let result = unit_inner(state, template, kwargs);
    let elapsed = started.elapsed();
    with_scope(|s| {
        let e = s.timings.entry(template.to_string()).or_default();
        e.0 += 1;
        e.1 += elapsed;
    });
    result
}

fn unit_inner(state: &State, template: &str, kwargs: Kwargs) -> Result<Value, Error> {
    // `peek`, not `get`: every keyword is an argument of the unit, so none is checked for
    // use, and `get` would record each name in a set on every call of every unit.
    let owner_value: Option<Value> = kwargs.peek("owner")?;
    let key: Option<String> = kwargs.peek("key")?;
    let mut args: Vec<(Arc<str>, Value)> = Vec::new();
    for name in kwargs.args() {
        if name == "key" {
            continue;
        }
        // Compared as they are against a memoized unit's (frozen) arguments; frozen only when
        // a fresh recording is stored.
        let v: Value = kwargs.peek(name)?;
        args.push((arg_name(name), v));
    }
    let owner = owner_value.as_ref().and_then(Owner::from_value);
    let key = match (key, &owner) {
        (Some(k), _) => k,
        (None, Some(o)) => o.to_string(),
        (None, None) => {
            return Err(Error::new(
                ErrorKind::MissingArgument,
                format!("unit({template:?}) needs owner= (an object) or key="),
            ))
        }
    };
    let ukey = UnitKey::new(template.to_string(), key);
    let owner = owner.unwrap_or_else(|| Owner {
        name: ukey.to_string(),
        ..Owner::default()
    });

    match with_scope(|s| skip_reason(s, &ukey, &owner, &args)).flatten() {
        Some(Skip::Silent) => {
            note_top_call(&Arc::new(ukey), None);
            return Ok(Value::from_safe_string(String::new()));
        }
        Some(Skip::Report(message)) => {
            note_top_call(&Arc::new(ukey), None);
            with_scope(|s| s.drop_owner(&owner, message));
            return Ok(Value::from_safe_string(String::new()));
        }
        None => {}
    }

    match with_scope(|s| try_replay(s, &ukey, &owner, &args)).flatten() {
        Some(Ok(v)) => return Ok(v),
        Some(Err(e)) => return Err(Error::new(ErrorKind::InvalidOperation, e)),
        None => {}
    }

    // Render from scratch.
    let Some(root) = with_scope(|s| s.root.clone()) else {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "unit() can only be used while rendering",
        ));
    };
    let ctx = super::objects::UnitContext::value(&args, root);
    FRAMES.with(|f| f.borrow_mut().push(Frame::default()));
    let result = state
        .env()
        .get_template(template)
        .and_then(|t| t.render(ctx));
    let Frame {
        rec, undo: undos, ..
    } = FRAMES.with(|f| f.borrow_mut().pop()).unwrap_or_default();
    let outcome = match result {
        // Kept in the cache for the life of the unit: without the render buffer's slack.
        Ok(mut text) => {
            text.shrink_to_fit();
            Ok(text)
        }
        Err(err) if is_unit_fault(&err) => {
            let e = super::RenderError::from_minijinja(template, &err, super::DEFAULT_FUEL);
            Err(if e.from_fail || e.line.is_none() {
                e.message
            } else {
                e.to_string()
            })
        }
        Err(err) => {
            // A template bug, not the owner's data: undo and stop the render (the caller keeps
            // its last good configuration).
            with_scope(|s| {
                for u in undos.into_iter().rev() {
                    undo(s, u);
                }
            });
            return Err(err);
        }
    };
    with_scope(|s| s.finish_fresh(ukey, owner, args, rec, undos, outcome))
        .ok_or_else(|| Error::new(ErrorKind::InvalidOperation, "unit() outside a render"))
}

thread_local! {
    /// Unit argument names, one allocation each: every cached unit keeps its arguments, and
    /// the names are the templates' own. Bounded all the same, should a template ever splat
    /// data into keyword arguments.
    static ARG_NAMES: RefCell<HashSet<Arc<str>>> = RefCell::new(HashSet::default());
}

const MAX_ARG_NAMES: usize = 1024;

fn arg_name(name: &str) -> Arc<str> {
    ARG_NAMES.with(|names| {
        let mut names = names.borrow_mut();
        if let Some(known) = names.get(name) {
            return Arc::clone(known);
        }
        let name: Arc<str> = Arc::from(name);
        if names.len() < MAX_ARG_NAMES {
            names.insert(Arc::clone(&name));
        }
        name
    })
}

enum Skip {
    /// Already reported in this render.
    Silent,
    Report(String),
}

/// Whether the unit's owner is left out: failed earlier in this render, or excluded after a
/// failed `haproxy -c` and unchanged since.
fn skip_reason(
    s: &mut Scope,
    ukey: &UnitKey,
    owner: &Owner,
    args: &[(Arc<str>, Value)],
) -> Option<Skip> {
    if s.failed.contains_key(owner) {
        s.touch(ukey);
        return Some(Skip::Silent);
    }
    let reason = s.cache.excluded.get(owner).cloned()?;
    if s.reported.contains(owner) {
        s.touch(ukey);
        return Some(Skip::Silent);
    }
    // Excluded while every unit of the owner would replay unchanged; any change retries it.
    let unchanged =
        s.cache.entries.get(ukey).is_some_and(|e| {
            same_args(&e.args, args) && e.rec.reads.iter().all(|r| still_true(s, r))
        });
    if unchanged {
        s.touch(ukey);
        Some(Skip::Report(reason))
    } else {
        s.cache.excluded.remove(owner);
        None
    }
}

fn try_replay(
    s: &mut Scope,
    ukey: &UnitKey,
    owner: &Owner,
    args: &[(Arc<str>, Value)],
) -> Option<Result<Value, String>> {
    let e = s.cache.entries.get(ukey)?;
    if !same_args(&e.args, args) || !e.rec.reads.iter().all(|r| still_true(s, r)) {
        return None;
    }
    let (rec, outcome) = (Arc::clone(&e.rec), Arc::clone(&e.outcome));
    let (unit, cached_owner, fresh) = (Arc::clone(&e.unit), Arc::clone(&e.owner), !e.validated);
    s.touch(ukey);
    for child in &rec.children {
        s.touch(child);
    }
    with_frame(|parent| parent.adopt_reads(&rec, ukey));
    match &*outcome {
        Ok(text) => {
            for effect in &rec.effects {
                if let Err(e) = replay(s, effect) {
                    return Some(Err(e));
                }
            }
            s.note_files(&rec, owner);
            s.cache.stats.replayed += 1;
            Some(Ok(s.instance(unit, cached_owner, fresh, text)))
        }
        Err(message) => {
            s.drop_owner(owner, message.clone());
            Some(Ok(Value::from_safe_string(String::new())))
        }
    }
}

impl Scope {
    fn note_files(&mut self, rec: &Recording, owner: &Owner) {
        for e in &rec.effects {
            if let Effect::File(file) = e {
                let (kind, name, _) = &**file;
                if let Ok(path) = self.files.path_of(*kind, name) {
                    self.file_owners.push((path, owner.clone()));
                }
            }
        }
    }

    fn touch(&mut self, ukey: &UnitKey) {
        let generation = self.cache.generation;
        if let Some(e) = self.cache.entries.get_mut(ukey) {
            e.generation = generation;
        }
    }

    fn instance(
        &mut self,
        unit: Arc<UnitKey>,
        owner: Arc<Owner>,
        fresh: bool,
        text: &str,
    ) -> Value {
        let id = self.instances.len();
        note_top_call(&unit, Some(id));
        self.instances.push(Instance { unit, owner, fresh });
        marked(id, text)
    }

    /// Reports the owner once per render and leaves its other units out (the engine renders
    /// again without it when it had already produced output).
    fn drop_owner(&mut self, owner: &Owner, message: String) {
        self.cache.stats.dropped += 1;
        if self.reported.insert(owner.clone()) {
            self.dropped.push(Dropped {
                owner: owner.clone(),
                message: message.clone(),
            });
        }
        self.newly_failed.entry(owner.clone()).or_insert(message);
    }

    fn finish_fresh(
        &mut self,
        ukey: UnitKey,
        owner: Owner,
        args: Vec<(Arc<str>, Value)>,
        rec: Recording,
        undos: Vec<Undo>,
        outcome: Result<String, String>,
    ) -> Value {
        let generation = self.cache.generation;
        // A unit rendered again (its inputs changed) keeps the key its entry was stored
        // under: the map keeps its old key on insert.
        let unit = match self.cache.entries.get_key_value(&ukey) {
            Some((known, _)) => Arc::clone(known),
            None => Arc::new(ukey),
        };
        let owner = Arc::new(owner);
        let value = match &outcome {
            Ok(text) => {
                self.cache.stats.rendered += 1;
                self.note_files(&rec, &owner);
                with_frame(|parent| parent.absorb(&rec, undos, &unit));
                self.instance(unit.clone(), owner.clone(), true, text)
            }
            Err(message) => {
                for u in undos.into_iter().rev() {
                    undo(self, u);
                }
                with_frame(|parent| parent.adopt_reads(&rec, &unit));
                self.drop_owner(&owner, message.clone());
                Value::from_safe_string(String::new())
            }
        };
        let mut rec = match &outcome {
            Ok(_) => rec,
            // A failed unit replays only its failure; its reads still decide when to retry.
            Err(_) => Recording {
                reads: rec.reads,
                effects: Vec::new(),
                children: Vec::new(),
            },
        };
        // Kept for the life of the unit: without the vectors' growth slack.
        rec.reads.shrink_to_fit();
        rec.effects.shrink_to_fit();
        rec.children.shrink_to_fit();
        self.cache.entries.insert(
            unit.clone(),
            Entry {
                unit,
                owner,
                args: args
                    .into_iter()
                    .map(|(k, v)| {
                        let v = freeze(&v);
                        (k, v)
                    })
                    .collect(),
                rec: Arc::new(rec),
                outcome: Arc::new(outcome),
                generation,
                validated: false,
            },
        );
        value
    }
}

impl Frame {
    fn push_read(&mut self, read: Read) {
        let own = match &read {
            Read::Shared { key, .. } => self.top.is_some() || self.wrote_shared.contains(key),
            Read::Seen { key, .. } => self.top.is_some() || self.wrote_seen.contains(key),
            _ => false,
        };
        if !own {
            self.rec.reads.push(read);
        }
    }

    fn push_effect(&mut self, effect: Effect, undo: Undo) {
        if self.top.is_some() {
            return;
        }
        // What a unit wrote to `shared` or marked with `first_seen`: its later reads of it
        // follow from its own inputs and are not recorded.
        match &effect {
            Effect::SharedSet(k, _) | Effect::SharedAppend(k, _)
                if !self.wrote_shared.contains(k) =>
            {
                self.wrote_shared.insert(k.clone());
            }
            Effect::Seen(k) if !self.wrote_seen.contains(k) => {
                self.wrote_seen.insert(k.clone());
            }
            _ => {}
        }
        self.rec.effects.push(effect);
        self.undo.push(undo);
    }

    /// Takes a child unit's reads (minus what this unit wrote itself) and its identity; its
    /// effects arrive separately (replayed, or through `absorb`).
    fn adopt_reads(&mut self, rec: &Recording, child: &UnitKey) {
        if self.top.is_some() {
            return;
        }
        for r in &rec.reads {
            self.push_read(r.clone());
        }
        self.rec.children.push(child.clone());
        self.rec.children.extend(rec.children.iter().cloned());
    }

    /// Takes a finished child unit's reads, effects and undo journal (one undo per effect).
    fn absorb(&mut self, rec: &Recording, undos: Vec<Undo>, child: &UnitKey) {
        if self.top.is_some() {
            return;
        }
        self.adopt_reads(rec, child);
        for (effect, undo) in rec.effects.iter().cloned().zip(undos) {
            self.push_effect(effect, undo);
        }
    }
}

/// Where one unit instance's output landed in a text cleaned of markers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Mark {
    pub id: usize,
    /// 1-based lines of its first and last character.
    pub first: usize,
    pub last: usize,
    /// Byte range in the clean text.
    pub start: usize,
    pub end: usize,
}

/// Removes unit markers from a rendered output, returning the clean text and where each unit
/// instance landed (inner instances before the ones enclosing them).
pub(super) fn strip_markers(text: &str) -> (String, Vec<Mark>) {
    if !text.contains(MARK_START) {
        return (text.to_string(), Vec::new());
    }
    let mut out = String::with_capacity(text.len());
    let mut marks = Vec::new();
    let mut open: Vec<(usize, usize, usize)> = Vec::new();
    let mut line = 1usize;
    let mut rest = text;
    // Copy the text between markers at once; its line breaks are counted, not visited one by
    // one (this runs over the whole configuration on every render that is not spliced).
    while let Some(i) = find_marker(rest) {
        let plain = &rest[..i];
        line += plain.bytes().filter(|&b| b == b'\n').count();
        out.push_str(plain);
        let c = rest[i..].chars().next().unwrap_or_default();
        rest = &rest[i + c.len_utf8()..];
        if c == MARK_START {
            let (id, after) = match rest.find(MARK_ID_END) {
                Some(j) => (&rest[..j], &rest[j + MARK_ID_END.len_utf8()..]),
                None => (rest, ""),
            };
            rest = after;
            if let Ok(id) = id.parse::<usize>() {
                open.push((id, line, out.len()));
            }
        } else if let Some((id, first, start)) = open.pop() {
            marks.push(Mark {
                id,
                first,
                last: line,
                start,
                end: out.len(),
            });
        }
    }
    out.push_str(rest);
    (out, marks)
}

/// The byte offset of the first [`MARK_START`] or [`MARK_END`] in `text`. Both are three bytes
/// in UTF-8 with the same lead byte, which never occurs inside another character's encoding.
fn find_marker(text: &str) -> Option<usize> {
    let mut start = [0u8; 4];
    let mut end = [0u8; 4];
    let start = MARK_START.encode_utf8(&mut start).as_bytes();
    let end = MARK_END.encode_utf8(&mut end).as_bytes();
    let bytes = text.as_bytes();
    let mut from = 0;
    while let Some(j) = bytes[from..].iter().position(|&b| b == start[0]) {
        let at = from + j;
        let here = &bytes[at..];
        if here.starts_with(start) || here.starts_with(end) {
            return Some(at);
        }
        from = at + 1;
    }
    None
}

/// Records an append to the shared list under `shared_key` (`shared.append`, or `append` on a
/// collector kept in `shared`); appends to a unit's own collector (no key) are not effects.
pub(super) fn note_collector_append(shared_key: Option<&str>, item: &Value) {
    if let Some(k) = shared_key {
        note_effect(
            Effect::SharedAppend(k.to_string(), item.clone()),
            Undo::SharedAppend(k.to_string()),
        );
    }
}

// ---------------------------------------------------------------------------------------
// Support for splicing (`splice`)

/// Renders one memoized unit again on its own, in the installed scope (whose `shared` holds
/// what the unit read there in the last render). Returns its text and recording.
pub(super) fn rerender(
    env: &minijinja::Environment<'_>,
    template: &str,
    args: &[(Arc<str>, Value)],
) -> Option<(String, Recording)> {
    let root = with_scope(|s| s.root.clone())?;
    let ctx = super::objects::UnitContext::value(args, root);
    FRAMES.with(|f| f.borrow_mut().push(Frame::default()));
    let result = env.get_template(template).and_then(|t| t.render(ctx));
    let frame = FRAMES.with(|f| f.borrow_mut().pop()).unwrap_or_default();
    result.ok().map(|text| (text, frame.rec))
}

/// A `shared` holding what a unit read from it (and which `first_seen` keys it found taken)
/// in its recording: the state at the unit's place in the render, as long as every unit
/// before it did the same as before.
pub(super) fn seeded_shared(rec: &Recording) -> Shared {
    let shared = Shared::default();
    for read in &rec.reads {
        match read {
            Read::Shared {
                key,
                value: Some(v),
            } => {
                shared.set_value(key, v.clone());
            }
            Read::Seen { key, fresh: false } => shared.mark_seen(key),
            _ => {}
        }
    }
    shared
}

/// Whether a recording read `shared` or `first_seen` state.
pub(super) fn reads_render_state(rec: &Recording) -> bool {
    rec.reads
        .iter()
        .any(|r| matches!(r, Read::Shared { .. } | Read::Seen { .. }))
}

/// Whether a unit rendered again read only `shared` and `first_seen` answers its previous
/// recording knew, and did exactly what it did before.
pub(super) fn same_behaviour(new: &Recording, old: &Recording) -> bool {
    let known = |read: &Read| {
        match read {
        Read::Shared { key, value } => old.reads.iter().any(|r| {
            matches!(r, Read::Shared { key: k, value: v } if k == key && same_opt(v.as_ref(), value.as_ref()))
        }),
        Read::Seen { key, fresh } => old
            .reads
            .iter()
            .any(|r| matches!(r, Read::Seen { key: k, fresh: f } if k == key && f == fresh)),
        _ => true,
    }
    };
    new.children.is_empty()
        && old.children.is_empty()
        && new.reads.iter().all(known)
        && new.effects.len() == old.effects.len()
        && new.effects.iter().zip(&old.effects).all(|pair| match pair {
            (Effect::SharedSet(k1, v1), Effect::SharedSet(k2, v2))
            | (Effect::SharedAppend(k1, v1), Effect::SharedAppend(k2, v2)) => {
                k1 == k2 && same(v1, v2)
            }
            (Effect::Seen(a), Effect::Seen(b)) => a == b,
            (Effect::Status(k1, v1), Effect::Status(k2, v2)) => k1 == k2 && v1 == v2,
            (Effect::File(f1), Effect::File(f2)) => f1 == f2,
            _ => false,
        })
}
