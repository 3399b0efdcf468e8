//! Informer-like clients of the `restart` scenario: each lists all pods, then watches from the
//! list's RV, following client-go's reflector (1.28, `tools/cache/reflector.go`) rule by rule:
//! - the first LIST asks `resourceVersion=0&limit=500` (served from a watch cache, the limit
//!   ignored there); a relist asks the last RV seen without a limit (so that the watch cache, not
//!   etcd, answers), and only after that LIST got 410 an unpaginated-capable `resourceVersion=`
//!   (`""`, a consistent read) with `limit=500`;
//! - the watch asks `allowWatchBookmarks=true` and resumes from the last RV (event, bookmark or
//!   list) when it ends; "connection refused" and 429 retry the watch after a backoff (so does
//!   a kept-alive connection closed before any answer: Go's transport sends the GET again on a
//!   new one, which meets the closed port), a 410
//!   (answer or ERROR event), any other error and a "very short watch" (ended within a second
//!   with no event) relist after a backoff;
//! - the backoff is the reflector's: 800 ms doubling to 30 s, jitter 1.0, reset after 2 min
//!   quiet (scaled by [`Options::backoff`] so that the small run in `cargo test` is quick).
//!
//! Each keeps what an informer's store would (the RV of every pod), accounts the writer's
//! changes in its [`Tracker`] (events) and in `listed_seq` (changes a relist carried), and
//! counts its LISTs. Started and read by `restart`.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, StatusCode};
use http_body_util::BodyExt;
use parking_lot::Mutex;
use serde::Deserialize;
use tokio::sync::watch;

use super::env::{chain, HttpClient, Target};
use super::scenario::NAMESPACES;
use super::track::{Seen, Tracker};

/// How the informers behave.
#[derive(Clone, Debug)]
pub struct Options {
    /// The reflector's initial backoff (800 ms in client-go); the cap is 37.5× it (30 s).
    pub backoff: Duration,
    /// Bench pods (`bench-pod-<i>`, see `Plan::object_key`): the store keeps their RVs by index.
    pub objects: usize,
    /// LIST bodies being fetched and parsed at once, over all the harness's informers: a
    /// thousand clients relisting 10 MB each would need 10 GB at once in this one process.
    pub lists_at_once: Arc<tokio::sync::Semaphore>,
}

/// The harness's bound on concurrent LISTs ([`Options::lists_at_once`]).
pub const LISTS_AT_ONCE: usize = 32;

/// What an informer's store holds: each pod's resourceVersion (0 when absent).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Store {
    /// By bench pod index.
    pub rvs: Vec<u64>,
    /// Any other pod, by `namespace/name`.
    pub others: HashMap<String, u64>,
}

impl Store {
    pub fn new(objects: usize) -> Store {
        Store { rvs: vec![0; objects], others: HashMap::new() }
    }

    fn set(&mut self, ns: &str, name: &str, rv: Option<u64>) {
        match bench_index(ns, name).filter(|&i| i < self.rvs.len()) {
            Some(i) => self.rvs[i] = rv.unwrap_or(0),
            None => {
                let key = format!("{ns}/{name}");
                match rv {
                    Some(rv) => self.others.insert(key, rv),
                    None => self.others.remove(&key),
                };
            }
        }
    }

    /// Keys whose RV differs from `truth` (missing, ghost or stale).
    pub fn differences(&self, truth: &Store) -> usize {
        let pods = self.rvs.iter().zip(&truth.rvs).filter(|(a, b)| a != b).count();
        let others = self.others.iter().filter(|(k, v)| truth.others.get(*k) != Some(v)).count()
            + truth.others.keys().filter(|k| !self.others.contains_key(*k)).count();
        pods + others
    }
}

/// `bench-pod-<i>` in its namespace: `i`.
pub fn bench_index(ns: &str, name: &str) -> Option<usize> {
    let i: usize = name.strip_prefix("bench-pod-")?.parse().ok()?;
    (ns.strip_prefix("bench-")?.parse::<usize>().ok()? == i % NAMESPACES).then_some(i)
}

