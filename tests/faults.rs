//! Fault injection between the proxy and its upstream (docs/design.md §6 Reliability, the "Faults,
//! proven" issue). The TCP fault proxy of `common::fault` sits between the proxy's upstream
//! client and the simulated apiserver and, on command, drops every open connection, refuses new
//! ones (upstream down), delays every chunk (slow upstream), stops forwarding on the open
//! connections without closing them (blackhole), or answers the next N LISTs of configmaps
//! with HTTP 500.
//!
//! Every fault case (all but the before-first-sync one and the test of the checks) runs 1 000
//! HTTP/1.1 watchers of the proxy (half on all configmaps, half on one namespace each) while a writer changes configmaps in the sim before, during and after the
//! fault, and checks each watcher against the writer's own record: every matching change
//! exactly once, in increasing resourceVersion order (across a relist: a clean end right after
//! what it had, for every watcher, as each started before the list: issue 31). Run by `cargo test --test faults`; owned by the reliability work
//! (README "## Reliability"). The tests share one lock so that only one runs at a time.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use kube_watchcache::app::{self, Running};
use kube_watchcache::config::ServeArgs;
use kube_watchcache_sim::{Sim, SimHandle, SimOptions};
use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio::sync::watch;

mod common;
use common::fault::Fault;

const WATCHERS: usize = 1000;
const NAMESPACES: usize = 10;
/// Pause between two writes of the writer (~30 changes/s).
const WRITE_EVERY: Duration = Duration::from_millis(33);
/// Bound of every wait on an observable condition: above the reflector's longest backoff
/// (30 s), which a cut that lasts while the suite loads both cores reaches (20 s was not: a
/// relist after a cut of ~12 s came after it, once, in a full local run).
const DEADLINE: Duration = Duration::from_secs(45);

/// One test at a time: each has 1 000 watchers and shares the two cores with the others.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Polls `cond` every 20 ms until it holds or `DEADLINE` passes; returns whether it held.
async fn until(mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + DEADLINE;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() > end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// The writer: changes configmaps in the sim and keeps its own record.

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Kind {
    Added,
    Modified,
    Deleted,
}

/// One change as the writer made it (what every matching watcher must see).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Change {
    kind: Kind,
    rv: u64,
    ns: usize,
    name: String,
}

/// The writer's record and its model of the sim's configmaps in `ns-*`: (ns, name) → rv.
#[derive(Default)]
struct Record {
    changes: Vec<Change>,
    state: BTreeMap<(usize, String), u64>,
    counter: u64,
}

fn rv_of(o: &Value) -> u64 {
    o["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap()
}

impl Record {
    /// One random change: create (40 %), update (40 %) or delete (20 %) in a random namespace.
    fn step(&mut self, sim: &Sim) {
        let ns = fastrand::usize(..NAMESPACES);
        let existing: Vec<String> = self
            .state
            .range((ns, String::new())..(ns + 1, String::new()))
            .map(|((_, n), _)| n.clone())
            .collect();
        let roll = fastrand::u8(..10);
        let (kind, name, obj) = if existing.is_empty() || roll < 4 {
            self.counter += 1;
            let name = format!("cm-{}", self.counter);
            let o = sim.create("configmaps", &format!("ns-{ns}"), cm(ns, &name, "0")).expect("create");
            (Kind::Added, name, o)
        } else {
            let name = existing[fastrand::usize(..existing.len())].clone();
            if roll < 8 {
                self.counter += 1;
                let o = sim
                    .update("configmaps", &format!("ns-{ns}"), cm(ns, &name, &self.counter.to_string()))
                    .expect("update");
                (Kind::Modified, name, o)
            } else {
                let o = sim.delete("configmaps", &format!("ns-{ns}"), &name).expect("delete");
                (Kind::Deleted, name, o)
            }
        };
        let rv = rv_of(&obj);
        match kind {
            Kind::Deleted => self.state.remove(&(ns, name.clone())),
            _ => self.state.insert((ns, name.clone()), rv),
        };
        self.changes.push(Change { kind, rv, ns, name });
    }
}

fn cm(ns: usize, name: &str, v: &str) -> Value {
    json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":name,"namespace":format!("ns-{ns}"),"labels":{"app":"faults"}},"data":{"v":v}})
}

/// A writer task making a change every [`WRITE_EVERY`] until stopped.
struct Writer {
    record: Arc<Mutex<Record>>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Writer {
    fn start(sim: Sim, record: Arc<Mutex<Record>>) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let (r, s) = (record.clone(), stop.clone());
        let task = tokio::spawn(async move {
            while !s.load(SeqCst) {
                r.lock().step(&sim);
                tokio::time::sleep(WRITE_EVERY).await;
            }
        });
        Writer { record, stop, task }
    }

    fn written(&self) -> usize {
        self.record.lock().changes.len()
    }

    /// Waits until `n` more changes have been made (bounded).
    async fn more(&self, n: usize) {
        let target = self.written() + n;
        assert!(until(|| self.written() >= target).await, "the writer made {n} changes");
    }

    async fn stop(self) {
        self.stop.store(true, SeqCst);
        self.task.await.unwrap();
    }
}

// ---------------------------------------------------------------------------------------------
// Watchers of the proxy: HTTP/1.1, one connection each.

#[derive(Deserialize)]
struct Line<'a> {
    #[serde(rename = "type", borrow)]
    kind: &'a str,
    #[serde(borrow)]
    object: Obj<'a>,
}

