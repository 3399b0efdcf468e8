//! Integration: the proxy's life around its upstream — started before the upstream is up, a
//! configured resource the upstream does not serve, a cache with no proof of being current
//! for longer than `--max-staleness`, the SIGTERM sequence with `--shutdown-delay-duration`,
//! and a CRD deleted and created again at once (issue 31: the watches of the old one end, as
//! the apiserver's do).

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use kube_watchcache::app;
use kube_watchcache_sim::{Sim, SimOptions};
use serde_json::{json, Value};

async fn status(client: &HttpClient, url: &str) -> (u16, String) {
    let r = send(client, http::Method::GET, url, None, &[]).await;
    (r.status.as_u16(), String::from_utf8_lossy(&r.body).into_owned())
}

#[tokio::test]
async fn the_proxy_starts_before_its_upstream_and_syncs_once_it_is_up() {
    // A port nothing listens on yet.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let upstream: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let proxy =
        app::start(&serve_args(upstream, &["configmaps"])).await.expect("starts without its upstream");
    let client = client();
    let url = |p: &str| format!("http://{}{p}", proxy.addr);
    assert_eq!(status(&client, &url("/livez")).await.0, 200);
    let (code, text) = status(&client, &url("/readyz")).await;
    assert_eq!(code, 500);
    assert!(text.contains("resource configmaps not cached yet"), "{text}");
    // Meanwhile its requests are forwarded (and fail like the upstream: unreachable).
    assert_eq!(status(&client, &url("/api/v1/configmaps?resourceVersion=0")).await.0, 503);
    let sim = Sim::start(SimOptions { listen: upstream, ..Default::default() }).await.unwrap();
    sim.sim.create("configmaps", "default", json!({"metadata": {"name": "a"}})).unwrap();
    eventually(20, "ready once the upstream is up", || async {
        status(&client, &url("/readyz")).await.0 == 200
    })
    .await;
    let lists =
        sim.sim.request_count(|r| r.path == "/api/v1/configmaps" && r.query.contains("resourceVersion=0"));
    let r = send(&client, http::Method::GET, &url("/api/v1/configmaps?resourceVersion=0"), None, &[]).await;
    assert_eq!(r.names(), ["a"]);
    let after =
        sim.sim.request_count(|r| r.path == "/api/v1/configmaps" && r.query.contains("resourceVersion=0"));
    assert_eq!(after, lists, "served from the cache");
}

#[tokio::test]
async fn a_resource_the_upstream_does_not_serve_is_forwarded_and_does_not_block_readiness() {
    let sim = Sim::start(SimOptions { listen: "127.0.0.1:0".parse().unwrap(), ..Default::default() })
        .await
        .unwrap();
    let proxy = app::start(&serve_args(sim.addr, &["configmaps", "example.org/things"])).await.unwrap();
    let client = client();
    let url = |p: &str| format!("http://{}{p}", proxy.addr);
    eventually(10, "ready without the missing resource", || async {
        status(&client, &url("/readyz")).await.0 == 200
    })
    .await;
    let path = "/apis/example.org/v1/things";
    let before = sim.sim.request_count(|r| r.path == path);
    let (code, _) = status(&client, &url(&format!("{path}?resourceVersion=0"))).await;
    assert_eq!(code, 404, "the upstream's answer");
    assert_eq!(sim.sim.request_count(|r| r.path == path), before + 1, "forwarded");
    // And discovery keeps asking for it.
    let discovery = || sim.sim.request_count(|r| r.path == "/apis");
    let asked = discovery();
    eventually(10, "discovery retried", || async { discovery() > asked }).await;
}

