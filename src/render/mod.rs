//! Template rendering: one minijinja environment per config ([`Engine`]), the render context of
//! DESIGN §4, and the output post-processing.
//!
//! A render produces `haproxy.cfg` first, then every map, file and certificate template, all
//! sharing one `shared` map and one file registry. Any error aborts the whole render; the caller
//! keeps its last good output.

pub(crate) mod context;
pub mod current_config;
pub(crate) mod filters;
pub(crate) mod glob;
pub(crate) mod objects;
pub(crate) mod safe;
pub(crate) mod slots;
mod splice;
pub mod units;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use haptic_agent::protocol::{Bundle, BundleFile, FileKind};
use minijinja::value::Value;
use minijinja::{Environment, ErrorKind, UndefinedBehavior};

use crate::config::model::{OutputTemplate, HAPROXY_PODS};
use crate::config::Spec;
use crate::store::Store;
use context::{FileRegistry, Paths, Shared, StatusCollector, StatusUpdate};
use current_config::CurrentConfig;
use objects::Resources;
pub use units::{Dropped, Owner, RenderCache, UnitKey, UnitSpan};

/// The render's own hash maps and sets (units, `shared`, statuses, the splicing index). Their
/// keys carry tenant text, so the hasher is randomly seeded; it is foldhash rather than std's
/// SipHash, which took 7 % of a full render at 10,000 Ingresses (perf, docs/performance.md).
pub(crate) type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
pub(crate) type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

/// A key with its hash, taken once when the key is made. A table that grows hashes its keys
/// again, and in a large render those are strings that have long left the cache (a miss or more
/// per key); with each hash beside its key, growing reads the table alone.
#[derive(Debug, Clone)]
pub(crate) struct Prehashed<K> {
    hash: u64,
    key: K,
}

impl<K: std::hash::Hash> Prehashed<K> {
    pub(crate) fn new(key: K) -> Prehashed<K> {
        let hash = crate::process_hash(&key);
        Prehashed { hash, key }
    }
}

impl<K> Prehashed<K> {
    pub(crate) fn into_key(self) -> K {
        self.key
    }
}

impl<K: PartialEq> PartialEq for Prehashed<K> {
    fn eq(&self, other: &Prehashed<K>) -> bool {
        self.hash == other.hash && self.key == other.key
    }
}

impl<K: Eq> Eq for Prehashed<K> {}

impl<K> std::hash::Hash for Prehashed<K> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

/// A map of [`Prehashed`] keys, which hashes nothing itself.
pub(crate) type PrehashedMap<K, V> = std::collections::HashMap<
    Prehashed<K>,
    V,
    std::hash::BuildHasherDefault<crate::store::doc::Passthrough>,
>;

/// Evaluation budget of one template render — each output template, and each render unit
/// separately: stops runaway loops and recursion in about a second (~20 ns per step), well
/// inside an admission webhook's timeout. A runaway unit leaves its owner out (and is
/// memoized as failed, so it costs once per change of the object). The top level of a render
/// of 10,000 Ingresses through the shipped libraries uses a few percent of it; the per-object
/// work is in units.
pub const DEFAULT_FUEL: u64 = 50_000_000;

pub const MAIN_TEMPLATE: &str = "haproxy.cfg";

/// Render passes at most: each pass after the first leaves out the owners whose units failed in
/// the one before (owners that fail only once others are out need another pass).
const MAX_PASSES: usize = 16;

/// A render or compile failure, located in a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderError {
    pub template: String,
    pub line: Option<usize>,
    pub message: String,
    /// The message comes from `fail()` in a template and is the user's own text.
    pub from_fail: bool,
}

impl fmt::Display for RenderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(
                f,
                "template {} line {}: {}",
                self.template, line, self.message
            ),
            None => write!(f, "template {}: {}", self.template, self.message),
        }
    }
}

impl std::error::Error for RenderError {}

