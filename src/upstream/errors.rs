//! [`ConfigError`], the error of an unusable upstream configuration, and [`one_line`]: shared
//! by `config` (which resolves the configuration), `auth` (token files) and `client`; depends
//! on nothing else of the crate, so that those modules need not import each other for it.

use std::path::Path;

/// A configuration that cannot be used. `Display` is one line; `main` prints it and exits 2.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "no upstream configured: pass --upstream or --kubeconfig, set KUBECONFIG, create \
         ~/.kube/config, or run in a pod with a service account"
    )]
    NoSource,
    #[error("kubeconfig {path}: {message}")]
    Kubeconfig { path: String, message: String },
    #[error("kubeconfig {path}: context \"{context}\" not found")]
    UnknownContext { path: String, context: String },
    #[error("in-cluster config: {0}")]
    InCluster(String),
    #[error("invalid upstream URL \"{url}\": {message}")]
    InvalidUrl { url: String, message: String },
    #[error("cannot read {what} {path}: {message}")]
    ReadFile { what: &'static str, path: String, message: String },
    #[error("TLS setup: {0}")]
    Tls(String),
    #[error("unsupported credentials: {0}")]
    Unsupported(String),
    #[error("{0}")]
    Exec(String),
}

impl ConfigError {
    pub(crate) fn read_file(what: &'static str, path: &Path, err: impl std::fmt::Display) -> ConfigError {
        ConfigError::ReadFile { what, path: path.display().to_string(), message: one_line(&err.to_string()) }
    }
}

/// Collapses a message onto one line (YAML parse errors carry snippets over several lines).
pub(crate) fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Where a YAML (or JSON) document holding credentials failed to parse — ` at line L, column
/// C`, or nothing — and not what it says there: the parser's message quotes values and its
/// snippet shows the lines around, either of which may be a token.
pub(crate) fn parse_error_at(e: &serde_saphyr::Error) -> String {
    match e.location() {
        Some(l) => format!(" at line {}, column {}", l.line(), l.column()),
        None => String::new(),
    }
}
