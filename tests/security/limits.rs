//! Limits end to end: which requests hold an in-flight permit and for how long, and which count
//! as streams against `--max-watches-per-user` (watches, followed logs, exec sessions). The sim is the upstream, the proxy is real, the
//! client talks HTTP to it.

use crate::common;

use std::time::Duration;

use bytes::Bytes;
use common::{send, serve_args, Resp};
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use kube_watchcache::app::{self, Running};
use kube_watchcache::config::ServeArgs;
use kube_watchcache_sim::{AuthScript, Rule, ScriptUser, Sim, SimHandle, SimOptions};
use serde_json::json;

struct Env {
    sim: SimHandle,
    proxy: Running,
    client: common::HttpClient,
}

async fn start(edit: impl FnOnce(&mut ServeArgs)) -> Env {
    let sim = Sim::start(SimOptions::default()).await.expect("sim starts");
    let mut args = serve_args(sim.addr, &["configmaps"]);
    edit(&mut args);
    let proxy = app::start(&args).await.expect("proxy starts");
    assert!(proxy.wait_ready(Duration::from_secs(10)).await);
    Env { sim, proxy, client: common::client() }
}

impl Env {
    async fn get(&self, path: &str, headers: &[(&str, &str)]) -> Resp {
        send(&self.client, Method::GET, &format!("http://{}{path}", self.proxy.addr), None, headers).await
    }

    /// Sends a GET and returns once the response headers are in, leaving the body unread.
    async fn headers_only(
        &self,
        path: &str,
        headers: &[(&str, &str)],
    ) -> http::Response<hyper::body::Incoming> {
        let mut b = Request::get(format!("http://{}{path}", self.proxy.addr));
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let req = b.body(Full::new(Bytes::new())).unwrap();
        tokio::time::timeout(Duration::from_secs(10), self.client.request(req)).await.unwrap().unwrap()
    }
}

/// ~24 MB of configmaps: more than the loopback socket buffers hold, so a LIST body whose reader
/// stops stays unfinished on the proxy's side.
fn fill(env: &Env) -> u64 {
    let _ = env.sim.sim.create(
        "namespaces",
        "",
        json!({"apiVersion":"v1","kind":"Namespace","metadata":{"name":"big"}}),
    );
    let data = "x".repeat(8 * 1024);
    let mut rv = 0;
    for i in 0..3000 {
        let o = env
            .sim
            .sim
            .create(
                "configmaps",
                "big",
                json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":format!("cm-{i:04}")},"data":{"k":data}}),
            )
            .unwrap();
        rv = common::rv_of(&o);
    }
    rv
}

