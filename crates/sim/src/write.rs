//! Writes: POST (create, `generateName`), PUT (update, `status` subresource), PATCH (merge,
//! strategic-merge applied as a JSON merge patch, JSON patch) and DELETE, with the
//! apiserver's status codes. The direct API (`Sim::create` …) and churn use the same
//! functions, so every write takes the same path into `store`.

use std::sync::Arc;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::{Map, Value};

use super::pods;
use super::respond::{body_bytes, full, json, Body};
use super::route::Target;
use super::store::meta_mut;
use super::Sim;
use kube_watchcache::error::{Cause, Error};
use kube_watchcache::resource::{Object, ObjectKey};

/// The stored object as JSON (typed, with kind/apiVersion).
pub fn to_value(o: &Object) -> Value {
    serde_json::from_slice(&o.typed_bytes()).unwrap_or(Value::Null)
}

fn respond(code: StatusCode, o: &Object) -> Response<Body> {
    json(code, full(o.typed_bytes()))
}

fn parse_body(bytes: &[u8]) -> Result<Value, Error> {
    serde_json::from_slice(bytes)
        .map_err(|e| Error::BadRequest(format!("the object provided is unrecognized: {e}")))
}

fn as_object(v: Value) -> Result<Map<String, Value>, Error> {
    match v {
        Value::Object(m) => Ok(m),
        _ => Err(Error::BadRequest("the object provided is unrecognized: not a JSON object".into())),
    }
}

/// Namespace handling shared by create and update: the URL namespace wins; a different one
/// in the body is a 400; cluster-scoped objects have none.
fn set_namespace(sim: &Sim, res: usize, obj: &mut Map<String, Value>, url_ns: &str) -> Result<(), Error> {
    let namespaced = sim.store().kinds.kind(res).namespaced;
    let meta = meta_mut(obj);
    if !namespaced {
        meta.remove("namespace");
        return Ok(());
    }
    let body_ns = meta.get("namespace").and_then(Value::as_str).unwrap_or("").to_owned();
    let ns = match (url_ns, body_ns.as_str()) {
        ("", "") => return Err(Error::BadRequest("the server could not find the requested resource".into())),
        ("", b) => b.to_owned(),
        (u, "") => u.to_owned(),
        (u, b) if u == b => u.to_owned(),
        _ => {
            return Err(Error::BadRequest(
                "the namespace of the provided object does not match the namespace sent on the request"
                    .into(),
            ))
        }
    };
    meta.insert("namespace".into(), Value::String(ns));
    Ok(())
}

/// Creates an object (POST and the direct API).
pub fn create(sim: &Sim, res: usize, url_ns: &str, obj: Value) -> Result<Arc<Object>, Error> {
    let kind = sim.store().kinds.kind(res).clone();
    let mut obj = as_object(obj)?;
    set_namespace(sim, res, &mut obj, url_ns)?;
    let meta = meta_mut(&mut obj);
    meta.remove("resourceVersion");
    let name = meta.get("name").and_then(Value::as_str).unwrap_or("").to_owned();
    if name.is_empty() {
        match meta.get("generateName").and_then(Value::as_str).filter(|g| !g.is_empty()) {
            Some(g) => {
                let name = format!("{g}{}", random_suffix());
                meta.insert("name".into(), Value::String(name));
            }
            None => {
                return Err(Error::Invalid {
                    kind: kind.kind.clone(),
                    group: kind.group.clone(),
                    name: String::new(),
                    causes: vec![Cause::required("metadata.name", "name or generateName is required")],
                })
            }
        }
    }
    defaults(&kind.group, &kind.resource, &mut obj);
    sim.store().create(res, obj)
}

