//! The filters and functions templates get beyond minijinja's builtins: `dig`, `fallback`,
//! `b64decode`, `b64encode`, `regex_search`, `regex_replace`, `regex_escape`, `sort_by`,
//! `glob_match`, `basename`, `sha256`, `fail`, `debug`, `first_seen`, `has_prefixed_key`,
//! `annotated`.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use minijinja::value::{Kwargs, Rest, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State};

use super::context::{Collector, Shared};
use super::glob::glob_match;
use super::objects::JsonNode;

/// Marks an error raised by `fail()`, whose message must reach users verbatim.
#[derive(Debug)]
pub(crate) struct FailMarker;

impl std::fmt::Display for FailMarker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("raised by fail()")
    }
}

impl std::error::Error for FailMarker {}

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidOperation, msg.into())
}

/// Compiled regexes, shared by every render: templates call the same few patterns in loops.
/// Shared as `Arc`: a cloned `Regex` starts with an empty pool of match caches, so cloning one
/// per call would allocate fresh caches on every match (it did: a tenth of a full render).
fn regex(pattern: &str) -> Result<Arc<regex::Regex>, Error> {
    static CACHE: Mutex<Option<HashMap<String, Arc<regex::Regex>>>> = Mutex::new(None);
    let mut guard = crate::lock(&CACHE);
    let cache = guard.get_or_insert_with(HashMap::new);
    if let Some(re) = cache.get(pattern) {
        return Ok(re.clone());
    }
    let re = Arc::new(
        regex::Regex::new(pattern)
            .map_err(|e| invalid(format!("invalid regular expression {pattern:?}: {e}")))?,
    );
    if cache.len() > 512 {
        cache.clear();
    }
    cache.insert(pattern.to_string(), re.clone());
    Ok(re)
}

fn is_missing(v: &Value) -> bool {
    v.is_undefined() || v.is_none()
}

/// `dig(obj, "k1", "k2", …)`: nested lookup; none when any step is missing.
fn dig(value: Value, path: Rest<Value>) -> Value {
    let mut current = value;
    for key in path.iter() {
        if is_missing(&current) {
            return Value::from(());
        }
        current = match current.get_item(key) {
            Ok(v) if !v.is_undefined() => v,
            _ => return Value::from(()),
        };
    }
    if current.is_undefined() {
        Value::from(())
    } else {
        current
    }
}

/// `fallback(v, default)`: `default` when `v` is undefined or none (not when empty or false).
fn fallback(value: Value, default: Value) -> Value {
    if is_missing(&value) {
        default
    } else {
        value
    }
}

fn b64decode(text: &str) -> Result<String, Error> {
    let bytes = haptic_agent::base64::decode(text.trim())
        .map_err(|e| invalid(format!("b64decode: {e}")))?;
    String::from_utf8(bytes).map_err(|_| invalid("b64decode: the decoded data is not UTF-8 text"))
}

fn b64encode(text: &str) -> String {
    haptic_agent::base64::encode(text.as_bytes())
}

fn regex_search(text: &str, pattern: &str) -> Result<bool, Error> {
    Ok(regex(pattern)?.is_match(text))
}

fn regex_replace(text: &str, pattern: &str, replacement: &str) -> Result<String, Error> {
    Ok(regex(pattern)?.replace_all(text, replacement).into_owned())
}

fn regex_escape(text: &str) -> String {
    regex::escape(text)
}

fn basename(path: &str) -> String {
    path.trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_string()
}

fn sha256(text: &str) -> String {
    haptic_agent::protocol::sha256_hex(text.as_bytes())
}

/// `glob_match(items, pattern)`: the strings (or the `name` of mappings) matching a glob.
fn glob_match_filter(items: Value, pattern: &str) -> Result<Value, Error> {
    let mut out = Vec::new();
    for item in items.try_iter()? {
        let name = if let Some(s) = item.as_str() {
            s.to_string()
        } else {
            match item.get_attr("name") {
                Ok(n) if n.as_str().is_some() => n.as_str().unwrap_or_default().to_string(),
                _ => continue,
            }
        };
        if glob_match(pattern, &name) {
            out.push(Value::from(name));
        }
    }
    Ok(Value::from(out))
}

