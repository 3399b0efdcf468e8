//! Integration: everything the cache does not serve is forwarded unchanged, streamed both
//! ways (issue 2, point 7).

use crate::common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::Method;
use http_body_util::{BodyExt, Full};
use kube_watchcache_sim::SimOptions;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn writes_go_upstream_and_come_back_through_the_watch() {
    let env = start().await;
    env.ns("ns");
    let mut w =
        open_watch(&env.client, &env.proxy_url("/api/v1/namespaces/ns/configmaps?watch=1&resourceVersion=0"))
            .await;
    let created = send(
        &env.client,
        Method::POST,
        &env.proxy_url("/api/v1/namespaces/ns/configmaps"),
        Some(json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"w"},"data":{"k":"v"}})),
        &[("content-type", "application/json")],
    )
    .await;
    assert_eq!(created.status, 201);
    assert_eq!(env.sim.sim.request_count(|r| r.method == "POST"), 1, "the write reached the upstream");
    assert_eq!(w.take(1, Duration::from_secs(5)).await, vec![("ADDED".into(), "w".into())]);
    // A duplicate create: the upstream's 409 comes back unchanged.
    let dup = send(
        &env.client,
        Method::POST,
        &env.proxy_url("/api/v1/namespaces/ns/configmaps"),
        Some(json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"w"}})),
        &[("content-type", "application/json")],
    )
    .await;
    assert_eq!(dup.status, 409);
    assert_eq!(dup.json()["reason"], "AlreadyExists");
    let del =
        send(&env.client, Method::DELETE, &env.proxy_url("/api/v1/namespaces/ns/configmaps/w"), None, &[])
            .await;
    assert_eq!(del.status, 200);
}

#[tokio::test]
async fn most_recent_get_discovery_and_version_are_forwarded() {
    let env = start().await;
    let rv = env.create_cm("ns", "a", json!({}));
    env.synced_to(rv).await;
    let r = env.get("/api/v1/namespaces/ns/configmaps/a").await;
    assert_eq!(r.status, 200);
    assert_eq!(
        env.upstream_requests("/api/v1/namespaces/ns/configmaps/a", ""),
        1,
        "GET with RV unset reads upstream"
    );
    for path in ["/api", "/apis", "/api/v1", "/version"] {
        let p = env.get(path).await;
        let s = env.get_sim(path).await;
        assert_eq!(p.status, s.status, "{path}");
        assert_eq!(p.body, s.body, "{path}: forwarded unchanged");
    }
    // Not cached: secrets.
    let r = env.get("/api/v1/secrets?resourceVersion=0").await;
    assert_eq!(r.status, 200);
    assert_eq!(env.upstream_requests("/api/v1/secrets", ""), 1);
}

#[tokio::test]
async fn alternate_representations_are_forwarded() {
    let env = start().await;
    // YAML first, JSON after it or not: the apiserver answers YAML (a WATCH its 406).
    for accept in ["application/yaml", "application/yaml, application/json"] {
        let before = env.upstream_requests("/api/v1/configmaps", "resourceVersion=0");
        let r = send(
            &env.client,
            Method::GET,
            &env.proxy_url("/api/v1/configmaps?resourceVersion=0"),
            None,
            &[("accept", accept)],
        )
        .await;
        let s = send(
            &env.client,
            Method::GET,
            &env.sim_url("/api/v1/configmaps?resourceVersion=0"),
            None,
            &[("accept", accept)],
        )
        .await;
        assert_eq!(r.status, s.status, "{accept}");
        assert_eq!(env.upstream_requests("/api/v1/configmaps", "resourceVersion=0"), before + 2, "{accept}");
    }
    // Protobuf first but JSON accepted (kubelet): served from the cache, in protobuf.
    let before = env.upstream_requests("/api/v1/configmaps", "resourceVersion=0");
    let r = send(
        &env.client,
        Method::GET,
        &env.proxy_url("/api/v1/configmaps?resourceVersion=0"),
        None,
        &[("accept", "application/vnd.kubernetes.protobuf,application/json")],
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.headers["content-type"], "application/vnd.kubernetes.protobuf");
    assert_eq!(env.upstream_requests("/api/v1/configmaps", "resourceVersion=0"), before);
}

#[tokio::test]
async fn long_running_logs_stream_through() {
    let env = start().await;
    env.ns("ns");
    env.sim.sim.create("pods", "ns", json!({"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[{"name":"c","image":"x"}]}})).unwrap();
    let req = http::Request::get(env.proxy_url("/api/v1/namespaces/ns/pods/p/log?follow=true"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = env.client.request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    // Two lines arrive one after the other while the stream stays open.
    let mut got = Vec::new();
    while got.iter().filter(|b| **b == b'\n').count() < 2 {
        let f = tokio::time::timeout(Duration::from_secs(5), body.frame())
            .await
            .expect("a line in time")
            .unwrap()
            .unwrap();
        if let Ok(d) = f.into_data() {
            got.extend_from_slice(&d);
        }
    }
}

#[tokio::test]
async fn upgrades_are_spliced() {
    // --auth=none refuses exec by default (kubectl proxy's --reject-paths); allowed here.
    let opts = SimOptions { listen: "127.0.0.1:0".parse().unwrap(), objects: 0, ..Default::default() };
    let env = start_edited(opts, |a| a.security.reject_paths = String::new()).await;
    env.ns("ns");
    env.sim.sim.create("pods", "ns", json!({"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[{"name":"c","image":"x"}]}})).unwrap();
    let s = common::exec_session(env.proxy.addr, "ns/pods/p", "").await;
    assert!(s.is_ok(), "{:?}", s.err());
}

/// Issue 21 item 4: headers the upstream may trust from the proxy's connection never pass:
/// request-header authentication headers are dropped, and `X-Forwarded-For` is the caller's
/// real address, not its own claim.
#[tokio::test]
async fn headers_the_upstream_may_trust_are_not_passed_on() {
    let env = start().await;
    env.ns("ns");
    let path = "/api/v1/namespaces/ns/configmaps/absent";
    let r = send(
        &env.client,
        Method::GET,
        &env.proxy_url(path),
        None,
        &[
            ("x-remote-user", "system:admin"),
            ("x-remote-group", "system:masters"),
            ("x-remote-extra-scopes", "all"),
            ("x-forwarded-for", "203.0.113.9"),
            ("x-real-ip", "203.0.113.9"),
        ],
    )
    .await;
    assert_eq!(r.status, 404, "forwarded and answered");
    let seen = env.sim.sim.requests(|r| r.path == path);
    assert_eq!(seen.len(), 1);
    let h = &seen[0].headers;
    for name in ["x-remote-user", "x-remote-group", "x-remote-extra-scopes", "x-real-ip"] {
        assert!(!h.contains_key(name), "{name} passed on");
    }
    assert_eq!(h.get_all("x-forwarded-for").iter().collect::<Vec<_>>(), ["127.0.0.1"]);
}

/// Issue 21: a transfer coding other than one `chunked` is refused as Go's server refuses it
/// (501), never forwarded without the coding.
#[tokio::test]
async fn unsupported_transfer_codings_are_refused() {
    let env = start().await;
    env.ns("ns");
    let path = "/api/v1/namespaces/ns/configmaps";
    let mut s = tokio::net::TcpStream::connect(env.proxy.addr).await.unwrap();
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut got)).await;
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 501"), "{text}");
    assert!(text.ends_with("501 Not Implemented"), "{text}");
    assert_eq!(env.upstream_path(path), 0, "nothing forwarded");
}