/// One informer's state.
pub struct Informer {
    pub state: Mutex<State>,
    /// LIST requests it sent (pages included).
    pub list_requests: AtomicU64,
    /// Full lists after the first (relists).
    pub relists: AtomicU64,
    /// Watches opened (200 answers).
    pub watch_opens: AtomicU64,
    /// Why its watches ended in a relist (`watch ERROR 410`, `watch answered 503`, `very short
    /// watch`, …) and why a relist's LIST was tried again, counted.
    pub relist_reasons: Mutex<BTreeMap<String, u64>>,
}

/// Guarded by the informer's lock.
pub struct State {
    pub tracker: Tracker,
    pub store: Store,
    /// By bench pod index: the highest writer `seq` a LIST showed (a relist carries the changes
    /// up to it, even though they never came as events).
    pub listed_seq: Vec<u64>,
    /// The first list has completed.
    pub synced: bool,
}

impl Informer {
    pub fn new(seq_base: u64, objects: usize) -> Informer {
        Informer {
            state: Mutex::new(State {
                tracker: Tracker::new(seq_base, 0),
                store: Store::new(objects),
                listed_seq: vec![0; objects],
                synced: false,
            }),
            list_requests: AtomicU64::new(0),
            relists: AtomicU64::new(0),
            watch_opens: AtomicU64::new(0),
            relist_reasons: Mutex::default(),
        }
    }

    /// A synced informer with this one's store (the harness lists once for all of a case's
    /// clients), accounting writer changes from `seq_base`.
    pub fn clone_synced(&self, seq_base: u64) -> Informer {
        let s = self.state.lock();
        let inf = Informer::new(seq_base, s.store.rvs.len());
        {
            let mut t = inf.state.lock();
            t.store = s.store.clone();
            t.listed_seq = s.listed_seq.clone();
            t.tracker = Tracker::new(seq_base, s.tracker.last_rv());
            t.synced = true;
        }
        inf
    }

    fn relist_because(&self, why: &str) {
        *self.relist_reasons.lock().entry(why.to_owned()).or_default() += 1;
    }

    /// Whether writer change `seq` (to pod `index`) reached this informer, as an event or
    /// through a list.
    pub fn got(s: &State, seq: u64, index: usize) -> bool {
        s.tracker.has(seq) || s.listed_seq.get(index).is_some_and(|&l| l >= seq)
    }
}

#[derive(Deserialize)]
struct Line<'a> {
    #[serde(borrow, rename = "type")]
    ty: Cow<'a, str>,
    #[serde(borrow)]
    object: Obj<'a>,
}

#[derive(Deserialize, Default)]
struct Obj<'a> {
    #[serde(borrow, default)]
    metadata: Meta<'a>,
    #[serde(default)]
    code: Option<u16>,
}

#[derive(Deserialize, Default)]
struct Meta<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    namespace: Option<Cow<'a, str>>,
    #[serde(borrow, default, rename = "resourceVersion")]
    rv: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    annotations: Option<Stamps<'a>>,
    #[serde(borrow, default, rename = "continue")]
    cont: Option<Cow<'a, str>>,
}

#[derive(Deserialize, Default)]
struct Stamps<'a> {
    #[serde(borrow, default, rename = "bench.kube-watchcache.io/seq")]
    seq: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct List<'a> {
    #[serde(borrow, default)]
    metadata: Meta<'a>,
    #[serde(borrow, default)]
    items: Vec<Obj<'a>>,
}

impl Meta<'_> {
    fn rv(&self) -> Option<u64> {
        self.rv.as_deref()?.parse().ok()
    }

    fn seq(&self) -> Option<u64> {
        self.annotations.as_ref()?.seq.as_deref()?.parse().ok().filter(|&s| s > 0)
    }
}

/// What ended a LIST or a watch request.
enum Failure {
    /// The upstream answered 410 Gone.
    Expired,
    /// Nobody listens ("connection refused") or 429: client-go retries the watch.
    Retriable,
    /// Anything else, said in a few words.
    Other(String),
}

