//! Integration: the proxy serves GET / LIST / WATCH from its cache in front of the simulated
//! apiserver (issue 2, point 6), and the upstream is not asked.

use crate::common;

use std::time::Duration;

use common::*;
use serde_json::json;

const T: Duration = Duration::from_secs(5);

#[tokio::test]
async fn list_rv0_is_served_from_cache_in_key_order() {
    let env = start().await;
    env.create_cm("a", "x", json!({"app": "a"}));
    let rv = env.create_cm("a-b", "y", json!({"app": "a"}));
    env.synced_to(rv).await;
    let before = env.upstream_requests("/api/v1/configmaps", "");
    let r = env.get_from_cache("/api/v1/configmaps?resourceVersion=0", false).await;
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["kind"], "ConfigMapList");
    assert_eq!(v["apiVersion"], "v1");
    assert_eq!(v["metadata"]["resourceVersion"], rv.to_string());
    assert_eq!(r.names(), vec!["y", "x"], "a-b/y sorts before a/x");
    assert!(v["items"][0].get("kind").is_none(), "built-in list items carry no kind");
    assert_eq!(env.upstream_requests("/api/v1/configmaps", ""), before, "served without asking upstream");
    // Same answer as the upstream itself.
    let up = env.get_sim("/api/v1/configmaps?resourceVersion=0").await;
    assert_eq!(up.json()["items"], v["items"]);
    env.proxy.shutdown().await;
}

#[tokio::test]
async fn empty_list_has_items_array() {
    let env = start().await;
    let r = env.get_from_cache("/api/v1/namespaces/nothing-here/configmaps?resourceVersion=0", true).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["items"], json!([]));
    assert!(r.json()["metadata"]["resourceVersion"].is_string());
}

#[tokio::test]
async fn get_from_cache_and_missing_object() {
    let env = start().await;
    let rv = env.create_cm("ns", "a", json!({}));
    env.synced_to(rv).await;
    let r = env.get_from_cache("/api/v1/namespaces/ns/configmaps/a?resourceVersion=0", true).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["kind"], "ConfigMap", "GET carries kind/apiVersion");
    assert_eq!(r.json()["metadata"]["resourceVersion"], rv.to_string());
    let r =
        env.get_from_cache(&format!("/api/v1/namespaces/ns/configmaps/a?resourceVersion={rv}"), true).await;
    assert_eq!(r.status, 200);
    let r = env.get_from_cache("/api/v1/namespaces/ns/configmaps/nope?resourceVersion=0", true).await;
    assert_eq!(r.status, 404);
    assert_eq!(
        r.json(),
        json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"configmaps \"nope\" not found","reason":"NotFound","details":{"name":"nope","kind":"configmaps"},"code":404})
    );
    // A missing name with a character Go's `%q` might write otherwise (non-ASCII, a control
    // character): the apiserver's own NotFound, forwarded.
    for name in ["caf%C3%A9", "a%C2%A0b", "a%09b"] {
        let path = format!("/api/v1/namespaces/ns/configmaps/{name}?resourceVersion=0");
        assert_eq!(env.upstream_exact(&path), 0);
        let r = env.get(&path).await;
        assert_eq!(r.status, 404, "{name}");
        assert_eq!(env.upstream_exact(&path), 1, "{name}: forwarded");
        assert_eq!(r.json(), env.get_sim(&path).await.json(), "{name}");
    }
}

#[tokio::test]
async fn not_older_than_waits_then_forwards() {
    let env = start().await;
    let rv = env.create_cm("ns", "a", json!({}));
    env.synced_to(rv).await;
    // Fresh enough: served from the cache.
    let before = env.upstream_requests("/api/v1/namespaces/ns/configmaps", "resourceVersion=");
    let r = env.get_from_cache(&format!("/api/v1/namespaces/ns/configmaps?resourceVersion={rv}"), true).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.names(), vec!["a"]);
    assert_eq!(env.upstream_requests("/api/v1/namespaces/ns/configmaps", "resourceVersion="), before);
    // Far in the future: the cache waits, then the request goes upstream, which answers 504.
    let future = rv + 100_000;
    let future_list = format!("/api/v1/namespaces/ns/configmaps?resourceVersion={future}");
    assert_eq!(env.upstream_exact(&future_list), 0);
    let r = env.get(&future_list).await;
    assert_eq!(r.status, 504);
    assert_eq!(r.json()["details"]["causes"][0]["reason"], "ResourceVersionTooLarge");
    assert_eq!(
        env.upstream_requests("/api/v1/namespaces/ns/configmaps", &format!("resourceVersion={future}")),
        1
    );
    assert_eq!(env.upstream_exact(&future_list), 1, "forwarded once, path and query unchanged");
}

