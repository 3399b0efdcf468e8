//! Relists that never leave a client with ghosts (issue 22, docs/design.md §6): the proxy's upstream
//! watch goes through the fault relay of `common::fault`, which stalls it while the sim
//! changes, then cuts it; the sim has compacted the cache's RV, so the re-watch gets 410 and
//! the proxy relists. Each client's stream, any prefix of it, and a resume from its last RV at
//! the proxy, at another replica or at the sim must leave exactly the sim's state; and a
//! `spec.nodeName=` watch sees what the sim's own watch sees; protobuf watchers (kubelets,
//! controllers) get across a relist exactly what JSON watchers get. Issue 31: a watch whose
//! difference is empty ends too (an object created and deleted in the gap leaves none), in
//! JSON, protobuf and metadata-only; every event the sim sent such a watch either reached the
//! client or came after its stream ended, and the resume from its last RV answers 410. Run by
//! `cargo test --test reliability`.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::fault::Fault;
use common::mirror::{resume, Applied, Mirror, Next, Stream};
use common::pb::{take_frames, WatchEvent};
use common::{client, serve_args, HttpClient};
use http::Request;
use http_body_util::{BodyExt, Full};
use kube_watchcache::app::{self, Running};
use kube_watchcache::resource::Rv;
use kube_watchcache_sim::{Sim, SimHandle, SimOptions};
use serde_json::{json, Value};

const NS: &str = "t";
const PATH: &str = "/api/v1/namespaces/t/configmaps";
/// How long a stream must stay quiet to count as caught up.
const IDLE: Duration = Duration::from_millis(700);

struct Env {
    sim: SimHandle,
    fault: Fault,
    /// Replica A: its upstream goes through the fault relay.
    a: Running,
    /// Replica B: straight to the sim.
    b: Running,
    client: HttpClient,
}

async fn start_proxy(upstream: std::net::SocketAddr) -> Running {
    let mut args = serve_args(upstream, &["configmaps", "pods"]);
    args.security.max_watches_per_user = 0;
    let p = app::start(&args).await.expect("proxy starts");
    assert!(p.wait_ready(Duration::from_secs(20)).await, "proxy synced");
    p
}

/// A sim that keeps only the last `window` revisions, replicas A (through the relay) and B.
async fn setup(window: usize) -> Env {
    let sim = Sim::start(SimOptions { compaction_window: window, ..Default::default() }).await.expect("sim");
    sim.sim
        .create("namespaces", "", json!({"apiVersion":"v1","kind":"Namespace","metadata":{"name":NS}}))
        .expect("namespace");
    let fault = Fault::start(sim.addr).await;
    let a = start_proxy(fault.addr).await;
    let b = start_proxy(sim.addr).await;
    Env { sim, fault, a, b, client: client() }
}

fn cm(name: &str, v: &str) -> Value {
    json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":name,"namespace":NS},"data":{"v":v}})
}

