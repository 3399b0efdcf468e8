//! Integration: the cache that checks itself (issue 33 item 2). The simulated apiserver
//! silently drops one watch event (a test-only fault, `Sim::drop_watch_events`): the cache
//! misses a change yet moves on. The consistency check must catch it within one
//! `--consistency-check-period` (a metadata-only LIST at the cache's RV, Exact), the cache is
//! relisted, and a client that lists and watches through the proxy ends up at the truth.

use crate::common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use kube_watchcache::app;
use kube_watchcache::resource::Rv;
use kube_watchcache_sim::{Sim, SimOptions};
use parking_lot::Mutex;
use serde_json::{json, Value};

const CMS: &str = "/api/v1/namespaces/w/configmaps";

async fn metric(client: &HttpClient, addr: std::net::SocketAddr, series: &str) -> u64 {
    let r = send(client, http::Method::GET, &format!("http://{addr}/watchcache/metrics"), None, &[]).await;
    let text = String::from_utf8_lossy(&r.body).into_owned();
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

fn names_rvs(list: &Value) -> BTreeMap<String, u64> {
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| (o["metadata"]["name"].as_str().unwrap().into(), rv_of(o)))
        .collect()
}

/// A client as client-go's reflector: list, watch from the list RV, re-watch from its last RV
/// when the stream ends, relist on 410. Its state is shared for the test to compare.
async fn informer(base: String, state: Arc<Mutex<BTreeMap<String, u64>>>) {
    let client = client();
    'list: loop {
        let r = send(&client, http::Method::GET, &format!("{base}{CMS}"), None, &[]).await;
        if r.status != 200 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        let list = r.json();
        *state.lock() = names_rvs(&list);
        let mut rv: u64 = list["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap();
        loop {
            let mut w = open_watch(&client, &format!("{base}{CMS}?watch=1&resourceVersion={rv}")).await;
            if w.status != 200 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue 'list;
            }
            while let Some(e) = w.next(Duration::from_secs(30)).await {
                let name = e["object"]["metadata"]["name"].as_str().unwrap_or_default().to_owned();
                match e["type"].as_str().unwrap_or_default() {
                    "ADDED" | "MODIFIED" => {
                        rv = rv_of(&e["object"]);
                        state.lock().insert(name, rv);
                    }
                    "DELETED" => {
                        rv = rv_of(&e["object"]);
                        state.lock().remove(&name);
                    }
                    "ERROR" => continue 'list,
                    _ => {}
                }
            }
        }
    }
}

