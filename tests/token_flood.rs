//! What an unauthenticated caller can make the proxy do upstream (issue 21 item 5): random
//! bearer tokens must not turn into unbounded TokenReviews. Requests count against
//! `--max-requests-inflight` before they are authenticated; rejected tokens are remembered
//! apart from valid ones; reviews sent upstream are bounded per second.

mod common;

use std::time::Duration;

use common::fault::Fault;
use common::{send, serve_args};
use http::{Method, StatusCode};
use kube_watchcache::app;
use kube_watchcache::config::SecurityArgs;
use kube_watchcache_sim::{AuthScript, Rule, ScriptUser, Sim, SimHandle, SimOptions};
use serde_json::json;

const TOKEN_REVIEWS: &str = "/apis/authentication.k8s.io/v1/tokenreviews";
const LIST: &str = "/api/v1/namespaces/ns-a/configmaps?resourceVersion=0";

async fn sim() -> SimHandle {
    let sim = Sim::start(SimOptions::default()).await.expect("sim starts");
    sim.sim.set_auth(
        AuthScript::default().token("alice-token", ScriptUser::new("alice", &[])).rule(Rule::user(
            "alice",
            &["get", "list", "watch"],
            "",
            &["configmaps"],
        )),
    );
    sim.sim
        .create("namespaces", "", json!({"apiVersion":"v1","kind":"Namespace","metadata":{"name":"ns-a"}}))
        .unwrap();
    sim
}

fn reviews(sim: &SimHandle) -> usize {
    sim.sim.request_count(|r| r.path == TOKEN_REVIEWS)
}

async fn get(addr: std::net::SocketAddr, token: &str) -> StatusCode {
    let auth = format!("Bearer {token}");
    send(&common::client(), Method::GET, &format!("http://{addr}{LIST}"), None, &[("authorization", &auth)])
        .await
        .status
}

fn secured(
    upstream: std::net::SocketAddr,
    edit: impl FnOnce(&mut SecurityArgs),
) -> kube_watchcache::config::ServeArgs {
    let mut args = serve_args(upstream, &["configmaps"]);
    args.security.auth = "upstream".into();
    edit(&mut args.security);
    args
}

/// A flood of random tokens: at most the burst of reviews goes upstream, the rest get 429;
/// the same bad tokens again cost nothing; a valid user's cached entry survives.
#[tokio::test]
async fn random_tokens_cost_a_bounded_number_of_reviews() {
    let sim = sim().await;
    let args = secured(sim.addr, |s| {
        s.authentication_token_review_qps = 1.0;
        s.authentication_token_review_burst = 20;
        s.auth_cache_size = 64;
    });
    let proxy = app::start(&args).await.expect("proxy starts");
    assert!(proxy.wait_ready(Duration::from_secs(10)).await);
    assert_eq!(get(proxy.addr, "alice-token").await, StatusCode::OK);
    assert_eq!(reviews(&sim), 1);
    let tokens: Vec<String> = (0..200).map(|i| format!("random-{i}-{}", fastrand::u64(..))).collect();
    let mut codes = Vec::new();
    for t in &tokens {
        codes.push(get(proxy.addr, t).await);
    }
    let sent = reviews(&sim) - 1;
    let refused = codes.iter().filter(|c| **c == StatusCode::UNAUTHORIZED).count();
    let limited = codes.iter().filter(|c| **c == StatusCode::TOO_MANY_REQUESTS).count();
    assert!(sent <= 22, "at most the burst (20) and what 1/s refilled: {sent} reviews for 200 tokens");
    assert_eq!(refused, sent, "every review sent said 401");
    assert_eq!(refused + limited, tokens.len());
    // The rejected tokens again: answered from the negative cache, no review.
    let before = reviews(&sim);
    for (t, c) in tokens.iter().zip(&codes) {
        if *c == StatusCode::UNAUTHORIZED {
            assert_eq!(get(proxy.addr, t).await, StatusCode::UNAUTHORIZED);
        }
    }
    assert_eq!(reviews(&sim), before, "rejected tokens are remembered");
    // Alice's entry was not pushed out by the flood (the cache holds 64).
    assert_eq!(get(proxy.addr, "alice-token").await, StatusCode::OK);
    assert_eq!(reviews(&sim), before, "alice still cached");
    proxy.shutdown().await;
}

/// With one request in flight (its TokenReview slowed down by the relay), a second request with
/// another bad token is refused with 429 before it is authenticated: no second review.
#[tokio::test]
async fn the_inflight_limit_comes_before_authentication() {
    let sim = sim().await;
    let relay = Fault::start(sim.addr).await;
    let args = secured(relay.addr, |s| s.max_requests_inflight = 1);
    let proxy = app::start(&args).await.expect("proxy starts");
    assert!(proxy.wait_ready(Duration::from_secs(10)).await);
    relay.set_delay(Duration::from_millis(400));
    let addr = proxy.addr;
    let first = tokio::spawn(async move { get(addr, "bad-1").await });
    // Until the first request's review is held in the relay.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while relay.count(|s| &s.delayed_chunks) == 0 {
        assert!(tokio::time::Instant::now() < deadline, "the first review reached the relay");
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(get(addr, "bad-2").await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(first.await.unwrap(), StatusCode::UNAUTHORIZED);
    relay.set_delay(Duration::ZERO);
    assert_eq!(reviews(&sim), 1, "the refused request made no TokenReview");
    proxy.shutdown().await;
}
