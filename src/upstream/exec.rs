//! Exec credential plugins (`users[].user.exec` of a kubeconfig, the only credentials EKS, GKE,
//! AKS and OIDC through kubelogin give): runs the plugin as client-go does and keeps what it
//! returned, a bearer token and/or a client certificate, until shortly before its
//! `expirationTimestamp`, then runs it again.
//!
//! The protocol is client-go's (`k8s.io/client-go/plugin/pkg/client/auth/exec`, documented at
//! <https://kubernetes.io/docs/reference/access-authn-authz/authentication/#client-go-credential-plugins>):
//! the plugin gets `KUBERNETES_EXEC_INFO` (an `ExecCredential` of the configured `apiVersion`,
//! `client.authentication.k8s.io/v1` or `v1beta1`, with `spec.interactive` and, with
//! `provideClusterInfo`, `spec.cluster`) and prints an `ExecCredential` whose `status` holds
//! `token` or `clientCertificateData`/`clientKeyData` and an optional `expirationTimestamp`.
//! A proxy has no terminal: the plugin always runs with `interactive: false` and no stdin, and a
//! plugin configured `interactiveMode: Always` is refused at start. A failure's message carries
//! the plugin's stderr (its last lines), as kubectl shows it.
//!
//! Why not kube-client's: its runner is private to its tower auth layer, runs the plugin with
//! a blocking `std::process` call on the async runtime, inherits stdin unless
//! `interactiveMode: Never`, and serialises `spec.cluster` with kebab-case names that client-go
//! plugins do not read. The kubeconfig's `exec` block itself is parsed by kube-client.
//!
//! Used by `config.rs` (the first run, at start: a plugin that fails stops the start with its
//! message) and `auth.rs` (the refresh task that keeps the credential current).

use std::process::{Output, Stdio};
use std::time::{Duration, SystemTime};

use base64::Engine;
use kube_client::config::{ExecConfig, ExecInteractiveMode};
use serde::Deserialize;
use serde_json::{json, Value};

/// How long one run of a plugin may take before it is killed.
pub(crate) const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// The credential versions client-go speaks.
const API_VERSIONS: [&str; 2] = ["client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1"];

/// A plugin, ready to run. Its `Debug` names the command alone: its environment comes from
/// the kubeconfig and may hold secrets.
#[derive(Clone)]
pub(crate) struct ExecPlugin {
    /// The kubeconfig user, for messages.
    pub user: String,
    command: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    api_version: String,
    install_hint: Option<String>,
    /// `KUBERNETES_EXEC_INFO`, made once.
    exec_info: String,
}

/// What one run returned. Its `Debug` says what it holds, never the values.
#[derive(Clone, PartialEq)]
pub(crate) struct Credential {
    pub token: Option<String>,
    /// Client certificate chain and key, PEM.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// `status.expirationTimestamp`; `None`: valid until the process ends.
    pub expiry: Option<SystemTime>,
}

impl std::fmt::Debug for ExecPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecPlugin")
            .field("user", &self.user)
            .field("command", &self.command)
            .field("env", &self.env.iter().map(|(k, _)| k).collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("identity", &self.identity.as_ref().map(|_| "<redacted>"))
            .field("expiry", &self.expiry)
            .finish()
    }
}

/// The cluster as `spec.cluster` carries it for `provideClusterInfo` (client-go's
/// `clientauthentication.Cluster`, camelCase).
pub(crate) struct ClusterInfo {
    pub server: String,
    pub tls_server_name: Option<String>,
    pub insecure_skip_tls_verify: bool,
    pub certificate_authority_pem: Option<Vec<u8>>,
    /// `clusters[].cluster.extensions[name=client.authentication.k8s.io/exec].extension`.
    pub config: Option<Value>,
}

