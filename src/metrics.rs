//! Prometheus metrics: one registry, created by `app`, updated by `server`, the reflectors, the
//! upstream client (through [`crate::upstream::Observer`]), `auth` and `tls`, rendered at
//! `/metrics`. Names follow the apiserver's where one exists (docs/apiserver-watch-cache.md §8.1), prefixed
//! `watchcache_`; every metric is listed in the README's "Metrics" table.
//!
//! Label values are bounded: `resource` is the `group/resource` of a cached resource (or empty),
//! verbs, codes, reasons and `served` come from fixed sets. No user, token, path or namespace is
//! ever a label value. Cumulative values kept by the caches (terminated watchers, fan-out work,
//! deliveries) are counters advanced to the cache's own total at each scrape.

mod process;

use parking_lot::Mutex;
use prometheus::{
    Encoder, Gauge, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

use crate::cache::Reader;

/// Request latency buckets (the apiserver's `apiserver_request_duration_seconds`).
const REQUEST_BUCKETS: &[f64] = &[
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0,
    20.0, 30.0, 45.0, 60.0,
];

/// Read-wait and review buckets: a few milliseconds to the 3 s `--freshness-wait`.
const WAIT_BUCKETS: &[f64] =
    &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0];

/// Watch-delivery lag buckets: from 50 µs (an idle proxy) to the seconds a slow watcher's
/// blocked delivery may wait.
const DELIVERY_BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0,
];

/// Verbs a request can be counted under; anything else (a custom HTTP method) is `other`.
const VERBS: &[&str] = &[
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
    "proxy",
    "post",
    "put",
    "head",
    "options",
    "connect",
    "reject",
];

/// Who answered a request: `cache`, `upstream` (forwarded; `reason` says why) or `proxy` (a
/// refusal or error of the proxy itself: limits, 401/403, validation, timeouts).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Served {
    Cache,
    Upstream(&'static str),
    Proxy,
}

impl Served {
    fn labels(self) -> (&'static str, &'static str) {
        match self {
            Served::Cache => ("cache", ""),
            Served::Upstream(reason) => ("upstream", reason),
            Served::Proxy => ("proxy", ""),
        }
    }
}

/// Which wait a read-wait observation is.
#[derive(Clone, Copy, Debug)]
pub enum ReadWait {
    /// A NotOlderThan / Exact read waiting for the cache RV (`--freshness-wait`).
    Freshness,
    /// A Most Recent LIST: probe plus wait for the probed RV (`--consistent-read-wait`).
    Consistent,
}

/// Which upstream review an auth observation is.
#[derive(Clone, Copy, Debug)]
pub enum Review {
    Token,
    Access,
}

impl Review {
    fn as_str(self) -> &'static str {
        match self {
            Review::Token => "tokenreview",
            Review::Access => "subjectaccessreview",
        }
    }
}

/// The proxy's metrics.
pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    request_duration: HistogramVec,
    in_flight: IntGauge,
    forwarded: IntCounterVec,
    write_stall_cuts: IntCounterVec,
    events: IntCounterVec,
    dispatched: IntCounterVec,
    relists: IntCounterVec,
    objects: IntGaugeVec,
    resource_version: IntGaugeVec,
    watchers: IntGaugeVec,
    terminated: IntCounterVec,
    ended_at_relist: IntCounterVec,
    offered: IntCounterVec,
    watch_shards: IntGaugeVec,
    shard_filtered: IntCounterVec,
    replays_overtaken: IntCounterVec,
    drop_managed_fields: IntCounterVec,
    protobuf_encodings: IntCounterVec,
    ready: IntGaugeVec,
    staleness: GaugeVec,
    cache_lag: GaugeVec,
    delivery_lag: HistogramVec,
    history_capacity: IntGaugeVec,
    history_size: IntGaugeVec,
    history_window: GaugeVec,
    list_fetched: IntCounterVec,
    list_returned: IntCounterVec,
    read_wait: HistogramVec,
    upstream_requests: IntCounterVec,
    upstream_duration: HistogramVec,
    review_duration: HistogramVec,
    auth_cache: IntCounterVec,
    cert_expiry: Gauge,
    reflector_errors: IntCounterVec,
    unparseable: IntCounterVec,
    cached_resources: IntGauge,
    state_loads: IntCounterVec,
    state_saves: IntCounterVec,
    state_bytes: IntGaugeVec,
    consistency_checks: IntCounterVec,
    consistency_differences: IntGaugeVec,
    upstream_lanes: IntGaugeVec,
    skipped_resources: IntGaugeVec,
    memory_limit: IntGauge,
    cache_memory: IntGaugeVec,
    memory_actions: IntCounterVec,
    memory_dropped: IntGauge,
    process: process::Process,
    cert_expiry_registered: std::sync::atomic::AtomicBool,
    /// Serialises the scrape-time refresh (counters advanced by differences), with the totals
    /// seen at the last one.
    refresh: Mutex<Seen>,
}