async fn request(client: &HttpClient, target: &Target, path: &str) -> Result<HyperResponse, Failure> {
    let req = target.request(Method::GET, path, None).ok_or(Failure::Other("bad URL".into()))?;
    let resp = match tokio::time::timeout(Duration::from_secs(60), client.request(req)).await {
        Ok(Ok(r)) => r,
        // Go's transport sends a GET again by itself when a kept-alive connection closed before
        // any answer; the second try then meets the closed port.
        Ok(Err(e)) if chain(&e).contains("onnection refused") || incomplete(&e) => {
            return Err(Failure::Retriable)
        }
        Ok(Err(e)) => {
            let msg = chain(&e);
            return Err(Failure::Other(format!("transport error ({})", &msg[..msg.len().min(120)])));
        }
        Err(_) => return Err(Failure::Other("no answer within 60 s".into())),
    };
    match resp.status() {
        s if s.is_success() => Ok(resp),
        StatusCode::GONE => Err(Failure::Expired),
        StatusCode::TOO_MANY_REQUESTS => Err(Failure::Retriable),
        s => Err(Failure::Other(format!("answered {}", s.as_u16()))),
    }
}

/// hyper's "connection closed before message completed".
fn incomplete(e: &hyper_util::client::legacy::Error) -> bool {
    use std::error::Error as _;
    e.source().and_then(|s| s.downcast_ref::<hyper::Error>()).is_some_and(hyper::Error::is_incomplete_message)
}

type HyperResponse = http::Response<hyper::body::Incoming>;

/// The reflector's backoff manager.
struct Backoff {
    base: Duration,
    next: Duration,
    last: Instant,
}

impl Backoff {
    fn new(base: Duration) -> Backoff {
        Backoff { base, next: base, last: Instant::now() }
    }

    async fn wait(&mut self, stop: &mut watch::Receiver<bool>) {
        if self.last.elapsed() > Duration::from_secs(120) {
            self.next = self.base;
        }
        let d = self.next.mul_f64(1.0 + fastrand::f64());
        self.next = (self.next * 2).min(self.base.mul_f64(37.5));
        tokio::select! {
            _ = tokio::time::sleep(d) => {},
            _ = stop.wait_for(|s| *s) => {},
        }
        self.last = Instant::now();
    }
}

/// One informer until `stop` flips.
pub async fn run(
    me: Arc<Informer>,
    client: HttpClient,
    target: Target,
    opts: Options,
    mut stop: watch::Receiver<bool>,
) {
    let mut backoff = Backoff::new(opts.backoff);
    // client-go's isLastSyncResourceVersionUnavailable.
    let mut unavailable = false;
    // Primed by the harness's list: straight to the watch.
    let mut primed = me.state.lock().synced;
    loop {
        if *stop.borrow() {
            return;
        }
        if std::mem::take(&mut primed) {
            if let Some(ended) = watch_loop(&me, &client, &target, &mut backoff, &mut stop).await {
                return ended;
            }
            backoff.wait(&mut stop).await;
            continue;
        }
        let (synced, last) = {
            let s = me.state.lock();
            (s.synced, s.tracker.last_rv())
        };
        let rv = match (unavailable, synced) {
            (true, _) => String::new(),
            (false, false) => "0".into(),
            (false, true) => last.to_string(),
        };
        match list(&me, &client, &target, &rv, &opts, &mut stop).await {
            Ok(()) => unavailable = false,
            Err(Failure::Expired) => {
                me.relist_because("list answered 410 (then resourceVersion=\"\")");
                unavailable = true;
                backoff.wait(&mut stop).await;
                continue;
            }
            Err(Failure::Retriable) => {
                me.relist_because("list refused or answered 429 (retried)");
                backoff.wait(&mut stop).await;
                continue;
            }
            Err(Failure::Other(why)) => {
                me.relist_because(&format!("list {why} (retried)"));
                backoff.wait(&mut stop).await;
                continue;
            }
        }
        if let Some(ended) = watch_loop(&me, &client, &target, &mut backoff, &mut stop).await {
            return ended;
        }
        backoff.wait(&mut stop).await;
    }
}

