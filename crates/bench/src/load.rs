//! The request drivers: open-loop LISTs and GETs at a fixed rate against one target, and the
//! writer that changes pods upstream at a fixed rate, stamping each change with its sequence
//! number and send time.
//!
//! Started and stopped by the phase runner (`phase`). Open-loop: a request is started every
//! 1/rate seconds whether or not the previous ones finished, up to [`MAX_IN_FLIGHT`]; beyond
//! that ticks are counted as skipped (the target is overloaded), never queued.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use http::Method;
use http_body_util::BodyExt;
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::env::{pod, secret_name, Backend, HttpClient, Target};
use super::nodes::NodeClients;
use super::scenario::Plan;
use super::stats::{Kind, PhaseStats};

/// In-flight requests per driver before ticks are skipped.
pub const MAX_IN_FLIGHT: usize = 64;
/// How long stopped drivers wait for their in-flight requests.
const STOP_GRACE: Duration = Duration::from_secs(15);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Ticks `rate` times a second until `stop`, running `one(n)` for tick `n` in a task.
async fn open_loop<F, Fut>(
    rate: f64,
    kind: Kind,
    stats: Arc<PhaseStats>,
    mut stop: watch::Receiver<bool>,
    one: F,
) where
    F: Fn(u64) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    if rate <= 0.0 {
        return;
    }
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut tasks = JoinSet::new();
    let mut n = 0u64;
    loop {
        tokio::select! {
            _ = tick.tick() => {},
            _ = stop.wait_for(|s| *s) => break,
        }
        while tasks.try_join_next().is_some() {}
        if tasks.len() >= MAX_IN_FLIGHT {
            stats.kind(kind).skipped.fetch_add(1, Relaxed);
            continue;
        }
        tasks.spawn(one(n));
        n += 1;
    }
    let _ = tokio::time::timeout(STOP_GRACE, async { while tasks.join_next().await.is_some() {} }).await;
}

/// Sends one request; records latency (until the whole body is read), bytes and the status.
/// Returns the body when `keep` is set and the request succeeded.
async fn request(
    target: &Target,
    client: &HttpClient,
    stats: &PhaseStats,
    kind: Kind,
    path: &str,
    keep: bool,
) -> Option<bytes::Bytes> {
    let req = target.request(Method::GET, path, None)?;
    timed(client, req, stats, kind, keep).await
}

/// A kubelet's GET (`nodes`), timed like the others.
async fn send_timed(
    client: &HttpClient,
    req: Option<http::Request<http_body_util::Full<bytes::Bytes>>>,
    stats: &PhaseStats,
    kind: Kind,
) {
    if let Some(req) = req {
        timed(client, req, stats, kind, false).await;
    }
}

/// Sends `req`, reads the whole body, records latency, bytes and status under `kind`; the body
/// when `keep` and the answer was a success.
async fn timed(
    client: &HttpClient,
    req: http::Request<http_body_util::Full<bytes::Bytes>>,
    stats: &PhaseStats,
    kind: Kind,
    keep: bool,
) -> Option<bytes::Bytes> {
    let k = stats.kind(kind);
    let started = Instant::now();
    let fut = async {
        let resp = client.request(req).await.map_err(|_| "transport")?;
        stats.version(resp.version());
        let status = resp.status();
        let mut body = resp.into_body();
        let mut kept = Vec::new();
        let mut bytes = 0;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|_| "transport")?;
            if let Ok(d) = frame.into_data() {
                bytes += d.len() as u64;
                if keep {
                    kept.extend_from_slice(&d);
                }
            }
        }
        Ok::<_, &str>((status, bytes, kept))
    };
    let outcome = tokio::time::timeout(REQUEST_TIMEOUT, fut).await.unwrap_or(Err("timeout"));
    match outcome {
        Ok((status, bytes, kept)) => {
            stats.status(status.as_str());
            if status.is_success() {
                // Latency and throughput of answered requests only: a quick 429 or 503 would
                // lower the one and raise the other.
                k.latency.record_duration(started.elapsed());
                k.done.fetch_add(1, Relaxed);
                k.bytes.fetch_add(bytes, Relaxed);
                return keep.then(|| kept.into());
            }
            k.errors.fetch_add(1, Relaxed);
            None
        }
        Err(label) => {
            // A request that timed out took at least its deadline: counted so in the latency,
            // which would otherwise miss exactly the slowest ones.
            if label == "timeout" {
                k.latency.record_duration(REQUEST_TIMEOUT);
            }
            k.errors.fetch_add(1, Relaxed);
            stats.status(label);
            None
        }
    }
}

/// The `metadata.continue` of a list body (items are skipped, not materialised).
pub fn continue_token(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct L {
        metadata: M,
    }
    #[derive(serde::Deserialize)]
    struct M {
        #[serde(default, rename = "continue")]
        cont: Option<String>,
    }
    serde_json::from_slice::<L>(body).ok()?.metadata.cont.filter(|c| !c.is_empty())
}

