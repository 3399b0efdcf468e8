//! `kube-watchcache sim`: its flags and the run that serves a simulated apiserver until a
//! signal. Called by the binary (`kube-watchcache-cli`); uses the rest of this crate and the core's
//! `app` helpers (signals, stdout, open-files limit).

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;
use kube_watchcache::app::{raise_open_files, say, wait_for_signal};

/// Flags of `sim`.
#[derive(Debug, Args, Clone)]
pub struct SimArgs {
    /// Address to serve the simulated apiserver on (plain HTTP, or HTTPS with --tls-cert-file).
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
    /// Serve HTTPS (HTTP/1.1 and HTTP/2 by ALPN) with this certificate (PEM, leaf first);
    /// needs --tls-private-key-file.
    #[arg(long, requires = "tls_private_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// The key of --tls-cert-file (PEM).
    #[arg(long, requires = "tls_cert_file")]
    pub tls_private_key_file: Option<PathBuf>,
    /// A file holding a bearer token that the sim's TokenReview accepts as user `admin` (group
    /// `system:masters`), which its SubjectAccessReview allows everything: what a proxy with
    /// `--auth=upstream` in front of the sim needs. Without it every review says no. The sim
    /// itself does not check tokens on other requests.
    #[arg(long)]
    pub admin_token_file: Option<PathBuf>,
}

/// `kube-watchcache sim`.
pub async fn run(args: SimArgs) -> Result<(), String> {
    raise_open_files();
    let tls = match (&args.tls_cert_file, &args.tls_private_key_file) {
        (Some(cert), Some(key)) => Some(crate::SimTls { cert_file: cert.clone(), key_file: key.clone() }),
        _ => None,
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    let opts = crate::SimOptions {
        listen: args.listen,
        objects: args.objects,
        churn_per_sec: args.churn,
        lease_churn_per_sec: args.lease_churn,
        compaction_window: args.compaction_window,
        tls,
        ..Default::default()
    };
    let admin = match &args.admin_token_file {
        Some(path) => {
            let token = std::fs::read_to_string(path)
                .map_err(|e| format!("--admin-token-file {}: {e}", path.display()))?;
            let token = token.trim().to_owned();
            if token.is_empty() {
                return Err(format!("--admin-token-file {}: the file is empty", path.display()));
            }
            Some(token)
        }
        None => None,
    };
    let handle = crate::Sim::start(opts).await.map_err(|e| format!("sim: {}: {e}", args.listen))?;
    if let Some(token) = admin {
        handle.sim.set_auth(crate::AuthScript::admin(&token));
    }
    tracing::info!(addr = %handle.addr, %scheme, "simulated apiserver serving");
    say(&format!("simulated apiserver on {scheme}://{}", handle.addr));
    wait_for_signal().await;
    handle.shutdown().await;
    Ok(())
}