impl RenderError {
    pub(crate) fn from_minijinja(entry: &str, err: &minijinja::Error, fuel: u64) -> RenderError {
        // Errors inside includes and macros arrive wrapped ("could not render include"); the
        // innermost template error says where the problem really is.
        let chain = std::iter::successors(Some(err as &(dyn std::error::Error + 'static)), |e| {
            e.source()
        });
        let mut innermost = err;
        let mut from_fail = false;
        for e in chain {
            if let Some(inner) = e.downcast_ref::<minijinja::Error>() {
                innermost = inner;
            }
            from_fail |= e.is::<filters::FailMarker>() || e.is::<safe::RefusalMarker>();
        }
        let template = innermost.name().or(err.name()).unwrap_or(entry).to_string();
        let message = if from_fail {
            innermost.detail().unwrap_or_default().to_string()
        } else if innermost.kind() == ErrorKind::OutOfFuel || err.kind() == ErrorKind::OutOfFuel {
            format!("evaluation budget of {fuel} steps exhausted (a runaway loop or recursion?)")
        } else {
            match innermost.detail() {
                Some(detail) => format!("{}: {detail}", innermost.kind()),
                None => innermost.kind().to_string(),
            }
        };
        let line = innermost.line().or(err.line());
        let template = if template != entry && !from_fail {
            format!("{template} (included from {entry})")
        } else {
            template
        };
        RenderError {
            template,
            line,
            message,
            from_fail,
        }
    }
}

/// A compiled post-processing step.
#[derive(Debug, Clone)]
struct RegexReplace {
    regex: regex::Regex,
    replace: String,
    /// The step is the indentation normaliser (`^[ ]+` or `^ +` with a replacement that names
    /// no group): done by hand, it costs a byte compare per line instead of a regex search over
    /// every line of the configuration on every render.
    leading_spaces: bool,
}

impl RegexReplace {
    fn new(pattern: &str, replace: String) -> Result<RegexReplace, regex::Error> {
        Ok(RegexReplace {
            regex: regex::Regex::new(pattern)?,
            leading_spaces: matches!(pattern, "^[ ]+" | "^ +") && !replace.contains('$'),
            replace,
        })
    }

    /// The line with the step applied, or `None` when it does not change.
    fn apply(&self, line: &str) -> Option<String> {
        if self.leading_spaces {
            let rest = line.trim_start_matches(' ');
            return (rest.len() < line.len()).then(|| format!("{}{rest}", self.replace));
        }
        match self.regex.replace_all(line, self.replace.as_str()) {
            std::borrow::Cow::Owned(changed) => Some(changed),
            std::borrow::Cow::Borrowed(_) => None,
        }
    }

    /// Appends the line with the step applied to `out`; the indentation normaliser without
    /// building the line anew.
    fn write(&self, line: &str, out: &mut String) {
        if self.leading_spaces {
            let rest = line.trim_start_matches(' ');
            if rest.len() < line.len() {
                out.push_str(&self.replace);
            }
            out.push_str(rest);
            return;
        }
        out.push_str(&self.regex.replace_all(line, self.replace.as_str()));
    }
}

/// Applies regex replacements line by line and ends the output with exactly one newline.
fn post_process(text: &str, steps: &[RegexReplace]) -> String {
    let body = text.trim_end_matches('\n');
    let mut out = String::with_capacity(body.len() + 1);
    if steps.is_empty() {
        out.push_str(body);
    } else {
        for (i, line) in body.split('\n').enumerate() {
            if i > 0 {
                out.push('\n');
            }
            post_process_line(line, steps, &mut out);
        }
    }
    out.push('\n');
    out
}

/// Applies the replacements to one line (no new line in it).
fn post_process_line(line: &str, steps: &[RegexReplace], out: &mut String) {
    let Some((last, first)) = steps.split_last() else {
        out.push_str(line);
        return;
    };
    let mut line = std::borrow::Cow::Borrowed(line);
    for step in first {
        if let Some(changed) = step.apply(&line) {
            line = std::borrow::Cow::Owned(changed);
        }
    }
    last.write(&line, out);
}

/// One output template: haproxy.cfg, a map, a file or a certificate.
#[derive(Debug, Clone)]
struct Output {
    name: String,
    kind: Option<FileKind>,
    post: Vec<RegexReplace>,
}

/// Everything a render reads besides the templates.
#[derive(Debug, Clone, Default)]
pub struct RenderInputs {
    /// Stores by watched-resource name; `haproxy-pods` feeds `controller.haproxy_pods`.
    pub stores: BTreeMap<String, Arc<Store>>,
    /// `extraContext` after any overrides (CLI, validation test).
    pub extra_context: serde_json::Map<String, serde_json::Value>,
    pub current_config: Option<Arc<CurrentConfig>>,
    /// Overrides `paths.base` (offline renders show their output directory).
    pub base_dir: Option<String>,
}

/// A rendered file, before it becomes part of a bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedFile {
    pub kind: FileKind,
    /// The template name, or the registered file's name.
    pub name: String,
    /// Relative to the directory of haproxy.cfg.
    pub path: String,
    pub content: Arc<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    /// The texts and spans are shared with the render cache, which keeps the last render for
    /// splicing the next (`Arc::make_mut` copies them only while someone else holds them).
    pub haproxy_cfg: Arc<String>,
    pub files: Vec<RenderedFile>,
    /// Shared with the render cache (a splice reuses them).
    pub statuses: Arc<Vec<StatusUpdate>>,
    /// Where each render unit's output landed, in render order.
    pub units: Arc<Vec<UnitSpan>>,
    /// Objects left out of this configuration, and why.
    pub dropped: Vec<Dropped>,
    /// Auxiliary files registered by render units, with the owner of the unit.
    pub file_owners: Vec<(String, Owner)>,
}

