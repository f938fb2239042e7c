//! Limits on config input, checked before a document is deserialized, so that hostile input
//! (a file of gigabytes, a document nested 100,000 levels deep, a YAML "billion laughs" alias
//! bomb) is refused within milliseconds and in bounded memory instead of stalling or exhausting
//! the process.
//!
//! Why a separate pass: serde_yaml loads a whole document before its recursion limit applies,
//! and libyaml's scanner spends time proportional to the flow nesting depth on every token, so
//! 100,000 nested `[` took over a minute to be refused. This pass reads libyaml's events one at a
//! time and stops at the first event past a limit, while the parse is still cheap. Syntax errors
//! are left to serde_yaml, which reports them with their position.
//!
//! The limits (also in docs/operations.md, "Config limits"):
//! * [`MAX_INPUT_BYTES`] per config file;
//! * [`MAX_DEPTH`] levels of nested mappings and lists (YAML files and the live object alike);
//! * [`MAX_NODES`] nodes and [`MAX_EXPANDED_BYTES`] bytes of scalar text per file, counted after
//!   alias expansion (each `*alias` counts as a full copy of what it refers to);
//! * no `.inf` or `.nan`: JSON has no such numbers, and serde_json would quietly make them
//!   `null` (so a field set to `.inf` would fall back to its default).

use std::collections::HashMap;
use std::ffi::CStr;
use std::marker::PhantomData;
use std::mem::MaybeUninit;

use serde_json::Value;
use unsafe_libyaml as unsafe_sys;

/// Largest config file read (4 MiB). A HAProxyTemplateConfig object must fit in one Kubernetes
/// object, which the API server caps at about 1.5 MiB, so no deployable config comes close.
pub(crate) const MAX_INPUT_BYTES: usize = 4 << 20;
/// Deepest nesting of mappings and lists (the top-level mapping is level 1).
pub(crate) const MAX_DEPTH: usize = 64;
/// Most nodes (scalars, mappings, lists) in one file after alias expansion.
pub(crate) const MAX_NODES: u64 = 1_000_000;
/// Most bytes of scalar text in one file after alias expansion (16 MiB).
pub(crate) const MAX_EXPANDED_BYTES: u64 = 16 << 20;

/// Owns a libyaml parser reading `'a` input; the parser stays at one heap address (libyaml
/// keeps a pointer to it for string input) and is freed on drop.
struct Parser<'a> {
    raw: Box<MaybeUninit<unsafe_sys::yaml_parser_t>>,
    input: PhantomData<&'a [u8]>,
}

impl<'a> Parser<'a> {
    fn new(input: &'a [u8]) -> Option<Parser<'a>> {
        let mut raw = Box::new(MaybeUninit::<unsafe_sys::yaml_parser_t>::uninit());
        // SAFETY: the parser is initialized in place at a stable heap address before any other
        // use, and wrapped (so deleted on drop) only once that succeeded; the lifetime keeps
        // `input` alive as long as the parser.
        unsafe {
            let p = raw.as_mut_ptr();
            if unsafe_sys::yaml_parser_initialize(p).fail {
                return None;
            }
            unsafe_sys::yaml_parser_set_encoding(p, unsafe_sys::YAML_UTF8_ENCODING);
            unsafe_sys::yaml_parser_set_input_string(p, input.as_ptr(), input.len() as u64);
        }
        Some(Parser {
            raw,
            input: PhantomData,
        })
    }
}

impl Drop for Parser<'_> {
    fn drop(&mut self) {
        // SAFETY: a Parser exists only after successful initialization.
        unsafe { unsafe_sys::yaml_parser_delete(self.raw.as_mut_ptr()) }
    }
}

/// What one event tells the limit check.
enum Event {
    StreamEnd,
    DocumentStart,
    CollectionStart {
        anchor: Option<Vec<u8>>,
    },
    CollectionEnd,
    Scalar {
        anchor: Option<Vec<u8>>,
        len: u64,
        /// A plain `.inf` or `.nan`: serde_json has no such numbers and would turn it into
        /// `null`, silently replacing the value with a default.
        non_finite: Option<String>,
    },
    Alias {
        anchor: Vec<u8>,
    },
    Other,
}