fn rv_of(o: &Value) -> u64 {
    o["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap()
}

impl Env {
    fn base(p: &Running) -> String {
        format!("http://{}", p.addr)
    }

    fn sim_base(&self) -> String {
        format!("http://{}", self.sim.addr)
    }

    fn create(&self, name: &str) -> u64 {
        rv_of(&self.sim.sim.create("configmaps", NS, cm(name, "0")).expect("create"))
    }

    fn update(&self, name: &str, v: &str) -> u64 {
        rv_of(&self.sim.sim.update("configmaps", NS, cm(name, v)).expect("update"))
    }

    fn delete(&self, name: &str) -> u64 {
        rv_of(&self.sim.sim.delete("configmaps", NS, name).expect("delete"))
    }

    fn cache_rv(p: &Running) -> u64 {
        p.readers().into_iter().find(|r| r.kind().resource == "configmaps").unwrap().progress().rv.0
    }

    async fn synced(p: &Running, rv: u64) {
        let r = p.readers().into_iter().find(|r| r.kind().resource == "configmaps").unwrap();
        r.wait_for(Rv(rv), Duration::from_secs(20)).await.expect("cache caught up");
    }

    /// The sim's state now: the truth every client must end with.
    async fn truth(&self) -> Mirror {
        Mirror::list(&self.client, &format!("{}{PATH}", self.sim_base())).await.expect("sim list")
    }

    /// Cuts A's stalled upstream watch; its re-watch (held until the stall is released) gets
    /// 410 from the sim, so A relists. Waits until A has the sim's RV.
    async fn relist_a(&self) {
        let lists = self.upstream_lists();
        self.fault.drop_all();
        self.fault.stall_watches(false);
        let end = Instant::now() + Duration::from_secs(20);
        while self.upstream_lists() == lists {
            if Instant::now() > end {
                self.sim.sim.request_count(|r| {
                    eprintln!("{} {}?{}", r.method, r.path, r.query);
                    false
                });
                panic!(
                    "A relisted (cache at {}, sim at {})",
                    Env::cache_rv(&self.a),
                    self.sim.sim.current_rv()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Env::synced(&self.a, self.sim.sim.current_rv().0).await;
    }

    /// Objects `victim` and `keep`, both replicas synced; a client's LIST at A and the URL of
    /// its watch from there (bookmarks on).
    async fn victim_and_keep(&self) -> (Mirror, String) {
        self.create("victim");
        let keep = self.create("keep");
        Env::synced(&self.a, keep).await;
        Env::synced(&self.b, keep).await;
        let start = Mirror::list(&self.client, &format!("{}{PATH}?resourceVersion=0", Env::base(&self.a)))
            .await
            .unwrap();
        let url = format!(
            "{}{PATH}?watch=true&allowWatchBookmarks=true&resourceVersion={}",
            Env::base(&self.a),
            start.rv
        );
        (start, url)
    }

    /// While A's watch is stalled, `victim` is deleted and three objects created, past the
    /// sim's compaction window; then A relists.
    async fn gap_and_relist(&self) {
        self.fault.stall_watches(true);
        self.delete("victim");
        for i in 0..3 {
            self.create(&format!("n{i}"));
        }
        self.relist_a().await;
    }

    fn upstream_lists(&self) -> usize {
        self.sim.sim.request_count(|r| common::reflector_list(r, "/api/v1/configmaps"))
    }
}

/// Applies `events` to `m` (stopping at an ERROR).
fn applied(mut m: Mirror, events: &[Value]) -> Mirror {
    for ev in events {
        if let Applied::Error(_) = m.apply(ev) {
            break;
        }
    }
    m
}

/// For every prefix of `events` (a client that held `start`, then lost its stream after each
/// event), a resume at each of `bases` must reach `truth`, with no event that makes no sense
/// for the state held. Returns how many resumes were checked.
async fn every_prefix_resumes_right(
    env: &Env,
    who: &str,
    start: &Mirror,
    events: &[Value],
    bases: &[String],
    truth: &Mirror,
) -> usize {
    let mut n = 0;
    for k in 0..=events.len() {
        let m = applied(start.clone(), &events[..k]);
        assert!(m.anomalies.is_empty(), "{who}: after {k} of {events:?}: {:?}", m.anomalies);
        for base in bases {
            let got = resume(&env.client, base, PATH, m.clone(), IDLE).await;
            assert!(
                got.anomalies.is_empty(),
                "{who}: resume at {base} after {k} events: {:?}",
                got.anomalies
            );
            assert_eq!(
                got.objects, truth.objects,
                "{who}: resume at {base} from {} after {k} of {events:?}",
                m.rv
            );
            n += 1;
        }
    }
    n
}

/// Issue 22 §1: while A's upstream watch is stalled at C, a watch-list (RV unset, its initial
/// state proven the upstream's at L1 > C: a write elsewhere moved the revision) and a watch
/// from a write's RV start ahead of A's cache; at the relist neither may get a diff computed
/// from C (the sim sends them `DELETED z`, or `DELETED x, MODIFIED y`; the old proxy `ADDED y,
/// DELETED z` and x forever). Both must end, and resume right from where they were, here (410,
/// relist) and at the sim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_that_started_ahead_of_the_cache_end_at_the_relist() {
    let env = setup(3).await;
    env.create("a");
    let z = env.create("z");
    Env::synced(&env.a, z).await;
    env.fault.stall_watches(true);
    let ns = json!({"apiVersion":"v1","kind":"Namespace","metadata":{"name":"elsewhere"}});
    let elsewhere = rv_of(&env.sim.sim.create("namespaces", "", ns).expect("namespace"));
    assert!(Env::cache_rv(&env.a) < elsewhere, "A's watch is stalled");

    // A watch-list with RV unset: its namespace did not change since C, so A's state there is
    // the upstream's at the revision its metadata LIST gives (≥ `elsewhere`, ahead of A).
    let url = format!(
        "{}{PATH}?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true",
        Env::base(&env.a)
    );
    let mut wl = Stream::open(&env.client, &url).await;
    assert_eq!(wl.status, 200);
    let mut wl_start = Mirror::default();
    loop {
        match wl.next(Duration::from_secs(10)).await {
            Next::Event(ev) => {
                if wl_start.initial(&ev) {
                    break;
                }
            }
            other => panic!("initial events of the watch-list: {other:?}"),
        }
    }
    assert_eq!(wl_start.objects.keys().cloned().collect::<Vec<_>>(), ["t/a", "t/z"]);
    assert!(wl_start.rv >= elsewhere, "the initial state is at {}, ahead of A's cache", wl_start.rv);
    env.delete("z");
    env.create("x");
    let y = env.create("y");
    // A watch from y's write RV; the client's state is the sim's at y.
    let wr_start = env.truth().await;
    assert_eq!(wr_start.rv, y);
    let url = format!("{}{PATH}?watch=true&allowWatchBookmarks=true&resourceVersion={y}", Env::base(&env.a));
    let mut wr = Stream::open(&env.client, &url).await;
    assert_eq!(wr.status, 200);

    env.delete("x");
    env.update("y", "1");
    env.relist_a().await;
    let truth = env.truth().await;

    let bases = [Env::base(&env.a), Env::base(&env.b), env.sim_base()];
    let mut resumes = 0;
    for (who, stream, start) in
        [("watch-list", &mut wl, &wl_start), ("watch from a write", &mut wr, &wr_start)]
    {
        let (events, ended) = stream.collect(IDLE).await;
        eprintln!("{who}: after the relist {events:?}, ended {ended}");
        resumes += every_prefix_resumes_right(&env, who, start, &events, &bases, &truth).await;
        assert!(ended, "{who}: the watch ended at the relist");
        assert!(events.is_empty(), "{who}: no relist difference: {events:?}");
        // Its re-watch here from its RV, inside the gap, is 410.
        let url = format!("{}{PATH}?watch=true&resourceVersion={}", Env::base(&env.a), start.rv);
        let (first, _) = Stream::open(&env.client, &url).await.collect(IDLE).await;
        assert_eq!(
            first.first().map(|e| (e["type"].clone(), e["object"]["code"].clone())),
            Some((json!("ERROR"), json!(410)))
        );
    }
    eprintln!("ahead of the cache: {resumes} resumes, all at the truth");
}

const WATCH_LIST: &str =
    "watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true";

/// Opens a watch-list of A's namespace in a task; it gives the initial state it got.
fn watch_list_of(env: &Env) -> tokio::task::JoinHandle<Mirror> {
    let (client, url) = (env.client.clone(), format!("{}{PATH}?{WATCH_LIST}", Env::base(&env.a)));
    tokio::spawn(async move {
        let mut s = Stream::open(&client, &url).await;
        assert_eq!(s.status, 200);
        let mut m = Mirror::default();
        loop {
            match s.next(Duration::from_secs(20)).await {
                Next::Event(ev) if m.initial(&ev) => return m,
                Next::Event(_) => {}
                other => panic!("initial events of the watch-list: {other:?}"),
            }
        }
    })
}

/// Requests the sim got for A's namespace: metadata-only LISTs, and watches (forwarded).
fn namespace_requests(env: &Env) -> (usize, usize) {
    let metadata = env.sim.sim.request_count(|r| {
        r.path == PATH
            && r.headers
                .get("accept")
                .and_then(|v| v.to_str().ok())
                .is_some_and(|a| a.contains("PartialObjectMetadataList"))
    });
    let watches = env.sim.sim.request_count(|r| r.path == PATH && r.query.contains("watch=true"));
    (metadata, watches)
}

/// Waits (up to 20 s) until `cond` holds.
async fn until(what: &str, cond: impl Fn() -> bool) {
    let end = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < end, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A synced to `a`, then its upstream watch held back while `b` is created: b's RV.
async fn b_held_back(env: &Env) -> u64 {
    let a = env.create("a");
    Env::synced(&env.a, a).await;
    env.fault.stall_watches(true);
    env.create("b")
}

/// A watch-list (RV unset) is proven by a metadata-only upstream LIST, then served from the
/// cache: while A's stream is held back, A's state lacks an object the LIST names, and the
/// watch waits for A to receive it (no object body read upstream, no watch forwarded).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_list_waits_for_the_cache_to_hold_the_listed_state() {
    let env = setup(3).await;
    let b = b_held_back(&env).await;
    let opened = watch_list_of(&env);
    until("the metadata LIST", || namespace_requests(&env).0 == 1).await;
    env.fault.stall_watches(false);
    let m = opened.await.expect("watch-list");
    assert_eq!(m.objects.keys().cloned().collect::<Vec<_>>(), ["t/a", "t/b"]);
    assert!(m.anomalies.is_empty() && m.rv >= b, "{m:?}");
    assert_eq!(namespace_requests(&env), (1, 0), "one metadata LIST, the watch served by A");
    let all = env.sim.sim.request_count(|r| r.path == PATH);
    assert_eq!(all, 1, "nothing else asked upstream: no object body listed");
}

/// One A cannot prove within 3 s (its stream stays held back) is forwarded, and gets the
/// upstream's state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_list_the_cache_cannot_prove_is_forwarded() {
    let env = setup(3).await;
    let b = b_held_back(&env).await;
    let started = Instant::now();
    let opened = watch_list_of(&env);
    until("the forwarded watch", || namespace_requests(&env).1 == 1).await;
    assert!(started.elapsed() >= Duration::from_secs(3), "forwarded after {:?}", started.elapsed());
    assert_eq!(namespace_requests(&env).0, 1, "after its metadata LIST");
    env.fault.stall_watches(false);
    let m = opened.await.expect("watch-list");
    assert_eq!(m.objects.keys().cloned().collect::<Vec<_>>(), ["t/a", "t/b"]);
    assert!(m.anomalies.is_empty() && m.rv >= b, "{m:?}");
}

/// Issue 22 §2: a client of A resuming from an RV it got during A's relist must not lose the
/// deletion A missed while stalled, whether it resumes at A, at replica B or at the sim. With
/// the fix A's stream ends without handing out any RV of the gap; whatever prefix of it the
/// client saw, every resume reaches the sim's state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_prefix_of_a_relisted_stream_resumes_right_anywhere() {
    let env = setup(3).await;
    let (start, url) = env.victim_and_keep().await;
    let mut w = Stream::open(&env.client, &url).await;
    assert_eq!(w.status, 200);
    // A watch of what the relist does not change (label app=other): it ends too (issue 31).
    let mut other = Stream::open(&env.client, &format!("{url}&labelSelector=app%3Dother")).await;
    assert_eq!(other.status, 200);
    env.gap_and_relist().await;
    Env::synced(&env.b, env.sim.sim.current_rv().0).await;
    let truth = env.truth().await;
    let (events, ended) = w.collect(IDLE).await;
    eprintln!("A's stream across its relist: {events:?}, ended {ended}");
    let bases = [Env::base(&env.a), Env::base(&env.b), env.sim_base()];
    let n = every_prefix_resumes_right(&env, "A's watcher", &start, &events, &bases, &truth).await;
    assert!(ended, "the watch ended at the relist");
    eprintln!("{n} resumes, all at the truth");
    // Issue 31: the watch the relist does not concern ends too (no BOOKMARK at the list RV,
    // which would present the gap as a quiet stretch); its re-watch from its RV is 410.
    let (events, ended) = other.collect(IDLE).await;
    assert!(ended, "an empty difference does not keep the watch: {events:?}");
    assert!(events.is_empty(), "no BOOKMARK at the list RV: {events:?}");
    let url = format!(
        "{}{PATH}?watch=true&labelSelector=app%3Dother&resourceVersion={}",
        Env::base(&env.a),
        start.rv
    );
    let (first, _) = Stream::open(&env.client, &url).await.collect(IDLE).await;
    assert_eq!(first.first().map(|e| e["object"]["code"].clone()), Some(json!(410)), "{first:?}");
}

/// Issue 22 §3: `fieldSelector=spec.nodeName=` (unscheduled pods, cluster-autoscaler's
/// lister) gets the same events from the proxy as from the sim, across an upstream cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_node_name_watchers_get_live_events() {
    let env = setup(10_000).await;
    let pod = |name: &str, node: Option<&str>| {
        let mut spec = json!({"containers":[{"name":"c","image":"i"}]});
        if let Some(n) = node {
            spec["nodeName"] = json!(n);
        }
        json!({"apiVersion":"v1","kind":"Pod","metadata":{"name":name,"namespace":NS},"spec":spec})
    };
    let rv = env.sim.sim.current_rv().0;
    let query = format!("/api/v1/pods?watch=true&fieldSelector=spec.nodeName%3D&resourceVersion={rv}");
    let mut at_proxy = Stream::open(&env.client, &format!("{}{query}", Env::base(&env.a))).await;
    let mut at_sim = Stream::open(&env.client, &format!("{}{query}", env.sim_base())).await;
    assert_eq!((at_proxy.status, at_sim.status), (200, 200));
    let s = &env.sim.sim;
    s.create("pods", NS, pod("p1", None)).unwrap();
    s.update("pods", NS, pod("p1", Some("n1"))).unwrap();
    s.create("pods", NS, pod("p2", None)).unwrap();
    env.fault.drop_all();
    s.delete("pods", NS, "p2").unwrap();
    let last = rv_of(&s.create("pods", NS, pod("p3", None)).unwrap());
    let pods = env.a.readers().into_iter().find(|r| r.kind().resource == "pods").unwrap();
    pods.wait_for(Rv(last), Duration::from_secs(20)).await.expect("A caught up");
    let summary = |evs: Vec<Value>| -> Vec<(String, String, u64)> {
        evs.iter()
            .map(|e| {
                (
                    e["type"].as_str().unwrap().to_owned(),
                    e["object"]["metadata"]["name"].as_str().unwrap().to_owned(),
                    rv_of(&e["object"]),
                )
            })
            .collect()
    };
    let want = summary(at_sim.collect(IDLE).await.0);
    let got = summary(at_proxy.collect(IDLE).await.0);
    assert_eq!(
        want.iter().map(|e| (e.0.as_str(), e.1.as_str())).collect::<Vec<_>>(),
        [("ADDED", "p1"), ("DELETED", "p1"), ("ADDED", "p2"), ("DELETED", "p2"), ("ADDED", "p3")]
    );
    assert_eq!(got, want);
}

