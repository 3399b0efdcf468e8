//! Pass-through of a caller's request to the upstream, unchanged and streamed both ways, on a
//! client that carries none of the proxy's credentials.
//!
//! With [`Upstream::forward_impersonating`] the proxy's own credentials are used instead, with
//! impersonation headers naming the caller (certificate callers); with
//! [`Upstream::forward_as_proxy`] the request goes as the proxy itself, like `kubectl proxy`
//! (`--auth=none`, a trusted loopback sidecar).
//!
//! Called by `server::proxy` for everything the cache does not serve. Hop-by-hop headers are
//! dropped (RFC 9110 §7.6.1) and `Host` becomes the upstream's. Upgrades (`kubectl exec`,
//! `attach`, `port-forward`: SPDY/3.1 or websocket) go over an HTTP/1.1-only client; on `101`
//! the two upgraded connections are spliced by a spawned task and the 101 goes back to the
//! caller (`splice`: ended as well once one side has closed and nothing moves for five
//! minutes). The server must serve its connections with upgrades enabled. What the request
//! carries as [`HeldWhileUpgraded`] goes with the splice and is dropped when it ends (the
//! server's per-user slot of a session, and its connection's `--max-connections` slot: an exec
//! session is held open as long as a watch, and its two sockets outlive hyper's connection).

use bytes::Bytes;
use http::header::{HeaderName, AUTHORIZATION, CONNECTION, HOST, TE, TRAILER, TRANSFER_ENCODING, UPGRADE};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

use super::client::transport;
use super::splice::{Ended, HALF_CLOSED_IDLE};
use super::{BoxBody, Upstream, UpstreamError};

/// At most one own request per this long confirms forwarded 401s
/// ([`Upstream::confirm_own_refusal`]).
const REFUSAL_PROBE_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// Hop-by-hop headers besides those the `Connection` header names.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
];

/// What the caller's request carries (an extension) that must live as long as an upgraded
/// session: the server's per-user stream slot and its connection slot (`--max-connections`).
/// Moved into the splice on `101`, dropped with the request otherwise.
#[derive(Clone, Default)]
pub struct HeldWhileUpgraded(Vec<std::sync::Arc<dyn Send + Sync>>);

impl HeldWhileUpgraded {
    /// Adds `what` to those `req` holds while upgraded (beside any added before).
    pub fn hold<B>(req: &mut Request<B>, what: std::sync::Arc<dyn Send + Sync>) {
        req.extensions_mut().get_or_insert_default::<HeldWhileUpgraded>().0.push(what);
    }

    /// How many things are held.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The protocols Kubernetes upgrades to: `kubectl exec` / `attach` / `port-forward` speak
/// SPDY/3.1 or websocket (the `v5.channel.k8s.io`-style subprotocols ride inside websocket's
/// `Sec-WebSocket-Protocol`, passed on unchanged).
const UPGRADES: [&str; 2] = ["SPDY/3.1", "websocket"];

/// The `Upgrade` value when the request asks to upgrade (`Connection: upgrade` + `Upgrade`) to
/// a protocol Kubernetes uses. Any other `Upgrade` is not an upgrade: the request is forwarded
/// as a plain one with the header dropped (what the apiserver's handlers do with it), so a
/// caller cannot pick the HTTP/1.1 upgrade path for an ordinary request.
pub(crate) fn upgrade_protocol(headers: &HeaderMap) -> Option<HeaderValue> {
    let asks = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    let proto = headers.get(UPGRADE)?;
    let known = proto.to_str().is_ok_and(|p| UPGRADES.iter().any(|u| p.trim().eq_ignore_ascii_case(u)));
    (asks && known).then(|| proto.clone())
}

/// Removes hop-by-hop headers, `Upgrade`, and every header named in `Connection`.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    headers.remove(UPGRADE);
    debug_assert!(!headers.contains_key(TE) && !headers.contains_key(TRAILER));
    debug_assert!(!headers.contains_key(TRANSFER_ENCODING));
}

