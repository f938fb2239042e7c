//! [`Doc`]: a stored Kubernetes object in a compact, immutable form.
//!
//! A `serde_json::Value` tree costs about twenty times its JSON: every object is a B-tree
//! node sized for eleven entries, and every key and string is its own allocation. Stores hold
//! tens of thousands of objects for the life of the controller, so they keep them as `Doc`s
//! instead: the nodes in preorder, four bytes each (eight in objects with more than 32 KiB of
//! text or nodes), and every distinct string of the object once, in one text buffer, except
//! the strings of a fixed table that nearly every object shares (`store::common`), which are
//! referred to by number. A node is read in place (templates see it through
//! `render::objects::JsonNode`), so nothing is converted per render.
//!
//! Layout: a node is a kind, the text offset of its key (members of objects) and one more
//! number: the text offset of a string or number (or its number in the common table), the
//! value of a boolean, or for arrays and objects the index one past their last descendant (so a walk skips a child's subtree in one
//! step). Text entries are a length prefix of ASCII bytes (six bits each, 0x40 = more follows)
//! and the string's bytes, so the buffer stays a `str`. Members keep the order of the
//! `serde_json` map they came from (sorted by key). Arrays and objects with more than
//! [`WIDE`] children also get a row of their children's indices, so that indexing an array and
//! finding a key (binary search) do not walk.

use std::collections::HashMap;
use std::fmt;
use std::hash::BuildHasherDefault;

use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::Value;

use super::common;

/// Containers with more children than this get a direct index of them.
const WIDE: usize = 16;

/// Key offsets share a word with the kind, and one bit marks the strings of the common table,
/// so text beyond this is refused.
const MAX_TEXT: usize = 1 << 28;

/// Set in a text offset that is an index into the [`common`] table instead.
const COMMON: u32 = 1 << 28;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Null,
    Bool,
    Number,
    String,
    Array,
    Object,
}

const KINDS: [Kind; 6] = [
    Kind::Null,
    Kind::Bool,
    Kind::Number,
    Kind::String,
    Kind::Array,
    Kind::Object,
];

#[derive(Debug, Clone, Copy)]
struct Node {
    /// Kind (top three bits) and the text offset of the member's key (0, the empty string,
    /// for array items and the root).
    head: u32,
    /// Text offset (string, number), 0/1 (bool), end of subtree (array, object).
    value: u32,
}

impl Node {
    fn kind(self) -> Kind {
        KINDS[(self.head >> 29) as usize]
    }

    fn is_container(self) -> bool {
        matches!(self.kind(), Kind::Array | Kind::Object)
    }

    /// One past the last node of the subtree of this node, found at `idx`.
    fn end(self, idx: u32) -> u32 {
        if self.is_container() {
            self.value
        } else {
            idx + 1
        }
    }

    fn key(self) -> u32 {
        self.head & (COMMON | (MAX_TEXT as u32 - 1))
    }
}

impl Node {
    /// The four-byte form: head (kind in the top three bits, then a flag for common strings
    /// and twelve bits of key) and value (a flag for common strings and fifteen bits), when
    /// both fit.
    fn narrow(self) -> Option<u32> {
        let kind = self.head >> 29;
        let key = match self.key() {
            k if k & COMMON != 0 && k & !COMMON < 0x1000 => 0x1000 | (k & !COMMON),
            k if k < 0x1000 => k,
            _ => return None,
        };
        let value = match self.value {
            v if v & COMMON != 0 && v & !COMMON < 0x8000 => 0x8000 | (v & !COMMON),
            v if v < 0x8000 => v,
            _ => return None,
        };
        Some(value << 16 | kind << 13 | key)
    }

    /// The node of [`Node::narrow`]'s form.
    fn widen(narrow: u32) -> Node {
        let (head, value) = (narrow & 0xffff, narrow >> 16);
        let key = match head & 0x1fff {
            k if k & 0x1000 != 0 => COMMON | (k & 0xfff),
            k => k,
        };
        let value = match value {
            v if v & 0x8000 != 0 => COMMON | (v & 0x7fff),
            v => v,
        };
        Node {
            head: (head >> 13) << 29 | key,
            value,
        }
    }
}

/// The nodes of a document: most objects are small enough for four bytes a node.
enum Nodes {
    Narrow(Box<[u32]>),
    Wide(Box<[Node]>),
}

