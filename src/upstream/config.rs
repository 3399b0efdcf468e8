//! Where the upstream connection comes from: `--upstream URL`, a kubeconfig (`--kubeconfig`,
//! `$KUBECONFIG`, `~/.kube/config`, current context or `--context`) or the in-cluster service
//! account. Produces a [`Resolved`] (base URL, TLS material, credentials) for `client.rs`.
//!
//! Kubeconfig and in-cluster parsing are kube-client's (`kube_client::config`); this file only
//! picks the source, applies the explicit flags on top (`--token-file`, `--client-certificate`/
//! `--client-key`, `--certificate-authority`, `--insecure-skip-tls-verify` win over what the
//! source says) and turns every failure into a one-line [`ConfigError`].

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine;
use kube_client::config::{AuthInfo, Config, ExecConfig, Kubeconfig, KubeconfigError};
use rustls_pki_types::CertificateDer;

use super::auth::{Credentials, ExecAuth, TokenFile};
pub(crate) use super::errors::one_line;
pub use super::errors::ConfigError;
use super::exec::{ClusterInfo, ExecPlugin};
pub(crate) use super::identity::Identity;
use super::identity::{parse_certs, IdentitySlot};

/// Where the connection comes from (filled by `crate::config` from CLI flags).
#[derive(Clone, Debug, Default)]
pub struct UpstreamOptions {
    /// `--upstream URL`: wins over any kubeconfig.
    pub upstream: Option<String>,
    /// `--kubeconfig`: else `$KUBECONFIG`, else `~/.kube/config`, else in-cluster.
    pub kubeconfig: Option<PathBuf>,
    /// `--context`: else the kubeconfig's current-context.
    pub context: Option<String>,
    /// `--token-file`: a bearer token file, re-read every minute.
    pub token_file: Option<PathBuf>,
    /// `--client-certificate` (PEM chain); needs `client_key`.
    pub client_certificate: Option<PathBuf>,
    /// `--client-key` (PEM, PKCS#8 / PKCS#1 / SEC1); needs `client_certificate`.
    pub client_key: Option<PathBuf>,
    /// `--certificate-authority` (PEM bundle) to verify the upstream's certificate.
    pub certificate_authority: Option<PathBuf>,
    /// `--insecure-skip-tls-verify`: do not verify the upstream's certificate.
    pub insecure_skip_tls_verify: bool,
    /// `--upstream-max-streams-per-connection`: requests open at once on one upstream HTTP/2
    /// connection before another is opened (0: [`super::lanes::DEFAULT_STREAMS_PER_CONNECTION`]).
    pub max_streams_per_connection: usize,
}

/// The outcome of resolving [`UpstreamOptions`].
pub struct Resolved {
    /// `scheme://authority[/prefix]`, no trailing slash.
    pub base_url: String,
    /// Where it came from, for [`super::Upstream::describe`].
    pub origin: String,
    pub tls: TlsSettings,
    pub auth: Credentials,
}

/// client-go's refusal of a certificate authority together with insecure-skip-tls-verify.
const INSECURE_WITH_ROOTS: &str = "specifying a root certificates file with the insecure flag is not allowed";

/// What the TLS layer needs.
#[derive(Default)]
pub struct TlsSettings {
    /// Trust anchors for the upstream's certificate (empty for `http://` or when insecure).
    pub roots: Vec<CertificateDer<'static>>,
    pub insecure: bool,
    /// Name to verify instead of the URL's host (`tls-server-name`).
    pub server_name: Option<String>,
    /// The proxy's client certificate; only the own-requests client presents it.
    pub identity: Option<Arc<IdentitySlot>>,
}

/// The process environment `resolve` looks at, separated so that tests need not mutate it.
pub(crate) struct Env {
    pub kubeconfig_var: Option<OsString>,
    pub home: Option<PathBuf>,
    pub in_cluster: bool,
    pub ssl_cert_file: Option<PathBuf>,
}