#[tokio::test]
async fn watch_from_rv_replays_then_streams_live() {
    let env = start().await;
    let r0 = env.create_cm("ns", "a", json!({}));
    let r1 = env.create_cm("ns", "b", json!({}));
    env.synced_to(r1).await;
    let path = "/api/v1/namespaces/ns/configmaps";
    let mut w =
        open_watch(&env.client, &env.proxy_url(&format!("{path}?watch=1&resourceVersion={r0}"))).await;
    assert_eq!(w.status, 200);
    assert_eq!(w.headers["content-type"], "application/json");
    let first = w.next(T).await.unwrap();
    assert_eq!(type_name(&first), ("ADDED".into(), "b".into()));
    assert_eq!(first["object"]["kind"], "ConfigMap", "watch objects carry kind");
    env.update_cm("ns", "a", json!({}), "changed");
    let d = env.delete_cm("ns", "b");
    assert_eq!(w.take(2, T).await, vec![("MODIFIED".into(), "a".into()), ("DELETED".into(), "b".into())]);
    let _ = d;
    assert_eq!(env.upstream_path(path), 0, "replayed and streamed from the cache: nothing forwarded");
}

#[tokio::test]
async fn watch_rv0_sends_initial_state_in_key_order() {
    let env = start().await;
    env.create_cm("ns", "b", json!({}));
    let rv = env.create_cm("ns", "a", json!({}));
    env.synced_to(rv).await;
    let mut w = open_watch(
        &env.client,
        &env.proxy_url("/api/v1/namespaces/ns/configmaps?watch=true&resourceVersion=0"),
    )
    .await;
    assert_eq!(w.take(2, T).await, vec![("ADDED".into(), "a".into()), ("ADDED".into(), "b".into())]);
    env.create_cm("ns", "c", json!({}));
    assert_eq!(w.take(1, T).await, vec![("ADDED".into(), "c".into())]);
    assert_eq!(
        env.upstream_path("/api/v1/namespaces/ns/configmaps"),
        0,
        "the cache's state: nothing forwarded"
    );
}

#[tokio::test]
async fn too_old_watch_gets_one_error_event() {
    let env = start().await;
    let r = env.create_cm("ns", "a", json!({}));
    env.synced_to(r).await;
    // The proxy listed after `r`: its window starts at its list RV.
    let (floor, _) =
        env.proxy.readers().into_iter().find(|r| r.kind().resource == "configmaps").unwrap().window();
    assert!(floor.0 >= 1);
    let old = floor.0 - 1;
    // The proxy answers from its own window: the upstream (whose log reaches back further)
    // is not asked.
    let resp = env
        .get_from_cache(&format!("/api/v1/namespaces/ns/configmaps?watch=1&resourceVersion={old}"), true)
        .await;
    assert_eq!(resp.status, 200);
    let ev = resp.events();
    assert_eq!(ev.len(), 1);
    assert_eq!(
        ev[0],
        json!({"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":format!("too old resource version: {old} ({})", floor.0),"reason":"Expired","code":410}})
    );
}

#[tokio::test]
async fn timeout_seconds_ends_the_watch() {
    let env = start().await;
    let start = std::time::Instant::now();
    let r = env.get_from_cache("/api/v1/configmaps?watch=1&resourceVersion=0&timeoutSeconds=1", false).await;
    assert_eq!(r.status, 200);
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(4), "{took:?}");
}

#[tokio::test]
async fn legacy_watch_paths_and_single_object_watch() {
    let env = start().await;
    let r0 = env.create_cm("ns", "a", json!({}));
    env.create_cm("ns", "b", json!({}));
    env.synced_to(r0 + 1).await;
    let mut w = open_watch(
        &env.client,
        &env.proxy_url(&format!("/api/v1/watch/namespaces/ns/configmaps/a?resourceVersion={r0}")),
    )
    .await;
    env.update_cm("ns", "b", json!({}), "x");
    env.update_cm("ns", "a", json!({}), "y");
    assert_eq!(w.take(1, T).await, vec![("MODIFIED".into(), "a".into())], "only object a");
    let mut all =
        open_watch(&env.client, &env.proxy_url(&format!("/api/v1/watch/configmaps?resourceVersion={r0}")))
            .await;
    assert_eq!(all.take(3, T).await.len(), 3);
    // Both served from the cache: nothing upstream on the legacy paths.
    assert_eq!(env.upstream_path("/api/v1/watch/namespaces/ns/configmaps/a"), 0);
    assert_eq!(env.upstream_path("/api/v1/watch/configmaps"), 0);
}

