//! `--goaway-chance` (issue 19): two replicas behind a round-robin TCP front (a Service), HTTP/2
//! clients that all connected while only the first replica was up. After the second comes up,
//! the GOAWAYs make the clients reconnect through the front and spread over both, with no
//! request failed. Bound checked: within 300 requests per client (at chance 0.02: ~6 GOAWAYs
//! each), at least a quarter of the last requests are served by the replica that came up late.

use crate::common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use kube_watchcache::app::{self, Running};
use kube_watchcache_sim::{Sim, SimOptions};
use serde_json::json;
use tokio::net::{TcpListener, TcpStream};

const CLIENTS: usize = 50;
const REQUESTS: usize = 300;

/// A TCP front that sends each new connection to the next backend that accepts it.
async fn front(backends: Vec<SocketAddr>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let next = Arc::new(AtomicUsize::new(0));
    tokio::spawn(async move {
        loop {
            let Ok((mut client, _)) = l.accept().await else { return };
            let (backends, next) = (backends.clone(), next.clone());
            tokio::spawn(async move {
                for _ in 0..backends.len() {
                    let b = backends[next.fetch_add(1, SeqCst) % backends.len()];
                    if let Ok(mut up) = TcpStream::connect(b).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut up).await;
                        return;
                    }
                }
            });
        }
    });
    addr
}

async fn replica(upstream: SocketAddr, listen: SocketAddr) -> Running {
    let mut args = common::serve_args(upstream, &["configmaps"]);
    args.insecure_listen = Some(listen);
    args.goaway_chance = 0.02;
    let p = app::start(&args).await.expect("replica starts");
    assert!(p.wait_ready(Duration::from_secs(10)).await);
    p
}

/// Requests a replica has answered (from its own metrics).
async fn served(addr: SocketAddr) -> f64 {
    let r = common::send(
        &common::client(),
        http::Method::GET,
        &format!("http://{addr}/watchcache/metrics"),
        None,
        &[],
    )
    .await;
    String::from_utf8_lossy(&r.body)
        .lines()
        .filter(|l| l.starts_with("watchcache_requests_total{") && l.contains("verb=\"list\""))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn goaway_spreads_long_lived_http2_clients_over_the_replicas() {
    let sim = Sim::start(SimOptions { objects: 0, ..Default::default() }).await.expect("sim");
    sim.sim.create("namespaces", "", json!({"metadata": {"name": "ns"}})).unwrap();
    let a = replica(sim.addr, "127.0.0.1:0".parse().unwrap()).await;
    // B's address, reserved; B itself starts later.
    let b_addr = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
    let front = front(vec![a.addr, b_addr]).await;
    let url = format!("http://{front}/api/v1/namespaces/ns/configmaps?resourceVersion=0");
    let failed = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| Client::builder(TokioExecutor::new()).http2_only(true).build_http::<Full<Bytes>>())
        .collect();
    let get = |c: &Client<_, Full<Bytes>>| {
        let (c, url, failed) = (c.clone(), url.clone(), failed.clone());
        async move {
            let req = Request::get(url).body(Full::new(Bytes::new())).unwrap();
            match c.request(req).await {
                Ok(r) if r.status() == 200 => {
                    let _ = r.into_body().collect().await;
                }
                _ => {
                    failed.fetch_add(1, SeqCst);
                }
            }
        }
    };
    // Every client connects while only A is up.
    for c in &clients {
        get(c).await;
    }
    let b = replica(sim.addr, b_addr).await;
    let half = Arc::new(AtomicBool::new(false));
    let (a0, b0) = (served(a.addr).await, served(b.addr).await);
    let mut at_half = (0.0, 0.0);
    for i in 0..REQUESTS {
        if i == REQUESTS / 2 && !half.swap(true, SeqCst) {
            at_half = (served(a.addr).await, served(b.addr).await);
        }
        let round: Vec<_> = clients.iter().map(|c| tokio::spawn(get(c))).collect();
        for t in round {
            t.await.unwrap();
        }
    }
    let (a1, b1) = (served(a.addr).await, served(b.addr).await);
    let late_b = b1 - at_half.1;
    let late_total = (a1 - at_half.0) + late_b;
    eprintln!(
        "goaway: {CLIENTS} clients x {REQUESTS} requests after B came up: A served {}, B {}; second half: B {late_b} of {late_total}",
        a1 - a0,
        b1 - b0
    );
    assert_eq!(failed.load(SeqCst), 0, "no request failed");
    assert!(
        late_b >= late_total / 4.0,
        "B serves at least a quarter of the second half: {late_b} of {late_total}"
    );
    a.shutdown().await;
    b.shutdown().await;
}