/// `has_prefixed_key(map, prefix)`: whether any key of a mapping starts with `prefix` — lets
/// libraries skip the per-object work of an annotation family an object does not use.
fn has_prefixed_key(map: Value, prefix: &str) -> bool {
    if map.kind() != ValueKind::Map {
        return false;
    }
    if let Some(node) = map.downcast_object_ref::<JsonNode>() {
        return node.has_key_prefixed(prefix);
    }
    map.try_iter()
        .map(|mut keys| keys.any(|k| k.as_str().is_some_and(|k| k.starts_with(prefix))))
        .unwrap_or(false)
}

/// `objects | annotated(name)`, `objects | annotated(prefix=p)`: the objects, in order, that
/// carry the annotation `name` with a value (as `obj.metadata.annotations[name]` is true), or
/// an annotation whose key starts with `p`; with `or_field="spec.tls"`, also those whose field
/// at that dotted path is true (a non-empty list, say). Annotation libraries look for the few
/// annotated Ingresses among all of them, for each feature; done natively, a pass runs no
/// template code per object (nine such passes took 30–40 ms of a full render at 10,000).
fn annotated(objects: Value, name: Option<&str>, kwargs: Kwargs) -> Result<Value, Error> {
    let prefix: Option<&str> = kwargs.get("prefix")?;
    let or_field: Option<&str> = kwargs.get("or_field")?;
    kwargs.assert_all_used()?;
    if name.is_some() == prefix.is_some() {
        return Err(invalid(
            "annotated: give either an annotation name or prefix=, not both",
        ));
    }
    let or_field: Vec<&str> = or_field.map(|f| f.split('.').collect()).unwrap_or_default();
    if is_missing(&objects) {
        return Ok(Value::from(Vec::<Value>::new()));
    }
    // A stored object answers natively; a template-built map through `dig`.
    let lookup = |object: &Value, path: &[&str]| match object.downcast_object_ref::<JsonNode>() {
        Some(node) => node.field(path).unwrap_or_default(),
        None => dig(
            object.clone(),
            Rest(path.iter().map(|k| Value::from(*k)).collect()),
        ),
    };
    let keep = |object: &Value| {
        let annotated = match (name, prefix) {
            (Some(name), _) => lookup(object, &["metadata", "annotations", name]).is_true(),
            (_, Some(prefix)) => {
                has_prefixed_key(lookup(object, &["metadata", "annotations"]), prefix)
            }
            _ => false,
        };
        annotated || (!or_field.is_empty() && lookup(object, &or_field).is_true())
    };
    if or_field.is_empty() {
        if let Some(collector) = objects.downcast_object_ref::<Collector>() {
            let pick = |keys: &[(Box<str>, bool)]| match (name, prefix) {
                (Some(name), _) => keys.iter().any(|(k, on)| *on && **k == *name),
                (_, Some(prefix)) => keys.iter().any(|(k, _)| k.starts_with(prefix)),
                _ => false,
            };
            if let Some(kept) = collector.annotated(pick) {
                return Ok(Value::from(kept));
            }
        }
    }
    if let Some(kept) = stored_in_place(&objects, &keep) {
        return Ok(Value::from(kept));
    }
    let mut kept = Vec::new();
    for object in objects.try_iter()? {
        if keep(&object) {
            kept.push(object);
        }
    }
    Ok(Value::from(kept))
}

/// The items of `list` (a list or a collector) that `keep` picks, in order, tested where they
/// are: taking them one at a time copies the list and touches every object's count twice,
/// which costs more than the test itself in a large render. Only when every item is a stored
/// object (`None` otherwise): testing those cannot reach a collector, and a collector's items
/// stay locked meanwhile.
fn stored_in_place(list: &Value, keep: &dyn Fn(&Value) -> bool) -> Option<Vec<Value>> {
    let pick = |items: &[Value]| {
        items
            .iter()
            .all(|i| i.downcast_object_ref::<JsonNode>().is_some())
            .then(|| items.iter().filter(|i| keep(i)).cloned().collect())
    };
    if let Some(collector) = list.downcast_object_ref::<Collector>() {
        return collector.with_items(pick);
    }
    pick(list.downcast_object_ref::<Vec<Value>>()?)
}

