//! The managedFields opt-out (`Accept: …;drop=metadata.managedFields`, KEP-5958; issue 34
//! item 2) through the proxy in front of the simulated 1.28 apiserver, which ignores the
//! parameter: what the cache serves is what a 1.38 apiserver with `ManagedFieldsOptOut` sends
//! (the objects without `metadata.managedFields`, the response's media type without the
//! parameter), for LIST, GET and WATCH, JSON and protobuf, objects and metadata, built-in kinds
//! and custom resources; the same read without the parameter keeps them; a clause whose `drop`
//! the apiserver refuses is skipped for the next; what is forwarded comes back as the upstream
//! answers it (from a 1.28 apiserver: with managedFields). Run by `cargo test --test serving`.

use crate::common;

use std::time::Duration;

use common::pb::{fields, lean_envelope, lean_list, lean_object, take_frames};
use common::*;
use http::Method;
use http_body_util::BodyExt;
use serde_json::{json, Value};

const T: Duration = Duration::from_secs(5);
const DROP: &str = ";drop=metadata.managedFields";
const PB: &str = "application/vnd.kubernetes.protobuf";

/// Server-side-apply bookkeeping as a 1.28 apiserver writes it: an applier and a controller.
fn managed_fields(app: &str) -> Value {
    json!([
        {"manager": "kubectl", "operation": "Apply", "apiVersion": "v1", "time": "2026-11-26T10:00:00Z",
         "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {"f:k": {}}, "f:metadata": {"f:labels": {"f:app": {}}}}},
        {"manager": "controller", "operation": "Update", "apiVersion": "v1", "time": "2026-11-26T10:00:01Z",
         "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:annotations": {".": {}, format!("f:{app}"): {}}}}}
    ])
}

fn cm(ns: &str, name: &str, data: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": name, "namespace": ns, "labels": {"app": "x"}, "annotations": {"a": "b"},
                        "managedFields": managed_fields(name)},
           "data": {"k": data}})
}

fn create(env: &Env, ns: &str, name: &str) -> u64 {
    env.ns(ns);
    rv_of(&env.sim.sim.create("configmaps", ns, cm(ns, name, "v")).expect("create"))
}

fn has_mf(o: &Value) -> bool {
    o["metadata"].get("managedFields").is_some()
}

/// `GET` through the proxy with an `Accept`, asserting whether the sim saw it.
async fn get(env: &Env, path_and_query: &str, accept: &str, forwarded: bool) -> Resp {
    let before = env.upstream_exact(path_and_query);
    let r = send(&env.client, Method::GET, &env.proxy_url(path_and_query), None, &[("accept", accept)]).await;
    assert_eq!(r.status, 200, "{path_and_query} {accept}: {:?}", String::from_utf8_lossy(&r.body));
    let seen = env.upstream_exact(path_and_query) - before;
    assert_eq!(seen, usize::from(forwarded), "{path_and_query} {accept}: forwarded = {forwarded}");
    r
}