/// Copies a NUL-terminated libyaml string.
///
/// SAFETY: `ptr` is null or points to a NUL-terminated string owned by a live event.
unsafe fn anchor(ptr: *const u8) -> Option<Vec<u8>> {
    (!ptr.is_null()).then(|| CStr::from_ptr(ptr.cast()).to_bytes().to_vec())
}

/// The YAML spellings of infinity and not-a-number (as serde_yaml reads them).
fn is_non_finite(value: &[u8]) -> bool {
    let unsigned = value
        .strip_prefix(b"+")
        .or_else(|| value.strip_prefix(b"-"))
        .unwrap_or(value);
    matches!(
        unsigned,
        b".inf" | b".Inf" | b".INF" | b".nan" | b".NaN" | b".NAN"
    )
}

/// The next event with its 1-based line and column, or `None` on a syntax error (after which
/// the parser is not used again).
fn next_event(parser: &mut Parser) -> Option<(Event, u64, u64)> {
    let mut raw = MaybeUninit::<unsafe_sys::yaml_event_t>::uninit();
    // SAFETY: the parser is initialized; a successfully parsed event is read according to its
    // type and then deleted exactly once.
    unsafe {
        let p = parser.raw.as_mut_ptr();
        if unsafe_sys::yaml_parser_parse(p, raw.as_mut_ptr()).fail {
            return None;
        }
        let e = raw.as_mut_ptr();
        let event = match (*e).type_ {
            unsafe_sys::YAML_STREAM_END_EVENT => Event::StreamEnd,
            unsafe_sys::YAML_DOCUMENT_START_EVENT => Event::DocumentStart,
            unsafe_sys::YAML_SEQUENCE_START_EVENT => Event::CollectionStart {
                anchor: anchor((*e).data.sequence_start.anchor),
            },
            unsafe_sys::YAML_MAPPING_START_EVENT => Event::CollectionStart {
                anchor: anchor((*e).data.mapping_start.anchor),
            },
            unsafe_sys::YAML_SEQUENCE_END_EVENT | unsafe_sys::YAML_MAPPING_END_EVENT => {
                Event::CollectionEnd
            }
            unsafe_sys::YAML_SCALAR_EVENT => {
                let scalar = (*e).data.scalar;
                let value: &[u8] = if scalar.value.is_null() {
                    &[]
                } else {
                    std::slice::from_raw_parts(scalar.value, scalar.length as usize)
                };
                let plain = scalar.style == unsafe_sys::YAML_PLAIN_SCALAR_STYLE;
                Event::Scalar {
                    anchor: anchor(scalar.anchor),
                    len: scalar.length,
                    non_finite: (plain && is_non_finite(value))
                        .then(|| String::from_utf8_lossy(value).into_owned()),
                }
            }
            unsafe_sys::YAML_ALIAS_EVENT => match anchor((*e).data.alias.anchor) {
                Some(anchor) => Event::Alias { anchor },
                None => Event::Other,
            },
            _ => Event::Other,
        };
        let (line, column) = ((*e).start_mark.line + 1, (*e).start_mark.column + 1);
        unsafe_sys::yaml_event_delete(e);
        Some((event, line, column))
    }
}

