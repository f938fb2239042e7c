//! The reconciler (every replica, so a standby is warm): leading-edge debounce, render,
//! classify against the last validated bundle, `haproxy -c` unless the change is runtime-only,
//! then publish to the deployer. A failed render or validation keeps the last good bundle.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver, Sender};
use haptic_agent::classify::{classify, Classification};
use haptic_agent::protocol::Bundle;

use super::state::{lock, ActiveConfig, Shared};
use super::status::StatusMsg;
use super::watchers::Watchers;
use crate::config::model::HAPROXY_PODS;
use crate::deploy::{DeployMsg, Published};
use crate::kube::reflector::ReflectorEvent;
use crate::metrics::Stage;
use crate::render::current_config::CurrentConfig;
use crate::render::{RenderCache, RenderInputs};
use crate::validate::haproxy::check_bundle;
use crate::validate::isolate::{render_validated, Failure};

pub(crate) enum ControlMsg {
    Config(Arc<ActiveConfig>),
    /// The deployed config as last published (HAProxyCfg), to keep server slots stable.
    CurrentConfig(String),
    /// This replica leads now (the term of `epoch`), with the haproxy.cfg and bundle hash the
    /// previous leader published (`None`: none could be read). A standby's server slots follow
    /// its own renders, which can differ from what the pods run (its renders saw the changes in
    /// other windows): when the published bundle is not its own but is what a pod runs, it
    /// takes the published slots and renders again, then releases the deployer's term (whose
    /// pushes wait for it), so that the first push keeps the pods' slots.
    Leading {
        epoch: u64,
        published: Option<(String, String)>,
    },
    Shutdown,
}

pub(crate) struct Reconciler {
    pub shared: Arc<Shared>,
    pub watchers: Arc<Mutex<Watchers>>,
    pub store_events: Receiver<ReflectorEvent>,
    pub control: Receiver<ControlMsg>,
    pub deployer: Sender<DeployMsg>,
    pub status: Sender<StatusMsg>,
    pub haproxy_bin: String,
    /// The release of `haproxy_bin` (`haproxy -v`), sent with the bundles it checked.
    pub haproxy_release: String,
}

struct Loop {
    config: Option<Arc<ActiveConfig>>,
    pending: bool,
    first_change: Option<Instant>,
    last_render: Option<Instant>,
    /// How long after `last_render` the next render may start ([`next_interval`]).
    interval: Option<Duration>,
    /// Store events since the last render: how busy the window before the next render was.
    events: usize,
    last_validated: Option<Bundle>,
    current_config: Option<Arc<CurrentConfig>>,
    /// `current_config` was taken from the published config, not from `last_validated`: the
    /// next one is parsed in full rather than updated from `last_validated`.
    adopted: bool,
    /// The leader term to release to the deployer once a render with the adopted slots has
    /// been sent to it (the deployer stops waiting after `plan::TAKEOVER_HOLD` anyway).
    release: Option<u64>,
    /// Memoized render units and the objects left out after failed checks (DESIGN §4).
    cache: RenderCache,
}

/// The longest a reconciler waits between renders during a burst, in debounce intervals.
const MAX_BACKOFF: u32 = 8;

/// A window between two renders with at least this many store events is part of a burst.
/// A change made on its own (an endpoint moving, a route added) is one or two events, so
/// changes made one after another never back off.
const BURST_EVENTS: usize = 4;

/// How long to wait after a render before the next one may start. `base` is the debounce
/// interval, `interval` the wait before this render, `since_last` the time since the previous
/// render and `events` the store events since then. Leading edge: a change after a quiet spell
/// renders at once and the wait is `base`. A window that collected a burst of events (a
/// rollout, a mass update) quadruples the wait, up to [`MAX_BACKOFF`] × `base`, so that a burst
/// costs a few renders, each covering many changes; the first window with few events goes
/// back to `base`.
fn next_interval(
    base: Duration,
    interval: Duration,
    since_last: Option<Duration>,
    events: usize,
) -> Duration {
    let quiet = since_last.is_none_or(|since| since >= interval * 2);
    if quiet || events < BURST_EVENTS {
        return base;
    }
    (interval * 4).min(base * MAX_BACKOFF).max(base)
}