/// A protobuf watch (`Accept` as a kubelet's: protobuf first, JSON second) read frame by frame.
struct PbStream {
    body: Option<hyper::body::Incoming>,
    buf: Vec<u8>,
    status: u16,
    content_type: String,
}

impl PbStream {
    async fn open(client: &HttpClient, url: &str) -> PbStream {
        let req = Request::get(url)
            .header("accept", "application/vnd.kubernetes.protobuf, application/json")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = tokio::time::timeout(Duration::from_secs(20), client.request(req))
            .await
            .expect("headers in time")
            .expect("response");
        let content_type =
            resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
        PbStream {
            status: resp.status().as_u16(),
            content_type,
            body: Some(resp.into_body()),
            buf: Vec::new(),
        }
    }

    /// Every event until the stream ends or stays idle for `idle`; and whether it ended.
    async fn collect(&mut self, idle: Duration) -> (Vec<WatchEvent>, bool) {
        let mut out = Vec::new();
        loop {
            for f in take_frames(&mut self.buf) {
                out.push(WatchEvent::parse(&f).unwrap_or_else(|| panic!("not a watch event: {f:?}")));
            }
            let Some(body) = self.body.as_mut() else {
                assert!(self.buf.is_empty(), "a partial frame at the end: {:?}", self.buf);
                return (out, true);
            };
            match tokio::time::timeout(idle, body.frame()).await {
                Err(_) => return (out, false),
                Ok(Some(Ok(f))) => {
                    if let Ok(data) = f.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
                Ok(Some(Err(e))) => panic!("the protobuf watch broke: {e}"),
                Ok(None) => self.body = None,
            }
        }
    }
}

/// A JSON event as (type, namespace/name, resourceVersion), the protobuf reader's shape.
fn summary(ev: &Value) -> (String, String, u64) {
    let o = &ev["object"];
    let name = o["metadata"]["name"].as_str().unwrap_or("");
    let key = match o["metadata"]["namespace"].as_str() {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_owned(),
    };
    (ev["type"].as_str().unwrap().to_owned(), key, rv_of(o))
}

/// Issue 17 with issue 22: kubelets and controllers watch in protobuf. Across the same relist,
/// a protobuf watcher gets exactly the events a JSON watcher gets (none of the gap's RVs, the
/// stream ended), and an untouched protobuf watcher ends as well, with nothing (issue 31).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protobuf_watchers_across_a_relist_get_what_json_watchers_get() {
    let env = setup(3).await;
    let (start, url) = env.victim_and_keep().await;
    let mut json_w = Stream::open(&env.client, &url).await;
    let mut pb_w = PbStream::open(&env.client, &url).await;
    let mut pb_other = PbStream::open(&env.client, &format!("{url}&labelSelector=app%3Dother")).await;
    for w in [&pb_w, &pb_other] {
        assert_eq!(
            (w.status, w.content_type.as_str()),
            (200, "application/vnd.kubernetes.protobuf;stream=watch")
        );
    }
    assert_eq!(json_w.status, 200);
    // A change both see live before the stall.
    let live = env.update("keep", "1");
    Env::synced(&env.a, live).await;
    env.gap_and_relist().await;
    let truth = env.truth().await;

