//! Phase 10, the end of the stack: serve from the cache (`serve`) or forward upstream (`proxy`,
//! with the caller's identity, or the proxy's own with `--auth=none`), or answer the
//! apiserver's own refusal, as classification said.
//! What the cache served is marked [`FromCache`] for compression; every answer is counted.

use std::future::Future;
use std::sync::Arc;

use hyper::body::Incoming;

use super::{arrived, Classified, FromCache, Next, Req, ResourceLabel, Resp};
use crate::metrics::Served;
use crate::server::auth::Caller;
use crate::server::classify::{ForwardReason, RequestInfo};
use crate::server::{body, serve};
use crate::server::{Forwarded, Server};

#[derive(Clone)]
pub struct Dispatch(pub Arc<Server>);

impl Next<Incoming> for Dispatch {
    fn run(&self, req: Req<Incoming>) -> impl Future<Output = Resp> + Send {
        // Boxed: serving and forwarding make a large future, and every phase before this one
        // would otherwise move it once more as it is built (measured: ~10 % of the proxy's CPU
        // on cached GETs went to those copies).
        let server = self.0.clone();
        Box::pin(async move { dispatch(&server, req).await })
    }
}

async fn dispatch(server: &Server, mut req: Req<Incoming>) -> Resp {
    let arrived = arrived(&req);
    let caller = req.extensions_mut().remove::<Caller>().unwrap_or_else(Caller::trusted);
    let info = req.extensions_mut().remove::<RequestInfo>().unwrap_or_default();
    let label = req.extensions_mut().remove::<ResourceLabel>().unwrap_or_default().0;
    let classified =
        req.extensions_mut().remove::<Classified>().unwrap_or(Classified::Forward(ForwardReason::NotCached));
    match classified {
        Classified::Forward(reason) => {
            let fwd = Forwarded { verb: &info.verb, resource: &label, arrived };
            server.forward(req, reason, &caller, fwd).await
        }
        Classified::Refuse { error, proto } => {
            server.record(&info.verb, &label, error.to_status().code.as_u16(), Served::Proxy, arrived);
            body::error_ref_as(&error, proto)
        }
        Classified::Cache { cr, catalog, key } => {
            let Some((reader, prober)) = catalog.caches.get(&key) else {
                let fwd = Forwarded { verb: &info.verb, resource: &label, arrived };
                return server.forward(req, ForwardReason::NotCached, &caller, fwd).await;
            };
            let gr = reader.kind().group_resource();
            let verb = cr.plan.verb();
            let src = serve::Source { reader, prober, metrics: &server.metrics };
            match serve::serve(&cr, src, &server.serve, arrived).await {
                serve::Served::Response(mut resp) => {
                    server.record(verb, &gr, resp.status().as_u16(), Served::Cache, arrived);
                    resp.extensions_mut().insert(FromCache);
                    resp
                }
                serve::Served::Forward(reason) => {
                    let fwd = Forwarded { verb, resource: &gr, arrived };
                    server.forward(req, reason, &caller, fwd).await
                }
            }
        }
    }
}
