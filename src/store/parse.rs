//! JSON from the API server parsed straight into [`Doc`]s.
//!
//! A reflector receives every object as JSON text: list pages and watch events. Parsing the
//! text into a `serde_json::Value` first and compacting that costs a tree of small allocations
//! per object, freed right after; with tens of thousands of objects that is most of the ingest
//! time and leaves the allocator's pages fragmented. Here the parser feeds the document
//! builder directly, strings borrowed from the text where they have no escapes, and the
//! `watchedResourcesIgnoreFields` are skipped as they are read.
//!
//! The result is the same document `ObjectFilter::prepare` and `Doc::from_value` give (the
//! fuzz target `watch_stream` checks this). Ignored fields are skipped while parsing only when
//! that is certainly the same: paths of keys only, none of them covering a field the field
//! selector or the reflector reads (name, namespace, resourceVersion). Any other filter takes
//! the `Value` path.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;

use super::doc::{Builder, Doc, TooLarge};
use super::path::Step;
use super::ObjectFilter;

/// One object as parsed: the document, without the ignored fields, and whether it passed the
/// field selector (judged before the fields were dropped). An object that did not pass is
/// only good for its key.
#[derive(Debug)]
pub struct Parsed {
    pub doc: Result<Doc, TooLarge>,
    pub selected: bool,
}

/// An [`ObjectFilter`] made ready for parsing.
#[derive(Debug, Default)]
pub struct Shape {
    filter: ObjectFilter,
    /// The ignored fields as a tree of keys, when they can be skipped while parsing.
    skip: Option<Trie>,
}

#[derive(Debug, Default)]
struct Trie {
    children: BTreeMap<String, Trie>,
    /// This key is ignored (with everything under it).
    leaf: bool,
}

/// Fields the reflector reads from every object, so never skipped while parsing.
const READ: [&[&str]; 3] = [
    &["metadata", "name"],
    &["metadata", "namespace"],
    &["metadata", "resourceVersion"],
];

impl Shape {
    pub fn new(filter: ObjectFilter) -> Shape {
        let mut shape = Shape::by_value(filter);
        shape.skip = shape.trie();
        shape
    }

    /// A shape that always takes the `Value` path (to compare against).
    pub fn by_value(filter: ObjectFilter) -> Shape {
        Shape { filter, skip: None }
    }

    pub fn filter(&self) -> &ObjectFilter {
        &self.filter
    }

    fn trie(&self) -> Option<Trie> {
        let mut read: Vec<Vec<&str>> = READ.iter().map(|p| p.to_vec()).collect();
        if let Some(sel) = &self.filter.field_selector {
            for path in sel.paths() {
                let keys = path.steps().iter().map(|s| match s {
                    Step::Key(k) => Some(k.as_str()),
                    Step::Index(_) => None,
                });
                // A selector through a list index is not compared below; take the Value path.
                read.push(keys.collect::<Option<Vec<_>>>()?);
            }
        }
        let mut trie = Trie::default();
        for path in &self.filter.ignore_fields {
            let mut keys = Vec::new();
            for step in path.steps() {
                match step {
                    Step::Key(k) => keys.push(k.as_str()),
                    Step::Index(_) => return None,
                }
            }
            if keys.is_empty() || read.iter().any(|r| r.starts_with(&keys)) {
                return None;
            }
            let mut node = &mut trie;
            for k in keys {
                node = node.children.entry(k.to_string()).or_default();
            }
            node.leaf = true;
        }
        Some(trie)
    }

    /// Parses one object (JSON text).
    pub fn parse(&self, json: &str) -> Result<Parsed, serde_json::Error> {
        let mut de = serde_json::Deserializer::from_str(json);
        let parsed = ObjectSeed {
            shape: self,
            defaults: &[],
        }
        .deserialize(&mut de)?;
        de.end()?;
        Ok(parsed)
    }

    /// Parses a watch event: its `type` and its object.
    pub fn parse_event(&self, json: &str) -> Result<(String, Parsed), serde_json::Error> {
        let mut de = serde_json::Deserializer::from_str(json);
        let event = de.deserialize_map(EventVisitor { shape: self })?;
        de.end()?;
        Ok(event)
    }

