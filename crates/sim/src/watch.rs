//! WATCH streams (docs/apiserver-watch-cache.md §1.7, §3): initial events for watch-lists (1.36 defaulting turns
//! RV ""/0 watches into watch-lists), replay of the log from RV N, live events, selector
//! transitions (ADDED/DELETED when an object enters or leaves the selection), bookmarks, and
//! the in-stream ERROR events (410 too old, 504 too large).
//!
//! Called by `http`. Each watch is a task that reads the store's log until it has caught up,
//! then takes the entries the store sends it (its resource's, or a kubelet's node's pods':
//! `store::Slot`), and writes framed events into a channel the response body drains; it ends at the deadline, when the client goes away,
//! when it fell so far behind that its revisions were compacted (closed without an event, like
//! a cacher watcher whose interval was invalidated), or when its resource is withdrawn (its
//! CustomResourceDefinition deleted: closed without an event, like a stopped cacher).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;

use kube_watchcache::selector::Texts;

use super::encode;
use super::query::{rv_of, watch_query, Query};
use super::read::{is_cached, no_protobuf, Filter};
use super::respond::{channel_body, json, protobuf, Accept, Body};
use super::route::Target;
use super::store::{meta_mut, Entry, Slot};
use super::Sim;
use kube_watchcache::error::Error;
use kube_watchcache::metadata_only::{self, Repr};
use kube_watchcache::params::WatchTimeout;
use kube_watchcache::resource::{frame_event, frame_object, EventType, Object, ResourceKind, Rv, Typing};

/// Starts a watch; request errors (422, 400, 500 for a bad RV) are HTTP errors, later ones are
/// ERROR events.
pub async fn handle(sim: Sim, t: Target, q: Query, accept: Accept) -> Result<http::Response<Body>, Error> {
    // A watch asked as a list (`as=PartialObjectMetadataList`): the apiserver accepts it (200,
    // its stream's content type) and sends nothing: no event can become a list, so the stream
    // ends at the first one (or the timeout) without a byte (recorded: v1.28.7-raw/protobuf.json,
    // negotiation 35, 36, 74, 75).
    if matches!(accept, Accept::MetadataList | Accept::ProtoMetadataList) {
        let proto = accept == Accept::ProtoMetadataList;
        let events = spawn(sim, t, q, if proto { Accept::Protobuf } else { Accept::Json })?;
        let (tx, rx) = mpsc::channel(1);
        tokio::spawn(async move {
            let mut events = events;
            // Until the first event, or the client goes (the watch then ends too).
            tokio::select! {
                _ = events.recv() => {}
                _ = tx.closed() => {}
            }
        });
        let mut resp = if proto {
            protobuf(StatusCode::OK, channel_body(rx), true)
        } else {
            json(StatusCode::OK, channel_body(rx))
        };
        resp.headers_mut()
            .insert(http::header::CACHE_CONTROL, http::HeaderValue::from_static("no-cache, private"));
        return Ok(resp);
    }
    let rx = spawn(sim, t, q, accept)?;
    let mut resp = if matches!(accept, Accept::Protobuf | Accept::ProtoMetadata) {
        protobuf(StatusCode::OK, channel_body(rx), true)
    } else {
        json(StatusCode::OK, channel_body(rx))
    };
    resp.headers_mut()
        .insert(http::header::CACHE_CONTROL, http::HeaderValue::from_static("no-cache, private"));
    Ok(resp)
}

