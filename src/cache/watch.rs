//! One watch served from the cache: the replay (history events after the start RV, or
//! synthetic ADDED events for the current state), then live events from the fan-out, with
//! BOOKMARKs for watchers that asked for them, until the deadline.
//!
//! Started by `Reader::watch` (called by `server::serve`); `Watch::next` yields the framed
//! lines of the response body, one event each, never re-encoded. A watch's initial objects
//! not sent yet are let go at its deadline by a timer of their own ([`Unsent`]), whether or
//! not the body is polled again.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::time::{Instant, Sleep};

use super::filter::{Filter, LazyFrames};
use super::initial::{Initial, Unsent};
use super::watchers::{Delivery, WatcherId};
use super::{Reader, Shared, Snapshot};
use crate::error::Error;
use crate::metadata_only::{self, Repr};
use crate::proto::ProtoType;
use crate::resource::{frame_event, frame_object, Event, EventType, ResourceKind, Rv};

/// Where a watch starts.
#[derive(Clone, Debug)]
pub enum WatchStart {
    /// Events with RV > N (legacy watch, or `sendInitialEvents=false`). Older than the history
    /// → one ERROR 410 event; newer than the cache → waits silently.
    After(Rv),
    /// Events after the current cache RV, no initial state (`sendInitialEvents=false`, RV 0).
    Now,
    /// Events after `rv`, a revision the upstream issued after the request arrived (RV unset,
    /// `sendInitialEvents=false`): like `After`, but if a relist has moved the history floor
    /// past `rv`, events after the cache RV (a later start is as "most recent"; the apiserver
    /// never answers such a watch 410), or if the history `rv` was read in (`histories`,
    /// `Reader::histories`) is gone since (the upstream's storage went back: `rv` names a
    /// revision of the old history, and a start from it skipped the new one's changes up to it).
    MostRecent { rv: Rv, histories: u64 },
    /// Synthetic ADDED for the current state, then (with bookmarks) the
    /// `k8s.io/initial-events-end` BOOKMARK, then live events (watch-list).
    InitialEvents,
    /// Synthetic ADDED for the current state, then live events, no end BOOKMARK (a legacy
    /// watch from RV 0 or unset, which is not a watch-list).
    State,
    /// A watch-list whose initial state is `snapshot`'s selection, proven to be the upstream's
    /// state at `rv` (ahead of the cache: `server::consistent`): ADDED for it, the end BOOKMARK
    /// at `rv`, then live events after `rv`; events ≤ `rv` are skipped and no BOOKMARK goes out
    /// until the cache passes `rv`. If the cache has reached `rv` by the time the watch
    /// registers, or a list below the cache's RV has landed since the snapshot (the upstream's
    /// storage went back: `rv` is of a history that is gone), this is `InitialEvents` from the
    /// cache's own state. A relist in the same history does not matter: the snapshot is still
    /// the state at `rv`, and the watch registers after it.
    Proven { rv: Rv, snapshot: Snapshot },
}

/// What a watch asks for.
#[derive(Clone, Debug)]
pub struct WatchRequest {
    pub filter: Filter,
    pub start: WatchStart,
    /// `allowWatchBookmarks=true`.
    pub bookmarks: bool,
    /// When the stream ends (timeoutSeconds, or the server's own cap).
    pub deadline: Instant,
}

/// The queue capacity an idle watch may keep; a larger one (a replay's) is freed once drained.
const PENDING_KEPT: usize = 16;

/// History events a replay takes at a time (under the cache lock), as its client reads.
const REPLAY_STEP: usize = 128;
/// At most about this many bytes of a replay's frames are queued at a time.
const REPLAY_STEP_BYTES: usize = 256 * 1024;

/// A running watch.
pub struct Watch {
    shared: Arc<Shared>,
    id: Option<WatcherId>,
    rx: mpsc::Receiver<Delivery>,
    /// Frames ready to go out before anything else (a replay's step, drained events,
    /// bookmarks).
    pending: VecDeque<Bytes>,
    /// The history events still to replay, read [`REPLAY_STEP`] at a time as the client
    /// reads; sent before any live event.
    replay: Option<Replay>,
    /// Objects still to send as synthetic ADDED events; dropped (with its buffer: 8 bytes per
    /// object of a watch-list) once sent, not kept for the life of the watch, and at the
    /// deadline if never sent ([`Unsent`]).
    initial: Option<Unsent>,
    /// The end-of-initial-events bookmark to send after `initial` (watch-list with bookmarks).
    end_bookmark: Option<Rv>,
    /// The RV of the end-of-initial-events bookmark once sent: no other bookmark at it (the
    /// apiserver's `wasBookmarkAfterRvSent`).
    end_sent: Option<Rv>,
    /// RV of the newest event or bookmark sent; bookmarks never go back or repeat.
    last_rv: Rv,
    bookmarks: bool,
    /// The representation of the initial events and bookmarks (live events come framed in it).
    repr: Repr,
    next_bookmark: Instant,
    deadline: Instant,
    /// The deadline and bookmark timers, registered once per watch (not per event): a
    /// delivery touches neither. Made at the first poll (a watch may be created outside the
    /// runtime).
    deadline_timer: Option<Pin<Box<Sleep>>>,
    bookmark_timer: Option<Pin<Box<Sleep>>>,
    /// The stream has ended; it stays ended.
    done: bool,
}

