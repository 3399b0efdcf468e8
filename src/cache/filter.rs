//! Which objects a list or watch selects (scope + label + field + shard selectors), and how one
//! cache event looks to one watcher (docs/apiserver-watch-cache.md §3.5: MODIFIED becomes ADDED or DELETED when an
//! object enters or leaves the selection).
//!
//! A filter also carries the representation its reader asked for (`Repr`: the objects as
//! received, or metadata only), so every frame a watcher gets is already in it.
//!
//! Pure. Used by `cache::list`, `cache::watchers` (fan-out) and `cache::watch` (replay).

use std::sync::{Arc, OnceLock};

use bytes::Bytes;

use crate::metadata_only::Repr;
use crate::resource::{frame_object, Event, EventType, Object};
use crate::selector::{FieldSelector, LabelSelector, ShardSelector};

/// What a request selects.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// Only objects in this namespace (`/namespaces/ns/...` or `metadata.namespace=ns`).
    pub namespace: Option<String>,
    /// Only the object with this name (`/watch/.../name` or `metadata.name=x`).
    pub name: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    /// `shardSelector` (KEP-5866): only objects whose hashed uid or namespace is in range.
    pub shard: Option<Arc<ShardSelector>>,
    /// How the selected objects are encoded (not which ones).
    pub repr: Repr,
    /// A page of this list is read as the apiserver reads it from its pods' `spec.nodeName`
    /// index (a Most Recent or NotOlderThan list from its start, `cache::list::render`): it
    /// has a continuation only if a later pod is on the node.
    pub node_index: bool,
}

impl Filter {
    /// Builds a filter, narrowing the scope with exact `metadata.namespace` / `metadata.name`
    /// field selectors the way the apiserver's registry does.
    pub fn new(
        namespace: Option<String>,
        name: Option<String>,
        labels: LabelSelector,
        fields: FieldSelector,
    ) -> Self {
        let namespace = namespace.or_else(|| fields.exact("metadata.namespace").map(str::to_owned));
        let name = name.or_else(|| fields.exact("metadata.name").map(str::to_owned));
        Filter { namespace, name, labels, fields, shard: None, repr: Repr::Full, node_index: false }
    }

    /// The same selection, its pages read as from the apiserver's node index (`node_index`).
    pub fn with_node_index(mut self, on: bool) -> Self {
        self.node_index = on;
        self
    }

    /// The same selection narrowed to a shard.
    pub fn with_shard(mut self, shard: Option<Arc<ShardSelector>>) -> Self {
        self.shard = shard;
        self
    }

    /// The same selection, encoded as `repr`.
    pub fn with_repr(mut self, repr: Repr) -> Self {
        self.repr = repr;
        self
    }

    /// Whether `obj` is selected.
    pub fn matches(&self, obj: &Object) -> bool {
        let h = &obj.header;
        // Before labels and fields, as the apiserver's predicate checks it.
        if self.shard.as_ref().is_some_and(|s| !s.matches(h)) {
            return false;
        }
        if self.namespace.as_deref().is_some_and(|ns| ns != h.namespace()) {
            return false;
        }
        if self.name.as_deref().is_some_and(|n| n != h.name()) {
            return false;
        }
        (self.labels.is_empty() || self.labels.matches(&h.labels()))
            && (self.fields.is_empty() || self.fields.matches(h))
    }

    /// Whether every object is selected (no per-object work needed).
    pub fn is_everything(&self) -> bool {
        self.namespace.is_none()
            && self.name.is_none()
            && self.labels.is_empty()
            && self.fields.is_empty()
            && self.shard.is_none()
    }

    /// Whether a sharded watcher gets nothing of `ev` because the object (now and before) is
    /// outside its shard: an event "filtered out by shard selector" in the apiserver's words.
    pub fn shard_excludes(&self, ev: &Event) -> bool {
        self.shard.as_ref().is_some_and(|s| {
            !s.matches(&ev.object.header) && ev.prev.as_deref().is_none_or(|p| !s.matches(&p.header))
        })
    }

