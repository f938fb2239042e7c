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
struct Histogram {
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
    histograms: BTreeMap<Labels, Histogram>,
}

/// Duration buckets in seconds, from 1 ms to 60 s.
pub(crate) const DURATION_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

#[derive(Debug, Clone, Default)]
pub(crate) struct Registry {
    families: Arc<Mutex<BTreeMap<&'static str, Family>>>,
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    let mut l: Labels = pairs
        .iter()
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

    /// Declares a family so it is exported (with no samples) before its first use.
    pub(crate) fn describe_counter(&self, metric: &Metric) {
        self.with(metric.name, metric.help, Kind::Counter, &[], |_| ());
    }

    pub(crate) fn inc(&self, metric: &Metric, pairs: &[(&str, &str)]) {
        self.add(metric, pairs, 1.0);
    }

    pub(crate) fn add(&self, metric: &Metric, pairs: &[(&str, &str)], v: f64) {
        self.with(metric.name, metric.help, Kind::Counter, &[], |f| {
            *f.values.entry(labels(pairs)).or_insert(0.0) += v
        });
    }

    pub(crate) fn set(&self, metric: &Metric, pairs: &[(&str, &str)], v: f64) {
        self.with(metric.name, metric.help, Kind::Gauge, &[], |f| {
            f.values.insert(labels(pairs), v);
        });
    }

    /// Replaces every sample of a gauge family (for per-object gauges whose label sets change).
    pub(crate) fn set_all(&self, metric: &Metric, samples: Vec<(Vec<(&str, &str)>, f64)>) {
        self.with(metric.name, metric.help, Kind::Gauge, &[], |f| {
            f.values = samples
                .iter()
                .map(|(pairs, v)| (labels(pairs), *v))
                .collect();
        });
    }

    pub(crate) fn observe(
        &self,
        metric: &Metric,
        buckets: &'static [f64],
        pairs: &[(&str, &str)],
        v: f64,
    ) {
        self.with(metric.name, metric.help, Kind::Histogram, buckets, |f| {
            let h = f
                .histograms
                .entry(labels(pairs))
                .or_insert_with(|| Histogram {
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
        });
    }

    /// The value of a counter or gauge sample.
    #[cfg(test)]
    pub(crate) fn value(&self, name: &str, pairs: &[(&str, &str)]) -> Option<f64> {
        let families = crate::lock(&self.families);
        families.get(name)?.values.get(&labels(pairs)).copied()
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

/// A metric: name and help text, declared once in the catalogue below.
#[derive(Debug)]
pub(crate) struct Metric {
    pub name: &'static str,
    pub help: &'static str,
}

// The catalogue: every family the controller exports (docs/operations.md lists them).
pub(crate) const DRIFT_DETECTED_TOTAL: Metric = Metric {
    name: "haptic_drift_detected_total",
    help: "Pods found running another bundle than the one deployed to them.",
};
pub(crate) const ADMITTED_PODS: Metric = Metric {
    name: "haptic_admitted_pods",
    help: "HAProxy pods admitted for deployment.",
};
pub(crate) const DEPLOYMENT_TOTAL: Metric = Metric {
    name: "haptic_deployment_total",
    help: "Bundle pushes to HAProxy pods by result.",
};
pub(crate) const DEPLOYMENT_ERRORS_TOTAL: Metric = Metric {
    name: "haptic_deployment_errors_total",
    help: "Failed bundle pushes to HAProxy pods.",
};
pub(crate) const DEPLOYMENT_DURATION_SECONDS: Metric = Metric {
    name: "haptic_deployment_duration_seconds",
    help: "Time to push one bundle to the pods that needed it.",
};
pub(crate) const CHANGE_TO_DEPLOYED_SECONDS: Metric = Metric {
    name: "haptic_change_to_deployed_seconds",
    help: "From the first change seen to the bundle applied on every admitted pod.",
};
pub(crate) const WEBHOOK_REQUESTS_TOTAL: Metric = Metric {
    name: "haptic_webhook_requests_total",
    help: "Admission webhook requests by result.",
};
pub(crate) const BUILD_INFO: Metric = Metric {
    name: "haptic_build_info",
    help: "Build information.",
};
pub(crate) const LEADER_ELECTION_IS_LEADER: Metric = Metric {
    name: "haptic_leader_election_is_leader",
    help: "1 while this replica leads.",
};
pub(crate) const LEADER_ELECTION_TRANSITIONS_TOTAL: Metric = Metric {
    name: "haptic_leader_election_transitions_total",
    help: "Leadership changes of this replica.",
};
pub(crate) const CONFIG_ERRORS_TOTAL: Metric = Metric {
    name: "haptic_config_errors_total",
    help: "HAProxyTemplateConfig changes refused as invalid.",
};
pub(crate) const WATCH_RESTARTS_TOTAL: Metric = Metric {
    name: "haptic_watch_restarts_total",
    help: "Re-lists of a watched resource (410, errors, broken watches).",
};
pub(crate) const WATCH_EVENTS_TOTAL: Metric = Metric {
    name: "haptic_watch_events_total",
    help: "Changes received per watched resource.",
};
pub(crate) const RESOURCE_OBJECTS: Metric = Metric {
    name: "haptic_resource_objects",
    help: "Objects held per watched resource.",
};
pub(crate) const RECONCILIATION_TOTAL: Metric = Metric {
    name: "haptic_reconciliation_total",
    help: "Reconciliations (render, and validation when needed).",
};
pub(crate) const VALIDATION_DURATION_SECONDS: Metric = Metric {
    name: "haptic_validation_duration_seconds",
    help: "Time of haproxy -c on a rendered bundle.",
};
pub(crate) const RENDER_DURATION_SECONDS: Metric = Metric {
    name: "haptic_render_duration_seconds",
    help: "Time to render every template once.",
};
pub(crate) const DROPPED_OBJECTS: Metric = Metric {
    name: "haptic_dropped_objects",
    help: "Objects left out of the configuration (refused values, failed checks).",
};
pub(crate) const RECONCILIATION_DURATION_SECONDS: Metric = Metric {
    name: "haptic_reconciliation_duration_seconds",
    help: "Time of one reconciliation.",
};
pub(crate) const CONFIG_BYTES: Metric = Metric {
    name: "haptic_config_bytes",
    help: "Size of the rendered haproxy.cfg.",
};
pub(crate) const RECONCILIATION_ERRORS_TOTAL: Metric = Metric {
    name: "haptic_reconciliation_errors_total",
    help: "Reconciliations that failed, by stage (render, validate).",
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_counters_gauges_histograms() {
        let r = Registry::default();
        r.inc(&RECONCILIATION_TOTAL, &[]);
        r.inc(
            &WATCH_EVENTS_TOTAL,
            &[("resource", "ingresses"), ("type", "ADDED")],
        );
        r.set(&LEADER_ELECTION_IS_LEADER, &[], 1.0);
        r.observe(&RENDER_DURATION_SECONDS, DURATION_BUCKETS, &[], 0.02);
        let text = r.encode();
        assert!(
            text.contains(
                "# TYPE haptic_reconciliation_total counter\nhaptic_reconciliation_total 1\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("haptic_watch_events_total{resource=\"ingresses\",type=\"ADDED\"} 1"),
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
        assert_eq!(r.value("haptic_leader_election_is_leader", &[]), Some(1.0));
    }
}