#[tokio::test]
async fn a_cache_without_proof_past_max_staleness_is_forwarded_and_not_ready() {
    let sim = Sim::start(SimOptions { listen: "127.0.0.1:0".parse().unwrap(), ..Default::default() })
        .await
        .unwrap();
    let mut args = serve_args(sim.addr, &["configmaps"]);
    args.max_staleness = Duration::from_millis(600);
    let proxy = app::start(&args).await.unwrap();
    assert!(proxy.wait_ready(Duration::from_secs(10)).await);
    let client = client();
    let url = |p: &str| format!("http://{}{p}", proxy.addr);
    let list = "/api/v1/configmaps?resourceVersion=0";
    let upstream_lists =
        || sim.sim.request_count(|r| r.path == "/api/v1/configmaps" && r.query == "resourceVersion=0");
    // No event, no bookmark (the sim's come every 60 s): the proof ages past the bound.
    eventually(10, "stale", || async { status(&client, &url("/readyz")).await.0 == 500 }).await;
    let (_, text) = status(&client, &url("/readyz")).await;
    assert!(text.contains("cache configmaps stale"), "{text}");
    let before = upstream_lists();
    assert_eq!(status(&client, &url(list)).await.0, 200);
    assert_eq!(upstream_lists(), before + 1, "a stale cache's read is forwarded");
    // An event is proof again: ready, and served from the cache.
    sim.sim.create("configmaps", "default", json!({"metadata": {"name": "fresh"}})).unwrap();
    eventually(10, "served from the cache again", || {
        let (client, url) = (&client, url(list));
        async move {
            let before = upstream_lists();
            status(client, &url).await.0 == 200 && upstream_lists() == before
        }
    })
    .await;
    assert_eq!(status(&client, &url("/readyz")).await.0, 200);
}

#[tokio::test]
async fn sigterm_sequence_turns_unready_first_and_keeps_serving_during_the_delay() {
    let env_sim = Sim::start(SimOptions { listen: "127.0.0.1:0".parse().unwrap(), ..Default::default() })
        .await
        .unwrap();
    let mut args = serve_args(env_sim.addr, &["configmaps"]);
    args.shutdown_delay_duration = Duration::from_secs(2);
    let proxy = app::start(&args).await.unwrap();
    assert!(proxy.wait_ready(Duration::from_secs(10)).await);
    let client = client();
    let addr = proxy.addr;
    let url = move |p: &str| format!("http://{addr}{p}");
    let started = Instant::now();
    let stopping = tokio::spawn(proxy.shutdown());
    eventually(2, "not ready at once", || async { status(&client, &url("/readyz")).await.0 == 500 }).await;
    // Still serving cached reads while the load balancers catch up.
    assert_eq!(status(&client, &url("/api/v1/configmaps?resourceVersion=0")).await.0, 200);
    assert!(started.elapsed() < Duration::from_secs(2), "checked inside the delay");
    stopping.await.unwrap();
    assert!(started.elapsed() >= Duration::from_secs(2), "the listener waited for the delay");
    let closed = client.get(url("/livez").parse().unwrap()).await;
    assert!(closed.is_err(), "no longer accepting");
}

#[tokio::test]
async fn a_deleted_crd_is_forwarded_and_cached_again_once_it_is_back() {
    deleted_crd_is_followed(Duration::from_millis(200), None).await;
}

/// Without periodic rediscovery: the reflector's 404 (on its next re-watch) triggers it.
#[tokio::test]
async fn a_404_for_a_cached_resource_triggers_rediscovery() {
    deleted_crd_is_followed(Duration::ZERO, Some(Duration::from_secs(1))).await;
}

