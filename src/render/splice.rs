//! Splicing: a render in proportion to the change (DESIGN §4).
//!
//! Replaying memoized units still evaluates every output template's top level: its loops over
//! all objects and one `unit()` call per object. When nothing the top levels read directly
//! has changed (their store lookups and `current_config` answers), and the few units whose
//! inputs changed do exactly what they did before (the same `shared` writes and appends,
//! `first_seen` marks, statuses and files), then every top level would make the same calls
//! with the same arguments and print the same text around them. The engine then renders just
//! those units and splices their new text into the last output.
//!
//! Why that is exact, by induction over the render: the first unit whose inputs changed sees
//! the same `shared` state as last time (every unit and top level before it read and did the
//! same), so it is rendered against the `shared` answers it recorded; if it then does what it
//! did before, the state after it is the same again. `shared` and `first_seen` answers at a
//! top level follow from that state; the rest of what a top level reads is checked.
//!
//! Only the top level's use of a unit's output is assumed: the top level prints it, as
//! `{{ unit(…) }}`, and does not otherwise inspect it. The last render is kept for splicing
//! only when every unit called at a top level was printed there verbatim, once, in call order.
//! Anything else (a render that left an object out, nested units, many changed units, a
//! changed exclusion, a unit that now behaves differently) takes the full render, which
//! replays what it can.

use super::HashMap;
use std::sync::Arc;

use super::current_config::CurrentConfig;
use super::units::{
    self, Mark, Owner, Read, Recording, RenderCache, TopTrace, UnitKey, MARK_START,
};
use super::{Engine, Paths, RenderInputs, Rendered};

/// Changed units are spliced while they are at most this many, or at most a quarter of the
/// units the outputs call (a burst of endpoint changes in a large cluster); more take the full
/// render, which replays the rest anyway.
const MIN_SPLICED: usize = 64;

/// The last render, as splicing needs it.
pub(crate) struct LastRender {
    outputs: Vec<OutputState>,
    /// Units the render used that no top level of its final pass called: those of objects
    /// left out (and any unit they failed in), and units called only in earlier passes.
    others: Vec<Arc<Recording>>,
    /// The version of each store it read, and its `current_config`.
    versions: Vec<(String, u64)>,
    current: Option<Arc<CurrentConfig>>,
    /// Who read what: only they need checking when it changes.
    readers: Readers,
    /// The render took more than one pass (objects were left out).
    passes: bool,
    rendered: Rendered,
    /// Owners excluded when it was made (a change of exclusions takes the full render).
    excluded: Vec<Owner>,
    /// Where each printed unit is called: `(hash of its key, output, call)`, sorted, so that
    /// a splice finds its few changed units without hashing every call's key.
    places: Vec<(u64, u32, u32)>,
}

struct OutputState {
    reads: Vec<Read>,
    calls: Vec<Placed>,
    /// The output's text before post-processing.
    pre: String,
    /// Its place in `Rendered::files` (`None`: haproxy.cfg).
    file: Option<usize>,
}

/// A unit called at an output's top level, and where its text is.
struct Placed {
    unit: Arc<UnitKey>,
    /// Its recording (as in the cache).
    rec: Arc<Recording>,
    /// Its text in `pre` and its span in `Rendered::units`; `None` when left out.
    at: Option<(Mark, usize)>,
}

/// A reader of a store: an output's top level, a call in it, or one of `others`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reader {
    Top(usize),
    Call(usize, usize),
    Other(usize),
}

/// The target of `current_config` readers in `LastRender::readers`: hashed as a store no
/// store can be named (a resource name has no NUL).
fn current_hash() -> u64 {
    units::read_hash("\0current_config", &[])
}

/// Who read what, in the last render, by [`units::read_hash`] of the target.
#[derive(Default)]
struct Readers {
    /// Per store (and `current_config`, [`current_hash`]): every reader.
    all: HashMap<u64, Vec<Reader>>,
    /// Per store: readers of `list()`.
    lists: HashMap<u64, Vec<Reader>>,
    /// Per store and looked-up keys: readers of `fetch` and `get`.
    lookups: HashMap<u64, Vec<Reader>>,
}