#[derive(Deserialize)]
struct Obj<'a> {
    #[serde(borrow, default)]
    metadata: Option<Meta<'a>>,
}

#[derive(Deserialize)]
struct Meta<'a> {
    #[serde(borrow, default)]
    name: &'a str,
    #[serde(borrow, default)]
    namespace: &'a str,
    #[serde(rename = "resourceVersion", borrow, default)]
    rv: &'a str,
}

/// What one watcher received.
#[derive(Default, Debug)]
struct Seen {
    changes: Vec<Change>,
    /// Events that are not ADDED/MODIFIED/DELETED of an `ns-*` configmap (ERROR, BOOKMARK…).
    other: Vec<String>,
    /// The stream ended (or failed) before the test stopped it.
    ended: Option<String>,
}

fn parse(line: &[u8], seen: &mut Seen) -> Option<u64> {
    let l: Line<'_> = match serde_json::from_slice(line) {
        Ok(l) => l,
        Err(e) => {
            seen.other.push(format!("unparseable ({e}): {}", String::from_utf8_lossy(line)));
            return None;
        }
    };
    let kind = match l.kind {
        "ADDED" => Kind::Added,
        "MODIFIED" => Kind::Modified,
        "DELETED" => Kind::Deleted,
        _ => {
            seen.other.push(String::from_utf8_lossy(line).into_owned());
            return None;
        }
    };
    let m = l.object.metadata?;
    let ns = m.namespace.strip_prefix("ns-").and_then(|n| n.parse().ok())?;
    let rv = m.rv.parse().ok()?;
    seen.changes.push(Change { kind, rv, ns, name: m.name.to_owned() });
    Some(rv)
}

struct Watchers {
    /// The namespace each watcher is limited to (`None`: all configmaps).
    scope: Vec<Option<usize>>,
    /// The highest RV each one has received so far.
    last: Arc<Vec<AtomicU64>>,
    opened: Arc<AtomicUsize>,
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<Seen>>,
}

impl Watchers {
    /// Opens `WATCHERS` watches from `rv`: even ones on all configmaps, odd ones on `ns-k`.
    async fn open(proxy: SocketAddr, rv: u64) -> Watchers {
        let scope: Vec<Option<usize>> =
            (0..WATCHERS).map(|i| (i % 2 == 1).then_some((i / 2) % NAMESPACES)).collect();
        let last: Arc<Vec<AtomicU64>> = Arc::new((0..WATCHERS).map(|_| AtomicU64::new(rv)).collect());
        let opened = Arc::new(AtomicUsize::new(0));
        let (stop, stop_rx) = watch::channel(false);
        let mut tasks = Vec::with_capacity(WATCHERS);
        for (i, s) in scope.iter().enumerate() {
            let path = match s {
                None => format!("/api/v1/configmaps?watch=true&resourceVersion={rv}"),
                Some(ns) => format!("/api/v1/namespaces/ns-{ns}/configmaps?watch=true&resourceVersion={rv}"),
            };
            tasks.push(tokio::spawn(watch_one(
                proxy,
                path,
                i,
                last.clone(),
                opened.clone(),
                stop_rx.clone(),
            )));
        }
        let w = Watchers { scope, last, opened, stop, tasks };
        assert!(
            until(|| w.opened.load(SeqCst) == WATCHERS).await,
            "{} of {WATCHERS} watches open",
            w.opened.load(SeqCst)
        );
        w
    }

    /// Waits (bounded) until every watcher has an event at or past the last change it should
    /// see; returns whether they all did.
    async fn caught_up(&self, record: &Mutex<Record>) -> bool {
        let mut want = [0u64; NAMESPACES];
        for c in &record.lock().changes {
            want[c.ns] = want[c.ns].max(c.rv);
        }
        self.caught_up_to(want).await
    }

    /// The same across a relist at an RV in (`before`, `after`]: a change made in between may
    /// never show (an object created and deleted there), but every object of the final state
    /// arrives with its RV, and so does every change outside that range.
    async fn caught_up_relist(&self, record: &Mutex<Record>, before: u64, after: u64) -> bool {
        let mut want = [0u64; NAMESPACES];
        {
            let r = record.lock();
            for c in r.changes.iter().filter(|c| c.rv <= before || c.rv > after) {
                want[c.ns] = want[c.ns].max(c.rv);
            }
            for ((ns, _), rv) in &r.state {
                want[*ns] = want[*ns].max(*rv);
            }
        }
        self.caught_up_to(want).await
    }

    async fn caught_up_to(&self, want: [u64; NAMESPACES]) -> bool {
        let all = want.iter().copied().max().unwrap_or(0);
        until(|| {
            self.scope
                .iter()
                .zip(self.last.iter())
                .all(|(s, l)| l.load(SeqCst) >= s.map_or(all, |ns| want[ns]))
        })
        .await
    }

    /// Stops every watch and returns what each saw, with its scope.
    async fn finish(self) -> Vec<(Option<usize>, Seen)> {
        self.stop.send_replace(true);
        let mut out = Vec::new();
        for (s, t) in self.scope.into_iter().zip(self.tasks) {
            out.push((s, t.await.unwrap()));
        }
        out
    }
}

