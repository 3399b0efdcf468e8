//! Wiring only: builds the upstream client, discovers the cached resources, creates one cache
//! and one reflector per resource, and serves; on shutdown, stops in the order of STYLE habit 9
//! (not ready → stop accepting → end watches → drain). Also small helpers the binary's other
//! subcommands share (signals, stdout, the open-files limit).
//!
//! Called by the binary (`crates/cli`: its serve subcommand; demo and the harness through
//! `start`), and by integration tests through `start`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::cache::{CacheOptions, Reader};
use crate::caches::{self, Caching};
use crate::config::{SecurityArgs, ServeArgs};
use crate::consistency;
use crate::memory;
use crate::metrics::Metrics;
use crate::reflector::ReflectorOptions;
use crate::server::auth::{Auth, AuthOptions, AuthnOptions, AuthzOptions};
use crate::server::limits::LimitOptions;
use crate::server::serve::ServeOptions;
use crate::server::tls::{self, TlsFiles};
use crate::server::Server;
use crate::server::{listener, Security};
use crate::state::{self, Loaded, Saver, StateOptions, Warm};
use crate::upstream::Upstream;
use crate::wanted::Wanted;

/// A running proxy.
/// The longest reading `--state-dir` at start, or saving to it at shutdown, may take (a hung
/// mount): 30 s, within the default `--shutdown-grace-period` and a startup probe's patience.
const STATE_IO_LIMIT: Duration = Duration::from_secs(30);

pub struct Running {
    /// Where it listens.
    pub addr: SocketAddr,
    /// The caches started and not retired (a retired or dropped one is let go with its reader).
    caching: Caching,
    /// Turns `/readyz` to 500 (the first step of a shutdown).
    unready: watch::Sender<bool>,
    /// `--shutdown-delay-duration`: ready no more, yet still serving everything.
    shutdown_delay: Duration,
    shutdown: watch::Sender<bool>,
    /// Stops the listener (first); it answers on `told` once no connection reads a request.
    stop_serving: watch::Sender<bool>,
    told: watch::Receiver<bool>,
    server_task: JoinHandle<()>,
    reflectors: Arc<parking_lot::Mutex<Vec<JoinHandle<()>>>>,
    /// `--state-dir`: what writes the state.
    saver: Option<Arc<Saver>>,
}

impl Running {
    /// The caches now (those started since, by discovery retries, included).
    pub fn readers(&self) -> Vec<Reader> {
        self.caching.readers()
    }

    /// Waits until every cache has synced, at most `timeout`.
    pub async fn wait_ready(&self, timeout: Duration) -> bool {
        let all = async {
            for r in &self.readers() {
                let mut rx = r.subscribe();
                let _ = rx.wait_for(|p| p.ready).await;
            }
        };
        tokio::time::timeout(timeout, all).await.is_ok()
    }

    /// Stops: not ready, wait `--shutdown-delay-duration`, stop accepting, end watches (HTTP/2
    /// GOAWAY), drain within the grace period.
    pub async fn shutdown(self) {
        self.unready.send_replace(true);
        if !self.shutdown_delay.is_zero() {
            tracing::info!(delay = ?self.shutdown_delay, "not ready; still serving until the shutdown delay ends");
            tokio::time::sleep(self.shutdown_delay).await;
        }
        tracing::info!("no new connections, ending watches, draining");
        // Stop accepting and tell every connection to finish before the watches end: a client
        // whose watch ends finds its connection closing (then the port refused), as at a
        // stopping kube-apiserver, and retries its watch rather than relisting on a 503.
        let _ = self.stop_serving.send(true);
        let mut told = self.told.clone();
        let _ = tokio::time::timeout(Duration::from_secs(2), crate::shutdown::until_true(&mut told)).await;
        let _ = self.shutdown.send(true);
        let reflectors = std::mem::take(&mut *self.reflectors.lock());
        for r in reflectors {
            let _ = r.await;
        }
        // The reflectors stopped and ended every watch: the caches no longer change.
        if let Some(saver) = &self.saver {
            // Bounded: a hung mount (NFS, a stuck hostPath) must not hold the shutdown past the
            // grace period; the files are written whole or not at all (`write_atomic`).
            let (readers, dropped) = (self.caching.readers(), self.caching.dropped_kinds());
            if tokio::time::timeout(STATE_IO_LIMIT, saver.save_all(&readers, &dropped)).await.is_err() {
                tracing::warn!(limit = ?STATE_IO_LIMIT, "shutdown: saving the caches to --state-dir took too long; given up");
            }
        }
        let _ = self.server_task.await;
    }

