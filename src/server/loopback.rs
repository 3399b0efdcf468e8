//! The browser guard of `--auth=none` (issue 21 item 1). With no authentication, every request
//! goes upstream with the proxy's own credentials, so anything that can make a request to the
//! loopback listener acts as the proxy: a web page through DNS rebinding (its name resolves to
//! 127.0.0.1, its requests carry `Host: attacker.example:port`), or a cross-origin WebSocket
//! (`Origin: https://evil.example`, which browsers do not restrict). Like `kubectl proxy`
//! (staging/src/k8s.io/kubectl/pkg/proxy/proxy_server.go, `FilterServer`), a request is
//! refused with 403 unless its Host (without the port) matches `--accept-hosts`, and when its
//! path matches `--reject-paths` (exec and attach by default) or its method
//! `--reject-methods`. Beyond kubectl proxy: a request carrying an `Origin` header (sent by
//! browsers, never by Kubernetes clients) is refused unless the origin matches
//! `--accept-origins` (none by default).
//!
//! Built by `app` from the flags (their defaults, kubectl proxy's, are in `config`); called by
//! `phase::guard` before anything else.

use http::{header, Request, Response};
use regex::Regex;

use super::body::{self, Body};
use crate::error::Error;

/// The compiled filters.
#[derive(Clone, Debug)]
pub struct LoopbackGuard {
    accept_hosts: Vec<Regex>,
    reject_paths: Vec<Regex>,
    reject_methods: Vec<Regex>,
    accept_origins: Vec<Regex>,
}

/// Comma-separated regular expressions, as kubectl's `MakeRegexpArray`; empty gives none.
fn regexps(flag: &str, list: &str) -> Result<Vec<Regex>, String> {
    list.split(',')
        .filter(|s| !s.is_empty())
        .map(|s| Regex::new(s).map_err(|e| format!("--{flag}: {s:?}: {e}")))
        .collect()
}

fn matches(list: &[Regex], s: &str) -> bool {
    list.iter().any(|r| r.is_match(s))
}

impl LoopbackGuard {
    pub fn new(
        accept_hosts: &str,
        reject_paths: &str,
        reject_methods: &str,
        accept_origins: &str,
    ) -> Result<LoopbackGuard, String> {
        Ok(LoopbackGuard {
            accept_hosts: regexps("accept-hosts", accept_hosts)?,
            reject_paths: regexps("reject-paths", reject_paths)?,
            reject_methods: regexps("reject-methods", reject_methods)?,
            accept_origins: regexps("accept-origins", accept_origins)?,
        })
    }

    /// `Ok` when `req` may go on; else the 403 to answer, with the reason.
    // The `Err` is the refusal response itself, as in `limits`.
    #[allow(clippy::result_large_err)]
    pub fn check<B>(&self, req: &Request<B>) -> Result<(), Response<Body>> {
        // kubectl proxy matches `req.URL.Path`, the decoded path, and so does the apiserver
        // route it: `%65xec` is `exec` there (issue 30 §4). An encoded `/` would make the two
        // readings differ again (a segment here, a separator there): refused outright.
        let raw = req.uri().path();
        let path = percent_encoding::percent_decode_str(raw).decode_utf8_lossy();
        let method = req.method().as_str();
        let host = host_of(req);
        let refused = if raw.contains("%2F") || raw.contains("%2f") {
            Some(format!("path {raw:?} has an encoded '/'"))
        } else if matches(&self.reject_paths, &path) {
            Some(format!("path {path:?} is rejected (--reject-paths)"))
        } else if matches(&self.reject_methods, method) {
            Some(format!("method {method} is rejected (--reject-methods)"))
        } else if !matches(&self.accept_hosts, &host) {
            Some(format!("host {host:?} is not accepted (--accept-hosts)"))
        } else {
            match req.headers().get(header::ORIGIN) {
                Some(o) => {
                    let origin = String::from_utf8_lossy(o.as_bytes());
                    (!matches(&self.accept_origins, &origin))
                        .then(|| format!("origin {origin:?} is not accepted (--accept-origins)"))
                }
                None => None,
            }
        };
        match refused {
            None => Ok(()),
            Some(why) => {
                // A web page can send these at will: one line per 30 s, the path cut short.
                static REFUSED: crate::warn_gate::WarnGate = crate::warn_gate::WarnGate::new();
                let path: String = raw.chars().take(200).collect();
                match REFUSED.pass() {
                    Some(held) => {
                        tracing::warn!(%method, %path, reason = %why, similar_since_last = held, "--auth=none: request refused")
                    }
                    None => tracing::debug!(%method, %path, reason = %why, "--auth=none: request refused"),
                }
                let message = format!("forbidden: {why}");
                Err(body::error(Error::Forbidden {
                    message,
                    name: String::new(),
                    group: String::new(),
                    kind: String::new(),
                }))
            }
        }
    }
}

