//! The simulated apiserver (`kube-watchcache sim`; the `kube-watchcache-sim` crate): an
//! in-memory, etcd-like store served over HTTP with kube-apiserver 1.36 semantics — one global revision counter, a bounded log of
//! changes with a compaction point, LIST / GET / WATCH with the exact resourceVersion rules,
//! writes, discovery, and the few subresources pass-through tests need.
//!
//! It is both a product feature (demos, load tests) and the test double every integration test
//! talks to, so it is a crate of its own, independent of the proxy's `cache` and `server`: it
//! checks the proxy rather than mirroring it. From the proxy's core (`kube_watchcache`) it uses
//! only what the recordings check in its own answers — `resource` (object bytes, keys,
//! framing), `error` (Status JSON), `params`, `selector`, `metadata_only`, `proto` — and two
//! helpers that are not semantics (`server::tls::server_provider`, `app`'s signal wait);
//! `tests/module_graph.rs` holds that list, each entry with the recording that checks it.
//!
//! # Layout
//!
//! | file | owns |
//! | --- | --- |
//! | `kinds` | the served resources |
//! | `store` | revisions, objects, the change log, compaction, writes |
//! | `encode` | object / list / bookmark JSON in the apiserver's shapes |
//! | `query` | the sim-specific bits of query parameters (the rest is `kube_watchcache::params`) |
//! | `route` | URL → discovery document or resource target |
//! | `http` | accept loop, recording, dispatch |
//! | `respond` | body type, JSON / error answers, content negotiation (what the handlers use) |
//! | `read` | LIST and GET |
//! | `watch` | WATCH streams and bookmarks |
//! | `write` | POST / PUT / PATCH / DELETE |
//! | `subresource` | `log`, `exec` / `attach` (upgrade echo), `status` |
//! | `discovery` | `/api`, `/apis`, `/version` … |
//! | `seed` | sample objects and churn |
//! | `review` | TokenReview / SubjectAccessReview from a test script (selectors read as a 1.34 apiserver) |
//! | `node_authz` | the Node authorizer of `--authorization-mode=Node,RBAC` (1.34, with selectors) |
//! | `tls` | the HTTPS acceptor (`--tls-cert-file`, `bench --tls`) |
//! | `cmd` | `kube-watchcache sim`: its flags and run |
#![forbid(unsafe_code)]

mod cmd;
mod discovery;
mod encode;
mod http;
mod kinds;
mod node_authz;
mod pods;
mod query;
mod read;
mod respond;
mod review;
mod route;
mod seed;
mod store;
mod subresource;
mod tls;
mod watch;
mod write;

#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

pub use cmd::{run, SimArgs};
use kube_watchcache::error::Error;
use kube_watchcache::resource::{ResourceKind, Rv};
pub use review::{AuthScript, Rule, ScriptUser, Subject};
use store::Store;
pub use tls::SimTls;

/// How the simulated apiserver is set up.
#[derive(Clone, Debug)]
pub struct SimOptions {
    /// Where to listen (`127.0.0.1:0` in tests).
    pub listen: SocketAddr,
    /// Seeded objects, spread over configmaps and pods in a few namespaces.
    pub objects: usize,
    /// Seeded updates per second (0 = none).
    pub churn_per_sec: f64,
    /// Node-heartbeat Lease renewals per second in `kube-node-lease` (0 = none): a resource
    /// the proxy does not cache moving the global revision, as in every live cluster.
    pub lease_churn_per_sec: f64,
    /// How many revisions the log keeps (older ones are compacted).
    pub compaction_window: usize,
    /// Periodic watch bookmark interval (60 s like the apiserver).
    pub bookmark_interval: Duration,
    /// Serve HTTPS (HTTP/1.1 and h2 by ALPN) with this certificate instead of plain HTTP.
    pub tls: Option<SimTls>,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            objects: 0,
            churn_per_sec: 0.0,
            lease_churn_per_sec: 0.0,
            compaction_window: 10_000,
            bookmark_interval: Duration::from_secs(60),
            tls: None,
        }
    }
}

