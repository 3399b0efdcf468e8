//! The little of a kubeconfig the bench needs: the current context's server URL and bearer
//! token (inline or `tokenFile`). Called by `bench::measure` for `--kubeconfig`.
//!
//! Plain HTTP only for now; an `https://` server is refused with a hint (`kubectl proxy`).

use std::path::Path;

use serde::Deserialize;

#[derive(Deserialize)]
struct Kubeconfig {
    #[serde(default, rename = "current-context")]
    current_context: String,
    #[serde(default)]
    contexts: Vec<Named<Context>>,
    #[serde(default)]
    clusters: Vec<Named<Cluster>>,
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
struct Cluster {
    server: String,
}

#[derive(Deserialize, Default)]
struct User {
    token: Option<String>,
    #[serde(rename = "tokenFile")]
    token_file: Option<String>,
}

fn find<'a, T>(list: &'a [Named<T>], name: &str) -> Option<&'a T> {
    list.iter().find(|n| n.name == name).and_then(|n| n.value.as_ref())
}

/// The server URL (no trailing slash) and bearer token of the current context.
pub fn server_and_token(path: &Path) -> Result<(String, Option<String>), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("--kubeconfig {}: {e}", path.display()))?;
    parse(&text).map_err(|e| format!("--kubeconfig {}: {e}", path.display()))
}

fn parse(text: &str) -> Result<(String, Option<String>), String> {
    let kc: Kubeconfig = serde_saphyr::from_str(text).map_err(|e| e.to_string())?;
    let ctx = find(&kc.contexts, &kc.current_context)
        .ok_or_else(|| format!("current context {:?} not found", kc.current_context))?;
    let cluster =
        find(&kc.clusters, &ctx.cluster).ok_or_else(|| format!("cluster {:?} not found", ctx.cluster))?;
    if !cluster.server.starts_with("http://") {
        return Err(format!(
            "server {} is not plain http; run `kubectl proxy` and pass --direct http://127.0.0.1:8001",
            cluster.server
        ));
    }
    let user = find(&kc.users, &ctx.user);
    let token = match user {
        Some(User { token: Some(t), .. }) => Some(t.clone()),
        Some(User { token_file: Some(f), .. }) => {
            Some(std::fs::read_to_string(f).map_err(|e| format!("tokenFile {f}: {e}"))?.trim().to_owned())
        }
        _ => None,
    };
    Ok((cluster.server.trim_end_matches('/').to_owned(), token))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn current_context_server_and_token() {
        let kc = "apiVersion: v1\nkind: Config\ncurrent-context: b\nclusters:\n- name: c1\n  cluster:\n    server: http://10.0.0.1:8080/\ncontexts:\n- name: a\n  context:\n    cluster: nope\n- name: b\n  context:\n    cluster: c1\n    user: u\nusers:\n- name: u\n  user:\n    token: sekrit\n";
        assert_eq!(parse(kc), Ok(("http://10.0.0.1:8080".into(), Some("sekrit".into()))));
        let tls = kc.replace("http://10.0.0.1:8080/", "https://10.0.0.1:6443");
        assert!(parse(&tls).unwrap_err().contains("kubectl proxy"));
        let missing = kc.replace("current-context: b", "current-context: z");
        assert!(parse(&missing).unwrap_err().contains("\"z\""));
    }
}
