//! Tiers (issue 19): a proxy is another proxy's upstream. The sim, a middle proxy M caching
//! from it, and two leaf proxies L1 and L2 caching from M. A writer churns configmaps; M is
//! restarted twice on the same address (its new cache starts at a new list RV, so the leaves'
//! re-watches get 410 and they relist from M); informer-like clients (`common::churn`) list or
//! watch-list, watch, drop their stream anywhere and resume at L1, L2, M or the sim. Every
//! event a client applies must make sense for its state, and at the end every client resumed
//! anywhere holds exactly the sim's objects: zero lost, duplicated or reordered events at the
//! leaves. It also prints what a tier costs in delivery lag (one watch at the sim, at M and at
//! L1, the same events timed at each).
//!
//! Seeded (`MODEL_SEED`) and timed by `SOAK_SECS` (default 12 s of churn). Run by
//! `cargo test --test tiers`.
//!
//! Issue 31: a relist at the middle tier whose difference for a leaf's upstream watch is
//! empty (an object created and deleted while the middle's own upstream watch was stalled)
//! must end that watch, so the leaf never presents the gap as a quiet stretch: its watches,
//! Exact LISTs and continue tokens inside the gap answer 410 (or are forwarded), never a state
//! without the object.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::churn::{
    assert_clients_at_truth, assert_streams_missed_nothing, churn, run_client, Stats, NS, PATH,
};
use common::fault::Fault;
use common::mirror::{Mirror, Next, Stream};
use common::{client, serve_args};
use kube_watchcache::app::{self, Running};
use kube_watchcache::resource::Rv;
use kube_watchcache_sim::{Sim, SimHandle, SimOptions};
use serde_json::json;

const CLIENTS: usize = 6;

