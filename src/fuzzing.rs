//! Entry points for the coverage-guided fuzz targets in `fuzz/` (`scripts/fuzz.sh`), also
//! replayed over the committed corpora by `tests/fuzz_corpora.rs`.
//!
//! Each takes arbitrary bytes and drives one input surface the way the controller does. Beyond
//! "never panics", each checks the invariants that surface promises, so a fuzzer finds wrong
//! answers too: a duration prints back to itself, the windowed classification equals the full
//! one, an incrementally updated `current_config` equals a fresh parse.

use std::io::Cursor;
use std::sync::Arc;

use haptic_agent::classify::{classify, classify_full};
use haptic_agent::haproxy_cfg::{self, Config};
use haptic_agent::protocol::Bundle;
use serde_json::Value;

use crate::config::duration::{format_duration, parse_duration, MAX_DURATION};
use crate::kube::client::WatchStream;
use crate::render::current_config::CurrentConfig;
use crate::store::path::{PathExpr, Step};
use crate::store::selector::{FieldSelector, LabelSelector};
use crate::store::{doc_key, ObjectFilter, Shape, Store};

/// Splits fuzz input into parts at NUL bytes (a separator the text formats never need).
fn parts(data: &[u8], n: usize) -> Vec<String> {
    let mut out: Vec<String> = data
        .splitn(n, |b| *b == 0)
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    out.resize(n, String::new());
    out
}

/// Config parsing: YAML fragments, merge, typed spec, validation. Every error carries a source;
/// nothing panics.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(fragments) = crate::config::parse_fragments(text, "fuzz.yaml") else {
        return;
    };
    let mut merged: Option<crate::config::ConfigDocument> = None;
    for fragment in fragments {
        let _ = fragment.valid_spec("fuzz.yaml");
        match &mut merged {
            Some(m) => m.merge(fragment),
            None => merged = Some(fragment),
        }
    }
    if let Some(doc) = merged {
        if let Ok(spec) = doc.valid_spec("fuzz.yaml") {
            // A valid spec prints to YAML that reads back as the same spec, unless the printed
            // form is itself past the input limits (aliases expanded, a merged manifest nesting
            // a bare spec one level deeper): those are refused as they would be from a user.
            let Ok(again) = crate::config::parse_fragments(&doc.to_yaml(), "again.yaml") else {
                return;
            };
            let again = again
                .into_iter()
                .next()
                .expect("a valid spec's YAML has a document")
                .valid_spec("again.yaml")
                .expect("a valid spec's YAML is valid");
            assert_eq!(format!("{spec:?}"), format!("{again:?}"));
        }
    }
}

/// Duration parsing: accepted values are within the documented maximum and print back to a
/// string that parses to the same value.
pub fn duration(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Ok(d) = parse_duration(&text) {
        assert!(d <= MAX_DURATION, "{text:?} parsed to {d:?}");
        let printed = format_duration(d);
        assert_eq!(
            parse_duration(&printed),
            Ok(d),
            "{text:?} printed as {printed:?}"
        );
    }
}

/// The haproxy.cfg tokenizer, section parser and classifier on two configurations (and one
/// map file each): the windowed classification equals the full comparison, and an updated
/// `current_config` equals a fresh parse of the new text.
pub fn haproxy_cfg(data: &[u8]) {
    let p = parts(data, 3);
    let (old, new, map) = (&p[0], &p[1], &p[2]);
    for line in old.lines().chain(new.lines()) {
        let tokens = haproxy_cfg::tokenize_line(line);
        let _ = haproxy_cfg::ServerLine::parse(&tokens);
        let _ = haproxy_cfg::file_references(tokens.iter().map(String::as_str), "maps/x.map");
        for t in &tokens {
            let _ = haproxy_cfg::SocketAddress::parse(t);
        }
    }
    let _ = haproxy_cfg::data_lines(map);
    let parsed = Config::parse(new);
    for section in &parsed.sections {
        let _ = section.name();
        let _ = section.has_servers();
    }
    let old_bundle = Bundle::new(old.clone(), Vec::new());
    let new_bundle = Bundle::new(new.clone(), Vec::new());
    assert_eq!(
        classify(&old_bundle, &new_bundle),
        classify_full(&old_bundle, &new_bundle),
        "windowed and full classification differ\n--- old\n{old}\n--- new\n{new}"
    );
    let updated = CurrentConfig::parse(old).update(old, new);
    assert_eq!(
        updated.value().to_string(),
        CurrentConfig::parse(new).value().to_string(),
        "updated current_config differs from a fresh parse\n--- old\n{old}\n--- new\n{new}"
    );
}