impl Rendered {
    pub fn to_bundle(&self) -> Bundle {
        let files = self
            .files
            .iter()
            .map(|f| BundleFile {
                kind: f.kind,
                path: f.path.clone(),
                content: f.content.as_bytes().to_vec(),
            })
            .collect();
        Bundle::new(Arc::clone(&self.haproxy_cfg), files)
    }
}

/// The compiled templates of one config.
pub struct Engine {
    /// Tells render caches which engine their entries belong to.
    id: u64,
    env: Environment<'static>,
    outputs: Vec<Output>,
    paths: Paths,
    extra_context: serde_json::Map<String, serde_json::Value>,
    fuel: u64,
}

impl fmt::Debug for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("outputs", &self.outputs.len())
            .finish()
    }
}

fn compile_post(name: &str, out: &OutputTemplate) -> Result<Vec<RegexReplace>, RenderError> {
    out.post_processing
        .iter()
        .map(|step| {
            let pattern = step
                .params
                .get("pattern")
                .map(String::as_str)
                .unwrap_or_default();
            let replace = step.params.get("replace").cloned().unwrap_or_default();
            RegexReplace::new(pattern, replace).map_err(|e| RenderError {
                template: name.to_string(),
                line: None,
                message: format!("postProcessing pattern {pattern:?}: {e}"),
                from_fail: false,
            })
        })
        .collect()
}

impl Engine {
    /// Compiles every template of the spec; the first syntax error is returned with its
    /// template and line.
    pub fn new(spec: &Spec) -> Result<Engine, RenderError> {
        Engine::with_fuel(spec, DEFAULT_FUEL)
    }

    pub fn with_fuel(spec: &Spec, fuel: u64) -> Result<Engine, RenderError> {
        let mut env = Environment::new();
        // Every `{{ … }}` goes through the HAProxy-aware formatter (safe::formatter): a value
        // that could change the structure of the configuration is refused unless it came
        // through a typed filter. The custom auto-escape mode keeps macro output and
        // `{% set %}` blocks safe strings, as HTML auto-escaping does.
        env.set_auto_escape_callback(|_| minijinja::AutoEscape::Custom("haproxy".into()));
        env.set_formatter(safe::formatter);
        env.set_undefined_behavior(UndefinedBehavior::Chainable);
        env.set_fuel(Some(fuel));
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .keep_trailing_newline(true)
            .build()
            .map_err(|e| RenderError {
                template: String::new(),
                line: None,
                message: e.to_string(),
                from_fail: false,
            })?;
        env.set_syntax(syntax);
        let snippet_names: Arc<[String]> = spec.template_snippets.keys().cloned().collect();
        filters::register(&mut env, snippet_names);
        safe::register(&mut env);

        let mut sources: Vec<(String, String)> =
            vec![(MAIN_TEMPLATE.into(), spec.haproxy_config.template.clone())];
        sources.extend(
            spec.template_snippets
                .iter()
                .map(|(n, s)| (n.clone(), s.template.clone())),
        );
        let mut outputs = vec![Output {
            name: MAIN_TEMPLATE.into(),
            kind: None,
            post: compile_post(MAIN_TEMPLATE, &spec.haproxy_config)?,
        }];
        let sections = [
            (FileKind::Map, &spec.maps),
            (FileKind::General, &spec.files),
            (FileKind::Cert, &spec.ssl_certificates),
        ];
        for (kind, templates) in sections {
            for (name, out) in templates {
                sources.push((name.clone(), out.template.clone()));
                outputs.push(Output {
                    name: name.clone(),
                    kind: Some(kind),
                    post: compile_post(name, out)?,
                });
            }
        }
        for (name, source) in sources {
            env.add_template_owned(name.clone(), source)
                .map_err(|e| RenderError::from_minijinja(&name, &e, fuel))?;
        }
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Ok(Engine {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            env,
            outputs,
            paths: Paths::from_spec(spec),
            extra_context: spec.templating_settings.extra_context.clone(),
            fuel,
        })
    }