async fn watch_one(
    proxy: SocketAddr,
    path: String,
    i: usize,
    last: Arc<Vec<AtomicU64>>,
    opened: Arc<AtomicUsize>,
    mut stop: watch::Receiver<bool>,
) -> Seen {
    let mut seen = Seen::default();
    let tcp = TcpStream::connect(proxy).await.expect("connect to the proxy");
    let (mut send, conn) =
        hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(tcp)).await.expect("handshake");
    tokio::spawn(conn);
    let req = Request::get(&path).header("host", proxy.to_string()).body(Empty::new()).unwrap();
    let resp = send.send_request(req).await.expect("watch response");
    assert_eq!(resp.status(), 200, "watch {path}");
    opened.fetch_add(1, SeqCst);
    let mut body = resp.into_body();
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let frame = tokio::select! {
            f = body.frame() => f,
            _ = stop.wait_for(|s| *s) => return seen,
        };
        match frame {
            Some(Ok(f)) => {
                if let Ok(data) = f.into_data() {
                    buf.extend_from_slice(&data);
                    let mut start = 0;
                    while let Some(p) = buf[start..].iter().position(|b| *b == b'\n') {
                        let line = &buf[start..start + p];
                        start += p + 1;
                        if !line.is_empty() {
                            if let Some(rv) = parse(line, &mut seen) {
                                last[i].fetch_max(rv, SeqCst);
                            }
                        }
                    }
                    buf.drain(..start);
                }
            }
            Some(Err(e)) => {
                seen.ended = Some(format!("stream error: {e}"));
                break;
            }
            None => {
                seen.ended = Some("stream ended".into());
                break;
            }
        }
    }
    // Keep the result until the test stops us (so `caught_up` does not wait on a dead one).
    last[i].store(u64::MAX, SeqCst);
    let _ = stop.wait_for(|s| *s).await;
    seen
}

// ---------------------------------------------------------------------------------------------
// The setup every test shares, and the checks.

struct Env {
    sim: SimHandle,
    fault: Fault,
    proxy: Running,
    record: Arc<Mutex<Record>>,
    /// The RV the watchers start from.
    start_rv: u64,
}

/// Sim → fault proxy → proxy (configmaps only), 5 configmaps per namespace, synced.
async fn setup(sim_opts: SimOptions) -> Env {
    setup_with(sim_opts, None).await
}

/// `setup` with the proxy's `--upstream-watch-idle-timeout`.
async fn setup_with(sim_opts: SimOptions, watch_idle_timeout: Option<Duration>) -> Env {
    let sim = Sim::start(sim_opts).await.expect("sim starts");
    for ns in 0..NAMESPACES {
        sim.sim
            .create(
                "namespaces",
                "",
                json!({"apiVersion":"v1","kind":"Namespace","metadata":{"name":format!("ns-{ns}")}}),
            )
            .expect("namespace");
    }
    let record = Arc::new(Mutex::new(Record::default()));
    for _ in 0..5 * NAMESPACES {
        record.lock().step(&sim.sim);
    }
    let fault = Fault::start(sim.addr).await;
    let mut args =
        ServeArgs::local(&format!("http://{}", fault.addr), &["configmaps"], "127.0.0.1:0".parse().unwrap());
    args.history_max_events = 10_000;
    args.shutdown_grace_period = Duration::from_secs(2);
    args.security.max_watches_per_user = 0;
    if let Some(t) = watch_idle_timeout {
        args.upstream_watch_idle_timeout = t;
    }
    let proxy = app::start(&args).await.expect("proxy starts");
    assert!(proxy.wait_ready(DEADLINE).await, "proxy synced");
    let start_rv = sim.sim.current_rv().0;
    let reader = &proxy.readers()[0];
    reader.wait_for(kube_watchcache::resource::Rv(start_rv), DEADLINE).await.expect("cache at the start RV");
    record.lock().changes.clear();
    Env { sim, fault, proxy, record, start_rv }
}

impl Env {
    fn cache_rv(&self) -> u64 {
        self.proxy.readers()[0].progress().rv.0
    }

    /// The reflector's LISTs of configmaps (pages of 500, not watches) the sim has received.
    fn upstream_lists(&self) -> usize {
        self.sim.sim.request_count(|r| common::reflector_list(r, "/api/v1/configmaps"))
    }

    fn upstream_watches(&self) -> usize {
        self.sim.sim.request_count(|r| r.path == "/api/v1/configmaps" && r.query.contains("watch=true"))
    }

    fn writer(&self) -> Writer {
        Writer::start(self.sim.sim.clone(), self.record.clone())
    }

    /// A cached read through the proxy (`resourceVersion=0`): (status, items, elapsed).
    async fn cached_list(&self, ns: Option<usize>) -> (u16, usize, Duration) {
        let path = match ns {
            None => "/api/v1/configmaps?resourceVersion=0".to_owned(),
            Some(ns) => format!("/api/v1/namespaces/ns-{ns}/configmaps?resourceVersion=0"),
        };
        let (status, v, took) = get(self.proxy.addr, &path).await;
        (status, v["items"].as_array().map_or(0, Vec::len), took)
    }

