//! The three pooled HTTP clients and the helpers for the proxy's own requests: URL building,
//! headers (`Accept`, `User-Agent`, `Authorization`), the 60 s timeout, and turning non-2xx
//! answers into [`UpstreamError::Status`].
//!
//! `list.rs`, `watch.rs` and `discovery.rs` build on [`Inner::send_own`] /
//! [`Upstream::get_json`]; `forward.rs` uses the forward and upgrade clients directly.

use std::time::Duration;

use bytes::Bytes;
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, USER_AGENT};
use http::{HeaderValue, Method, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::{Body as _, Incoming};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use super::auth::Credentials;
use super::config::{ConfigError, Resolved};
use super::lanes::{self, Lanes, Leased};
use super::tls::{connector, Connector, Flavor};
use super::{Upstream, UpstreamError};

/// Bound on every non-watch own request (headers and body), and on a watch's response headers.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
const H2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const H2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// Everything an [`Upstream`] shares between its clones.
pub(crate) struct Inner {
    pub base_url: String,
    origin: String,
    auth: Credentials,
    has_identity: bool,
    user_agent: HeaderValue,
    /// The proxy's own requests: its token and client certificate.
    pub own: Lanes<Full<Bytes>>,
    /// Pass-through, no credentials, h2 when offered.
    pub forward: Lanes<Incoming>,
    /// Pass-through of upgrade requests, no credentials, HTTP/1.1 only.
    pub upgrade: Client<Connector, Incoming>,
    /// A caller's request sent with the proxy's identity and impersonation headers.
    pub forward_own: Lanes<Incoming>,
    /// The same for upgrades, HTTP/1.1 only.
    pub upgrade_own: Client<Connector, Incoming>,
    /// Told about every own request (metrics).
    pub observer: ObserverSlot,
    /// Reads the client certificate's files again (`IdentitySlot::reload_files`); stopped with
    /// the clients.
    cert_reload: Option<tokio::task::JoinHandle<()>>,
    /// When the last own request was made to confirm a forwarded request's 401
    /// ([`Upstream::confirm_own_refusal`]).
    pub refusal_probed: parking_lot::Mutex<Option<tokio::time::Instant>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(t) = &self.cert_reload {
            t.abort();
        }
    }
}

impl Inner {
    /// `streams_per_connection`: requests on one upstream connection at once (0: the default,
    /// [`lanes::DEFAULT_STREAMS_PER_CONNECTION`]).
    pub fn build(r: Resolved, streams_per_connection: usize) -> Result<Inner, ConfigError> {
        if r.tls.insecure && r.base_url.starts_with("https://") {
            tracing::warn!(
                upstream = %r.base_url,
                "INSECURE: the upstream's certificate is not verified (insecure-skip-tls-verify); \
                 anyone on the network path can pose as the apiserver and receive the proxy's \
                 credentials and every forwarded request"
            );
        }
        let per_lane = match streams_per_connection {
            0 => lanes::DEFAULT_STREAMS_PER_CONNECTION,
            n => n.min(lanes::MAX_STREAMS_PER_CONNECTION),
        };
        let observer = ObserverSlot::default();
        let own = lanes(&r, Flavor::Own, per_lane, "own", &observer)?;
        let forward = lanes(&r, Flavor::Forward, per_lane, "forward", &observer)?;
        let upgrade = upgrade_client(&r, Flavor::Upgrade, per_lane)?;
        let forward_own = lanes(&r, Flavor::Own, per_lane, "forward_own", &observer)?;
        let upgrade_own = upgrade_client(&r, Flavor::OwnUpgrade, per_lane)?;
        let cert_reload = match (&r.tls.identity, tokio::runtime::Handle::try_current()) {
            (Some(slot), Ok(_)) => slot.reload_files(),
            _ => None,
        };
        Ok(Inner {
            cert_reload,
            refusal_probed: parking_lot::Mutex::new(None),
            base_url: r.base_url,
            origin: r.origin,
            has_identity: r.tls.identity.is_some(),
            auth: r.auth,
            user_agent: HeaderValue::from_static(concat!("kube-watchcache/", env!("CARGO_PKG_VERSION"))),
            own,
            forward,
            upgrade,
            forward_own,
            upgrade_own,
            observer,
        })
    }

