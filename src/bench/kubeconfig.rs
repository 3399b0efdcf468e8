//! The little of a kubeconfig the bench needs for the direct target: the current context's
//! server URL, its CA (`certificate-authority` file or `certificate-authority-data`), and the
//! user's bearer token (inline or `tokenFile`) or client certificate (file or data). Relative
//! file paths are taken from the kubeconfig's directory, as kubectl does. Exec plugins, auth
//! providers and `tls-server-name` are not supported (give `--token` instead).
//!
//! Called by `bench::measure` for `--kubeconfig`.

use std::path::{Path, PathBuf};

use base64::Engine;
use serde::Deserialize;

#[derive(Deserialize)]
struct Kubeconfig {
    #[serde(default, rename = "current-context")]
    current_context: String,
    #[serde(default)]
    contexts: Vec<Named<Context>>,
    #[serde(default)]
    clusters: Vec<Named<ClusterEntry>>,
    #[serde(default)]
    users: Vec<Named<User>>,
}

#[derive(Deserialize)]
struct Named<T> {
    name: String,
    #[serde(alias = "context", alias = "cluster", alias = "user")]
    value: Option<T>,
}

#[derive(Deserialize)]
struct Context {
    cluster: String,
    #[serde(default)]
    user: String,
}

#[derive(Deserialize)]
struct ClusterEntry {
    server: String,
    #[serde(rename = "certificate-authority")]
    ca_file: Option<String>,
    #[serde(rename = "certificate-authority-data")]
    ca_data: Option<String>,
}

#[derive(Deserialize, Default)]
struct User {
    token: Option<String>,
    #[serde(rename = "tokenFile")]
    token_file: Option<String>,
    #[serde(rename = "client-certificate")]
    cert_file: Option<String>,
    #[serde(rename = "client-certificate-data")]
    cert_data: Option<String>,
    #[serde(rename = "client-key")]
    key_file: Option<String>,
    #[serde(rename = "client-key-data")]
    key_data: Option<String>,
}

/// What the bench takes from the current context.
#[derive(Debug, Default, PartialEq)]
pub struct Cluster {
    /// The server URL without a trailing slash.
    pub server: String,
    /// The cluster's CA bundle (PEM).
    pub ca: Option<Vec<u8>>,
    pub token: Option<String>,
    /// The user's client certificate and key (PEM).
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

fn find<'a, T>(list: &'a [Named<T>], name: &str) -> Option<&'a T> {
    list.iter().find(|n| n.name == name).and_then(|n| n.value.as_ref())
}

/// The current context's cluster and credentials.
pub fn load(path: &Path) -> Result<Cluster, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("--kubeconfig {}: {e}", path.display()))?;
    let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
    parse(&text, &dir).map_err(|e| format!("--kubeconfig {}: {e}", path.display()))
}

/// A file's bytes or inline base64 data, the data winning (kubectl's rule).
fn file_or_data(
    file: &Option<String>,
    data: &Option<String>,
    dir: &Path,
    what: &str,
) -> Result<Option<Vec<u8>>, String> {
    if let Some(d) = data.as_deref().filter(|d| !d.is_empty()) {
        let clean: String = d.split_whitespace().collect();
        return base64::engine::general_purpose::STANDARD
            .decode(clean)
            .map(Some)
            .map_err(|e| format!("{what}-data: {e}"));
    }
    match file.as_deref().filter(|f| !f.is_empty()) {
        Some(f) => {
            let p: PathBuf = dir.join(f);
            std::fs::read(&p).map(Some).map_err(|e| format!("{what} {}: {e}", p.display()))
        }
        None => Ok(None),
    }
}

