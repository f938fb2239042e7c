//! A small Prometheus registry: counters, gauges and histograms with labels, encoded in the text
//! format 0.0.4 (`haptic_` prefix). Process metrics are read from `/proc` at scrape time.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::{Arc, Mutex};

type Labels = Vec<(String, String)>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

#[derive(Debug, Clone, Default)]
struct Samples {
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

#[derive(Debug)]
struct Family {
    help: &'static str,
    kind: Kind,
    buckets: &'static [f64],
    values: BTreeMap<Labels, f64>,
    histograms: BTreeMap<Labels, Samples>,
}

/// Duration buckets in seconds, from 1 ms to 60 s.
pub(crate) const DURATION_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

#[derive(Debug, Clone, Default)]
pub(crate) struct Registry {
    families: Arc<Mutex<BTreeMap<&'static str, Family>>>,
}

fn labels<const N: usize>(names: &[&'static str; N], values: [&str; N]) -> Labels {
    let mut l: Labels = names
        .iter()
        .zip(values)
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    l.sort();
    l
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn format_labels(labels: &Labels, extra: Option<(&str, String)>) -> String {
    let mut parts: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect();
    if let Some((k, v)) = extra {
        parts.push(format!("{k}=\"{v}\""));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", parts.join(","))
    }
}

fn format_value(v: f64) -> String {
    if v.is_infinite() {
        if v > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        }
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

impl Registry {
    fn with<R>(
        &self,
        name: &'static str,
        help: &'static str,
        kind: Kind,
        buckets: &'static [f64],
        f: impl FnOnce(&mut Family) -> R,
    ) -> R {
        let mut families = crate::lock(&self.families);
        let family = families.entry(name).or_insert_with(|| Family {
            help,
            kind,
            buckets,
            values: BTreeMap::new(),
            histograms: BTreeMap::new(),
        });
        f(family)
    }

    /// Declares a counter so it is exported (with no samples) before its first use.
    pub(crate) fn describe<const N: usize>(&self, metric: &Counter<N>) {
        self.with(metric.name, metric.help, Kind::Counter, &[], |_| ());
    }

    /// Exports a counter's series at 0 before its first event, so that `increase()` and
    /// `rate()` see that first event (Prometheus cannot tell a new series' first value from a
    /// count it missed).
    pub(crate) fn zero<const N: usize>(&self, metric: &Counter<N>, values: [&str; N]) {
        self.with(metric.name, metric.help, Kind::Counter, &[], |f| {
            f.values
                .entry(labels(&metric.labels, values))
                .or_insert(0.0);
        });
    }

    pub(crate) fn inc<const N: usize>(&self, metric: &Counter<N>, values: [&str; N]) {
        self.with(metric.name, metric.help, Kind::Counter, &[], |f| {
            *f.values
                .entry(labels(&metric.labels, values))
                .or_insert(0.0) += 1.0
        });
    }

    pub(crate) fn set<const N: usize>(&self, metric: &Gauge<N>, values: [&str; N], v: f64) {
        self.with(metric.name, metric.help, Kind::Gauge, &[], |f| {
            f.values.insert(labels(&metric.labels, values), v);
        });
    }

    /// Replaces every sample of a gauge (for per-object gauges whose label sets change).
    pub(crate) fn set_all<const N: usize>(
        &self,
        metric: &Gauge<N>,
        samples: Vec<([&str; N], f64)>,
    ) {
        self.with(metric.name, metric.help, Kind::Gauge, &[], |f| {
            f.values = samples
                .into_iter()
                .map(|(values, v)| (labels(&metric.labels, values), v))
                .collect();
        });
    }

    pub(crate) fn observe<const N: usize>(&self, metric: &Histogram<N>, values: [&str; N], v: f64) {
        self.with(
            metric.name,
            metric.help,
            Kind::Histogram,
            metric.buckets,
            |f| {
                let h = f
                    .histograms
                    .entry(labels(&metric.labels, values))
                    .or_insert_with(|| Samples {
                        counts: vec![0; f.buckets.len()],
                        ..Default::default()
                    });
                for (i, bound) in f.buckets.iter().enumerate() {
                    if v <= *bound {
                        h.counts[i] += 1;
                    }
                }
                h.sum += v;
                h.count += 1;
            },
        );
    }

    /// The value of a gauge sample.
    #[cfg(test)]
    pub(crate) fn value<const N: usize>(
        &self,
        metric: &Gauge<N>,
        values: [&str; N],
    ) -> Option<f64> {
        let families = crate::lock(&self.families);
        families
            .get(metric.name)?
            .values
            .get(&labels(&metric.labels, values))
            .copied()
    }

    pub(crate) fn encode(&self) -> String {
        let mut out = String::new();
        let families = crate::lock(&self.families);
        for (name, family) in families.iter() {
            let kind = match family.kind {
                Kind::Counter => "counter",
                Kind::Gauge => "gauge",
                Kind::Histogram => "histogram",
            };
            let _ = writeln!(out, "# HELP {name} {}", family.help);
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (l, v) in &family.values {
                let _ = writeln!(out, "{name}{} {}", format_labels(l, None), format_value(*v));
            }
            for (l, h) in &family.histograms {
                for (i, bound) in family.buckets.iter().enumerate() {
                    let _ = writeln!(
                        out,
                        "{name}_bucket{} {}",
                        format_labels(l, Some(("le", format_value(*bound)))),
                        h.counts[i]
                    );
                }
                let _ = writeln!(
                    out,
                    "{name}_bucket{} {}",
                    format_labels(l, Some(("le", "+Inf".into()))),
                    h.count
                );
                let _ = writeln!(
                    out,
                    "{name}_sum{} {}",
                    format_labels(l, None),
                    format_value(h.sum)
                );
                let _ = writeln!(out, "{name}_count{} {}", format_labels(l, None), h.count);
            }
        }
        drop(families);
        out.push_str(&process_metrics());
        out
    }
}

/// `process_*` metrics from /proc (resident memory, CPU seconds, open fds, start time).
fn process_metrics() -> String {
    let mut out = String::new();
    let ticks = 100.0; // USER_HZ on Linux
    let page = 4096.0;
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name; the name itself may contain spaces.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let field = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok());
    let boot_time = std::fs::read_to_string("/proc/stat")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("btime ")
                .and_then(|v| v.trim().parse::<f64>().ok())
        });
    if let (Some(utime), Some(stime)) = (field(11), field(12)) {
        let _ = write!(out, "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total {}\n", (utime + stime) / ticks);
    }
    if let Some(rss) = field(21) {
        let _ = write!(out, "# HELP process_resident_memory_bytes Resident memory size in bytes.\n# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes {}\n", format_value(rss * page));
    }
    if let (Some(start), Some(boot)) = (field(19), boot_time) {
        let _ = write!(out, "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.\n# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds {}\n", format_value(boot + start / ticks));
    }
    if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
        let _ = write!(out, "# HELP process_open_fds Number of open file descriptors.\n# TYPE process_open_fds gauge\nprocess_open_fds {}\n", dir.count());
    }
    out
}