    pub fn describe(&self) -> String {
        let mut creds = self.auth.describe();
        if self.has_identity {
            creds.push_str(", client certificate");
        }
        format!("{} ({}; {})", self.base_url, self.origin, creds)
    }

    /// `base_url` + a path-and-query that starts with `/`. Never one that could leave the base
    /// URL's path prefix ([`Inner::escapes_prefix`]).
    pub fn uri(&self, path_and_query: &str) -> Result<Uri, UpstreamError> {
        let path = path_and_query.split('?').next().unwrap_or_default();
        if self.escapes_prefix(path) {
            return Err(UpstreamError::Transport(format!("{path:?}: {PREFIX_ESCAPE}")));
        }
        let sep = if path_and_query.starts_with('/') { "" } else { "/" };
        format!("{}{sep}{path_and_query}", self.base_url)
            .parse()
            .map_err(|e| UpstreamError::Transport(format!("invalid request path {path_and_query:?}: {e}")))
    }

    /// Whether `path` (a caller's) has a `.` or `..` segment, also percent-encoded, while the
    /// base URL has a path prefix (`https://rancher/k8s/clusters/c-1`). A front proxy there that
    /// normalizes the path would take the request out of the prefix (to another cluster's
    /// path, or to the front proxy's own API) with the proxy's credentials. Without a prefix
    /// the path stays the upstream's to read (the apiserver does not normalize it).
    pub fn escapes_prefix(&self, path: &str) -> bool {
        let prefixed = self.base_url.split("://").nth(1).is_some_and(|rest| rest.contains('/'));
        prefixed && has_dot_segment(path)
    }