/// Validates a watch request and starts its task; the receiver yields one framed event per
/// item and ends with the watch. With `Accept::Metadata` (`as=PartialObjectMetadata`, what
/// metadata informers send) every object is its PartialObjectMetadata, as the apiserver's
/// watch transforms each event (recorded: `v1.28.7-raw/metadata-only.json`'s watch).
pub fn spawn(sim: Sim, t: Target, q: Query, accept: Accept) -> Result<mpsc::Receiver<Bytes>, Error> {
    let kind = sim.store().kinds.kind(t.res).clone();
    if accept != Accept::Table {
        accept.check_form(false, &kind)?;
    }
    let metadata = matches!(accept, Accept::Metadata | Accept::ProtoMetadata);
    let proto = matches!(accept, Accept::Protobuf | Accept::ProtoMetadata);
    let typing = sim.store().typing(t.res).clone();
    // The legacy `/watch/` path is a watch whatever the `watch` parameter says.
    let q = watch_query(q);
    q.check_selector_syntax(Texts::Qualified)?;
    q.validate()?;
    let filter = Filter::new(&kind, &t, &q)?;
    let rv = rv_of(q.rv_for_get_or_watch()?);
    let timeout = match q.watch_timeout() {
        WatchTimeout::After(d) => d,
        // Go's timer fires at once (200, no event).
        WatchTimeout::Now => Duration::ZERO,
        // --min-request-timeout (1800 s) × uniform[1, 2).
        WatchTimeout::Default => Duration::from_secs(1800 + fastrand::u64(0..1800)),
    };
    let (tx, rx) = mpsc::channel(256);
    // Now, before the response: a withdrawal after this ends the watch, and a watch from "now"
    // starts here (a write the client makes once it has the response's headers is after it).
    let withdrawals = sim.withdrawals(t.res);
    let requested_at = sim.store().current_rv();
    let w = Watch {
        sim,
        withdrawals,
        requested_at,
        res: t.res,
        kind,
        filter,
        q,
        rv,
        deadline: Instant::now() + timeout,
        tx,
        metadata,
        proto,
        typing,
    };
    tokio::spawn(w.run());
    Ok(rx)
}

struct Watch {
    sim: Sim,
    /// The resource's withdrawal count when the watch started (`Sim::withdrawals`).
    withdrawals: u64,
    /// The store's revision when the request came, before the response was sent.
    requested_at: Rv,
    res: usize,
    kind: ResourceKind,
    filter: Filter,
    q: Query,
    rv: Rv,
    deadline: Instant,
    tx: mpsc::Sender<Bytes>,
    /// Objects as PartialObjectMetadata.
    metadata: bool,
    /// Frames in protobuf (`…;stream=watch`).
    proto: bool,
    typing: Typing,
}

/// The client went away.
struct Gone;

impl Watch {
    async fn run(self) {
        let _ = self.stream().await;
    }

    async fn send(&self, b: Bytes) -> Result<(), Gone> {
        self.tx.send(b).await.map_err(|_| Gone)
    }

    /// An object's chunks in this watch's representation.
    fn chunks(&self, o: &Object) -> Vec<Bytes> {
        if self.metadata {
            vec![o.metadata_bytes()]
        } else {
            o.typed_chunks().to_vec()
        }
    }

    /// A BOOKMARK's object in this watch's representation.
    fn bookmark(&self, rv: Rv, end: bool) -> Bytes {
        if self.metadata {
            metadata_only::bookmark(&rv.to_string(), end)
        } else {
            encode::bookmark(&self.kind, rv, end)
        }
    }

    async fn error(&self, e: Error) -> Result<(), Gone> {
        let status = e.to_status().body;
        self.send(self.status_frame(status)).await
    }

    fn repr(&self) -> Repr {
        let shape = if self.metadata { Repr::Metadata } else { Repr::Full };
        shape.with_proto(self.proto)
    }

    /// An event of a stored object in this watch's representation.
    fn object_frame(&self, t: EventType, o: &Object) -> Bytes {
        if !self.proto {
            return frame_event(t, &self.chunks(o));
        }
        frame_object(t, o, self.repr()).unwrap_or_else(|| self.unencodable())
    }

    /// An event of an object given as JSON (a BOOKMARK's, a DELETED one rewritten) in this
    /// watch's representation: whole typed object or PartialObjectMetadata, as `self.metadata`.
    fn json_frame(&self, t: EventType, json: Bytes) -> Bytes {
        if !self.proto {
            return frame_event(t, &[json]);
        }
        self.typing.proto.json_event(t.as_str(), &json, self.metadata).unwrap_or_else(|| self.unencodable())
    }

    /// An ERROR event carrying `status`, in this watch's encoding.
    fn status_frame(&self, status: Bytes) -> Bytes {
        match self.proto.then(|| kube_watchcache::proto::status_event(&status)) {
            Some(Ok(frame)) => frame,
            _ => frame_event(EventType::Error, &[status]),
        }
    }