    /// Whether this watcher receives anything for `ev` ([`Filter::frame_for`] is not `None`),
    /// without making a frame.
    pub fn concerns(&self, ev: &Event) -> bool {
        let (cur, prev) = self.sides(ev);
        cur || prev
    }

    /// Whether the object after `ev` (none for a DELETED) and the one before it (none when the
    /// cache did not hold it) match.
    fn sides(&self, ev: &Event) -> (bool, bool) {
        let every = self.is_everything();
        let cur = ev.kind != EventType::Deleted && (every || self.matches(&ev.object));
        let prev = ev.prev.as_deref().is_some_and(|p| every || self.matches(p));
        (cur, prev)
    }

    /// The frame this watcher receives for `ev`, `None` if the event does not concern it, or
    /// [`NoExactEncoding`] if it is asked for in protobuf and has no exact encoding.
    ///
    /// The type is 1.36's `cacheWatcher.convertToWatchEvent`'s, from the two sides alone: ADDED
    /// when only the new object matches, MODIFIED when both do, DELETED (of the previous
    /// object, at the event's RV) when only the previous one does — for every watcher, the
    /// unfiltered too. So an upstream ADDED of an object the cache held is a MODIFIED, a
    /// MODIFIED of one it did not hold an ADDED, and a DELETED of one it did not hold nothing
    /// (each only when the cache missed something). Where the type is the upstream's, its frame
    /// is sent as received.
    pub fn frame_for(&self, ev: &Event, lazy: &LazyFrames) -> Result<Option<Bytes>, NoExactEncoding> {
        let repr = self.repr;
        let framed = |f: Option<Bytes>| f.map(Some).ok_or(NoExactEncoding);
        match (self.sides(ev), ev.kind) {
            ((true, true), EventType::Modified)
            | ((true, false), EventType::Added)
            | ((false, true), EventType::Deleted) => framed(ev.frame_as(repr)),
            ((true, true), _) => framed(lazy.modified(ev, repr)),
            ((true, false), _) => framed(lazy.added(ev, repr)),
            ((false, true), _) => framed(lazy.deleted(ev, repr)),
            ((false, false), _) => Ok(None),
        }
    }
}

/// An event a protobuf watcher asked for has no exact protobuf encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoExactEncoding;

/// Transition frames of one event, framed once (per representation) for all the watchers
/// that need them.
#[derive(Debug, Default)]
pub struct LazyFrames {
    added: [OnceLock<Option<Bytes>>; 8],
    modified: [OnceLock<Option<Bytes>>; 8],
    deleted: [OnceLock<Option<Bytes>>; 8],
}

impl LazyFrames {
    fn added(&self, ev: &Event, repr: Repr) -> Option<Bytes> {
        self.added[repr.index()].get_or_init(|| frame_object(EventType::Added, &ev.object, repr)).clone()
    }

    fn modified(&self, ev: &Event, repr: Repr) -> Option<Bytes> {
        self.modified[repr.index()]
            .get_or_init(|| frame_object(EventType::Modified, &ev.object, repr))
            .clone()
    }

    /// DELETED carrying the previous object with `metadata.resourceVersion` = the event's RV.
    fn deleted(&self, ev: &Event, repr: Repr) -> Option<Bytes> {
        self.deleted[repr.index()]
            .get_or_init(|| {
                // A lean watcher's frame from the lean copy the previous state already keeps
                // (a copy of the full state would be cut again at every event).
                let prev = ev.prev.as_deref().unwrap_or(&ev.object).view(repr);
                frame_object(EventType::Deleted, &prev.with_rv(ev.rv), repr.keeping_managed_fields())
            })
            .clone()
    }
}

/// An event as the fan-out hands it around: the shared event plus its lazy variants.
#[derive(Debug)]
pub struct Dispatched {
    pub event: Arc<Event>,
    pub lazy: LazyFrames,
    /// When the event arrived, in nanoseconds after the cache was made (at least 1): the
    /// stamp of the deliveries the lag sampler picks (`cache::lag`).
    pub arrived_ns: u64,
}
