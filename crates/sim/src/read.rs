//! LIST and GET: the resourceVersion rules of docs/apiserver-watch-cache.md §1.5/§1.6 against the etcd-like store
//! (current state, state at an exact revision rebuilt from the log, waits for future
//! revisions), pagination with etcd's continue tokens, selectors.
//!
//! Called by `http` for GET requests that are not watches; `watch` reuses [`Filter`].

use std::sync::Arc;

use bytes::Bytes;

use http::{Response, StatusCode};
use serde_json::json;

use super::encode::{self, ListMeta};
use super::query::{rv_of, ContinueToken, Query, RvMatch, RvParam};
use super::respond::{chunks_body, full, json as json_response, protobuf, Accept, Body};
use super::route::Target;
use super::store::Objects;
use super::Sim;
use kube_watchcache::error::Error;
use kube_watchcache::metadata_only::{self, Repr};
use kube_watchcache::proto::envelope;
use kube_watchcache::resource::{Header, Object, ObjectKey, ResourceKind, Rv};
use kube_watchcache::selector::{FieldSelector, LabelSelector, Texts};

/// Selectors and scope of a LIST or WATCH. Selectors are parsed only when given, so that
/// requests without them never depend on `kube_watchcache::selector`.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub label: Option<LabelSelector>,
    pub field: Option<FieldSelector>,
}

impl Filter {
    /// Parses the selectors (400 texts from `kube_watchcache::selector`) and narrows the scope with exact
    /// `metadata.namespace` / `metadata.name` requirements.
    pub fn new(kind: &ResourceKind, t: &Target, q: &Query) -> Result<Filter, Error> {
        let given = |s: &String| (!s.is_empty()).then(|| s.clone());
        let label =
            given(&q.label_selector).map(|s| LabelSelector::parse_as(&s, Texts::Qualified)).transpose()?;
        let field = given(&q.field_selector).map(|s| FieldSelector::parse(&s, kind)).transpose()?;
        let mut f = Filter { namespace: t.namespace.clone(), name: t.name.clone(), label, field };
        if let Some(fs) = &f.field {
            // A watch of one object: the selector must require exactly its name (`ListResource`).
            if let Some(url_name) = &t.name {
                if t.force_watch && !fs.is_empty() && fs.exact("metadata.name") != Some(url_name.as_str()) {
                    return Err(Error::BadRequest(
                        "fieldSelector metadata.name doesn't match requested name".into(),
                    ));
                }
            }
            if f.namespace.is_none() && kind.namespaced {
                f.namespace = fs.exact("metadata.namespace").map(str::to_owned);
            }
            if f.name.is_none() {
                f.name = fs.exact("metadata.name").map(str::to_owned);
            }
        }
        Ok(f)
    }

    /// The node an exact `spec.nodeName` requirement names (not empty: an unscheduled pod is
    /// on no node's index).
    pub fn node(&self) -> Option<&str> {
        self.field.as_ref()?.exact("spec.nodeName").filter(|n| !n.is_empty())
    }

    pub fn has_selectors(&self) -> bool {
        self.label.is_some() || self.field.is_some()
    }

    /// Scope (namespace / name) plus selectors.
    pub fn matches(&self, h: &Header) -> bool {
        if self.namespace.as_deref().is_some_and(|ns| ns != h.namespace()) {
            return false;
        }
        if self.name.as_deref().is_some_and(|n| n != h.name()) {
            return false;
        }
        self.label.as_ref().is_none_or(|l| l.matches(&h.labels()))
            && self.field.as_ref().is_none_or(|f| f.matches(h))
    }

    /// The objects in scope, in key order, starting at `from` (inclusive).
    pub fn scan<'a>(
        &self,
        objects: &'a Objects,
        from: Option<ObjectKey>,
    ) -> Box<dyn Iterator<Item = &'a Arc<Object>> + Send + 'a> {
        if let (Some(ns), Some(name)) = (&self.namespace, &self.name) {
            let key = ObjectKey::new(ns, name);
            return Box::new(
                objects.get(&key).into_iter().filter(move |_| from.as_ref().is_none_or(|f| &key >= f)),
            );
        }
        let prefix = self.namespace.as_ref().map(|ns| format!("{ns}/"));
        let start = match (&prefix, from) {
            (_, Some(f)) => f,
            (Some(p), None) => ObjectKey::of(p),
            (None, None) => ObjectKey::of(""),
        };
        Box::new(
            objects
                .range(start..)
                .take_while(move |(k, _)| prefix.as_ref().is_none_or(|p| k.as_str().starts_with(p.as_str())))
                .map(|(_, v)| v),
        )
    }
}