pub(super) fn start(reader: &Reader, req: WatchRequest) -> Result<Watch, Error> {
    let shared = reader.shared.clone();
    let repr = req.filter.repr;
    let filter = Arc::new(req.filter);
    let queue = shared.opts.watcher_queue;
    let mut initial = None;
    let mut end_bookmark = None;
    let last_rv;
    {
        let mut st = shared.state.lock();
        if st.watchers.is_closed() {
            return Err(Error::ServiceUnavailable("the server is shutting down".into()));
        }
        if st.unservable {
            return Err(Error::Unparsable);
        }
        // Found wrong since the server saw it ready (under this lock: `request_relist`), before
        // this watch could register: its initial events or replay would be of the wrong state.
        if shared.relist.pending() {
            return Err(Error::Relisting);
        }
        let start = match req.start {
            WatchStart::MostRecent { rv, histories }
                if rv < st.history.floor() || histories != st.histories =>
            {
                WatchStart::Now
            }
            WatchStart::MostRecent { rv, .. } => WatchStart::After(rv),
            other => other,
        };
        match start {
            WatchStart::After(rv) => {
                if rv < st.history.floor() {
                    return Err(Error::TooOldResourceVersion {
                        requested: rv,
                        oldest: st.history.oldest_shown(),
                    });
                }
                // A replayed event without an exact protobuf encoding: the apiserver serves it
                // (made now, once per event version, kept with the event for the replay).
                if repr.is_proto()
                    && st
                        .history
                        .newer_than(rv)
                        .any(|ev| filter.frame_for(ev, &LazyFrames::default()).is_err())
                {
                    return Err(Error::NoExactEncoding);
                }
                // Replayed in steps as the client reads (`Replay`), not queued whole: a client
                // that never reads holds a step, not a copy of the history's frames (32 bytes
                // each, and every frame the history lets go of meanwhile).
                last_rv = st.history.newer_than(rv).next_back().map_or(rv, |e| e.rv);
                // Only a replay with something for this watcher is kept: a relist at the cache's
                // RV keeps a watch that got every event up to it, which one still replaying has
                // not (`Step::Lost`).
                let replay = if st.history.newer_than(rv).any(|ev| filter.concerns(ev)) {
                    let mut replay = Replay {
                        after: rv,
                        through: last_rv,
                        generation: st.history.generation(),
                        filter: filter.clone(),
                        taken: VecDeque::new(),
                    };
                    // The first step is taken with the request: a watch from the floor of a
                    // busy history is not overtaken before its client reads.
                    replay.fetch(&st.history);
                    Some(replay)
                } else {
                    if filter.shard.is_some() {
                        let n = st.history.newer_than(rv).filter(|ev| filter.shard_excludes(ev)).count();
                        st.watchers.add_shard_filtered(n as u64);
                    }
                    None
                };
                let (id, rx) =
                    st.watchers.add(filter.clone(), shared.kind.namespaced, last_rv, queue, replay.is_some());
                drop(st);
                let mut watch =
                    finish(shared, id, rx, None, None, last_rv, req.bookmarks, repr, req.deadline);
                watch.replay = replay;
                return Ok(watch);
            }
            WatchStart::Now | WatchStart::MostRecent { .. } => {
                last_rv = st.rv;
            }
            WatchStart::Proven { rv, snapshot } if rv > st.rv && snapshot.histories == st.histories => {
                last_rv = rv;
                initial = Some(Initial::of_store(&snapshot.store, filter.clone(), shared.kind.namespaced));
                if req.bookmarks {
                    end_bookmark = Some(rv);
                }
            }
            WatchStart::State => {
                last_rv = st.rv;
                initial = Some(Initial::of_store(&st.store, filter.clone(), shared.kind.namespaced));
            }
            WatchStart::InitialEvents | WatchStart::Proven { .. } => {
                last_rv = st.rv;
                initial = Some(Initial::of_store(&st.store, filter.clone(), shared.kind.namespaced));
                if req.bookmarks {
                    end_bookmark = Some(st.rv);
                }
            }
        }
        // In protobuf, every initial object must have its exact encoding (made now, once per
        // object version), or the apiserver serves the watch.
        if repr.is_proto() && !initial.as_ref().is_none_or(|i| i.all(|o| o.proto_message_as(repr).is_some()))
        {
            return Err(Error::NoExactEncoding);
        }
        let (id, rx) = st.watchers.add(filter.clone(), shared.kind.namespaced, last_rv, queue, false);
        drop(st);
        Ok(finish(shared, id, rx, initial, end_bookmark, last_rv, req.bookmarks, repr, req.deadline))
    }
}