async fn deleted_crd_is_followed(rediscovery: Duration, watch_idle: Option<Duration>) {
    let sim = Sim::start(SimOptions { listen: "127.0.0.1:0".parse().unwrap(), ..Default::default() })
        .await
        .unwrap();
    sim.sim.create("namespaces", "", json!({"metadata": {"name": "ns"}})).unwrap();
    let w = sim
        .sim
        .create(
            "example.com/widgets",
            "ns",
            json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}),
        )
        .unwrap();
    let mut args = serve_args(sim.addr, &["configmaps", "example.com/widgets"]);
    args.rediscovery_interval = rediscovery;
    if let Some(t) = watch_idle {
        args.upstream_watch_idle_timeout = t;
    }
    let proxy = app::start(&args).await.unwrap();
    assert!(proxy.wait_ready(Duration::from_secs(10)).await);
    let widgets = proxy.readers().into_iter().find(|r| r.kind().resource == "widgets").unwrap();
    widgets.wait_for(kube_watchcache::resource::Rv(rv_of(&w)), Duration::from_secs(5)).await.unwrap();
    let client = client();
    let path = "/apis/example.com/v1/namespaces/ns/widgets";
    let url = format!("http://{}{path}?resourceVersion=0", proxy.addr);
    let upstream = || sim.sim.request_count(|r| r.path == path);
    let from_cache = || async {
        let before = upstream();
        let (code, body) = status(&client, &url).await;
        code == 200 && body.contains("\"w\"") && upstream() == before
    };
    assert!(from_cache().await, "served from the cache");
    // The CRD is deleted: rediscovery notices, the cache is retired, requests are forwarded.
    sim.sim.set_served("example.com/widgets", false).unwrap();
    eventually(10, "forwarded to the upstream, which answers 404", || async {
        status(&client, &url).await.0 == 404
    })
    .await;
    let (code, text) = status(&client, &format!("http://{}/readyz", proxy.addr)).await;
    assert_eq!(code, 200, "a missing CRD does not take the proxy out of service: {text}");
    // Re-created: found again, cached again.
    sim.sim.set_served("example.com/widgets", true).unwrap();
    eventually(20, "cached again", from_cache).await;
}

/// Issue 24: periodic rediscovery fetches each discovery document once per round, and sends no
/// probe LIST for resources it caches already (before: `/apis` once per cached resource, and a
/// one-item LIST of each every round).
#[tokio::test]
async fn a_rediscovery_round_costs_its_documents_once() {
    let sim = Sim::start(SimOptions { listen: "127.0.0.1:0".parse().unwrap(), ..Default::default() })
        .await
        .unwrap();
    let named = ["configmaps", "pods", "apps/deployments", "example.com/widgets"];
    let mut args = serve_args(sim.addr, &named);
    args.rediscovery_interval = Duration::from_millis(100);
    let proxy = app::start(&args).await.unwrap();
    assert!(proxy.wait_ready(Duration::from_secs(10)).await);
    let count = |path: &str| sim.sim.request_count(|r| r.path == path);
    let probes = || sim.sim.request_count(|r| r.query == "limit=1");
    let (apis0, probes0) = (count("/apis"), probes());
    eventually(20, "five rounds", || async { count("/apis") >= apis0 + 5 }).await;
    let rounds = count("/apis") - apis0;
    let apis = count("/apis");
    for doc in ["/api/v1", "/apis/apps/v1", "/apis/example.com/v1"] {
        assert!(count(doc) <= apis + 1, "{doc}: {} fetches for {apis} of /apis", count(doc));
    }
    assert_eq!(probes(), probes0, "no probe LIST in {rounds} rounds of an unchanged upstream");
    proxy.shutdown().await;
}

/// At shutdown, what still runs on a connection when the grace period is over ends with the
/// connection (before: a forwarded watch outlived the server; a watch registered with a
/// stopped cache never ended), and a cache whose reflector stopped takes no new watch.
#[tokio::test]
async fn nothing_outlives_the_grace_period() {
    let env = common::start().await;
    env.ns("ns");
    // secrets are not cached: the watch is forwarded and stays open upstream.
    let mut forwarded =
        open_watch(&env.client, &env.proxy_url("/api/v1/namespaces/ns/secrets?watch=1")).await;
    assert_eq!(forwarded.status, 200);
    let common::Env { proxy, sim, .. } = env;
    let t = std::time::Instant::now();
    proxy.shutdown().await;
    assert!(forwarded.ends_within(Duration::from_secs(5)).await, "the forwarded watch ended with the server");
    assert!(t.elapsed() < Duration::from_secs(15), "shutdown took {:?}", t.elapsed());
    drop(sim);
}