fn register<C: prometheus::core::Collector + Clone + 'static>(r: &Registry, name: &str, c: C) -> C {
    r.register(Box::new(c.clone())).unwrap_or_else(|e| panic!("metric {name}: {e}"));
    c
}

fn counter(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c =
        IntCounterVec::new(Opts::new(name, help), labels).unwrap_or_else(|e| panic!("metric {name}: {e}"));
    register(r, name, c)
}

fn gauge(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).unwrap_or_else(|e| panic!("metric {name}: {e}"));
    register(r, name, g)
}

fn fgauge(r: &Registry, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    let g = GaugeVec::new(Opts::new(name, help), labels).unwrap_or_else(|e| panic!("metric {name}: {e}"));
    register(r, name, g)
}

fn histogram(r: &Registry, name: &str, help: &str, labels: &[&str], buckets: &[f64]) -> HistogramVec {
    let h = HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets.to_vec()), labels)
        .unwrap_or_else(|e| panic!("metric {name}: {e}"));
    register(r, name, h)
}

/// Per counter series: the cache whose cumulative total was seen last, and that total.
type Seen = std::collections::HashMap<(&'static str, String), (u64, u64)>;

/// Adds to `c` what the cumulative `total` kept by cache `id` grew by since it was last seen
/// (never backwards). A cache that replaced another of the same resource (readmitted after a
/// `--cache-memory-limit` drop, rebuilt) counts from its own zero: against the counter's value,
/// a new cache's totals stayed flat until they passed its predecessor's, for hours.
fn advance(seen: &mut Seen, series: (&'static str, &str), id: u64, c: &prometheus::IntCounter, total: u64) {
    let last = seen.entry((series.0, series.1.to_owned())).or_insert((id, 0));
    if last.0 != id {
        *last = (id, 0);
    }
    if total > last.1 {
        c.inc_by(total - last.1);
        last.1 = total;
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let r = Registry::new();
        let build = IntGaugeVec::new(
            Opts::new("watchcache_build_info", "Always 1; the labels say which build is running."),
            &["version"],
        )
        .unwrap_or_else(|e| panic!("metric build_info: {e}"));
        build.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        register(&r, "watchcache_build_info", build);
        let in_flight = register(
            &r,
            "watchcache_current_inflight_requests",
            IntGauge::new(
                "watchcache_current_inflight_requests",
                "Non-long-running requests holding an in-flight permit (until their body ends); the limit is --max-requests-inflight.",
            )
            .unwrap_or_else(|e| panic!("metric in-flight: {e}")),
        );
        Metrics {
            requests: counter(
                &r,
                "watchcache_requests_total",
                "Requests by verb, cached resource (empty for others), HTTP code, who answered (served: cache, upstream, proxy) and the forward reason.",
                &["verb", "resource", "code", "served", "reason"],
            ),
            request_duration: histogram(
                &r,
                "watchcache_request_duration_seconds",
                "Time from a request's arrival to its response headers, by verb, cached resource and who answered; watches are not observed.",
                &["verb", "resource", "served"],
                REQUEST_BUCKETS,
            ),
            in_flight,
            forwarded: counter(
                &r,
                "watchcache_forwarded_requests_total",
                "Requests forwarded upstream, by reason.",
                &["reason"],
            ),
            write_stall_cuts: counter(
                &r,
                "watchcache_write_stall_cuts_total",
                "Responses cut because their client took nothing of them for --write-stall-timeout, by kind.",
                &["kind"],
            ),
            events: counter(
                &r,
                "watchcache_events_received_total",
                "Upstream watch events applied to the cache.",
                &["resource"],
            ),
            dispatched: counter(
                &r,
                "watchcache_events_dispatched_total",
                "(event, watcher) deliveries by the cache's fan-out to live watches.",
                &["resource"],
            ),
            relists: counter(
                &r,
                "watchcache_relists_total",
                "Full upstream lists (initial sync and relists).",
                &["resource"],
            ),
            objects: gauge(&r, "watchcache_objects", "Objects in the cache.", &["resource"]),
            resource_version: gauge(
                &r,
                "watchcache_resource_version",
                "The cache RV (mod 10^15).",
                &["resource"],
            ),
            watchers: gauge(&r, "watchcache_watchers", "Live watches served from the cache.", &["resource"]),
            terminated: counter(
                &r,
                "watchcache_terminated_watchers_total",
                "Watches closed because the client was too slow.",
                &["resource"],
            ),
            ended_at_relist: counter(
                &r,
                "watchcache_watchers_ended_at_relist_total",
                "Watches ended by a relist of the upstream (every watch that started before the list, unless provably complete).",
                &["resource"],
            ),
            offered: counter(
                &r,
                "watchcache_fanout_offered_total",
                "(event, watcher) pairs examined by the fan-out.",
                &["resource"],
            ),
            // The apiserver's `apiserver_watch_shards_total` is a gauge despite its suffix.
            watch_shards: gauge(
                &r,
                "watchcache_watch_shards_total",
                "Live sharded watches (shardSelector) served from the cache.",
                &["resource"],
            ),
            shard_filtered: counter(
                &r,
                "watchcache_watch_filtered_events_total",
                "Events a sharded watch did not get because the object is outside its shard.",
                &["resource"],
            ),
            replays_overtaken: counter(
                &r,
                "watchcache_watch_replays_overtaken_total",
                "Watches ended because the history let go of events their replay had yet to send.",
                &["resource"],
            ),
            drop_managed_fields: counter(
                &r,
                "watchcache_drop_managed_fields_requests_total",
                "Reads asking drop=metadata.managedFields (KEP-5958), by where they were answered: \
                 cache (without managedFields) or upstream (as the upstream answers).",
                &["resource", "answered"],
            ),
            protobuf_encodings: counter(
                &r,
                "watchcache_protobuf_encodings_total",
                "Object versions encoded into protobuf (once per version, for every protobuf reader), by how: \
                 fresh (from the JSON), from_previous (the replaced version's encoding, both texts read), \
                 walked (read where the texts differ) or spliced (only changed scalars encoded).",
                &["resource", "how"],
            ),
            ready: gauge(
                &r,
                "watchcache_cache_ready",
                "1 when the resource's cache is synced.",
                &["resource"],
            ),
            staleness: fgauge(
                &r,
                "watchcache_cache_staleness_seconds",
                "Seconds since the cache last had proof that it was current (an event, a bookmark, a list, an upstream watch that started).",
                &["resource"],
            ),
            cache_lag: fgauge(
                &r,
                "watchcache_cache_lag_seconds",
                "Seconds since the upstream was seen (consistent-read probe) at a resourceVersion the cache has not reached; 0 once it has reached every one. A lower bound of how far behind the cache is (watchcache_cache_staleness_seconds is the upper one).",
                &["resource"],
            ),
            delivery_lag: histogram(
                &r,
                "watchcache_watch_delivery_lag_seconds",
                "Time from an upstream watch event's arrival at the cache to its frame being handed to a watcher's response body; sampled: each event's first delivery and one in 64 of the rest.",
                &["resource"],
                DELIVERY_BUCKETS,
            ),
            history_capacity: gauge(
                &r,
                "watchcache_history_capacity",
                "Most events the resource's history keeps (--history-max-events).",
                &["resource"],
            ),
            history_size: gauge(&r, "watchcache_history_size", "Events in the resource's history.", &["resource"]),
            history_window: fgauge(
                &r,
                "watchcache_history_window_seconds",
                "Age of the oldest event in the history: how far back a watch can resume (at most --history-window).",
                &["resource"],
            ),
            list_fetched: counter(
                &r,
                "watchcache_list_fetched_objects_total",
                "Objects examined by LISTs served from the cache (the apiserver's apiserver_cache_list_fetched_objects_total).",
                &["resource"],
            ),
            list_returned: counter(
                &r,
                "watchcache_list_returned_objects_total",
                "Objects returned by LISTs served from the cache.",
                &["resource"],
            ),
            read_wait: histogram(
                &r,
                "watchcache_read_wait_seconds",
                "Time a read waited before it was served from the cache or forwarded: freshness (NotOlderThan/Exact RV) or consistent (Most Recent LIST: probe and wait).",
                &["resource", "read"],
                WAIT_BUCKETS,
            ),
            upstream_requests: counter(
                &r,
                "watchcache_upstream_requests_total",
                "The proxy's own upstream requests (lists, watches, probes, discovery, reviews), by method and code (`error` when no answer came).",
                &["method", "code"],
            ),
            upstream_duration: histogram(
                &r,
                "watchcache_upstream_request_duration_seconds",
                "Time to the response headers of the proxy's own upstream requests, by method.",
                &["method"],
                REQUEST_BUCKETS,
            ),
            review_duration: histogram(
                &r,
                "watchcache_auth_review_duration_seconds",
                "Latency of upstream TokenReviews and SubjectAccessReviews (cache misses only).",
                &["review"],
                WAIT_BUCKETS,
            ),
            auth_cache: counter(
                &r,
                "watchcache_auth_cache_lookups_total",
                "Authentication and authorization cache lookups by review and result (hit, miss).",
                &["review", "result"],
            ),
            cert_expiry: Gauge::new(
                "watchcache_serving_certificate_expiration_timestamp_seconds",
                "notAfter of the serving certificate now in use, as Unix time (TLS listener only).",
            )
            .unwrap_or_else(|e| panic!("metric certificate expiry: {e}")),
            reflector_errors: counter(
                &r,
                "watchcache_reflector_errors_total",
                "Failures of a resource's upstream list/watch loop, by reason (list_/watch_ + unreachable, http_<code>, decode; error_event_<code>; expired = 410, relisted).",
                &["resource", "reason"],
            ),
            unparseable: counter(
                &r,
                "watchcache_unparseable_objects_total",
                "Upstream objects (list items, watch events) that could not be parsed: each ends the cache's watches and forwards its requests until a full list parses whole.",
                &["resource"],
            ),
            cached_resources: register(
                &r,
                "watchcache_cached_resources",
                IntGauge::new(
                    "watchcache_cached_resources",
                    "Resources served from a cache now (named in --resources or found by its wildcard).",
                )
                .unwrap_or_else(|e| panic!("metric cached_resources: {e}")),
            ),
            skipped_resources: gauge(
                &r,
                "watchcache_skipped_resources",
                "Resources a --resources wildcard found but does not cache, by reason: forbidden (the proxy may not list them), aggregated (served by an aggregated API server), failed (discovery or list failed), not_synced (no sync within the bound; forwarded meanwhile).",
                &["reason"],
            ),
            state_loads: counter(
                &r,
                "watchcache_state_loads_total",
                "Saved states (--state-dir) at start by result: restored, or why refused (truncated, corrupt, checksum, format_version, other_cluster, other_version, identity_unknown, unchecked, upstream_behind, unreadable).",
                &["result"],
            ),
            state_saves: counter(
                &r,
                "watchcache_state_saves_total",
                "State files written to --state-dir by resource and result (ok, failed).",
                &["resource", "result"],
            ),
            state_bytes: gauge(
                &r,
                "watchcache_state_bytes",
                "Size of each resource's last written state file.",
                &["resource"],
            ),
            consistency_checks: counter(
                &r,
                "watchcache_consistency_checks_total",
                "Consistency checks (--consistency-check-period) by resource and result: consistent, inconsistent (relisted), upstream_behind (its RV below the cache's: relisted), failed (upstream not asked), skipped (cache not ready).",
                &["resource", "result"],
            ),
            consistency_differences: gauge(
                &r,
                "watchcache_consistency_differences",
                "Keys (namespace, name, resourceVersion) that differed between the cache and the upstream at the same RV at the last check.",
                &["resource"],
            ),
            upstream_lanes: gauge(
                &r,
                "watchcache_upstream_lanes",
                "Lanes of upstream connections made so far by client (own, forward, forward_own): one more each time every lane had --upstream-max-streams-per-connection requests open.",
                &["client"],
            ),
            memory_limit: register(
                &r,
                "watchcache_cache_memory_limit_bytes",
                IntGauge::new(
                    "watchcache_cache_memory_limit_bytes",
                    "--cache-memory-limit in bytes (0: no limit).",
                )
                .unwrap_or_else(|e| panic!("metric cache_memory_limit_bytes: {e}")),
            ),
            cache_memory: gauge(
                &r,
                "watchcache_cache_memory_bytes",
                "Bytes each cache keeps, as --cache-memory-limit counts them, by part: objects (current objects with their lazily made forms and index share) and history (what only the history keeps: event frames, superseded and deleted versions). Measured every --cache-memory-check-period; only with a limit; 0 once dropped.",
                &["resource", "part"],
            ),
            memory_actions: counter(
                &r,
                "watchcache_cache_memory_actions_total",
                "What --cache-memory-limit did, by action: history_shortened, dropped (a cache no longer kept; its requests forwarded), history_restored, readmitted.",
                &["action"],
            ),
            memory_dropped: register(
                &r,
                "watchcache_cache_memory_dropped_resources",
                IntGauge::new(
                    "watchcache_cache_memory_dropped_resources",
                    "Resources not cached now because of --cache-memory-limit (their requests are forwarded, reason memory_limit).",
                )
                .unwrap_or_else(|e| panic!("metric cache_memory_dropped_resources: {e}")),
            ),
            process: process::Process::register(&r),
            cert_expiry_registered: std::sync::atomic::AtomicBool::new(false),
            refresh: Mutex::new(Seen::default()),
            registry: r,
        }
    }

    /// Creates the series of a newly cached resource at 0, so that rates work from the start.
    pub fn cache_added(&self, resource: &str) {
        for c in [
            &self.events,
            &self.dispatched,
            &self.relists,
            &self.unparseable,
            &self.terminated,
            &self.ended_at_relist,
            &self.offered,
            &self.shard_filtered,
            &self.replays_overtaken,
        ] {
            c.with_label_values(&[resource]);
        }
        self.list_fetched.with_label_values(&[resource]);
        self.list_returned.with_label_values(&[resource]);
        for answered in ["cache", "upstream"] {
            self.drop_managed_fields.with_label_values(&[resource, answered]);
        }
    }

    /// How many resources are cached, and how many a wildcard skipped by reason (every reason
    /// is set, 0 when none).
    pub fn resources(&self, cached: usize, skipped: &[(&str, usize)]) {
        self.cached_resources.set(cached as i64);
        for (reason, n) in skipped {
            self.skipped_resources.with_label_values(&[reason]).set(*n as i64);
        }
    }

    /// `--cache-memory-limit` is on with `bytes`: every action's series starts at 0.
    pub fn memory_limit(&self, bytes: u64, actions: &[&str]) {
        self.memory_limit.set(bytes as i64);
        for a in actions {
            self.memory_actions.with_label_values(&[a]);
        }
    }

    /// One cache's measured memory.
    pub fn cache_memory(&self, resource: &str, objects: u64, history: u64) {
        self.cache_memory.with_label_values(&[resource, "objects"]).set(objects as i64);
        self.cache_memory.with_label_values(&[resource, "history"]).set(history as i64);
    }

    /// A cache no longer running (dropped for `--cache-memory-limit`): its gauges go (they
    /// would keep their last values — ready, its watchers — for as long as it is not cached);
    /// its counters stay, and a cache made again for it adds to them.
    pub fn forget_cache(&self, resource: &str) {
        // Not while a scrape refreshes them (it would set them again).
        let _seen = self.refresh.lock();
        let l = [resource];
        for g in [
            &self.objects,
            &self.resource_version,
            &self.watchers,
            &self.watch_shards,
            &self.ready,
            &self.history_capacity,
            &self.history_size,
        ] {
            let _ = g.remove_label_values(&l);
        }
        for g in [&self.staleness, &self.cache_lag, &self.history_window] {
            let _ = g.remove_label_values(&l);
        }
    }

    /// One action of `--cache-memory-limit` (`memory::ACTIONS`).
    pub fn memory_action(&self, action: &str) {
        self.memory_actions.with_label_values(&[action]).inc();
    }

    /// Resources not cached now because of `--cache-memory-limit`.
    pub fn memory_dropped(&self, n: usize) {
        self.memory_dropped.set(n as i64);
    }

    /// One consistency check of a cache.
    pub fn consistency_check(&self, resource: &str, result: &str) {
        self.consistency_checks.with_label_values(&[resource, result]).inc();
    }

    /// Keys that differed at a cache's last consistency check.
    pub fn consistency_differences(&self, resource: &str, n: usize) {
        self.consistency_differences.with_label_values(&[resource]).set(n as i64);
    }

    /// A saved state at start: `restored` or the refusal's reason.
    pub fn state_load(&self, result: &str) {
        self.state_loads.with_label_values(&[result]).inc();
    }

    /// A state file written (`ok`) or not.
    pub fn state_saved(&self, resource: &str, bytes: u64, ok: bool) {
        self.state_saves.with_label_values(&[resource, if ok { "ok" } else { "failed" }]).inc();
        if ok {
            self.state_bytes.with_label_values(&[resource]).set(bytes as i64);
        }
    }

    /// Creates every `result` series of `watchcache_state_loads_total` at 0.
    pub fn state_enabled(&self, results: &[&str]) {
        for r in results {
            self.state_loads.with_label_values(&[r]);
        }
    }

    pub fn reflector_error(&self, resource: &str, reason: &str) {
        self.reflector_errors.with_label_values(&[resource, reason]).inc();
    }

    pub fn unparseable(&self, resource: &str) {
        self.unparseable.with_label_values(&[resource]).inc();
    }

    /// One answered request. `resource` must be a cached resource's `group/resource` or empty.
    pub fn request(&self, verb: &str, resource: &str, code: u16, served: Served) {
        let verb = if VERBS.contains(&verb) { verb } else { "other" };
        let (served, reason) = served.labels();
        self.requests.with_label_values(&[verb, resource, &code.to_string(), served, reason]).inc();
    }

    /// The time to the response headers of a request (not watches).
    pub fn request_duration(&self, verb: &str, resource: &str, served: Served, secs: f64) {
        let verb = if VERBS.contains(&verb) { verb } else { "other" };
        self.request_duration.with_label_values(&[verb, resource, served.labels().0]).observe(secs);
    }

    /// A read that asked for `drop=metadata.managedFields`, answered by the cache (without
    /// them) or forwarded (`cache` false: the upstream decides; one before 1.38 keeps them).
    pub fn drop_managed_fields(&self, resource: &str, cache: bool) {
        let answered = if cache { "cache" } else { "upstream" };
        self.drop_managed_fields.with_label_values(&[resource, answered]).inc();
    }

    pub fn forwarded(&self, reason: &str) {
        self.forwarded.with_label_values(&[reason]).inc();
    }

    /// The counter of write-stall cuts of `kind` (`response`: non-long-running; `watch`: a
    /// long-running answer, served or forwarded), for `limits::InFlight` to count them.
    pub fn write_stall_cuts(&self, kind: &str) -> prometheus::IntCounter {
        self.write_stall_cuts.with_label_values(&[kind])
    }

    pub fn event(&self, resource: &str) {
        self.events.with_label_values(&[resource]).inc();
    }

    pub fn relist(&self, resource: &str) {
        self.relists.with_label_values(&[resource]).inc();
    }

    /// A LIST served from the cache: objects examined and returned.
    pub fn list_served(&self, resource: &str, fetched: usize, returned: usize) {
        self.list_fetched.with_label_values(&[resource]).inc_by(fetched as u64);
        self.list_returned.with_label_values(&[resource]).inc_by(returned as u64);
    }

    pub fn read_wait(&self, resource: &str, read: ReadWait, secs: f64) {
        let read = match read {
            ReadWait::Freshness => "freshness",
            ReadWait::Consistent => "consistent",
        };
        self.read_wait.with_label_values(&[resource, read]).observe(secs);
    }

    /// An upstream review that was not answered by the cache took `secs`.
    pub fn review(&self, review: Review, secs: f64) {
        self.review_duration.with_label_values(&[review.as_str()]).observe(secs);
    }

    pub fn auth_cache(&self, review: Review, hit: bool) {
        self.auth_cache.with_label_values(&[review.as_str(), if hit { "hit" } else { "miss" }]).inc();
    }

    /// The serving certificate's notAfter (Unix seconds).
    pub fn serving_certificate_expiry(&self, not_after: i64) {
        if !self.cert_expiry_registered.swap(true, std::sync::atomic::Ordering::Relaxed) {
            // Registered on first use: without a TLS listener there is no such certificate.
            let _ = self.registry.register(Box::new(self.cert_expiry.clone()));
        }
        self.cert_expiry.set(not_after as f64);
    }

    /// The watch-delivery lag histogram, for the caches to observe into (`cache::lag`).
    pub fn delivery_lag(&self) -> crate::cache::DeliveryLag {
        crate::cache::DeliveryLag(Some(self.delivery_lag.clone()))
    }

    pub fn set_in_flight(&self, n: usize) {
        self.in_flight.set(n as i64);
    }

    /// Refreshes the per-cache gauges and counters, and the process metrics.
    pub fn observe_caches<'a>(&self, readers: impl Iterator<Item = &'a Reader>) {
        let mut seen = self.refresh.lock();
        // A cache being dropped has its gauges removed (`forget_cache`), not set again.
        for r in readers.filter(|r| !r.released()) {
            let gr = r.kind().group_resource();
            let l = [gr.as_str()];
            let id = r.cache_id();
            let mut advance = |name: &'static str, c: &prometheus::IntCounter, total: u64| {
                advance(&mut seen, (name, gr.as_str()), id, c, total)
            };
            let p = r.progress();
            let w = r.watcher_stats();
            let h = r.history_stats();
            self.objects.with_label_values(&l).set(r.len() as i64);
            self.resource_version.with_label_values(&l).set((p.rv.0 % 1_000_000_000_000_000) as i64);
            self.watchers.with_label_values(&l).set(w.live as i64);
            advance("terminated", &self.terminated.with_label_values(&l), w.terminated);
            advance("ended_at_relist", &self.ended_at_relist.with_label_values(&l), w.ended_at_relist);
            advance("offered", &self.offered.with_label_values(&l), w.offered);
            advance("dispatched", &self.dispatched.with_label_values(&l), w.delivered);
            self.watch_shards.with_label_values(&l).set(w.sharded as i64);
            advance("shard_filtered", &self.shard_filtered.with_label_values(&l), w.shard_filtered);
            advance("replays_overtaken", &self.replays_overtaken.with_label_values(&l), w.replays_overtaken);
            for (how, n) in crate::proto::ENCODINGS.iter().zip(r.proto_type().encodings()) {
                advance(how, &self.protobuf_encodings.with_label_values(&[gr.as_str(), how]), n);
            }
            self.ready.with_label_values(&l).set(i64::from(p.ready));
            if let Some(s) = r.staleness() {
                self.staleness.with_label_values(&l).set(s.as_secs_f64());
            }
            if let Some(lag) = r.lag() {
                self.cache_lag.with_label_values(&l).set(lag.as_secs_f64());
            }
            self.history_capacity.with_label_values(&l).set(h.capacity as i64);
            self.history_size.with_label_values(&l).set(h.len as i64);
            self.history_window.with_label_values(&l).set(h.oldest_age.as_secs_f64());
        }
        self.process.refresh();
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        if TextEncoder::new().encode(&self.registry.gather(), &mut buf).is_err() {
            return String::new();
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}

impl crate::upstream::Observer for Metrics {
    fn upstream_request(&self, method: &str, code: Option<u16>, secs: f64) {
        let method = match method {
            "GET" | "POST" | "PUT" | "PATCH" | "DELETE" => method,
            _ => "OTHER",
        };
        let code = code.map_or_else(|| "error".to_owned(), |c| c.to_string());
        self.upstream_requests.with_label_values(&[method, &code]).inc();
        self.upstream_duration.with_label_values(&[method]).observe(secs);
    }

    fn upstream_lanes(&self, client: &str, lanes: usize) {
        // Lanes only grow: a report overtaken by a later one never lowers the gauge.
        let g = self.upstream_lanes.with_label_values(&[client]);
        if lanes as i64 > g.get() {
            g.set(lanes as i64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_follow_their_cumulative_source_and_never_go_back() {
        let m = Metrics::new();
        let mut seen = Seen::default();
        let c = m.terminated.with_label_values(&["pods"]);
        advance(&mut seen, ("terminated", "pods"), 1, &c, 5);
        advance(&mut seen, ("terminated", "pods"), 1, &c, 3);
        assert_eq!(c.get(), 5);
        advance(&mut seen, ("terminated", "pods"), 1, &c, 9);
        assert_eq!(c.get(), 9);
        // Another cache of pods (readmitted after a drop): its totals count from its own zero.
        advance(&mut seen, ("terminated", "pods"), 2, &c, 4);
        assert_eq!(c.get(), 13);
        advance(&mut seen, ("terminated", "pods"), 2, &c, 6);
        assert_eq!(c.get(), 15);
    }

    /// A dropped cache's gauges go (its `ready` stayed 1 and its watchers counted for as long
    /// as it was not cached); its counters stay.
    #[tokio::test]
    async fn a_forgotten_cache_leaves_no_gauge_and_keeps_its_counters() {
        let m = Metrics::new();
        let kind = crate::resource::ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true);
        let (mut w, r) = crate::cache::new(kind, crate::cache::CacheOptions::default());
        w.replace(Vec::new(), crate::resource::Rv(1));
        m.observe_caches([&r].into_iter());
        m.dispatched.with_label_values(&["configmaps"]).inc();
        let text = m.render();
        assert!(text.contains(r#"watchcache_cache_ready{resource="configmaps"} 1"#), "{text}");
        m.forget_cache("configmaps");
        let text = m.render();
        assert!(!text.contains(r#"watchcache_cache_ready{resource="configmaps"}"#), "{text}");
        assert!(!text.contains(r#"watchcache_watchers{resource="configmaps"}"#), "{text}");
        assert!(text.contains(r#"watchcache_events_dispatched_total{resource="configmaps"} 1"#), "{text}");
    }

    /// Scraped through `observe_caches`: a second cache of the same resource adds its own
    /// deliveries to the counter the first one's made.
    #[tokio::test]
    async fn a_cache_made_again_adds_to_its_resources_counters() {
        use crate::cache::{CacheOptions, Filter, WatchRequest, WatchStart};
        use crate::resource::{EventType, ResourceKind, Rv};
        let m = Metrics::new();
        let kind = ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true);
        let deliver = |n: u64| {
            let (mut w, r) = crate::cache::new(kind.clone(), CacheOptions::default());
            w.replace(Vec::new(), Rv(1));
            let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
            let req = WatchRequest {
                filter: Filter::default(),
                start: WatchStart::Now,
                bookmarks: false,
                deadline,
            };
            let watch = r.watch(req).unwrap();
            for i in 0..n {
                let json = format!(
                    r#"{{"metadata":{{"name":"c{i}","namespace":"ns","resourceVersion":"{}"}}}}"#,
                    i + 2
                );
                let o = w.parse(bytes::Bytes::from(json)).unwrap();
                drop(w.apply(EventType::Added, o).unwrap());
            }
            (w, r, watch)
        };
        let series = |m: &Metrics| m.dispatched.with_label_values(&["configmaps"]).get();
        let (_w, first, _watch) = deliver(5);
        m.observe_caches([&first].into_iter());
        assert_eq!(series(&m), 5);
        let (_w2, second, _watch2) = deliver(3);
        m.observe_caches([&second].into_iter());
        assert_eq!(series(&m), 8, "the second cache's 3 deliveries counted at once");
    }

    #[test]
    fn unknown_verbs_are_other_and_every_family_renders() {
        let m = Metrics::new();
        m.request("FOO", "", 405, Served::Proxy);
        m.request("list", "apps/deployments", 200, Served::Cache);
        m.request("create", "", 201, Served::Upstream("write"));
        let text = m.render();
        assert!(
            text.contains(
                r#"watchcache_requests_total{code="405",reason="",resource="",served="proxy",verb="other"} 1"#
            ),
            "{text}"
        );
        assert!(text.contains(r#"reason="write",resource="",served="upstream",verb="create"} 1"#), "{text}");
        assert!(text.contains("watchcache_build_info{version="), "{text}");
        #[cfg(target_os = "linux")]
        for name in [
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
            "process_open_fds",
            "process_start_time_seconds",
        ] {
            assert!(text.contains(&format!("\n{name} ")), "{name}: {text}");
        }
    }
}
