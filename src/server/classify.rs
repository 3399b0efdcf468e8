//! The cache-or-upstream decision for one request: a pure function of method, path, query,
//! `Accept` and the set of cached resources (docs/design.md §3, docs/apiserver-watch-cache.md §1).
//!
//! Also the apiserver's `RequestInfo` of every request ([`request_info`]: verb, group, version,
//! namespace, resource, subresource, name, as `k8s.io/apiserver/pkg/endpoints/request/
//! requestinfo.go` computes them), which the authorization attributes and the limits
//! ([`is_long_running`]) read instead of looking at the raw request again.
//!
//! Called by `phase::admit` (the `RequestInfo`) and `phase::classify` before anything is
//! served or forwarded. No I/O; tested with a
//! table. Validation errors come out of here with the apiserver's exact texts, in its order:
//! label-selector parse (400) → ListOptions validation (422) → field labels (400) →
//! shard selector (500, the registry parses it before storage) → continue token (400) →
//! resourceVersion (400 for LIST, 500 for GET/WATCH).

use std::sync::Arc;

use http::Method;

use crate::error::Error;
use crate::metadata_only::Repr;
use crate::params::{ContinueToken, ListOptions, RvMatch, RvParam};
use crate::resource::{ResourceKind, Rv};
use crate::selector::{FieldSelector, LabelSelector, ShardError, ShardSelector};

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
    /// The client wants a representation the cache cannot give in JSON (protobuf only, Table,
    /// metadata-only in the wrong form for the verb).
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
    /// The cache has had no proof of being current for longer than `--max-staleness`.
    Stale,
    /// A path the apiserver would route otherwise than its segments read here (an encoded `/`
    /// in a segment), or a namespace or name it would refuse or look up elsewhere, or a GET of
    /// a missing object whose name Go's `%q` would quote otherwise (`serve`): only the
    /// apiserver's own answer, with the caller's identity, is exact.
    UnusualPath,
    /// A `shardSelector` in a form only the apiserver's CEL parser reads exactly (module doc
    /// of `selector::shard`): the upstream decides, and says whether it filtered.
    ShardSelector,
    /// A resource `--cache-memory-limit` stopped caching (`memory`; set by `phase::classify`).
    MemoryLimit,
    /// The resource's cache cannot parse an object the upstream sent (`cache::unparsable`):
    /// it cannot hold the upstream's state until a full list parses whole.
    Unparsable,
    /// Selectors heavier than [`MAX_SELECTOR_WEIGHT`]: matching them against every object (and
    /// every event, for a watch) is CPU the apiserver spends under its own fairness, not on one
    /// of the proxy's workers that every other request shares.
    LargeSelector,
    /// An upgrade (`Connection: Upgrade`, e.g. a WebSocket watch from a browser console): the
    /// apiserver answers a watch's with `101` and one event per WebSocket message, which the
    /// cache does not speak.
    Upgrade,
    /// A refused query the proxy cannot refuse in the apiserver's words: one with a value
    /// holding characters Go's `strconv.Quote` escapes otherwise (or bytes that are not UTF-8),
    /// or a continue token (Go's decoders read them more leniently: trailing bits, line breaks,
    /// keys in any case, duplicates). The apiserver answers it, or serves it.
    UnusualQuery,
}

/// Label requirements (each counted with as many values as it lists) and field terms a cached
/// read may carry; heavier selectors are forwarded. Real clients send a handful; the 16 KiB URL
/// limit allows ~5 000 (`!a1,!a2,…`), each checked against each object's labels.
pub const MAX_SELECTOR_WEIGHT: usize = 128;

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
            ForwardReason::Stale => "stale",
            ForwardReason::UnusualPath => "unusual_path",
            ForwardReason::ShardSelector => "shard_selector",
            ForwardReason::MemoryLimit => "memory_limit",
            ForwardReason::LargeSelector => "large_selector",
            ForwardReason::Unparsable => "unparsable",
            ForwardReason::Upgrade => "upgrade",
            ForwardReason::UnusualQuery => "unusual_query",
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
    /// Legacy watch from RV 0 or unset without `sendInitialEvents` (a `/watch/` path, which is
    /// not defaulted): the cache's current state as ADDED, then live events; no wait, no
    /// initial-events-end bookmark (the cacher's "legacy case", RV 0 required).
    WatchState,
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
    /// The objects as received or metadata only, in JSON or protobuf (`accept::negotiate`).
    pub repr: Repr,
    /// A LIST's or WATCH's parsed `shardSelector` (KEP-5866): only objects in the shard are
    /// served, and a LIST says so in `metadata.shardInfo`.
    pub shard: Option<Arc<ShardSelector>>,
    /// How the cache's error answers are written ([`error_encoding`]: negotiated apart, as the
    /// apiserver's `ErrorNegotiated`, so a metadata-only protobuf reader gets JSON Statuses).
    pub error_encoding: ErrorEncoding,
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

