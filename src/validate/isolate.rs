//! Fault isolation at the check (DESIGN §4, SECURITY.md rule 4): when `haproxy -c` rejects a
//! rendered configuration, find the object whose lines it rejected, leave that object out,
//! and check again — so one tenant's value never stops everyone else's changes.
//!
//! Attribution, in order:
//! 1. the error names a line of an output (`parsing [haproxy.cfg:123]`, `at line 4 of file
//!    'maps/x.map'`): the innermost render unit that wrote that line;
//! 2. the error names an auxiliary file a unit registered (a certificate): that unit's owner;
//! 3. otherwise, bisection over the objects rendered from scratch since the last configuration
//!    that passed (only they can be guilty): usually one.
//!
//! Owners left out stay out while their units would replay unchanged (`RenderCache`); errors
//! that belong to no object (the admin's own templates) fail the whole render as before, and
//! every exclusion made while trying is taken back.

use std::collections::BTreeSet;

use haptic_agent::protocol::Bundle;

use super::haproxy::CheckError;
use crate::render::{Engine, Owner, RenderCache, RenderError, RenderInputs, Rendered};

/// The most objects one reconciliation may leave out after failed checks; past it the error is
/// reported as the configuration's own (a broken template makes every object "guilty").
const MAX_EXCLUSIONS: usize = 16;

