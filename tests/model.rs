//! Model-based test of the product's promise (issue 22, DESIGN §6): no client ever holds an
//! object that does not exist, or misses one that does, whatever the upstream does and
//! wherever it resumes. Two replicas (A and B, each behind its own fault relay of
//! `common::fault`) and the sim; a writer churns configmaps; a fault task stalls a replica's
//! upstream watch, cuts it, compacts the sim (so that a cut after a stall means 410 and a
//! relist); clients list or watch-list, watch, drop their stream at random points and resume
//! at a random one of A, B and the sim, relisting (anywhere) after 410. Every event a client
//! applies must make sense for the state it holds (no ghost ADDED/MODIFIED/DELETED, RVs never
//! back), and at the end every client's state must equal the sim's LIST.
//!
//! Seeded (`MODEL_SEED`, default fixed) and timed by `SOAK_SECS` (default 12 s of churn, CI);
//! `benches/relist-soak.sh` runs it for minutes and prints the figures. Run by
//! `cargo test --test model`.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::fault::Fault;
use common::mirror::{resume, Applied, Mirror, Next, Stream};
use common::{client, serve_args, HttpClient};
use kube_watchcache::app::{self, Running};
use kube_watchcache::resource::Rv;
use kube_watchcache::sim::{Sim, SimHandle, SimOptions};
use serde_json::json;

const NS: &str = "m";
const PATH: &str = "/api/v1/namespaces/m/configmaps";
const CLIENTS: usize = 6;
/// Objects the writer keeps around.
const NAMES: usize = 12;

#[derive(Default)]
struct Stats {
    writes: AtomicUsize,
    stalls: AtomicUsize,
    cuts: AtomicUsize,
    compactions: AtomicUsize,
    lists: AtomicUsize,
    watch_lists: AtomicUsize,
    resumes: [AtomicUsize; 3],
    gone: AtomicUsize,
    ended: AtomicUsize,
    events: AtomicUsize,
}

