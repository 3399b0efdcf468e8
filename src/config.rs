//! Command-line flags (kube-apiserver style) and the optional config file, turned into a
//! validated configuration. Called by `main`; the result goes to `app`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use serde::Deserialize;

use crate::upstream::UpstreamOptions;

/// kube-watchcache: an in-memory watch cache for the Kubernetes API, run as a reverse proxy in
/// front of kube-apiserver.
#[derive(Debug, Parser)]
#[command(name = "kube-watchcache", version, about, long_about = None)]
pub struct Cli {
    /// Log filter (`error`, `warn`, `info`, `debug`, `trace`, or a tracing directive such as
    /// `kube_watchcache=debug`). RUST_LOG wins when set.
    #[arg(long, global = true, default_value = "info", env = "WATCHCACHE_LOG_LEVEL")]
    pub log_level: String,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the proxy: cache the configured resources of the upstream apiserver and serve
    /// GET/LIST/WATCH from memory; forward everything else.
    Serve(Box<ServeArgs>),
    /// Run a simulated kube-apiserver (in-memory objects, real resourceVersion semantics) for
    /// demos, tests and load tests.
    Sim(SimArgs),
    /// Start a simulated apiserver with sample objects and the proxy in front of it, and print
    /// commands to try. Runs until Ctrl-C.
    Demo(DemoArgs),
    /// Load-test the proxy against the direct upstream in one run (watchers, lists, gets and
    /// upstream writes); prints a table and writes JSON and SVG reports.
    Bench(Box<crate::bench::BenchArgs>),
}

/// Where the upstream apiserver is and how to authenticate to it.
#[derive(Debug, Args, Clone)]
pub struct UpstreamArgs {
    /// Path to a kubeconfig file. Default: $KUBECONFIG, then ~/.kube/config, then the in-cluster
    /// service account.
    #[arg(long, env = "KUBECONFIG")]
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
    #[arg(long)]
    pub insecure_skip_tls_verify: bool,
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
        }
    }
}

/// Flags of `serve`.
#[derive(Debug, Args, Clone)]
pub struct ServeArgs {
    #[command(flatten)]
    pub upstream: UpstreamArgs,
    /// Resources to cache, comma separated, as `resource` (core group) or `group/resource`:
    /// e.g. `pods,nodes,configmaps,apps/deployments,example.com/widgets`. The version is found
    /// by discovery. Everything else is forwarded.
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
    /// Watches without timeoutSeconds end after this × a random factor in [1, 2).
    #[arg(long, default_value = "30m", value_parser = parse_duration)]
    pub min_request_timeout: Duration,
    /// How long a NotOlderThan read waits for the cache before going upstream.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub freshness_wait: Duration,
    /// Most Recent reads (resourceVersion unset): `cache` serves LISTs from the cache when a
    /// probe upstream proves it fresh (else forwards them at once) and watches always from the
    /// cache; `upstream` always forwards them.
    #[arg(long, default_value = "cache", value_parser = ["cache", "upstream"])]
    pub consistent_reads: String,
    /// How long a Most Recent LIST may wait for the cache to reach the probed upstream RV
    /// before it is forwarded (0: never wait).
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub consistent_read_wait: Duration,
    /// On SIGTERM, how long in-flight requests may take to finish.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub shutdown_grace_period: Duration,
    #[command(flatten)]
    pub security: SecurityArgs,
}

/// Authentication, authorization, TLS reload and limits of `serve`.
#[derive(Debug, Args, Clone)]
pub struct SecurityArgs {
    /// `upstream`: every caller is authenticated (client certificate, or bearer token by
    /// TokenReview) and every read served from the cache is authorized (SubjectAccessReview),
    /// both on the upstream. `none`: no checks at all, forwarded requests pass unchanged — only
    /// for a trusted sidecar on a loopback listener (refused elsewhere).
    #[arg(long, default_value = "upstream", value_parser = ["upstream", "none"])]
    pub auth: String,
    /// CA bundle (PEM) that signs client certificates; their CommonName is the user, their
    /// Organizations the groups. Without it, client certificates are not asked for.
    #[arg(long)]
    pub client_ca_file: Option<PathBuf>,
    /// Requests without credentials act as `system:anonymous` (group
    /// `system:unauthenticated`) instead of getting 401.
    #[arg(long, default_value_t = false)]
    pub anonymous_auth: bool,
    /// How long a successful TokenReview is cached.
    #[arg(long, default_value = "2m", value_parser = parse_duration)]
    pub authentication_cache_ttl: Duration,
    /// How long a rejected token is cached.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub authentication_failure_cache_ttl: Duration,
    /// How long an allowing SubjectAccessReview is cached.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub authorization_allowed_cache_ttl: Duration,
    /// How long a denying SubjectAccessReview is cached.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub authorization_denied_cache_ttl: Duration,
    /// Entries in each of the token and decision caches.
    #[arg(long, default_value_t = 10_000)]
    pub auth_cache_size: usize,
    /// How often the serving certificate and key files are checked for changes.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub tls_reload_interval: Duration,
    /// Non-long-running requests served at once (watches, exec, logs excluded); 429 past it.
    /// 0 = unlimited.
    #[arg(long, default_value_t = 400)]
    pub max_requests_inflight: usize,
    /// Watches served from the cache at once per user; 429 past it. 0 = unlimited.
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
            authorization_allowed_cache_ttl: Duration::from_secs(300),
            authorization_denied_cache_ttl: Duration::from_secs(30),
            auth_cache_size: 10_000,
            tls_reload_interval: Duration::from_secs(10),
            max_requests_inflight: 400,
            max_watches_per_user: 1000,
            max_url_bytes: 32 * 1024,
            max_header_bytes: 1024 * 1024,
            request_timeout: Duration::from_secs(60),
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
    /// A proxy for a trusted local setup (demo, bench, tests): plain HTTP on the loopback
    /// `listen` address, no authentication (`--auth=none`), the given plain-HTTP upstream, every
    /// other flag at its default — built by parsing flags, so the defaults live in one place.
    pub fn local(upstream_url: &str, resources: &[&str], listen: SocketAddr) -> ServeArgs {
        let resources = resources.join(",");
        let listen = listen.to_string();
        let argv = [
            "kube-watchcache",
            "serve",
            "--upstream",
            upstream_url,
            "--resources",
            resources.as_str(),
            "--insecure-listen",
            listen.as_str(),
            "--auth=none",
        ];
        match Cli::try_parse_from(argv).map(|c| c.command) {
            Ok(Command::Serve(args)) => *args,
            other => unreachable!("the local flag set always parses: {other:?}"),
        }
    }