impl Nodes {
    #[inline]
    fn get(&self, idx: u32) -> Node {
        match self {
            Nodes::Narrow(n) => Node::widen(n[idx as usize]),
            Nodes::Wide(n) => n[idx as usize],
        }
    }

    fn len(&self) -> usize {
        match self {
            Nodes::Narrow(n) => n.len(),
            Nodes::Wide(n) => n.len(),
        }
    }

    fn heap_bytes(&self) -> usize {
        match self {
            Nodes::Narrow(n) => n.len() * 4,
            Nodes::Wide(n) => n.len() * std::mem::size_of::<Node>(),
        }
    }

    /// The narrow form when every node has one (a wide one is copied as it is).
    fn from_slice(nodes: &[Node]) -> Nodes {
        if nodes.len() < 0x8000 && nodes.iter().all(|n| n.narrow().is_some()) {
            let narrow = nodes.iter().map(|n| n.narrow().unwrap_or_default());
            return Nodes::Narrow(narrow.collect());
        }
        Nodes::Wide(Box::from(nodes))
    }
}

/// An object too large to be stored compactly (its strings exceed 256 MiB).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooLarge;

impl fmt::Display for TooLarge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "object too large to store (more than 256 MiB of text)")
    }
}

/// One JSON document, immutable once built.
pub struct Doc {
    nodes: Nodes,
    text: Box<str>,
    /// `(container node, start in children, count)` for every wide container, by node.
    wide: Box<[(u32, u32, u32)]>,
    /// Rows of child node indices of wide containers; an object's row is sorted by key.
    children: Box<[u32]>,
}

impl Doc {
    pub fn from_value(value: &Value) -> Result<Doc, TooLarge> {
        let mut b = Builder::new();
        b.value(value, 0);
        b.finish()
    }

    pub fn root(&self) -> NodeRef<'_> {
        NodeRef { doc: self, idx: 0 }
    }

    /// The node at `idx` (as given by [`NodeRef::index`]); `None` past the end.
    pub fn node(&self, idx: u32) -> Option<NodeRef<'_>> {
        ((idx as usize) < self.nodes.len()).then_some(NodeRef { doc: self, idx })
    }

    /// Bytes held on the heap (for memory accounting).
    pub fn heap_bytes(&self) -> usize {
        self.nodes.heap_bytes() + self.text.len() + self.wide.len() * 12 + self.children.len() * 4
    }

    pub fn to_value(&self) -> Value {
        self.root().to_value()
    }

    fn string_at(&self, offset: u32) -> &str {
        string_at(&self.text, offset)
    }

    fn wide_row(&self, idx: u32) -> Option<&[u32]> {
        if self.wide.is_empty() {
            return None;
        }
        let i = self.wide.binary_search_by_key(&idx, |w| w.0).ok()?;
        let (_, start, count) = self.wide[i];
        self.children.get(start as usize..(start + count) as usize)
    }
}

impl fmt::Debug for Doc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = serde_json::to_string(&self.root()).map_err(|_| fmt::Error)?;
        write!(f, "Doc({text})")
    }
}

impl PartialEq for Doc {
    fn eq(&self, other: &Doc) -> bool {
        self.root() == other.root()
    }
}

impl Serialize for Doc {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.root().serialize(s)
    }
}

/// A node of a [`Doc`].
#[derive(Clone, Copy)]
pub struct NodeRef<'a> {
    doc: &'a Doc,
    idx: u32,
}

impl<'a> NodeRef<'a> {
    fn node(self) -> Node {
        self.doc.nodes.get(self.idx)
    }

    /// This node's position in its document (see [`Doc::node`]).
    pub fn index(self) -> u32 {
        self.idx
    }

    pub fn kind(self) -> Kind {
        self.node().kind()
    }

    /// One past the last node of this subtree.
    fn end(self) -> u32 {
        self.node().end(self.idx)
    }