#[allow(clippy::too_many_arguments)]
fn finish(
    shared: Arc<Shared>,
    id: WatcherId,
    rx: mpsc::Receiver<Delivery>,
    initial: Option<Initial>,
    end_bookmark: Option<Rv>,
    last_rv: Rv,
    bookmarks: bool,
    repr: Repr,
    deadline: Instant,
) -> Watch {
    let now = Instant::now();
    let next_bookmark = bookmark_time(now, shared.opts.bookmark_interval, deadline);
    // A watch of 2 s or less gets no periodic bookmark.
    let bookmarks = bookmarks && next_bookmark > now;
    Watch {
        shared,
        id: Some(id),
        rx,
        pending: VecDeque::new(),
        replay: None,
        initial: initial.map(|i| Unsent::new(i, deadline)),
        end_bookmark,
        end_sent: None,
        last_rv,
        bookmarks,
        repr,
        next_bookmark,
        deadline,
        deadline_timer: None,
        bookmark_timer: None,
        done: false,
    }
}

/// The history events a watch from an RV still has to replay: those in `(after, through]`,
/// `through` being the newest when the watch started (live events after it come through the
/// watcher's queue). Read a step at a time under the cache lock; if the history let go of the
/// next one meanwhile (evicted for its window, count or `--cache-memory-limit`, or a relist),
/// the watch ends after what it sent, as the apiserver's does when its watch cache's buffer
/// moved past a watcher's interval: its client re-watches from its last RV (410, relist).
struct Replay {
    after: Rv,
    through: Rv,
    generation: u64,
    filter: Arc<Filter>,
    /// Events taken from the history (under the cache lock), not framed yet: a step's.
    taken: VecDeque<Arc<Event>>,
}

/// What a replay step did.
enum Step {
    /// Frames queued (or events skipped); more to come.
    More,
    /// The last event up to `through` is queued.
    Done,
    /// The next event is gone from the history: the watch ends. `relisted`: the history
    /// restarted (a relist, or one about to be: `distrust_through`; the cache dropped), rather
    /// than let go of its oldest events.
    Lost { relisted: bool },
}

impl Replay {
    /// Takes the next [`REPLAY_STEP`] events after `after` (up to `through`) from `history`,
    /// under the cache lock; `false` when the next one is gone (evicted, or a relist).
    fn fetch(&mut self, history: &super::History) -> bool {
        if history.generation() != self.generation || self.after < history.floor() {
            return false;
        }
        let through = self.through;
        self.taken.extend(
            history.newer_than(self.after).take_while(|e| e.rv <= through).take(REPLAY_STEP).cloned(),
        );
        true
    }

    /// Frames taken events into `pending`, outside the cache lock, up to [`REPLAY_STEP_BYTES`]
    /// (a selector's transition frames are copies of their own); fetches a step first when
    /// none is left.
    fn step(&mut self, shared: &Shared, pending: &mut VecDeque<Bytes>) -> Step {
        if self.taken.is_empty() && self.after < self.through {
            let st = shared.state.lock();
            if !self.fetch(&st.history) {
                return Step::Lost { relisted: st.history.generation() != self.generation };
            }
        }
        let (mut bytes, mut filtered) = (0, 0);
        while bytes < REPLAY_STEP_BYTES {
            let Some(ev) = self.taken.pop_front() else { break };
            match self.filter.frame_for(&ev, &LazyFrames::default()) {
                Ok(Some(f)) => {
                    bytes += f.len();
                    pending.push_back(f);
                }
                Ok(None) => filtered += u64::from(self.filter.shard_excludes(&ev)),
                // Checked at the start: never for an event of the history.
                Err(_) => return Step::Lost { relisted: false },
            }
            self.after = ev.rv;
        }
        if filtered > 0 {
            shared.state.lock().watchers.add_shard_filtered(filtered);
        }
        if self.taken.is_empty() && self.after >= self.through {
            Step::Done
        } else {
            Step::More
        }
    }
}

/// Next periodic bookmark: one interval from now, but at least 2 s before the deadline.
fn bookmark_time(now: Instant, interval: std::time::Duration, deadline: Instant) -> Instant {
    let early = deadline.checked_sub(std::time::Duration::from_secs(2)).unwrap_or(now);
    (now + interval).min(early)
}

impl Watch {
    /// The next frame of the response body; `None` when the watch is over (deadline, slow
    /// watcher closed, cache shut down).
    pub async fn next(&mut self) -> Option<Bytes> {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }

