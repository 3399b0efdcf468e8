//! Front-door tests of the simulated apiserver: a sim started on 127.0.0.1:0, real HTTP, and
//! the answers compared with the v1.28.7 recordings where they apply.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};

use base64::Engine;

use super::{Sim, SimHandle, SimOptions};
use kube_watchcache::resource::ResourceKind;
use kube_watchcache::selector::FieldSelector;

fn recording(name: &str) -> Value {
    let path = format!("{}/../../tests/recordings/v1.28.7/{name}.json", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap()
}

async fn start() -> SimHandle {
    Sim::start(SimOptions::default()).await.unwrap()
}

struct Resp {
    status: StatusCode,
    headers: http::HeaderMap,
    body: Bytes,
}

impl Resp {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {:?}", self.body))
    }
}

async fn send(
    h: &SimHandle,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> Resp {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut req = Request::builder().method(method).uri(format!("http://{}{}", h.addr, path));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let body = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
    let resp = client.request(req.body(Full::new(body)).unwrap()).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    Resp { status, headers, body }
}

async fn get(h: &SimHandle, path: &str) -> Resp {
    send(h, Method::GET, path, &[], None).await
}

/// Reads a watch stream to its end (the sim ends it at timeoutSeconds) or `max` events.
async fn watch(h: &SimHandle, path: &str, max: usize) -> Vec<Value> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let req = Request::get(format!("http://{}{}", h.addr, path)).body(Full::new(Bytes::new())).unwrap();
    let resp = client.request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-type"], "application/json");
    let mut body = resp.into_body();
    let mut buf = Vec::new();
    let mut events = Vec::new();
    while events.len() < max {
        let Some(frame) = tokio::time::timeout(Duration::from_secs(10), body.frame()).await.unwrap() else {
            break;
        };
        if let Ok(data) = frame.unwrap().into_data() {
            buf.extend_from_slice(&data);
            while let Some(i) = buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buf.drain(..=i).collect();
                events.push(serde_json::from_slice(&line).unwrap());
            }
        }
    }
    events
}

/// The `base` fixture of the recordings: cap-base/cm-1..cm-5, then cm-1 patched.
/// Returns (R_OLD, R).
fn base_fixture(sim: &Sim) -> (u64, u64) {
    sim.create("namespaces", "", json!({"metadata": {"name": "cap-base"}})).unwrap();
    let tiers = [Some("front"), Some("front"), Some("back"), None, Some("db")];
    for (i, tier) in tiers.iter().enumerate() {
        let mut labels = json!({"app": "a"});
        if let Some(t) = tier {
            labels["tier"] = json!(t);
        }
        let cm = json!({"metadata": {"name": format!("cm-{}", i + 1), "labels": labels}, "data": {"k": format!("v{}", i + 1)}});
        sim.create("configmaps", "cap-base", cm).unwrap();
    }
    let r_old = sim.current_rv().0;
    let cm1 = sim.update("configmaps", "cap-base", json!({"metadata": {"name": "cm-1", "labels": {"app": "a", "tier": "front"}}, "data": {"k": "v1-updated"}}));
    let r = cm1.unwrap()["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap();
    (r_old, r)
}

fn names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap().to_owned())
        .collect()
}

fn decode_token(t: &str) -> Value {
    use base64::Engine;
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(t).unwrap();
    serde_json::from_slice(&raw).unwrap()
}

