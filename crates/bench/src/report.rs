//! The bench report: what one run measured per target, as a side-by-side table on the terminal
//! (proxy, direct, ratio) and as JSON (`--json FILE`).
//!
//! Built by the phase runner (`phase`, one [`TargetReport`] per phase) and `bench::run`;
//! the SVG chart (`svg`) reads the same structure.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::stats::Summary;

/// One request kind against one target.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RequestReport {
    pub count: u64,
    pub per_sec: f64,
    pub bytes: u64,
    pub bytes_per_sec: f64,
    pub errors: u64,
    /// Ticks not sent because too many requests were in flight (overload).
    pub skipped: u64,
    pub latency: Summary,
}

/// The watch clients against one target.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct WatchReport {
    pub watchers: usize,
    pub opened: usize,
    /// Watchers that got an ERROR event (e.g. 410) and could not continue.
    pub failed: usize,
    pub reconnects: u64,
    pub events: u64,
    pub events_per_sec: f64,
    pub bytes_per_sec: f64,
    /// Changes the writer made in this phase (and failed writes).
    pub changes_written: u64,
    pub writes_failed: u64,
    /// The first failed write's error (the upstream's Status message when it answered).
    #[serde(default)]
    pub first_write_error: Option<String>,
    /// Sum over watchers of the changes each should have received.
    pub deliveries_expected: u64,
    pub deliveries_received: u64,
    /// Writer changes received by a node's watcher (or, through the proxy, a shard's) outside
    /// its selection, and events whose sequence number is past any phase's reach
    /// (`track::MAX_SPAN`; a smaller forged one is not told apart).
    #[serde(default)]
    pub unexpected: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub out_of_order: u64,
    /// Delivery lag: receive time − writer's send time.
    pub lag: Summary,
    /// Per second of the phase: (second, mean lag ms, max lag ms).
    pub lag_timeline: Vec<(u64, f64, f64)>,
}

/// Everything measured against one target in one phase.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct TargetReport {
    /// `proxy` or `direct`.
    pub name: String,
    pub url: String,
    pub seconds: f64,
    /// By request kind (`list rv=0`, `list limit page`, `get rv=0`, `watch open`).
    pub requests: BTreeMap<String, RequestReport>,
    /// Outcomes by HTTP status or failure label.
    pub statuses: BTreeMap<String, u64>,
    pub watch: WatchReport,
    /// Requests that reached the upstream during the phase (the sim's count, or the proxy's
    /// forwarded-requests metric), when known.
    pub upstream_requests: Option<u64>,
    /// CPU seconds used during the phase by the measured process (the whole bench process when
    /// everything runs in-process).
    pub cpu_seconds: Option<f64>,
    /// The upstream's CPU seconds during a proxy phase (`--direct-pid` given): the writes,
    /// Lease renewals and reviews it serves meanwhile. The direct column's `cpu_seconds` holds
    /// the same work, so "proxy + its upstream" against "direct" compares like with like.
    #[serde(default)]
    pub upstream_cpu_seconds: Option<f64>,
    /// Largest resident set seen during the phase.
    pub peak_rss_bytes: Option<u64>,
    /// Responses by the HTTP version the connections really spoke (`HTTP/1.1`, `HTTP/2.0`).
    #[serde(default)]
    pub http_versions: BTreeMap<String, u64>,
    /// Writer changes delivered to the watchers (summed over watchers): the denominator of
    /// `cpu_us_per_delivery`.
    #[serde(default)]
    pub deliveries: u64,
    /// Bytes of LIST bodies received (whole lists and pages): the denominator of
    /// `cpu_ms_per_mb_listed`.
    #[serde(default)]
    pub bytes_listed: u64,
    /// The measured process's CPU in the phase, in µs per delivery. All of the phase's CPU is
    /// counted, so this reads true where deliveries dominate the work (`watch-fanout`); `None`
    /// when CPU was not measured or nothing was delivered.
    #[serde(default)]
    pub cpu_us_per_delivery: Option<f64>,
    /// The same CPU in ms per MB (10^6 bytes) of LIST bodies received; reads true where LISTs
    /// dominate (`list-heavy`).
    #[serde(default)]
    pub cpu_ms_per_mb_listed: Option<f64>,
    /// Lease renewals the bench wrote to an external cluster during the phase (node-heartbeat
    /// churn, `bench::cluster`), and how many failed.
    #[serde(default)]
    pub lease_renewals: u64,
    #[serde(default)]
    pub lease_renewals_failed: u64,
    #[serde(default)]
    pub first_lease_error: Option<String>,
    /// The proxy's authentication and authorization cache lookups in the phase (from its
    /// `/watchcache/metrics`), when it runs with auth on; `None` for the direct target.
    #[serde(default)]
    pub auth_lookups: Option<AuthLookups>,
    /// The proxy's own part of the watch lag over the phase, from its sampled
    /// `watchcache_watch_delivery_lag_seconds` (scraped before and after): an upstream event's
    /// arrival to its frame going to a watcher's body. `None` for the direct target.
    #[serde(default)]
    pub proxy_delivery_lag: Option<ProxyDeliveryLag>,
}

