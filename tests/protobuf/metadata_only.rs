//! Metadata-only reads from the cache (issue 17, item 3): `as=PartialObjectMetadata[List];
//! g=meta.k8s.io;v=v1` in JSON, as the garbage collector and the quota controller ask for them.
//!
//! 1. Byte equality with a real kube-apiserver: `tests/recordings/v1.28.7-raw/metadata-only.json`
//!    (`record_raw.py`) holds, for every built-in kind of a 1.28.7 cluster, its full JSON LIST
//!    and GET and the metadata-only answers for the same object versions, plus one watch seen
//!    both ways at once. The full answers go into a cache as a reflector would put them; what
//!    the cache renders metadata-only must be the apiserver's bytes.
//! 2. End to end through the proxy in front of the sim: served from the cache (nothing
//!    upstream), equal to the sim's own metadata answers, live watch events metadata-only.

use crate::common;

use common::recorded::{group_version, RawList};
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use kube_watchcache::cache::{self, CacheOptions, Filter, Page, WatchRequest, WatchStart};
use kube_watchcache::metadata_only::Repr;
use kube_watchcache::resource::{EventType, ResourceKind, Rv};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

const META: &str = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";
/// client-go's metadata client (kube-controller-manager's garbage collector): protobuf first.
/// client-go's metadata client (kube-controller-manager's garbage collector) without its
/// leading protobuf clause: the JSON this file is about (the protobuf answers to the full header
/// are `tests/protobuf/protobuf.rs`').
const GC_LIST: &str = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";
const GC_WATCH: &str = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json";

fn recording() -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/recordings/v1.28.7-raw/metadata-only.json");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap()
}

fn body(v: &Value) -> &str {
    assert_eq!(v["status"], 200, "recorded status");
    v["body"].as_str().expect("a JSON body as text")
}

fn kind_of(entry: &Value, namespaced: bool) -> ResourceKind {
    let (g, v) = group_version(entry["path"].as_str().unwrap());
    let resource = entry["resource"].as_str().unwrap();
    let kind = entry["kind"].as_str().unwrap_or("");
    ResourceKind::new(&g, &v, resource, kind, namespaced, true)
}

