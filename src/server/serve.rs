//! Serving a classified request from the cache: GET, LIST and WATCH with the apiserver's
//! resourceVersion semantics (docs/apiserver-watch-cache.md §1.5–§1.7), or the decision that it must go upstream
//! after all (not fresh enough in time, outside the history window, not synced).
//!
//! Called by `phase::dispatch` with a `CacheRequest` from `classify` and the resource's
//! `cache::Reader`. Bodies are the stored bytes, streamed.

use std::sync::Arc;
use std::time::Duration;

use http::{header, HeaderValue, Response, StatusCode};
use tokio::time::Instant;

use super::body::{self, Body};
use super::classify::{CacheRequest, ForwardReason, Plan};
use super::consistent::{Initial, Prober};
use crate::cache::{Filter, Page, Reader, WatchRequest, WatchStart};
use crate::error::Error;
use crate::metadata_only::Repr;
use crate::metrics::{Metrics, ReadWait};
use crate::params::WatchTimeout;
use crate::resource::{frame_event, EventType, Rv};
use crate::upstream::{MetadataPage, Selection};

/// Tunables of cache serving.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// How long a NotOlderThan read waits for the cache to catch up (3 s like the apiserver).
    pub freshness_wait: Duration,
    /// Watches without `timeoutSeconds` last this × uniform[1, 2) (`--min-request-timeout`).
    pub min_request_timeout: Duration,
    /// Serve Most Recent reads from the cache after a consistent-read probe
    /// (`--consistent-reads=cache`), or always forward them (`upstream`).
    pub consistent_reads: bool,
    /// How long a Most Recent LIST waits for the cache to reach the probed RV before going
    /// upstream (0: serve only what is already proven, forward the rest at once).
    pub consistent_wait: Duration,
    /// Past this long without proof that the cache is current, its reads are forwarded
    /// (`--max-staleness`; zero: never).
    pub max_staleness: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            freshness_wait: Duration::from_secs(3),
            min_request_timeout: Duration::from_secs(1800),
            consistent_reads: true,
            consistent_wait: Duration::ZERO,
            max_staleness: Duration::from_secs(180),
        }
    }
}

/// What serving produced.
pub enum Outcome {
    Response(Response<Body>),
    /// The cache cannot answer this one: forward it unchanged.
    Forward(ForwardReason),
}

impl From<Error> for Outcome {
    fn from(e: Error) -> Self {
        Outcome::Response(body::error(e))
    }
}

/// The cache of one resource and its consistent-read prober.
pub struct Source<'a> {
    pub reader: &'a Reader,
    pub prober: &'a Prober,
    pub metrics: &'a Metrics,
    /// Who authenticated (`None` with `--auth=none`): the upstream reads the proxy makes for
    /// the request are counted against that user's share (`consistent`).
    pub user: Option<Arc<str>>,
}

/// `reader.wait_for`, observed as a freshness read wait.
async fn wait_fresh(src: &Source<'_>, rv: Rv, wait: Duration) -> Result<(), Error> {
    let started = Instant::now();
    let r = src.reader.wait_for(rv, wait).await;
    let gr = src.reader.kind().group_resource();
    src.metrics.read_wait(&gr, ReadWait::Freshness, started.elapsed().as_secs_f64());
    r
}

/// Serves `req`, which arrived at `arrived`, from the cache.
pub async fn serve(req: &CacheRequest, src: Source<'_>, opts: &ServeOptions, arrived: Instant) -> Outcome {
    // Protobuf only while every object of the resource could be encoded exactly.
    if req.repr.is_proto() && !src.reader.proto_type().serves(req.repr.is_metadata()) {
        return Outcome::Forward(ForwardReason::Accept);
    }
    let served = serve_inner(req, &src, opts, arrived).await;
    // Dropped for --cache-memory-limit after this request was classified: what it read may be
    // the emptied cache (an empty list, a 404, a closed watch), so it goes where the requests
    // classified after the drop go. Checked after the read (`Reader::released`).
    if src.reader.released() {
        return Outcome::Forward(ForwardReason::MemoryLimit);
    }
    // Unservable while this request waited (`cache::unparsable`): what it got is an error or a
    // state the cache no longer stands by; the upstream answers instead.
    if matches!(served, Err(Error::Unparsable)) || src.reader.progress().unservable {
        return Outcome::Forward(ForwardReason::Unparsable);
    }
    let mut outcome = match served {
        Ok(s) => s,
        Err(e) => Outcome::Response(body::error_as(e, req.error_encoding)),
    };
    // The upstream's warnings about the resource (a deprecated API's), as its answers carry.
    if let Outcome::Response(resp) = &mut outcome {
        for w in src.reader.warnings().iter() {
            if let Ok(v) = HeaderValue::from_str(w) {
                resp.headers_mut().append(header::WARNING, v);
            }
        }
    }
    outcome
}