    /// Parses a list page, handing each item to `each` as it is read (items get the
    /// `defaults` members they lack: list items carry no apiVersion or kind). Returns the
    /// page's `metadata`.
    pub fn parse_list(
        &self,
        json: &str,
        defaults: &[(&str, &str)],
        each: &mut dyn FnMut(Parsed),
    ) -> Result<ListMeta, serde_json::Error> {
        let mut de = serde_json::Deserializer::from_str(json);
        let meta = de.deserialize_map(ListVisitor {
            shape: self,
            defaults,
            each,
        })?;
        de.end()?;
        Ok(meta)
    }
}

/// `metadata` of a list.
#[derive(Debug, Default, Deserialize)]
pub struct ListMeta {
    #[serde(default, rename = "continue")]
    pub continue_token: Option<String>,
    #[serde(default, rename = "resourceVersion")]
    pub resource_version: Option<String>,
}

struct ObjectSeed<'s> {
    shape: &'s Shape,
    defaults: &'s [(&'s str, &'s str)],
}

impl<'de> DeserializeSeed<'de> for ObjectSeed<'_> {
    type Value = Parsed;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Parsed, D::Error> {
        let filter = &self.shape.filter;
        let Some(skip) = &self.shape.skip else {
            let mut value = Value::deserialize(d)?;
            if let Some(map) = value.as_object_mut() {
                for (k, v) in self.defaults {
                    map.entry(*k).or_insert_with(|| Value::from(*v));
                }
            }
            let selected = filter.selects(&value);
            for path in &filter.ignore_fields {
                path.remove(&mut value);
            }
            return Ok(Parsed {
                doc: Doc::from_value(&value),
                selected,
            });
        };
        let mut b = Builder::new();
        d.deserialize_any(NodeSeed {
            b: &mut b,
            key: 0,
            skip: Some(skip),
            defaults: self.defaults,
        })?;
        let doc = b.finish();
        let selected = match (&doc, &filter.field_selector) {
            (Ok(doc), Some(sel)) => sel.matches_node(doc.root()),
            (_, None) => true,
            (Err(_), Some(_)) => false,
        };
        Ok(Parsed { doc, selected })
    }
}

/// Builds one value (and everything under it) as the member `key`.
struct NodeSeed<'b, 's> {
    b: &'b mut Builder,
    key: u32,
    /// Ignored fields below this value, when it is an object.
    skip: Option<&'s Trie>,
    /// Members an object gets when it lacks them (the root of list items only).
    defaults: &'s [(&'s str, &'s str)],
}

impl<'de> DeserializeSeed<'de> for NodeSeed<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for NodeSeed<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        self.b.null(self.key);
        Ok(())
    }

    fn visit_none<E>(self) -> Result<(), E> {
        self.b.null(self.key);
        Ok(())
    }

    fn visit_bool<E>(self, v: bool) -> Result<(), E> {
        self.b.bool(self.key, v);
        Ok(())
    }

    fn visit_i64<E>(self, v: i64) -> Result<(), E> {
        self.b.number(self.key, &v.into());
        Ok(())
    }

    fn visit_u64<E>(self, v: u64) -> Result<(), E> {
        self.b.number(self.key, &v.into());
        Ok(())
    }

    fn visit_f64<E>(self, v: f64) -> Result<(), E> {
        // As `serde_json::Value` does: a float JSON cannot write is null.
        match serde_json::Number::from_f64(v) {
            Some(n) => self.b.number(self.key, &n),
            None => self.b.null(self.key),
        }
        Ok(())
    }

    fn visit_str<E>(self, v: &str) -> Result<(), E> {
        self.b.string(self.key, v);
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let idx = self.b.open(self.key, false);
        while seq
            .next_element_seed(NodeSeed {
                b: &mut *self.b,
                key: 0,
                skip: None,
                defaults: &[],
            })?
            .is_some()
        {}
        self.b.close(idx);
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let idx = self.b.open(self.key, true);
        let mut missing: Vec<bool> = vec![true; self.defaults.len()];
        while let Some(Key(k)) = map.next_key::<Key>()? {
            let below = self.skip.and_then(|t| t.children.get(&*k));
            if below.is_some_and(|t| t.leaf) {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            for (i, (name, _)) in self.defaults.iter().enumerate() {
                if *name == k {
                    missing[i] = false;
                }
            }
            let key = self.b.intern(&k);
            map.next_value_seed(NodeSeed {
                b: &mut *self.b,
                key,
                skip: below,
                defaults: &[],
            })?;
        }
        for ((name, value), missing) in self.defaults.iter().zip(missing) {
            if missing {
                let key = self.b.intern(name);
                self.b.string(key, value);
            }
        }
        self.b.close(idx);
        Ok(())
    }
}