/// Watch-stream decoding into a store, the way a reflector applies events: decoded lines,
/// field selector and ignored fields, upserts and deletes under three indexes. The store's
/// index always answers what the objects hold.
pub fn watch_stream(data: &[u8]) {
    let mut store = Store::indexed_by(&[
        "metadata.namespace".into(),
        "metadata.labels['kubernetes.io/service-name']".into(),
    ]);
    let filter = ObjectFilter::new(
        &["metadata.managedFields".into(), "status".into()],
        Some("metadata.namespace!=kube-system"),
    );
    let fast = WatchStream::from_reader("fuzz", Box::new(Cursor::new(data.to_vec())))
        .shaped(Arc::new(Shape::new(filter.clone())));
    let slow = WatchStream::from_reader("fuzz", Box::new(Cursor::new(data.to_vec())))
        .shaped(Arc::new(Shape::by_value(filter)));
    for (event, by_value) in fast.zip(slow).take(256) {
        // Parsed straight into a document as through a `Value`.
        assert_eq!(event.is_ok(), by_value.is_ok(), "event verdicts");
        let (Ok(event), Ok(by_value)) = (event, by_value) else {
            continue;
        };
        assert_eq!(event.kind, by_value.kind);
        assert_eq!(event.object.selected, by_value.object.selected);
        assert_eq!(event.object.doc, by_value.object.doc);
        let Ok(doc) = event.object.doc else { continue };
        let Some(key) = doc_key(&doc) else {
            continue;
        };
        match event.kind.as_str() {
            "ADDED" | "MODIFIED" if event.object.selected => {
                let _ = store.upsert(Arc::new(doc));
            }
            "ADDED" | "MODIFIED" | "DELETED" => {
                store.delete(&key);
            }
            _ => {}
        }
    }
    for object in store.list() {
        let keys: Vec<String> = store
            .index_by()
            .iter()
            .map(|p| p.key_of_node(object.root()).unwrap_or_default())
            .collect();
        let found = store.fetch(&keys).expect("a lookup by every index key");
        assert!(
            found.iter().any(|o| Arc::ptr_eq(o, object)),
            "an object is not found under its own index keys {keys:?}"
        );
    }
}

/// Store path expressions, field selectors and label selectors against one JSON object.
pub fn store_paths(data: &[u8]) {
    let p = parts(data, 4);
    let object: Value = serde_json::from_str(&p[3]).unwrap_or(Value::Null);
    // The compact form stores answers every lookup as the parsed value does.
    let doc = crate::store::Doc::from_value(&object).expect("a small document fits");
    assert_eq!(doc.to_value(), object, "a document round-trips");
    if let Ok(path) = PathExpr::parse(&p[0]) {
        assert_eq!(
            path.get_node(doc.root()).map(|n| n.to_value()),
            path.get(&object).cloned(),
            "{path} finds the same value in the document"
        );
        assert_eq!(path.key_of_node(doc.root()), path.key_of(&object), "{path}");
        let mut copy = object.clone();
        if path.remove(&mut copy) {
            // A removed key is gone; a removed list item leaves its list one shorter.
            let (last, parents) = path.steps().split_last().expect("a path has steps");
            let parent = |v: &Value| -> Option<Value> {
                let mut at = v;
                for step in parents {
                    at = match step {
                        Step::Key(k) => at.get(k)?,
                        Step::Index(n) => at.get(*n)?,
                    };
                }
                Some(at.clone())
            };
            match last {
                Step::Key(k) => assert!(
                    parent(&copy).is_some_and(|p| p.get(k).is_none()),
                    "{path} still present after remove"
                ),
                Step::Index(_) => {
                    let len = |v: Option<Value>| v.and_then(|p| p.as_array().map(Vec::len));
                    assert_eq!(
                        len(parent(&copy)),
                        len(parent(&object)).map(|n| n - 1),
                        "{path}: the list did not lose one item"
                    );
                }
            }
        }
    }
    if let Ok(selector) = FieldSelector::parse(&p[1]) {
        let matches = selector.matches(&object);
        assert_eq!(selector.matches_node(doc.root()), matches, "{}", p[1]);
    }
    // Parsing the text straight into a document, with the path ignored and the selector
    // applied, gives what the `Value` path gives.
    let filter = ObjectFilter::new(std::slice::from_ref(&p[0]), Some(&p[1]));
    let fast = Shape::new(filter.clone()).parse(&p[3]);
    let slow = Shape::by_value(filter).parse(&p[3]);
    match (fast, slow) {
        (Ok(fast), Ok(slow)) => {
            assert_eq!(fast.selected, slow.selected, "selected");
            assert_eq!(fast.doc, slow.doc, "parsed documents");
        }
        (fast, slow) => assert_eq!(fast.is_ok(), slow.is_ok(), "parse verdicts"),
    }
    if let Ok(selector) = LabelSelector::parse(&p[2]) {
        let matches = selector.matches(&object);
        // The query form sent to the API server parses to the same selector.
        let again = LabelSelector::parse(selector.as_query()).expect("a selector's query parses");
        assert_eq!(again.matches(&object), matches);
    }
}
