//! One caller cannot exhaust what every caller needs (issue 30 item 5), and HTTP/2 in the
//! clear serves many requests on one connection (item 6). The sim answers TokenReviews and
//! SubjectAccessReviews as the apiserver would; the proxy is real; clients speak HTTP to it.
//!
//! - in flight: a user holding connections whose large answers it does not read gets its share
//!   of `--max-requests-inflight` (429 past it) while another user is served, and the share
//!   comes back at `--write-stall-timeout`, well before `--request-timeout`;
//! - watches: a cached watch whose client takes nothing of it is cut at the same timeout, and
//!   what it holds (a watch-list's snapshot, its watcher) let go; an idle one is kept;
//! - SubjectAccessReviews: GETs of many distinct names make at most the user's burst of reviews
//!   (`--authorization-review-burst`), then 429, while another user is served; a user acting as
//!   another spends the pair's reviews and watch slots, never the named user's own;
//! - HTTP/2 streams reset after the proxy accepted them (their review sent) count against the
//!   connection, which is closed past the bound instead of sending a review per stream.

use crate::common;

use std::time::Duration;

use bytes::Bytes;
use common::{send, serve_args};
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use kube_watchcache::app::{self, Running};
use kube_watchcache::config::ServeArgs;
use kube_watchcache_sim::{AuthScript, Rule, ScriptUser, Sim, SimHandle, SimOptions};
use serde_json::json;
use tokio::time::Instant;

const ACCESS_REVIEWS: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews";
const LIST: &str = "/api/v1/namespaces/big/configmaps?resourceVersion=0";

struct Env {
    sim: SimHandle,
    proxy: Running,
    client: common::HttpClient,
}

fn script() -> AuthScript {
    AuthScript::default()
        .token("mallory-token", ScriptUser::new("mallory", &[]))
        .token("alice-token", ScriptUser::new("alice", &[]))
        .rule(Rule::user("mallory", &["get", "list", "watch"], "", &["configmaps"]))
        .rule(Rule::user("alice", &["get", "list"], "", &["configmaps"]))
        .rule(Rule::paths("alice", &["get"], &["/watchcache/metrics"]))
}

async fn start(objects: usize, edit: impl FnOnce(&mut ServeArgs)) -> Env {
    let sim = Sim::start(SimOptions::default()).await.expect("sim starts");
    sim.sim.set_auth(script());
    sim.sim
        .create("namespaces", "", json!({"apiVersion":"v1","kind":"Namespace","metadata":{"name":"big"}}))
        .unwrap();
    // 8 KiB each: 3000 of them are ~24 MB, more than the loopback socket buffers hold.
    let data = "x".repeat(8 * 1024);
    let mut rv = 0;
    for i in 0..objects {
        let o = sim
            .sim
            .create(
                "configmaps",
                "big",
                json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":format!("cm-{i:04}")},"data":{"k":data}}),
            )
            .unwrap();
        rv = common::rv_of(&o);
    }
    let mut args = serve_args(sim.addr, &["configmaps"]);
    args.security.auth = "upstream".into();
    edit(&mut args);
    let proxy = app::start(&args).await.expect("proxy starts");
    assert!(proxy.wait_ready(Duration::from_secs(10)).await);
    if rv > 0 {
        let r = proxy.readers().into_iter().find(|r| r.kind().resource == "configmaps").unwrap();
        r.wait_for(kube_watchcache::resource::Rv(rv), Duration::from_secs(20)).await.expect("synced");
    }
    Env { sim, proxy, client: common::client() }
}

impl Env {
    async fn get(&self, path: &str, token: &str) -> StatusCode {
        let auth = format!("Bearer {token}");
        let url = format!("http://{}{path}", self.proxy.addr);
        send(&self.client, Method::GET, &url, None, &[("authorization", &auth)]).await.status
    }