fn add_reader(map: &mut HashMap<u64, Vec<Reader>>, key: u64, reader: Reader) {
    let list = map.entry(key).or_default();
    if list.last() != Some(&reader) {
        list.push(reader);
    }
}

impl Readers {
    /// Adds `reader` for everything `reads` touch.
    fn add(&mut self, reads: &[Read], reader: Reader) {
        for read in reads {
            match read {
                Read::Store(r) => {
                    add_reader(&mut self.all, r.store_hash, reader);
                    match r.method {
                        units::StoreMethod::List => {
                            add_reader(&mut self.lists, r.store_hash, reader)
                        }
                        _ => add_reader(&mut self.lookups, r.keys_hash, reader),
                    }
                }
                Read::Current { .. } => add_reader(&mut self.all, current_hash(), reader),
                _ => {}
            }
        }
    }

    /// The readers of `target` in `map` (a superset when two targets share a hash).
    fn of(map: &HashMap<u64, Vec<Reader>>, target: u64) -> &[Reader] {
        map.get(&target).map(Vec::as_slice).unwrap_or_default()
    }
}

/// One output's text before post-processing and its unit marks.
pub(super) struct Pre {
    pub text: String,
    pub marks: Vec<Mark>,
}

impl LastRender {
    /// Keeps a finished render for splicing, if every output's top level printed each unit it
    /// called verbatim, once, in call order (and no unit is nested in another).
    pub(super) fn build(
        traces: Vec<TopTrace>,
        pres: Vec<Pre>,
        cache: &RenderCache,
        rendered: &Rendered,
        names: &[(String, Option<String>)],
        passes: bool,
        inputs: &RenderInputs,
    ) -> Option<LastRender> {
        if traces.len() != pres.len() || pres.len() != names.len() {
            return None;
        }
        // The spans are the outputs' marks in order (`render_outputs`): the n-th mark of all is
        // the n-th span. Checked; should that ever not hold, the render is not kept.
        let is_span = |n: usize, name: &str, mark: &Mark, unit: &Arc<UnitKey>| {
            rendered.units.get(n).is_some_and(|s| {
                Arc::ptr_eq(&s.unit, unit)
                    && (s.first, s.last) == (mark.first, mark.last)
                    && &*s.output == name
            })
        };
        let mut printed = 0;
        let mut outputs = Vec::with_capacity(pres.len());
        for ((trace, pre), (name, path)) in traces.into_iter().zip(pres).zip(names) {
            let called = trace.calls.iter().filter(|c| c.instance.is_some()).count();
            if pre.marks.len() != called {
                return None; // nested units, or a unit printed twice or not at all
            }
            // The marks are in text order: printed in call order, the n-th printed call is
            // the n-th mark.
            let mut marks = pre.marks.iter();
            let mut calls = Vec::with_capacity(trace.calls.len());
            for call in trace.calls {
                let entry = cache.entries.get(&call.unit)?;
                let rec = Arc::clone(&entry.rec);
                let at = match call.instance {
                    None => None,
                    Some(id) => {
                        let mark = *marks.next().filter(|m| m.id == id)?;
                        let text = match &*entry.outcome {
                            Ok(text) => text,
                            Err(_) => return None,
                        };
                        // The text without markers has none left, so a unit text equal to
                        // its place there has no nested unit in it.
                        if pre.text.get(mark.start..mark.end)? != text.as_str() {
                            return None;
                        }
                        if !is_span(printed, name, &mark, &call.unit) {
                            return None;
                        }
                        let span = printed;
                        printed += 1;
                        Some((mark, span))
                    }
                };
                calls.push(Placed {
                    unit: call.unit,
                    rec,
                    at,
                });
            }
            let file = match path {
                None => None,
                Some(path) => Some(rendered.files.iter().position(|f| &f.path == path)?),
            };
            outputs.push(OutputState {
                reads: trace.reads,
                calls,
                pre: pre.text,
                file,
            });
        }
        if printed != rendered.units.len() {
            return None;
        }
        // A printed unit is its entry's own key (`Scope::instance` is given the entry's), so
        // the printed units are told apart by address. A unit printed under another copy of
        // its key would count among the others as well: a change to its inputs would then take
        // the full render, never a wrong splice.
        let called: super::HashSet<*const UnitKey> = outputs
            .iter()
            .flat_map(|o| o.calls.iter().filter(|c| c.at.is_some()))
            .map(|c| Arc::as_ptr(&c.unit))
            .collect();
        let others: Vec<Arc<Recording>> = cache
            .entries
            .values()
            .filter(|e| !called.contains(&Arc::as_ptr(&e.unit)))
            .map(|e| Arc::clone(&e.rec))
            .collect();
        let mut excluded: Vec<Owner> = cache.excluded.keys().cloned().collect();
        excluded.sort();
        let mut readers = Readers::default();
        for (o, output) in outputs.iter().enumerate() {
            readers.add(&output.reads, Reader::Top(o));
            for (c, call) in output.calls.iter().enumerate() {
                readers.add(&call.rec.reads, Reader::Call(o, c));
            }
        }
        for (i, rec) in others.iter().enumerate() {
            readers.add(&rec.reads, Reader::Other(i));
        }
        let mut places: Vec<(u64, u32, u32)> = Vec::new();
        for (o, output) in outputs.iter().enumerate() {
            for (c, call) in output.calls.iter().enumerate() {
                if call.at.is_some() {
                    let (o, c) = (u32::try_from(o).ok()?, u32::try_from(c).ok()?);
                    places.push((call.unit.prehash(), o, c));
                }
            }
        }
        places.sort_unstable();
        Some(LastRender {
            readers,
            outputs,
            others,
            versions: versions(inputs),
            current: inputs.current_config.clone(),
            passes,
            rendered: rendered.clone(),
            excluded,
            places,
        })
    }

