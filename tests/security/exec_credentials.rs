//! Exec credential plugins end to end (issue 18 item 4): `serve --kubeconfig` and
//! `bench --kubeconfig` with a user whose credentials come from a small shell plugin that hands
//! out tokens valid for three seconds. A front before the sim plays the apiserver's
//! authenticator: it refuses (401) a token once the expiry the plugin gave it has passed, and
//! records every token it saw. Runs several lifetimes long: every request must carry a fresh
//! token, so the credential was renewed before it expired, each time.

use crate::common;

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use kube_watchcache::app;
use kube_watchcache_bench::{BenchArgs, Scenario};
use kube_watchcache_sim::{Sim, SimOptions};
use parking_lot::Mutex;

/// `tok-<run>-<expiry in Unix seconds>`, valid for `$LIFETIME` seconds.
const PLUGIN: &str = r#"#!/bin/sh
dir=$(dirname "$0")
n=$(( $(cat "$dir/count" 2>/dev/null || echo 0) + 1 ))
# Written whole, then renamed: the test reading the count never sees an empty file.
echo "$n" > "$dir/count.$$" && mv "$dir/count.$$" "$dir/count"
exp=$(( $(date +%s) + ${LIFETIME:-3600} ))
printf '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"tok-%s-%s","expirationTimestamp":"%s"}}' \
  "$n" "$exp" "$(date -u -d "@$exp" +%Y-%m-%dT%H:%M:%SZ)"
"#;

struct Plugin {
    dir: PathBuf,
    kubeconfig: PathBuf,
}

impl Plugin {
    fn new(name: &str, server: SocketAddr) -> Plugin {
        Plugin::lasting(name, server, 3)
    }

    /// A plugin whose tokens live `lifetime` seconds.
    fn lasting(name: &str, server: SocketAddr, lifetime: u64) -> Plugin {
        let dir = std::env::temp_dir().join(format!(
            "kwc-exec-{name}-{}-{}",
            std::process::id(),
            fastrand::u32(..)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let script = dir.join("plugin.sh");
        std::fs::write(&script, PLUGIN).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let kubeconfig = dir.join("config");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: x\nclusters:\n- name: c\n  cluster:\n    \
                 server: http://{server}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\nusers:\n\
                 - name: u\n  user:\n    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      \
                 command: {}\n      interactiveMode: Never\n      env:\n      - name: LIFETIME\n        value: \"{lifetime}\"\n",
                script.display()
            ),
        )
        .unwrap();
        Plugin { dir, kubeconfig }
    }