#[tokio::test]
async fn cluster_scoped_and_custom_resources() {
    let env = start().await;
    let n = env
        .sim
        .sim
        .create("nodes", "", json!({"apiVersion":"v1","kind":"Node","metadata":{"name":"n1"}}))
        .unwrap();
    env.ns("ns");
    let w = env
        .sim
        .sim
        .create(
            "example.com/widgets",
            "ns",
            json!({"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w1"},"spec":{"size":1}}),
        )
        .unwrap();
    env.cache_synced_to("nodes", rv_of(&n)).await;
    env.cache_synced_to("widgets", rv_of(&w)).await;
    let r = env.get_from_cache(&format!("/api/v1/nodes?resourceVersion={}", rv_of(&n)), false).await;
    assert_eq!(r.names(), vec!["n1"]);
    let r = env
        .get_from_cache(
            &format!("/apis/example.com/v1/namespaces/ns/widgets?resourceVersion={}", rv_of(&w)),
            true,
        )
        .await;
    let v = r.json();
    assert_eq!(v["kind"], "WidgetList");
    assert_eq!(v["items"][0]["kind"], "Widget", "custom resource items keep kind");
    let up = env.get_sim("/apis/example.com/v1/namespaces/ns/widgets?resourceVersion=0").await;
    assert_eq!(up.json()["items"], v["items"]);
}

#[tokio::test]
async fn bad_input_gets_apiserver_errors() {
    let env = start().await;
    let r = env.get("/api/v1/configmaps?resourceVersion=abc").await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["message"],
        "invalid resource version: resourceVersion: Invalid value: \"abc\": strconv.ParseUint: parsing \"abc\": invalid syntax"
    );
    let r = env.get("/api/v1/configmaps?labelSelector=tier%20in%20(front").await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["message"], "unable to parse requirement: found '', expected: ',' or ')'");
    let r = env.get("/api/v1/configmaps?resourceVersionMatch=NotOlderThan").await;
    assert_eq!(r.status, 422);
    let r = env.get("/api/v1/configmaps?limit=abc&resourceVersion=0").await;
    assert_eq!(r.status, 400);
}

