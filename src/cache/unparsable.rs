//! An object the upstream sent that the cache cannot parse (invalid JSON, no name, no valid
//! resourceVersion): the cache cannot hold the upstream's state without it. Skipping it would
//! lose its events for every watcher and leave a LIST without it, so instead every watch ends
//! at once (its client re-watches from its last RV, forwarded, and gets the event from the
//! apiserver), no watch starts, and every request is forwarded (reason `unparsable`, not
//! blocking `/readyz`) until a full list parses whole (`Writer::replace`).
//!
//! [`Writer::unparsable`] is called by `reflector` (an event's object, or a list's item);
//! `server::serve` and `server::state` read the flag it sets in the cache's progress.

use super::Writer;

impl Writer {
    /// The upstream sent an object that cannot be parsed (`why`): ends every watch, refuses new
    /// ones ([`crate::error::Error::Unparsable`]) and marks the cache unservable, not ready,
    /// until the next full list (which the reflector makes once every object of it parses).
    /// Returns how many watches ended.
    pub fn unparsable(&mut self, why: String) -> usize {
        let mut st = self.shared.state.lock();
        st.unservable = true;
        let ended = st.watchers.end_all();
        let rv = st.rv;
        // Under the state lock: a watch that read the cache ready before is refused when it
        // registers, and nothing is applied until the list.
        self.shared.progress.send_modify(|p| {
            if p.ready {
                p.since = tokio::time::Instant::now();
            }
            p.rv = rv;
            p.ready = false;
            p.unservable = true;
            p.last_error = Some(why);
        });
        ended
    }
}