/// Refuses YAML (or JSON) text that is too large, too deeply nested or expands too much
/// through aliases. Text that is not valid YAML passes: the deserializer reports its error.
pub(crate) fn check_yaml(text: &str) -> Result<(), String> {
    if text.len() > MAX_INPUT_BYTES {
        return Err(too_large(text.len()));
    }
    let Some(mut parser) = Parser::new(text.as_bytes()) else {
        return Ok(());
    };
    struct Open {
        anchor: Option<Vec<u8>>,
        nodes: u64,
        bytes: u64,
    }
    let mut open: Vec<Open> = Vec::new();
    // Anchor -> (nodes, bytes) of the node it names, aliases inside it expanded.
    let mut anchors: HashMap<Vec<u8>, (u64, u64)> = HashMap::new();
    let (mut nodes, mut bytes) = (0u64, 0u64);
    let mut aliases = false;
    while let Some((event, line, column)) = next_event(&mut parser) {
        match event {
            Event::StreamEnd => break,
            Event::DocumentStart => anchors.clear(),
            Event::CollectionStart { anchor } => {
                nodes += 1;
                open.push(Open {
                    anchor,
                    nodes: nodes - 1,
                    bytes,
                });
                if open.len() > MAX_DEPTH {
                    return Err(format!(
                        "nested deeper than {MAX_DEPTH} levels at line {line} column {column} \
                         (configs are limited to {MAX_DEPTH} levels of mappings and lists)"
                    ));
                }
            }
            Event::CollectionEnd => {
                if let Some(o) = open.pop() {
                    if let Some(anchor) = o.anchor {
                        anchors.insert(anchor, (nodes - o.nodes, bytes - o.bytes));
                    }
                }
            }
            Event::Scalar {
                anchor,
                len,
                non_finite,
            } => {
                if let Some(value) = non_finite {
                    return Err(format!(
                        "{value} at line {line} column {column} is not a finite number, which \
                         configs cannot hold (quote it if you mean a string)"
                    ));
                }
                nodes += 1;
                bytes = bytes.saturating_add(len);
                if let Some(anchor) = anchor {
                    anchors.insert(anchor, (1, len));
                }
            }
            Event::Alias { anchor } => {
                // An unknown anchor is the deserializer's error to report.
                let (n, b) = anchors.get(&anchor).copied().unwrap_or((1, 0));
                aliases = true;
                nodes = nodes.saturating_add(n);
                bytes = bytes.saturating_add(b);
            }
            Event::Other => {}
        }
        if nodes > MAX_NODES || bytes > MAX_EXPANDED_BYTES {
            let what = if nodes > MAX_NODES {
                format!("{MAX_NODES} nodes (mappings, lists and scalars)")
            } else {
                format!("{} MiB of text", MAX_EXPANDED_BYTES >> 20)
            };
            return Err(if aliases {
                format!(
                    "expands to more than {what} through aliases at line {line} column \
                     {column} (each *alias counts as a copy of what it names: an alias bomb?)"
                )
            } else {
                format!("has more than {what} at line {line} column {column}")
            });
        }
    }
    Ok(())
}

/// The message for input over [`MAX_INPUT_BYTES`].
pub(crate) fn too_large(len: usize) -> String {
    format!(
        "{len} bytes is more than the {} MiB a config file may have",
        MAX_INPUT_BYTES >> 20
    )
}