    /// A request with the proxy's own credentials.
    pub fn own_request(
        &self,
        method: Method,
        path_and_query: &str,
        body: Option<Bytes>,
    ) -> Result<Request<Full<Bytes>>, UpstreamError> {
        let mut req = Request::new(Full::new(body.clone().unwrap_or_default()));
        *req.method_mut() = method;
        *req.uri_mut() = self.uri(path_and_query)?;
        let h = req.headers_mut();
        h.insert(ACCEPT, HeaderValue::from_static("application/json"));
        h.insert(USER_AGENT, self.user_agent.clone());
        if body.is_some() {
            h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
        if let Some(auth) = self.auth.header() {
            h.insert(AUTHORIZATION, auth);
        }
        Ok(req)
    }

    /// The proxy's own `Authorization` header, if it has a bearer token.
    pub fn own_authorization(&self) -> Option<HeaderValue> {
        self.auth.header()
    }

    /// Sends an own request and waits (at most [`REQUEST_TIMEOUT`]) for the response headers.
    /// A non-2xx answer is read and returned as [`UpstreamError::Status`].
    pub async fn send_own(
        &self,
        req: Request<Full<Bytes>>,
    ) -> Result<Response<Leased<Incoming>>, UpstreamError> {
        let what = format!("{} {}", req.method(), req.uri().path());
        let method = req.method().clone();
        let authorization = req.headers().get(AUTHORIZATION).cloned();
        let started = tokio::time::Instant::now();
        let sent = tokio::time::timeout(REQUEST_TIMEOUT, self.own.request(req)).await;
        if let Some(o) = self.observer.get() {
            let code = match &sent {
                Ok(Ok(r)) => Some(r.status().as_u16()),
                _ => None,
            };
            o.upstream_request(method.as_str(), code, started.elapsed().as_secs_f64());
        }
        let resp = sent.map_err(|_| timeout(&what))?.map_err(|e| transport(&what, &e))?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        let code = resp.status();
        if code == http::StatusCode::UNAUTHORIZED {
            self.auth.unauthorized(authorization.as_ref());
        }
        let body = tokio::time::timeout(REQUEST_TIMEOUT, resp.into_body().collect())
            .await
            .map_err(|_| timeout(&what))?
            .map_err(|e| transport(&what, &e))?
            .to_bytes();
        Err(status_error(code, body))
    }

    /// An own request with its whole body, all within [`REQUEST_TIMEOUT`].
    pub async fn request_bytes(
        &self,
        method: Method,
        path_and_query: &str,
        body: Option<Bytes>,
    ) -> Result<Bytes, UpstreamError> {
        let req = self.own_request(method, path_and_query, body)?;
        self.send_bytes(req).await
    }

    /// Like `request_bytes` for a GET with another `Accept` (a metadata-only list).
    pub async fn get_bytes_as(
        &self,
        path_and_query: &str,
        accept: &'static str,
    ) -> Result<Bytes, UpstreamError> {
        let mut req = self.own_request(Method::GET, path_and_query, None)?;
        req.headers_mut().insert(ACCEPT, HeaderValue::from_static(accept));
        self.send_bytes(req).await
    }

    /// [`Inner::request_bytes`] of a GET, with the answer's `Warning` header values (an
    /// apiserver sends a deprecated API's warning on every answer about it).
    pub async fn get_bytes_warned(
        &self,
        path_and_query: &str,
    ) -> Result<(Bytes, Vec<String>), UpstreamError> {
        let req = self.own_request(Method::GET, path_and_query, None)?;
        self.send_bytes_warned(req).await
    }

    /// [`Inner::get_bytes_warned`] whose body is admitted as it arrives: `admit(n)` for each
    /// `n` bytes more (the declared length at once, when there is one); `Ok(None)` as soon as
    /// it says no, the rest not read — the connection is let go with it. The body is gathered
    /// into one buffer of its exact length.
    pub async fn get_bytes_admitted(
        &self,
        path_and_query: &str,
        admit: &mut (dyn FnMut(u64) -> bool + Send),
    ) -> Result<Option<(Bytes, Vec<String>)>, UpstreamError> {
        let req = self.own_request(Method::GET, path_and_query, None)?;
        let what = format!("GET {}", req.uri().path());
        let fut = async {
            let resp = self.send_own(req).await?;
            let warnings = warnings(resp.headers());
            let declared = resp.body().size_hint().exact();
            let mut counted = 0u64;
            if let Some(n) = declared {
                if !admit(n) {
                    return Ok(None);
                }
                counted = n;
            }
            // The frames, then one copy at the exact length: the objects are slices of this
            // buffer for as long as they live, so no growth slack is kept with them.
            let mut frames: Vec<Bytes> = Vec::new();
            let mut total = 0u64;
            let mut body = resp.into_body();
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|e| transport(&what, &e))?;
                if let Ok(data) = frame.into_data() {
                    total += data.len() as u64;
                    if total > counted {
                        if !admit(total - counted) {
                            return Ok(None);
                        }
                        counted = total;
                    }
                    frames.push(data);
                }
            }
            let whole = match frames.len() {
                1 => frames.pop().unwrap_or_default(),
                _ => {
                    let mut buf = bytes::BytesMut::with_capacity(frames.iter().map(Bytes::len).sum());
                    frames.iter().for_each(|f| buf.extend_from_slice(f));
                    buf.freeze()
                }
            };
            Ok(Some((whole, warnings)))
        };
        tokio::time::timeout(REQUEST_TIMEOUT, fut).await.map_err(|_| timeout(&what))?
    }

    async fn send_bytes(&self, req: Request<Full<Bytes>>) -> Result<Bytes, UpstreamError> {
        self.send_bytes_warned(req).await.map(|(body, _)| body)
    }

    async fn send_bytes_warned(
        &self,
        req: Request<Full<Bytes>>,
    ) -> Result<(Bytes, Vec<String>), UpstreamError> {
        let what = format!("{} {}", req.method(), req.uri().path());
        let fut = async {
            let resp = self.send_own(req).await?;
            let warnings = warnings(resp.headers());
            let body =
                resp.into_body().collect().await.map(|b| b.to_bytes()).map_err(|e| transport(&what, &e))?;
            Ok((body, warnings))
        };
        tokio::time::timeout(REQUEST_TIMEOUT, fut).await.map_err(|_| timeout(&what))?
    }
}

