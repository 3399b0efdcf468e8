//! The flags of `serve` (kube-apiserver style) and the optional config file, turned into a
//! validated configuration, and the duration parser every subcommand's flags use. Assembled
//! into the command line by the binary (`crates/cli`); the result goes to `app`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, FromArgMatches};
use serde::Deserialize;

use crate::upstream::UpstreamOptions;

/// Where the upstream apiserver is and how to authenticate to it.
#[derive(Debug, Args, Clone)]
pub struct UpstreamArgs {
    /// Path to a kubeconfig file. Default: $KUBECONFIG (a list of files separated by `:`, merged
    /// like kubectl: the first file to set a value wins), then ~/.kube/config, then the
    /// in-cluster service account.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: the current context).
    #[arg(long)]
    pub context: Option<String>,
    /// URL of the upstream apiserver, instead of a kubeconfig (e.g. https://10.0.0.1:6443).
    #[arg(long)]
    pub upstream: Option<String>,
    /// File with a bearer token for the upstream (re-read every minute).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Client certificate file for TLS authentication to the upstream.
    #[arg(long)]
    pub client_certificate: Option<PathBuf>,
    /// Client key file for TLS authentication to the upstream.
    #[arg(long)]
    pub client_key: Option<PathBuf>,
    /// CA bundle to verify the upstream's serving certificate.
    #[arg(long)]
    pub certificate_authority: Option<PathBuf>,
    /// Do not verify the upstream's serving certificate. Insecure; for tests only.
    #[arg(long, num_args = 0..=1, require_equals = true, default_value = "false",
          default_missing_value = "true", value_parser = parse_bool_flag)]
    pub insecure_skip_tls_verify: bool,
    /// Requests open at once on one HTTP/2 connection to the upstream; past it another
    /// connection is opened. Keep it below the upstream's --http2-max-streams-per-connection
    /// (kube-apiserver's default: 100): a request past the upstream's limit waits for another
    /// request's stream to end, and a watch's lasts minutes.
    #[arg(long, default_value_t = crate::upstream::DEFAULT_STREAMS_PER_CONNECTION,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new()
              .range(1..=crate::upstream::MAX_STREAMS_PER_CONNECTION as u64))]
    pub upstream_max_streams_per_connection: usize,
}

impl UpstreamArgs {
    pub fn options(&self) -> UpstreamOptions {
        UpstreamOptions {
            upstream: self.upstream.clone(),
            kubeconfig: self.kubeconfig.clone(),
            context: self.context.clone(),
            token_file: self.token_file.clone(),
            client_certificate: self.client_certificate.clone(),
            client_key: self.client_key.clone(),
            certificate_authority: self.certificate_authority.clone(),
            insecure_skip_tls_verify: self.insecure_skip_tls_verify,
            max_streams_per_connection: self.upstream_max_streams_per_connection,
        }
    }
}

