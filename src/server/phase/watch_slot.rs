//! Phase 10: a slot for each watch, served or forwarded, per user and client address
//! (`--max-watches-per-user`), held until the watch's body ends; 429 past the limit. Needs
//! users: none with `--auth=none`.

use std::sync::Arc;

use super::{arrived, context, pass, Classified, Next, Phase, Recorder, Req, Resp};
use crate::server::limits::{self, Limits};

#[derive(Clone)]
pub struct WatchSlot {
    /// Whether callers are users (`--auth=upstream`); per-user slots need users.
    pub per_user: bool,
    pub limits: Arc<Limits>,
    pub recorder: Recorder,
}

impl<B: Send + Sync + 'static> Phase<B> for WatchSlot {
    async fn call<S: Next<B>>(&self, req: Req<B>, next: &S) -> Resp {
        // A refused request (bad watch options) is answered at once: it holds no slot.
        let ctx = context(&req);
        let refused = matches!(ctx.and_then(|c| c.classified.as_ref()), Some(Classified::Refuse { .. }));
        let slot = match ctx.map(|c| (&c.info, &c.caller)) {
            Some((Some(info), Some(caller))) if !refused && self.per_user && info.verb == "watch" => {
                let addr = req.extensions().get::<crate::server::proxy::PeerAddr>().map(|p| p.0.ip());
                match self.limits.watch_slot(&caller.effective.name, addr) {
                    Ok(s) => Some(s),
                    Err(resp) => return self.recorder.refused(resp, "watch", "", arrived(&req)),
                }
            }
            _ => None,
        };
        let resp = pass(next, req).await;
        match slot {
            Some(g) => limits::Guarded::wrap(resp, g),
            None => resp,
        }
    }
}
