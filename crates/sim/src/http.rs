//! The HTTP front of the simulated apiserver: the accept loop (HTTP/1.1 + h2c through
//! `hyper_util`'s auto builder, upgrades allowed; HTTPS when `tls` gives an acceptor), request recording, content negotiation and
//! dispatch to `discovery`, `read`, `watch`, `write` and `subresource`.
//!
//! Started by `Sim::start`; stopped by the shutdown signal in `SimHandle`. The handlers it
//! dispatches to build their answers with `respond`, never with this module.

use std::convert::Infallible;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use super::query::Query;
use super::respond::{error_encoding, error_response_as, full, indented, negotiate, Body};
use super::route::{route, Route, Target};
use super::{discovery, read, review, subresource, watch, write, RequestRecord, Sim};
use kube_watchcache::error::Error;
use kube_watchcache::server::indent;

fn page_not_found() -> Response<Body> {
    let mut resp = Response::new(full(Bytes::from_static(b"404 page not found\n")));
    *resp.status_mut() = StatusCode::NOT_FOUND;
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    resp.headers_mut().insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    resp
}

/// Streams a client may open at once on one HTTP/2 connection, as kube-apiserver allows.
pub const HTTP2_MAX_STREAMS_PER_CONNECTION: u32 = 100;

/// Accepts connections until `shutdown` flips; each connection is dropped at shutdown too.
/// With `tls`, every connection is a TLS handshake first (in its own task), then the same
/// HTTP/1.1 + h2 service.
pub async fn serve(
    listener: TcpListener,
    sim: Sim,
    tls: Option<TlsAcceptor>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.wait_for(|s| *s) => return,
        };
        let (stream, _) = match accepted {
            Ok(a) => a,
            // Out of file descriptors (or another transient failure): the queue waits, the
            // loop does not spin.
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (sim, tls, stop) = (sim.clone(), tls.clone(), shutdown.clone());
        tokio::spawn(async move {
            match tls {
                None => connection(stream, sim, stop).await,
                Some(acceptor) => {
                    let mut stop_handshake = stop.clone();
                    // Bounded as Go's server bounds it (by its header read timeout): a client
                    // that opens a connection and sends nothing does not hold it for ever.
                    let handshake = tokio::select! {
                        h = tokio::time::timeout(READ_HEADER_TIMEOUT, acceptor.accept(stream)) => match h {
                            Ok(h) => h,
                            Err(_) => return,
                        },
                        _ = stop_handshake.wait_for(|s| *s) => return,
                    };
                    // A failed handshake is the client's problem; the listener goes on.
                    if let Ok(stream) = handshake {
                        connection(stream, sim, stop).await;
                    }
                }
            }
        });
    }
}

/// kube-apiserver's `ReadHeaderTimeout`, which also bounds its TLS handshakes.
const READ_HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(32);
/// kube-apiserver's `IdleTimeout`.
const IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(90);

/// Serves one connection (HTTP/1.1 with upgrades, or h2 by its preface) until it ends or the
/// sim shuts down.
async fn connection<I>(io: I, sim: Sim, mut stop: tokio::sync::watch::Receiver<bool>)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req| {
        let sim = sim.clone();
        async move { Ok::<_, Infallible>(handle(sim, req).await) }
    });
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    // A request whose headers do not come closes its connection (hyper applies no bound
    // without a timer). hyper's head timeout also runs while a kept-alive connection waits for
    // its next request: kube-apiserver's `IdleTimeout` then (secure_serving.go), as the
    // proxy's listener does (`server::conn`).
    builder.http1().timer(TokioTimer::new()).header_read_timeout(IDLE_TIMEOUT);
    // kube-apiserver's limit with `--http2-max-streams-per-connection` unset (0): 100 streams on
    // an HTTP/2 connection (k8s.io/apiserver secure_serving.go); a client's 101st waits.
    builder.http2().max_concurrent_streams(HTTP2_MAX_STREAMS_PER_CONNECTION);
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), svc);
    tokio::select! {
        _ = conn => {}
        _ = stop.wait_for(|s| *s) => {}
    }
}

/// A copy of `headers` whose values hold their own bytes: hyper reads an HTTP/1.1 request's
/// values as slices of its connection's read buffer, and a record kept them all alive (up to
/// 100 000 records, each a buffer of up to 1 MiB, in a long load run).
fn owned(headers: &http::HeaderMap) -> http::HeaderMap {
    let mut out = http::HeaderMap::with_capacity(headers.len());
    for (k, v) in headers {
        out.append(k.clone(), http::HeaderValue::from_bytes(v.as_bytes()).unwrap_or_else(|_| v.clone()));
    }
    out
}