impl Reconciler {
    pub(crate) fn run(self) {
        let mut s = Loop {
            config: None,
            pending: false,
            first_change: None,
            last_render: None,
            interval: None,
            events: 0,
            last_validated: None,
            current_config: None,
            adopted: false,
            release: None,
            cache: RenderCache::new(),
        };
        loop {
            let timeout = self.next_timeout(&s);
            select! {
                recv(self.store_events) -> ev => match ev {
                    Ok(ev) => self.on_store_event(&mut s, ev),
                    Err(_) => return,
                },
                recv(self.control) -> msg => match msg {
                    Ok(ControlMsg::Config(c)) => {
                        s.config = Some(c);
                        s.pending = true;
                        s.first_change.get_or_insert_with(Instant::now);
                        s.last_render = None; // a new config renders at once
                        s.interval = None;
                    }
                    Ok(ControlMsg::CurrentConfig(text)) => {
                        if s.current_config.is_none() {
                            s.current_config = Some(Arc::new(CurrentConfig::parse(&text)));
                        }
                    }
                    Ok(ControlMsg::Leading { epoch, published }) => {
                        // A read for an earlier term that arrives late (each term reads on a
                        // thread of its own) is out of date.
                        if self.shared.leadership().epoch() == Some(epoch)
                            && !self.take_over(&mut s, published, epoch)
                        {
                            let _ = self.deployer.send(DeployMsg::Release(epoch));
                        }
                    }
                    Ok(ControlMsg::Shutdown) | Err(_) => return,
                },
                default(timeout) => {}
            }
            self.maybe_render(&mut s);
        }
    }

    /// Adopts the published slots when the published bundle is not this replica's own last
    /// one and an admitted pod runs it (the object may lag, or be edited), and renders with
    /// them at once (when it can: a config, and every store synced).
    /// Returns whether it adopted them: the term of `epoch` is then released by the render
    /// that uses them (or by its failure), else the caller releases it at once.
    fn take_over(&self, s: &mut Loop, published: Option<(String, String)>, epoch: u64) -> bool {
        let Some((text, bundle)) = published else {
            return false;
        };
        let own = s.last_validated.as_ref().map(|b| b.hash());
        if own.as_ref().is_some_and(|h| h.as_str() == bundle) {
            return false;
        }
        let running = lock(&self.shared.pods)
            .iter()
            .any(|p| p.admitted && p.applied_bundle.as_deref() == Some(bundle.as_str()));
        if !running {
            log::info!(
                "leading: the published bundle={} is not what the pods run; keeping this replica's server slots",
                bundle.get(..12).unwrap_or(&bundle)
            );
            return false;
        }
        log::info!(
            "leading: taking the server slots of the published bundle={} (this replica's last: {})",
            bundle.get(..12).unwrap_or(&bundle),
            own.as_ref()
                .map_or("none", |h| h.as_str().get(..12).unwrap_or("?"))
        );
        s.current_config = Some(Arc::new(CurrentConfig::parse(&text)));
        s.adopted = true;
        s.pending = true;
        s.first_change.get_or_insert_with(Instant::now);
        s.last_render = None;
        s.release = Some(epoch);
        self.maybe_render(s);
        true
    }

    /// Releases the deployer's leader term waiting for a render with adopted slots, if any.
    fn release_term(&self, s: &mut Loop) {
        if let Some(epoch) = s.release.take() {
            let _ = self.deployer.send(DeployMsg::Release(epoch));
        }
    }

