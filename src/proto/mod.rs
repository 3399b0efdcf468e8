//! Protobuf answers from the cache (issue 17): the apiserver's own encoding of the objects the
//! cache holds in JSON, made by transcoding with the Kubernetes schema (`schema`,
//! `transcode`) and framed as the apiserver frames it (`envelope`).
//!
//! Why transcoding and not a second upstream stream in protobuf: one reflector per resource
//! (one list, one watch, one history, one order of events), and no protobuf bytes held for
//! resources nobody asks for in protobuf. A message is made at the first protobuf read of an
//! object version and shared by every later one (`resource::Object`), a watch frame once per
//! event for all protobuf watchers (`resource::Event`).
//!
//! What the schema cannot prove it encodes exactly (a member of a newer API version, a
//! type the table marks as hand-written and the transcoder does not know) is not served in
//! protobuf: see `Encoding` in `resource`.

pub mod after;
pub mod envelope;
pub mod schema;
pub mod splice;
pub mod transcode;
pub mod window;
pub mod wire;

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use bytes::Bytes;

pub use transcode::{Rope, Unsupported};

/// An object version's message: a rope (made now, or kept), or the previous version's encoding
/// with edits (`splice`), not yet copied together.
pub enum Encoded<'p> {
    Rope(Cow<'p, Rope>),
    Spliced(splice::Spliced<'p>),
}

impl Encoded<'_> {
    pub fn len(&self) -> usize {
        match self {
            Encoded::Rope(r) => r.len(),
            Encoded::Spliced(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Some object of its JSON had a member twice ([`Rope::repeated`]; a splice gives up on those).
    pub fn repeated(&self) -> bool {
        matches!(self, Encoded::Rope(r) if r.repeated())
    }

    /// Its bytes in order, appended to `out`.
    pub fn pieces_into<'s>(&'s self, out: &mut Vec<&'s [u8]>) {
        match self {
            Encoded::Rope(r) => out.extend(r.parts().iter().map(|p| &p[..])),
            Encoded::Spliced(s) => s.pieces_into(out),
        }
    }
}

/// The newest Kubernetes minor version: every field the schema has is written.
pub const NEWEST: u32 = u32::MAX;

/// The newest minor version the schema is taken from (k8s.io/api v0.36): an upstream newer
/// than it may have fields the schema does not know that Go writes even when zero (JSON leaves
/// them out): its protobuf cannot be proven, and is forwarded (`ProtoType::unproven`).
pub const SCHEMA_MINOR: u32 = 36;

/// Whether protobuf answers can be proven for an upstream of `minor` (its `/version`; `None`
/// when it gave none): a minor the schema knows.
pub fn provable(minor: Option<u32>) -> bool {
    minor.is_some_and(|m| m <= SCHEMA_MINOR)
}

/// The minor version in a `/version` answer (`"minor":"28"` or `"28+"`).
pub fn minor_of_version(version: &serde_json::Value) -> Option<u32> {
    let m = version.get("minor")?.as_str()?;
    m.trim_end_matches('+').parse().ok()
}

/// The minor version whose feature-gate defaults the upstream follows: its `emulationMinor`
/// when it has one (an apiserver run with `--emulated-version`) and it is lower, else its
/// `minor`.
pub fn gates_minor_of_version(version: &serde_json::Value) -> Option<u32> {
    let minor = minor_of_version(version)?;
    let emulated = version
        .get("emulationMinor")
        .and_then(|m| m.as_str())
        .and_then(|m| m.trim_end_matches('+').parse().ok());
    Some(emulated.map_or(minor, |e: u32| e.min(minor)))
}

/// `Content-Type` of protobuf objects and lists.
pub const CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";
/// `Content-Type` of protobuf watch streams.
pub const WATCH_CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf;stream=watch";

const META_V1: &str = "k8s.io.apimachinery.pkg.apis.meta.v1";

/// How an object version's protobuf encoding was made, the `how` of
/// `watchcache_protobuf_encodings_total`: from its JSON alone; from the version it replaced, its
/// whole texts read (`after`); walked where the two texts differ (`window`); only its changed
/// scalars encoded (`splice`).
pub const ENCODINGS: [&str; 4] = ["fresh", "from_previous", "walked", "spliced"];

/// An index of [`ENCODINGS`].
#[derive(Clone, Copy)]
enum How {
    Fresh,
    FromPrevious,
    Walked,
    Spliced,
}

/// How the objects of one cached resource are encoded in protobuf: the kind's message (built-in
/// kinds only; a custom resource has metadata-only protobuf), its envelope's TypeMeta, and
/// whether every object so far could be encoded. One per cache, shared by its objects.
#[derive(Debug)]
pub struct ProtoType {
    msg: Option<usize>,
    /// `runtime.TypeMeta` {apiVersion, kind}.
    type_meta: Vec<u8>,
    /// `pods`, `deployments.apps`: for the log line.
    resource: String,
    /// An object could not be encoded (whole, metadata only): those protobuf reads of this
    /// resource go upstream from now on. Apart, so that a kind whose whole objects cannot be
    /// proven (ControllerRevisions) keeps its metadata-only protobuf (the garbage collector's).
    failed: [AtomicBool; 2],
    /// The upstream's Kubernetes minor version ([`NEWEST`] until known): fields its types do
    /// not have yet are not written (`schema::Field::since`). Per cache, not process-wide.
    minor: AtomicU32,
    /// Object versions encoded, by [`ENCODINGS`].
    encodings: [AtomicU64; 4],
}

impl ProtoType {
    /// The protobuf type of a kind; `builtin` kinds get their message if the schema has one.
    pub fn new(group: &str, version: &str, kind: &str, builtin: bool, resource: String) -> ProtoType {
        let msg = if builtin { schema::schema().kind(group, version, kind) } else { None };
        let api_version = if group.is_empty() { version.to_owned() } else { format!("{group}/{version}") };
        ProtoType {
            msg,
            type_meta: envelope::type_meta(&api_version, kind),
            resource,
            failed: Default::default(),
            minor: AtomicU32::new(NEWEST),
            encodings: Default::default(),
        }
    }

    /// Records the upstream's minor version (from its `/version`).
    pub fn set_upstream_minor(&self, minor: u32) {
        self.minor.store(minor, Ordering::Relaxed);
    }

    /// No protobuf read of this resource is served: the upstream's minor version is unknown
    /// or newer than [`SCHEMA_MINOR`] (a review: a `/version` that failed at start meant the
    /// newest schema for good, writing 1.33's zero `observedGeneration`s to a 1.28's clients).
    pub fn unproven(&self) {
        for f in &self.failed {
            f.store(true, Ordering::Relaxed);
        }
    }

    fn minor(&self) -> u32 {
        self.minor.load(Ordering::Relaxed)
    }

    /// Object versions encoded so far, by [`ENCODINGS`].
    pub fn encodings(&self) -> [u64; 4] {
        self.encodings.each_ref().map(|n| n.load(Ordering::Relaxed))
    }

    /// `r`, counted under `how` when it is an encoding.
    fn made<T, E>(&self, how: How, r: Result<T, E>) -> Result<T, E> {
        if r.is_ok() {
            self.encodings[how as usize].fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    /// Whether reads of this resource may be served in protobuf (metadata only, or whole
    /// objects): the kind has a message and no object has failed to encode.
    pub fn serves(&self, metadata: bool) -> bool {
        (metadata || self.msg.is_some()) && !self.failed[usize::from(metadata)].load(Ordering::Relaxed)
    }

    /// The TypeMeta of an enveloped object (the kind's, or PartialObjectMetadata's).
    pub fn type_meta(&self, metadata: bool) -> &[u8] {
        if metadata {
            metadata_type_meta()
        } else {
            &self.type_meta
        }
    }

    /// The message (no envelope) of an object given as the apiserver's JSON; `None` (and
    /// protobuf reads of this resource forwarded from now on) if it cannot be proven exact.
    pub fn encode(&self, json: &[u8]) -> Option<Bytes> {
        let msg = self.msg?;
        self.outcome(false, transcode::object(schema::schema(), msg, json, self.minor()).map(Bytes::from))
    }

    /// The PartialObjectMetadata message of an object's PartialObjectMetadata JSON (what
    /// `metadata_only` makes, byte-equal to the apiserver's).
    pub fn encode_metadata(&self, json: &[u8]) -> Option<Bytes> {
        self.outcome(true, encode_metadata(json, self.minor()))
    }

    /// An object's message as a [`Rope`] sharing its long strings with `stored`: `json` is
    /// `prefix_len` bytes (its `kind`/`apiVersion`) followed by `stored`, the object's bytes as
    /// the cache keeps them. Made once per object version.
    pub fn encode_shared(&self, json: &[u8], stored: &Bytes, prefix_len: usize) -> Option<Rope> {
        let msg = self.msg?;
        let encoded = transcode::object_shared(schema::schema(), msg, json, stored, prefix_len, self.minor());
        self.outcome(false, self.made(How::Fresh, encoded))
    }

    /// [`ProtoType::encode_shared`] of a new version, `now` = (json, stored, prefix_len), from
    /// the encoding of the version it replaced, `before` (the same three) and `prior` (its
    /// message): the unchanged parts are copied (`after`); a fresh encoding if that fails.
    pub fn encode_after(
        &self,
        now: (&[u8], &Bytes, usize),
        before: (&[u8], &Bytes, usize),
        prior: &Rope,
    ) -> Option<Rope> {
        let msg = self.msg?;
        let (s, minor) = (schema::schema(), self.minor());
        let p = after::Prior { json: before.0, stored: before.1, prefix_len: before.2, rope: prior };
        let encoded = self
            .made(How::FromPrevious, after::object_after(s, msg, now.0, now.1, now.2, minor, &p))
            .or_else(|_| self.made(How::Fresh, transcode::object_shared(s, msg, now.0, now.1, now.2, minor)));
        self.outcome(false, encoded)
    }

    /// [`ProtoType::encode_after`] for a built-in object given by its bodies (its JSON after
    /// the opening `{` and its `kind`/`apiVersion`), read only where the two differ (`window`).
    /// `None`: not proven that way (then `encode_after`).
    pub fn encode_edit<'p>(&self, now: &'p Bytes, before: &'p Bytes, prior: &'p Rope) -> Option<Encoded<'p>> {
        let (s, msg, minor) = (schema::schema(), self.msg?, self.minor());
        let spliced = splice::object_splice(s, msg, now, before, minor, prior).map(Encoded::Spliced);
        self.made(How::Spliced, spliced.ok_or(())).ok().or_else(|| {
            let walked =
                window::object_edit(s, msg, now, before, minor, prior).map(|r| Encoded::Rope(Cow::Owned(r)));
            self.made(How::Walked, walked.ok_or(())).ok()
        })
    }

    /// An object's PartialObjectMetadata message, sharing with its PartialObjectMetadata JSON.
    pub fn encode_metadata_shared(&self, json: &Bytes) -> Option<Rope> {
        let s = schema::schema();
        let Some(msg) = s.message(&format!("{META_V1}.PartialObjectMetadata")) else {
            return self.outcome(true, Err(Unsupported("no PartialObjectMetadata in the schema".into())));
        };
        self.outcome(true, transcode::object_shared(s, msg, json, json, 0, self.minor()))
    }

    /// One watch frame of type `event_type` whose object is given as JSON (a BOOKMARK's, a
    /// rewritten DELETED one): the kind's object, or its PartialObjectMetadata when `metadata`.
    pub fn json_event(&self, event_type: &str, json: &[u8], metadata: bool) -> Option<Bytes> {
        let msg = if metadata { self.encode_metadata(json)? } else { self.encode(json)? };
        let head = envelope::head(self.type_meta(metadata), msg.len());
        Some(envelope::watch_event(event_type, &[&head, &msg, envelope::UNKNOWN_TAIL]))
    }

    fn outcome<T>(&self, metadata: bool, r: Result<T, Unsupported>) -> Option<T> {
        match r {
            Ok(b) => Some(b),
            Err(e) => {
                if !self.failed[usize::from(metadata)].swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        resource = %self.resource,
                        metadata_only = metadata,
                        error = %e,
                        "an object the protobuf schema cannot encode exactly: these protobuf reads of this resource go upstream from now on"
                    );
                }
                None
            }
        }
    }
}