/// What a LIST reads: a resource's objects, or (its current state only) those of one node.
enum Source {
    All(Objects),
    OnNode(Vec<Arc<Object>>),
}

/// LIST (docs/apiserver-watch-cache.md §1.6, with the sim as both cache and etcd).
pub async fn list(sim: &Sim, t: &Target, q: &Query, accept: Accept) -> Result<Response<Body>, Error> {
    let store = sim.store();
    let kind = store.kinds.kind(t.res).clone();
    q.check_selector_syntax(Texts::Qualified)?;
    q.validate()?;
    let filter = Filter::new(&kind, t, q)?;
    let token = q.continue_for_list()?;
    let rv_param = q.rv_for_list()?;
    let unset = rv_param == RvParam::Unset;
    let rv = rv_of(rv_param);
    let limit = q.limit().unwrap_or(0) as u64;
    let exact = q.rv_match() == Some(RvMatch::Exact) || (q.rv_match().is_none() && limit > 0 && rv.0 > 0);

    // Where the list starts (key relative to the list prefix) and at which revision.
    let ns_prefix = t.namespace.clone().map(|ns| format!("{ns}/")).unwrap_or_default();
    // The current state: one node's objects from the store's index when the selector names a
    // node (a kubelet's list at 10 000 nodes would otherwise read 20 000 pods), else all.
    let current = || match filter.node() {
        Some(node) => {
            let (cur, objs) = store.snapshot_on_node(t.res, node);
            (cur, Source::OnNode(objs))
        }
        None => {
            let (cur, objs) = store.snapshot(t.res);
            (cur, Source::All(objs))
        }
    };
    let (list_rv, objects, from, limit) = if let Some(c) = &token {
        let from = Some(ObjectKey::from(format!("{ns_prefix}{}", c.start)));
        if c.rv < 0 {
            let (cur, objs) = current();
            (cur, objs, from, limit)
        } else {
            let at = Rv(c.rv as u64);
            if at > store.current_rv() {
                reached(store, &kind, at).await?;
            }
            match store.snapshot_at(t.res, at) {
                Ok(objs) => (at, Source::All(objs), from, limit),
                Err(_) => return Err(expired_continue(&c.start)),
            }
        }
    } else if unset {
        let (cur, objs) = current();
        (cur, objs, None, limit)
    } else if rv.0 == 0 {
        // Any freshness: the watch cache ignores limit when the text is `0` (1.36 compares the
        // text: `00` keeps it, or storage answers; events are not cached: etcd honours it).
        let (cur, objs) = current();
        (cur, objs, None, if is_cached(&kind) && q.resource_version == "0" { 0 } else { limit })
    } else if exact {
        if rv > store.current_rv() {
            reached(store, &kind, rv).await?;
        }
        match store.snapshot_at(t.res, rv) {
            Ok(objs) => (rv, Source::All(objs), None, limit),
            Err(_) => {
                return Err(Error::Expired("The resourceVersion for the provided list is too old.".into()))
            }
        }
    } else {
        reached(store, &kind, rv).await?;
        let (cur, objs) = current();
        (cur, objs, None, limit)
    };

    let mut items = Vec::new();
    let mut last: Option<ObjectKey> = None;
    let mut more = false;
    let mut scanned_after = 0u64;
    let mut iter = match &objects {
        Source::All(objects) => filter.scan(objects, from),
        Source::OnNode(objects) => {
            Box::new(objects.iter().filter(move |o| from.as_ref().is_none_or(|f| &o.header.key >= f)))
        }
    };
    for o in iter.by_ref() {
        if limit > 0 && items.len() as u64 == limit {
            more = true;
            scanned_after = 1;
            break;
        }
        if filter.matches(&o.header) {
            last = Some(o.header.key.clone());
            items.push(o.clone());
        }
    }
    let remaining = if more && !filter.has_selectors() {
        scanned_after += iter.count() as u64;
        Some(scanned_after)
    } else {
        None
    };
    let continue_token = match (more, &last) {
        (true, Some(k)) => {
            let rel = k.as_str().strip_prefix(ns_prefix.as_str()).unwrap_or(k.as_str());
            Some(ContinueToken::after(list_rv.0 as i64, rel).encode())
        }
        _ => None,
    };
    if accept == Accept::Table {
        return Ok(table(list_rv, continue_token, &items));
    }
    accept.check_form(true, &kind)?;
    if accept == Accept::MetadataList {
        return Ok(metadata_list(list_rv, continue_token, remaining, &items));
    }
    if matches!(accept, Accept::Protobuf | Accept::ProtoMetadataList) {
        return proto_list(
            &kind,
            list_rv,
            continue_token,
            remaining,
            &items,
            accept == Accept::ProtoMetadataList,
        );
    }
    let meta = ListMeta { rv: list_rv, continue_token, remaining };
    let chunks = encode::list_chunks(&kind, &meta, items.iter().map(|o| o.item_chunks()).collect());
    Ok(json_response(StatusCode::OK, chunks_body(chunks)))
}