    /// Polls for the next frame: none past the deadline; then what is queued first (replay,
    /// initial events, the end bookmark), then live events, then the deadline and the bookmark
    /// timer, in that order.
    /// Once it has returned `Ready(None)` it always does.
    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        loop {
            // The deadline first: a watch whose queue is never empty when read (a client as
            // fast as the events) would otherwise outlive it (a review).
            if self.done || Instant::now() >= self.deadline {
                self.done = true;
                return Poll::Ready(None);
            }
            if let Some(f) = self.pending.pop_front() {
                return Poll::Ready(Some(f));
            }
            if let Some(replay) = self.replay.as_mut() {
                match replay.step(&self.shared, &mut self.pending) {
                    Step::More => {}
                    Step::Done => {
                        self.replay = None;
                        if let Some(id) = &self.id {
                            self.shared.state.lock().watchers.replayed(id);
                        }
                    }
                    Step::Lost { relisted } => {
                        self.replay = None;
                        self.done = true;
                        // Its watcher goes now (not when the body is dropped), counted once: as
                        // ended by the relist (unless the relist ended it already) or overtaken.
                        if let Some(id) = self.id.take() {
                            let w = &mut self.shared.state.lock().watchers;
                            if relisted {
                                w.ended_by_relist(&id);
                            } else {
                                w.overtaken(&id);
                            }
                        }
                        return Poll::Ready(None);
                    }
                }
                continue;
            }
            if self.pending.capacity() > PENDING_KEPT {
                // A drained replay: its buffer goes, a bookmark or two fit in a new one.
                self.pending = VecDeque::new();
            }
            if let Some(initial) = self.initial.as_ref() {
                let next = match initial.objects.lock().as_mut() {
                    Some(objects) => objects.next(),
                    // Let go at the deadline, unsent: the watch is over.
                    None => {
                        self.done = true;
                        return Poll::Ready(None);
                    }
                };
                match next {
                    // Encodings checked at the start: always there.
                    Some(obj) => match frame_object(EventType::Added, &obj, self.repr) {
                        Some(f) => return Poll::Ready(Some(f)),
                        None => {
                            self.done = true;
                            return Poll::Ready(None);
                        }
                    },
                    None => self.initial = None,
                }
            }
            if let Some(rv) = self.end_bookmark.take() {
                self.last_rv = self.last_rv.max(rv);
                self.end_sent = Some(rv);
                if let Some(f) =
                    bookmark_frame(&self.shared.kind, &self.shared.typing.proto, rv, true, self.repr)
                {
                    return Poll::Ready(Some(f));
                }
                continue;
            }
            match self.rx.poll_recv(cx) {
                Poll::Ready(Some(d)) => {
                    self.last_rv = self.last_rv.max(d.rv);
                    if d.arrived_ns != 0 {
                        self.shared.delivered(d.arrived_ns);
                    }
                    return Poll::Ready(Some(d.frame));
                }
                Poll::Ready(None) => {
                    self.done = true;
                    return Poll::Ready(None);
                }
                Poll::Pending => {}
            }
            let deadline = self.deadline;
            let timer =
                self.deadline_timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
            if timer.as_mut().poll(cx).is_ready() {
                self.done = true;
                return Poll::Ready(None);
            }
            if self.bookmarks {
                let at = self.next_bookmark;
                let timer = self.bookmark_timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
                if timer.as_mut().poll(cx).is_ready() {
                    self.bookmark();
                    let at = self.next_bookmark;
                    if let Some(t) = self.bookmark_timer.as_mut() {
                        t.as_mut().reset(at);
                    }
                    continue;
                }
            }
            return Poll::Pending;
        }
    }

    /// Queues a BOOKMARK at the dispatched RV, after whatever events are already queued for
    /// this watcher: every event up to that RV is in the queue when it is read, so draining the
    /// queue afterwards keeps RVs in order (even while a slow delivery is pending).
    fn bookmark(&mut self) {
        let now = Instant::now();
        let cache_rv = Rv(self.shared.dispatched.load(std::sync::atomic::Ordering::Acquire));
        let closed = loop {
            match self.rx.try_recv() {
                Ok(d) => {
                    self.last_rv = self.last_rv.max(d.rv);
                    // Drained ahead of a bookmark: it goes to the body next, observed now.
                    if d.arrived_ns != 0 {
                        self.shared.delivered(d.arrived_ns);
                    }
                    self.pending.push_back(d.frame);
                }
                Err(mpsc::error::TryRecvError::Empty) => break false,
                Err(mpsc::error::TryRecvError::Disconnected) => break true,
            }
        };
        if closed {
            // The watcher was ended (too slow, or at a relist) before `cache_rv` was
            // published: its queue does not hold every event up to it, and a bookmark would
            // let the client resume past what it missed. The stream ends after what is queued.
            self.bookmarks = false;
            return;
        }
        // After the pre-deadline bookmark there is no other.
        self.next_bookmark = bookmark_time(now, self.shared.opts.bookmark_interval, self.deadline);
        self.bookmarks = self.next_bookmark > now;
        // Periodic bookmarks only carry news; the one 2 s before the deadline goes out even
        // when nothing happened since the last event or bookmark (at that same RV), as the
        // apiserver's does (its cacher sends the cache RV, which its progress notifications
        // keep moving, whenever it is past the watch's start): the client re-watches from a
        // fresh RV. Never backwards: a watch from a future RV waits silently. Never at the
        // end-of-initial-events bookmark's RV again: the apiserver's watcher sends one at its
        // start RV only while `wasBookmarkAfterRvSent` is false (a review).
        let last = !self.bookmarks;
        let repeat = last && cache_rv == self.last_rv && cache_rv > Rv(0) && self.end_sent != Some(cache_rv);
        if cache_rv > self.last_rv || repeat {
            self.last_rv = cache_rv;
            if let Some(f) =
                bookmark_frame(&self.shared.kind, &self.shared.typing.proto, cache_rv, false, self.repr)
            {
                self.pending.push_back(f);
            }
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.shared.state.lock().watchers.remove(&id);
        }
    }
}