impl Env {
    fn from_process() -> Env {
        Env {
            kubeconfig_var: std::env::var_os("KUBECONFIG").filter(|v| !v.is_empty()),
            home: std::env::var_os("HOME").filter(|v| !v.is_empty()).map(PathBuf::from),
            in_cluster: std::env::var_os("KUBERNETES_SERVICE_HOST").is_some_and(|v| !v.is_empty()),
            ssl_cert_file: std::env::var_os("SSL_CERT_FILE").filter(|v| !v.is_empty()).map(PathBuf::from),
        }
    }
}

/// Resolves the options against the process environment.
pub fn resolve(opts: &UpstreamOptions) -> Result<Resolved, ConfigError> {
    resolve_with(opts, &Env::from_process())
}

/// Picks the source (`--upstream` > `--kubeconfig` > `$KUBECONFIG` > `~/.kube/config` >
/// in-cluster), then applies the explicit flags on top.
pub(crate) fn resolve_with(opts: &UpstreamOptions, env: &Env) -> Result<Resolved, ConfigError> {
    let mut r = if let Some(url) = &opts.upstream {
        Resolved {
            base_url: normalize_url(url)?,
            origin: "--upstream".into(),
            tls: TlsSettings::default(),
            auth: Credentials::None,
        }
    } else if let Some(path) = &opts.kubeconfig {
        let kc = read_kubeconfig(path)?;
        from_kubeconfig(kc, &path.display().to_string(), opts.context.as_deref())?
    } else if let Some(var) = &env.kubeconfig_var {
        let label = var.to_string_lossy().into_owned();
        from_kubeconfig(read_kubeconfig_list(var, &label)?, &label, opts.context.as_deref())?
    } else if let Some(path) =
        env.home.as_ref().map(|h| h.join(".kube").join("config")).filter(|p| p.exists())
    {
        let label = path.display().to_string();
        let kc = read_kubeconfig(&path)?;
        from_kubeconfig(kc, &label, opts.context.as_deref())?
    } else if env.in_cluster {
        in_cluster()?
    } else {
        return Err(ConfigError::NoSource);
    };
    apply_flags(&mut r, opts)?;
    if r.base_url.starts_with("https://") && r.tls.roots.is_empty() && !r.tls.insecure {
        r.tls.roots = system_roots(env)?;
    }
    Ok(r)
}

/// `$KUBECONFIG` may list several files; they merge, the first to set a value wins.
fn read_kubeconfig_list(var: &OsString, label: &str) -> Result<Kubeconfig, ConfigError> {
    let mut merged = Kubeconfig::default();
    for path in std::env::split_paths(var).filter(|p| !p.as_os_str().is_empty()) {
        let kc = read_kubeconfig(&path)?;
        merged = merged.merge(kc).map_err(|e| kube_err(e, label, None))?;
    }
    Ok(merged)
}

/// One kubeconfig file, read by kube-client (which also makes its relative paths absolute).
/// kube-client indexes UTF-16 text in pairs of bytes and panics on an odd length: such a file is
/// refused here first.
fn read_kubeconfig(path: &Path) -> Result<Kubeconfig, ConfigError> {
    let label = path.display().to_string();
    if let Ok(bytes) = std::fs::read(path) {
        if matches!(bytes.as_slice(), [0xFF, 0xFE, ..] | [0xFE, 0xFF, ..]) && bytes.len() % 2 == 1 {
            return Err(ConfigError::Kubeconfig {
                path: label,
                message: "invalid UTF-16 text (odd number of bytes)".into(),
            });
        }
    }
    Kubeconfig::read_from(path).map_err(|e| kube_err(e, &label, None))
}

