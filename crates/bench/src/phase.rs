//! One phase: drive one target (the proxy or the direct upstream) with the plan's load for the
//! plan's duration and measure it.
//!
//! Order: open every watch at the upstream's current RV (and wait for all of them) → start the
//! writer, LISTs and GETs → after the duration stop them → wait until every watcher has received
//! every change it should (or a drain timeout) → settle loss / duplicates / order per watcher.
//! Called by `bench::run`, once per target and round.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::Method;
use parking_lot::Mutex;
use tokio::sync::{watch, Semaphore};

use super::cluster;
use super::env::{send, Backend, Clients, Remote, Target};
use super::load::{self, WriteLog, MAX_IN_FLIGHT};
use super::nodes::NodeIdentities;
use super::procstat;
use super::report::{AuthLookups, ProxyDeliveryLag, RequestReport, TargetReport, WatchReport};
use super::scenario::Plan;
use super::stats::{Kind, PhaseStats};
use super::tls::ClientTls;
use super::track::Tracker;
use super::watchers::{self, Shared, Watcher};
use kube_watchcache_sim::Sim;

/// After the writer stopped: how long deliveries may make no progress before the missing
/// ones count as lost, and how long draining may take in all.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
const DRAIN_MAX: Duration = Duration::from_secs(300);
/// How long all watches may take to open.
const OPEN_TIMEOUT: Duration = Duration::from_secs(180);
/// Concurrent WATCH connection attempts.
const CONNECTS_IN_FLIGHT: usize = 256;

/// Where the number of requests that reached the upstream comes from.
#[derive(Clone)]
pub enum UpstreamCount {
    /// The in-process sim's request log.
    Sim(Sim),
    /// The proxy's `watchcache_forwarded_requests_total` (summed over reasons).
    ProxyMetrics(Arc<Remote>),
    Unknown,
}

impl UpstreamCount {
    async fn read(&self) -> Option<u64> {
        match self {
            UpstreamCount::Sim(sim) => Some(sim.request_count(|_| true) as u64),
            UpstreamCount::ProxyMetrics(r) => {
                let body = send(
                    &r.client,
                    r.target.request(Method::GET, kube_watchcache::server::health::METRICS_PATH, None)?,
                )
                .await
                .ok()?;
                Some(forwarded_total(&String::from_utf8_lossy(&body)))
            }
            UpstreamCount::Unknown => None,
        }
    }
}

/// Sum of every `watchcache_forwarded_requests_total{…}` sample in a Prometheus text body.
pub fn forwarded_total(metrics: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("watchcache_forwarded_requests_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// `watchcache_auth_cache_lookups_total{…}` summed by `result` (hit, miss) in a Prometheus
/// text body; `None` when the proxy exports no such sample (auth off).
pub fn auth_lookups(metrics: &str) -> Option<AuthLookups> {
    let mut out: Option<AuthLookups> = None;
    for l in metrics.lines().filter(|l| l.starts_with("watchcache_auth_cache_lookups_total{")) {
        let Some(n) = l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) else { continue };
        let a = out.get_or_insert_with(AuthLookups::default);
        if l.contains("result=\"hit\"") {
            a.hits += n as u64;
        } else if l.contains("result=\"miss\"") {
            a.misses += n as u64;
        }
    }
    // SubjectAccessReviews the proxy sent: the count of their latency histogram.
    for l in metrics.lines().filter(|l| {
        l.starts_with("watchcache_auth_review_duration_seconds_count{") && l.contains("subjectaccessreview")
    }) {
        if let Some(n) = l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) {
            out.get_or_insert_with(AuthLookups::default).subject_access_reviews += n as u64;
        }
    }
    out
}

/// The proxy's `/watchcache/metrics` text now (`None` for the direct target, or unreachable).
async fn scrape(r: &Option<Arc<Remote>>) -> Option<String> {
    let r = r.as_ref()?;
    let body =
        send(&r.client, r.target.request(Method::GET, kube_watchcache::server::health::METRICS_PATH, None)?)
            .await
            .ok()?;
    Some(String::from_utf8_lossy(&body).into_owned())
}

/// `watchcache_watch_delivery_lag_seconds` summed over resources: cumulative bucket counts by
/// upper bound, and the sample sum. `None` when the proxy exports no sample.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LagHistogram {
    /// (le, cumulative count), by increasing `le` (`+Inf` last).
    pub buckets: Vec<(f64, f64)>,
    pub sum: f64,
}

