//! Prometheus metrics: one registry, created by `app`, updated by `server` and the
//! reflectors, rendered at `/metrics`. Label values come from `as_str()` of outcome enums.

use prometheus::{Encoder, GaugeVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder};

use crate::cache::Reader;

/// The proxy's metrics.
pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    forwarded: IntCounterVec,
    events: IntCounterVec,
    relists: IntCounterVec,
    objects: IntGaugeVec,
    resource_version: IntGaugeVec,
    watchers: IntGaugeVec,
    terminated: IntGaugeVec,
    offered: IntGaugeVec,
    ready: IntGaugeVec,
    staleness: GaugeVec,
    reflector_errors: IntCounterVec,
    unparseable: IntCounterVec,
}

fn counter(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c =
        IntCounterVec::new(Opts::new(name, help), labels).unwrap_or_else(|e| panic!("metric {name}: {e}"));
    r.register(Box::new(c.clone())).unwrap_or_else(|e| panic!("metric {name}: {e}"));
    c
}

fn gauge(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).unwrap_or_else(|e| panic!("metric {name}: {e}"));
    r.register(Box::new(g.clone())).unwrap_or_else(|e| panic!("metric {name}: {e}"));
    g
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let r = Registry::new();
        Metrics {
            requests: counter(
                &r,
                "watchcache_requests_total",
                "Requests answered by the proxy itself, by verb and HTTP code.",
                &["verb", "code"],
            ),
            forwarded: counter(
                &r,
                "watchcache_forwarded_requests_total",
                "Requests forwarded upstream, by reason.",
                &["reason"],
            ),
            events: counter(
                &r,
                "watchcache_events_received_total",
                "Upstream watch events applied to the cache.",
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
            terminated: gauge(
                &r,
                "watchcache_terminated_watchers",
                "Watches closed so far because the client was too slow.",
                &["resource"],
            ),
            offered: gauge(
                &r,
                "watchcache_fanout_offered",
                "(event, watcher) pairs examined by the fan-out so far.",
                &["resource"],
            ),
            ready: gauge(
                &r,
                "watchcache_cache_ready",
                "1 when the resource's cache is synced.",
                &["resource"],
            ),
            staleness: {
                let g = GaugeVec::new(
                    Opts::new(
                        "watchcache_cache_staleness_seconds",
                        "Seconds since the cache last had proof that it was current (an event, a bookmark, a list, an upstream watch that started).",
                    ),
                    &["resource"],
                )
                .unwrap_or_else(|e| panic!("metric staleness: {e}"));
                r.register(Box::new(g.clone())).unwrap_or_else(|e| panic!("metric staleness: {e}"));
                g
            },
            reflector_errors: counter(
                &r,
                "watchcache_reflector_errors_total",
                "Failures of a resource's upstream list/watch loop, by reason (list_/watch_ + unreachable, http_<code>, decode; error_event_<code>; expired = 410, relisted).",
                &["resource", "reason"],
            ),
            unparseable: counter(
                &r,
                "watchcache_unparseable_objects_total",
                "Upstream objects (list items, watch events) that could not be parsed and were skipped.",
                &["resource"],
            ),
            registry: r,
        }
    }

    pub fn reflector_error(&self, resource: &str, reason: &str) {
        self.reflector_errors.with_label_values(&[resource, reason]).inc();
    }

    pub fn unparseable(&self, resource: &str) {
        self.unparseable.with_label_values(&[resource]).inc();
    }

    pub fn request(&self, verb: &str, code: u16) {
        self.requests.with_label_values(&[verb, &code.to_string()]).inc();
    }

    pub fn forwarded(&self, reason: &str) {
        self.forwarded.with_label_values(&[reason]).inc();
    }

    pub fn event(&self, resource: &str) {
        self.events.with_label_values(&[resource]).inc();
    }

    pub fn relist(&self, resource: &str) {
        self.relists.with_label_values(&[resource]).inc();
    }

    /// Refreshes the per-cache gauges.
    pub fn observe_caches<'a>(&self, readers: impl Iterator<Item = &'a Reader>) {
        for r in readers {
            let gr = r.kind().group_resource();
            let p = r.progress();
            let w = r.watcher_stats();
            self.objects.with_label_values(&[&gr]).set(r.len() as i64);
            self.resource_version.with_label_values(&[&gr]).set((p.rv.0 % 1_000_000_000_000_000) as i64);
            self.watchers.with_label_values(&[&gr]).set(w.live as i64);
            self.terminated.with_label_values(&[&gr]).set(w.terminated as i64);
            self.offered.with_label_values(&[&gr]).set(w.offered as i64);
            self.ready.with_label_values(&[&gr]).set(i64::from(p.ready));
            if let Some(s) = r.staleness() {
                self.staleness.with_label_values(&[&gr]).set(s.as_secs_f64());
            }
        }
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