/// A member's key, borrowed from the text when it has no escapes.
struct Key<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Key<'de>, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a key")
            }

            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }

            fn visit_str<E>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_string())))
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

struct EventVisitor<'s> {
    shape: &'s Shape,
}

impl<'de> Visitor<'de> for EventVisitor<'_> {
    type Value = (String, Parsed);

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a watch event")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (mut kind, mut object) = (String::new(), None);
        while let Some(Key(k)) = map.next_key::<Key>()? {
            match &*k {
                "type" => kind = map.next_value::<Option<String>>()?.unwrap_or_default(),
                "object" => {
                    object = Some(map.next_value_seed(ObjectSeed {
                        shape: self.shape,
                        defaults: &[],
                    })?)
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let object = object.unwrap_or_else(|| Parsed {
            doc: Doc::from_value(&Value::Null),
            selected: false,
        });
        Ok((kind, object))
    }
}

struct ListVisitor<'s, 'f> {
    shape: &'s Shape,
    defaults: &'s [(&'s str, &'s str)],
    each: &'f mut dyn FnMut(Parsed),
}

impl<'de> Visitor<'de> for ListVisitor<'_, '_> {
    type Value = ListMeta;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ListMeta, A::Error> {
        let mut meta = ListMeta::default();
        while let Some(Key(k)) = map.next_key::<Key>()? {
            match &*k {
                "metadata" => meta = map.next_value::<Option<ListMeta>>()?.unwrap_or_default(),
                "items" => map.next_value_seed(Items {
                    shape: self.shape,
                    defaults: self.defaults,
                    each: &mut *self.each,
                })?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(meta)
    }
}

struct Items<'s, 'f> {
    shape: &'s Shape,
    defaults: &'s [(&'s str, &'s str)],
    each: &'f mut dyn FnMut(Parsed),
}

impl<'de> DeserializeSeed<'de> for Items<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Items<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of objects")
    }

    /// `"items": null` (an empty list, as some servers write it).
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(parsed) = seq.next_element_seed(ObjectSeed {
            shape: self.shape,
            defaults: self.defaults,
        })? {
            (self.each)(parsed);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn filter(ignore: &[&str], selector: Option<&str>) -> ObjectFilter {
        let ignore: Vec<String> = ignore.iter().map(|s| s.to_string()).collect();
        ObjectFilter::new(&ignore, selector)
    }

    /// Both paths give the same document and the same verdict.
    fn same(f: ObjectFilter, text: &str) -> Parsed {
        let fast = Shape::new(f.clone()).parse(text).unwrap();
        let slow = Shape::by_value(f).parse(text).unwrap();
        assert_eq!(fast.selected, slow.selected, "{text}");
        assert_eq!(fast.doc, slow.doc, "{text}");
        fast
    }

    const POD: &str = r#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"web-1","namespace":"shop",
        "managedFields":[{"manager":"kubectl"}],"labels":{"app":"web","b":"1","a":"2"},
        "annotations":{"x\u002ey":"caf\u00e9","x":"1"}},
        "spec":{"nodeName":"n1","containers":[{"name":"c","ports":[{"containerPort":8080}]}]},
        "status":{"phase":"Running","ratio":0.5,"big":18446744073709551615,"neg":-3,"ok":true,"none":null}}"#;

    #[test]
    fn parses_as_the_value_path_does() {
        same(ObjectFilter::default(), POD);
        let p = same(filter(&["metadata.managedFields", "status"], None), POD);
        let doc = p.doc.unwrap();
        assert!(doc.root().pointer(&["metadata", "managedFields"]).is_none());
        assert!(doc.root().get("status").is_none());
        assert_eq!(
            doc.root()
                .pointer(&["metadata", "annotations", "x.y"])
                .unwrap()
                .as_str(),
            Some("café")
        );
        // Members come out sorted by key, as from a `serde_json` map.
        let keys: Vec<_> = doc.root().members().map(|(k, _)| k.to_string()).collect();
        assert_eq!(keys, ["apiVersion", "kind", "metadata", "spec"]);
    }

    #[test]
    fn the_field_selector_sees_the_object_before_fields_are_ignored() {
        let p = same(filter(&["spec"], Some("spec.nodeName=n1")), POD);
        assert!(p.selected, "the selector read spec before it was dropped");
        assert!(p.doc.unwrap().root().get("spec").is_none());
        let p = same(filter(&["status"], Some("status.phase!=Running")), POD);
        assert!(!p.selected);
        let p = same(
            filter(&["metadata.managedFields"], Some("metadata.namespace=shop")),
            POD,
        );
        assert!(p.selected);
    }

    #[test]
    fn unusual_filters_and_documents_take_the_same_path() {
        for ignore in [
            &["metadata"][..],
            &["metadata.name"],
            &["spec.containers[0]"],
            &["spec.containers.name"],
            &["metadata.labels.a", "metadata.labels.b", "metadata.labels"],
            &["nothing.here"],
        ] {
            same(filter(ignore, None), POD);
        }
        for text in [
            r#"{"b":1,"a":2,"b":3}"#,
            r#"{"a":{"y":1,"x":2,"x":{"q":[1,{"b":2,"a":1}]}},"a":{"z":0}}"#,
            r#"[1,2,{"b":1,"a":2}]"#,
            r#""just a string""#,
            r#"null"#,
            r#"{"n":1.0,"m":1e300,"k":-0.0,"j":123456789012345678901234567890}"#,
        ] {
            same(filter(&["a.x", "b"], None), text);
            same(ObjectFilter::default(), text);
        }
        for bad in [
            r#"{"m":1e400}"#,
            r#"{"a":1,}"#,
            r#"{"a":1} {}"#,
            "\"{\\ud800}\"",
        ] {
            assert!(
                Shape::new(ObjectFilter::default()).parse(bad).is_err(),
                "{bad}"
            );
            assert!(Shape::by_value(ObjectFilter::default()).parse(bad).is_err());
        }
    }

    #[test]
    fn list_items_get_the_missing_defaults() {
        let shape = Shape::new(filter(&["metadata.managedFields"], None));
        let page = json!({"kind": "PodList", "apiVersion": "v1",
            "metadata": {"resourceVersion": "77", "continue": "next"},
            "items": [
                {"metadata": {"name": "a", "managedFields": []}},
                {"kind": "Other", "metadata": {"name": "b"}}]})
        .to_string();
        let mut items = Vec::new();
        let defaults = [("apiVersion", "v1"), ("kind", "Pod")];
        let meta = shape
            .parse_list(&page, &defaults, &mut |p| {
                items.push(p.doc.unwrap().to_value())
            })
            .unwrap();
        assert_eq!(meta.resource_version.as_deref(), Some("77"));
        assert_eq!(meta.continue_token.as_deref(), Some("next"));
        assert_eq!(
            items,
            [
                json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a"}}),
                json!({"apiVersion": "v1", "kind": "Other", "metadata": {"name": "b"}})
            ]
        );
        let empty = r#"{"metadata":{"resourceVersion":"5"},"items":null}"#;
        let meta = shape
            .parse_list(empty, &defaults, &mut |_| panic!("no items"))
            .unwrap();
        assert_eq!(meta.resource_version.as_deref(), Some("5"));
    }

    #[test]
    fn events_carry_their_type_and_object() {
        let shape = Shape::new(ObjectFilter::default());
        let (kind, p) = shape
            .parse_event(r#"{"object":{"kind":"Status","code":410},"type":"ERROR"}"#)
            .unwrap();
        assert_eq!(kind, "ERROR");
        assert_eq!(
            p.doc.unwrap().root().get("code").unwrap().as_u64(),
            Some(410)
        );
        assert!(shape
            .parse_event(r#"{"type":"ADDED","object":{"a":}"#)
            .is_err());
        assert!(shape.parse_event(r#"{"type":"ADDED"} trailing"#).is_err());
    }
}