    fn first_child(self) -> Option<NodeRef<'a>> {
        let node = self.node();
        (node.is_container() && node.value > self.idx + 1).then_some(NodeRef {
            doc: self.doc,
            idx: self.idx + 1,
        })
    }

    /// The children of an array or object (values, in order); empty for scalars.
    pub fn items(self) -> Children<'a> {
        Children {
            doc: self.doc,
            next: self.first_child().map(|c| c.idx),
            end: self.end(),
        }
    }

    /// The members of an object as (key, value), in key order; empty for anything else.
    pub fn members(self) -> impl Iterator<Item = (&'a str, NodeRef<'a>)> {
        let children = if self.kind() == Kind::Object {
            self.items()
        } else {
            Children {
                doc: self.doc,
                next: None,
                end: 0,
            }
        };
        children.map(|c| (c.key(), c))
    }

    /// The key of an object member ("" for anything else).
    pub fn key(self) -> &'a str {
        self.doc.string_at(self.node().key())
    }

    /// Number of children of an array or object; 0 for scalars.
    pub fn len(self) -> usize {
        match self.wide_row() {
            Some(row) => row.len(),
            None => self.items().count(),
        }
    }

    pub fn is_empty(self) -> bool {
        self.first_child().is_none()
    }

    /// The member `key` of an object.
    pub fn get(self, key: &str) -> Option<NodeRef<'a>> {
        let node = self.node();
        if node.kind() != Kind::Object {
            return None;
        }
        let end = node.value;
        if end <= self.idx + 1 {
            return None;
        }
        if let Some(row) = self.wide_row() {
            let i = row
                .binary_search_by(|&c| self.doc_node(c).key().cmp(key))
                .ok()?;
            return Some(self.doc_node(row[i]));
        }
        // Templates look up a few well-known keys (metadata, spec, name, …) far more than any
        // other: those are stored as their number in the common table, so the walk compares
        // numbers, not strings, and skips each member's subtree in one step.
        let wanted = common::find(key, fx_hash(key.as_bytes())).map(|i| COMMON | i);
        let mut i = self.idx + 1;
        while i < end {
            let child = self.doc.nodes.get(i);
            let k = child.key();
            let hit = match wanted {
                Some(w) => k == w,
                None => k & COMMON == 0 && string_at(&self.doc.text, k) == key,
            };
            if hit {
                return Some(self.doc_node(i));
            }
            i = child.end(i);
        }
        None
    }

    /// Item `i` of an array.
    pub fn at(self, i: usize) -> Option<NodeRef<'a>> {
        if self.kind() != Kind::Array {
            return None;
        }
        if let Some(row) = self.wide_row() {
            return row.get(i).map(|&c| self.doc_node(c));
        }
        self.items().nth(i)
    }

    fn wide_row(self) -> Option<&'a [u32]> {
        self.doc.wide_row(self.idx)
    }

    fn doc_node(self, idx: u32) -> NodeRef<'a> {
        NodeRef { doc: self.doc, idx }
    }

    pub fn as_str(self) -> Option<&'a str> {
        (self.kind() == Kind::String).then(|| self.doc.string_at(self.node().value))
    }

    pub fn as_bool(self) -> Option<bool> {
        (self.kind() == Kind::Bool).then(|| self.node().value == 1)
    }

    pub fn is_null(self) -> bool {
        self.kind() == Kind::Null
    }

    /// A number as it was written (serde_json's rendering).
    pub fn number_text(self) -> Option<&'a str> {
        (self.kind() == Kind::Number).then(|| self.doc.string_at(self.node().value))
    }

    pub fn as_i64(self) -> Option<i64> {
        self.number_text()?.parse().ok()
    }

    pub fn as_u64(self) -> Option<u64> {
        self.number_text()?.parse().ok()
    }

    pub fn as_f64(self) -> Option<f64> {
        self.number_text()?.parse().ok()
    }

    /// The number as serde_json holds it. Floats are read back with the standard library's
    /// exact parser: serde_json printed their shortest round-tripping form, and its own
    /// parser can be one unit in the last place off.
    fn number(self) -> Option<serde_json::Number> {
        let text = self.number_text()?;
        if let Ok(i) = text.parse::<i64>() {
            return Some(i.into());
        }
        if let Ok(u) = text.parse::<u64>() {
            return Some(u.into());
        }
        serde_json::Number::from_f64(text.parse().ok()?)
    }

    /// The node at a path of keys.
    pub fn pointer(self, keys: &[&str]) -> Option<NodeRef<'a>> {
        keys.iter().try_fold(self, |n, k| n.get(k))
    }

    pub fn to_value(self) -> Value {
        match self.kind() {
            Kind::Null => Value::Null,
            Kind::Bool => Value::Bool(self.node().value == 1),
            Kind::Number => self.number().map(Value::Number).unwrap_or(Value::Null),
            Kind::String => Value::String(self.as_str().unwrap_or_default().to_string()),
            Kind::Array => Value::Array(self.items().map(NodeRef::to_value).collect()),
            Kind::Object => Value::Object(
                self.members()
                    .map(|(k, v)| (k.to_string(), v.to_value()))
                    .collect(),
            ),
        }
    }
}