pub fn delivery_lag(metrics: &str) -> Option<LagHistogram> {
    const NAME: &str = "watchcache_watch_delivery_lag_seconds";
    let value = |l: &str| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
    let mut by_le: Vec<(f64, f64)> = Vec::new();
    let mut sum = None;
    for l in metrics.lines() {
        let Some(rest) = l.strip_prefix(NAME) else { continue };
        if rest.starts_with("_sum") {
            *sum.get_or_insert(0.0) += value(l).unwrap_or(0.0);
        } else if rest.starts_with("_bucket{") {
            let Some(le) = rest.split("le=\"").nth(1).and_then(|x| x.split('"').next()) else { continue };
            let Ok(le) = le.parse::<f64>() else { continue };
            let n = value(l).unwrap_or(0.0);
            match by_le.iter_mut().find(|(b, _)| *b == le) {
                Some((_, c)) => *c += n,
                None => by_le.push((le, n)),
            }
        }
    }
    by_le.sort_by(|a, b| a.0.total_cmp(&b.0));
    Some(LagHistogram { buckets: by_le, sum: sum? })
}

impl LagHistogram {
    /// The samples between `before` and `self` (two scrapes of the same proxy), as the
    /// report's figures: count, mean and `histogram_quantile`-style p50 / p99 (linear within
    /// a bucket; the bucket's lower bound when it is the `+Inf` one).
    pub fn since(&self, before: &LagHistogram) -> ProxyDeliveryLag {
        let earlier = |le: f64| before.buckets.iter().find(|(b, _)| *b == le).map_or(0.0, |(_, c)| *c);
        let delta: Vec<(f64, f64)> =
            self.buckets.iter().map(|(le, c)| (*le, (c - earlier(*le)).max(0.0))).collect();
        let count = delta.last().map_or(0.0, |(_, c)| *c);
        let quantile = |q: f64| {
            if count <= 0.0 {
                return None;
            }
            let rank = q * count;
            let (mut lo, mut below) = (0.0, 0.0);
            for &(le, c) in &delta {
                if c >= rank {
                    if le.is_infinite() {
                        return Some(lo * 1e3);
                    }
                    let within = if c > below { (rank - below) / (c - below) } else { 1.0 };
                    return Some((lo + (le - lo) * within) * 1e3);
                }
                (lo, below) = (le, c);
            }
            None
        };
        ProxyDeliveryLag {
            samples: count as u64,
            mean_ms: (count > 0.0).then(|| (self.sum - before.sum).max(0.0) / count * 1e3),
            p50_ms: quantile(0.5),
            p99_ms: quantile(0.99),
        }
    }
}

/// What a phase needs.
pub struct Phase<'a> {
    pub plan: &'a Plan,
    pub target: Target,
    pub backend: Backend,
    /// First writer sequence number of this phase.
    pub seq_base: u64,
    /// Whose CPU and RSS to measure: `Some(None)` this process, `Some(Some(pid))` another one.
    pub measure: Option<Option<u32>>,
    /// The upstream's process, measured too while the proxy is (`--direct-pid` in the proxy
    /// phase): the writes and reviews the proxy phase costs it.
    pub measure_upstream: Option<u32>,
    pub upstream: UpstreamCount,
    /// The clients' TLS material (trust anchors, client certificate).
    pub tls: ClientTls,
    /// The proxy's `/watchcache/metrics`, for its auth cache lookups (proxy phases only).
    pub proxy_metrics: Option<Arc<Remote>>,
    /// `--node-identities`: each node's identity, for a kubelet-like client per node.
    pub nodes: Option<Arc<NodeIdentities>>,
}

fn progress(line: &str) {
    let mut e = std::io::stderr();
    if e.is_terminal() {
        let _ = write!(e, "\r\x1b[2K{line}");
    } else {
        let _ = writeln!(e, "{line}");
    }
    let _ = e.flush();
}

fn progress_done() {
    if std::io::stderr().is_terminal() {
        eprintln!();
    }
}