/// Replaces every header value by a copy of its own. hyper reads an HTTP/1.1 message's header
/// values as slices of its connection's read buffer (a request's up to `--max-header-bytes`,
/// 1 MiB), and an HTTP/2 connection's HPACK table keeps the values it indexes for as long as
/// that connection lives: a slice kept there keeps its whole buffer. About 120 forwarded
/// HTTP/1.1 requests, each with a 1 MiB padding header and a small distinct one, held ~120 MiB on
/// one shared upstream connection, where the table's own bound is 4 KiB (review). A copy holds
/// only its bytes.
pub(crate) fn own_values(headers: &mut HeaderMap) {
    for v in headers.values_mut() {
        if let Ok(mut copy) = HeaderValue::from_bytes(v.as_bytes()) {
            copy.set_sensitive(v.is_sensitive());
            *v = copy;
        }
    }
}

/// Removes every `Impersonate-*` header a caller sent.
pub(crate) fn strip_impersonation(headers: &mut HeaderMap) {
    let names: Vec<HeaderName> =
        headers.keys().filter(|n| n.as_str().starts_with("impersonate-")).cloned().collect();
    for name in names {
        headers.remove(name);
    }
}

/// A forwarded request's headers from the caller's: hop-by-hop ones dropped (the address
/// `server::proxy` set in `X-Forwarded-For` kept), `Host` dropped (the client sets the
/// upstream's), every value a copy of its own ([`own_values`]); with `impersonation` (the
/// proxy's own identity), the caller's `Authorization` and `Impersonate-*` replaced by these
/// and `own_authorization`.
fn outgoing_headers(
    h: &mut HeaderMap,
    impersonation: Option<HeaderMap>,
    own_authorization: Option<HeaderValue>,
) {
    // A caller naming `X-Forwarded-For` in `Connection` must not remove it (issue 30 §3).
    let forwarded_for = h.get(X_FORWARDED_FOR).cloned();
    strip_hop_by_hop(h);
    if let Some(v) = forwarded_for {
        h.insert(X_FORWARDED_FOR, v);
    }
    h.remove(HOST);
    own_values(h);
    // Never indexed in the shared upstream connection's HPACK table (beside other callers'
    // requests, a compression oracle's target): a caller's token, in `Authorization` or in a
    // WebSocket subprotocol (`base64url.bearer.authorization.k8s.io.<token>`).
    for name in [AUTHORIZATION, http::header::SEC_WEBSOCKET_PROTOCOL] {
        if let http::header::Entry::Occupied(mut e) = h.entry(name) {
            for v in e.iter_mut() {
                v.set_sensitive(true);
            }
        }
    }
    if let Some(imp) = impersonation {
        h.remove(AUTHORIZATION);
        strip_impersonation(h);
        for (name, value) in &imp {
            h.append(name.clone(), value.clone());
        }
        if let Some(auth) = own_authorization {
            h.insert(AUTHORIZATION, auth);
        }
    }
}

impl Upstream {
    /// A request forwarded with the proxy's credential was answered 401: the apiserver refusing
    /// that credential, or something behind it (a `proxy` subresource's backend, an aggregated
    /// API) answering 401 itself. An own request tells which — its 401 renews the credential
    /// (`Inner::send_own`) — made at most once per [`REFUSAL_PROBE_EVERY`] (a review: callers
    /// made the exec credential plugin run again every 5 s with a backend's 401s).
    fn confirm_own_refusal(&self) {
        let now = tokio::time::Instant::now();
        {
            let mut last = self.inner.refusal_probed.lock();
            if last.is_some_and(|t| now.duration_since(t) < REFUSAL_PROBE_EVERY) {
                return;
            }
            *last = Some(now);
        }
        let up = self.clone();
        tokio::spawn(async move {
            if let Err(e) = up.get_json("/version").await {
                tracing::debug!(error = %e, "the own request after a forwarded 401 failed");
            }
        });
    }

    /// Forwards a caller's request unchanged (method, path and query, end-to-end headers
    /// including the caller's own `Authorization`, streamed body) and returns the upstream's
    /// response unchanged, streamed. The proxy's token and client certificate are never used.
    /// Only a failure to get an answer is an error; a 4xx/5xx answer is returned as it is.
    pub async fn forward(&self, req: Request<Incoming>) -> Result<Response<BoxBody>, UpstreamError> {
        self.forward_with(req, None).await
    }

    /// Forwards a caller's request on its behalf with the proxy's own credentials (token and
    /// client certificate): the caller's `Authorization` and `Impersonate-*` headers are
    /// dropped and `impersonation` (the `Impersonate-*` headers naming the caller, built and
    /// authorized by the server) is added. Used for callers authenticated by a client
    /// certificate, which cannot be passed on.
    pub async fn forward_impersonating(
        &self,
        req: Request<Incoming>,
        impersonation: HeaderMap,
    ) -> Result<Response<BoxBody>, UpstreamError> {
        self.forward_with(req, Some(impersonation)).await
    }