fn seed() -> u64 {
    std::env::var("MODEL_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(22)
}

fn secs() -> u64 {
    std::env::var("SOAK_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(12)
}

async fn start_proxy(upstream: std::net::SocketAddr) -> Running {
    let mut args = serve_args(upstream, &["configmaps"]);
    args.security.max_watches_per_user = 0;
    let p = app::start(&args).await.expect("proxy starts");
    assert!(p.wait_ready(Duration::from_secs(30)).await, "proxy synced");
    p
}

/// The writer: random create / update / delete among `NAMES` names.
async fn churn(sim: Sim, stop: Arc<AtomicBool>, stats: Arc<Stats>, seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut n = 0u64;
    while !stop.load(SeqCst) {
        let name = format!("c{}", rng.usize(..NAMES));
        n += 1;
        let obj = json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":name,"namespace":NS},"data":{"v":n.to_string()}});
        let ok = if sim.update("configmaps", NS, obj.clone()).is_ok() {
            if rng.u8(..4) == 0 {
                sim.delete("configmaps", NS, &name).is_ok()
            } else {
                true
            }
        } else {
            sim.create("configmaps", NS, obj).is_ok()
        };
        if ok {
            stats.writes.fetch_add(1, SeqCst);
        }
        tokio::time::sleep(Duration::from_millis(rng.u64(5..40))).await;
    }
}

/// The faults: on a random replica, a stall (released, or ended by a cut after a compaction:
/// a relist), a plain cut, or a compaction of the sim alone.
async fn faults(sim: Sim, relays: [Arc<Fault>; 2], stop: Arc<AtomicBool>, stats: Arc<Stats>, seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    while !stop.load(SeqCst) {
        tokio::time::sleep(Duration::from_millis(rng.u64(200..900))).await;
        let relay = &relays[rng.usize(..2)];
        match rng.u8(..4) {
            0 | 1 => {
                relay.stall_watches(true);
                stats.stalls.fetch_add(1, SeqCst);
                tokio::time::sleep(Duration::from_millis(rng.u64(200..1200))).await;
                if rng.bool() {
                    sim.compact();
                    stats.compactions.fetch_add(1, SeqCst);
                    relay.drop_all();
                    stats.cuts.fetch_add(1, SeqCst);
                }
                relay.stall_watches(false);
            }
            2 => {
                relay.drop_all();
                stats.cuts.fetch_add(1, SeqCst);
            }
            _ => {
                sim.compact();
                stats.compactions.fetch_add(1, SeqCst);
            }
        }
    }
    for r in &relays {
        r.stall_watches(false);
    }
}

/// A starting state from `base`: a LIST, or a watch-list whose stream the client then keeps.
async fn start(
    http: &HttpClient,
    base: &str,
    rng: &mut fastrand::Rng,
    stats: &Stats,
) -> Option<(Mirror, Option<Stream>)> {
    if rng.bool() {
        let q = if rng.bool() { "" } else { "?resourceVersion=0" };
        let m = Mirror::list(http, &format!("{base}{PATH}{q}")).await?;
        stats.lists.fetch_add(1, SeqCst);
        return Some((m, None));
    }
    let url = format!(
        "{base}{PATH}?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"
    );
    let mut s = Stream::open(http, &url).await;
    if s.status != 200 {
        return None;
    }
    let mut m = Mirror::default();
    loop {
        match s.next(Duration::from_secs(10)).await {
            Next::Event(ev) => {
                if ev["type"] == "ERROR" {
                    return None;
                }
                if m.initial(&ev) {
                    break;
                }
            }
            // Ended (or stalled) before its initial state was complete: start again.
            _ => return None,
        }
    }
    stats.watch_lists.fetch_add(1, SeqCst);
    Some((m, Some(s)))
}

/// One client until `stop`; returns its state (and its anomalies).
async fn run_client(
    bases: Arc<[String; 3]>,
    stop: Arc<AtomicBool>,
    stats: Arc<Stats>,
    seed: u64,
) -> Option<Mirror> {
    let http = client();
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut held: Option<Mirror> = None;
    while !stop.load(SeqCst) {
        let b = rng.usize(..3);
        let base = &bases[b];
        let (mut m, stream) = match held.take() {
            Some(m) => {
                stats.resumes[b].fetch_add(1, SeqCst);
                (m, None)
            }
            None => match start(&http, base, &mut rng, &stats).await {
                Some(s) => s,
                None => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let mut s = match stream {
            Some(s) => s,
            None => {
                let url =
                    format!("{base}{PATH}?watch=true&allowWatchBookmarks=true&resourceVersion={}", m.rv);
                let s = Stream::open(&http, &url).await;
                if s.status != 200 {
                    // Not ready (429) or the like: the client keeps its state and tries again.
                    held = Some(m);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                s
            }
        };
        // Read a random number of events, then drop the stream (a lost connection).
        let budget = rng.usize(0..12);
        let mut got = 0;
        let mut keep = true;
        while got < budget && !stop.load(SeqCst) {
            match s.next(Duration::from_millis(rng.u64(50..400))).await {
                Next::Event(ev) => match m.apply(&ev) {
                    Applied::Error(code) => {
                        assert_eq!(code, 410, "{ev}");
                        stats.gone.fetch_add(1, SeqCst);
                        keep = false;
                        break;
                    }
                    Applied::Change => {
                        stats.events.fetch_add(1, SeqCst);
                        got += 1;
                    }
                    Applied::Bookmark { .. } => {}
                },
                Next::End => {
                    stats.ended.fetch_add(1, SeqCst);
                    break;
                }
                Next::Idle => break,
            }
        }
        if !m.anomalies.is_empty() {
            return Some(m);
        }
        if keep {
            held = Some(m);
        }
    }
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_never_hold_ghosts_across_faults_relists_and_replicas() {
    let seed = seed();
    let secs = secs();
    let sim: SimHandle =
        Sim::start(SimOptions { compaction_window: 400, ..Default::default() }).await.expect("sim");
    sim.sim
        .create("namespaces", "", json!({"apiVersion":"v1","kind":"Namespace","metadata":{"name":NS}}))
        .expect("namespace");
    let relays = [Arc::new(Fault::start(sim.addr).await), Arc::new(Fault::start(sim.addr).await)];
    let a = start_proxy(relays[0].addr).await;
    let b = start_proxy(relays[1].addr).await;
    let bases = Arc::new([
        format!("http://{}", a.addr),
        format!("http://{}", b.addr),
        format!("http://{}", sim.addr),
    ]);
    let stats = Arc::new(Stats::default());
    let stop = Arc::new(AtomicBool::new(false));
    let stop_clients = Arc::new(AtomicBool::new(false));

    let writer = tokio::spawn(churn(sim.sim.clone(), stop.clone(), stats.clone(), seed));
    let fault_task =
        tokio::spawn(faults(sim.sim.clone(), relays.clone(), stop.clone(), stats.clone(), seed + 1));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            tokio::spawn(run_client(bases.clone(), stop_clients.clone(), stats.clone(), seed + 10 + i as u64))
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop.store(true, SeqCst);
    writer.await.unwrap();
    fault_task.await.unwrap();
    stop_clients.store(true, SeqCst);
    let mut held = Vec::new();
    for c in clients {
        held.push(c.await.unwrap());
    }

    // Quiet now: both replicas reach the sim's revision (a relist if they need one).
    let rv = sim.sim.current_rv().0;
    let t = Instant::now();
    for p in [&a, &b] {
        p.readers[0].wait_for(Rv(rv), Duration::from_secs(60)).await.expect("replica caught up");
    }
    let caught_up = t.elapsed();
    let http = client();
    let truth = Mirror::list(&http, &format!("{}{PATH}", bases[2])).await.expect("truth");
    let mut rng = fastrand::Rng::with_seed(seed + 2);
    let mut checked = 0;
    for (i, m) in held.into_iter().enumerate() {
        let base = &bases[rng.usize(..3)];
        let m = match m {
            Some(m) => {
                assert!(m.anomalies.is_empty(), "client {i}: {:?}", m.anomalies);
                m
            }
            None => Mirror::list(&http, &format!("{base}{PATH}")).await.expect("list"),
        };
        let from = m.rv;
        let got = resume(&http, base, PATH, m, Duration::from_millis(800)).await;
        assert!(got.anomalies.is_empty(), "client {i} resuming at {base} from {from}: {:?}", got.anomalies);
        assert_eq!(got.objects, truth.objects, "client {i} resuming at {base} from {from}");
        checked += 1;
    }
    let l = |p: &Running| p.readers[0].watcher_stats();
    let upstream_lists = sim.sim.request_count(|r| {
        r.path == "/api/v1/configmaps" && !r.query.contains("watch=true") && r.query.contains("limit=500")
    });
    let s = &stats;
    eprintln!(
        "model (seed {seed}, {secs} s): {} writes; faults: {} stalls, {} cuts, {} compactions; {} replica LISTs (2 initial, the rest relists); clients: {} lists, {} watch-lists, resumes at A {} / B {} / sim {}, {} events applied, {} streams ended, {} 410s; replicas caught up {caught_up:?} after; {checked} clients at the truth ({} objects), 0 ghosts; watchers now A {:?} B {:?}",
        s.writes.load(SeqCst),
        s.stalls.load(SeqCst),
        s.cuts.load(SeqCst),
        s.compactions.load(SeqCst),
        upstream_lists,
        s.lists.load(SeqCst),
        s.watch_lists.load(SeqCst),
        s.resumes[0].load(SeqCst),
        s.resumes[1].load(SeqCst),
        s.resumes[2].load(SeqCst),
        s.events.load(SeqCst),
        s.ended.load(SeqCst),
        s.gone.load(SeqCst),
        truth.objects.len(),
        l(&a).live,
        l(&b).live,
    );
    assert!(s.writes.load(SeqCst) > 0 && s.events.load(SeqCst) > 0);
    a.shutdown().await;
    b.shutdown().await;
}
