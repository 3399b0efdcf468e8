//! Phase 10: a per-user slot for each watch, served or forwarded (`--max-watches-per-user`),
//! held until the watch's body ends; 429 past the limit. Needs users: none with `--auth=none`.

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
                match self.limits.watch_slot(&caller.effective.name) {
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