    /// The `(output, call)` places where `unit` is printed.
    fn places_of(&self, unit: &UnitKey) -> Vec<(usize, usize)> {
        let hash = unit.prehash();
        let from = self.places.partition_point(|p| p.0 < hash);
        self.places[from..]
            .iter()
            .take_while(|p| p.0 == hash)
            .map(|&(_, o, c)| (o as usize, c as usize))
            .filter(|&(o, c)| *self.outputs[o].calls[c].unit == *unit)
            .collect()
    }

    /// The units of the kept render have passed `haproxy -c`.
    pub(super) fn mark_validated(&mut self) {
        if self.rendered.units.iter().any(|s| s.fresh) {
            for span in Arc::make_mut(&mut self.rendered.units) {
                span.fresh = false;
            }
        }
    }
}

impl Engine {
    /// Renders by splicing changed units into the last render kept in `cache`, when that is
    /// exact (see the module documentation); `None` otherwise, leaving `cache` usable.
    pub(super) fn try_splice(
        &self,
        inputs: &RenderInputs,
        paths: &Paths,
        cache: &mut RenderCache,
    ) -> Option<Rendered> {
        if !cache.compatible(self.id, &inputs.extra_context, &inputs.base_dir) {
            return None;
        }
        let mut last = cache.last.take()?;
        let mut excluded: Vec<Owner> = cache.excluded.keys().cloned().collect();
        excluded.sort();
        if excluded != last.excluded || last.outputs.len() != self.outputs.len() {
            return None;
        }
        let current = inputs.current_config.as_deref();
        // Reads of stores unchanged since the last render hold (they held then); the others
        // are checked, mostly against the store's log of changes.
        let now = versions(inputs);
        let mut changed: Vec<&str> = now
            .iter()
            .filter(|v| !last.versions.contains(v))
            .chain(last.versions.iter().filter(|v| !now.contains(v)))
            .map(|(name, _)| name.as_str())
            .collect();
        changed.sort_unstable();
        changed.dedup();
        let same_current = match (&last.current, &inputs.current_config) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        // Per changed store, the index keys changed since (when its log reaches back).
        let changed_keys: HashMap<&str, Vec<&[String]>> = changed
            .iter()
            .filter_map(|name| {
                let since = last.versions.iter().find(|(n, _)| n == name)?.1;
                let keys = inputs.stores.get(*name)?.changes_since(since)?;
                Some((*name, keys.collect()))
            })
            .collect();
        let unchanged = |r: &Read| match r {
            Read::Store(s) if !changed.contains(&s.store.as_str()) => true,
            Read::Store(s) if changed_keys.contains_key(s.store.as_str()) => {
                let touched = &changed_keys[s.store.as_str()];
                match s.method {
                    units::StoreMethod::List => touched.is_empty(),
                    _ => !touched.iter().any(|k| k.starts_with(&s.keys)),
                }
            }
            Read::Current { .. } if same_current => true,
            _ => units::input_unchanged(&inputs.stores, current, r),
        };
        // Only the readers of what changed are checked. A top level, a left-out owner's unit
        // or a unit used only in an earlier pass that read something else takes the full
        // render (the same objects must be left out again).
        let mut dirty: Vec<Arc<UnitKey>> = Vec::new();
        let calls: usize = last.outputs.iter().map(|o| o.calls.len()).sum();
        let max_spliced = (calls / 4).max(MIN_SPLICED);
        let mut candidates: Vec<Reader> = Vec::new();
        let readers = &last.readers;
        for name in &changed {
            let store = units::read_hash(name, &[]);
            match changed_keys.get(name) {
                // A lookup by keys K answers differently only if a changed key starts with K.
                Some(touched) => {
                    candidates.extend_from_slice(Readers::of(&readers.lists, store));
                    for key in touched {
                        for n in 0..=key.len() {
                            let at = units::read_hash(name, &key[..n]);
                            candidates.extend_from_slice(Readers::of(&readers.lookups, at));
                        }
                    }
                }
                None => candidates.extend_from_slice(Readers::of(&readers.all, store)),
            }
        }
        if !same_current {
            candidates.extend_from_slice(Readers::of(&readers.all, current_hash()));
        }
        candidates.sort_unstable_by_key(|r| match *r {
            Reader::Top(o) => (0, o, 0),
            Reader::Call(o, c) => (1, o, c),
            Reader::Other(i) => (2, i, 0),
        });
        candidates.dedup();
        for reader in &candidates {
            let (reads, call) = match *reader {
                Reader::Top(o) => (&last.outputs[o].reads, None),
                Reader::Other(i) => (&last.others[i].reads, None),
                Reader::Call(o, c) => {
                    let call = &last.outputs[o].calls[c];
                    (&call.rec.reads, Some(call))
                }
            };
            if reads.iter().all(unchanged) {
                continue;
            }
            // A left-out owner's unit changed (it may come back), or a top level: full.
            let call = call.filter(|c| c.at.is_some())?;
            if !dirty.contains(&call.unit) {
                if dirty.len() == max_spliced {
                    return None;
                }
                dirty.push(call.unit.clone());
            }
        }
        let mut texts: HashMap<Arc<UnitKey>, (String, Arc<Recording>)> = HashMap::default();
        for unit in &dirty {
            let text = self.rerender(inputs, paths, cache, unit, last.passes)?;
            let rec = Arc::clone(&cache.entries.get(unit)?.rec);
            texts.insert(unit.clone(), (text, rec));
        }
        last.versions = now;
        last.current = inputs.current_config.clone();
        // Where the changed units are printed, in order.
        let mut at: Vec<(usize, usize)> = texts.keys().flat_map(|u| last.places_of(u)).collect();
        at.sort_unstable();
        let rendered = &mut last.rendered;
        let units = Arc::make_mut(&mut rendered.units);
        // Dirty units' new recordings, with their old ones and their place.
        let mut new_readers: Vec<(Arc<Recording>, Arc<Recording>, Reader)> = Vec::new();
        for (o, (output, state)) in self.outputs.iter().zip(&mut last.outputs).enumerate() {
            let mut here = at.iter().filter(|p| p.0 == o).map(|p| p.1).peekable();
            if here.peek().is_none() {
                continue;
            }
            let mut bytes: isize = 0;
            let mut lines: isize = 0;
            // Per changed unit: its old lines and bytes, and its new mark.
            let mut changed: Vec<(Mark, Mark, &str)> = Vec::new();
            for (c, call) in state.calls.iter_mut().enumerate() {
                let Some((mark, span)) = &mut call.at else {
                    continue;
                };
                let old = *mark;
                mark.start = shift(old.start, bytes);
                mark.first = shift(old.first, lines);
                let changed_here = here.next_if_eq(&c).is_some();
                match changed_here.then(|| texts.get(&call.unit)).flatten() {
                    Some((text, rec)) => {
                        let old_rec = std::mem::replace(&mut call.rec, Arc::clone(rec));
                        new_readers.push((Arc::clone(rec), old_rec, Reader::Call(o, c)));
                        let newlines = text.bytes().filter(|&b| b == b'\n').count();
                        mark.end = mark.start + text.len();
                        mark.last = mark.first + newlines;
                        bytes += text.len() as isize - (old.end - old.start) as isize;
                        lines += newlines as isize - (old.last - old.first) as isize;
                        units[*span].fresh = true;
                        changed.push((old, *mark, text.as_str()));
                    }
                    None => {
                        mark.end = shift(old.end, bytes);
                        mark.last = shift(old.last, lines);
                    }
                }
                let s = &mut units[*span];
                s.first = mark.first;
                s.last = mark.last;
            }
            // Edit in place, last change first (earlier offsets stay valid).
            for (old, _, text) in changed.iter().rev() {
                state.pre.replace_range(old.start..old.end, text);
            }
            let post = match state.file {
                None => &mut rendered.haproxy_cfg,
                Some(i) => &mut rendered.files[i].content,
            };
            // Copied (when the caller still holds the last render) only to be edited.
            match splice_post(post, &state.pre, &changed, &output.post) {
                Some(edits) => {
                    let post = Arc::make_mut(post);
                    for (from, to, lines) in edits.into_iter().rev() {
                        post.replace_range(from..to, &lines);
                    }
                }
                None => *post = Arc::new(super::post_process(&state.pre, &output.post)),
            }
        }
        cache.stats = units::CacheStats {
            replayed: calls - dirty.len(),
            rendered: dirty.len(),
            dropped: rendered.dropped.len(),
            spliced: true,
        };
        // A changed unit may read what it did not read before.
        for (new, old, reader) in new_readers {
            let fresh: Vec<Read> = new
                .reads
                .iter()
                .filter(|r| !old.reads.iter().any(|o| same_target(o, r)))
                .cloned()
                .collect();
            last.readers.add(&fresh, reader);
        }
        let out = rendered.clone();
        cache.last = Some(last);
        Some(out)
    }