impl Phase<'_> {
    /// Runs the phase; returns its report and the next free writer sequence number.
    pub async fn run(self) -> Result<(TargetReport, u64), String> {
        let plan = self.plan;
        let name = self.target.name;
        let stats = Arc::new(PhaseStats::default());
        let start_rv = self.backend.current_rv().await?;
        let clients = Clients::new(&self.tls, plan.http2, plan.watch_clients() + 2 * MAX_IN_FLIGHT);
        // This phase's own node clients: dropped with the phase, their connections with them.
        let node_clients = self.nodes.as_ref().map(|n| n.clients());
        let epoch = Instant::now();
        let shared = Arc::new(Shared {
            target: self.target.clone(),
            clients: clients.clone(),
            stats: stats.clone(),
            phase_start: epoch,
            opened: Default::default(),
            connect: Semaphore::new(CONNECTS_IN_FLIGHT),
            nodes: node_clients.clone(),
        });

        // 1. Watches, all from the same RV.
        let (wstop, wstop_rx) = watch::channel(false);
        let nodes = (0..plan.sizes.watchers).map(|_| None).chain((0..plan.sizes.node_watchers).map(Some));
        let mut list = Vec::new();
        let mut tasks = tokio::task::JoinSet::new();
        // `sharded`: each pod's shard (uids are the server's), and each watcher's.
        let shard_of = match plan.shards {
            0 => None,
            n => Some(super::shards::of_objects(&self.target, clients.pick(0), plan.sizes.objects, n).await?),
        };
        for (i, node) in nodes.enumerate() {
            let shard = (plan.shards > 0 && node.is_none()).then(|| (i % plan.shards, plan.shards));
            let w = Arc::new(Watcher {
                node,
                shard,
                tracker: Mutex::new(Tracker::new(self.seq_base, start_rv)),
                reconnects: Default::default(),
                failed: Default::default(),
            });
            list.push(w.clone());
            tasks.spawn(watchers::run(shared.clone(), w, i, "/api/v1/pods".into(), wstop_rx.clone()));
        }
        let total = list.len();
        let open_deadline = Instant::now() + OPEN_TIMEOUT;
        while shared.opened.load(Relaxed) < total && Instant::now() < open_deadline {
            progress(&format!("[{name}] opening watches {}/{total}", shared.opened.load(Relaxed)));
            tokio::time::sleep(Duration::from_millis(250)).await;
        }

        // 2. Load for the duration.
        let cpu0 = self.measure.and_then(procstat::cpu_seconds);
        let upstream_cpu0 = self.measure_upstream.and_then(|p| procstat::cpu_seconds(Some(p)));
        let up0 = self.upstream.read().await;
        let metrics0 = scrape(&self.proxy_metrics).await;
        let auth0 = metrics0.as_deref().and_then(auth_lookups);
        let (stop, stop_rx) = watch::channel(false);
        let rss_peak = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let sampler = self.measure.map(|pid| {
            let (peak, mut stop) = (rss_peak.clone(), stop_rx.clone());
            tokio::spawn(async move {
                loop {
                    if let Some(r) = procstat::rss_bytes(pid) {
                        peak.fetch_max(r, Relaxed);
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(200)) => {},
                        _ = stop.wait_for(|s| *s) => return,
                    }
                }
            })
        });
        let load_start = Instant::now();
        let offset = load_start.duration_since(epoch).as_secs();
        let client = clients.pick(usize::MAX / 2).clone();
        let lists = tokio::spawn(load::lists(
            plan.clone(),
            self.target.clone(),
            client.clone(),
            stats.clone(),
            stop_rx.clone(),
        ));
        let gets = tokio::spawn(load::gets(
            plan.clone(),
            self.target.clone(),
            client,
            node_clients.clone(),
            stats.clone(),
            stop_rx.clone(),
        ));
        let writer =
            tokio::spawn(load::writer(plan.clone(), self.backend.clone(), self.seq_base, stop_rx.clone()));
        // An external cluster gets Lease churn from the bench (the in-process sim churns its own).
        let leases = match &self.backend {
            Backend::Http(r) => Some(tokio::spawn(cluster::churn(plan.clone(), r.clone(), stop_rx.clone()))),
            Backend::Sim(_) => None,
        };
        while load_start.elapsed() < plan.duration {
            let s = load_start.elapsed().as_secs();
            progress(&format!(
                "[{name}] {s}s/{}s  watches {}/{total}  events {}  lists {}  gets {}  errors {}",
                plan.duration.as_secs(),
                shared.opened.load(Relaxed),
                stats.watch_events.load(Relaxed),
                stats.kind(Kind::List).done.load(Relaxed) + stats.kind(Kind::ListPage).done.load(Relaxed),
                stats.kind(Kind::Get).done.load(Relaxed),
                Kind::ALL.iter().map(|&k| stats.kind(k).errors.load(Relaxed)).sum::<u64>(),
            ));
            let left = plan.duration.saturating_sub(load_start.elapsed());
            tokio::time::sleep(left.min(Duration::from_secs(1))).await;
        }
        let _ = stop.send(true);
        let log = writer.await.map_err(|e| e.to_string())?;
        let lease_log = match leases {
            Some(l) => l.await.map_err(|e| e.to_string())?,
            None => cluster::LeaseLog::default(),
        };
        let seconds = load_start.elapsed().as_secs_f64();
        let _ = lists.await;
        let _ = gets.await;

        // 3. Drain: every watcher gets every change it should see.
        let expected = Expected::new(&log, shard_of.as_deref());
        // Wait while deliveries progress (an overloaded machine may lag many seconds); give up
        // after DRAIN_TIMEOUT without progress, or DRAIN_MAX in all.
        let drain_start = Instant::now();
        let (mut best, mut progressed) = (u64::MAX, Instant::now());
        loop {
            let missing: u64 =
                list.iter().filter(|w| !w.failed.load(Relaxed)).map(|w| expected.lost(w)).sum();
            if missing < best {
                (best, progressed) = (missing, Instant::now());
            }
            if missing == 0 || progressed.elapsed() >= DRAIN_TIMEOUT || drain_start.elapsed() >= DRAIN_MAX {
                break;
            }
            progress(&format!("[{name}] waiting for {missing} deliveries"));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = wstop.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(10), async {
            while tasks.join_next().await.is_some() {}
        })
        .await;
        tasks.abort_all();
        if let Some(s) = sampler {
            let _ = s.await;
        }
        let cpu1 = self.measure.and_then(procstat::cpu_seconds);
        let upstream_cpu1 = self.measure_upstream.and_then(|p| procstat::cpu_seconds(Some(p)));
        let up1 = self.upstream.read().await;
        let metrics1 = scrape(&self.proxy_metrics).await;
        let auth1 = metrics1.as_deref().and_then(auth_lookups);
        let lag = |m: &Option<String>| m.as_deref().and_then(delivery_lag);
        let proxy_delivery_lag = lag(&metrics1).map(|b| b.since(&lag(&metrics0).unwrap_or_default()));
        progress_done();

        // 4. Settle.
        let mut watch = WatchReport {
            watchers: total,
            opened: shared.opened.load(Relaxed),
            changes_written: log.nodes.len() as u64 - log.failed,
            writes_failed: log.failed,
            first_write_error: log.first_error.clone(),
            events: stats.watch_events.load(Relaxed),
            events_per_sec: stats.watch_events.load(Relaxed) as f64 / seconds,
            bytes_per_sec: stats.watch_bytes.load(Relaxed) as f64 / seconds,
            lag: stats.lag.summary(),
            lag_timeline: stats
                .timeline()
                .into_iter()
                .filter(|(s, _, _)| *s >= offset)
                .map(|(s, mean, max)| (s - offset, mean, max))
                .collect(),
            ..WatchReport::default()
        };
        for w in &list {
            let t = w.tracker.lock();
            watch.deliveries_expected += expected.count(w);
            watch.deliveries_received += t.received;
            // Writer changes outside its selection: a node's watcher (`spec.nodeName`, which
            // every apiserver applies) or, through the proxy, a shard's (an apiserver before
            // KEP-5866 sends every shard's changes, which is what the direct column shows).
            let selected = w.node.is_some() || (w.shard.is_some() && name == "proxy");
            if selected {
                // A write the client saw fail may have been committed all the same: not counted.
                let committed_anyway = t.arrived(log.failed_seqs());
                watch.unexpected += t.received - expected.arrived_locked(&t, w) - committed_anyway;
            }
            watch.unexpected += t.implausible;
            watch.lost += expected.lost_locked(&t, w);
            watch.duplicated += t.duplicated;
            watch.out_of_order += t.out_of_order;
            watch.reconnects += w.reconnects.load(Relaxed);
            watch.failed += usize::from(w.failed.load(Relaxed));
        }
        let requests = Kind::ALL
            .iter()
            .map(|&k| {
                let s = stats.kind(k);
                let count = s.done.load(Relaxed);
                let bytes = s.bytes.load(Relaxed);
                let r = RequestReport {
                    count,
                    per_sec: count as f64 / seconds,
                    bytes,
                    bytes_per_sec: bytes as f64 / seconds,
                    errors: s.errors.load(Relaxed),
                    skipped: s.skipped.load(Relaxed),
                    latency: s.latency.summary(),
                };
                (k.as_str().to_owned(), r)
            })
            .filter(|(_, r)| r.count > 0 || r.errors > 0)
            .collect();
        let mut report = TargetReport {
            name: name.to_owned(),
            url: self.target.base.clone(),
            seconds,
            requests,
            statuses: stats.statuses(),
            watch,
            upstream_requests: up0.zip(up1).map(|(a, b)| b.saturating_sub(a)),
            cpu_seconds: cpu0.zip(cpu1).map(|(a, b)| b - a),
            upstream_cpu_seconds: upstream_cpu0.zip(upstream_cpu1).map(|(a, b)| b - a),
            peak_rss_bytes: self.measure.map(|_| rss_peak.load(Relaxed)),
            http_versions: stats.versions(),
            auth_lookups: auth0.zip(auth1).map(|(a, b)| AuthLookups {
                hits: b.hits.saturating_sub(a.hits),
                misses: b.misses.saturating_sub(a.misses),
                subject_access_reviews: b.subject_access_reviews.saturating_sub(a.subject_access_reviews),
            }),
            proxy_delivery_lag,
            lease_renewals: lease_log.renewed,
            lease_renewals_failed: lease_log.failed,
            first_lease_error: lease_log.first_error,
            ..TargetReport::default()
        };
        report.fill_costs();
        Ok((report, self.seq_base + log.nodes.len() as u64))
    }
}