fn seed() -> u64 {
    std::env::var("MODEL_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(19)
}

fn secs() -> u64 {
    std::env::var("SOAK_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(12)
}

/// A proxy caching configmaps from `upstream`, listening on `listen` (port 0: any).
async fn proxy(upstream: SocketAddr, listen: SocketAddr) -> Running {
    let mut args = serve_args(upstream, &["configmaps"]);
    args.insecure_listen = Some(listen);
    args.security.max_watches_per_user = 0;
    // The address of a proxy just shut down may take a moment to be free again.
    for _ in 0..50 {
        match app::start(&args).await {
            Ok(p) => {
                assert!(p.wait_ready(Duration::from_secs(30)).await, "proxy synced");
                return p;
            }
            Err(e) if listen.port() != 0 => {
                eprintln!("restart on {listen}: {e}; again");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("proxy starts: {e}"),
        }
    }
    panic!("could not restart on {listen}");
}

/// Watches `base` from `rv` and notes when each event's RV arrived, until `stop`.
async fn time_events(base: String, rv: u64, stop: Arc<AtomicBool>) -> HashMap<u64, Instant> {
    let http = client();
    let mut seen = HashMap::new();
    let url = format!("{base}{PATH}?watch=true&resourceVersion={rv}");
    let mut s = Stream::open(&http, &url).await;
    assert_eq!(s.status, 200, "{url}");
    while !stop.load(SeqCst) {
        match s.next(Duration::from_millis(300)).await {
            Next::Event(ev) => {
                if let Some(r) =
                    ev["object"]["metadata"]["resourceVersion"].as_str().and_then(|r| r.parse().ok())
                {
                    seen.entry(r).or_insert_with(Instant::now);
                }
            }
            Next::Idle => {}
            Next::End => break,
        }
    }
    seen
}

/// `watchcache_relists_total` of a proxy (the initial list included), from its /watchcache/metrics.
async fn relists(addr: SocketAddr) -> f64 {
    let r =
        common::send(&client(), http::Method::GET, &format!("http://{addr}/watchcache/metrics"), None, &[])
            .await;
    assert_eq!(r.status, 200);
    let text = String::from_utf8_lossy(&r.body).into_owned();
    text.lines()
        .find(|l| l.starts_with("watchcache_relists_total{"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// p50 and p99 of how much later than at `from` the same events arrived at `to`.
fn lag(from: &HashMap<u64, Instant>, to: &HashMap<u64, Instant>) -> (usize, Duration, Duration) {
    let mut d: Vec<Duration> =
        to.iter().filter_map(|(rv, t)| from.get(rv).map(|f| t.saturating_duration_since(*f))).collect();
    d.sort();
    if d.is_empty() {
        return (0, Duration::ZERO, Duration::ZERO);
    }
    let q = |p: f64| d[((d.len() - 1) as f64 * p) as usize];
    (d.len(), q(0.5), q(0.99))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaves_of_a_tree_of_caches_lose_nothing_across_a_middle_restart() {
    let seed = seed();
    let secs = secs();
    let sim: SimHandle =
        Sim::start(SimOptions { compaction_window: 400, ..Default::default() }).await.expect("sim");
    sim.sim
        .create("namespaces", "", json!({"apiVersion":"v1","kind":"Namespace","metadata":{"name":NS}}))
        .expect("namespace");
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let middle = proxy(sim.addr, any).await;
    let middle_addr = middle.addr;
    let l1 = proxy(middle_addr, any).await;
    let l2 = proxy(middle_addr, any).await;
    let bases = Arc::new(vec![
        format!("http://{}", l1.addr),
        format!("http://{}", l2.addr),
        format!("http://{middle_addr}"),
        format!("http://{}", sim.addr),
    ]);
    let stats = Arc::new(Stats::default());
    let stop = Arc::new(AtomicBool::new(false));
    let stop_clients = Arc::new(AtomicBool::new(false));
    let stop_timing = Arc::new(AtomicBool::new(false));

    // Lag: the same events timed at the sim, at M and at L1 (before the first restart).
    let rv0 = sim.sim.current_rv().0;
    l1.readers()[0].wait_for(Rv(rv0), Duration::from_secs(10)).await.expect("leaf at the start RV");
    let timers: Vec<_> = [&bases[3], &bases[2], &bases[0]]
        .into_iter()
        .map(|b| tokio::spawn(time_events(b.clone(), rv0, stop_timing.clone())))
        .collect();

    let writer = tokio::spawn(churn(sim.sim.clone(), stop.clone(), stats.clone(), seed));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            tokio::spawn(run_client(bases.clone(), stop_clients.clone(), stats.clone(), seed + 10 + i as u64))
        })
        .collect();
    let third = Duration::from_secs(secs) / 3;
    tokio::time::sleep(third).await;
    stop_timing.store(true, SeqCst);
    let mut timed = Vec::new();
    for t in timers {
        timed.push(t.await.unwrap());
    }
    // Two restarts of the middle tier, on the same address, with compactions in between: the
    // leaves' re-watches from RVs the new middle cache never had get 410, and they relist.
    let mut middle = Some(middle);
    let mut restarts = 0;
    for _ in 0..2 {
        if let Some(m) = middle.take() {
            m.shutdown().await;
        }
        sim.sim.compact();
        tokio::time::sleep(Duration::from_millis(300)).await;
        middle = Some(proxy(sim.addr, middle_addr).await);
        restarts += 1;
        tokio::time::sleep(third / 2).await;
    }
    stop.store(true, SeqCst);
    writer.await.unwrap();
    stop_clients.store(true, SeqCst);
    let mut held = Vec::new();
    for c in clients {
        held.push(c.await.unwrap());
    }
    let middle = middle.expect("middle tier");

    // Quiet now: every tier reaches the sim's revision.
    let rv = sim.sim.current_rv().0;
    let t = Instant::now();
    for (name, p) in [("middle", &middle), ("L1", &l1), ("L2", &l2)] {
        if let Err(e) = p.readers()[0].wait_for(Rv(rv), Duration::from_secs(60)).await {
            let m = relists(middle.addr).await;
            panic!(
                "{name} did not catch up with the sim at {rv}: {e:?}; middle lists {m}, progress {:?}",
                p.readers()[0].progress()
            );
        }
    }
    let caught_up = t.elapsed();
    let http = client();
    let truth = Mirror::list(&http, &format!("{}{PATH}", bases[3])).await.expect("truth");
    let (streams, changes) = assert_streams_missed_nothing(&stats);
    eprintln!("event-level: {streams} streams, {changes} changes received, none skipped");
    assert_clients_at_truth(held, &bases, &truth, seed + 2).await;
    // The restarts made the leaves relist from the new middle tier (the 410 path was taken).
    let leaf_lists = relists(l1.addr).await + relists(l2.addr).await;
    assert!(leaf_lists > 2.0, "the leaves relisted after the middle restarts: {leaf_lists} lists");
    // Every leaf serves the truth too.
    for base in &bases[..2] {
        let leaf =
            Mirror::list(&http, &format!("{base}{PATH}?resourceVersion={rv}")).await.expect("leaf list");
        assert_eq!(leaf.objects, truth.objects, "{base}");
    }
    let (n_m, m50, m99) = lag(&timed[0], &timed[1]);
    let (n_l, l50, l99) = lag(&timed[0], &timed[2]);
    let s = &stats;
    eprintln!(
        "tiers (seed {seed}, {secs} s): {} writes, {restarts} middle restarts; clients: {} lists, {} watch-lists, resumes at L1 {} / L2 {} / M {} / sim {}, {} events applied, {} streams ended, {} 410s; tiers caught up {caught_up:?} after; {} clients at the truth ({} objects); {leaf_lists} leaf lists (2 initial); lag behind the sim: M p50 {m50:?} p99 {m99:?} ({n_m} events), L1 (two tiers) p50 {l50:?} p99 {l99:?} ({n_l} events)",
        s.writes.load(SeqCst),
        s.lists.load(SeqCst),
        s.watch_lists.load(SeqCst),
        s.resumes[0].load(SeqCst),
        s.resumes[1].load(SeqCst),
        s.resumes[2].load(SeqCst),
        s.resumes[3].load(SeqCst),
        s.events.load(SeqCst),
        s.ended.load(SeqCst),
        s.gone.load(SeqCst),
        CLIENTS,
        truth.objects.len(),
    );
    assert!(s.writes.load(SeqCst) > 0 && s.events.load(SeqCst) > 0);
    assert!(n_l > 0, "events timed through two tiers");
    for p in [middle, l1, l2] {
        p.shutdown().await;
    }
}

/// Issue 31 §1: proxy C's upstream is proxy A, A's upstream goes through the fault relay. A's
/// watch stalls; x is created (a client lists at the sim and holds x at RV r) and deleted; the
/// sim compacts, A's re-watch gets 410 and A relists at L. x is in neither A's cache nor the
/// list: the difference for C's upstream watch is empty. Before the fix A kept it open with a
/// BOOKMARK at L, C moved to L and served (its old RV, L] as a quiet stretch: a watch from r
/// gave nothing (the client kept x forever), an Exact LIST at r and a continue token at r
/// omitted x. Now A ends C's watch, C re-watches (410) and relists, and each of those answers
/// 410 or the sim's own state at r.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relist_with_an_empty_difference_at_the_middle_leaves_no_quiet_gap_at_the_leaf() {
    let sim: SimHandle =
        Sim::start(SimOptions { compaction_window: 3, ..Default::default() }).await.expect("sim");
    let s = &sim.sim;
    s.create("namespaces", "", json!({"apiVersion":"v1","kind":"Namespace","metadata":{"name":NS}}))
        .expect("namespace");
    let cm =
        |name: &str| json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":name,"namespace":NS}});
    let rv_of =
        |o: serde_json::Value| -> u64 { o["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap() };
    let a_rv = rv_of(s.create("configmaps", NS, cm("a")).expect("a"));
    let fault = Fault::start(sim.addr).await;
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let a = proxy(fault.addr, any).await;
    let c = proxy(a.addr, any).await;
    c.readers()[0].wait_for(Rv(a_rv), Duration::from_secs(10)).await.expect("C synced");
    let http = client();
    let c_base = format!("http://{}", c.addr);
    let lists_at = |p: &Running| p.readers()[0].watcher_stats();
    // A watch at C from before the gap, as an informer of C holds one.
    let c0 = c.readers()[0].progress().rv.0;
    let mut before = Stream::open(
        &http,
        &format!("{c_base}{PATH}?watch=true&allowWatchBookmarks=true&resourceVersion={c0}"),
    )
    .await;
    assert_eq!(before.status, 200);

    fault.stall_watches(true);
    let r = rv_of(s.create("configmaps", NS, cm("x")).expect("x"));
    // A client of the sim holds x at r, and a continue token at r (page 1: a).
    let at_r = Mirror::list(&http, &format!("http://{}{PATH}", sim.addr)).await.expect("list at r");
    assert_eq!((at_r.rv, at_r.objects.contains_key(&format!("{NS}/x"))), (r, true));
    let page =
        common::send(&http, http::Method::GET, &format!("http://{}{PATH}?limit=1", sim.addr), None, &[])
            .await;
    let page: serde_json::Value = serde_json::from_slice(&page.body).expect("page 1");
    let token = page["metadata"]["continue"].as_str().expect("a continue token").to_owned();
    s.delete("configmaps", NS, "x").expect("delete x");
    // Past the sim's compaction window (3): A's RV and r are gone upstream.
    for i in 0..3 {
        s.create("configmaps", NS, cm(&format!("n{i}"))).expect("create");
    }
    s.delete("configmaps", NS, "n0").expect("delete n0");
    s.delete("configmaps", NS, "n1").expect("delete n1");
    s.delete("configmaps", NS, "n2").expect("delete n2");
    assert!(a.readers()[0].progress().rv.0 < r, "A's watch is stalled");
    // The cut: A's re-watch gets 410, A relists at L; nothing C selects differs.
    let ended_at_a = lists_at(&a).ended_at_relist;
    fault.drop_all();
    fault.stall_watches(false);
    let l = s.current_rv().0;
    a.readers()[0].wait_for(Rv(l), Duration::from_secs(20)).await.expect("A relisted");
    c.readers()[0].wait_for(Rv(l), Duration::from_secs(20)).await.expect("C caught up");
    assert!(lists_at(&a).ended_at_relist > ended_at_a, "A ended C's upstream watch at its relist");
    let (floor, _) = c.readers()[0].window();
    assert!(floor.0 >= l, "C relisted (its history starts at {floor}, not inside the gap before {l})");
    // C's own client watch from before the gap ended, without any RV of the gap.
    let (events, ended) = before.collect(Duration::from_millis(700)).await;
    assert!(ended, "the watch at C from before the gap ended: {events:?}");
    assert!(
        events.iter().all(|e| rv_of(e["object"].clone()) < r),
        "nothing from the gap, no BOOKMARK at L: {events:?}"
    );

    // A watch at C from r: 410 (the client relists and drops x), not silence.
    let (events, _) = Stream::open(&http, &format!("{c_base}{PATH}?watch=true&resourceVersion={r}"))
        .await
        .collect(Duration::from_millis(700))
        .await;
    assert_eq!(
        events.first().map(|e| (e["type"].clone(), e["object"]["code"].clone())),
        Some((json!("ERROR"), json!(410))),
        "watch from r at C: {events:?}"
    );
    // An Exact LIST at r and the continue token at r: 410 (forwarded: the sim compacted r), or
    // the sim's state at r (with x); never a state without x.
    for (what, url) in [
        ("Exact LIST", format!("{c_base}{PATH}?resourceVersion={r}&resourceVersionMatch=Exact")),
        ("legacy Exact", format!("{c_base}{PATH}?resourceVersion={r}&limit=500")),
        ("continue token", format!("{c_base}{PATH}?limit=500&continue={token}")),
    ] {
        let resp = common::send(&http, http::Method::GET, &url, None, &[]).await;
        let body = String::from_utf8_lossy(&resp.body).into_owned();
        match resp.status.as_u16() {
            410 => {}
            200 => assert!(body.contains("\"x\""), "{what} at r from C omits x: {body}"),
            other => panic!("{what} at r from C: {other} {body}"),
        }
    }
    // The client that held x, resumed at C, drops it.
    let got = common::mirror::resume(&http, &c_base, PATH, at_r, Duration::from_millis(700)).await;
    let truth = Mirror::list(&http, &format!("http://{}{PATH}", sim.addr)).await.expect("truth");
    assert_eq!(got.objects, truth.objects, "the client of C holds no ghost");
    for p in [c, a] {
        p.shutdown().await;
    }
}
