//! A relist asked for from outside the reflector: the consistency check (`consistency`) found
//! the cache different from the upstream at the same RV. The cache is marked not ready at
//! once (its reads are forwarded, `/readyz` names the reason), and the reflector, woken, lists
//! again; the relist rules apply (every watch that started before the list ends).
//!
//! [`Reader::request_relist`] is called by `consistency`, and [`Reader::upstream_went_back`] by
//! it and `server::consistent` (an upstream found behind the cache), and through
//! [`Writer::upstream_went_back`] by `reflector` (its probe before a re-watch); [`Writer::relist_requested`]
//! is awaited by `reflector` beside its upstream watch.

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use tokio::sync::Notify;

use super::{Reader, Writer};
use crate::resource::Rv;

/// The pending request: why, and a wake-up for the reflector.
#[derive(Default)]
pub struct Request {
    /// Taken by the reflector when it acts on it: the RV at which the cache was found wrong,
    /// the number of full lists it had installed then, and why.
    reason: Mutex<Option<(Rv, u64, String)>>,
    /// Kept until the relist is in, for `/readyz?verbose`.
    shown: Mutex<Option<String>>,
    /// Set from the request until the relist is in: events and bookmarks applied meanwhile
    /// move the cache's RV but do not make it ready again (it is known wrong).
    pending: AtomicBool,
    wake: Notify,
}

impl Request {
    /// Whether a relist was asked for and is not in yet (a new watch is refused then:
    /// `watch::start`).
    pub(super) fn pending(&self) -> bool {
        self.pending.load(Ordering::Acquire)
    }
}

/// The one warning every finder of an upstream behind the cache logs (the consistency check, a
/// consistent read, the reflector's probe before a re-watch).
pub fn warn_went_back(resource: &str, cache: Rv, upstream: Rv, by: &'static str) {
    tracing::warn!(resource, cache = %cache, upstream = %upstream, by, "the upstream is at a resourceVersion below the cache's: its storage went back (etcd restored without --bump-revision?); relisting");
}

impl Reader {
    /// The number of full lists the cache has installed: a finding about its state is made
    /// after reading it, and handed to [`Reader::request_relist`].
    pub fn lists(&self) -> u64 {
        self.shared.state.lock().lists
    }

    /// Lists installed below the cache's RV (the upstream's storage went back): an upstream
    /// answer read while this was `n` names a state of the history that is gone once it is not.
    pub fn histories(&self) -> u64 {
        self.shared.state.lock().histories
    }

    /// Asks the reflector for a relist, the cache having been found wrong at `at` with
    /// `lists` full lists installed ([`Reader::lists`], read before the state the finding is
    /// about), and marks the cache not ready until it is done.
    ///
    /// A stale request is dropped: one for an RV above the cache's (the cache has been relisted
    /// below it since: the upstream's storage went back, and two reads found it at once), and
    /// one made before a full list landed (the state found wrong is gone; distrusting the new
    /// one would end every watch started from it and relist again for nothing).
    pub fn request_relist(&self, at: Rv, lists: u64, reason: String) {
        // Under the state lock: a list (`Writer::replace`, which clears the request) and an
        // event (`Writer::advance`, which reads it) come wholly before or after.
        let st = self.shared.state.lock();
        if at > st.rv || st.lists != lists {
            drop(st);
            tracing::debug!(resource = %self.shared.kind.group_resource(), at = %at, "relist request dropped: the cache was relisted since");
            return;
        }
        self.shared.progress.send_modify(|p| {
            if p.ready {
                p.since = tokio::time::Instant::now();
            }
            p.ready = false;
            p.last_error = Some(reason.clone());
        });
        self.shared.relist.pending.store(true, Ordering::Release);
        *self.shared.relist.shown.lock() = Some(reason.clone());
        *self.shared.relist.reason.lock() = Some((at, lists, reason));
        drop(st);
        self.shared.relist.wake.notify_one();
    }

