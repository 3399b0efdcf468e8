//! Integration: large cached GET/LIST bodies are gzip'd like the apiserver's (issue 4): only
//! when the first `Accept-Encoding` has the exact token `gzip` and the body exceeds 128 KiB;
//! watches and forwarded responses are never touched.

use crate::common;

use std::io::Read;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use flate2::read::GzDecoder;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use serde_json::json;

const THRESHOLD: usize = 128 * 1024;
/// The list of namespace `big`: 160 configmaps of ~1.2 KiB, ~200 KiB in all.
const BIG: &str = "/api/v1/namespaces/big/configmaps?resourceVersion=0";
const SMALL: &str = "/api/v1/namespaces/small/configmaps?resourceVersion=0";

/// Fills namespace `big` (over the threshold) and `small` (one object); returns the last RV.
async fn filled() -> Env {
    let env = start().await;
    env.ns("big");
    let mut rv = 0;
    for i in 0..160 {
        let data = format!("{i:04}-").repeat(240);
        let o = env
            .sim
            .sim
            .create(
                "configmaps",
                "big",
                json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":format!("cm-{i:03}")},"data":{"d":data}}),
            )
            .expect("create");
        rv = rv_of(&o);
    }
    let rv = rv.max(env.create_cm("small", "only", json!({})));
    env.synced_to(rv).await;
    env
}

async fn get_with(env: &Env, path: &str, accept_encoding: &str) -> Resp {
    send(&env.client, Method::GET, &env.proxy_url(path), None, &[("accept-encoding", accept_encoding)]).await
}

fn gunzip(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    GzDecoder::new(b).read_to_end(&mut out).expect("valid gzip");
    out
}

fn is_gzip(r: &Resp) -> bool {
    r.headers.get("content-encoding").is_some_and(|v| v == "gzip")
}

#[tokio::test]
async fn large_list_is_gzipped_and_decompresses_to_the_identity_body() {
    let env = filled().await;
    let plain = env.get(BIG).await;
    assert_eq!(plain.status, 200);
    assert!(plain.body.len() > THRESHOLD, "fixture too small: {} bytes", plain.body.len());
    assert_eq!(plain.names().len(), 160);
    assert!(!is_gzip(&plain), "no Accept-Encoding: identity");
    assert_eq!(plain.headers["content-length"], plain.body.len().to_string());

    let gz = get_with(&env, BIG, "gzip").await;
    assert_eq!(gz.status, 200);
    assert!(is_gzip(&gz), "headers: {:?}", gz.headers);
    assert_eq!(gz.headers["vary"], "Accept-Encoding");
    assert!(gz.headers.get("content-length").is_none(), "compressed bodies are chunked");
    assert_eq!(gz.headers["content-type"], "application/json", "Content-Type unchanged");
    assert!(gz.body.len() < plain.body.len() / 4, "{} of {} bytes", gz.body.len(), plain.body.len());
    assert_eq!(Bytes::from(gunzip(&gz.body)), plain.body, "same bytes as the identity LIST");
    env.proxy.shutdown().await;
}

#[tokio::test]
async fn small_list_stays_identity() {
    let env = filled().await;
    let r = get_with(&env, SMALL, "gzip").await;
    assert_eq!(r.status, 200);
    assert!(!is_gzip(&r));
    assert!(r.headers.get("vary").is_none());
    assert_eq!(r.headers["content-length"], r.body.len().to_string());
    assert_eq!(r.names(), vec!["only"]);
    env.proxy.shutdown().await;
}

#[tokio::test]
async fn accept_encoding_is_read_like_the_apiserver() {
    let env = filled().await;
    let plain = env.get(BIG).await;
    // The apiserver's ContentEncodingSupported: the first header value, split at ',', one
    // trimmed token exactly `gzip` — no q-values, no wildcard, case-sensitive.
    for ae in ["gzip", "gzip, deflate, br", "deflate,gzip", " gzip "] {
        let r = get_with(&env, BIG, ae).await;
        assert!(is_gzip(&r), "Accept-Encoding: {ae:?} → gzip");
        assert_eq!(Bytes::from(gunzip(&r.body)), plain.body, "Accept-Encoding: {ae:?}");
    }
    for ae in ["identity", "gzip;q=0", "gzip;q=1.0", "GZIP", "*", "x-gzip", "deflate, br"] {
        let r = get_with(&env, BIG, ae).await;
        assert!(!is_gzip(&r), "Accept-Encoding: {ae:?} → identity");
        assert_eq!(r.body, plain.body, "Accept-Encoding: {ae:?}");
    }
    env.proxy.shutdown().await;
}

#[tokio::test]
async fn watch_is_never_gzipped() {
    let env = filled().await;
    // A watch from RV 0 starts with every object as ADDED: far more than 128 KiB at once.
    let url = env.proxy_url("/api/v1/namespaces/big/configmaps?watch=1&resourceVersion=0");
    let req =
        Request::builder().uri(url).header("accept-encoding", "gzip").body(Full::new(Bytes::new())).unwrap();
    let t = Duration::from_secs(10);
    let resp = tokio::time::timeout(t, env.client.request(req)).await.expect("headers in time").unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().get("content-encoding").is_none(), "headers: {:?}", resp.headers());
    assert!(resp.headers().get("content-length").is_none());
    let mut body = resp.into_body();
    let mut buf = Vec::new();
    let mut events = 0;
    while events < 160 {
        let frame = tokio::time::timeout(t, body.frame()).await.expect("events in time").unwrap().unwrap();
        buf.extend_from_slice(&frame.into_data().unwrap_or_default());
        while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            let e: serde_json::Value = serde_json::from_slice(&line).expect("plain JSON event lines");
            assert_eq!(e["type"], "ADDED");
            events += 1;
        }
    }
    env.proxy.shutdown().await;
}

#[tokio::test]
async fn forwarded_responses_are_passed_through() {
    let env = start().await;
    // One object over the threshold, read without resourceVersion: a GET the proxy forwards.
    env.ns("huge");
    env.sim
        .sim
        .create(
            "configmaps",
            "huge",
            json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"one"},"data":{"d":"x".repeat(THRESHOLD + 1)}}),
        )
        .expect("create");
    let before = env.upstream_requests("/api/v1/namespaces/huge/configmaps/one", "");
    let r = get_with(&env, "/api/v1/namespaces/huge/configmaps/one", "gzip").await;
    assert_eq!(r.status, 200);
    assert_eq!(env.upstream_requests("/api/v1/namespaces/huge/configmaps/one", ""), before + 1, "forwarded");
    // The simulated upstream answers identity; the proxy leaves that as it is.
    assert!(!is_gzip(&r));
    assert!(r.body.len() > THRESHOLD);
    assert_eq!(r.json()["metadata"]["name"], "one");
    // The same object from the cache (resourceVersion=0) is gzip'd like the apiserver's GET.
    let rv = env.sim.sim.current_rv().0;
    env.synced_to(rv).await;
    let cached = "/api/v1/namespaces/huge/configmaps/one?resourceVersion=0";
    let z = get_with(&env, cached, "gzip").await;
    assert_eq!(env.upstream_requests("/api/v1/namespaces/huge/configmaps/one", ""), before + 1, "cached");
    assert!(is_gzip(&z), "{:?}", z.headers);
    let plain = get_with(&env, cached, "identity").await;
    assert_eq!(plain.headers.get("content-length").unwrap(), &plain.body.len().to_string());
    assert_eq!(gunzip(&z.body), plain.body.to_vec());
    env.proxy.shutdown().await;
}