impl PartialEq for NodeRef<'_> {
    fn eq(&self, other: &NodeRef<'_>) -> bool {
        if self.kind() != other.kind() {
            return false;
        }
        match self.kind() {
            Kind::Null => true,
            Kind::Bool => self.as_bool() == other.as_bool(),
            Kind::Number => self.number_text() == other.number_text(),
            Kind::String => self.as_str() == other.as_str(),
            Kind::Array => self.items().eq(other.items()),
            Kind::Object => self.members().eq(other.members()),
        }
    }
}

impl fmt::Debug for NodeRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = serde_json::to_string(self).map_err(|_| fmt::Error)?;
        f.write_str(&text)
    }
}

impl Serialize for NodeRef<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.kind() {
            Kind::Null => s.serialize_unit(),
            Kind::Bool => s.serialize_bool(self.node().value == 1),
            Kind::Number => match self.number() {
                Some(n) => n.serialize(s),
                None => s.serialize_unit(),
            },
            Kind::String => s.serialize_str(self.as_str().unwrap_or_default()),
            Kind::Array => {
                let mut seq = s.serialize_seq(None)?;
                for item in self.items() {
                    seq.serialize_element(&item)?;
                }
                seq.end()
            }
            Kind::Object => {
                let mut map = s.serialize_map(None)?;
                for (k, v) in self.members() {
                    map.serialize_entry(k, &v)?;
                }
                map.end()
            }
        }
    }
}

/// The children of an array or object, in order.
pub struct Children<'a> {
    doc: &'a Doc,
    next: Option<u32>,
    end: u32,
}

impl<'a> Iterator for Children<'a> {
    type Item = NodeRef<'a>;

    fn next(&mut self) -> Option<NodeRef<'a>> {
        let idx = self.next?;
        let node = NodeRef { doc: self.doc, idx };
        let after = node.end();
        self.next = (after < self.end).then_some(after);
        Some(node)
    }
}

/// The text entry at `offset` (a length prefix, then the bytes), or the common string.
fn string_at(text: &str, offset: u32) -> &str {
    if offset & COMMON != 0 {
        return common::get(offset & !COMMON);
    }
    let bytes = text.as_bytes();
    let (mut len, mut shift, mut at) = (0usize, 0u32, offset as usize);
    // Entries are only ever written by `Builder::write`, so the prefix is well formed; a
    // corrupt one could only make the slice below fail, never read out of bounds.
    while let Some(&b) = bytes.get(at) {
        len |= usize::from(b & 0x3f) << shift;
        at += 1;
        if b & 0x40 == 0 {
            break;
        }
        shift += 6;
    }
    text.get(at..at + len).unwrap_or_default()
}

/// Builds a [`Doc`] from a preorder stream of values: [`Builder::scalar`] and friends for
/// leaves, [`Builder::open`] / [`Builder::close`] around containers. Objects may arrive with
/// members in any order (as JSON text has them) and even repeated: closing an object sorts its
/// members by key and keeps the last of equal keys, as `serde_json`'s map does, so a document
/// parsed from text and one converted from a `Value` are the same.
pub(crate) struct Builder {
    nodes: Vec<Node>,
    text: String,
    /// Each distinct string is written once: text offsets by the string's hash (a collision
    /// only costs a second copy, never a wrong answer: the text is compared).
    offsets: HashMap<u64, u32, BuildHasherDefault<Passthrough>>,
    /// Set once the text outgrows [`MAX_TEXT`]; later writes are dropped.
    too_large: bool,
    /// Scratch space of `order_members`.
    members: Vec<(u32, u32)>,
    moved: Vec<Node>,
}