/// LISTs of all pods at `rate`/s: even ticks `resourceVersion=0` (whole list), odd ticks
/// paginated with `limit` (each page timed on its own), following continue tokens.
pub async fn lists(
    plan: Plan,
    target: Target,
    client: HttpClient,
    stats: Arc<PhaseStats>,
    stop: watch::Receiver<bool>,
) {
    let (st, t, c) = (stats.clone(), target, client);
    open_loop(plan.sizes.lists_per_sec, Kind::List, stats, stop, move |n| {
        let (stats, target, client, limit) = (st.clone(), t.clone(), c.clone(), plan.page_limit);
        async move {
            if n % 2 == 0 {
                request(&target, &client, &stats, Kind::List, "/api/v1/pods?resourceVersion=0", false).await;
                return;
            }
            let mut path = format!("/api/v1/pods?limit={limit}");
            while let Some(body) = request(&target, &client, &stats, Kind::ListPage, &path, true).await {
                let Some(token) = continue_token(&body) else { return };
                let token: String = form_urlencoded::byte_serialize(token.as_bytes()).collect();
                path = format!("/api/v1/pods?limit={limit}&continue={token}");
            }
        }
    })
    .await
}

/// GETs of random pods at `rate`/s with `resourceVersion=0`.
pub async fn gets(
    plan: Plan,
    target: Target,
    client: HttpClient,
    nodes: Option<Arc<NodeClients>>,
    stats: Arc<PhaseStats>,
    stop: watch::Receiver<bool>,
) {
    let (st, t, c, objects) = (stats.clone(), target, client, plan.sizes.objects.max(1));
    open_loop(plan.sizes.gets_per_sec, Kind::Get, stats, stop, move |_| {
        let (stats, target, client, nodes) = (st.clone(), t.clone(), c.clone(), nodes.clone());
        let i = fastrand::usize(0..objects);
        let ((ns, name), node) = (Plan::object_key(i), plan.node_of(i));
        async move {
            match nodes {
                // A kubelet reading a Secret its pod mounts, with its own certificate.
                Some(nodes) => {
                    let path =
                        format!("/api/v1/namespaces/{ns}/secrets/{}?resourceVersion=0", secret_name(node));
                    let req = nodes.request(&target, Method::GET, &path);
                    send_timed(nodes.client(node), req, &stats, Kind::Get).await;
                }
                None => {
                    let path = format!("/api/v1/namespaces/{ns}/pods/{name}?resourceVersion=0");
                    request(&target, &client, &stats, Kind::Get, &path, false).await;
                }
            }
        }
    })
    .await
}

/// The writer's record of this phase: `nodes[s - base]` is the node of change `s`
/// (`usize::MAX` when that write failed).
#[derive(Debug, Default)]
pub struct WriteLog {
    pub base: u64,
    pub nodes: Vec<usize>,
    /// The object (pod index) of each change.
    pub objects: Vec<usize>,
    pub failed: u64,
    /// The first failed write's error (the upstream's Status message when it answered).
    pub first_error: Option<String>,
}

impl WriteLog {
    /// The sequence numbers of writes that failed: a failure the client saw (a timeout, a 504,
    /// a reset after sending) may still have been committed and reach a watcher.
    pub fn failed_seqs(&self) -> impl Iterator<Item = u64> + '_ {
        self.nodes.iter().enumerate().filter(|(_, &n)| n == usize::MAX).map(|(i, _)| self.base + i as u64)
    }

    /// The sequence numbers a watcher of `node` (`None`: all) must receive.
    pub fn expected(&self, node: Option<usize>) -> impl Iterator<Item = u64> + '_ {
        self.nodes
            .iter()
            .enumerate()
            .filter(move |(_, &n)| n != usize::MAX && node.is_none_or(|w| w == n))
            .map(|(i, _)| self.base + i as u64)
    }
}

/// Updates random pods at `events_per_sec` until `stop`; returns what it wrote.
/// Sequence numbers continue from `base` (≥ 1: seeded objects carry 0).
pub async fn writer(plan: Plan, backend: Backend, base: u64, mut stop: watch::Receiver<bool>) -> WriteLog {
    let log = Mutex::new(WriteLog { base, ..WriteLog::default() });
    let rate = plan.sizes.events_per_sec;
    if rate <= 0.0 || plan.sizes.objects == 0 {
        return log.into_inner();
    }
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {},
            _ = stop.wait_for(|s| *s) => break,
        }
        let i = fastrand::usize(0..plan.sizes.objects);
        let seq = base + log.lock().nodes.len() as u64;
        let sent = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        let result = backend.write(pod(&plan, i, seq, sent), false).await;
        let ok = result.is_ok();
        let mut l = log.lock();
        l.nodes.push(if ok { plan.node_of(i) } else { usize::MAX });
        l.objects.push(i);
        if let Err(e) = result {
            l.failed += 1;
            l.first_error.get_or_insert(e);
        }
    }
    log.into_inner()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_tokens_are_read_from_list_metadata() {
        let body = br#"{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"9","continue":"abc","remainingItemCount":3},"items":[{"metadata":{"name":"a"}}]}"#;
        assert_eq!(continue_token(body).as_deref(), Some("abc"));
        let last = br#"{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"9"},"items":[]}"#;
        assert_eq!(continue_token(last), None);
        assert_eq!(continue_token(br#"{"metadata":{"continue":""},"items":[]}"#), None);
    }

    #[test]
    fn expected_changes_follow_the_selector_and_skip_failures() {
        let log =
            WriteLog { base: 10, nodes: vec![0, 1, usize::MAX, 1, 0], failed: 1, ..WriteLog::default() };
        assert_eq!(log.expected(None).collect::<Vec<_>>(), vec![10, 11, 13, 14]);
        assert_eq!(log.expected(Some(1)).collect::<Vec<_>>(), vec![11, 13]);
        assert_eq!(log.expected(Some(7)).count(), 0);
        assert_eq!(log.failed_seqs().collect::<Vec<_>>(), vec![12]);
    }
}