impl Upstream {
    /// The proxy's own GET (probes, and later TokenReview/SubjectAccessReview lookups):
    /// `path_and_query` relative to the base URL, with the proxy's credentials; body buffered.
    /// Non-2xx → [`UpstreamError::Status`]. At most 60 s.
    pub async fn get_json(&self, path_and_query: &str) -> Result<Bytes, UpstreamError> {
        self.inner.request_bytes(Method::GET, path_and_query, None).await
    }

    /// The proxy's own POST of a JSON body (TokenReview, SubjectAccessReview); like
    /// [`Upstream::get_json`] otherwise.
    pub async fn post_json(&self, path_and_query: &str, body: Bytes) -> Result<Bytes, UpstreamError> {
        self.inner.request_bytes(Method::POST, path_and_query, Some(body)).await
    }
}

/// The metrics observer, set once by `app` after the clients are made.
pub(crate) type ObserverSlot = std::sync::Arc<std::sync::OnceLock<std::sync::Arc<dyn super::Observer>>>;

/// A client's connections in lanes of `per_lane` requests (see `lanes.rs`).
fn lanes<B>(
    r: &Resolved,
    flavor: Flavor,
    per_lane: usize,
    name: &'static str,
    observer: &ObserverSlot,
) -> Result<Lanes<B>, ConfigError>
where
    B: http_body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    // Built once: a lane's client is a clone of it with a pool of its own.
    let conn = connector(&r.tls, flavor)?;
    let observer = observer.clone();
    let made = move |n: usize| {
        if let Some(o) = observer.get() {
            o.upstream_lanes(name, n);
        }
    };
    // The own clients present the proxy's certificate: new connections once it is renewed.
    let identity = if flavor == Flavor::Own { r.tls.identity.clone() } else { None };
    Ok(Lanes::new(per_lane, move || builder(per_lane).build(conn.clone()))
        .reporting(made)
        .presenting(identity))
}

/// The upgrade clients (exec, attach, port-forward, WebSocket watches): never pooled.
fn upgrade_client<B>(
    r: &Resolved,
    flavor: Flavor,
    per_lane: usize,
) -> Result<Client<Connector, B>, ConfigError>
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
{
    let mut b = builder(per_lane);
    // An upgrade's connection is not pooled: a refused upgrade (403) left it idle in the pool
    // for 90 s, held by no client connection's slot, so a caller's burst of refused upgrades
    // kept as many upstream connections (files) open past `--max-connections` (review). A
    // session is rare; its handshake is cheap.
    b.pool_max_idle_per_host(0);
    Ok(b.build(connector(&r.tls, flavor)?))
}

/// A stream's HTTP/2 flow-control window on an upstream connection: 1 MiB in flight per
/// response, enough for a multi-megabyte LIST at loopback and LAN speeds.
pub(crate) const STREAM_WINDOW: u32 = 1 << 20;

/// `per_lane` streams' windows, at most HTTP/2's largest window (2^31 − 1).
fn connection_window(per_lane: usize) -> u32 {
    let streams = u32::try_from(per_lane).unwrap_or(u32::MAX);
    STREAM_WINDOW.saturating_mul(streams).min((1 << 31) - 1)
}

/// Why a path with a dot segment is not sent below a path prefix (the 400's message).
pub const PREFIX_ESCAPE: &str =
    "a \".\" or \"..\" path segment cannot be sent below the upstream URL's path prefix";