/// What the apiserver's `RequestInfoFactory.NewRequestInfo` makes of a request: the verb
/// (`get`, `list`, `watch`, `create`, …; the lowercase HTTP method for non-resource requests)
/// and the resource it is about. Authorization attributes are exactly these.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestInfo {
    pub is_resource_request: bool,
    pub path: String,
    pub verb: String,
    pub api_group: String,
    pub api_version: String,
    pub namespace: String,
    pub resource: String,
    pub subresource: String,
    pub name: String,
    /// The raw `fieldSelector` / `labelSelector` (first value) of a list, watch or
    /// deletecollection whose verb does not come from a `/watch/` path: what a 1.31+
    /// apiserver puts in its authorization attributes (KEP-4601).
    pub field_selector: String,
    pub label_selector: String,
}

/// `RequestInfoFactory.NewRequestInfo` (API prefixes `api` (groupless) and `apis`):
///
/// - `/{watch|proxy}/…` sets the verb; otherwise it comes from the method;
/// - `/namespaces/{ns}/…` sets the namespace — also for `/namespaces/{ns}` itself (the
///   namespace object: namespace = name = ns) and its `status` / `finalize` subresources;
/// - a GET without a name is a `watch` when the first `watch` parameter is not `0`/`false`
///   (any case), else a `list`; its name is then the `metadata.name=X` of the field selector
///   when the query decodes and X is a valid path segment name;
/// - a DELETE without a name is a `deletecollection`.
///
/// Like Go's, it splits the decoded path (`req.URL.Path`): an encoded `/` (`%2F`) separates
/// segments here as it does in the apiserver's routing and authorization. A path whose segments
/// read one by one would say otherwise is never served from the cache ([`classify`] forwards
/// it as [`ForwardReason::UnusualPath`]), so these attributes always describe what is served.
pub fn request_info(method: &Method, path: &str, query: Option<&str>) -> RequestInfo {
    let mut info = RequestInfo {
        path: path.to_owned(),
        verb: method.as_str().to_ascii_lowercase(),
        ..RequestInfo::default()
    };
    let decoded = percent_encoding::percent_decode_str(path).decode_utf8_lossy();
    let trimmed = decoded.trim_matches('/');
    if trimmed.is_empty() {
        return info;
    }
    let parts: Vec<String> = trimmed.split('/').map(str::to_owned).collect();
    let (group, rest) = match parts[0].as_str() {
        "api" if parts.len() >= 3 => ("", &parts[1..]),
        "apis" if parts.len() >= 4 => (parts[1].as_str(), &parts[2..]),
        _ => return info,
    };
    info.is_resource_request = true;
    info.api_group = group.to_owned();
    info.api_version = rest[0].clone();
    let mut cur = &rest[1..];
    let verb_via_path = matches!(cur[0].as_str(), "watch" | "proxy");
    if verb_via_path {
        if cur.len() < 2 {
            // The apiserver fails such a request ("unable to determine kind and namespace").
            return info;
        }
        info.verb = cur[0].clone();
        cur = &cur[1..];
    } else {
        info.verb = match *method {
            Method::POST => "create",
            Method::GET | Method::HEAD => "get",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE => "delete",
            _ => "",
        }
        .into();
    }
    if cur[0] == "namespaces" && cur.len() > 1 {
        info.namespace = cur[1].clone();
        if cur.len() > 2 && !matches!(cur[2].as_str(), "status" | "finalize") {
            cur = &cur[2..];
        }
    }
    if cur.len() >= 3 && info.verb != "proxy" {
        info.subresource = cur[2].clone();
    }
    if cur.len() >= 2 {
        info.name = cur[1].clone();
    }
    info.resource = cur[0].clone();
    if info.name.is_empty() && info.verb == "get" {
        let query = query.unwrap_or("");
        let first = |key: &str| {
            crate::params::query_pairs(query).find(|(k, _)| k == key).map(|(_, v)| v.into_owned())
        };
        info.verb = match first("watch") {
            Some(v) if crate::params::parse_bool(&v) => "watch",
            _ => "list",
        }
        .into();
        // Go decodes all of ListOptions first; a query that does not decode names nothing.
        let decoded =
            ListOptions::from_query(query).ok().filter(|o| LabelSelector::parse(&o.label_selector).is_ok());
        if let Some(Ok(Some(name))) = decoded.map(|o| exact_name(&o.field_selector)) {
            if valid_path_segment_name(&name) {
                info.name = name;
            }
        }
    }
    if info.name.is_empty() && info.verb == "delete" {
        info.verb = "deletecollection".into();
    }
    // requestinfo.go (1.31+): "Don't support selector authorization on requests that used the
    // deprecated verb-via-path mechanism"; the raw query values, read even when the rest of
    // the ListOptions does not decode.
    if !verb_via_path && matches!(info.verb.as_str(), "list" | "watch" | "deletecollection") {
        let first = |key: &str| {
            crate::params::query_pairs(query.unwrap_or(""))
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.into_owned())
        };
        info.field_selector = first("fieldSelector").unwrap_or_default();
        info.label_selector = first("labelSelector").unwrap_or_default();
    }
    info
}