fn from_kubeconfig(mut kc: Kubeconfig, label: &str, context: Option<&str>) -> Result<Resolved, ConfigError> {
    if let Some(c) = context {
        kc.current_context = Some(c.to_owned());
    }
    let context_name = kc.current_context.clone();
    let user_name = context_name
        .as_ref()
        .and_then(|c| kc.contexts.iter().find(|n| &n.name == c))
        .and_then(|n| n.context.as_ref())
        .and_then(|c| c.user.clone())
        .unwrap_or_default();
    let cfg = Config::try_from(kc).map_err(|e| kube_err(e, label, context_name.as_deref()))?;
    let url = cfg.cluster_url.to_string();
    if cfg.proxy_url.is_some() {
        tracing::warn!("kubeconfig {label}: proxy-url / HTTPS_PROXY is not supported; connecting directly");
    }
    let kerr = |message: String| ConfigError::Kubeconfig { path: label.to_owned(), message };
    let base_url = normalize_url(&url).map_err(|e| kerr(e.to_string()))?;
    let roots: Vec<CertificateDer<'static>> =
        cfg.root_cert.unwrap_or_default().into_iter().map(CertificateDer::from).collect();
    let cluster = ClusterInfo {
        server: base_url.clone(),
        tls_server_name: cfg.tls_server_name.clone().filter(|s| !s.is_empty()),
        insecure_skip_tls_verify: cfg.accept_invalid_certs,
        certificate_authority_pem: ca_pem(&roots),
        config: None,
    };
    let (auth, identity) = user_credentials(&cfg.auth_info, &user_name, cluster).map_err(|e| match e {
        ConfigError::Kubeconfig { message, .. } => kerr(message),
        other => other,
    })?;
    Ok(Resolved {
        base_url,
        origin: match context_name {
            Some(c) => format!("kubeconfig {label}, context {c}"),
            None => format!("kubeconfig {label}"),
        },
        tls: TlsSettings {
            roots: {
                // client-go refuses such a cluster rather than not verify what it was told to.
                if cfg.accept_invalid_certs && !roots.is_empty() {
                    return Err(ConfigError::Tls(INSECURE_WITH_ROOTS.into()));
                }
                roots
            },
            insecure: cfg.accept_invalid_certs,
            server_name: cfg.tls_server_name.filter(|s| !s.is_empty()),
            identity,
        },
        auth,
    })
}