    /// A GET whose response headers are read, and nothing of its body.
    async fn unread(&self, path: &str, token: &str) -> http::Response<hyper::body::Incoming> {
        let req = Request::get(format!("http://{}{path}", self.proxy.addr))
            .header("authorization", format!("Bearer {token}"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        tokio::time::timeout(Duration::from_secs(20), self.client.request(req)).await.unwrap().unwrap()
    }

    fn access_reviews(&self) -> usize {
        self.sim.sim.request_count(|r| r.path == ACCESS_REVIEWS)
    }
}

/// A user allowed to impersonate gets no more in flight by naming other users: its share is
/// its own, taken before the impersonation is checked (before, each impersonated user had a
/// share, and requests waiting on impersonation's reviews held permits past any share).
#[tokio::test]
async fn impersonating_other_users_spreads_no_request_over_their_shares() {
    let env = start(3000, |a| {
        a.security.max_requests_inflight = 4;
        a.security.write_stall_timeout = Duration::from_secs(30);
    })
    .await;
    let mut script = script().rule(Rule::user("mallory", &["impersonate"], "", &["users"]));
    for i in 0..6 {
        script = script.rule(Rule::user(&format!("u{i}"), &["get", "list"], "", &["configmaps"]));
    }
    env.sim.sim.set_auth(script);
    let mut held = Vec::new();
    let mut refused = 0;
    for i in 0..6 {
        let req = Request::get(format!("http://{}{LIST}", env.proxy.addr))
            .header("authorization", "Bearer mallory-token")
            .header("impersonate-user", format!("u{i}"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let r =
            tokio::time::timeout(Duration::from_secs(20), env.client.request(req)).await.unwrap().unwrap();
        match r.status() {
            StatusCode::OK => held.push(r),
            StatusCode::TOO_MANY_REQUESTS => refused += 1,
            s => panic!("unexpected {s}"),
        }
    }
    assert_eq!((held.len(), refused), (2, 4), "Mallory's own share, whoever she names");
    assert_eq!(
        env.get("/api/v1/namespaces/big/configmaps/cm-0001?resourceVersion=0", "alice-token").await,
        StatusCode::OK,
        "Alice is served"
    );
    drop(held);
}

/// A GET with `token`, as `as_user` when given (headers read, nothing of the body).
async fn acting(
    env: &Env,
    token: &str,
    as_user: Option<&str>,
    path: String,
) -> http::Response<hyper::body::Incoming> {
    let mut b = Request::get(format!("http://{}{path}", env.proxy.addr))
        .header("authorization", format!("Bearer {token}"));
    if let Some(u) = as_user {
        b = b.header("impersonate-user", u);
    }
    let req = b.body(Full::new(Bytes::new())).unwrap();
    tokio::time::timeout(Duration::from_secs(10), env.client.request(req)).await.unwrap().unwrap()
}

/// A user acting as another spends the pair's review budget and watch slots: an impersonating
/// front proxy (Pinniped, Teleport) serves each of its users with that user's own limits, as the
/// apiserver's priority and fairness classifies by the impersonated user, and an impersonator
/// never spends the named user's own (a review: keyed by the impersonated user alone, mallory
/// exhausted alice's; keyed by the impersonator alone, a front proxy's users shared one set).
#[tokio::test]
async fn an_impersonator_spends_the_pairs_limits_not_the_named_users_own() {
    let env = start(0, |a| {
        a.security.authorization_review_qps = 0.001;
        a.security.authorization_review_burst = 3;
        a.security.max_watches_per_user = 2;
        // One review per impersonation (constrained impersonation tries its modes first).
        a.security.feature_gates.constrained_impersonation = Some(false);
    })
    .await;
    let rules = || {
        script()
            .rule(Rule::user("mallory", &["impersonate"], "", &["users"]))
            .rule(Rule::user("alice", &["watch"], "", &["configmaps"]))
            .rule(Rule::user("u1", &["get", "list", "watch"], "", &["configmaps"]))
    };
    env.sim.sim.set_auth(rules());
    let req = |token: &'static str, as_user: Option<&'static str>, path: &str| {
        acting(&env, token, as_user, path.to_owned())
    };
    let get = |i: usize| format!("/api/v1/namespaces/big/configmaps/n-{i}?resourceVersion=0");
    let (nf, tm, ok) = (StatusCode::NOT_FOUND, StatusCode::TOO_MANY_REQUESTS, StatusCode::OK);
    let mut codes = Vec::new();
    for i in 0..4 {
        codes.push(req("mallory-token", Some("alice"), &get(i)).await.status());
    }
    // The impersonation's review is mallory's own; the three decisions the pair's burst.
    assert_eq!(codes, [nf, nf, nf, tm], "the pair's burst of 3");
    assert_eq!(req("alice-token", None, &get(10)).await.status(), nf, "alice's own budget is untouched");
    let r = req("mallory-token", Some("u1"), &get(20)).await;
    let st = r.status();
    let body = r.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(st, nf, "another pair has its own: {}", String::from_utf8_lossy(&body));
    assert_eq!(env.access_reviews(), 1 + 3 + 1 + 2);

    // Watches (reviews unbounded): two slots for the pair, two for alice herself, two for
    // another pair.
    env.proxy.shutdown().await;
    let env = start(0, |a| {
        a.security.authorization_review_qps = 0.0;
        a.security.max_watches_per_user = 2;
    })
    .await;
    env.sim.sim.set_auth(rules());
    let req = |token: &'static str, as_user: Option<&'static str>, path: &str| {
        acting(&env, token, as_user, path.to_owned())
    };
    let watch = "/api/v1/namespaces/big/configmaps?watch=1&resourceVersion=0";
    let mut held = Vec::new();
    let mut statuses = Vec::new();
    for (token, as_user) in [("mallory-token", Some("alice")); 3].into_iter().chain([
        ("alice-token", None),
        ("alice-token", None),
        ("mallory-token", Some("u1")),
    ]) {
        let w = req(token, as_user, watch).await;
        statuses.push(w.status());
        held.push(w);
    }
    assert_eq!(statuses, [ok, ok, tm, ok, ok, ok]);
    drop(held);
    env.proxy.shutdown().await;
}

/// Mallory opens more connections than all the in-flight permits, each asking for a ~24 MB
/// LIST it never reads. Before: every permit was Mallory's until --request-timeout, and Alice's
/// cached GET got 429. Now Mallory holds half of them (--max-requests-inflight-per-user) and
/// Alice is served; and the unread answers give their permits back at --write-stall-timeout.
#[tokio::test]
async fn a_user_not_reading_large_answers_holds_only_its_share_and_not_for_long() {
    let stall = Duration::from_secs(2);
    let env = start(3000, |a| {
        a.security.max_requests_inflight = 4;
        a.security.write_stall_timeout = stall;
    })
    .await;
    let mut held = Vec::new();
    let mut refused = 0;
    for _ in 0..6 {
        let r = env.unread(LIST, "mallory-token").await;
        match r.status() {
            StatusCode::OK => held.push(r),
            StatusCode::TOO_MANY_REQUESTS => refused += 1,
            s => panic!("unexpected {s}"),
        }
    }
    let t0 = Instant::now();
    assert_eq!((held.len(), refused), (2, 4), "Mallory's share is half of the 4 permits");
    for _ in 0..3 {
        assert_eq!(
            env.get("/api/v1/namespaces/big/configmaps/cm-0001?resourceVersion=0", "alice-token").await,
            StatusCode::OK
        );
    }
    assert_eq!(
        env.get("/api/v1/namespaces/big/configmaps/cm-0001?resourceVersion=0", "mallory-token").await,
        StatusCode::TOO_MANY_REQUESTS,
        "Mallory's unread answers still hold her share"
    );
    // Nothing read: the share comes back after the stall timeout (not the 60 s request timeout).
    loop {
        let s = env.get("/api/v1/namespaces/big/configmaps/cm-0001?resourceVersion=0", "mallory-token").await;
        if s == StatusCode::OK {
            break;
        }
        assert!(t0.elapsed() < stall * 4, "freed within a few stall timeouts: {:?}", t0.elapsed());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let waited = t0.elapsed();
    eprintln!("unread answers freed their share after {waited:?}");
    assert!(waited >= stall - Duration::from_millis(500), "not before the stall timeout: {waited:?}");
    // The unread answers were cut: reading one now ends with an error, not 24 MB.
    let body =
        tokio::time::timeout(Duration::from_secs(20), held.remove(0).into_body().collect()).await.unwrap();
    assert!(body.is_err(), "the stalled body was cut");
    env.proxy.shutdown().await;
}

/// Mallory asks for small answers indented for her (`pretty=true`) on an HTTP/2 connection
/// that grants her streams no window: nothing of a body is ever sent, the answers stay with
/// the proxy. Before, the indenting phase sat outside admit and drained each answer whole, so
/// its in-flight permit was freed at once while its indented copy waited: she could hold any
/// number of them. Now an indented answer holds its permit (and is let go at the stall cut).
#[tokio::test]
async fn indented_answers_nobody_reads_hold_their_permits() {
    let stall = Duration::from_secs(2);
    let env = start(1, |a| {
        a.security.max_requests_inflight = 4;
        a.security.write_stall_timeout = stall;
    })
    .await;
    let (mut send, conn) = h2_without_window(&env).await;
    let path = "/api/v1/namespaces/big/configmaps/cm-0000?resourceVersion=0&pretty=true";
    let mut unsent = Vec::new();
    for _ in 0..2 {
        send.ready().await.unwrap();
        let r = send.send_request(h2_get(path, "mallory-token")).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        unsent.push(r);
    }
    let t0 = Instant::now();
    send.ready().await.unwrap();
    let r = send.send_request(h2_get(path, "mallory-token")).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "her share is held by the two unsent answers");
    assert_eq!(env.get(path, "alice-token").await, StatusCode::OK, "Alice is served");
    // The permits come back at the stall cut, nothing having been read.
    loop {
        send.ready().await.unwrap();
        let r = send.send_request(h2_get(path, "mallory-token")).await.unwrap();
        if r.status() == StatusCode::OK {
            break;
        }
        assert!(t0.elapsed() < stall * 4, "freed within a few stall timeouts: {:?}", t0.elapsed());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(unsent);
    conn.abort();
    env.proxy.shutdown().await;
}

/// Mallory opens a watch-list of the ConfigMaps (served from the cache: its initial objects
/// from a snapshot of the store) on an HTTP/2 connection that grants her streams no window, so
/// nothing of it is ever sent. Before, hyper kept the body (the watcher, the snapshot and every
/// version the store replaced since, a full queue once the cache closed it for being slow)
/// until the connection ended. Now it is cut at --write-stall-timeout like a forwarded watch,
/// and what it held let go; her idle watch (nothing to send) is not cut and still gets events.
#[tokio::test]
async fn cached_watches_nobody_reads_are_let_go_at_the_write_stall_timeout() {
    let stall = Duration::from_secs(2);
    let env = start(50, |a| a.security.write_stall_timeout = stall).await;
    let reader = env.proxy.readers().into_iter().find(|r| r.kind().resource == "configmaps").unwrap();
    let live = || reader.watcher_stats().live;
    let auth = [("authorization", "Bearer mallory-token")];
    let rv = reader.progress().rv.0;
    let url =
        format!("http://{}/api/v1/namespaces/big/configmaps?watch=true&resourceVersion={rv}", env.proxy.addr);
    let mut idle = common::open_watch_with(&env.client, &url, &auth).await;
    assert_eq!(idle.status, StatusCode::OK);

    let (mut send, conn) = h2_without_window(&env).await;
    let path = "/api/v1/namespaces/big/configmaps?watch=true&sendInitialEvents=true\
                &resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true";
    send.ready().await.unwrap();
    let unread = send.send_request(h2_get(path, "mallory-token")).await.unwrap();
    assert_eq!(unread.status(), StatusCode::OK);
    assert_eq!(live(), 2, "both watches served from the cache");
    let t0 = Instant::now();
    while live() > 1 {
        assert!(t0.elapsed() < stall * 4, "let go within a few stall timeouts: {:?}", t0.elapsed());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The idle watch was opened first: it has waited longer than the stall, and is kept.
    assert!(t0.elapsed() >= stall / 2, "not before the stall: {:?}", t0.elapsed());
    let url = format!("http://{}/watchcache/metrics", env.proxy.addr);
    let auth = [("authorization", "Bearer alice-token")];
    let metrics = common::send(&env.client, Method::GET, &url, None, &auth).await;
    let text = String::from_utf8_lossy(&metrics.body);
    assert!(text.contains("watchcache_write_stall_cuts_total{kind=\"watch\"} 1\n"), "counted: {text}");
    let obj = json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"late"},"data":{"k":"v"}});
    env.sim.sim.create("configmaps", "big", obj).unwrap();
    let ev = idle.next(Duration::from_secs(10)).await.expect("the idle watch gets the event");
    assert_eq!(ev["object"]["metadata"]["name"], "late");
    drop(unread);
    conn.abort();
    env.proxy.shutdown().await;
}

/// Alice GETs 300 distinct names (no such objects: each needs its own decision). Before: 300
/// SubjectAccessReviews. Now at most her burst (plus what the rate refills), then 429; another
/// user still has reviews of their own.
#[tokio::test]
async fn gets_of_many_names_make_at_most_the_users_burst_of_reviews() {
    let env = start(0, |a| {
        a.security.authorization_review_qps = 2.0;
        a.security.authorization_review_burst = 30;
    })
    .await;
    let t0 = Instant::now();
    let mut codes = Vec::new();
    for i in 0..300 {
        codes.push(
            env.get(&format!("/api/v1/namespaces/big/configmaps/n-{i}?resourceVersion=0"), "alice-token")
                .await,
        );
    }
    let secs = t0.elapsed().as_secs_f64();
    let reviews = env.access_reviews();
    eprintln!("300 names: {reviews} reviews in {secs:.2} s");
    let limited = codes.iter().filter(|c| **c == StatusCode::TOO_MANY_REQUESTS).count();
    assert!(reviews as f64 <= 30.0 + 2.0 * secs + 1.0, "{reviews} reviews in {secs:.1} s for 300 names");
    assert_eq!(limited + reviews, 300, "the rest got 429: {codes:?}");
    assert!(codes.iter().all(|c| [StatusCode::NOT_FOUND, StatusCode::TOO_MANY_REQUESTS].contains(c)));
    // Cached decisions need no review: a name already decided is served past the bound.
    assert_eq!(
        env.get("/api/v1/namespaces/big/configmaps/n-0?resourceVersion=0", "alice-token").await,
        StatusCode::NOT_FOUND
    );
    // Mallory's bucket is her own.
    assert_eq!(
        env.get("/api/v1/namespaces/big/configmaps/n-0?resourceVersion=0", "mallory-token").await,
        StatusCode::NOT_FOUND
    );
    env.proxy.shutdown().await;
}

/// The review budget is per user and client address: a DaemonSet's pods on every node share
/// one service account (and each pod's token carries its own pod name, so each asks its own
/// reviews), and were held to one node's budget. Another address has a burst of its own; the
/// first is still spent. (A refill every 1 000 s: nothing comes back during the test.)
#[tokio::test]
async fn the_review_budget_is_per_user_and_client_address() {
    let env = start(0, |a| {
        a.security.authorization_review_qps = 0.001;
        a.security.authorization_review_burst = 3;
    })
    .await;
    let path = |i: usize| format!("/api/v1/namespaces/big/configmaps/n-{i}?resourceVersion=0");
    let mut codes = Vec::new();
    for i in 0..5 {
        codes.push(get_from("127.0.0.1", &env, &path(i), "alice-token").await);
    }
    let (nf, tm) = (StatusCode::NOT_FOUND, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(codes, [nf, nf, nf, tm, tm], "the burst, then 429");
    assert_eq!(get_from("127.0.0.2", &env, &path(10), "alice-token").await, nf, "a burst of its own");
    assert_eq!(get_from("127.0.0.2", &env, &path(4), "alice-token").await, nf);
    assert_eq!(get_from("127.0.0.1", &env, &path(11), "alice-token").await, tm, "the first still spent");
    assert_eq!(get_from("127.0.0.1", &env, &path(4), "alice-token").await, nf, "a decision made is shared");
    assert_eq!(env.access_reviews(), 5);
    env.proxy.shutdown().await;
}

/// A GET over HTTP/1.1 from the local address `from` (any 127.x: another client host).
async fn get_from(from: &str, env: &Env, path: &str, token: &str) -> StatusCode {
    let tcp = common::connect_from(from, env.proxy.addr).await;
    let (mut send, conn) =
        hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(tcp)).await.unwrap();
    tokio::spawn(conn);
    let req = Request::get(path)
        .header("host", "localhost")
        .header("authorization", format!("Bearer {token}"))
        .body(Empty::new())
        .unwrap();
    send.send_request(req).await.unwrap().status()
}

/// A client without credentials opens HTTP/2 streams with no window and keeps them: their
/// 401s are never sent, hyper keeps them, and the connection was busy for ever — never idle,
/// never giving way at --max-connections — so one client could hold every connection slot
/// (a review; without the fix this connection is still open after 20 s). Now a connection
/// whose every open answer waited on its client for twice --write-stall-timeout is closed;
/// one with a quiet watch beside (waiting for an event, not for its client) is kept.
#[tokio::test]
async fn a_connection_whose_every_answer_waits_on_its_client_is_closed() {
    let stall = Duration::from_secs(1);
    let env = start(0, |a| {
        a.security.write_stall_timeout = stall;
        a.idle_timeout = Duration::from_secs(1);
    })
    .await;
    let unauthenticated =
        || Request::get("http://localhost/api/v1/namespaces/big/configmaps").body(Empty::new()).unwrap();
    let (mut send, conn) = h2_without_window(&env).await;
    // Held, never read: the streams stay open.
    let mut held = Vec::new();
    for _ in 0..3 {
        send.ready().await.unwrap();
        let r = send.send_request(unauthenticated()).await.unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        held.push(r);
    }
    let t0 = Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(20), conn).await.expect("closed by the proxy");
    // Closed once its answers waited twice the stall (not idle: they are open).
    assert!(t0.elapsed() >= stall * 2, "not before its answers stalled: {:?}", t0.elapsed());
    assert!(ended.unwrap().is_err(), "closed, not finished");
    eprintln!("a connection of stalled 401s closed after {:?}", t0.elapsed());
    drop(held);

    // Beside a quiet watch (nothing to send: waiting on the cache, not on the client), the
    // same stalled answers keep the connection.
    let (mut send, conn) = h2_without_window(&env).await;
    send.ready().await.unwrap();
    let path = "/api/v1/namespaces/big/configmaps?watch=true&resourceVersion=0";
    let watch = send.send_request(h2_get(path, "mallory-token")).await.unwrap();
    assert_eq!(watch.status(), StatusCode::OK);
    send.ready().await.unwrap();
    let r = send.send_request(unauthenticated()).await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let kept = tokio::time::timeout(stall * 6, async {
        while !conn.is_finished() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(kept.is_err(), "a connection with a quiet watch is kept");
    drop((watch, r));
    conn.abort();
    env.proxy.shutdown().await;
}

/// An h2c connection that grants its streams no window: nothing of an answer is ever sent.
async fn h2_without_window(
    env: &Env,
) -> (hyper::client::conn::http2::SendRequest<Empty<Bytes>>, tokio::task::JoinHandle<Result<(), hyper::Error>>)
{
    let tcp = tokio::net::TcpStream::connect(env.proxy.addr).await.unwrap();
    let (send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(0)
        .handshake::<_, Empty<Bytes>>(TokioIo::new(tcp))
        .await
        .unwrap();
    (send, tokio::spawn(conn))
}

/// An h2c connection (prior knowledge) on the plain listener.
async fn h2c(
    env: &Env,
) -> (hyper::client::conn::http2::SendRequest<Empty<Bytes>>, tokio::task::JoinHandle<Result<(), hyper::Error>>)
{
    let tcp = tokio::net::TcpStream::connect(env.proxy.addr).await.unwrap();
    let (send, conn) =
        hyper::client::conn::http2::handshake::<_, _, Empty<Bytes>>(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    (send, tokio::spawn(conn))
}

fn h2_get(path: &str, token: &str) -> Request<Empty<Bytes>> {
    Request::get(format!("http://localhost{path}"))
        .header("authorization", format!("Bearer {token}"))
        .body(Empty::new())
        .unwrap()
}

/// HEADERS, then RST_STREAM once the proxy has accepted the stream and sent its review (the
/// sim answers reviews after 300 ms), 20 streams at a time. Before: a review per stream, the
/// connection kept (h2's own bound counts only streams reset before they are accepted). Now the
/// connection is closed after about `conn::RESET_BURST` of them.
#[tokio::test]
async fn streams_reset_after_they_were_accepted_close_the_connection() {
    let env = start(0, |a| a.security.authorization_review_qps = 0.0).await;
    env.sim.sim.set_auth(script().delayed(Duration::from_millis(300)));
    let (mut send, conn) = h2c(&env).await;
    let mut streams = 0;
    let mut closed = false;
    'flood: for batch in 0..50 {
        let before = env.access_reviews();
        let mut pending = Vec::new();
        for i in 0..20 {
            if send.ready().await.is_err() {
                closed = true;
                break 'flood;
            }
            let path = format!("/api/v1/namespaces/big/configmaps/r-{batch}-{i}?resourceVersion=0");
            pending.push(send.send_request(h2_get(&path, "mallory-token")));
            streams += 1;
        }
        // Until the proxy has sent their reviews (the sim records a request when it arrives).
        let deadline = Instant::now() + Duration::from_secs(5);
        while env.access_reviews() < before + pending.len()
            && Instant::now() < deadline
            && !conn.is_finished()
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        drop(pending); // RST_STREAM(CANCEL) for each
    }
    let reviews = env.access_reviews();
    eprintln!(
        "reset flood: connection closed={} after {streams} streams, {reviews} reviews",
        closed || conn.is_finished()
    );
    assert!(closed || conn.is_finished(), "the connection was closed ({streams} streams)");
    assert!(streams <= 400, "closed after {streams} streams");
    assert!(reviews <= 400, "{reviews} reviews");
    // Another connection is served.
    env.sim.sim.set_auth(script());
    let (mut send, _conn) = h2c(&env).await;
    let resp =
        send.send_request(h2_get("/api/v1/namespaces/big/configmaps?resourceVersion=0", "alice-token")).await;
    assert_eq!(resp.unwrap().status(), StatusCode::OK);
    env.proxy.shutdown().await;
}

/// Item 6: several requests, one after the other and at once, on one h2c connection (prior
/// knowledge, as `curl --http2-prior-knowledge`), with and without --goaway-chance. A regression
/// guard: it passes on the code before issue 30 too — the reported failure was curl 7.88's own
/// (curl#10634, fixed in curl 8.0; a plain hyper server fails the same way with that curl).
#[tokio::test]
async fn h2c_serves_many_requests_on_one_connection() {
    for chance in [0.0, 0.02] {
        let env = start(3, |a| a.goaway_chance = chance).await;
        let (mut send, conn) = h2c(&env).await;
        let mut served = 0;
        for i in 0..20 {
            let path = format!("/api/v1/namespaces/big/configmaps/cm-{:04}?resourceVersion=0", i % 3);
            if send.ready().await.is_err() {
                break; // after a GOAWAY (--goaway-chance) a client reconnects
            }
            let resp = send.send_request(h2_get(&path, "alice-token")).await.unwrap();
            assert_eq!(resp.status(), StatusCode::OK, "request {i}");
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            assert!(body.starts_with(b"{\"kind\":\"ConfigMap\""), "request {i}");
            served += 1;
        }
        if chance == 0.0 {
            assert_eq!(served, 20, "every request on the one connection");
        }
        assert!(served >= 1);
        let (send, _conn) = h2c(&env).await;
        let all = futures_util::future::join_all((0..10).map(|_| {
            let mut send = send.clone();
            async move { send.send_request(h2_get(LIST, "alice-token")).await.map(|r| r.status()) }
        }))
        .await;
        assert!(all.iter().all(|r| matches!(r, Ok(StatusCode::OK))), "{all:?}");
        drop(send);
        drop(conn);
        env.proxy.shutdown().await;
    }
}