#[test]
fn lists_of_every_builtin_kind_equal_the_apiservers_bytes() {
    let rec = recording();
    let lists = rec["lists"].as_array().unwrap();
    assert!(lists.len() >= 20, "the recording covers the built-in kinds");
    for entry in lists {
        let name = entry["resource"].as_str().unwrap();
        let full = body(&entry["full"]);
        let full_list: RawList = serde_json::from_str(full).unwrap();
        let items = full_list.items.unwrap_or_default();
        let namespaced = items.iter().any(|i| i.get().contains(r#""namespace":"#));
        let (mut w, r) = cache::new(kind_of(entry, namespaced), CacheOptions::default());
        let objects = items.iter().map(|i| w.parse(Bytes::from(i.get().to_owned())).unwrap()).collect();
        let rv: Value = serde_json::from_str(full_list.metadata.get()).unwrap();
        let rv = Rv(rv["resourceVersion"].as_str().unwrap().parse().unwrap());
        w.replace(objects, rv);
        let snap = r.snapshot();
        let page = || Some(Page { limit: 3, start: None, token_rv: rv.0 as i64 });

        // The recorded page may continue (the cache got only its items): compare with the
        // apiserver's bytes whose ListMeta is the cache's (same RV, no continuation).
        let expected = |recorded: &str| {
            let meta = serde_json::from_str::<RawList>(recorded).unwrap().metadata.get().to_owned();
            recorded.replacen(&meta, &format!(r#"{{"resourceVersion":"{rv}"}}"#), 1)
        };
        let got = r.list(&snap, &Filter::default().with_repr(Repr::Metadata), page()).unwrap().to_vec();
        let want = expected(body(&entry["metadata"]));
        assert_eq!(String::from_utf8(got).unwrap(), want, "{name}: metadata-only LIST");
        // The full list too: the cache's JSON is the apiserver's.
        let got = r.list(&snap, &Filter::default(), page()).unwrap().to_vec();
        assert_eq!(String::from_utf8(got).unwrap(), expected(full), "{name}: full LIST");
    }
}

#[test]
fn gets_of_every_builtin_kind_equal_the_apiservers_bytes() {
    let rec = recording();
    let gets = rec["gets"].as_array().unwrap();
    assert!(gets.len() >= 20);
    for entry in gets {
        let full = body(&entry["full"]);
        let obj: Value = serde_json::from_str(full).unwrap();
        let namespaced = obj["metadata"]["namespace"].is_string();
        let mut e = entry.clone();
        e["kind"] = obj["kind"].clone();
        let (mut w, r) = cache::new(kind_of(&e, namespaced), CacheOptions::default());
        let o = w.parse(Bytes::from(full.trim_end().to_owned())).unwrap();
        let rv = o.header.rv;
        w.replace(vec![o], rv);
        let ns = obj["metadata"]["namespace"].as_str().unwrap_or("");
        let cached = r.get(ns, obj["metadata"]["name"].as_str().unwrap()).unwrap();
        let [a, b, _] = cached.chunks_as(Repr::Metadata).unwrap();
        let got = [&a[..], &b[..], b"\n"].concat();
        assert_eq!(String::from_utf8(got).unwrap(), body(&entry["metadata"]), "{}", entry["path"]);
        // Full: the object as received (what serve sends, plus the same newline).
        let [a, b, _] = cached.chunks_as(Repr::Full).unwrap();
        assert_eq!(String::from_utf8([&a[..], &b[..], b"\n"].concat()).unwrap(), full);
    }
}

#[test]
fn an_empty_metadata_list_has_null_items_as_the_apiserver_encodes_it() {
    let rec = recording();
    let e = &rec["empty_list"];
    let kind = ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true);
    let (mut w, r) = cache::new(kind, CacheOptions::default());
    let rv: Value = serde_json::from_str(body(&e["full"])).unwrap();
    let rv = Rv(rv["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap());
    w.replace(Vec::new(), rv);
    let snap = r.snapshot();
    let got = r.list(&snap, &Filter::default().with_repr(Repr::Metadata), None).unwrap().to_vec();
    assert_eq!(String::from_utf8(got).unwrap(), body(&e["metadata"]));
    let got = r.list(&snap, &Filter::default(), None).unwrap().to_vec();
    assert_eq!(String::from_utf8(got).unwrap(), body(&e["full"]), "full lists keep []");
}

#[tokio::test(start_paused = true)]
async fn watch_events_equal_the_apiservers_metadata_frames() {
    let rec = recording();
    let wr = &rec["watch"];
    let start: u64 = wr["query"]["resourceVersion"].as_str().unwrap().parse().unwrap();
    let kind = ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true);
    let opts = CacheOptions { bookmark_interval: Duration::from_secs(60), ..Default::default() };
    let (mut w, r) = cache::new(kind, opts);
    w.replace(Vec::new(), Rv(start));
    let filter = Filter::new(Some("raw-meta-watch".into()), None, Default::default(), Default::default());
    let mut watch = r
        .watch(WatchRequest {
            filter: filter.with_repr(Repr::Metadata),
            start: WatchStart::After(Rv(start)),
            bookmarks: true,
            deadline: tokio::time::Instant::now() + Duration::from_secs(300),
        })
        .unwrap();
    let full: Vec<&str> = wr["full"].as_array().unwrap()[1..].iter().map(|l| l.as_str().unwrap()).collect();
    let meta: Vec<&str> =
        wr["metadata"].as_array().unwrap()[1..].iter().map(|l| l.as_str().unwrap()).collect();
    assert_eq!(full.len(), meta.len());
    let mut compared = 0;
    let mut last = Rv(start);
    for (f, m) in full.iter().zip(&meta) {
        #[derive(Deserialize)]
        struct Ev<'a> {
            #[serde(rename = "type")]
            t: &'a str,
            #[serde(borrow)]
            object: &'a RawValue,
        }
        let ev: Ev = serde_json::from_str(f).unwrap();
        let t = EventType::parse(ev.t).unwrap();
        if t == EventType::Bookmark {
            continue;
        }
        let obj = w.parse(Bytes::from(ev.object.get().to_owned())).unwrap();
        last = obj.header.rv;
        w.apply(t, obj).unwrap().finish().await;
        let got = watch.next().await.unwrap();
        assert_eq!(std::str::from_utf8(&got).unwrap(), *m, "{} event", ev.t);
        compared += 1;
    }
    assert_eq!(compared, 3, "ADDED, MODIFIED, DELETED");
    // A BOOKMARK once the resource moves on (a write in another namespace): the apiserver's
    // metadata-only BOOKMARK at that RV, without 1.28's `"creationTimestamp":null`.
    let recorded = meta.iter().find(|l| l.contains(r#""type":"BOOKMARK""#)).expect("a recorded BOOKMARK");
    let other = json!({"metadata": {"name": "x", "namespace": "elsewhere", "resourceVersion": (last.0 + 1).to_string()}});
    w.apply(EventType::Added, w.parse(Bytes::from(other.to_string())).unwrap()).unwrap().finish().await;
    let got = watch.next().await.unwrap();
    let want = recorded
        .replace(&format!(r#""resourceVersion":"{last}""#), &format!(r#""resourceVersion":"{}""#, last.0 + 1))
        .replace(r#","creationTimestamp":null"#, "");
    assert_eq!(std::str::from_utf8(&got).unwrap(), want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_informers_are_served_from_the_cache() {
    let env = common::start().await;
    env.ns("m");
    for i in 0..5 {
        env.create_cm("m", &format!("cm-{i}"), json!({"app": "a"}));
    }
    let rv = env.create_cm("m", "cm-5", json!({"app": "b"}));
    env.synced_to(rv).await;
    // What the proxy sent upstream (this test's own requests to the sim carry a marker).
    let upstream_lists = || {
        env.sim.sim.request_count(|r| {
            r.path.starts_with("/api/v1/namespaces/m/configmaps") && !r.headers.contains_key("x-test-direct")
        })
    };
    let before = upstream_lists();
    let h = |accept: &'static str| [("accept", accept)];
    let direct = |accept: &'static str| [("accept", accept), ("x-test-direct", "1")];

    // LIST (the informer's RV=0 list) with pagination ignored, as the cache does for RV=0.
    let url = env.proxy_url("/api/v1/namespaces/m/configmaps?resourceVersion=0&labelSelector=app%3Da");
    let list = common::send(&env.client, http::Method::GET, &url, None, &h(GC_LIST)).await;
    assert_eq!(list.status, 200);
    assert_eq!(list.headers["content-type"], "application/json");
    let v = list.json();
    assert_eq!(
        (v["kind"].as_str(), v["apiVersion"].as_str()),
        (Some("PartialObjectMetadataList"), Some("meta.k8s.io/v1"))
    );
    assert_eq!(v["items"].as_array().unwrap().len(), 5);
    // Each item is the sim's own metadata-only answer for that object, byte for byte.
    let sim_items: Vec<Value> = {
        let url = env.sim_url("/api/v1/namespaces/m/configmaps?labelSelector=app%3Da");
        let s = common::send(&env.client, http::Method::GET, &url, None, &direct(GC_LIST)).await;
        s.json()["items"].as_array().unwrap().clone()
    };
    assert_eq!(v["items"].as_array().unwrap(), &sim_items);
    for item in v["items"].as_array().unwrap() {
        assert_eq!(item.as_object().unwrap().keys().collect::<Vec<_>>(), ["apiVersion", "kind", "metadata"]);
    }

    // GET at RV 0: the sim's metadata GET bytes (newline included).
    let url = env.proxy_url("/api/v1/namespaces/m/configmaps/cm-1?resourceVersion=0");
    let got = common::send(&env.client, http::Method::GET, &url, None, &h(META)).await;
    let sim_url = env.sim_url("/api/v1/namespaces/m/configmaps/cm-1");
    let sim = common::send(&env.client, http::Method::GET, &sim_url, None, &direct(META)).await;
    assert_eq!(got.status, 200);
    assert_eq!(got.body, sim.body, "cached metadata GET = the sim's");
    // And the full GET ends with the newline the apiserver's JSON encoder writes.
    let full = env.get("/api/v1/namespaces/m/configmaps/cm-1?resourceVersion=0").await;
    assert_eq!(full.body.last(), Some(&b'\n'));
    // A missing object asked for only as metadata: the apiserver writes its 404 without a
    // transform to negotiate, as raw indented JSON without a newline (`WriteRawJSON`); the
    // cache's is the sim's byte for byte.
    let url = env.proxy_url("/api/v1/namespaces/m/configmaps/none?resourceVersion=0");
    let got = common::send(&env.client, http::Method::GET, &url, None, &h(META)).await;
    let none_url = env.sim_url("/api/v1/namespaces/m/configmaps/none");
    let sim = common::send(&env.client, http::Method::GET, &none_url, None, &direct(META)).await;
    assert_eq!((got.status.as_u16(), sim.status.as_u16()), (404, 404));
    assert!(sim.body.starts_with(b"{\n  \"kind\": \"Status\"") && !sim.body.ends_with(b"\n"));
    assert_eq!(String::from_utf8_lossy(&got.body), String::from_utf8_lossy(&sim.body));
    assert_eq!(got.headers["content-type"], "application/json");
    assert_eq!(upstream_lists(), before, "nothing above went upstream");

    // WATCH from the list's RV: live events metadata-only, each the sim's metadata GET of
    // that version.
    let list_rv = v["metadata"]["resourceVersion"].as_str().unwrap().to_owned();
    let url = env.proxy_url(&format!(
        "/api/v1/namespaces/m/configmaps?watch=1&resourceVersion={list_rv}&allowWatchBookmarks=true"
    ));
    let mut watch = common::open_watch_with(&env.client, &url, &h(GC_WATCH)).await;
    assert_eq!(watch.status, 200);
    env.update_cm("m", "cm-1", json!({"app": "a", "x": "y"}), "v2");
    let line = watch.next_line(Duration::from_secs(10)).await.expect("an event");
    let sim = common::send(&env.client, http::Method::GET, &sim_url, None, &direct(META)).await;
    let mut want = br#"{"type":"MODIFIED","object":"#.to_vec();
    want.extend_from_slice(&sim.body[..sim.body.len() - 1]);
    want.extend_from_slice(b"}\n");
    assert_eq!(String::from_utf8(line).unwrap(), String::from_utf8(want).unwrap());
    // Leaving the selection: a metadata-only DELETED (label selectors work as for full watches).
    let url = env.proxy_url(&format!(
        "/api/v1/namespaces/m/configmaps?watch=1&resourceVersion={list_rv}&labelSelector=app%3Da"
    ));
    let mut selected = common::open_watch_with(&env.client, &url, &h(GC_WATCH)).await;
    let e = selected.next(Duration::from_secs(10)).await.expect("the MODIFIED it already missed");
    assert_eq!(e["object"]["kind"], "PartialObjectMetadata");
    env.update_cm("m", "cm-2", json!({"app": "c"}), "v2");
    let e = selected.next(Duration::from_secs(10)).await.expect("DELETED");
    assert_eq!(
        (e["type"].as_str(), e["object"]["kind"].as_str()),
        (Some("DELETED"), Some("PartialObjectMetadata"))
    );
    assert!(e["object"].get("data").is_none());
    assert_eq!(upstream_lists(), before, "the watches were served from the cache");

    // What the cache does not produce goes upstream unchanged: a LIST asked for as one
    // PartialObjectMetadata (the apiserver's 406), Table.
    let url = env.proxy_url("/api/v1/namespaces/m/configmaps?resourceVersion=0");
    let r = common::send(&env.client, http::Method::GET, &url, None, &h(META)).await;
    assert_eq!(upstream_lists(), before + 1, "forwarded");
    assert_eq!(r.status, 406);
    assert_eq!(
        r.json()["message"],
        "you requested PartialObjectMetadata, but the requested object is a list (*core.ConfigMapList)"
    );
    let url = env.proxy_url("/api/v1/namespaces/m/configmaps?resourceVersion=0");
    let table = "application/json;as=Table;g=meta.k8s.io;v=v1,application/json";
    assert_eq!(common::send(&env.client, http::Method::GET, &url, None, &h(table)).await.status, 200);
    assert_eq!(upstream_lists(), before + 2, "forwarded");
}

/// The sim's own metadata watch (what the proxy's upstream and `kube-watchcache sim` users
/// get): every event carries the object's metadata exactly as the full event does, wrapped as
/// PartialObjectMetadata, the property the recorded apiserver watch shows; bookmarks too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sims_metadata_watch_has_the_apiservers_shape() {
    // The recording: each metadata event is the full event's metadata, wrapped.
    let rec = recording();
    let wrap = |t: &str, meta: &str| {
        format!(
            r#"{{"type":"{t}","object":{{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{meta}}}}}"#
        )
    };
    let metadata_of = |line: &str| -> (String, String) {
        #[derive(Deserialize)]
        struct Ev<'a> {
            #[serde(rename = "type")]
            t: String,
            #[serde(borrow)]
            object: Obj<'a>,
        }
        #[derive(Deserialize)]
        struct Obj<'a> {
            #[serde(borrow)]
            metadata: &'a RawValue,
        }
        let ev: Ev = serde_json::from_str(line.trim_end()).unwrap();
        (ev.t, ev.object.metadata.get().to_owned())
    };
    let full: Vec<&str> =
        rec["watch"]["full"].as_array().unwrap()[1..].iter().map(|l| l.as_str().unwrap()).collect();
    let meta: Vec<&str> =
        rec["watch"]["metadata"].as_array().unwrap()[1..].iter().map(|l| l.as_str().unwrap()).collect();
    for (f, m) in full.iter().zip(&meta) {
        let (t, md) = metadata_of(f);
        if t != "BOOKMARK" {
            assert_eq!(m.trim_end(), wrap(&t, &md), "recorded");
        }
    }

    // The sim, the same way.
    let env = common::start().await;
    env.ns("sim-meta-watch");
    let rv = env.create_cm("sim-meta-watch", "w-0", json!({}));
    let q = format!(
        "/api/v1/namespaces/sim-meta-watch/configmaps?watch=1&resourceVersion={rv}&allowWatchBookmarks=true"
    );
    let mut f = common::open_watch(&env.client, &env.sim_url(&q)).await;
    let mut m = common::open_watch_with(&env.client, &env.sim_url(&q), &[("Accept", META)]).await;
    env.create_cm("sim-meta-watch", "w-1", json!({"x": "1"}));
    env.update_cm("sim-meta-watch", "w-1", json!({"x": "2"}), "d");
    env.delete_cm("sim-meta-watch", "w-1");
    for want in ["ADDED", "MODIFIED", "DELETED"] {
        let fl = String::from_utf8(f.next_line(Duration::from_secs(10)).await.expect("full event")).unwrap();
        let ml =
            String::from_utf8(m.next_line(Duration::from_secs(10)).await.expect("metadata event")).unwrap();
        let (t, md) = metadata_of(&fl);
        assert_eq!(t, want);
        assert_eq!(ml.trim_end(), wrap(&t, &md));
    }
    // A watch asked in the list form: 200 and a stream that ends at its first event without a
    // byte (no event can become a list), as recorded in protobuf (v1.28.7-raw/protobuf.json,
    // negotiation 35, 74; the proxy forwards it).
    let r = common::send(
        &env.client,
        http::Method::GET,
        &env.sim_url(&q),
        None,
        &[("Accept", "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1")],
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", String::from_utf8_lossy(&r.body));
    assert!(r.body.is_empty(), "{}", String::from_utf8_lossy(&r.body));
}

fn cr_recording() -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/recordings/v1.28.7-raw/cr-metadata.json");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap()
}

/// Custom resources (`record_cr.py`): the apiserver serves them as unstructured JSON (sorted
/// keys) but their PartialObjectMetadata as the typed ObjectMeta; the cache's metadata-only
/// LIST, GET and watch events equal the apiserver's bytes.
#[tokio::test(start_paused = true)]
async fn custom_resources_metadata_equals_the_apiservers_bytes() {
    let rec = cr_recording();
    let kind = || ResourceKind::new("rec.example.com", "v1", "widgets", "Widget", true, false);

    // LIST
    let full = body(&rec["lists"]["full"]);
    let full_list: RawList = serde_json::from_str(full).unwrap();
    let items = full_list.items.unwrap_or_default();
    assert!(!items.is_empty());
    let (mut w, r) = cache::new(kind(), CacheOptions::default());
    let objects = items.iter().map(|i| w.parse(Bytes::from(i.get().to_owned())).unwrap()).collect();
    let rv: Value = serde_json::from_str(full_list.metadata.get()).unwrap();
    let rv = Rv(rv["resourceVersion"].as_str().unwrap().parse().unwrap());
    w.replace(objects, rv);
    let snap = r.snapshot();
    let recorded = body(&rec["lists"]["metadata"]);
    let meta = serde_json::from_str::<RawList>(recorded).unwrap().metadata.get().to_owned();
    let want = recorded.replacen(&meta, &format!(r#"{{"resourceVersion":"{rv}"}}"#), 1);
    let got = r.list(&snap, &Filter::default().with_repr(Repr::Metadata), None).unwrap().to_vec();
    assert_eq!(String::from_utf8(got).unwrap(), want, "metadata-only LIST of a custom resource");

    // GET
    for entry in rec["gets"].as_array().unwrap() {
        let obj: Value = serde_json::from_str(body(&entry["full"])).unwrap();
        let (mut w, r) = cache::new(kind(), CacheOptions::default());
        let o = w.parse(Bytes::from(body(&entry["full"]).trim_end().to_owned())).unwrap();
        let rv = o.header.rv;
        w.replace(vec![o], rv);
        let cached = r
            .get(obj["metadata"]["namespace"].as_str().unwrap(), obj["metadata"]["name"].as_str().unwrap())
            .unwrap();
        let [a, b, _] = cached.chunks_as(Repr::Metadata).unwrap();
        let got = [&a[..], &b[..], b"\n"].concat();
        assert_eq!(String::from_utf8(got).unwrap(), body(&entry["metadata"]), "{}", entry["path"]);
    }

    // WATCH: the full events applied to a cache, its metadata watchers get the recorded frames.
    let wr = &rec["watch"];
    let start: u64 = wr["query"]["resourceVersion"].as_str().unwrap().parse().unwrap();
    let (mut w, r) = cache::new(kind(), CacheOptions::default());
    w.replace(Vec::new(), Rv(start));
    let mut watch = r
        .watch(WatchRequest {
            filter: Filter::default().with_repr(Repr::Metadata),
            start: WatchStart::After(Rv(start)),
            bookmarks: false,
            deadline: tokio::time::Instant::now() + Duration::from_secs(300),
        })
        .unwrap();
    let lines = |k: &str| -> Vec<String> {
        wr[k].as_array().unwrap()[1..].iter().map(|l| l.as_str().unwrap().to_owned()).collect()
    };
    let (full, meta) = (lines("full"), lines("metadata"));
    assert_eq!(full.len(), 4, "ADDED ×2, MODIFIED, DELETED");
    for (f, m) in full.iter().zip(&meta) {
        #[derive(Deserialize)]
        struct Ev<'a> {
            #[serde(rename = "type")]
            t: &'a str,
            #[serde(borrow)]
            object: &'a RawValue,
        }
        let ev: Ev = serde_json::from_str(f).unwrap();
        let obj = w.parse(Bytes::from(ev.object.get().to_owned())).unwrap();
        w.apply(EventType::parse(ev.t).unwrap(), obj).unwrap().finish().await;
        let got = watch.next().await.unwrap();
        assert_eq!(std::str::from_utf8(&got).unwrap(), m, "{} event", ev.t);
    }
}

/// End to end: a custom resource's metadata-only LIST and GET through the proxy are served
/// from the cache (nothing sent upstream on the path) and equal the sim's own answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_resource_metadata_is_served_from_the_cache() {
    let env = common::start().await;
    env.ns("ns");
    let w = env
        .sim
        .sim
        .create(
            "example.com/widgets",
            "ns",
            json!({"apiVersion":"example.com/v1","kind":"Widget",
                   "metadata":{"name":"w1","labels":{"b":"2","a":"1"},"annotations":{"n":"<&>"}},"spec":{"size":1}}),
        )
        .unwrap();
    let rv = common::rv_of(&w);
    env.cache_synced_to("widgets", rv).await;
    let path = "/apis/example.com/v1/namespaces/ns/widgets";
    let upstream = || env.upstream_path(path);
    for (url, accept) in
        [(format!("{path}?resourceVersion=0"), GC_LIST), (format!("{path}/w1?resourceVersion=0"), GC_WATCH)]
    {
        let before = upstream();
        let got =
            common::send(&env.client, http::Method::GET, &env.proxy_url(&url), None, &[("accept", accept)])
                .await;
        assert_eq!(upstream(), before, "{url}: served from the cache");
        assert_eq!(got.status, 200);
        let sim =
            common::send(&env.client, http::Method::GET, &env.sim_url(&url), None, &[("accept", accept)])
                .await;
        if url.contains("/w1") {
            assert_eq!(got.body, sim.body, "{url}");
            let text = String::from_utf8_lossy(&got.body);
            assert!(
                text.contains(r#""metadata":{"name":"w1","namespace":"ns","#),
                "ObjectMeta order: {text}"
            );
            assert!(text.contains(r#""labels":{"a":"1","b":"2"},"annotations":{"#), "{text}");
        }
        let (got, sim): (Value, Value) = (got.json(), sim.json());
        if !url.contains("/w1") {
            assert_eq!(got["kind"], "PartialObjectMetadataList");
            assert_eq!(got["items"], sim["items"], "{url}");
        }
    }
}
