//! Sharded LIST and WATCH (`shardSelector`, KEP-5866; issue 34 item 1) through the proxy in
//! front of the simulated 1.28 apiserver, which ignores the parameter: the cache serves what a
//! 1.36 apiserver with `ShardedListAndWatch` sends (only the shard, `metadata.shardInfo` on
//! built-in lists); whatever is forwarded comes back as the upstream answers it, unsharded and
//! without `shardInfo` (the client filters by itself). Shards are checked with a hash written
//! here, not the proxy's: the union of the shards is the unsharded answer and no object is in
//! two (LIST, paginated, Exact, watch, watch-list, protobuf, metadata-only); a sharded watcher
//! sees exactly its part of an unsharded watcher's events; invalid selectors get the
//! apiserver's 500. Run by `cargo test --test serving`.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::pb::{field, fields, take_frames, WatchEvent};
use common::*;
use http::Method;
use http_body_util::BodyExt;
use serde_json::{json, Value};

const T: Duration = Duration::from_secs(5);
const KUBELET: &str = "application/vnd.kubernetes.protobuf, application/json";
const META_LIST: &str = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";

/// 64-bit FNV-1a, written out here (the proxy's own is what is under test).
fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf29ce484222325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100000001b3))
}

/// Quarter `i` of 4 by uid: its canonical selector text and whether a hash is in it.
fn quarter(i: u64) -> (String, impl Fn(u64) -> bool) {
    let bound =
        |n: u64| if n == 4 { "0x10000000000000000".to_owned() } else { format!("0x{:016x}", n << 62) };
    let text = format!("shardRange(object.metadata.uid, '{}', '{}')", bound(i), bound(i + 1));
    (text, move |h: u64| h >> 62 == i)
}

