//! Label selectors (`=`, `==`, `!=`, `in`, `notin`, `key`, `!key`) and the field selectors every
//! resource supports (`metadata.name`, `metadata.namespace` with `=`, `==`, `!=`).

use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
enum LabelOp {
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    NotExists,
}

/// A parsed label selector; every requirement must hold.
#[derive(Debug, Clone, Default)]
pub struct LabelSelector {
    reqs: Vec<(String, LabelOp)>,
}

/// A parsed field selector; every term must hold.
#[derive(Debug, Clone, Default)]
pub struct FieldSelector {
    terms: Vec<(String, bool, String)>,
}

/// Whether the character at byte `i` follows an odd number of backslashes.
fn escaped(s: &str, i: usize) -> bool {
    s[..i].bytes().rev().take_while(|&b| b == b'\\').count() % 2 == 1
}

/// Splits on `sep` where it is not escaped.
fn split_unescaped(s: &str, sep: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut start = 0;
    for (i, c) in s.char_indices() {
        if c == sep && !escaped(s, i) {
            parts.push(&s[start..i]);
            start = i + c.len_utf8();
        }
    }
    parts.push(&s[start..]);
    parts
}

/// A field selector value without its escapes; `None` for an escape of another character.
fn unescape(value: &str) -> Option<String> {
    let mut out = String::new();
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some(e @ ('\\' | ',' | '=')) => out.push(e),
                _ => return None,
            }
        } else {
            out.push(c);
        }
    }
    Some(out)
}

/// Splits on commas that are not inside parentheses.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
        .into_iter()
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect()
}

fn parse_set(rest: &str, whole: &str) -> Result<Vec<String>, String> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| {
            format!("unable to parse requirement: {whole:?}: expected a set in parentheses")
        })?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

fn check_key(key: &str, whole: &str) -> Result<String, String> {
    let ok = !key.is_empty()
        && key.len() <= 317
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    if ok {
        Ok(key.to_string())
    } else {
        Err(format!(
            "unable to parse requirement: invalid label key {key:?} in {whole:?}"
        ))
    }
}

impl LabelSelector {
    pub fn parse(text: &str) -> Result<LabelSelector, String> {
        let mut reqs = Vec::new();
        for part in split_top_level(text) {
            let req = if let Some(key) = part.strip_prefix('!') {
                (check_key(key.trim(), part)?, LabelOp::NotExists)
            } else if let Some((k, v)) = part.split_once("!=") {
                (
                    check_key(k.trim(), part)?,
                    LabelOp::NotIn(vec![v.trim().to_string()]),
                )
            } else if let Some((k, v)) = part.split_once("==") {
                (
                    check_key(k.trim(), part)?,
                    LabelOp::In(vec![v.trim().to_string()]),
                )
            } else if let Some((k, v)) = part.split_once('=') {
                (
                    check_key(k.trim(), part)?,
                    LabelOp::In(vec![v.trim().to_string()]),
                )
            } else if let Some((k, rest)) = part.split_once(" notin ") {
                (
                    check_key(k.trim(), part)?,
                    LabelOp::NotIn(parse_set(rest, part)?),
                )
            } else if let Some((k, rest)) = part.split_once(" in ") {
                (
                    check_key(k.trim(), part)?,
                    LabelOp::In(parse_set(rest, part)?),
                )
            } else {
                (check_key(part, part)?, LabelOp::Exists)
            };
            reqs.push(req);
        }
        Ok(LabelSelector { reqs })
    }

