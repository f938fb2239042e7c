//! Resource URLs: parsing `/api/v1/…` and `/apis/GROUP/VERSION/…` paths into a target, dispatch
//! by method, and the read verbs (get, list with selectors and pagination, watch). Writes are in
//! [`crate::write`].

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::auth::User;
use crate::http::Request;
use crate::registry::{Registry, ResourceType};
use crate::selectors::{FieldSelector, LabelSelector};
use crate::server::{Ctx, Reply};
use crate::status::ApiError;
use crate::storage::WatchStart;
use crate::util::{base64_decode, base64_encode};
use crate::watch::WatchOptions;
use crate::write;

/// What a resource URL addresses.
pub struct Target {
    pub rtype: Arc<ResourceType>,
    pub version: String,
    /// Namespace from the path; `None` for cluster-scoped types and all-namespace lists.
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub subresource: Option<String>,
    /// Reached through the deprecated `/watch/` path prefix.
    pub watch_path: bool,
}

impl Target {
    /// The namespace part of the storage key (`""` for cluster-scoped types).
    pub fn ns(&self) -> &str {
        self.namespace.as_deref().unwrap_or("")
    }

    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or("")
    }
}

fn no_route() -> ApiError {
    ApiError::new(
        404,
        "NotFound",
        "the server could not find the requested resource",
    )
}

/// Parses a resource path against the current registry.
pub fn parse_target(registry: &Registry, path: &str) -> Result<Target, ApiError> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, mut rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(no_route()),
    };
    let watch_path = rest.first() == Some(&"watch");
    if watch_path {
        rest = &rest[1..];
    }
    let namespaced_form = rest.len() >= 3
        && rest[0] == "namespaces"
        && registry
            .find(group, version, rest[2])
            .is_some_and(|t| t.namespaced);
    let (namespace, rest) = if namespaced_form {
        (Some(rest[1].to_string()), &rest[2..])
    } else {
        (None, rest)
    };
    let (plural, name, subresource) = match rest {
        [p] => (*p, None, None),
        [p, n] => (*p, Some(n.to_string()), None),
        [p, n, s] => (*p, Some(n.to_string()), Some(s.to_string())),
        _ => return Err(no_route()),
    };
    let rtype = registry.find(group, version, plural).ok_or_else(no_route)?;
    // A cluster-scoped type addressed inside a namespace, or a namespaced object by name without
    // one, does not exist.
    if (!rtype.namespaced && namespace.is_some())
        || (rtype.namespaced && namespace.is_none() && name.is_some())
    {
        return Err(no_route());
    }
    if name.as_deref() == Some("") {
        return Err(no_route());
    }
    Ok(Target {
        rtype,
        version: version.to_string(),
        namespace,
        name,
        subresource,
        watch_path,
    })
}

/// Serves one resource request.
pub fn handle(ctx: &Ctx, req: &Request, user: &User) -> Result<Reply, ApiError> {
    let registry = ctx.store.registry();
    let target = parse_target(&registry, &req.path)?;
    let watch = target.watch_path || matches!(req.param("watch"), Some("true" | "1"));
    let method = req.method.as_str();
    if ctx.config.rbac {
        let verb = match (method, target.name.is_some()) {
            ("GET", _) if watch => "watch",
            ("GET", true) => "get",
            ("GET", false) => "list",
            ("POST", _) => "create",
            ("PUT", _) => "update",
            ("PATCH", _) => "patch",
            ("DELETE", true) => "delete",
            ("DELETE", false) => "deletecollection",
            (other, _) => other,
        };
        crate::rbac::authorize(
            &ctx.store,
            user,
            &crate::rbac::Attributes {
                verb,
                group: &target.rtype.group,
                resource: &target.rtype.plural,
                subresource: target.subresource.as_deref(),
                namespace: target.namespace.as_deref(),
                name: target.name.as_deref(),
            },
        )?;
    }
    match (target.name.is_some(), target.subresource.as_deref()) {
        (false, None) => match method {
            "GET" if watch => watch_request(ctx, &target, req),
            "GET" => list(ctx, &target, req),
            "POST" => write::create(ctx, &target, req, user),
            "DELETE" => write::delete_collection(ctx, &target, req, user),
            _ => Err(ApiError::method_not_allowed(format!(
                "{method} is not supported on a collection"
            ))),
        },
        (true, None) => match method {
            "GET" if watch => watch_request(ctx, &target, req),
            "GET" => get(ctx, &target).map(|o| Reply::Json(200, o)),
            "PUT" => write::update(ctx, &target, req, user, false),
            "PATCH" => write::patch(ctx, &target, req, user, false),
            "DELETE" => write::delete(ctx, &target, req, user),
            _ => Err(ApiError::method_not_allowed(format!(
                "{method} is not supported on an object"
            ))),
        },
        (true, Some("status")) if target.rtype.status_subresource => match method {
            "GET" => get(ctx, &target).map(|o| Reply::Json(200, o)),
            "PUT" => write::update(ctx, &target, req, user, true),
            "PATCH" => write::patch(ctx, &target, req, user, true),
            _ => Err(ApiError::method_not_allowed(format!(
                "{method} is not supported on status"
            ))),
        },
        _ => Err(no_route()),
    }
}