#[tokio::test]
async fn the_in_flight_permit_lasts_until_the_body_ends_and_only_real_long_runners_skip_it() {
    let env = start(|a| a.security.max_requests_inflight = 1).await;
    let rv = fill(&env);
    let r = env.proxy.readers().into_iter().find(|r| r.kind().resource == "configmaps").unwrap();
    r.wait_for(kube_watchcache::resource::Rv(rv), Duration::from_secs(20)).await.expect("synced");
    let _ = env.sim.sim.create("pods", "big", json!({"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[{"name":"c","image":"x"}]}}));

    // A large LIST whose client reads the headers, then stops: its body is not done.
    let big = env.headers_only("/api/v1/namespaces/big/configmaps?resourceVersion=0", &[]).await;
    assert_eq!(big.status(), StatusCode::OK);

    let small = "/api/v1/namespaces/big/configmaps/cm-0001?resourceVersion=0";
    let r = env.get(small, &[]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "the unfinished body still holds the only permit");
    assert_eq!(r.headers["retry-after"], "1");
    // Raw flags do not make a request long-running …
    for (query, headers) in [
        ("&follow=1", &[][..]),
        ("&follow=true&watch=false", &[][..]),
        ("", &[("upgrade", "websocket")][..]),
        ("", &[("connection", "Upgrade"), ("upgrade", "websocket")][..]),
    ] {
        let r = env.get(&format!("{small}{query}"), headers).await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{query} {headers:?}");
    }
    // … what the request is does: watches (served and forwarded) and logs, followed or not
    // (the apiserver's `longRunningSubresources`).
    for path in [
        "/api/v1/namespaces/big/configmaps?watch=1&resourceVersion=0&fieldSelector=metadata.name%3Dcm-0001",
        "/api/v1/namespaces/big/secrets?watch=true&resourceVersion=0",
        "/api/v1/namespaces/big/pods/p/log?follow=true",
        "/api/v1/namespaces/big/pods/p/log",
    ] {
        let resp = env.headers_only(path, &[]).await;
        assert_eq!(resp.status(), StatusCode::OK, "{path}");
    }
    // A watch whose RV is unset starts with a read upstream (a watch-list's metadata LIST, a
    // probe): its start needs a permit, as API Priority and Fairness charges a watch's
    // initialization; its stream does not.
    for path in [
        "/api/v1/namespaces/big/configmaps?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan",
        "/api/v1/namespaces/big/secrets?watch=true",
    ] {
        let r = env.get(path, &[]).await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{path}");
    }

    // Reading the LIST to its end frees the permit.
    let body =
        tokio::time::timeout(Duration::from_secs(30), big.into_body().collect()).await.unwrap().unwrap();
    assert!(body.to_bytes().len() > 24_000_000);
    assert_eq!(env.get(small, &[]).await.status, StatusCode::OK);
    let watch_list = env
        .headers_only("/api/v1/namespaces/big/configmaps?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan", &[])
        .await;
    assert_eq!(watch_list.status(), StatusCode::OK);
    assert_eq!(env.get(small, &[]).await.status, StatusCode::OK, "a started watch holds no permit");
}

/// Watches count against the caller's limit whether the cache serves them or not.
#[tokio::test]
async fn forwarded_watches_count_against_the_per_user_limit() {
    let env = start(|a| {
        a.security.auth = "upstream".into();
        a.security.max_watches_per_user = 2;
    })
    .await;
    env.sim.sim.set_auth(
        AuthScript::default()
            .token("alice-token", ScriptUser::new("alice", &[]))
            .token("bob-token", ScriptUser::new("bob", &[]))
            .rule(Rule::user("alice", &["watch"], "", &["configmaps"]))
            .rule(Rule::user("bob", &["watch"], "", &["configmaps"])),
    );
    let alice = [("authorization", "Bearer alice-token")];
    // Two watches of resources the proxy does not cache: forwarded, and counted.
    let w1 = env.headers_only("/api/v1/namespaces/default/secrets?watch=1", &alice).await;
    let w2 = env.headers_only("/api/v1/watch/namespaces/default/services", &alice).await;
    assert_eq!((w1.status(), w2.status()), (StatusCode::OK, StatusCode::OK));
    let r = env.get("/api/v1/namespaces/default/configmaps?watch=1&resourceVersion=0", &alice).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "a cache-served watch finds the slots taken");
    let r = env.get("/api/v1/namespaces/default/secrets?watch=1&timeoutSeconds=1", &alice).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "and so does a forwarded one");
    // Another user has their own slots; a list is not a watch.
    let bob = env
        .headers_only("/api/v1/namespaces/default/secrets?watch=1", &[("authorization", "Bearer bob-token")])
        .await;
    assert_eq!(bob.status(), StatusCode::OK);
    assert_eq!(env.get("/api/v1/namespaces/default/secrets", &alice).await.status, StatusCode::OK);
    // A forwarded watch frees its slot when it ends (once the proxy sees the connection close).
    drop(w1);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let w = env.headers_only("/api/v1/namespaces/default/secrets?watch=1", &alice).await;
        if w.status() == StatusCode::OK {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the slot of the closed watch is freed");
    }
    drop(w2);
}

/// An exec session of pod `default/p` as the bearer of `token` (`common::exec_session`).
async fn exec_session(env: &Env, token: &str) -> Result<tokio::net::TcpStream, String> {
    common::exec_session(env.proxy.addr, "default/pods/p", &format!("Authorization: Bearer {token}\r\n"))
        .await
}

/// Followed logs and exec sessions hold no in-flight permit (they are long-running) but hold a
/// stream and an upstream connection open as long as a watch: they count against the same
/// per-user limit, an exec session for as long as it is spliced (not just until its `101`).
#[tokio::test]
async fn followed_logs_and_exec_sessions_count_against_the_per_user_limit() {
    let env = start(|a| {
        a.security.auth = "upstream".into();
        a.security.max_watches_per_user = 2;
    })
    .await;
    env.sim.sim.set_auth(
        AuthScript::default()
            .token("alice-token", ScriptUser::new("alice", &[]))
            .token("bob-token", ScriptUser::new("bob", &[])),
    );
    env.sim
        .sim
        .create("pods", "default", json!({"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[{"name":"c","image":"x"}]}}))
        .unwrap();
    let alice = [("authorization", "Bearer alice-token")];
    let log = "/api/v1/namespaces/default/pods/p/log?follow=true";
    let follow = env.headers_only(log, &alice).await;
    assert_eq!(follow.status(), StatusCode::OK);
    let session = exec_session(&env, "alice-token").await.expect("a session");
    // Both slots are taken: one more log, a watch, another session are refused.
    let refused = exec_session(&env, "alice-token").await.expect_err("no third stream");
    assert!(refused.starts_with("HTTP/1.1 429"), "{refused}");
    let r = env.get(log, &alice).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "a third stream");
    let r = env.get("/api/v1/namespaces/default/secrets?watch=1&timeoutSeconds=1", &alice).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "a watch shares the limit");
    let r = env.get("/api/v1/namespaces/default/pods/p/log", &alice).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "a log read without follow is a stream too");
    // Another user has their own.
    let bob = env.headers_only(log, &[("authorization", "Bearer bob-token")]).await;
    assert_eq!(bob.status(), StatusCode::OK);
    // The log's slot is freed when its stream is dropped: one session more, and no other.
    drop(follow);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let second = loop {
        match exec_session(&env, "alice-token").await {
            Ok(s) => break s,
            Err(head) => {
                assert!(head.starts_with("HTTP/1.1 429"), "{head}");
                assert!(tokio::time::Instant::now() < deadline, "the dropped log frees its slot");
            }
        }
    };
    let refused = exec_session(&env, "alice-token").await.expect_err("two sessions hold both slots");
    assert!(refused.starts_with("HTTP/1.1 429"), "{refused}");
    // A session's slot is freed when the session ends.
    drop(session);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let w = env.headers_only(log, &alice).await;
        if w.status() == StatusCode::OK {
            break;
        }
        assert_eq!(w.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(tokio::time::Instant::now() < deadline, "the ended session frees its slot");
    }
    drop(second);
}

/// Sends a GET on a raw connection and reads its answer's status line (within `within`).
async fn status_line(s: &mut tokio::net::TcpStream, within: Duration) -> Option<String> {
    request_line(s, "GET /livez HTTP/1.1\r\nHost: localhost\r\n\r\n", within).await
}

/// Sends `request` on a raw connection and reads its answer's status line (within `within`).
async fn request_line(s: &mut tokio::net::TcpStream, request: &str, within: Duration) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    s.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    let read = async {
        while !head.ends_with(b"\r\n") {
            if s.read_exact(&mut byte).await.is_err() {
                break;
            }
            head.push(byte[0]);
        }
    };
    tokio::time::timeout(within, read).await.ok()?;
    Some(String::from_utf8_lossy(&head).trim().to_owned())
}

