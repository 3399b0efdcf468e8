//! The HTTP front of the simulated apiserver: the accept loop (HTTP/1.1 + h2c through
//! `hyper_util`'s auto builder, upgrades allowed; HTTPS when `tls` gives an acceptor), request recording, content negotiation and
//! dispatch to `discovery`, `read`, `watch`, `write` and `subresource`.
//!
//! Started by `Sim::start`; stopped by the shutdown signal in `SimHandle`.

use std::convert::Infallible;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use super::query::Query;
use super::route::{route, Route, Target};
use super::{discovery, read, review, subresource, watch, write, RequestRecord, Sim};
use crate::error::Error;

/// Every response body of the sim.
pub type Body = BoxBody<Bytes, Infallible>;

pub fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).boxed()
}

/// A body that streams what is sent on `rx` (watches, followed logs) and ends when the
/// sender is dropped.
pub fn channel_body(rx: tokio::sync::mpsc::Receiver<Bytes>) -> Body {
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    BodyExt::boxed(StreamBody::new(stream))
}

/// A body made of ready chunks (list responses: no copy of the stored bytes).
pub fn chunks_body(chunks: Vec<Bytes>) -> Body {
    let stream = futures_util::stream::iter(chunks.into_iter().map(|b| Ok::<_, Infallible>(Frame::data(b))));
    BodyExt::boxed(StreamBody::new(stream))
}

/// An `Error` rendered by the crate's one renderer, with the sim's body type.
pub fn error_response(e: Error) -> Response<Body> {
    e.into_response::<Full<Bytes>>().map(BodyExt::boxed)
}

