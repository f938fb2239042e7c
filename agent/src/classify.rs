//! The classifier: compares the applied bundle with a desired one and decides whether HAProxy
//! needs nothing, runtime commands only, or a reload.
//!
//! It is a pure function of the two bundles so the controller can call it to predict what an agent
//! will do (skip `haproxy -c` for runtime-only changes, rate-limit only reloads) and the agent can
//! call it to plan. Runtime-class changes are deliberately narrow (DESIGN §6, reference §5.5):
//!
//! * server `addr:port`, `weight` and `enabled`/`disabled` in existing slots of an existing backend;
//! * content of a map file the running configuration loads through a `map*()` converter;
//! * content of a certificate loaded by its own name (`crt <file>` or a crt-list line);
//! * crt-list lines appended or removed while the first (default certificate) line stays.
//!
//! Everything else is a reload, with the reasons spelled out.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use crate::haproxy_cfg::{
    changed_sections, data_lines, file_references, Config, Section, ServerLine, SocketAddress,
    Tokens,
};
use crate::protocol::{Bundle, BundleFile, FileKind};

/// Largest certificate payload sent in one `set ssl cert` command. HAProxy's default
/// `tune.bufsize` is 16 kB and a certificate cannot be split over several commands.
pub const MAX_CERT_PAYLOAD: usize = 15_000;

/// The highest weight HAProxy accepts.
const MAX_WEIGHT: u32 = 256;

/// What applying a new bundle over the old one takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Classification {
    /// Same configuration (ignoring comments and whitespace) and the same files.
    NoChange,
    /// Runtime commands are enough. The list may be empty when only files HAProxy does not read
    /// changed (they are still written to disk).
    Runtime(Vec<RuntimeAction>),
    /// HAProxy must reload; the reasons say why.
    Reload(Vec<String>),
}

impl Classification {
    /// `no_change`, `runtime` or `reload`, as on the wire.
    pub fn result_name(&self) -> &'static str {
        match self {
            Classification::NoChange => "no_change",
            Classification::Runtime(_) => "runtime",
            Classification::Reload(_) => "reload",
        }
    }

    /// The runtime commands, one line each (payloads summarised), or nothing.
    pub fn commands(&self) -> Vec<String> {
        match self {
            Classification::Runtime(actions) => {
                actions.iter().flat_map(RuntimeAction::describe).collect()
            }
            _ => Vec::new(),
        }
    }

    /// Whether `haproxy -c` must vet the new bundle before it goes out: a reload, and a runtime
    /// change that brings content HAProxy parses and may refuse where templates could not tell
    /// (a key that does not match its certificate, a PEM block it cannot read; a map of regular
    /// expressions, addresses or numbers: PCRE refuses patterns the templates' checks accept,
    /// such as a quantifier above 65535 or a compiled size above 64 KiB). Such a bundle sent
    /// unchecked would be refused by every agent's own check, holding back every later change.
    /// Server changes and maps of plain strings need none.
    pub fn needs_check(&self) -> bool {
        match self {
            Classification::NoChange => false,
            Classification::Runtime(actions) => actions.iter().any(|a| {
                matches!(
                    a,
                    RuntimeAction::SetCert { .. }
                        | RuntimeAction::AddCrtListLine { .. }
                        | RuntimeAction::ReplaceMap { parsed: true, .. }
                )
            }),
            Classification::Reload(_) => true,
        }
    }

    pub fn reasons(&self) -> &[String] {
        match self {
            Classification::Reload(reasons) => reasons,
            _ => &[],
        }
    }
}

/// One runtime change. Names are the ones HAProxy's runtime API knows (as written in the
/// configuration); `path` is the bundle path the payload comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuntimeAction {
    /// A single-line command with a one-line reply (`set server …`).
    Command(String),
    /// Atomic replacement of a map's entries: `prepare map`, `add map @V … <<`, `commit map @V`.
    /// `parsed`: HAProxy parses its keys or values (a regular expression, an address, a
    /// number): one it cannot read fails the whole map.
    ReplaceMap {
        name: String,
        path: String,
        parsed: bool,
    },
    /// New certificate content: (`new ssl cert` when `new_store`), `set ssl cert <<`,
    /// `commit ssl cert`.
    SetCert {
        name: String,
        path: String,
        new_store: bool,
    },
    /// `add ssl crt-list <crt_list> <<` with one line.
    AddCrtListLine { crt_list: String, line: String },
    /// `del ssl crt-list <crt_list> <cert>`.
    DelCrtListEntry { crt_list: String, cert: String },
    /// `del ssl cert <name>` for a certificate nothing uses any more.
    DelCert { name: String },
}

