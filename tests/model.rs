//! Model-based test of the product's promise (issue 22, docs/design.md §6): no client ever holds an
//! object that does not exist, or misses one that does, whatever the upstream does and
//! wherever it resumes. Two replicas (A and B, each behind its own fault relay of
//! `common::fault`) and the sim; a writer churns configmaps; a fault task stalls a replica's
//! upstream watch, cuts it, compacts the sim (so that a cut after a stall means 410 and a
//! relist); clients list or watch-list, watch, drop their stream at random points and resume
//! at a random one of A, B and the sim, relisting (anywhere) after 410. Every event a client
//! applies must make sense for the state it holds (no ghost ADDED/MODIFIED/DELETED, RVs never
//! back), and at the end every client's state must equal the sim's LIST. Event by event
//! (issue 31): every change the sim made to a stream's selection between its start and the
//! last RV it gave reached the client, in order (`assert_streams_missed_nothing`); what came
//! after that point comes to the client's next stream from there, or 410.
//!
//! Seeded (`MODEL_SEED`, default fixed) and timed by `SOAK_SECS` (default 12 s of churn, CI);
//! `benches/relist-soak.sh` runs it for minutes and prints the figures. Run by
//! `cargo test --test model`.

mod common;

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::churn::{assert_clients_at_truth, assert_streams_missed_nothing, churn, run_client, Stats, PATH};
use common::fault::Fault;
use common::mirror::Mirror;
use common::{client, serve_args};
use kube_watchcache::app::{self, Running};
use kube_watchcache::resource::Rv;
use kube_watchcache_sim::{Sim, SimHandle, SimOptions};
use serde_json::json;

const CLIENTS: usize = 6;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_never_hold_ghosts_across_faults_relists_and_replicas() {
    let seed = seed();
    let secs = secs();
    let sim: SimHandle =
        Sim::start(SimOptions { compaction_window: 400, ..Default::default() }).await.expect("sim");
    sim.sim
        .create(
            "namespaces",
            "",
            json!({"apiVersion":"v1","kind":"Namespace","metadata":{"name":common::churn::NS}}),
        )
        .expect("namespace");
    let relays = [Arc::new(Fault::start(sim.addr).await), Arc::new(Fault::start(sim.addr).await)];
    let a = start_proxy(relays[0].addr).await;
    let b = start_proxy(relays[1].addr).await;
    let bases = Arc::new(vec![
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
        p.readers()[0].wait_for(Rv(rv), Duration::from_secs(60)).await.expect("replica caught up");
    }
    let caught_up = t.elapsed();
    let http = client();
    let truth = Mirror::list(&http, &format!("{}{PATH}", bases[2])).await.expect("truth");
    let (streams, changes) = assert_streams_missed_nothing(&stats);
    eprintln!("event-level: {streams} streams, {changes} changes received, none skipped");
    let checked = assert_clients_at_truth(held, &bases, &truth, seed + 2).await;
    let l = |p: &Running| p.readers()[0].watcher_stats();
    let upstream_lists = sim.sim.request_count(|r| common::reflector_list(r, "/api/v1/configmaps"));
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