#[tokio::test]
async fn lists_and_gets_from_the_cache_leave_managed_fields_out_when_asked() {
    let env = start().await;
    let mut rv = 0;
    for i in 0..12 {
        rv = create(&env, ["a", "b"][i % 2], &format!("cm-{i:02}"));
    }
    env.synced_to(rv).await;
    let upstream = env.get_sim("/api/v1/configmaps").await.json();
    assert!(upstream["items"].as_array().unwrap().iter().all(has_mf), "the sim keeps what was written");

    // JSON LIST: the sim's list without managedFields; the media type is not echoed.
    let path = "/api/v1/configmaps?resourceVersion=0";
    let full = get(&env, path, "application/json", false).await;
    let lean = get(&env, path, &format!("application/json{DROP}"), false).await;
    assert_eq!(lean.headers["content-type"], "application/json");
    assert_eq!(full.json(), upstream);
    assert_eq!(lean.json(), common::without_managed_fields(upstream.clone()));
    // client-go with the opt-out sends it on each clause.
    let both = get(&env, path, &format!("application/json{DROP},*/*{DROP}"), false).await;
    assert_eq!(both.body, lean.body);

    // Paginated: each page lean, the same continue tokens.
    let p1 =
        get(&env, "/api/v1/configmaps?resourceVersion=0&limit=5", &format!("application/json{DROP}"), false)
            .await;
    let f1 = get(&env, "/api/v1/configmaps?resourceVersion=0&limit=5", "application/json", false).await;
    assert_eq!(p1.json(), common::without_managed_fields(f1.json()));

    // Protobuf: the proxy's full protobuf less ObjectMeta field 17 in each item.
    let full = get(&env, path, &format!("{PB}, application/json"), false).await;
    let lean = get(&env, path, &format!("{PB}{DROP}, application/json{DROP}"), false).await;
    assert_eq!(lean.headers["content-type"], PB);
    assert_ne!(full.body, lean.body);
    assert_eq!(lean.body.to_vec(), lean_envelope(&full.body, &lean_list));

    // Metadata only, JSON and protobuf.
    let meta = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";
    let full = get(&env, path, meta, false).await.json();
    assert!(full["items"].as_array().unwrap().iter().all(has_mf));
    let lean = get(&env, path, &format!("{meta}{DROP}"), false).await;
    assert_eq!(lean.json(), common::without_managed_fields(full));
    let pb_meta = format!("{PB};as=PartialObjectMetadataList;g=meta.k8s.io;v=v1");
    let full = get(&env, path, &pb_meta, false).await;
    let lean = get(&env, path, &format!("{pb_meta}{DROP}"), false).await;
    assert_eq!(lean.body.to_vec(), lean_envelope(&full.body, &lean_list));

    // GET at resourceVersion=0, from the cache: JSON and protobuf.
    let obj = "/api/v1/namespaces/a/configmaps/cm-00?resourceVersion=0";
    let full = get(&env, obj, "application/json", false).await.json();
    assert!(has_mf(&full));
    assert_eq!(
        get(&env, obj, &format!("application/json{DROP}"), false).await.json(),
        common::without_managed_fields(full)
    );
    let full = get(&env, obj, PB, false).await;
    let lean = get(&env, obj, &format!("{PB}{DROP}"), false).await;
    assert_eq!(lean.body.to_vec(), lean_envelope(&full.body, &lean_object));

    // A custom resource (unstructured, keys sorted): JSON from the cache.
    env.ns("w");
    let mut w = json!({"apiVersion": "example.com/v1", "kind": "Widget",
                       "metadata": {"name": "w1", "namespace": "w", "managedFields": managed_fields("w1")},
                       "spec": {"size": 3}});
    let created = env.sim.sim.create("example.com/widgets", "w", w.take()).expect("create widget");
    env.cache_synced_to("widgets", rv_of(&created)).await;
    let wpath = "/apis/example.com/v1/widgets?resourceVersion=0";
    let full = env.get_sim("/apis/example.com/v1/widgets").await.json();
    assert!(has_mf(&full["items"][0]));
    let lean = get(&env, wpath, &format!("application/json{DROP}"), false).await;
    assert_eq!(lean.json(), common::without_managed_fields(full));
}

#[tokio::test]
async fn refused_drop_values_and_forwarded_reads_are_the_apiservers() {
    let env = start().await;
    let rv = create(&env, "a", "cm-0");
    env.synced_to(rv).await;
    let path = "/api/v1/configmaps?resourceVersion=0";

    // An unknown or repeated target skips its clause (1.38): the next one answers.
    for bad in ["spec", "metadata.managedFields+metadata.managedFields", "spec+metadata.managedFields"] {
        let r = get(&env, path, &format!("application/json;drop={bad}, application/json"), false).await;
        assert!(has_mf(&r.json()["items"][0]), "drop={bad}");
        let r = get(&env, path, &format!("{PB};drop={bad}, application/json{DROP}"), false).await;
        assert_eq!(r.headers["content-type"], "application/json", "drop={bad}");
        assert!(!has_mf(&r.json()["items"][0]), "drop={bad}");
    }
    // An empty `drop=` never reaches the apiserver (goautoneg drops a parameter without a
    // value): the clause is a plain one.
    let r = get(&env, path, &format!("{PB};drop=, application/json{DROP}"), false).await;
    assert_eq!(r.headers["content-type"], PB);
    // No clause left: a 1.38 apiserver's 406, which the cache does not make up; the upstream
    // answers (a 1.28 one ignores the parameter).
    let r = get(&env, path, "application/json;drop=spec", true).await;
    assert!(has_mf(&r.json()["items"][0]));

    // Forwarded reads (here a GET of the most recent version) go upstream untouched: an
    // apiserver that knows the parameter drops the field, a 1.28 one sends it.
    let r = get(&env, "/api/v1/namespaces/a/configmaps/cm-0", &format!("application/json{DROP}"), true).await;
    assert!(has_mf(&r.json()), "the upstream's answer, not the cache's");
    // Table stays the apiserver's too.
    let table = format!("application/json;as=Table;v=v1;g=meta.k8s.io{DROP}");
    get(&env, path, &table, true).await;

    // Counted by where they were answered: the three lean LISTs above from the cache; the GET
    // and the Table upstream (refused values ask for nothing: not counted).
    let m = env.get("/watchcache/metrics").await;
    let text = String::from_utf8_lossy(&m.body).into_owned();
    let value = |answered: &str| {
        let series = format!("watchcache_drop_managed_fields_requests_total{{answered=\"{answered}\",resource=\"configmaps\"}}");
        text.lines()
            .find(|l| l.starts_with(&series))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("{series} in\n{text}"))
    };
    assert_eq!((value("cache"), value("upstream")), (3.0, 2.0));
}

