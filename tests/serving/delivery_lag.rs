//! Issue 34 item 3: the proxy publishes its part of the watch latency. The proxy in front of
//! the sim (`tests/common`), one watch of configmaps through it, a few writes in the sim:
//! `watchcache_watch_delivery_lag_seconds` counts each delivery it sampled (every event's
//! first), and `watchcache_cache_lag_seconds` rises while a consistent-read probe has seen the
//! upstream at an RV the configmaps cache has not reached, and falls back to 0 when an event
//! takes the cache there.

use crate::common;

use std::time::Duration;

use kube_watchcache_sim::SimOptions;
use serde_json::json;

/// The value of one series (`name{labels}`) in the proxy's metrics, 0 when absent.
async fn metric(env: &common::Env, series: &str) -> f64 {
    let resp = env.get("/watchcache/metrics").await;
    assert_eq!(resp.status, 200);
    let text = String::from_utf8_lossy(&resp.body).into_owned();
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok()).unwrap_or(0.0)
}

const DELIVERY_COUNT: &str = r#"watchcache_watch_delivery_lag_seconds_count{resource="configmaps"}"#;
const DELIVERY_SUM: &str = r#"watchcache_watch_delivery_lag_seconds_sum{resource="configmaps"}"#;
const CACHE_LAG: &str = r#"watchcache_cache_lag_seconds{resource="configmaps"}"#;

#[tokio::test]
async fn the_lag_metrics_move_as_a_watch_is_delivered() {
    // No sim BOOKMARK during the test (they would take the cache to the upstream RV too).
    let env = common::start_with(SimOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        objects: 0,
        bookmark_interval: Duration::from_secs(600),
        ..Default::default()
    })
    .await;
    assert_eq!(metric(&env, DELIVERY_COUNT).await, 0.0);
    assert_eq!(metric(&env, CACHE_LAG).await, 0.0);

    let rv0 = env.create_cm("lag", "seed", json!({}));
    env.synced_to(rv0).await;
    let mut watch = common::open_watch(
        &env.client,
        &env.proxy_url(&format!("/api/v1/configmaps?watch=1&resourceVersion={rv0}")),
    )
    .await;
    for i in 0..3 {
        env.create_cm("lag", &format!("cm-{i}"), json!({}));
    }
    let got = watch.take(3, Duration::from_secs(5)).await;
    assert_eq!(got.len(), 3, "{got:?}");
    // One watcher: every event's delivery is its first, so each is sampled (observed when the
    // frame went to the body, before the client read it).
    assert_eq!(metric(&env, DELIVERY_COUNT).await, 3.0);
    let sum = metric(&env, DELIVERY_SUM).await;
    assert!(sum > 0.0 && sum < 3.0, "3 local deliveries took {sum} s");

    // A write to another resource moves the upstream RV (etcd's, shared) but no configmaps
    // event: a Most Recent LIST's probe sees the upstream ahead of the configmaps cache.
    let node = env
        .sim
        .sim
        .create("nodes", "", json!({"apiVersion":"v1","kind":"Node","metadata":{"name":"lag-node"}}))
        .expect("node");
    let list = env.get("/api/v1/configmaps").await;
    assert_eq!(list.status, 200);
    let lag = metric(&env, CACHE_LAG).await;
    assert!(lag > 0.0 && lag < 1.0, "the probe saw the upstream ahead: {lag}");
    let again = metric(&env, CACHE_LAG).await;
    assert!(again > lag, "still behind, for longer: {again} after {lag}");
    // A configmaps event past that RV takes the cache there: not behind any more.
    let rv = env.create_cm("lag", "after", json!({}));
    assert!(rv > common::rv_of(&node));
    env.synced_to(rv).await;
    assert_eq!(metric(&env, CACHE_LAG).await, 0.0);
}
