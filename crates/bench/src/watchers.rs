//! The watch clients: each holds one WATCH on the target (its own connection over HTTP/1.1),
//! reads events line by line with a minimal borrowed parse (type, resourceVersion and the
//! writer's two annotations), feeds its [`Tracker`] and the lag histogram, and resumes from its
//! last RV when the stream ends.
//!
//! Started by the phase runner (`phase`), which waits for all of them to be open before the
//! load starts, and stops them once every expected change has arrived (or a drain timeout).

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use http::Method;
use http_body_util::BodyExt;
use parking_lot::Mutex;
use serde::Deserialize;
use tokio::sync::watch;

use super::env::{Clients, Target};
use super::nodes::NodeClients;
use super::parsed::Parsed;
use super::stats::{Kind, PhaseStats};
use super::track::{Seen, Tracker};

/// One watch client's shared state.
pub struct Watcher {
    /// `Some(n)`: watches `fieldSelector=spec.nodeName=node-n`; `None`: the whole resource.
    pub node: Option<usize>,
    /// `Some((i, n))`: watches shard `i` of `n` by uid (`shardSelector`, the `sharded` scenario).
    pub shard: Option<(usize, usize)>,
    pub tracker: Mutex<Tracker>,
    pub reconnects: AtomicU64,
    /// The watch got a 410 (or another error event) and gave up.
    pub failed: AtomicBool,
}

/// What every watcher of a phase shares.
pub struct Shared {
    pub target: Target,
    pub clients: Clients,
    pub stats: Arc<PhaseStats>,
    pub phase_start: Instant,
    /// Watchers whose first WATCH got its response headers.
    pub opened: AtomicUsize,
    /// Limits concurrent connection attempts so the listen backlog does not overflow.
    pub connect: tokio::sync::Semaphore,
    /// `--node-identities`: node watchers use their node's client and a kubelet's request.
    pub nodes: Option<Arc<NodeClients>>,
}

#[derive(Deserialize)]
struct Line<'a> {
    #[serde(borrow, rename = "type")]
    ty: Cow<'a, str>,
    #[serde(borrow)]
    object: LineObject<'a>,
}

#[derive(Deserialize)]
struct LineObject<'a> {
    #[serde(borrow, default)]
    metadata: LineMeta<'a>,
    /// Set on the Status of an ERROR event.
    #[serde(default)]
    code: Option<u16>,
}

#[derive(Deserialize, Default)]
struct LineMeta<'a> {
    #[serde(borrow, default, rename = "resourceVersion")]
    rv: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    annotations: Option<Stamps<'a>>,
}

#[derive(Deserialize, Default)]
struct Stamps<'a> {
    #[serde(borrow, default, rename = "bench.kube-watchcache.io/sent-unix-nanos")]
    sent: Option<Cow<'a, str>>,
    #[serde(borrow, default, rename = "bench.kube-watchcache.io/seq")]
    seq: Option<Cow<'a, str>>,
}

pub fn parse_line(line: &[u8]) -> Parsed {
    let Ok(l) = serde_json::from_slice::<Line>(line) else { return Parsed::Garbage };
    let rv = l.object.metadata.rv.as_deref().and_then(|r| r.parse::<u64>().ok());
    match (l.ty.as_ref(), rv) {
        ("ERROR", _) => Parsed::Error { code: l.object.code.unwrap_or(0) },
        ("BOOKMARK", Some(rv)) => Parsed::Bookmark { rv },
        ("ADDED" | "MODIFIED" | "DELETED", Some(rv)) => {
            let stamps = l.object.metadata.annotations.unwrap_or_default();
            Parsed::Event {
                rv,
                // Seeded objects carry seq 0, which is never a writer change (they start at 1).
                seq: stamps.seq.and_then(|s| s.parse().ok()).filter(|&s| s > 0),
                sent_nanos: stamps.sent.and_then(|s| s.parse().ok()).filter(|&s| s > 0),
            }
        }
        _ => Parsed::Garbage,
    }
}

fn now_nanos() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
}