/// A Most Recent LIST's proof of freshness: the cache RV is at least a revision the upstream
/// issued after the request arrived (waiting at most `--consistent-read-wait`, 0 by default).
/// `false` means forward it now (see `server::consistent`).
async fn proven_fresh(src: &Source<'_>, opts: &ServeOptions, arrived: Instant) -> bool {
    if !opts.consistent_reads || !src.prober.probes_streak.should_try() {
        return false;
    }
    let started = Instant::now();
    let r = match src.prober.fresh_rv(arrived).await {
        Ok(f) => f.rv,
        Err(e) => {
            tracing::debug!(error = %e, "consistent-read probe failed; forwarding");
            return false;
        }
    };
    // The upstream is at `r` now: until the cache gets there it is behind (cache lag).
    src.reader.upstream_at(r);
    let proven = if opts.consistent_wait.is_zero() {
        let p = src.reader.progress();
        p.ready && p.rv >= r
    } else {
        src.reader.wait_for(r, opts.consistent_wait).await.is_ok()
    };
    src.prober.probes_streak.record(proven);
    let gr = src.reader.kind().group_resource();
    src.metrics.read_wait(&gr, ReadWait::Consistent, started.elapsed().as_secs_f64());
    proven
}

/// A Most Recent LIST the probe could not prove: served from the cache at the upstream's
/// revision R when a metadata-only upstream LIST of the same selection shows the cache's page
/// is exactly the state at R; else forwarded (see `server::consistent`).
async fn proven_by_metadata(
    src: &Source<'_>,
    req: &CacheRequest,
    limit: Option<usize>,
    arrived: Instant,
) -> Result<Outcome, Error> {
    let reader = src.reader;
    if !src.prober.metadata_streak.should_try() {
        return Ok(Outcome::Forward(ForwardReason::MostRecent));
    }
    let upstream_limit = limit.map(|l| l.min(u32::MAX as usize) as u32);
    let histories = reader.histories();
    let meta = match src.prober.metadata(selection(req), upstream_limit, arrived, src.user.clone()).await {
        Ok(m) => m,
        Err(e) => {
            tracing::debug!(error = %e, "metadata proof failed; forwarding");
            return Ok(Outcome::Forward(ForwardReason::MostRecent));
        }
    };
    let mut snap = reader.snapshot();
    // A state of another history than the page's proves nothing (its RV names another state).
    if snap.histories != histories {
        return Ok(Outcome::Forward(ForwardReason::MostRecent));
    }
    let caught_up = snap.rv >= meta.rv;
    // The metadata page is the unsharded selection's (the proxy's own LIST carries no
    // shardSelector): it proves a sharded page only when the cache has caught up.
    if !caught_up && req.shard.is_some() {
        return Ok(Outcome::Forward(ForwardReason::MostRecent));
    }
    if !caught_up {
        snap.rv = meta.rv;
    }
    let page = || limit.map(|limit| Page { limit, start: None, token_rv: snap.rv.0 as i64 });
    // Read as 1.36 reads a Most Recent list (from its node index, `list`).
    let Some(mut body) = reader.list(&snap, &filter(req, false).with_node_index(true), page()) else {
        return Ok(Outcome::Forward(ForwardReason::Accept));
    };
    // Caught up: fresh by RV alone. Else the cache's page must be exactly the upstream's at R.
    let mut proven = caught_up || same_page(&body, &meta);
    if !proven && limit.is_some() && req.fields.exact("spec.nodeName").is_some() {
        // An upstream that pages a node's pods from its whole range (before 1.36: from etcd)
        // continues where the index would not: the same page read so proves it too.
        if let Some(whole) = reader.list(&snap, &filter(req, false), page()) {
            if same_page(&whole, &meta) {
                (body, proven) = (whole, true);
            }
        }
    }
    src.prober.metadata_streak.record(proven);
    if !proven {
        return Ok(Outcome::Forward(ForwardReason::MostRecent));
    }
    Ok(respond_list(src, body, req.repr))
}

/// Whether a page rendered from the cache holds exactly the objects (same keys, same
/// versions, same order) and continuation of the upstream's metadata page.
fn same_page(body: &crate::cache::ListBody, meta: &MetadataPage) -> bool {
    body.versions().eq(meta.items.iter().map(|(ns, n, rv)| (ns.as_str(), n.as_str(), *rv)))
        && body.continue_token.is_some() == meta.continue_token.is_some()
        && body.remaining.map(|n| n as u64) == meta.remaining
}

/// The upstream selection of a watch: its namespace and selectors, a name as `metadata.name`
/// (escaped: a `,` or `=` in a name must not add a term to a LIST the proxy makes as itself).
fn selection(req: &CacheRequest) -> Selection {
    let mut fields = req.opts.field_selector.clone();
    if let Some(name) = &req.name {
        if !fields.is_empty() {
            fields.push(',');
        }
        fields.push_str("metadata.name=");
        fields.push_str(&crate::selector::escape_field_value(name));
    }
    Selection {
        namespace: req.namespace.clone(),
        label_selector: req.opts.label_selector.clone(),
        field_selector: fields,
    }
}