pub fn json(status: StatusCode, body: Body) -> Response<Body> {
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

fn page_not_found() -> Response<Body> {
    let mut resp = Response::new(full(Bytes::from_static(b"404 page not found\n")));
    *resp.status_mut() = StatusCode::NOT_FOUND;
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    resp.headers_mut().insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    resp
}

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
        let Ok((stream, _)) = accepted else { continue };
        let _ = stream.set_nodelay(true);
        let (sim, tls, stop) = (sim.clone(), tls.clone(), shutdown.clone());
        tokio::spawn(async move {
            match tls {
                None => connection(stream, sim, stop).await,
                Some(acceptor) => {
                    let mut stop_handshake = stop.clone();
                    let handshake = tokio::select! {
                        h = acceptor.accept(stream) => h,
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
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), svc);
    tokio::select! {
        _ = conn => {}
        _ = stop.wait_for(|s| *s) => {}
    }
}

/// One request: record it, route it, answer it.
pub async fn handle(sim: Sim, req: Request<Incoming>) -> Response<Body> {
    sim.record(RequestRecord {
        method: req.method().to_string(),
        path: req.uri().path().to_owned(),
        query: req.uri().query().unwrap_or("").to_owned(),
        headers: req.headers().clone(),
    });
    if review::is_review(req.method(), req.uri().path()) {
        return review::handle(sim, req).await;
    }
    // Resources whose CRD was deleted (`Sim::set_served`) are neither routed nor discovered.
    match route(&sim.store().kinds, req.uri().path()) {
        Route::PageNotFound => page_not_found(),
        Route::NoSuchResource => error_response(Error::NoSuchResource),
        Route::Health => Response::new(full(Bytes::from_static(b"ok"))),
        Route::Version => discovery::version(),
        Route::CoreVersions => discovery::core_versions(req.headers()),
        Route::Groups => discovery::groups(&sim.served_kinds()),
        Route::Group(g) => discovery::group(&sim.served_kinds(), &g),
        Route::Resources(g, v) => discovery::resources(&sim.served_kinds(), &g, &v),
        Route::Resource(t) if sim.is_withdrawn(t.res) => page_not_found(),
        Route::Resource(t) => resource(sim, t, req).await.unwrap_or_else(error_response),
    }
}

async fn resource(sim: Sim, t: Target, req: Request<Incoming>) -> Result<Response<Body>, Error> {
    let raw = req.uri().query().unwrap_or("").to_owned();
    if let Some(sub) = t.sub.clone() {
        return subresource::handle(sim, t, &sub, &raw, req).await;
    }
    let method = req.method().clone();
    match (method, t.name.is_some()) {
        (Method::GET, _) => {
            let q = Query::from_query(&raw)?;
            let accept = negotiate(req.headers(), sim.store().kinds.kind(t.res).builtin)?;
            if t.force_watch || (q.watch && t.name.is_none()) {
                watch::handle(sim, t, q).await
            } else if t.name.is_some() {
                read::get(&sim, &t, &q, accept).await
            } else {
                read::list(&sim, &t, &q, accept).await
            }
        }
        (Method::POST, false) => write::post(&sim, &t, req).await,
        (Method::PUT, true) => write::put(&sim, &t, req).await,
        (Method::PATCH, true) => write::patch(&sim, &t, req).await,
        (Method::DELETE, true) => write::delete(&sim, &t, &raw),
        _ => Err(Error::MethodNotAllowed),
    }
}

/// What the client accepts, among what the sim can produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accept {
    Json,
    Table,
    /// `as=PartialObjectMetadata[List];g=meta.k8s.io;v=v1`: metadata only (GET and LIST).
    Metadata,
}

/// Content negotiation: plain JSON when any media range allows it, a Table when that comes
/// first, else 406 with the apiserver's texts (accept-unsupported.json, crd-accept-protobuf.json).
pub fn negotiate(headers: &http::HeaderMap, builtin: bool) -> Result<Accept, Error> {
    let Some(raw) = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()) else {
        return Ok(Accept::Json);
    };
    let mut saw_unknown_as = false;
    for range in raw.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let mt = parts.next().unwrap_or("").to_ascii_lowercase();
        let params: Vec<(String, String)> = parts
            .filter_map(|p| p.split_once('='))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        let as_ = params.iter().find(|(k, _)| k == "as").map(|(_, v)| v.as_str());
        if !matches!(mt.as_str(), "application/json" | "*/*" | "application/*" | "") {
            continue;
        }
        match as_ {
            None => return Ok(Accept::Json),
            Some("Table") => return Ok(Accept::Table),
            Some("PartialObjectMetadata" | "PartialObjectMetadataList")
                if params.iter().any(|(k, v)| k == "g" && v == "meta.k8s.io")
                    && params.iter().any(|(k, v)| k == "v" && v == "v1") =>
            {
                return Ok(Accept::Metadata)
            }
            Some(_) => saw_unknown_as = true,
        }
    }
    if saw_unknown_as || !builtin {
        let types = if builtin {
            "application/json, application/yaml, application/vnd.kubernetes.protobuf"
        } else {
            "application/json, application/yaml"
        };
        return Err(Error::MediaTypesNotAccepted(types.into()));
    }
    Err(Error::NotAcceptable("406: Not Acceptable\n\nAvailable representations: application/json, application/yaml, application/vnd.kubernetes.protobuf, application/json;stream=watch, application/vnd.kubernetes.protobuf;stream=watch".into()))
}

/// Reads a request body (at most 3 MiB, the apiserver's limit).
pub async fn body_bytes(req: Request<Incoming>) -> Result<Bytes, Error> {
    let limited = http_body_util::Limited::new(req.into_body(), 3 * 1024 * 1024);
    match limited.collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) => Err(Error::BadRequest(format!("unable to read request body: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(v: &str) -> http::HeaderMap {
        let mut m = http::HeaderMap::new();
        m.insert(header::ACCEPT, HeaderValue::from_str(v).unwrap());
        m
    }

    #[test]
    fn negotiation() {
        assert_eq!(negotiate(&http::HeaderMap::new(), true).unwrap(), Accept::Json);
        assert_eq!(negotiate(&h("application/vnd.kubernetes.protobuf, */*"), true).unwrap(), Accept::Json);
        assert_eq!(
            negotiate(&h("application/json;as=Table;v=v1;g=meta.k8s.io,application/json"), true).unwrap(),
            Accept::Table
        );
        assert_eq!(
            negotiate(&h("application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"), true).unwrap(),
            Accept::Metadata
        );
        assert!(
            negotiate(&h("application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v2"), true).is_err()
        );
        assert!(negotiate(&h("application/vnd.kubernetes.protobuf"), false).is_err());
        assert!(negotiate(&h("text/html"), true).is_err());
    }
}