/// `base | overlay(top)`: one map of both, `top`'s entries replacing `base`'s (a Service's
/// annotations over its Ingress's). Anything that is not a map counts as empty.
fn overlay(base: Value, top: Value) -> Value {
    let mut out = std::collections::BTreeMap::new();
    for map in [base, top] {
        if map.kind() != ValueKind::Map {
            continue;
        }
        for key in map.try_iter().into_iter().flatten() {
            if let Ok(value) = map.get_item(&key) {
                out.insert(key, value);
            }
        }
    }
    Value::from(out)
}

fn fail(message: &str) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message.to_string()).with_source(FailMarker))
}

/// `debug(value, label?)`: the value as JSON, every line a HAProxy comment (JSON escapes line
/// breaks inside strings, so nothing can leave the comment: the result is a safe string).
fn debug(value: Value, label: Option<&str>) -> Value {
    let json =
        serde_json::to_string_pretty(&value).unwrap_or_else(|e| format!("<unserialisable: {e}>"));
    let mut out = format!("# DEBUG {}:\n", label.unwrap_or("value"));
    for line in json.lines() {
        out.push_str("# ");
        out.push_str(line);
        out.push('\n');
    }
    Value::from_safe_string(out)
}

fn first_seen(state: &State, parts: Rest<Value>) -> Result<bool, Error> {
    let shared = state
        .lookup("shared")
        .ok_or_else(|| invalid("first_seen needs the render's `shared` object"))?;
    let shared = shared
        .downcast_object_ref::<Shared>()
        .ok_or_else(|| invalid("`shared` has been shadowed; first_seen cannot work"))?;
    let mut key = String::with_capacity(
        parts
            .iter()
            .map(|p| p.as_str().map_or(16, str::len) + 1)
            .sum(),
    );
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            key.push('\u{1f}');
        }
        let _ = write!(key, "{part}");
    }
    Ok(shared.first_seen(key))
}

/// One `sort_by` criterion: `$.a.b`, optionally `| length`, optionally `:desc` or `:exists`.
struct SortKey {
    path: Vec<String>,
    length: bool,
    exists: bool,
    descending: bool,
}

impl SortKey {
    fn parse(spec: &str) -> SortKey {
        let mut text = spec.trim();
        let mut descending = false;
        let mut exists = false;
        if let Some(t) = text.strip_suffix(":desc") {
            descending = true;
            text = t;
        }
        if let Some(t) = text.strip_suffix(":exists") {
            exists = true;
            text = t;
        }
        let (text, length) = match text.split_once('|') {
            Some((t, f)) if f.trim() == "length" => (t.trim(), true),
            _ => (text, false),
        };
        let text = text
            .strip_prefix("$.")
            .or_else(|| text.strip_prefix('$'))
            .unwrap_or(text);
        let path = text
            .split('.')
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        SortKey {
            path,
            length,
            exists,
            descending,
        }
    }

    fn extract(&self, item: &Value) -> Value {
        let mut v = item.clone();
        for key in &self.path {
            v = match v.get_attr(key) {
                Ok(x) => x,
                Err(_) => Value::UNDEFINED,
            };
        }
        if self.exists {
            return Value::from(!is_missing(&v));
        }
        if self.length {
            return v
                .len()
                .map(|n| Value::from(n as i64))
                .unwrap_or(Value::from(()));
        }
        v
    }
}

/// One item's value under one `sort_by` criterion, taken once before sorting.
enum SortValue {
    Number(f64),
    /// A string (borrowed from its value when compared).
    Text(Value),
    /// Anything else, printed.
    Printed(String),
    Missing,
}

impl SortValue {
    fn of(v: Value) -> SortValue {
        if is_missing(&v) {
            SortValue::Missing
        } else if v.is_number() {
            SortValue::Number(f64::try_from(v).unwrap_or(f64::NAN))
        } else if v.as_str().is_some() {
            SortValue::Text(v)
        } else {
            SortValue::Printed(v.to_string())
        }
    }

    fn class(&self) -> u8 {
        match self {
            SortValue::Number(_) => 0,
            SortValue::Text(_) | SortValue::Printed(_) => 1,
            SortValue::Missing => 2,
        }
    }