/// Flags of `serve`.
#[derive(Debug, Args, Clone)]
pub struct ServeArgs {
    #[command(flatten)]
    pub upstream: UpstreamArgs,
    /// Resources to cache, comma separated, as `resource` (core group), `group/resource` or
    /// `resource.group` (kubectl's form): e.g. `pods,nodes,apps/deployments,widgets.example.com`.
    /// `*` caches everything listable, `-resource` excludes after it. The version is found by
    /// discovery. Everything else is forwarded.
    #[arg(long, value_delimiter = ',', env = "WATCHCACHE_RESOURCES")]
    pub resources: Vec<String>,
    /// YAML config file (see config/watchcache.yaml); flags given on the command line win.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The IP address on which to serve TLS (with --secure-port).
    #[arg(long, default_value = "0.0.0.0")]
    pub bind_address: std::net::IpAddr,
    /// The port on which to serve HTTPS; needs --tls-cert-file and --tls-private-key-file.
    #[arg(long, default_value_t = 8443)]
    pub secure_port: u16,
    /// File containing the serving certificate (PEM, leaf first).
    #[arg(long)]
    pub tls_cert_file: Option<PathBuf>,
    /// File containing the serving private key (PEM).
    #[arg(long)]
    pub tls_private_key_file: Option<PathBuf>,
    /// Serve plain HTTP on this loopback address instead of TLS (e.g. 127.0.0.1:8001).
    /// Refused on a non-loopback address.
    #[arg(long)]
    pub insecure_listen: Option<SocketAddr>,
    /// How long events stay in each resource's history (watches may resume that far back).
    #[arg(long, default_value = "75s", value_parser = parse_duration)]
    pub history_window: Duration,
    /// At most this many events per resource's history.
    #[arg(long, default_value_t = 102_400)]
    pub history_max_events: usize,
    /// Bytes the caches may keep together: a quantity (`512Mi`, `2Gi`) or a share of the
    /// container's memory limit (`60%`). Past it, histories are shortened, then the largest
    /// caches dropped (their requests forwarded). Unset: no limit.
    #[arg(long, default_value = "", value_parser = crate::memory::limit::parse)]
    pub cache_memory_limit: crate::memory::limit::Limit,
    /// How often the caches' memory is measured against `--cache-memory-limit` (also at once
    /// after every full list).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub cache_memory_check_period: Duration,
    /// Watches without timeoutSeconds end after this × a random factor in [1, 2).
    #[arg(long, default_value = "30m", value_parser = parse_duration)]
    pub min_request_timeout: Duration,
    /// How long a NotOlderThan read waits for the cache before going upstream.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub freshness_wait: Duration,
    /// Most Recent reads (resourceVersion unset): `cache` serves LISTs from the cache when an
    /// upstream probe or a metadata-only upstream LIST proves it fresh (else forwards them at
    /// once) and watches always from the cache; `upstream` always forwards them.
    #[arg(long, default_value = "cache", value_parser = ["cache", "upstream"])]
    pub consistent_reads: String,
    /// How long a Most Recent LIST may wait for the cache to reach the probed upstream RV
    /// before it is forwarded (0: never wait).
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub consistent_read_wait: Duration,
    /// On SIGTERM, how long in-flight requests may take to finish.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub shutdown_grace_period: Duration,
    /// A connection on which no request started within this time of its accept is closed,
    /// and a request head must be read within it (kube-apiserver's ReadHeaderTimeout).
    #[arg(long, default_value = "32s", value_parser = parse_duration)]
    pub read_header_timeout: Duration,
    /// A connection with no request in flight (HTTP/1.1 keep-alive, HTTP/2 without streams) for
    /// this long is closed (kube-apiserver's IdleTimeout). An open watch keeps it busy.
    #[arg(long, default_value = "90s", value_parser = parse_duration)]
    pub idle_timeout: Duration,
    /// Client connections open at once; past it new ones wait in the accept queue. 0: the
    /// open-files limit less a reserve for the proxy's own connections and files.
    #[arg(long, default_value_t = 0)]
    pub max_connections: usize,
    /// HTTP/2 connections are pinged this often (0: never)...
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub http2_keepalive_interval: Duration,
    /// ...and closed when a ping is not answered within this time.
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    pub http2_keepalive_timeout: Duration,
    /// The fraction of HTTP/2 requests after which the connection is sent GOAWAY, so that
    /// long-lived clients reconnect through the load balancer and spread over the replicas
    /// (kube-apiserver's flag). 0 (off) to 0.02; 0.001 is a starting point. Not for a single
    /// replica or a sidecar.
    #[arg(long, default_value_t = 0.0)]
    pub goaway_chance: f64,
    /// A cache with no proof of being current (an event, a bookmark, a list, an upstream watch
    /// that started) for longer than this has its reads forwarded; /readyz fails only when
    /// every synced cache is so (the upstream is away). Shorter upstream outages keep being
    /// served from the cache. 0 disables. Upstream bookmarks arrive about every 60 s on a quiet
    /// resource, hence the margin.
    #[arg(long, default_value = "3m", value_parser = parse_duration)]
    pub max_staleness: Duration,
    /// How often the cached resources are looked up again in the upstream's discovery, so that
    /// a CRD that changes its served version or is deleted is followed (also right after a
    /// reflector gets 404). 0: only after a 404.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub rediscovery_interval: Duration,
    /// An upstream watch that delivers nothing (no event, no bookmark) for this long is
    /// renewed from the cache RV: a partitioned connection can stall without ever closing.
    #[arg(long, default_value = "150s", value_parser = parse_duration)]
    pub upstream_watch_idle_timeout: Duration,
    /// On SIGTERM, how long /readyz answers 500 while everything is still served, before the
    /// listener stops accepting (as kube-apiserver's flag: time for Services and load balancers
    /// to stop sending traffic).
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub shutdown_delay_duration: Duration,
    /// How often each cache is compared with the upstream at the same resourceVersion (a
    /// metadata-only LIST at `resourceVersionMatch=Exact`, jittered, with backoff; also once
    /// after a warm start). A cache that differs is relisted, its reads forwarded meanwhile.
    /// 0: never.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub consistency_check_period: Duration,
    /// Warm restarts: keep each cached resource's objects, history and RV in this directory
    /// (written every --state-sync-period and at shutdown; read at start, checked against the
    /// upstream). The files hold API objects in the clear, like an unencrypted etcd. Off when
    /// unset.
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// How often the state is written to --state-dir while running (a crash loses at most
    /// this much; 0: only at shutdown).
    #[arg(long, default_value = "1m", value_parser = parse_duration)]
    pub state_sync_period: Duration,
    /// Which cached resources are written to --state-dir, as --resources (`*` with
    /// exclusions, or names). Secrets are not written unless named here.
    #[arg(long, value_delimiter = ',', default_value = "*,-secrets")]
    pub state_resources: Vec<String>,
    #[command(flatten)]
    pub security: SecurityArgs,
    /// Which of the flags the config file may also set were given explicitly (filled from the
    /// parser's value sources by [`ServeArgs::from_flags`] and `cli::Cli::try_parse_args`): those win over the file.
    #[arg(skip)]
    pub explicit: ExplicitFlags,
}