    let (json_events, json_ended) = json_w.collect(IDLE).await;
    let (pb_events, pb_ended) = pb_w.collect(IDLE).await;
    eprintln!("across the relist: JSON {json_events:?} (ended {json_ended}), protobuf {pb_events:?} (ended {pb_ended})");
    assert!(json_ended && pb_ended, "both watches ended at the relist");
    let want: Vec<(String, String, u64)> = json_events.iter().map(summary).collect();
    let got: Vec<(String, String, u64)> =
        pb_events.iter().map(|e| (e.type_.clone(), e.key.clone(), e.rv)).collect();
    assert_eq!(got, want, "the protobuf watcher got what the JSON watcher got");
    assert_eq!(want.first().map(|e| (e.0.as_str(), e.1.as_str(), e.2)), Some(("MODIFIED", "t/keep", live)));
    assert!(pb_events.iter().all(|e| e.kind == "ConfigMap"), "{pb_events:?}");
    // None of the gap's RVs (after the stall, before the relist): the stream ended instead.
    assert!(pb_events.iter().all(|e| e.rv <= live), "{pb_events:?}");
    // What the protobuf client holds (its own events applied), resumed at the proxy, is the truth.
    let as_json: Vec<Value> = pb_events
        .iter()
        .map(|e| {
            let (namespace, name) = e.key.split_once('/').unwrap_or(("", &e.key));
            json!({"type": e.type_, "object": {"metadata": {"namespace": namespace, "name": name, "resourceVersion": e.rv.to_string()}}})
        })
        .collect();
    let held = applied(start.clone(), &as_json);
    assert!(held.anomalies.is_empty(), "{:?}", held.anomalies);
    let resumed = resume(&env.client, &Env::base(&env.a), PATH, held, IDLE).await;
    assert_eq!(resumed.objects, truth.objects);

