//! Kubernetes-flavoured field paths, as used by `indexBy`, `watchedResourcesIgnoreFields` and
//! `fieldSelector`: dot-separated keys, `\.` for a dot inside a key, `['quoted.key']` (or double
//! quotes), and `[n]` list indices. A leading `.` and kubectl-style `{…}` braces are accepted.
//!
//! `metadata.labels['kubernetes.io/service-name']` and
//! `metadata.labels.kubernetes\.io/service-name` name the same field.

use std::fmt;

use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Key(String),
    Index(usize),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathExpr {
    source: String,
    steps: Vec<Step>,
}

impl fmt::Display for PathExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

impl PathExpr {
    pub fn parse(source: &str) -> Result<PathExpr, String> {
        let err = |msg: &str| format!("invalid path {source:?}: {msg}");
        let mut text = source.trim();
        if let Some(inner) = text.strip_prefix('{').and_then(|t| t.strip_suffix('}')) {
            text = inner.trim();
        }
        let text = text.strip_prefix('.').unwrap_or(text);
        if text.is_empty() {
            return Err(err("empty"));
        }
        let chars: Vec<char> = text.chars().collect();
        let mut steps = Vec::new();
        let mut i = 0;
        let mut key = String::new();
        // `expect_key` is true right after a '.', where a key (not a bracket) must follow.
        let mut expect_key = true;
        while i < chars.len() {
            match chars[i] {
                '\\' => {
                    let next = chars.get(i + 1).ok_or_else(|| err("trailing backslash"))?;
                    key.push(*next);
                    i += 2;
                }
                '.' => {
                    if key.is_empty() && expect_key {
                        return Err(err("empty key between dots"));
                    }
                    if !key.is_empty() {
                        steps.push(Step::Key(std::mem::take(&mut key)));
                    }
                    expect_key = true;
                    i += 1;
                }
                '[' => {
                    if !key.is_empty() {
                        steps.push(Step::Key(std::mem::take(&mut key)));
                    } else if expect_key && !steps.is_empty() {
                        return Err(err("'[' directly after '.'"));
                    }
                    let close = chars[i..]
                        .iter()
                        .position(|c| *c == ']')
                        .ok_or_else(|| err("unclosed '['"))?
                        + i;
                    let inner: String = chars[i + 1..close].iter().collect();
                    let inner = inner.trim();
                    let quoted = (inner.starts_with('\'') && inner.ends_with('\''))
                        || (inner.starts_with('"') && inner.ends_with('"'));
                    if quoted && inner.len() >= 2 {
                        steps.push(Step::Key(inner[1..inner.len() - 1].to_string()));
                    } else if let Ok(n) = inner.parse::<usize>() {
                        steps.push(Step::Index(n));
                    } else {
                        return Err(err(&format!(
                            "bracket must hold a quoted key or an index, got [{inner}]"
                        )));
                    }
                    expect_key = false;
                    i = close + 1;
                    if let Some(c) = chars.get(i) {
                        if *c != '.' && *c != '[' {
                            return Err(err("expected '.' or '[' after ']'"));
                        }
                    }
                }
                ']' => return Err(err("unexpected ']'")),
                c => {
                    key.push(c);
                    expect_key = true;
                    i += 1;
                }
            }
        }
        if !key.is_empty() {
            steps.push(Step::Key(key));
        } else if chars.last() == Some(&'.') {
            return Err(err("trailing '.'"));
        }
        Ok(PathExpr {
            source: source.to_string(),
            steps,
        })
    }

    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    pub fn get<'v>(&self, value: &'v Value) -> Option<&'v Value> {
        self.steps.iter().try_fold(value, |v, step| match step {
            Step::Key(k) => v.as_object()?.get(k),
            Step::Index(n) => v.as_array()?.get(*n),
        })
    }

    pub fn get_node<'d>(&self, node: super::NodeRef<'d>) -> Option<super::NodeRef<'d>> {
        self.steps.iter().try_fold(node, |n, step| match step {
            Step::Key(k) => n.get(k),
            Step::Index(i) => n.at(*i),
        })
    }

    /// [`PathExpr::key_of`] for a stored object.
    pub fn key_of_node(&self, node: super::NodeRef<'_>) -> Option<String> {
        let found = self.get_node(node)?;
        match found.kind() {
            super::doc::Kind::String | super::doc::Kind::Number | super::doc::Kind::Bool => {
                scalar_key(&found.to_value())
            }
            _ => None,
        }
    }

    /// Removes the addressed field; a missing path is a no-op. Returns whether something went.
    pub fn remove(&self, value: &mut Value) -> bool {
        let Some((last, parents)) = self.steps.split_last() else {
            return false;
        };
        let mut current = value;
        for step in parents {
            let next = match step {
                Step::Key(k) => current.as_object_mut().and_then(|m| m.get_mut(k)),
                Step::Index(n) => current.as_array_mut().and_then(|a| a.get_mut(*n)),
            };
            match next {
                Some(v) => current = v,
                None => return false,
            }
        }
        match last {
            Step::Key(k) => current.as_object_mut().and_then(|m| m.remove(k)).is_some(),
            Step::Index(n) => match current.as_array_mut() {
                Some(a) if *n < a.len() => {
                    a.remove(*n);
                    true
                }
                _ => false,
            },
        }
    }

    /// The value as an index key: strings as-is, numbers in decimal, booleans as true/false.
    /// `None` when the field is missing, null, or not a scalar.
    pub fn key_of(&self, value: &Value) -> Option<String> {
        scalar_key(self.get(value)?)
    }
}