impl ExecPlugin {
    /// Checks the kubeconfig's `exec` block. `cluster` is given when `provideClusterInfo` is set.
    pub fn new(cfg: &ExecConfig, user: &str, cluster: Option<ClusterInfo>) -> Result<ExecPlugin, String> {
        let command = cfg
            .command
            .clone()
            .filter(|c| !c.is_empty())
            .ok_or_else(|| format!("user \"{user}\": exec plugin has no command"))?;
        let api_version = cfg.api_version.clone().unwrap_or_default();
        if !API_VERSIONS.contains(&api_version.as_str()) {
            return Err(format!(
                "user \"{user}\": exec plugin apiVersion \"{api_version}\" is not supported (use {})",
                API_VERSIONS.join(" or ")
            ));
        }
        if cfg.interactive_mode == Some(ExecInteractiveMode::Always) {
            return Err(format!(
                "user \"{user}\": exec plugin has interactiveMode Always, but kube-watchcache has no \
                 terminal to offer it; use a plugin that can run with interactiveMode Never"
            ));
        }
        let env = cfg
            .env
            .iter()
            .flatten()
            .filter_map(|e| Some((e.get("name")?.clone(), e.get("value")?.clone())))
            .collect();
        let mut spec = json!({ "interactive": false });
        if cfg.provide_cluster_info {
            let c = cluster.ok_or_else(|| format!("user \"{user}\": provideClusterInfo needs a cluster"))?;
            spec["cluster"] = c.to_json();
        }
        let exec_info =
            json!({ "apiVersion": api_version, "kind": "ExecCredential", "spec": spec }).to_string();
        Ok(ExecPlugin {
            user: user.to_owned(),
            command,
            args: cfg.args.clone().unwrap_or_default(),
            env,
            api_version,
            install_hint: cfg.install_hint.clone(),
            exec_info,
        })
    }

    /// For logs: the command, never its output.
    pub fn describe(&self) -> String {
        format!("exec plugin {}", self.command)
    }

    fn command(&self) -> tokio::process::Command {
        let mut c = tokio::process::Command::new(&self.command);
        c.args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("KUBERNETES_EXEC_INFO", &self.exec_info)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        c
    }

    /// Runs the plugin once (at most [`RUN_TIMEOUT`]).
    pub async fn run(&self) -> Result<Credential, String> {
        let out = match tokio::time::timeout(RUN_TIMEOUT, self.command().output()).await {
            Ok(Ok(out)) => out,
            Ok(Err(e)) => return Err(self.start_error(&e)),
            Err(_) => return Err(format!("{}: no answer within {RUN_TIMEOUT:?}", self.what())),
        };
        self.parse(out)
    }

    /// Runs the plugin once from synchronous code (the start), on a runtime of its own.
    pub fn run_blocking(&self) -> Result<Credential, String> {
        // A thread of its own (this may be called from inside the proxy's runtime), which also
        // drops the little runtime outside any async context.
        std::thread::scope(|s| {
            s.spawn(|| {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| format!("{}: {e}", self.what()))?;
                rt.block_on(self.run())
            })
            .join()
        })
        .unwrap_or_else(|_| Err(format!("{}: the runner panicked", self.what())))
    }

    fn what(&self) -> String {
        format!("user \"{}\": exec plugin {}", self.user, self.command)
    }

    fn start_error(&self, e: &std::io::Error) -> String {
        let mut m = format!("{}: {e}", self.what());
        if e.kind() == std::io::ErrorKind::NotFound {
            if let Some(h) = &self.install_hint {
                m.push_str(&format!(" ({})", super::errors::one_line(h)));
            }
        }
        m
    }

    fn parse(&self, out: Output) -> Result<Credential, String> {
        if !out.status.success() {
            return Err(format!("{} failed ({}): {}", self.what(), out.status, stderr_tail(&out.stderr)));
        }
        let bad = |m: String| format!("{}: {m}", self.what());
        let cred: ExecCredential = serde_saphyr::from_slice(&out.stdout).map_err(|e| {
            bad(format!("output is not an ExecCredential{}", super::errors::parse_error_at(&e)))
        })?;
        if cred.kind.as_deref() != Some("ExecCredential")
            || cred.api_version.as_deref() != Some(&self.api_version)
        {
            return Err(bad(format!(
                "answered kind {:?}, apiVersion {:?}; expected ExecCredential, {}",
                cred.kind.unwrap_or_default(),
                cred.api_version.unwrap_or_default(),
                self.api_version
            )));
        }
        let s = cred.status.ok_or_else(|| bad("answered no status".into()))?;
        let token = s.token.filter(|t| !t.trim().is_empty());
        let identity = match (s.client_certificate_data, s.client_key_data) {
            (Some(c), Some(k)) if !c.is_empty() && !k.is_empty() => Some((c.into_bytes(), k.into_bytes())),
            (None, None) => None,
            _ => return Err(bad("answered a client certificate without its key, or a key alone".into())),
        };
        if token.is_none() && identity.is_none() {
            return Err(bad("answered neither a token nor a client certificate".into()));
        }
        let expiry = match s.expiration_timestamp.filter(|t| !t.is_empty()) {
            None => None,
            Some(t) => {
                let ts: jiff::Timestamp =
                    t.parse().map_err(|e| bad(format!("expirationTimestamp {t:?}: {e}")))?;
                Some(SystemTime::from(ts))
            }
        };
        Ok(Credential { token, identity, expiry })
    }
}