#[tokio::test]
async fn watchers_with_and_without_the_opt_out_each_get_their_form() {
    let env = start().await;
    let rv = create(&env, "a", "cm-0");
    env.synced_to(rv).await;
    let base = format!("/api/v1/namespaces/a/configmaps?watch=1&resourceVersion={rv}");
    let full_w = open_watch_with(&env.client, &env.proxy_url(&base), &[]).await;
    let lean_url = env.proxy_url(&base);
    let accept = format!("application/json{DROP}");
    let lean_w = open_watch_with(&env.client, &lean_url, &[("accept", &accept)]).await;
    assert_eq!(lean_w.headers["content-type"], "application/json");
    let req = http::Request::get(env.proxy_url(&base))
        .header("accept", format!("{PB}{DROP}"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let resp = env.client.request(req).await.unwrap();
    assert_eq!(resp.headers()["content-type"], "application/vnd.kubernetes.protobuf;stream=watch");
    let mut pb = resp.into_body();
    let req = http::Request::get(env.proxy_url(&base))
        .header("accept", PB)
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let mut pb_full = env.client.request(req).await.unwrap().into_body();

    // Added (with and without a watcher's own filter), modified, deleted.
    create(&env, "a", "cm-1");
    env.sim.sim.update("configmaps", "a", cm("a", "cm-1", "2")).expect("update");
    let last = rv_of(&env.sim.sim.delete("configmaps", "a", "cm-1").expect("delete"));
    env.synced_to(last).await;

    // The initial events of a watch from rv 0 and of a watch-list, and its end BOOKMARK.
    for q in [
        "resourceVersion=0",
        "sendInitialEvents=true&resourceVersionMatch=NotOlderThan&resourceVersion=0&allowWatchBookmarks=true",
    ] {
        let url = env.proxy_url(&format!("/api/v1/namespaces/a/configmaps?watch=1&{q}"));
        let mut w = open_watch_with(&env.client, &url, &[("accept", &accept)]).await;
        let e = w.next(T).await.expect("initial event");
        assert_eq!(
            (e["type"].as_str(), e["object"]["metadata"]["name"].as_str()),
            (Some("ADDED"), Some("cm-0")),
            "{q}"
        );
        assert!(!has_mf(&e["object"]) && e["object"]["data"]["k"] == "v", "{q}: {e}");
        if q.contains("sendInitialEvents") {
            let b = w.next(T).await.expect("bookmark");
            assert_eq!(b["type"], "BOOKMARK", "{q}");
            assert_eq!(b["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"], "true");
        }
    }

    let (mut full_w, mut lean_w) = (full_w, lean_w);
    for want in ["ADDED", "MODIFIED", "DELETED"] {
        let f = full_w.next(T).await.expect("full event");
        let l = lean_w.next(T).await.expect("lean event");
        assert_eq!((f["type"].as_str(), l["type"].as_str()), (Some(want), Some(want)));
        assert!(has_mf(&f["object"]), "{want}: kept without the parameter");
        assert_eq!(l["object"], common::without_managed_fields(f["object"].clone()), "{want}");
    }

    // Protobuf: each frame the full frame less field 17.
    let (mut buf, mut fbuf) = (Vec::new(), Vec::new());
    let (mut lean_frames, mut full_frames) = (Vec::new(), Vec::new());
    let deadline = tokio::time::Instant::now() + T;
    while lean_frames.len() < 3 || full_frames.len() < 3 {
        let next = async {
            tokio::select! {
                f = pb.frame() => buf.extend_from_slice(f.expect("frame").unwrap().data_ref().unwrap()),
                f = pb_full.frame() => fbuf.extend_from_slice(f.expect("frame").unwrap().data_ref().unwrap()),
            }
        };
        tokio::time::timeout_at(deadline, next).await.expect("protobuf events in time");
        lean_frames.extend(take_frames(&mut buf));
        full_frames.extend(take_frames(&mut fbuf));
    }
    for (l, f) in lean_frames.iter().zip(&full_frames) {
        // WatchEvent{type = 1, object = 2 (RawExtension{raw = 1: k8s\0 + Unknown})}.
        let lean_event = |ev: &[u8]| {
            common::pb::rebuild(ev, &|n, p| {
                Some(if n == 2 {
                    common::pb::rebuild(p, &|n, p| {
                        Some(if n == 1 { lean_envelope(p, &lean_object) } else { p.to_vec() })
                    })
                } else {
                    p.to_vec()
                })
            })
        };
        assert_ne!(l, f);
        assert_eq!(*l, lean_event(f));
        assert!(fields(l).is_some());
    }
}