/// A stored object as seen through the requested version.
pub fn present(obj: &Value, rtype: &ResourceType, version: &str) -> Value {
    let mut out = obj.clone();
    out["apiVersion"] = Value::String(rtype.api_version(version));
    out
}

fn get(ctx: &Ctx, t: &Target) -> Result<Value, ApiError> {
    let gr = t.rtype.group_resource();
    ctx.store
        .get(&gr, t.ns(), t.name())
        .map(|o| present(&o, &t.rtype, &t.version))
        .ok_or_else(|| ApiError::not_found(&t.rtype.group, &t.rtype.plural, t.name()))
}

/// Label and field selectors of a request on objects of type `t` (the fields it can be
/// selected by are the type's: `field label not supported` otherwise, as in Kubernetes).
pub fn selectors(
    req: &Request,
    t: &ResourceType,
) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let labels = LabelSelector::parse(req.param("labelSelector").unwrap_or(""))
        .map_err(ApiError::bad_request)?;
    let own = match t.builtin {
        true => crate::selectors::selectable_fields(&t.group, &t.plural),
        false => &[],
    };
    let own_labels = !t.builtin || !own.is_empty();
    let fields =
        FieldSelector::parse_for(req.param("fieldSelector").unwrap_or(""), own, own_labels)
            .map_err(ApiError::bad_request)?;
    Ok((labels, fields))
}

const CONTINUE_TOO_OLD: &str = "The provided continue parameter is too old to display a \
consistent list result. You can start a new list without the continue parameter, or use the \
continue token in this response to retrieve the remainder of the results. Continuing with the \
provided token results in an inconsistent list - objects that were created, modified, or deleted \
between the time the first chunk was returned and now may show up in the list.";

fn decode_continue(token: &str) -> Result<(u64, String, String), ApiError> {
    let bad = || {
        ApiError::bad_request("continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)")
    };
    let raw = base64_decode(token).map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    let rv = v["rv"].as_u64().ok_or_else(bad)?;
    let ns = v["ns"].as_str().ok_or_else(bad)?.to_string();
    let name = v["name"].as_str().ok_or_else(bad)?.to_string();
    Ok((rv, ns, name))
}

fn parse_rv(text: &str) -> Result<u64, ApiError> {
    text.parse()
        .map_err(|_| ApiError::bad_request(format!("invalid resource version: {text:?}")))
}