/// Watches until a relist is due (`None`) or `stop` flips (`Some`).
async fn watch_loop(
    me: &Informer,
    client: &HttpClient,
    target: &Target,
    backoff: &mut Backoff,
    stop: &mut watch::Receiver<bool>,
) -> Option<()> {
    // The watch loop: ends (with a relist next) on 410, an error or a very short watch.
    loop {
        if *stop.borrow() {
            return Some(());
        }
        let rv = me.state.lock().tracker.last_rv();
        let timeout = 300 + fastrand::u64(0..300);
        let path = format!(
            "/api/v1/pods?watch=true&resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds={timeout}"
        );
        let resp = tokio::select! {
            r = request(client, target, &path) => r,
            _ = stop.wait_for(|s| *s) => return Some(()),
        };
        let resp = match resp {
            Ok(r) => r,
            Err(Failure::Retriable) => {
                backoff.wait(stop).await;
                continue;
            }
            Err(Failure::Expired) => {
                me.relist_because("watch answered 410");
                return None;
            }
            Err(Failure::Other(why)) => {
                me.relist_because(&format!("watch {why}"));
                return None;
            }
        };
        me.watch_opens.fetch_add(1, Relaxed);
        match stream(me, resp, stop).await {
            Ended::Stop => return Some(()),
            Ended::Normally => continue,
            Ended::Relist(why) => {
                me.relist_because(why);
                return None;
            }
        }
    }
}

enum Ended {
    Stop,
    Normally,
    Relist(&'static str),
}

/// Reads one watch until it ends.
async fn stream(me: &Informer, resp: HyperResponse, stop: &mut watch::Receiver<bool>) -> Ended {
    let started = Instant::now();
    let mut events = 0u64;
    let mut body = resp.into_body();
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let frame = tokio::select! {
            f = body.frame() => f,
            _ = stop.wait_for(|s| *s) => return Ended::Stop,
        };
        let data = match frame {
            Some(Ok(f)) => match f.into_data() {
                Ok(d) => d,
                Err(_) => continue,
            },
            Some(Err(_)) | None => break,
        };
        buf.extend_from_slice(&data);
        let mut start = 0;
        let mut s = me.state.lock();
        while let Some(pos) = buf[start..].iter().position(|&b| b == b'\n') {
            let line = &buf[start..start + pos];
            start += pos + 1;
            if line.is_empty() {
                continue;
            }
            let Ok(l) = serde_json::from_slice::<Line>(line) else {
                return Ended::Relist("unparseable watch event");
            };
            events += 1;
            let m = &l.object.metadata;
            match (l.ty.as_ref(), m.rv()) {
                ("ERROR", _) => {
                    // 410 or another error: client-go relists (from the last RV).
                    return Ended::Relist(match l.object.code {
                        Some(410) => "watch ERROR 410",
                        _ => "watch ERROR event",
                    });
                }
                ("BOOKMARK", Some(rv)) => s.tracker.bookmark(rv),
                (ty @ ("ADDED" | "MODIFIED" | "DELETED"), Some(rv)) => {
                    if s.tracker.observe(rv, m.seq()) == Seen::Duplicate {
                        continue;
                    }
                    let (ns, name) = (m.namespace.as_deref().unwrap_or(""), m.name.as_deref().unwrap_or(""));
                    s.store.set(ns, name, (ty != "DELETED").then_some(rv));
                }
                _ => return Ended::Relist("unexpected watch event"),
            }
        }
        drop(s);
        buf.drain(..start);
    }
    // client-go's "very short watch": under a second and no event is an error, and relists.
    if started.elapsed() < Duration::from_secs(1) && events == 0 {
        Ended::Relist("very short watch")
    } else {
        Ended::Normally
    }
}

/// One full list at `rv` into `me`, outside the reflector loop (the harness's own lists).
pub async fn list_once(
    me: &Informer,
    client: &HttpClient,
    target: &Target,
    rv: &str,
    opts: &Options,
    mut stop: watch::Receiver<bool>,
) -> Result<(), String> {
    list(me, client, target, rv, opts, &mut stop).await.map_err(|f| match f {
        Failure::Expired => "410 Gone".to_owned(),
        Failure::Retriable => "connection refused or 429".to_owned(),
        Failure::Other(why) => why,
    })
}