/// A BOOKMARK event: the kind with only `metadata.resourceVersion` (plus the
/// `k8s.io/initial-events-end` annotation for the end of a watch-list's initial events), and
/// the zero-valued non-omitempty members of the built-in Pod type (docs/apiserver-watch-cache.md §3.2); metadata
/// only, the PartialObjectMetadata the apiserver makes of that object.
///
/// In protobuf, the same objects encoded as the apiserver encodes its (zero-valued) object;
/// `None` only if the schema cannot encode them.
pub fn bookmark_frame(
    kind: &ResourceKind,
    proto: &ProtoType,
    rv: Rv,
    end_of_initial: bool,
    repr: Repr,
) -> Option<Bytes> {
    let object = bookmark_object(kind, rv, end_of_initial, repr.is_metadata());
    if !repr.is_proto() {
        return Some(frame_event(EventType::Bookmark, &[object]));
    }
    proto.json_event(EventType::Bookmark.as_str(), &object, repr.is_metadata())
}

/// The JSON object of a BOOKMARK (see [`bookmark_frame`]).
fn bookmark_object(kind: &ResourceKind, rv: Rv, end_of_initial: bool, metadata: bool) -> Bytes {
    if metadata {
        return metadata_only::bookmark(&rv.to_string(), end_of_initial);
    }
    let annotations =
        if end_of_initial { r#","annotations":{"k8s.io/initial-events-end":"true"}"# } else { "" };
    let extra = if kind.builtin && kind.group.is_empty() && kind.resource == "pods" {
        r#","spec":{"containers":null},"status":{}"#
    } else {
        ""
    };
    let obj = if kind.builtin {
        format!(
            r#"{{"kind":{},"apiVersion":{},"metadata":{{"resourceVersion":"{rv}"{annotations}}}{extra}}}"#,
            serde_json::Value::from(kind.kind.as_str()),
            serde_json::Value::from(kind.api_version())
        )
    } else {
        // An `Unstructured`, whose keys Go's encoder sorts: `annotations` first.
        let annotations =
            if end_of_initial { r#""annotations":{"k8s.io/initial-events-end":"true"},"# } else { "" };
        format!(
            r#"{{"apiVersion":{},"kind":{},"metadata":{{{annotations}"resourceVersion":"{rv}"}}}}"#,
            serde_json::Value::from(kind.api_version()),
            serde_json::Value::from(kind.kind.as_str())
        )
    };
    Bytes::from(obj)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{new, CacheOptions, Filter};
    use crate::resource::Object;

    /// A custom resource's BOOKMARK is an `Unstructured`, its keys sorted: the end-of-initial
    /// annotation before the RV (it was after: found by a review). A built-in's is typed.
    #[test]
    fn a_custom_resources_end_bookmark_has_its_keys_sorted() {
        let cr = ResourceKind::new("example.com", "v1", "widgets", "Widget", true, false);
        assert_eq!(
            &bookmark_object(&cr, Rv(7), true, false)[..],
            br#"{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"annotations":{"k8s.io/initial-events-end":"true"},"resourceVersion":"7"}}"#
        );
        assert_eq!(
            &bookmark_object(&cr, Rv(7), false, false)[..],
            br#"{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"resourceVersion":"7"}}"#
        );
        let cm = ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true);
        assert_eq!(
            &bookmark_object(&cm, Rv(7), true, false)[..],
            br#"{"kind":"ConfigMap","apiVersion":"v1","metadata":{"resourceVersion":"7","annotations":{"k8s.io/initial-events-end":"true"}}}"#
        );
    }

    fn cm(w: &crate::cache::Writer, rv: u64) -> Object {
        let json = format!(r#"{{"metadata":{{"name":"x","namespace":"a","resourceVersion":"{rv}"}}}}"#);
        w.parse(Bytes::from(json)).unwrap()
    }

    /// Issue 22 §4: a watcher dropped for overflow just before its bookmark timer fires (the
    /// race of another thread) must not get a bookmark at the RV of the event it missed.
    #[tokio::test]
    async fn no_bookmark_once_the_watcher_was_dropped() {
        let kind = ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true);
        let (mut w, r) = new(kind, CacheOptions { watcher_queue: 1, ..Default::default() });
        w.replace(vec![cm(&w, 5)], Rv(10));
        let deadline = Instant::now() + std::time::Duration::from_secs(300);
        let mut watch = r
            .watch(WatchRequest {
                filter: Filter::default(),
                start: WatchStart::After(Rv(10)),
                bookmarks: true,
                deadline,
            })
            .unwrap();
        w.apply(EventType::Modified, cm(&w, 11)).unwrap();
        // The queue is full: dropping the dispatch closes the watcher at once; 12 is published.
        drop(w.apply(EventType::Modified, cm(&w, 12)).unwrap());
        assert_eq!(r.watcher_stats().terminated, 1);
        watch.bookmark();
        assert_eq!(watch.pending.len(), 1, "the event it has, and no bookmark at 12");
        assert!(!watch.bookmarks);
        assert!(watch.next().await.is_some());
        assert!(watch.next().await.is_none());
    }

    fn named(w: &crate::cache::Writer, name: &str, rv: u64) -> Object {
        let json = format!(r#"{{"metadata":{{"name":"{name}","namespace":"a","resourceVersion":"{rv}"}}}}"#);
        w.parse(Bytes::from(json)).unwrap()
    }

    /// A watch's initial objects that a client never takes (hyper never polls the body again)
    /// are let go at the deadline, not when the connection ends: its snapshot of the store,
    /// which holds every version the store replaced since; polled after that, the watch ends
    /// without claiming the initial state complete.
    #[tokio::test(start_paused = true)]
    async fn unsent_initial_objects_are_let_go_at_the_deadline() {
        let kind = ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true);
        let (mut w, r) = new(kind, CacheOptions::default());
        let objects: Vec<Object> = (0..100).map(|i| named(&w, &format!("o{i}"), 5)).collect();
        w.replace(objects, Rv(10));
        let deadline = Instant::now() + std::time::Duration::from_secs(300);
        let req = WatchRequest {
            filter: Filter::default(),
            start: WatchStart::InitialEvents,
            bookmarks: true,
            deadline,
        };
        let mut list = r.watch(req).unwrap();
        assert!(list.next().await.is_some(), "one initial event taken, then the client stops");
        let old = r.get("a", "o50").unwrap();
        w.apply(EventType::Modified, named(&w, "o50", 11)).unwrap().finish().await;
        let held = || Arc::strong_count(&old);
        let before = held();
        tokio::time::sleep(std::time::Duration::from_secs(299)).await;
        assert_eq!(held(), before);
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        // The step it had taken (o0 to o255) and its snapshot of the store.
        assert_eq!(held(), before - 2, "let go at the deadline, the body never polled");
        assert!(list.next().await.is_none(), "over: no end-of-initial-events bookmark");
    }

    /// A watch-list sends the state it started at, in key order, selected by its namespace and
    /// labels, whatever the store does meanwhile; one from an upstream LIST shares its objects
    /// (no copy per watch). Either takes a step of objects at a time.
    #[tokio::test]
    async fn a_watch_list_sends_its_starting_state_a_step_at_a_time() {
        let kind = ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true);
        let (mut w, r) = new(kind, CacheOptions::default());
        let obj = |w: &crate::cache::Writer, ns: &str, i: usize, rv: u64| {
            let json = format!(
                r#"{{"metadata":{{"name":"o{i:04}","namespace":"{ns}","resourceVersion":"{rv}","labels":{{"even":"{}"}}}}}}"#,
                i.is_multiple_of(2)
            );
            w.parse(Bytes::from(json)).unwrap()
        };
        let mut objects: Vec<Object> = (0..1000).map(|i| obj(&w, "a", i, 5)).collect();
        objects.extend((0..10).map(|i| obj(&w, "b", i, 5)));
        w.replace(objects, Rv(10));
        let deadline = Instant::now() + std::time::Duration::from_secs(300);
        let labels = crate::selector::LabelSelector::parse("even=true").unwrap();
        let filter = Filter::new(Some("a".into()), None, labels, Default::default());
        let start = WatchStart::InitialEvents;
        let mut list =
            r.watch(WatchRequest { filter: filter.clone(), start, bookmarks: false, deadline }).unwrap();
        let name = |f: &Bytes| -> String {
            let v: serde_json::Value = serde_json::from_slice(f).unwrap();
            v["object"]["metadata"]["name"].as_str().unwrap().to_owned()
        };
        assert_eq!(name(&list.next().await.unwrap()), "o0000");
        // The store changes under it: deleted, added, relabelled; the watch-list's state stays.
        w.apply(EventType::Deleted, obj(&w, "a", 2, 11)).unwrap().finish().await;
        w.apply(EventType::Added, obj(&w, "a", 1000, 12)).unwrap().finish().await;
        let mut sent = vec!["o0000".to_owned()];
        for _ in 0..499 {
            sent.push(name(&list.next().await.unwrap()));
        }
        assert_eq!(sent, (0..1000).step_by(2).map(|i| format!("o{i:04}")).collect::<Vec<_>>());
        let after: Vec<String> =
            [list.next().await.unwrap(), list.next().await.unwrap()].iter().map(name).collect();
        assert_eq!(after, ["o0002", "o1000"], "then the live events");

        // A state proven the upstream's at 20, ahead of the cache: its selection, in key order.
        let store = super::super::store::filled((0..600).map(|i| obj(&w, "a", i, 20)).collect());
        let snapshot = crate::cache::Snapshot { store, rv: Rv(12), lists: r.lists(), histories: 0 };
        let start = WatchStart::Proven { rv: Rv(20), snapshot };
        let mut listed = r.watch(WatchRequest { filter, start, bookmarks: false, deadline }).unwrap();
        let mut got = Vec::new();
        for _ in 0..300 {
            got.push(name(&listed.next().await.unwrap()));
        }
        assert_eq!(got, (0..600).step_by(2).map(|i| format!("o{i:04}")).collect::<Vec<_>>());
    }

    /// A watch-list's initial objects and a replay's queue are freed once sent, not kept for
    /// the life of the watch (8 bytes per object per watcher: 80 KB for 10 000 objects).
    #[tokio::test]
    async fn sent_initial_events_and_replays_free_their_buffers() {
        let kind = ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true);
        let (mut w, r) = new(kind, CacheOptions::default());
        let objects: Vec<Object> = (0..100).map(|i| named(&w, &format!("o{i}"), 5)).collect();
        w.replace(objects, Rv(10));
        let deadline = Instant::now() + std::time::Duration::from_secs(300);
        let req = |start| WatchRequest { filter: Filter::default(), start, bookmarks: false, deadline };
        let mut list = r.watch(req(WatchStart::InitialEvents)).unwrap();
        assert!(list.initial.is_some());
        for _ in 0..100 {
            assert!(list.next().await.is_some());
        }
        // The next poll finds nothing left and drops the buffer.
        let _ = futures_util::poll!(std::pin::pin!(list.next()));
        assert!(list.initial.is_none(), "the initial objects' buffer is freed");

        for i in 0..50 {
            w.apply(EventType::Modified, named(&w, &format!("o{i}"), 11 + i)).unwrap().finish().await;
        }
        let mut replay = r.watch(req(WatchStart::After(Rv(10)))).unwrap();
        assert!(replay.pending.is_empty() && replay.replay.is_some(), "replayed as it is read");
        for _ in 0..50 {
            assert!(replay.next().await.is_some());
        }
        let _ = futures_util::poll!(std::pin::pin!(replay.next()));
        assert!(replay.pending.capacity() <= PENDING_KEPT, "the drained replay's queue is freed");
    }

    /// The RVs of what a watch sends until it ends (`None`, then `true`), `n` frames came, or
    /// nothing came for 5 s.
    async fn rvs(watch: &mut Watch, n: usize) -> (Vec<u64>, bool) {
        let mut out = Vec::new();
        while out.len() < n {
            let next = tokio::time::timeout(std::time::Duration::from_secs(5), watch.next());
            let Ok(next) = next.await else { return (out, false) };
            match next {
                Some(f) => {
                    let v: serde_json::Value = serde_json::from_slice(&f).unwrap();
                    out.push(v["object"]["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap());
                }
                None => return (out, true),
            }
        }
        (out, false)
    }

    /// A cache listed at 10 with one object, then modified at every RV in `11..=through`.
    async fn modified_through(
        opts: CacheOptions,
        through: u64,
    ) -> (crate::cache::Writer, crate::cache::Reader) {
        let kind = ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true);
        let (mut w, r) = new(kind, opts);
        w.replace(vec![named(&w, "o", 5)], Rv(10));
        for rv in 11..=through {
            w.apply(EventType::Modified, named(&w, "o", rv)).unwrap().finish().await;
        }
        (w, r)
    }

    /// A watch of everything from `rv`.
    fn watch_from(r: &crate::cache::Reader, rv: u64) -> Result<Watch, Error> {
        let deadline = Instant::now() + std::time::Duration::from_secs(300);
        let start = WatchStart::After(Rv(rv));
        r.watch(WatchRequest { filter: Filter::default(), start, bookmarks: false, deadline })
    }

    /// A watch from an old RV whose client does not read holds one replay step, not the
    /// history's frames; read, it gets every event in order, then the live ones.
    #[tokio::test]
    async fn a_replay_is_taken_a_step_at_a_time_as_it_is_read() {
        let (mut w, r) = modified_through(CacheOptions::default(), 1010).await;
        let mut watch = watch_from(&r, 10).unwrap();
        assert!(watch.pending.is_empty(), "nothing queued before it is read");
        assert_eq!(rvs(&mut watch, 1).await.0, [11]);
        assert_eq!(watch.pending.len(), REPLAY_STEP - 1, "one step queued");
        w.apply(EventType::Modified, named(&w, "o", 1011)).unwrap().finish().await;
        let (got, ended) = rvs(&mut watch, 1000).await;
        assert!(!ended);
        assert_eq!(got, (12..=1011).collect::<Vec<_>>());
    }

    /// The history lets go of events the replay has not reached (its count): the watch ends
    /// after what it sent — every event up to there, in order, nothing after a gap — as the
    /// apiserver's watcher does when its buffer moves past it; its client re-watches (410).
    #[tokio::test]
    async fn a_replay_overtaken_by_the_history_ends_after_what_it_sent() {
        let opts = CacheOptions { history_max_events: 300, watcher_queue: 10_000, ..Default::default() };
        let (mut w, r) = modified_through(opts, 310).await;
        let mut watch = watch_from(&r, 10).unwrap();
        assert_eq!(rvs(&mut watch, 10).await.0, (11..=20).collect::<Vec<_>>());
        for rv in 311..=700 {
            w.apply(EventType::Modified, named(&w, "o", rv)).unwrap().finish().await;
        }
        let (got, ended) = rvs(&mut watch, 10_000).await;
        assert!(ended, "the watch ends");
        assert_eq!(
            got,
            (21..(11 + REPLAY_STEP as u64)).collect::<Vec<_>>(),
            "the step it had, nothing after"
        );
        assert!(watch_from(&r, 138).is_err(), "its re-watch is 410");
        let stats = r.watcher_stats();
        assert_eq!((stats.replays_overtaken, stats.live), (1, 0), "counted, its watcher gone");
    }

    /// The upstream's storage went back while a replay was under way: the watch ends (its
    /// watcher ended at the relist) and sends nothing of the new history, though the history's
    /// floor is now below where the replay stood.
    #[tokio::test]
    async fn a_replay_under_way_at_a_rewind_sends_nothing_of_the_new_history() {
        let (mut w, r) = modified_through(CacheOptions::default(), 400).await;
        let mut watch = watch_from(&r, 10).unwrap();
        assert_eq!(rvs(&mut watch, 1).await.0, [11]);
        w.replace(vec![named(&w, "o", 12)], Rv(12));
        for rv in 13..=300 {
            w.apply(EventType::Modified, named(&w, "o", rv)).unwrap().finish().await;
        }
        let (got, ended) = rvs(&mut watch, 10_000).await;
        assert!(ended);
        assert_eq!(got, (12..(11 + REPLAY_STEP as u64)).collect::<Vec<_>>(), "its step, then the end");
        let stats = r.watcher_stats();
        assert_eq!(
            (stats.ended_at_relist, stats.replays_overtaken),
            (1, 0),
            "ended by the relist, counted once"
        );
    }

    /// The cache found wrong mid-replay (`distrust_through`, before the reflector relists): the
    /// replay ends there, counted as ended by the relist, not as overtaken (review finding).
    #[tokio::test]
    async fn a_replay_ended_by_a_distrusted_history_counts_as_ended_by_the_relist() {
        let (w, r) = modified_through(CacheOptions::default(), 400).await;
        let mut watch = watch_from(&r, 10).unwrap();
        assert_eq!(rvs(&mut watch, 1).await.0, [11]);
        w.distrust_through(Rv(400));
        let (got, ended) = rvs(&mut watch, 10_000).await;
        assert!(ended && got.len() < REPLAY_STEP, "its step, then the end: {got:?}");
        let stats = r.watcher_stats();
        assert_eq!((stats.ended_at_relist, stats.replays_overtaken, stats.live), (1, 0, 0));
    }

    /// A watch from the floor of a full history whose next event comes before its client reads
    /// (evicting the oldest): its first step was taken with the request, so it is not ended
    /// with nothing sent (review finding); a relist at the cache's RV while it replays ends it
    /// and counts it (it has not got every event up to there).
    #[tokio::test]
    async fn a_replay_keeps_its_first_step_and_a_relist_ends_it_under_way() {
        let opts = CacheOptions { history_max_events: 300, watcher_queue: 10_000, ..Default::default() };
        let (mut w, r) = modified_through(opts, 310).await;
        let mut from_floor = watch_from(&r, 10).unwrap();
        w.apply(EventType::Modified, named(&w, "o", 311)).unwrap().finish().await;
        let (got, ended) = rvs(&mut from_floor, REPLAY_STEP).await;
        assert!(!ended);
        assert_eq!(got, (11..(11 + REPLAY_STEP as u64)).collect::<Vec<_>>(), "its first step");

        let mut under_way = watch_from(&r, 170).unwrap();
        assert_eq!(rvs(&mut under_way, 1).await.0, [171]);
        let mut done = watch_from(&r, 305).unwrap();
        assert_eq!(rvs(&mut done, 6).await.0, (306..=311).collect::<Vec<_>>());
        let _ = futures_util::poll!(std::pin::pin!(done.next()));
        // A relist at the cache's RV that changes nothing: the watch whose replay is done stays.
        w.replace(vec![named(&w, "o", 311)], Rv(311));
        assert_eq!(r.watcher_stats().ended_at_relist, 2, "the two still replaying");
        let (got, ended) = rvs(&mut under_way, 10_000).await;
        assert!(ended && got.len() < REPLAY_STEP, "its step, then the end: {got:?}");
        w.apply(EventType::Modified, named(&w, "o", 312)).unwrap().finish().await;
        assert_eq!(rvs(&mut done, 1).await.0, [312]);
    }
}