fn list(ctx: &Ctx, t: &Target, req: &Request) -> Result<Reply, ApiError> {
    let (labels, fields) = selectors(req, &t.rtype)?;
    let limit: usize = match req.param("limit") {
        Some(l) => l
            .parse()
            .map_err(|_| ApiError::bad_request(format!("invalid limit {l:?}")))?,
        None => 0,
    };
    let (at, after) = match req.param("continue") {
        Some(token) => {
            let (rv, ns, name) = decode_continue(token)?;
            (Some(rv), Some((ns, name)))
        }
        None => match (
            req.param("resourceVersion"),
            req.param("resourceVersionMatch"),
        ) {
            (Some(rv), Some("Exact")) => (Some(parse_rv(rv)?), None),
            (Some(rv), _) => {
                parse_rv(rv)?;
                (None, None)
            }
            (None, _) => (None, None),
        },
    };
    let gr = t.rtype.group_resource();
    let (rv, objects) = ctx
        .store
        .list(&gr, t.namespace.as_deref(), at)
        .map_err(|e| {
            if after.is_some() {
                ApiError::expired(CONTINUE_TOO_OLD)
            } else {
                e
            }
        })?;
    let key = |o: &Value| -> (String, String) {
        (
            o["metadata"]["namespace"]
                .as_str()
                .unwrap_or("")
                .to_string(),
            o["metadata"]["name"].as_str().unwrap_or("").to_string(),
        )
    };
    let matching: Vec<&Arc<Value>> = objects
        .iter()
        .filter(|o| after.as_ref().is_none_or(|a| key(o) > *a))
        .filter(|o| labels.matches(o) && fields.matches(o))
        .collect();
    let take = if limit > 0 {
        limit.min(matching.len())
    } else {
        matching.len()
    };
    let items: Vec<Value> = matching[..take]
        .iter()
        .map(|o| present(o, &t.rtype, &t.version))
        .collect();
    let remaining = matching.len() - take;
    let last = take.checked_sub(1).map(|i| key(matching[i]));
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if remaining > 0 {
        if let Some((ns, name)) = last {
            let token = json!({"rv": rv, "ns": ns, "name": name}).to_string();
            metadata["continue"] = json!(base64_encode(token.as_bytes()));
            if labels.is_empty() && req.param("fieldSelector").is_none() {
                metadata["remainingItemCount"] = json!(remaining);
            }
        }
    }
    Ok(Reply::Json(
        200,
        json!({
            "kind": t.rtype.list_kind(),
            "apiVersion": t.rtype.api_version(&t.version),
            "metadata": metadata,
            "items": items,
        }),
    ))
}

fn watch_request(ctx: &Ctx, t: &Target, req: &Request) -> Result<Reply, ApiError> {
    let (labels, mut fields) = selectors(req, &t.rtype)?;
    if let Some(name) = &t.name {
        fields = FieldSelector::parse(&format!("metadata.name={name}"))
            .map_err(ApiError::bad_request)?;
    }
    let timeout = match req.param("timeoutSeconds") {
        Some(s) => Duration::from_secs(
            s.parse()
                .map_err(|_| ApiError::bad_request(format!("invalid timeoutSeconds {s:?}")))?,
        ),
        None => ctx.config.watch_timeout,
    };
    let send_initial = req.param("sendInitialEvents") == Some("true");
    let start = match req.param("resourceVersion") {
        None | Some("0") => WatchStart::Current,
        Some(_) if send_initial => WatchStart::Current,
        Some(rv) => WatchStart::After(parse_rv(rv)?),
    };
    let opts = WatchOptions {
        rtype: t.rtype.clone(),
        version: t.version.clone(),
        labels,
        fields,
        bookmarks: matches!(req.param("allowWatchBookmarks"), Some("true" | "1")),
        timeout,
        initial_events_end: send_initial,
        skip_through: 0,
    };
    let registration = ctx
        .store
        .watch(&t.rtype.group_resource(), t.namespace.as_deref(), start);
    Ok(Reply::Watch(Box::new(opts), registration))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        let reg = Registry::builtin();
        let t = parse_target(&reg, "/api/v1/namespaces/default/services/web/status").unwrap();
        assert_eq!(
            (t.ns(), t.name(), t.subresource.as_deref()),
            ("default", "web", Some("status"))
        );
        let t = parse_target(&reg, "/api/v1/namespaces/default").unwrap();
        assert_eq!(
            (t.rtype.plural.as_str(), t.name()),
            ("namespaces", "default")
        );
        let t = parse_target(&reg, "/api/v1/namespaces/default/status").unwrap();
        assert_eq!(t.subresource.as_deref(), Some("status"));
        let t = parse_target(&reg, "/apis/networking.k8s.io/v1/ingresses").unwrap();
        assert!(t.namespace.is_none() && t.name.is_none());
        let t = parse_target(&reg, "/api/v1/watch/namespaces/x/pods").unwrap();
        assert!(t.watch_path && t.ns() == "x");
        assert_eq!(
            parse_target(&reg, "/api/v1/pods/x").err().unwrap().code,
            404
        );
        assert_eq!(
            parse_target(&reg, "/apis/nope/v1/things")
                .err()
                .unwrap()
                .code,
            404
        );
    }
}