/// Flags given on the command line or through their environment variable, as opposed to
/// their defaults.
impl ServeArgs {
    /// The effective configuration for the startup log: every setting, file paths included,
    /// never a secret (no token or key is held here; an upstream URL loses any `user:password@`).
    pub fn effective(&self) -> serde_json::Value {
        let d = |d: Duration| format!("{d:?}");
        let p = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
        let u = &self.upstream;
        let s = &self.security;
        let mut v = serde_json::json!({
            "upstream": u.upstream.as_deref().map(crate::upstream::hide_userinfo),
            "kubeconfig": p(&u.kubeconfig),
            "context": u.context,
            "tokenFile": p(&u.token_file),
            "clientCertificate": p(&u.client_certificate),
            "clientKey": p(&u.client_key),
            "certificateAuthority": p(&u.certificate_authority),
            "insecureSkipTlsVerify": u.insecure_skip_tls_verify,
            "resources": self.resources,
            "config": p(&self.config),
            "bindAddress": self.bind_address.to_string(),
            "securePort": self.secure_port,
            "tlsCertFile": p(&self.tls_cert_file),
            "tlsPrivateKeyFile": p(&self.tls_private_key_file),
            "insecureListen": self.insecure_listen.map(|a| a.to_string()),
            "historyWindow": d(self.history_window),
            "historyMaxEvents": self.history_max_events,
            "cacheMemoryLimit": format!("{:?}", self.cache_memory_limit),
            "cacheMemoryCheckPeriod": d(self.cache_memory_check_period),
            "minRequestTimeout": d(self.min_request_timeout),
            "freshnessWait": d(self.freshness_wait),
            "consistentReads": self.consistent_reads,
            "consistentReadWait": d(self.consistent_read_wait),
            "maxStaleness": d(self.max_staleness),
            "upstreamWatchIdleTimeout": d(self.upstream_watch_idle_timeout),
            "shutdownDelayDuration": d(self.shutdown_delay_duration),
            "shutdownGracePeriod": d(self.shutdown_grace_period),
            "auth": s.auth,
            "clientCaFile": p(&s.client_ca_file),
            "anonymousAuth": s.anonymous_auth,
            "authenticationCacheTtl": d(s.authentication_cache_ttl),
            "authenticationFailureCacheTtl": d(s.authentication_failure_cache_ttl),
            "authorizationAllowedCacheTtl": d(s.authorization_allowed_cache_ttl),
            "authorizationDeniedCacheTtl": d(s.authorization_denied_cache_ttl),
            "authCacheSize": s.auth_cache_size,
            "tlsReloadInterval": d(s.tls_reload_interval),
            "maxRequestsInflight": s.max_requests_inflight,
            "maxWatchesPerUser": s.max_watches_per_user,
            "maxUrlBytes": s.max_url_bytes,
            "maxHeaderBytes": s.max_header_bytes,
            "requestTimeout": d(s.request_timeout),
        });
        // Apart: one `json!` of every field passes the macro's recursion limit.
        for (k, x) in [
            ("maxRequestsInflightPerUser", serde_json::json!(s.in_flight_per_user())),
            ("writeStallTimeout", d(s.write_stall_timeout).into()),
            ("authenticationTokenMaxLength", s.authentication_token_max_length.into()),
            ("authorizationReviewQps", s.authorization_review_qps.into()),
            ("authorizationReviewBurst", s.authorization_review_burst.into()),
            ("consistencyCheckPeriod", d(self.consistency_check_period).into()),
            ("stateDir", p(&self.state_dir).into()),
            ("stateSyncPeriod", d(self.state_sync_period).into()),
            ("stateResources", serde_json::json!(self.state_resources)),
            ("upstreamMaxStreamsPerConnection", u.upstream_max_streams_per_connection.into()),
            ("maxConnections", self.max_connections.into()),
            (
                "featureGates",
                serde_json::json!({ "ConstrainedImpersonation": s.feature_gates.constrained_impersonation }),
            ),
        ] {
            v[k] = x;
        }
        v
    }
}

#[derive(Clone, Debug, Default)]
pub struct ExplicitFlags {
    pub history_window: bool,
    pub history_max_events: bool,
}

/// Which of `m`'s file-overridable flags were given on the command line or by environment.
pub fn explicit_flags(m: &ArgMatches) -> ExplicitFlags {
    ExplicitFlags {
        history_window: explicit(m, "history_window"),
        history_max_events: explicit(m, "history_max_events"),
    }
}

fn explicit(m: &ArgMatches, id: &str) -> bool {
    matches!(m.value_source(id), Some(ValueSource::CommandLine | ValueSource::EnvVariable))
}

/// Boolean flag values as Go's `strconv.ParseBool` (kube-apiserver's flags): `1 t T TRUE true
/// True` and `0 f F FALSE false False`.
pub fn parse_bool_flag(s: &str) -> Result<bool, String> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(format!("invalid boolean {s:?}: use true or false")),
    }
}

/// kubectl proxy's `--accept-hosts` default (`server::loopback`).
pub const ACCEPT_HOSTS: &str = r"^localhost$,^127\.0\.0\.1$,^\[::1\]$";
/// kubectl proxy's `--reject-paths` default.
pub const REJECT_PATHS: &str = r"^/api/.*/pods/.*/exec,^/api/.*/pods/.*/attach";
/// kubectl proxy's `--reject-methods` default (matches no method).
pub const REJECT_METHODS: &str = "^$";