/// One request the sim received over HTTP.
#[derive(Clone, Debug)]
pub struct RequestRecord {
    pub method: String,
    pub path: String,
    pub query: String,
    pub headers: ::http::HeaderMap,
}

/// How many request records are kept (oldest dropped first), so long load runs stay bounded.
const MAX_RECORDS: usize = 100_000;

struct Inner {
    store: Store,
    opts: SimOptions,
    requests: Mutex<VecDeque<RequestRecord>>,
    auth: Mutex<review::AuthScript>,
    /// Kinds (indices) no longer served: a deleted CRD.
    withdrawn: Mutex<std::collections::HashSet<usize>>,
    /// How many times each resource was withdrawn: a watch started before a withdrawal ends,
    /// even if the resource is served again by the time it looks.
    withdrawals: Mutex<std::collections::HashMap<usize, u64>>,
    /// The revision at which each resource was last served again after a withdrawal: its new
    /// storage (a new watch cache, listed at that revision) has no history before it, so a
    /// watch from an older RV is too old, as at a kube-apiserver whose CRD was re-created.
    served_again_at: Mutex<std::collections::HashMap<usize, Rv>>,
    /// Test-only fault: this many watch events are silently not sent (`drop_watch_events`).
    drop_watch_events: std::sync::atomic::AtomicU64,
    /// The revision of the last [`SimHandle::restart`]: the restarted apiserver's watch caches
    /// were listed then, so a watch of a cached kind from an older RV is too old.
    restarted_at: Mutex<Rv>,
}

/// The in-memory apiserver state; cheap to clone.
#[derive(Clone)]
pub struct Sim {
    inner: Arc<Inner>,
}

/// A running sim. Dropping it (or [`SimHandle::shutdown`]) stops the listener and every
/// connection.
pub struct SimHandle {
    pub addr: SocketAddr,
    pub sim: Sim,
    stop: tokio::sync::watch::Sender<bool>,
    server: Option<tokio::task::JoinHandle<()>>,
    churn: Option<tokio::task::JoinHandle<()>>,
    leases: Option<tokio::task::JoinHandle<()>>,
}

impl Sim {
    /// A sim with no listener and only the built-in namespaces (for unit tests of the store).
    pub fn new(opts: SimOptions) -> Sim {
        let store = Store::new(kinds::Kinds::builtin(), opts.compaction_window);
        let sim = Sim {
            inner: Arc::new(Inner {
                store,
                opts,
                requests: Mutex::new(VecDeque::new()),
                auth: Mutex::default(),
                withdrawn: Mutex::default(),
                withdrawals: Mutex::default(),
                served_again_at: Mutex::default(),
                drop_watch_events: Default::default(),
                restarted_at: Mutex::new(Rv(0)),
            }),
        };
        seed::system(&sim);
        sim
    }

    /// Binds, seeds and serves (plain HTTP, or HTTPS with `opts.tls`).
    pub async fn start(opts: SimOptions) -> std::io::Result<SimHandle> {
        let listener = kube_watchcache::server::listener::bind(opts.listen).await?;
        let sim = Sim::new(opts.clone());
        seed::objects(&sim, opts.objects);
        SimHandle::serve(listener, sim)
    }

    pub(crate) fn store(&self) -> &Store {
        &self.inner.store
    }

    pub(crate) fn opts(&self) -> &SimOptions {
        &self.inner.opts
    }

    fn record(&self, r: RequestRecord) {
        let mut q = self.inner.requests.lock();
        if q.len() >= MAX_RECORDS {
            q.pop_front();
        }
        q.push_back(r);
    }

    /// What it serves.
    pub fn resources(&self) -> Vec<ResourceKind> {
        self.store().kinds.all.iter().map(|s| s.kind.clone()).collect()
    }

    pub fn current_rv(&self) -> Rv {
        self.store().current_rv()
    }

    fn resolve(&self, resource: &str) -> Result<usize, Error> {
        self.store().kinds.by_name(resource).ok_or(Error::NoSuchResource)
    }

    /// Creates an object (same path as POST); returns the stored object.
    pub fn create(
        &self,
        resource: &str,
        namespace: &str,
        obj: serde_json::Value,
    ) -> Result<serde_json::Value, Error> {
        let res = self.resolve(resource)?;
        let o = write::create(self, res, namespace, obj)?;
        Ok(write::to_value(&o))
    }