    /// The upstream answered a read sent after the cache was at `cache` with `upstream`, below
    /// it: its storage went back (etcd restored without `--bump-revision`). Logged (`by`: who
    /// found it) and the cache relisted; `Writer::replace` then takes the lower RV.
    pub fn upstream_went_back(&self, cache: Rv, upstream: Rv, by: &'static str) {
        warn_went_back(&self.shared.kind.group_resource(), cache, upstream, by);
        self.request_relist(
            cache,
            self.lists(),
            format!("the upstream is at resourceVersion {upstream}, below the cache's {cache}: its storage went back; relisting"),
        );
    }

    /// Why a relist was asked for, until it is in (`/readyz?verbose`).
    pub fn relist_reason(&self) -> Option<String> {
        self.shared.relist.shown.lock().clone()
    }
}

impl Writer {
    /// [`Reader::upstream_went_back`], found by the reflector itself (its probe before a
    /// re-watch): the cache is not ready and a relist pending at once, as when a probe or the
    /// consistency check finds it. Before, the reflector only went to list again, and until that
    /// list landed (seconds for a large resource; for ever while lists failed or the byte
    /// budget refused them) the cache stayed ready: a watch from an RV the new history issued
    /// got the gone history's events, and the state file was written from it.
    pub fn upstream_went_back(&self, cache: Rv, upstream: Rv, by: &'static str) {
        Reader { shared: self.shared.clone() }.upstream_went_back(cache, upstream, by);
    }

    /// A full list is in (`Writer::replace`, under the state lock): a request made before it is
    /// of a state that is gone, and dropped; `/readyz?verbose` no longer names it.
    pub(super) fn relist_done(&self) {
        self.shared.relist.reason.lock().take();
        self.shared.relist.shown.lock().take();
        self.shared.relist.pending.store(false, Ordering::Release);
    }

    /// Whether a relist was asked for and is not in yet (`Writer::apply` and
    /// `Writer::bookmark` then leave the cache not ready).
    pub(super) fn relist_pending(&self) -> bool {
        self.shared.relist.pending()
    }

    /// The cache was found wrong at `at` (the reflector, before it relists, the cache not
    /// ready): from now on a watch from any RV up to the cache's RV now (`at` or later: what
    /// came after `at` was applied to the wrong state) answers 410 and an Exact read or
    /// continue token there is forwarded, even once the relist is in and at that RV itself —
    /// a client that resumes there holds what the wrong cache served. The history is emptied
    /// and its floor raised above that RV (the 410's "oldest"), which the relist's
    /// `History::reset` keeps; a relist that lands below the floor leaves the cache unready
    /// until the upstream moves past it (`Writer::replace`).
    pub fn distrust_through(&self, at: Rv) {
        let mut st = self.shared.state.lock();
        // Found wrong at an RV above the cache's: relisted below it since (the upstream's
        // storage went back), nothing it served there is in the new history.
        if at > st.rv {
            return;
        }
        let through = at.max(st.rv);
        st.history.reset_above(through);
    }

    /// Resolves when a relist was asked for (where the cache was found wrong, and why),
    /// consuming the request. A stale one is dropped: one for an RV above the cache's (asked
    /// for before a relist below it landed: the upstream's storage went back, found by two
    /// reads at once; it would distrust every RV up to the gone one and leave the cache unready
    /// until the upstream passed it), and one made before a full list that landed since.
    pub async fn relist_requested(&self) -> (Rv, String) {
        loop {
            let request = self.shared.relist.reason.lock().take();
            if let Some((at, lists, why)) = request {
                let st = self.shared.state.lock();
                if at <= st.rv && st.lists == lists {
                    return (at, why);
                }
                drop(st);
                tracing::debug!(resource = %self.shared.kind.group_resource(), at = %at, "relist request dropped: the cache was relisted since");
                continue;
            }
            self.shared.relist.wake.notified().await;
        }
    }
}