    /// An ERROR event for an object the schema cannot encode (the apiserver always can).
    fn unencodable(&self) -> Bytes {
        self.status_frame(no_protobuf().to_status().body)
    }

    async fn stream(&self) -> Result<(), Gone> {
        let store = self.sim.store();
        // The etcd watch of uncached kinds (events) sends no periodic bookmarks.
        let bookmarks = self.q.allow_watch_bookmarks;
        let periodic = bookmarks && is_cached(&self.kind);
        // `pos`: every revision ≤ pos has been looked at. `sent`: last RV the client has seen.
        let mut pos;
        if self.q.send_initial_events == Some(true) {
            if self.rv.0 > 0 && self.rv > store.current_rv() {
                if let Err(e) = store.wait_for(self.rv).await {
                    return self.error(e).await;
                }
            }
            let (cur, objects) = store.snapshot(self.res);
            for o in self.filter.scan(&objects, None) {
                if self.filter.matches(&o.header) {
                    self.send(self.object_frame(EventType::Added, o)).await?;
                }
            }
            pos = cur;
            if bookmarks {
                self.send(self.json_frame(EventType::Bookmark, self.bookmark(cur, true))).await?;
            }
        } else if self.q.send_initial_events == Some(false)
            && matches!(self.q.resource_version.as_str(), "" | "0")
        {
            pos = self.requested_at;
        } else {
            // A resource served again after a withdrawal (its CRD re-created) has a new watch
            // cache, listed at that revision: nothing older can be replayed. So has every cached
            // kind after a restart.
            let mut compacted = store.compacted().max(self.sim.served_again_at(self.res));
            if is_cached(&self.kind) {
                compacted = compacted.max(self.sim.restarted_at());
            }
            if self.rv < compacted {
                // Uncached kinds are etcd watches: etcd's wording
                // (compaction-watch-uncached-too-old.json).
                let e = if is_cached(&self.kind) {
                    Error::TooOldResourceVersion { requested: self.rv, oldest: compacted }
                } else {
                    Error::Expired("The resourceVersion for the provided watch is too old.".into())
                };
                return self.error(e).await;
            }
            pos = self.rv;
        }
        let mut sent = pos;
        let interval = self.sim.opts().bookmark_interval.max(Duration::from_millis(10));
        let mut next_bookmark = if periodic { next(Instant::now(), interval, self.deadline) } else { None };
        // The log from `pos` (every resource's entries: `pos` is a revision), until the watch
        // has caught up and follows it.
        let slot = self.slot();
        let mut queue = loop {
            let Ok((entries, follow)) = store.since_or_follow(pos, 1000, &slot) else {
                // Fell behind the compaction point: close, the client re-watches and gets 410.
                return Ok(());
            };
            for e in entries {
                pos = e.event.rv;
                self.deliver(&e, &mut sent).await?;
            }
            if let Some(queue) = follow {
                break queue;
            }
        };
        loop {
            if self.sim.withdrawals(self.res) != self.withdrawals {
                // Its storage torn down: the stream ends without an event. (Checked when the
                // watch wakes; one blocked on a slow client ends when it next wakes.)
                return Ok(());
            }
            let bookmark_at = next_bookmark.unwrap_or(self.deadline);
            tokio::select! {
                e = queue.recv() => match e {
                    // Not after its position (a watch from a revision not reached yet).
                    Some(e) if e.event.rv <= pos => {}
                    // An entry compacted before this watch took it: it fell behind, as above.
                    Some(e) if store.is_compacted(e.event.rv) => return Ok(()),
                    Some(e) => {
                        pos = e.event.rv;
                        self.deliver(&e, &mut sent).await?;
                    }
                    // Let go: its queue overflowed, or its resource was withdrawn.
                    None => return Ok(()),
                },
                _ = tokio::time::sleep_until(self.deadline) => return Ok(()),
                _ = tokio::time::sleep_until(bookmark_at), if next_bookmark.is_some() => {
                    // Every entry up to the current revision that concerns this watch is in its
                    // queue (sent under the lock that took the revision): those first, then the
                    // bookmark at that revision.
                    let now = store.current_rv();
                    while let Ok(e) = queue.try_recv() {
                        if e.event.rv <= pos {
                            continue;
                        }
                        if store.is_compacted(e.event.rv) {
                            return Ok(());
                        }
                        pos = e.event.rv;
                        self.deliver(&e, &mut sent).await?;
                        if pos >= now {
                            break;
                        }
                    }
                    pos = pos.max(now);
                    // Never backwards, never repeated (1.36).
                    if pos > sent {
                        self.send(self.json_frame(EventType::Bookmark, self.bookmark(pos, false))).await?;
                        sent = pos;
                    }
                    next_bookmark = next(Instant::now(), interval, self.deadline);
                }
                _ = self.tx.closed() => return Err(Gone),
            }
        }
    }