    /// Forwards a request as the proxy itself (its token and client certificate), like
    /// `kubectl proxy`: for `--auth=none`, where the caller is trusted and has no identity of
    /// its own here. The caller's `Authorization` and `Impersonate-*` headers are dropped (the
    /// proxy's identity may impersonate; a sidecar caller must not be able to borrow that).
    pub async fn forward_as_proxy(&self, req: Request<Incoming>) -> Result<Response<BoxBody>, UpstreamError> {
        self.forward_with(req, Some(HeaderMap::new())).await
    }

    async fn forward_with(
        &self,
        mut req: Request<Incoming>,
        impersonation: Option<HeaderMap>,
    ) -> Result<Response<BoxBody>, UpstreamError> {
        let uri = self.forward_uri(req.uri())?;
        let upgrade = upgrade_protocol(req.headers());
        let caller_side = upgrade.as_ref().map(|_| hyper::upgrade::on(&mut req));
        let held = req.extensions_mut().remove::<HeldWhileUpgraded>();
        let (parts, body) = req.into_parts();
        let mut out = Request::new(body);
        *out.method_mut() = parts.method;
        *out.uri_mut() = uri;
        *out.headers_mut() = parts.headers;
        let own_identity = impersonation.is_some();
        let own_authorization = if own_identity { self.inner.own_authorization() } else { None };
        outgoing_headers(out.headers_mut(), impersonation, own_authorization);
        let what = format!("forward {} {}", out.method(), out.uri().path());

        let (Some(proto), Some(caller_side)) = (upgrade, caller_side) else {
            let client = if own_identity { &self.inner.forward_own } else { &self.inner.forward };
            let resp = client.request(out).await.map_err(|e| transport(&what, &e))?;
            if own_identity && resp.status() == StatusCode::UNAUTHORIZED {
                self.confirm_own_refusal();
            }
            return Ok(passthrough(resp));
        };
        out.headers_mut().insert(CONNECTION, HeaderValue::from_static("Upgrade"));
        out.headers_mut().insert(UPGRADE, proto);
        let client = if own_identity { &self.inner.upgrade_own } else { &self.inner.upgrade };
        let mut resp = client.request(out).await.map_err(|e| transport(&what, &e))?;
        if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
            return Ok(passthrough(resp));
        }
        let upstream_side = hyper::upgrade::on(&mut resp);
        tokio::spawn(splice(caller_side, upstream_side, held));
        // The 101 keeps its Connection/Upgrade headers: they are what it means.
        Ok(resp.map(|_| Empty::<Bytes>::new().map_err(|never| match never {}).boxed_unsync()))
    }

    /// The upstream URL for a caller's path and query (after the base URL's own path prefix).
    fn forward_uri(&self, caller: &Uri) -> Result<Uri, UpstreamError> {
        let pq = caller.path_and_query().map(|p| p.as_str()).unwrap_or("/");
        self.inner.uri(pq)
    }
}

/// The upstream response with hop-by-hop headers dropped and the body streamed.
fn passthrough<B>(resp: Response<B>) -> Response<BoxBody>
where
    B: http_body::Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: Into<super::rechunk::PumpError> + Send,
{
    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    // An HTTP/1.1 upstream's answer: its values are slices of that connection's read buffer,
    // which a caller's HTTP/2 connection's HPACK table would keep.
    own_values(&mut parts.headers);
    Response::from_parts(parts, super::rechunk::pumped(body).boxed_unsync())
}

