//! `meta.k8s.io/v1 Status` errors, shaped exactly like the real API server's so that clients
//! (kubectl, client-go, our own `src/kube`) parse `reason`, `message` and `code` the same way.

use serde_json::{json, Value};

/// An error answer: HTTP code, Kubernetes reason and human message, plus optional details.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: u16,
    pub reason: String,
    pub message: String,
    pub details: Option<Value>,
}

impl ApiError {
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            reason: reason.to_string(),
            message: message.into(),
            details: None,
        }
    }

    pub fn with_message(mut self, message: impl Into<String>) -> ApiError {
        self.message = message.into();
        self
    }

    fn with_details(mut self, details: Value) -> ApiError {
        self.details = Some(details);
        self
    }

    /// `404 NotFound`: `ingresses.networking.k8s.io "web" not found`.
    pub fn not_found(group: &str, plural: &str, name: &str) -> ApiError {
        let qualified = qualified(group, plural);
        ApiError::new(404, "NotFound", format!("{qualified} \"{name}\" not found"))
            .with_details(details(group, plural, name))
    }

    /// `403 Forbidden` from the authorizer, with its message.
    pub fn forbidden(group: &str, plural: &str, name: &str, message: String) -> ApiError {
        ApiError::new(403, "Forbidden", message).with_details(details(group, plural, name))
    }

    /// `409 AlreadyExists` for a create of an existing name.
    pub fn already_exists(group: &str, plural: &str, name: &str) -> ApiError {
        let qualified = qualified(group, plural);
        ApiError::new(
            409,
            "AlreadyExists",
            format!("{qualified} \"{name}\" already exists"),
        )
        .with_details(details(group, plural, name))
    }

    /// `409 Conflict` for a stale `resourceVersion`.
    pub fn conflict(group: &str, plural: &str, name: &str) -> ApiError {
        let qualified = qualified(group, plural);
        ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {qualified} \"{name}\": the object has been \
                 modified; please apply your changes to the latest version and try again"
            ),
        )
        .with_details(details(group, plural, name))
    }

    /// `422 Invalid` with one field cause.
    pub fn invalid(group: &str, kind: &str, name: &str, field: &str, detail: &str) -> ApiError {
        let kind_q = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        ApiError::new(
            422,
            "Invalid",
            format!("{kind_q} \"{name}\" is invalid: {field}: {detail}"),
        )
        .with_details(json!({
            "name": name, "group": group, "kind": kind,
            "causes": [{"reason": "FieldValueInvalid", "message": detail, "field": field}],
        }))
    }

    /// `410 Expired` for a list or continue token older than the compaction point.
    pub fn expired(message: impl Into<String>) -> ApiError {
        ApiError::new(410, "Expired", message)
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "BadRequest", message)
    }

    pub fn method_not_allowed(message: impl Into<String>) -> ApiError {
        ApiError::new(405, "MethodNotAllowed", message)
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(500, "InternalError", message)
    }

    pub fn unauthorized() -> ApiError {
        ApiError::new(401, "Unauthorized", "Unauthorized")
    }

    /// The usual reason for an HTTP code, for injected faults.
    pub fn from_code(code: u16, message: Option<&str>) -> ApiError {
        let reason = reason_for_code(code);
        let msg = message.map(str::to_string).unwrap_or_else(|| match code {
            500 => "Internal error occurred: injected fault".to_string(),
            503 => "the server is currently unable to handle the request".to_string(),
            429 => "too many requests, please try again later".to_string(),
            504 => "the server was unable to return a response in the time allotted".to_string(),
            _ => format!("injected fault with code {code}"),
        });
        ApiError::new(code, reason, msg)
    }

    /// The `Status` object for this error.
    pub fn to_status(&self) -> Value {
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        // Errors passed on from etcd carry no reason (kubectl then prints "Error from server: …").
        if self.reason.is_empty() {
            if let Some(m) = v.as_object_mut() {
                m.remove("reason");
            }
        }
        if let Some(d) = &self.details {
            v["details"] = d.clone();
        }
        v
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

/// The reason string Kubernetes uses for a given HTTP status code.
pub fn reason_for_code(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        406 => "NotAcceptable",
        409 => "Conflict",
        410 => "Gone",
        413 => "RequestEntityTooLarge",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    }
}

fn qualified(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}

fn details(group: &str, plural: &str, name: &str) -> Value {
    json!({"name": name, "group": group, "kind": plural})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_matches_kubernetes_wording() {
        let e = ApiError::not_found("networking.k8s.io", "ingresses", "web");
        let s = e.to_status();
        assert_eq!(
            s["message"],
            "ingresses.networking.k8s.io \"web\" not found"
        );
        assert_eq!(s["reason"], "NotFound");
        assert_eq!(s["code"], 404);
        assert_eq!(s["status"], "Failure");
        let core = ApiError::not_found("", "services", "x").to_status();
        assert_eq!(core["message"], "services \"x\" not found");
    }
}