    /// The proxy's client must speak HTTP/1.1 to a plain-http upstream (the 500 injection and
    /// the per-connection faults rely on it).
    fn assert_http1(&self) {
        assert!(!self.fault.st.h2_preface.load(SeqCst), "the proxy spoke h2c to the upstream");
        assert!(self.fault.count(|s| &s.heads) > 0, "request heads seen");
    }
}

/// A GET on a new HTTP/1.1 connection: (status, JSON body or Null, elapsed).
async fn get(addr: SocketAddr, path: &str) -> (u16, Value, Duration) {
    let t = Instant::now();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(tcp)).await.unwrap();
    tokio::spawn(conn);
    let req = Request::get(path).header("host", addr.to_string()).body(Empty::new()).unwrap();
    let resp = tokio::time::timeout(DEADLINE, send.send_request(req)).await.expect("answer in time").unwrap();
    let status = resp.status().as_u16();
    let body = tokio::time::timeout(DEADLINE, resp.into_body().collect()).await.expect("body in time");
    let v: Value = serde_json::from_slice(&body.unwrap().to_bytes()).unwrap_or(Value::Null);
    (status, v, t.elapsed())
}

/// Totals over all watchers.
#[derive(Debug, Default)]
struct Tally {
    expected: usize,
    received: usize,
    lost: usize,
    duplicated: usize,
    reordered: usize,
    unexpected: usize,
    other_events: usize,
    ended: usize,
}

fn matches(scope: Option<usize>, ns: usize) -> bool {
    scope.is_none_or(|s| s == ns)
}

/// Exact delivery: each watcher saw exactly the writer's matching changes, once each, in
/// increasing RV order, and its stream is still open.
fn check_exact(record: &Record, seen: &[(Option<usize>, Seen)]) -> Tally {
    let mut t = Tally::default();
    let mut first_bad: Option<String> = None;
    for (i, (scope, s)) in seen.iter().enumerate() {
        let want: Vec<&Change> = record.changes.iter().filter(|c| matches(*scope, c.ns)).collect();
        let want_set: HashSet<&Change> = want.iter().copied().collect();
        let mut got_set = HashSet::new();
        let mut prev = 0;
        let (mut lost, mut dup, mut reord, mut unexp) = (0, 0, 0, 0);
        for c in &s.changes {
            if !got_set.insert(c) {
                dup += 1;
            }
            if c.rv <= prev {
                reord += 1;
            }
            prev = prev.max(c.rv);
            if !want_set.contains(c) {
                unexp += 1;
            }
        }
        for c in &want {
            if !got_set.contains(c) {
                lost += 1;
            }
        }
        t.expected += want.len();
        t.received += s.changes.len();
        t.lost += lost;
        t.duplicated += dup;
        t.reordered += reord;
        t.unexpected += unexp;
        t.other_events += s.other.len();
        t.ended += usize::from(s.ended.is_some());
        if first_bad.is_none() && (lost + dup + reord + unexp > 0 || !s.other.is_empty() || s.ended.is_some())
        {
            first_bad = Some(format!(
                "watcher {i} ({scope:?}): lost {lost}, dup {dup}, reordered {reord}, unexpected {unexp}, other {:?}, ended {:?}",
                s.other.iter().take(2).collect::<Vec<_>>(),
                s.ended
            ));
        }
    }
    if let Some(b) = first_bad {
        eprintln!("first bad watcher: {b}");
    }
    t
}

/// Delivery across a relist from cache RV `before` to a list at an RV in (`before`, `after`]
/// (docs/design.md §6): a watcher either ended cleanly at the relist, having received exactly the
/// changes up to its last RV (≤ `before`) and nothing else, or stayed open and received every
/// change of its scope at or below `before` and above `after`, in order (since issue 31 none
/// that started before the list stays: `relist_case` asserts that all ended). No relist difference is ever sent: every event is a
/// change the writer made. Counts the ended watchers in `ended`.
fn check_relist(record: &Record, before: u64, after: u64, seen: &[(Option<usize>, Seen)]) -> Tally {
    let mut t = Tally::default();
    let mut first_bad: Option<String> = None;
    for (i, (scope, s)) in seen.iter().enumerate() {
        let mut bad = Vec::new();
        let last = s.changes.last().map_or(0, |c| c.rv);
        let ended = s.ended.as_deref() == Some("stream ended");
        let want: Vec<&Change> = record
            .changes
            .iter()
            .filter(|c| matches(*scope, c.ns))
            .filter(|c| if ended { c.rv <= last } else { c.rv <= before || c.rv > after })
            .collect();
        if ended && last > before {
            t.unexpected += 1;
            bad.push(format!("ended after an event at {last} > the cache RV {before} at the cut"));
        }
        let got: Vec<&Change> = s.changes.iter().collect();
        if got != want {
            let got_set: HashSet<&Change> = got.iter().copied().collect();
            let want_set: HashSet<&Change> = want.iter().copied().collect();
            let lost = want.iter().filter(|c| !got_set.contains(*c)).count();
            let unexpected = got.iter().filter(|c| !want_set.contains(*c)).count();
            t.lost += lost;
            t.unexpected += unexpected;
            t.duplicated += got.len() - got_set.len();
            if lost + unexpected + got.len() - got_set.len() == 0 {
                t.reordered += 1;
            }
            bad.push(format!(
                "lost {lost}, unexpected {unexpected}, received {} of {}",
                got.len(),
                want.len()
            ));
        }
        t.expected += want.len();
        t.received += got.len();
        t.other_events += s.other.len();
        t.ended += usize::from(ended);
        if s.ended.is_some() && !ended {
            t.other_events += 1;
            bad.push(format!("stream failed: {:?}", s.ended));
        }
        if !s.other.is_empty() {
            bad.push(format!("other {:?}", s.other.iter().take(2).collect::<Vec<_>>()));
        }
        if first_bad.is_none() && !bad.is_empty() {
            first_bad = Some(format!("watcher {i} ({scope:?}): {bad:?}"));
        }
    }
    if let Some(b) = first_bad {
        eprintln!("first bad watcher: {b}");
    }
    t
}

