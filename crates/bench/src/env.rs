//! Where the load goes: the targets (proxy, direct upstream) with their HTTP(S) clients, and the
//! backend the writer and the seeding talk to (the in-process sim, or the upstream over HTTP).
//! In-process mode starts a `sim` and a proxy in front of it on `127.0.0.1:0`: plain HTTP with
//! `--auth=none`, or with `--tls` both on HTTPS (a throwaway CA) and the proxy's auth on.
//!
//! Called by `bench::run` (setup and teardown) and by every driver (requests).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use http::{HeaderValue, Method, Request};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};

use super::certs::Pki;
use super::scenario::{Plan, CREATED_BY, NAMESPACES};
use super::tls::{ClientTls, Connector};
use kube_watchcache::app::{self, Running};
use kube_watchcache::config::ServeArgs;
use kube_watchcache::upstream::Credentials;
use kube_watchcache_sim::{AuthScript, Sim, SimHandle, SimOptions, SimTls};

pub type HttpClient = Client<Connector, Full<Bytes>>;

/// HTTP/2 streams per connection before the next client (connection) is used.
const H2_STREAMS_PER_CONN: usize = 100;

/// The clients for one target: one pooled HTTP/1.1 client (a connection per in-flight
/// request), or with `--http2` enough h2 clients (prior knowledge on `http://`, ALPN `h2` on
/// `https://`) that no connection carries more than [`H2_STREAMS_PER_CONN`] watches.
#[derive(Clone)]
pub struct Clients(Arc<Vec<HttpClient>>);

impl Clients {
    pub fn new(tls: &ClientTls, http2: bool, streams: usize) -> Clients {
        let n = if http2 { streams.div_ceil(H2_STREAMS_PER_CONN).max(1) } else { 1 };
        let clients = (0..n)
            .map(|_| {
                let mut b = Client::builder(TokioExecutor::new());
                b.pool_idle_timeout(Duration::from_secs(30)).http2_only(http2);
                b.build(tls.connector(http2))
            })
            .collect();
        Clients(Arc::new(clients))
    }

    /// One HTTP/1.1 client (seeding, metrics).
    pub fn one(tls: &ClientTls) -> HttpClient {
        Clients::new(tls, false, 1).0[0].clone()
    }

    /// The client for stream `i` (watchers spread over the h2 connections).
    pub fn pick(&self, i: usize) -> &HttpClient {
        &self.0[i % self.0.len()]
    }
}

/// One side of the comparison.
#[derive(Clone)]
pub struct Target {
    /// `proxy` or `direct`.
    pub name: &'static str,
    /// Base URL without a trailing slash.
    pub base: String,
    /// The bearer credential (`--token`, the kubeconfig's token, token file or exec plugin).
    pub auth: Option<Arc<Credentials>>,
}

