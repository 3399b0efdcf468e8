//! The clients and the writer of the model-based tests (`tests/model.rs`, `tests/tiers.rs`):
//! a writer churning configmaps of one namespace in the sim, and informer-like clients that
//! list or watch-list, watch, drop their stream at random points and resume at a random base
//! URL, relisting after 410, recording every event that makes no sense for their state.
//! The writer logs every write and each client every stream it read, so that
//! `assert_streams_missed_nothing` checks at the end, event by event, that no stream skipped a
//! change of its selection (issue 31): a change either reached the client or came after the
//! last RV its stream gave (an event or a BOOKMARK), where the client resumes (and gets it, or
//! 410).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
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
    /// Every write of the writer, in order: (type of its watch event, `namespace/name`, RV).
    pub written: Mutex<Vec<Change>>,
    /// Every watch stream a client read (after its initial state, if any).
    pub streams: Mutex<Vec<StreamLog>>,
}

/// A change as a watch of the whole namespace sees it: (type, `namespace/name`, RV).
pub type Change = (&'static str, String, u64);

/// What one client got from one watch stream.
#[derive(Debug)]
pub struct StreamLog {
    pub url: String,
    /// The RV the stream started after (the client's state there was exact).
    pub from: u64,
    /// The changes received, in order.
    pub got: Vec<Change>,
    /// The newest RV the stream gave (event or BOOKMARK): the client resumes from here.
    pub last: u64,
}

fn event_type(t: &str) -> &'static str {
    match t {
        "ADDED" => "ADDED",
        "MODIFIED" => "MODIFIED",
        "DELETED" => "DELETED",
        "BOOKMARK" => "BOOKMARK",
        _ => "ERROR",
    }
}

fn rv_of(o: &serde_json::Value) -> u64 {
    o["metadata"]["resourceVersion"].as_str().and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// The writer: random create / update / delete among `NAMES` names.
pub async fn churn(sim: Sim, stop: Arc<AtomicBool>, stats: Arc<Stats>, seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut n = 0u64;
    while !stop.load(SeqCst) {
        let name = format!("c{}", rng.usize(..NAMES));
        n += 1;
        let obj = json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":name,"namespace":NS},"data":{"v":n.to_string()}});
        let key = format!("{NS}/{name}");
        let log = |t: &'static str, o: &serde_json::Value| {
            stats.written.lock().unwrap().push((t, key.clone(), rv_of(o)));
        };
        let ok = if let Ok(o) = sim.update("configmaps", NS, obj.clone()) {
            log("MODIFIED", &o);
            if rng.u8(..4) == 0 {
                sim.delete("configmaps", NS, &name).map(|o| log("DELETED", &o)).is_ok()
            } else {
                true
            }
        } else {
            sim.create("configmaps", NS, obj).map(|o| log("ADDED", &o)).is_ok()
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
        let url = format!("{base}{PATH}?watch=true&allowWatchBookmarks=true&resourceVersion={}", m.rv);
        let mut log = StreamLog { url: url.clone(), from: m.rv, got: Vec::new(), last: m.rv };
        let mut s = match stream {
            Some(s) => s,
            None => {
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
                Next::Event(ev) => {
                    let (t, o) = (event_type(ev["type"].as_str().unwrap_or("")), &ev["object"]);
                    if t != "BOOKMARK" && t != "ERROR" {
                        let key = format!(
                            "{}/{}",
                            o["metadata"]["namespace"].as_str().unwrap_or(""),
                            o["metadata"]["name"].as_str().unwrap_or("")
                        );
                        log.got.push((t, key, rv_of(o)));
                    }
                    if t != "ERROR" {
                        log.last = log.last.max(rv_of(o));
                    }
                    match m.apply(&ev) {
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
                    }
                }
                Next::End => {
                    stats.ended.fetch_add(1, SeqCst);
                    break;
                }
                Next::Idle => break,
            }
        }
        stats.streams.lock().unwrap().push(log);
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

/// Event by event (issue 31): for every stream a client read, the changes it received are
/// exactly the writer's changes with RV in (its start, the last RV it gave], in order; so
/// every change of its selection either reached the client or came after the point it resumes
/// from (where the next stream gets it, or 410 and a relist). Call once the writer stopped.
/// Returns (streams, changes) checked.
pub fn assert_streams_missed_nothing(stats: &Stats) -> (usize, usize) {
    let written = stats.written.lock().unwrap();
    let streams = stats.streams.lock().unwrap();
    let mut changes = 0;
    for st in streams.iter() {
        let lo = written.partition_point(|c| c.2 <= st.from);
        let hi = written.partition_point(|c| c.2 <= st.last);
        let want = &written[lo..hi.max(lo)];
        assert_eq!(
            st.got, want,
            "{}: from {} to {}, the stream skipped or invented a change",
            st.url, st.from, st.last
        );
        changes += st.got.len();
    }
    (streams.len(), changes)
}