    /// Renders one changed unit against the `shared` answers it recorded; its new text if it
    /// did exactly what it did before (its entry is then updated), `None` otherwise.
    /// After a render of several passes, only a unit that reads no `shared` or `first_seen`
    /// state qualifies: it then behaves the same in every pass, so the passes repeat.
    fn rerender(
        &self,
        inputs: &RenderInputs,
        paths: &Paths,
        cache: &mut RenderCache,
        unit: &UnitKey,
        passes: bool,
    ) -> Option<String> {
        let entry = cache.entries.get(unit)?;
        let (args, old) = (entry.args.clone(), Arc::clone(&entry.rec));
        if passes && units::reads_render_state(&old) {
            return None;
        }
        self.enter_scope(
            inputs,
            paths,
            Arc::new(units::seeded_shared(&old)),
            std::mem::take(cache),
            HashMap::default(),
        );
        let result = units::rerender(&self.env, unit.template(), &args);
        let scope = units::leave()?;
        let clean = scope.dropped.is_empty() && scope.newly_failed.is_empty();
        *cache = scope.cache;
        let (text, rec) = result?;
        if !clean || text.contains(MARK_START) || !units::same_behaviour(&rec, &old) {
            return None;
        }
        let generation = cache.generation;
        let entry = cache.entries.get_mut(unit)?;
        entry.args = args;
        entry.rec = Arc::new(rec);
        entry.outcome = Arc::new(Ok(text.clone()));
        entry.generation = generation;
        entry.validated = false;
        Some(text)
    }
}