impl Target {
    /// A request to `path_and_query` with `Accept: application/json` and the bearer token.
    pub fn request(
        &self,
        method: Method,
        path_and_query: &str,
        body: Option<Bytes>,
    ) -> Option<Request<Full<Bytes>>> {
        let mut b = Request::builder()
            .method(method)
            .uri(format!("{}{}", self.base, path_and_query))
            .header(ACCEPT, HeaderValue::from_static("application/json"));
        if body.is_some() {
            b = b.header(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
        if let Some(h) = self.auth.as_ref().and_then(|a| a.header()) {
            b = b.header(AUTHORIZATION, h);
        }
        b.body(Full::new(body.unwrap_or_default())).ok()
    }
}

/// What the writer and the seeding write to.
#[derive(Clone)]
pub enum Backend {
    /// The in-process sim: writes are function calls, RVs are read directly.
    Sim(Sim),
    /// An upstream reached over HTTP (`--direct`, the kubeconfig's cluster, or the proxy).
    Http(Arc<Remote>),
}

/// A target with the client to reach it.
pub struct Remote {
    pub target: Target,
    pub client: HttpClient,
    /// `--put-writes`: changes replace the whole pod (the writer before issue 18).
    pub put_writes: bool,
}

impl Remote {
    pub fn new(target: Target, client: HttpClient) -> Arc<Remote> {
        Arc::new(Remote { target, client, put_writes: false })
    }

    /// A writer that replaces whole pods with PUT, as the bench did before issue 18: a real
    /// apiserver (and the sim) refuse it with 422 once admission has filled the pod's spec in.
    pub fn with_put_writes(target: Target, client: HttpClient) -> Arc<Remote> {
        Arc::new(Remote { target, client, put_writes: true })
    }
}

/// Annotation keys the writer stamps on every change.
pub const SENT_KEY: &str = "bench.kube-watchcache.io/sent-unix-nanos";
pub const SEQ_KEY: &str = "bench.kube-watchcache.io/seq";
const PAD_KEY: &str = "bench.kube-watchcache.io/pad";

/// The pod the bench keeps at index `i`, padded to about `plan.sizes.object_size` bytes and
/// stamped with the writer's `seq` and send time (0 when seeding).
pub fn pod(plan: &Plan, i: usize, seq: u64, sent_nanos: u128) -> Value {
    let (ns, name) = Plan::object_key(i);
    let node = format!("node-{}", plan.node_of(i));
    let mut v = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": {"app": "bench", "bench-index": (i % 100).to_string()},
            "annotations": {PAD_KEY: "", SENT_KEY: sent_nanos.to_string(), SEQ_KEY: seq.to_string()},
        },
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.9"}]},
        "status": {"phase": "Running"},
    });
    if plan.node_identities {
        v["spec"]["volumes"] = json!([secret_volume(plan.node_of(i))]);
    }
    // uid, timestamps and the RV add ~150 bytes once stored.
    let base = v.to_string().len() + 150;
    if let Some(pad) = v.pointer_mut(&format!("/metadata/annotations/{}", PAD_KEY.replace('/', "~1"))) {
        *pad = Value::String("x".repeat(plan.sizes.object_size.saturating_sub(base)));
    }
    v
}

/// `--node-identities`: the Secret node `n`'s pods mount.
pub fn secret_name(node: usize) -> String {
    format!("bench-node-{node}")
}

/// The volume that makes a pod of `node` reference its Secret (the Node authorizer's graph).
pub fn secret_volume(node: usize) -> Value {
    json!({"name": "node-secret", "secret": {"secretName": secret_name(node)}})
}

/// The Secret itself.
pub fn secret(ns: &str, node: usize) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": secret_name(node), "namespace": ns},
           "data": {"token": "YmVuY2g="}})
}

impl Backend {
    /// The upstream's current resourceVersion (a Most Recent LIST with `limit=1` over HTTP).
    pub async fn current_rv(&self) -> Result<u64, String> {
        match self {
            Backend::Sim(sim) => Ok(sim.current_rv().0),
            Backend::Http(r) => {
                let (t, c) = (&r.target, &r.client);
                let req = t.request(Method::GET, "/api/v1/pods?limit=1", None).ok_or("bad URL")?;
                let body = send(c, req).await?;
                #[derive(serde::Deserialize)]
                struct L {
                    metadata: M,
                }
                #[derive(serde::Deserialize)]
                struct M {
                    #[serde(rename = "resourceVersion")]
                    rv: String,
                }
                let l: L = serde_json::from_slice(&body).map_err(|e| format!("list of pods: {e}"))?;
                l.metadata.rv.parse().map_err(|e| format!("list resourceVersion {:?}: {e}", l.metadata.rv))
            }
        }
    }

    /// Creates one pod (`create`), or changes its bench annotations. Over HTTP a change is a
    /// JSON merge-patch of `metadata.annotations`, never a whole-object PUT: a real apiserver
    /// refuses a PUT of a pod whose spec admission has filled in since (422 "pod updates may not
    /// change fields other than …").
    pub async fn write(&self, obj: Value, create: bool) -> Result<(), String> {
        let ns = obj.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("").to_owned();
        match self {
            Backend::Sim(sim) if create => sim.create("pods", &ns, obj).map(drop).map_err(|e| e.to_string()),
            Backend::Sim(sim) => sim.update("pods", &ns, obj).map(drop).map_err(|e| e.to_string()),
            Backend::Http(r) => {
                let (t, c) = (&r.target, &r.client);
                let name = obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("").to_owned();
                let req = if create {
                    t.request(
                        Method::POST,
                        &format!("/api/v1/namespaces/{ns}/pods"),
                        Some(Bytes::from(obj.to_string())),
                    )
                } else if r.put_writes {
                    t.request(
                        Method::PUT,
                        &format!("/api/v1/namespaces/{ns}/pods/{name}"),
                        Some(Bytes::from(obj.to_string())),
                    )
                } else {
                    let patch = json!({"metadata": {"annotations": obj.pointer("/metadata/annotations").cloned().unwrap_or_default()}});
                    t.request(
                        Method::PATCH,
                        &format!("/api/v1/namespaces/{ns}/pods/{name}"),
                        Some(Bytes::from(patch.to_string())),
                    )
                    .map(|mut req| {
                        req.headers_mut()
                            .insert(CONTENT_TYPE, HeaderValue::from_static("application/merge-patch+json"));
                        req
                    })
                };
                send(c, req.ok_or("bad URL")?).await.map(drop)
            }
        }
    }

