//! `--cache-memory-limit` (issue 35 §3) against the sim: a history that outgrows the limit is
//! shortened (older RVs answer 410 from the cache, recent ones still watch); a cache that
//! outgrows it is dropped while a client watches it: the watch ends after events that are
//! exactly a prefix of the sim's, the re-watch from its last RV is forwarded and brings the
//! rest, every read is answered (forwarded, equal to the sim's truth), the proxy stays ready and
//! says what it dropped in its metrics and `/readyz?verbose`; a resource larger than the limit
//! at start is never held whole (its list is refused page by page, then it is dropped); a
//! dropped cache comes back once the others have shrunk enough; a relist after an upstream cut
//! that passes the limit drops the cache without a client losing an event (its whole answer read
//! no further than the budget's room). Run by `cargo test --test reliability memory_limit::`.

use crate::common;

use std::time::Duration;

use common::{client, eventually, open_watch, send, serve_args, HttpClient};
use http::Method;
use kube_watchcache::app::{self, Running};
use kube_watchcache::memory::limit::Limit;
use kube_watchcache::resource::ResourceKind;
use kube_watchcache::upstream::ListPage;
use kube_watchcache_sim::{Sim, SimHandle, SimOptions};
use serde_json::{json, Value};

const NS: &str = "t";

async fn sim() -> SimHandle {
    let sim =
        Sim::start(SimOptions { listen: "127.0.0.1:0".parse().unwrap(), objects: 0, ..Default::default() })
            .await
            .expect("sim");
    sim.sim
        .create("namespaces", "", json!({"apiVersion":"v1","kind":"Namespace","metadata":{"name":NS}}))
        .expect("namespace");
    sim
}

async fn proxy(sim: &SimHandle, limit: u64, max_events: usize) -> Running {
    let mut args = serve_args(sim.addr, &["configmaps", "pods"]);
    args.cache_memory_limit = Limit::Bytes(limit);
    args.cache_memory_check_period = Duration::from_millis(100);
    args.history_max_events = max_events;
    let p = app::start(&args).await.expect("proxy starts");
    assert!(p.wait_ready(Duration::from_secs(10)).await, "proxy synced");
    p
}

fn cm(name: &str, data: usize) -> Value {
    json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":name,"namespace":NS},"data":{"k":"x".repeat(data)}})
}

fn pod(name: &str, data: usize) -> Value {
    json!({"apiVersion":"v1","kind":"Pod","metadata":{"name":name,"namespace":NS,"annotations":{"a":"y".repeat(data)}},"spec":{"nodeName":"n1","containers":[{"name":"c","image":"i"}]}})
}

/// What a cache of pods counts for every pod the sim holds in `NS` (each item parsed as the
/// reflector parses it).
async fn whole_pods_bytes(c: &HttpClient, sim: &SimHandle) -> u64 {
    let (code, body) =
        get(c, &format!("http://{}", sim.addr), &format!("/api/v1/namespaces/{NS}/pods")).await;
    assert_eq!(code, 200);
    let page = ListPage::parse(&bytes::Bytes::from(body)).expect("a list");
    let kind = ResourceKind::new("", "v1", "pods", "Pod", true, true);
    let (writer, _reader) = kube_watchcache::cache::new(kind, Default::default());
    page.items.into_iter().map(|raw| writer.parse(raw).expect("an object").kept_bytes() as u64).sum()
}

async fn get(c: &HttpClient, base: &str, path: &str) -> (u16, Vec<u8>) {
    let r = send(c, Method::GET, &format!("{base}{path}"), None, &[]).await;
    (r.status.as_u16(), r.body.to_vec())
}

/// The value of one series in the proxy's metrics (0 when absent).
async fn metric(c: &HttpClient, p: &Running, series: &str) -> f64 {
    let (_, body) = get(c, &format!("http://{}", p.addr), "/watchcache/metrics").await;
    let text = String::from_utf8(body).unwrap();
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok()).unwrap_or(0.0)
}

/// (name, resourceVersion) of a list's items.
fn items(body: &[u8]) -> Vec<(String, String)> {
    let v: Value = serde_json::from_slice(body).unwrap();
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            let m = &o["metadata"];
            (m["name"].as_str().unwrap().to_owned(), m["resourceVersion"].as_str().unwrap().to_owned())
        })
        .collect()
}

