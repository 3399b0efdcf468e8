//! The clients and the writer of the model-based tests (`tests/model.rs`, `tests/tiers.rs`):
//! a writer churning configmaps of one namespace in the sim, and informer-like clients that
//! list or watch-list, watch, drop their stream at random points and resume at a random base
//! URL, relisting after 410, recording every event that makes no sense for their state.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use kube_watchcache_sim::Sim;
use serde_json::json;

use super::mirror::{resume, Applied, Mirror, Next, Stream};
use super::{client, HttpClient};

pub const NS: &str = "m";
pub const PATH: &str = "/api/v1/namespaces/m/configmaps";
/// Objects the writer keeps around.
const NAMES: usize = 12;

/// What the writer, the faults and the clients did.
#[derive(Default)]
pub struct Stats {
    pub writes: AtomicUsize,
    pub stalls: AtomicUsize,
    pub cuts: AtomicUsize,
    pub compactions: AtomicUsize,
    pub lists: AtomicUsize,
    pub watch_lists: AtomicUsize,
    pub resumes: [AtomicUsize; 4],
    pub gone: AtomicUsize,
    pub ended: AtomicUsize,
    pub events: AtomicUsize,
}

/// The writer: random create / update / delete among `NAMES` names.
pub async fn churn(sim: Sim, stop: Arc<AtomicBool>, stats: Arc<Stats>, seed: u64) {
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

/// One client until `stop`, resuming at a random one of `bases` (at most 4); returns its
/// state (and its anomalies).
pub async fn run_client(
    bases: Arc<Vec<String>>,
    stop: Arc<AtomicBool>,
    stats: Arc<Stats>,
    seed: u64,
) -> Option<Mirror> {
    let http = client();
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut held: Option<Mirror> = None;
    while !stop.load(SeqCst) {
        let b = rng.usize(..bases.len());
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

/// The end of a model run: every client's state (a fresh LIST for those that held none),
/// resumed at a random one of `bases`, must be free of anomalies and equal `truth` (the sim's
/// LIST). Returns how many clients were checked.
pub async fn assert_clients_at_truth(
    held: Vec<Option<Mirror>>,
    bases: &[String],
    truth: &Mirror,
    seed: u64,
) -> usize {
    let http = client();
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut checked = 0;
    for (i, m) in held.into_iter().enumerate() {
        let base = &bases[rng.usize(..bases.len())];
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
    checked
}
