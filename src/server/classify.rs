//! The cache-or-upstream decision for one request: a pure function of method, path, query,
//! `Accept` and the set of cached resources (DESIGN §3, reference §1).
//!
//! Called by `server::handle` before anything is served or forwarded. No I/O; tested with a
//! table. Validation errors come out of here with the apiserver's exact texts, in its order:
//! label-selector parse (400) → ListOptions validation (422) → field labels (400) →
//! continue token (400) → resourceVersion (400 for LIST, 500 for GET/WATCH).

use std::sync::Arc;

use http::Method;

use crate::error::Error;
use crate::params::{ContinueToken, ListOptions, RvMatch, RvParam};
use crate::resource::{ResourceKind, Rv};
use crate::selector::{FieldSelector, LabelSelector};

/// The parts of a resource URL (`/api/v1/namespaces/ns/pods/name/sub`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourcePath {
    pub group: String,
    pub version: String,
    pub namespace: Option<String>,
    pub resource: String,
    pub name: Option<String>,
    pub subresource: Option<String>,
    /// The legacy `/watch/` prefix.
    pub watch_prefix: bool,
}

/// Why a request goes upstream. `as_str` is used in logs and metric labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForwardReason {
    /// Not a GET: writes, deletes, connects.
    Write,
    /// Not a resource URL: discovery, /version, /openapi, …
    NonResource,
    /// A resource this proxy does not cache.
    NotCached,
    /// A subresource (`/log`, `/exec`, `/status`, …).
    Subresource,
    /// The client does not accept plain JSON first (protobuf only, Table, metadata-only).
    Accept,
    /// A field selector this proxy cannot evaluate for a custom resource.
    UnknownField,
    /// GET with resourceVersion unset: the apiserver reads etcd for it too.
    MostRecentGet,
    /// Most Recent LIST or watch that the cache could not show fresh (consistent read failed
    /// or `--consistent-reads=upstream`).
    MostRecent,
    /// A NotOlderThan / Exact read whose RV the cache did not reach in `--freshness-wait`.
    NotFresh,
    /// An Exact read or continue token whose RV is outside the history window.
    OutsideWindow,
    /// The resource's cache has not synced yet (and the apiserver would read etcd).
    NotSynced,
}

impl ForwardReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ForwardReason::Write => "write",
            ForwardReason::NonResource => "non_resource",
            ForwardReason::NotCached => "not_cached",
            ForwardReason::Subresource => "subresource",
            ForwardReason::Accept => "accept",
            ForwardReason::UnknownField => "unknown_field",
            ForwardReason::MostRecentGet => "most_recent_get",
            ForwardReason::MostRecent => "most_recent",
            ForwardReason::NotFresh => "not_fresh",
            ForwardReason::OutsideWindow => "outside_window",
            ForwardReason::NotSynced => "not_synced",
        }
    }
}

/// What the cache is asked to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// GET one object; wait for the cache to reach `min_rv` first (NotOlderThan).
    Get { min_rv: Option<Rv> },
    /// LIST at any freshness (`resourceVersion=0`): full list, `limit` ignored.
    ListAny,
    /// LIST not older than N (`resourceVersion=N`, NotOlderThan, or no limit); `limit` honoured.
    ListNotOlderThan { min_rv: Rv, limit: Option<usize> },
    /// LIST of the state at exactly N (Exact, or legacy `limit` + N, or a continue token).
    ListExact { rv: Rv, limit: Option<usize>, start: Option<String> },
    /// Most Recent LIST (RV unset, or a continue token with rv −1): needs a consistent read.
    ListMostRecent { limit: Option<usize>, start: Option<String> },
    /// WATCH of events after N (legacy, or `sendInitialEvents=false`).
    WatchAfter { rv: Rv },
    /// WATCH of events after the current cache RV (`sendInitialEvents=false`, RV 0).
    WatchNow,
    /// Watch-list: initial state then live; wait for `min_rv` first (504 ERROR event after 3 s).
    WatchList { min_rv: Option<Rv> },
    /// Most Recent watch (RV unset): needs a consistent read; `initial` = sendInitialEvents.
    WatchMostRecent { initial: bool },
}

impl Plan {
    pub fn verb(&self) -> &'static str {
        match self {
            Plan::Get { .. } => "get",
            Plan::ListAny
            | Plan::ListNotOlderThan { .. }
            | Plan::ListExact { .. }
            | Plan::ListMostRecent { .. } => "list",
            _ => "watch",
        }
    }
}

/// A request the cache may serve.
#[derive(Clone, Debug)]
pub struct CacheRequest {
    pub kind: Arc<ResourceKind>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub opts: ListOptions,
    pub plan: Plan,
}