/// Fields the apiserver fills in on create.
fn defaults(group: &str, resource: &str, obj: &mut Map<String, Value>) {
    match (group, resource) {
        ("", "namespaces") => {
            obj.insert("spec".into(), serde_json::json!({"finalizers": ["kubernetes"]}));
            obj.insert("status".into(), serde_json::json!({"phase": "Active"}));
        }
        ("", "pods") => {
            // The defaults the apiserver and admission give a pod on create (pods.rs).
            if let Some(Value::Object(spec)) = obj.get_mut("spec") {
                pods::defaults(spec);
                pods::admit_create(spec, &random_suffix());
            }
            let status = obj.entry("status").or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(s) = status {
                s.entry("phase").or_insert_with(|| Value::String("Pending".into()));
            }
        }
        ("", "secrets") => secret(obj),
        _ => {}
    }
}

/// What decoding a v1 Secret does on every write: `stringData` merged into `data` (base64,
/// winning over `data`'s keys) and never stored (`Convert_v1_Secret_To_core_Secret`), and an
/// empty `type` defaulted to `Opaque` (`SetDefaults_Secret`): a `type=Opaque` field selector
/// finds a secret created without one (a review).
fn secret(obj: &mut Map<String, Value>) {
    use base64::Engine;
    if let Some(Value::Object(strings)) = obj.remove("stringData") {
        let data = obj.entry("data").or_insert_with(|| Value::Object(Map::new()));
        if !data.is_object() {
            *data = Value::Object(Map::new());
        }
        if let Value::Object(data) = data {
            for (k, v) in strings {
                let text = v.as_str().unwrap_or_default().to_owned();
                data.insert(k, Value::String(base64::engine::general_purpose::STANDARD.encode(text)));
            }
        }
    }
    if obj.get("type").and_then(Value::as_str).is_none_or(str::is_empty) {
        obj.insert("type".into(), Value::String("Opaque".into()));
    }
}

/// `generateName` suffix: 5 characters from the apiserver's alphabet.
fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..5).map(|_| ALPHABET[fastrand::usize(..ALPHABET.len())] as char).collect()
}

/// How an update came: from a client (PUT, PATCH: validated like the apiserver's, e.g. a pod's
/// immutable spec fields), or from the sim itself (its direct API, a binding).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Writer {
    Client,
    Internal,
}

/// Replaces an object (PUT and the direct API). With `status_only` only `status` changes;
/// otherwise `status` is kept for kinds that have a status subresource.
pub fn update(
    sim: &Sim,
    res: usize,
    url_ns: &str,
    url_name: &str,
    obj: Value,
    status_only: bool,
    writer: Writer,
) -> Result<Arc<Object>, Error> {
    let store = sim.store();
    let kind = store.kinds.kind(res).clone();
    let mut obj = as_object(obj)?;
    set_namespace(sim, res, &mut obj, url_ns)?;
    let meta = meta_mut(&mut obj);
    match meta.get("name").and_then(Value::as_str) {
        None | Some("") => {
            meta.insert("name".into(), Value::String(url_name.to_owned()));
        }
        Some(n) if n != url_name => {
            return Err(Error::BadRequest(format!(
                "the name of the object ({n}) does not match the name on the URL ({url_name})"
            )))
        }
        _ => {}
    }
    let ns = meta.get("namespace").and_then(Value::as_str).unwrap_or("").to_owned();
    if kind.group.is_empty() && kind.resource == "secrets" {
        secret(&mut obj);
    }
    let has_status = store.kinds.all[res].subresources.contains(&"status");
    if status_only || has_status {
        let key = ObjectKey::new(&ns, url_name);
        let current = store.get(res, &key).ok_or_else(|| Error::not_found(&kind, url_name))?;
        let Value::Object(mut cur) = to_value(&current) else {
            return Err(Error::Internal("stored object is not an object".into()));
        };
        if kind.group.is_empty() && kind.resource == "pods" && !status_only {
            if let Some(Value::Object(spec)) = obj.get_mut("spec") {
                pods::defaults(spec);
            }
            if writer == Writer::Client {
                let new = Value::Object(obj.clone());
                pods::validate_update(url_name, &Value::Object(cur.clone()), &new)?;
            }
        }
        if status_only {
            match obj.remove("status") {
                Some(s) => cur.insert("status".into(), s),
                None => cur.remove("status"),
            };
            if let Some(rv) = obj.get("metadata").and_then(|m| m.get("resourceVersion")).cloned() {
                meta_mut(&mut cur).insert("resourceVersion".into(), rv);
            }
            obj = cur;
        } else {
            match cur.remove("status") {
                Some(s) => obj.insert("status".into(), s),
                None => obj.remove("status"),
            };
        }
    }
    store.update(res, obj)
}