/// `caught_up`: every watcher reached the last change within the deadline — asserted first, so
/// a machine too slow to deliver in time says so rather than count the undelivered as lost.
fn assert_clean(name: &str, t: &Tally, caught_up: bool) {
    eprintln!("{name}: {t:?}");
    assert!(caught_up, "{name}: not every watcher caught up within {DEADLINE:?}: {t:?}");
    assert!(t.expected > 0, "{name}: something to deliver");
    assert_eq!(
        (t.lost, t.duplicated, t.reordered, t.unexpected, t.other_events, t.ended),
        (0, 0, 0, 0, 0, 0),
        "{name}: (lost, duplicated, reordered, unexpected, other events, ended streams) over {WATCHERS} watchers: {t:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// The cases.

/// 1. The upstream goes away (open connections dropped, new ones refused) while the sim keeps
///    writing, then comes back with its revision continued: the cache re-watches from its RV
///    (still inside the sim's window) without a relist, and every change reaches every watcher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_restart_resumes_without_relist() {
    let _g = SERIAL.lock().await;
    let env = setup(SimOptions::default()).await;
    let watchers = Watchers::open(env.proxy.addr, env.start_rv).await;
    let lists = env.upstream_lists();
    let writer = env.writer();
    writer.more(20).await;

    env.fault.down();
    let t_down = Instant::now();
    let n_down = writer.written();
    // While it is down: Any reads are served from the cache; a NotOlderThan read the cache
    // cannot prove waits --freshness-wait (3 s), is forwarded and fails like the upstream.
    // Down until that read is done and the reflector has been turned away twice (its backoff
    // takes ~2.4–4.8 s for that): three refusals with the forwarded read's.
    let reads = async {
        let any = env.cached_list(None).await;
        // An RV the cache cannot have: written after the cut (the writer goes on meanwhile;
        // a change already on its way when the connections dropped may still land).
        let cut_at = env.cache_rv();
        assert!(until(|| env.sim.sim.current_rv().0 > cut_at + 2).await, "the sim moved on");
        let ahead = env.sim.sim.current_rv().0;
        let fresh = get(env.proxy.addr, &format!("/api/v1/configmaps?resourceVersion={ahead}")).await;
        (any, ahead, fresh)
    };
    let (reads, refused) = tokio::join!(reads, until(|| env.fault.count(|s| &s.refused) >= 3));
    assert!(refused, "the reflector kept trying");
    let ((any_status, any_items, any_took), ahead, (fresh_status, fresh_body, fresh_took)) = reads;
    let down_for = t_down.elapsed();
    let written_while_down = writer.written() - n_down;
    let rv_at_up = env.sim.sim.current_rv().0;
    env.fault.up();
    let t_up = Instant::now();
    // The writer goes on meanwhile (its own task).
    assert!(until(|| env.cache_rv() >= rv_at_up).await, "the cache caught up after the restart");
    let resumed_after = t_up.elapsed();
    writer.more(30).await;
    writer.stop().await;
    let t = Instant::now();
    let ok = watchers.caught_up(&env.record).await;
    let catch_up = t.elapsed();
    let seen = watchers.finish().await;
    let tally = check_exact(&env.record.lock(), &seen);
    eprintln!(
        "restart: down {down_for:?} ({} refused), {written_while_down} changes while down; the cache had them \
         {resumed_after:?} after the upstream came back; \
         watchers caught up {ok} {catch_up:?} after the last write",
        env.fault.count(|s| &s.refused)
    );
    eprintln!(
        "restart: while down, LIST RV=0 {any_status} ({any_items} items) in {any_took:?}; LIST RV={ahead} \
         {fresh_status} in {fresh_took:?}: {fresh_body}"
    );
    assert_clean("restart", &tally, ok);
    assert_eq!(any_status, 200, "Any reads are served while the upstream is down");
    assert!(any_items > 0);
    assert!(fresh_status >= 500, "an unprovable NotOlderThan read fails like the upstream: {fresh_status}");
    assert_eq!(fresh_body["kind"], "Status", "{fresh_body}");
    assert_eq!(env.upstream_lists(), lists, "no relist: the RV was still in the sim's window");
    assert!(env.upstream_watches() >= 2, "re-watched");
    env.assert_http1();
    env.proxy.shutdown().await;
}

/// 2. Every open upstream connection is dropped once mid-stream: the watch resumes from the
///    cache RV, nothing lost or duplicated, no relist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_watch_resumes_from_the_cache_rv() {
    let _g = SERIAL.lock().await;
    let env = setup(SimOptions::default()).await;
    let watchers = Watchers::open(env.proxy.addr, env.start_rv).await;
    let lists = env.upstream_lists();
    let watches = env.upstream_watches();
    let writer = env.writer();
    writer.more(20).await;
    env.fault.drop_all();
    let dropped_at = env.cache_rv();
    assert!(until(|| env.upstream_watches() > watches).await, "re-watched after the drop");
    writer.more(30).await;
    writer.stop().await;
    let ok = watchers.caught_up(&env.record).await;
    let seen = watchers.finish().await;
    let tally = check_exact(&env.record.lock(), &seen);
    assert_clean("drop", &tally, ok);
    assert_eq!(env.upstream_lists(), lists, "no relist");
    // The re-watch asked for an RV at or after where the cache stood when the drop happened.
    let resumed = env.sim.sim.request_count(|r| {
        r.path == "/api/v1/configmaps"
            && r.query.split('&').any(|p| {
                p.strip_prefix("resourceVersion=")
                    .and_then(|v| v.parse::<u64>().ok())
                    .is_some_and(|v| v >= dropped_at)
            })
            && r.query.contains("watch=true")
    });
    assert!(resumed >= 1, "a re-watch from the cache RV ({dropped_at})");
    env.assert_http1();
    env.proxy.shutdown().await;
}