#[tokio::test]
async fn most_recent_list_is_a_consistent_read_from_the_cache() {
    // A quiet cluster (the configmaps' own writes are the only ones): once the cache has a
    // write, the probe's revision is the cache's and the cache answers. (Under churn of other
    // resources, and read-your-writes before the cache has the write: tests/serving/live_cluster.rs.)
    let env = start().await;
    for i in 0..5 {
        let last = env.create_cm("ns", &format!("c{i}"), json!({}));
        env.synced_to(last).await;
        let probes = env.upstream_requests("/api/v1/configmaps", "limit=1");
        let r = env.get("/api/v1/namespaces/ns/configmaps").await;
        assert_eq!(r.status, 200);
        assert!(r.names().contains(&format!("c{i}")), "write {i} visible");
        let list_rv: u64 = r.json()["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap();
        assert!(list_rv >= last);
        assert!(env.upstream_requests("/api/v1/configmaps", "limit=1") > probes, "after a probe upstream");
    }
    assert_eq!(env.upstream_exact("/api/v1/namespaces/ns/configmaps"), 0, "the list itself never forwarded");
}

#[tokio::test]
async fn paginated_lists_are_consistent_snapshots() {
    let env = start().await;
    let mut rv = 0;
    for i in 1..=5 {
        rv = env.create_cm("ns", &format!("cm-{i}"), json!({"app": "a"}));
    }
    env.synced_to(rv).await;
    // Both pages come from the cache (its history window keeps the first page's snapshot).
    let p1 = env
        .get_from_cache(
            &format!("/api/v1/namespaces/ns/configmaps?limit=2&resourceVersion={rv}&resourceVersionMatch=NotOlderThan"),
            true,
        )
        .await;
    assert_eq!(p1.names(), vec!["cm-1", "cm-2"]);
    let m = p1.json()["metadata"].clone();
    assert_eq!(m["remainingItemCount"], 3);
    let token = m["continue"].as_str().unwrap().to_owned();
    // Writes between pages do not show.
    env.create_cm("ns", "cm-2a", json!({}));
    let d = env.delete_cm("ns", "cm-4");
    env.synced_to(d).await;
    let p2 =
        env.get_from_cache(&format!("/api/v1/namespaces/ns/configmaps?limit=2&continue={token}"), true).await;
    assert_eq!(p2.status, 200);
    assert_eq!(p2.names(), vec!["cm-3", "cm-4"]);
    assert_eq!(p2.json()["metadata"]["resourceVersion"], m["resourceVersion"]);
    // The upstream accepts the proxy's tokens (same format).
    let up = env.get_sim(&format!("/api/v1/namespaces/ns/configmaps?limit=2&continue={token}")).await;
    assert_eq!(up.names(), vec!["cm-3", "cm-4"]);
}

/// Issue 24: a continue token (or Exact read) whose RV the cache moved past `--history-window`
/// or more ago is the upstream's to answer: after a compaction, the apiserver's 410 with a
/// token to continue at the latest revision comes through. While the cache is still at the
/// token's RV it is served from the cache, however old.
#[tokio::test]
async fn continue_tokens_older_than_the_window_are_answered_by_the_upstream() {
    let sim = kube_watchcache_sim::Sim::start(kube_watchcache_sim::SimOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        objects: 0,
        ..Default::default()
    })
    .await
    .expect("sim starts");
    let mut args = serve_args(sim.addr, &["configmaps"]);
    // Zero: every RV the cache has moved past is outside the window at once (no waiting).
    args.history_window = Duration::ZERO;
    let proxy = kube_watchcache::app::start(&args).await.expect("proxy starts");
    assert!(proxy.wait_ready(T).await);
    let env = Env { sim, proxy, client: client() };
    let mut rv = 0;
    for i in 1..=4 {
        rv = env.create_cm("ns", &format!("cm-{i}"), json!({}));
    }
    env.synced_to(rv).await;
    let p1 = env
        .get_from_cache(
            &format!("/api/v1/namespaces/ns/configmaps?limit=2&resourceVersion={rv}&resourceVersionMatch=NotOlderThan"),
            true,
        )
        .await;
    let token = p1.json()["metadata"]["continue"].as_str().unwrap().to_owned();
    let page2 = format!("/api/v1/namespaces/ns/configmaps?limit=2&continue={token}");
    // The cache is still at the token's RV: served from the cache.
    let p2 = env.get_from_cache(&page2, true).await;
    assert_eq!(p2.names(), vec!["cm-3", "cm-4"]);
    // The cache moves past it, and the upstream compacts it away.
    let later = env.create_cm("ns", "cm-5", json!({}));
    env.synced_to(later).await;
    env.sim.sim.compact();
    let before = env.upstream_exact(&page2);
    let p2 = env.get(&page2).await;
    assert_eq!(env.upstream_exact(&page2), before + 1, "forwarded upstream");
    assert_eq!(p2.status, 410, "{:?}", p2.json());
    let st = p2.json();
    assert_eq!(st["reason"], "Expired");
    assert!(st["metadata"]["continue"].is_string(), "the upstream's token to continue at the latest RV");
    // An Exact read at the old RV goes upstream too.
    let exact = format!("/api/v1/namespaces/ns/configmaps?resourceVersion={rv}&resourceVersionMatch=Exact");
    let before = env.upstream_exact(&exact);
    let r = env.get(&exact).await;
    assert_eq!(env.upstream_exact(&exact), before + 1);
    assert_eq!(r.status, 410);
}