pub async fn post(sim: &Sim, t: &Target, req: Request<Incoming>) -> Result<Response<Body>, Error> {
    let body = parse_body(&body_bytes(req).await?)?;
    let o = create(sim, t.res, t.namespace.as_deref().unwrap_or(""), body)?;
    Ok(respond(StatusCode::CREATED, &o))
}

pub async fn put(sim: &Sim, t: &Target, req: Request<Incoming>) -> Result<Response<Body>, Error> {
    let body = parse_body(&body_bytes(req).await?)?;
    let name = t.name.as_deref().unwrap_or("");
    let o = update(
        sim,
        t.res,
        t.namespace.as_deref().unwrap_or(""),
        name,
        body,
        t.sub.as_deref() == Some("status"),
        Writer::Client,
    )?;
    Ok(respond(StatusCode::OK, &o))
}

/// A built-in kind's patch types, in the apiserver's order (`installer.go`).
const BUILTIN_PATCH_TYPES: &str = "application/json-patch+json, application/merge-patch+json, \
                                   application/strategic-merge-patch+json, application/apply-patch+yaml";
/// A custom resource's: no strategic merge patch (it has no Go struct to merge by).
const CUSTOM_PATCH_TYPES: &str =
    "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml";

pub async fn patch(sim: &Sim, t: &Target, req: Request<Incoming>) -> Result<Response<Body>, Error> {
    let ct = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    // The content type first, before the name or the body (the apiserver's `PatchResource`):
    // a built-in kind's patch types, and a custom resource's, which have no strategic merge
    // patch (installer.go; apiextensions' crdHandler).
    let builtin = sim.store().kinds.kind(t.res).builtin;
    let accepted = if builtin { BUILTIN_PATCH_TYPES } else { CUSTOM_PATCH_TYPES };
    if !accepted.split(", ").any(|a| a == ct) {
        // A built-in kind's route refuses it before its handler (go-restful's `Consumes`); a
        // custom resource's handler names its types.
        return Err(if builtin {
            Error::UnsupportedMediaTypeRoute
        } else {
            Error::UnsupportedMediaType(accepted.into())
        });
    }
    let patch = parse_body(&body_bytes(req).await?)?;
    let store = sim.store();
    let kind = store.kinds.kind(t.res);
    let name = t.name.as_deref().unwrap_or("");
    let ns = if kind.namespaced { t.namespace.as_deref().unwrap_or("") } else { "" };
    let current = store.get(t.res, &ObjectKey::new(ns, name)).ok_or_else(|| Error::not_found(kind, name))?;
    let mut v = to_value(&current);
    match ct.as_str() {
        // Strategic merge patch is applied as a JSON merge patch: the sim has no schemas with
        // patch strategies (lists are replaced, not merged by key).
        "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
            merge_patch(&mut v, &patch)
        }
        "application/json-patch+json" => json_patch(&mut v, &patch)?,
        // Server-side apply is not simulated: said so, not passed for a real refusal.
        _ => return Err(Error::MethodNotAllowed),
    }
    let status_only = t.sub.as_deref() == Some("status");
    let o = update(sim, t.res, ns, name, v, status_only, Writer::Client)?;
    Ok(respond(StatusCode::OK, &o))
}