/// The writer's changes grouped the way watchers select them.
struct Expected {
    all: Vec<u64>,
    by_node: HashMap<usize, Vec<u64>>,
    /// `sharded`: by the shard of the changed pod (an upstream that ignores `shardSelector`
    /// sends a sharded watcher more; only these must arrive).
    by_shard: HashMap<usize, Vec<u64>>,
}

impl Expected {
    /// `shard_of`: each pod's shard, for the `sharded` scenario.
    fn new(log: &WriteLog, shard_of: Option<&[usize]>) -> Expected {
        let all: Vec<u64> = log.expected(None).collect();
        let mut by_node: HashMap<usize, Vec<u64>> = HashMap::new();
        let mut by_shard: HashMap<usize, Vec<u64>> = HashMap::new();
        for s in &all {
            let at = (s - log.base) as usize;
            by_node.entry(log.nodes[at]).or_default().push(*s);
            if let Some(&shard) = shard_of.and_then(|m| log.objects.get(at).and_then(|&i| m.get(i))) {
                by_shard.entry(shard).or_default().push(*s);
            }
        }
        Expected { all, by_node, by_shard }
    }

    fn of(&self, node: Option<usize>, shard: Option<(usize, usize)>) -> &[u64] {
        let group = match (node, shard) {
            (Some(n), _) => self.by_node.get(&n),
            (None, Some((i, _))) => self.by_shard.get(&i),
            (None, None) => return &self.all,
        };
        group.map(Vec::as_slice).unwrap_or(&[])
    }