/// Authentication, authorization, TLS reload and limits of `serve`.
#[derive(Debug, Args, Clone)]
pub struct SecurityArgs {
    /// `upstream`: every caller is authenticated (client certificate, or bearer token by
    /// TokenReview) and every read served from the cache is authorized (SubjectAccessReview),
    /// both on the upstream. `none`: no checks at all, forwarded requests go as the proxy itself
    /// (its credentials replace the caller's, like `kubectl proxy`) — only for a trusted sidecar
    /// on a loopback listener (refused elsewhere).
    #[arg(long, default_value = "upstream", value_parser = ["upstream", "none"])]
    pub auth: String,
    /// CA bundle (PEM) that signs client certificates; their CommonName is the user, their
    /// Organizations the groups. Without it, client certificates are not asked for.
    #[arg(long)]
    pub client_ca_file: Option<PathBuf>,
    /// Requests without credentials act as `system:anonymous` (group
    /// `system:unauthenticated`) instead of getting 401. `--anonymous-auth=false` is accepted.
    #[arg(long, num_args = 0..=1, require_equals = true, default_value = "false",
          default_missing_value = "true", value_parser = parse_bool_flag)]
    pub anonymous_auth: bool,
    /// How long a successful TokenReview is cached. Also spelt as the kube components' delegated
    /// authentication flag, `--authentication-token-webhook-cache-ttl`.
    #[arg(long, default_value = "2m", value_parser = parse_duration, alias = "authentication-token-webhook-cache-ttl")]
    pub authentication_cache_ttl: Duration,
    /// How long a rejected token is cached.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub authentication_failure_cache_ttl: Duration,
    /// TokenReviews sent upstream per second at most (tokens not cached yet); past it callers
    /// get 429. 0 = unbounded.
    #[arg(long, default_value_t = 50.0)]
    pub authentication_token_review_qps: f64,
    /// TokenReviews sent at once above the rate. Each source address (an IPv6 /64) may use a
    /// quarter of the rate and of the burst.
    #[arg(long, default_value_t = 100)]
    pub authentication_token_review_burst: u32,
    /// Longest bearer token in bytes; a longer one gets 401 without a TokenReview.
    #[arg(long, default_value_t = 16 * 1024)]
    pub authentication_token_max_length: usize,
    /// SubjectAccessReviews sent upstream per second per user and client address (decisions
    /// not cached yet); past it that user gets 429 there. 0 = unbounded.
    #[arg(long, default_value_t = 20.0)]
    pub authorization_review_qps: f64,
    /// SubjectAccessReviews a user may send at once above the rate.
    #[arg(long, default_value_t = 100)]
    pub authorization_review_burst: u32,
    /// How long an allowing SubjectAccessReview is cached. Also spelt as the kube components'
    /// delegated authorization flag, `--authorization-webhook-cache-authorized-ttl`.
    #[arg(long, default_value = "5m", value_parser = parse_duration, alias = "authorization-webhook-cache-authorized-ttl")]
    pub authorization_allowed_cache_ttl: Duration,
    /// How long a denying SubjectAccessReview is cached. Also spelt
    /// `--authorization-webhook-cache-unauthorized-ttl`.
    #[arg(long, default_value = "30s", value_parser = parse_duration, alias = "authorization-webhook-cache-unauthorized-ttl")]
    pub authorization_denied_cache_ttl: Duration,
    /// Entries in each of the token and decision caches.
    #[arg(long, default_value_t = 10_000)]
    pub auth_cache_size: usize,
    /// How often the serving certificate and key files and --client-ca-file are checked for
    /// changes (and the client CAs for expiry).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub tls_reload_interval: Duration,
    /// Non-long-running requests served at once (watches, exec, logs excluded); 429 past it.
    /// 0 = unlimited.
    #[arg(long, default_value_t = 400)]
    pub max_requests_inflight: usize,
    /// In-flight requests (of --max-requests-inflight) one user may hold; 429 past it (default: half of
    /// --max-requests-inflight, at least 1). 0 = no per-user share.
    #[arg(long)]
    pub max_requests_inflight_per_user: Option<usize>,
    /// A response whose client takes nothing of it for this long is cut and what it holds let
    /// go: a non-long-running one frees its in-flight permit before --request-timeout; a watch
    /// (served or forwarded) its source. A watch with nothing to send is never cut. 0 = never
    /// (non-long-running: only at --request-timeout).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub write_stall_timeout: Duration,
    /// Open watches (served from the cache or forwarded) per user and client address, counting
    /// too followed logs and exec/attach/port-forward sessions; 429 past it.
    /// 0 = unlimited.
    #[arg(long, default_value_t = 1000)]
    pub max_watches_per_user: usize,
    /// Longest request URL (path and query) in bytes; 414 past it.
    #[arg(long, default_value_t = 32 * 1024)]
    pub max_url_bytes: usize,
    /// Largest request header block in bytes; 431 past it.
    #[arg(long, default_value_t = 1024 * 1024)]
    pub max_header_bytes: usize,
    /// Time limit for non-long-running requests (504 past it).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub request_timeout: Duration,
    /// Request-header authentication user headers (besides `X-Remote-User`), dropped from
    /// every forwarded request so that a caller cannot assert an identity the upstream trusts
    /// from the proxy's connection. Comma-separated, as kube-apiserver's flag.
    #[arg(long, value_delimiter = ',')]
    pub requestheader_username_headers: Vec<String>,
    /// Request-header group headers dropped (besides `X-Remote-Group`).
    #[arg(long, value_delimiter = ',')]
    pub requestheader_group_headers: Vec<String>,
    /// Request-header uid headers dropped (besides `X-Remote-Uid`).
    #[arg(long, value_delimiter = ',')]
    pub requestheader_uid_headers: Vec<String>,
    /// Request-header extra-header prefixes dropped (besides `X-Remote-Extra-`).
    #[arg(long, value_delimiter = ',')]
    pub requestheader_extra_headers_prefix: Vec<String>,
    /// With --auth=none: regular expressions (comma-separated) for the hosts (the Host header
    /// without its port) to accept, as `kubectl proxy`'s; other hosts get 403 (DNS rebinding).
    #[arg(long, default_value = ACCEPT_HOSTS)]
    pub accept_hosts: String,
    /// With --auth=none: regular expressions for the paths to refuse (exec and attach).
    #[arg(long, default_value = REJECT_PATHS)]
    pub reject_paths: String,
    /// With --auth=none: regular expressions for the methods to refuse.
    #[arg(long, default_value = REJECT_METHODS)]
    pub reject_methods: String,
    /// With --auth=none: regular expressions for the browser origins (`Origin` header) to
    /// accept; by default a request carrying any `Origin` gets 403.
    #[arg(long, default_value = "")]
    pub accept_origins: String,
    /// Feature gates, as kube-apiserver's (`Name=true|false,…`). Known:
    /// `ConstrainedImpersonation` (beta, on by default since Kubernetes 1.36): when unset, on
    /// when the upstream is 1.36 or newer. Set it as the upstream apiserver has it: on where the
    /// apiserver has it off, a cached read would accept an impersonation the apiserver refuses.
    #[arg(long, default_value = "", value_parser = parse_feature_gates)]
    pub feature_gates: FeatureGates,
}

/// The `--feature-gates` this proxy reads; `None`: the upstream's default. Gates it does not
/// read are kept by name (`ignored`), so the apiserver's own `--feature-gates` value can be
/// given as it is (logged at start).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FeatureGates {
    pub constrained_impersonation: Option<bool>,
    pub ignored: Vec<String>,
}

impl FeatureGates {
    /// Whether constrained impersonation is on: as set, else as the upstream's Kubernetes minor
    /// version has it by default (on from 1.36; off when the version is unknown).
    pub fn constrained_impersonation(&self, upstream_minor: Option<u32>) -> bool {
        self.constrained_impersonation.unwrap_or(upstream_minor.is_some_and(|m| m >= 36))
    }
}

