//! `/healthz`, `/livez`, `/readyz` and `/metrics`: answered before classification, never
//! forwarded, never authenticated (they reveal nothing about cached data).
//!
//! Called first by `Server::handle`.

use http::{header, HeaderValue, Request, Response, StatusCode};

use super::body::{self, Body};
use super::Server;

/// Answers a health or metrics request, or `None` for anything else.
pub fn handle<B>(server: &Server, req: &Request<B>) -> Option<Response<Body>> {
    if req.method() != http::Method::GET && req.method() != http::Method::HEAD {
        return None;
    }
    let (code, ctype, text) = match req.uri().path() {
        "/healthz" | "/livez" => (StatusCode::OK, "text/plain; charset=utf-8", "ok".to_owned()),
        "/readyz" => match server.ready() {
            Ok(()) => (StatusCode::OK, "text/plain; charset=utf-8", "ok".to_owned()),
            Err(reasons) => {
                let mut t: String = reasons.iter().map(|r| format!("[-]{r}\n")).collect();
                t.push_str("readyz check failed\n");
                (StatusCode::INTERNAL_SERVER_ERROR, "text/plain; charset=utf-8", t)
            }
        },
        "/metrics" => {
            server.metrics().observe_caches(server.readers().iter());
            server.metrics().set_in_flight(server.in_flight());
            (StatusCode::OK, "text/plain; version=0.0.4", server.metrics().render())
        }
        _ => return None,
    };
    let mut resp = Response::new(body::full(text));
    *resp.status_mut() = code;
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(ctype));
    Some(resp)
}
