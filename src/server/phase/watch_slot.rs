//! Phase 10: a slot for each watch and each other request that holds a stream open — a
//! pod log (followed or not), an upgraded `exec` / `attach` / `port-forward` session — served or
//! forwarded, per user and client address (`--max-watches-per-user`); 429 past the
//! limit. The slot is held until the response body ends, and for an upgrade until its spliced
//! session ends (`upstream::HeldWhileUpgraded`): such requests hold no in-flight permit
//! (`classify::is_long_running`), so without this one user could hold any number of upstream
//! streams and connections open. Needs users: none with `--auth=none`. An upgrade also takes a
//! second `--max-connections` slot for its upstream connection (`limits::ConnectionSlots`,
//! with or without users).

use std::sync::Arc;

use super::{arrived, context, pass, Classified, Next, Phase, Recorder, Req, Resp};
use crate::server::classify::{self, RequestInfo};
use crate::server::limits::{self, Limits};
use crate::upstream::HeldWhileUpgraded;

#[derive(Clone)]
pub struct WatchSlot {
    /// Whether callers are users (`--auth=upstream`); per-user slots need users.
    pub per_user: bool,
    pub limits: Arc<Limits>,
    pub recorder: Recorder,
}

/// Whether a request holds a stream open once answered: a watch, a log (followed or not), or one
/// asking to upgrade (what `upstream::forward` splices on `101`). Not a `proxy` request: most
/// are short (metrics scraped through `nodes/<n>/proxy` from one service account on thousands
/// of nodes), and the apiserver bounds none of them.
fn holds_a_stream<B>(info: &RequestInfo, req: &Req<B>) -> bool {
    info.verb == "watch"
        || (info.subresource == "log" && classify::is_long_running(info))
        || crate::upstream::upgrade_protocol(req.headers()).is_some()
}

/// The request's verb, as `classify` found it ("" if not known).
fn ctx_verb<B>(req: &Req<B>) -> String {
    context(req).and_then(|c| c.info.as_ref()).map(|i| i.verb.clone()).unwrap_or_default()
}