/// DELETE. A pod bound to a node is deleted gracefully, as without a kubelet: first a MODIFIED
/// with `deletionTimestamp`; with a grace period of 0 it is then removed (DELETED), otherwise it
/// stays (watch-pod-graceful-delete.json, watch-field-selector-nodename.json).
/// The options are the body's `DeleteOptions` when it has one (client-go and kube-rs send
/// them so), else the query's, as the apiserver's `DeleteResource` reads them.
pub async fn delete(
    sim: &Sim,
    t: &Target,
    raw_query: &str,
    req: Request<Incoming>,
) -> Result<Response<Body>, Error> {
    let body = body_bytes(req).await?;
    let options = if body.iter().all(u8::is_ascii_whitespace) { None } else { Some(parse_body(&body)?) };
    let ns = t.namespace.as_deref().unwrap_or("");
    let name = t.name.as_deref().unwrap_or("");
    let kind = sim.store().kinds.kind(t.res);
    if kind.group.is_empty() && kind.resource == "pods" {
        let key = ObjectKey::new(ns, name);
        if let Some(cur) = sim.store().get(t.res, &key) {
            let v = to_value(&cur);
            if v.pointer("/spec/nodeName").and_then(Value::as_str).is_some_and(|n| !n.is_empty()) {
                let asked = match &options {
                    Some(o) => o.get("gracePeriodSeconds").and_then(Value::as_i64),
                    None => form_urlencoded::parse(raw_query.as_bytes())
                        .find(|(k, _)| k == "gracePeriodSeconds")
                        .and_then(|(_, v)| v.parse::<i64>().ok()),
                };
                let grace = asked
                    .or_else(|| v.pointer("/spec/terminationGracePeriodSeconds").and_then(Value::as_i64))
                    .unwrap_or(30);
                let marked = sim.store().mark_deleting(t.res, &key, grace)?;
                if grace > 0 {
                    return Ok(respond(StatusCode::OK, &marked));
                }
            }
        }
    }
    let o = sim.store().delete(t.res, ns, name)?;
    if returns_deleted_object(&kind.group, &kind.resource) {
        return Ok(respond(StatusCode::OK, &o));
    }
    // The generic store's `finalizeDelete`: a Success Status naming what was deleted
    // (list-pagination-snapshot.json, watch-cluster-scoped-nodes.json, crd-watch.json).
    let v = to_value(&o);
    let meta =
        |k: &str| v.pointer(&format!("/metadata/{k}")).and_then(Value::as_str).unwrap_or("").to_owned();
    let q = |s: &str| Value::String(s.to_owned()).to_string();
    let group = if kind.group.is_empty() { String::new() } else { format!(r#","group":{}"#, q(&kind.group)) };
    let status = format!(
        r#"{{"kind":"Status","apiVersion":"v1","metadata":{{}},"status":"Success","details":{{"name":{}{group},"kind":{},"uid":{}}}}}"#,
        q(&meta("name")),
        q(&kind.resource),
        q(&meta("uid"))
    );
    Ok(json(StatusCode::OK, full(status)))
}

/// The resources whose storage returns the deleted object (`ReturnDeletedObject: true` in
/// kube-apiserver's registries); every other answers a DELETE with a Success Status.
fn returns_deleted_object(group: &str, resource: &str) -> bool {
    match group {
        "" => matches!(
            resource,
            "namespaces"
                | "persistentvolumes"
                | "persistentvolumeclaims"
                | "pods"
                | "podtemplates"
                | "resourcequotas"
                | "services"
                | "serviceaccounts"
        ),
        "storage.k8s.io" => {
            matches!(resource, "csidrivers" | "csinodes" | "storageclasses" | "volumeattachments")
        }
        "resource.k8s.io" => true,
        _ => false,
    }
}

/// `pods/<name>/binding`: schedules an unscheduled pod (the scheduler's write), 201 + Status.
pub async fn bind(sim: &Sim, t: &Target, req: Request<Incoming>) -> Result<Response<Body>, Error> {
    let binding = parse_body(&body_bytes(req).await?)?;
    let node = binding.pointer("/target/name").and_then(Value::as_str).unwrap_or("").to_owned();
    let ns = t.namespace.as_deref().unwrap_or("");
    let name = t.name.as_deref().unwrap_or("");
    let kind = sim.store().kinds.kind(t.res).clone();
    let cur =
        sim.store().get(t.res, &ObjectKey::new(ns, name)).ok_or_else(|| Error::not_found(&kind, name))?;
    let mut v = to_value(&cur);
    if let Some(spec) = v.get_mut("spec").and_then(Value::as_object_mut) {
        spec.insert("nodeName".into(), Value::String(node));
    }
    update(sim, t.res, ns, name, v, false, Writer::Internal)?;
    let status = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Success","code":201}"#;
    Ok(json(StatusCode::CREATED, full(status)))
}

/// RFC 7386 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(t) = target {
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

/// Operations in one JSON patch at most (the apiserver's `maxJSONPatchOperations`).
const MAX_JSON_PATCH_OPERATIONS: usize = 10_000;
/// Bytes `copy` operations may add in one JSON patch (the apiserver's
/// `--json-patch-max-copy-bytes` default): 40 copies of the whole document into itself, a
/// 2 KB body, doubled it 40 times and took the sim down (found by a review).
const JSON_PATCH_MAX_COPY_BYTES: usize = 3 * 1024 * 1024;

/// RFC 6902 JSON patch: `add`, `remove`, `replace`, `test`, `copy`, `move`. As the
/// apiserver's `applyJSPatch`: a patch that is not an array is a 400, one of too many
/// operations a 413, one that does not apply (the copy bound too) a 422 that does not say why.
pub fn json_patch(target: &mut Value, patch: &Value) -> Result<(), Error> {
    // Why it does not apply is not said: `NewGenericServerResponse` drops the message.
    let bad = |why: String| {
        tracing::debug!(why, "JSON patch does not apply");
        Error::Unprocessable
    };
    let ops = patch.as_array().ok_or_else(|| Error::BadRequest("json patch must be an array".into()))?;
    if ops.len() > MAX_JSON_PATCH_OPERATIONS {
        return Err(Error::RequestEntityTooLarge(format!(
            "The allowed maximum operations in a JSON patch is {MAX_JSON_PATCH_OPERATIONS}, got {}",
            ops.len()
        )));
    }
    let mut copied = 0usize;
    for op in ops {
        let kind = op.get("op").and_then(Value::as_str).unwrap_or("");
        let path = op.get("path").and_then(Value::as_str).unwrap_or("");
        let value = || op.get("value").cloned().ok_or_else(|| bad(format!("missing value for {kind}")));
        match kind {
            "add" => add(target, path, value()?),
            "replace" => {
                let slot = target.pointer_mut(path).ok_or_else(|| {
                    bad(format!("replace operation does not apply: doc is missing key: {path}"))
                })?;
                *slot = value()?;
                Ok(())
            }
            "remove" => remove(target, path).map(|_| ()),
            "test" => match target.pointer(path) {
                Some(v) if *v == value()? => Ok(()),
                _ => Err(format!("testing value {path} failed")),
            },
            "copy" | "move" => {
                let from = op.get("from").and_then(Value::as_str).unwrap_or("");
                let v = if kind == "move" {
                    remove(target, from)
                } else {
                    target.pointer(from).ok_or(from.to_owned()).and_then(|v| {
                        copied = copied.saturating_add(serde_json::to_vec(v).map_or(usize::MAX, |b| b.len()));
                        if copied > JSON_PATCH_MAX_COPY_BYTES {
                            return Err(format!(
                                "Unable to complete the copy, the accumulated size increase of copy is {copied}, exceeding the limit {JSON_PATCH_MAX_COPY_BYTES}"
                            ));
                        }
                        Ok(v.clone())
                    })
                };
                v.and_then(|v| add(target, path, v))
            }
            other => Err(format!("Unexpected kind: {other}")),
        }
        .map_err(bad)?;
    }
    Ok(())
}

fn split(path: &str) -> Result<(&str, String), String> {
    let i = path.rfind('/').ok_or_else(|| format!("invalid path {path}"))?;
    Ok((&path[..i], path[i + 1..].replace("~1", "/").replace("~0", "~")))
}

fn add(target: &mut Value, path: &str, v: Value) -> Result<(), String> {
    if path.is_empty() {
        *target = v;
        return Ok(());
    }
    let (parent, last) = split(path)?;
    match target.pointer_mut(parent) {
        Some(Value::Object(m)) => {
            m.insert(last, v);
            Ok(())
        }
        Some(Value::Array(a)) => {
            let i = if last == "-" {
                a.len()
            } else {
                last.parse().map_err(|_| format!("invalid index {last}"))?
            };
            if i > a.len() {
                return Err(format!("add operation does not apply: index {i} out of range"));
            }
            a.insert(i, v);
            Ok(())
        }
        _ => Err(format!("add operation does not apply: doc is missing path: {path}")),
    }
}

fn remove(target: &mut Value, path: &str) -> Result<Value, String> {
    let (parent, last) = split(path)?;
    let missing = || format!("remove operation does not apply: doc is missing path: {path}");
    match target.pointer_mut(parent) {
        Some(Value::Object(m)) => m.remove(&last).ok_or_else(missing),
        Some(Value::Array(a)) => match last.parse::<usize>() {
            Ok(i) if i < a.len() => Ok(a.remove(i)),
            _ => Err(missing()),
        },
        _ => Err(missing()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_rfc7386() {
        let mut v = json!({"a": {"b": 1, "c": 2}, "l": [1, 2]});
        merge_patch(&mut v, &json!({"a": {"b": null, "d": 3}, "l": [3]}));
        assert_eq!(v, json!({"a": {"c": 2, "d": 3}, "l": [3]}));
    }

    #[test]
    fn json_patch_ops() {
        let mut v = json!({"metadata": {"labels": {"a": "1"}}, "l": [1]});
        json_patch(
            &mut v,
            &json!([
                {"op": "add", "path": "/metadata/labels/b", "value": "2"},
                {"op": "remove", "path": "/metadata/labels/a"},
                {"op": "add", "path": "/l/-", "value": 2},
                {"op": "test", "path": "/l/1", "value": 2},
                {"op": "replace", "path": "/l/0", "value": 0}
            ]),
        )
        .map_err(|_| ())
        .unwrap();
        assert_eq!(v, json!({"metadata": {"labels": {"b": "2"}}, "l": [0, 2]}));
        assert!(json_patch(&mut v, &json!([{"op": "test", "path": "/l/0", "value": 9}])).is_err());
        // Copies of the whole document into itself: refused once they would add 3 MiB.
        let mut doc = json!({"data": "x".repeat(1000)});
        let doubling: Vec<Value> =
            (0..40).map(|i| json!({"op": "copy", "from": "", "path": format!("/a{i}")})).collect();
        let e = json_patch(&mut doc, &Value::Array(doubling)).unwrap_err();
        assert!(matches!(e, Error::Unprocessable), "{e:?}");
        let size = serde_json::to_vec(&doc).unwrap().len();
        assert!(size <= 2 * 3 * 1024 * 1024 + 2_000, "stopped at the bound: {size}");
        let many: Vec<Value> =
            (0..10_001).map(|_| json!({"op": "test", "path": "/data", "value": "y"})).collect();
        let e = json_patch(&mut doc, &Value::Array(many)).unwrap_err();
        assert_eq!(
            e.to_status().body,
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Request entity too large: The allowed maximum operations in a JSON patch is 10000, got 10001","reason":"RequestEntityTooLarge","code":413}"#
        );
        // One that does not apply: the apiserver's 422 with empty details.
        let e = json_patch(&mut doc, &json!([{"op": "test", "path": "/data", "value": "y"}])).unwrap_err();
        assert_eq!(
            e.to_status().body,
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the server rejected our request due to an error in our request","reason":"Invalid","details":{},"code":422}"#
        );
        assert_eq!(json_patch(&mut doc, &json!({})).unwrap_err().to_status().code, 400, "not an array");
    }
}