/// Sampled proxy delivery lag over a phase (see `TargetReport::proxy_delivery_lag`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProxyDeliveryLag {
    pub samples: u64,
    pub mean_ms: Option<f64>,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
}

/// `watchcache_auth_cache_lookups_total` over the phase, summed over TokenReview and
/// SubjectAccessReview: misses went to the upstream, hits did not.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AuthLookups {
    pub hits: u64,
    pub misses: u64,
    /// SubjectAccessReviews the proxy sent upstream during the load.
    #[serde(default)]
    pub subject_access_reviews: u64,
}

impl TargetReport {
    /// Fills `deliveries`, `bytes_listed` and the two CPU costs from what was measured.
    pub fn fill_costs(&mut self) {
        self.deliveries = self.watch.deliveries_received;
        self.bytes_listed =
            self.requests.iter().filter(|(k, _)| k.starts_with("list")).map(|(_, r)| r.bytes).sum();
        let per = |scale: f64, n: f64| self.cpu_seconds.filter(|_| n > 0.0).map(|c| c * scale / n);
        self.cpu_us_per_delivery = per(1e6, self.deliveries as f64);
        self.cpu_ms_per_mb_listed = per(1e3, self.bytes_listed as f64 / 1e6);
    }
}

/// The whole run.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Report {
    pub scenario: String,
    /// The resolved plan (sizes, rates, duration).
    pub plan: serde_json::Value,
    /// `in-process` (sim + proxy + harness in one process) or `external`.
    pub mode: String,
    /// What CPU/RSS measure.
    pub process: String,
    /// How the targets were secured, when the bench set it up (`--tls`); empty otherwise.
    #[serde(default)]
    pub security: String,
    pub targets: Vec<TargetReport>,
    /// What makes the run fail: lost, duplicated, reordered or unexpected events, watchers that
    /// never opened or ended on an ERROR, failed writes and failed requests (5xx, timeouts) past
    /// `MAX_FAILED_WRITES`, refused requests (401/403), a phase with watchers that expected no
    /// delivery at all (it proved nothing).
    pub problems: Vec<String>,
}

/// Failed writes tolerated per phase: at most 1 % of those attempted (a busy upstream may
/// refuse one now and then); past it the run fails.
pub const MAX_FAILED_WRITES: f64 = 0.01;

/// The problem when more than [`MAX_FAILED_WRITES`] of a kind of write failed.
fn too_many_failed(target: &str, what: &str, ok: u64, failed: u64, first: Option<&str>) -> Option<String> {
    let attempted = ok + failed;
    (failed > 0 && failed as f64 > MAX_FAILED_WRITES * attempted as f64).then(|| {
        format!(
            "{target}: {failed} of {attempted} {what} failed (more than {:.0} %); first: {}",
            MAX_FAILED_WRITES * 100.0,
            first.unwrap_or("unknown")
        )
    })
}