    // The untouched protobuf watch ends too, with nothing (issue 31): no protobuf BOOKMARK at
    // the list RV.
    let (events, ended) = pb_other.collect(IDLE).await;
    assert!(ended, "an empty difference does not keep the protobuf watch: {events:?}");
    assert!(events.is_empty(), "{events:?}");
}

/// One watch's events as (type, namespace/name, RV), bookmarks apart.
fn changes(events: &[Value]) -> Vec<(String, String, u64)> {
    events.iter().filter(|e| e["type"] != "BOOKMARK").map(summary).collect()
}

/// Issue 31 §2: watches by namespace, cluster-wide and of app=t open at A and at the sim from
/// one RV. While A's upstream watch is stalled, x is created and deleted, y (app=t, another
/// namespace) created, relabelled and deleted; A relists, and the difference for each watch
/// is empty. The sim sends the gap's events (`ADDED x, DELETED x, ADDED
/// y, DELETED y` to app=t); before the fix A sent a BOOKMARK at the list RV and kept every
/// watch open, so its clients missed them all. Now every event the sim sent a watch either
/// reached A's client or came after A's stream ended, no BOOKMARK bridges the gap, and the
/// resume from the last RV received answers 410; JSON, protobuf, metadata-only and JSON
/// without managedFields alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_kept_across_a_relist_would_miss_the_gap_so_they_end() {
    // Compacted by hand after the sim's own watches have read the gap.
    let env = setup(10_000).await;
    env.sim
        .sim
        .create("namespaces", "", json!({"apiVersion":"v1","kind":"Namespace","metadata":{"name":"u"}}))
        .expect("namespace u");
    let r0 = env.create("keep");
    Env::synced(&env.a, r0).await;
    let q = |path: &str, sel: &str| {
        format!("{path}?watch=true&allowWatchBookmarks=true&resourceVersion={r0}{sel}")
    };
    let watches = [
        ("namespace", q(PATH, "")),
        ("cluster-wide", q("/api/v1/configmaps", "")),
        ("app=t", q("/api/v1/configmaps", "&labelSelector=app%3Dt")),
    ];
    let mut at_a = Vec::new();
    let mut lean_at_a = Vec::new();
    let mut at_sim = Vec::new();
    let lean = [("accept", "application/json;drop=metadata.managedFields")];
    for (_, pq) in &watches {
        at_a.push(Stream::open(&env.client, &format!("{}{pq}", Env::base(&env.a))).await);
        lean_at_a.push(Stream::open_with(&env.client, &format!("{}{pq}", Env::base(&env.a)), &lean).await);
        at_sim.push(Stream::open(&env.client, &format!("{}{pq}", env.sim_base())).await);
    }
    let app_t = format!("{}{}", Env::base(&env.a), watches[2].1);
    let mut pb = PbStream::open(&env.client, &app_t).await;
    let meta_accept = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";
    let mut meta = common::open_watch_with(&env.client, &app_t, &[("accept", meta_accept)]).await;
    assert!(at_a.iter().chain(&lean_at_a).chain(&at_sim).all(|w| w.status == 200));
    assert!(pb.status == 200 && meta.status == 200);

    // A change every namespace and cluster-wide watcher sees live, before the stall.
    let live = env.update("keep", "1");
    Env::synced(&env.a, live).await;
    env.fault.stall_watches(true);
    let labelled = |ns: &str, name: &str, app: &str| json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":name,"namespace":ns,"labels":{"app":app}}});
    let s = &env.sim.sim;
    s.create("configmaps", NS, labelled(NS, "x", "t")).expect("x");
    s.delete("configmaps", NS, "x").expect("delete x");
    s.create("configmaps", "u", labelled("u", "y", "t")).expect("y");
    s.update("configmaps", "u", labelled("u", "y", "v")).expect("relabel y");
    s.delete("configmaps", "u", "y").expect("delete y");
    assert_eq!(Env::cache_rv(&env.a), live, "A's watch is stalled");
    let mut sent_by_sim = Vec::new();
    for w in &mut at_sim {
        sent_by_sim.push(changes(&w.collect(IDLE).await.0));
    }
    let app_t_events: Vec<(&str, &str)> =
        sent_by_sim[2].iter().map(|c| (c.0.as_str(), c.1.as_str())).collect();
    assert_eq!(app_t_events, [("ADDED", "t/x"), ("DELETED", "t/x"), ("ADDED", "u/y"), ("DELETED", "u/y")]);
    s.compact();
    env.relist_a().await;
    let l = s.current_rv().0;

    for (i, (who, _)) in watches.iter().enumerate() {
        let sent = &sent_by_sim[i];
        let (got, ended) = at_a[i].collect(IDLE).await;
        assert!(sent.len() >= 2, "{who}: the sim sent the gap's events: {sent:?}");
        assert!(ended, "{who}: the watch ended at A's relist: {got:?}");
        // Event-level: what A's client got is a prefix of what the sim sent; nothing after
        // it (no event, no BOOKMARK) bridges the rest.
        let received = changes(&got);
        assert_eq!(received[..], sent[..received.len().min(sent.len())], "{who}: {got:?} vs {sent:?}");
        // Without managedFields (issue 34): the same events, the same end.
        let (lean_got, lean_ended) = lean_at_a[i].collect(IDLE).await;
        assert!(lean_ended, "{who}, lean: the watch ended at A's relist: {lean_got:?}");
        assert_eq!(changes(&lean_got), received, "{who}, lean");
        if i < 2 {
            assert_eq!(received.first().map(|c| (c.1.as_str(), c.2)), Some(("t/keep", live)), "{who}");
        }
        let last = got.last().map_or(r0, |e| rv_of(&e["object"]));
        if let Some(missed) = sent.get(received.len()) {
            assert!(last < missed.2, "{who}: its last RV {last} passes the missed {missed:?}: {got:?}");
        }
        // The resume from its last RV: 410 (the gap is not served as a quiet stretch).
        let url = format!(
            "{}{}",
            Env::base(&env.a),
            watches[i].1.replace(&format!("resourceVersion={r0}"), &format!("resourceVersion={last}"))
        );
        let (first, _) = Stream::open(&env.client, &url).await.collect(IDLE).await;
        assert_eq!(first.first().map(|e| e["object"]["code"].clone()), Some(json!(410)), "{who}: {first:?}");
        assert!(last < l);
    }
    let (pb_events, pb_ended) = pb.collect(IDLE).await;
    assert!(pb_ended && pb_events.is_empty(), "protobuf app=t: {pb_events:?}, ended {pb_ended}");
    let mut lines = Vec::new();
    while let Some(line) = meta.next_line(IDLE).await {
        lines.push(String::from_utf8_lossy(&line).into_owned());
    }
    assert!(lines.is_empty(), "metadata-only app=t: {lines:?}");
    assert!(meta.ends_within(Duration::from_millis(200)).await, "metadata-only app=t ended");
}