/// Cut, compact, (optionally fail the next LISTs), restore: the re-watch gets 410, the proxy
/// relists, and every live watcher (each started before the list) ends cleanly after exactly
/// what it had (its client then gets 410 on a re-watch from that RV and relists), whatever the
/// relist changed in its scope (issue 31).
async fn relist_case(name: &str, failing_lists: usize) {
    let env = setup(SimOptions::default()).await;
    let watchers = Watchers::open(env.proxy.addr, env.start_rv).await;
    let lists = env.upstream_lists();
    let writer = env.writer();
    writer.more(20).await;

    env.fault.down();
    // The cut is complete once the reflector has tried to reconnect (it does only after the old
    // stream ended, every event it carried applied): only then is the cache RV the cut's.
    let refused = env.fault.count(|s| &s.refused);
    assert!(until(|| env.fault.count(|s| &s.refused) > refused).await, "the reflector tried to reconnect");
    let before = env.cache_rv();
    // Changes the cache will only learn through the relist, then the compaction.
    writer.more(30).await;
    env.sim.sim.compact();
    writer.more(5).await;
    env.fault.fail_next_lists(failing_lists);
    env.fault.up();
    let mut served_during_failures = None;
    if failing_lists > 0 {
        assert!(until(|| env.fault.count(|s| &s.failed_lists) >= 1).await, "a LIST was answered 500");
        // Any reads are served from the cache while the upstream LIST fails.
        served_during_failures = Some(env.cached_list(None).await);
        assert!(
            until(|| env.fault.count(|s| &s.failed_lists) == failing_lists).await,
            "{failing_lists} LISTs answered 500"
        );
    }
    assert!(until(|| env.upstream_lists() > lists).await, "relisted");
    let after = env.sim.sim.current_rv().0;
    writer.more(30).await;
    writer.stop().await;
    let ok = watchers.caught_up_relist(&env.record, before, after).await;
    let seen = watchers.finish().await;
    let tally = check_relist(&env.record.lock(), before, after, &seen);
    eprintln!("{name}: cut at cache RV {before}, relist seen at sim RV {after}, caught up {ok}, cached read while failing {served_during_failures:?}");
    eprintln!("{name}: {tally:?}");
    assert!(tally.expected > 0, "{name}: {tally:?}");
    assert_eq!(tally.ended, WATCHERS, "{name}: every watcher ended at the relist: {tally:?}");
    assert_eq!(
        (tally.lost, tally.duplicated, tally.reordered, tally.unexpected, tally.other_events),
        (0, 0, 0, 0, 0),
        "{name}: (lost, duplicated, reordered, unexpected, other events) over {WATCHERS} watchers"
    );
    assert!(ok);
    // An ended watcher's client re-watches from its last RV, inside the gap the relist covered:
    // 410, so it relists (here, or from the sim, which compacted that RV too).
    for (scope, s) in seen.iter().filter(|(_, s)| s.ended.is_some()).take(20) {
        let rv = s.changes.last().map_or(env.start_rv, |c| c.rv);
        let path = match scope {
            None => format!("/api/v1/configmaps?watch=true&resourceVersion={rv}"),
            Some(ns) => format!("/api/v1/namespaces/ns-{ns}/configmaps?watch=true&resourceVersion={rv}"),
        };
        let (status, v, _) = get(env.proxy.addr, &path).await;
        assert_eq!(
            (status, v["type"].as_str(), v["object"]["code"].as_u64()),
            (200, Some("ERROR"), Some(410)),
            "{path}: {v}"
        );
    }
    assert_eq!(env.upstream_lists(), lists + 1, "one LIST reached the sim (the failed ones did not)");
    assert_eq!(env.fault.count(|s| &s.failed_lists), failing_lists);
    if let Some((status, items, _)) = served_during_failures {
        assert_eq!(status, 200, "an Any read while the relist fails");
        assert!(items > 0);
    }
    // Readiness stayed (the cache kept its last state while relisting).
    assert!(env.proxy.readers()[0].progress().ready);
    env.assert_http1();
    env.proxy.shutdown().await;
}