/// Waits for the revision `rv` as the watch cache does, or, for a kind the apiserver does not
/// cache, answers at once as etcd does (`Store::at_least`).
async fn reached(store: &super::store::Store, kind: &ResourceKind, rv: Rv) -> Result<(), Error> {
    if is_cached(kind) {
        store.wait_for(rv).await
    } else {
        store.at_least(rv)
    }
}

/// Whether the apiserver keeps a watch cache for the resource: every kind but core events
/// (`--watch-cache-sizes` default `events=0`, docs/apiserver-watch-cache.md §0.2).
pub fn is_cached(kind: &ResourceKind) -> bool {
    !(kind.group.is_empty() && kind.resource == "events")
}

/// 410 for a continue token whose revision was compacted, carrying a token to continue at the
/// latest revision (compaction-continue-expired.json).
fn expired_continue(start: &str) -> Error {
    Error::ExpiredContinue { continue_token: ContinueToken { rv: -1, start: start.to_owned() }.encode() }
}

/// GET one object (docs/apiserver-watch-cache.md §1.5): RV unset / 0 → current; N → wait until the store reaches N
/// (3 s, then 504).
pub async fn get(sim: &Sim, t: &Target, q: &Query, accept: Accept) -> Result<Response<Body>, Error> {
    let store = sim.store();
    let kind = store.kinds.kind(t.res);
    let rv = rv_of(q.rv_for_get_or_watch()?);
    if rv > store.current_rv() {
        reached(store, kind, rv).await?;
    }
    let name = t.name.as_deref().unwrap_or("");
    let key = ObjectKey::new(if kind.namespaced { t.namespace.as_deref().unwrap_or("") } else { "" }, name);
    let o = store.get(t.res, &key).ok_or_else(|| Error::not_found(kind, name))?;
    if accept == Accept::Table {
        return Ok(table(store.current_rv(), None, &[o]));
    }
    accept.check_form(false, kind)?;
    if accept == Accept::Metadata {
        return Ok(json_response(StatusCode::OK, full(object_body(o.metadata_bytes()))));
    }
    if matches!(accept, Accept::Protobuf | Accept::ProtoMetadata) {
        let repr = if accept == Accept::Protobuf { Repr::FullProto } else { Repr::MetadataProto };
        let chunks = o.chunks_as(repr).ok_or_else(no_protobuf)?;
        return Ok(protobuf(StatusCode::OK, chunks_body(chunks.to_vec()), false));
    }
    Ok(json_response(StatusCode::OK, full(object_body(o.typed_bytes()))))
}

/// An object the schema cannot encode (the apiserver always can: a sim limitation).
pub(super) fn no_protobuf() -> Error {
    Error::Internal("the simulated apiserver cannot encode this object in protobuf".into())
}

