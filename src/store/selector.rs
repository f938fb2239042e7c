//! Label selectors (sent to the API server, and matched locally for fixtures) and client-side
//! field selectors.

use std::collections::BTreeMap;

use serde_json::Value;

use super::path::{scalar_key, PathExpr};

#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed Kubernetes label selector (`app=web,tier!=db,env in (a,b),!legacy`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct LabelSelector {
    requirements: Vec<Requirement>,
    source: String,
}

fn check_label_key(key: &str, whole: &str) -> Result<(), String> {
    let ok = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid label selector {whole:?}: bad label key {key:?}"
        ))
    }
}

/// Splits on commas that are not inside parentheses.
fn split_terms(text: &str) -> Vec<&str> {
    let mut terms = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                terms.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(&text[start..]);
    terms
}

impl LabelSelector {
    pub(crate) fn parse(text: &str) -> Result<LabelSelector, String> {
        let mut requirements = Vec::new();
        if text.trim().is_empty() {
            return Ok(LabelSelector::default());
        }
        for term in split_terms(text) {
            let term = term.trim();
            if term.is_empty() {
                return Err(format!("invalid label selector {text:?}: empty term"));
            }
            let req = if let Some(key) = term.strip_prefix('!') {
                check_label_key(key.trim(), text)?;
                Requirement::NotExists(key.trim().to_string())
            } else if let Some((key, value)) = term.split_once("!=") {
                check_label_key(key.trim(), text)?;
                Requirement::NotEquals(key.trim().into(), value.trim().into())
            } else if let Some((key, value)) =
                term.split_once("==").or_else(|| term.split_once('='))
            {
                check_label_key(key.trim(), text)?;
                Requirement::Equals(key.trim().into(), value.trim().into())
            } else if let Some((key, set, negated)) = parse_set(term) {
                check_label_key(key, text)?;
                let values = set
                    .split(',')
                    .map(|v| v.trim().to_string())
                    .filter(|v| !v.is_empty())
                    .collect();
                if negated {
                    Requirement::NotIn(key.into(), values)
                } else {
                    Requirement::In(key.into(), values)
                }
            } else {
                check_label_key(term, text)?;
                Requirement::Exists(term.to_string())
            };
            requirements.push(req);
        }
        Ok(LabelSelector {
            requirements,
            source: text.trim().to_string(),
        })
    }

