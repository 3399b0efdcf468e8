//! Relists that never leave a client with ghosts (issue 22, DESIGN §6): the proxy's upstream
//! watch goes through the fault relay of `common::fault`, which stalls it while the sim
//! changes, then cuts it; the sim has compacted the cache's RV, so the re-watch gets 410 and
//! the proxy relists. Each client's stream, any prefix of it, and a resume from its last RV at
//! the proxy, at another replica or at the sim must leave exactly the sim's state; and a
//! `spec.nodeName=` watch sees what the sim's own watch sees; protobuf watchers (kubelets,
//! controllers) get across a relist exactly what JSON watchers get. Run by `cargo test --test
//! relist`.

mod common;

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
        p.readers.iter().find(|r| r.kind().resource == "configmaps").unwrap().progress().rv.0
    }

    async fn synced(p: &Running, rv: u64) {
        let r = p.readers.iter().find(|r| r.kind().resource == "configmaps").unwrap();
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
        self.sim.sim.request_count(|r| {
            r.path == "/api/v1/configmaps" && !r.query.contains("watch=true") && r.query.contains("limit=500")
        })
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
/// state from an upstream LIST at L1 > C) and a watch from a write's RV start ahead of A's
/// cache; at the relist neither may get a diff computed from C (the sim sends them `DELETED x,
/// MODIFIED y`, the old proxy `ADDED y, DELETED z` and x forever). Both must end, and resume
/// right from where they were, here (410, relist) and at the sim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_that_started_ahead_of_the_cache_end_at_the_relist() {
    let env = setup(3).await;
    env.create("a");
    let z = env.create("z");
    Env::synced(&env.a, z).await;
    env.fault.stall_watches(true);
    env.delete("z");
    env.create("x");
    let y = env.create("y");
    assert!(Env::cache_rv(&env.a) < y, "A's watch is stalled");

    // A watch-list with RV unset: its initial state comes from an upstream LIST at y.
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
    assert_eq!(wl_start.objects.keys().cloned().collect::<Vec<_>>(), ["t/a", "t/x", "t/y"]);
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
    // A watch of what the relist does not change (label app=other): it may stay open.
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
    // The untouched watch stayed open: a BOOKMARK at the list RV, then the next change.
    let (events, ended) = other.collect(IDLE).await;
    assert!(!ended, "an empty difference keeps the watch");
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["type"], "BOOKMARK");
    assert_eq!(rv_of(&events[0]["object"]), truth.rv, "at the list RV (nothing changed since)");
    let mut o = cm("o", "0");
    o["metadata"]["labels"] = json!({"app":"other"});
    let o_rv = rv_of(&env.sim.sim.create("configmaps", NS, o).expect("create"));
    match other.next(Duration::from_secs(10)).await {
        Next::Event(ev) => assert_eq!((ev["type"].as_str(), rv_of(&ev["object"])), (Some("ADDED"), o_rv)),
        n => panic!("the next change: {n:?}"),
    }
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
    let pods = env.a.readers.iter().find(|r| r.kind().resource == "pods").unwrap();
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
/// stream ended), and an untouched protobuf watcher stays open with a protobuf BOOKMARK at the
/// list RV, then the next change.
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

    // The untouched protobuf watch: a BOOKMARK at the list RV, open, then the next change.
    let (events, ended) = pb_other.collect(IDLE).await;
    assert!(!ended, "an empty difference keeps the protobuf watch");
    assert_eq!(events.iter().map(|e| (e.type_.as_str(), e.rv)).collect::<Vec<_>>(), [("BOOKMARK", truth.rv)]);
    let mut o = cm("o", "0");
    o["metadata"]["labels"] = json!({"app":"other"});
    let o_rv = rv_of(&env.sim.sim.create("configmaps", NS, o).expect("create"));
    let (events, _) = pb_other.collect(IDLE).await;
    assert_eq!(
        events.iter().map(|e| (e.type_.as_str(), e.key.as_str(), e.rv)).collect::<Vec<_>>(),
        [("ADDED", "t/o", o_rv)]
    );
}