/// A connection with a watch open (a request in flight: it never gives way at the bound), once
/// its status line is in; `headers` are added to the request.
async fn held_watch(env: &Env, headers: &str) -> (tokio::net::TcpStream, String) {
    let mut s = tokio::net::TcpStream::connect(env.proxy.addr).await.unwrap();
    let req = format!(
        "GET /api/v1/namespaces/default/configmaps?watch=1 HTTP/1.1\r\nHost: localhost\r\n{headers}\r\n"
    );
    let line = request_line(&mut s, &req, Duration::from_secs(5)).await.expect("the watch's status line");
    (s, line)
}

/// A new connection sending a GET, still unanswered after the time it would have needed (its
/// status line comes later, from the task); `None` if it was answered.
async fn waiting_connection(env: &Env) -> Option<tokio::task::JoinHandle<Option<String>>> {
    let mut s = tokio::net::TcpStream::connect(env.proxy.addr).await.unwrap();
    let waiting = tokio::spawn(async move { status_line(&mut s, Duration::from_secs(10)).await });
    let early = tokio::time::timeout(Duration::from_millis(300), async {
        while !waiting.is_finished() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    early.is_err().then_some(waiting)
}

/// `--max-connections`: past it the proxy accepts no more connections until one closes (they
/// wait in the kernel's queue), so a flood of connections cannot take the descriptors the
/// proxy needs for its own upstream connections and files.
#[tokio::test]
async fn connections_past_the_bound_wait_until_one_closes() {
    let env = start(|a| a.max_connections = 2).await;
    // Two connections, each with a request in flight: neither gives way.
    let mut held = Vec::new();
    for _ in 0..2 {
        let (s, line) = held_watch(&env, "").await;
        assert!(line.starts_with("HTTP/1.1 200"), "{line}");
        held.push(s);
    }
    // Not accepted while both are open: nothing answers it.
    let waiting = waiting_connection(&env).await.expect("the third connection waits");
    drop(held.pop());
    let line = waiting.await.unwrap().expect("served once a slot is free");
    assert!(line.starts_with("HTTP/1.1 200"), "{line}");
}

/// At the bound, an idle connection (its request answered, the connection kept open — a
/// `/healthz` a minute keeps it from the idle timeout) gives way to the one waiting: one source
/// holding every slot with idle connections cannot keep the others out. One with a request in
/// flight keeps its place.
#[tokio::test]
async fn at_the_bound_an_idle_connection_gives_way() {
    let env = start(|a| a.max_connections = 2).await;
    let (mut watching, line) = held_watch(&env, "").await;
    assert!(line.starts_with("HTTP/1.1 200"), "{line}");
    let mut idle = tokio::net::TcpStream::connect(env.proxy.addr).await.unwrap();
    let line = status_line(&mut idle, Duration::from_secs(5)).await.expect("served");
    assert!(line.starts_with("HTTP/1.1 200"), "{line}");
    // At the bound with nobody waiting, past `crowd::MIN_IDLE`: the idle one stays open.
    let wait = kube_watchcache::server::crowd::MIN_IDLE + Duration::from_secs(2);
    assert!(!ends_within(&mut idle, wait).await, "nobody waits: no connection is closed");
    // A newcomer is served at the listener's next look (`crowd::GIVE_WAY_EVERY`), not after the
    // 90 s idle timeout; the idle one was closed, the watch is still open.
    let mut newcomer = tokio::net::TcpStream::connect(env.proxy.addr).await.unwrap();
    let line =
        status_line(&mut newcomer, Duration::from_secs(5)).await.expect("served: the idle one gave way");
    assert!(line.starts_with("HTTP/1.1 200"), "{line}");
    assert!(ends_within(&mut idle, Duration::from_secs(5)).await, "the idle connection was closed");
    assert!(
        !ends_within(&mut watching, Duration::from_millis(300)).await,
        "the watch's connection stays open"
    );
}

/// Over TLS, connections that never finish their handshake (silent, or half a ClientHello) give
/// way like idle ones: at the bound a newcomer is served once one of them has been silent for
/// `crowd::MIN_IDLE`, not when the handshake's 10 s run out (a review: unfinished handshakes
/// were no members of the crowd, and a connect flood kept every slot).
#[tokio::test]
async fn at_the_bound_an_unfinished_tls_handshake_gives_way() {
    let testdata =
        |n: &str| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/testdata/security").join(n);
    let env = start(|a| {
        a.max_connections = 2;
        a.insecure_listen = None;
        a.secure_port = 0;
        a.bind_address = "127.0.0.1".parse().unwrap();
        a.tls_cert_file = Some(testdata("server1.crt"));
        a.tls_private_key_file = Some(testdata("server1.key"));
    })
    .await;
    let started = tokio::time::Instant::now();
    let mut silent = Vec::new();
    for _ in 0..2 {
        silent.push(tokio::net::TcpStream::connect(env.proxy.addr).await.unwrap());
    }
    let client = common::tls::https(common::tls::config().with_no_client_auth(), false);
    let url = format!("https://localhost:{}/livez", env.proxy.addr.port());
    let req = Request::get(url).body(Full::new(Bytes::new())).unwrap();
    let resp =
        tokio::time::timeout(Duration::from_secs(20), client.request(req)).await.expect("answered").unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let took = started.elapsed();
    // The handshake timeout would have freed a slot at 10 s; a silent one gives way from 5 s.
    assert!(took < Duration::from_millis(9_500), "served after {took:?}");
    assert!(
        ends_within(&mut silent[0], Duration::ZERO).await
            || ends_within(&mut silent[1], Duration::ZERO).await,
        "a silent connection was closed"
    );
}

/// Whether `s` ends (its peer closes it) within `dur`, whatever it reads meanwhile.
async fn ends_within(s: &mut tokio::net::TcpStream, dur: Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 4096];
    let ended = tokio::time::timeout(dur, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    ended.is_ok()
}

/// An exec session's two sockets outlive hyper's connection (its task ends at the 101): the
/// session keeps its connection's `--max-connections` slot until it ends, and takes a second
/// for its own upstream connection, so sessions cannot take descriptors past the bound.
#[tokio::test]
async fn an_upgraded_session_holds_two_connection_slots_until_it_ends() {
    // The listener always holds one slot for the connection it waits to accept.
    for max in [2, 3] {
        let env = start(|a| {
            a.security.auth = "upstream".into();
            a.max_connections = max;
        })
        .await;
        env.sim.sim.set_auth(
            AuthScript::default().token("alice-token", ScriptUser::new("alice", &[])).rule(Rule::user(
                "alice",
                &["watch"],
                "",
                &["configmaps"],
            )),
        );
        env.sim
            .sim
            .create("pods", "default", json!({"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[{"name":"c","image":"x"}]}}))
            .unwrap();
        if max == 2 {
            // Its own slot, and none for the upstream connection.
            let refused = exec_session(&env, "alice-token").await.expect_err("no second slot");
            assert!(refused.starts_with("HTTP/1.1 429"), "{refused}");
            continue;
        }
        let session = exec_session(&env, "alice-token").await.expect("a session");
        // The third slot: one more connection (busy: an idle one would give way), then no more.
        let (_third, line) = held_watch(&env, "Authorization: Bearer alice-token\r\n").await;
        assert!(line.starts_with("HTTP/1.1 200"), "{line}");
        let waiting =
            waiting_connection(&env).await.expect("the next connection waits while the session is open");
        drop(session);
        let line = waiting.await.unwrap().expect("served once the session ended");
        assert!(line.starts_with("HTTP/1.1 200"), "{line}");
    }
}