/// Scratch buffers larger than this are not kept for the next document.
const KEEP_SCRATCH: usize = 1 << 20;

thread_local! {
    /// The buffers of the last builder of this thread: documents are built in them and then
    /// copied out at their exact size, so a stream of documents allocates two blocks each and
    /// leaves no growth slack behind.
    static SCRATCH: std::cell::RefCell<Option<Builder>> = const { std::cell::RefCell::new(None) };
}

impl Builder {
    pub(crate) fn new() -> Builder {
        let mut b = SCRATCH
            .with(|s| s.borrow_mut().take())
            .unwrap_or_else(|| Builder {
                nodes: Vec::new(),
                text: String::new(),
                offsets: HashMap::default(),
                too_large: false,
                members: Vec::new(),
                moved: Vec::new(),
            });
        b.intern("");
        b
    }

    /// Gives the buffers back for the next builder on this thread.
    fn recycle(mut self) {
        let size = self.nodes.capacity() * std::mem::size_of::<Node>()
            + self.text.capacity()
            + self.offsets.capacity() * 16
            + self.members.capacity() * 8
            + self.moved.capacity() * std::mem::size_of::<Node>();
        if size > KEEP_SCRATCH {
            return;
        }
        self.nodes.clear();
        self.text.clear();
        self.offsets.clear();
        self.too_large = false;
        SCRATCH.with(|s| *s.borrow_mut() = Some(self));
    }

    /// The text offset of `s`, written on first use.
    pub(crate) fn intern(&mut self, s: &str) -> u32 {
        let hash = fx_hash(s.as_bytes());
        if let Some(i) = common::find(s, hash) {
            return COMMON | i;
        }
        if let Some(&at) = self.offsets.get(&hash) {
            if string_at(&self.text, at) == s {
                return at;
            }
            return self.write(s);
        }
        let at = self.write(s);
        if !self.too_large {
            self.offsets.insert(hash, at);
        }
        at
    }

    /// Appends a text entry: the length prefix, then the bytes.
    fn write(&mut self, s: &str) -> u32 {
        if self.too_large || self.text.len() + s.len() + 8 >= MAX_TEXT {
            self.too_large = true;
            return 0;
        }
        let at = self.text.len();
        let mut len = s.len();
        loop {
            let digit = (len & 0x3f) as u8;
            len >>= 6;
            if len == 0 {
                self.text.push(char::from(digit));
                break;
            }
            self.text.push(char::from(digit | 0x40));
        }
        self.text.push_str(s);
        at as u32
    }

    fn node(&mut self, kind: Kind, key: u32, value: u32) -> u32 {
        let idx = self.nodes.len();
        if idx >= u32::MAX as usize {
            self.too_large = true;
        }
        let kind_bits = KINDS.iter().position(|k| *k == kind).unwrap_or(0) as u32;
        self.nodes.push(Node {
            head: kind_bits << 29 | key,
            value,
        });
        idx as u32
    }

    pub(crate) fn null(&mut self, key: u32) {
        self.node(Kind::Null, key, 0);
    }

    pub(crate) fn bool(&mut self, key: u32, b: bool) {
        self.node(Kind::Bool, key, u32::from(b));
    }

    /// A number, kept as `serde_json` prints it (numbers are few, so they are not
    /// deduplicated).
    pub(crate) fn number(&mut self, key: u32, n: &serde_json::Number) {
        let at = self.write(&n.to_string());
        self.node(Kind::Number, key, at);
    }

    pub(crate) fn string(&mut self, key: u32, s: &str) {
        let at = self.intern(s);
        self.node(Kind::String, key, at);
    }

    /// Starts an array or object; its items follow, then [`Builder::close`] with the index
    /// returned here.
    pub(crate) fn open(&mut self, key: u32, object: bool) -> u32 {
        let kind = if object { Kind::Object } else { Kind::Array };
        self.node(kind, key, 0)
    }

    pub(crate) fn close(&mut self, idx: u32) {
        let end = self.nodes.len() as u32;
        self.nodes[idx as usize].value = end;
        if self.nodes[idx as usize].kind() == Kind::Object {
            self.order_members(idx, end);
        }
    }