/// `fields.ParseSelector(s).RequiresExactMatch("metadata.name")`: the syntax only (no field
/// label conversion), terms in sorted order, the first `metadata.name=` / `==` term's
/// unescaped value. `Err` when the selector does not parse.
fn exact_name(selector: &str) -> Result<Option<String>, ()> {
    let terms = crate::selector::parse_terms(selector).map_err(|_| ())?;
    Ok(terms.into_iter().find(|t| t.field == "metadata.name" && t.equals).map(|t| t.value))
}

/// `path.IsValidPathSegmentName`: not `.` or `..`, no `/` or `%`.
pub fn valid_path_segment_name(name: &str) -> bool {
    name != "." && name != ".." && !name.contains(['/', '%'])
}

impl ResourcePath {
    /// Whether the cache may answer for this path: every segment reads the same one by one as
    /// the apiserver reads it from the decoded path (no encoded `/`), the namespace is one the
    /// apiserver could hold (a DNS-1123 label) and the name is a valid path segment. Anything
    /// else is the apiserver's to answer (a subresource it routes to, a 400, a 404).
    pub fn is_plain(&self) -> bool {
        let segments =
            [Some(&self.group), Some(&self.version), Some(&self.resource), self.namespace.as_ref()];
        segments.into_iter().flatten().all(|s| !s.contains('/'))
            && self.namespace.as_deref().is_none_or(crate::selector::is_dns1123_label_name)
            && self.name.as_deref().is_none_or(valid_path_segment_name)
    }
}

/// Whether a request may run for long and is therefore exempt from the in-flight limit and
/// the request timeout: the apiserver's `BasicLongRunningRequestCheck` (verbs `watch` and
/// `proxy`, subresources `proxy` and `log`, followed or not: a plain read of a large log over a
/// slow link was cut at `--request-timeout` here until 2026-11-29, found by a review) except
/// that `exec` / `attach` / `portforward` count only once they have upgraded (the wait for the
/// upstream's `101` counts as a request like any other; the spliced connection then holds
/// nothing). Everything comes from the [`RequestInfo`], never from raw query flags on other
/// paths.
pub fn is_long_running(info: &RequestInfo) -> bool {
    if matches!(info.verb.as_str(), "watch" | "proxy") {
        return info.is_resource_request;
    }
    info.is_resource_request && matches!(info.subresource.as_str(), "proxy" | "log")
}

/// The apiserver's own `LongRunningRequestCheck` (`BasicLongRunningRequestCheck` with the
/// verbs watch and proxy, the subresources attach, exec, proxy, log and portforward, and
/// `/debug/pprof/`): what its `WithRequestDeadline` leaves alone (the `timeout` parameter is not
/// read). Wider than [`is_long_running`], which counts exec and attach against the in-flight
/// limit.
pub fn apiserver_long_running(info: &RequestInfo, path: &str) -> bool {
    matches!(info.verb.as_str(), "watch" | "proxy")
        || (info.is_resource_request
            && matches!(info.subresource.as_str(), "attach" | "exec" | "proxy" | "log" | "portforward"))
        || (!info.is_resource_request && path.starts_with("/debug/pprof/"))
}