fn parse(text: &str, dir: &Path) -> Result<Cluster, String> {
    let kc: Kubeconfig = serde_saphyr::from_str(text).map_err(|e| e.to_string())?;
    let ctx = find(&kc.contexts, &kc.current_context)
        .ok_or_else(|| format!("current context {:?} not found", kc.current_context))?;
    let cluster =
        find(&kc.clusters, &ctx.cluster).ok_or_else(|| format!("cluster {:?} not found", ctx.cluster))?;
    if !cluster.server.starts_with("http://") && !cluster.server.starts_with("https://") {
        return Err(format!("server {:?} is neither http:// nor https://", cluster.server));
    }
    let ca = file_or_data(&cluster.ca_file, &cluster.ca_data, dir, "certificate-authority")?;
    let no_user = User::default();
    let user = find(&kc.users, &ctx.user).unwrap_or(&no_user);
    let token = match (&user.token, &user.token_file) {
        (Some(t), _) if !t.trim().is_empty() => Some(t.trim().to_owned()),
        (_, Some(f)) if !f.is_empty() => {
            let p = dir.join(f);
            Some(
                std::fs::read_to_string(&p)
                    .map_err(|e| format!("tokenFile {}: {e}", p.display()))?
                    .trim()
                    .to_owned(),
            )
        }
        _ => None,
    };
    let cert = file_or_data(&user.cert_file, &user.cert_data, dir, "client-certificate")?;
    let key = file_or_data(&user.key_file, &user.key_data, dir, "client-key")?;
    let identity = match (cert, key) {
        (Some(c), Some(k)) => Some((c, k)),
        (None, None) => None,
        _ => return Err(format!("user {:?} has only one of client-certificate and client-key", ctx.user)),
    };
    Ok(Cluster { server: cluster.server.trim_end_matches('/').to_owned(), ca, token, identity })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KC: &str = "apiVersion: v1\nkind: Config\ncurrent-context: b\nclusters:\n- name: c1\n  cluster:\n    server: http://10.0.0.1:8080/\ncontexts:\n- name: a\n  context:\n    cluster: nope\n- name: b\n  context:\n    cluster: c1\n    user: u\nusers:\n- name: u\n  user:\n    token: sekrit\n";

    #[test]
    fn current_context_server_and_token() {
        let c = parse(KC, Path::new("/")).unwrap();
        assert_eq!(
            c,
            Cluster {
                server: "http://10.0.0.1:8080".into(),
                token: Some("sekrit".into()),
                ..Cluster::default()
            }
        );
        let missing = KC.replace("current-context: b", "current-context: z");
        assert!(parse(&missing, Path::new("/")).unwrap_err().contains("\"z\""));
        let odd = KC.replace("http://10.0.0.1:8080/", "ftp://x");
        assert!(parse(&odd, Path::new("/")).unwrap_err().contains("neither"));
    }

    #[test]
    fn https_with_ca_data_or_a_relative_ca_file_and_a_client_certificate() {
        let dir = std::env::temp_dir().join(format!("kwc-kubeconfig-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("ca.crt"), "CA PEM").unwrap();
        std::fs::write(dir.join("token"), "from-file\n").unwrap();
        let tls = KC
            .replace("http://10.0.0.1:8080/", "https://10.0.0.1:6443\n    certificate-authority: ca.crt")
            .replace(
                "token: sekrit",
                "tokenFile: token\n    client-certificate-data: Q0VSVA==\n    client-key-data: S0VZ",
            );
        let c = parse(&tls, &dir).unwrap();
        assert_eq!(c.server, "https://10.0.0.1:6443");
        assert_eq!(c.ca.as_deref(), Some(&b"CA PEM"[..]));
        assert_eq!(c.token.as_deref(), Some("from-file"));
        assert_eq!(c.identity, Some((b"CERT".to_vec(), b"KEY".to_vec())));
        let data = tls.replace("certificate-authority: ca.crt", "certificate-authority-data: REFUQQ==");
        assert_eq!(parse(&data, &dir).unwrap().ca.as_deref(), Some(&b"DATA"[..]));
        let half = tls.replace("    client-key-data: S0VZ\n", "");
        assert!(parse(&half, &dir).unwrap_err().contains("only one"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
