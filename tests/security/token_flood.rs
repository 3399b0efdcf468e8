//! What an unauthenticated caller can make the proxy do upstream (issue 21 item 5): random
//! bearer tokens must not turn into unbounded TokenReviews. Requests count against
//! `--max-requests-inflight` before they are authenticated; rejected tokens are remembered
//! apart from valid ones; reviews sent upstream are bounded per second, and each source address
//! has a quarter of that (issue 30 item 5); tokens are read as the apiserver reads them, and a
//! token over `--authentication-token-max-length` is refused without a review.

use crate::common;

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

fn client_from(ip: &str) -> common::HttpClient {
    let mut c = hyper_util::client::legacy::connect::HttpConnector::new();
    c.set_local_address(Some(ip.parse().unwrap()));
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build(c)
}

/// A flood of random tokens from one address takes its own share of the review rate (a
/// quarter), not everyone's: new valid tokens from another address are still reviewed. Before,
/// one bucket for all: the flood spent it and new valid tokens got 429.
#[tokio::test]
async fn a_flood_from_one_source_leaves_reviews_for_the_others() {
    let sim = sim().await;
    let mut script = AuthScript::default();
    for i in 0..8 {
        script = script.token(&format!("valid-{i}"), ScriptUser::new(&format!("user-{i}"), &[]));
        script = script.rule(Rule::user(&format!("user-{i}"), &["list"], "", &["configmaps"]));
    }
    sim.sim.set_auth(script);
    let args = secured(sim.addr, |s| {
        s.authentication_token_review_qps = 1.0;
        s.authentication_token_review_burst = 40;
    });
    let proxy = app::start(&args).await.expect("proxy starts");
    assert!(proxy.wait_ready(Duration::from_secs(10)).await);
    let mut limited = 0;
    for i in 0..200 {
        if get(proxy.addr, &format!("random-{i}-{}", fastrand::u64(..))).await
            == StatusCode::TOO_MANY_REQUESTS
        {
            limited += 1;
        }
    }
    let flood_reviews = reviews(&sim);
    assert!(flood_reviews <= 10 + 3, "the flood's source had a quarter of the burst: {flood_reviews}");
    assert_eq!(limited, 200 - flood_reviews);
    let other = client_from("127.0.0.2");
    for i in 0..8 {
        let auth = format!("Bearer valid-{i}");
        let url = format!("http://{}{LIST}", proxy.addr);
        let r = send(&other, Method::GET, &url, None, &[("authorization", &auth)]).await;
        assert_eq!(r.status, StatusCode::OK, "valid token {i} from another address");
    }
    proxy.shutdown().await;
}

/// Unknown tokens from four addresses spend the whole review rate (a quarter each); a user
/// whose cached answer expires meanwhile is reviewed again from the renewals' own bucket, never
/// refused. Before, every valid token got 429 once its answer expired, for as long as the flood
/// went on (found by a review).
#[tokio::test]
async fn a_flood_of_unknown_tokens_does_not_refuse_a_known_users_renewal() {
    let sim = sim().await;
    let args = secured(sim.addr, |s| {
        s.authentication_token_review_qps = 0.01;
        s.authentication_token_review_burst = 8;
        s.authentication_cache_ttl = Duration::from_secs(1);
    });
    let proxy = app::start(&args).await.expect("proxy starts");
    assert!(proxy.wait_ready(Duration::from_secs(10)).await);
    assert_eq!(get(proxy.addr, "alice-token").await, StatusCode::OK);
    let url = format!("http://{}{LIST}", proxy.addr);
    let mut limited = 0;
    for i in 0..40 {
        let from = client_from(&format!("127.0.0.{}", 2 + i % 4));
        let auth = format!("Bearer random-{i}-{}", fastrand::u64(..));
        if send(&from, Method::GET, &url, None, &[("authorization", &auth)]).await.status
            == StatusCode::TOO_MANY_REQUESTS
        {
            limited += 1;
        }
    }
    assert_eq!(reviews(&sim), 8, "the flood spent the shared bucket");
    assert_eq!(limited, 40 - 7);
    // Until alice's answer has expired and been renewed: every request is answered.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while reviews(&sim) == 8 {
        assert!(tokio::time::Instant::now() < deadline, "alice's answer is renewed");
        assert_eq!(get(proxy.addr, "alice-token").await, StatusCode::OK);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(get(proxy.addr, "alice-token").await, StatusCode::OK);
    // A new token is still bound by the shared bucket.
    assert_eq!(get(proxy.addr, "random-after").await, StatusCode::TOO_MANY_REQUESTS);
    proxy.shutdown().await;
}