/// Whether a long-running request starts with a read before it streams: a watch with its
/// `resourceVersion` unset (its first value, empty or absent), whose start asks the upstream
/// (a probe, or a watch-list's metadata LIST; `server::consistent`). `admit` holds an in-flight
/// permit for that start, as API Priority and Fairness holds a watch's seat until the watch is
/// initialized.
pub fn starts_with_a_read(info: &RequestInfo, query: Option<&str>) -> bool {
    info.verb == "watch"
        && info.is_resource_request
        && crate::params::query_pairs(query.unwrap_or(""))
            .find(|(k, _)| k == "resourceVersion")
            .is_none_or(|(_, v)| v.is_empty())
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
    if !rp.is_plain() {
        return Route::Forward(ForwardReason::UnusualPath);
    }
    if rp.namespace.is_some() && !kind.namespaced {
        // e.g. /api/v1/namespaces/ns/nodes: let the apiserver answer as it does.
        return Route::Forward(ForwardReason::NotCached);
    }
    if kind.namespaced && rp.namespace.is_none() && rp.name.is_some() {
        // `/api/v1/configmaps/a`, `/api/v1/watch/configmaps/a`: the apiserver has no such route
        // (a namespaced object is named only within its namespace); its own 404.
        return Route::Forward(ForwardReason::UnusualPath);
    }
    let Some(negotiated) = accept::negotiate(accept, kind.builtin) else {
        return Route::Forward(ForwardReason::Accept);
    };
    // The cache writes no YAML: a client whose errors the apiserver would write in YAML is its.
    if error_encoding(accept) == ErrorEncoding::Yaml {
        return Route::Forward(ForwardReason::Accept);
    }
    match decide(&rp, kind, query.unwrap_or(""), negotiated) {
        Ok(Route::Cache(mut cr)) => {
            cr.error_encoding = error_encoding(accept);
            Route::Cache(cr)
        }
        Ok(r) => r,
        Err(_) if query.is_some_and(unusual_query) => Route::Forward(ForwardReason::UnusualQuery),
        Err(e) => Route::Reject(e),
    }
}

/// Whether a refusal of `query` might not be in the apiserver's words ([`ForwardReason::UnusualQuery`]).
fn unusual_query(query: &str) -> bool {
    crate::params::query_pairs_bytes(query)
        .any(|(k, v)| (k == b"continue" && !v.is_empty()) || v.iter().any(|b| !(b' '..=b'~').contains(b)))
}

fn decide(
    rp: &ResourcePath,
    kind: Arc<ResourceKind>,
    query: &str,
    negotiated: Negotiated,
) -> Result<Route, Error> {
    // `?watch=1` on an object URL is a plain GET; `/watch/` makes anything a watch.
    let is_get = rp.name.is_some() && !rp.watch_prefix;
    let mut opts = if is_get { ListOptions::for_get(query)? } else { ListOptions::from_query(query)? };
    let is_list = !is_get && !opts.watch && !rp.watch_prefix;
    let Some(repr) = accept::repr_for(negotiated, is_list) else {
        return Ok(Route::Forward(ForwardReason::Accept));
    };
    if is_get {
        // GetOptions carry only resourceVersion: every other parameter is ignored.
        let plan = match opts.rv_for_get_or_watch()? {
            RvParam::Unset => return Ok(Route::Forward(ForwardReason::MostRecentGet)),
            RvParam::Zero => Plan::Get { min_rv: None },
            RvParam::At(rv) => Plan::Get { min_rv: Some(rv) },
        };
        return Ok(cache(
            rp,
            kind,
            LabelSelector::default(),
            FieldSelector::default(),
            opts,
            plan,
            repr,
            None,
        ));
    }
    let labels = LabelSelector::parse(&opts.label_selector)?;
    // Decoding parses the field selector too, before validation (`ListOptions::check_selector_syntax`).
    crate::selector::parse_terms(&opts.field_selector)?;
    // Defaulted and validated as the query says (`get.go` `listOpts`); a `/watch/` path makes
    // it a watch only then (`forceWatch`), so such a watch is never defaulted to a watch-list
    // (a review: it got the initial-events-end bookmark, and the list's 422s were not given).
    opts.apply_defaults();
    opts.validate()?;
    opts.watch |= rp.watch_prefix;
    let fields = match FieldSelector::parse(&opts.field_selector, &kind) {
        Ok(f) => f,
        // A custom resource may declare selectable fields the proxy does not know: let the
        // apiserver decide.
        Err(_) if !kind.builtin => return Ok(Route::Forward(ForwardReason::UnknownField)),
        Err(e) => return Err(e),
    };
    // A watch of one object: any field selector must require exactly its name (1.36 `get.go`
    // `ListResource`; `metadata.namespace=ns` or `metadata.name!=a` alone is refused too).
    if let Some(name) = &rp.name {
        if !fields.is_empty() && fields.exact("metadata.name") != Some(name.as_str()) {
            return Err(Error::BadRequest("fieldSelector metadata.name doesn't match requested name".into()));
        }
    }
    if labels.weight() + fields.len() > MAX_SELECTOR_WEIGHT {
        return Ok(Route::Forward(ForwardReason::LargeSelector));
    }
    // 1.36 with ShardedListAndWatch on: the registry parses the selector before it asks
    // storage (so before continue / resourceVersion errors) and fails with a plain error.
    let shard = match opts.shard_selector.as_str() {
        "" => None,
        raw => match ShardSelector::parse(raw) {
            Ok(s) => Some(Arc::new(s)),
            Err(ShardError::Invalid(m)) => {
                return Err(Error::InternalRaw(format!("invalid shard selector: {m}")))
            }
            Err(ShardError::Unsupported) => return Ok(Route::Forward(ForwardReason::ShardSelector)),
        },
    };
    let plan = if opts.watch { watch_plan(&opts)? } else { list_plan(&opts)? };
    Ok(cache(rp, kind, labels, fields, opts, plan, repr, shard))
}