    /// Merges the config file under the flags and checks the result.
    pub fn validate(mut self) -> Result<ServeArgs, String> {
        if let Some(path) = &self.config {
            let text =
                std::fs::read_to_string(path).map_err(|e| format!("--config {}: {e}", path.display()))?;
            let file: FileConfig =
                serde_saphyr::from_str(&text).map_err(|e| format!("--config {}: {e}", path.display()))?;
            if self.resources.is_empty() {
                self.resources = file.resources.unwrap_or_default();
            }
            if let Some(w) = file.history_window {
                self.history_window =
                    parse_duration(&w).map_err(|e| format!("--config historyWindow: {e}"))?;
            }
            if let Some(n) = file.history_max_events {
                self.history_max_events = n;
            }
        }
        self.resources =
            self.resources.iter().map(|r| r.trim().to_owned()).filter(|r| !r.is_empty()).collect();
        if self.resources.is_empty() {
            return Err(
                "no resources to cache: give --resources (e.g. --resources pods,configmaps) or --config"
                    .into(),
            );
        }
        for r in &self.resources {
            if r.split('/').count() > 2 || r.split('/').any(str::is_empty) {
                return Err(format!("--resources: {r:?} is not `resource` or `group/resource`"));
            }
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
        Ok(self)
    }
}

/// Flags of `sim`.
#[derive(Debug, Args, Clone)]
pub struct SimArgs {
    /// Address to serve the simulated apiserver on (plain HTTP).
    #[arg(long, default_value = "127.0.0.1:8001")]
    pub listen: SocketAddr,
    /// Number of sample objects to create at start (configmaps and pods in a few namespaces).
    #[arg(long, default_value_t = 100)]
    pub objects: usize,
    /// Random updates per second to the sample objects.
    #[arg(long, default_value_t = 0.0)]
    pub churn: f64,
    /// Node-heartbeat Lease renewals per second (a resource the proxy does not cache that
    /// moves the global revision, as in every live cluster); 0 turns them off.
    #[arg(long, default_value_t = 20.0)]
    pub lease_churn: f64,
    /// How many revisions the simulated etcd keeps before compacting.
    #[arg(long, default_value_t = 10_000)]
    pub compaction_window: usize,
}

/// Flags of `demo`.
#[derive(Debug, Args, Clone)]
pub struct DemoArgs {
    /// Address of the proxy (plain HTTP, loopback).
    #[arg(long, default_value = "127.0.0.1:8001")]
    pub listen: SocketAddr,
    /// Address of the simulated apiserver (plain HTTP, loopback).
    #[arg(long, default_value = "127.0.0.1:8002")]
    pub sim_listen: SocketAddr,
    /// Sample objects in the simulated apiserver.
    #[arg(long, default_value_t = 200)]
    pub objects: usize,
    /// Random updates per second in the simulated apiserver.
    #[arg(long, default_value_t = 2.0)]
    pub churn: f64,
    /// Lease renewals per second in the simulated apiserver (node heartbeats, not cached).
    #[arg(long, default_value_t = 20.0)]
    pub lease_churn: f64,
    /// Stop after this long instead of waiting for Ctrl-C (e.g. `30s`).
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Length of the short benchmark (proxy vs direct, per side) run before the prompt; 0 skips it.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub bench: Duration,
}

/// Parses Go-style durations: `75s`, `2m`, `1h30m`, `500ms`, or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if let Ok(n) = s.parse::<u64>() {
        return Ok(Duration::from_secs(n));
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    if rest.is_empty() {
        return Err("empty duration".into());
    }
    while !rest.is_empty() {
        let num_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let (num, tail) = rest.split_at(num_end);
        let n: f64 = num.parse().map_err(|_| format!("invalid duration {s:?}"))?;
        let unit_end = tail.find(|c: char| c.is_ascii_digit()).unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_end);
        let secs = match unit {
            "ms" => n / 1000.0,
            "s" => n,
            "m" => n * 60.0,
            "h" => n * 3600.0,
            _ => return Err(format!("invalid duration {s:?}: unknown unit {unit:?}")),
        };
        total += Duration::from_secs_f64(secs);
        rest = tail;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("75s"), Ok(Duration::from_secs(75)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("42"), Ok(Duration::from_secs(42)));
        assert!(parse_duration("3 days").is_err());
        assert!(parse_duration("").is_err());
    }

    fn serve(args: &[&str]) -> Result<ServeArgs, String> {
        let mut v = vec!["kube-watchcache", "serve"];
        v.extend_from_slice(args);
        let cli = Cli::try_parse_from(v).map_err(|e| e.to_string())?;
        match cli.command {
            Command::Serve(s) => s.validate(),
            _ => unreachable!(),
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
        assert!(serve(&["--insecure-listen", "127.0.0.1:1", "--config", f.to_str().unwrap()]).is_err());
    }
}