#[tokio::test]
async fn list_rv0_order_and_shape_match_recording() {
    let h = start().await;
    let (_, r) = base_fixture(&h.sim);
    let rec = recording("list-rv-0");
    let expected = &rec["steps"][0]["response"]["body"];
    let resp = get(&h, "/api/v1/namespaces/cap-base/configmaps?resourceVersion=0").await;
    assert_eq!(resp.status, 200);
    assert!(resp.body.ends_with(b"]}\n"));
    assert!(resp
        .body
        .starts_with(br#"{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":""#));
    let got = resp.json();
    assert_eq!(got["metadata"], json!({"resourceVersion": r.to_string()}));
    assert_eq!(names(&got), names(expected));
    for (g, e) in got["items"].as_array().unwrap().iter().zip(expected["items"].as_array().unwrap()) {
        assert!(g.get("kind").is_none() && g.get("apiVersion").is_none());
        assert_eq!(g["data"], e["data"]);
        assert_eq!(g["metadata"]["labels"], e["metadata"]["labels"]);
        assert_eq!(g["metadata"]["namespace"], "cap-base");
        assert_eq!(g["metadata"]["uid"].as_str().unwrap().len(), 36);
    }
    // cm-1 carries the patch RV, the others their create RVs, like the recording.
    assert_eq!(got["items"][0]["metadata"]["resourceVersion"], r.to_string());
}

#[tokio::test]
async fn pagination_three_pages_like_recording() {
    let h = start().await;
    let (_, r) = base_fixture(&h.sim);
    let rec = recording("list-pagination-3-pages");
    let mut path = "/api/v1/namespaces/cap-base/configmaps?limit=2".to_owned();
    for step in rec["steps"].as_array().unwrap() {
        let expected = &step["response"]["body"];
        let got = get(&h, &path).await.json();
        assert_eq!(names(&got), names(expected));
        assert_eq!(got["metadata"]["resourceVersion"], r.to_string());
        assert_eq!(got["metadata"].get("remainingItemCount"), expected["metadata"].get("remainingItemCount"));
        match (got["metadata"].get("continue"), expected["metadata"].get("continue")) {
            (Some(g), Some(e)) => {
                let (g, mut e) = (decode_token(g.as_str().unwrap()), decode_token(e.as_str().unwrap()));
                e["rv"] = json!(r);
                assert_eq!(g, e);
                path = format!(
                    "/api/v1/namespaces/cap-base/configmaps?limit=2&continue={}",
                    got["metadata"]["continue"].as_str().unwrap()
                );
            }
            (None, None) => {}
            other => panic!("continue mismatch: {other:?}"),
        }
    }
}

/// A client that sends part of a request's headers and then nothing has its connection closed
/// (after kube-apiserver's `IdleTimeout`, 90 s: hyper has one timer for both), not held for
/// ever (found by a review).
#[tokio::test(start_paused = true)]
async fn a_connection_whose_headers_never_come_is_closed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let h = start().await;
    let mut c = tokio::net::TcpStream::connect(h.addr).await.unwrap();
    c.write_all(b"GET /api HTTP/1.1\r\nhost: x\r\n").await.unwrap();
    let started = tokio::time::Instant::now();
    let mut buf = [0u8; 1024];
    let read = tokio::time::timeout(Duration::from_secs(120), c.read(&mut buf)).await;
    assert!(matches!(read, Ok(Ok(_))), "closed before 120 s: {read:?}");
    let waited = started.elapsed();
    assert!(waited >= Duration::from_secs(90) && waited < Duration::from_secs(100), "{waited:?}");
}

#[tokio::test]
async fn a_limit_is_ignored_at_resource_version_0_as_written_only() {
    let h = start().await;
    base_fixture(&h.sim);
    let all = get(&h, "/api/v1/namespaces/cap-base/configmaps?resourceVersion=0&limit=2").await.json();
    assert_eq!(names(&all).len(), 5);
    assert!(all["metadata"].get("continue").is_none());
    // 1.36 compares the text: another spelling of zero keeps the limit.
    for q in ["resourceVersion=00&limit=2", "resourceVersion=00&resourceVersionMatch=NotOlderThan&limit=2"] {
        let page = get(&h, &format!("/api/v1/namespaces/cap-base/configmaps?{q}")).await.json();
        assert_eq!(names(&page), ["cm-1", "cm-2"], "{q}");
        assert!(page["metadata"]["continue"].is_string(), "{q}");
    }
}

#[tokio::test]
async fn exact_list_at_an_old_revision() {
    let h = start().await;
    let (r_old, _) = base_fixture(&h.sim);
    for q in [
        format!("resourceVersion={r_old}&resourceVersionMatch=Exact"),
        format!("resourceVersion={r_old}&limit=10"),
    ] {
        let got = get(&h, &format!("/api/v1/namespaces/cap-base/configmaps?{q}")).await.json();
        assert_eq!(got["metadata"]["resourceVersion"], r_old.to_string());
        assert_eq!(got["items"][0]["data"]["k"], "v1", "{q}");
        assert_eq!(names(&got).len(), 5);
    }
    // Deleted since: still there at the old revision.
    h.sim.delete("configmaps", "cap-base", "cm-3").unwrap();
    let got = get(
        &h,
        &format!("/api/v1/namespaces/cap-base/configmaps?resourceVersion={r_old}&resourceVersionMatch=Exact"),
    )
    .await
    .json();
    assert_eq!(names(&got), ["cm-1", "cm-2", "cm-3", "cm-4", "cm-5"]);
    h.sim.compact();
    let resp = get(
        &h,
        &format!("/api/v1/namespaces/cap-base/configmaps?resourceVersion={r_old}&resourceVersionMatch=Exact"),
    )
    .await;
    assert_eq!(resp.status, 410);
    assert_eq!(resp.json()["message"], "The resourceVersion for the provided list is too old.");
}

#[tokio::test]
async fn expired_continue_token_offers_rv_minus_one() {
    let h = start().await;
    base_fixture(&h.sim);
    let page1 = get(&h, "/api/v1/namespaces/cap-base/configmaps?limit=1").await.json();
    let token = page1["metadata"]["continue"].as_str().unwrap().to_owned();
    h.sim
        .update("configmaps", "cap-base", json!({"metadata": {"name": "cm-2"}, "data": {"k": "x"}}))
        .unwrap();
    h.sim.compact();
    let resp = get(&h, &format!("/api/v1/namespaces/cap-base/configmaps?limit=1&continue={token}")).await;
    let rec = &recording("compaction-continue-expired")["steps"][0]["response"]["body"];
    assert_eq!(resp.status, 410);
    let got = resp.json();
    assert_eq!(got["message"], rec["message"]);
    let next = got["metadata"]["continue"].as_str().unwrap();
    assert_eq!(decode_token(next), json!({"v": "meta.k8s.io/v1", "rv": -1, "start": "cm-1\u{0}"}));
    let rest = get(&h, &format!("/api/v1/namespaces/cap-base/configmaps?continue={next}")).await.json();
    assert_eq!(names(&rest), ["cm-2", "cm-3", "cm-4", "cm-5"]);
    assert_eq!(rest["items"][0]["data"]["k"], "x");
    assert_eq!(rest["metadata"]["resourceVersion"], h.sim.current_rv().to_string());
}

#[tokio::test]
async fn watch_from_rv_sees_create_patch_delete() {
    let h = start().await;
    let sim = h.sim.clone();
    sim.create("namespaces", "", json!({"metadata": {"name": "cap-w-cur"}})).unwrap();
    sim.create("configmaps", "cap-w-cur", json!({"metadata": {"name": "a", "labels": {"app": "w"}}}))
        .unwrap();
    sim.create("configmaps", "cap-w-cur", json!({"metadata": {"name": "b", "labels": {"app": "w"}}}))
        .unwrap();
    let r = sim.current_rv().0;
    let path =
        format!("/api/v1/namespaces/cap-w-cur/configmaps?watch=1&resourceVersion={r}&timeoutSeconds=3");
    let writer = {
        let h_addr = h.addr;
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let hh = SimHandleRef(h_addr);
            hh.send(Method::POST, "/api/v1/namespaces/cap-w-cur/configmaps", None, json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "labels": {"app": "w"}}, "data": {"k": "v"}})).await;
            hh.send(
                Method::PATCH,
                "/api/v1/namespaces/cap-w-cur/configmaps/a",
                Some("application/merge-patch+json"),
                json!({"data": {"k": "changed"}}),
            )
            .await;
            hh.send(Method::DELETE, "/api/v1/namespaces/cap-w-cur/configmaps/b", None, Value::Null).await;
        })
    };
    let events = watch(&h, &path, 3).await;
    writer.await.unwrap();
    let rec = recording("watch-rv-current");
    let expected: Vec<&str> = rec["steps"][0]["response"]["body"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    let got: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(got, expected);
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["object"]["kind"], "ConfigMap");
        assert_eq!(e["object"]["apiVersion"], "v1");
        assert_eq!(e["object"]["metadata"]["resourceVersion"], (r + 1 + i as u64).to_string());
    }
    assert_eq!(events[1]["object"]["data"]["k"], "changed");
    assert_eq!(events[2]["object"]["metadata"]["name"], "b");
}

/// A bare address, for requests from spawned tasks.
struct SimHandleRef(std::net::SocketAddr);

impl SimHandleRef {
    async fn send(&self, method: Method, path: &str, ct: Option<&str>, body: Value) -> StatusCode {
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let mut req = Request::builder().method(method).uri(format!("http://{}{}", self.0, path));
        if let Some(ct) = ct {
            req = req.header("content-type", ct);
        }
        let body = if body.is_null() { Bytes::new() } else { Bytes::from(body.to_string()) };
        let resp = client.request(req.body(Full::new(body)).unwrap()).await.unwrap();
        let status = resp.status();
        assert!(status.is_success(), "{status}");
        status
    }
}