/// Splices the caller's and the upstream's upgraded connections (`super::splice`); `_held` is
/// dropped when the session ends.
async fn splice(caller: OnUpgrade, upstream: OnUpgrade, _held: Option<HeldWhileUpgraded>) {
    let (caller, upstream) = match tokio::try_join!(caller, upstream) {
        Ok(pair) => pair,
        Err(e) => {
            tracing::debug!("upgrade failed: {e}");
            return;
        }
    };
    let ended = super::splice::splice(TokioIo::new(caller), TokioIo::new(upstream), HALF_CLOSED_IDLE).await;
    match ended {
        Ended::Closed { to_upstream, to_caller } => {
            tracing::debug!(bytes_to_upstream = to_upstream, bytes_to_caller = to_caller, "upgrade closed")
        }
        Ended::Failed(e) => tracing::debug!("upgraded connection ended: {e}"),
        Ended::QuietAfterClose => tracing::debug!(
            "upgraded connection ended: one side closed and nothing moved for {}s",
            HALF_CLOSED_IDLE.as_secs()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn hop_by_hop_headers_are_dropped_end_to_end_ones_kept() {
        let mut h = headers(&[
            ("connection", "keep-alive, X-Hop"),
            ("keep-alive", "timeout=5"),
            ("x-hop", "1"),
            ("te", "trailers"),
            ("transfer-encoding", "chunked"),
            ("proxy-authorization", "Basic eA=="),
            ("upgrade", "h2c"),
            ("authorization", "Bearer caller"),
            ("accept", "application/json"),
            ("content-length", "3"),
            ("impersonate-user", "alice"),
        ]);
        strip_hop_by_hop(&mut h);
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort();
        assert_eq!(left, ["accept", "authorization", "content-length", "impersonate-user"]);
    }

    /// A value that was a slice of a large buffer (hyper's HTTP/1.1 read buffer) no longer
    /// keeps it once copied: its bytes live elsewhere; values and sensitivity unchanged.
    #[test]
    fn forwarded_header_values_do_not_keep_the_buffer_they_were_read_from() {
        let buffer = Bytes::from(vec![b'a'; 1 << 20]);
        let range = buffer.as_ptr() as usize..buffer.as_ptr() as usize + buffer.len();
        let mut h = HeaderMap::new();
        h.insert("x-small", HeaderValue::from_maybe_shared(buffer.slice(..3)).unwrap());
        let mut secret = HeaderValue::from_maybe_shared(buffer.slice(10..20)).unwrap();
        secret.set_sensitive(true);
        h.insert(AUTHORIZATION, secret);
        assert!(h.values().all(|v| range.contains(&(v.as_bytes().as_ptr() as usize))), "the test's premise");
        outgoing_headers(&mut h, None, None);
        for v in h.values() {
            assert!(!range.contains(&(v.as_bytes().as_ptr() as usize)), "{v:?} still in the buffer");
        }
        assert_eq!(h["x-small"], "aaa");
        assert_eq!(h[AUTHORIZATION], "aaaaaaaaaa");
        assert!(h[AUTHORIZATION].is_sensitive() && !h["x-small"].is_sensitive());
        // A caller's token is never indexed for HPACK, in a WebSocket subprotocol either.
        let mut h = headers(&[
            ("authorization", "Bearer caller"),
            ("sec-websocket-protocol", "base64url.bearer.authorization.k8s.io.dG9r"),
            ("sec-websocket-protocol", "v4.channel.k8s.io"),
            ("accept", "application/json"),
        ]);
        outgoing_headers(&mut h, None, None);
        assert!(h[AUTHORIZATION].is_sensitive());
        assert!(h.get_all("sec-websocket-protocol").iter().all(|v| v.is_sensitive()));
        assert!(!h["accept"].is_sensitive());
    }

    #[test]
    fn upgrade_detection() {
        let spdy = headers(&[("connection", "Upgrade"), ("upgrade", "SPDY/3.1")]);
        assert_eq!(upgrade_protocol(&spdy).unwrap(), "SPDY/3.1");
        let ws = headers(&[("connection", "keep-alive, upgrade"), ("upgrade", "websocket")]);
        assert_eq!(upgrade_protocol(&ws).unwrap(), "websocket");
        assert!(upgrade_protocol(&headers(&[("upgrade", "websocket")])).is_none());
        assert!(upgrade_protocol(&headers(&[("connection", "upgrade")])).is_none());
        let spdy_lower = headers(&[("connection", "Upgrade"), ("upgrade", "spdy/3.1")]);
        assert_eq!(upgrade_protocol(&spdy_lower).unwrap(), "spdy/3.1");
        // Issue 21: any other protocol is a plain request (not the HTTP/1.1 upgrade path).
        for other in ["x", "h2c", "websocket, x", "SPDY/3.0", "TLS/1.0"] {
            assert!(
                upgrade_protocol(&headers(&[("connection", "Upgrade"), ("upgrade", other)])).is_none(),
                "{other}"
            );
        }
    }
}