/// The outcome of classification.
#[derive(Debug)]
pub enum Route {
    Cache(Box<CacheRequest>),
    Forward(ForwardReason),
    Reject(Error),
}

/// Looks up cached resources by (group, version, resource).
pub trait Resources {
    fn find(&self, group: &str, version: &str, resource: &str) -> Option<Arc<ResourceKind>>;
}

impl Resources for [Arc<ResourceKind>] {
    fn find(&self, group: &str, version: &str, resource: &str) -> Option<Arc<ResourceKind>> {
        self.iter().find(|k| k.group == group && k.version == version && k.resource == resource).cloned()
    }
}

/// Splits an API path into its resource parts (Kubernetes' RequestInfoFactory rules).
/// `None` for non-resource paths.
pub fn parse_path(path: &str) -> Option<ResourcePath> {
    let mut parts: Vec<String> = Vec::new();
    for seg in path.trim_matches('/').split('/') {
        if seg.is_empty() {
            return None;
        }
        parts.push(percent_encoding::percent_decode_str(seg).decode_utf8().ok()?.into_owned());
    }
    let (group, version, rest) = match parts.first().map(String::as_str) {
        Some("api") if parts.len() >= 3 => (String::new(), parts[1].clone(), &parts[2..]),
        Some("apis") if parts.len() >= 4 => (parts[1].clone(), parts[2].clone(), &parts[3..]),
        _ => return None,
    };
    let mut rest = rest.to_vec();
    let watch_prefix = rest.first().is_some_and(|s| s == "watch");
    if watch_prefix {
        rest.remove(0);
    }
    let mut namespace = None;
    if rest.first().is_some_and(|s| s == "namespaces") && rest.len() > 1 {
        namespace = Some(rest[1].clone());
        if rest.len() > 2 && rest[2] != "status" && rest[2] != "finalize" {
            rest.drain(..2);
        } else {
            // `/namespaces/ns` is the namespace object itself.
            namespace = None;
        }
    }
    let resource = rest.first()?.clone();
    let name = rest.get(1).cloned();
    let subresource = rest.get(2).cloned();
    if rest.len() > 3 {
        return Some(ResourcePath {
            group,
            version,
            namespace,
            resource,
            name,
            subresource: Some(rest[2..].join("/")),
            watch_prefix,
        });
    }
    Some(ResourcePath { group, version, namespace, resource, name, subresource, watch_prefix })
}

/// Whether the cache can answer a request with this `Accept` header as the client wants it
/// (DESIGN §3, content negotiation): plain JSON must be acceptable, and the first choice must
/// not be an alternate representation (`as=Table`, `as=PartialObjectMetadata…`).
pub fn accepts_plain_json(accept: Option<&str>) -> bool {
    let Some(accept) = accept.map(str::trim).filter(|a| !a.is_empty()) else {
        return true;
    };
    let mut json_ok = false;
    for (i, range) in accept.split(',').enumerate() {
        let mut it = range.split(';').map(str::trim);
        let media = it.next().unwrap_or("").to_ascii_lowercase();
        let mut alternate = false;
        let mut q_zero = false;
        for p in it {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            match k.trim().to_ascii_lowercase().as_str() {
                "as" | "g" | "v" => alternate |= k.trim().eq_ignore_ascii_case("as"),
                "q" => q_zero = v.trim().parse::<f32>().is_ok_and(|q| q == 0.0),
                _ => {}
            }
        }
        if i == 0 && alternate {
            return false;
        }
        if !alternate && !q_zero && matches!(media.as_str(), "application/json" | "*/*" | "application/*") {
            json_ok = true;
        }
    }
    json_ok
}

/// Decides what to do with one request.
pub fn classify(
    method: &Method,
    path: &str,
    query: Option<&str>,
    accept: Option<&str>,
    cached: &(impl Resources + ?Sized),
) -> Route {
    if method != Method::GET {
        return Route::Forward(ForwardReason::Write);
    }
    let Some(rp) = parse_path(path) else {
        return Route::Forward(ForwardReason::NonResource);
    };
    let Some(kind) = cached.find(&rp.group, &rp.version, &rp.resource) else {
        return Route::Forward(ForwardReason::NotCached);
    };
    if rp.subresource.is_some() {
        return Route::Forward(ForwardReason::Subresource);
    }
    if rp.namespace.is_some() && !kind.namespaced {
        // e.g. /api/v1/namespaces/ns/nodes: let the apiserver answer as it does.
        return Route::Forward(ForwardReason::NotCached);
    }
    if !accepts_plain_json(accept) {
        return Route::Forward(ForwardReason::Accept);
    }
    match decide(&rp, kind, query.unwrap_or("")) {
        Ok(r) => r,
        Err(e) => Route::Reject(e),
    }
}

