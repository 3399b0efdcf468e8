//! Forward upstream: a request the cache does not serve goes to the apiserver and its answer
//! comes back unchanged, streamed both ways (`upstream::Upstream::forward` does the work; this
//! picks whose identity it carries and maps transport failures to a Status).
//!
//! Identities stay apart: a token caller's request goes with its own `Authorization` unchanged;
//! an anonymous caller's goes with no credentials; a certificate caller's goes with the proxy's
//! credentials and `Impersonate-*` headers naming the (authorized) effective user. With
//! `--auth=none` (a trusted loopback sidecar) requests go as the proxy itself, like `kubectl
//! proxy`: the proxy's credentials replace the caller's `Authorization`, and `Impersonate-*`
//! headers are dropped. Called by `phase::dispatch`.

use std::net::SocketAddr;

use http::{HeaderMap, HeaderName, HeaderValue, Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::auth::{impersonate, Caller, Credential};
use super::body::{self, Body};
use crate::error::Error;
use crate::upstream::Upstream;

/// The caller's TCP peer address, put into each request's extensions by the listener.
#[derive(Clone, Copy, Debug)]
pub struct PeerAddr(pub SocketAddr);

/// The address a request came from (the listener attaches it), for per-source review shares.
pub fn source<B>(req: &http::Request<B>) -> Option<std::net::IpAddr> {
    req.extensions().get::<PeerAddr>().map(|p| p.0.ip())
}

/// The request-header authentication headers to drop (`--requestheader-*`).
#[derive(Clone, Debug)]
pub struct TrustedHeaders {
    names: Vec<HeaderName>,
    prefixes: Vec<String>,
}

impl Default for TrustedHeaders {
    fn default() -> Self {
        TrustedHeaders::new(&[], &[])
    }
}

impl TrustedHeaders {
    /// Exact `names` (user, group, uid headers) and extra-header `prefixes`, on top of the
    /// kube-apiserver defaults (`X-Remote-User`, `X-Remote-Group`, `X-Remote-Uid`,
    /// `X-Remote-Extra-`), compared without case. A name that is not a valid header name
    /// cannot arrive and is ignored.
    pub fn new(names: &[String], prefixes: &[String]) -> TrustedHeaders {
        let mut n: Vec<HeaderName> = ["x-remote-user", "x-remote-group", "x-remote-uid"]
            .iter()
            .map(|s| HeaderName::from_static(s))
            .collect();
        n.extend(
            names
                .iter()
                .filter_map(|s| HeaderName::from_bytes(s.trim().to_ascii_lowercase().as_bytes()).ok()),
        );
        let mut p = vec!["x-remote-extra-".to_owned()];
        p.extend(prefixes.iter().map(|s| s.trim().to_ascii_lowercase()).filter(|s| !s.is_empty()));
        TrustedHeaders { names: n, prefixes: p }
    }

    /// Drops them, and sets `X-Forwarded-For` to `peer` (none without a peer).
    pub fn clean(&self, headers: &mut HeaderMap, peer: Option<SocketAddr>) {
        for n in &self.names {
            headers.remove(n);
        }
        let prefixed: Vec<HeaderName> = headers
            .keys()
            .filter(|k| self.prefixes.iter().any(|p| k.as_str().starts_with(p.as_str())))
            .cloned()
            .collect();
        for n in prefixed {
            headers.remove(n);
        }
        headers.remove("x-real-ip");
        headers.remove("x-forwarded-for");
        if let Some(peer) = peer {
            if let Ok(v) = HeaderValue::from_str(&peer.ip().to_string()) {
                headers.insert("x-forwarded-for", v);
            }
        }
    }
}

pub async fn forward(
    upstream: &Upstream,
    mut req: Request<Incoming>,
    caller: &Caller,
    trusted: &TrustedHeaders,
) -> Response<Body> {
    if upstream.escapes_prefix(req.uri().path()) {
        return body::error(Error::BadRequest(crate::upstream::PREFIX_ESCAPE.into()));
    }
    let peer = req.extensions().get::<PeerAddr>().map(|p| p.0);
    trusted.clean(req.headers_mut(), peer);
    let sent = match caller.credential {
        Credential::Certificate => {
            let mut imp = HeaderMap::new();
            if let Err(e) = impersonate::set(&mut imp, &caller.effective) {
                return body::error(Error::Internal(e));
            }
            upstream.forward_impersonating(req, imp).await
        }
        Credential::Trusted => upstream.forward_as_proxy(req).await,
        // Never the proxy's credentials: the token caller's own header, or none at all.
        Credential::Anonymous | Credential::Token => upstream.forward(req).await,
    };
    match sent {
        Ok(resp) => resp.map(|b| b.map_err(Into::into).boxed_unsync()),
        Err(e) => {
            static FAILED: crate::warn_gate::WarnGate = crate::warn_gate::WarnGate::new();
            match FAILED.pass() {
                Some(held) => {
                    tracing::warn!(error = %e, similar_since_last = held, "forwarding upstream failed")
                }
                None => tracing::debug!(error = %e, "forwarding upstream failed"),
            }
            body::error(Error::ServiceUnavailable(format!(
                "the upstream apiserver could not be reached: {e}"
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trusted_headers_are_dropped_and_the_peer_is_the_forwarded_for() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("x-remote-user", "system:admin"),
            ("X-Remote-Group", "system:masters"),
            ("x-remote-uid", "0"),
            ("x-remote-extra-scopes", "a"),
            ("x-my-user", "root"),
            ("x-my-extra-k", "v"),
            ("x-forwarded-for", "10.0.0.1"),
            ("x-real-ip", "10.0.0.1"),
            ("accept", "application/json"),
        ] {
            h.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_static(v));
        }
        let t = TrustedHeaders::new(&["X-My-User".into()], &["X-My-Extra-".into()]);
        t.clean(&mut h, Some("192.0.2.7:5000".parse().unwrap()));
        let mut left: Vec<(String, String)> =
            h.iter().map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_owned())).collect();
        left.sort();
        assert_eq!(
            left,
            [("accept".into(), "application/json".into()), ("x-forwarded-for".into(), "192.0.2.7".into())]
        );
    }
}