/// The user's bearer token / token file and client certificate, or else its exec plugin's
/// (run once here, so that a plugin that fails stops the start with its message; `auth.rs`
/// renews it). Credentials providers and basic auth are not supported: a user that has nothing else
/// is an error rather than silent anonymity.
fn user_credentials(
    a: &AuthInfo,
    user: &str,
    cluster: ClusterInfo,
) -> Result<(Credentials, Option<Arc<IdentitySlot>>), ConfigError> {
    let err = |message: String| ConfigError::Kubeconfig { path: String::new(), message };
    // kube-client keeps secrets in `secrecy` types; its serializer exposes them.
    let secrets = serde_json::to_value(a).unwrap_or_default();
    let secret =
        |k: &str| secrets.get(k).and_then(|v| v.as_str()).filter(|s| !s.is_empty()).map(str::to_owned);

    let token_file = a.token_file.as_deref().filter(|p| !p.is_empty());
    let auth = if let Some(token) = secret("token") {
        let fixed = Credentials::token(token.trim()).map_err(|e| err(format!("user \"{user}\": {e}")))?;
        match (token_file, fixed) {
            (Some(path), Credentials::Token(h)) => {
                Credentials::TokenFile(TokenFile::open_or(Path::new(path), h))
            }
            (_, fixed) => fixed,
        }
    } else if let Some(path) = token_file {
        Credentials::TokenFile(TokenFile::open(Path::new(path))?)
    } else {
        Credentials::None
    };

    let cert = match (&a.client_certificate_data, &a.client_certificate) {
        (Some(d), _) if !d.is_empty() => {
            Some(decode_b64(d).map_err(|e| err(format!("client-certificate-data: {e}")))?)
        }
        (_, Some(p)) if !p.is_empty() => Some(read(Path::new(p), "client certificate")?),
        _ => None,
    };
    let key = match (secret("client-key-data"), &a.client_key) {
        (Some(d), _) => Some(decode_b64(&d).map_err(|e| err(format!("client-key-data: {e}")))?),
        (None, Some(p)) if !p.is_empty() => Some(read(Path::new(p), "client key")?),
        _ => None,
    };
    // client-go reads files again (`ReloadTLSFiles`) only when both are files.
    let files =
        match (&a.client_certificate_data, &a.client_certificate, secret("client-key-data"), &a.client_key) {
            (None, Some(c), None, Some(k)) if !c.is_empty() && !k.is_empty() => Some((c.into(), k.into())),
            _ => None,
        };
    let identity = match (cert, key) {
        (Some(_), Some(_)) if files.is_some() => {
            files.map(|(c, k)| IdentitySlot::from_files(c, k)).transpose()?
        }
        (Some(c), Some(k)) => Some(identity(&c, &k)?),
        (None, None) => None,
        (Some(_), None) => {
            return Err(err(format!("user \"{user}\" has a client certificate but no client key")))
        }
        (None, Some(_)) => {
            return Err(err(format!("user \"{user}\" has a client key but no client certificate")))
        }
    };

    if matches!(auth, Credentials::None) && identity.is_none() {
        if let Some(exec) = &a.exec {
            let info = exec.provide_cluster_info.then(|| ClusterInfo {
                config: exec.cluster.as_ref().and_then(|c| c.config.clone()),
                ..cluster
            });
            return exec_credentials(exec, user, info);
        }
        let what = if a.auth_provider.is_some() {
            Some("an auth-provider")
        } else if a.username.is_some() {
            Some("basic auth (username/password)")
        } else {
            None
        };
        if let Some(what) = what {
            return Err(ConfigError::Unsupported(format!(
                "user \"{user}\" uses {what}, which kube-watchcache does not support; \
                 give it a token, a tokenFile or a client certificate"
            )));
        }
    }
    Ok((auth, identity))
}

/// Runs the exec plugin once: its token becomes the bearer credential, its certificate the
/// client certificate; both are renewed before `expirationTimestamp` by `auth::ExecAuth`.
fn exec_credentials(
    exec: &ExecConfig,
    user: &str,
    cluster: Option<ClusterInfo>,
) -> Result<(Credentials, Option<Arc<IdentitySlot>>), ConfigError> {
    let plugin = ExecPlugin::new(exec, user, cluster).map_err(ConfigError::Unsupported)?;
    let first = plugin.run_blocking().map_err(ConfigError::Exec)?;
    let slot = match &first.identity {
        Some((cert, key)) => Some(identity(cert, key)?),
        None => None,
    };
    let auth = ExecAuth::new(plugin, &first).map_err(ConfigError::Exec)?;
    if let Some(slot) = &slot {
        auth.set_identity_slot(slot.clone());
    }
    Ok((Credentials::Exec(auth), slot))
}

fn in_cluster() -> Result<Resolved, ConfigError> {
    let cfg = Config::incluster().map_err(|e| ConfigError::InCluster(one_line(&e.to_string())))?;
    let base_url = normalize_url(&cfg.cluster_url.to_string())?;
    let token_path = cfg.auth_info.token_file.clone().unwrap_or_default();
    Ok(Resolved {
        base_url,
        origin: "in-cluster service account".into(),
        tls: TlsSettings {
            roots: cfg.root_cert.unwrap_or_default().into_iter().map(CertificateDer::from).collect(),
            ..TlsSettings::default()
        },
        auth: Credentials::TokenFile(TokenFile::open(Path::new(&token_path))?),
    })
}