    /// Creates the namespaces and the `plan.sizes.objects` pods (creation or replacement, so a
    /// second run against the same upstream reuses them).
    pub async fn seed(&self, plan: &Plan) -> Result<(), String> {
        for n in 0..NAMESPACES {
            let (k, v) = CREATED_BY;
            let ns = json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": format!("bench-{n}"), "labels": {k: v}}});
            // Already existing is fine.
            let _ = match self {
                Backend::Sim(sim) => sim.create("namespaces", "", ns).map(drop).map_err(|e| e.to_string()),
                Backend::Http(r) => {
                    match r.target.request(Method::POST, "/api/v1/namespaces", Some(ns.to_string().into())) {
                        Some(req) => send(&r.client, req).await.map(drop),
                        None => Err("bad URL".into()),
                    }
                }
            };
        }
        if plan.node_identities {
            self.seed_secrets(plan).await?;
        }
        let concurrency = match self {
            Backend::Sim(_) => 1,
            Backend::Http(..) => 32,
        };
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..concurrency {
            let (me, plan, next) = (self.clone(), plan.clone(), next.clone());
            tasks.spawn(async move {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= plan.sizes.objects {
                        return Ok::<(), String>(());
                    }
                    let obj = pod(&plan, i, 0, 0);
                    me.seed_one(obj, i).await?;
                }
            });
        }
        while let Some(r) = tasks.join_next().await {
            r.map_err(|e| e.to_string())??;
        }
        Ok(())
    }
}

impl Backend {
    /// Creates pod `i`, or reuses it when it exists (its annotations reset by a merge-patch).
    /// A fresh namespace refuses pods until its `default` ServiceAccount exists (a controller
    /// makes it a moment later): creation is retried with backoff for up to 30 s, then the
    /// upstream's own message is the error.
    async fn seed_one(&self, obj: Value, i: usize) -> Result<(), String> {
        let mut delay = Duration::from_millis(100);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let err = match self.write(obj.clone(), true).await {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            if err.contains("HTTP 409") || err.contains("already exists") {
                // Reused as it is, unless it is bound to another node than this plan's
                // (`spec.nodeName` cannot change): then it is deleted and created again.
                if self.bound_elsewhere(&obj).await? {
                    self.delete_now(&obj).await.map_err(|e| format!("seeding pod {i}: {e}"))?;
                    continue;
                }
                return self.write(obj, false).await.map_err(|e| format!("seeding pod {i}: {e}"));
            }
            if tokio::time::Instant::now() + delay > deadline {
                return Err(format!("seeding pod {i}: {err}"));
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(2));
        }
    }
}

impl Backend {
    /// The Secret of every (namespace, node) the plan's pods use (existing ones are kept).
    async fn seed_secrets(&self, plan: &Plan) -> Result<(), String> {
        let mut seen = std::collections::HashSet::new();
        for i in 0..plan.sizes.objects {
            let ((ns, _), node) = (Plan::object_key(i), plan.node_of(i));
            if !seen.insert((ns.clone(), node)) {
                continue;
            }
            let secret = secret(&ns, node);
            let result = match self {
                Backend::Sim(sim) => sim.create("secrets", &ns, secret).map(drop).map_err(|e| e.to_string()),
                Backend::Http(r) => {
                    let path = format!("/api/v1/namespaces/{ns}/secrets");
                    let req = r
                        .target
                        .request(Method::POST, &path, Some(secret.to_string().into()))
                        .ok_or("bad URL")?;
                    send(&r.client, req).await.map(drop)
                }
            };
            match result {
                Ok(()) => {}
                Err(e) if e.contains("HTTP 409") || e.contains("already exists") => {}
                Err(e) => return Err(format!("seeding secret {ns}/{}: {e}", secret_name(node))),
            }
        }
        Ok(())
    }