/// One full list (all its pages) at `rv` (`""`, `"0"` or the last RV seen), replacing the store.
async fn list(
    me: &Informer,
    client: &HttpClient,
    target: &Target,
    rv: &str,
    opts: &Options,
    stop: &mut watch::Receiver<bool>,
) -> Result<(), Failure> {
    // client-go's pager: a limit unless the RV is a specific one (then the watch cache answers).
    let paginate = rv.is_empty() || rv == "0";
    let mut store = Store::new(opts.objects);
    let mut listed: Vec<(usize, u64)> = Vec::new();
    let mut cont = String::new();
    let list_rv = loop {
        let mut path = format!("/api/v1/pods?resourceVersion={rv}");
        if paginate {
            path.push_str("&limit=500");
        }
        if !cont.is_empty() {
            path = format!("/api/v1/pods?limit=500&continue={}", encode(&cont));
        }
        let _permit = tokio::select! {
            p = opts.lists_at_once.acquire() => p.map_err(|_| Failure::Other("stopped".into()))?,
            _ = stop.wait_for(|s| *s) => return Err(Failure::Other("stopped".into())),
        };
        me.list_requests.fetch_add(1, Relaxed);
        let body = tokio::select! {
            r = fetch(client, target, &path) => r?,
            _ = stop.wait_for(|s| *s) => return Err(Failure::Other("stopped".into())),
        };
        let l: List = serde_json::from_slice(&body).map_err(|_| Failure::Other("unparseable list".into()))?;
        for o in &l.items {
            let m = &o.metadata;
            let (ns, name) = (m.namespace.as_deref().unwrap_or(""), m.name.as_deref().unwrap_or(""));
            store.set(ns, name, m.rv());
            if let (Some(i), Some(seq)) = (bench_index(ns, name), m.seq()) {
                listed.push((i, seq));
            }
        }
        match l.metadata.cont.as_deref().filter(|c| !c.is_empty()) {
            Some(c) => cont = c.to_owned(),
            None => break l.metadata.rv().ok_or(Failure::Other("list without a resourceVersion".into()))?,
        }
    };
    let mut s = me.state.lock();
    if s.synced {
        me.relists.fetch_add(1, Relaxed);
    }
    s.synced = true;
    s.store = store;
    s.tracker.relisted(list_rv);
    for (i, seq) in listed {
        if let Some(l) = s.listed_seq.get_mut(i) {
            *l = (*l).max(seq);
        }
    }
    Ok(())
}

async fn fetch(client: &HttpClient, target: &Target, path: &str) -> Result<Bytes, Failure> {
    let resp = request(client, target, path).await?;
    let body = tokio::time::timeout(Duration::from_secs(120), resp.into_body().collect())
        .await
        .map_err(|_| Failure::Other("list body not read within 120 s".into()))?
        .map_err(|_| Failure::Other("list body cut".into()))?;
    Ok(body.to_bytes())
}

fn encode(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bench_pods_are_kept_by_index_and_compared_with_the_truth() {
        assert_eq!(bench_index("bench-3", "bench-pod-13"), Some(13));
        assert_eq!(bench_index("bench-4", "bench-pod-13"), None, "not where the bench puts it");
        assert_eq!(bench_index("default", "web"), None);
        let mut a = Store::new(20);
        a.set("bench-3", "bench-pod-13", Some(7));
        a.set("default", "web", Some(9));
        let mut truth = a.clone();
        assert_eq!(a.differences(&truth), 0);
        truth.set("bench-3", "bench-pod-13", Some(8));
        truth.set("default", "web", None);
        truth.set("kube-system", "dns", Some(3));
        assert_eq!(a.differences(&truth), 3, "a stale pod, a ghost and a missing one");
    }

    #[test]
    fn a_change_arrives_as_an_event_or_through_a_list() {
        let inf = Informer::new(10, 4);
        let mut s = inf.state.lock();
        s.tracker.observe(5, Some(10));
        s.listed_seq[2] = 12;
        assert!(Informer::got(&s, 10, 1), "as an event");
        assert!(Informer::got(&s, 11, 2) && Informer::got(&s, 12, 2), "carried by a list");
        assert!(!Informer::got(&s, 13, 2) && !Informer::got(&s, 11, 3));
    }
}