/// Runs one watch client until `stop` flips (or its watch fails for good).
pub async fn run(
    shared: Arc<Shared>,
    me: Arc<Watcher>,
    index: usize,
    path: String,
    mut stop: watch::Receiver<bool>,
) {
    let mut first = true;
    let mut buf: Vec<u8> = Vec::new();
    let mut lags: Vec<u64> = Vec::new();
    let kubelet = me.node.and_then(|n| shared.nodes.as_ref().map(|c| c.client(n).clone()));
    let client = kubelet.clone().unwrap_or_else(|| shared.clients.pick(index).clone());
    loop {
        if *stop.borrow() {
            return;
        }
        let rv = me.tracker.lock().last_rv();
        let mut url = format!("{path}?watch=true&resourceVersion={rv}&timeoutSeconds=3600");
        if let Some(n) = me.node {
            url.push_str(&format!("&fieldSelector=spec.nodeName%3Dnode-{n}"));
        }
        if let Some((i, n)) = me.shard {
            url.push_str(&format!("&shardSelector={}", super::shards::query(i, n)));
        }
        let req = match (&kubelet, &shared.nodes) {
            (Some(_), Some(nodes)) => nodes.request(&shared.target, Method::GET, &url),
            _ => shared.target.request(Method::GET, &url, None),
        };
        let Some(req) = req else {
            me.failed.store(true, Relaxed);
            return;
        };
        let permit = shared.connect.acquire().await;
        let started = Instant::now();
        let resp = tokio::select! {
            r = tokio::time::timeout(Duration::from_secs(60), client.request(req)) => r,
            _ = stop.wait_for(|s| *s) => return,
        };
        drop(permit);
        let kind = shared.stats.kind(Kind::WatchOpen);
        if let Ok(Ok(r)) = &resp {
            shared.stats.version(r.version());
        }
        let resp = match resp {
            Ok(Ok(r)) if r.status().is_success() => r,
            other => {
                kind.errors.fetch_add(1, Relaxed);
                shared.stats.status(&match other {
                    Ok(Ok(r)) => r.status().as_u16().to_string(),
                    Ok(Err(_)) => "transport".into(),
                    Err(_) => "timeout".into(),
                });
                backoff(&mut stop).await;
                continue;
            }
        };
        kind.latency.record_duration(started.elapsed());
        kind.done.fetch_add(1, Relaxed);
        shared.stats.status("200");
        if first {
            first = false;
            shared.opened.fetch_add(1, Relaxed);
        } else {
            me.reconnects.fetch_add(1, Relaxed);
        }
        // Kubelets ask protobuf first: the proxy answers in protobuf, an upstream that cannot
        // (the sim) in JSON lines.
        let proto = resp
            .headers()
            .get(http::header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"application/vnd.kubernetes.protobuf"));
        let mut body = resp.into_body();
        buf.clear();
        loop {
            let frame = tokio::select! {
                f = body.frame() => f,
                _ = stop.wait_for(|s| *s) => return,
            };
            let Some(Ok(frame)) = frame else { break };
            let Ok(data) = frame.into_data() else { continue };
            shared.stats.watch_bytes.fetch_add(data.len() as u64, Relaxed);
            buf.extend_from_slice(&data);
            let mut start = 0;
            let now = now_nanos();
            let mut events = 0;
            let mut gave_up = false;
            {
                let mut t = me.tracker.lock();
                let parsed: Vec<Parsed> = if proto {
                    let (frames, used) = super::pbwatch::frames(&buf);
                    start = used;
                    frames.into_iter().map(super::pbwatch::parse_frame).collect()
                } else {
                    let mut out = Vec::new();
                    while let Some(pos) = buf[start..].iter().position(|&b| b == b'\n') {
                        let line = &buf[start..start + pos];
                        start += pos + 1;
                        if !line.is_empty() {
                            out.push(parse_line(line));
                        }
                    }
                    out
                };
                for p in parsed {
                    events += 1;
                    match p {
                        Parsed::Event { rv, seq, sent_nanos } => {
                            if t.observe(rv, seq) != Seen::Duplicate {
                                if let (Some(sent), Some(_)) = (sent_nanos, seq) {
                                    lags.push(
                                        u64::try_from(now.saturating_sub(sent) / 1000).unwrap_or(u64::MAX),
                                    );
                                }
                            }
                        }
                        Parsed::Bookmark { .. } => {}
                        Parsed::Error { code } => {
                            shared.stats.status(&format!("watch-error-{code}"));
                            gave_up = true;
                        }
                        Parsed::Garbage => shared.stats.status("watch-garbage"),
                    }
                }
            }
            buf.drain(..start);
            shared.stats.watch_events.fetch_add(events, Relaxed);
            let second = shared.phase_start.elapsed().as_secs() as usize;
            shared.stats.record_lags(second, &lags);
            lags.clear();
            if gave_up {
                // 410 or another error: the changes after it cannot be had without a relist,
                // so they show up as lost.
                me.failed.store(true, Relaxed);
                return;
            }
        }
        backoff(&mut stop).await;
    }
}

async fn backoff(stop: &mut watch::Receiver<bool>) {
    tokio::select! {
        _ = tokio::time::sleep(Duration::from_millis(200 + fastrand::u64(0..300))) => {},
        _ = stop.wait_for(|s| *s) => {},
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_parsed_minimally() {
        let ev = br#"{"type":"MODIFIED","object":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"n","resourceVersion":"42","annotations":{"bench.kube-watchcache.io/pad":"xx","bench.kube-watchcache.io/sent-unix-nanos":"1700000000000000000","bench.kube-watchcache.io/seq":"7"}},"spec":{"nodeName":"node-1","containers":[{"name":"c"}]}}}"#;
        assert_eq!(
            parse_line(ev),
            Parsed::Event { rv: 42, seq: Some(7), sent_nanos: Some(1_700_000_000_000_000_000) }
        );
        let seeded = br#"{"type":"ADDED","object":{"metadata":{"resourceVersion":"5","annotations":{"bench.kube-watchcache.io/seq":"0","bench.kube-watchcache.io/sent-unix-nanos":"0"}}}}"#;
        assert_eq!(parse_line(seeded), Parsed::Event { rv: 5, seq: None, sent_nanos: None });
        let plain = br#"{"type":"DELETED","object":{"metadata":{"resourceVersion":"6"}}}"#;
        assert_eq!(parse_line(plain), Parsed::Event { rv: 6, seq: None, sent_nanos: None });
        let bm = br#"{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"9","annotations":{"k8s.io/initial-events-end":"true"}}}}"#;
        assert_eq!(parse_line(bm), Parsed::Bookmark { rv: 9 });
        let err = br#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 1 (5)","reason":"Expired","code":410}}"#;
        assert_eq!(parse_line(err), Parsed::Error { code: 410 });
        assert_eq!(parse_line(b"{not json"), Parsed::Garbage);
    }
}
