//! Shared helpers for integration tests: start the simulated apiserver and the proxy on
//! 127.0.0.1:0, and talk plain HTTP to them.
#![allow(dead_code)]

pub mod churn;
pub mod fault;
pub mod mirror;
pub mod pb;
pub mod recorded;
pub mod tls;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use kube_watchcache::app::{self, Running};
use kube_watchcache::config::ServeArgs;
use kube_watchcache_sim::{Sim, SimHandle, SimOptions};
use serde_json::{json, Value};

/// Polls `f` every 50 ms until it holds, failing after `secs` seconds (for what the proxy does
/// in the background: rediscovery, retirement).
pub async fn eventually<F, Fut>(secs: u64, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    while !f().await {
        assert!(std::time::Instant::now() < deadline, "{what}: not within {secs} s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether the upstream's request `r` is a reflector's full list of the collection `path`:
/// paged and consistent (`limit=500`, its first page), or whole from the RV its watch lost
/// (`resourceVersion=<n>` alone, after a 410) — not a watch, a later page, or a metadata list.
pub fn reflector_list(r: &kube_watchcache_sim::RequestRecord, path: &str) -> bool {
    let whole_since = r
        .query
        .strip_prefix("resourceVersion=")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    let metadata =
        r.headers.get("accept").is_some_and(|a| a.to_str().unwrap_or("").contains("PartialObjectMetadata"));
    r.path == path
        && !metadata
        && !r.query.contains("watch=true")
        && !r.query.contains("continue=")
        && (r.query.contains("limit=500") || whole_since)
}

/// Of the upstream's requests, a reflector's lists of `path` that were whole from an RV
/// ([`reflector_list`]'s second kind).
pub fn whole_relists(sim: &SimHandle, path: &str) -> usize {
    sim.sim.request_count(|r| reflector_list(r, path) && !r.query.contains("limit="))
}

pub type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

pub struct Env {
    pub sim: SimHandle,
    pub proxy: Running,
    pub client: HttpClient,
}

pub fn serve_args(upstream: SocketAddr, resources: &[&str]) -> ServeArgs {
    let mut args = ServeArgs::local(&format!("http://{upstream}"), resources, "127.0.0.1:0".parse().unwrap());
    args.history_max_events = 10_000;
    args.shutdown_grace_period = Duration::from_secs(2);
    args
}

/// Starts a sim with no seeded objects and a proxy caching configmaps, pods, nodes and widgets.
pub async fn start() -> Env {
    start_with(SimOptions { listen: "127.0.0.1:0".parse().unwrap(), objects: 0, ..Default::default() }).await
}

pub async fn start_with(opts: SimOptions) -> Env {
    start_edited(opts, |_| {}).await
}

/// Like [`start_with`], with the proxy's flags edited first.
pub async fn start_edited(opts: SimOptions, edit: impl FnOnce(&mut ServeArgs)) -> Env {
    let sim = Sim::start(opts).await.expect("sim starts");
    let mut args = serve_args(sim.addr, &["configmaps", "pods", "nodes", "example.com/widgets"]);
    edit(&mut args);
    let proxy = app::start(&args).await.expect("proxy starts");
    assert!(proxy.wait_ready(Duration::from_secs(10)).await, "proxy synced");
    Env { sim, proxy, client: client() }
}

impl Env {
    pub fn proxy_url(&self, path_and_query: &str) -> String {
        format!("http://{}{}", self.proxy.addr, path_and_query)
    }

    pub fn sim_url(&self, path_and_query: &str) -> String {
        format!("http://{}{}", self.sim.addr, path_and_query)
    }

    pub async fn get(&self, path_and_query: &str) -> Resp {
        send(&self.client, Method::GET, &self.proxy_url(path_and_query), None, &[]).await
    }

    pub async fn get_sim(&self, path_and_query: &str) -> Resp {
        send(&self.client, Method::GET, &self.sim_url(path_and_query), None, &[]).await
    }

    /// Creates a namespace upstream unless it exists.
    pub fn ns(&self, ns: &str) {
        let _ = self.sim.sim.create(
            "namespaces",
            "",
            json!({"apiVersion":"v1","kind":"Namespace","metadata":{"name":ns}}),
        );
    }

    /// Creates a configmap upstream (directly in the sim, namespace included) and returns its RV.
    pub fn create_cm(&self, ns: &str, name: &str, labels: Value) -> u64 {
        self.ns(ns);
        let o = self
            .sim
            .sim
            .create("configmaps", ns, json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":name,"labels":labels},"data":{"k":"v"}}))
            .expect("create");
        rv_of(&o)
    }

    pub fn update_cm(&self, ns: &str, name: &str, labels: Value, data: &str) -> u64 {
        let o = self
            .sim
            .sim
            .update("configmaps", ns, json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":name,"namespace":ns,"labels":labels},"data":{"k":data}}))
            .expect("update");
        rv_of(&o)
    }

    pub fn delete_cm(&self, ns: &str, name: &str) -> u64 {
        let o = self.sim.sim.delete("configmaps", ns, name).expect("delete");
        rv_of(&o)
    }

    /// Waits until the proxy's configmaps cache has reached `rv`.
    pub async fn synced_to(&self, rv: u64) {
        let r = self.proxy.readers().into_iter().find(|r| r.kind().resource == "configmaps").unwrap();
        r.wait_for(kube_watchcache::resource::Rv(rv), Duration::from_secs(5)).await.expect("cache caught up");
    }

    /// Requests the sim saw that match `path` prefix and contain `query_part`.
    pub fn upstream_requests(&self, path: &str, query_part: &str) -> usize {
        self.sim.sim.request_count(|r| r.path.starts_with(path) && r.query.contains(query_part))
    }

    /// Requests the sim saw for exactly this path and query (`/p?q`, the query as sent: the
    /// proxy forwards it unchanged).
    pub fn upstream_exact(&self, path_and_query: &str) -> usize {
        let (path, query) = path_and_query.split_once('?').unwrap_or((path_and_query, ""));
        self.sim.sim.request_count(|r| r.path == path && r.query == query)
    }

    /// Requests the sim saw for exactly this path, whatever their query. For paths the proxy's
    /// own reflectors and probes never use (namespaced collections, objects, `/watch/` paths):
    /// catches a forwarded request even if its query was rewritten.
    pub fn upstream_path(&self, path: &str) -> usize {
        self.sim.sim.request_count(|r| r.path == path)
    }

    /// Sends `GET path_and_query` through the proxy and asserts the sim did not see it (same
    /// path and query; and nothing at all on that path when `path_untouched`).
    pub async fn get_from_cache(&self, path_and_query: &str, path_untouched: bool) -> Resp {
        let path = path_and_query.split('?').next().unwrap_or("");
        let (exact, any) = (self.upstream_exact(path_and_query), self.upstream_path(path));
        let r = self.get(path_and_query).await;
        assert_eq!(
            self.upstream_exact(path_and_query),
            exact,
            "served from the cache: {path_and_query} not forwarded"
        );
        if path_untouched {
            assert_eq!(
                self.upstream_path(path),
                any,
                "served from the cache: nothing sent upstream on {path}"
            );
        }
        r
    }

    /// Waits until the proxy's cache of `resource` (plural) has reached `rv`.
    pub async fn cache_synced_to(&self, resource: &str, rv: u64) {
        let r = self
            .proxy
            .readers()
            .into_iter()
            .find(|r| r.kind().resource == resource)
            .expect("cached resource");
        r.wait_for(kube_watchcache::resource::Rv(rv), Duration::from_secs(5)).await.expect("cache caught up");
    }
}

pub fn rv_of(o: &Value) -> u64 {
    o["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap()
}

pub struct Resp {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Resp {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }

    pub fn names(&self) -> Vec<String> {
        self.json()["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap().to_owned())
            .collect()
    }

    /// Watch bodies: one JSON event per line.
    pub fn events(&self) -> Vec<Value> {
        self.body
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect()
    }
}

pub async fn send(
    client: &HttpClient,
    method: Method,
    url: &str,
    body: Option<Value>,
    headers: &[(&str, &str)],
) -> Resp {
    let mut b = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let body = body.map(|v| Bytes::from(v.to_string())).unwrap_or_default();
    let req = b.body(Full::new(body)).unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(20), client.request(req))
        .await
        .expect("response in time")
        .expect("request");
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = tokio::time::timeout(Duration::from_secs(20), resp.into_body().collect())
        .await
        .expect("body in time")
        .expect("body")
        .to_bytes();
    Resp { status, headers, body }
}

/// An open watch read line by line.
pub struct WatchLines {
    pub status: StatusCode,
    pub headers: HeaderMap,
    body: hyper::body::Incoming,
    buf: Vec<u8>,
}

pub async fn open_watch(client: &HttpClient, url: &str) -> WatchLines {
    open_watch_with(client, url, &[]).await
}

/// `open_watch` with request headers (e.g. `authorization`).
pub async fn open_watch_with(client: &HttpClient, url: &str, headers: &[(&str, &str)]) -> WatchLines {
    let mut b = Request::builder().uri(url);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let req = b.body(Full::new(Bytes::new())).unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(10), client.request(req))
        .await
        .expect("headers in time")
        .expect("watch");
    WatchLines {
        status: resp.status(),
        headers: resp.headers().clone(),
        body: resp.into_body(),
        buf: Vec::new(),
    }
}

impl WatchLines {
    /// The next event, or `None` at the end of the stream or after `timeout` without one.
    /// Whether the stream ends (or fails) within `timeout`, whatever it still sends.
    pub async fn ends_within(&mut self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, self.body.frame()).await {
                Err(_) => return false,
                Ok(None) | Ok(Some(Err(_))) => return true,
                Ok(Some(Ok(_))) => {}
            }
        }
    }

    pub async fn next(&mut self, timeout: Duration) -> Option<Value> {
        let line = self.next_line(timeout).await?;
        Some(serde_json::from_slice(&line[..line.len() - 1]).expect("event JSON"))
    }

    /// The next event line as sent, with its newline (byte comparisons).
    pub async fn next_line(&mut self, timeout: Duration) -> Option<Vec<u8>> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=pos).collect();
                if line.len() > 1 {
                    return Some(line);
                }
                continue;
            }
            let frame = tokio::time::timeout_at(deadline, self.body.frame()).await.ok()??.ok()?;
            if let Ok(data) = frame.into_data() {
                self.buf.extend_from_slice(&data);
            }
        }
    }

    /// (type, name) of the next `n` events.
    pub async fn take(&mut self, n: usize, timeout: Duration) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for _ in 0..n {
            match self.next(timeout).await {
                Some(e) => out.push(type_name(&e)),
                None => break,
            }
        }
        out
    }
}