#[derive(Debug)]
pub(crate) enum Failure {
    Render(RenderError),
    /// `haproxy -c` rejected lines no object owns (or could not run).
    Check(CheckError),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Render(e) => e.fmt(f),
            Failure::Check(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for Failure {}

/// A rendered configuration that passed `haproxy -c` (or needed no check).
#[derive(Debug)]
pub(crate) struct Validated {
    pub rendered: Rendered,
    pub bundle: Bundle,
    /// `haproxy -c` output (warnings) of the passing check, if one ran.
    pub warnings: Option<String>,
    /// How many checks ran (more than one when objects were left out).
    pub checks: usize,
}

/// Renders through `cache`, asks `needs_check` whether the bundle must be checked, and checks
/// it with `check`, leaving out objects whose configuration `haproxy -c` rejects.
pub(crate) fn render_validated(
    engine: &Engine,
    inputs: &RenderInputs,
    cache: &mut RenderCache,
    needs_check: &mut dyn FnMut(&Bundle) -> bool,
    check: &mut dyn FnMut(&Bundle) -> Result<String, CheckError>,
) -> Result<Validated, Failure> {
    let mut excluded_now: Vec<Owner> = Vec::new();
    let mut checks = 0;
    let result = loop {
        let rendered = match engine.render_cached(inputs, cache) {
            Ok(r) => r,
            Err(e) => break Err(Failure::Render(e)),
        };
        let bundle = rendered.to_bundle();
        if !needs_check(&bundle) {
            break Ok(Validated {
                rendered,
                bundle,
                warnings: None,
                checks,
            });
        }
        checks += 1;
        let message = match check(&bundle) {
            Ok(warnings) => {
                cache.mark_validated();
                break Ok(Validated {
                    rendered,
                    bundle,
                    warnings: Some(warnings),
                    checks,
                });
            }
            Err(CheckError::Rejected { message }) => message,
            Err(e) => break Err(Failure::Check(e)),
        };
        if excluded_now.len() >= MAX_EXCLUSIONS {
            break Err(Failure::Check(CheckError::Rejected { message }));
        }
        let reason = format!("haproxy -c rejected its configuration: {}", alert(&message));
        let mut guilty = attribute(&message, &rendered);
        if guilty.is_empty() {
            guilty = bisect(engine, inputs, cache, &rendered, check, &mut checks)
                .into_iter()
                .collect();
        }
        if guilty.is_empty() {
            break Err(Failure::Check(CheckError::Rejected { message }));
        }
        for owner in guilty {
            log::warn!("leaving {owner} out of the configuration: {reason}");
            cache.exclude(&owner, reason.clone());
            excluded_now.push(owner);
        }
    };
    if result.is_err() {
        // The configuration itself is broken: do not blame the objects tried on the way.
        for owner in &excluded_now {
            cache.include(owner);
        }
    }
    result
}

/// The first alert of a `haproxy -c` message, without the check's temporary directory.
pub(crate) fn alert(message: &str) -> String {
    let line = message
        .lines()
        .find(|l| l.contains("[ALERT]"))
        .or_else(|| message.lines().find(|l| !l.trim().is_empty()))
        .unwrap_or("")
        .trim();
    let line = line
        .split_once(" : config : ")
        .map(|(_, rest)| rest)
        .unwrap_or(line);
    let mut out = String::new();
    // Paths to the temporary check directory mean nothing to users: keep the file name.
    for word in line.split_inclusive(['[', '\'', ' ']) {
        match word.find("/haptic-check") {
            Some(_) => {
                // The separator the piece ends with, if any (the last piece may end in any
                // character, several bytes long).
                let (body, sep) = match word.chars().last() {
                    Some('[' | '\'' | ' ') => word.split_at(word.len() - 1),
                    _ => (word, ""),
                };
                let name = body
                    .rsplit_once(':')
                    .map(|(p, l)| format!("{}:{l}", p.rsplit('/').next().unwrap_or(p)))
                    .unwrap_or_else(|| body.rsplit('/').next().unwrap_or(body).to_string());
                out.push_str(&name);
                out.push_str(sep);
            }
            None => out.push_str(word),
        }
    }
    out.chars().take(400).collect()
}

/// Owners whose lines or files the alerts of `message` name.
fn attribute(message: &str, rendered: &Rendered) -> BTreeSet<Owner> {
    let mut guilty = BTreeSet::new();
    for line in message.lines().filter(|l| l.contains("[ALERT]")) {
        for (file, number) in locations(line) {
            let output = output_of(&file, rendered);
            // The innermost unit covering the line: the shortest span.
            if let Some(span) = rendered
                .units
                .iter()
                .filter(|s| Some(&*s.output) == output.as_deref())
                .filter(|s| s.first <= number && number <= s.last)
                .min_by_key(|s| s.last - s.first)
            {
                guilty.insert((*span.owner).clone());
            }
        }
        for quoted in line.split('\'').skip(1).step_by(2) {
            for (path, owner) in &rendered.file_owners {
                if quoted == path || quoted.ends_with(&format!("/{path}")) {
                    guilty.insert(owner.clone());
                }
            }
        }
    }
    guilty
}

/// `(file, line)` pairs an alert names: `[file:123]` and `at line 4 of file 'file'`.
fn locations(line: &str) -> Vec<(String, usize)> {
    let mut found = Vec::new();
    let mut rest = line;
    while let Some(start) = rest.find('[') {
        rest = &rest[start + 1..];
        let Some(end) = rest.find(']') else { break };
        if let Some((file, number)) = rest[..end].rsplit_once(':') {
            if let Ok(n) = number.parse::<usize>() {
                found.push((file.to_string(), n));
            }
        }
        rest = &rest[end + 1..];
    }
    if let Some(pos) = line.find("at line ") {
        let tail = &line[pos + 8..];
        let number: String = tail.chars().take_while(char::is_ascii_digit).collect();
        if let (Ok(n), Some(file)) = (
            number.parse::<usize>(),
            tail.split('\'').nth(1).map(str::to_string),
        ) {
            found.push((file, n));
        }
    }
    found
}

/// The output template a file named in an alert was rendered from.
fn output_of(file: &str, rendered: &Rendered) -> Option<String> {
    let base = file.rsplit('/').next().unwrap_or(file);
    if base == "haproxy.cfg" {
        return Some(crate::render::MAIN_TEMPLATE.to_string());
    }
    rendered
        .files
        .iter()
        .find(|f| file == f.path || file.ends_with(&format!("/{}", f.path)))
        .map(|f| f.name.clone())
}

/// Finds one guilty owner among those rendered from scratch since the last passing check, by
/// leaving out halves and checking. Returns `None` when no subset makes the check pass.
fn bisect(
    engine: &Engine,
    inputs: &RenderInputs,
    cache: &mut RenderCache,
    rendered: &Rendered,
    check: &mut dyn FnMut(&Bundle) -> Result<String, CheckError>,
    checks: &mut usize,
) -> Option<Owner> {
    let suspects: BTreeSet<Owner> = rendered
        .units
        .iter()
        .filter(|s| s.fresh)
        .map(|s| (*s.owner).clone())
        .collect();
    let mut candidates: Vec<Owner> = suspects.into_iter().collect();
    if candidates.is_empty() {
        return None;
    }
    let mut passes_without = |owners: &[Owner], cache: &mut RenderCache| -> bool {
        for o in owners {
            cache.exclude(o, "bisecting a failed haproxy -c".into());
        }
        let ok = engine
            .render_cached(inputs, cache)
            .map(|r| {
                *checks += 1;
                check(&r.to_bundle()).is_ok()
            })
            .unwrap_or(false);
        for o in owners {
            cache.include(o);
        }
        ok
    };
    // The guilty owner must be among the candidates: check that leaving all of them out passes.
    if candidates.len() > 1 && !passes_without(&candidates, cache) {
        return None;
    }
    while candidates.len() > 1 {
        let half = candidates.len() / 2;
        let (first, second) = candidates.split_at(half);
        candidates = if passes_without(first, cache) {
            first.to_vec()
        } else {
            second.to_vec()
        };
    }
    let last = candidates.pop()?;
    passes_without(std::slice::from_ref(&last), cache).then_some(last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ConfigDocument;
    use crate::store::path::PathExpr;
    use crate::store::Store;
    use serde_json::json;
    use std::collections::BTreeMap;
    use std::sync::Arc;

    /// A config where each ConfigMap is one unit: a backend whose server weight is the
    /// ConfigMap's `data.weight` printed raw (`| safe`, an admin's mistake), and a map entry
    /// whose key is `data.key` printed raw: values the templates accept and haproxy -c refuses.
    fn engine() -> Engine {
        let doc = ConfigDocument {
            metadata: None,
            spec: json!({
                "podSelector": {"matchLabels": {"app": "haproxy"}},
                "watchedResources": {"things": {"apiVersion": "v1", "resources": "configmaps", "indexBy": ["metadata.namespace", "metadata.name"]}},
                "templateSnippets": {
                    "thing": {"template": "\nbackend be_{{ t.metadata.name }}\n  server s 127.0.0.1:1 weight {{ t.data.weight | safe }}{% do shared.append('keys', t.data.key) %}"},
                },
                "maps": {"r.map": {"template": "{% for k in shared.get('keys', []) %}{{ k | safe }} x\n{% endfor %}"}},
                "haproxyConfig": {"template": "global\n  default-path config\ndefaults\n  mode http\n  timeout client 5s\n  timeout server 5s\n  timeout connect 5s\nfrontend f\n  bind 127.0.0.1:1\n  http-request set-var(txn.b) path,map_reg(maps/r.map)\n{% for t in resources.things.list() %}{{ unit('thing', owner=t, t=t) }}{% endfor %}\n"},
            }),
        };
        Engine::new(&doc.valid_spec("test").unwrap()).unwrap()
    }

    fn inputs(things: &[(&str, &str, &str)]) -> RenderInputs {
        let mut store = Store::new(vec![
            PathExpr::parse("metadata.namespace").unwrap(),
            PathExpr::parse("metadata.name").unwrap(),
        ]);
        for (name, weight, key) in things {
            store
                .upsert_value(&json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"namespace": "ns", "name": name},
                    "data": {"weight": weight, "key": key}}))
                .unwrap();
        }
        RenderInputs {
            stores: BTreeMap::from([("things".to_string(), Arc::new(store))]),
            ..Default::default()
        }
    }