impl RuntimeAction {
    /// The commands this action sends, payloads shown as `<<(…)`; `@V` is the map version
    /// HAProxy hands out at `prepare map`.
    pub fn describe(&self) -> Vec<String> {
        match self {
            RuntimeAction::Command(c) => vec![c.clone()],
            RuntimeAction::ReplaceMap { name, path, .. } => vec![
                format!("prepare map {name}"),
                format!("add map @V {name} <<(entries of {path})"),
                format!("commit map @V {name}"),
            ],
            RuntimeAction::SetCert {
                name,
                path,
                new_store,
            } => {
                let mut out = Vec::new();
                if *new_store {
                    out.push(format!("new ssl cert {name}"));
                }
                out.push(format!("set ssl cert {name} <<(content of {path})"));
                out.push(format!("commit ssl cert {name}"));
                out
            }
            RuntimeAction::AddCrtListLine { crt_list, line } => {
                vec![format!("add ssl crt-list {crt_list} <<({line})")]
            }
            RuntimeAction::DelCrtListEntry { crt_list, cert } => {
                vec![format!("del ssl crt-list {crt_list} {cert}")]
            }
            RuntimeAction::DelCert { name } => vec![format!("del ssl cert {name}")],
        }
    }
}

/// Runtime actions grouped so they run in a safe order: certificates exist before crt-lists use
/// them, crt-list entries go before their certificates are deleted.
#[derive(Default)]
struct Plan {
    certs: Vec<RuntimeAction>,
    crt_list_dels: Vec<RuntimeAction>,
    crt_list_adds: Vec<RuntimeAction>,
    servers: Vec<RuntimeAction>,
    maps: Vec<RuntimeAction>,
    cert_dels: Vec<RuntimeAction>,
    reasons: Vec<String>,
}

impl Plan {
    /// The classification this plan comes to (`files_equal`: no file changed either).
    fn conclude(self, files_equal: bool) -> Classification {
        if !self.reasons.is_empty() {
            return Classification::Reload(self.reasons);
        }
        let actions = self.into_actions();
        if actions.is_empty() && files_equal {
            Classification::NoChange
        } else {
            Classification::Runtime(actions)
        }
    }

    fn reload(&mut self, reason: String) {
        self.reasons.push(reason);
    }

    fn into_actions(self) -> Vec<RuntimeAction> {
        let mut all = self.certs;
        all.extend(self.crt_list_dels);
        all.extend(self.crt_list_adds);
        all.extend(self.servers);
        all.extend(self.maps);
        all.extend(self.cert_dels);
        all
    }
}

/// Compares the applied bundle `old` with the desired bundle `new`.
///
/// When only haproxy.cfg differs, only the sections between the first and the last differing
/// line are parsed (a change of a few endpoints in a large configuration costs its sections,
/// not the whole text); the result is the same as [`classify_full`]'s.
pub fn classify(old: &Bundle, new: &Bundle) -> Classification {
    if old.files == new.files {
        if old.haproxy_cfg == new.haproxy_cfg {
            return Classification::NoChange;
        }
        if let Some(class) = classify_window(&old.haproxy_cfg, &new.haproxy_cfg) {
            return class;
        }
    }
    classify_full(old, new)
}

/// [`classify`] of two configurations with the same files, from their differing sections only;
/// `None` when the section list itself changed (the full comparison words the reasons).
fn classify_window(old: &str, new: &str) -> Option<Classification> {
    let (old_cfg, new_cfg) = changed_sections(old, new);
    let same_headers = old_cfg.sections.len() == new_cfg.sections.len()
        && old_cfg
            .sections
            .iter()
            .zip(&new_cfg.sections)
            .all(|(o, n)| o.header == n.header);
    if !same_headers {
        return None;
    }
    let mut plan = Plan::default();
    compare_configs(&old_cfg, &new_cfg, &mut plan);
    Some(plan.conclude(true))
}

/// The comparison of the whole bundles.
pub fn classify_full(old: &Bundle, new: &Bundle) -> Classification {
    let old_cfg = Config::parse(&old.haproxy_cfg);
    let new_cfg = Config::parse(&new.haproxy_cfg);
    let mut plan = Plan::default();
    compare_configs(&old_cfg, &new_cfg, &mut plan);
    let files_equal = old.files == new.files;
    if !files_equal {
        compare_files(old, new, &old_cfg, &new_cfg, &mut plan);
    }
    plan.conclude(files_equal)
}