pub fn scalar_key(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(match n.as_f64() {
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 1e15 => format!("{}", f as i64),
            _ => n.to_string(),
        }),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn keys(path: &str) -> Vec<Step> {
        PathExpr::parse(path).unwrap().steps
    }

    #[test]
    fn parses_all_spellings() {
        let expected = vec![
            Step::Key("metadata".into()),
            Step::Key("labels".into()),
            Step::Key("kubernetes.io/service-name".into()),
        ];
        assert_eq!(
            keys("metadata.labels['kubernetes.io/service-name']"),
            expected
        );
        assert_eq!(
            keys("metadata.labels[\"kubernetes.io/service-name\"]"),
            expected
        );
        assert_eq!(
            keys(r"metadata.labels.kubernetes\.io/service-name"),
            expected
        );
        assert_eq!(
            keys(".metadata.labels['kubernetes.io/service-name']"),
            expected
        );
        assert_eq!(
            keys("{.metadata.labels['kubernetes.io/service-name']}"),
            expected
        );
        assert_eq!(
            keys("spec.rules[0].host"),
            vec![
                Step::Key("spec".into()),
                Step::Key("rules".into()),
                Step::Index(0),
                Step::Key("host".into())
            ]
        );
    }

    #[test]
    fn rejects_malformed_paths() {
        for bad in ["", "a..b", "a.", "a[", "a[x]", "a[0]b", "a]", "a\\"] {
            assert!(PathExpr::parse(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn gets_keys_and_removes() {
        let mut obj = json!({"metadata": {"name": "x", "labels": {"a.b/c": "v"}, "generation": 3,
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}", "keep": "1"}},
            "spec": {"ports": [{"port": 80.0}], "on": true}});
        assert_eq!(
            PathExpr::parse(r"metadata.labels.a\.b/c")
                .unwrap()
                .key_of(&obj)
                .as_deref(),
            Some("v")
        );
        assert_eq!(
            PathExpr::parse("metadata.generation")
                .unwrap()
                .key_of(&obj)
                .as_deref(),
            Some("3")
        );
        assert_eq!(
            PathExpr::parse("spec.ports[0].port")
                .unwrap()
                .key_of(&obj)
                .as_deref(),
            Some("80")
        );
        assert_eq!(
            PathExpr::parse("spec.on").unwrap().key_of(&obj).as_deref(),
            Some("true")
        );
        assert_eq!(PathExpr::parse("spec.ports").unwrap().key_of(&obj), None);
        assert_eq!(
            PathExpr::parse("spec.missing.deep").unwrap().key_of(&obj),
            None
        );

        let ignore = PathExpr::parse(
            "metadata.annotations['kubectl.kubernetes.io/last-applied-configuration']",
        )
        .unwrap();
        assert!(ignore.remove(&mut obj));
        assert!(!ignore.remove(&mut obj), "second removal is a no-op");
        assert_eq!(obj["metadata"]["annotations"], json!({"keep": "1"}));
        assert!(!PathExpr::parse("nothing.here").unwrap().remove(&mut obj));
    }
}