/// 3. 410 on the re-watch (the sim compacted while the watch was cut): relist; the watchers
///    end, every one (each started before the list: issue 31), and no difference is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gone_rewatch_relists_and_ends_every_watcher() {
    let _g = SERIAL.lock().await;
    relist_case("410 relist", 0).await;
}

/// 4. The same, and the first LIST of the relist answered HTTP 500 by the fault proxy
///    (it parses the request line: the proxy speaks HTTP/1.1 to a plain-http upstream): the
///    reflector retries with backoff, keeps serving the last state meanwhile, then relists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_500s_are_retried_while_the_cache_keeps_serving() {
    let _g = SERIAL.lock().await;
    relist_case("500 on relist", 1).await;
}

/// 5. Slow upstream: every chunk, both ways, waits 150 ms. Cached reads are answered without
///    the upstream; watchers still get every change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_upstream_cached_reads_stay_fast_and_nothing_is_lost() {
    let _g = SERIAL.lock().await;
    let env = setup(SimOptions::default()).await;
    let watchers = Watchers::open(env.proxy.addr, env.start_rv).await;
    let delay = Duration::from_millis(150);
    env.fault.set_delay(delay);
    let writer = env.writer();
    writer.more(10).await;
    let forwarded_before = env.sim.sim.request_count(|r| r.query.contains("resourceVersion=0"));
    let mut times = Vec::new();
    for i in 0..20 {
        let (status, _, took) = env.cached_list((i % 2 == 1).then_some(i % NAMESPACES)).await;
        assert_eq!(status, 200);
        times.push(took);
    }
    writer.more(30).await;
    writer.stop().await;
    let ok = watchers.caught_up(&env.record).await;
    let seen = watchers.finish().await;
    let tally = check_exact(&env.record.lock(), &seen);
    times.sort();
    eprintln!(
        "slow: {} chunks delayed {delay:?}; 20 cached LISTs p50 {:?} max {:?}",
        env.fault.count(|s| &s.delayed_chunks),
        times[10],
        times[19]
    );
    assert_clean("slow", &tally, ok);
    assert!(env.fault.count(|s| &s.delayed_chunks) > 0, "the fault was active");
    assert_eq!(
        env.sim.sim.request_count(|r| r.query.contains("resourceVersion=0")),
        forwarded_before,
        "cached reads never reached the slow upstream"
    );
    env.assert_http1();
    env.proxy.shutdown().await;
}

/// 6. Partition of the open connections: bytes stop without a FIN (the sim keeps sending
///    bookmarks every second and writing). New connections work. The proxy notices the silent
///    watch after `--upstream-watch-idle-timeout` (3 s here: bookmarks come every second) and
///    re-watches; every change must then arrive. (Without the timeout the cache stayed at its
///    RV forever: only TCP keepalive ends such a connection, and never while something on the
///    path still ACKs, as the fault proxy does.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackholed_watch_is_noticed() {
    let _g = SERIAL.lock().await;
    let env = setup_with(
        SimOptions { bookmark_interval: Duration::from_secs(1), ..SimOptions::default() },
        Some(Duration::from_secs(3)),
    )
    .await;
    let watchers = Watchers::open(env.proxy.addr, env.start_rv).await;
    let writer = env.writer();
    writer.more(10).await;
    let watches = env.upstream_watches();
    let open_before = env.fault.count(|s| &s.accepted);
    env.fault.blackhole_open();
    let stalled_at = env.cache_rv();
    writer.more(30).await;
    writer.stop().await;
    let ok = watchers.caught_up(&env.record).await;
    let cache_rv = env.cache_rv();
    let sim_rv = env.sim.sim.current_rv().0;
    let rewatched = env.upstream_watches() > watches;
    let seen = watchers.finish().await;
    let tally = check_exact(&env.record.lock(), &seen);
    eprintln!(
        "blackhole: cache RV {stalled_at} at the partition, {cache_rv} after {DEADLINE:?} (sim at {sim_rv}); \
         re-watched {rewatched}; {} chunks held; {open_before} upstream connections made before the \
         partition (pooled idle ones among them are partitioned too), {} after",
        env.fault.count(|s| &s.held_chunks),
        env.fault.count(|s| &s.accepted) - open_before
    );
    assert!(rewatched, "the proxy re-watched on a new connection within {DEADLINE:?}");
    assert_clean("blackhole", &tally, ok);
    env.proxy.shutdown().await;
}