fn compare_configs(old: &Config, new: &Config, plan: &mut Plan) {
    let old_headers: Vec<&Tokens> = old.sections.iter().map(|s| &s.header).collect();
    let new_headers: Vec<&Tokens> = new.sections.iter().map(|s| &s.header).collect();
    if old_headers != new_headers {
        // Sets, not `contains` on the lists: a backend added at 10,000 sections would compare
        // every header with every other (10^8 comparisons, seconds in the controller and again
        // in every agent).
        let old_set: HashSet<&Tokens> = old_headers.iter().copied().collect();
        let new_set: HashSet<&Tokens> = new_headers.iter().copied().collect();
        let added: Vec<String> = new_headers
            .iter()
            .filter(|h| !old_set.contains(*h))
            .map(|h| h.join(" "))
            .collect();
        let removed: Vec<String> = old_headers
            .iter()
            .filter(|h| !new_set.contains(*h))
            .map(|h| h.join(" "))
            .collect();
        for a in added {
            plan.reload(format!("section added: {a}"));
        }
        for r in removed {
            plan.reload(format!("section removed: {r}"));
        }
        if plan.reasons.is_empty() {
            plan.reload("sections reordered".into());
        }
        return;
    }
    for (o, n) in old.sections.iter().zip(&new.sections) {
        if o.lines != n.lines {
            compare_section(o, n, plan);
        }
    }
}

fn section_label(section: &Section) -> String {
    if section.header.is_empty() {
        "lines before the first section".into()
    } else {
        section.header.join(" ")
    }
}

fn compare_section(old: &Section, new: &Section, plan: &mut Plan) {
    let label = section_label(old);
    if !old.has_servers() {
        plan.reload(format!(
            "{label}: {}",
            first_difference(&old.lines, &new.lines)
        ));
        return;
    }
    if old.lines.len() != new.lines.len() {
        plan.reload(format!(
            "{label}: lines added or removed ({}, e.g. server slots)",
            first_difference(&old.lines, &new.lines)
        ));
        return;
    }
    for (o, n) in old.lines.iter().zip(&new.lines) {
        if o == n {
            continue;
        }
        match (ServerLine::parse(o), ServerLine::parse(n)) {
            (Some(os), Some(ns)) if os.name == ns.name && os.rest == ns.rest => {
                compare_server(old.name(), &os, &ns, plan);
            }
            (Some(os), Some(ns)) if os.name == ns.name => {
                plan.reload(format!(
                    "{label}: server {} changed in a keyword other than address, weight or state",
                    os.name
                ));
            }
            _ => plan.reload(format!(
                "{label}: line \"{}\" became \"{}\"",
                o.join(" "),
                n.join(" ")
            )),
        }
    }
}

fn first_difference(old: &[Tokens], new: &[Tokens]) -> String {
    for (i, n) in new.iter().enumerate() {
        match old.get(i) {
            Some(o) if o == n => continue,
            Some(o) => return format!("line \"{}\" became \"{}\"", o.join(" "), n.join(" ")),
            None => return format!("line \"{}\" added", n.join(" ")),
        }
    }
    match old.get(new.len()) {
        Some(o) => format!("line \"{}\" removed", o.join(" ")),
        None => "changed".into(),
    }
}

fn valid_weight(w: &str) -> bool {
    w.bytes().all(|b| b.is_ascii_digit()) && w.parse::<u32>().is_ok_and(|v| v <= MAX_WEIGHT)
}

/// Runtime commands for one server whose address, weight or state changed. Enabling sets the
/// address before `state ready`; disabling goes to `maint` before moving the address, so no
/// request reaches a placeholder or the wrong pod.
fn compare_server(backend: &str, old: &ServerLine, new: &ServerLine, plan: &mut Plan) {
    let target = format!("{backend}/{}", new.name);
    let mut cmds = Vec::new();
    let mut addr_cmd = None;
    if old.address != new.address {
        match (
            SocketAddress::parse(&old.address),
            SocketAddress::parse(&new.address),
        ) {
            (Some(_), Some(a)) => {
                addr_cmd = Some(format!("set server {target} addr {} port {}", a.ip, a.port))
            }
            _ => {
                plan.reload(format!(
                    "server {target}: address {} -> {} is not an IP:port change",
                    old.address, new.address
                ));
                return;
            }
        }
    }
    let mut weight_cmd = None;
    if old.weight != new.weight {
        match (&old.weight, &new.weight) {
            (Some(_), Some(w)) if valid_weight(w) => {
                weight_cmd = Some(format!("set server {target} weight {w}"))
            }
            _ => {
                plan.reload(format!(
                    "server {target}: weight change {:?} -> {:?} needs a reload",
                    old.weight, new.weight
                ));
                return;
            }
        }
    }
    match (old.disabled, new.disabled) {
        (true, false) => {
            cmds.extend(addr_cmd);
            cmds.extend(weight_cmd);
            cmds.push(format!("set server {target} state ready"));
        }
        (false, true) => {
            cmds.push(format!("set server {target} state maint"));
            cmds.extend(addr_cmd);
            cmds.extend(weight_cmd);
        }
        _ => {
            cmds.extend(addr_cmd);
            cmds.extend(weight_cmd);
        }
    }
    plan.servers
        .extend(cmds.into_iter().map(RuntimeAction::Command));
}