/// The request's host without its port: the `Host` header (HTTP/1.1) or the URI authority
/// (HTTP/2 `:authority`). An IPv6 literal keeps its brackets (`[::1]`), which the default
/// `--accept-hosts` expects. No host at all is `""`, which no default accepts.
fn host_of<B>(req: &Request<B>) -> String {
    let raw = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned)
        .or_else(|| req.uri().authority().map(|a| a.as_str().to_owned()))
        .unwrap_or_default();
    let raw = raw.rsplit_once('@').map_or(raw.as_str(), |(_, h)| h);
    if let Some(rest) = raw.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((ip, _)) => format!("[{ip}]"),
            None => raw.to_owned(),
        };
    }
    raw.split_once(':').map_or(raw, |(h, _)| h).to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ACCEPT_HOSTS, REJECT_METHODS, REJECT_PATHS};

    fn req(method: &str, uri: &str, headers: &[(&str, &str)]) -> Request<()> {
        let mut b = Request::builder().method(method).uri(uri);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap()
    }

    fn defaults() -> LoopbackGuard {
        LoopbackGuard::new(ACCEPT_HOSTS, REJECT_PATHS, REJECT_METHODS, "").unwrap()
    }

    #[test]
    fn hosts_paths_methods_and_origins() {
        let g = defaults();
        let ok = |r: Request<()>| g.check(&r).is_ok();
        for host in ["localhost:8001", "127.0.0.1:8001", "[::1]:8001", "LOCALHOST:1", "localhost"] {
            assert!(ok(req("GET", "/api/v1/pods", &[("host", host)])), "{host}");
        }
        // DNS rebinding: the attacker's name with the proxy's port.
        for host in
            ["attacker.example:18080", "localhost.attacker.example:1", "127.0.0.1.nip.io:1", "", "[::2]:1"]
        {
            assert!(!ok(req("GET", "/api/v1/namespaces/kube-system/secrets", &[("host", host)])), "{host:?}");
        }
        // HTTP/2: the authority.
        assert!(ok(req("GET", "http://127.0.0.1:8001/api", &[])));
        assert!(!ok(req("GET", "http://evil.example:8001/api", &[])));
        // Exec and attach, whatever the host; port-forward and logs are kubectl proxy's too.
        for p in ["/api/v1/namespaces/ns/pods/p/exec?command=id", "/api/v1/namespaces/ns/pods/p/attach"] {
            assert!(!ok(req("POST", p, &[("host", "localhost:1")])), "{p}");
            assert!(!ok(req("GET", p, &[("host", "localhost:1"), ("upgrade", "websocket")])), "{p}");
        }
        assert!(ok(req("GET", "/api/v1/namespaces/ns/pods/p/log", &[("host", "localhost:1")])));
        // Any browser origin is refused unless accepted.
        let evil = [("host", "127.0.0.1:1"), ("origin", "https://evil.example")];
        assert!(!ok(req("GET", "/api/v1/pods", &evil)));
        let g =
            LoopbackGuard::new(ACCEPT_HOSTS, REJECT_PATHS, "^DELETE$", r"^https://dash\.example$").unwrap();
        assert!(g
            .check(&req("GET", "/api", &[("host", "localhost:1"), ("origin", "https://dash.example")]))
            .is_ok());
        assert!(g.check(&req("GET", "/api", &evil)).is_err());
        assert!(g.check(&req("DELETE", "/api/v1/namespaces/a", &[("host", "localhost:1")])).is_err());
        let r = g.check(&req("GET", "/api", &evil)).unwrap_err();
        assert_eq!(r.status(), 403);
    }

    /// Issue 30 §4: the decoded path is matched, as kubectl proxy and the apiserver read it;
    /// an encoded `/` is refused.
    #[test]
    fn encoded_paths_are_matched_decoded() {
        let g = defaults();
        let host = [("host", "localhost:1")];
        for p in [
            "/api/v1/namespaces/ns/pods/p/%65xec?command=id",
            "/api/v1/namespaces/ns/%70ods/p/exec",
            "/api/v1/namespaces/ns/pods/p/%61ttach",
            "/%61pi/v1/namespaces/ns/pods/p/exec",
            "/api/v1/namespaces/ns/pods/p%2Fexec",
            "/api/v1/namespaces/ns/pods%2fp/log",
        ] {
            assert!(g.check(&req("POST", p, &host)).is_err(), "{p}");
            assert!(
                g.check(&req("GET", p, &[("host", "localhost:1"), ("upgrade", "websocket")])).is_err(),
                "{p}"
            );
        }
        for p in [
            "/api/v1/namespaces/ns/pods/p/log",
            "/api/v1/namespaces/ns/configmaps/a%20b",
            "/api/v1/namespaces/ns/pods/%65",
        ] {
            assert!(g.check(&req("GET", p, &host)).is_ok(), "{p}");
        }
    }

    #[test]
    fn bad_patterns_are_named() {
        let e = LoopbackGuard::new("(", "", "", "").unwrap_err();
        assert!(e.starts_with("--accept-hosts: \"(\""), "{e}");
    }
}