fn enc(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

fn key(o: &Value) -> String {
    format!(
        "{}/{}",
        o["metadata"]["namespace"].as_str().unwrap_or(""),
        o["metadata"]["name"].as_str().unwrap()
    )
}

fn uid(o: &Value) -> String {
    o["metadata"]["uid"].as_str().expect("uid").to_owned()
}

/// 40 configmaps over three namespaces; returns the last RV.
fn populate(env: &Env) -> u64 {
    let mut rv = 0;
    for i in 0..40 {
        rv = env.create_cm(["a", "b", "c"][i % 3], &format!("cm-{i:02}"), json!({"app": "x"}));
    }
    rv
}

/// key → uid of every configmap, from the sim itself.
async fn truth(env: &Env) -> BTreeMap<String, String> {
    let v = env.get_sim("/api/v1/configmaps").await.json();
    v["items"].as_array().unwrap().iter().map(|o| (key(o), uid(o))).collect()
}

fn keys(v: &Value) -> Vec<String> {
    v["items"].as_array().unwrap().iter().map(key).collect()
}

#[tokio::test]
async fn sharded_lists_partition_the_collection_in_every_form() {
    let env = start().await;
    let mid = populate(&env);
    let rv = env.create_cm("a", "late", json!({}));
    env.synced_to(rv).await;
    let all = truth(&env).await;
    assert_eq!(all.len(), 41);
    let at_mid: BTreeSet<String> = all.keys().filter(|k| *k != "a/late").cloned().collect();

    let mut union = BTreeSet::new();
    let mut union_pages = BTreeSet::new();
    let mut union_exact = BTreeSet::new();
    let mut union_proto = BTreeSet::new();
    let mut most_pages = 0;
    for i in 0..4 {
        let (sel, inside) = quarter(i);
        let q = enc(&sel);
        let want: BTreeSet<String> =
            all.iter().filter(|(_, u)| inside(fnv(u))).map(|(k, _)| k.clone()).collect();

        // resourceVersion=0: from the cache, only the shard, shardInfo echoed.
        let r = env
            .get_from_cache(&format!("/api/v1/configmaps?resourceVersion=0&shardSelector={q}"), false)
            .await;
        assert_eq!(r.status, 200);
        let v = r.json();
        assert_eq!(v["metadata"]["shardInfo"], json!({"selector": sel}));
        let got: Vec<String> = keys(&v);
        for item in v["items"].as_array().unwrap() {
            assert!(inside(fnv(&uid(item))), "{} outside shard {i}", key(item));
        }
        assert_eq!(got.iter().cloned().collect::<BTreeSet<_>>(), want, "shard {i}");
        for k in got {
            assert!(union.insert(k.clone()), "{k} in two shards");
        }

        // Paginated (NotOlderThan + limit, then continue tokens): every page sharded, echoed,
        // no remainingItemCount (a selector makes the count unknown, as with labels).
        let mut url = format!("/api/v1/configmaps?resourceVersion={rv}&resourceVersionMatch=NotOlderThan&limit=4&shardSelector={q}");
        let mut pages = 0;
        loop {
            let v = env.get_from_cache(&url, false).await.json();
            pages += 1;
            assert_eq!(v["metadata"]["shardInfo"]["selector"], sel.as_str());
            assert!(v["metadata"].get("remainingItemCount").is_none());
            assert!(v["items"].as_array().unwrap().len() <= 4);
            for k in keys(&v) {
                assert!(want.contains(&k) && union_pages.insert(k.clone()), "page item {k}");
            }
            match v["metadata"]["continue"].as_str() {
                Some(c) if !c.is_empty() => {
                    url = format!("/api/v1/configmaps?limit=4&continue={}&shardSelector={q}", enc(c))
                }
                _ => break,
            }
        }
        // The shards' sizes follow the random uids: a shard of 4 or fewer is one page.
        assert!(pages >= want.len().div_ceil(4).max(1), "shard {i}: {pages} pages for {} items", want.len());
        most_pages = most_pages.max(pages);

        // Exact at an earlier RV: the shard of the state then.
        let v = env
            .get_from_cache(
                &format!(
                    "/api/v1/configmaps?resourceVersion={mid}&resourceVersionMatch=Exact&shardSelector={q}"
                ),
                false,
            )
            .await
            .json();
        assert_eq!(v["metadata"]["resourceVersion"], mid.to_string());
        assert_eq!(v["metadata"]["shardInfo"]["selector"], sel.as_str());
        for k in keys(&v) {
            assert!(
                want.contains(&k) && at_mid.contains(&k) && union_exact.insert(k.clone()),
                "exact item {k}"
            );
        }

        // Metadata only: filtered the same, but no shardInfo (asPartialObjectMetadataList
        // copies only resourceVersion, continue and remainingItemCount in 1.36).
        let url = env.proxy_url(&format!("/api/v1/configmaps?resourceVersion=0&shardSelector={q}"));
        let r = send(&env.client, Method::GET, &url, None, &[("accept", META_LIST)]).await;
        let v = r.json();
        assert_eq!(v["kind"], "PartialObjectMetadataList");
        assert!(v["metadata"].get("shardInfo").is_none(), "{}", v["metadata"]);
        assert_eq!(keys(&v).into_iter().collect::<BTreeSet<_>>(), want);

        // Protobuf: ListMeta field 5 = ShardInfo{selector = 1}.
        let r = send(&env.client, Method::GET, &url, None, &[("accept", KUBELET)]).await;
        assert_eq!(r.headers["content-type"], "application/vnd.kubernetes.protobuf");
        let unknown = r.body.strip_prefix(b"k8s\0").expect("magic");
        let list = field(unknown, 2).expect("raw");
        let meta = field(list, 1).expect("ListMeta");
        let info = field(meta, 5).expect("shardInfo");
        assert_eq!(field(info, 1), Some(sel.as_bytes()));
        for (n, _, item) in fields(list).unwrap() {
            if n == 2 {
                let m = field(item, 1).unwrap();
                let name = String::from_utf8(field(m, 1).unwrap().to_vec()).unwrap();
                let ns = String::from_utf8(field(m, 3).unwrap().to_vec()).unwrap();
                let k = format!("{ns}/{name}");
                assert!(want.contains(&k) && union_proto.insert(k.clone()), "protobuf item {k}");
            }
        }
    }
    assert!(most_pages >= 2, "pagination exercised");
    let everything: BTreeSet<String> = all.keys().cloned().collect();
    assert_eq!(union, everything, "the shards together are the whole list");
    assert_eq!(union_pages, everything);
    assert_eq!(union_exact, at_mid);
    assert_eq!(union_proto, everything);

    // By namespace: halves of the hash space; each namespace wholly in one half.
    let half = |lo: &str, hi: &str| format!("shardRange(object.metadata.namespace, '{lo}', '{hi}')");
    let halves =
        [half("0x0000000000000000", "0x8000000000000000"), half("0x8000000000000000", "0x10000000000000000")];
    let mut seen = BTreeSet::new();
    for (i, sel) in halves.iter().enumerate() {
        let v = env
            .get_from_cache(
                &format!("/api/v1/configmaps?resourceVersion=0&shardSelector={}", enc(sel)),
                false,
            )
            .await
            .json();
        for item in v["items"].as_array().unwrap() {
            let ns = item["metadata"]["namespace"].as_str().unwrap();
            assert_eq!((fnv(ns) >> 63) as usize, i, "{ns} in half {i}");
            assert!(seen.insert(key(item)));
        }
    }
    assert_eq!(seen, everything);

    // Another spelling of the same selector: echoed in the canonical form.
    let (sel, _) = quarter(1);
    let spelled = "shardRange( object.metadata.uid,\"0x4000000000000000\" ,'0x8000000000000000')";
    let v = env
        .get_from_cache(
            &format!("/api/v1/configmaps?resourceVersion=0&shardSelector={}", enc(spelled)),
            false,
        )
        .await
        .json();
    assert_eq!(v["metadata"]["shardInfo"]["selector"], sel.as_str());
    // A GET of one object takes no shardSelector (GetOptions): the object, whatever its shard.
    let r = env
        .get_from_cache(
            &format!(
                "/api/v1/namespaces/a/configmaps/late?resourceVersion=0&shardSelector={}",
                enc(&quarter(0).0)
            ),
            true,
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["metadata"]["name"], "late");
    env.proxy.shutdown().await;
}

#[tokio::test]
async fn invalid_selectors_get_the_apiservers_error_and_unusual_ones_go_upstream() {
    let env = start().await;
    let rv = populate(&env);
    env.synced_to(rv).await;
    let status = |message: &str| json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":message,"code":500});
    let name = enc("shardRange(object.metadata.name, '0x0000000000000000', '0x8000000000000000')");
    let cases = [
        (format!("/api/v1/configmaps?resourceVersion=0&shardSelector={name}"), "invalid shard selector: unsupported field path \"object.metadata.name\"; supported: object.metadata.uid, object.metadata.namespace"),
        (
            format!("/api/v1/configmaps?watch=true&resourceVersion={rv}&shardSelector={}", enc("shardRange(object.metadata.uid, '0x0', '0x8000000000000000')")),
            "invalid shard selector: hexStart must be a 0x-prefixed 16-digit hex value, got \"0x0\" (did you mean \"0x0000000000000000\"?)",
        ),
        // Parsed before storage looks at the resourceVersion (with a continue token the
        // apiserver's to refuse: `classify` tests).
        (format!("/api/v1/configmaps?resourceVersion=abc&shardSelector={}", enc(" ")), "invalid shard selector: empty shard selector is not allowed; omit the parameter for unfiltered lists"),
    ];
    for (url, message) in cases {
        let r = env.get_from_cache(&url, false).await;
        assert_eq!(r.status, 500, "{url}");
        assert_eq!(r.json(), status(message), "{url}");
    }
    // ListOptions validation (422) comes first.
    let r = env.get(&format!("/api/v1/configmaps?resourceVersionMatch=Exact&shardSelector={name}")).await;
    assert_eq!(r.status, 422);
    // `shardSelector=` is no selector at all.
    let r = env.get_from_cache("/api/v1/configmaps?resourceVersion=0&shardSelector=", false).await;
    assert_eq!(r.json()["items"].as_array().unwrap().len(), 40);
    assert!(r.json()["metadata"].get("shardInfo").is_none());

    // A form only CEL reads (parenthesised): forwarded untouched; the 1.28 upstream ignores
    // it, so the answer is whole and says nothing about shards.
    let odd = format!(
        "/api/v1/configmaps?resourceVersion=0&shardSelector={}",
        enc("(shardRange(object.metadata.uid, '0x0000000000000000', '0x4000000000000000'))")
    );
    assert_eq!(env.upstream_exact(&odd), 0);
    let r = env.get(&odd).await;
    assert_eq!(env.upstream_exact(&odd), 1, "forwarded as sent");
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["items"].as_array().unwrap().len(), 40);
    assert!(r.json()["metadata"].get("shardInfo").is_none());
    env.proxy.shutdown().await;
}