/// What one informer-like client did in the re-watch wave.
struct Recovered {
    /// From the cut to its new watch's 200 (after its relist).
    after: Duration,
    /// LISTs it sent to the proxy (client-go relists after a watch's 410 with
    /// `resourceVersion=<its RV>&limit=500`; after a 410 to that, with RV unset).
    lists: usize,
    /// Answers that were not 200 (status 0: no answer), each retried after a backoff.
    refused: Vec<u16>,
}

/// A LIST as a client-go informer sends it: the state, or the status of a failed answer.
async fn list_once(http: &HttpClient, url: &str) -> Result<Mirror, u16> {
    let r = common::send(http, http::Method::GET, url, None, &[]).await;
    if r.status != 200 {
        return Err(r.status.as_u16());
    }
    let v: Value = serde_json::from_slice(&r.body).map_err(|_| 0u16)?;
    let key = |o: &Value| {
        format!(
            "{}/{}",
            o["metadata"]["namespace"].as_str().unwrap_or(""),
            o["metadata"]["name"].as_str().unwrap_or("")
        )
    };
    let objects = v["items"].as_array().ok_or(0u16)?.iter().map(|o| (key(o), rv_of(o))).collect();
    let rv = v["metadata"]["resourceVersion"].as_str().and_then(|s| s.parse().ok()).ok_or(0u16)?;
    Ok(Mirror { objects, rv, anomalies: Vec::new() })
}