/// The explicit flags win over whatever the source said.
fn apply_flags(r: &mut Resolved, opts: &UpstreamOptions) -> Result<(), ConfigError> {
    if let Some(path) = &opts.token_file {
        r.auth = Credentials::TokenFile(TokenFile::open(path)?);
    }
    match (&opts.client_certificate, &opts.client_key) {
        (Some(c), Some(k)) => {
            r.tls.identity = Some(IdentitySlot::from_files(c.clone(), k.clone())?);
        }
        (None, None) => {}
        _ => {
            return Err(ConfigError::Tls(
                "--client-certificate and --client-key must be given together".into(),
            ))
        }
    }
    if opts.certificate_authority.is_some() && opts.insecure_skip_tls_verify {
        return Err(ConfigError::Tls(INSECURE_WITH_ROOTS.into()));
    }
    if let Some(path) = &opts.certificate_authority {
        r.tls.roots = parse_certs(&read(path, "certificate authority")?)
            .map_err(|e| ConfigError::read_file("certificate authority", path, e))?;
        // A CA given verifies: it overrides a kubeconfig's insecure-skip-tls-verify, as
        // kubectl's flag does (a review: the roots were loaded and nothing verified).
        r.tls.insecure = false;
    }
    if opts.insecure_skip_tls_verify {
        r.tls.insecure = true;
    }
    Ok(())
}

/// `https://host:port/prefix/` → `https://host:port/prefix`; only http and https, and no
/// credentials in it (`user:password@`): the URL is logged, written into `--state-dir` files
/// as the cluster's identity, and named in errors — never a place for a secret. An error
/// names the URL with what precedes an `@` hidden.
pub(crate) fn normalize_url(url: &str) -> Result<String, ConfigError> {
    let shown = hide_userinfo(url);
    let bad = |message: &str| ConfigError::InvalidUrl { url: one_line(&shown), message: message.into() };
    let uri: http::Uri = url.trim().parse().map_err(|e: http::uri::InvalidUri| bad(&e.to_string()))?;
    let scheme = match uri.scheme_str() {
        Some(s @ ("http" | "https")) => s,
        Some(_) => return Err(bad("scheme must be http or https")),
        None => return Err(bad("expected scheme://host[:port]")),
    };
    let authority = uri.authority().ok_or_else(|| bad("no host"))?;
    if authority.as_str().contains('@') {
        return Err(bad("credentials in the URL are not supported: give a token or a client certificate"));
    }
    if uri.query().is_some() {
        return Err(bad("a query is not allowed"));
    }
    Ok(format!("{scheme}://{authority}{}", uri.path().trim_end_matches('/')))
}

/// `url` with what precedes its last `@` (after `://`, or of the whole without a scheme)
/// replaced by `***`. A password may hold a `/`, `?`, `#` or digits after a `:` — none of
/// which tells it from a host, a port or a path — so any `@` hides all before it: a path
/// holding one (`http://h:1/a@b` → `http://***@b`) is hidden too, which costs only a log's
/// detail. A query or fragment is hidden as well (`?access_token=…`; refused, but logged with
/// the effective configuration first).
pub fn hide_userinfo(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (format!("{scheme}://"), rest),
        None => (String::new(), url),
    };
    // An `@` after a `?` or `#` may be the query's (`?user=a@b&token=…`): nothing after the
    // scheme is shown then.
    let query_at = rest.find(['?', '#']);
    let (head, tail) = match rest.rfind('@') {
        Some(at) if query_at.is_some_and(|q| q < at) => return format!("{scheme}***"),
        Some(at) => (format!("{scheme}***"), &rest[at..]),
        None => (scheme, rest),
    };
    // A query or fragment may carry a token (`?access_token=…`): hidden too.
    match tail.find(['?', '#']) {
        Some(i) => format!("{head}{}***", &tail[..=i]),
        None => format!("{head}{tail}"),
    }
}

fn read(path: &Path, what: &'static str) -> Result<Vec<u8>, ConfigError> {
    std::fs::read(path).map_err(|e| ConfigError::read_file(what, path, e))
}