/// `--feature-gates` as the kube components parse it (`k=v` pairs, comma-separated, values as
/// `strconv.ParseBool`); a gate this proxy does not read is kept in `ignored` (the kube
/// components refuse an unknown one, but the apiserver's value names many this proxy has no
/// use for).
pub fn parse_feature_gates(s: &str) -> Result<FeatureGates, String> {
    let mut gates = FeatureGates::default();
    for pair in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((k, v)) = pair.split_once('=') else {
            return Err(format!("missing bool value for {pair}"));
        };
        let v = parse_bool_flag(v.trim()).map_err(|e| format!("invalid value of {k}={v}, err: {e}"))?;
        match k.trim() {
            "ConstrainedImpersonation" => gates.constrained_impersonation = Some(v),
            other => gates.ignored.push(other.to_owned()),
        }
    }
    Ok(gates)
}

impl SecurityArgs {
    /// `--auth=none` with default limits: what tests and `demo` use on loopback.
    pub fn none() -> SecurityArgs {
        SecurityArgs {
            auth: "none".into(),
            client_ca_file: None,
            anonymous_auth: false,
            authentication_cache_ttl: Duration::from_secs(120),
            authentication_failure_cache_ttl: Duration::from_secs(10),
            authentication_token_review_qps: 50.0,
            authentication_token_review_burst: 100,
            authentication_token_max_length: 16 * 1024,
            authorization_review_qps: 20.0,
            authorization_review_burst: 100,
            authorization_allowed_cache_ttl: Duration::from_secs(300),
            authorization_denied_cache_ttl: Duration::from_secs(30),
            auth_cache_size: 10_000,
            tls_reload_interval: Duration::from_secs(10),
            max_requests_inflight: 400,
            max_requests_inflight_per_user: None,
            write_stall_timeout: Duration::from_secs(10),
            max_watches_per_user: 1000,
            max_url_bytes: 32 * 1024,
            max_header_bytes: 1024 * 1024,
            request_timeout: Duration::from_secs(60),
            accept_hosts: ACCEPT_HOSTS.into(),
            reject_paths: REJECT_PATHS.into(),
            reject_methods: REJECT_METHODS.into(),
            accept_origins: String::new(),
            feature_gates: FeatureGates::default(),
            requestheader_username_headers: Vec::new(),
            requestheader_group_headers: Vec::new(),
            requestheader_uid_headers: Vec::new(),
            requestheader_extra_headers_prefix: Vec::new(),
        }
    }

    /// `--max-requests-inflight-per-user`, its default resolved (0: no share).
    pub fn in_flight_per_user(&self) -> usize {
        match self.max_requests_inflight_per_user {
            Some(n) => n,
            None if self.max_requests_inflight == 0 => 0,
            None => (self.max_requests_inflight / 2).max(1),
        }
    }

    /// Whether callers are checked (`--auth=upstream`).
    pub fn enabled(&self) -> bool {
        self.auth != "none"
    }
}

/// The config file (`--config`). Every field is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FileConfig {
    pub resources: Option<Vec<String>>,
    pub history_window: Option<String>,
    pub history_max_events: Option<usize>,
}

impl ServeArgs {
    /// Parses `serve`'s flags alone (no program name, no subcommand), recording which
    /// file-overridable ones were given, as the full command line does (`cli`).
    pub fn from_flags<T>(flags: &[T]) -> Result<ServeArgs, clap::Error>
    where
        T: Into<std::ffi::OsString> + Clone,
    {
        let cmd = ServeArgs::augment_args(clap::Command::new("serve").no_binary_name(true));
        let m = cmd.try_get_matches_from(flags.iter().cloned())?;
        let mut args = ServeArgs::from_arg_matches(&m)?;
        args.explicit = explicit_flags(&m);
        Ok(args)
    }

    /// A proxy for a trusted local setup (demo, bench, tests): plain HTTP on the loopback
    /// `listen` address, no authentication (`--auth=none`), the given plain-HTTP upstream, every
    /// other flag at its default — built by parsing flags, so the defaults live in one place.
    pub fn local(upstream_url: &str, resources: &[&str], listen: SocketAddr) -> ServeArgs {
        let resources = resources.join(",");
        let listen = listen.to_string();
        let flags = [
            "--upstream",
            upstream_url,
            "--resources",
            resources.as_str(),
            "--insecure-listen",
            listen.as_str(),
            "--auth=none",
        ];
        match ServeArgs::from_flags(&flags) {
            Ok(args) => args,
            Err(e) => unreachable!("the local flag set always parses: {e}"),
        }
    }

    /// Merges the config file under the flags and checks the result.
    pub fn validate(mut self) -> Result<ServeArgs, String> {
        if let Some(path) = &self.config {
            let text =
                std::fs::read_to_string(path).map_err(|e| format!("--config {}: {e}", path.display()))?;
            // Where it fails, not what it says there: a file named by mistake (a kubeconfig, a
            // token) would have its values quoted by the parser's message and snippet.
            let file: FileConfig = serde_saphyr::from_str(&text).map_err(|e| {
                // An unknown key is named (a key is no secret); any other message may quote a
                // value.
                let text = e.to_string();
                let unknown = text.lines().next().and_then(|l| l.find("unknown field `").map(|i| &l[i..]));
                format!(
                    "--config {}: {}{} (its keys: resources, historyWindow, historyMaxEvents)",
                    path.display(),
                    unknown.map_or("not a configuration file", |u| u.split(',').next().unwrap_or(u)),
                    crate::upstream::parse_error_at(&e)
                )
            })?;
            if self.resources.is_empty() {
                self.resources = file.resources.unwrap_or_default();
            }
            if let Some(w) = file.history_window {
                let w = parse_duration(&w).map_err(|e| format!("--config historyWindow: {e}"))?;
                if !self.explicit.history_window {
                    self.history_window = w;
                }
            }
            if let Some(n) = file.history_max_events {
                if !self.explicit.history_max_events {
                    self.history_max_events = n;
                }
            }
        }
        self.resources =
            self.resources.iter().map(|r| r.trim().to_owned()).filter(|r| !r.is_empty()).collect();
        crate::wanted::Wanted::parse(&self.resources)?;
        crate::wanted::Wanted::parse(&self.state_resources)
            .map_err(|e| e.replace("--resources", "--state-resources"))?;
        if !(0.0..=0.02).contains(&self.goaway_chance) {
            // kube-apiserver's words (server/options/server_run_options.go).
            return Err("--goaway-chance can not be less than 0 or greater than 0.02".into());
        }
        match (&self.insecure_listen, &self.tls_cert_file, &self.tls_private_key_file) {
            (Some(addr), _, _) if !addr.ip().is_loopback() => {
                return Err(format!(
                    "--insecure-listen {addr}: plain HTTP is only allowed on a loopback address; use --tls-cert-file/--tls-private-key-file"
                ))
            }
            (Some(_), _, _) => {}
            (None, Some(_), Some(_)) => {}
            (None, _, _) => {
                return Err("give --tls-cert-file and --tls-private-key-file, or --insecure-listen on a loopback address".into())
            }
        }
        let listen_ip = self.insecure_listen.map_or(self.bind_address, |a| a.ip());
        if !self.security.enabled() && !listen_ip.is_loopback() {
            return Err(format!(
                "--auth=none: only allowed on a loopback listener (a trusted sidecar), not {listen_ip}"
            ));
        }
        if self.security.client_ca_file.is_some() && self.insecure_listen.is_some() {
            return Err("--client-ca-file needs the TLS listener, not --insecure-listen".into());
        }
        if self.history_max_events == 0 {
            return Err("--history-max-events must be positive".into());
        }
        if self.cache_memory_check_period.is_zero() {
            return Err("--cache-memory-check-period must be positive".into());
        }
        Ok(self)
    }
}