    /// Which new log entries this watch is sent once it follows the log: a pod watch with an
    /// exact, non-empty `spec.nodeName` requirement (a kubelet's) only its node's pods' events,
    /// any other every event of its resource (its filter decides).
    fn slot(&self) -> Slot {
        let node =
            self.filter.field.as_ref().and_then(|f| f.exact("spec.nodeName")).filter(|n| !n.is_empty());
        match node {
            Some(n) => Slot::Node(self.res, n.to_owned()),
            None => Slot::All(self.res),
        }
    }

    /// Sends what this watch sees of log entry `e` (at `e`'s revision), if anything; `sent`
    /// becomes its revision when something was sent.
    async fn deliver(&self, e: &Arc<Entry>, sent: &mut Rv) -> Result<(), Gone> {
        if e.res != self.res {
            return Ok(());
        }
        if let Some(frame) = self.frame(e) {
            // Test-only fault: the event is lost on its way (a bug upstream or in between), the
            // stream goes on as if it had been sent.
            if self.sim.take_dropped_watch_event() {
                return Ok(());
            }
            self.send(frame).await?;
            *sent = e.event.rv;
        }
        Ok(())
    }

    /// The event this watcher sees for a log entry (docs/apiserver-watch-cache.md §3.5), if any.
    fn frame(&self, e: &Arc<Entry>) -> Option<Bytes> {
        let ev = &e.event;
        let cur = ev.kind != EventType::Deleted && self.filter.matches(&ev.object.header);
        let prev = ev.prev.as_ref().is_some_and(|p| self.filter.matches(&p.header));
        // The event as stored, in this watch's representation.
        let as_is = || {
            if self.proto {
                ev.frame_as(self.repr()).unwrap_or_else(|| self.unencodable())
            } else if self.metadata {
                frame_event(ev.kind, &self.chunks(&ev.object))
            } else {
                ev.frame.clone()
            }
        };
        match (cur, prev) {
            (true, true) => Some(as_is()),
            (true, false) => {
                if ev.kind == EventType::Added {
                    Some(as_is())
                } else {
                    Some(self.object_frame(EventType::Added, &ev.object))
                }
            }
            (false, true) if ev.kind == EventType::Deleted => Some(as_is()),
            (false, true) => {
                // Left the selection: the previous state, at this event's revision.
                let p = ev.prev.as_ref()?;
                let mut v: serde_json::Map<String, Value> = serde_json::from_slice(&p.typed_bytes()).ok()?;
                meta_mut(&mut v).insert("resourceVersion".into(), Value::String(ev.rv.to_string()));
                let full = Bytes::from(encode::object(&self.kind, &v));
                let object = if self.metadata {
                    metadata_only::object(full.get(1..).unwrap_or_default())
                } else {
                    full
                };
                Some(self.json_frame(EventType::Deleted, object))
            }
            (false, false) => None,
        }
    }
}

/// Next bookmark time: `min(now + interval, deadline − 2 s)`, none once that is not ahead.
fn next(now: Instant, interval: Duration, deadline: Instant) -> Option<Instant> {
    let before_deadline = deadline.checked_sub(Duration::from_secs(2))?;
    let t = (now + interval).min(before_deadline);
    (t > now).then_some(t)
}