#[allow(clippy::too_many_arguments)]
fn cache(
    rp: &ResourcePath,
    kind: Arc<ResourceKind>,
    labels: LabelSelector,
    fields: FieldSelector,
    opts: ListOptions,
    plan: Plan,
    repr: Repr,
    shard: Option<Arc<ShardSelector>>,
) -> Route {
    Route::Cache(Box::new(CacheRequest {
        kind,
        namespace: rp.namespace.clone(),
        name: rp.name.clone(),
        labels,
        fields,
        opts,
        plan,
        repr,
        shard,
        error_encoding: ErrorEncoding::Json,
    }))
}

/// The LIST rows of docs/apiserver-watch-cache.md §1.6.
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
        // Any: the whole list, limit ignored like the apiserver's cache — when the text is `0`:
        // 1.36 compares the text (`computeListLimit`, `ShouldDelegateList`), so another spelling
        // of zero (`00`) keeps its limit, and with a limit or `Exact` it is an exact read at 0,
        // which storage answers at its latest revision.
        (None, RvParam::Zero, _) if opts.resource_version == "0" => Plan::ListAny,
        (None, RvParam::Zero, Some(RvMatch::NotOlderThan)) => Plan::ListNotOlderThan { min_rv: Rv(0), limit },
        (None, RvParam::Zero, Some(RvMatch::Exact)) => Plan::ListMostRecent { limit, start: None },
        (None, RvParam::Zero, None) if limit.is_some() => Plan::ListMostRecent { limit, start: None },
        (None, RvParam::Zero, None) => Plan::ListAny,
        (None, RvParam::Unset, _) => Plan::ListMostRecent { limit, start: None },
        (None, RvParam::At(rv), Some(RvMatch::Exact)) => Plan::ListExact { rv, limit, start: None },
        (None, RvParam::At(rv), Some(RvMatch::NotOlderThan)) => Plan::ListNotOlderThan { min_rv: rv, limit },
        // Legacy: N with a limit is an exact read; without one, not older than N.
        (None, RvParam::At(rv), None) if limit.is_some() => Plan::ListExact { rv, limit, start: None },
        (None, RvParam::At(rv), None) => Plan::ListNotOlderThan { min_rv: rv, limit: None },
    })
}

/// The WATCH rows of docs/apiserver-watch-cache.md §1.7 (after defaulting).
fn watch_plan(opts: &ListOptions) -> Result<Plan, Error> {
    let rv = opts.rv_for_get_or_watch()?;
    Ok(match (opts.send_initial_events, rv) {
        (Some(true), RvParam::Unset) => Plan::WatchMostRecent { initial: true },
        (Some(true), RvParam::Zero) => Plan::WatchList { min_rv: None },
        (Some(true), RvParam::At(rv)) => Plan::WatchList { min_rv: Some(rv) },
        (Some(false), RvParam::Unset) => Plan::WatchMostRecent { initial: false },
        (Some(false), RvParam::Zero) => Plan::WatchNow,
        (_, RvParam::At(rv)) => Plan::WatchAfter { rv },
        // Not defaulted (a `/watch/` path): the legacy watch.
        (None, RvParam::Unset | RvParam::Zero) => Plan::WatchState,
    })
}

mod accept;
pub mod autoneg;

pub use accept::{
    asks_to_drop_managed_fields, error_encoding, error_encoding_known, error_in_proto, Negotiated, Wanted,
};
pub use autoneg::ErrorEncoding;

#[cfg(test)]
mod tests;