/// One request: record it, route it, answer it.
pub async fn handle(sim: Sim, req: Request<Incoming>) -> Response<Body> {
    sim.record(RequestRecord {
        method: req.method().to_string(),
        path: req.uri().path().to_owned(),
        query: req.uri().query().unwrap_or("").to_owned(),
        headers: owned(req.headers()),
    });
    if review::is_review(req.method(), req.uri().path()) {
        return review::handle(sim, req).await;
    }
    // Resources whose CRD was deleted (`Sim::set_served`) are neither routed nor discovered.
    match route(&sim.store().kinds, req.uri().path()) {
        Route::PageNotFound => page_not_found(),
        // Written as any refusal (`ErrorNegotiated`): protobuf, JSON or raw JSON by the Accept.
        Route::NoSuchResource => error_response_as(Error::NoSuchResource, error_encoding(req.headers())),
        Route::Health => Response::new(full(Bytes::from_static(b"ok"))),
        Route::Version => discovery::version(),
        Route::CoreVersions => discovery::core_versions(req.headers()),
        Route::Groups => discovery::groups(&sim.served_kinds()),
        Route::Group(g) => discovery::group(&sim.served_kinds(), &g),
        Route::Resources(g, v) => discovery::resources(&sim.served_kinds(), &g, &v),
        Route::Resource(t) if sim.is_withdrawn(t.res) => page_not_found(),
        Route::Resource(t) => {
            let errors = error_encoding(req.headers());
            let ua = req.headers().get(header::USER_AGENT).map(HeaderValue::as_bytes);
            let pretty = indent::wanted(req.uri().query(), ua);
            let watch = t.force_watch
                || (t.name.is_none()
                    && Query::from_query(req.uri().query().unwrap_or("")).is_ok_and(|q| q.watch));
            let resp = resource(sim, t, req).await.unwrap_or_else(|e| error_response_as(e, errors));
            // A watch's stream is never indented; the Status refusing one is.
            if pretty && (!watch || resp.status() != StatusCode::OK) {
                indented(resp).await
            } else {
                resp
            }
        }
    }
}

async fn resource(sim: Sim, t: Target, req: Request<Incoming>) -> Result<Response<Body>, Error> {
    let raw = req.uri().query().unwrap_or("").to_owned();
    if let Some(why) = t.name.as_deref().and_then(invalid_name) {
        return Err(why);
    }
    if let Some(sub) = t.sub.clone() {
        return subresource::handle(sim, t, &sub, &raw, req).await;
    }
    let method = req.method().clone();
    match (method, t.name.is_some()) {
        (Method::GET, _) => {
            // A GET of one object decodes GetOptions only (`Query::for_get`).
            let get = t.name.is_some() && !t.force_watch;
            let q = if get { Query::for_get(&raw)? } else { Query::from_query(&raw)? };
            let accept = negotiate(req.headers(), sim.store().kinds.kind(t.res).builtin, get)?;
            if t.force_watch || (q.watch && t.name.is_none()) {
                watch::handle(sim, t, q, accept).await
            } else if t.name.is_some() {
                read::get(&sim, &t, &q, accept).await
            } else {
                read::list(&sim, &t, &q, accept).await
            }
        }
        (Method::POST, false) => write::post(&sim, &t, req).await,
        (Method::PUT, true) => write::put(&sim, &t, req).await,
        (Method::PATCH, true) => write::patch(&sim, &t, req).await,
        (Method::DELETE, true) => write::delete(&sim, &t, &raw, req).await,
        _ => Err(Error::MethodNotAllowed),
    }
}

/// The apiserver's handlers refuse a name that is not a valid path segment
/// (`path.IsValidPathSegmentName`, in `ScopeNamer.Name`) with 400, as recorded from
/// kube-apiserver 1.28.7: `Name parameter invalid: "a%b": may not contain '%'`.
fn invalid_name(name: &str) -> Option<Error> {
    let mut errs: Vec<String> = Vec::new();
    if name == "." || name == ".." {
        errs.push(format!("may not be '{name}'"));
    }
    for c in ['/', '%'] {
        if name.contains(c) {
            errs.push(format!("may not contain '{c}'"));
        }
    }
    (!errs.is_empty()).then(|| {
        Error::BadRequest(format!(
            "Name parameter invalid: {}: {}",
            kube_watchcache::resource::go_quote(name),
            errs.join(";")
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A recorded value holds its own bytes, not the buffer it was read from.
    #[test]
    fn recorded_header_values_do_not_keep_their_buffer() {
        let buffer = Bytes::from(vec![b'a'; 1 << 20]);
        let range = buffer.as_ptr() as usize..buffer.as_ptr() as usize + buffer.len();
        let mut h = http::HeaderMap::new();
        h.append("x-a", HeaderValue::from_maybe_shared(buffer.slice(..2)).unwrap());
        h.append("x-a", HeaderValue::from_maybe_shared(buffer.slice(2..5)).unwrap());
        let kept = owned(&h);
        assert_eq!(kept.get_all("x-a").iter().map(|v| v.as_bytes().len()).collect::<Vec<_>>(), [2, 3]);
        assert!(kept.values().all(|v| !range.contains(&(v.as_bytes().as_ptr() as usize))));
    }
}