/// The CA bundle as PEM again, for an exec plugin's `spec.cluster.certificateAuthorityData`.
fn ca_pem(roots: &[CertificateDer<'static>]) -> Option<Vec<u8>> {
    if roots.is_empty() {
        return None;
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut pem = String::new();
    for c in roots {
        let body = b64.encode(c.as_ref());
        pem.push_str("-----BEGIN CERTIFICATE-----\n");
        for line in body.as_bytes().chunks(64) {
            pem.push_str(&String::from_utf8_lossy(line));
            pem.push('\n');
        }
        pem.push_str("-----END CERTIFICATE-----\n");
    }
    Some(pem.into_bytes())
}

fn decode_b64(s: &str) -> Result<Vec<u8>, String> {
    let compact: String = s.split_whitespace().collect();
    base64::engine::general_purpose::STANDARD.decode(compact).map_err(|e| e.to_string())
}

fn identity(cert_pem: &[u8], key_pem: &[u8]) -> Result<Arc<IdentitySlot>, ConfigError> {
    IdentitySlot::new(&Identity::from_pem(cert_pem, key_pem)?)
}

/// The system trust store, for an `https://` upstream that named no CA.
fn system_roots(env: &Env) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
    const BUNDLES: [&str; 4] = [
        "/etc/ssl/certs/ca-certificates.crt",
        "/etc/pki/tls/certs/ca-bundle.crt",
        "/etc/ssl/ca-bundle.pem",
        "/etc/ssl/cert.pem",
    ];
    let candidates = env.ssl_cert_file.iter().cloned().chain(BUNDLES.iter().map(PathBuf::from));
    for path in candidates {
        if let Ok(pem) = std::fs::read(&path) {
            if let Ok(certs) = parse_certs(&pem) {
                return Ok(certs);
            }
        }
    }
    Err(ConfigError::Tls(
        "the upstream is https but no certificate authority is configured and no system CA bundle \
         was found; pass --certificate-authority or --insecure-skip-tls-verify"
            .into(),
    ))
}

fn kube_err(e: KubeconfigError, label: &str, context: Option<&str>) -> ConfigError {
    match e {
        KubeconfigError::LoadContext(c) => ConfigError::UnknownContext { path: label.into(), context: c },
        KubeconfigError::CurrentContextNotSet => ConfigError::Kubeconfig {
            path: label.into(),
            message: "no current-context set; pass --context".into(),
        },
        KubeconfigError::LoadClusterOfContext(c) => ConfigError::Kubeconfig {
            path: label.into(),
            message: format!("cluster \"{c}\" of context \"{}\" not found", context.unwrap_or_default()),
        },
        KubeconfigError::ReadConfig(io, path) => ConfigError::read_file("kubeconfig", &path, io),
        // Not the parser's text: it quotes values and the lines around (credentials, maybe).
        KubeconfigError::Parse(e) => ConfigError::Kubeconfig {
            path: label.into(),
            message: format!("not valid YAML{}", super::errors::parse_error_at(&e)),
        },
        other => ConfigError::Kubeconfig { path: label.into(), message: one_line(&other.to_string()) },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::testutil::TempDir;

    #[test]
    fn odd_length_utf16_kubeconfig_is_an_error_not_a_panic() {
        let dir = TempDir::new();
        for bom in [[0xFF, 0xFE], [0xFE, 0xFF]] {
            let path = dir.path().join("odd");
            std::fs::write(&path, [bom[0], bom[1], b'a']).unwrap();
            let e = read_kubeconfig(&path).err().unwrap().to_string();
            assert!(e.contains("UTF-16"), "{e}");
            let env = Env {
                kubeconfig_var: Some(path.clone().into()),
                home: None,
                in_cluster: false,
                ssl_cert_file: None,
            };
            assert!(resolve_with(&UpstreamOptions::default(), &env).is_err());
        }
    }
}
