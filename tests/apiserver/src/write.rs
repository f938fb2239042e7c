//! The write verbs: create, update (PUT), patch (merge, strategic merge, JSON patch), delete
//! (with finalizers and preconditions) and deletecollection, each with admission webhooks and
//! optimistic concurrency. Unconditional writes retry when they lose a race; writes that name a
//! `resourceVersion` get `409 Conflict` instead.

use std::sync::Arc;

use serde_json::{json, Value};

use crate::admission::{self, Operation, Review};
use crate::api::{present, selectors, Target};
use crate::auth::User;
use crate::http::Request;
use crate::objects::{crd_status, parse_body, prepare_create, prepare_update};
use crate::patch::{json_patch, merge_patch, strategic_merge_patch};
use crate::registry::crd_type;
use crate::server::{Ctx, Reply};
use crate::status::ApiError;
use crate::storage::{object_rv, CommitError, Expect, CRD_RESOURCE};
use crate::util::now_rfc3339;

const RETRIES: usize = 20;

fn dry_run(req: &Request) -> bool {
    req.query.get("dryRun").is_some_and(|v| v == "All")
}

/// etcd's default request limit (`--max-request-bytes`, 1.5 MiB). Objects are stored as JSON
/// here; custom resources are JSON in etcd too, built-in kinds protobuf (somewhat smaller).
const MAX_STORED_OBJECT: usize = 1_572_864;

/// etcd refuses an object above its request limit; the API server passes the error on as a
/// 500 without a reason.
fn storable(obj: &Value) -> Result<(), ApiError> {
    let size = serde_json::to_vec(obj).map_or(0, |b| b.len());
    if size > MAX_STORED_OBJECT {
        return Err(ApiError::new(500, "", "etcdserver: request is too large"));
    }
    Ok(())
}

fn commit_error(t: &Target, name: &str, e: CommitError) -> ApiError {
    let (g, p) = (&t.rtype.group, &t.rtype.plural);
    match e {
        CommitError::AlreadyExists => ApiError::already_exists(g, p, name),
        CommitError::NotFound => ApiError::not_found(g, p, name),
        CommitError::Conflict => ApiError::conflict(g, p, name),
    }
}

/// CRDs are checked and get their status from the server.
fn crd_checks(t: &Target, obj: &mut Value, name: &str) -> Result<(), ApiError> {
    if t.rtype.group_resource() != CRD_RESOURCE {
        return Ok(());
    }
    crd_type(obj).map_err(|e| {
        let (field, detail) = e.split_once(": ").unwrap_or(("spec", e.as_str()));
        ApiError::invalid(&t.rtype.group, &t.rtype.kind, name, field, detail)
    })?;
    obj["status"] = crd_status(obj);
    Ok(())
}

fn review<'a>(t: &'a Target, op: Operation, user: &'a User, dry: bool) -> Review<'a> {
    Review {
        operation: op,
        rtype: &t.rtype,
        version: &t.version,
        namespace: t.ns(),
        name: t.name(),
        subresource: t.subresource.as_deref(),
        user,
        dry_run: dry,
        object: None,
        old_object: None,
    }
}