fn decide(rp: &ResourcePath, kind: Arc<ResourceKind>, query: &str) -> Result<Route, Error> {
    let mut opts = ListOptions::from_query(query)?;
    // `?watch=1` on an object URL is a plain GET; `/watch/` makes anything a watch.
    let is_get = rp.name.is_some() && !rp.watch_prefix;
    if is_get {
        // GetOptions carry only resourceVersion: every other parameter is ignored.
        let plan = match opts.rv_for_get_or_watch()? {
            RvParam::Unset => return Ok(Route::Forward(ForwardReason::MostRecentGet)),
            RvParam::Zero => Plan::Get { min_rv: None },
            RvParam::At(rv) => Plan::Get { min_rv: Some(rv) },
        };
        return Ok(cache(rp, kind, LabelSelector::default(), FieldSelector::default(), opts, plan));
    }
    opts.watch |= rp.watch_prefix;
    let labels = LabelSelector::parse(&opts.label_selector)?;
    opts.apply_defaults();
    opts.validate()?;
    let fields = match FieldSelector::parse(&opts.field_selector, &kind) {
        Ok(f) => f,
        // A custom resource may declare selectable fields the proxy does not know: let the
        // apiserver decide.
        Err(_) if !kind.builtin => return Ok(Route::Forward(ForwardReason::UnknownField)),
        Err(e) => return Err(e),
    };
    if let (Some(name), Some(sel)) = (&rp.name, fields.exact("metadata.name")) {
        if name != sel {
            return Err(Error::BadRequest("fieldSelector metadata.name doesn't match requested name".into()));
        }
    }
    let plan = if opts.watch { watch_plan(&opts)? } else { list_plan(&opts)? };
    Ok(cache(rp, kind, labels, fields, opts, plan))
}

fn cache(
    rp: &ResourcePath,
    kind: Arc<ResourceKind>,
    labels: LabelSelector,
    fields: FieldSelector,
    opts: ListOptions,
    plan: Plan,
) -> Route {
    Route::Cache(Box::new(CacheRequest {
        kind,
        namespace: rp.namespace.clone(),
        name: rp.name.clone(),
        labels,
        fields,
        opts,
        plan,
    }))
}

/// The LIST rows of reference §1.6.
fn list_plan(opts: &ListOptions) -> Result<Plan, Error> {
    let token = opts.continue_for_list()?;
    let rv = opts.rv_for_list()?;
    let limit = opts.limit();
    Ok(match (token, rv, opts.rv_match()) {
        // A continue token pins the list RV; rv −1 continues at the latest state.
        (Some(ContinueToken { rv, start }), _, _) if rv > 0 => {
            Plan::ListExact { rv: Rv(rv as u64), limit, start: Some(start) }
        }
        (Some(ContinueToken { start, .. }), _, _) => Plan::ListMostRecent { limit, start: Some(start) },
        // Any: the whole list, limit ignored like the apiserver's cache.
        (None, RvParam::Zero, _) => Plan::ListAny,
        (None, RvParam::Unset, _) => Plan::ListMostRecent { limit, start: None },
        (None, RvParam::At(rv), Some(RvMatch::Exact)) => Plan::ListExact { rv, limit, start: None },
        (None, RvParam::At(rv), Some(RvMatch::NotOlderThan)) => Plan::ListNotOlderThan { min_rv: rv, limit },
        // Legacy: N with a limit is an exact read; without one, not older than N.
        (None, RvParam::At(rv), None) if limit.is_some() => Plan::ListExact { rv, limit, start: None },
        (None, RvParam::At(rv), None) => Plan::ListNotOlderThan { min_rv: rv, limit: None },
    })
}

/// The WATCH rows of reference §1.7 (after defaulting).
fn watch_plan(opts: &ListOptions) -> Result<Plan, Error> {
    let rv = opts.rv_for_get_or_watch()?;
    Ok(match (opts.send_initial_events, rv) {
        (Some(true), RvParam::Unset) => Plan::WatchMostRecent { initial: true },
        (Some(true), RvParam::Zero) => Plan::WatchList { min_rv: None },
        (Some(true), RvParam::At(rv)) => Plan::WatchList { min_rv: Some(rv) },
        (Some(false), RvParam::Unset) => Plan::WatchMostRecent { initial: false },
        (Some(false), RvParam::Zero) => Plan::WatchNow,
        (_, RvParam::At(rv)) => Plan::WatchAfter { rv },
        // Defaulting turned RV unset/0 without sendInitialEvents into a watch-list.
        (None, RvParam::Unset) => Plan::WatchMostRecent { initial: true },
        (None, RvParam::Zero) => Plan::WatchList { min_rv: None },
    })
}

#[cfg(test)]
mod tests;