fn shift(line: usize, by: isize) -> usize {
    line.saturating_add_signed(by)
}

/// Post-processing (line by line) of only the lines the changed units touched: the edits to
/// the old output `post` (byte range and new lines, in order); its other lines stay.
/// `changed` holds, per changed unit in order, its old mark (lines) and its new mark in
/// `pre`. `None` when the shortcut does not apply (a replacement that inserts new lines, or a
/// change reaching the output's last line, where trailing new lines are trimmed).
fn splice_post(
    post: &str,
    pre: &str,
    changed: &[(Mark, Mark, &str)],
    steps: &[super::RegexReplace],
) -> Option<Vec<(usize, usize, String)>> {
    if steps.iter().any(|s| s.replace.contains('\n')) {
        return None;
    }
    // Whole lines: (old first, old last, new byte range), merged where they share a line.
    let mut ranges: Vec<(usize, usize, usize, usize)> = Vec::new();
    for (old, new, _) in changed {
        let start = pre[..new.start].rfind('\n').map_or(0, |i| i + 1);
        let end = pre[new.end..].find('\n').map_or(pre.len(), |i| new.end + i);
        match ranges.last_mut() {
            Some(r) if old.first <= r.1 => {
                r.1 = old.last;
                r.3 = end;
            }
            _ => ranges.push((old.first, old.last, start, end)),
        }
    }
    // Text must follow the last changed line (trailing new lines are trimmed at the end).
    if ranges
        .last()
        .is_none_or(|r| pre[r.3..].trim_end_matches('\n').is_empty())
    {
        return None;
    }
    // The byte where line `target` starts, moving forward from `line` at `pos`.
    let advance = |mut pos: usize, mut line: usize, target: usize| -> Option<usize> {
        while line < target {
            pos += post[pos..].find('\n')? + 1;
            line += 1;
        }
        Some(pos)
    };
    let mut edits: Vec<(usize, usize, String)> = Vec::with_capacity(ranges.len());
    let (mut pos, mut line) = (0usize, 1usize);
    for &(first, last, start, end) in &ranges {
        let from = advance(pos, line, first)?;
        let to = advance(from, first, last + 1)?;
        let mut lines = String::with_capacity(end - start + 1);
        for l in pre[start..end].split('\n') {
            super::post_process_line(l, steps, &mut lines);
            lines.push('\n');
        }
        edits.push((from, to, lines));
        (pos, line) = (to, last + 1);
    }
    Some(edits)
}

fn versions(inputs: &RenderInputs) -> Vec<(String, u64)> {
    inputs
        .stores
        .iter()
        .map(|(name, store)| (name.clone(), store.version()))
        .collect()
}

/// Whether two reads ask the same question (the same store lookup, the same backend).
fn same_target(a: &Read, b: &Read) -> bool {
    match (a, b) {
        (Read::Store(a), Read::Store(b)) => {
            a.store == b.store && a.method == b.method && a.keys == b.keys
        }
        (Read::Current { backend: b1, .. }, Read::Current { backend: b2, .. }) => b1 == b2,
        _ => false,
    }
}
