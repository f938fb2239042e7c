//! The `HAProxyTemplateConfig` v1alpha1 spec as it appears on the wire (camelCase), with the
//! defaults users can rely on applied by the accessor methods.
//!
//! Durations stay strings here so that [`super::validate`] can report every bad one with its
//! field path; the accessors parse them after validation succeeded.

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

pub const DEFAULT_DATAPLANE_PORT: u16 = 5555;

fn duration_or(value: &Option<String>, default: Duration) -> Duration {
    // Validation has rejected unparsable values before accessors are used; a value that still
    // fails to parse here falls back rather than panicking.
    value
        .as_deref()
        .and_then(|v| parse_duration(v).ok())
        .unwrap_or(default)
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
        duration_or(
            &self.controller.leader_election.lease_duration,
            Duration::from_secs(15),
        )
    }
    pub fn renew_deadline(&self) -> Duration {
        duration_or(
            &self.controller.leader_election.renew_deadline,
            Duration::from_secs(10),
        )
    }
    pub fn retry_period(&self) -> Duration {
        duration_or(
            &self.controller.leader_election.retry_period,
            Duration::from_secs(2),
        )
    }
    pub fn debounce_interval(&self) -> Duration {
        duration_or(
            &self.controller.reconciliation.debounce_interval,
            Duration::from_millis(100),
        )
    }
    pub fn compression_threshold(&self) -> i64 {
        self.controller
            .config_publishing
            .compression_threshold
            .unwrap_or(1_048_576)
    }
    pub fn dataplane_port(&self) -> u16 {
        self.dataplane
            .port
            .and_then(|p| u16::try_from(p).ok())
            .unwrap_or(DEFAULT_DATAPLANE_PORT)
    }
    pub fn min_deployment_interval(&self) -> Duration {
        duration_or(
            &self.dataplane.min_deployment_interval,
            Duration::from_secs(2),
        )
    }
    pub fn drift_prevention_interval(&self) -> Duration {
        duration_or(
            &self.dataplane.drift_prevention_interval,
            Duration::from_secs(60),
        )
    }
    pub fn deployment_timeout(&self) -> Duration {
        duration_or(&self.dataplane.deployment_timeout, Duration::from_secs(30))
    }
    pub fn max_parallel(&self) -> usize {
        self.dataplane
            .max_parallel
            .filter(|n| *n > 0)
            .map(|n| n as usize)
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