    /// Sorts the members of the object at `idx` by key, keeping the last of equal keys.
    fn order_members(&mut self, idx: u32, end: u32) {
        let mut members = std::mem::take(&mut self.members);
        members.clear();
        let mut sorted = true;
        let mut at = idx + 1;
        while at < end {
            let next = self.subtree_end(at);
            if let Some(&(prev, _)) = members.last() {
                let (a, b) = (self.key_text(prev), self.key_text(at));
                sorted &= a < b;
            }
            members.push((at, next));
            at = next;
        }
        if !sorted {
            self.permute(idx, &mut members);
        }
        self.members = members;
    }

    /// Rewrites the members of the object at `idx` (`(start, end)` of each) in key order.
    fn permute(&mut self, idx: u32, members: &mut Vec<(u32, u32)>) {
        // Stable: equal keys keep their arrival order, and the last of each run stays.
        members.sort_by(|a, b| self.key_text(a.0).cmp(self.key_text(b.0)));
        let mut kept = 0;
        for i in 0..members.len() {
            if kept > 0 && self.key_text(members[kept - 1].0) == self.key_text(members[i].0) {
                members[kept - 1] = members[i];
            } else {
                members[kept] = members[i];
                kept += 1;
            }
        }
        members.truncate(kept);
        let mut moved = std::mem::take(&mut self.moved);
        moved.clear();
        for &(start, stop) in members.iter() {
            let shift = (idx + 1 + moved.len() as u32).wrapping_sub(start);
            for node in &self.nodes[start as usize..stop as usize] {
                let mut node = *node;
                if matches!(node.kind(), Kind::Array | Kind::Object) {
                    node.value = node.value.wrapping_add(shift);
                }
                moved.push(node);
            }
        }
        let new_end = idx + 1 + moved.len() as u32;
        self.nodes.truncate(idx as usize + 1);
        self.nodes.extend_from_slice(&moved);
        self.nodes[idx as usize].value = new_end;
        self.moved = moved;
    }

    fn subtree_end(&self, at: u32) -> u32 {
        let node = self.nodes[at as usize];
        match node.kind() {
            Kind::Array | Kind::Object => node.value,
            _ => at + 1,
        }
    }

    fn key_text(&self, at: u32) -> &str {
        string_at(&self.text, self.nodes[at as usize].key())
    }

    /// The value, walked into this builder as the member `key` (0 for the root and items).
    pub(crate) fn value(&mut self, value: &Value, key: u32) {
        match value {
            Value::Null => self.null(key),
            Value::Bool(b) => self.bool(key, *b),
            Value::Number(n) => self.number(key, n),
            Value::String(s) => self.string(key, s),
            Value::Array(items) => {
                let idx = self.open(key, false);
                for item in items {
                    self.value(item, 0);
                }
                self.close(idx);
            }
            Value::Object(map) => {
                let idx = self.open(key, true);
                for (k, v) in map {
                    let key = self.intern(k);
                    self.value(v, key);
                }
                self.close(idx);
            }
        }
    }

    /// The finished document: one root value must have been built.
    pub(crate) fn finish(self) -> Result<Doc, TooLarge> {
        let doc = self.build();
        self.recycle();
        doc
    }

    fn build(&self) -> Result<Doc, TooLarge> {
        if self.too_large || self.nodes.is_empty() {
            return Err(TooLarge);
        }
        // Rows of wide containers, in node order (lookups search by node). Members are
        // already sorted, so an object's row is sorted by key too.
        let mut wide = Vec::new();
        let mut children = Vec::new();
        for (idx, node) in self.nodes.iter().enumerate() {
            if !matches!(node.kind(), Kind::Array | Kind::Object) {
                continue;
            }
            let end = node.value;
            let (mut count, mut at) = (0, idx as u32 + 1);
            while at < end && count <= WIDE {
                count += 1;
                at = self.subtree_end(at);
            }
            if count > WIDE {
                let start = u32::try_from(children.len()).map_err(|_| TooLarge)?;
                let mut at = idx as u32 + 1;
                while at < end {
                    children.push(at);
                    at = self.subtree_end(at);
                }
                let count = children.len() as u32 - start;
                wide.push((idx as u32, start, count));
            }
        }
        Ok(Doc {
            nodes: Nodes::from_slice(&self.nodes),
            text: Box::from(&self.text[..]),
            wide: wide.into_boxed_slice(),
            children: children.into_boxed_slice(),
        })
    }
}

