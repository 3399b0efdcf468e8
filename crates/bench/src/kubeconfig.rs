//! The direct target of `bench --kubeconfig`, resolved exactly as `serve --kubeconfig` resolves
//! its upstream (`upstream::resolve`, kube-client's loader): the context's server URL, its CA,
//! `tls-server-name`, `insecure-skip-tls-verify` (with the same loud warning), a token, token
//! file, client certificate (file or inline data) or exec credential plugin (renewed before it
//! expires, for the whole run).
//!
//! Called by `bench::modes` for `--kubeconfig`.

use std::path::Path;
use std::sync::Arc;

use kube_watchcache::upstream::{self, Credentials, TlsSettings, UpstreamOptions};

/// What the bench takes from the kubeconfig.
pub struct Cluster {
    /// The server URL without a trailing slash.
    pub server: String,
    pub tls: TlsSettings,
    /// The bearer credential (token, token file, exec plugin), sent to both targets.
    pub auth: Option<Arc<Credentials>>,
}

/// The current context's cluster and credentials (`context`: another one).
pub fn load(path: &Path, context: Option<&str>) -> Result<Cluster, String> {
    let opts = UpstreamOptions {
        kubeconfig: Some(path.to_owned()),
        context: context.map(str::to_owned),
        ..UpstreamOptions::default()
    };
    let r = upstream::resolve(&opts).map_err(|e| format!("--kubeconfig: {e}"))?;
    if r.tls.insecure && r.base_url.starts_with("https://") {
        eprintln!(
            "WARNING: {}: insecure-skip-tls-verify: the server's certificate is not verified; anyone \
             on the path can pose as the apiserver and receive the bench's credentials",
            r.base_url
        );
    }
    let auth = match r.auth {
        Credentials::None => None,
        a => Some(Arc::new(a)),
    };
    Ok(Cluster { server: r.base_url, tls: r.tls, auth })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KC: &str = "apiVersion: v1\nkind: Config\ncurrent-context: b\nclusters:\n- name: c1\n  cluster:\n    server: http://10.0.0.1:8080/\ncontexts:\n- name: a\n  context:\n    cluster: nope\n- name: b\n  context:\n    cluster: c1\n    user: u\nusers:\n- name: u\n  user:\n    token: sekrit\n";

    fn write(name: &str, text: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("kwc-bench-kubeconfig-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn current_context_server_token_and_errors() {
        let c = load(&write("kc", KC), None).unwrap();
        assert_eq!(c.server, "http://10.0.0.1:8080");
        assert_eq!(c.auth.unwrap().header().unwrap(), "Bearer sekrit");
        let missing = write("missing", &KC.replace("current-context: b", "current-context: z"));
        assert!(load(&missing, None).err().unwrap().contains("\"z\""));
        assert!(load(&write("kc2", KC), Some("a")).err().unwrap().contains("nope"));
    }

    #[test]
    fn tls_server_name_insecure_and_inline_client_certificate() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/testdata/security");
        let b64 = |f: &str| {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.encode(std::fs::read(dir.join(f)).unwrap())
        };
        let kc = KC
            .replace(
                "http://10.0.0.1:8080/",
                &format!(
                    "https://10.0.0.1:6443\n    certificate-authority-data: {}\n    tls-server-name: apiserver.test",
                    b64("server-ca.crt")
                ),
            )
            .replace(
                "token: sekrit",
                &format!("client-certificate-data: {}\n    client-key-data: {}", b64("server1.crt"), b64("server1.key")),
            );
        let c = load(&write("tls", &kc), None).unwrap();
        assert_eq!(c.server, "https://10.0.0.1:6443");
        assert_eq!(c.tls.server_name.as_deref(), Some("apiserver.test"));
        assert_eq!(c.tls.roots.len(), 1);
        assert!(c.tls.identity.is_some() && c.auth.is_none());
        let insecure =
            kc.replace("    tls-server-name: apiserver.test", "    insecure-skip-tls-verify: true");
        // A certificate authority with insecure-skip-tls-verify: client-go's refusal.
        assert!(load(&write("insecure-ca", &insecure), None).is_err());
        let ca_line = format!("\n    certificate-authority-data: {}", b64("server-ca.crt"));
        let insecure = insecure.replace(&ca_line, "");
        assert!(load(&write("insecure", &insecure), None).unwrap().tls.insecure);
    }
}