impl Report {
    /// Collects the problems of every target; the run fails if there is any.
    pub fn check(&mut self) {
        for t in &self.targets {
            let w = &t.watch;
            let writes = (w.changes_written, w.writes_failed, w.first_write_error.as_deref());
            let leases = (t.lease_renewals, t.lease_renewals_failed, t.first_lease_error.as_deref());
            for ((ok, failed, first), what) in [(writes, "writes"), (leases, "Lease renewals")] {
                if let Some(p) = too_many_failed(&t.name, what, ok, failed, first) {
                    self.problems.push(p);
                }
            }
            if w.watchers > 0 && w.deliveries_expected == 0 {
                self.problems.push(format!(
                    "{}: no delivery was expected (no change written reached a watcher): the watch checks proved nothing",
                    t.name
                ));
            }
            for code in ["401", "403"] {
                if let Some(n) = t.statuses.get(code).filter(|n| **n > 0) {
                    self.problems.push(format!("{}: {n} requests answered {code}", t.name));
                }
            }
            // Server errors and requests without an answer (timeouts, transport errors), over
            // the requests and watch opens (a watch's in-stream ERROR counts in `w.failed`):
            // past the same 1 % as writes, the figures are of a failing target.
            let is_request = |k: &str| !k.starts_with("watch-");
            let failing = |k: &str| k.starts_with('5') || k == "transport" || k == "timeout";
            let all: u64 = t.statuses.iter().filter(|(k, _)| is_request(k)).map(|(_, n)| n).sum();
            let failures: Vec<String> =
                t.statuses.iter().filter(|(k, _)| failing(k)).map(|(k, n)| format!("{k}×{n}")).collect();
            let failed: u64 = t.statuses.iter().filter(|(k, _)| failing(k)).map(|(_, n)| n).sum();
            if failed > 0 && failed as f64 > MAX_FAILED_WRITES * all as f64 {
                self.problems.push(format!(
                    "{}: {failed} of {all} requests failed (5xx, timeouts, transport errors; more than {:.0} %): {}",
                    t.name,
                    MAX_FAILED_WRITES * 100.0,
                    failures.join(" ")
                ));
            }
            if w.failed > 0 {
                self.problems.push(format!(
                    "{}: {} watches ended with an ERROR event (a 410, a server error) and did not go on",
                    t.name, w.failed
                ));
            }
            if w.unexpected > 0 {
                self.problems.push(format!(
                    "{}: {} writer changes reached watchers whose selection does not hold them (a selector not applied?)",
                    t.name, w.unexpected
                ));
            }
            for (n, what) in
                [(w.lost, "lost"), (w.duplicated, "duplicated"), (w.out_of_order, "out of order")]
            {
                if n > 0 {
                    self.problems.push(format!("{}: {n} watch events {what}", t.name));
                }
            }
            if w.opened < w.watchers {
                self.problems.push(format!("{}: only {} of {} watches opened", t.name, w.opened, w.watchers));
            }
        }
    }

    fn target(&self, name: &str) -> Option<&TargetReport> {
        self.targets.iter().find(|t| t.name == name)
    }