/// client-go's backoff between failed attempts (0.8 s doubling, jitter 1.0), kept short here.
async fn backoff(attempt: u32) {
    let base = Duration::from_millis(800) * 2u32.pow(attempt.min(3));
    tokio::time::sleep(base.mul_f64(1.0 + fastrand::f64())).await;
}

/// A client-go-like informer of A from `rv`: when its stream ends it re-watches from its last
/// RV; after 410 it relists as client-go does (retrying refused answers after a backoff), then
/// watches from the list RV. Returns once that watch is open.
async fn informer(
    http: HttpClient,
    base: String,
    rv: u64,
    open: Arc<AtomicUsize>,
    cut: Arc<OnceInstant>,
) -> Recovered {
    let mut rv = rv;
    let mut first = true;
    let mut refused = Vec::new();
    let mut attempt = 0;
    loop {
        let url = format!("{base}{PATH}?watch=true&allowWatchBookmarks=true&resourceVersion={rv}");
        let mut s = Stream::open(&http, &url).await;
        if s.status != 200 {
            assert!(!first, "{url}: {}", s.status);
            refused.push(s.status);
            backoff(attempt).await;
            attempt += 1;
            continue;
        }
        if first {
            open.fetch_add(1, SeqCst);
            first = false;
        }
        let gone = loop {
            match s.next(Duration::from_secs(120)).await {
                Next::Event(ev) if ev["type"] == "ERROR" => {
                    assert_eq!(ev["object"]["code"], 410, "{ev}");
                    break true;
                }
                Next::Event(ev) => rv = rv_of(&ev["object"]),
                Next::End => break false,
                Next::Idle => panic!("{url}: nothing for 120 s"),
            }
        };
        if !gone {
            continue;
        }
        let mut lists = 0;
        let mut unavailable = false;
        let m = loop {
            let q = if unavailable { String::new() } else { format!("resourceVersion={rv}&") };
            lists += 1;
            match list_once(&http, &format!("{base}{PATH}?{q}limit=500")).await {
                Ok(m) => break m,
                Err(410) => unavailable = true,
                Err(code) => {
                    refused.push(code);
                    backoff(attempt).await;
                    attempt += 1;
                }
            }
        };
        loop {
            let url = format!("{base}{PATH}?watch=true&allowWatchBookmarks=true&resourceVersion={}", m.rv);
            let s = Stream::open(&http, &url).await;
            if s.status == 200 {
                return Recovered { after: cut.get().elapsed(), lists, refused };
            }
            refused.push(s.status);
            backoff(attempt).await;
            attempt += 1;
        }
    }
}