    /// Waits for SIGTERM or Ctrl-C on `signals`, then shuts down; a second signal exits at
    /// once (status 1, like kube-apiserver). One listener serves both waits: a signal that
    /// arrives while the shutdown starts is not lost between two listeners.
    pub async fn run_until_signal(self, mut signals: Signals) {
        signals.recv().await;
        tracing::info!("shutting down (a second SIGTERM or Ctrl-C exits at once)");
        tokio::select! {
            _ = self.shutdown() => {}
            _ = signals.recv() => {
                tracing::warn!("second signal received, exiting at once");
                std::process::exit(1);
            }
        }
    }
}

/// SIGTERM and SIGINT (Ctrl-C), listened to from creation on.
pub struct Signals {
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    int: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    pub fn new() -> Signals {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Signals { term: signal(SignalKind::terminate()).ok(), int: signal(SignalKind::interrupt()).ok() }
        }
        #[cfg(not(unix))]
        {
            Signals {}
        }
    }

    /// The next signal (since creation, or since the previous one).
    pub async fn recv(&mut self) {
        #[cfg(unix)]
        {
            async fn next(s: &mut Option<tokio::signal::unix::Signal>) {
                match s {
                    Some(s) => {
                        s.recv().await;
                    }
                    None => std::future::pending().await,
                }
            }
            if self.term.is_none() && self.int.is_none() {
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
            tokio::select! {
                _ = next(&mut self.term) => {},
                _ = next(&mut self.int) => {},
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

impl Default for Signals {
    fn default() -> Self {
        Signals::new()
    }
}

/// Waits for SIGTERM or Ctrl-C (one wait; see `Signals` for more).
pub async fn wait_for_signal() {
    Signals::new().recv().await;
}

/// Starts the proxy described by validated `args`. Errors are one line, for the CLI.
pub async fn start(args: &ServeArgs) -> Result<Running, String> {
    let upstream = Upstream::new(&args.upstream.options()).map_err(|e| e.to_string())?;
    tracing::info!(upstream = %upstream.describe(), "upstream configured");
    let metrics = Arc::new(Metrics::new());
    upstream.observe(metrics.clone());
    let wanted = Wanted::parse(&args.resources)?;
    // Saved states are read before the first upstream request.
    let state_opts = state_options(args)?;
    let memory_limit = match args.cache_memory_limit.resolve() {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, "--cache-memory-limit: running without a limit");
            None
        }
    };
    let loaded = match &state_opts {
        Some(o) => {
            metrics.state_enabled(state::LOAD_RESULTS);
            let o = o.clone();
            let given_up = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let stop = given_up.clone();
            let read = tokio::task::spawn_blocking(move || Loaded::read_until(&o, memory_limit, &stop));
            // Bounded: on a slow or hung mount the proxy starts cold rather than never (its
            // listener not bound, no /livez, nothing said); the read stops at its next file,
            // and the caches are still saved (a review: no Saver was made).
            match tokio::time::timeout(STATE_IO_LIMIT, read).await {
                Ok(r) => Some(r.map_err(|e| e.to_string())?),
                Err(_) => {
                    given_up.store(true, std::sync::atomic::Ordering::Relaxed);
                    tracing::warn!(limit = ?STATE_IO_LIMIT, "reading --state-dir took too long; starting cold");
                    Some(Loaded { files: Vec::new(), written: Default::default() })
                }
            }
        }
        None => None,
    };
    let discovered = caches::discover_wanted(&upstream, &wanted).await?;
    // Protobuf answers are the upstream's version's encoding (fields added since are not
    // written); unknown (no /version): the newest.
    let version = upstream.get_json("/version").await.ok();
    let version = version.and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
    let upstream_minor = version.as_ref().and_then(crate::proto::minor_of_version);
    // Feature-gate defaults follow the version the apiserver emulates (`--emulated-version`,
    // 1.31+), which may be below its binary's.
    let gates_minor = version.as_ref().and_then(crate::proto::gates_minor_of_version);
    let protobuf_unproven = match upstream_minor {
        Some(minor) if crate::proto::provable(Some(minor)) => {
            tracing::info!(minor, "upstream Kubernetes minor version (protobuf encoding)");
            false
        }
        Some(minor) => {
            tracing::warn!(
                minor,
                schema = crate::proto::SCHEMA_MINOR,
                "the upstream is newer than the protobuf schema: protobuf reads are forwarded"
            );
            true
        }
        None => {
            tracing::warn!("upstream /version gave no minor version: protobuf reads are forwarded");
            true
        }
    };
    let tls = match (&args.insecure_listen, &args.tls_cert_file, &args.tls_private_key_file) {
        (None, Some(cert), Some(key)) => Some(tls::server_config(&TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: args.security.client_ca_file.clone(),
            reload_interval: args.security.tls_reload_interval,
        })?),
        _ => None,
    };
    let addr = args.insecure_listen.unwrap_or(SocketAddr::new(args.bind_address, args.secure_port));
    let tcp = listener::bind(addr).await.map_err(|e| format!("listen on {addr}: {e}"))?;
    let addr = tcp.local_addr().map_err(|e| e.to_string())?;

    let (shutdown, shutdown_rx) = watch::channel(false);
    let (unready, unready_rx) = watch::channel(false);
    let memory_budget = memory_limit.map(|l| Arc::new(crate::cache::Budget::new(l)));
    let cache_opts = CacheOptions {
        history_window: args.history_window,
        history_max_events: args.history_max_events,
        upstream_minor,
        protobuf_unproven,
        delivery_lag: metrics.delivery_lag(),
        memory: memory_budget.clone(),
        ..CacheOptions::default()
    };
    let caching = Caching::new(
        upstream.clone(),
        cache_opts,
        metrics.clone(),
        shutdown_rx.clone(),
        ReflectorOptions {
            watch_idle_timeout: args.upstream_watch_idle_timeout,
            max_staleness: args.max_staleness,
            ..ReflectorOptions::default()
        },
        wanted.clone(),
    );
    let mut warm_start = false;
    let mut warm_states = None;
    let (caching, saver) = match (state_opts, loaded) {
        (Some(opts), Some(loaded)) => {
            // Asked again on 429 / 5xx / no answer (`state::checked`), within 30 s in all
            // (the start waits for it; without it every saved state is given up).
            let identity =
                match tokio::time::timeout(Duration::from_secs(30), state::identity(&upstream)).await {
                    Ok(r) => r,
                    Err(_) => Err("no answer within 30s".to_owned()),
                };
            if let Err(e) = &identity {
                tracing::warn!(error = %e, "the upstream cluster's identity is unknown: no saved state is used");
            }
            let dir = opts.dir.clone();
            let warm = Arc::new(Warm::new(loaded, &identity, &metrics).in_dir(dir.clone()));
            let saver = Arc::new(Saver::new(opts, upstream.clone(), metrics.clone(), identity.ok()));
            warm_start = !warm.is_empty();
            warm_states = Some((warm.clone(), dir));
            let caching = caching.with_warm(warm);
            let c = caching.clone();
            tokio::spawn(saver.clone().run(move || (c.readers(), c.dropped_kinds()), shutdown_rx.clone()));
            (caching, Some(saver))
        }
        _ => (caching, None),
    };
    let readers: Vec<Reader> =
        discovered.found.iter().filter(|f| !f.2).map(|(name, k, _)| caching.spawn(name, k.clone())).collect();
    let serve_opts = ServeOptions {
        freshness_wait: args.freshness_wait,
        min_request_timeout: args.min_request_timeout,
        consistent_reads: args.consistent_reads == "cache",
        consistent_wait: args.consistent_read_wait,
        max_staleness: args.max_staleness,
    };
    let security = security(&args.security, &upstream, addr, &metrics, gates_minor)?;
    let tls = tls.map(|(cfg, reloader)| {
        let interval = args.security.tls_reload_interval;
        let client_ca = reloader.client_ca.clone();
        tokio::spawn(tls::watch_files(reloader, interval, shutdown_rx.clone(), metrics.clone()));
        (cfg, client_ca)
    });
    let server = Arc::new(Server::new(readers, upstream, serve_opts, metrics, unready_rx, security));
    for (name, kind, _) in discovered.found.into_iter().filter(|f| f.2) {
        caching.spawn_wild(&name, kind, &server.catalog());
    }
    // Every cache of the start took its state: what is left is not used later.
    if let Some((warm, dir)) = warm_states {
        warm.drop_untaken(&caching.metrics, &dir);
    }
    server.resources().set_skipped(discovered.skipped);
    if wanted.all {
        server.resources().rediscover_on_miss(caching.rediscover.clone(), caching.wanted.clone());
    }
    for (name, m) in discovered.missing {
        server.resources().set_missing(&name, m);
        if name == "*" {
            tokio::spawn(caching.clone().retry_wildcard(server.catalog()));
        } else {
            tokio::spawn(caching.clone().retry_discovery(name, server.catalog()));
        }
    }
    caching.report(server.resources());
    let c = caching.clone();
    tokio::spawn(consistency::run(
        caching.upstream.clone(),
        move || c.readers(),
        args.consistency_check_period,
        warm_start,
        caching.metrics.clone(),
        shutdown_rx.clone(),
    ));
    tokio::spawn(caching.clone().rediscover_loop(args.rediscovery_interval, server.catalog()));
    if let Some(budget) = memory_budget {
        let period = args.cache_memory_check_period;
        tokio::spawn(memory::run(caching.clone(), server.catalog(), budget, period, shutdown_rx.clone()));
    }
    let conn_opts = crate::server::conn::ConnOptions {
        read_header_timeout: args.read_header_timeout,
        idle_timeout: args.idle_timeout,
        h2_keepalive_interval: (!args.http2_keepalive_interval.is_zero())
            .then_some(args.http2_keepalive_interval),
        h2_keepalive_timeout: args.http2_keepalive_timeout,
        goaway_chance: args.goaway_chance,
        max_connections: max_connections(args.max_connections),
        write_stall: args.security.write_stall_timeout,
    };
    let (stop_serving, stop_serving_rx) = watch::channel(false);
    let (told_tx, told) = watch::channel(false);
    let server_task = tokio::spawn(listener::run(
        tcp,
        tls,
        server,
        stop_serving_rx,
        told_tx,
        args.shutdown_grace_period,
        conn_opts,
    ));
    tracing::info!(%addr, tls = args.insecure_listen.is_none(), auth = %args.security.auth, "serving");
    Ok(Running {
        addr,
        unready,
        shutdown_delay: args.shutdown_delay_duration,
        shutdown,
        stop_serving,
        told,
        server_task,
        reflectors: caching.reflectors.clone(),
        caching,
        saver,
    })
}

/// `--state-dir` and its companions, or `None` when warm restarts are off.
fn state_options(args: &ServeArgs) -> Result<Option<StateOptions>, String> {
    let Some(dir) = &args.state_dir else { return Ok(None) };
    let resources =
        Wanted::parse(&args.state_resources).map_err(|e| e.replace("--resources", "--state-resources"))?;
    Ok(Some(StateOptions { dir: dir.clone(), sync_period: args.state_sync_period, resources }))
}

/// The server's authentication, authorization and limits from the flags.
fn security(
    args: &SecurityArgs,
    upstream: &Upstream,
    addr: SocketAddr,
    metrics: &Arc<Metrics>,
    upstream_minor: Option<u32>,
) -> Result<Security, String> {
    let constrained_impersonation = args.feature_gates.constrained_impersonation(upstream_minor);
    if !args.feature_gates.ignored.is_empty() {
        tracing::info!(gates = ?args.feature_gates.ignored, "--feature-gates: gates this proxy does not read, ignored");
    }
    if args.enabled() {
        tracing::info!(
            constrained_impersonation,
            "impersonation modes (--feature-gates=ConstrainedImpersonation)"
        );
    }
    let auth = if args.enabled() {
        Some(Auth::new(
            upstream.clone(),
            AuthOptions {
                anonymous: args.anonymous_auth,
                authn: AuthnOptions {
                    success_ttl: args.authentication_cache_ttl,
                    failure_ttl: args.authentication_failure_cache_ttl,
                    capacity: args.auth_cache_size,
                    review_qps: args.authentication_token_review_qps,
                    review_burst: args.authentication_token_review_burst,
                    max_token_bytes: args.authentication_token_max_length,
                },
                authz: AuthzOptions {
                    allowed_ttl: args.authorization_allowed_cache_ttl,
                    denied_ttl: args.authorization_denied_cache_ttl,
                    capacity: args.auth_cache_size,
                    review_qps: args.authorization_review_qps,
                    review_burst: args.authorization_review_burst,
                },
                constrained_impersonation,
            },
            metrics.clone(),
        ))
    } else {
        tracing::warn!(
            %addr,
            "--auth=none: NO AUTHENTICATION AND NO AUTHORIZATION. Anyone who can reach this loopback \
             listener reads every cached object. Only for a trusted sidecar."
        );
        None
    };
    Ok(Security {
        auth,
        limits: LimitOptions {
            max_url_bytes: args.max_url_bytes,
            max_header_bytes: args.max_header_bytes,
            max_in_flight: args.max_requests_inflight,
            max_in_flight_per_user: args.in_flight_per_user(),
            write_stall_timeout: args.write_stall_timeout,
            max_watches_per_user: args.max_watches_per_user,
            request_timeout: args.request_timeout,
        },
        // The browser guard of --auth=none (a bad pattern stops the start, naming its flag).
        loopback: if args.enabled() {
            None
        } else {
            Some(crate::server::loopback::LoopbackGuard::new(
                &args.accept_hosts,
                &args.reject_paths,
                &args.reject_methods,
                &args.accept_origins,
            )?)
        },
        trusted_headers: crate::server::proxy::TrustedHeaders::new(
            &[
                args.requestheader_username_headers.clone(),
                args.requestheader_group_headers.clone(),
                args.requestheader_uid_headers.clone(),
            ]
            .concat(),
            &args.requestheader_extra_headers_prefix,
        ),
    })
}

/// `--max-connections`, or with `0` the open-files limit less a reserve (an eighth of it, 256
/// to 8 192) for what the proxy opens itself — upstream connections, upgraded sessions'
/// upstream sides, state files — which a flood of client connections must not leave without
/// a descriptor.
fn max_connections(flag: usize) -> usize {
    if flag > 0 {
        return flag;
    }
    let soft = crate::rlimit::nofile().min(usize::MAX as u64) as usize;
    let reserve = (soft / 8).clamp(256, 8192);
    let max = soft.saturating_sub(reserve).max(1);
    tracing::info!(max, open_files = soft, "client connections bounded by the open-files limit");
    max
}

/// Every watch is a socket: start with the soft open-files limit at the hard one.
pub fn raise_open_files() {
    let (soft, hard) = crate::rlimit::raise_nofile();
    tracing::info!(soft, hard, "open files limit");
}

/// `kube-watchcache serve`.
pub async fn serve(args: ServeArgs) -> Result<(), String> {
    tracing::info!(version = env!("CARGO_PKG_VERSION"), config = %args.effective(), "kube-watchcache serve starting");
    raise_open_files();
    // Listened to before the start: a SIGTERM that comes once the start is done (its
    // "serving" line is its last step) is the graceful shutdown's, not the default action's;
    // one that comes while it starts (which may wait on an upstream that does not answer for a
    // minute or more) ends it at once, as the default action did.
    let mut signals = Signals::new();
    let running = tokio::select! {
        biased;
        r = start(&args) => r?,
        _ = signals.recv() => return Err("interrupted while starting".into()),
    };
    running.run_until_signal(signals).await;
    Ok(())
}

/// Prints a line to stdout; a closed stdout (`| head`) is not an error worth a panic.
pub fn say(text: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout().lock(), "{text}");
}