/// Whether `path`, percent-decoded (again, until nothing changes), has a `.` or `..` segment between `/` or `\\` (as a front
/// proxy that decodes `%2F` or reads backslashes as slashes would see it), also with path
/// parameters after a `;` (`..;x`: a dot segment to servers that strip them).
fn has_dot_segment(path: &str) -> bool {
    // Decoded until nothing changes (a few rounds at most): two front proxies that each decode
    // would read `%252e` as `.`.
    let mut decoded: Vec<u8> = path.as_bytes().to_vec();
    for _ in 0..4 {
        let next: Vec<u8> = percent_encoding::percent_decode(&decoded).collect();
        if next == decoded {
            break;
        }
        decoded = next;
    }
    decoded.split(|b| *b == b'/' || *b == b'\\').any(|seg| {
        let seg = seg.split(|b| *b == b';').next().unwrap_or_default();
        seg == b"." || seg == b".."
    })
}

/// The client settings. The connection's window is the sum of its streams' (`per_lane` ×
/// [`STREAM_WINDOW`]): a response its caller does not read holds its own stream's window and
/// never stops the others on the connection (hyper's adaptive window sets both to one figure,
/// so one unread response of 64 KiB stopped every response on the connection).
pub(crate) fn builder(per_lane: usize) -> hyper_util::client::legacy::Builder {
    let mut b = Client::builder(TokioExecutor::new());
    b.timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .http2_keep_alive_interval(H2_KEEPALIVE_INTERVAL)
        .http2_keep_alive_timeout(H2_KEEPALIVE_TIMEOUT)
        .http2_keep_alive_while_idle(true)
        .http2_initial_stream_window_size(STREAM_WINDOW)
        .http2_initial_connection_window_size(connection_window(per_lane));
    b
}

/// An answer's `Warning` header values (an apiserver sends a deprecated API's on every answer
/// about it).
pub(crate) fn warnings(headers: &http::HeaderMap) -> Vec<String> {
    headers.get_all(http::header::WARNING).iter().filter_map(|v| v.to_str().ok().map(str::to_owned)).collect()
}

/// A non-2xx answer: keep the body, and its `Status` object when it is one.
pub(crate) fn status_error(code: StatusCode, body: Bytes) -> UpstreamError {
    let status = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .filter(|v| v.get("kind").and_then(|k| k.as_str()) == Some("Status"));
    UpstreamError::Status { code: code.as_u16(), status, body }
}

/// A transport error with its cause chain (hyper-util's own Display is just "client error").
pub(crate) fn transport(what: &str, e: &(dyn std::error::Error + 'static)) -> UpstreamError {
    let mut msg = format!("{what}: {e}");
    let mut src = e.source();
    while let Some(s) = src {
        let s_text = s.to_string();
        if !msg.ends_with(&s_text) {
            msg.push_str(": ");
            msg.push_str(&s_text);
        }
        src = s.source();
    }
    UpstreamError::Transport(super::config::one_line(&msg))
}

fn timeout(what: &str) -> UpstreamError {
    UpstreamError::Transport(format!("{what}: no answer within {}s", REQUEST_TIMEOUT.as_secs()))
}

#[cfg(test)]
mod tests {
    use super::has_dot_segment;

    #[test]
    fn dot_segments_are_found_however_they_are_written() {
        for p in [
            "/..",
            "/api/../x",
            "/a/.",
            "/%2e%2E/x",
            "/a/cm1%2F..",
            "/a/cm1%2f%2E",
            "/a\\..\\b",
            "/a%5C../b",
            "/api/..;/x",
            "/a/.;p=1/b",
            "/a/..%3B/b",
            "/a/%252e%252E/b",
            "/a/%25252e/b",
        ] {
            assert!(has_dot_segment(p), "{p}");
        }
        for p in [
            "/",
            "/api/v1/namespaces/a..b/x",
            "/a/...",
            "/a/.b",
            "/a/%2e%2e%2e",
            "/a/b.",
            "/a/;../b",
            "/a/...;x",
        ] {
            assert!(!has_dot_segment(p), "{p}");
        }
    }
}