/// FxHash over bytes (rustc's hash): fast, and collisions cost only deduplication.
pub(super) fn fx_hash(bytes: &[u8]) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let mut h: u64 = bytes.len() as u64;
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_le_bytes(c.try_into().unwrap_or_default());
        h = (h.rotate_left(5) ^ w).wrapping_mul(K);
    }
    for &b in chunks.remainder() {
        h = (h.rotate_left(5) ^ u64::from(b)).wrapping_mul(K);
    }
    h
}

/// The hasher of maps whose keys are hashes already, or carry theirs.
#[derive(Default)]
pub(crate) struct Passthrough(u64);

impl std::hash::Hasher for Passthrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0 = fx_hash(bytes);
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn doc(v: &Value) -> Doc {
        Doc::from_value(v).unwrap()
    }

    /// A deterministic pseudo-random JSON value (xorshift), with every kind, long and
    /// non-ASCII strings, repeated strings and containers on both sides of `WIDE`.
    fn random_value(seed: &mut u64, depth: usize) -> Value {
        let mut next = || {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            *seed
        };
        let pick = next() % if depth == 0 { 5 } else { 7 };
        match pick {
            0 => Value::Null,
            1 => Value::Bool(next() % 2 == 0),
            2 => match next() % 4 {
                0 => json!(next() as i64),
                1 => json!(next()),
                2 => json!((next() % 1000) as f64 / 8.0),
                _ => json!(-((next() % 100) as i64)),
            },
            3 => {
                let words = ["", "a", "name", "ä€😀", "metadata", "x\"\\\n\u{0}y"];
                let len = match next() % 8 {
                    0 => 70,
                    1 => 5000,
                    _ => 1,
                };
                Value::String(words[(next() % 6) as usize].repeat(len))
            }
            4 => Value::String(format!("s{}", next() % 5)),
            5 => {
                let n = [0, 1, 3, WIDE, WIDE + 1, 40][(next() % 6) as usize];
                Value::Array((0..n).map(|_| random_value(seed, depth - 1)).collect())
            }
            _ => {
                let n = [0, 1, 3, WIDE, WIDE + 1, 40][(next() % 6) as usize];
                let mut map = serde_json::Map::new();
                for i in 0..n {
                    // Some keys of the common table (stored by number), some not.
                    let common = ["metadata", "name", "spec", "namespace", "labels", "ports"];
                    let key = if i % 3 == 2 {
                        common[(i / 3) % common.len()].to_string()
                    } else {
                        format!("k{}{}", i % 7, "é".repeat(i % 3))
                    };
                    map.insert(key, random_value(seed, depth - 1));
                }
                Value::Object(map)
            }
        }
    }

    /// Every lookup a template can make on `d` answers as the same lookup on `v`.
    fn same_answers(d: NodeRef<'_>, v: &Value) {
        assert_eq!(d.to_value(), *v);
        match v {
            Value::Object(map) => {
                assert_eq!(d.kind(), Kind::Object);
                assert_eq!(d.len(), map.len());
                let members: Vec<_> = d.members().map(|(k, _)| k.to_string()).collect();
                assert_eq!(members, map.keys().cloned().collect::<Vec<_>>());
                for (k, item) in map {
                    same_answers(d.get(k).expect("a member"), item);
                }
                assert!(d.get("missing key").is_none());
                assert!(d.at(0).is_none());
            }
            Value::Array(items) => {
                assert_eq!(d.kind(), Kind::Array);
                assert_eq!(d.len(), items.len());
                for (i, item) in items.iter().enumerate() {
                    same_answers(d.at(i).expect("an item"), item);
                }
                assert!(d.at(items.len()).is_none());
                assert!(d.get("0").is_none());
            }
            Value::String(s) => assert_eq!(d.as_str(), Some(s.as_str())),
            Value::Number(n) => {
                assert_eq!(d.as_i64(), n.as_i64());
                assert_eq!(d.as_u64(), n.as_u64());
                assert_eq!(d.as_f64(), n.as_f64());
            }
            Value::Bool(b) => assert_eq!(d.as_bool(), Some(*b)),
            Value::Null => assert!(d.is_null()),
        }
    }

    #[test]
    fn answers_every_lookup_as_the_parsed_value_does() {
        let mut seed = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..300 {
            let v = random_value(&mut seed, 4);
            let d = doc(&v);
            same_answers(d.root(), &v);
            assert_eq!(serde_json::to_string(&d).unwrap(), v.to_string());
        }
    }

    #[test]
    fn floats_come_back_exactly() {
        // Found by fuzzing: serde_json's own float parser is one unit in the last place off
        // for these.
        for f in [
            9.466386628878889e36,
            6.56688888888889e68,
            0.1,
            -0.0,
            1e-300,
            f64::MAX,
        ] {
            let v = json!({"f": f});
            assert_eq!(doc(&v).to_value(), v, "{f}");
            assert_eq!(doc(&v).root().get("f").unwrap().as_f64(), Some(f));
        }
    }

    #[test]
    fn wide_containers_are_indexed_and_small_ones_are_not() {
        let wide: serde_json::Map<String, Value> = (0..100)
            .map(|i| (format!("key-{i:03}"), json!(i)))
            .collect();
        let v = json!({"wide": wide, "list": (0..100).collect::<Vec<_>>(), "small": {"a": 1}});
        let d = doc(&v);
        assert_eq!(d.wide.len(), 2);
        let root = d.root();
        assert_eq!(
            root.pointer(&["wide", "key-057"]).unwrap().as_i64(),
            Some(57)
        );
        assert_eq!(root.get("list").unwrap().at(99).unwrap().as_i64(), Some(99));
        assert_eq!(root.get("list").unwrap().len(), 100);
        assert_eq!(root.pointer(&["small", "a"]).unwrap().as_i64(), Some(1));
    }

    #[test]
    fn small_objects_take_four_bytes_a_node_and_large_ones_eight() {
        let small = json!({"metadata": {"name": "web", "labels": {"owner": "team-a"}},
            "list": [1, "two", true, null, {"kind": "Service"}]});
        let d = doc(&small);
        assert!(matches!(d.nodes, Nodes::Narrow(_)));
        same_answers(d.root(), &small);
        // Past 4 KiB of text, keys no longer fit; past 32 KiB, values neither.
        for len in [5000, 40_000] {
            let large = json!({"a": "x".repeat(len), "b": {"owner": "y", "name": "z"},
                "c": (0..40).collect::<Vec<_>>()});
            let d = doc(&large);
            assert!(matches!(d.nodes, Nodes::Wide(_)));
            same_answers(d.root(), &large);
        }
        let many = Value::Array((0..40_000).map(Value::from).collect());
        let d = doc(&many);
        assert!(matches!(d.nodes, Nodes::Wide(_)));
        same_answers(d.root(), &many);
    }

    #[test]
    fn repeated_strings_are_stored_once() {
        let v = json!({"owner": "team-a", "labels": {"owner": "team-a", "app": "team-a"},
            "list": ["team-a", "team-a", "team-a"], "namespace": "namespace"});
        let d = doc(&v);
        assert_eq!(d.text.matches("team-a").count(), 1);
        assert_eq!(d.text.matches("owner").count(), 1);
        // Strings of the common table are not in the document's text at all.
        assert_eq!(d.text.matches("namespace").count(), 0);
        assert_eq!(d.text.matches("labels").count(), 0);
        same_answers(d.root(), &v);
    }

    #[test]
    fn a_typical_object_is_smaller_than_its_json() {
        let v = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "web-abcde", "namespace": "shop", "labels": {"kubernetes.io/service-name": "web"},
                "resourceVersion": "123456", "uid": "8d7b4e5c-2a55-4b0e-9d6f-3f1c2b7a9e10"},
            "addressType": "IPv4", "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": [
                {"addresses": ["10.1.0.1"], "conditions": {"ready": true, "serving": true, "terminating": false}, "nodeName": "node-1"},
                {"addresses": ["10.1.0.2"], "conditions": {"ready": true, "serving": true, "terminating": false}, "nodeName": "node-2"},
                {"addresses": ["10.1.0.3"], "conditions": {"ready": true, "serving": true, "terminating": false}, "nodeName": "node-1"}]});
        let d = doc(&v);
        let json_len = v.to_string().len();
        assert!(
            d.heap_bytes() < json_len * 3 / 2,
            "{} bytes for {json_len} bytes of JSON",
            d.heap_bytes()
        );
    }
}