    /// The terminal table: one column per target, and proxy/direct when both ran.
    pub fn table(&self) -> String {
        let cols: Vec<&TargetReport> = ["proxy", "direct"].iter().filter_map(|n| self.target(n)).collect();
        let both = cols.len() == 2;
        // A cell is a number, or the text shown instead ("-", "not measured").
        type Cells = Vec<Result<f64, &'static str>>;
        let mut rows: Vec<(String, Cells, u8)> = Vec::new();
        let mut cells =
            |label: String, f: &dyn Fn(&TargetReport) -> Result<f64, &'static str>, decimals: u8| {
                rows.push((label, cols.iter().map(|t| f(t)).collect(), decimals));
            };
        let mut row = |label: String, f: &dyn Fn(&TargetReport) -> Option<f64>, decimals: u8| {
            cells(label, &|t| f(t).ok_or("-"), decimals);
        };
        let kinds: Vec<String> = {
            let mut k: Vec<String> = cols.iter().flat_map(|t| t.requests.keys().cloned()).collect();
            k.sort();
            k.dedup();
            k
        };
        for k in &kinds {
            let get = |t: &TargetReport| t.requests.get(k).cloned().unwrap_or_default();
            if cols.iter().all(|t| get(t).count == 0 && get(t).errors == 0) {
                continue;
            }
            row(format!("{k}: requests/s"), &|t| Some(get(t).per_sec), 1);
            row(format!("{k}: p50 ms"), &|t| Some(get(t).latency.p50_ms), 2);
            row(format!("{k}: p90 ms"), &|t| Some(get(t).latency.p90_ms), 2);
            row(format!("{k}: p99 ms"), &|t| Some(get(t).latency.p99_ms), 2);
            row(format!("{k}: max ms"), &|t| Some(get(t).latency.max_ms), 2);
            row(format!("{k}: MB/s"), &|t| Some(get(t).bytes_per_sec / 1e6), 2);
            row(format!("{k}: errors"), &|t| Some(get(t).errors as f64), 0);
            if cols.iter().any(|t| get(t).skipped > 0) {
                row(format!("{k}: skipped (overload)"), &|t| Some(get(t).skipped as f64), 0);
            }
        }
        if cols.iter().any(|t| t.watch.watchers > 0) {
            row("watchers open".into(), &|t| Some(t.watch.opened as f64), 0);
            row("watch events/s".into(), &|t| Some(t.watch.events_per_sec), 0);
            row("watch MB/s".into(), &|t| Some(t.watch.bytes_per_sec / 1e6), 2);
            row("changes written".into(), &|t| Some(t.watch.changes_written as f64), 0);
            row("writes failed".into(), &|t| Some(t.watch.writes_failed as f64), 0);
            if cols.iter().any(|t| t.lease_renewals + t.lease_renewals_failed > 0) {
                row("lease renewals".into(), &|t| Some(t.lease_renewals as f64), 0);
                row("lease renewals failed".into(), &|t| Some(t.lease_renewals_failed as f64), 0);
            }
            row("deliveries expected".into(), &|t| Some(t.watch.deliveries_expected as f64), 0);
            row("lag p50 ms".into(), &|t| Some(t.watch.lag.p50_ms), 2);
            row("lag p99 ms".into(), &|t| Some(t.watch.lag.p99_ms), 2);
            row("lag max ms".into(), &|t| Some(t.watch.lag.max_ms), 2);
            // The proxy's part of that lag, from its own histogram (sampled; bucket-interpolated).
            if cols.iter().any(|t| t.proxy_delivery_lag.is_some()) {
                row("proxy delivery lag p50 ms".into(), &|t| t.proxy_delivery_lag.and_then(|l| l.p50_ms), 2);
                row("proxy delivery lag p99 ms".into(), &|t| t.proxy_delivery_lag.and_then(|l| l.p99_ms), 2);
                row(
                    "proxy delivery lag mean ms".into(),
                    &|t| t.proxy_delivery_lag.and_then(|l| l.mean_ms),
                    2,
                );
                row(
                    "proxy delivery lag samples".into(),
                    &|t| t.proxy_delivery_lag.map(|l| l.samples as f64),
                    0,
                );
            }
            // Nothing expected proves nothing: "-", not "0 lost".
            let proven = |t: &TargetReport, n: u64| (t.watch.deliveries_expected > 0).then_some(n as f64);
            row("events lost".into(), &|t| proven(t, t.watch.lost), 0);
            row("events duplicated".into(), &|t| proven(t, t.watch.duplicated), 0);
            row("events out of order".into(), &|t| proven(t, t.watch.out_of_order), 0);
            row("watch reconnects".into(), &|t| Some(t.watch.reconnects as f64), 0);
        }
        row("upstream requests".into(), &|t| t.upstream_requests.map(|n| n as f64), 0);
        if cols.iter().any(|t| t.auth_lookups.is_some()) {
            row("auth cache hits".into(), &|t| t.auth_lookups.map(|a| a.hits as f64), 0);
            row("auth cache misses".into(), &|t| t.auth_lookups.map(|a| a.misses as f64), 0);
            row(
                "auth cache hit %".into(),
                &|t| {
                    t.auth_lookups
                        .filter(|a| a.hits + a.misses > 0)
                        .map(|a| 100.0 * a.hits as f64 / (a.hits + a.misses) as f64)
                },
                1,
            );
            row("upstream SARs".into(), &|t| t.auth_lookups.map(|a| a.subject_access_reviews as f64), 0);
            row(
                "upstream SARs/s".into(),
                &|t| {
                    t.auth_lookups
                        .filter(|_| t.seconds > 0.0)
                        .map(|a| a.subject_access_reviews as f64 / t.seconds)
                },
                2,
            );
        }
        row("CPU seconds".into(), &|t| t.cpu_seconds, 2);
        if self.targets.iter().any(|t| t.upstream_cpu_seconds.is_some()) {
            // Proxy + its upstream in the same phase, against the upstream alone.
            row(
                "CPU s with the upstream's".into(),
                &|t| match t.upstream_cpu_seconds {
                    Some(u) => t.cpu_seconds.map(|c| c + u),
                    None => t.cpu_seconds,
                },
                2,
            );
        }
        row("peak RSS MiB".into(), &|t| t.peak_rss_bytes.map(|b| b as f64 / 1048576.0), 1);
        row("deliveries".into(), &|t| Some(t.deliveries as f64), 0);
        row("MB listed".into(), &|t| Some(t.bytes_listed as f64 / 1e6), 1);
        let cost = |v: Option<f64>, t: &TargetReport| match (v, t.cpu_seconds) {
            (Some(v), _) => Ok(v),
            (None, None) => Err("not measured"),
            (None, Some(_)) => Err("-"),
        };
        cells("CPU µs per delivery".into(), &|t| cost(t.cpu_us_per_delivery, t), 2);
        cells("CPU ms per MB listed".into(), &|t| cost(t.cpu_ms_per_mb_listed, t), 2);