    /// Renders and checks every bundle with the real `haproxy -c`, counting the checks.
    fn checked(
        engine: &Engine,
        inputs: &RenderInputs,
        cache: &mut RenderCache,
        checks: &mut usize,
    ) -> Result<Validated, Failure> {
        render_validated(engine, inputs, cache, &mut |_| true, &mut |b| {
            *checks += 1;
            crate::validate::haproxy::check_bundle("haproxy", b)
        })
    }

    #[test]
    fn a_rejected_line_leaves_its_owner_out_and_the_rest_goes_ahead() {
        let engine = engine();
        let mut cache = RenderCache::new();
        let mut checks = 0;
        let good = inputs(&[("a", "10", "^/a"), ("b", "20", "^/b")]);
        let v = checked(&engine, &good, &mut cache, &mut checks).expect("a valid configuration");
        assert!(v.rendered.dropped.is_empty());
        // A weight HAProxy refuses (0..256): attributed by its line, no bisection needed.
        let bad = inputs(&[("a", "10", "^/a"), ("b", "20", "^/b"), ("c", "9999", "^/c")]);
        checks = 0;
        let v = checked(&engine, &bad, &mut cache, &mut checks)
            .expect("the other objects still make a configuration");
        assert_eq!(checks, 2, "one failed check, one passing check");
        assert_eq!(v.rendered.dropped.len(), 1);
        assert_eq!(v.rendered.dropped[0].owner.to_string(), "ConfigMap ns/c");
        assert!(
            v.rendered.dropped[0]
                .message
                .contains("haproxy -c rejected"),
            "{}",
            v.rendered.dropped[0].message
        );
        assert!(v.bundle.haproxy_cfg.contains("backend be_b"));
        assert!(!v.bundle.haproxy_cfg.contains("be_c"));
        // It stays out while unchanged, without another failing check.
        checks = 0;
        let v = checked(&engine, &bad, &mut cache, &mut checks).unwrap();
        assert_eq!((checks, v.rendered.dropped.len()), (1, 1));
        // Fixed, it is back.
        let fixed = inputs(&[("a", "10", "^/a"), ("b", "20", "^/b"), ("c", "30", "^/c")]);
        let v = checked(&engine, &fixed, &mut cache, &mut checks).unwrap();
        assert!(v.rendered.dropped.is_empty());
        assert!(v.bundle.haproxy_cfg.contains("backend be_c"));
    }