#[tokio::test]
async fn a_dropped_event_is_caught_within_one_period_and_clients_end_at_the_truth() {
    let period = Duration::from_secs(2);
    let (sim, proxy) = proxied(period).await;
    let (client, reader) = (client(), proxy.readers()[0].clone());
    let base = format!("http://{}", proxy.addr);
    let state = Arc::new(Mutex::new(BTreeMap::new()));
    let task = tokio::spawn(informer(base.clone(), state.clone()));

    // One change is lost on its way to the proxy; the next one arrives.
    sim.sim.drop_watch_events(1);
    let lost = rv_of(&sim.sim.update("configmaps", "w", cm("a", "lost")).expect("update"));
    let seen = rv_of(&sim.sim.update("configmaps", "w", cm("b", "seen")).expect("update"));
    let dropped_at = Instant::now();
    reader.wait_for(Rv(seen), Duration::from_secs(5)).await.expect("the next event arrived");
    assert!(reader.get("w", "a").is_some_and(|o| o.header.rv.0 < lost), "the fault dropped the event");

    let series = "watchcache_consistency_checks_total{resource=\"configmaps\",result=\"inconsistent\"}";
    while metric(&client, proxy.addr, series).await == 0 {
        // One period (+ its jitter of a tenth) and the time of a check in a debug build.
        assert!(
            dropped_at.elapsed() < period.mul_f64(1.1) + Duration::from_secs(3),
            "not caught in one period"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        metric(&client, proxy.addr, "watchcache_consistency_differences{resource=\"configmaps\"}").await,
        1,
        "one key differs"
    );
    // The cache is relisted: it has the lost change, and the consistent checks go on.
    let deadline = Instant::now() + Duration::from_secs(10);
    while reader.get("w", "a").is_none_or(|o| o.header.rv.0 != lost) {
        assert!(Instant::now() < deadline, "relisted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        metric(
            &client,
            proxy.addr,
            "watchcache_reflector_errors_total{reason=\"inconsistent\",resource=\"configmaps\"}"
        )
        .await
            >= 1
    );
    // Nothing was written upstream since the lost change: the list is at the RV the wrong
    // cache had reached, which its clients may hold, so the cache waits for the upstream to
    // move past it (unready: its reads forwarded or 429) rather than answer there.
    assert!(!reader.progress().ready, "not served at the RV the wrong cache was at");
    let after = rv_of(&sim.sim.update("configmaps", "w", cm("c", "after")).expect("update"));
    reader.wait_for(Rv(after), Duration::from_secs(5)).await.expect("moved past it");
    assert!(reader.progress().ready);
    // The client: its watch ended at the relist, its re-watch got 410, it listed again.
    let truth = names_rvs(
        &send(&client, http::Method::GET, &format!("http://{}{CMS}", sim.addr), None, &[]).await.json(),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while *state.lock() != truth {
        assert!(Instant::now() < deadline, "client at the truth: {:?} vs {truth:?}", state.lock());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let consistent = "watchcache_consistency_checks_total{resource=\"configmaps\",result=\"consistent\"}";
    let deadline = Instant::now() + period * 3;
    while metric(&client, proxy.addr, consistent).await == 0 {
        assert!(Instant::now() < deadline, "a later check finds the cache consistent");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    task.abort();
    proxy.shutdown().await;
}

/// The check's "R was compacted upstream: once more at the cache's current RV" branch. The
/// proxy's upstream watch is held (fault relay), a change is made and the upstream compacted
/// past the cache's RV R0; the check's first LIST (Exact at R0, slowed by a second relay) gets
/// 410. Meanwhile the watch is released and the cache reaches R1: the retry asks R1 and finds
/// the cache consistent there. A second compaction with the watch held again makes both tries
/// 410: after one retry the cache is compared with the upstream's current state (consistent,
/// inconsistent or skipped, as far as that state tells), never loops.
/// A round says which checks the upstream failed (here a 500 to the configmaps' LIST): only
/// those are checked again after the backoff, the others wait for the next period (a review:
/// one failure re-checked every cache, again and again, at an upstream shedding load).
#[tokio::test]
async fn a_round_names_the_checks_that_failed() {
    use common::fault::Fault;
    use kube_watchcache::consistency::round;
    use kube_watchcache::metrics::Metrics;
    use kube_watchcache::upstream::{Upstream, UpstreamOptions};

    let sim = Sim::start(SimOptions { listen: "127.0.0.1:0".parse().unwrap(), ..Default::default() })
        .await
        .expect("sim starts");
    let mut args = serve_args(sim.addr, &["configmaps", "pods"]);
    args.consistency_check_period = Duration::ZERO;
    let proxy = app::start(&args).await.expect("proxy starts");
    assert!(proxy.wait_ready(Duration::from_secs(10)).await);
    let relay = Fault::start(sim.addr).await;
    let upstream = Upstream::new(&UpstreamOptions {
        upstream: Some(format!("http://{}", relay.addr)),
        ..Default::default()
    })
    .expect("upstream");
    let metrics = Metrics::new();
    relay.fail_next_lists(1);
    assert_eq!(round(&upstream, &proxy.readers(), &metrics).await, ["configmaps"]);
    assert!(round(&upstream, &proxy.readers(), &metrics).await.is_empty());
}

#[tokio::test]
async fn a_check_whose_rv_was_compacted_retries_once_at_the_current_rv() {
    use common::fault::Fault;
    use kube_watchcache::consistency::{check, Outcome};
    use kube_watchcache::upstream::{Upstream, UpstreamOptions};

    let sim =
        Sim::start(SimOptions { listen: "127.0.0.1:0".parse().unwrap(), objects: 0, ..Default::default() })
            .await
            .expect("sim starts");
    let _ = sim.sim.create("namespaces", "", json!({"metadata":{"name":"w"}}));
    let cm = |name: &str, v: &str| json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":name,"namespace":"w"},"data":{"k":v}});
    for n in ["a", "b"] {
        sim.sim.create("configmaps", "w", cm(n, "0")).expect("create");
    }
    let watch_relay = Fault::start(sim.addr).await;
    let mut args = serve_args(watch_relay.addr, &["configmaps"]);
    args.consistency_check_period = Duration::ZERO;
    let proxy = app::start(&args).await.expect("proxy starts");
    assert!(proxy.wait_ready(Duration::from_secs(10)).await);
    let reader = proxy.readers()[0].clone();
    let r0 = reader.snapshot().rv;
    let check_relay = Fault::start(sim.addr).await;
    let upstream = Upstream::new(&UpstreamOptions {
        upstream: Some(format!("http://{}", check_relay.addr)),
        ..Default::default()
    })
    .expect("upstream");
    let exact_lists = |sim: &Sim| -> Vec<String> {
        sim.requests(|r| r.query.contains("resourceVersionMatch=Exact"))
            .into_iter()
            .filter_map(|r| {
                r.query.split('&').find_map(|kv| kv.strip_prefix("resourceVersion=").map(str::to_owned))
            })
            .collect()
    };

    // The change the cache has not seen yet, and the upstream compacted past R0.
    watch_relay.stall_watches(true);
    let r1 = rv_of(&sim.sim.update("configmaps", "w", cm("a", "1")).expect("update"));
    sim.sim.compact();
    check_relay.set_delay(Duration::from_millis(500));
    let task = {
        let (upstream, reader) = (upstream.clone(), reader.clone());
        tokio::spawn(async move { check(&upstream, &reader).await })
    };
    // The first LIST has left (its snapshot is at R0): now the cache may move on.
    while check_relay.st.heads.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    watch_relay.stall_watches(false);
    reader.wait_for(Rv(r1), Duration::from_secs(5)).await.expect("the cache reached R1");
    match task.await.expect("check") {
        Outcome::Consistent { rv, keys } => assert_eq!((rv, keys), (Rv(r1), 2)),
        other => panic!("expected consistent at {r1}, got {other:?}"),
    }
    assert_eq!(exact_lists(&sim.sim), [r0.0.to_string(), r1.to_string()], "first R0 (410), then R1");

    // Both tries compacted: one retry, then the upstream's current state (at R2) compared with
    // the cache's at R1; b changed after R1 (its event held back), which the cache may still
    // get: nothing can be told, skipped (not failed: no backoff for every resource).
    check_relay.set_delay(Duration::ZERO);
    watch_relay.stall_watches(true);
    let r2 = rv_of(&sim.sim.update("configmaps", "w", cm("b", "2")).expect("update"));
    sim.sim.compact();
    assert_eq!(check(&upstream, &reader).await, Outcome::Skipped);
    let asked = exact_lists(&sim.sim);
    assert_eq!(asked[2..], [r1.to_string(), r1.to_string(), r2.to_string()], "two tries at R1, then R2");
    watch_relay.stall_watches(false);
    reader.wait_for(Rv(r2), Duration::from_secs(5)).await.expect("the cache reached R2");

    // A quiet resource: other resources move the revision and the upstream compacts past the
    // cache's RV, which no configmap event moves. Compared with the upstream's current state:
    // the same keys, which prove nothing (an object the cache missed may have been deleted
    // since): skipped, not failed.
    // (The proxy's watch held: nothing, not even a bookmark, moves the cache's RV.)
    watch_relay.stall_watches(true);
    let _ = sim.sim.create("namespaces", "", json!({"metadata":{"name":"x"}}));
    sim.sim.compact();
    assert_eq!(check(&upstream, &reader).await, Outcome::Skipped);
    watch_relay.stall_watches(false);

    watch_relay.stall_watches(false);
    proxy.shutdown().await;
}

/// A proxy in front of the sim whose etcd is then restored from a backup without
/// `--bump-revision` (`SimHandle::restore`): the upstream comes back at an RV below the cache's
/// and issues the RVs after it again, for other changes. The proxy's upstream watch from its
/// RV is accepted and waits for an RV the upstream has not reached (as the apiserver's does),
/// so the cache would stand still, serving the gone state as current.
struct Restored {
    sim: kube_watchcache_sim::SimHandle,
    proxy: app::Running,
    reader: kube_watchcache::cache::Reader,
    client: HttpClient,
    state: Arc<Mutex<BTreeMap<String, u64>>>,
    informer: tokio::task::JoinHandle<()>,
    /// The RV of the last change the restore lost (the cache had reached it).
    gone: u64,
    /// The first change after the restore (an RV the gone history used).
    first: u64,
}

fn cm(name: &str, v: &str) -> Value {
    json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":name,"namespace":"w"},"data":{"k":v}})
}

/// The sim with ConfigMaps a, b and c in namespace w, and a proxy in front of it, ready,
/// checking itself every `period`.
async fn proxied(period: Duration) -> (kube_watchcache_sim::SimHandle, app::Running) {
    let sim =
        Sim::start(SimOptions { listen: "127.0.0.1:0".parse().unwrap(), objects: 0, ..Default::default() })
            .await
            .expect("sim starts");
    let _ = sim.sim.create("namespaces", "", json!({"metadata":{"name":"w"}}));
    for n in ["a", "b", "c"] {
        sim.sim.create("configmaps", "w", cm(n, "0")).expect("create");
    }
    let mut args = serve_args(sim.addr, &["configmaps"]);
    args.consistency_check_period = period;
    let proxy = app::start(&args).await.expect("proxy starts");
    assert!(proxy.wait_ready(Duration::from_secs(10)).await);
    (sim, proxy)
}

async fn restored(period: Duration) -> Restored {
    let (sim, proxy) = proxied(period).await;
    let (client, reader) = (client(), proxy.readers()[0].clone());
    let state = Arc::new(Mutex::new(BTreeMap::new()));
    let informer = tokio::spawn(informer(format!("http://{}", proxy.addr), state.clone()));

    // The backup, then changes it does not hold, seen by the cache and the client.
    let backup = sim.sim.current_rv();
    for i in 0..5 {
        sim.sim.update("configmaps", "w", cm("a", &format!("lost-{i}"))).expect("update");
    }
    sim.sim.create("configmaps", "w", cm("d", "lost")).expect("create");
    let gone = rv_of(&sim.sim.delete("configmaps", "w", "b").expect("delete"));
    reader.wait_for(Rv(gone), Duration::from_secs(5)).await.expect("the cache saw them");
    let deadline = Instant::now() + Duration::from_secs(10);
    while state.lock().len() != 3 || state.lock().contains_key("b") {
        assert!(Instant::now() < deadline, "the client saw them: {:?}", state.lock());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let sim = sim.restore(backup, Duration::from_millis(100)).await.expect("restored");
    // The new history: fewer changes than were lost, so the upstream stays below the cache.
    let first = rv_of(&sim.sim.update("configmaps", "w", cm("c", "new")).expect("update"));
    assert_eq!(first, backup.0 + 1, "an RV the gone history used");
    Restored { sim, proxy, reader, client, state, informer, gone, first }
}

impl Restored {
    /// Until the cache holds the first change after the restore and the backup's state.
    async fn followed(&self, within: Duration) {
        let deadline = Instant::now() + within;
        while self.reader.get("w", "c").is_none_or(|o| o.header.rv.0 != self.first) {
            assert!(Instant::now() < deadline, "the cache follows the restored upstream");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            self.reader.get("w", "d").is_none() && self.reader.get("w", "b").is_some(),
            "the state of the backup"
        );
    }

    /// The client ends at the upstream's state (its re-watch from an RV of the gone history
    /// answered 410, it relisted).
    async fn client_at_the_truth(&self) {
        let url = format!("http://{}{CMS}", self.sim.addr);
        let truth = names_rvs(&send(&self.client, http::Method::GET, &url, None, &[]).await.json());
        let deadline = Instant::now() + Duration::from_secs(20);
        while *self.state.lock() != truth {
            assert!(Instant::now() < deadline, "client at the truth: {:?} vs {truth:?}", self.state.lock());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn end(self) {
        self.informer.abort();
        self.proxy.shutdown().await;
        self.sim.shutdown().await;
    }
}

/// The check sees the upstream behind (`upstream_behind`), the cache is relisted at the
/// upstream's RV, the changes after it reach the cache, a watch from an RV of the gone history
/// the upstream has not issued again is 410 and one it has issued again is served, and a
/// client that lists and watches through the proxy ends at the truth.
#[tokio::test]
async fn an_upstream_restored_without_a_revision_bump_is_caught_and_followed() {
    let period = Duration::from_secs(1);
    let t = restored(period).await;
    t.followed(period.mul_f64(1.1) + Duration::from_secs(9)).await;
    // Caught by the check or, first, by the reflector's probe before its re-watch (the restore
    // restarted the upstream); the check's own finding is `a_check_finds_an_upstream_behind_the_cache`.
    let by_check = "watchcache_consistency_checks_total{resource=\"configmaps\",result=\"upstream_behind\"}";
    let by_reflector =
        "watchcache_reflector_errors_total{reason=\"upstream_behind\",resource=\"configmaps\"}";
    let caught =
        metric(&t.client, t.proxy.addr, by_check).await + metric(&t.client, t.proxy.addr, by_reflector).await;
    assert!(caught >= 1, "caught");
    let second = rv_of(&t.sim.sim.update("configmaps", "w", cm("a", "new")).expect("update"));
    assert!(second < t.gone, "still below the RVs the gone history reached");
    t.reader.wait_for(Rv(second), Duration::from_secs(5)).await.expect("the next change is applied");
    t.client_at_the_truth().await;

    // Another resource moves the upstream's revision, not this cache's: a watch from that RV
    // (one a client may get from a forwarded LIST) is of the new history and is served.
    let other = rv_of(&t.sim.sim.create("namespaces", "", json!({"metadata":{"name":"x"}})).expect("create"));
    assert!(other < t.gone && other > t.reader.progress().rv.0);
    let base = format!("http://{}", t.proxy.addr);
    let mut w = open_watch(&t.client, &format!("{base}{CMS}?watch=1&resourceVersion={other}")).await;
    assert_eq!(w.status, 200);
    let third = rv_of(&t.sim.sim.update("configmaps", "w", cm("c", "third")).expect("update"));
    let e = w.next(Duration::from_secs(5)).await.expect("an event");
    assert_eq!((e["type"].as_str(), rv_of(&e["object"])), (Some("MODIFIED"), third), "{e}");
    // One the upstream has not issued again: 410, naming the new floor.
    let ahead = t.gone;
    let mut w = open_watch(&t.client, &format!("{base}{CMS}?watch=1&resourceVersion={ahead}")).await;
    let e = w.next(Duration::from_secs(5)).await.expect("an event");
    assert_eq!(e["type"], "ERROR", "{e}");
    assert_eq!(e["object"]["code"], 410, "{e}");
    t.end().await;
}

/// With the periodic check off, a Most Recent LIST's probe (a consistent read sent after the
/// cache's RV was read) finds the upstream below the cache and has it relisted; the LIST is
/// forwarded meanwhile, never proven fresh by an RV below the cache's.
#[tokio::test]
async fn an_upstream_restored_without_a_revision_bump_is_caught_by_a_consistent_read() {
    let t = restored(Duration::ZERO).await;
    let url = format!("http://{}{CMS}", t.proxy.addr);
    let r = send(&t.client, http::Method::GET, &url, None, &[]).await;
    assert_eq!(r.status, 200);
    let listed: u64 = r.json()["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap();
    assert!(listed < t.gone, "the upstream's answer, not the gone state's RV: {listed}");
    t.followed(Duration::from_secs(10)).await;
    t.client_at_the_truth().await;
    t.end().await;
}

/// With the periodic check off and no Most Recent read: the restore restarted the apiserver,
/// the proxy's upstream watch failed, and before re-watching the reflector asked the upstream
/// its RV (below the cache's): the cache follows the new history with nothing else asking.
#[tokio::test]
async fn an_upstream_restored_without_a_revision_bump_is_caught_when_the_watch_reconnects() {
    let t = restored(Duration::ZERO).await;
    t.followed(Duration::from_secs(10)).await;
    let errors = "watchcache_reflector_errors_total{reason=\"upstream_behind\",resource=\"configmaps\"}";
    assert_eq!(metric(&t.client, t.proxy.addr, errors).await, 1);
    t.client_at_the_truth().await;
    t.end().await;
}

/// The check itself, on a cache whose RV the upstream has not reached (its storage went back):
/// `Behind`, with both RVs, before any comparison.
#[tokio::test]
async fn a_check_finds_an_upstream_behind_the_cache() {
    use kube_watchcache::cache::{new, CacheOptions};
    use kube_watchcache::consistency::{check, Outcome};
    use kube_watchcache::resource::ResourceKind;
    use kube_watchcache::upstream::{Upstream, UpstreamOptions};

    let (sim, _proxy) = proxied(Duration::ZERO).await;
    let upstream_rv = sim.sim.current_rv();
    let kind = ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true);
    let (mut w, reader) = new(kind, CacheOptions::default());
    let ahead = Rv(upstream_rv.0 + 1000);
    w.replace(Vec::new(), ahead);
    let upstream = Upstream::new(&UpstreamOptions {
        upstream: Some(format!("http://{}", sim.addr)),
        ..Default::default()
    })
    .expect("upstream");
    match check(&upstream, &reader).await {
        Outcome::Behind { cache, upstream } => assert_eq!((cache, upstream), (ahead, upstream_rv)),
        other => panic!("expected the upstream behind, got {other:?}"),
    }
    assert_eq!(Outcome::Behind { cache: ahead, upstream: upstream_rv }.as_str(), "upstream_behind");
}
