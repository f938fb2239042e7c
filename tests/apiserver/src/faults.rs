//! Fault injection, driven by `POST /_dev/faults` (see `docs/dev-apiserver.md`): fail the next N
//! requests with a chosen code (optionally only under a path prefix), add latency to every
//! request, pause watch delivery for resource types, close all watches and compact the history.
//! The store-level actions (closing watches, compaction) are carried out by the caller.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};

use crate::status::ApiError;

struct FailRule {
    remaining: u64,
    code: u16,
    prefix: Option<String>,
    message: Option<String>,
}

#[derive(Default)]
struct State {
    fail: Vec<FailRule>,
    latency: Duration,
    latency_prefix: Option<String>,
    paused: BTreeSet<String>,
}

/// The `POST /_dev/faults` body. Every field is optional; fields combine.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FaultRequest {
    /// Drop every fault first.
    #[serde(default)]
    pub reset: bool,
    /// `true` or `"clean"`: end watches with the terminating chunk; `"abrupt"`: shut the socket.
    pub close_watches: Option<Value>,
    pub fail_next: Option<FailNext>,
    pub latency_ms: Option<u64>,
    pub latency_path_prefix: Option<String>,
    #[serde(default)]
    pub compact: bool,
    #[serde(default)]
    pub pause: Vec<String>,
    #[serde(default)]
    pub resume: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FailNext {
    pub count: u64,
    pub code: u16,
    pub path_prefix: Option<String>,
    pub message: Option<String>,
}

/// Current faults.
#[derive(Default)]
pub struct Faults {
    state: Mutex<State>,
}

impl Faults {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Called for every API request: waits the configured latency, then answers the injected
    /// error if one is due for this path.
    pub fn before_request(&self, path: &str) -> Option<ApiError> {
        let (delay, failure) = {
            let mut st = self.lock();
            let delay = if st
                .latency_prefix
                .as_deref()
                .is_none_or(|p| path.starts_with(p))
            {
                st.latency
            } else {
                Duration::ZERO
            };
            let mut failure = None;
            if let Some(rule) = st.fail.iter_mut().find(|r| {
                r.remaining > 0 && r.prefix.as_deref().is_none_or(|p| path.starts_with(p))
            }) {
                rule.remaining -= 1;
                failure = Some(ApiError::from_code(rule.code, rule.message.as_deref()));
            }
            st.fail.retain(|r| r.remaining > 0);
            (delay, failure)
        };
        if !delay.is_zero() {
            // The delay is the injected fault itself, not synchronisation.
            std::thread::sleep(delay);
        }
        failure
    }

    /// Whether watch delivery for this group-resource is paused.
    pub fn is_paused(&self, group_resource: &str) -> bool {
        let st = self.lock();
        !st.paused.is_empty() && st.paused.contains(group_resource)
    }

    /// Applies the request-level parts of a fault request.
    pub fn apply(&self, req: &FaultRequest) -> Result<(), String> {
        let mut st = self.lock();
        if req.reset {
            *st = State::default();
        }
        if let Some(f) = &req.fail_next {
            if !(100..=599).contains(&f.code) {
                return Err(format!(
                    "failNext.code {} is not an HTTP status code",
                    f.code
                ));
            }
            st.fail.push(FailRule {
                remaining: f.count,
                code: f.code,
                prefix: f.path_prefix.clone(),
                message: f.message.clone(),
            });
        }
        if let Some(ms) = req.latency_ms {
            st.latency = Duration::from_millis(ms);
            st.latency_prefix = req.latency_path_prefix.clone();
        }
        for r in &req.pause {
            st.paused.insert(r.clone());
        }
        for r in &req.resume {
            st.paused.remove(r);
        }
        Ok(())
    }

    /// A summary for `GET /_dev/faults` and the answer to `POST`.
    pub fn describe(&self) -> Value {
        let st = self.lock();
        json!({
            "pendingFailures": st.fail.iter().map(|r| json!({
                "remaining": r.remaining, "code": r.code, "pathPrefix": r.prefix})).collect::<Vec<_>>(),
            "latencyMs": st.latency.as_millis() as u64,
            "latencyPathPrefix": st.latency_prefix,
            "paused": st.paused.iter().collect::<Vec<_>>(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fail_next_counts_down_per_prefix() {
        let f = Faults::default();
        let req: FaultRequest = serde_json::from_value(json!({
            "failNext": {"count": 2, "code": 503, "pathPrefix": "/api/v1/services"}}))
        .unwrap();
        f.apply(&req).unwrap();
        assert!(f.before_request("/api/v1/pods").is_none());
        assert_eq!(f.before_request("/api/v1/services").unwrap().code, 503);
        assert_eq!(
            f.before_request("/api/v1/services").unwrap().reason,
            "ServiceUnavailable"
        );
        assert!(f.before_request("/api/v1/services").is_none());
        assert!(serde_json::from_value::<FaultRequest>(json!({"bogus": 1})).is_err());
    }
}