#[tokio::test]
async fn forwarded_reads_are_the_upstreams_answer_without_shard_info() {
    let opts = kube_watchcache_sim::SimOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        objects: 0,
        ..Default::default()
    };
    let env = start_edited(opts, |a| a.consistent_reads = "upstream".into()).await;
    let rv = populate(&env);
    env.synced_to(rv).await;
    let (sel, _) = quarter(2);
    // Most Recent LIST: forwarded (`--consistent-reads=upstream`), the query untouched.
    let url = format!("/api/v1/configmaps?shardSelector={}", enc(&sel));
    let r = env.get(&url).await;
    assert_eq!(env.upstream_exact(&url), 1);
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["items"].as_array().unwrap().len(), 40, "the 1.28 upstream ignores the selector");
    assert!(r.json()["metadata"].get("shardInfo").is_none());
    // An Exact LIST outside the history window: forwarded too.
    let url = format!(
        "/api/v1/configmaps?resourceVersion=1&resourceVersionMatch=Exact&shardSelector={}",
        enc(&sel)
    );
    let r = env.get(&url).await;
    assert_eq!(env.upstream_exact(&url), 1);
    assert!(!String::from_utf8_lossy(&r.body).contains("shardInfo"));
    // A Most Recent watch without initial events: forwarded, every event.
    let url = format!("/api/v1/namespaces/a/configmaps?watch=true&sendInitialEvents=false&resourceVersionMatch=NotOlderThan&shardSelector={}", enc(&sel));
    let mut w = open_watch(&env.client, &env.proxy_url(&url)).await;
    assert_eq!(w.status, 200);
    // The upstream starts such a watch after its response head: probe until it is running.
    for i in 0.. {
        assert!(i < 50, "the forwarded watch never started");
        env.create_cm("a", &format!("probe-{i}"), json!({}));
        if !w.take(1, Duration::from_millis(100)).await.is_empty() {
            break;
        }
    }
    // Any probe event left over comes first; then all eight.
    for i in 0..8 {
        env.create_cm("a", &format!("new-{i}"), json!({}));
    }
    let mut got = w.take(8, T).await;
    while got.len() < 8 || got.iter().any(|(_, n)| n.starts_with("probe-")) {
        got.retain(|(_, n)| !n.starts_with("probe-"));
        let more = w.take(8 - got.len(), T).await;
        assert!(!more.is_empty(), "all eight, whatever their shard: {got:?}");
        got.extend(more);
    }
    let names: Vec<_> = got.iter().map(|(_, n)| n.clone()).collect();
    assert_eq!(
        names,
        (0..8).map(|i| format!("new-{i}")).collect::<Vec<_>>(),
        "all eight, whatever their shard"
    );
    assert_eq!(env.upstream_exact(&url), 1);
    env.proxy.shutdown().await;
}