/// `meta.k8s.io/v1` PartialObjectMetadata's TypeMeta.
pub fn metadata_type_meta() -> &'static [u8] {
    static TM: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    TM.get_or_init(|| envelope::type_meta("meta.k8s.io/v1", "PartialObjectMetadata"))
}

/// `meta.k8s.io/v1` PartialObjectMetadataList's TypeMeta.
pub fn metadata_list_type_meta() -> &'static [u8] {
    static TM: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    TM.get_or_init(|| envelope::type_meta("meta.k8s.io/v1", "PartialObjectMetadataList"))
}

/// The TypeMeta of a list's envelope: the kind's list, or PartialObjectMetadataList.
pub fn list_type_meta(api_version: &str, list_kind: &str, metadata: bool) -> Vec<u8> {
    if metadata {
        metadata_list_type_meta().to_vec()
    } else {
        envelope::type_meta(api_version, list_kind)
    }
}

fn encode_metadata(json: &[u8], minor: u32) -> Result<Bytes, Unsupported> {
    let s = schema::schema();
    let msg = s
        .message(&format!("{META_V1}.PartialObjectMetadata"))
        .ok_or_else(|| Unsupported("no PartialObjectMetadata in the schema".into()))?;
    transcode::object(s, msg, json, minor).map(Bytes::from)
}