/// Refuses a value (for example a config object read from the API server) nested deeper than
/// [`MAX_DEPTH`]; `path` names the value, and the message names the first place too deep.
pub(crate) fn check_depth(value: &Value, path: &str) -> Result<(), String> {
    /// `Err` holds the path segments from the node that is too deep up to `value`.
    fn walk(value: &Value, level: usize) -> Result<(), Vec<String>> {
        match value {
            Value::Object(_) | Value::Array(_) if level > MAX_DEPTH => Err(Vec::new()),
            Value::Object(map) => map.iter().try_for_each(|(k, v)| {
                walk(v, level + 1).map_err(|mut at| {
                    at.push(format!(".{k}"));
                    at
                })
            }),
            Value::Array(items) => items.iter().enumerate().try_for_each(|(i, v)| {
                walk(v, level + 1).map_err(|mut at| {
                    at.push(format!("[{i}]"));
                    at
                })
            }),
            _ => Ok(()),
        }
    }
    walk(value, 1).map_err(|at| {
        let at: String = at.into_iter().rev().collect();
        format!(
            "{path}{at}: nested deeper than {MAX_DEPTH} levels (configs are limited to \
             {MAX_DEPTH} levels of mappings and lists)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested_flow(depth: usize) -> String {
        format!("a: {}{}\n", "[".repeat(depth), "]".repeat(depth))
    }

    #[test]
    fn ordinary_configs_pass() {
        for text in [
            "",
            "a: 1\n",
            "---\na: [1, {b: c}]\n---\nx: y\n",
            "{\"json\": [1, 2, {\"a\": null}]}",
            "a: &x {b: 1}\nc: *x\n",
            "a: [unclosed\n", // a syntax error: serde_yaml reports it
            "a: *unknown\n",
        ] {
            assert_eq!(check_yaml(text), Ok(()), "{text:?}");
        }
        let libraries = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/chart/libraries"));
        for entry in libraries.into_iter().flatten().flatten() {
            let text = std::fs::read_to_string(entry.path()).unwrap();
            assert_eq!(check_yaml(&text), Ok(()), "{}", entry.path().display());
        }
    }

    #[test]
    fn depth_limit_is_exact() {
        // The top-level mapping is level 1, so `a:` plus 63 lists is 64 levels.
        assert_eq!(check_yaml(&nested_flow(MAX_DEPTH - 1)), Ok(()));
        let e = check_yaml(&nested_flow(MAX_DEPTH)).unwrap_err();
        assert!(e.contains("nested deeper than 64 levels at line 1"), "{e}");
        let block: String = (0..MAX_DEPTH)
            .map(|i| format!("{}k{i}:\n", "  ".repeat(i)))
            .collect();
        assert_eq!(check_yaml(&block), Ok(()));
        let block = format!("{block}{}k: v\n", "  ".repeat(MAX_DEPTH));
        assert!(check_yaml(&block).unwrap_err().contains("nested deeper"));
    }

    #[test]
    fn hostile_nesting_is_refused() {
        for text in [
            nested_flow(100_000),
            format!("a: {}1{}\n", "{b: ".repeat(100_000), "}".repeat(100_000)),
            format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)),
            format!("{}\n", "- ".repeat(100_000)),
            "[".repeat(1_000_000),
        ] {
            let e = check_yaml(&text).unwrap_err();
            assert!(e.contains("nested deeper than 64 levels"), "{e}");
        }
    }

    #[test]
    fn alias_bombs_are_refused() {
        // Nine levels of nine copies: 9^9 (387 million) strings from a few hundred bytes.
        let mut text = String::from(
            "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
        );
        let mut prev = 'a';
        for c in "bcdefghi".chars() {
            let refs = vec![format!("*{prev}"); 9].join(",");
            text.push_str(&format!("{c}: &{c} [{refs}]\n"));
            prev = c;
        }
        let e = check_yaml(&text).unwrap_err();
        assert!(
            e.starts_with(
                "expands to more than 1000000 nodes (mappings, lists and scalars) through aliases"
            ),
            "{e}"
        );
        assert!(e.contains("alias bomb"), "{e}");
        // A big string repeated through aliases: few nodes, much text.
        let text = format!(
            "a: &a \"{}\"\nb: [{}]\n",
            "x".repeat(1 << 20),
            vec!["*a"; 20].join(",")
        );
        let e = check_yaml(&text).unwrap_err();
        assert!(
            e.starts_with("expands to more than 16 MiB of text through aliases"),
            "{e}"
        );
        // Anchors do not leak into the next document.
        assert_eq!(check_yaml("a: &a [1]\n---\nb: *a\n"), Ok(()));
    }

    #[test]
    fn infinity_and_nan_are_refused() {
        for text in [
            "a: .inf\n",
            "a: [-.Inf]\n",
            "a: {b: .NaN}\n",
            "a: +.INF\n",
            "a: !!float .nan\n",
        ] {
            let e = check_yaml(text).unwrap_err();
            assert!(e.contains("is not a finite number"), "{text:?}: {e}");
        }
        for text in [
            "a: \".inf\"\n",
            "a: '.nan'\n",
            "a: 1e400\n",
            "a: .infinity\n",
            "a: |\n  .inf\n",
        ] {
            assert_eq!(check_yaml(text), Ok(()), "{text:?}");
        }
    }

    #[test]
    fn huge_input_is_refused() {
        let text = format!("a: \"{}\"\n", "x".repeat(MAX_INPUT_BYTES));
        assert!(check_yaml(&text).unwrap_err().contains("4 MiB"));
        let text = format!("a: [{}]\n", "0,".repeat(MAX_NODES as usize / 2 + 1));
        assert!(text.len() < MAX_INPUT_BYTES);
        assert!(check_yaml(&text).is_ok());
        let text = format!("a: [{}]\n", "0,".repeat(MAX_NODES as usize + 1));
        let e = check_yaml(&text).unwrap_err();
        assert!(e.starts_with("has more than 1000000 nodes"), "{e}");
    }

    #[test]
    fn depth_of_values() {
        let mut v = serde_json::json!(1);
        for i in 0..MAX_DEPTH {
            v = if i % 2 == 0 {
                serde_json::json!([v])
            } else {
                serde_json::json!({ "k": v })
            };
        }
        assert_eq!(check_depth(&v, "spec"), Ok(()));
        let deeper = serde_json::json!({ "x": [1, v] });
        let e = check_depth(&deeper, "spec").unwrap_err();
        assert!(e.starts_with("spec.x[1]"), "{e}");
        assert!(e.contains("nested deeper than 64 levels"), "{e}");
    }
}