/// Issue 31: a CRD deleted and created again at once. The apiserver tears the old storage down
/// (its watches end) and its new watch cache lists at the current revision L, so the proxy's
/// re-watch gets 410 and it relists; the objects are the same (the sim keeps them), so the
/// difference for a client's watch is empty. Before the fix the proxy kept that watch with a
/// BOOKMARK at L; now it ends, as the apiserver's does, and its re-watch from its RV is 410.
#[tokio::test]
async fn a_crd_deleted_and_created_again_ends_the_watches_of_the_old_one() {
    let sim = Sim::start(SimOptions { listen: "127.0.0.1:0".parse().unwrap(), ..Default::default() })
        .await
        .unwrap();
    sim.sim.create("namespaces", "", json!({"metadata": {"name": "ns"}})).unwrap();
    let w = sim
        .sim
        .create(
            "example.com/widgets",
            "ns",
            json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}),
        )
        .unwrap();
    let rv = rv_of(&w);
    let mut args = serve_args(sim.addr, &["configmaps", "example.com/widgets"]);
    args.rediscovery_interval = Duration::ZERO;
    let proxy = app::start(&args).await.unwrap();
    assert!(proxy.wait_ready(Duration::from_secs(10)).await);
    let widgets = proxy.readers().into_iter().find(|r| r.kind().resource == "widgets").unwrap();
    widgets.wait_for(kube_watchcache::resource::Rv(rv), Duration::from_secs(5)).await.unwrap();
    let client = client();
    let path = "/apis/example.com/v1/namespaces/ns/widgets";
    let query = format!("?watch=true&allowWatchBookmarks=true&resourceVersion={rv}");
    let mut at_proxy = open_watch(&client, &format!("http://{}{path}{query}", proxy.addr)).await;
    let mut at_sim = open_watch(&client, &format!("http://{}{path}{query}", sim.addr)).await;
    assert_eq!((at_proxy.status.as_u16(), at_sim.status.as_u16()), (200, 200));
    let ended_before = widgets.watcher_stats().ended_at_relist;

    sim.sim.set_served("example.com/widgets", false).unwrap();
    // Deleting and creating a CRD are writes of CustomResourceDefinition objects: the revision
    // moves on (the sim does not store CRDs; a configmap stands in for them).
    sim.sim.create("configmaps", "ns", json!({"metadata": {"name": "crd-writes"}})).unwrap();
    sim.sim.set_served("example.com/widgets", true).unwrap();
    let l = sim.sim.current_rv().0;
    assert!(at_sim.ends_within(Duration::from_secs(5)).await, "the sim's watch of the old CRD ended");
    // The proxy's watch ends with nothing: no BOOKMARK at L presenting the re-creation as a
    // quiet stretch.
    let mut got = Vec::new();
    while let Some(ev) = at_proxy.next(Duration::from_secs(10)).await {
        got.push(ev);
    }
    assert!(got.is_empty(), "nothing across the re-creation: {got:?}");
    assert!(at_proxy.ends_within(Duration::from_millis(200)).await, "the proxy's watch of the old CRD ended");
    assert_eq!(widgets.watcher_stats().ended_at_relist, ended_before + 1, "ended by the relist");
    assert!(widgets.window().0 .0 >= l, "the proxy relisted at the new storage's revision");
    // Its re-watch from its RV: 410 at the proxy, as at the sim.
    for base in [proxy.addr, sim.addr] {
        let mut again = open_watch(&client, &format!("http://{base}{path}{query}")).await;
        let ev = again.next(Duration::from_secs(10)).await.expect("an event");
        assert_eq!(
            (ev["type"].as_str(), ev["object"]["code"].as_u64()),
            (Some("ERROR"), Some(410)),
            "{base}: {ev}"
        );
    }
    proxy.shutdown().await;
}