#[tokio::test]
async fn too_old_watch_after_compaction_is_one_error_event() {
    let h = start().await;
    let (r_old, _) = base_fixture(&h.sim);
    h.sim.compact();
    let c = h.sim.current_rv().0;
    let events =
        watch(&h, &format!("/api/v1/namespaces/cap-base/configmaps?watch=1&resourceVersion={r_old}"), 10)
            .await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["type"], "ERROR");
    assert_eq!(
        events[0]["object"],
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": format!("too old resource version: {r_old} ({c})"), "reason": "Expired", "code": 410})
    );
    // From the compaction point itself it works (no error, ends at the timeout).
    let events = watch(
        &h,
        &format!("/api/v1/namespaces/cap-base/configmaps?watch=1&resourceVersion={c}&timeoutSeconds=1"),
        10,
    )
    .await;
    assert!(events.is_empty());
}

#[tokio::test]
async fn a_restart_keeps_the_storage_but_its_watch_caches_start_at_the_restart() {
    let h = start().await;
    let (r_old, _) = base_fixture(&h.sim);
    let addr = h.addr;
    let h = h.restart(Duration::from_millis(10)).await.unwrap();
    assert_eq!(h.addr, addr, "the same address after the restart");
    let r = h.sim.current_rv().0;
    // The objects are still there (etcd lived on).
    let list = get(&h, "/api/v1/namespaces/cap-base/configmaps").await.json();
    assert_eq!(names(&list), ["cm-1", "cm-2", "cm-3", "cm-4", "cm-5"]);
    // A watch from before the restart: the new watch cache has no such history (410), as at a
    // restarted kube-apiserver.
    let events =
        watch(&h, &format!("/api/v1/namespaces/cap-base/configmaps?watch=1&resourceVersion={r_old}"), 10)
            .await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["object"]["message"], format!("too old resource version: {r_old} ({r})"));
    assert_eq!(events[0]["object"]["code"], 410);
    // From the restart's revision on, a watch replays what followed.
    h.sim
        .update("configmaps", "cap-base", json!({"metadata": {"name": "cm-1"}, "data": {"k": "after"}}))
        .unwrap();
    let path = format!("/api/v1/namespaces/cap-base/configmaps?watch=1&resourceVersion={r}&timeoutSeconds=2");
    let events = watch(&h, &path, 1).await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["type"], "MODIFIED");
}

#[tokio::test]
async fn watch_rv0_with_bookmarks_is_a_watch_list() {
    let h = start().await;
    let (_, r) = base_fixture(&h.sim);
    let events = watch(&h, "/api/v1/namespaces/cap-base/configmaps?watch=1&resourceVersion=0&allowWatchBookmarks=true&timeoutSeconds=1", 10).await;
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["ADDED", "ADDED", "ADDED", "ADDED", "ADDED", "BOOKMARK"]);
    let added: Vec<&str> =
        events[..5].iter().map(|e| e["object"]["metadata"]["name"].as_str().unwrap()).collect();
    assert_eq!(added, ["cm-1", "cm-2", "cm-3", "cm-4", "cm-5"]);
    assert_eq!(
        events[5]["object"],
        json!({"kind": "ConfigMap", "apiVersion": "v1", "metadata": {"resourceVersion": r.to_string(), "annotations": {"k8s.io/initial-events-end": "true"}}})
    );
    // Without bookmarks: the ADDEDs, no marker.
    let events = watch(&h, "/api/v1/namespaces/cap-base/configmaps?watch=1&timeoutSeconds=1", 10).await;
    assert_eq!(events.len(), 5);
}

#[tokio::test]
async fn not_found_texts_match_recordings() {
    let h = start().await;
    base_fixture(&h.sim);
    let rec = recording("get-missing");
    let resp = get(&h, "/api/v1/namespaces/cap-base/configmaps/nope").await;
    assert_eq!(resp.status, 404);
    assert_eq!(resp.json(), rec["steps"][0]["response"]["body"]);
    let rec = recording("path-variants");
    let resp = get(&h, "/api/v1/namespaces/cap-base/nosuchresources").await;
    assert_eq!(resp.status, 404);
    assert_eq!(resp.json(), rec["steps"][1]["response"]["body"]);
    let resp = get(&h, "/apis/nosuch.example.com/v1/widgets").await;
    assert_eq!(resp.status, 404);
    assert_eq!(resp.headers["content-type"], "text/plain; charset=utf-8");
    assert_eq!(resp.body.as_ref(), rec["steps"][2]["response"]["body"]["text"].as_str().unwrap().as_bytes());
    let resp = get(&h, "/api/v1/namespaces/default/nodes").await;
    assert_eq!(resp.json(), recording("cluster-scoped-nodes")["steps"][5]["response"]["body"]);
}

/// A body past 3 MiB: the apiserver's 413 (`limitedReadBody`), not a 400.
#[tokio::test]
async fn a_body_past_the_limit_is_413() {
    let h = start().await;
    let big = json!({"metadata": {"name": "big"}, "data": {"a": "x".repeat(3 * 1024 * 1024)}});
    let r = send(&h, Method::POST, "/api/v1/namespaces/default/configmaps", &[], Some(big)).await;
    assert_eq!(r.status, 413);
    assert_eq!(
        r.json(),
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": "Request entity too large: limit is 3145728", "reason": "RequestEntityTooLarge", "code": 413})
    );
}

#[tokio::test]
async fn duplicate_create_is_409_and_stale_update_conflicts() {
    let h = start().await;
    let cm = json!({"metadata": {"name": "dup"}, "data": {"a": "1"}});
    let first = send(&h, Method::POST, "/api/v1/namespaces/default/configmaps", &[], Some(cm.clone())).await;
    assert_eq!(first.status, 201);
    let second = send(&h, Method::POST, "/api/v1/namespaces/default/configmaps", &[], Some(cm)).await;
    assert_eq!(second.status, 409);
    assert_eq!(
        second.json(),
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": "configmaps \"dup\" already exists", "reason": "AlreadyExists", "details": {"name": "dup", "kind": "configmaps"}, "code": 409})
    );
    let stale = json!({"metadata": {"name": "dup", "resourceVersion": "1"}, "data": {"a": "2"}});
    let resp = send(&h, Method::PUT, "/api/v1/namespaces/default/configmaps/dup", &[], Some(stale)).await;
    assert_eq!(resp.status, 409);
    assert_eq!(resp.json()["reason"], "Conflict");
    let resp = send(
        &h,
        Method::POST,
        "/api/v1/namespaces/nosuchns/configmaps",
        &[],
        Some(json!({"metadata": {"name": "x"}})),
    )
    .await;
    assert_eq!(resp.status, 404);
    assert_eq!(resp.json()["message"], "namespaces \"nosuchns\" not found");
}

