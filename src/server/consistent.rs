//! Consistent reads from the cache (KEP-2340 for a proxy): a Most Recent LIST or watch may be
//! served from the cache once the cache has caught up with what the upstream had when the
//! request arrived.
//!
//! One upstream probe (`LIST ?limit=1`, a consistent read upstream) per resource is in flight
//! at a time; its RV R is an upper bound of every write finished before it was sent. A request
//! that arrived before a probe was sent may use that probe's R: once the cache RV ≥ R (waiting
//! at most a short bound) the cache holds every such write, so read-your-writes holds. Used by
//! `server::serve`; the only place in `server` that asks the upstream on its own behalf.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::resource::{ResourceKind, Rv};
use crate::upstream::Upstream;

/// One probe: when it was sent, and its result once known.
struct Probe {
    sent: Instant,
    result: watch::Receiver<Option<Result<Rv, String>>>,
}

/// The coalescing prober of one resource.
pub struct Prober {
    upstream: Upstream,
    kind: ResourceKind,
    last: Mutex<Option<Probe>>,
}

impl Prober {
    pub fn new(upstream: Upstream, kind: ResourceKind) -> Arc<Prober> {
        Arc::new(Prober { upstream, kind, last: Mutex::new(None) })
    }

    /// A fresh upstream RV for a request that arrived at `arrived`: joins the newest probe if it
    /// was sent at or after `arrived`, else sends a new one.
    pub async fn fresh_rv(&self, arrived: Instant) -> Result<Rv, String> {
        let mut rx = {
            let mut last = self.last.lock();
            match &*last {
                Some(p) if p.sent >= arrived => p.result.clone(),
                _ => {
                    let (tx, rx) = watch::channel(None);
                    *last = Some(Probe { sent: Instant::now(), result: rx.clone() });
                    let upstream = self.upstream.clone();
                    let kind = self.kind.clone();
                    tokio::spawn(async move {
                        let r = upstream
                            .list_page(&kind, 1, None, None)
                            .await
                            .map(|p| p.rv)
                            .map_err(|e| e.to_string());
                        let _ = tx.send(Some(r));
                    });
                    rx
                }
            }
        };
        let res = tokio::time::timeout(Duration::from_secs(10), rx.wait_for(Option::is_some)).await;
        match res {
            Ok(Ok(v)) => v.clone().unwrap_or_else(|| Err("probe vanished".into())),
            Ok(Err(_)) => Err("probe task ended".into()),
            Err(_) => Err("probe timed out".into()),
        }
    }
}