    fn count(&self, w: &Watcher) -> u64 {
        self.of(w.node, w.shard).len() as u64
    }

    fn lost(&self, w: &Watcher) -> u64 {
        self.lost_locked(&w.tracker.lock(), w)
    }

    fn arrived_locked(&self, t: &Tracker, w: &Watcher) -> u64 {
        t.arrived(self.of(w.node, w.shard).iter().copied())
    }

    fn lost_locked(&self, t: &Tracker, w: &Watcher) -> u64 {
        t.lost(self.of(w.node, w.shard).iter().copied())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarded_requests_are_summed_over_reasons() {
        let m = "# HELP watchcache_forwarded_requests_total Requests forwarded upstream, by reason.\n# TYPE watchcache_forwarded_requests_total counter\nwatchcache_forwarded_requests_total{reason=\"write\"} 3\nwatchcache_forwarded_requests_total{reason=\"consistent\"} 4\nwatchcache_requests_total{verb=\"get\",code=\"200\"} 99\n";
        assert_eq!(forwarded_total(m), 7);
    }

    #[test]
    fn the_proxy_delivery_lag_is_the_histogram_between_two_scrapes() {
        let before = "watchcache_watch_delivery_lag_seconds_bucket{resource=\"pods\",le=\"0.001\"} 10\nwatchcache_watch_delivery_lag_seconds_bucket{resource=\"pods\",le=\"0.01\"} 10\nwatchcache_watch_delivery_lag_seconds_bucket{resource=\"pods\",le=\"+Inf\"} 10\nwatchcache_watch_delivery_lag_seconds_sum{resource=\"pods\"} 0.005\nwatchcache_watch_delivery_lag_seconds_count{resource=\"pods\"} 10\n";
        // 100 more: 50 under 1 ms (pods), 50 in (1 ms, 10 ms] (configmaps); sum +0.3 s.
        let after = "watchcache_watch_delivery_lag_seconds_bucket{resource=\"pods\",le=\"0.001\"} 60\nwatchcache_watch_delivery_lag_seconds_bucket{resource=\"pods\",le=\"0.01\"} 60\nwatchcache_watch_delivery_lag_seconds_bucket{resource=\"pods\",le=\"+Inf\"} 60\nwatchcache_watch_delivery_lag_seconds_sum{resource=\"pods\"} 0.03\nwatchcache_watch_delivery_lag_seconds_bucket{resource=\"configmaps\",le=\"0.001\"} 0\nwatchcache_watch_delivery_lag_seconds_bucket{resource=\"configmaps\",le=\"0.01\"} 50\nwatchcache_watch_delivery_lag_seconds_bucket{resource=\"configmaps\",le=\"+Inf\"} 50\nwatchcache_watch_delivery_lag_seconds_sum{resource=\"configmaps\"} 0.275\n";
        let (a, b) = (delivery_lag(before).unwrap(), delivery_lag(after).unwrap());
        let lag = b.since(&a);
        assert_eq!(lag.samples, 100);
        assert!((lag.mean_ms.unwrap() - 3.0).abs() < 1e-9, "{lag:?}");
        assert!((lag.p50_ms.unwrap() - 1.0).abs() < 1e-9, "{lag:?}");
        assert!((lag.p99_ms.unwrap() - 9.82).abs() < 1e-9, "{lag:?}");
        assert_eq!(delivery_lag("watchcache_requests_total 3\n"), None);
        assert_eq!(a.since(&a).p99_ms, None);
    }

    #[test]
    fn auth_lookups_are_summed_by_result() {
        let m = "watchcache_auth_cache_lookups_total{review=\"token\",result=\"hit\"} 10\nwatchcache_auth_cache_lookups_total{review=\"access\",result=\"hit\"} 5\nwatchcache_auth_cache_lookups_total{review=\"token\",result=\"miss\"} 1\nwatchcache_auth_cache_lookups_total{review=\"access\",result=\"miss\"} 2\nwatchcache_auth_review_duration_seconds_count{review=\"subjectaccessreview\"} 4\nwatchcache_auth_review_duration_seconds_count{review=\"tokenreview\"} 9\n";
        assert_eq!(auth_lookups(m), Some(AuthLookups { hits: 15, misses: 3, subject_access_reviews: 4 }));
        assert_eq!(auth_lookups("watchcache_requests_total 3\n"), None);
    }

    #[test]
    fn expected_changes_by_node_and_by_shard() {
        let log = WriteLog {
            base: 5,
            nodes: vec![1, 2, 1, usize::MAX],
            objects: vec![0, 1, 2, 3],
            failed: 1,
            first_error: None,
        };
        // Pods 0 and 1 in shard 3, pod 2 in shard 0.
        let e = Expected::new(&log, Some(&[3, 3, 0, 0]));
        assert_eq!(e.of(None, None), &[5, 6, 7]);
        assert_eq!(e.of(Some(1), None), &[5, 7]);
        assert_eq!(e.of(None, Some((3, 4))), &[5, 6]);
        assert_eq!(e.of(None, Some((0, 4))), &[7]);
        assert!(e.of(None, Some((1, 4))).is_empty());
        let mut t = Tracker::new(5, 0);
        t.observe(10, Some(5));
        let w = |node, shard| Watcher {
            node,
            shard,
            tracker: Default::default(),
            reconnects: Default::default(),
            failed: Default::default(),
        };
        assert_eq!(e.lost_locked(&t, &w(Some(1), None)), 1);
        assert_eq!(e.lost_locked(&t, &w(None, None)), 2);
        assert_eq!(e.lost_locked(&t, &w(None, Some((3, 4)))), 1);
        assert_eq!(e.count(&w(None, Some((0, 4)))), 1);
    }
}
