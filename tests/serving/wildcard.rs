//! Integration: `--resources '*,-events'` against the simulated apiserver — every resource it
//! serves that can be listed and watched is cached except the excluded ones, a CRD deleted
//! while running is retired (its requests forwarded) and cached again once it is back, at once
//! when a request for it arrives, with no request failing in between.

use crate::common;

use std::time::Duration;

use common::*;
use kube_watchcache::app;
use kube_watchcache_sim::{Sim, SimOptions};
use serde_json::json;

async fn sim_with_a_widget() -> kube_watchcache_sim::SimHandle {
    let sim = Sim::start(SimOptions { listen: "127.0.0.1:0".parse().unwrap(), ..Default::default() })
        .await
        .unwrap();
    sim.sim.create("namespaces", "", json!({"metadata": {"name": "ns"}})).unwrap();
    sim.sim
        .create(
            "example.com/widgets",
            "ns",
            json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}),
        )
        .unwrap();
    sim
}

fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
}

#[tokio::test]
async fn a_wildcard_caches_what_the_upstream_serves_less_the_exclusions() {
    let sim = sim_with_a_widget().await;
    let proxy = app::start(&serve_args(sim.addr, &["*", "-events"])).await.unwrap();
    assert!(proxy.wait_ready(Duration::from_secs(10)).await, "synced");
    let mut cached: Vec<String> = proxy.readers().iter().map(|r| r.kind().group_resource()).collect();
    cached.sort();
    let mut want: Vec<String> =
        sim.sim.resources().iter().filter(|k| k.resource != "events").map(|k| k.group_resource()).collect();
    want.sort();
    assert_eq!(cached, want, "every resource the sim serves, events excluded");
    let client = client();
    let get = |p: &str| {
        let url = format!("http://{}{p}", proxy.addr);
        let client = client.clone();
        async move { send(&client, http::Method::GET, &url, None, &[]).await }
    };
    // A cached one is answered without the upstream; the excluded one is forwarded.
    for (path, cached) in
        [("/apis/example.com/v1/namespaces/ns/widgets", true), ("/api/v1/namespaces/ns/events", false)]
    {
        let before = sim.sim.request_count(|r| r.path == path);
        let r = get(&format!("{path}?resourceVersion=0")).await;
        assert_eq!(r.status, 200, "{path}");
        let seen = sim.sim.request_count(|r| r.path == path) - before;
        assert_eq!(seen, usize::from(!cached), "{path}: cached {cached}");
    }
    let m = String::from_utf8_lossy(&get("/watchcache/metrics").await.body).into_owned();
    assert_eq!(metric(&m, "watchcache_cached_resources "), Some(want.len() as f64), "{m}");
    assert_eq!(metric(&m, "watchcache_skipped_resources{reason=\"forbidden\"} "), Some(0.0));
}