pub fn type_name(e: &Value) -> (String, String) {
    (
        e["type"].as_str().unwrap_or("").to_owned(),
        e["object"]["metadata"]["name"].as_str().unwrap_or("").to_owned(),
    )
}

/// The JSON value without `metadata.managedFields` (its items' too, for a list): what a read
/// with `drop=metadata.managedFields` should equal.
pub fn without_managed_fields(mut v: Value) -> Value {
    if let Some(items) = v.get_mut("items").and_then(Value::as_array_mut) {
        items.iter_mut().for_each(|i| {
            i["metadata"].as_object_mut().map(|m| m.remove("managedFields"));
        });
    }
    if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("managedFields");
    }
    v
}

/// A TCP connection to `addr` from the local address `from` (any 127.x: another client host).
pub async fn connect_from(from: &str, addr: std::net::SocketAddr) -> tokio::net::TcpStream {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind(format!("{from}:0").parse().unwrap()).unwrap();
    sock.connect(addr).await.unwrap()
}

/// Opens an exec session (`POST …/pods/<pod>/exec`, SPDY/3.1 upgrade) on the proxy at `addr`
/// with `extra` header lines (each ending in `\r\n`), and returns the connection once the `101`
/// is in and one echo went through the splice (the sim echoes); the answer's head otherwise.
pub async fn exec_session(addr: SocketAddr, pod: &str, extra: &str) -> Result<tokio::net::TcpStream, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST /api/v1/namespaces/{pod}/exec?command=sh&stdin=true HTTP/1.1\r\nHost: {addr}\r\n{extra}Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\nContent-Length: 0\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut byte))
            .await
            .expect("answer in time")
            .unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    if !head.starts_with("HTTP/1.1 101") {
        return Err(head);
    }
    s.write_all(b"ping").await.unwrap();
    let mut echo = [0u8; 4];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut echo))
        .await
        .expect("echo in time")
        .unwrap();
    assert_eq!(&echo, b"ping");
    Ok(s)
}