    /// The selector of a `matchLabels`/`matchExpressions` object (webhook objectSelector).
    pub fn from_label_selector_object(sel: &Value) -> Result<LabelSelector, String> {
        let mut reqs = Vec::new();
        if let Some(m) = sel["matchLabels"].as_object() {
            for (k, v) in m {
                reqs.push((
                    k.clone(),
                    LabelOp::In(vec![v.as_str().unwrap_or("").to_string()]),
                ));
            }
        }
        for e in sel["matchExpressions"].as_array().into_iter().flatten() {
            let key = e["key"].as_str().unwrap_or("").to_string();
            let values: Vec<String> = e["values"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            let op = match e["operator"].as_str() {
                Some("In") => LabelOp::In(values),
                Some("NotIn") => LabelOp::NotIn(values),
                Some("Exists") => LabelOp::Exists,
                Some("DoesNotExist") => LabelOp::NotExists,
                other => return Err(format!("unknown selector operator {other:?}")),
            };
            reqs.push((key, op));
        }
        Ok(LabelSelector { reqs })
    }

    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    /// Whether an object's `metadata.labels` satisfy the selector.
    pub fn matches(&self, obj: &Value) -> bool {
        self.matches_labels(&obj["metadata"]["labels"])
    }

    /// Whether a labels map satisfies the selector.
    pub fn matches_labels(&self, labels: &Value) -> bool {
        self.reqs.iter().all(|(key, op)| {
            let value = labels.get(key).and_then(Value::as_str);
            match op {
                LabelOp::In(set) => value.is_some_and(|v| set.iter().any(|s| s == v)),
                LabelOp::NotIn(set) => value.is_none_or(|v| !set.iter().any(|s| s == v)),
                LabelOp::Exists => value.is_some(),
                LabelOp::NotExists => value.is_none(),
            }
        })
    }
}

/// The fields objects of a type can be selected by besides `metadata.name` and
/// `metadata.namespace`, as the real API server's registries declare them (custom resources
/// have none here).
pub fn selectable_fields(group: &str, plural: &str) -> &'static [&'static str] {
    match (group, plural) {
        ("", "secrets") => &["type"],
        ("", "pods") => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        ("", "namespaces") => &["status.phase"],
        ("", "nodes") => &["spec.unschedulable"],
        ("", "events") => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "type",
        ],
        ("", "replicationcontrollers") | ("apps", "replicasets") => &["status.replicas"],
        ("batch", "jobs") => &["status.successful"],
        _ => &[],
    }
}

impl FieldSelector {
    /// A selector on `metadata.name` and `metadata.namespace` only (any type).
    pub fn parse(text: &str) -> Result<FieldSelector, String> {
        Self::parse_for(text, &[], true)
    }

