//! The request path as a tower stack, assembled here in the order of the README's phase list;
//! the phases themselves are `phase::*`. Called by `state::Server::handle`, once per request (the
//! stack is a few `Arc` clones).

use std::convert::Infallible;
use std::sync::Arc;

use hyper::body::Incoming;
use tower::ServiceBuilder;

use tower::Service;

use super::phase::{self, Next, PhaseLayer, Recorder, Req, Resp};
use super::{health, Server};

/// The stack, in the README's phase order. A tower `Service` (each phase a `Layer`), which
/// `Server::handle` runs statically (`Next::run`): one future for the whole request. Each phase
/// gets exactly the parts of the server it uses.
pub fn stack(
    server: &Arc<Server>,
) -> impl Next<Incoming> + Service<Req<Incoming>, Response = Resp, Error = Infallible> {
    let recorder = Recorder(server.metrics.clone());
    let page = server.clone();
    ServiceBuilder::new()
        .layer(PhaseLayer(phase::guard::Guard {
            loopback: server.loopback.clone(),
            recorder: recorder.clone(),
        }))
        .layer(PhaseLayer(phase::health::Health { server: server.clone() }))
        .layer(PhaseLayer(phase::sizes::Sizes { limits: server.limits.clone(), recorder: recorder.clone() }))
        .layer(PhaseLayer(phase::admit::Admit { limits: server.limits.clone(), recorder: recorder.clone() }))
        .layer(PhaseLayer(phase::compress::Compress))
        .layer(PhaseLayer(phase::pretty::Pretty))
        .layer(PhaseLayer(phase::authenticate::Authenticate {
            auth: server.auth.clone(),
            limits: server.limits.clone(),
            metrics_page: Arc::new(move || health::metrics(&page)),
            recorder: recorder.clone(),
        }))
        .layer(PhaseLayer(phase::classify::Classify { resources: server.resources.clone() }))
        .layer(PhaseLayer(phase::authorize::Authorize {
            auth: server.auth.clone(),
            recorder: recorder.clone(),
        }))
        .layer(PhaseLayer(phase::watch_slot::WatchSlot {
            per_user: server.auth.is_some(),
            limits: server.limits.clone(),
            recorder: recorder.clone(),
        }))
        .service(phase::dispatch::Dispatch {
            upstream: server.upstream.clone(),
            serve: server.serve.clone(),
            trusted_headers: server.trusted_headers.clone(),
            write_stall_timeout: server.limits.opts.write_stall_timeout,
            recorder,
        })
}

#[cfg(test)]
mod tests {
    /// Issue 32 §2: the order of the phases is pinned. Authorization reads the caller
    /// (authenticate) and the decision (classify); dispatch forwards with the caller's identity.
    /// A reorder must be deliberate: change this list with the README's phase table.
    #[test]
    fn the_phase_order_is_pinned() {
        let src = include_str!("stack.rs");
        let body =
            &src[src.find("ServiceBuilder::new()").unwrap_or(0)..src.find("#[cfg(test)]").unwrap_or(0)];
        let order: Vec<&str> = body
            .lines()
            .filter_map(|l| {
                l.trim()
                    .strip_prefix(".layer(PhaseLayer(phase::")
                    .or_else(|| l.trim().strip_prefix(".service(phase::"))
            })
            .filter_map(|l| l.split("::").next())
            .collect();
        assert_eq!(
            order,
            [
                "guard",
                "health",
                "sizes",
                "admit",
                "compress",
                "pretty",
                "authenticate",
                "classify",
                "authorize",
                "watch_slot",
                "dispatch"
            ]
        );
    }
}
