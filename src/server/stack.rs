//! The request path as a tower stack, assembled here in the order of the README's phase list;
//! the phases themselves are `phase::*`. Called by `Server::handle`, once per request (the
//! stack is a few `Arc` clones).

use std::convert::Infallible;
use std::sync::Arc;

use hyper::body::Incoming;
use tower::ServiceBuilder;

use tower::Service;

use super::phase::{self, Next, PhaseLayer, Req, Resp};
use super::Server;

/// The stack, in the README's phase order. A tower `Service` (each phase a `Layer`), which
/// `Server::handle` runs statically (`Next::run`): one future for the whole request.
pub fn stack(
    server: &Arc<Server>,
) -> impl Next<Incoming> + Service<Req<Incoming>, Response = Resp, Error = Infallible> {
    let s = || server.clone();
    ServiceBuilder::new()
        .layer(PhaseLayer(phase::guard::Guard(s())))
        .layer(PhaseLayer(phase::health::Health(s())))
        .layer(PhaseLayer(phase::sizes::Sizes(s())))
        .layer(PhaseLayer(phase::admit::Admit(s())))
        .layer(PhaseLayer(phase::authenticate::Authenticate(s())))
        .layer(PhaseLayer(phase::classify::Classify(s())))
        .layer(PhaseLayer(phase::authorize::Authorize(s())))
        .layer(PhaseLayer(phase::watch_slot::WatchSlot(s())))
        .layer(PhaseLayer(phase::compress::Compress))
        .service(phase::dispatch::Dispatch(s()))
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
                "authenticate",
                "classify",
                "authorize",
                "watch_slot",
                "compress",
                "dispatch"
            ]
        );
    }
}