    /// Replaces an object (same path as PUT); returns the stored object.
    pub fn update(
        &self,
        resource: &str,
        namespace: &str,
        obj: serde_json::Value,
    ) -> Result<serde_json::Value, Error> {
        let res = self.resolve(resource)?;
        let name = obj.pointer("/metadata/name").and_then(|v| v.as_str()).unwrap_or("").to_owned();
        let o = write::update(self, res, namespace, &name, obj, false, write::Writer::Internal)?;
        Ok(write::to_value(&o))
    }

    /// Deletes an object (same path as DELETE); returns it with the deletion resourceVersion.
    pub fn delete(&self, resource: &str, namespace: &str, name: &str) -> Result<serde_json::Value, Error> {
        let res = self.resolve(resource)?;
        let o = self.store().delete(res, namespace, name)?;
        Ok(write::to_value(&o))
    }

    /// Compacts the log at the current revision: watches and Exact reads from older revisions
    /// now fail with 410.
    pub fn compact(&self) {
        self.store().compact();
    }

    /// Stops (false) or resumes (true) serving a resource, like deleting and re-creating its
    /// CustomResourceDefinition: while withdrawn it is absent from discovery and its URLs answer
    /// `404 page not found`, and its open watches end (the apiserver tears the resource's
    /// storage down, which stops its watch cache and closes every watch on it); its objects are
    /// kept for when it comes back. Served again, its new storage starts at the current
    /// revision: a watch from an older RV answers 410, as the new watch cache's would.
    pub fn set_served(&self, resource: &str, served: bool) -> Result<(), Error> {
        let res = self.resolve(resource)?;
        {
            let mut w = self.inner.withdrawn.lock();
            if served {
                if w.remove(&res) {
                    self.inner.served_again_at.lock().insert(res, self.current_rv());
                }
            } else {
                w.insert(res);
            }
        }
        if !served {
            *self.inner.withdrawals.lock().entry(res).or_default() += 1;
            self.store().end_watches(res);
        }
        Ok(())
    }

    /// The revision `res` was last served again at after a withdrawal (its storage's start).
    pub(crate) fn served_again_at(&self, res: usize) -> Rv {
        self.inner.served_again_at.lock().get(&res).copied().unwrap_or(Rv(0))
    }

    /// The revision the watch caches were last listed at by a restart (0: never restarted).
    pub(crate) fn restarted_at(&self) -> Rv {
        *self.inner.restarted_at.lock()
    }

    /// How many times `res` was withdrawn so far.
    pub(crate) fn withdrawals(&self, res: usize) -> u64 {
        self.inner.withdrawals.lock().get(&res).copied().unwrap_or(0)
    }

    pub(crate) fn is_withdrawn(&self, res: usize) -> bool {
        self.inner.withdrawn.lock().contains(&res)
    }

    /// The kinds discovery lists: all but the withdrawn ones.
    pub(crate) fn served_kinds(&self) -> kinds::Kinds {
        let w = self.inner.withdrawn.lock();
        let all = &self.store().kinds.all;
        kinds::Kinds {
            all: all.iter().enumerate().filter(|(i, _)| !w.contains(i)).map(|(_, k)| k.clone()).collect(),
        }
    }