/// Reads a protobuf watch's events (type, key, rv) until `idle` passes without one.
async fn proto_events(body: &mut hyper::body::Incoming, idle: Duration) -> Vec<(String, String, u64)> {
    let mut buf = Vec::new();
    let mut out = Vec::new();
    while let Ok(Some(Ok(f))) = tokio::time::timeout(idle, body.frame()).await {
        if let Ok(d) = f.into_data() {
            buf.extend_from_slice(&d);
        }
        for frame in take_frames(&mut buf) {
            let e = WatchEvent::parse(&frame).expect("a watch event");
            out.push((e.type_, e.key, e.rv));
        }
    }
    out
}

fn summary(e: &Value) -> (String, String, u64) {
    let o = &e["object"];
    (
        e["type"].as_str().unwrap().to_owned(),
        key(o),
        o["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap(),
    )
}

async fn drain(w: &mut WatchLines, idle: Duration) -> Vec<Value> {
    let mut out = Vec::new();
    while let Some(e) = w.next(idle).await {
        out.push(e);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_watchers_see_exactly_their_events() {
    let env = start().await;
    let rv = populate(&env);
    env.synced_to(rv).await;
    let all = truth(&env).await;
    let base = "/api/v1/configmaps?watch=true&allowWatchBookmarks=true";
    let whole = open_watch(&env.client, &env.proxy_url(&format!("{base}&resourceVersion={rv}"))).await;
    let mut whole = whole;
    let mut watches = Vec::new();
    let mut lists = Vec::new();
    for i in 0..4 {
        let q = enc(&quarter(i).0);
        watches.push(
            open_watch(
                &env.client,
                &env.proxy_url(&format!("{base}&resourceVersion={rv}&shardSelector={q}")),
            )
            .await,
        );
        lists.push(
            open_watch(
                &env.client,
                &env.proxy_url(&format!("{base}&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&resourceVersion=0&shardSelector={q}")),
            )
            .await,
        );
    }
    // A kubelet-like protobuf watcher of shard 3.
    let url = env.proxy_url(&format!("{base}&resourceVersion={rv}&shardSelector={}", enc(&quarter(3).0)));
    let req = http::Request::get(url)
        .header("accept", KUBELET)
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let resp = env.client.request(req).await.unwrap();
    assert_eq!(resp.headers()["content-type"], "application/vnd.kubernetes.protobuf;stream=watch");
    let mut proto = resp.into_body();

    // Watch-lists: the shard's objects as ADDED, then the end BOOKMARK (an object, not a list:
    // no shardInfo, as in 1.36).
    for (i, w) in lists.iter_mut().enumerate() {
        let (_, inside) = quarter(i as u64);
        let mut initial = BTreeSet::new();
        loop {
            let e = w.next(T).await.expect("initial event");
            if e["type"] == "BOOKMARK" {
                assert_eq!(e["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"], "true");
                assert!(!e.to_string().contains("shardInfo"));
                break;
            }
            assert_eq!(e["type"], "ADDED");
            assert!(inside(fnv(&uid(&e["object"]))));
            initial.insert(key(&e["object"]));
        }
        let want: BTreeSet<String> =
            all.iter().filter(|(_, u)| inside(fnv(u))).map(|(k, _)| k.clone()).collect();
        assert_eq!(initial, want, "watch-list {i}");
    }

    // Churn: creations, updates (label changes too), deletions.
    let mut last = rv;
    for i in 0..30 {
        last = env.create_cm("b", &format!("churn-{i}"), json!({"app": "y"}));
    }
    for i in 0..40 {
        let ns = ["a", "b", "c"][i % 3];
        last =
            env.update_cm(ns, &format!("cm-{i:02}"), json!({"app": if i % 2 == 0 { "x" } else { "z" }}), "2");
    }
    for i in (0..30).step_by(3) {
        last = env.delete_cm("b", &format!("churn-{i}"));
    }
    env.synced_to(last).await;

    let idle = Duration::from_millis(800);
    let everything: Vec<Value> =
        drain(&mut whole, idle).await.into_iter().filter(|e| e["type"] != "BOOKMARK").collect();
    assert_eq!(everything.len(), 30 + 40 + 10);
    let mut filtered_out = 0;
    for (i, (w, l)) in watches.iter_mut().zip(lists.iter_mut()).enumerate() {
        let (_, inside) = quarter(i as u64);
        let want: Vec<_> =
            everything.iter().filter(|e| inside(fnv(&uid(&e["object"])))).map(summary).collect();
        filtered_out += everything.len() - want.len();
        for (what, w) in [("watch", w), ("watch-list", l)] {
            let got: Vec<_> =
                drain(w, idle).await.iter().filter(|e| e["type"] != "BOOKMARK").map(summary).collect();
            assert_eq!(got, want, "{what} of shard {i}: exactly its part, in order");
        }
        if i == 3 {
            let got: Vec<_> =
                proto_events(&mut proto, idle).await.into_iter().filter(|e| e.0 != "BOOKMARK").collect();
            assert_eq!(got, want, "protobuf watch of shard 3");
        }
    }

    // Metrics: 9 sharded watches open; every event a sharded watch did not get, counted.
    let m = env.get("/watchcache/metrics").await;
    let text = String::from_utf8_lossy(&m.body).into_owned();
    let value = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{name}{{resource=\"configmaps\"}}")))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("{name} in\n{text}"))
    };
    assert_eq!(value("watchcache_watch_shards_total"), 9.0);
    // Each of the 4 watches and 4 watch-lists skipped the others' events; the protobuf one too.
    let proto_skipped = everything.iter().filter(|e| !quarter(3).1(fnv(&uid(&e["object"])))).count();
    assert_eq!(value("watchcache_watch_filtered_events_total"), (2 * filtered_out + proto_skipped) as f64);
    drop(watches);
    drop(lists);
    drop(proto);
    env.proxy.shutdown().await;
}