async fn serve_inner(
    req: &CacheRequest,
    src: &Source<'_>,
    opts: &ServeOptions,
    arrived: Instant,
) -> Result<Outcome, Error> {
    let reader = src.reader;
    let progress = reader.progress();
    if progress.unservable {
        return Ok(Outcome::Forward(ForwardReason::Unparsable));
    }
    // A relist that has not landed within `--max-staleness` (lists failing, or refused by the
    // byte budget, on this replica only perhaps): forwarded, not 429 for as long as it lasts —
    // the replica stays in service (`Readiness::blocking`), and the upstream can answer.
    let stale = too_stale(reader, opts);
    let relist_overdue = progress.rv > Rv(0) && stale;
    if !progress.ready && !relist_overdue {
        return Ok(not_ready(req, &progress));
    }
    if stale {
        return Ok(Outcome::Forward(ForwardReason::Stale));
    }
    let kind = reader.kind();
    match &req.plan {
        Plan::Get { min_rv } => {
            if let Some(rv) = min_rv {
                if wait_fresh(src, *rv, opts.freshness_wait).await.is_err() {
                    return Ok(Outcome::Forward(ForwardReason::NotFresh));
                }
            }
            let ns = req.namespace.as_deref().unwrap_or("");
            let name = req.name.as_deref().unwrap_or("");
            match reader.get(ns, name) {
                Some(obj) => {
                    let Some([a, b, c]) = obj.chunks_as(req.repr) else {
                        return Ok(Outcome::Forward(ForwardReason::Accept));
                    };
                    // JSON ends with a newline, as Go's JSON encoder ends the apiserver's.
                    let end = if req.repr.is_proto() { c } else { bytes::Bytes::from_static(b"\n") };
                    let chunks = vec![a, b, end];
                    let len: usize = chunks.iter().map(|c| c.len()).sum();
                    let mut resp =
                        response(StatusCode::OK, body::chunks(chunks), content_type(req.repr, false));
                    // Known length: lets a large object be gzip'd like the apiserver's (> 128 KiB).
                    resp.headers_mut().insert(header::CONTENT_LENGTH, HeaderValue::from(len));
                    Ok(Outcome::Response(resp))
                }
                // A name Go's `%q` would quote otherwise than `go_quote` (a control or
                // non-ASCII character: RBAC and a few other kinds allow any but `/` and `%`):
                // the apiserver says it is not found, in its words.
                None if !name.bytes().all(|b| (b' '..=b'~').contains(&b)) => {
                    Ok(Outcome::Forward(ForwardReason::UnusualPath))
                }
                None => Err(Error::not_found(kind, name)),
            }
        }
        Plan::ListAny => list(src, req, reader.snapshot(), None),
        Plan::ListNotOlderThan { min_rv, limit } => {
            if wait_fresh(src, *min_rv, opts.freshness_wait).await.is_err() {
                return Ok(Outcome::Forward(ForwardReason::NotFresh));
            }
            let snap = reader.snapshot();
            let page = limit.map(|limit| Page { limit, start: None, token_rv: snap.rv.0 as i64 });
            list(src, req, snap, page)
        }
        Plan::ListExact { rv, limit, start } => {
            // A continue token the cache has not reached (issued by the upstream, or by the
            // metadata proof at the upstream's revision): the upstream serves it at once.
            if *rv > reader.progress().rv && start.is_some() {
                return Ok(Outcome::Forward(ForwardReason::NotFresh));
            }
            if *rv > reader.progress().rv && wait_fresh(src, *rv, opts.freshness_wait).await.is_err() {
                return Ok(Outcome::Forward(ForwardReason::NotFresh));
            }
            let Some(snap) = reader.snapshot_at(*rv) else {
                return Ok(Outcome::Forward(ForwardReason::OutsideWindow));
            };
            let page = limit.map(|limit| Page { limit, start: start.clone(), token_rv: rv.0 as i64 });
            // A continue token without a limit still lists from its start key.
            let page = page.or_else(|| {
                start.clone().map(|s| Page { limit: usize::MAX, start: Some(s), token_rv: rv.0 as i64 })
            });
            list(src, req, snap, page)
        }
        Plan::ListMostRecent { limit, start: None } if opts.consistent_reads => {
            if proven_fresh(src, opts, arrived).await {
                let snap = reader.snapshot();
                let page = limit.map(|limit| Page { limit, start: None, token_rv: snap.rv.0 as i64 });
                return list(src, req, snap, page);
            }
            proven_by_metadata(src, req, *limit, arrived).await
        }
        Plan::ListMostRecent { limit, start } => {
            if !proven_fresh(src, opts, arrived).await {
                return Ok(Outcome::Forward(ForwardReason::MostRecent));
            }
            let snap = reader.snapshot();
            let token_rv = snap.rv.0 as i64;
            let page = match (limit, start) {
                (Some(limit), start) => Some(Page { limit: *limit, start: start.clone(), token_rv }),
                (None, Some(s)) => Some(Page { limit: usize::MAX, start: Some(s.clone()), token_rv }),
                (None, None) => None,
            };
            list(src, req, snap, page)
        }
        Plan::WatchMostRecent { .. } if !opts.consistent_reads => {
            Ok(Outcome::Forward(ForwardReason::MostRecent))
        }
        // Events after a revision issued after the request arrived; no proof needed: events up
        // to it are skipped and bookmarks held until the cache passes it.
        Plan::WatchMostRecent { initial: false } => match src.prober.fresh_rv(arrived).await {
            Ok(f) => watch(reader, req, opts, WatchStart::MostRecent { rv: f.rv, histories: f.histories }),
            Err(e) => {
                tracing::debug!(error = %e, "consistent-read probe failed; forwarding");
                Ok(Outcome::Forward(ForwardReason::MostRecent))
            }
        },
        // Watch-list: the initial state proven by one upstream consistent metadata LIST
        // (shared), the initial objects and the live stream from the cache.
        Plan::WatchMostRecent { initial: true } => {
            match src
                .prober
                .initial(selection(req), filter(req, true).with_shard(None), arrived, src.user.clone())
                .await
            {
                Ok(Initial::Cache) => watch(reader, req, opts, WatchStart::InitialEvents),
                Ok(Initial::Proven { rv, snapshot }) => {
                    watch(reader, req, opts, WatchStart::Proven { rv, snapshot })
                }
                Err(e) => {
                    tracing::debug!(error = %e, "initial list failed; forwarding the watch");
                    Ok(Outcome::Forward(ForwardReason::MostRecent))
                }
            }
        }
        Plan::WatchAfter { rv } => {
            // Above the cache's RV, after the upstream's storage went back past `rv`: of the
            // gone history unless the upstream issued it again (a probe sent after arrival).
            if reader.gone_ahead(*rv) {
                match src.prober.fresh_rv(arrived).await {
                    Ok(f) if f.rv < *rv => return Ok(error_event_stream(&reader.gone(*rv), req.repr)),
                    Ok(_) => {}
                    Err(e) => {
                        tracing::debug!(error = %e, "consistent-read probe failed; forwarding");
                        return Ok(Outcome::Forward(ForwardReason::NotFresh));
                    }
                }
            }
            watch(reader, req, opts, WatchStart::After(*rv))
        }
        Plan::WatchNow => watch(reader, req, opts, WatchStart::Now),
        Plan::WatchState => watch(reader, req, opts, WatchStart::State),
        Plan::WatchList { min_rv } => {
            if let Some(rv) = min_rv {
                if let Err(e) = wait_fresh(src, *rv, opts.freshness_wait).await {
                    if matches!(e, Error::Unparsable) {
                        return Ok(Outcome::Forward(ForwardReason::Unparsable));
                    }
                    return Ok(error_event_stream(&e, req.repr));
                }
            }
            watch(reader, req, opts, WatchStart::InitialEvents)
        }
    }
}

