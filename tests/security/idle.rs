//! Idle connections are closed (issue 21 item 6), as kube-apiserver's server closes them: a
//! silent connection `--read-header-timeout` after its accept, an HTTP/1.1 keep-alive or HTTP/2
//! connection with nothing in flight after `--idle-timeout`. (Before, a silent HTTP/1.1
//! connection and an idle HTTP/2 one were still open after 100 s.) That an open watch keeps its
//! connection is checked with paused time in `server::conn`. Accepted connections have TCP
//! keepalive on, as kube-apiserver's do.

use crate::common;

use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use kube_watchcache::app;
use kube_watchcache_sim::{Sim, SimOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Far above the timeouts used here: the bound on waiting for the close.
const BOUND: Duration = Duration::from_secs(20);

#[tokio::test]
async fn silent_and_idle_connections_are_closed() {
    let sim = Sim::start(SimOptions { objects: 0, ..Default::default() }).await.expect("sim");
    let mut args = common::serve_args(sim.addr, &["configmaps"]);
    args.read_header_timeout = Duration::from_millis(500);
    args.idle_timeout = Duration::from_secs(1);
    let proxy = app::start(&args).await.expect("proxy starts");
    assert!(proxy.wait_ready(Duration::from_secs(10)).await);

    // A connection that never sends a byte.
    let t = tokio::time::Instant::now();
    let mut silent = TcpStream::connect(proxy.addr).await.unwrap();
    let mut buf = [0u8; 64];
    // Ten times the timeout (not the 10 s protocol sniffing of a plain connection).
    let n = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut buf))
        .await
        .expect("closed in time")
        .unwrap_or(0);
    assert_eq!(n, 0, "closed without an answer");
    assert!(t.elapsed() >= Duration::from_millis(500), "not before the timeout: {:?}", t.elapsed());

    // HTTP/1.1 keep-alive: one request, then nothing.
    let mut ka = TcpStream::connect(proxy.addr).await.unwrap();
    ka.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n").await.unwrap();
    let mut got = Vec::new();
    let t = tokio::time::Instant::now();
    let closed = tokio::time::timeout(BOUND, async {
        loop {
            match ka.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the idle keep-alive connection was closed");
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"), "answered first");
    assert!(t.elapsed() >= Duration::from_secs(1), "not before the idle timeout: {:?}", t.elapsed());

    // HTTP/2 (prior knowledge): one request, then no stream.
    let tcp = TcpStream::connect(proxy.addr).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http2::handshake::<_, _, Empty<Bytes>>(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    let conn = tokio::spawn(conn);
    let req = Request::get("http://localhost/healthz").body(Empty::new()).unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let _ = resp.into_body().collect().await;
    tokio::time::timeout(BOUND, conn)
        .await
        .expect("the idle HTTP/2 connection was closed (GOAWAY)")
        .unwrap()
        .ok();
    proxy.shutdown().await;
}

/// A first request head trickled in one byte at a time is closed at --read-header-timeout (here
/// 1 s), as Go's ReadHeaderTimeout closes it; before, the connection lived until hyper's own
/// head timeout, the longer --idle-timeout (90 s by default).
#[tokio::test]
async fn a_trickled_first_head_is_closed_at_the_read_header_timeout() {
    let sim = Sim::start(SimOptions { objects: 0, ..Default::default() }).await.expect("sim");
    let mut args = common::serve_args(sim.addr, &["configmaps"]);
    args.read_header_timeout = Duration::from_secs(1);
    args.idle_timeout = Duration::from_secs(90);
    let proxy = app::start(&args).await.expect("proxy starts");
    assert!(proxy.wait_ready(Duration::from_secs(10)).await);
    let t = tokio::time::Instant::now();
    let mut conn = TcpStream::connect(proxy.addr).await.unwrap();
    let head = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    let mut closed_at = None;
    for b in head.iter() {
        tick.tick().await;
        if conn.write_all(&[*b]).await.is_err() {
            closed_at = Some(t.elapsed());
            break;
        }
        let mut buf = [0u8; 64];
        if let Ok(Ok(0)) = tokio::time::timeout(Duration::ZERO, conn.read(&mut buf)).await {
            closed_at = Some(t.elapsed());
            break;
        }
    }
    let closed_at = closed_at.expect("closed before the head was complete");
    assert!(closed_at >= Duration::from_secs(1), "not before the timeout: {closed_at:?}");
    assert!(closed_at < Duration::from_secs(3), "at the timeout, not at --idle-timeout: {closed_at:?}");
    proxy.shutdown().await;
}

/// The proxy's end of an accepted connection has TCP keepalive on, every 3 minutes as
/// kube-apiserver's listener sets it: a client that vanished while holding an HTTP/1.1 watch
/// with nothing to send is found by the kernel, not kept until the watch's deadline. Read from
/// the kernel (`/proc/net/tcp`: the proxy's socket runs its keepalive timer, `tr` 2, due in
/// about 180 s), so it fails if the accepted socket is left without.
#[tokio::test]
async fn accepted_connections_have_tcp_keepalive() {
    let Ok(_) = std::fs::metadata("/proc/net/tcp") else {
        eprintln!("skipped: no /proc/net/tcp here");
        return;
    };
    let sim = Sim::start(SimOptions { objects: 0, ..Default::default() }).await.expect("sim");
    let proxy = app::start(&common::serve_args(sim.addr, &["configmaps"])).await.expect("proxy starts");
    assert!(proxy.wait_ready(Duration::from_secs(10)).await);
    let mut c = TcpStream::connect(proxy.addr).await.unwrap();
    // A watch with nothing to send: the connection stays open and idle.
    c.write_all(b"GET /api/v1/configmaps?watch=1&resourceVersion=0 HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 512];
    let n = tokio::time::timeout(BOUND, c.read(&mut buf)).await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    let (server, client) = (proxy.addr.port(), c.local_addr().unwrap().port());
    let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap();
    // `sl local rem st tx:rx tr:when …`, addresses as `HEXIP:HEXPORT`.
    let port = |a: &str| u16::from_str_radix(a.rsplit(':').next().unwrap(), 16).unwrap();
    let line = tcp
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| port(f[1]) == server && port(f[2]) == client)
        .expect("the proxy's end of the connection");
    let (timer, when) = line[5].split_once(':').unwrap();
    let when = u64::from_str_radix(when, 16).unwrap();
    assert_eq!(timer, "02", "the keepalive timer runs: {line:?}");
    // In clock ticks (USER_HZ, 100 a second): about 180 s from now.
    assert!((170 * 100..=180 * 100).contains(&when), "due in ~180 s: {when} ticks");
    drop(c);
    proxy.shutdown().await;
}