/// A `Status` (the JSON `error::Error` renders) as the apiserver sends it in protobuf: the
/// whole envelope.
pub fn encode_status(json: &[u8]) -> Result<Bytes, Unsupported> {
    let s = schema::schema();
    let msg = s
        .message(&format!("{META_V1}.Status"))
        .ok_or_else(|| Unsupported("no Status in the schema".into()))?;
    // A Status's fields are as old as the API: every version writes them alike.
    let body = transcode::object(s, msg, json, NEWEST)?;
    Ok(envelope::object(&envelope::type_meta("v1", "Status"), &body))
}

/// A watch ERROR frame carrying a `Status` (the JSON `error::Error` renders), in protobuf.
pub fn status_event(json: &[u8]) -> Result<Bytes, Unsupported> {
    let status = encode_status(json)?;
    Ok(envelope::watch_event("ERROR", &[&status]))
}

#[cfg(test)]
mod tests {

    /// Protobuf is served only for an upstream whose minor version the schema knows: unknown
    /// (no `/version`) or newer, every protobuf read of every resource is forwarded.
    #[test]
    fn protobuf_is_proven_only_for_a_known_minor() {
        assert!(provable(Some(28)) && provable(Some(SCHEMA_MINOR)));
        assert!(!provable(None) && !provable(Some(SCHEMA_MINOR + 1)));
        let p = ProtoType::new("", "v1", "Pod", true, "pods".into());
        assert!(p.serves(false) && p.serves(true));
        p.unproven();
        assert!(!p.serves(false) && !p.serves(true));
    }
    use super::*;

    /// Feature gates follow the emulated version when an apiserver has one below its binary's.
    #[test]
    fn gate_defaults_follow_the_emulated_version() {
        let v = |j: &str| serde_json::from_str::<serde_json::Value>(j).unwrap();
        assert_eq!(gates_minor_of_version(&v(r#"{"major":"1","minor":"36"}"#)), Some(36));
        let emulating = v(r#"{"major":"1","minor":"36","emulationMajor":"1","emulationMinor":"35"}"#);
        assert_eq!(gates_minor_of_version(&emulating), Some(35));
        assert_eq!(minor_of_version(&emulating), Some(36), "the encoding is the binary's");
        assert_eq!(gates_minor_of_version(&v(r#"{"minor":"28+","emulationMinor":"x"}"#)), Some(28));
        assert_eq!(gates_minor_of_version(&v(r#"{"major":"1"}"#)), None);
    }
}