/// Whether the cache has gone longer than `--max-staleness` without proof of being current.
pub fn too_stale(reader: &Reader, opts: &ServeOptions) -> bool {
    !opts.max_staleness.is_zero() && reader.staleness().is_some_and(|s| s > opts.max_staleness)
}

fn filter(req: &CacheRequest, watch_name: bool) -> Filter {
    Filter::new(
        req.namespace.clone(),
        if watch_name { req.name.clone() } else { None },
        req.labels.clone(),
        req.fields.clone(),
    )
    .with_shard(req.shard.clone())
    .with_repr(req.repr)
}

fn list(
    src: &Source<'_>,
    req: &CacheRequest,
    snap: crate::cache::Snapshot,
    page: Option<Page>,
) -> Result<Outcome, Error> {
    // The apiserver's cacher reads these from its indexes (`listLatestRV`); Exact reads and
    // continuations from its snapshots, which have none.
    let by_index =
        matches!(req.plan, Plan::ListNotOlderThan { .. } | Plan::ListMostRecent { start: None, .. });
    match src.reader.list(&snap, &filter(req, false).with_node_index(by_index), page) {
        Some(body) => Ok(respond_list(src, body, req.repr)),
        // An item without an exact protobuf encoding: the apiserver answers it.
        None => Ok(Outcome::Forward(ForwardReason::Accept)),
    }
}

/// The response for a rendered LIST body (counted in the list metrics).
fn respond_list(src: &Source<'_>, body: crate::cache::ListBody, repr: Repr) -> Outcome {
    src.metrics.list_served(&src.reader.kind().group_resource(), body.fetched, body.items);
    let len = body.len;
    let mut resp = response(StatusCode::OK, body::lazy(body.into_chunks()), content_type(repr, false));
    resp.headers_mut().insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    Outcome::Response(resp)
}

fn watch(
    reader: &Reader,
    req: &CacheRequest,
    opts: &ServeOptions,
    start: WatchStart,
) -> Result<Outcome, Error> {
    // `--min-request-timeout` × [1, 2) without `timeoutSeconds`, and at most that with it: the
    // watch was authorized when it started, and its life is bounded (documented in the README).
    let cap = opts.min_request_timeout.mul_f64(1.0 + fastrand::f64());
    let timeout = match req.opts.watch_timeout() {
        WatchTimeout::After(d) => d.min(cap),
        // The apiserver's watch context is already done: 200 and no event, not even an
        // initial one.
        WatchTimeout::Now => {
            let empty = body::chunks(Vec::new());
            return Ok(Outcome::Response(response(StatusCode::OK, empty, content_type(req.repr, true))));
        }
        WatchTimeout::Default => cap,
    };
    let wr = WatchRequest {
        filter: filter(req, true),
        start,
        bookmarks: req.opts.allow_watch_bookmarks,
        deadline: Instant::now() + timeout,
    };
    match reader.watch(wr) {
        Ok(w) => {
            Ok(Outcome::Response(response(StatusCode::OK, body::watch(w), content_type(req.repr, true))))
        }
        // A cache that stopped (shutdown) refuses the watch before any stream, as the
        // apiserver's stopped cacher does (HTTP 503): the client retries, elsewhere.
        Err(e @ Error::ServiceUnavailable(_)) => Err(e),
        // An object of the replay or of the initial events has no exact protobuf encoding.
        Err(Error::NoExactEncoding) => Ok(Outcome::Forward(ForwardReason::Accept)),
        // The cache became unservable since its progress was read (`cache::unparsable`).
        Err(Error::Unparsable) => Ok(Outcome::Forward(ForwardReason::Unparsable)),
        // It was found wrong since then (a relist pending): as for a cache not ready.
        Err(Error::Relisting) => Ok(not_ready(req, &reader.progress())),
        // Cached watches report their other errors (410 too old) as HTTP 200 + one ERROR event.
        Err(e) => Ok(error_event_stream(&e, req.repr)),
    }
}