impl<B: Send + Sync + 'static> Phase<B> for WatchSlot {
    async fn call<S: Next<B>>(&self, mut req: Req<B>, next: &S) -> Resp {
        // A refused request (bad watch options) is answered at once: it holds no slot.
        let ctx = context(&req);
        let refused = matches!(ctx.and_then(|c| c.classified.as_ref()), Some(Classified::Refuse { .. }));
        let slot = match ctx.map(|c| (&c.info, &c.caller)) {
            Some((Some(info), Some(caller))) if !refused && self.per_user && holds_a_stream(info, &req) => {
                let addr = req.extensions().get::<crate::server::proxy::PeerAddr>().map(|p| p.0.ip());
                // The authenticated user's, or the pair's when it impersonates (`limits::acting`).
                match self.limits.watch_slot(&limits::acting(&caller.user.name, &caller.effective.name), addr)
                {
                    Ok(s) => Some(Arc::new(s)),
                    Err(resp) => {
                        let verb = info.verb.clone();
                        return self.recorder.refused(resp, &verb, "", arrived(&req));
                    }
                }
            }
            _ => None,
        };
        if let Some(s) = &slot {
            HeldWhileUpgraded::hold(&mut req, s.clone());
        }
        // The second `--max-connections` slot of an upgrade (its upstream connection): none
        // left, 429 (the session would take a descriptor past the bound).
        if let Some(slots) = req.extensions().get::<limits::ConnectionSlots>().filter(|_| !refused) {
            match slots.0.clone().try_acquire_owned() {
                Ok(p) => HeldWhileUpgraded::hold(&mut req, Arc::new(p)),
                Err(_) => {
                    let verb = ctx_verb(&req);
                    return self.recorder.refused(limits::too_many(), &verb, "", arrived(&req));
                }
            }
        }
        let resp = pass(next, req).await;
        match slot {
            Some(g) => limits::Guarded::wrap(resp, g),
            None => resp,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::classify::request_info;
    use crate::server::limits::LimitOptions;
    use crate::server::phase::testing::{request, run, run_seen};

    fn slot(limit: usize) -> WatchSlot {
        let limits =
            Arc::new(Limits::new(LimitOptions { max_watches_per_user: limit, ..Default::default() }));
        WatchSlot { per_user: true, limits, recorder: Recorder::default() }
    }

    /// A request of `pq` by the trusted caller, its context filled as earlier phases fill it.
    fn by_user(pq: &str, headers: &[(&str, &str)]) -> Req<String> {
        let mut req = request(pq);
        for (k, v) in headers {
            req.headers_mut().append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                http::HeaderValue::from_str(v).unwrap(),
            );
        }
        let info = request_info(req.method(), req.uri().path(), req.uri().query());
        let ctx = super::super::context_mut(&mut req);
        ctx.info = Some(info);
        ctx.caller = Some(crate::server::auth::Caller::trusted());
        req
    }

    /// Every request that holds a stream open takes one of the user's slots, for as long as its
    /// body lasts — or, for an upgrade, as long as what the request carries on to the splice.
    #[tokio::test]
    async fn streams_of_every_kind_take_a_slot_short_requests_none() {
        let s = slot(1);
        let user = "system:unsecured";
        for (pq, headers) in [
            ("/api/v1/pods?watch=1", &[][..]),
            ("/api/v1/namespaces/a/pods/p/log?follow=true", &[][..]),
            // A log, followed or not: long-running, as the apiserver's.
            ("/api/v1/namespaces/a/pods/p/log", &[][..]),
            (
                "/api/v1/namespaces/a/pods/p/exec?command=sh",
                &[("connection", "Upgrade"), ("upgrade", "SPDY/3.1")][..],
            ),
            (
                "/api/v1/namespaces/a/pods/p/portforward",
                &[("connection", "upgrade"), ("upgrade", "websocket")][..],
            ),
        ] {
            let (held, seen) = run_seen(s.clone(), by_user(pq, headers)).await;
            assert_eq!(held.status(), 200, "{pq}");
            assert_eq!(s.limits.watches_of(user), 1, "{pq} holds a slot");
            let (refused, reached) = run(s.clone(), by_user(pq, headers)).await;
            assert_eq!((refused.status().as_u16(), reached), (429, false), "{pq}: the only slot is taken");
            // What goes on to the upgrade's splice holds the slot after the answer is gone.
            let carried =
                seen.unwrap().remove::<HeldWhileUpgraded>().expect("the slot goes on with the request");
            drop(held);
            assert_eq!(s.limits.watches_of(user), 1, "{pq}: held by what the splice would keep");
            drop(carried);
            assert_eq!(s.limits.watches_of(user), 0, "{pq}: freed when both are gone");
        }
        // Short requests, and raw flags on paths where they mean nothing, take none.
        for (pq, headers) in [
            ("/api/v1/pods", &[][..]),
            ("/api/v1/pods?follow=true", &[][..]),
            ("/api/v1/namespaces/a/pods/p/proxy/x", &[][..]),
            ("/api/v1/nodes/n/proxy/stats", &[][..]),
            ("/api/v1/namespaces/a/pods/p/exec", &[("upgrade", "SPDY/3.1")][..]),
            ("/api/v1/namespaces/a/pods/p/exec", &[("connection", "upgrade"), ("upgrade", "h2c")][..]),
        ] {
            let (resp, seen) = run_seen(s.clone(), by_user(pq, headers)).await;
            assert_eq!(resp.status(), 200, "{pq}");
            assert_eq!(s.limits.watches_of(user), 0, "{pq} holds no slot");
            assert!(seen.unwrap().get::<HeldWhileUpgraded>().is_none(), "{pq}");
        }
    }
}