/// The longest duration Go's `time.ParseDuration` accepts (`math.MaxInt64` nanoseconds).
const MAX_DURATION_NANOS: u128 = i64::MAX as u128;

/// Parses durations like Go's `time.ParseDuration` (what kube-apiserver's flags use): a sequence
/// of decimal numbers, each with an optional fraction and a unit (`ns`, `us`, `µs`, `μs`, `ms`,
/// `s`, `m`, `h`), e.g. `75s`, `1h30m`, `1.5s`, `500ms`; `0` alone; and, beyond Go, a plain
/// integer as seconds (`42`). Negative durations and anything above Go's limit
/// (2562047h47m16.854775807s) are errors; nothing panics.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let invalid = |why: &str| format!("invalid duration {s:?}: {why}");
    if s.is_empty() {
        return Err("invalid duration \"\": empty".into());
    }
    if s.bytes().all(|b| b.is_ascii_digit()) {
        return s.parse::<u64>().map(Duration::from_secs).map_err(|_| invalid("too large"));
    }
    let rest = match s.as_bytes()[0] {
        b'-' if s != "-0" => return Err(invalid("negative durations are not allowed")),
        b'-' | b'+' => &s[1..],
        _ => s,
    };
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(invalid("no number"));
    }
    let mut total: u128 = 0;
    let mut rest = rest;
    while !rest.is_empty() {
        let int_end = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let (int, tail) = rest.split_at(int_end);
        let (frac, tail) = match tail.strip_prefix('.') {
            Some(t) => {
                let end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
                t.split_at(end)
            }
            None => ("", tail),
        };
        if int.is_empty() && frac.is_empty() {
            return Err(invalid("expected a number"));
        }
        let unit_end = tail.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_end);
        let per_unit: u128 = match unit {
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60 * 1_000_000_000,
            "h" => 3600 * 1_000_000_000,
            "" => return Err(invalid("missing unit (ns, us, ms, s, m, h)")),
            other => return Err(invalid(&format!("unknown unit {other:?} (ns, us, ms, s, m, h)"))),
        };
        let too_large = || invalid("too large (at most 2562047h47m16.854775807s)");
        // Integer part: digits accumulate in u128 and stop at the first one past the limit.
        let mut whole: u128 = 0;
        for d in int.bytes() {
            whole = whole * 10 + u128::from(d - b'0');
            if whole > MAX_DURATION_NANOS {
                return Err(too_large());
            }
        }
        let mut nanos =
            whole.checked_mul(per_unit).filter(|n| *n <= MAX_DURATION_NANOS).ok_or_else(too_large)?;
        // Fraction: only the digits that can matter at nanosecond precision (Go truncates too).
        let mut scale = per_unit;
        for d in frac.bytes() {
            if scale < 10 {
                break;
            }
            scale /= 10;
            nanos += u128::from(d - b'0') * scale;
        }
        total = total.checked_add(nanos).filter(|n| *n <= MAX_DURATION_NANOS).ok_or_else(too_large)?;
        rest = tail;
    }
    // total ≤ i64::MAX, so it fits a u64 of nanoseconds.
    Ok(Duration::from_nanos(total as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effective_configuration_has_no_credentials() {
        let mut a = ServeArgs::local(
            "https://admin:s3cret@10.0.0.1:6443/prefix",
            &["pods"],
            "127.0.0.1:0".parse().unwrap(),
        );
        a.upstream.token_file = Some("/var/run/token".into());
        let text = a.effective().to_string();
        assert!(!text.contains("s3cret") && !text.contains("admin"), "{text}");
        assert!(text.contains(r#""upstream":"https://***@10.0.0.1:6443/prefix""#), "{text}");
        assert!(text.contains(r#""tokenFile":"/var/run/token""#), "{text}");
        assert!(text.contains(r#""historyWindow":"75s""#), "{text}");
        assert_eq!(crate::upstream::hide_userinfo("https://[::1]:6443/a"), "https://[::1]:6443/a");
        // Passwords with characters a URL would not take there are hidden whole; a path with an
        // `@` is hidden too (nothing tells it from a password with a `/`).
        for (url, shown) in [
            ("https://admin:p#ss@h:6443", "https://***"),
            ("https://admin:p?ss@h", "https://***"),
            // An `@` in the query: nothing shown after the scheme.
            ("https://gw/k8s?user=a@b.c&access_token=S3CRET", "https://***"),
            ("https://admin:p/ss@h/prefix", "https://***@h/prefix"),
            ("https://u:1234/abc@h", "https://***@h"),
            ("https://u:/pw@h", "https://***@h"),
            ("admin:p/ss@h", "***@h"),
            ("http://h:1/a@b", "http://***@b"),
            // A query or fragment (a token in it) is hidden, with or without userinfo.
            ("https://gw.example/k8s?access_token=S3CRET", "https://gw.example/k8s?***"),
            ("https://u:p@gw/k8s?t=S3CRET#x", "https://***@gw/k8s?***"),
            ("https://gw/k8s#S3CRET", "https://gw/k8s#***"),
        ] {
            assert_eq!(crate::upstream::hide_userinfo(url), shown, "{url}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("75s"), Ok(Duration::from_secs(75)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("42"), Ok(Duration::from_secs(42)));
        assert!(parse_duration("3 days").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn durations_follow_go_and_never_panic() {
        let ok = |s: &str, d: Duration| assert_eq!(parse_duration(s), Ok(d), "{s}");
        ok("1.5s", Duration::from_millis(1500));
        ok(".5m", Duration::from_secs(30));
        ok("1.s", Duration::from_secs(1));
        ok("2h45m30.5s", Duration::from_millis((2 * 3600 + 45 * 60 + 30) * 1000 + 500));
        ok("300ns", Duration::from_nanos(300));
        ok("10us", Duration::from_micros(10));
        ok("10\u{b5}s", Duration::from_micros(10));
        ok("10\u{3bc}s", Duration::from_micros(10));
        ok("0", Duration::ZERO);
        ok("+5s", Duration::from_secs(5));
        ok("0.000000001s", Duration::from_nanos(1));
        ok("1.0000000019s", Duration::from_nanos(1_000_000_001));
        ok("2562047h47m16.854775807s", Duration::from_nanos(i64::MAX as u64));
        for bad in [
            "100000000000000000000s",
            "2562047h47m16.854775808s",
            "2562048h",
            "9223372036854775807h",
            "99999999999999999999999999999999999999999",
            "1e9s",
            "1.5",
            "-1s",
            "s",
            ".s",
            "1..5s",
            "1d",
            "+",
            "1h 30m",
        ] {
            let e = parse_duration(bad).unwrap_err();
            assert!(e.contains("invalid duration") && !e.contains('\n'), "{bad}: {e}");
        }
        assert!(parse_duration("100000000000000000000s").unwrap_err().contains("too large"));
    }

    fn serve(args: &[&str]) -> Result<ServeArgs, String> {
        ServeArgs::from_flags(args).map_err(|e| e.to_string())?.validate()
    }

    #[test]
    fn goaway_chance_is_checked() {
        let base = ["--resources", "pods", "--insecure-listen", "127.0.0.1:8001"];
        let with = |extra: &[&str]| serve(&[&base[..], extra].concat());
        assert_eq!(with(&["--goaway-chance", "0.02"]).unwrap().goaway_chance, 0.02);
        for bad in ["--goaway-chance=0.03", "--goaway-chance=-0.001"] {
            let e = with(&[bad]).unwrap_err();
            assert_eq!(e, "--goaway-chance can not be less than 0 or greater than 0.02", "{bad}");
        }
    }

    #[test]
    fn plain_http_only_on_loopback() {
        assert!(serve(&["--resources", "pods", "--insecure-listen", "127.0.0.1:8001"]).is_ok());
        let e = serve(&["--resources", "pods", "--insecure-listen", "0.0.0.0:8001"]).unwrap_err();
        assert!(e.contains("loopback"), "{e}");
        let e = serve(&["--resources", "pods"]).unwrap_err();
        assert!(e.contains("--tls-cert-file"), "{e}");
    }

    #[test]
    fn auth_none_only_on_loopback() {
        let tls = ["--resources", "pods", "--tls-cert-file", "c", "--tls-private-key-file", "k"];
        let mut v = tls.to_vec();
        v.extend(["--auth", "none"]);
        let e = serve(&v).unwrap_err();
        assert!(e.contains("--auth=none") && e.contains("loopback"), "{e}");
        v.extend(["--bind-address", "127.0.0.1"]);
        assert!(serve(&v).is_ok());
        let ok =
            serve(&["--resources", "pods", "--insecure-listen", "127.0.0.1:1", "--auth", "none"]).unwrap();
        assert!(!ok.security.enabled());
        let ok = serve(&tls).unwrap();
        assert!(ok.security.enabled(), "authentication is the default");
        assert!(serve(&["--resources", "pods", "--insecure-listen", "127.0.0.1:1", "--auth", "off"]).is_err());
        let e = serve(&["--resources", "pods", "--insecure-listen", "127.0.0.1:1", "--client-ca-file", "ca"])
            .unwrap_err();
        assert!(e.contains("--client-ca-file"), "{e}");
    }

    #[test]
    fn resources_are_required_and_well_formed() {
        let e = serve(&["--insecure-listen", "127.0.0.1:1"]).unwrap_err();
        assert!(e.contains("no resources"), "{e}");
        let e = serve(&["--insecure-listen", "127.0.0.1:1", "--resources", "a/b/c"]).unwrap_err();
        assert!(e.contains("a/b/c"), "{e}");
        let ok =
            serve(&["--insecure-listen", "127.0.0.1:1", "--resources", "pods, apps/deployments"]).unwrap();
        assert_eq!(ok.resources, vec!["pods", "apps/deployments"]);
    }

    #[test]
    fn config_file_fills_what_flags_leave_out() {
        let dir = std::env::temp_dir().join(format!("kwc-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("c.yaml");
        std::fs::write(&f, "resources: [pods, configmaps]\nhistoryWindow: 2m\n").unwrap();
        let ok = serve(&["--insecure-listen", "127.0.0.1:1", "--config", f.to_str().unwrap()]).unwrap();
        assert_eq!(ok.resources, vec!["pods", "configmaps"]);
        assert_eq!(ok.history_window, Duration::from_secs(120));
        std::fs::write(&f, "resourcez: [pods]\n").unwrap();
        let e = serve(&["--insecure-listen", "127.0.0.1:1", "--config", f.to_str().unwrap()]).unwrap_err();
        assert!(e.contains("unknown field `resourcez` at line 1"), "the key is named: {e}");
        // A kubeconfig named by mistake: its token is not quoted back.
        std::fs::write(&f, "users:\n- name: a\n  user: {token: S3CRET}\nresources: S3CRET\n").unwrap();
        let e = serve(&["--insecure-listen", "127.0.0.1:1", "--config", f.to_str().unwrap()]).unwrap_err();
        assert!(e.contains(" at line ") && !e.contains("S3CRET"), "where, not what: {e}");
    }

    /// The kube components' delegated-auth cache flags are accepted as aliases.
    #[test]
    fn delegated_auth_cache_flags_have_the_kube_components_names_too() {
        let a = serve(&[
            "--resources",
            "pods",
            "--insecure-listen",
            "127.0.0.1:1",
            "--authentication-token-webhook-cache-ttl=7s",
            "--authorization-webhook-cache-authorized-ttl=8s",
            "--authorization-webhook-cache-unauthorized-ttl=9s",
        ])
        .unwrap();
        let s = &a.security;
        assert_eq!(
            (s.authentication_cache_ttl, s.authorization_allowed_cache_ttl, s.authorization_denied_cache_ttl),
            (Duration::from_secs(7), Duration::from_secs(8), Duration::from_secs(9))
        );
    }

    #[test]
    fn feature_gates_as_the_kube_components_read_them() {
        let unset = parse_feature_gates("").unwrap();
        assert!(!unset.constrained_impersonation(Some(35)), "off before 1.36");
        assert!(unset.constrained_impersonation(Some(36)), "on by default from 1.36");
        assert!(!unset.constrained_impersonation(None), "off when the version is unknown");
        let off = parse_feature_gates("ConstrainedImpersonation=false").unwrap();
        assert!(!off.constrained_impersonation(Some(37)));
        let on = parse_feature_gates(" ConstrainedImpersonation=True ,").unwrap();
        assert!(on.constrained_impersonation(Some(28)));
        // The apiserver's own value, gates this proxy does not read included.
        let apiservers = parse_feature_gates("WatchList=true,ConstrainedImpersonation=false").unwrap();
        assert_eq!(apiservers.ignored, ["WatchList"]);
        assert!(!apiservers.constrained_impersonation(Some(36)));
        assert!(parse_feature_gates("ConstrainedImpersonation").is_err());
        assert!(parse_feature_gates("ConstrainedImpersonation=yes").is_err());
        let args = serve(&[
            "--resources",
            "pods",
            "--insecure-listen",
            "127.0.0.1:1",
            "--feature-gates=ConstrainedImpersonation=false",
        ]);
        assert_eq!(args.unwrap().security.feature_gates, off);
        assert!(parse_feature_gates("Foo=maybe").is_err(), "a value that is not a bool");
    }

    #[test]
    fn flags_win_over_the_config_file() {
        let dir = std::env::temp_dir().join(format!("kwc-cfg-win-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("c.yaml");
        std::fs::write(&f, "resources: [pods]\nhistoryWindow: 2m\nhistoryMaxEvents: 7\n").unwrap();
        let cfg = f.to_str().unwrap();
        let base = ["--insecure-listen", "127.0.0.1:1", "--config", cfg];
        let with = |extra: &[&str]| {
            let mut v = base.to_vec();
            v.extend_from_slice(extra);
            serve(&v).unwrap()
        };
        let ok = with(&["--history-window", "10s", "--history-max-events", "500", "--resources", "nodes"]);
        assert_eq!(ok.history_window, Duration::from_secs(10), "the flag wins");
        assert_eq!(ok.history_max_events, 500, "the flag wins");
        assert_eq!(ok.resources, vec!["nodes"]);
        // Even a flag equal to the default wins.
        let ok = with(&["--history-window=75s", "--history-max-events=102400"]);
        assert_eq!((ok.history_window, ok.history_max_events), (Duration::from_secs(75), 102_400));
        // Without flags the file fills them in.
        let ok = with(&[]);
        assert_eq!((ok.history_window, ok.history_max_events), (Duration::from_secs(120), 7));
        assert_eq!(ok.resources, vec!["pods"]);
        // A bad duration in the file is an error even when the flag wins.
        std::fs::write(&f, "historyWindow: 100000000000000000000s\n").unwrap();
        let e =
            serve(&["--insecure-listen", "127.0.0.1:1", "--config", cfg, "--resources", "pods"]).unwrap_err();
        assert!(e.contains("historyWindow") && e.contains("too large"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn boolean_flags_take_an_optional_value() {
        let base = ["--resources", "pods", "--insecure-listen", "127.0.0.1:1"];
        let with = |extra: &[&str]| {
            let mut v = base.to_vec();
            v.extend_from_slice(extra);
            serve(&v)
        };
        assert!(!with(&[]).unwrap().security.anonymous_auth);
        assert!(with(&["--anonymous-auth"]).unwrap().security.anonymous_auth);
        assert!(with(&["--anonymous-auth=true"]).unwrap().security.anonymous_auth);
        assert!(!with(&["--anonymous-auth=false"]).unwrap().security.anonymous_auth);
        assert!(!with(&["--anonymous-auth=0"]).unwrap().security.anonymous_auth);
        assert!(with(&["--anonymous-auth=maybe"]).is_err());
        // `--flag false` is not `--flag=false` (as with Go's pflag): the stray word is an error.
        assert!(with(&["--anonymous-auth", "false"]).is_err());
        assert!(with(&["--insecure-skip-tls-verify"]).unwrap().upstream.insecure_skip_tls_verify);
        assert!(!with(&["--insecure-skip-tls-verify=false"]).unwrap().upstream.insecure_skip_tls_verify);
    }
}