    #[test]
    fn an_error_without_a_unit_line_is_bisected_among_changed_objects() {
        let engine = engine();
        let mut cache = RenderCache::new();
        let mut checks = 0;
        let names: Vec<String> = (0..8).map(|i| format!("t{i}")).collect();
        let mut things: Vec<(&str, &str, &str)> =
            names.iter().map(|n| (n.as_str(), "1", "^/ok")).collect();
        checked(&engine, &inputs(&things), &mut cache, &mut checks).expect("valid");
        // Two new objects; one adds an invalid regex to the map (named by map line, which no
        // unit wrote).
        things.push(("new-good", "1", "^/fine"));
        things.push(("new-bad", "1", "(unclosed"));
        let v = checked(&engine, &inputs(&things), &mut cache, &mut checks)
            .expect("bisection finds the culprit");
        let dropped: Vec<String> = v
            .rendered
            .dropped
            .iter()
            .map(|d| d.owner.to_string())
            .collect();
        assert_eq!(dropped, ["ConfigMap ns/new-bad"]);
        assert!(v.bundle.haproxy_cfg.contains("be_new-good"));
    }

    #[test]
    fn a_broken_configuration_blames_nobody() {
        let engine = engine();
        let mut cache = RenderCache::new();
        let mut checks = 0;
        let things = [("a", "1", "^/a")];
        // Every check fails (as when the admin's own template is broken): the error stands and
        // no object is left out afterwards.
        let err = render_validated(
            &engine,
            &inputs(&things),
            &mut cache,
            &mut |_| true,
            &mut |_: &Bundle| {
                checks += 1;
                Err(CheckError::Rejected {
                    message: "[ALERT] (1) : config : something global".into(),
                })
            },
        )
        .unwrap_err();
        assert!(matches!(err, Failure::Check(_)));
        assert_eq!(cache.excluded().count(), 0);
    }

    #[test]
    fn finds_lines_and_files_in_alerts() {
        let line = "[ALERT]    (1) : config : parsing [/tmp/haptic-check-1/haproxy.cfg:10] : error in frontend 'f' : regex '(bad' is invalid at line 2 of file 'maps/r.map'.";
        assert_eq!(
            locations(line),
            vec![
                ("/tmp/haptic-check-1/haproxy.cfg".to_string(), 10),
                ("maps/r.map".to_string(), 2)
            ]
        );
        assert_eq!(
            alert(line),
            "parsing [haproxy.cfg:10] : error in frontend 'f' : regex '(bad' is invalid at line 2 of file 'maps/r.map'."
        );
    }

    /// The last word of an alert naming the check directory may end in any character.
    #[test]
    fn alert_keeps_file_names_whatever_the_last_character() {
        for (line, expected) in [
            (
                "[ALERT] (1) : config : parsing [/tmp/haptic-check-1/haproxy.cfg:12] : bad",
                "parsing [haproxy.cfg:12] : bad",
            ),
            (
                "[ALERT] (1) : config : cannot open /tmp/haptic-check-1/maps/x.map",
                "cannot open x.map",
            ),
            (
                "[ALERT] (1) : config : cannot open /tmp/haptic-check-1/maps/é",
                "cannot open é",
            ),
            (
                "[ALERT] (1) : config : cannot open /tmp/haptic-check-1/maps/a:b€",
                "cannot open a:b€",
            ),
        ] {
            assert_eq!(alert(line), expected, "{line}");
        }
    }
}