#[tokio::test]
async fn crd_list_shape_matches_recording() {
    let h = start().await;
    h.sim.create("namespaces", "", json!({"metadata": {"name": "cap-crd"}})).unwrap();
    for i in 1..=3 {
        let w = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": format!("w{i}"), "labels": {"app": "w"}}, "spec": {"size": i}});
        h.sim.create("example.com/widgets", "cap-crd", w).unwrap();
    }
    let rec = recording("crd-list");
    let expected = &rec["steps"][0]["response"]["body"];
    let resp = get(&h, "/apis/example.com/v1/namespaces/cap-crd/widgets").await;
    assert!(resp.body.starts_with(br#"{"apiVersion":"example.com/v1","items":[{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"creationTimestamp":"#), "{:?}", resp.body);
    let got = resp.json();
    let keys = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    assert_eq!(keys(&got), keys(expected));
    assert_eq!(got["kind"], "WidgetList");
    assert_eq!(got["metadata"]["continue"], "");
    assert_eq!(names(&got), names(expected));
    for (g, e) in got["items"].as_array().unwrap().iter().zip(expected["items"].as_array().unwrap()) {
        assert_eq!(g["spec"], e["spec"]);
        assert_eq!(g["kind"], e["kind"]);
        assert_eq!(g["metadata"]["generation"], 1);
    }
}

#[tokio::test]
async fn validation_and_rv_errors() {
    let h = start().await;
    let resp = get(&h, "/api/v1/configmaps?resourceVersionMatch=Exact&resourceVersion=0").await;
    assert_eq!(resp.status, 422);
    let resp = get(&h, "/api/v1/configmaps?resourceVersion=abc").await;
    assert_eq!(resp.status, 400);
    assert_eq!(resp.json()["message"], "invalid resource version: resourceVersion: Invalid value: \"abc\": strconv.ParseUint: parsing \"abc\": invalid syntax");
    let resp = get(&h, "/api/v1/namespaces/default?resourceVersion=abc").await;
    assert_eq!(resp.status, 500);
    assert!(resp.json().get("reason").is_none());
    let resp = get(&h, "/api/v1/configmaps?continue=abc!").await;
    assert_eq!(resp.json(), recording("list-continue-malformed")["steps"][0]["response"]["body"]);
    let resp = send(&h, Method::GET, "/api/v1/configmaps", &[("accept", "text/html")], None).await;
    assert_eq!(resp.status, 406);
}

#[tokio::test(start_paused = true)]
async fn future_rv_list_waits_three_seconds_then_504() {
    let sim = Sim::new(SimOptions::default());
    let t0 = tokio::time::Instant::now();
    let future =
        super::store::Store::wait_for(sim.store(), kube_watchcache::resource::Rv(sim.current_rv().0 + 100))
            .await;
    assert!(matches!(future, Err(kube_watchcache::error::Error::TooLargeResourceVersion { .. })));
    assert_eq!(t0.elapsed(), Duration::from_secs(3));
}

/// A kind the apiserver does not cache (events): a read past the current revision is etcd's
/// 504 at once, without `Retry-After` (recorded: events-not-cached.json step 3, after 0.0 s);
/// a cached kind's waits 3 s and says `Retry-After: 1` (the cacher's).
#[tokio::test]
async fn an_uncached_kinds_future_read_is_etcds_504_at_once() {
    let h = start().await;
    let future = h.sim.current_rv().0 + 100_000;
    let t0 = std::time::Instant::now();
    let r = get(&h, &format!("/api/v1/namespaces/default/events?resourceVersion={future}")).await;
    assert!(t0.elapsed() < Duration::from_secs(2), "at once");
    assert_eq!(r.status, 504);
    assert!(r.headers.get("retry-after").is_none());
    let want = recording("events-not-cached")["steps"][2]["response"]["body"].clone();
    let mut got = r.json();
    // The recorded revisions are the recording's own.
    got["message"] = want["message"].clone();
    assert_eq!(got, want);
}

/// A Secret written without a type is `Opaque`, its `stringData` merged into `data` (base64,
/// winning over `data`) and never stored, as the apiserver's conversion and defaults do.
#[tokio::test]
async fn a_secrets_type_and_string_data_are_the_apiservers() {
    let h = start().await;
    let body = json!({"apiVersion":"v1","kind":"Secret","metadata":{"name":"s"},
        "data":{"a":"eA==","b":"eQ=="},"stringData":{"b":"two","c":"three"}});
    let r = send(&h, Method::POST, "/api/v1/namespaces/default/secrets", &[], Some(body)).await;
    assert_eq!(r.status, 201, "{:?}", r.body);
    let s = get(&h, "/api/v1/namespaces/default/secrets/s").await.json();
    assert_eq!(s["type"], "Opaque");
    assert!(s.get("stringData").is_none());
    let b64 = |t: &str| base64::engine::general_purpose::STANDARD.encode(t);
    assert_eq!(s["data"], json!({"a": "eA==", "b": b64("two"), "c": b64("three")}));
    let l = get(&h, "/api/v1/namespaces/default/secrets?fieldSelector=type%3DOpaque").await.json();
    assert!(l["items"].as_array().unwrap().iter().any(|i| i["metadata"]["name"] == "s"));
}

/// A DELETE's options are its body's `DeleteOptions` when it has one (client-go and kube-rs
/// send them), else its query's: a bound pod deleted with `{"gracePeriodSeconds":0}` in the
/// body is removed, not left terminating for its 30 s (a review).
#[tokio::test]
async fn a_deletes_options_come_from_its_body() {
    let h = start().await;
    let pod = |name: &str| {
        json!({"apiVersion":"v1","kind":"Pod","metadata":{"name":name},
            "spec":{"nodeName":"node-a","containers":[{"name":"c","image":"i"}]}})
    };
    for name in ["p-body", "p-none"] {
        let r = send(&h, Method::POST, "/api/v1/namespaces/default/pods", &[], Some(pod(name))).await;
        assert_eq!(r.status, 201, "{:?}", r.body);
    }
    let path = "/api/v1/namespaces/default/pods/p-body?gracePeriodSeconds=30";
    let r = send(
        &h,
        Method::DELETE,
        path,
        &[],
        Some(json!({"kind":"DeleteOptions","apiVersion":"v1","gracePeriodSeconds":0})),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(get(&h, "/api/v1/namespaces/default/pods/p-body").await.status, 404, "removed at once");
    // Without a body, the pod's own grace: marked, still there.
    let r = send(&h, Method::DELETE, "/api/v1/namespaces/default/pods/p-none", &[], None).await;
    assert_eq!(r.status, 200);
    let p = get(&h, "/api/v1/namespaces/default/pods/p-none").await;
    assert_eq!(p.status, 200);
    assert!(p.json()["metadata"]["deletionTimestamp"].is_string());
}

#[tokio::test(start_paused = true)]
async fn periodic_bookmarks_with_paused_time() {
    let sim = Sim::new(SimOptions::default());
    let r = sim.current_rv().0;
    let mut rx = watch_configmaps(
        &sim,
        Some("default"),
        &format!("watch=1&resourceVersion={r}&allowWatchBookmarks=true&timeoutSeconds=70"),
    );
    // An unrelated write (another namespace) moves the revision; it is not delivered.
    sim.create("configmaps", "kube-system", json!({"metadata": {"name": "other"}})).unwrap();
    let moved = sim.current_rv().0;
    let t0 = tokio::time::Instant::now();
    let mut got = Vec::new();
    while let Some(b) = rx.recv().await {
        got.push((t0.elapsed().as_secs(), serde_json::from_slice::<Value>(&b).unwrap()));
    }
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].0, 60);
    assert_eq!(
        got[0].1,
        json!({"type": "BOOKMARK", "object": {"kind": "ConfigMap", "apiVersion": "v1", "metadata": {"resourceVersion": moved.to_string()}}})
    );
    assert_eq!(t0.elapsed(), Duration::from_secs(70));
}

#[tokio::test(start_paused = true)]
async fn bookmark_two_seconds_before_deadline() {
    let sim = Sim::new(SimOptions::default());
    let r = sim.current_rv().0;
    let mut rx = watch_configmaps(
        &sim,
        Some("default"),
        &format!("watch=1&resourceVersion={r}&allowWatchBookmarks=true&timeoutSeconds=5"),
    );
    sim.create("configmaps", "kube-system", json!({"metadata": {"name": "other"}})).unwrap();
    let t0 = tokio::time::Instant::now();
    let first = rx.recv().await.unwrap();
    assert_eq!(t0.elapsed(), Duration::from_secs(3));
    assert!(first.starts_with(b"{\"type\":\"BOOKMARK\""));
    assert!(rx.recv().await.is_none());
}

#[tokio::test]
async fn discovery_lists_resources() {
    let h = start().await;
    let v1 = get(&h, "/api/v1").await.json();
    let pods = v1["resources"].as_array().unwrap().iter().find(|r| r["name"] == "pods").unwrap();
    assert_eq!(pods["kind"], "Pod");
    assert_eq!(pods["namespaced"], true);
    assert!(pods["verbs"].as_array().unwrap().contains(&json!("watch")));
    let groups = get(&h, "/apis").await.json();
    let names: Vec<&str> =
        groups["groups"].as_array().unwrap().iter().map(|g| g["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "apps",
            "batch",
            "coordination.k8s.io",
            "discovery.k8s.io",
            "example.com",
            "gateway.networking.k8s.io"
        ]
    );
    assert_eq!(get(&h, "/apis/apps/v1").await.json()["resources"][0]["kind"], "Deployment");
    assert_eq!(get(&h, "/version").await.json()["gitVersion"], "v1.36.0-sim");
    assert_eq!(h.sim.request_count(|r| r.path.starts_with("/api")), 3);
}

#[tokio::test]
async fn seeded_sim_serves_objects_and_bounds_the_log() {
    let h = Sim::start(SimOptions { objects: 200, compaction_window: 50, ..SimOptions::default() })
        .await
        .unwrap();
    let cms = get(&h, "/api/v1/configmaps?resourceVersion=0").await.json();
    assert_eq!(names(&cms).len(), 100);
    let pods = get(&h, "/api/v1/pods?limit=7").await.json();
    assert_eq!(names(&pods).len(), 7);
    assert_eq!(pods["metadata"]["remainingItemCount"], 93);
    assert!(h.sim.store().compacted().0 >= h.sim.current_rv().0 - 50);
    h.shutdown().await;
}

#[tokio::test]
async fn object_url_with_watch_param_is_a_get_and_legacy_watch_path_watches_one_object() {
    let h = start().await;
    base_fixture(&h.sim);
    let resp = get(&h, "/api/v1/namespaces/cap-base/configmaps/cm-2?watch=1").await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.json()["kind"], "ConfigMap");
    let events =
        watch(&h, "/api/v1/watch/namespaces/cap-base/configmaps/cm-2?resourceVersion=0&timeoutSeconds=1", 10)
            .await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["object"]["metadata"]["name"], "cm-2", "{events:?}");
}