    pub fn paths(&self) -> &Paths {
        &self.paths
    }

    /// The config's own `extraContext`, before overrides.
    pub fn extra_context(&self) -> &serde_json::Map<String, serde_json::Value> {
        &self.extra_context
    }

    /// Renders haproxy.cfg and every auxiliary template from scratch, keeping nothing for a
    /// later render (`RenderCache::once`: no splicing index is built).
    pub fn render(&self, inputs: &RenderInputs) -> Result<Rendered, RenderError> {
        self.render_cached(inputs, &mut RenderCache::once())
    }

    /// Renders, replaying every render unit whose inputs are unchanged since the renders that
    /// filled `cache`. The result is byte-for-byte the full render's.
    pub fn render_cached(
        &self,
        inputs: &RenderInputs,
        cache: &mut RenderCache,
    ) -> Result<Rendered, RenderError> {
        let paths = match &inputs.base_dir {
            Some(base) => self.paths.clone().with_base(base.clone()),
            None => self.paths.clone(),
        };
        if let Some(rendered) = self.try_splice(inputs, &paths, cache) {
            return Ok(rendered);
        }
        // A unit that fails drops its owner; when the owner's other units had already
        // produced output, render again without the owner (replays make that cheap). Each
        // pass adds owners, so this ends; the bound guards against a pathological template.
        let mut failed: HashMap<Owner, String> = HashMap::default();
        let mut passes = 0;
        let (registry, status, outputs, instances, dropped, file_owners, traces) = loop {
            passes += 1;
            if passes == 1 {
                cache.prepare(self.id, &inputs.extra_context, &inputs.base_dir);
            }
            cache.stats = units::CacheStats::default();
            let keep_pre = !cache.once;
            let (ctx, registry, status) = self.enter_scope(
                inputs,
                &paths,
                Arc::new(Shared::default()),
                std::mem::take(cache),
                failed.clone(),
            );
            let outputs = self.render_outputs(&ctx, &paths, keep_pre);
            let Some(scope) = units::leave() else {
                return Err(RenderError {
                    template: MAIN_TEMPLATE.into(),
                    line: None,
                    message: "render scope lost".into(),
                    from_fail: false,
                });
            };
            *cache = scope.cache;
            if log::log_enabled!(log::Level::Debug) {
                let mut timings: Vec<_> = scope.timings.iter().collect();
                timings.sort_by_key(|t| std::cmp::Reverse(t.1 .1));
                for (template, (calls, time)) in timings.iter().take(12) {
                    log::debug!(
                        "unit template={template} calls={calls} ms={:.1}",
                        time.as_secs_f64() * 1000.0
                    );
                }
                log::debug!(
                    "units rendered={} replayed={} dropped={}",
                    cache.stats.rendered,
                    cache.stats.replayed,
                    cache.stats.dropped
                );
            }
            if outputs.is_ok() && !scope.newly_failed.is_empty() {
                if passes >= MAX_PASSES {
                    // Never ship a pass in which an owner failed: part of it would be in.
                    return Err(RenderError {
                        template: MAIN_TEMPLATE.into(),
                        line: None,
                        message: format!(
                            "objects kept failing after {MAX_PASSES} passes (last: {})",
                            scope
                                .newly_failed
                                .keys()
                                .map(|o| o.to_string())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                        from_fail: false,
                    });
                }
                failed.extend(scope.newly_failed);
                continue;
            }
            break (
                registry,
                status,
                outputs,
                scope.instances,
                scope.dropped,
                scope.file_owners,
                (!scope.inspected).then_some(scope.traces),
            );
        };
        let (haproxy_cfg, mut files, spans, pres) = outputs?;
        let mut dropped = dropped;
        dropped.sort_by(|a, b| a.owner.cmp(&b.owner));
        cache.sweep();
        // Each instance's key and owner move into its span; only an instance printed more than
        // once is cloned. (Cloning every one touches each unit's counts again, long after they
        // left the cache: a cache miss per unit in a large render.)
        let mut left = vec![0u32; instances.len()];
        for (_, id, _, _) in &spans {
            if let Some(n) = left.get_mut(*id) {
                *n += 1;
            }
        }
        let mut instances: Vec<Option<units::Instance>> = instances.into_iter().map(Some).collect();
        let units = spans
            .into_iter()
            .filter_map(|(output, id, first, last)| {
                let n = left.get_mut(id)?;
                *n -= 1;
                let slot = instances.get_mut(id)?;
                let i = if *n == 0 { slot.take() } else { slot.clone() }?;
                Some(UnitSpan {
                    unit: i.unit,
                    owner: i.owner,
                    output,
                    first,
                    last,
                    fresh: i.fresh,
                })
            })
            .collect();
        for registered in registry.take() {
            if let Some(clash) = files.iter().find(|f| f.path == registered.path) {
                return Err(RenderError {
                    template: clash.name.clone(),
                    line: None,
                    message: format!(
                        "{} is produced both by template {} and by files.register",
                        registered.path, clash.name
                    ),
                    from_fail: false,
                });
            }
            let name = registered
                .path
                .rsplit('/')
                .next()
                .unwrap_or_default()
                .to_string();
            files.push(RenderedFile {
                kind: registered.kind,
                name,
                path: registered.path,
                content: Arc::new(registered.content),
            });
        }
        files.sort_by(|a, b| a.path.cmp(&b.path));
        let rendered = Rendered {
            haproxy_cfg: Arc::new(haproxy_cfg),
            files,
            statuses: Arc::new(status.take()),
            units: Arc::new(units),
            dropped,
            file_owners,
        };
        if let Some(traces) = traces.filter(|_| !cache.once) {
            let names: Vec<(String, Option<String>)> = self
                .outputs
                .iter()
                .map(|o| {
                    (
                        o.name.clone(),
                        o.kind.and_then(|k| paths.get(&o.name, k).ok()),
                    )
                })
                .collect();
            cache.last = splice::LastRender::build(
                traces,
                pres,
                cache,
                &rendered,
                &names,
                passes > 1,
                inputs,
            )
            .map(Box::new);
        }
        Ok(rendered)
    }

    /// Renders every output template in order; returns haproxy.cfg, the files, the unit
    /// spans `(output, instance, first line, last line)`, and (with `keep_pre`, for splicing)
    /// each output's text before post-processing.
    #[allow(clippy::type_complexity)]
    fn render_outputs(
        &self,
        ctx: &Value,
        paths: &Paths,
        keep_pre: bool,
    ) -> Result<
        (
            String,
            Vec<RenderedFile>,
            Vec<(Arc<str>, usize, usize, usize)>,
            Vec<splice::Pre>,
        ),
        RenderError,
    > {
        let mut haproxy_cfg = String::new();
        let mut files = Vec::new();
        let mut spans = Vec::new();
        let mut pres = Vec::new();
        for output in &self.outputs {
            let template = self
                .env
                .get_template(&output.name)
                .map_err(|e| RenderError::from_minijinja(&output.name, &e, self.fuel))?;
            let started = std::time::Instant::now();
            units::begin_output();
            let text = template.render(ctx);
            units::end_output();
            let text =
                text.map_err(|e| RenderError::from_minijinja(&output.name, &e, self.fuel))?;
            log::debug!(
                "rendered template={} ms={:.1}",
                output.name,
                started.elapsed().as_secs_f64() * 1000.0
            );
            let (pre, marks) = units::strip_markers(&text);
            // The marked text is the largest of the three (it has its buffer's slack).
            drop(text);
            let name: Arc<str> = Arc::from(output.name.as_str());
            spans.extend(marks.iter().map(|m| (name.clone(), m.id, m.first, m.last)));
            let text = post_process(&pre, &output.post);
            if keep_pre {
                pres.push(splice::Pre { text: pre, marks });
            }
            match output.kind {
                None => haproxy_cfg = text,
                Some(kind) => {
                    let path = paths
                        .get(&output.name, kind)
                        .map_err(|message| RenderError {
                            template: output.name.clone(),
                            line: None,
                            message,
                            from_fail: false,
                        })?;
                    files.push(RenderedFile {
                        kind,
                        name: output.name.clone(),
                        path,
                        content: Arc::new(text),
                    });
                }
            }
        }
        Ok((haproxy_cfg, files, spans, pres))
    }

    /// Installs the units scope of one render (or one unit rendered alone): fresh file
    /// registry and status collector, the given `shared`; returns the root context with them.
    fn enter_scope(
        &self,
        inputs: &RenderInputs,
        paths: &Paths,
        shared: Arc<Shared>,
        cache: RenderCache,
        failed: HashMap<Owner, String>,
    ) -> (Value, Arc<FileRegistry>, Arc<StatusCollector>) {
        let registry = Arc::new(FileRegistry::new(paths.clone()));
        let status = Arc::new(StatusCollector::default());
        let ctx = self.context(
            inputs,
            paths.clone(),
            registry.clone(),
            status.clone(),
            shared.clone(),
        );
        units::enter(units::Scope::new(
            ctx.clone(),
            shared,
            status.clone(),
            registry.clone(),
            inputs,
            cache,
            failed,
        ));
        (ctx, registry, status)
    }

    fn context(
        &self,
        inputs: &RenderInputs,
        paths: Paths,
        registry: Arc<FileRegistry>,
        status: Arc<StatusCollector>,
        shared: Arc<Shared>,
    ) -> Value {
        let mut ctx: BTreeMap<String, Value> = BTreeMap::new();
        // extraContext keys come first so the built-in names below always win over them. They
        // are the admin's settings, but plain strings: a template prints one that is not plain
        // (`bind_address: '"${POD_IP}"'`) with `| safe`. Making them safe strings would make
        // every `"literal text " ~ setting` a markup concatenation that refuses the literal.
        for (key, value) in &inputs.extra_context {
            ctx.insert(key.clone(), Value::from(minijinja::value::Serde(value)));
        }
        ctx.insert(
            "extraContext".into(),
            Value::from(minijinja::value::Serde(&inputs.extra_context)),
        );
        ctx.insert(
            "resources".into(),
            Value::from_object(Resources::new(&inputs.stores)),
        );
        let pods = inputs
            .stores
            .get(HAPROXY_PODS)
            .cloned()
            .unwrap_or_else(|| Arc::new(Store::new(pod_index())));
        let pods = Value::from_object(objects::StoreView {
            name: HAPROXY_PODS.into(),
            store: pods,
        });
        ctx.insert(
            "controller".into(),
            Value::from(BTreeMap::from([("haproxy_pods".to_string(), pods)])),
        );
        ctx.insert("paths".into(), Value::from_object(paths));
        ctx.insert("files".into(), Value::from_dyn_object(registry));
        ctx.insert("shared".into(), Value::from_dyn_object(shared));
        ctx.insert("status".into(), Value::from_dyn_object(status));
        let current = inputs
            .current_config
            .as_ref()
            .map(|c| c.value())
            .unwrap_or_else(CurrentConfig::empty_value);
        ctx.insert("current_config".into(), current);
        objects::RenderContext::value(ctx)
    }
}

/// The index of the auto-injected HAProxy pods store.
pub fn pod_index() -> Vec<crate::store::path::PathExpr> {
    ["metadata.namespace", "metadata.name"]
        .iter()
        .filter_map(|p| crate::store::path::PathExpr::parse(p).ok())
        .collect()
}

#[cfg(test)]
mod tests;