    /// Test-only fault: the next `n` events any watch stream would send are silently skipped
    /// (the stream goes on; a later event or bookmark moves its RV past them), so a cache
    /// behind it misses them — what the consistency check (`consistency`) must catch.
    pub fn drop_watch_events(&self, n: u64) {
        self.inner.drop_watch_events.store(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether to skip this event (`drop_watch_events`), counting it.
    pub(crate) fn take_dropped_watch_event(&self) -> bool {
        use std::sync::atomic::Ordering;
        self.inner
            .drop_watch_events
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }

    /// How many recorded HTTP requests match `pred`.
    pub fn request_count(&self, pred: impl Fn(&RequestRecord) -> bool) -> usize {
        self.inner.requests.lock().iter().filter(|r| pred(r)).count()
    }

    /// The recorded requests matching `pred`, oldest first (what the upstream received).
    pub fn requests(&self, pred: impl Fn(&RequestRecord) -> bool) -> Vec<RequestRecord> {
        self.inner.requests.lock().iter().filter(|r| pred(r)).cloned().collect()
    }
}

impl SimHandle {
    /// Serves `sim` on `listener` (plain HTTP, or HTTPS with its `opts.tls`), with its churn.
    fn serve(listener: tokio::net::TcpListener, sim: Sim) -> std::io::Result<SimHandle> {
        let opts = sim.opts().clone();
        let acceptor = opts.tls.as_ref().map(tls::acceptor).transpose()?;
        let addr = listener.local_addr()?;
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let server = tokio::spawn(http::serve(listener, sim.clone(), acceptor, stop_rx.clone()));
        let churn =
            (opts.churn_per_sec > 0.0).then(|| tokio::spawn(seed::churn(sim.clone(), stop_rx.clone())));
        let leases = (opts.lease_churn_per_sec > 0.0).then(|| tokio::spawn(seed::lease_churn(sim.clone())));
        tracing::info!(%addr, objects = opts.objects, tls = opts.tls.is_some(), "simulated apiserver listening");
        Ok(SimHandle { addr, sim, stop, server: Some(server), churn, leases })
    }

    /// Restarts the apiserver process while its storage (etcd) lives on, as a kube-apiserver
    /// rollout does: every connection and watch ends, nothing is served for `down`, then it
    /// listens again on the same address. Its watch caches are new, listed at the current
    /// revision: a watch of a cached kind from an older RV answers 410 (what makes informers
    /// relist after an apiserver restart, kubernetes/kubernetes#129194); etcd watches (uncached
    /// kinds), LISTs and Exact reads are unaffected.
    pub async fn restart(self, down: Duration) -> std::io::Result<SimHandle> {
        let (addr, sim) = (self.addr, self.sim.clone());
        self.shutdown().await;
        SimHandle::back(addr, sim, down).await
    }

    /// The cluster's etcd restored from a backup taken at revision `at` **without**
    /// `--bump-revision`, the apiserver stopped for it and started again after `down` (the
    /// documented order): the objects as they were at `at`, and the revisions after `at` issued
    /// again, for other changes. A client that resumes from an RV it got before names a state
    /// that no longer exists; the apiserver cannot tell (a watch from an RV not reached yet
    /// waits for it, as the real one's does). What `etcdutl snapshot restore --bump-revision
    /// --mark-compacted` is for. Errs when `at` is compacted away or in the future.
    pub async fn restore(self, at: Rv, down: Duration) -> std::io::Result<SimHandle> {
        let (addr, sim) = (self.addr, self.sim.clone());
        self.shutdown().await;
        sim.store().restore_to(at).map_err(|c| {
            std::io::Error::other(format!("no backup at {at}: compacted at {c} or not reached"))
        })?;
        SimHandle::back(addr, sim, down).await
    }

    /// Listens again on `addr` after `down`, with watch caches listed at the current revision.
    async fn back(addr: SocketAddr, sim: Sim, down: Duration) -> std::io::Result<SimHandle> {
        tokio::time::sleep(down).await;
        // The new watch caches list when the process is back.
        *sim.inner.restarted_at.lock() = sim.current_rv();
        // The port was just released; a few tries cover a slow close.
        let mut tries = 0;
        let listener = loop {
            match kube_watchcache::server::listener::bind(addr).await {
                Ok(l) => break l,
                Err(e) if tries >= 50 => return Err(e),
                Err(_) => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        };
        SimHandle::serve(listener, sim)
    }

    /// Stops accepting, closes every connection and waits for the listener task.
    pub async fn shutdown(mut self) {
        self.stop.send_replace(true);
        for t in [self.churn.take(), self.leases.take()].into_iter().flatten() {
            t.abort();
        }
        if let Some(s) = self.server.take() {
            let _ = s.await;
        }
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        self.stop.send_replace(true);
        for t in [self.server.take(), self.churn.take(), self.leases.take()].into_iter().flatten() {
            t.abort();
        }
    }
}