#[tokio::test]
async fn pod_log_and_exec_upgrade_echo() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let h = start().await;
    h.sim
        .create(
            "pods",
            "default",
            json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}),
        )
        .unwrap();
    let resp = get(&h, "/api/v1/namespaces/default/pods/p/log").await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.headers["content-type"], "text/plain");
    assert_eq!(resp.body.iter().filter(|b| **b == b'\n').count(), 3);
    assert_eq!(get(&h, "/api/v1/namespaces/default/pods/nope/log").await.status, 404);

    let mut s = tokio::net::TcpStream::connect(h.addr).await.unwrap();
    s.write_all(b"POST /api/v1/namespaces/default/pods/p/exec?command=sh HTTP/1.1\r\nHost: sim\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\nContent-Length: 0\r\n\r\n").await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        s.read_exact(&mut b).await.unwrap();
        head.push(b[0]);
    }
    let head = String::from_utf8(head).unwrap();
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(head.to_ascii_lowercase().contains("upgrade: spdy/3.1"), "{head}");
    s.write_all(b"hello").await.unwrap();
    let mut echo = [0u8; 5];
    s.read_exact(&mut echo).await.unwrap();
    assert_eq!(&echo, b"hello");
}

#[tokio::test]
async fn status_subresource_and_patch_types() {
    let h = start().await;
    let mut body = h
        .sim
        .create(
            "pods",
            "default",
            json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}),
        )
        .unwrap();
    // Main-resource writes keep status; the status subresource changes only status. (The
    // stored pod is sent back: a pod's spec, as admission filled it in, may not change.)
    body["status"] = json!({"phase": "Running"});
    let resp = send(&h, Method::PUT, "/api/v1/namespaces/default/pods/p", &[], Some(body.clone())).await;
    assert_eq!(resp.json()["status"]["phase"], "Pending");
    let resp = send(&h, Method::PUT, "/api/v1/namespaces/default/pods/p/status", &[], Some(body)).await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.json()["status"]["phase"], "Running");
    let patch = json!([{"op": "add", "path": "/metadata/labels", "value": {"x": "1"}}]);
    let resp = send(
        &h,
        Method::PATCH,
        "/api/v1/namespaces/default/pods/p",
        &[("content-type", "application/json-patch+json")],
        Some(patch),
    )
    .await;
    assert_eq!(resp.json()["metadata"]["labels"]["x"], "1");
    let resp = send(
        &h,
        Method::PATCH,
        "/api/v1/namespaces/default/pods/p",
        &[("content-type", "application/strategic-merge-patch+json")],
        Some(json!({"metadata": {"labels": {"y": "2"}}})),
    )
    .await;
    assert_eq!(resp.json()["metadata"]["labels"], json!({"x": "1", "y": "2"}));
    let resp = send(
        &h,
        Method::PATCH,
        "/api/v1/namespaces/default/pods/p",
        &[("content-type", "text/plain")],
        Some(json!({})),
    )
    .await;
    assert_eq!(resp.status, 415);
    // A built-in kind's route refuses it: go-restful's text (the types are not named).
    assert_eq!(
        resp.json(),
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": "415: Unsupported Media Type", "reason": "UnsupportedMediaType", "details": {}, "code": 415})
    );
    // Before the name is looked up: 415 for a missing object too.
    let resp = send(
        &h,
        Method::PATCH,
        "/api/v1/namespaces/default/pods/nope",
        &[("content-type", "text/plain")],
        Some(json!({})),
    )
    .await;
    assert_eq!(resp.status, 415);
    // A custom resource has no strategic merge patch.
    h.sim
        .create(
            "example.com/widgets",
            "default",
            json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}),
        )
        .unwrap();
    let resp = send(
        &h,
        Method::PATCH,
        "/apis/example.com/v1/namespaces/default/widgets/w",
        &[("content-type", "application/strategic-merge-patch+json")],
        Some(json!({"metadata": {"labels": {"y": "2"}}})),
    )
    .await;
    assert_eq!(resp.status, 415);
    // A custom resource's handler names its types (no strategic merge patch), without details.
    assert_eq!(
        resp.json(),
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml", "reason": "UnsupportedMediaType", "code": 415})
    );
    // A no-op update takes no revision.
    let rv = h.sim.current_rv();
    let cur = get(&h, "/api/v1/namespaces/default/pods/p").await.json();
    let resp = send(&h, Method::PUT, "/api/v1/namespaces/default/pods/p", &[], Some(cur)).await;
    assert_eq!(resp.status, 200);
    assert_eq!(h.sim.current_rv(), rv);
    // DELETE answers the object at the deletion revision.
    let resp = send(&h, Method::DELETE, "/api/v1/namespaces/default/pods/p", &[], None).await;
    assert_eq!(resp.json()["metadata"]["resourceVersion"], (rv.0 + 1).to_string());
    assert_eq!(get(&h, "/api/v1/namespaces/default/pods/p").await.status, 404);
}