/// The checks themselves: a lost, a duplicated and a reordered change, an unexpected event and
/// an ended stream are all counted (so the fault tests can fail).
#[test]
fn the_checks_count_every_kind_of_delivery_error() {
    let ch = |kind, rv, ns, name: &str| Change { kind, rv, ns, name: name.to_owned() };
    let mut record = Record {
        changes: vec![
            ch(Kind::Added, 11, 0, "a"),
            ch(Kind::Modified, 12, 0, "a"),
            ch(Kind::Added, 13, 1, "b"),
            ch(Kind::Deleted, 14, 0, "a"),
        ],
        ..Record::default()
    };
    record.state.insert((1, "b".into()), 13);
    let good = Seen { changes: record.changes.clone(), ..Seen::default() };
    let ns1 = Seen { changes: vec![ch(Kind::Added, 13, 1, "b")], ..Seen::default() };
    let t = check_exact(&record, &[(None, good), (Some(1), ns1)]);
    assert_eq!((t.expected, t.received, t.lost, t.duplicated, t.reordered, t.unexpected), (5, 5, 0, 0, 0, 0));

    let c = &record.changes;
    let bad = Seen {
        changes: vec![c[1].clone(), c[0].clone(), c[0].clone(), ch(Kind::Added, 15, 0, "z")],
        other: vec!["ERROR".into()],
        ended: Some("stream ended".into()),
    };
    let t = check_exact(&record, &[(None, bad)]);
    // c[2], c[3] lost; c[0] twice; c[0] after c[1] and its repeat out of order; z unexpected.
    assert_eq!(
        (t.lost, t.duplicated, t.reordered, t.unexpected, t.other_events, t.ended),
        (2, 1, 2, 1, 1, 1)
    );

    // Across a relist (cache at 12 at the cut, listed by 13): a watcher that ended after what
    // it had at the cut is clean; one that got anything from the relist, or ended late, is not.
    let ended =
        |changes: Vec<Change>| Seen { changes, ended: Some("stream ended".into()), ..Seen::default() };
    let t = check_relist(&record, 12, 13, &[(None, ended(c[..2].to_vec())), (Some(1), ended(vec![]))]);
    assert_eq!((t.lost, t.duplicated, t.reordered, t.unexpected, t.ended), (0, 0, 0, 0, 2), "{t:?}");
    let diff = ended(vec![c[0].clone(), c[1].clone(), ch(Kind::Deleted, 13, 0, "a")]);
    let t = check_relist(&record, 12, 13, &[(None, diff)]);
    assert!(t.unexpected > 0, "a relist difference: {t:?}");
    let t = check_relist(&record, 12, 13, &[(None, ended(c[..3].to_vec()))]);
    assert_eq!(t.unexpected, 1, "an event past the cut, then the end: {t:?}");
    let kept = Seen { changes: vec![c[0].clone(), c[1].clone(), c[3].clone()], ..Seen::default() };
    let t = check_relist(&record, 12, 13, &[(None, kept)]);
    assert_eq!((t.lost, t.unexpected, t.ended), (0, 0, 0), "{t:?}");
    let kept_short = Seen { changes: vec![c[0].clone(), c[1].clone()], ..Seen::default() };
    assert_eq!(check_relist(&record, 12, 13, &[(None, kept_short)]).lost, 1);
}

/// 5 bis. LISTs answered 500 before the first sync: the proxy stays not ready (`/readyz` 500,
///    watches 429 like the apiserver's cacher) and becomes ready once a LIST succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_500s_before_the_first_sync_keep_the_proxy_not_ready() {
    let _g = SERIAL.lock().await;
    let sim = Sim::start(SimOptions::default()).await.expect("sim starts");
    let fault = Fault::start(sim.addr).await;
    fault.fail_next_lists(2);
    let mut args =
        ServeArgs::local(&format!("http://{}", fault.addr), &["configmaps"], "127.0.0.1:0".parse().unwrap());
    args.shutdown_grace_period = Duration::from_secs(2);
    let proxy = app::start(&args).await.expect("proxy starts");
    // Between the first 500 and the second there is at least one backoff (0.8 s or more).
    assert!(until(|| fault.count(|s| &s.failed_lists) >= 1).await, "a LIST answered 500");
    let (ready, _, _) = get(proxy.addr, "/readyz").await;
    let (watch, status, _) = get(proxy.addr, "/api/v1/configmaps?watch=true&resourceVersion=0").await;
    eprintln!("startup 500: /readyz {ready}, watch {watch}: {status}");
    assert_eq!(ready, 500, "not ready before the first sync");
    assert_eq!(watch, 429, "{status}");
    assert!(proxy.wait_ready(DEADLINE).await, "ready once a LIST succeeded");
    assert_eq!(fault.count(|s| &s.failed_lists), 2);
    assert_eq!(get(proxy.addr, "/readyz").await.0, 200);
    proxy.shutdown().await;
}

/// 2 bis. A flapping upstream: every connection dropped three times, each time once the
///    re-watch is back and changes flow again. Nothing lost or duplicated, no relist; the
///    reconnect delays show the backoff (it is not reset by a successful re-watch).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flapping_upstream_loses_nothing() {
    let _g = SERIAL.lock().await;
    let env = setup(SimOptions::default()).await;
    let watchers = Watchers::open(env.proxy.addr, env.start_rv).await;
    let lists = env.upstream_lists();
    let writer = env.writer();
    writer.more(10).await;
    let mut delays = Vec::new();
    for _ in 0..3 {
        let watches = env.upstream_watches();
        env.fault.drop_all();
        let t = Instant::now();
        assert!(until(|| env.upstream_watches() > watches).await, "re-watched");
        delays.push(t.elapsed());
        writer.more(5).await;
    }
    writer.more(10).await;
    writer.stop().await;
    let ok = watchers.caught_up(&env.record).await;
    let seen = watchers.finish().await;
    let tally = check_exact(&env.record.lock(), &seen);
    eprintln!("flapping: re-watch delays after each drop {delays:?}");
    assert_clean("flapping", &tally, ok);
    assert_eq!(env.upstream_lists(), lists, "no relist");
    env.proxy.shutdown().await;
}