    /// Whether the upstream's pod named like `obj` is bound to another node (HTTP only; the
    /// in-process sim replaces whole objects).
    async fn bound_elsewhere(&self, obj: &Value) -> Result<bool, String> {
        let Backend::Http(r) = self else { return Ok(false) };
        let s = |p: &str| obj.pointer(p).and_then(Value::as_str).unwrap_or("").to_owned();
        let path = format!("/api/v1/namespaces/{}/pods/{}", s("/metadata/namespace"), s("/metadata/name"));
        let req = r.target.request(Method::GET, &path, None).ok_or("bad URL")?;
        let body = send(&r.client, req).await?;
        let have: Value = serde_json::from_slice(&body).map_err(|e| format!("{path}: {e}"))?;
        Ok(have.pointer("/spec/nodeName") != obj.pointer("/spec/nodeName"))
    }

    /// Deletes the pod named like `obj` at once (no kubelet confirms a graceful deletion of a
    /// bench pod bound to a node that does not exist).
    async fn delete_now(&self, obj: &Value) -> Result<(), String> {
        let Backend::Http(r) = self else { return Ok(()) };
        let s = |p: &str| obj.pointer(p).and_then(Value::as_str).unwrap_or("").to_owned();
        let path = format!(
            "/api/v1/namespaces/{}/pods/{}?gracePeriodSeconds=0",
            s("/metadata/namespace"),
            s("/metadata/name")
        );
        let req = r.target.request(Method::DELETE, &path, None).ok_or("bad URL")?;
        send(&r.client, req).await.map(drop)
    }
}

/// Sends a request and reads the whole body; non-2xx is an error with the start of the body.
pub async fn send(c: &HttpClient, req: Request<Full<Bytes>>) -> Result<Bytes, String> {
    use http_body_util::BodyExt;
    let what = format!("{} {}", req.method(), req.uri());
    let fut = async {
        let resp = c.request(req).await.map_err(|e| format!("{what}: {}", chain(&e)))?;
        let status = resp.status();
        let body = resp.into_body().collect().await.map_err(|e| format!("{what}: {e}"))?.to_bytes();
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
            return Err(format!("{what}: HTTP {status}: {text}"));
        }
        Ok(body)
    };
    tokio::time::timeout(Duration::from_secs(60), fut).await.map_err(|_| "timed out after 60 s".to_owned())?
}

/// An error with its causes (hyper-util's own text is just "client error (Connect)").
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    msg
}

/// The simulated apiserver and the proxy, both in this process.
pub struct Local {
    pub sim: SimHandle,
    pub proxy: Running,
    /// `--tls`: the throwaway CA and certificates (removed when dropped) and the bearer token
    /// the sim's TokenReview accepts (user `admin`, group `system:masters`).
    pub secure: Option<(Pki, String)>,
}

