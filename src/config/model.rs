//! The `HAProxyTemplateConfig` v1alpha1 spec as it appears on the wire (camelCase), with the
//! defaults users can rely on applied by the accessor methods.
//!
//! Durations stay strings here so that [`super::validate`] can report every bad one with its
//! field path; the accessors parse them after validation succeeded. Every duration and number
//! has a documented range ([`DURATION_FIELDS`], [`INT_FIELDS`], docs/operations.md).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::duration::parse_duration;

pub const GROUP: &str = "haproxy-haptic.org";
pub const VERSION: &str = "v1alpha1";
pub const API_VERSION: &str = "haproxy-haptic.org/v1alpha1";
pub const KIND: &str = "HAProxyTemplateConfig";
/// The watched-resource name under which the HAProxy pods are stored (auto-injected).
pub const HAPROXY_PODS: &str = "haproxy-pods";

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Spec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret_ref: Option<SecretRef>,
    #[serde(default)]
    pub pod_selector: PodSelector,
    #[serde(default)]
    pub controller: ControllerSettings,
    #[serde(default)]
    pub logging: Logging,
    #[serde(default)]
    pub dataplane: Dataplane,
    #[serde(default)]
    pub templating_settings: TemplatingSettings,
    #[serde(default)]
    pub watched_resources_ignore_fields: Vec<String>,
    #[serde(default)]
    pub watched_resources: BTreeMap<String, WatchedResource>,
    #[serde(default)]
    pub template_snippets: BTreeMap<String, Snippet>,
    #[serde(default)]
    pub maps: BTreeMap<String, OutputTemplate>,
    #[serde(default)]
    pub files: BTreeMap<String, OutputTemplate>,
    #[serde(default)]
    pub ssl_certificates: BTreeMap<String, OutputTemplate>,
    #[serde(default)]
    pub haproxy_config: OutputTemplate,
    #[serde(default)]
    pub validation_tests: BTreeMap<String, ValidationTest>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretRef {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodSelector {
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ControllerSettings {
    #[serde(default)]
    pub leader_election: LeaderElection,
    #[serde(default)]
    pub config_publishing: ConfigPublishing,
    #[serde(default)]
    pub reconciliation: Reconciliation,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LeaderElection {
    pub enabled: Option<bool>,
    pub lease_name: Option<String>,
    pub lease_duration: Option<String>,
    pub renew_deadline: Option<String>,
    pub retry_period: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConfigPublishing {
    pub compression_threshold: Option<i64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Reconciliation {
    pub debounce_interval: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Logging {
    pub level: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Dataplane {
    pub port: Option<i64>,
    pub min_deployment_interval: Option<String>,
    pub drift_prevention_interval: Option<String>,
    pub deployment_timeout: Option<String>,
    pub maps_dir: Option<String>,
    pub ssl_certs_dir: Option<String>,
    pub general_storage_dir: Option<String>,
    pub config_file: Option<String>,
    pub max_parallel: Option<i64>,
    pub raw_push_threshold: Option<i64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TemplatingSettings {
    pub engine: Option<String>,
    #[serde(default)]
    pub extra_context: serde_json::Map<String, serde_json::Value>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WatchedResource {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub resources: String,
    #[serde(default)]
    pub enable_validation_webhook: bool,
    #[serde(default)]
    pub index_by: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field_selector: Option<String>,
    /// Restricts the watch to one namespace (server-side). Absent: cluster-wide.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Accepted for compatibility only when empty; see validation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<String>,
}

impl WatchedResource {
    /// `(group, version)`; the core group is `""`.
    pub fn group_version(&self) -> (&str, &str) {
        match self.api_version.split_once('/') {
            Some((group, version)) => (group, version),
            None => ("", self.api_version.as_str()),
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Snippet {
    #[serde(default)]
    pub template: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OutputTemplate {
    #[serde(default)]
    pub template: String,
    #[serde(default)]
    pub post_processing: Vec<PostProcessing>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PostProcessing {
    #[serde(default, rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub params: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ValidationTest {
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub fixtures: BTreeMap<String, Vec<serde_json::Value>>,
    #[serde(default)]
    pub http_resources: Vec<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_config: Option<String>,
    #[serde(default)]
    pub extra_context: serde_json::Map<String, serde_json::Value>,
    #[serde(default)]
    pub assertions: Vec<Assertion>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Assertion {
    #[serde(default, rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub target: String,
    #[serde(default)]
    pub pattern: String,
    #[serde(default)]
    pub expected: Option<serde_yaml::Value>,
    #[serde(default)]
    pub jsonpath: String,
    #[serde(default)]
    pub patterns: Vec<String>,
}

/// Where the dataplane keeps its files, after defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataplanePaths {
    pub config_file: String,
    pub maps_dir: String,
    pub ssl_certs_dir: String,
    pub general_storage_dir: String,
}

/// A duration field with its default and its allowed range (inclusive). The ranges are listed in
/// docs/operations.md ("Config limits"); a unit test keeps that table in step with this code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurationField {
    pub path: &'static str,
    pub default: Duration,
    pub min: Duration,
    pub max: Duration,
}

/// An integer field with its default (if any) and its allowed range (inclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntField {
    pub path: &'static str,
    pub default: Option<i64>,
    pub min: i64,
    pub max: i64,
}

const fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

const fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

pub const LEASE_DURATION: DurationField = DurationField {
    path: "spec.controller.leaderElection.leaseDuration",
    default: secs(15),
    min: secs(2),
    max: secs(3600),
};
pub const RENEW_DEADLINE: DurationField = DurationField {
    path: "spec.controller.leaderElection.renewDeadline",
    default: secs(10),
    min: secs(1),
    max: secs(3600),
};
pub const RETRY_PERIOD: DurationField = DurationField {
    path: "spec.controller.leaderElection.retryPeriod",
    default: secs(2),
    min: millis(100),
    max: secs(600),
};
pub const DEBOUNCE_INTERVAL: DurationField = DurationField {
    path: "spec.controller.reconciliation.debounceInterval",
    default: millis(100),
    min: Duration::ZERO,
    max: secs(60),
};
pub const MIN_DEPLOYMENT_INTERVAL: DurationField = DurationField {
    path: "spec.dataplane.minDeploymentInterval",
    default: secs(2),
    min: Duration::ZERO,
    max: secs(600),
};
pub const DRIFT_PREVENTION_INTERVAL: DurationField = DurationField {
    path: "spec.dataplane.driftPreventionInterval",
    default: secs(60),
    min: secs(1),
    max: secs(24 * 3600),
};
pub const DEPLOYMENT_TIMEOUT: DurationField = DurationField {
    path: "spec.dataplane.deploymentTimeout",
    default: secs(30),
    min: secs(1),
    max: secs(600),
};

/// Every duration in the config.
pub const DURATION_FIELDS: [DurationField; 7] = [
    LEASE_DURATION,
    RENEW_DEADLINE,
    RETRY_PERIOD,
    DEBOUNCE_INTERVAL,
    MIN_DEPLOYMENT_INTERVAL,
    DRIFT_PREVENTION_INTERVAL,
    DEPLOYMENT_TIMEOUT,
];

pub const DATAPLANE_PORT: IntField = IntField {
    path: "spec.dataplane.port",
    default: Some(5555),
    min: 1,
    max: 65535,
};
pub const COMPRESSION_THRESHOLD: IntField = IntField {
    path: "spec.controller.configPublishing.compressionThreshold",
    default: Some(1_048_576),
    min: 0,
    max: 1 << 30,
};
pub const MAX_PARALLEL: IntField = IntField {
    path: "spec.dataplane.maxParallel",
    default: Some(0),
    min: 0,
    max: 10_000,
};
pub const RAW_PUSH_THRESHOLD: IntField = IntField {
    path: "spec.dataplane.rawPushThreshold",
    default: None,
    min: 0,
    max: 1_000_000,
};
/// `expected` of a `match_count` assertion (the path names one assertion of one test).
pub const MATCH_COUNT_EXPECTED: IntField = IntField {
    path: "spec.validationTests.<test>.assertions[<i>].expected",
    default: None,
    min: 0,
    max: 1_000_000_000,
};

/// Every number in the config.
pub const INT_FIELDS: [IntField; 5] = [
    DATAPLANE_PORT,
    COMPRESSION_THRESHOLD,
    MAX_PARALLEL,
    RAW_PUSH_THRESHOLD,
    MATCH_COUNT_EXPECTED,
];

pub const DEFAULT_DATAPLANE_PORT: u16 = 5555;

impl DurationField {
    /// The value when set, valid and in range; else the default. Validation has refused
    /// anything else before accessors are used; this keeps an unvalidated spec harmless too.
    pub fn get(&self, value: &Option<String>) -> Duration {
        value
            .as_deref()
            .and_then(|v| parse_duration(v).ok())
            .filter(|d| (self.min..=self.max).contains(d))
            .unwrap_or(self.default)
    }
}

impl IntField {
    /// The value when set and in range; else the default (`None` when the field has none).
    pub fn get(&self, value: Option<i64>) -> Option<i64> {
        value
            .filter(|v| (self.min..=self.max).contains(v))
            .or(self.default)
    }
}

impl Spec {
    pub fn leader_election_enabled(&self) -> bool {
        self.controller.leader_election.enabled.unwrap_or(true)
    }
    pub fn lease_name(&self) -> String {
        self.controller
            .leader_election
            .lease_name
            .clone()
            .unwrap_or_else(|| "haptic-leader".into())
    }
    pub fn lease_duration(&self) -> Duration {
        LEASE_DURATION.get(&self.controller.leader_election.lease_duration)
    }
    pub fn renew_deadline(&self) -> Duration {
        RENEW_DEADLINE.get(&self.controller.leader_election.renew_deadline)
    }
    pub fn retry_period(&self) -> Duration {
        RETRY_PERIOD.get(&self.controller.leader_election.retry_period)
    }
    pub fn debounce_interval(&self) -> Duration {
        DEBOUNCE_INTERVAL.get(&self.controller.reconciliation.debounce_interval)
    }
    pub fn compression_threshold(&self) -> i64 {
        COMPRESSION_THRESHOLD
            .get(self.controller.config_publishing.compression_threshold)
            .unwrap_or(1_048_576)
    }
    pub fn dataplane_port(&self) -> u16 {
        DATAPLANE_PORT
            .get(self.dataplane.port)
            .and_then(|p| u16::try_from(p).ok())
            .unwrap_or(DEFAULT_DATAPLANE_PORT)
    }
    pub fn min_deployment_interval(&self) -> Duration {
        MIN_DEPLOYMENT_INTERVAL.get(&self.dataplane.min_deployment_interval)
    }
    pub fn drift_prevention_interval(&self) -> Duration {
        DRIFT_PREVENTION_INTERVAL.get(&self.dataplane.drift_prevention_interval)
    }
    pub fn deployment_timeout(&self) -> Duration {
        DEPLOYMENT_TIMEOUT.get(&self.dataplane.deployment_timeout)
    }
    pub fn max_parallel(&self) -> usize {
        MAX_PARALLEL
            .get(self.dataplane.max_parallel)
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(0)
    }
    pub fn dataplane_paths(&self) -> DataplanePaths {
        let d = &self.dataplane;
        let or = |v: &Option<String>, default: &str| {
            v.clone()
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| default.into())
        };
        DataplanePaths {
            config_file: or(&d.config_file, "/etc/haproxy/haproxy.cfg"),
            maps_dir: or(&d.maps_dir, "/etc/haproxy/maps"),
            ssl_certs_dir: or(&d.ssl_certs_dir, "/etc/haproxy/ssl"),
            general_storage_dir: or(&d.general_storage_dir, "/etc/haproxy/general"),
        }
    }
    /// `spec.logging.level`, upper-cased; `None` when unset (LOG_LEVEL, then INFO apply).
    pub fn log_level(&self) -> Option<String> {
        self.logging
            .level
            .as_deref()
            .filter(|l| !l.is_empty())
            .map(|l| l.to_ascii_uppercase())
    }
}