/// A round whose group-version document the upstream does not give (429 under APF, 5xx, a
/// replica still registering its CRDs) changes nothing for that group-version: its caches stay,
/// their watches too (a review: they were retired, every watch ended, then cached anew cold by
/// the next round, on every replica at once).
#[tokio::test]
async fn a_group_version_the_upstream_is_too_busy_to_describe_keeps_its_caches() {
    let sim = sim_with_a_widget().await;
    let relay = common::fault::Fault::start(sim.addr).await;
    let mut args = serve_args(relay.addr, &["*", "-events"]);
    args.rediscovery_interval = Duration::ZERO;
    let proxy = app::start(&args).await.unwrap();
    assert!(proxy.wait_ready(Duration::from_secs(10)).await);
    let client = client();
    let widgets = "/apis/example.com/v1/namespaces/ns/widgets";
    let mut watch = client
        .get(format!("http://{}{widgets}?watch=1&resourceVersion=0", proxy.addr).parse().unwrap())
        .await
        .unwrap();
    assert_eq!(watch.status(), 200);
    relay.busy(Some("/apis/example.com/v1"));
    // A request for a resource not cached makes the proxy look again (at most every 2 s).
    let before = relay.count(|s| &s.busy_answers);
    eventually(10, "a round met the busy group-version", || async {
        let url = format!("http://{}/apis/nothing.example.com/v1/things", proxy.addr);
        send(&client, http::Method::GET, &url, None, &[]).await;
        relay.count(|s| &s.busy_answers) > before
    })
    .await;
    let cached = proxy.readers().iter().any(|r| r.kind().group_resource() == "widgets.example.com");
    assert!(cached, "still cached");
    let upstream = || sim.sim.request_count(|r| r.path == widgets);
    let seen = upstream();
    let r = send(
        &client,
        http::Method::GET,
        &format!("http://{}{widgets}?resourceVersion=0", proxy.addr),
        None,
        &[],
    )
    .await;
    assert_eq!((r.status.as_u16(), upstream()), (200, seen), "served from the cache");
    // The watch is still open: a new widget reaches it.
    sim.sim
        .create(
            "example.com/widgets",
            "ns",
            json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w2"}}),
        )
        .unwrap();
    let mut seen_w2 = false;
    while let Ok(Some(Ok(frame))) =
        tokio::time::timeout(Duration::from_secs(5), http_body_util::BodyExt::frame(watch.body_mut())).await
    {
        if frame.data_ref().is_some_and(|d| String::from_utf8_lossy(d).contains("\"w2\"")) {
            seen_w2 = true;
            break;
        }
    }
    assert!(seen_w2, "the watch opened before the round got the new widget");
    relay.busy(None);
}

#[tokio::test]
async fn a_wildcard_follows_a_crd_deleted_and_installed_again() {
    let sim = sim_with_a_widget().await;
    let mut args = serve_args(sim.addr, &["*", "-events"]);
    // No periodic rediscovery: only a reflector's 404 and requests for resources not cached
    // make the proxy look again.
    args.rediscovery_interval = Duration::ZERO;
    args.upstream_watch_idle_timeout = Duration::from_secs(1);
    let proxy = app::start(&args).await.unwrap();
    assert!(proxy.wait_ready(Duration::from_secs(10)).await);
    let client = client();
    let path = "/apis/example.com/v1/namespaces/ns/widgets";
    let url = format!("http://{}{path}?resourceVersion=0", proxy.addr);
    let upstream = || sim.sim.request_count(|r| r.path == path);
    // Every answer in between is the cache's or the upstream's own: 200, or 404 while the CRD
    // is gone; never a failure of the proxy.
    let answer = || async {
        let before = upstream();
        let r = send(&client, http::Method::GET, &url, None, &[]).await;
        assert!(matches!(r.status.as_u16(), 200 | 404), "{} {}", r.status, String::from_utf8_lossy(&r.body));
        (r.status.as_u16(), upstream() == before)
    };
    assert_eq!(answer().await, (200, true), "served from the cache");
    sim.sim.set_served("example.com/widgets", false).unwrap();
    // (Retired once rounds have agreed for `caches::CONFIRM_AFTER`, 3 s: one round meeting an
    // apiserver replica that has not registered its CRDs yet retires nothing.)
    eventually(20, "retired: forwarded, and the upstream answers 404", || async {
        answer().await == (404, false)
    })
    .await;
    let (code, text) = {
        let r = send(&client, http::Method::GET, &format!("http://{}/readyz", proxy.addr), None, &[]).await;
        (r.status.as_u16(), String::from_utf8_lossy(&r.body).into_owned())
    };
    assert_eq!(code, 200, "a deleted CRD does not take the proxy out of service: {text}");
    // Installed again: the next request for it (forwarded) makes the proxy look at once; no
    // periodic rediscovery is configured, so only that request can have done it.
    sim.sim.set_served("example.com/widgets", true).unwrap();
    assert_eq!(answer().await, (200, false), "forwarded until cached again");
    eventually(5, "cached again after a request for it", || async { answer().await == (200, true) }).await;
}
