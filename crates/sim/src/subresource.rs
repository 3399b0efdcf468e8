//! Subresources the pass-through tests need: `pods/<n>/log` (plain text, `follow=true` streams
//! a line per second until the client leaves), `pods/<n>/exec` and `/attach` (HTTP/1.1 upgrade
//! answered with 101, then the bytes are echoed back), and `…/status` (GET, PUT, PATCH).
//! Called by `http` for URLs with a subresource segment.

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::query::{follow, Query};
use super::respond::{channel_body, full, negotiate, Body};
use super::route::Target;
use super::{read, write, Sim};
use kube_watchcache::error::Error;
use kube_watchcache::resource::ObjectKey;

pub async fn handle(
    sim: Sim,
    t: Target,
    sub: &str,
    raw_query: &str,
    req: Request<Incoming>,
) -> Result<Response<Body>, Error> {
    let served = &sim.store().kinds.all[t.res];
    if !served.subresources.contains(&sub) {
        return Err(Error::NoSuchResource);
    }
    let name = t.name.clone().unwrap_or_default();
    let ns = t.namespace.clone().unwrap_or_default();
    let exists = sim.store().get(t.res, &ObjectKey::new(&ns, &name)).is_some();
    match (sub, req.method().clone()) {
        ("status", Method::GET) => {
            let accept = negotiate(req.headers(), served.kind.builtin, true)?;
            read::get(&sim, &t, &Query::for_get(raw_query)?, accept).await
        }
        ("status", Method::PUT) => write::put(&sim, &t, req).await,
        ("status", Method::PATCH) => write::patch(&sim, &t, req).await,
        ("binding", Method::POST) if exists => write::bind(&sim, &t, req).await,
        ("log", Method::GET) if exists => Ok(log(&name, follow(raw_query))),
        ("exec" | "attach", Method::GET | Method::POST) if exists => Ok(upgrade(req)),
        (_, _) if !exists => Err(Error::not_found(&served.kind, &name)),
        _ => Err(Error::MethodNotAllowed),
    }
}

fn log(pod: &str, follow: bool) -> Response<Body> {
    let pod = pod.to_owned();
    let line =
        move |i: u64| Bytes::from(format!("{} sim log line {i} from {pod}\n", super::encode::now_rfc3339()));
    let body = if follow {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
            for i in 0.. {
                tick.tick().await;
                if tx.send(line(i)).await.is_err() {
                    return;
                }
            }
        });
        channel_body(rx)
    } else {
        full((0..3).flat_map(|i| line(i).to_vec()).collect::<Vec<u8>>())
    };
    let mut resp = Response::new(body);
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    resp
}

/// Answers an upgrade request with 101 and echoes the upgraded connection's bytes.
fn upgrade(req: Request<Incoming>) -> Response<Body> {
    let protocol = req.headers().get(header::UPGRADE).cloned();
    let Some(protocol) = protocol else {
        let mut resp = Response::new(full(Bytes::from_static(b"Upgrade request required")));
        *resp.status_mut() = StatusCode::BAD_REQUEST;
        return resp;
    };
    let subprotocol = req.headers().get("x-stream-protocol-version").cloned();
    let ws_protocol = req.headers().get(header::SEC_WEBSOCKET_PROTOCOL).cloned();
    tokio::spawn(async move {
        if let Ok(upgraded) = hyper::upgrade::on(req).await {
            let mut io = TokioIo::new(upgraded);
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                match io.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if io.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                }
            }
        }
    });
    let mut resp = Response::new(full(Bytes::new()));
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(header::UPGRADE, protocol);
    if let Some(p) = subprotocol {
        h.insert("x-stream-protocol-version", p);
    }
    if let Some(p) = ws_protocol {
        h.insert(header::SEC_WEBSOCKET_PROTOCOL, p);
    }
    resp
}