mod relist {
    //! A kube-state-metrics-like informer per shard through churn and a relist of the proxy
    //! (its upstream watch stalled while the sim changes and compacts, then cut: `common::fault`).

    use super::*;
    use common::fault::Fault;
    use common::mirror::{Applied, Mirror, Stream};
    use kube_watchcache::app;
    use kube_watchcache::resource::Rv;
    use kube_watchcache_sim::{Sim, SimOptions};

    const PATH: &str = "/api/v1/namespaces/t/configmaps";
    const IDLE: Duration = Duration::from_millis(700);

    fn cm(name: &str, v: &str) -> Value {
        json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":name,"namespace":"t"},"data":{"v":v}})
    }

    /// One shard's informer: its state, and the changes its watches delivered.
    struct Informer {
        query: String,
        inside: Box<dyn Fn(u64) -> bool>,
        mirror: Mirror,
        stream: Stream,
        changes: Vec<(String, String, u64)>,
    }

    impl Informer {
        async fn start(client: &HttpClient, base: &str, i: u64) -> Informer {
            let (sel, inside) = quarter(i);
            let query = format!("shardSelector={}", enc(&sel));
            let mirror =
                Mirror::list(client, &format!("{base}{PATH}?resourceVersion=0&{query}")).await.expect("list");
            let stream = Stream::open(client, &Self::watch_url(base, &query, mirror.rv)).await;
            Informer { query, inside: Box::new(inside), mirror, stream, changes: Vec::new() }
        }

