//! The proxy's connections to the upstream are shared by every caller, so no caller's requests
//! may hold up another's there. kube-apiserver allows 100 streams on an HTTP/2 connection (the
//! sim too); before the upstream's connections were in lanes (`upstream::lanes`), the 101st
//! request through the proxy waited for one of 100 forwarded watches to end — minutes.
//! Here 120 forwarded watches are open through a proxy in front of the sim over HTTPS (HTTP/2
//! by ALPN), and a forwarded GET and a cached LIST are still answered at once.

use crate::common;

use std::path::PathBuf;
use std::time::Duration;

use kube_watchcache::app;
use kube_watchcache_sim::{Sim, SimOptions, SimTls};
use serde_json::json;

const WATCHES: usize = 120;

fn testdata(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/testdata/security").join(name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_watches_past_the_upstreams_stream_limit_hold_up_no_other_request() {
    let tls = SimTls { cert_file: testdata("server1.crt"), key_file: testdata("server1.key") };
    let sim = Sim::start(SimOptions { objects: 0, tls: Some(tls), ..Default::default() }).await.expect("sim");
    sim.sim.create("namespaces", "", json!({"metadata": {"name": "ns"}})).unwrap();
    let mut args = common::serve_args(sim.addr, &["configmaps"]);
    args.upstream.upstream = Some(format!("https://127.0.0.1:{}", sim.addr.port()));
    args.upstream.certificate_authority = Some(testdata("server-ca.crt"));
    let proxy = app::start(&args).await.expect("proxy starts");
    assert!(proxy.wait_ready(Duration::from_secs(10)).await, "proxy synced");
    let url = |pq: &str| format!("http://{}{pq}", proxy.addr);
    let client = common::client();

    // Secrets are not cached: every watch is forwarded, each on a stream to the upstream.
    let mut watches = Vec::new();
    for _ in 0..WATCHES {
        let w = common::open_watch(&client, &url("/api/v1/namespaces/ns/secrets?watch=1")).await;
        assert_eq!(w.status, 200);
        watches.push(w);
    }
    let (secrets, configmaps) =
        (url("/api/v1/namespaces/ns/secrets"), url("/api/v1/namespaces/ns/configmaps"));
    let get = common::send(&client, http::Method::GET, &secrets, None, &[]);
    let r = tokio::time::timeout(Duration::from_secs(10), get).await.expect("answered, not queued");
    assert_eq!(r.status, 200);
    let list = common::send(&client, http::Method::GET, &configmaps, None, &[]);
    let r = tokio::time::timeout(Duration::from_secs(10), list).await.expect("answered");
    assert_eq!(r.status, 200);

    // And every watch still gets its events.
    sim.sim.create("secrets", "ns", json!({"metadata": {"name": "s1", "namespace": "ns"}})).unwrap();
    for w in &mut watches {
        let ev = w.next(Duration::from_secs(10)).await.expect("the event");
        assert_eq!(ev["type"], "ADDED");
    }
}
