//! Phase 8: a per-user slot for each watch, served or forwarded (`--max-watches-per-user`),
//! held until the watch's body ends; 429 past the limit. Needs users: none with `--auth=none`.

use std::sync::Arc;

use super::{pass, Classified, Next, Phase, Req, Resp};
use crate::server::auth::Caller;
use crate::server::classify::RequestInfo;
use crate::server::limits;
use crate::server::Server;

#[derive(Clone)]
pub struct WatchSlot(pub Arc<Server>);

impl<B: Send + Sync + 'static> Phase<B> for WatchSlot {
    async fn call<S: Next<B>>(&self, req: Req<B>, next: &S) -> Resp {
        // A refused request (bad watch options) is answered at once: it holds no slot.
        let refused = matches!(req.extensions().get::<Classified>(), Some(Classified::Refuse { .. }));
        let slot = match (req.extensions().get::<RequestInfo>(), req.extensions().get::<Caller>()) {
            (Some(info), Some(caller)) if !refused => match self.0.watch_slot(info, caller) {
                Ok(s) => s,
                Err(resp) => return resp,
            },
            _ => None,
        };
        let resp = pass(next, req).await;
        match slot {
            Some(g) => limits::Guarded::wrap(resp, g),
            None => resp,
        }
    }
}