    fn text(&self) -> &str {
        match self {
            SortValue::Text(v) => v.as_str().unwrap_or_default(),
            SortValue::Printed(s) => s,
            _ => "",
        }
    }
}

/// Numbers first, numerically; then everything else by its printed form (strings lexically,
/// `false` before `true`); missing values last. A total order whatever the items hold: sorting
/// with one that is not (a number compared with a string by their printed forms, but with
/// another number by value) may panic in the standard library's sort, and a tenant's value
/// must not stop the render.
fn compare(a: &SortValue, b: &SortValue) -> Ordering {
    match (a, b) {
        (SortValue::Number(x), SortValue::Number(y)) => x.total_cmp(y),
        _ => match a.class().cmp(&b.class()) {
            Ordering::Equal => a.text().cmp(b.text()),
            other => other,
        },
    }
}

/// `sort_by(items, ["$.a.b:desc", "$.x:exists", "$.path | length:desc"])`: stable multi-key sort.
fn sort_by(items: Value, keys: Value) -> Result<Value, Error> {
    let specs: Vec<SortKey> = if let Some(one) = keys.as_str() {
        vec![SortKey::parse(one)]
    } else {
        keys.try_iter()?
            .map(|k| SortKey::parse(&k.to_string()))
            .collect()
    };
    // Each item's values are taken once, before sorting: a comparison reads them alone.
    let mut rows: Vec<(Vec<SortValue>, Value)> = items
        .try_iter()?
        .map(|item| {
            let values = specs.iter().map(|s| SortValue::of(s.extract(&item)));
            (values.collect(), item)
        })
        .collect();
    rows.sort_by(|(a, _), (b, _)| {
        for (spec, (x, y)) in specs.iter().zip(a.iter().zip(b)) {
            let ord = compare(x, y);
            let ord = if spec.descending { ord.reverse() } else { ord };
            if ord != Ordering::Equal {
                return ord;
            }
        }
        Ordering::Equal
    });
    Ok(Value::from(
        rows.into_iter().map(|(_, item)| item).collect::<Vec<_>>(),
    ))
}