/// Issue 4: a client that stops reading its watch never delays the others. Its queue fills,
/// it gets the shared time budget, then the proxy closes it; the stream it got is a clean,
/// gap-free prefix that ends with the chunked terminator. The healthy watcher gets every event.
/// (The write-stall cut, which would close the stalled one too on a slow machine, is off here:
/// `fairness` tests it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_watch_client_is_closed_and_never_delays_the_others() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let opts = kube_watchcache_sim::SimOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        objects: 0,
        ..Default::default()
    };
    let env = start_edited(opts, |a| a.security.write_stall_timeout = Duration::ZERO).await;
    let rv0 = env.create_cm("s", "big", json!({}));
    env.synced_to(rv0).await;
    let path = format!("/api/v1/namespaces/s/configmaps?watch=1&resourceVersion={rv0}");
    // The stalled client: a tiny receive window, and it reads nothing until the end.
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let mut stalled = sock.connect(env.proxy.addr).await.unwrap();
    stalled.write_all(format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").as_bytes()).await.unwrap();
    let mut healthy = open_watch(&env.client, &env.proxy_url(&path)).await;
    let reader = env.proxy.readers().into_iter().find(|r| r.kind().resource == "configmaps").unwrap().clone();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while reader.watcher_stats().live < 2 {
        assert!(std::time::Instant::now() < deadline, "both watches registered with the cache");
        tokio::task::yield_now().await;
    }
    // 2 000 events of 16 KiB: more than the queue (1 000) plus what the sockets hold.
    let data = "x".repeat(16 * 1024);
    let n = 2000;
    let writer = {
        let sim = env.sim.sim.clone();
        tokio::task::spawn_blocking(move || {
            for i in 0..n {
                let cm = json!({"apiVersion":"v1","kind":"ConfigMap",
                    "metadata":{"name":"big","namespace":"s"},"data":{"k":format!("{i}{data}")}});
                sim.update("configmaps", "s", cm).expect("update");
            }
        })
    };
    let mut last = rv0;
    for i in 0..n {
        let e = healthy.next(Duration::from_secs(20)).await.unwrap_or_else(|| {
            panic!("event {i} arrived: {:?} relists {:?}", reader.watcher_stats(), reader.progress())
        });
        let rv = rv_of(&e["object"]);
        assert!(rv > last, "in order, no duplicates");
        last = rv;
    }
    writer.await.unwrap();
    assert_eq!(reader.watcher_stats().terminated, 1, "the stalled watcher was closed");
    assert_eq!(reader.watcher_stats().live, 1);
    // What the stalled client got: a prefix of the events, in order, then a clean end.
    // The connection stays open (keep-alive): read until the response's chunked terminator.
    let mut raw = Vec::new();
    let mut buf = vec![0; 64 * 1024];
    while !raw.ends_with(b"\r\n0\r\n\r\n") {
        let got = tokio::time::timeout(Duration::from_secs(20), stalled.read(&mut buf)).await;
        let k = got.expect("the stream ends with the chunked terminator").unwrap();
        assert!(k > 0, "connection closed before the terminator");
        raw.extend_from_slice(&buf[..k]);
    }
    let text = String::from_utf8_lossy(&raw);
    let rvs: Vec<u64> = text
        .split("\"resourceVersion\":\"")
        .skip(1)
        .map(|s| s[..s.find('"').unwrap()].parse().unwrap())
        .collect();
    assert!(!rvs.is_empty() && rvs.len() < n, "got {} of {n} events before being closed", rvs.len());
    assert!(rvs.windows(2).all(|w| w[1] == w[0] + 1), "no gap, no duplicate, no reordering");
    assert_eq!(rvs[0], rv0 + 1);
    assert_eq!(env.upstream_path("/api/v1/namespaces/s/configmaps"), 0, "both watches served from the cache");
    env.proxy.shutdown().await;
}

/// HTTP/2 with prior knowledge (the preface is detected; such connections defer their wake-ups
/// behind the runnable tasks): many watches on one connection each get every event, in order,
/// and a LIST on the same connection equals the HTTP/1.1 one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_watches_share_a_connection_and_each_get_every_event() {
    let env = start().await;
    let rv0 = env.create_cm("h2", "a", json!({}));
    env.synced_to(rv0).await;
    let h2: HttpClient = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let url = env.proxy_url(&format!("/api/v1/namespaces/h2/configmaps?watch=1&resourceVersion={rv0}"));
    let mut watches = Vec::new();
    for _ in 0..50 {
        let w = open_watch(&h2, &url).await;
        assert_eq!(w.status, 200);
        watches.push(w);
    }
    let mut want = Vec::new();
    for i in 0..3 {
        want.push(env.update_cm("h2", "a", json!({}), &format!("v{i}")));
    }
    for (n, w) in watches.iter_mut().enumerate() {
        for rv in &want {
            let e = w.next(Duration::from_secs(10)).await.unwrap_or_else(|| panic!("watch {n}: event {rv}"));
            assert_eq!(rv_of(&e["object"]), *rv, "watch {n}");
        }
    }
    let list = "/api/v1/namespaces/h2/configmaps?resourceVersion=0";
    let over_h2 = send(&h2, http::Method::GET, &env.proxy_url(list), None, &[]).await;
    assert_eq!(over_h2.status, 200);
    assert_eq!(over_h2.body, env.get(list).await.body);
    assert_eq!(
        env.upstream_path("/api/v1/namespaces/h2/configmaps"),
        0,
        "watches and lists served from the cache"
    );
    env.proxy.shutdown().await;
}