/// At shutdown the connections are told to finish before the caches end their watches: a
/// client whose HTTP/1.1 watch ended sees its connection close, never a 503 from a stopped
/// cache on a request it sends next on the same connection (client-go would relist on that
/// 503; on a closed connection it retries, then meets the closed port and retries its watch).
#[tokio::test]
async fn a_watch_ended_by_shutdown_leaves_its_connection_closing() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let env = start().await;
    let rv = env.create_cm("sd", "a", json!({}));
    let mut sock = tokio::net::TcpStream::connect(env.proxy.addr).await.expect("connect");
    let head = format!(
        "GET /api/v1/namespaces/sd/configmaps?watch=1&resourceVersion={rv} HTTP/1.1\r\nhost: 127.0.0.1\r\naccept: application/json\r\n\r\n"
    );
    sock.write_all(head.as_bytes()).await.expect("write");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = sock.read(&mut buf).await.expect("read");
        assert!(n > 0, "closed before the headers");
        got.extend_from_slice(&buf[..n]);
    }
    assert!(got.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&got));
    let Env { proxy, sim, .. } = env;
    let shutdown = tokio::spawn(proxy.shutdown());
    // The watch's chunked body ends…
    while !got.ends_with(b"0\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(10), sock.read(&mut buf))
            .await
            .expect("ends")
            .expect("read");
        assert!(n > 0, "closed without ending the body");
        got.extend_from_slice(&buf[..n]);
    }
    // …and the next request on the same connection is not answered (the connection closes).
    let _ = sock
        .write_all(b"GET /api/v1/namespaces/sd/configmaps?watch=1 HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        .await;
    let mut after = Vec::new();
    let _ =
        tokio::time::timeout(Duration::from_secs(10), sock.read_to_end(&mut after)).await.expect("closes");
    assert!(after.is_empty(), "answered after the watch ended: {}", String::from_utf8_lossy(&after));
    shutdown.await.expect("shutdown");
    sim.shutdown().await;
}

/// A custom resource whose schema lets `type`, `status` or `spec` be anything (here `type`
/// turns from a string into a number, `status` into a string): every change and its deletion
/// reach the cache's watchers, and no ghost stays (a field-selector member that was not an
/// object or a string made the whole object unparsable: its events were skipped).
#[tokio::test]
async fn a_custom_resource_of_any_shape_is_followed_to_its_deletion() {
    let env = start().await;
    env.ns("w");
    let w = |v: Value| json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w1", "namespace": "w"}, "type": v, "status": {"ok": true}});
    let created = env.sim.sim.create("example.com/widgets", "w", w(json!("a"))).expect("create widget");
    env.cache_synced_to("widgets", rv_of(&created)).await;
    let path = "/apis/example.com/v1/namespaces/w/widgets";
    let mut watch = open_watch(
        &env.client,
        &env.proxy_url(&format!("{path}?watch=1&resourceVersion={}", rv_of(&created))),
    )
    .await;
    let mut odd = w(json!(3));
    odd["status"] = json!("Ready");
    odd["metadata"]["resourceVersion"] = json!(rv_of(&created).to_string());
    let updated = env.sim.sim.update("example.com/widgets", "w", odd).expect("update widget");
    let deleted = rv_of(&env.sim.sim.delete("example.com/widgets", "w", "w1").expect("delete widget"));
    let got = watch.take(2, Duration::from_secs(10)).await;
    assert_eq!(got, [("MODIFIED".into(), "w1".into()), ("DELETED".into(), "w1".into())]);
    env.cache_synced_to("widgets", deleted).await;
    let r = env.get(&format!("{path}/w1?resourceVersion=0")).await;
    assert_eq!(r.status, 404, "no ghost: {}", String::from_utf8_lossy(&r.body));
    assert!(rv_of(&updated) < deleted);
}