/// HTTP 200 with exactly one ERROR event carrying the error's Status, then the end.
fn error_event_stream(e: &Error, repr: Repr) -> Outcome {
    let status = e.to_status();
    let frame = if repr.is_proto() {
        match crate::proto::status_event(&status.body) {
            Ok(frame) => frame,
            Err(_) => return Outcome::Forward(ForwardReason::Accept),
        }
    } else {
        frame_event(EventType::Error, &[status.body])
    };
    Outcome::Response(response(StatusCode::OK, body::chunks(vec![frame]), content_type(repr, true)))
}

/// What a request gets while the cache is not synced (docs/apiserver-watch-cache.md §8.2): GETs and plain
/// paginated LISTs go upstream; the rest get 429 `storage is (re)initializing`.
fn not_ready(req: &CacheRequest, p: &crate::cache::Progress) -> Outcome {
    let forward = match &req.plan {
        Plan::Get { .. } => true,
        Plan::ListAny
        | Plan::ListNotOlderThan { .. }
        | Plan::ListExact { .. }
        | Plan::ListMostRecent { .. } => {
            req.opts.limit().is_some()
                && req.labels.is_empty()
                && req.fields.is_empty()
                && req.shard.is_none()
        }
        _ => false,
    };
    if forward {
        return Outcome::Forward(ForwardReason::NotSynced);
    }
    let secs = Instant::now().duration_since(p.since).as_secs_f64();
    let retry_after = (0.06 * secs).exp().clamp(1.0, 30.0) as u32;
    // The apiserver's text alone: why the cache is not ready (the upstream's answer to the
    // proxy's own list, naming its identity) is for the logs and `/readyz?verbose`.
    let message = "storage is (re)initializing".to_owned();
    Outcome::Response(body::error_as(Error::TooManyRequests { message, retry_after }, req.error_encoding))
}

/// The apiserver's `Content-Type` for a representation (a watch stream's in protobuf is
/// `…;stream=watch`; JSON streams are `application/json`).
fn content_type(repr: Repr, watch: bool) -> &'static str {
    match (repr.is_proto(), watch) {
        (false, _) => "application/json",
        (true, false) => crate::proto::CONTENT_TYPE,
        (true, true) => crate::proto::WATCH_CONTENT_TYPE,
    }
}