        let mut out = String::new();
        let _ = write!(out, "{:<32}", format!("scenario {}", self.scenario));
        for t in &cols {
            let _ = write!(out, "{:>14}", t.name);
        }
        if both {
            let _ = write!(out, "{:>14}", "proxy/direct");
        }
        out.push('\n');
        for (label, vals, d) in rows {
            let _ = write!(out, "{label:<32}");
            for v in &vals {
                let text = match v {
                    Ok(v) => format!("{v:.*}", d as usize),
                    Err(text) => (*text).to_owned(),
                };
                let _ = write!(out, "{text:>14}");
            }
            if both {
                let ratio = match (vals[0], vals[1]) {
                    (Ok(p), Ok(d)) if d != 0.0 => format!("{:.2}", p / d),
                    _ => "-".into(),
                };
                let _ = write!(out, "{ratio:>14}");
            }
            out.push('\n');
        }
        for t in &cols {
            let s: Vec<String> = t.statuses.iter().map(|(k, v)| format!("{k}×{v}")).collect();
            let _ = writeln!(out, "{} outcomes: {}", t.name, s.join(" "));
            let v: Vec<String> = t.http_versions.iter().map(|(k, v)| format!("{k}×{v}")).collect();
            let _ = writeln!(out, "{} {}: {}", t.name, t.url, v.join(" "));
        }
        let _ = writeln!(out, "CPU/RSS: {}", self.process);
        if !self.security.is_empty() {
            let _ = writeln!(out, "security: {}", self.security);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(name: &str, p50: f64, lost: u64) -> TargetReport {
        let mut t =
            TargetReport { name: name.into(), url: "http://x".into(), seconds: 1.0, ..Default::default() };
        t.requests.insert(
            "get rv=0".into(),
            RequestReport {
                count: 10,
                per_sec: 10.0,
                latency: Summary { p50_ms: p50, ..Default::default() },
                ..Default::default()
            },
        );
        t.watch = WatchReport {
            watchers: 2,
            opened: 2,
            lost,
            changes_written: 10,
            deliveries_expected: 20,
            ..Default::default()
        };
        t.statuses.insert("200".into(), 12);
        t
    }

    #[test]
    fn table_has_both_columns_and_the_ratio() {
        let r = Report {
            scenario: "mixed".into(),
            targets: vec![target("proxy", 1.0, 0), target("direct", 4.0, 0)],
            ..Default::default()
        };
        let t = r.table();
        let p50 = t.lines().find(|l| l.starts_with("get rv=0: p50 ms")).unwrap();
        assert!(p50.ends_with("0.25"), "{p50}");
        assert!(t.contains("proxy outcomes: 200×12"), "{t}");
        let cpu = t.lines().find(|l| l.starts_with("CPU µs per delivery")).unwrap();
        assert!(cpu.contains("not measured"), "{cpu}");
    }

    #[test]
    fn cpu_per_delivery_and_per_mb_listed() {
        let mut t = target("proxy", 1.0, 0);
        t.watch.deliveries_received = 4000;
        t.requests
            .insert("list rv=0".into(), RequestReport { count: 2, bytes: 3_000_000, ..Default::default() });
        t.requests.insert(
            "list limit page".into(),
            RequestReport { count: 6, bytes: 1_000_000, ..Default::default() },
        );
        t.fill_costs();
        assert_eq!((t.deliveries, t.bytes_listed), (4000, 4_000_000));
        assert_eq!((t.cpu_us_per_delivery, t.cpu_ms_per_mb_listed), (None, None), "no CPU measured");
        t.cpu_seconds = Some(0.2);
        t.fill_costs();
        assert_eq!(t.cpu_us_per_delivery, Some(50.0));
        assert_eq!(t.cpu_ms_per_mb_listed, Some(50.0));
        let mut d = target("direct", 1.0, 0);
        d.cpu_seconds = Some(0.8);
        d.watch.deliveries_received = 4000;
        d.fill_costs();
        let r = Report { targets: vec![t, d], ..Default::default() };
        let table = r.table();
        let row = |name: &str| table.lines().find(|l| l.starts_with(name)).unwrap().to_owned();
        assert!(row("CPU µs per delivery").ends_with("0.25"), "{table}");
        assert!(!table.contains("CPU s with the upstream's"), "no upstream measured: no row");
        // The upstream measured during the proxy phase (`--direct-pid`): proxy + upstream.
        let mut r = r;
        r.targets[0].upstream_cpu_seconds = Some(0.4);
        let table = r.table();
        let row = |name: &str| table.lines().find(|l| l.starts_with(name)).unwrap().to_owned();
        let both = row("CPU s with the upstream's");
        assert!(both.contains("0.60") && both.trim_end().ends_with("0.75"), "{both}");
        let per_mb = row("CPU ms per MB listed");
        assert!(
            per_mb.contains("50.00") && per_mb.trim_end().ends_with('-'),
            "nothing listed directly: {per_mb}"
        );
    }

    #[test]
    fn delivery_problems_fail_the_run() {
        let mut r =
            Report { targets: vec![target("proxy", 1.0, 3), target("direct", 1.0, 0)], ..Default::default() };
        r.check();
        assert_eq!(r.problems, vec!["proxy: 3 watch events lost".to_owned()]);
        let mut ok = Report { targets: vec![target("proxy", 1.0, 0)], ..Default::default() };
        ok.check();
        assert!(ok.problems.is_empty());
    }

    /// Server errors and unanswered requests past 1 %, watches ended by an ERROR and changes
    /// outside a watcher's selection fail the run (a review: each passed as "0 lost").
    #[test]
    fn errors_failed_watches_and_unexpected_events_fail_the_run() {
        let mut t = target("proxy", 1.0, 0);
        t.statuses.insert("200".into(), 199);
        t.statuses.insert("503".into(), 1);
        // A watch's in-stream errors are not requests (counted as failed watches).
        t.statuses.insert("watch-error-410".into(), 50);
        let mut r = Report { targets: vec![t.clone()], ..Default::default() };
        r.check();
        assert!(r.problems.is_empty(), "1 of 200 is tolerated… {:?}", r.problems);
        t.statuses.remove("watch-error-410");
        t.statuses.insert("timeout".into(), 1);
        t.statuses.insert("200".into(), 100);
        t.statuses.insert("503".into(), 2);
        t.watch.failed = 1;
        t.watch.unexpected = 4;
        let mut r = Report { targets: vec![t], ..Default::default() };
        r.check();
        assert_eq!(r.problems.len(), 3, "{:?}", r.problems);
        assert_eq!(
            r.problems[0],
            "proxy: 3 of 103 requests failed (5xx, timeouts, transport errors; more than 1 %): 503×2 timeout×1"
        );
        assert!(r.problems[1].contains("1 watches ended with an ERROR event"));
        assert!(
            r.problems[2].contains("4 writer changes reached watchers whose selection does not hold them")
        );
    }

    /// Issue 18: failed writes, refused requests and a phase that expected nothing fail the
    /// run, with the upstream's message; "0 lost" is not printed when nothing was expected.
    #[test]
    fn failures_are_loud() {
        let mut t = target("proxy", 1.0, 0);
        t.watch.writes_failed = 748;
        t.watch.changes_written = 0;
        t.watch.deliveries_expected = 0;
        t.watch.first_write_error =
            Some("422: Pod \"p\" is invalid: spec: Forbidden: pod updates may not change fields".into());
        t.statuses.insert("403".into(), 2);
        let mut r = Report { targets: vec![t], ..Default::default() };
        r.check();
        assert_eq!(r.problems.len(), 3, "{:?}", r.problems);
        assert!(r.problems[0].starts_with("proxy: 748 of 748 writes failed (more than 1 %); first: 422: Pod"));
        assert!(r.problems[1].contains("no delivery was expected"));
        assert_eq!(r.problems[2], "proxy: 2 requests answered 403");
        let table = r.table();
        let row = |name: &str| table.lines().find(|l| l.starts_with(name)).unwrap().to_owned();
        assert!(row("writes failed").trim_end().ends_with("748"), "{table}");
        assert!(row("events lost").trim_end().ends_with('-'), "not 0 when nothing was expected: {table}");
        // One failure in a thousand writes is tolerated.
        let mut t = target("proxy", 1.0, 0);
        t.watch.writes_failed = 1;
        t.watch.changes_written = 999;
        let mut r = Report { targets: vec![t], ..Default::default() };
        r.check();
        assert!(r.problems.is_empty(), "{:?}", r.problems);
    }
}