/// The words a bundle's HAProxy sees: the configuration and every crt-list line.
fn loaded_words<'a>(cfg: &'a Config, bundle: &'a Bundle) -> Vec<&'a str> {
    let mut words: Vec<&str> = cfg.tokens().collect();
    for f in bundle.files.iter().filter(|f| f.kind == FileKind::CrtList) {
        if let Ok(text) = std::str::from_utf8(&f.content) {
            words.extend(
                text.lines()
                    .flat_map(|l| l.split_whitespace().take_while(|w| !w.starts_with('#'))),
            );
        }
    }
    words
}

fn compare_files(old: &Bundle, new: &Bundle, old_cfg: &Config, new_cfg: &Config, plan: &mut Plan) {
    let old_files: BTreeMap<&str, &BundleFile> =
        old.files.iter().map(|f| (f.path.as_str(), f)).collect();
    let new_files: BTreeMap<&str, &BundleFile> =
        new.files.iter().map(|f| (f.path.as_str(), f)).collect();
    let old_words = loaded_words(old_cfg, old);
    let new_words = loaded_words(new_cfg, new);
    let paths: BTreeSet<&str> = old_files.keys().chain(new_files.keys()).copied().collect();
    for path in paths {
        match (old_files.get(path), new_files.get(path)) {
            (Some(o), Some(n)) if o.kind != n.kind => {
                plan.reload(format!(
                    "file {path}: kind changed from {} to {}",
                    o.kind, n.kind
                ));
            }
            (Some(o), Some(n)) if o.content == n.content => {}
            (Some(_), None) => {
                if !file_references(new_words.iter().copied(), path).is_empty() {
                    plan.reload(format!("file {path} removed but still referenced"));
                }
            }
            (old_file, Some(n)) => {
                let old_content = old_file.map(|f| f.content.as_slice());
                changed_file(n, old_content, old_cfg, &old_words, &new_words, new, plan);
            }
            (None, None) => {}
        }
    }
}

/// A file whose content is new or changed. Only files the running HAProxy has loaded matter;
/// the others are written to disk and picked up by whatever references them next.
fn changed_file(
    file: &BundleFile,
    old_content: Option<&[u8]>,
    old_cfg: &Config,
    old_words: &[&str],
    new_words: &[&str],
    new: &Bundle,
    plan: &mut Plan,
) {
    let path = file.path.as_str();
    let refs = file_references(old_words.iter().copied(), path);
    let dir_loaded = file.kind == FileKind::Cert
        && path.rsplit_once('/').is_some_and(|(dir, _)| {
            !file_references(old_words.iter().copied(), &format!("{dir}/")).is_empty()
        });
    if dir_loaded {
        plan.reload(format!(
            "certificate {path} is loaded through its directory"
        ));
        return;
    }
    if refs.is_empty() {
        return;
    }
    match file.kind {
        FileKind::Map => {
            if refs.iter().all(|r| r.is_map()) {
                for r in refs {
                    plan.maps.push(RuntimeAction::ReplaceMap {
                        parsed: r.map_parses(),
                        name: r.name,
                        path: path.into(),
                    });
                }
            } else {
                plan.reload(format!("file {path} is loaded other than as a map"));
            }
        }
        FileKind::Cert => {
            let payload = file.content.iter().filter(|&&b| b != b'\r').count();
            if payload > MAX_CERT_PAYLOAD {
                plan.reload(format!(
                    "certificate {path} is too large ({payload} bytes) for a runtime update"
                ));
                return;
            }
            for r in refs {
                if !r.name.starts_with('/') && old_cfg.has_directive("crt-base") {
                    plan.reload(format!("certificate {path} is named relative to crt-base; the runtime API needs the absolute name"));
                    return;
                }
                plan.certs.push(RuntimeAction::SetCert {
                    name: r.name,
                    path: path.into(),
                    new_store: false,
                });
            }
        }
        FileKind::CrtList => match old_content {
            Some(old_bytes) if refs.iter().all(|r| r.context == "crt-list") => {
                for r in refs {
                    compare_crt_list(
                        &r.name,
                        path,
                        old_bytes,
                        &file.content,
                        old_words,
                        new_words,
                        new,
                        plan,
                    );
                }
            }
            _ => plan.reload(format!(
                "crt-list {path} changed in a way the runtime API cannot apply"
            )),
        },
        FileKind::General | FileKind::Ca | FileKind::Crl => {
            plan.reload(format!(
                "{} file {path} changed (HAProxy reads it only at start)",
                file.kind
            ));
        }
    }
}