fn response(code: StatusCode, body: Body, content_type: &'static str) -> Response<Body> {
    let mut resp = Response::new(body);
    *resp.status_mut() = code;
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache, private"));
    resp
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use http_body_util::BodyExt;

    use super::*;
    use crate::cache::{self, CacheOptions};
    use crate::resource::{ResourceKind, Rv};
    use crate::server::classify::{classify, Route};
    use crate::upstream::{Upstream, UpstreamOptions};

    fn kinds() -> Vec<Arc<ResourceKind>> {
        vec![
            Arc::new(ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true)),
            Arc::new(ResourceKind::new("", "v1", "pods", "Pod", true, true)),
        ]
    }

    async fn run(reader: &Reader, path: &str, query: &str) -> Outcome {
        let Route::Cache(cr) = classify(&http::Method::GET, path, Some(query), None, &kinds()[..]) else {
            panic!("not for the cache")
        };
        let upstream = Upstream::new(&UpstreamOptions {
            upstream: Some("http://127.0.0.1:9".into()),
            ..Default::default()
        })
        .unwrap();
        let prober = Prober::new(upstream, reader.clone());
        let opts = ServeOptions { freshness_wait: Duration::from_millis(200), ..Default::default() };
        let metrics = crate::metrics::Metrics::new();
        serve(&cr, Source { reader, prober: &prober, metrics: &metrics, user: None }, &opts, Instant::now())
            .await
    }

    async fn body(s: Outcome) -> (u16, Option<String>, String) {
        let Outcome::Response(r) = s else { panic!("forwarded") };
        let code = r.status().as_u16();
        let ra = r.headers().get("retry-after").map(|v| v.to_str().unwrap().to_owned());
        let b = r.into_body().collect().await.unwrap().to_bytes();
        (code, ra, String::from_utf8(b.to_vec()).unwrap())
    }

    /// The upstream's warnings about the resource (a deprecated API's) ride on every cached
    /// answer, errors too, as on the apiserver's (found by a review: cached reads of
    /// `v1 Endpoints` lost `kubectl`'s deprecation warning).
    #[tokio::test]
    async fn the_upstreams_warnings_ride_on_cached_answers() {
        let (mut w, r) = cache::new(kinds()[0].as_ref().clone(), CacheOptions::default());
        w.replace(Vec::new(), Rv(10));
        let warning = r#"299 - "v1 ConfigMap is deprecated in v1.99+""#;
        let warnings = |o: &Outcome| match o {
            Outcome::Response(r) => {
                r.headers().get_all("warning").iter().map(|v| v.to_str().unwrap().to_owned()).collect()
            }
            Outcome::Forward(_) => vec!["forwarded".to_owned()],
        };
        let list = run(&r, "/api/v1/configmaps", "resourceVersion=0").await;
        assert_eq!(warnings(&list), Vec::<String>::new(), "none yet");
        w.set_warnings(vec![warning.to_owned()]);
        for (path, query) in [
            ("/api/v1/configmaps", "resourceVersion=0"),
            ("/api/v1/namespaces/ns/configmaps/nope", "resourceVersion=0"),
            ("/api/v1/configmaps", "watch=1&resourceVersion=10"),
        ] {
            assert_eq!(warnings(&run(&r, path, query).await), [warning], "{path}?{query}");
        }
        w.set_warnings(Vec::new());
        assert_eq!(warnings(&run(&r, "/api/v1/configmaps", "resourceVersion=0").await), Vec::<String>::new());
    }

    /// A relist that has not landed within `--max-staleness` has its reads forwarded, not
    /// answered 429 for as long as it lasts (the replica stays in service meanwhile).
    #[tokio::test(start_paused = true)]
    async fn a_relist_past_max_staleness_is_forwarded() {
        let (mut w, r) = cache::new(kinds()[0].as_ref().clone(), CacheOptions::default());
        w.replace(Vec::new(), Rv(10));
        w.set_not_ready(Some(
            "relisting: upstream answered HTTP 403: User \"system:serviceaccount:kube-system:kwc\"".into(),
        ));
        let (code, _, b) = body(run(&r, "/api/v1/configmaps", "resourceVersion=0").await).await;
        assert_eq!(code, 429, "a relist under way");
        // The apiserver's text alone: why (the upstream's answer to the proxy's own list,
        // naming its identity) is not the caller's.
        assert!(b.contains(r#""message":"storage is (re)initializing","#) && !b.contains("kwc"), "{b}");
        tokio::time::advance(Duration::from_secs(181)).await;
        assert!(matches!(
            run(&r, "/api/v1/configmaps", "resourceVersion=0").await,
            Outcome::Forward(ForwardReason::Stale)
        ));
    }

    #[tokio::test]
    async fn not_synced_answers_429_or_forwards() {
        let (_w, r) = cache::new(kinds()[0].as_ref().clone(), CacheOptions::default());
        let (code, ra, b) = body(run(&r, "/api/v1/configmaps", "resourceVersion=0").await).await;
        assert_eq!(code, 429);
        assert_eq!(ra.as_deref(), Some("1"));
        assert_eq!(
            b,
            concat!(
                r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"storage is (re)initializing","reason":"TooManyRequests","details":{"retryAfterSeconds":1},"code":429}"#,
                "\n"
            )
        );
        assert_eq!(body(run(&r, "/api/v1/configmaps", "watch=1&resourceVersion=5").await).await.0, 429);
        // A plain paginated list and a GET go where the apiserver would send them: upstream.
        assert!(matches!(
            run(&r, "/api/v1/configmaps", "limit=500&resourceVersion=5").await,
            Outcome::Forward(_)
        ));
        assert!(matches!(
            run(&r, "/api/v1/namespaces/ns/configmaps/a", "resourceVersion=0").await,
            Outcome::Forward(_)
        ));
        // With a selector, a paginated list is a 429 too.
        let s = run(&r, "/api/v1/configmaps", "limit=500&resourceVersion=5&labelSelector=a%3Db").await;
        assert_eq!(body(s).await.0, 429);
    }

    #[tokio::test]
    async fn watch_list_that_cannot_catch_up_gets_a_504_error_event() {
        let (mut w, r) = cache::new(kinds()[0].as_ref().clone(), CacheOptions::default());
        w.replace(Vec::new(), Rv(10));
        let s = run(&r, "/api/v1/configmaps", "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&resourceVersion=500").await;
        let (code, _, b) = body(s).await;
        assert_eq!(code, 200);
        assert_eq!(
            b,
            "{\"type\":\"ERROR\",\"object\":{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\",\"message\":\"Timeout: Too large resource version: 500, current: 10\",\"reason\":\"Timeout\",\"details\":{\"causes\":[{\"reason\":\"ResourceVersionTooLarge\",\"message\":\"Too large resource version\"}],\"retryAfterSeconds\":1},\"code\":504}}\n"
        );
        // A watch-list from an RV older than the history is never a 410: it gets the state.
        let s = run(&r, "/api/v1/configmaps", "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&resourceVersion=3&timeoutSeconds=1").await;
        let (code, _, b) = body(s).await;
        assert_eq!(code, 200);
        assert!(b.starts_with("{\"type\":\"BOOKMARK\""), "{b}");
        assert!(b.contains("k8s.io/initial-events-end"));
    }

    /// A watch the cache can no longer feed (its reflector stopped at shutdown) is an HTTP 503
    /// before any stream, as the apiserver's stopped cacher answers, so that clients retry
    /// elsewhere; a too-old RV stays HTTP 200 + one ERROR 410 event.
    #[tokio::test]
    async fn a_watch_after_the_cache_stopped_is_an_http_503() {
        let (mut w, r) = cache::new(kinds()[0].as_ref().clone(), CacheOptions::default());
        w.replace(Vec::new(), Rv(10));
        w.close_watchers();
        let (code, _, b) = body(run(&r, "/api/v1/configmaps", "watch=1&resourceVersion=10").await).await;
        assert_eq!(code, 503, "{b}");
        assert!(b.starts_with(r#"{"kind":"Status""#), "a Status, not a watch event: {b}");
        let (mut w, r) = cache::new(kinds()[0].as_ref().clone(), CacheOptions::default());
        w.replace(Vec::new(), Rv(10));
        let (code, _, b) = body(run(&r, "/api/v1/configmaps", "watch=1&resourceVersion=3").await).await;
        assert_eq!(code, 200);
        assert!(b.starts_with(r#"{"type":"ERROR""#) && b.contains(r#""code":410"#), "{b}");
    }

    /// A request that took the cache's reader before `--cache-memory-limit` dropped it, and
    /// reads it after its writer emptied it (still "ready": its progress is not touched), is
    /// forwarded: never the emptied cache's empty list, 404 or closed watch.
    #[tokio::test]
    async fn a_read_of_a_cache_dropped_under_it_is_forwarded() {
        let (mut w, r) = cache::new(kinds()[0].as_ref().clone(), CacheOptions::default());
        let json = r#"{"metadata":{"name":"a","namespace":"ns","resourceVersion":"7"}}"#;
        w.replace(vec![w.parse(bytes::Bytes::from(json)).unwrap()], Rv(7));
        let reads = [
            ("/api/v1/configmaps", "resourceVersion=0"),
            ("/api/v1/configmaps", "resourceVersion=7&limit=10"),
            ("/api/v1/namespaces/ns/configmaps/a", "resourceVersion=0"),
            ("/api/v1/configmaps", "watch=1&resourceVersion=7"),
        ];
        for (path, q) in reads {
            assert!(matches!(run(&r, path, q).await, Outcome::Response(_)), "{path}?{q}: served before");
        }
        r.release_at_stop();
        w.close_watchers();
        w.stopped();
        assert!(r.progress().ready, "the emptied cache still reads as ready");
        for (path, q) in reads {
            let got = run(&r, path, q).await;
            assert!(matches!(got, Outcome::Forward(ForwardReason::MemoryLimit)), "{path}?{q}: not forwarded");
        }
    }

    /// A cache that met an object it cannot parse forwards every read (never its state
    /// without that object, never a 429), and a watch that read it ready before is forwarded
    /// when it registers; a list that parses whole serves it again.
    #[tokio::test]
    async fn a_cache_that_cannot_parse_an_object_forwards_every_read() {
        let (mut w, r) = cache::new(kinds()[0].as_ref().clone(), CacheOptions::default());
        let json = r#"{"metadata":{"name":"a","namespace":"ns","resourceVersion":"7"}}"#;
        w.replace(vec![w.parse(bytes::Bytes::from(json)).unwrap()], Rv(7));
        let reads = [
            ("/api/v1/configmaps", "resourceVersion=0"),
            ("/api/v1/configmaps", "resourceVersion=7&limit=10"),
            ("/api/v1/configmaps", "labelSelector=x%3Dy&resourceVersion=0"),
            ("/api/v1/namespaces/ns/configmaps/a", "resourceVersion=0"),
            ("/api/v1/configmaps", "watch=1&resourceVersion=7"),
            ("/api/v1/configmaps", "watch=1&resourceVersion=0"),
        ];
        w.unparsable("bad".into());
        for (path, q) in reads {
            let got = run(&r, path, q).await;
            assert!(matches!(got, Outcome::Forward(ForwardReason::Unparsable)), "{path}?{q}: not forwarded");
        }
        // The watch itself, past the progress check: refused, so it is forwarded.
        let req = WatchRequest {
            filter: Filter::default(),
            start: WatchStart::Now,
            bookmarks: false,
            deadline: Instant::now() + Duration::from_secs(60),
        };
        assert!(matches!(r.watch(req), Err(Error::Unparsable)));
        let json = r#"{"metadata":{"name":"a","namespace":"ns","resourceVersion":"9"}}"#;
        w.replace(vec![w.parse(bytes::Bytes::from(json)).unwrap()], Rv(9));
        for (path, q) in reads {
            let got = run(&r, path, q).await;
            assert!(
                !matches!(got, Outcome::Forward(ForwardReason::Unparsable)),
                "{path}?{q}: still forwarded"
            );
        }
        assert!(matches!(run(&r, reads[0].0, reads[0].1).await, Outcome::Response(_)), "served again");
    }

    /// A read waiting for the cache to reach its RV when the cache meets an object it cannot
    /// parse is forwarded then, not after its whole wait (the cache will not move).
    #[tokio::test(start_paused = true)]
    async fn a_read_waiting_when_the_cache_cannot_parse_an_object_is_forwarded_at_once() {
        let (mut w, r) = cache::new(kinds()[0].as_ref().clone(), CacheOptions::default());
        w.replace(Vec::new(), Rv(7));
        let waiting = tokio::spawn({
            let r = r.clone();
            async move {
                let got =
                    run(&r, "/api/v1/configmaps", "resourceVersion=9&resourceVersionMatch=NotOlderThan")
                        .await;
                (matches!(got, Outcome::Forward(ForwardReason::Unparsable)), Instant::now())
            }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        w.unparsable("bad".into());
        let at = Instant::now();
        let (forwarded, done) = waiting.await.unwrap();
        assert!(forwarded);
        assert_eq!(done, at, "forwarded {:?} after the cache became unservable", done - at);
    }

    #[tokio::test]
    async fn huge_timeout_seconds_is_capped_not_a_panic() {
        let (mut w, r) = cache::new(kinds()[0].as_ref().clone(), CacheOptions::default());
        w.replace(Vec::new(), Rv(10));
        for t in ["9223372036854775807", "9999999999999", "1"] {
            let q = format!("watch=1&resourceVersion=10&timeoutSeconds={t}");
            let Outcome::Response(resp) = run(&r, "/api/v1/configmaps", &q).await else {
                panic!("forwarded")
            };
            assert_eq!(resp.status(), 200, "{t}");
        }
    }

    /// Pods by node, a page of a NotOlderThan list (read from the apiserver's node index): not
    /// continued when the node has no more pods; a legacy-exact page (read from a snapshot's
    /// whole range) is, as the apiserver's.
    #[tokio::test]
    async fn a_nodes_pods_page_is_continued_as_the_apiserver_reads_it() {
        use http_body_util::BodyExt;
        let (mut w, r) = cache::new(kinds()[1].as_ref().clone(), CacheOptions::default());
        let pod = |name: &str, rv: u64, node: &str| {
            let json = format!(
                r#"{{"metadata":{{"name":"{name}","namespace":"ns","resourceVersion":"{rv}"}},"spec":{{"nodeName":"{node}"}}}}"#
            );
            w.parse(bytes::Bytes::from(json)).unwrap()
        };
        let items = vec![pod("a", 2, "n1"), pod("b", 3, "n1"), pod("c", 4, "n2")];
        w.replace(items, Rv(10));
        for (q, continued) in [
            ("resourceVersion=10&resourceVersionMatch=NotOlderThan&limit=2", false),
            ("resourceVersion=10&limit=2", true),
        ] {
            let q = format!("{q}&fieldSelector=spec.nodeName%3Dn1");
            let Outcome::Response(resp) = run(&r, "/api/v1/pods", &q).await else { panic!("forwarded") };
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(v["items"].as_array().map(Vec::len), Some(2), "{q}");
            assert_eq!(
                v["metadata"]["continue"].as_str().is_some_and(|c| !c.is_empty()),
                continued,
                "{q}: {v}"
            );
        }
    }

    /// A negative `timeoutSeconds` ends the watch at once: 200 and no event, not even the
    /// initial ones (Go's timer of a negative duration; recorded from kube-apiserver 1.28.7).
    #[tokio::test(start_paused = true)]
    async fn a_negative_timeout_ends_the_watch_at_once() {
        use http_body_util::BodyExt;
        let (mut w, r) = cache::new(kinds()[0].as_ref().clone(), CacheOptions::default());
        let json = r#"{"metadata":{"name":"a","namespace":"ns","resourceVersion":"10"}}"#;
        let obj = w.parse(bytes::Bytes::from(json)).unwrap();
        w.replace(vec![obj], Rv(10));
        // Go's seconds-to-duration product wraps: 9223372037 s is negative, i64::MIN zero (the
        // default timeout, not tried here: it would outlast the test's minute).
        for (t, events) in [("-1", false), ("9223372037", false), ("1", true)] {
            let q = format!("watch=1&resourceVersion=0&timeoutSeconds={t}");
            let Outcome::Response(resp) = run(&r, "/api/v1/configmaps", &q).await else {
                panic!("forwarded")
            };
            assert_eq!(resp.status(), 200, "{t}");
            let body = tokio::time::timeout(Duration::from_secs(60), resp.into_body().collect()).await;
            let body = body.expect("the watch ended").unwrap().to_bytes();
            assert_eq!(!body.is_empty(), events, "{t}: {}", String::from_utf8_lossy(&body));
        }
    }

    #[test]
    fn a_page_is_proven_only_by_the_same_objects_at_the_same_versions() {
        let (mut w, r) = cache::new(kinds()[0].as_ref().clone(), CacheOptions::default());
        let obj = |name: &str, rv: u64| {
            let json =
                format!(r#"{{"metadata":{{"name":"{name}","namespace":"ns","resourceVersion":"{rv}"}}}}"#);
            w.parse(bytes::Bytes::from(json)).unwrap()
        };
        let objs = vec![obj("a", 3), obj("b", 5), obj("c", 7)];
        w.replace(objs, Rv(7));
        let snap = r.snapshot();
        let page = |limit| Some(Page { limit, start: None, token_rv: 20 });
        let all = r.list(&snap, &Filter::default(), None).unwrap();
        let two = r.list(&snap, &Filter::default(), page(2)).unwrap();
        let meta = |items: &[(&str, u64)], cont: bool, remaining: Option<u64>| MetadataPage {
            rv: Rv(20),
            continue_token: cont.then(|| "t".to_owned()),
            remaining,
            items: items.iter().map(|(n, rv)| ("ns".to_owned(), (*n).to_owned(), Rv(*rv))).collect(),
        };
        assert!(same_page(&all, &meta(&[("a", 3), ("b", 5), ("c", 7)], false, None)));
        assert!(same_page(&two, &meta(&[("a", 3), ("b", 5)], true, Some(1))));
        // Anything that differs is no proof: a newer version, one object more or less, another
        // order, a different continuation or count.
        assert!(!same_page(&all, &meta(&[("a", 3), ("b", 6), ("c", 7)], false, None)));
        assert!(!same_page(&all, &meta(&[("a", 3), ("b", 5)], false, None)));
        assert!(!same_page(&all, &meta(&[("a", 3), ("b", 5), ("c", 7), ("d", 9)], false, None)));
        assert!(!same_page(&all, &meta(&[("b", 5), ("a", 3), ("c", 7)], false, None)));
        assert!(!same_page(&two, &meta(&[("a", 3), ("b", 5)], false, None)));
        assert!(!same_page(&two, &meta(&[("a", 3), ("b", 5)], true, Some(2))));
    }
}