#[tokio::test]
async fn generate_name_and_missing_name() {
    let h = start().await;
    let resp = send(
        &h,
        Method::POST,
        "/api/v1/namespaces/default/configmaps",
        &[],
        Some(json!({"metadata": {"generateName": "gen-"}})),
    )
    .await;
    assert_eq!(resp.status, 201);
    let name = resp.json()["metadata"]["name"].as_str().unwrap().to_owned();
    assert!(name.starts_with("gen-") && name.len() == 9, "{name}");
    let resp =
        send(&h, Method::POST, "/api/v1/namespaces/default/configmaps", &[], Some(json!({"metadata": {}})))
            .await;
    assert_eq!(resp.status, 422);
    assert_eq!(
        resp.json()["message"],
        "ConfigMap \"\" is invalid: metadata.name: Required value: name or generateName is required"
    );
}

/// Load check (run by hand): `cargo test --release --lib sim::tests::seeds_100k -- --ignored --nocapture`.
#[tokio::test]
#[ignore]
async fn seeds_100k() {
    let t0 = std::time::Instant::now();
    let h = Sim::start(SimOptions { objects: 100_000, ..SimOptions::default() }).await.unwrap();
    println!("seeded 100k in {:?}", t0.elapsed());
    let t1 = std::time::Instant::now();
    let resp = get(&h, "/api/v1/pods?resourceVersion=0").await;
    println!("listed {} bytes of pods in {:?}", resp.body.len(), t1.elapsed());
    assert_eq!(names(&resp.json()).len(), 50_000);
}

#[tokio::test(start_paused = true)]
async fn watch_list_from_a_future_rv_ends_with_a_504_error_event() {
    let sim = Sim::new(SimOptions::default());
    let future = sim.current_rv().0 + 100;
    let mut rx = watch_configmaps(&sim, None, &format!("watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&resourceVersion={future}&allowWatchBookmarks=true"));
    let t0 = tokio::time::Instant::now();
    let ev: Value = serde_json::from_slice(&rx.recv().await.unwrap()).unwrap();
    assert_eq!(t0.elapsed(), Duration::from_secs(3));
    assert_eq!(ev["type"], "ERROR");
    assert_eq!(ev["object"]["code"], 504);
    assert_eq!(ev["object"]["details"]["causes"][0]["reason"], "ResourceVersionTooLarge");
    assert!(rx.recv().await.is_none());
}

#[tokio::test]
async fn serves_h2c() {
    let h = start().await;
    let client = Client::builder(TokioExecutor::new()).http2_only(true).build_http::<Full<Bytes>>();
    let req =
        Request::get(format!("http://{}/api/v1/namespaces", h.addr)).body(Full::new(Bytes::new())).unwrap();
    let resp = client.request(req).await.unwrap();
    assert_eq!(resp.version(), http::Version::HTTP_2);
    let body: Value = serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(names(&body), ["default", "kube-node-lease", "kube-public", "kube-system"]);
}

/// Starts a configmaps watch on the sim (no HTTP) and returns its frames.
fn watch_configmaps(
    sim: &Sim,
    namespace: Option<&str>,
    query: &str,
) -> tokio::sync::mpsc::Receiver<bytes::Bytes> {
    let res = sim.store().kinds.by_name("configmaps").unwrap();
    let t = super::route::Target {
        res,
        namespace: namespace.map(Into::into),
        name: None,
        sub: None,
        force_watch: false,
    };
    let q = super::query::Query::from_query(query).unwrap();
    super::watch::spawn(sim.clone(), t, q, super::respond::Accept::Json).map_err(|_| ()).unwrap()
}

