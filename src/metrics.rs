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
pub const DURATION_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

#[derive(Debug, Clone, Default)]
pub struct Registry {
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
    pub fn describe_counter(&self, name: &'static str, help: &'static str) {
        self.with(name, help, Kind::Counter, &[], |_| ());
    }

    pub fn inc(&self, name: &'static str, help: &'static str, pairs: &[(&str, &str)]) {
        self.add(name, help, pairs, 1.0);
    }

    pub fn add(&self, name: &'static str, help: &'static str, pairs: &[(&str, &str)], v: f64) {
        self.with(name, help, Kind::Counter, &[], |f| {
            *f.values.entry(labels(pairs)).or_insert(0.0) += v
        });
    }

    pub fn set(&self, name: &'static str, help: &'static str, pairs: &[(&str, &str)], v: f64) {
        self.with(name, help, Kind::Gauge, &[], |f| {
            f.values.insert(labels(pairs), v);
        });
    }

    /// Replaces every sample of a gauge family (for per-object gauges whose label sets change).
    pub fn set_all(
        &self,
        name: &'static str,
        help: &'static str,
        samples: Vec<(Vec<(&str, &str)>, f64)>,
    ) {
        self.with(name, help, Kind::Gauge, &[], |f| {
            f.values = samples
                .iter()
                .map(|(pairs, v)| (labels(pairs), *v))
                .collect();
        });
    }

    pub fn observe(
        &self,
        name: &'static str,
        help: &'static str,
        buckets: &'static [f64],
        pairs: &[(&str, &str)],
        v: f64,
    ) {
        self.with(name, help, Kind::Histogram, buckets, |f| {
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

    /// The value of a counter or gauge sample (tests and health checks).
    pub fn value(&self, name: &str, pairs: &[(&str, &str)]) -> Option<f64> {
        let families = crate::lock(&self.families);
        families.get(name)?.values.get(&labels(pairs)).copied()
    }

    pub fn encode(&self) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_counters_gauges_histograms() {
        let r = Registry::default();
        r.inc("haptic_reconciliation_total", "Reconciliations.", &[]);
        r.inc(
            "haptic_watch_events_total",
            "Watch events.",
            &[("resource", "ingresses"), ("type", "ADDED")],
        );
        r.set(
            "haptic_leader_election_is_leader",
            "1 when leading.",
            &[],
            1.0,
        );
        r.observe(
            "haptic_render_duration_seconds",
            "Render time.",
            DURATION_BUCKETS,
            &[],
            0.02,
        );
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