/// The reconciliation stage that failed (`haptic_reconciliation_errors_total{stage}` and the
/// config's status).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    Render,
    Validate,
}

impl Stage {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Stage::Render => "render",
            Stage::Validate => "validate",
        }
    }
}

/// A counter family: name, help text and label names, declared once in the catalogue below.
#[derive(Debug)]
pub(crate) struct Counter<const N: usize> {
    pub name: &'static str,
    pub help: &'static str,
    pub labels: [&'static str; N],
}

/// A gauge family.
#[derive(Debug)]
pub(crate) struct Gauge<const N: usize> {
    pub name: &'static str,
    pub help: &'static str,
    pub labels: [&'static str; N],
}

/// A histogram family with its buckets.
#[derive(Debug)]
pub(crate) struct Histogram<const N: usize> {
    pub name: &'static str,
    pub help: &'static str,
    pub labels: [&'static str; N],
    pub buckets: &'static [f64],
}

// The catalogue: every family the controller exports (docs/operations.md lists them). The type
// says what may be done with a family (a counter is only incremented) and how many label values
// each sample takes.
pub(crate) const DRIFT_DETECTED_TOTAL: Counter<0> = Counter {
    name: "haptic_drift_detected_total",
    help: "Pods found running another bundle than the one deployed to them.",
    labels: [],
};
pub(crate) const ADMITTED_PODS: Gauge<0> = Gauge {
    name: "haptic_admitted_pods",
    help: "HAProxy pods admitted for deployment.",
    labels: [],
};
pub(crate) const DEPLOYMENT_TOTAL: Counter<1> = Counter {
    name: "haptic_deployment_total",
    help: "Bundle pushes to HAProxy pods by result.",
    labels: ["result"],
};
pub(crate) const DEPLOYMENT_ERRORS_TOTAL: Counter<0> = Counter {
    name: "haptic_deployment_errors_total",
    help: "Failed bundle pushes to HAProxy pods.",
    labels: [],
};
pub(crate) const DEPLOYMENT_DURATION_SECONDS: Histogram<0> = Histogram {
    name: "haptic_deployment_duration_seconds",
    help: "Time to push one bundle to the pods that needed it, from its first push until none is under way.",
    labels: [],
    buckets: DURATION_BUCKETS,
};
pub(crate) const CHANGE_TO_DEPLOYED_SECONDS: Histogram<0> = Histogram {
    name: "haptic_change_to_deployed_seconds",
    help: "From the first change seen to the bundle applied on every admitted pod.",
    labels: [],
    buckets: DURATION_BUCKETS,
};
pub(crate) const WEBHOOK_REQUESTS_TOTAL: Counter<1> = Counter {
    name: "haptic_webhook_requests_total",
    help: "Admission webhook requests by result.",
    labels: ["result"],
};
pub(crate) const BUILD_INFO: Gauge<2> = Gauge {
    name: "haptic_build_info",
    help: "Build information.",
    labels: ["version", "commit"],
};
pub(crate) const CHECK_SANDBOX: Gauge<0> = Gauge {
    name: "haptic_check_sandbox",
    help: "The Landlock ABI version haproxy -c is sandboxed with; 0: the kernel has none and checks run unsandboxed.",
    labels: [],
};
pub(crate) const LEADER_ELECTION_IS_LEADER: Gauge<0> = Gauge {
    name: "haptic_leader_election_is_leader",
    help: "1 while this replica leads.",
    labels: [],
};
pub(crate) const LEADER_ELECTION_TRANSITIONS_TOTAL: Counter<0> = Counter {
    name: "haptic_leader_election_transitions_total",
    help: "Leadership changes of this replica.",
    labels: [],
};
pub(crate) const CONFIG_ERRORS_TOTAL: Counter<0> = Counter {
    name: "haptic_config_errors_total",
    help: "HAProxyTemplateConfig changes refused as invalid.",
    labels: [],
};
pub(crate) const WATCH_RESTARTS_TOTAL: Counter<1> = Counter {
    name: "haptic_watch_restarts_total",
    help: "Re-lists of a watched resource (410, errors, broken watches).",
    labels: ["resource"],
};
pub(crate) const WATCH_EVENTS_TOTAL: Counter<1> = Counter {
    name: "haptic_watch_events_total",
    help: "Changes received per watched resource.",
    labels: ["resource"],
};
pub(crate) const RESOURCE_OBJECTS: Gauge<1> = Gauge {
    name: "haptic_resource_objects",
    help: "Objects held per watched resource.",
    labels: ["type"],
};
pub(crate) const RECONCILIATION_TOTAL: Counter<0> = Counter {
    name: "haptic_reconciliation_total",
    help: "Reconciliations (render, and validation when needed).",
    labels: [],
};
pub(crate) const VALIDATION_DURATION_SECONDS: Histogram<0> = Histogram {
    name: "haptic_validation_duration_seconds",
    help: "Time of haproxy -c on a rendered bundle.",
    labels: [],
    buckets: DURATION_BUCKETS,
};
pub(crate) const RENDER_DURATION_SECONDS: Histogram<0> = Histogram {
    name: "haptic_render_duration_seconds",
    help: "Time to render every template once (with the passes that leave out failing objects; without haproxy -c).",
    labels: [],
    buckets: DURATION_BUCKETS,
};
pub(crate) const DROPPED_OBJECTS: Gauge<0> = Gauge {
    name: "haptic_dropped_objects",
    help: "Objects left out of the configuration (refused values, failed checks).",
    labels: [],
};
pub(crate) const RECONCILIATION_DURATION_SECONDS: Histogram<0> = Histogram {
    name: "haptic_reconciliation_duration_seconds",
    help: "Time of one reconciliation.",
    labels: [],
    buckets: DURATION_BUCKETS,
};
pub(crate) const CONFIG_BYTES: Gauge<0> = Gauge {
    name: "haptic_config_bytes",
    help: "Size of the rendered haproxy.cfg.",
    labels: [],
};
pub(crate) const RECONCILIATION_ERRORS_TOTAL: Counter<1> = Counter {
    name: "haptic_reconciliation_errors_total",
    help: "Reconciliations that failed, by stage (render, validate).",
    labels: ["stage"],
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_counters_gauges_histograms() {
        let r = Registry::default();
        r.inc(&RECONCILIATION_TOTAL, []);
        r.inc(&WATCH_EVENTS_TOTAL, ["ingresses"]);
        r.set(&LEADER_ELECTION_IS_LEADER, [], 1.0);
        r.observe(&RENDER_DURATION_SECONDS, [], 0.02);
        let text = r.encode();
        assert!(
            text.contains(
                "# TYPE haptic_reconciliation_total counter\nhaptic_reconciliation_total 1\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("haptic_watch_events_total{resource=\"ingresses\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("haptic_render_duration_seconds_bucket{le=\"0.025\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("haptic_render_duration_seconds_bucket{le=\"0.01\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("haptic_render_duration_seconds_count 1"),
            "{text}"
        );
        assert!(text.contains("process_resident_memory_bytes "), "{text}");
        assert_eq!(r.value(&LEADER_ELECTION_IS_LEADER, []), Some(1.0));
    }
}