    pub(crate) fn from_match_labels(labels: &BTreeMap<String, String>) -> LabelSelector {
        let requirements = labels
            .iter()
            .map(|(k, v)| Requirement::Equals(k.clone(), v.clone()))
            .collect();
        let source = labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        LabelSelector {
            requirements,
            source,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The selector in the API server's query syntax.
    pub(crate) fn as_query(&self) -> &str {
        &self.source
    }

    /// Whether an object's `metadata.labels` satisfy every requirement.
    pub(crate) fn matches(&self, object: &Value) -> bool {
        let labels = object
            .pointer("/metadata/labels")
            .and_then(Value::as_object);
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.requirements.iter().all(|req| match req {
            Requirement::Equals(k, v) => get(k) == Some(v.as_str()),
            Requirement::NotEquals(k, v) => get(k) != Some(v.as_str()),
            Requirement::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Requirement::NotIn(k, vs) => get(k).is_none_or(|x| vs.iter().all(|v| v != x)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::NotExists(k) => get(k).is_none(),
        })
    }
}

/// `key in (a,b)` / `key notin (a,b)` → (key, "a,b", negated).
fn parse_set(term: &str) -> Option<(&str, &str, bool)> {
    let open = term.find('(')?;
    let inner = term[open + 1..].strip_suffix(')')?;
    let head = term[..open].trim();
    if let Some(key) = head.strip_suffix(" notin") {
        return Some((key.trim(), inner, true));
    }
    head.strip_suffix(" in")
        .map(|key| (key.trim(), inner, false))
}

/// A client-side field selector: comma-separated `path=value`, `path==value` or `path!=value`
/// terms, all of which must hold. A missing field never equals a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldSelector {
    terms: Vec<(PathExpr, String, bool)>,
}

impl FieldSelector {
    pub fn parse(text: &str) -> Result<FieldSelector, String> {
        let mut terms = Vec::new();
        for term in text.split(',') {
            let (path, value, equal) = if let Some((p, v)) = term.split_once("!=") {
                (p, v, false)
            } else if let Some((p, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                (p, v, true)
            } else {
                return Err(format!(
                    "invalid field selector {text:?}: expected path=value, got {term:?}"
                ));
            };
            let path = PathExpr::parse(path.trim())
                .map_err(|e| format!("invalid field selector {text:?}: {e}"))?;
            terms.push((path, value.trim().to_string(), equal));
        }
        Ok(FieldSelector { terms })
    }

    pub fn matches(&self, object: &Value) -> bool {
        self.terms.iter().all(|(path, value, equal)| {
            let actual = path.get(object).and_then(scalar_key);
            (actual.as_deref() == Some(value.as_str())) == *equal
        })
    }

    /// [`FieldSelector::matches`] for a stored object.
    pub fn matches_node(&self, object: super::NodeRef<'_>) -> bool {
        self.terms.iter().all(|(path, value, equal)| {
            let actual = path.key_of_node(object);
            (actual.as_deref() == Some(value.as_str())) == *equal
        })
    }

    /// The selector as the API server reads it (`path=value` or `path!=value`, by commas),
    /// trimmed as it is matched here, with `\`, `,` and `=` escaped in values.
    pub fn to_query(&self) -> String {
        let escape = |v: &str| {
            v.chars().fold(String::new(), |mut out, c| {
                if matches!(c, '\\' | ',' | '=') {
                    out.push('\\');
                }
                out.push(c);
                out
            })
        };
        self.terms
            .iter()
            .map(|(path, value, equal)| {
                format!("{path}{}{}", if *equal { "=" } else { "!=" }, escape(value))
            })
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The paths the selector reads.
    pub fn paths(&self) -> impl Iterator<Item = &PathExpr> {
        self.terms.iter().map(|(p, _, _)| p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(labels: Value) -> Value {
        json!({"metadata": {"labels": labels}})
    }

    #[test]
    fn label_selector_forms() {
        let sel = LabelSelector::parse(
            "app=web, tier!=db,env in (prod, staging),zone notin (x),canary,!legacy",
        )
        .unwrap();
        assert!(sel.matches(&pod(json!({"app": "web", "env": "prod", "canary": ""}))));
        assert!(
            !sel.matches(&pod(json!({"app": "web", "env": "dev", "canary": ""}))),
            "env not in set"
        );
        assert!(
            !sel.matches(&pod(json!({"app": "web", "env": "prod"}))),
            "canary must exist"
        );
        assert!(!sel.matches(&pod(
            json!({"app": "web", "env": "prod", "canary": "", "legacy": "1"})
        )));
        assert!(!sel.matches(&pod(
            json!({"app": "web", "tier": "db", "env": "prod", "canary": ""})
        )));
        assert!(!sel.matches(&pod(
            json!({"app": "web", "zone": "x", "env": "prod", "canary": ""})
        )));
        assert!(LabelSelector::parse("app==web")
            .unwrap()
            .matches(&pod(json!({"app": "web"}))));
        assert!(LabelSelector::parse("").unwrap().matches(&json!({})));
    }

    #[test]
    fn label_selector_errors() {
        assert!(LabelSelector::parse("a=b,,c").is_err());
        assert!(LabelSelector::parse("bad key=1").is_err());
    }

    #[test]
    fn field_selector() {
        let sel = FieldSelector::parse("metadata.namespace=prod,spec.type!=ExternalName").unwrap();
        assert!(
            sel.matches(&json!({"metadata": {"namespace": "prod"}, "spec": {"type": "ClusterIP"}}))
        );
        assert!(!sel.matches(
            &json!({"metadata": {"namespace": "prod"}, "spec": {"type": "ExternalName"}})
        ));
        assert!(
            !sel.matches(&json!({"metadata": {}})),
            "missing field never equals"
        );
        assert!(FieldSelector::parse("nonsense").is_err());
        // What the API server is sent: the terms as matched here, values escaped.
        assert_eq!(
            FieldSelector::parse(" metadata.name = a=b ,type!=x\\y")
                .unwrap()
                .to_query(),
            "metadata.name=a\\=b,type!=x\\\\y"
        );
    }
}