/// (type, name, resourceVersion) of up to `max` events of a watch, until it ends or is quiet.
async fn events(c: &HttpClient, url: &str, max: usize) -> (Vec<(String, String, String)>, bool) {
    let mut w = open_watch(c, url).await;
    assert_eq!(w.status, 200, "{url}");
    let mut out = Vec::new();
    while out.len() < max {
        match w.next(Duration::from_secs(3)).await {
            Some(e) => out.push((
                e["type"].as_str().unwrap().to_owned(),
                e["object"]["metadata"]["name"].as_str().unwrap_or("").to_owned(),
                e["object"]["metadata"]["resourceVersion"].as_str().unwrap_or("").to_owned(),
            )),
            None => break,
        }
    }
    let ended = w.ends_within(Duration::from_millis(200)).await;
    (out, ended)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_history_past_the_limit_is_shortened_and_older_rvs_answer_410_from_the_cache() {
    let sim = sim().await;
    for i in 0..20 {
        sim.sim.create("configmaps", NS, cm(&format!("c{i}"), 100)).unwrap();
    }
    let p = proxy(&sim, 1_000_000, 10_000).await;
    let (c, base) = (client(), format!("http://{}", p.addr));
    // 400 updates of 2 KB: a history of about 2 MB (each event's frame and superseded version).
    let before = sim.sim.current_rv().0;
    let mut last = sim.sim.update("configmaps", NS, cm("c0", 2000)).unwrap();
    for i in 1..400 {
        last = sim.sim.update("configmaps", NS, cm("c0", 2000 + i)).unwrap();
    }
    let last_rv = last["metadata"]["resourceVersion"].as_str().unwrap().to_owned();
    let cms = p.readers().into_iter().find(|r| r.kind().resource == "configmaps").unwrap();
    cms.wait_for(kube_watchcache::resource::Rv(last_rv.parse().unwrap()), Duration::from_secs(10))
        .await
        .unwrap();
    eventually(10, "the history shortened under the limit", || async {
        let u = cms.memory();
        u.history_cap < 400 && u.total() <= 1_000_000
    })
    .await;
    let u = cms.memory();
    assert!(u.history_cap >= 100, "never below the floor: {u:?}");
    assert!(
        metric(&c, &p, r#"watchcache_cache_memory_actions_total{action="history_shortened"}"#).await >= 1.0
    );
    assert_eq!(metric(&c, &p, r#"watchcache_cache_memory_actions_total{action="dropped"}"#).await, 0.0);

    // A watch from before the first update is now too old: the cache answers 410, the sim is
    // not asked.
    let path = format!("/api/v1/namespaces/{NS}/configmaps?watch=true&resourceVersion={before}");
    let asked = sim.sim.request_count(|r| r.path == format!("/api/v1/namespaces/{NS}/configmaps"));
    let mut w = open_watch(&c, &format!("{base}{path}")).await;
    let e = w.next(Duration::from_secs(3)).await.expect("an event");
    assert_eq!(e["type"], "ERROR", "{e}");
    assert_eq!(e["object"]["code"], 410, "{e}");
    assert!(e["object"]["message"].as_str().unwrap().starts_with("too old resource version"), "{e}");
    assert_eq!(sim.sim.request_count(|r| r.path == format!("/api/v1/namespaces/{NS}/configmaps")), asked);
    // From the newest RV, the next change arrives, from the cache.
    let path = format!("/api/v1/namespaces/{NS}/configmaps?watch=true&resourceVersion={last_rv}");
    let mut w = open_watch(&c, &format!("{base}{path}")).await;
    let next = sim.sim.update("configmaps", NS, cm("c1", 10)).unwrap();
    let e = w.next(Duration::from_secs(3)).await.expect("the next event");
    assert_eq!(e["object"]["metadata"]["resourceVersion"], next["metadata"]["resourceVersion"]);
    assert_eq!(sim.sim.request_count(|r| r.path == format!("/api/v1/namespaces/{NS}/configmaps")), asked);
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_past_the_limit_is_dropped_its_watch_ends_and_every_read_is_answered() {
    let sim = sim().await;
    for i in 0..5 {
        sim.sim.create("configmaps", NS, cm(&format!("small{i}"), 10)).unwrap();
        sim.sim.create("pods", NS, pod(&format!("p{i}"), 10)).unwrap();
    }
    let p = proxy(&sim, 300_000, 10_000).await;
    let (c, base) = (client(), format!("http://{}", p.addr));
    let from = sim.sim.current_rv().0;
    // A client watches configmaps (from the cache) while 300 of 3 KB (~1 MB) arrive.
    let watch_path = format!("/api/v1/namespaces/{NS}/configmaps?watch=true&resourceVersion={from}");
    let watching = {
        let (c, url) = (c.clone(), format!("{base}{watch_path}"));
        tokio::spawn(async move { events(&c, &url, usize::MAX).await })
    };
    let dropped = p.readers().into_iter().find(|r| r.kind().resource == "configmaps").unwrap();
    // Served from the cache: the watch is registered there before the data arrives.
    eventually(5, "the watch open in the cache", || async { dropped.watcher_stats().live == 1 }).await;
    for i in 0..300 {
        sim.sim.create("configmaps", NS, cm(&format!("big{i}"), 3000)).unwrap();
    }
    eventually(10, "configmaps dropped", || async {
        metric(&c, &p, "watchcache_cache_memory_dropped_resources").await == 1.0
    })
    .await;
    // Its objects and history are let go, even though this test still holds its reader; the
    // proxy no longer lists it among its caches.
    assert!(p.readers().iter().all(|r| r.kind().resource != "configmaps"));
    eventually(5, "the dropped cache emptied", || async {
        dropped.is_empty() && dropped.memory().total() == 0
    })
    .await;

    // The watch ended after events that are exactly the start of the sim's own; the re-watch
    // from its last RV (forwarded now) brings the rest: nothing lost, nothing repeated.
    let (seen, ended) = watching.await.unwrap();
    let truth = format!("http://{}{watch_path}", sim.addr);
    let (all, _) = events(&c, &truth, 300).await;
    assert_eq!(all.len(), 300);
    assert!(ended, "the watch of the dropped cache ended");
    assert_eq!(seen[..], all[..seen.len()], "a prefix of the sim's events");
    let resume_rv = seen.last().map_or(from.to_string(), |e| e.2.clone());
    let resume = format!("{base}/api/v1/namespaces/{NS}/configmaps?watch=true&resourceVersion={resume_rv}");
    let (rest, _) = events(&c, &resume, 300 - seen.len()).await;
    assert_eq!([&seen[..], &rest[..]].concat(), all, "the re-watch brings exactly the rest");

    // Every read answered: configmaps forwarded (the sim's answer), pods from the cache.
    for path in [
        format!("/api/v1/namespaces/{NS}/configmaps?resourceVersion=0"),
        "/api/v1/configmaps?limit=50".to_string(),
        format!("/api/v1/namespaces/{NS}/configmaps/big7"),
    ] {
        let (code, body) = get(&c, &base, &path).await;
        let (sim_code, sim_body) = get(&c, &format!("http://{}", sim.addr), &path).await;
        assert_eq!((code, sim_code), (200, 200), "{path}");
        let (a, b): (Value, Value) =
            (serde_json::from_slice(&body).unwrap(), serde_json::from_slice(&sim_body).unwrap());
        assert_eq!(a, b, "{path}");
    }
    let pods = format!("/api/v1/namespaces/{NS}/pods?resourceVersion=0");
    let asked = sim.sim.request_count(|r| r.path == format!("/api/v1/namespaces/{NS}/pods"));
    let (code, body) = get(&c, &base, &pods).await;
    assert_eq!(code, 200);
    assert_eq!(
        sim.sim.request_count(|r| r.path == format!("/api/v1/namespaces/{NS}/pods")),
        asked,
        "pods stay cached"
    );
    let (_, sim_body) = get(&c, &format!("http://{}", sim.addr), &pods).await;
    assert_eq!(items(&body), items(&sim_body));

    // Reported: metrics (forward reason, action), readyz?verbose (still ready), pods untouched.
    assert!(metric(&c, &p, r#"watchcache_forwarded_requests_total{reason="memory_limit"}"#).await >= 4.0);
    assert!(metric(&c, &p, r#"watchcache_cache_memory_actions_total{action="dropped"}"#).await >= 1.0);
    assert_eq!(metric(&c, &p, "watchcache_cache_memory_limit_bytes").await, 300_000.0);
    let (code, body) = get(&c, &base, "/readyz?verbose").await;
    let text = String::from_utf8(body).unwrap();
    assert_eq!(code, 200, "{text}");
    assert!(text.contains("[+]dropped/memory-limit/configmaps ok\n"), "{text}");
    assert!(text.contains("[+]cache/pods ok\n") && !text.contains("dropped/memory-limit/pods"), "{text}");
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_cache_comes_back_once_the_others_have_shrunk() {
    let sim = sim().await;
    for i in 0..100 {
        sim.sim.create("pods", NS, pod(&format!("p{i}"), 3700)).unwrap();
        sim.sim.create("configmaps", NS, cm(&format!("c{i}"), 4500)).unwrap();
    }
    // What each cache keeps, measured by a proxy with room to spare.
    let roomy = proxy(&sim, 1 << 40, 5).await;
    let size =
        |res: &str| roomy.readers().into_iter().find(|r| r.kind().resource == res).unwrap().memory().total();
    let (pods, cms) = (size("pods"), size("configmaps"));
    roomy.shutdown().await;
    assert!(pods > cms && cms > pods / 2, "pods {pods}, configmaps {cms}");
    // A limit both exceed together: pods (the larger) go, configmaps stay.
    // Both lists arrive at once: whichever passes the limit first is refused, then pods
    // (the larger) are dropped and configmaps list again.
    let limit = (pods + cms) * 95 / 100;
    let mut args = serve_args(sim.addr, &["configmaps", "pods"]);
    args.cache_memory_limit = Limit::Bytes(limit);
    args.cache_memory_check_period = Duration::from_millis(100);
    args.history_max_events = 5;
    let p = app::start(&args).await.expect("proxy starts");
    let c = client();
    eventually(10, "pods dropped", || async {
        metric(&c, &p, "watchcache_cache_memory_dropped_resources").await == 1.0
    })
    .await;
    let cms_cache = p.readers().into_iter().find(|r| r.kind().resource == "configmaps").unwrap();
    eventually(10, "configmaps synced", || async { cms_cache.progress().ready }).await;
    let (code, body) = get(&c, &format!("http://{}", p.addr), "/readyz?verbose").await;
    assert_eq!(code, 200);
    assert!(String::from_utf8_lossy(&body).contains("[+]dropped/memory-limit/pods ok"));
    // Configmaps shrink to a twentieth (a history of 5 events): pods fit under 70 % again.
    for i in 5..100 {
        sim.sim.delete("configmaps", NS, &format!("c{i}")).unwrap();
    }
    eventually(15, "pods cached again", || async {
        metric(&c, &p, "watchcache_cache_memory_dropped_resources").await == 0.0
            && metric(&c, &p, r#"watchcache_cache_memory_actions_total{action="readmitted"}"#).await >= 1.0
    })
    .await;
    let base = format!("http://{}", p.addr);
    eventually(10, "pods served from the cache", || async {
        let (_, body) = get(&c, &base, "/readyz?verbose").await;
        let text = String::from_utf8(body).unwrap();
        text.contains("[+]cache/pods ok") && !text.contains("dropped/memory-limit")
    })
    .await;
    let path = format!("/api/v1/namespaces/{NS}/pods?resourceVersion=0");
    let asked = sim.sim.request_count(|r| r.path == format!("/api/v1/namespaces/{NS}/pods"));
    let (code, body) = get(&c, &base, &path).await;
    assert_eq!(code, 200);
    assert_eq!(sim.sim.request_count(|r| r.path == format!("/api/v1/namespaces/{NS}/pods")), asked);
    let (_, sim_body) = get(&c, &format!("http://{}", sim.addr), &path).await;
    assert_eq!(items(&body), items(&sim_body));
    assert_eq!(items(&body).len(), 100);
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_larger_than_the_limit_at_start_is_refused_while_listing_then_forwarded() {
    let sim = sim().await;
    for i in 0..1200 {
        sim.sim.create("pods", NS, pod(&format!("p{i}"), 1000)).unwrap();
    }
    for i in 0..10 {
        sim.sim.create("configmaps", NS, cm(&format!("c{i}"), 100)).unwrap();
    }
    // ~2.5 MB of pods in three pages of 500 against 1 MB: the second page is refused.
    let mut args = serve_args(sim.addr, &["configmaps", "pods"]);
    args.cache_memory_limit = Limit::Bytes(1_000_000);
    args.cache_memory_check_period = Duration::from_millis(100);
    let p = app::start(&args).await.expect("proxy starts");
    let (c, base) = (client(), format!("http://{}", p.addr));
    let pods = p.readers().into_iter().find(|r| r.kind().resource == "pods").unwrap();
    eventually(10, "ready, pods dropped", || async {
        let (code, body) = get(&c, &base, "/readyz?verbose").await;
        code == 200 && String::from_utf8_lossy(&body).contains("[+]dropped/memory-limit/pods ok")
    })
    .await;
    // The refused list counts at what the whole list would bring (its first pages scaled by the
    // upstream's remainingItemCount), not at the pages that came before the refusal: the plan
    // then weighs the resource at its size (what the cache would count for all 1 200 pods).
    let whole = whole_pods_bytes(&c, &sim).await;
    let refused = pods.refused_list();
    assert!(refused.abs_diff(whole) < whole / 20, "counted at {refused}, the whole list {whole}");
    assert!(pods.is_empty(), "never installed");
    assert!(p.readers().iter().all(|r| r.kind().resource != "pods"), "no longer among the caches");
    for path in [
        format!("/api/v1/namespaces/{NS}/pods?resourceVersion=0"),
        format!("/api/v1/namespaces/{NS}/configmaps?resourceVersion=0"),
    ] {
        let (code, body) = get(&c, &base, &path).await;
        let (_, sim_body) = get(&c, &format!("http://{}", sim.addr), &path).await;
        assert_eq!(code, 200, "{path}");
        assert_eq!(items(&body), items(&sim_body), "{path}");
    }
    assert_eq!(metric(&c, &p, r#"watchcache_forwarded_requests_total{reason="memory_limit"}"#).await, 1.0);
    p.shutdown().await;
}

/// Two resources that fit the limit alone but not together, listed at once: one list is
/// refused, the larger cache is dropped, and the other lists again and is served from the
/// cache (what a refused list had brought never counts as held).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_lists_that_do_not_fit_together_one_is_dropped_and_the_other_synced() {
    let sim = sim().await;
    for i in 0..1200 {
        sim.sim.create("configmaps", NS, cm(&format!("c{i}"), 1000)).unwrap();
    }
    for i in 0..400 {
        sim.sim.create("pods", NS, pod(&format!("p{i}"), 2500)).unwrap();
    }
    let mut args = serve_args(sim.addr, &["configmaps", "pods"]);
    // ~1.9 MB of configmaps (three pages), ~1.85 MB of pods: each fits 3 MB, not both.
    args.cache_memory_limit = Limit::Bytes(3_000_000);
    args.cache_memory_check_period = Duration::from_millis(100);
    let p = app::start(&args).await.expect("proxy starts");
    let (c, base) = (client(), format!("http://{}", p.addr));
    eventually(20, "ready with one resource dropped", || async {
        let (code, body) = get(&c, &base, "/readyz?verbose").await;
        code == 200 && String::from_utf8_lossy(&body).matches("dropped/memory-limit/").count() == 1
    })
    .await;
    let readers = p.readers();
    let synced: Vec<&str> = readers
        .iter()
        .filter(|r| r.progress().ready && !r.is_empty())
        .map(|r| r.kind().resource.as_str())
        .collect();
    assert_eq!(synced.len(), 1, "{synced:?}");
    for r in ["configmaps", "pods"] {
        let path = format!("/api/v1/namespaces/{NS}/{r}?resourceVersion=0");
        let (code, body) = get(&c, &base, &path).await;
        let (_, sim_body) = get(&c, &format!("http://{}", sim.addr), &path).await;
        assert_eq!(code, 200, "{path}");
        assert_eq!(items(&body), items(&sim_body), "{path}");
    }
    p.shutdown().await;
}

/// Issue 35 §3 with issue 22: the limit is passed by the relist that follows an upstream cut
/// (the gap's objects arrive in its LIST, not as events). The list is refused and the cache
/// dropped; a client's watch kept open across the cut ends without any event of the gap, its
/// resume from its last RV is forwarded and answered exactly as the sim answers it (410: the
/// sim compacted), and the client's relist (forwarded) is the sim's state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relist_after_an_upstream_cut_that_passes_the_limit_drops_the_cache_and_loses_nothing() {
    let sim = Sim::start(SimOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        objects: 0,
        compaction_window: 3,
        ..Default::default()
    })
    .await
    .expect("sim");
    sim.sim
        .create("namespaces", "", json!({"apiVersion":"v1","kind":"Namespace","metadata":{"name":NS}}))
        .expect("namespace");
    for i in 0..5 {
        sim.sim.create("configmaps", NS, cm(&format!("small{i}"), 10)).unwrap();
        sim.sim.create("pods", NS, pod(&format!("p{i}"), 10)).unwrap();
    }
    let fault = common::fault::Fault::start(sim.addr).await;
    let mut args = serve_args(fault.addr, &["configmaps", "pods"]);
    args.cache_memory_limit = Limit::Bytes(300_000);
    args.cache_memory_check_period = Duration::from_millis(100);
    let p = app::start(&args).await.expect("proxy starts");
    assert!(p.wait_ready(Duration::from_secs(10)).await, "proxy synced");
    let (c, base) = (client(), format!("http://{}", p.addr));
    let from = sim.sim.current_rv().0;
    let watch_path = format!("/api/v1/namespaces/{NS}/configmaps?watch=true&resourceVersion={from}");
    let mut w = open_watch(&c, &format!("{base}{watch_path}")).await;
    assert_eq!(w.status, 200);

    // The proxy's upstream watch is stalled while 300 configmaps of 3 KB (~1 MB) are written
    // and compacted past; then it is cut: the re-watch gets 410 and the proxy relists.
    fault.stall_watches(true);
    for i in 0..300 {
        sim.sim.create("configmaps", NS, cm(&format!("big{i}"), 3000)).unwrap();
    }
    let paged = |sim: &SimHandle| {
        sim.sim
            .request_count(|r| common::reflector_list(r, "/api/v1/configmaps") && r.query.contains("limit="))
    };
    assert_eq!(paged(&sim), 1, "the first sync");
    fault.drop_all();
    fault.stall_watches(false);
    eventually(10, "configmaps dropped at the relist", || async {
        metric(&c, &p, "watchcache_cache_memory_dropped_resources").await == 1.0
    })
    .await;
    // The relist was asked whole from the lost RV, its answer (~1 MB) read no further than the
    // budget's room, then listed paged and refused there (counted at its expected size).
    assert_eq!(common::whole_relists(&sim, "/api/v1/configmaps"), 1);
    assert_eq!(paged(&sim), 2, "the whole answer was let go past the room");

    // Nothing of the gap reached the client, and its watch ended.
    let mut seen = Vec::new();
    while let Some(e) = w.next(Duration::from_secs(1)).await {
        seen.push(e);
    }
    assert!(seen.is_empty(), "no event of the gap: {seen:?}");
    assert!(w.ends_within(Duration::from_millis(200)).await, "the watch ended");
    // Its resume from its RV is answered as the sim answers it (410, compacted).
    let (here, _) = events(&c, &format!("{base}{watch_path}"), 10).await;
    let (there, _) = events(&c, &format!("http://{}{watch_path}", sim.addr), 10).await;
    assert_eq!(here, there);
    assert_eq!(here.first().map(|e| e.0.as_str()), Some("ERROR"), "{here:?}");
    // The client's relist is the sim's state.
    let path = format!("/api/v1/namespaces/{NS}/configmaps?resourceVersion=0");
    let (code, body) = get(&c, &base, &path).await;
    let (_, sim_body) = get(&c, &format!("http://{}", sim.addr), &path).await;
    assert_eq!(code, 200);
    assert_eq!(items(&body).len(), 305);
    assert_eq!(items(&body), items(&sim_body));
    p.shutdown().await;
}