    fn next_timeout(&self, s: &Loop) -> Duration {
        let Some(config) = &s.config else {
            return Duration::from_millis(500);
        };
        if !s.pending {
            return Duration::from_millis(500);
        }
        match s.last_render {
            Some(last) => (last
                + s.interval
                    .unwrap_or_else(|| config.spec.debounce_interval()))
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1)),
            None => Duration::from_millis(20),
        }
    }

    fn on_store_event(&self, s: &mut Loop, ev: ReflectorEvent) {
        let name = match &ev {
            ReflectorEvent::Changed { name } => name.clone(),
            ReflectorEvent::Relisted { name, reason } => {
                self.shared
                    .metrics
                    .inc(&crate::metrics::WATCH_RESTARTS_TOTAL, [name]);
                log::debug!("resource={name} relisted: {reason}");
                name.clone()
            }
        };
        self.shared
            .metrics
            .inc(&crate::metrics::WATCH_EVENTS_TOTAL, [&name]);
        if name == HAPROXY_PODS {
            if let Some(pods) = lock(&self.watchers).store(HAPROXY_PODS) {
                let _ = self
                    .deployer
                    .send(DeployMsg::Pods(crate::deploy::pods::targets(&pods)));
            }
        }
        s.pending = true;
        s.events += 1;
        s.first_change.get_or_insert_with(Instant::now);
    }

    fn maybe_render(&self, s: &mut Loop) {
        let Some(config) = s.config.clone() else {
            return;
        };
        if !s.pending {
            return;
        }
        // Debounce first: snapshots are taken only for a render that happens now.
        let base = config.spec.debounce_interval();
        let interval = s.interval.unwrap_or(base);
        if s.last_render.is_some_and(|last| last.elapsed() < interval) {
            return;
        }
        // Changes already queued are in the snapshot about to be taken (a reflector writes its
        // store before it sends the event): take them now, so that they do not cause another
        // render of the same state (a burst of events would otherwise cost a render more).
        while let Ok(ev) = self.store_events.try_recv() {
            self.on_store_event(s, ev);
        }
        let stores = {
            let w = lock(&self.watchers);
            let barrier = w.barrier();
            if !barrier.is_synced() {
                self.shared.set_phase(format!(
                    "waiting for the initial list of: {}",
                    barrier.pending().join(", ")
                ));
                return;
            }
            w.snapshot()
        };
        if !self.shared.synced.swap(true, Ordering::SeqCst) {
            log::info!("all watched resources synced");
        }
        s.pending = false;
        let next = next_interval(base, interval, s.last_render.map(|l| l.elapsed()), s.events);
        if next > interval {
            log::debug!(
                "a burst of changes ({} since the last render): the next render waits {} ms",
                s.events,
                next.as_millis()
            );
        }
        s.interval = Some(next);
        s.events = 0;
        s.last_render = Some(Instant::now());
        let first_change = s.first_change.take().unwrap_or_else(Instant::now);
        *lock(&self.shared.store_counts) =
            stores.iter().map(|(n, st)| (n.clone(), st.len())).collect();
        self.shared.metrics.set_all(
            &crate::metrics::RESOURCE_OBJECTS,
            stores
                .iter()
                .map(|(n, st)| ([n.as_str()], st.len() as f64))
                .collect(),
        );
        self.shared.set_phase("running");
        self.render(s, &config, stores, first_change);
    }

    fn render(
        &self,
        s: &mut Loop,
        config: &ActiveConfig,
        stores: std::collections::BTreeMap<String, Arc<crate::store::Store>>,
        first_change: Instant,
    ) {
        let metrics = &self.shared.metrics;
        let started = Instant::now();
        metrics.inc(&crate::metrics::RECONCILIATION_TOTAL, []);
        let inputs = RenderInputs {
            stores,
            extra_context: config.spec.templating_settings.extra_context.clone(),
            current_config: s.current_config.clone(),
            base_dir: None,
        };
        // Render (replaying unchanged units), then check with haproxy -c unless the change is
        // runtime-only and brings no certificate (Classification::needs_check); objects whose configuration the check rejects are left out, and the
        // rest goes ahead (validate::isolate).
        // The classification of the bundle the loop settles on, kept for the deploy decision.
        let last = s.last_validated.as_ref();
        let mut last_class = None;
        let mut needs_check = |bundle: &Bundle| {
            let class = last.map(|old| classify(old, bundle));
            let check = class.as_ref().is_none_or(Classification::needs_check);
            last_class = Some(class);
            check
        };
        let haproxy_bin = self.haproxy_bin.clone();
        // Time in `haproxy -c`, which the render's own duration leaves out.
        let mut checking = Duration::ZERO;
        let mut check = |bundle: &Bundle| {
            let check_started = Instant::now();
            let result = check_bundle(&haproxy_bin, bundle);
            let took = check_started.elapsed();
            checking += took;
            metrics.observe(
                &crate::metrics::VALIDATION_DURATION_SECONDS,
                [],
                took.as_secs_f64(),
            );
            result
        };
        let render_started = Instant::now();
        let validated = render_validated(
            &config.engine,
            &inputs,
            &mut s.cache,
            &mut needs_check,
            &mut check,
        );
        metrics.observe(
            &crate::metrics::RENDER_DURATION_SECONDS,
            [],
            render_started
                .elapsed()
                .saturating_sub(checking)
                .as_secs_f64(),
        );
        let validated = match validated {
            Ok(v) => v,
            Err(Failure::Render(e)) => {
                return self.failed(s, Stage::Render, e.to_string(), started)
            }
            Err(Failure::Check(e)) => {
                return self.failed(s, Stage::Validate, e.to_string(), started)
            }
        };
        let checks = validated.checks;
        // The bundle passed this replica's `haproxy -c` (not only an earlier one of this loop).
        let checked = validated.warnings.is_some();
        let rendered = validated.rendered;
        let bundle = validated.bundle;
        metrics.set(
            &crate::metrics::DROPPED_OBJECTS,
            [],
            rendered.dropped.len() as f64,
        );
        let _ = self
            .status
            .send(StatusMsg::TemplateStatuses(rendered.statuses.clone()));
        let _ = self
            .status
            .send(StatusMsg::Dropped(rendered.dropped.clone()));
        let hash = bundle.hash();
        if s.last_validated.as_ref().is_some_and(|b| b.hash() == hash) {
            if s.adopted {
                // The adopted slots give this replica's own last bundle: nothing to push.
                s.current_config = Some(Arc::new(CurrentConfig::parse(&bundle.haproxy_cfg)));
                s.adopted = false;
            }
            self.release_term(s);
            self.succeeded(s, &bundle, started);
            return;
        }
        let class = last_class
            .flatten()
            .or_else(|| s.last_validated.as_ref().map(|old| classify(old, &bundle)));
        let reload = !matches!(
            class,
            Some(Classification::NoChange) | Some(Classification::Runtime(_))
        );
        let stats = s.cache.stats;
        log::info!(
            "bundle={} rendered class={} config_bytes={} files={} checks={checks} units={} ({} rendered, {}) in {} ms",
            &hash.as_str()[..12],
            class.as_ref().map(|c| c.result_name()).unwrap_or("initial"),
            bundle.haproxy_cfg.len(),
            bundle.files.len(),
            stats.replayed + stats.rendered,
            stats.rendered,
            if stats.spliced { "spliced" } else { "full" },
            started.elapsed().as_millis()
        );
        // The next render's current_config: from the last one when it is the parse of the last
        // validated bundle (only the sections that changed are parsed again).
        let next = match (&s.current_config, &s.last_validated) {
            (Some(current), Some(last)) if !s.adopted => {
                current.update(&last.haproxy_cfg, &bundle.haproxy_cfg)
            }
            _ => CurrentConfig::parse(&bundle.haproxy_cfg),
        };
        s.current_config = Some(Arc::new(next));
        s.adopted = false;
        let published = Arc::new(Published {
            bundle: bundle.clone(),
            hash: hash.clone(),
            reload,
            checked_with: checked.then(|| self.haproxy_release.clone()),
            first_change,
        });
        let _ = self.deployer.send(DeployMsg::Bundle(published.clone()));
        self.release_term(s);
        let _ = self.status.send(StatusMsg::Published(published));
        s.last_validated = Some(bundle.clone());
        self.succeeded(s, &bundle, started);
    }

    fn succeeded(&self, _s: &mut Loop, bundle: &Bundle, started: Instant) {
        let metrics = &self.shared.metrics;
        metrics.observe(
            &crate::metrics::RECONCILIATION_DURATION_SECONDS,
            [],
            started.elapsed().as_secs_f64(),
        );
        metrics.set(
            &crate::metrics::CONFIG_BYTES,
            [],
            bundle.haproxy_cfg.len() as f64,
        );
        let mut render = lock(&self.shared.render);
        let recovered = render.last_error.take();
        render.bundle = Some(bundle.hash().to_string());
        render.haproxy_cfg = Some(bundle.haproxy_cfg.clone());
        render.last_success_at = Some(crate::kube::lease::rfc3339(std::time::SystemTime::now()));
        render.renders += 1;
        drop(render);
        if let Some(previous) = recovered {
            log::info!("reconciliation recovered (previous error: {previous})");
            self.shared
                .record("recovered: rendering and validation succeed again");
        }
        let _ = self.status.send(StatusMsg::Reconciled { error: None });
    }

    fn failed(&self, s: &mut Loop, stage: Stage, error: String, started: Instant) {
        // A term waiting for a render with the adopted slots gets none: the deployer goes on
        // with the bundle it has.
        self.release_term(s);
        let stage = stage.as_str();
        let metrics = &self.shared.metrics;
        metrics.inc(&crate::metrics::RECONCILIATION_ERRORS_TOTAL, [stage]);
        metrics.observe(
            &crate::metrics::RECONCILIATION_DURATION_SECONDS,
            [],
            started.elapsed().as_secs_f64(),
        );
        log::error!("{stage} failed; keeping the last good configuration: {error}");
        let mut render = lock(&self.shared.render);
        let repeated = render.last_error.as_deref() == Some(error.as_str());
        render.last_error = Some(error.clone());
        drop(render);
        if !repeated {
            self.shared.record(format!("{stage} failed: {error}"));
        }
        let _ = self.status.send(StatusMsg::Reconciled {
            error: Some((stage.to_string(), error)),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::{next_interval, MAX_BACKOFF};
    use std::time::Duration;

    const BASE: Duration = Duration::from_millis(50);

    /// The render times (ms) of the reconciler's gate for store events at `events` (sorted):
    /// a pending change renders at once, or `interval` after the previous render, and that
    /// render takes in every event so far.
    fn renders(base: Duration, events: &[Duration]) -> Vec<u128> {
        let (mut out, mut last, mut interval) = (Vec::new(), None::<Duration>, base);
        let mut next = 0;
        while next < events.len() {
            let due = last.map_or(events[next], |l| (l + interval).max(events[next]));
            let taken = events[next..].iter().take_while(|t| **t <= due).count();
            interval = next_interval(base, interval, last.map(|l| due - l), taken);
            out.push(due.as_millis());
            (last, next) = (Some(due), next + taken);
        }
        out
    }

    fn every(step: Duration, n: u32) -> Vec<Duration> {
        (0..n).map(|i| step * i).collect()
    }

    #[test]
    fn changes_made_one_after_another_never_back_off() {
        // A user (or the latency benchmark) makes a change, sees it served 25 ms after its
        // render, and makes the next; each change is one or two store events (an object and,
        // for some, a status write coming back). No change waits longer than the debounce
        // interval.
        for per_change in [1, 2, 3] {
            let (mut last, mut interval, mut t) = (None::<Duration>, BASE, Duration::ZERO);
            for _ in 0..50 {
                let due = last.map_or(t, |l| (l + interval).max(t));
                assert!(due - t <= BASE, "a change waited {:?}", due - t);
                interval = next_interval(BASE, interval, last.map(|l| due - l), per_change);
                last = Some(due);
                t = due + Duration::from_millis(25);
            }
        }
    }

    #[test]
    fn a_burst_costs_a_few_renders_and_waits_at_most_the_cap() {
        // 1,000 updates sent in 400 ms (the latency benchmark's burst, debounce 50 ms).
        assert_eq!(
            renders(BASE, &every(Duration::from_micros(400), 1000)),
            [0, 50, 250, 650]
        );
        // 1,000 spread over a second with the default debounce interval (100 ms).
        assert_eq!(
            renders(
                Duration::from_millis(100),
                &every(Duration::from_millis(1), 1000)
            ),
            [0, 100, 500, 1300]
        );
        // A stream that goes on: renders every MAX_BACKOFF intervals, never fewer.
        let r = renders(BASE, &every(Duration::from_millis(1), 5000));
        assert!(
            r.windows(2)
                .all(|w| w[1] - w[0] <= (BASE * MAX_BACKOFF).as_millis()),
            "{r:?}"
        );
        assert_eq!(r.len(), 15, "{r:?}");
    }

    #[test]
    fn after_a_burst_a_quiet_spell_goes_back_to_the_debounce_interval() {
        let mut events = every(Duration::from_micros(400), 1000);
        // A change well after the burst renders at once, and the one after it within the
        // debounce interval.
        events.push(Duration::from_millis(2000));
        events.push(Duration::from_millis(2010));
        let r = renders(BASE, &events);
        assert_eq!(&r[r.len() - 2..], [2000, 2050]);
        // A quiet spell is measured against the wait in force: twice it, at least.
        assert_eq!(
            next_interval(BASE, BASE * 8, Some(BASE * 16), 100),
            BASE,
            "a burst after a quiet spell starts at the debounce interval"
        );
        assert_eq!(next_interval(BASE, BASE * 8, Some(BASE * 8), 100), BASE * 8);
        assert_eq!(next_interval(BASE, BASE * 8, Some(BASE * 8), 1), BASE);
        // No debounce stays no debounce.
        assert_eq!(
            next_interval(Duration::ZERO, Duration::ZERO, Some(Duration::ZERO), 100),
            Duration::ZERO
        );
    }
}
