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
    eventually(10, "retired: forwarded, and the upstream answers 404", || async {
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