pub fn create(ctx: &Ctx, t: &Target, req: &Request, user: &User) -> Result<Reply, ApiError> {
    let mut obj = parse_body(&req.body, req.header("content-type"))?;
    let ns = t.ns().to_string();
    let name = prepare_create(&t.rtype, &t.version, &ns, &mut obj)?;
    crd_checks(t, &mut obj, &name)?;
    if t.rtype.namespaced {
        match ctx.store.get("namespaces", "", &ns) {
            None => return Err(ApiError::not_found("", "namespaces", &ns)),
            Some(n) if !n["metadata"]["deletionTimestamp"].is_null() => {
                return Err(ApiError::new(
                    403,
                    "Forbidden",
                    format!(
                        "{} \"{name}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                        t.rtype.group_resource()
                    ),
                ))
            }
            Some(_) => {}
        }
    }
    if ctx
        .store
        .get(&t.rtype.group_resource(), &ns, &name)
        .is_some()
    {
        return Err(ApiError::already_exists(
            &t.rtype.group,
            &t.rtype.plural,
            &name,
        ));
    }
    let dry = dry_run(req);
    let mut r = review(t, Operation::Create, user, dry);
    r.name = &name;
    r.object = Some(&obj);
    admission::validate(ctx, &r)?;
    if dry {
        return Ok(Reply::Json(201, obj));
    }
    storable(&obj)?;
    let stored = ctx
        .store
        .commit(
            &t.rtype.group_resource(),
            &ns,
            &name,
            Expect::Absent,
            Some(obj),
        )
        .map_err(|e| commit_error(t, &name, e))?;
    log::debug!(
        "created resource={} namespace={ns} name={name}",
        t.rtype.group_resource()
    );
    Ok(Reply::Json(201, present(&stored, &t.rtype, &t.version)))
}

/// Finishes any write to an existing object: admission, then commit with the right precondition.
/// Returns `Ok(None)` when an unconditional write lost a race and should be recomputed.
fn commit_update(
    ctx: &Ctx,
    t: &Target,
    user: &User,
    dry: bool,
    current: &Arc<Value>,
    mut new: Value,
    precondition: Option<u64>,
) -> Result<Option<Reply>, ApiError> {
    let cur_rv = object_rv(current);
    if precondition.is_some_and(|p| p != cur_rv) {
        return Err(ApiError::conflict(
            &t.rtype.group,
            &t.rtype.plural,
            t.name(),
        ));
    }
    crd_checks(t, &mut new, t.name())?;
    // An object being deleted goes away once its last finalizer is removed.
    let finalized = !current["metadata"]["deletionTimestamp"].is_null()
        && new["metadata"]["finalizers"]
            .as_array()
            .is_none_or(|f| f.is_empty());
    let mut r = review(t, Operation::Update, user, dry);
    r.object = Some(&new);
    r.old_object = Some(current);
    admission::validate(ctx, &r)?;
    if dry {
        return Ok(Some(Reply::Json(200, new)));
    }
    // A write that changes nothing is not made, as the real API server's storage skips it: no
    // new resourceVersion and no watch event; the answer is the stored object.
    if !finalized && unchanged(current, &new) {
        return Ok(Some(Reply::Json(
            200,
            present(current, &t.rtype, &t.version),
        )));
    }
    storable(&new)?;
    let gr = t.rtype.group_resource();
    let write = if finalized { None } else { Some(new) };
    match ctx
        .store
        .commit(&gr, t.ns(), t.name(), Expect::Version(cur_rv), write)
    {
        Ok(stored) => Ok(Some(Reply::Json(
            200,
            present(&stored, &t.rtype, &t.version),
        ))),
        Err(CommitError::Conflict) if precondition.is_none() => Ok(None),
        Err(e) => Err(commit_error(t, t.name(), e)),
    }
}

/// Whether `new` is `current` but for its `metadata.resourceVersion`.
fn unchanged(current: &Value, new: &Value) -> bool {
    let (Some(a), Some(b)) = (current.as_object(), new.as_object()) else {
        return current == new;
    };
    let same_meta = |m: &Value, n: &Value| {
        let (Some(m), Some(n)) = (m.as_object(), n.as_object()) else {
            return m == n;
        };
        let fields = |x: &serde_json::Map<String, Value>| {
            x.keys().filter(|k| *k != "resourceVersion").count()
        };
        fields(m) == fields(n)
            && m.iter()
                .all(|(k, v)| k == "resourceVersion" || n.get(k) == Some(v))
    };
    a.len() == b.len()
        && a.iter().all(|(k, v)| match b.get(k) {
            Some(w) if k == "metadata" => same_meta(v, w),
            Some(w) => v == w,
            None => false,
        })
}