    fn runs(&self) -> u64 {
        std::fs::read_to_string(self.dir.join("count")).map(|s| s.trim().parse().unwrap()).unwrap_or(0)
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What the front saw.
#[derive(Default)]
struct Seen {
    tokens: BTreeSet<String>,
    refused: Vec<String>,
    /// Paths asked with a valid token, in order.
    paths: Vec<String>,
}

/// A front that authenticates like the apiserver (expired or missing token: 401) and passes
/// the rest to the sim.
async fn front(sim: SocketAddr) -> (SocketAddr, Arc<Mutex<Seen>>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build_http::<Incoming>();
    let st = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else { return };
            let (client, st) = (client.clone(), st.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let (client, st) = (client.clone(), st.clone());
                    async move { Ok::<_, Infallible>(pass(req, sim, &client, &st).await) }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    (addr, seen)
}

type Body = BoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

async fn pass(
    mut req: Request<Incoming>,
    sim: SocketAddr,
    client: &hyper_util::client::legacy::Client<hyper_util::client::legacy::connect::HttpConnector, Incoming>,
    seen: &Mutex<Seen>,
) -> Response<Body> {
    let token = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer tok-"))
        .map(str::to_owned);
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    let fresh = token
        .as_deref()
        .and_then(|t| t.rsplit('-').next()?.parse::<u64>().ok())
        .is_some_and(|exp| now <= exp);
    let what = format!("{} {} {:?}", req.method(), req.uri(), token);
    if !fresh {
        seen.lock().refused.push(what);
        let status = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Unauthorized","reason":"Unauthorized","code":401}"#;
        let mut r =
            Response::new(Full::new(Bytes::from_static(status.as_bytes())).map_err(|e| match e {}).boxed());
        *r.status_mut() = StatusCode::UNAUTHORIZED;
        return r;
    }
    {
        let mut seen = seen.lock();
        seen.tokens.insert(token.unwrap_or_default());
        seen.paths.push(req.uri().path().to_owned());
    }
    // A `proxy` subresource's backend that answers 401 itself, whatever the token.
    if req.uri().path().contains("/proxy/") {
        let mut r = Response::new(
            Full::new(Bytes::from_static(b"backend: who are you?")).map_err(|e| match e {}).boxed(),
        );
        *r.status_mut() = StatusCode::UNAUTHORIZED;
        return r;
    }
    let pq = req.uri().path_and_query().map(|p| p.as_str().to_owned()).unwrap_or_default();
    *req.uri_mut() = format!("http://{sim}{pq}").parse().unwrap();
    match client.request(req).await {
        Ok(r) => r.map(|b| b.map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>).boxed()),
        Err(e) => {
            let mut r = Response::new(Full::new(Bytes::from(e.to_string())).map_err(|e| match e {}).boxed());
            *r.status_mut() = StatusCode::BAD_GATEWAY;
            r
        }
    }
}

/// The sim behind the authenticating front, a plugin whose tokens live `lifetime` seconds, and
/// a proxy caching configmaps with the plugin's credentials, synced.
async fn serving(
    name: &str,
    lifetime: u64,
) -> (kube_watchcache_sim::SimHandle, Arc<Mutex<Seen>>, Plugin, kube_watchcache::app::Running) {
    let handle =
        Sim::start(SimOptions { listen: "127.0.0.1:0".parse().unwrap(), objects: 0, ..Default::default() })
            .await
            .unwrap();
    let (front, seen) = front(handle.addr).await;
    let plugin = Plugin::lasting(name, front, lifetime);
    let proxy = app::start(&serve_args(&plugin.kubeconfig, &["configmaps"])).await.expect("proxy starts");
    assert!(proxy.wait_ready(Duration::from_secs(10)).await, "proxy synced with the plugin's token");
    (handle, seen, plugin, proxy)
}

fn serve_args(kubeconfig: &Path, resources: &[&str]) -> kube_watchcache::config::ServeArgs {
    let mut args = common::serve_args("127.0.0.1:9".parse().unwrap(), resources);
    args.upstream.upstream = None;
    args.upstream.kubeconfig = Some(kubeconfig.to_owned());
    args
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_renews_its_exec_credential_before_each_expiry() {
    let (handle, seen, plugin, proxy) = serving("serve", 3).await;
    let client = common::client();
    let url = format!("http://{}/api/v1/namespaces/default/secrets", proxy.addr);
    // Forwarded reads (--auth=none: with the proxy's own credentials) across three renewals.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut reads = 0;
    while plugin.runs() < 4 {
        assert!(tokio::time::Instant::now() < deadline, "renewed only {} times", plugin.runs());
        let r = common::send(&client, http::Method::GET, &url, None, &[]).await;
        assert_eq!(r.status, StatusCode::OK, "read {reads}: {}", String::from_utf8_lossy(&r.body));
        reads += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let seen = seen.lock();
    assert!(seen.refused.is_empty(), "expired or missing tokens reached the apiserver: {:?}", seen.refused);
    assert!(seen.tokens.len() >= 3, "the proxy moved to each new token: {:?}", seen.tokens);
    drop(handle);
}

/// A 401 to a forwarded request may be a backend's behind the apiserver (a `proxy`
/// subresource): the proxy asks an own request whether its credential is refused before it
/// runs the plugin again (a review: each such 401 ran it, up to every 5 s, for as long as a
/// caller liked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backends_401_does_not_run_the_plugin_again() {
    let (handle, seen, plugin, proxy) = serving("backend401", 3600).await;
    let runs = plugin.runs();
    // The start's own /version is before this.
    let before = seen.lock().paths.len();
    let client = common::client();
    let url = format!("http://{}/api/v1/namespaces/default/services/web:80/proxy/", proxy.addr);
    for _ in 0..5 {
        let r = common::send(&client, http::Method::GET, &url, None, &[]).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "the backend's answer, passed on");
    }
    // The own request that confirms, once for the five: answered, so nothing renewed.
    let probes = || seen.lock().paths[before..].iter().filter(|p| *p == "/version").count();
    common::eventually(10, "an own request after the 401s", || async { probes() > 0 }).await;
    let probes = probes();
    assert_eq!(probes, 1, "one own request for the five 401s");
    assert_eq!(plugin.runs(), runs, "the plugin was not run again");
    assert!(seen.lock().refused.is_empty());
    drop(handle);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_with_an_exec_kubeconfig_runs_longer_than_a_token_lives() {
    let handle =
        Sim::start(SimOptions { listen: "127.0.0.1:0".parse().unwrap(), objects: 0, ..Default::default() })
            .await
            .unwrap();
    let (front, seen) = front(handle.addr).await;
    let plugin = Plugin::new("bench", front);
    let proxy = app::start(&common::serve_args(handle.addr, &["pods"])).await.expect("proxy starts");
    assert!(proxy.wait_ready(Duration::from_secs(10)).await);

    let mut a = BenchArgs::new(Scenario::ListHeavy, Duration::from_secs(4));
    a.kubeconfig = Some(plugin.kubeconfig.clone());
    a.target = Some(format!("http://{}", proxy.addr));
    a.watchers = Some(5);
    a.objects = Some(50);
    a.object_size = Some(400);
    a.events_per_sec = Some(10.0);
    a.lists_per_sec = Some(2.0);
    a.gets_per_sec = Some(10.0);
    a.lease_churn = Some(0.0);
    let report = kube_watchcache_bench::measure(&a).await.expect("the run passes");
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    let direct = report.targets.iter().find(|t| t.name == "direct").expect("direct phase");
    assert!(direct.watch.changes_written > 0 && direct.watch.deliveries_expected > 0);
    let seen = seen.lock();
    assert!(
        seen.refused.is_empty(),
        "expired or missing tokens: {:?}",
        &seen.refused[..seen.refused.len().min(5)]
    );
    assert!(plugin.runs() >= 2 && seen.tokens.len() >= 2, "renewed during the run: {:?}", seen.tokens);
}