impl Local {
    /// Starts a sim, seeds it, starts a proxy caching pods in front of it and waits for it to
    /// sync. With `tls`, the sim and the proxy serve HTTPS with certificates from a fresh CA, the
    /// proxy reaches the sim over HTTPS and runs `--auth=upstream` against the sim's review
    /// script.
    pub async fn start(plan: &Plan, tls: bool) -> Result<Local, String> {
        let events = (plan.sizes.events_per_sec * plan.duration.as_secs_f64() * 4.0) as usize;
        let leases = (plan.sizes.lease_churn_per_sec * plan.duration.as_secs_f64() * 4.0) as usize;
        let pki = if tls { Some(Pki::generate()?) } else { None };
        let opts = SimOptions {
            compaction_window: plan.sizes.objects + events + leases + 10_000,
            lease_churn_per_sec: plan.sizes.lease_churn_per_sec,
            tls: pki.as_ref().map(|p| SimTls { cert_file: p.sim_cert.clone(), key_file: p.sim_key.clone() }),
            ..SimOptions::default()
        };
        let sim = Sim::start(opts).await.map_err(|e| format!("sim: {e}"))?;
        Backend::Sim(sim.sim.clone()).seed(plan).await?;
        let (args, secure) = match pki {
            None => (serve_args(sim.addr, events), None),
            Some(pki) => {
                let token = format!("bench-{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
                sim.sim.set_auth(AuthScript::admin(&token));
                (secure_serve_args(sim.addr, events, &pki, &token, plan.node_identities)?, Some((pki, token)))
            }
        };
        let proxy = app::start(&args).await?;
        if !proxy.wait_ready(Duration::from_secs(120)).await {
            return Err("the in-process proxy did not sync within 120 s".into());
        }
        Ok(Local { sim, proxy, secure })
    }

    /// The two targets, each with the bearer token in `--tls` mode.
    pub fn targets(&self) -> [Target; 2] {
        let scheme = if self.secure.is_some() { "https" } else { "http" };
        let token = self.secure.as_ref().and_then(|(_, t)| Credentials::token(t).ok()).map(Arc::new);
        [
            Target { name: "proxy", base: format!("{scheme}://{}", self.proxy.addr), auth: token.clone() },
            Target { name: "direct", base: format!("{scheme}://{}", self.sim.addr), auth: token },
        ]
    }

    pub async fn shutdown(self) {
        self.proxy.shutdown().await;
        self.sim.shutdown().await;
    }
}

fn tune(mut args: ServeArgs, events: usize) -> ServeArgs {
    args.history_window = Duration::from_secs(600);
    args.history_max_events = events.max(102_400);
    args.shutdown_grace_period = Duration::from_secs(2);
    args
}

fn serve_args(upstream: std::net::SocketAddr, events: usize) -> ServeArgs {
    let args = ServeArgs::local(
        &format!("http://{upstream}"),
        &["pods"],
        std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
    );
    tune(args, events)
}

/// The production setup on loopback: HTTPS in front, HTTPS to the sim (verified against the
/// throwaway CA, the proxy's own token sent like a service account's), delegated authn/authz
/// with the default caches. No per-user watch limit: every bench watcher is the same user.
fn secure_serve_args(
    upstream: std::net::SocketAddr,
    events: usize,
    pki: &Pki,
    token: &str,
    node_identities: bool,
) -> Result<ServeArgs, String> {
    let token_file = pki.dir.join("token");
    std::fs::write(&token_file, token).map_err(|e| format!("{}: {e}", token_file.display()))?;
    let path = |p: &std::path::Path| p.display().to_string();
    let mut flags = vec![
        format!("--upstream=https://{upstream}"),
        format!("--certificate-authority={}", path(&pki.ca)),
        format!("--token-file={}", path(&token_file)),
        format!("--resources={}", if node_identities { "pods,secrets" } else { "pods" }),
        "--bind-address=127.0.0.1".into(),
        "--secure-port=0".into(),
        format!("--tls-cert-file={}", path(&pki.proxy_cert)),
        format!("--tls-private-key-file={}", path(&pki.proxy_key)),
        "--auth=upstream".into(),
        "--max-watches-per-user=0".into(),
    ];
    if node_identities {
        // Kubelets: client certificates of the run's CA, and the Secrets their pods mount.
        flags.push(format!("--client-ca-file={}", path(&pki.ca)));
    }
    match ServeArgs::from_flags(&flags) {
        Ok(args) => Ok(tune(args, events)),
        Err(e) => Err(format!("the proxy's flags: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Scenario;

    #[test]
    fn pods_are_padded_to_about_the_object_size() {
        let mut sizes = Scenario::ListHeavy.defaults();
        sizes.object_size = 2048;
        let plan = Plan::new(Scenario::ListHeavy, sizes, Duration::from_secs(1), false);
        let p = pod(&plan, 7, 42, 1234);
        let len = p.to_string().len();
        assert!((1800..=2048).contains(&len), "{len}");
        assert_eq!(p["metadata"]["annotations"][SEQ_KEY], "42");
        assert_eq!(p["metadata"]["annotations"][SENT_KEY], "1234");
        assert_eq!(p["spec"]["nodeName"], "node-0", "list-heavy has one node");
    }
}