#[tokio::test]
async fn metadata_only_lists_and_gets() {
    let h = start().await;
    base_fixture(&h.sim);
    let accept = [("Accept", "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1")];
    let r = send(&h, Method::GET, "/api/v1/namespaces/cap-base/configmaps?limit=2", &accept, None).await;
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(
        (v["kind"].as_str(), v["apiVersion"].as_str()),
        (Some("PartialObjectMetadataList"), Some("meta.k8s.io/v1"))
    );
    assert!(v["metadata"]["continue"].is_string());
    assert_eq!(v["metadata"]["remainingItemCount"], 3);
    let full = get(&h, "/api/v1/namespaces/cap-base/configmaps?limit=2").await.json();
    assert_eq!(v["metadata"]["resourceVersion"], full["metadata"]["resourceVersion"]);
    for (m, f) in v["items"].as_array().unwrap().iter().zip(full["items"].as_array().unwrap()) {
        assert_eq!(m["kind"], "PartialObjectMetadata");
        assert_eq!(m["metadata"], f["metadata"], "the whole metadata");
        assert!(m.get("data").is_none(), "and nothing else");
    }
    let one = [("Accept", "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1")];
    let g = send(&h, Method::GET, "/api/v1/namespaces/cap-base/configmaps/cm-1", &one, None).await.json();
    assert_eq!(
        (g["kind"].as_str(), g["metadata"]["name"].as_str()),
        (Some("PartialObjectMetadata"), Some("cm-1"))
    );
    assert!(g.get("data").is_none());
}

/// A withdrawn resource (its CRD deleted) ends its open watches without an event, as the
/// apiserver's teardown of the resource's storage does; a new watch is 404.
#[tokio::test]
async fn withdrawing_a_resource_ends_its_watches() {
    let h = start().await;
    h.sim.create("namespaces", "", json!({"metadata": {"name": "w"}})).unwrap();
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let path = "/apis/example.com/v1/namespaces/w/widgets?watch=1&resourceVersion=0&timeoutSeconds=600";
    let req = Request::get(format!("http://{}{path}", h.addr)).body(Full::new(Bytes::new())).unwrap();
    let resp = client.request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    let w = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w1"}, "spec": {"size": 1}});
    h.sim.create("example.com/widgets", "w", w).unwrap();
    let mut seen = Vec::new();
    while !seen.ends_with(b"\n") {
        let frame =
            tokio::time::timeout(Duration::from_secs(10), body.frame()).await.unwrap().unwrap().unwrap();
        seen.extend_from_slice(&frame.into_data().unwrap());
    }
    let ev: Value = serde_json::from_slice(&seen).unwrap();
    assert_eq!((ev["type"].as_str(), ev["object"]["metadata"]["name"].as_str()), (Some("ADDED"), Some("w1")));
    h.sim.set_served("example.com/widgets", false).unwrap();
    // The stream ends, with nothing more.
    let rest = tokio::time::timeout(Duration::from_secs(10), body.collect()).await.expect("the watch ended");
    assert!(rest.unwrap().to_bytes().is_empty());
    assert_eq!(get(&h, path).await.status, StatusCode::NOT_FOUND);
    // Served again: watches work again, the objects kept.
    h.sim.set_served("example.com/widgets", true).unwrap();
    let events =
        watch(&h, "/apis/example.com/v1/namespaces/w/widgets?watch=1&resourceVersion=0&timeoutSeconds=1", 10)
            .await;
    assert_eq!(events.len(), 1, "{events:?}");
    // Withdrawn and served again before the watch looks: it still ends (the CRD was replaced).
    let req = Request::get(format!("http://{}{path}", h.addr)).body(Full::new(Bytes::new())).unwrap();
    let resp = client.request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    h.sim.set_served("example.com/widgets", false).unwrap();
    h.sim.set_served("example.com/widgets", true).unwrap();
    let all = tokio::time::timeout(Duration::from_secs(10), resp.into_body().collect())
        .await
        .expect("the watch ended");
    let lines = all.unwrap().to_bytes();
    assert_eq!(lines.iter().filter(|b| **b == b'\n').count(), 1, "only the initial ADDED: {lines:?}");
    // Served again, its new storage (a new watch cache listed at that revision) replays
    // nothing older: a watch from before answers 410, one from that revision is accepted.
    let before = h.sim.current_rv().0;
    h.sim.set_served("example.com/widgets", false).unwrap();
    h.sim.create("namespaces", "", json!({"metadata": {"name": "crd-writes"}})).unwrap();
    h.sim.set_served("example.com/widgets", true).unwrap();
    let again = h.sim.current_rv().0;
    let base = "/apis/example.com/v1/namespaces/w/widgets?watch=1&timeoutSeconds=1&resourceVersion=";
    let events = watch(&h, &format!("{base}{before}"), 10).await;
    assert_eq!(
        events.first().map(|e| e["object"]["message"].clone()),
        Some(json!(format!("too old resource version: {before} ({again})"))),
        "{events:?}"
    );
    let events = watch(&h, &format!("{base}{again}"), 10).await;
    assert!(events.is_empty(), "{events:?}");
}