    /// A selector on the metadata fields and on `fields`, the type's own; `own_labels`: the
    /// type declares field labels (or is a custom resource), which words the refusal.
    pub fn parse_for(
        text: &str,
        fields: &[&str],
        own_labels: bool,
    ) -> Result<FieldSelector, String> {
        let mut terms = Vec::new();
        for part in split_unescaped(text, ',')
            .into_iter()
            .filter(|p| !p.is_empty())
        {
            // The first operator not escaped in the term; the value is unescaped (`\,`, `\=`,
            // `\\`), as in Kubernetes' fields.ParseSelector.
            let at = |op: &str| {
                part.match_indices(op)
                    .map(|(i, _)| i)
                    .find(|&i| !escaped(part, i))
            };
            let (field, equal, value) = match (at("!="), at("==").or_else(|| at("="))) {
                (Some(i), None) => (&part[..i], false, &part[i + 2..]),
                (Some(i), Some(j)) if i < j => (&part[..i], false, &part[i + 2..]),
                (_, Some(j)) if part[j..].starts_with("==") => (&part[..j], true, &part[j + 2..]),
                (_, Some(j)) => (&part[..j], true, &part[j + 1..]),
                (None, None) => {
                    return Err(format!(
                        "invalid selector: '{text}'; can't understand '{part}'"
                    ))
                }
            };
            let value = unescape(value).ok_or_else(|| {
                format!("invalid field selector: '{text}': invalid escape sequence in '{value}'")
            })?;
            let field = field.trim();
            if field != "metadata.name" && field != "metadata.namespace" && !fields.contains(&field)
            {
                // Types with field labels of their own (and custom resources) say it one way,
                // the others in apimachinery's default words.
                return Err(match own_labels {
                    true => format!("field label not supported: {field}"),
                    false => format!(
                        "\"{field}\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
                    ),
                });
            }
            terms.push((field.to_string(), equal, value));
        }
        Ok(FieldSelector { terms })
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.terms.iter().all(|(field, equal, value)| {
            let found = field.split('.').try_fold(obj, |v, k| v.get(k));
            let actual = match found {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Bool(b)) => b.to_string(),
                Some(Value::Number(n)) => n.to_string(),
                // An unset boolean field is selected as its default.
                None if field == "spec.hostNetwork" || field == "spec.unschedulable" => {
                    "false".into()
                }
                _ => String::new(),
            };
            (actual == *value) == *equal
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "namespace": "ns1", "labels": labels}})
    }

    #[test]
    fn label_operators() {
        let o = obj(json!({"app": "web", "tier": "front"}));
        let yes = [
            "",
            "app=web",
            "app==web",
            "app!=db",
            "tier in (front, back)",
            "tier notin (back)",
            "app",
            "!missing",
            "app=web,tier",
            "missing notin (x)",
            "missing!=x",
        ];
        for s in yes {
            assert!(
                LabelSelector::parse(s).unwrap().matches(&o),
                "{s} should match"
            );
        }
        let no = [
            "app=db",
            "app!=web",
            "tier in (back)",
            "tier notin (front)",
            "missing",
            "!app",
        ];
        for s in no {
            assert!(
                !LabelSelector::parse(s).unwrap().matches(&o),
                "{s} should not match"
            );
        }
        assert!(LabelSelector::parse("a in x").is_err());
    }

    #[test]
    fn field_selectors() {
        let o = obj(json!({}));
        assert!(FieldSelector::parse("metadata.name=a").unwrap().matches(&o));
        assert!(
            FieldSelector::parse("metadata.namespace!=ns2,metadata.name==a")
                .unwrap()
                .matches(&o)
        );
        assert!(!FieldSelector::parse("metadata.name!=a")
            .unwrap()
            .matches(&o));
        assert!(FieldSelector::parse("spec.x=1")
            .unwrap_err()
            .contains("not supported"));
        // A type's own fields, as the real registries declare them.
        let secrets = selectable_fields("", "secrets");
        let tls = json!({"metadata": {"name": "a"}, "type": "kubernetes.io/tls"});
        let helm = json!({"metadata": {"name": "b"}, "type": "helm.sh/release.v1"});
        let sel = FieldSelector::parse_for("type!=helm.sh/release.v1", secrets, true).unwrap();
        assert!(sel.matches(&tls) && !sel.matches(&helm));
        assert!(
            FieldSelector::parse("type=x").is_err(),
            "not a field of every type"
        );
        assert!(FieldSelector::parse_for("data.x=1", secrets, true)
            .unwrap_err()
            .starts_with("field label not supported"));
        assert_eq!(
            FieldSelector::parse_for("spec.type=x", &[], false).unwrap_err(),
            r#""spec.type" is not a known field selector: only "metadata.name", "metadata.namespace""#
        );
        let pods = selectable_fields("", "pods");
        let pod = json!({"spec": {"nodeName": "n1"}, "status": {"phase": "Running"}});
        let sel = FieldSelector::parse_for(
            "spec.nodeName=n1,status.phase!=Failed,spec.hostNetwork=false",
            pods,
            true,
        )
        .unwrap();
        assert!(sel.matches(&pod));
        // Escaped separators in values.
        let named = |name: &str| json!({"metadata": {"name": name}});
        let sel = FieldSelector::parse("metadata.name=a\\=b\\,c").unwrap();
        assert!(sel.matches(&named("a=b,c")) && !sel.matches(&named("a")));
        assert!(FieldSelector::parse("metadata.name=a\\x").is_err());
    }
}