/// Appended and removed crt-list lines become runtime commands; any other edit reloads.
#[allow(clippy::too_many_arguments)]
fn compare_crt_list(
    name: &str,
    path: &str,
    old: &[u8],
    new: &[u8],
    old_words: &[&str],
    new_words: &[&str],
    bundle: &Bundle,
    plan: &mut Plan,
) {
    let (Ok(old_text), Ok(new_text)) = (std::str::from_utf8(old), std::str::from_utf8(new)) else {
        plan.reload(format!("crt-list {path} is not UTF-8"));
        return;
    };
    let old_lines = data_lines(old_text);
    let new_lines = data_lines(new_text);
    let unique = |lines: &[Tokens]| {
        lines.iter().map(|l| &l[0]).collect::<BTreeSet<_>>().len() == lines.len()
    };
    if !unique(&old_lines) || !unique(&new_lines) {
        plan.reload(format!("crt-list {path} names a certificate twice"));
        return;
    }
    if old_lines.first() != new_lines.first() {
        plan.reload(format!(
            "crt-list {path}: first line (the default certificate) changed"
        ));
        return;
    }
    // Sets for the membership tests: a crt-list has a line per certificate (thousands).
    let old_set: HashSet<&Tokens> = old_lines.iter().collect();
    let new_set: HashSet<&Tokens> = new_lines.iter().collect();
    let kept: Vec<&Tokens> = new_lines
        .iter()
        .take_while(|l| old_set.contains(l))
        .collect();
    let appended = &new_lines[kept.len()..];
    if appended.iter().any(|l| old_set.contains(l)) {
        plan.reload(format!("crt-list {path}: lines reordered"));
        return;
    }
    let kept_set: HashSet<&Tokens> = kept.iter().copied().collect();
    let kept_in_old_order = old_lines
        .iter()
        .filter(|l| kept_set.contains(l))
        .collect::<Vec<_>>()
        == kept;
    if !kept_in_old_order {
        plan.reload(format!("crt-list {path}: lines reordered"));
        return;
    }
    let new_word_set: HashSet<&str> = new_words.iter().copied().collect();
    let old_word_set: HashSet<&str> = old_words.iter().copied().collect();
    for removed in old_lines.iter().filter(|l| !new_set.contains(l)) {
        let cert = removed[0].clone();
        plan.crt_list_dels.push(RuntimeAction::DelCrtListEntry {
            crt_list: name.into(),
            cert: cert.clone(),
        });
        if !new_word_set.contains(cert.as_str()) {
            plan.cert_dels.push(RuntimeAction::DelCert { name: cert });
        }
    }
    for line in appended {
        if line.iter().any(|t| t.chars().any(char::is_whitespace)) {
            plan.reload(format!("crt-list {path}: appended line has quoted words"));
            return;
        }
        let cert = &line[0];
        if !old_word_set.contains(cert.as_str()) {
            let source = bundle.files.iter().find(|f| {
                f.kind == FileKind::Cert
                    && (*cert == f.path
                        || cert
                            .strip_suffix(f.path.as_str())
                            .is_some_and(|p| p.ends_with('/')))
            });
            match source {
                Some(f) if f.content.len() <= MAX_CERT_PAYLOAD && cert.starts_with('/') => {
                    plan.certs.push(RuntimeAction::SetCert {
                        name: cert.clone(),
                        path: f.path.clone(),
                        new_store: true,
                    });
                }
                _ => {
                    plan.reload(format!("crt-list {path}: {cert} is neither loaded nor a bundle certificate with an absolute name"));
                    return;
                }
            }
        }
        plan.crt_list_adds.push(RuntimeAction::AddCrtListLine {
            crt_list: name.into(),
            line: line.join(" "),
        });
    }
}

#[cfg(test)]
#[path = "classify_tests.rs"]
mod tests;