/// A LIST selecting one node (`fieldSelector=spec.nodeName=…`, a kubelet's) is read from the
/// store's node index rather than from every pod: the same items, in the same order, in the
/// same pages at the same revision as the whole resource filtered — whatever else the request
/// narrows (namespace, labels), and after pods are bound, moved and deleted.
#[tokio::test]
async fn a_list_by_node_is_the_whole_list_filtered() {
    let h = start().await;
    for ns in ["ns-a", "ns-b"] {
        h.sim.create("namespaces", "", json!({"metadata": {"name": ns}})).unwrap();
    }
    let pod = |i: usize, node: &str| {
        let mut spec = json!({"containers": [{"name": "c", "image": "i"}]});
        if !node.is_empty() {
            spec["nodeName"] = json!(node);
        }
        json!({"metadata": {"name": format!("p-{i:02}"), "labels": {"odd": (i % 2).to_string()}}, "spec": spec})
    };
    let ns_of = |i: usize| if i.is_multiple_of(3) { "ns-b" } else { "ns-a" };
    for i in 0..14 {
        let node = ["node-a", "node-b", "", "node-a"][i % 4];
        h.sim.create("pods", ns_of(i), pod(i, node)).unwrap();
    }
    h.sim.update("pods", ns_of(2), pod(2, "node-a")).unwrap(); // bound
    h.sim.update("pods", ns_of(1), pod(1, "node-a")).unwrap(); // moved
    h.sim.delete("pods", ns_of(3), "p-03").unwrap();

    // (namespace, node, label selector) → names, from the whole list.
    let all = get(&h, "/api/v1/pods").await.json();
    let expected = |ns: Option<&str>, node: &str, odd: Option<&str>| -> Vec<String> {
        all["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| ns.is_none_or(|ns| p["metadata"]["namespace"] == ns))
            .filter(|p| p["spec"]["nodeName"].as_str().unwrap_or("") == node)
            .filter(|p| odd.is_none_or(|o| p["metadata"]["labels"]["odd"] == o))
            .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        expected(None, "node-a", None).len(),
        8,
        "the fixture: p-00 p-01 p-02 p-04 p-07 p-08 p-11 p-12"
    );
    let rv = all["metadata"]["resourceVersion"].clone();
    let cases = [
        ("/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-a", None, "node-a", None),
        ("/api/v1/pods?fieldSelector=spec.nodeName%3D%3Dnode-b&resourceVersion=0", None, "node-b", None),
        (
            "/api/v1/namespaces/ns-a/pods?fieldSelector=spec.nodeName%3Dnode-a&labelSelector=odd%3D1",
            Some("ns-a"),
            "node-a",
            Some("1"),
        ),
        ("/api/v1/pods?fieldSelector=spec.nodeName%3D", None, "", None),
        ("/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-x", None, "node-x", None),
    ];
    for (path, ns, node, odd) in cases {
        let got = get(&h, path).await;
        assert_eq!(got.status, StatusCode::OK, "{path}");
        let got = got.json();
        assert_eq!(names(&got), expected(ns, node, odd), "{path}");
        assert_eq!(got["metadata"]["resourceVersion"], rv, "{path}");
    }
    // In pages of two, each page continuing after the last: every item once, in order.
    let mut paged = Vec::new();
    let mut path = "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-a&limit=2".to_owned();
    loop {
        let page = get(&h, &path).await.json();
        assert_eq!(page["metadata"]["resourceVersion"], rv);
        assert!(page["metadata"].get("remainingItemCount").is_none(), "not counted under a selector");
        paged.extend(names(&page));
        match page["metadata"]["continue"].as_str() {
            Some(c) => {
                path = format!("/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-a&limit=2&continue={c}")
            }
            None => break,
        }
    }
    assert_eq!(paged, expected(None, "node-a", None));
}

/// Which LISTs are read from the node index: those whose field selector requires one node by
/// equality (a kubelet's `spec.nodeName=<node>`, whatever else it requires); not an inequality,
/// nor the unscheduled pods' empty name.
#[test]
fn a_list_is_read_by_node_when_its_selector_requires_one() {
    let pods = ResourceKind::new("", "v1", "pods", "Pod", true, true);
    let node = |sel: &str| {
        let field = (!sel.is_empty()).then(|| FieldSelector::parse(sel, &pods).unwrap());
        crate::read::Filter { field, ..Default::default() }.node().map(str::to_owned)
    };
    assert_eq!(node("spec.nodeName=node-1").as_deref(), Some("node-1"));
    assert_eq!(node("spec.nodeName==node-1,status.phase=Running").as_deref(), Some("node-1"));
    assert_eq!(node("status.phase!=Failed,spec.nodeName=node-2").as_deref(), Some("node-2"));
    for none in ["spec.nodeName!=node-1", "spec.nodeName=", "metadata.name=p", ""] {
        assert_eq!(node(none), None, "{none:?}");
    }
}

/// Every recorded content negotiation (`v1.28.7-raw/protobuf.json`, `negotiation`: 78 Accept
/// headers on a built-in kind and a custom resource, LIST, GET and WATCH) against the sim: the
/// status and the content type the apiserver answered. Bodies are the proxy's tests' concern.
#[tokio::test]
async fn every_recorded_negotiation_has_the_apiservers_status_and_content_type() {
    let h = start().await;
    h.sim.create("namespaces", "", json!({"metadata": {"name": "neg"}})).unwrap();
    h.sim.create("configmaps", "neg", json!({"metadata": {"name": "c1"}, "data": {"a": "1"}})).unwrap();
    let w = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w1"}, "spec": {"size": 1}});
    h.sim.create("example.com/widgets", "neg", w).unwrap();
    let path = format!("{}/../../tests/recordings/v1.28.7-raw/protobuf.json", env!("CARGO_MANIFEST_DIR"));
    let rec: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let rv = h.sim.current_rv();
    let mut differ = Vec::new();
    for (i, e) in rec["negotiation"].as_array().unwrap().iter().enumerate() {
        let target = e["target"].as_str().unwrap();
        let base = if target.starts_with("builtin") {
            "/api/v1/namespaces/neg/configmaps"
        } else {
            "/apis/example.com/v1/namespaces/neg/widgets"
        };
        let (path, query) = match target.rsplit('-').next().unwrap() {
            "get" => (
                format!("{base}/{}", if target.starts_with("builtin") { "c1" } else { "w1" }),
                "resourceVersion=0".to_owned(),
            ),
            "watch" => (base.to_owned(), format!("watch=1&resourceVersion={rv}&timeoutSeconds=1")),
            _ => (base.to_owned(), "resourceVersion=0".to_owned()),
        };
        let req = Request::get(format!("http://{}{path}?{query}", h.addr))
            .header("accept", e["accept"].as_str().unwrap())
            .body(Full::new(Bytes::new()))
            .unwrap();
        // The answer's head only: a watch's body runs on.
        let resp = client.request(req).await.unwrap();
        let got = (
            resp.status().as_u16(),
            resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned(),
        );
        let want = (e["status"].as_u64().unwrap() as u16, e["content_type"].as_str().unwrap().to_owned());
        if got != want {
            differ.push(format!(
                "{i} {target} {:?}: {got:?}, recorded {want:?}",
                e["accept"].as_str().unwrap()
            ));
            continue;
        }
        // A JSON refusal: the same Status, byte for byte (indented where the apiserver found no
        // JSON in the Accept header to write it with).
        if want.0 != 200 && want.1 == "application/json" {
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            let recorded = match e.get("body_b64").and_then(Value::as_str) {
                Some(b) => base64::engine::general_purpose::STANDARD.decode(b).unwrap(),
                None => e["body"].as_str().unwrap_or("").as_bytes().to_vec(),
            };
            if body != recorded {
                differ.push(format!(
                    "{i} {target}: {:?}, recorded {:?}",
                    String::from_utf8_lossy(&body),
                    String::from_utf8_lossy(&recorded)
                ));
            }
        }
    }
    assert!(differ.is_empty(), "{} of 78 differ:\n{}", differ.len(), differ.join("\n"));
}