/// A token longer than --authentication-token-max-length is 401 without a TokenReview (before:
/// a 900 KB token became a 900 KB TokenReview), even one the upstream would accept; one of
/// exactly the length is reviewed.
#[tokio::test]
async fn a_token_over_the_length_bound_is_refused_without_a_review() {
    let sim = sim().await;
    let (long, just) = ("l".repeat(16 * 1024 + 1), "j".repeat(16 * 1024));
    sim.sim.set_auth(
        AuthScript::default()
            .token(&long, ScriptUser::new("alice", &[]))
            .token(&just, ScriptUser::new("alice", &[]))
            .rule(Rule::user("alice", &["list"], "", &["configmaps"])),
    );
    let proxy = app::start(&secured(sim.addr, |_| {})).await.expect("proxy starts");
    assert!(proxy.wait_ready(Duration::from_secs(10)).await);
    assert_eq!(get(proxy.addr, &long).await, StatusCode::UNAUTHORIZED);
    assert_eq!(reviews(&sim), 0, "no review of the long token");
    assert_eq!(get(proxy.addr, &just).await, StatusCode::OK);
    assert_eq!(reviews(&sim), 1);
    proxy.shutdown().await;
}

/// `Bearer  <token>` (two spaces) carries no token for the apiserver's bearer token
/// authenticator (`strings.SplitN(auth, " ", 3)`: the token part is empty): 401, no review.
/// Before, the token was trimmed and the cached read served.
#[tokio::test]
async fn bearer_with_two_spaces_carries_no_token() {
    let sim = sim().await;
    let proxy = app::start(&secured(sim.addr, |_| {})).await.expect("proxy starts");
    assert!(proxy.wait_ready(Duration::from_secs(10)).await);
    assert_eq!(get(proxy.addr, " alice-token").await, StatusCode::UNAUTHORIZED);
    assert_eq!(reviews(&sim), 0);
    assert_eq!(get(proxy.addr, "alice-token").await, StatusCode::OK, "one space is a token");
    proxy.shutdown().await;
}

/// Requests with an unknown token wait on its review holding an in-flight permit; concurrent
/// ones with the same token all wait on that one review. One source piling requests on a slow
/// review holds at most its seats (`auth::waiting::PER_SOURCE`), not every permit: past them
/// it gets 429 at once, and a caller whose token is known is still served. Before, 40
/// requests with one bad token held all 40 permits for the review's whole time.
#[tokio::test]
async fn requests_piled_on_one_slow_review_hold_only_their_sources_seats() {
    use kube_watchcache::server::auth::waiting::PER_SOURCE;
    let sim = sim().await;
    let relay = Fault::start(sim.addr).await;
    let piled = PER_SOURCE + 8;
    let args = secured(relay.addr, |s| s.max_requests_inflight = piled);
    let proxy = app::start(&args).await.expect("proxy starts");
    assert!(proxy.wait_ready(Duration::from_secs(10)).await);
    let other = client_from("127.0.0.2");
    let alice = || async {
        let url = format!("http://{}{LIST}", proxy.addr);
        send(&other, Method::GET, &url, None, &[("authorization", "Bearer alice-token")]).await.status
    };
    assert_eq!(alice().await, StatusCode::OK, "alice's token and rights are cached");
    // The review waits until every request has come and been counted: no time window.
    relay.hold(true);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for _ in 0..piled {
        let (addr, tx) = (proxy.addr, tx.clone());
        tokio::spawn(async move {
            let _ = tx.send(get(addr, "bad-and-slow").await);
        });
    }
    let mut codes = Vec::new();
    for _ in 0..piled - PER_SOURCE {
        let c =
            tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.expect("refused at once").unwrap();
        codes.push(c);
    }
    assert!(codes.iter().all(|c| *c == StatusCode::TOO_MANY_REQUESTS), "{codes:?}");
    assert_eq!(alice().await, StatusCode::OK, "a known caller still finds a permit");
    relay.hold(false);
    for _ in 0..PER_SOURCE {
        let c = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.expect("reviewed").unwrap();
        assert_eq!(c, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(reviews(&sim), 2, "alice's, and one for every request that waited");
    proxy.shutdown().await;
}