fn current(ctx: &Ctx, t: &Target) -> Result<Arc<Value>, ApiError> {
    ctx.store
        .get(&t.rtype.group_resource(), t.ns(), t.name())
        .ok_or_else(|| ApiError::not_found(&t.rtype.group, &t.rtype.plural, t.name()))
}

fn requested_rv(obj: &Value) -> Result<Option<u64>, ApiError> {
    match obj["metadata"]["resourceVersion"].as_str() {
        None | Some("") => Ok(None),
        Some(s) => s
            .parse()
            .map(Some)
            .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {s:?}"))),
    }
}

pub fn update(
    ctx: &Ctx,
    t: &Target,
    req: &Request,
    user: &User,
    status_only: bool,
) -> Result<Reply, ApiError> {
    let body = parse_body(&req.body, req.header("content-type"))?;
    let precondition = requested_rv(&body)?;
    if let Some(ns) = body["metadata"]["namespace"].as_str() {
        if t.rtype.namespaced && !ns.is_empty() && ns != t.ns() {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
    }
    for _ in 0..RETRIES {
        let cur = current(ctx, t)?;
        let new = prepare_update(&t.rtype, &t.version, &cur, body.clone(), status_only)?;
        if let Some(reply) = commit_update(ctx, t, user, dry_run(req), &cur, new, precondition)? {
            return Ok(reply);
        }
    }
    Err(ApiError::conflict(
        &t.rtype.group,
        &t.rtype.plural,
        t.name(),
    ))
}

pub fn patch(
    ctx: &Ctx,
    t: &Target,
    req: &Request,
    user: &User,
    status_only: bool,
) -> Result<Reply, ApiError> {
    let content_type = req.header("content-type").unwrap_or("");
    let media = content_type.split(';').next().unwrap_or("").trim();
    let patch: Value = serde_json::from_slice(&req.body)
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
    for _ in 0..RETRIES {
        let cur = current(ctx, t)?;
        let patched = match media {
            "application/merge-patch+json" => merge_patch(&cur, &patch),
            "application/strategic-merge-patch+json" => {
                if !t.rtype.builtin {
                    return Err(ApiError::new(
                        415,
                        "UnsupportedMediaType",
                        "the body of the request was in an unknown format - accepted media types \
                         include: application/json-patch+json, application/merge-patch+json, \
                         application/apply-patch+yaml",
                    ));
                }
                strategic_merge_patch(&cur, &patch).map_err(ApiError::bad_request)?
            }
            "application/json-patch+json" => {
                json_patch(&cur, &patch).map_err(|e| ApiError::new(422, "Invalid", e))?
            }
            other => {
                return Err(ApiError::new(
                    415,
                    "UnsupportedMediaType",
                    format!("the server does not support patch content type {other:?} (server-side apply is not implemented)"),
                ))
            }
        };
        let precondition = requested_rv(&patched)?.filter(|rv| *rv != object_rv(&cur));
        if precondition.is_some() {
            return Err(ApiError::conflict(
                &t.rtype.group,
                &t.rtype.plural,
                t.name(),
            ));
        }
        let new = prepare_update(&t.rtype, &t.version, &cur, patched, status_only)?;
        if let Some(reply) = commit_update(ctx, t, user, dry_run(req), &cur, new, None)? {
            return Ok(reply);
        }
    }
    Err(ApiError::conflict(
        &t.rtype.group,
        &t.rtype.plural,
        t.name(),
    ))
}

pub fn delete(ctx: &Ctx, t: &Target, req: &Request, user: &User) -> Result<Reply, ApiError> {
    let options: Value = if req.body.is_empty() {
        json!({})
    } else {
        parse_body(&req.body, req.header("content-type"))?
    };
    let dry = dry_run(req)
        || options["dryRun"]
            .as_array()
            .is_some_and(|a| a.iter().any(|v| v == "All"));
    for _ in 0..RETRIES {
        let cur = current(ctx, t)?;
        let pre = &options["preconditions"];
        if let Some(uid) = pre["uid"].as_str() {
            if cur["metadata"]["uid"].as_str() != Some(uid) {
                return Err(
                    ApiError::conflict(&t.rtype.group, &t.rtype.plural, t.name()).with_message(
                        format!(
                        "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                        cur["metadata"]["uid"].as_str().unwrap_or("")
                    ),
                    ),
                );
            }
        }
        let precondition = match pre["resourceVersion"].as_str() {
            Some(rv) => Some(
                rv.parse::<u64>()
                    .map_err(|_| ApiError::bad_request("invalid precondition resourceVersion"))?,
            ),
            None => None,
        };
        if precondition.is_some_and(|p| p != object_rv(&cur)) {
            return Err(ApiError::conflict(
                &t.rtype.group,
                &t.rtype.plural,
                t.name(),
            ));
        }
        let mut r = review(t, Operation::Delete, user, dry);
        r.old_object = Some(&cur);
        admission::validate(ctx, &r)?;
        if dry {
            return Ok(Reply::Json(200, present(&cur, &t.rtype, &t.version)));
        }
        let gr = t.rtype.group_resource();
        let has_finalizers = cur["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        let is_namespace = t.rtype.group.is_empty() && t.rtype.plural == "namespaces";
        let write = if is_namespace && !has_finalizers {
            if !cur["metadata"]["deletionTimestamp"].is_null() {
                return Ok(Reply::Json(200, present(&cur, &t.rtype, &t.version)));
            }
            let mut marked = (*cur).clone();
            marked["metadata"]["deletionTimestamp"] = json!(now_rfc3339());
            marked["status"]["phase"] = json!("Terminating");
            Some(marked)
        } else if has_finalizers {
            if !cur["metadata"]["deletionTimestamp"].is_null() {
                return Ok(Reply::Json(200, present(&cur, &t.rtype, &t.version)));
            }
            let mut marked = (*cur).clone();
            marked["metadata"]["deletionTimestamp"] = json!(now_rfc3339());
            marked["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            Some(marked)
        } else {
            None
        };
        match ctx.store.commit(
            &gr,
            t.ns(),
            t.name(),
            Expect::Version(object_rv(&cur)),
            write,
        ) {
            Ok(obj) => {
                if is_namespace && !has_finalizers {
                    let _ = ctx.namespace_reaper.send(t.name().to_string());
                }
                log::debug!(
                    "deleted resource={gr} namespace={} name={}",
                    t.ns(),
                    t.name()
                );
                return Ok(Reply::Json(200, present(&obj, &t.rtype, &t.version)));
            }
            Err(CommitError::Conflict) if precondition.is_none() => continue,
            Err(e) => return Err(commit_error(t, t.name(), e)),
        }
    }
    Err(ApiError::conflict(
        &t.rtype.group,
        &t.rtype.plural,
        t.name(),
    ))
}

pub fn delete_collection(
    ctx: &Ctx,
    t: &Target,
    req: &Request,
    user: &User,
) -> Result<Reply, ApiError> {
    let (labels, fields) = selectors(req, &t.rtype)?;
    let gr = t.rtype.group_resource();
    let (_, objects) = ctx.store.list(&gr, t.namespace.as_deref(), None)?;
    let mut deleted = Vec::new();
    for obj in objects
        .iter()
        .filter(|o| labels.matches(o) && fields.matches(o))
    {
        let one = Target {
            rtype: t.rtype.clone(),
            version: t.version.clone(),
            namespace: obj["metadata"]["namespace"]
                .as_str()
                .map(str::to_string)
                .filter(|_| t.rtype.namespaced),
            name: obj["metadata"]["name"].as_str().map(str::to_string),
            subresource: None,
            watch_path: false,
        };
        match delete(ctx, &one, req, user) {
            Ok(Reply::Json(_, o)) => deleted.push(o),
            Ok(_) => {}
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Reply::Json(
        200,
        json!({
            "kind": t.rtype.list_kind(),
            "apiVersion": t.rtype.api_version(&t.version),
            "metadata": {"resourceVersion": ctx.store.current_rv().to_string()},
            "items": deleted,
        }),
    ))
}