/// An instant set once, read by many.
#[derive(Default)]
struct OnceInstant(std::sync::OnceLock<Instant>);

impl OnceInstant {
    fn get(&self) -> Instant {
        *self.0.get().expect("set before any watch can end")
    }
}

/// The cost of issue 31 (README, Relists): a relist ends every watch that started before it,
/// so its watchers re-watch (410) and relist at once. 1 000 informer-like watchers of A
/// (`WAVE_WATCHERS`); a stall, a compaction, a cut: A relists; each watcher's stream ends, its
/// re-watch gets 410, it relists as client-go does and watches again. Prints how long the
/// wave took and what reached the upstream; every watcher must be back within 120 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rewatch_wave_after_a_relist_of_1000_watchers() {
    let n: usize = std::env::var("WAVE_WATCHERS").ok().and_then(|s| s.parse().ok()).unwrap_or(1000);
    let env = setup(10_000).await;
    for i in 0..20 {
        env.create(&format!("o{i}"));
    }
    let r0 = env.sim.sim.current_rv().0;
    Env::synced(&env.a, r0).await;
    let open = Arc::new(AtomicUsize::new(0));
    let cut = Arc::new(OnceInstant::default());
    let tasks: Vec<_> = (0..n)
        .map(|_| tokio::spawn(informer(client(), Env::base(&env.a), r0, open.clone(), cut.clone())))
        .collect();
    let end = Instant::now() + Duration::from_secs(60);
    while open.load(SeqCst) < n {
        assert!(Instant::now() < end, "{} of {n} watches open", open.load(SeqCst));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    env.fault.stall_watches(true);
    env.delete("o0");
    env.create("gap");
    env.sim.sim.compact();
    let client_lists =
        |env: &Env| env.sim.sim.request_count(|r| r.path == PATH && !r.query.contains("watch=true"));
    let all_requests = |env: &Env| env.sim.sim.request_count(|_| true);
    let (lists0, requests0) = (client_lists(&env), all_requests(&env));
    let _ = cut.0.set(Instant::now());
    env.relist_a().await;
    let relisted = cut.get().elapsed();
    let mut got = Vec::new();
    for t in tasks {
        got.push(
            tokio::time::timeout(Duration::from_secs(120), t).await.expect("back within 120 s").unwrap(),
        );
    }
    let wave = cut.get().elapsed();
    let mut after: Vec<Duration> = got.iter().map(|r| r.after).collect();
    after.sort();
    let proxy_lists: usize = got.iter().map(|r| r.lists).sum();
    let mut refused = std::collections::BTreeMap::<u16, usize>::new();
    for r in &got {
        for c in &r.refused {
            *refused.entry(*c).or_default() += 1;
        }
    }
    let forwarded = client_lists(&env) - lists0;
    let upstream = all_requests(&env) - requests0;
    eprintln!(
        "re-watch wave: {n} watchers; A relisted {relisted:?} after the cut; all back {wave:?} after it (p50 {:?}, p99 {:?}); {proxy_lists} LISTs to the proxy ({} more than one per watcher), {forwarded} reached the upstream; {upstream} upstream requests in all; refused answers, retried after a backoff (status: count): {refused:?}",
        after[n / 2],
        after[n * 99 / 100],
        proxy_lists - n,
    );
    assert_eq!(
        env.a
            .readers()
            .into_iter()
            .find(|r| r.kind().resource == "configmaps")
            .unwrap()
            .watcher_stats()
            .ended_at_relist as usize,
        n
    );
}