        fn watch_url(base: &str, query: &str, rv: u64) -> String {
            format!("{base}{PATH}?watch=true&allowWatchBookmarks=true&resourceVersion={rv}&{query}")
        }

        /// Applies what arrives until the stream is idle; whether it ended.
        async fn catch_up(&mut self) -> bool {
            let (events, ended) = self.stream.collect(IDLE).await;
            for e in &events {
                if let Applied::Error(code) = self.mirror.apply(e) {
                    panic!("error {code} on a live sharded watch");
                }
                if e["type"] != "BOOKMARK" {
                    self.changes.push(summary(e));
                }
            }
            ended
        }

        /// After its stream ended: re-watch from the last RV (410 past a relist), relist the
        /// shard, watch again.
        async fn resume(&mut self, client: &HttpClient, base: &str) {
            let mut s = Stream::open(client, &Self::watch_url(base, &self.query, self.mirror.rv)).await;
            let (events, _) = s.collect(IDLE).await;
            let gone = events.iter().any(|e| self.mirror.apply(e) == Applied::Error(410));
            assert!(gone, "the resume from before the relist is 410: {events:?}");
            let url = format!("{base}{PATH}?resourceVersion=0&{}", self.query);
            let list = send(client, Method::GET, &url, None, &[]).await.json();
            assert!(list["metadata"]["shardInfo"]["selector"].is_string(), "the relist is served sharded");
            self.mirror = Mirror::list(client, &url).await.expect("relist");
            self.stream = Stream::open(client, &Self::watch_url(base, &self.query, self.mirror.rv)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sharded_informers_stay_exact_through_churn_and_a_relist() {
        let sim = Sim::start(SimOptions::default()).await.expect("sim");
        sim.sim
            .create("namespaces", "", json!({"apiVersion":"v1","kind":"Namespace","metadata":{"name":"t"}}))
            .unwrap();
        let fault = Fault::start(sim.addr).await;
        let mut args = serve_args(fault.addr, &["configmaps"]);
        args.security.max_watches_per_user = 0;
        let proxy = app::start(&args).await.expect("proxy starts");
        assert!(proxy.wait_ready(Duration::from_secs(20)).await);
        let reader = proxy.readers().into_iter().find(|r| r.kind().resource == "configmaps").unwrap().clone();
        let synced = |rv: u64| {
            let reader = reader.clone();
            async move { reader.wait_for(Rv(rv), Duration::from_secs(20)).await.expect("cache caught up") }
        };
        let rv_of = |o: Value| o["metadata"]["resourceVersion"].as_str().unwrap().parse::<u64>().unwrap();
        let create = |n: &str| rv_of(sim.sim.create("configmaps", "t", cm(n, "0")).expect("create"));
        let update = |n: &str, v: &str| rv_of(sim.sim.update("configmaps", "t", cm(n, v)).expect("update"));
        let delete = |n: &str| rv_of(sim.sim.delete("configmaps", "t", n).expect("delete"));
        let client = client();
        let base = format!("http://{}", proxy.addr);
        let mut last = 0;
        for i in 0..24 {
            last = create(&format!("o{i}"));
        }
        synced(last).await;

        let mut informers = Vec::new();
        for i in 0..4 {
            informers.push(Informer::start(&client, &base, i).await);
        }
        let mut whole =
            Stream::open(&client, &format!("{base}{PATH}?watch=true&resourceVersion={last}")).await;
        // Churn.
        for i in 0..24 {
            last = update(&format!("o{i}"), "1");
        }
        for i in 0..6 {
            last = delete(&format!("o{i}"));
            last = last.max(create(&format!("p{i}")));
        }
        synced(last).await;
        let (reference, _) = whole.collect(IDLE).await;
        assert_eq!(reference.len(), 24 + 12);
        for (i, inf) in informers.iter_mut().enumerate() {
            assert!(!inf.catch_up().await, "shard {i} still watching");
            let want: Vec<_> =
                reference.iter().filter(|e| (inf.inside)(fnv(&uid(&e["object"])))).map(summary).collect();
            assert_eq!(inf.changes, want, "shard {i}: exactly its part of the events");
        }

        // A relist: the upstream watch stalls while the sim moves past its compaction window,
        // then is cut; the proxy relists and ends the watches that started before.
        let lists = || sim.sim.request_count(|r| common::reflector_list(r, "/api/v1/configmaps"));
        let before = lists();
        fault.stall_watches(true);
        for i in 6..10 {
            delete(&format!("o{i}"));
        }
        for i in 0..4 {
            create(&format!("gap{i}"));
        }
        // Compacted past the cache's RV: the proxy's re-watch gets 410, so it relists.
        sim.sim.compact();
        fault.drop_all();
        fault.stall_watches(false);
        let end = std::time::Instant::now() + Duration::from_secs(20);
        while lists() == before {
            assert!(std::time::Instant::now() < end, "the proxy relisted");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        synced(sim.sim.current_rv().0).await;
        for inf in informers.iter_mut() {
            assert!(inf.catch_up().await, "a watch from before the relist ends");
            inf.resume(&client, &base).await;
        }
        // More churn after the relist.
        for i in 10..24 {
            last = update(&format!("o{i}"), "2");
        }
        last = last.max(create("after"));
        synced(last).await;

        let sim_state: BTreeMap<String, (String, u64)> = {
            let v = send(&client, Method::GET, &format!("http://{}{PATH}", sim.addr), None, &[]).await.json();
            v["items"].as_array().unwrap().iter().map(|o| (key(o), (uid(o), rv_of(o.clone())))).collect()
        };
        let mut union = BTreeMap::new();
        for (i, inf) in informers.iter_mut().enumerate() {
            assert!(!inf.catch_up().await);
            assert!(inf.mirror.anomalies.is_empty(), "shard {i}: {:?}", inf.mirror.anomalies);
            let want: BTreeMap<String, u64> = sim_state
                .iter()
                .filter(|(_, (u, _))| (inf.inside)(fnv(u)))
                .map(|(k, (_, rv))| (k.clone(), *rv))
                .collect();
            assert_eq!(inf.mirror.objects, want, "shard {i} holds exactly its part of the sim's state");
            union.extend(inf.mirror.objects.clone());
        }
        assert_eq!(union.len(), sim_state.len(), "the shards together hold everything");
        proxy.shutdown().await;
    }
}