/// A LIST in protobuf: the envelope, ListMeta, each item's message (whole or metadata only).
fn proto_list(
    kind: &ResourceKind,
    rv: Rv,
    token: Option<String>,
    remaining: Option<u64>,
    items: &[Arc<Object>],
    metadata: bool,
) -> Result<Response<Body>, Error> {
    let mut messages = Vec::with_capacity(items.len());
    for o in items {
        messages.push(o.proto_message(metadata).ok_or_else(no_protobuf)?);
    }
    let items_len: usize = messages.iter().map(|m| envelope::item_prefix_len(m.len()) + m.len()).sum();
    let type_meta = kube_watchcache::proto::list_type_meta(&kind.api_version(), &kind.list_kind(), metadata);
    let head = envelope::list_head(
        &type_meta,
        &rv.to_string(),
        token.as_deref(),
        remaining.map(|n| n as usize),
        items_len,
    );
    let mut chunks = vec![Bytes::from(head)];
    for m in messages {
        chunks.push(envelope::item_prefix(m.len()));
        chunks.extend(m.parts().iter().cloned());
    }
    chunks.push(Bytes::from_static(envelope::UNKNOWN_TAIL));
    Ok(protobuf(StatusCode::OK, chunks_body(chunks), false))
}

/// A GET answer: the object and the newline Go's JSON encoder ends it with (recorded).
fn object_body(o: Bytes) -> Vec<u8> {
    let mut out = Vec::with_capacity(o.len() + 1);
    out.extend_from_slice(&o);
    out.push(b'\n');
    out
}

/// A `PartialObjectMetadataList` (what metadata informers and `kubectl get --show-kind`-less
/// metadata clients ask for), with the list metadata of the JSON list.
fn metadata_list(
    rv: Rv,
    token: Option<String>,
    remaining: Option<u64>,
    items: &[Arc<Object>],
) -> Response<Body> {
    // ListMeta in its Go field order (resourceVersion, continue, remainingItemCount).
    let mut meta = format!("{{\"resourceVersion\":\"{rv}\"");
    if let Some(t) = token {
        meta.push_str(&format!(",\"continue\":{}", json!(t)));
    }
    if let Some(n) = remaining {
        meta.push_str(&format!(",\"remainingItemCount\":{n}"));
    }
    meta.push('}');
    let mut body = metadata_only::LIST_HEAD.as_bytes().to_vec();
    body.extend_from_slice(meta.as_bytes());
    if items.is_empty() {
        body.extend_from_slice(metadata_only::EMPTY_ITEMS.as_bytes());
        return json_response(StatusCode::OK, full(body));
    }
    body.extend_from_slice(br#","items":["#);
    for (i, o) in items.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(&o.metadata_bytes());
    }
    body.extend_from_slice(b"]}\n");
    json_response(StatusCode::OK, full(body))
}

/// A minimal `meta.k8s.io/v1` Table (Name, Age), rows carrying PartialObjectMetadata.
fn table(rv: Rv, token: Option<String>, items: &[Arc<Object>]) -> Response<Body> {
    let rows: Vec<serde_json::Value> = items
        .iter()
        .map(|o| {
            let v: serde_json::Value = serde_json::from_slice(&o.typed_bytes()).unwrap_or_default();
            let created = v.pointer("/metadata/creationTimestamp").cloned().unwrap_or_default();
            json!({
                "cells": [o.header.name(), age(created.as_str().unwrap_or(""))],
                "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": v["metadata"]},
            })
        })
        .collect();
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(t) = token {
        meta["continue"] = json!(t);
    }
    let body = json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": [
            {"name": "Name", "type": "string", "format": "name", "description": "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names", "priority": 0},
            {"name": "Age", "type": "string", "format": "", "description": "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata", "priority": 0},
        ],
        "rows": rows,
    });
    json_response(StatusCode::OK, full(serde_json::to_vec(&body).unwrap_or_default()))
}

/// kubectl-style age (`5s`, `3m`, `2h`, `4d`) of an RFC 3339 timestamp.
fn age(created: &str) -> String {
    let now = encode::now_rfc3339();
    let secs = |s: &str| -> Option<i64> {
        let d: Vec<i64> = s
            .split(|c: char| !c.is_ascii_digit())
            .filter(|p| !p.is_empty())
            .filter_map(|p| p.parse().ok())
            .collect();
        let [y, mo, da, h, mi, se] = d.get(..6)?.try_into().ok()?;
        Some((((y * 12 + mo) * 31 + da) * 24 + h) * 3600 + mi * 60 + se)
    };
    let d = secs(&now).zip(secs(created)).map(|(a, b)| (a - b).max(0)).unwrap_or(0);
    match d {
        d if d < 120 => format!("{d}s"),
        d if d < 7200 => format!("{}m", d / 60),
        d if d < 172_800 => format!("{}h", d / 3600),
        d => format!("{}d", d / 86_400),
    }
}