impl ClusterInfo {
    fn to_json(&self) -> Value {
        let mut c = json!({ "server": self.server });
        if let Some(n) = &self.tls_server_name {
            c["tlsServerName"] = json!(n);
        }
        if self.insecure_skip_tls_verify {
            c["insecureSkipTLSVerify"] = json!(true);
        }
        if let Some(pem) = &self.certificate_authority_pem {
            c["certificateAuthorityData"] = json!(base64::engine::general_purpose::STANDARD.encode(pem));
        }
        if let Some(v) = &self.config {
            c["config"] = v.clone();
        }
        c
    }
}

/// When a credential obtained at `obtained` should be replaced: a tenth of its lifetime before
/// it expires, at most a minute before (client-go runs the plugin again only once the
/// credential has expired or was refused; a proxy renews first so that no request of its own
/// carries an expired token). A credential that has expired already when obtained (a clock
/// skewed, a plugin's stale cache) is replaced [`RENEW_FLOOR`] later, as after a failed run,
/// not every second. `None`: never.
pub(crate) fn renew_at(obtained: SystemTime, expiry: Option<SystemTime>) -> Option<SystemTime> {
    let expiry = expiry?;
    if expiry <= obtained {
        return Some(obtained + RENEW_FLOOR);
    }
    let lifetime = expiry.duration_since(obtained).unwrap_or_default();
    Some(expiry - (lifetime / 10).min(Duration::from_secs(60)))
}

/// See [`renew_at`]: as long as `auth` waits to retry a failed run.
pub(crate) const RENEW_FLOOR: Duration = Duration::from_secs(5);

#[cfg(test)]
mod renew_tests {
    use super::*;

    #[test]
    fn a_credential_is_renewed_before_it_expires_and_an_expired_one_after_the_floor() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let at = |expiry_in: i64| {
            let expiry = if expiry_in >= 0 {
                t + Duration::from_secs(expiry_in as u64)
            } else {
                t - Duration::from_secs((-expiry_in) as u64)
            };
            renew_at(t, Some(expiry)).map(|r| r.duration_since(t).unwrap().as_secs())
        };
        assert_eq!(at(3600), Some(3540), "a minute before, at most");
        assert_eq!(at(100), Some(90), "a tenth of its life before");
        assert_eq!(at(3), Some(2), "a short-lived one too (2.7 s)");
        assert_eq!(at(0), Some(RENEW_FLOOR.as_secs()), "expiring now: the floor");
        assert_eq!(at(-600), Some(RENEW_FLOOR.as_secs()), "expired already: the floor, not at once");
        assert_eq!(renew_at(t, None), None);
    }
}

/// The last lines of a plugin's stderr, on one line (kubectl shows it; the proxy logs it).
fn stderr_tail(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    if lines.is_empty() {
        return "no output on stderr".into();
    }
    let tail = lines[lines.len().saturating_sub(5)..].join(" | ");
    let mut tail = super::errors::one_line(&tail);
    if tail.len() > 1000 {
        let mut cut = 1000;
        while !tail.is_char_boundary(cut) {
            cut -= 1;
        }
        tail.truncate(cut);
        tail.push('…');
    }
    format!("stderr: {tail}")
}

#[derive(Deserialize)]
struct ExecCredential {
    #[serde(rename = "apiVersion")]
    api_version: Option<String>,
    kind: Option<String>,
    status: Option<Status>,
}

#[derive(Deserialize)]
struct Status {
    #[serde(rename = "expirationTimestamp")]
    expiration_timestamp: Option<String>,
    token: Option<String>,
    #[serde(rename = "clientCertificateData")]
    client_certificate_data: Option<String>,
    #[serde(rename = "clientKeyData")]
    client_key_data: Option<String>,
}