pub(crate) fn register(env: &mut Environment<'static>, snippet_names: Arc<[String]>) {
    env.add_filter("dig", dig);
    env.add_function("dig", dig);
    env.add_filter("fallback", fallback);
    env.add_function("fallback", fallback);
    env.add_filter("b64decode", b64decode);
    env.add_filter("b64encode", b64encode);
    env.add_filter("regex_search", regex_search);
    env.add_function("regex_search", regex_search);
    env.add_filter("regex_replace", regex_replace);
    env.add_filter("regex_escape", regex_escape);
    env.add_filter("sort_by", sort_by);
    env.add_filter("glob_match", glob_match_filter);
    env.add_filter("basename", basename);
    env.add_filter("sha256", sha256);
    env.add_function("fail", fail);
    env.add_filter("debug", debug);
    env.add_function("debug", debug);
    env.add_function("first_seen", first_seen);
    env.add_function("unit", super::units::unit);
    env.add_filter("has_prefixed_key", has_prefixed_key);
    env.add_filter("annotated", annotated);
    env.add_filter("overlay", overlay);
    env.add_test("having_prefixed_key", has_prefixed_key);
    env.add_function("server_lines", super::slots::server_lines);
    env.add_function("collector", || {
        Value::from_object(super::context::Collector::default())
    });
    // The names are fixed for the engine's life and units ask for the same few patterns
    // thousands of times per render: each pattern is matched once.
    let matched = std::sync::Mutex::new(std::collections::HashMap::<String, Value>::new());
    env.add_function("snippets", move |pattern: &str| -> Value {
        let mut matched = crate::lock(&matched);
        if let Some(names) = matched.get(pattern) {
            return names.clone();
        }
        // Names are kept sorted, so matches come out in the order hooks rely on.
        let names = Value::from(
            snippet_names
                .iter()
                .filter(|n| glob_match(pattern, n))
                .map(|n| Value::from(n.as_str()))
                .collect::<Vec<_>>(),
        );
        // Bounded: a template could build patterns from data.
        if matched.len() < 256 {
            matched.insert(pattern.to_string(), names.clone());
        }
        names
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `k` of each item after `sort_by(spec)`, printed; `-` where the item has none.
    fn sorted(keys: Vec<Value>, spec: &str) -> Vec<String> {
        let items: Vec<Value> = keys
            .into_iter()
            .map(|k| {
                let mut map = std::collections::BTreeMap::new();
                if !k.is_undefined() {
                    map.insert("k".to_string(), k);
                }
                Value::from(map)
            })
            .collect();
        sort_by(Value::from(items), Value::from(spec))
            .unwrap()
            .try_iter()
            .unwrap()
            .map(|i| match i.get_attr("k").unwrap_or_default() {
                k if k.is_undefined() => "-".into(),
                k => k.to_string(),
            })
            .collect()
    }

    /// The documented order on a mix of every kind: numbers by value (NaN after them), then
    /// the rest by printed form, then missing values.
    #[test]
    fn sort_by_orders_numbers_then_printed_forms_then_missing() {
        let mix = vec![
            Value::from("b"),
            Value::UNDEFINED,
            Value::from(10),
            Value::from("10"),
            Value::from(true),
            Value::from(9.5),
            Value::from(f64::NAN),
            Value::from(()),
            Value::from(false),
            Value::from(-1),
            Value::from(""),
        ];
        let printed = sorted(mix.clone(), "$.k");
        // Booleans print as `True` and `False`; `none` counts as missing, as an absent key
        // does (ties keep their order).
        assert_eq!(
            printed,
            ["-1", "9.5", "10", "NaN", "", "10", "False", "True", "b", "-", "None"]
        );
        let printed = sorted(mix, "$.k:desc");
        assert_eq!(
            printed,
            ["-", "None", "b", "True", "False", "10", "", "NaN", "10", "9.5", "-1"]
        );
    }

    /// Random lists of values that broke the order before (a number equal to a string by its
    /// printed form, but less than another number that prints after it): no panic, every
    /// neighbour in order, ties in their first order.
    #[test]
    fn sort_by_is_a_total_order_on_any_values() {
        let pool: Vec<Value> = vec![
            Value::from("host-0001.example.com/a"),
            Value::from("host-0001"),
            Value::from("host-0001\0"),
            Value::from(""),
            Value::from("\u{e9}t\u{e9}"),
            Value::from(10),
            Value::from(9.5),
            Value::from(-1),
            Value::from(u64::MAX),
            Value::from(f64::NAN),
            Value::from(true),
            Value::from(false),
            Value::from(()),
            Value::UNDEFINED,
            Value::from("10"),
            Value::from("9.5"),
            Value::from("true"),
            Value::from(vec![Value::from(1)]),
        ];
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        for round in 0..300 {
            let mut next = || crate::xorshift(&mut seed);
            let n = (next() % 60) as usize;
            let picks: Vec<usize> = (0..n)
                .map(|_| (next() % pool.len() as u64) as usize)
                .collect();
            let items: Vec<Value> = picks
                .iter()
                .enumerate()
                .map(|(i, &p)| {
                    let mut map = std::collections::BTreeMap::new();
                    if !pool[p].is_undefined() {
                        map.insert("k".to_string(), pool[p].clone());
                    }
                    map.insert("i".to_string(), Value::from(i));
                    Value::from(map)
                })
                .collect();
            let out: Vec<Value> = sort_by(Value::from(items), Value::from("$.k"))
                .unwrap()
                .try_iter()
                .unwrap()
                .collect();
            assert_eq!(out.len(), n, "round {round}");
            for pair in out.windows(2) {
                let key = |v: &Value| SortValue::of(v.get_attr("k").unwrap_or_default());
                let at = |v: &Value| i64::try_from(v.get_attr("i").unwrap()).unwrap();
                match compare(&key(&pair[0]), &key(&pair[1])) {
                    Ordering::Less => {}
                    Ordering::Equal => assert!(at(&pair[0]) < at(&pair[1]), "round {round}: tie"),
                    Ordering::Greater => panic!("round {round}: out of order"),
                }
            }
        }
    }
}
