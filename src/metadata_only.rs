//! The metadata-only representation (`as=PartialObjectMetadata[List];g=meta.k8s.io;v=v1`,
//! issue 17): how the apiserver encodes an object, a list and a BOOKMARK as
//! `meta.k8s.io/v1` PartialObjectMetadata in JSON, built from the bytes the cache holds.
//!
//! The apiserver's `asPartialObjectMetadata` copies the object's `ObjectMeta` and encodes it
//! with the same Go struct, so for a built-in kind the `metadata` member of the object as
//! received is, byte for byte, the `metadata` of its PartialObjectMetadata
//! (`tests/recordings/v1.28.7-raw/metadata-only.json` shows it for every built-in kind of a
//! 1.28 cluster). Custom resources are unstructured (their metadata keys come sorted), so the
//! cache forwards their metadata-only requests.
//!
//! Pure byte work, no dependency on the rest of the crate: `resource` (per object version, once)
//! and `cache` (lists, bookmarks) call it; `server::classify` chooses the representation.

use bytes::{BufMut, Bytes, BytesMut};
use serde::Deserialize;
use serde_json::value::RawValue;

/// How a cached read encodes its objects for the client: the shape (the objects, or their
/// PartialObjectMetadata), the encoding (JSON, protobuf) and whether `metadata.managedFields`
/// is left out (`Accept: …;drop=metadata.managedFields`, KEP-5958, `managed_fields`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Repr {
    /// The objects as received (the resource's own kind), in JSON.
    #[default]
    Full,
    /// `meta.k8s.io/v1` PartialObjectMetadata in JSON.
    Metadata,
    /// The objects in protobuf (built-in kinds), as the apiserver encodes them (`proto`).
    FullProto,
    /// PartialObjectMetadata in protobuf.
    MetadataProto,
    /// `Full` without `metadata.managedFields`.
    FullLean,
    /// `Metadata` without `metadata.managedFields`.
    MetadataLean,
    /// `FullProto` without `metadata.managedFields`.
    FullProtoLean,
    /// `MetadataProto` without `metadata.managedFields`.
    MetadataProtoLean,
}

impl Repr {
    /// Every representation, in `index` order.
    pub const ALL: [Repr; 8] = [
        Repr::Full,
        Repr::Metadata,
        Repr::FullProto,
        Repr::MetadataProto,
        Repr::FullLean,
        Repr::MetadataLean,
        Repr::FullProtoLean,
        Repr::MetadataProtoLean,
    ];

    /// Index for per-representation arrays (`ALL`'s order; the first four keep managedFields).
    pub fn index(self) -> usize {
        match self {
            Repr::Full => 0,
            Repr::Metadata => 1,
            Repr::FullProto => 2,
            Repr::MetadataProto => 3,
            Repr::FullLean => 4,
            Repr::MetadataLean => 5,
            Repr::FullProtoLean => 6,
            Repr::MetadataProtoLean => 7,
        }
    }

    /// For logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Repr::Full => "full",
            Repr::Metadata => "metadata",
            Repr::FullProto => "full_protobuf",
            Repr::MetadataProto => "metadata_protobuf",
            Repr::FullLean => "full_lean",
            Repr::MetadataLean => "metadata_lean",
            Repr::FullProtoLean => "full_protobuf_lean",
            Repr::MetadataProtoLean => "metadata_protobuf_lean",
        }
    }

    /// Protobuf rather than JSON.
    pub fn is_proto(self) -> bool {
        matches!(self, Repr::FullProto | Repr::MetadataProto | Repr::FullProtoLean | Repr::MetadataProtoLean)
    }

    /// PartialObjectMetadata rather than the object.
    pub fn is_metadata(self) -> bool {
        matches!(self, Repr::Metadata | Repr::MetadataProto | Repr::MetadataLean | Repr::MetadataProtoLean)
    }

    /// Without `metadata.managedFields` (`drop=metadata.managedFields`).
    pub fn is_lean(self) -> bool {
        self.index() >= 4
    }

    /// The same representation with managedFields kept.
    pub fn keeping_managed_fields(self) -> Repr {
        Repr::ALL[self.index() % 4]
    }

    /// The same representation, with managedFields left out if `lean`.
    pub fn lean(self, lean: bool) -> Repr {
        Repr::ALL[self.index() % 4 + if lean { 4 } else { 0 }]
    }

    /// The same shape in the other encoding.
    pub fn with_proto(self, proto: bool) -> Repr {
        let base = match (self.is_metadata(), proto) {
            (false, false) => Repr::Full,
            (true, false) => Repr::Metadata,
            (false, true) => Repr::FullProto,
            (true, true) => Repr::MetadataProto,
        };
        base.lean(self.is_lean())
    }
}

const OBJECT_HEAD: &[u8] = br#"{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":"#;

/// `{"kind":"PartialObjectMetadataList","apiVersion":"meta.k8s.io/v1","metadata":`: the list
/// envelope before its ListMeta.
pub const LIST_HEAD: &str =
    r#"{"kind":"PartialObjectMetadataList","apiVersion":"meta.k8s.io/v1","metadata":"#;

/// The end of an empty PartialObjectMetadataList after its ListMeta: the apiserver's
/// `asPartialObjectMetadataList` leaves `Items` nil, which Go encodes as `null` (recorded).
pub const EMPTY_ITEMS: &str = ",\"items\":null}\n";

#[derive(Deserialize)]
struct WithMetadata<'a> {
    #[serde(borrow)]
    metadata: Option<&'a RawValue>,
}

/// The PartialObjectMetadata of an object given as the members after its opening `{` (and
/// after `kind`/`apiVersion`): `{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1",
/// "metadata":<its metadata as received>}`. `members` is what `resource::Object` keeps of a
/// built-in object; it was parsed once already, so it is valid JSON.
pub fn object(members: &[u8]) -> Bytes {
    let raw = leading_metadata(members).or_else(|| {
        let mut whole = Vec::with_capacity(members.len() + 1);
        whole.push(b'{');
        whole.extend_from_slice(members);
        serde_json::from_slice::<WithMetadata>(&whole).ok()?.metadata.map(|m| m.get().as_bytes().to_vec())
    });
    let meta = raw.as_deref().unwrap_or(b"{}");
    let mut out = BytesMut::with_capacity(OBJECT_HEAD.len() + meta.len() + 1);
    out.put_slice(OBJECT_HEAD);
    out.put_slice(meta);
    out.put_u8(b'}');
    out.freeze()
}

/// The PartialObjectMetadata of a custom resource, given as the members after its opening `{`.
/// The apiserver serves a custom resource as unstructured JSON, whose maps are encoded with
/// their keys sorted, but its PartialObjectMetadata is the typed `ObjectMeta`: the same values,
/// in `ObjectMeta`'s field order (and `OwnerReference`'s, `ManagedFieldsEntry`'s), empty ones
/// omitted as its `omitempty` tags say (recorded: `v1.28.7-raw/cr-metadata.json`). Each value
/// is kept as received (its escapes are the apiserver's); only members are reordered.
pub fn custom_object(members: &[u8]) -> Bytes {
    let mut whole = Vec::with_capacity(members.len() + 1);
    whole.push(b'{');
    whole.extend_from_slice(members);
    let meta = serde_json::from_slice::<WithMetadata>(&whole)
        .ok()
        .and_then(|w| w.metadata)
        .and_then(|m| typed_members(m.get().as_bytes(), OBJECT_META))
        .unwrap_or_else(|| b"{}".to_vec());
    let mut out = BytesMut::with_capacity(OBJECT_HEAD.len() + meta.len() + 1);
    out.put_slice(OBJECT_HEAD);
    out.put_slice(&meta);
    out.put_u8(b'}');
    out.freeze()
}

/// How a typed Go struct encodes one field: its JSON name, and whether an empty value is
/// left out (`omitempty` on a string, number, map or slice), or a list whose elements are
/// structs of their own.
enum Field {
    Plain(&'static str),
    /// `omitempty`: left out when `""`, `0`, `false`, `{}`, `[]` or `null`.
    OmitEmpty(&'static str),
    /// A slice of structs (omitempty), each element re-ordered too.
    Structs(&'static str, &'static [Field]),
}

/// `k8s.io/apimachinery/pkg/apis/meta/v1.ObjectMeta`, in field order.
const OBJECT_META: &[Field] = &[
    Field::OmitEmpty("name"),
    Field::OmitEmpty("generateName"),
    Field::OmitEmpty("namespace"),
    Field::OmitEmpty("selfLink"),
    Field::OmitEmpty("uid"),
    Field::OmitEmpty("resourceVersion"),
    Field::OmitEmpty("generation"),
    // A struct (`metav1.Time`): never omitted by omitempty.
    Field::Plain("creationTimestamp"),
    Field::Plain("deletionTimestamp"),
    Field::Plain("deletionGracePeriodSeconds"),
    Field::OmitEmpty("labels"),
    Field::OmitEmpty("annotations"),
    Field::Structs("ownerReferences", OWNER_REFERENCE),
    Field::OmitEmpty("finalizers"),
    Field::Structs("managedFields", MANAGED_FIELDS_ENTRY),
];

const OWNER_REFERENCE: &[Field] = &[
    Field::Plain("apiVersion"),
    Field::Plain("kind"),
    Field::Plain("name"),
    Field::Plain("uid"),
    // Pointers: kept even when false.
    Field::Plain("controller"),
    Field::Plain("blockOwnerDeletion"),
];

const MANAGED_FIELDS_ENTRY: &[Field] = &[
    Field::OmitEmpty("manager"),
    Field::OmitEmpty("operation"),
    Field::OmitEmpty("apiVersion"),
    Field::Plain("time"),
    Field::OmitEmpty("fieldsType"),
    Field::Plain("fieldsV1"),
    Field::OmitEmpty("subresource"),
];

fn is_empty(raw: &str) -> bool {
    matches!(raw.trim(), "\"\"" | "0" | "false" | "{}" | "[]" | "null")
}

/// A JSON object's members in `fields`' order (unknown members dropped); `None` if `raw` is
/// not an object.
fn typed_members(raw: &[u8], fields: &[Field]) -> Option<Vec<u8>> {
    let map: std::collections::HashMap<&str, &RawValue> = serde_json::from_slice(raw).ok()?;
    let mut out = Vec::with_capacity(raw.len());
    out.push(b'{');
    let mut first = true;
    let mut put = |out: &mut Vec<u8>, name: &str, value: &[u8]| {
        if !std::mem::take(&mut first) {
            out.push(b',');
        }
        out.push(b'"');
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b"\":");
        out.extend_from_slice(value);
    };
    for f in fields {
        match f {
            Field::Plain(name) => {
                if let Some(v) = map.get(name) {
                    put(&mut out, name, v.get().as_bytes());
                }
            }
            Field::OmitEmpty(name) => {
                if let Some(v) = map.get(name).filter(|v| !is_empty(v.get())) {
                    put(&mut out, name, v.get().as_bytes());
                }
            }
            Field::Structs(name, inner) => {
                let Some(v) = map.get(name).filter(|v| !is_empty(v.get())) else { continue };
                let items: Vec<&RawValue> = serde_json::from_str(v.get()).ok()?;
                let mut list = vec![b'['];
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        list.push(b',');
                    }
                    list.extend_from_slice(&typed_members(item.get().as_bytes(), inner)?);
                }
                list.push(b']');
                put(&mut out, name, &list);
            }
        }
    }
    out.push(b'}');
    Some(out)
}

/// The annotation apps/v1's conversion adds to a DaemonSet from its internal
/// `spec.templateGeneration`: the apiserver makes PartialObjectMetadata before that conversion,
/// so its metadata-only answers (JSON and protobuf, recorded from 1.28.7) do not have it.
pub const DAEMONSET_CONVERSION_ANNOTATION: &str = "deprecated.daemonset.template.generation";

/// The annotation apps/v1's (and v1beta2's) conversion moves into an internal Deployment's
/// `spec.rollbackTo` when it is set, deleting it: the apiserver makes PartialObjectMetadata from
/// the internal object, so its metadata-only answers do not have it (a review; the whole object,
/// converted back, has it again).
pub const DEPLOYMENT_ROLLBACK_ANNOTATION: &str = "deprecated.deployment.rollback.to";

/// [`without_annotation`] when the annotation's value is not empty (Go's conversion leaves an
/// empty one).
pub fn without_set_annotation(pom: Bytes, key: &str) -> Bytes {
    let empty = format!("\"{key}\":\"\"");
    let annotations = find(&pom, b"\"annotations\":{");
    match annotations {
        Some(from) if find(&pom[from..], empty.as_bytes()).is_none() => without_annotation(pom, key),
        _ => pom,
    }
}

/// A PartialObjectMetadata (as [`object`] makes it) without the annotation `key` (and without
/// `annotations` if it was the only one). Apiserver output only: the member is
/// `"key":"value"` with a value without escapes. Looked for from `"annotations":{` on (no
/// string can hold that text unescaped): the labels come first, and a label of the same key
/// was taken out instead, the annotation left (found by a review).
pub fn without_annotation(pom: Bytes, key: &str) -> Bytes {
    let s = &pom[..];
    let needle = format!("\"{key}\":\"");
    let Some(from) = find(s, b"\"annotations\":{") else { return pom };
    let Some(start) = find(&s[from..], needle.as_bytes()).map(|at| from + at) else { return pom };
    let Some(len) = s[start + needle.len()..].iter().position(|&b| b == b'"' || b == b'\\') else {
        return pom;
    };
    if s[start + needle.len() + len] != b'"' {
        return pom;
    }
    let mut end = start + needle.len() + len + 1;
    let mut start = start;
    if s.get(end) == Some(&b',') {
        end += 1;
    } else if start > 0 && s[start - 1] == b',' {
        start -= 1;
    }
    let mut out = Vec::with_capacity(s.len());
    out.extend_from_slice(&s[..start]);
    out.extend_from_slice(&s[end..]);
    // The only annotation: Go omits the empty map.
    for empty in [&b",\"annotations\":{}"[..], &b"\"annotations\":{},"[..], &b"\"annotations\":{}"[..]] {
        if let Some(i) = find(&out, empty) {
            out.drain(i..i + empty.len());
            break;
        }
    }
    Bytes::from(out)
}

fn find(h: &[u8], n: &[u8]) -> Option<usize> {
    h.windows(n.len()).position(|w| w == n)
}

/// Fast path: apiserver output has `metadata` first after `kind`/`apiVersion`.
fn leading_metadata(members: &[u8]) -> Option<Vec<u8>> {
    let rest = members.strip_prefix(br#""metadata":"#)?;
    let mut de = serde_json::Deserializer::from_slice(rest);
    let raw = <&RawValue>::deserialize(&mut de).ok()?;
    Some(raw.get().as_bytes().to_vec())
}

/// A BOOKMARK's object: only `metadata.resourceVersion` (and the `k8s.io/initial-events-end`
/// annotation at the end of a watch-list's initial events), like the apiserver's transform of
/// the empty object it sends; `creationTimestamp` is omitted as 1.34+ omits a zero time
/// (1.28 sends `"creationTimestamp":null`, the recordings' one known difference).
pub fn bookmark(rv: &str, end_of_initial: bool) -> Bytes {
    let annotations =
        if end_of_initial { r#","annotations":{"k8s.io/initial-events-end":"true"}"# } else { "" };
    let mut out = BytesMut::new();
    out.put_slice(OBJECT_HEAD);
    out.put_slice(format!(r#"{{"resourceVersion":"{rv}"{annotations}}}}}"#).as_bytes());
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn custom_objects_get_object_meta_order_with_values_as_received() {
        let members = br#""apiVersion":"x/v1","kind":"W","metadata":{"annotations":{"n":"\u003c"},"creationTimestamp":"t","generation":0,"labels":{},"managedFields":[{"apiVersion":"x/v1","fieldsType":"FieldsV1","fieldsV1":{"f:a":{}},"manager":"m","operation":"Update","time":"t"}],"name":"w","namespace":"ns","ownerReferences":[{"apiVersion":"v1","blockOwnerDeletion":false,"kind":"K","name":"o","uid":"u"}],"resourceVersion":"5","uid":"id","unknown":1},"spec":{}}"#;
        assert_eq!(
            std::str::from_utf8(&custom_object(members)).unwrap(),
            r#"{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"name":"w","namespace":"ns","uid":"id","resourceVersion":"5","creationTimestamp":"t","annotations":{"n":"\u003c"},"ownerReferences":[{"apiVersion":"v1","kind":"K","name":"o","uid":"u","blockOwnerDeletion":false}],"managedFields":[{"manager":"m","operation":"Update","apiVersion":"x/v1","time":"t","fieldsType":"FieldsV1","fieldsV1":{"f:a":{}}}]}}"#
        );
        assert_eq!(
            &custom_object(b"}")[..],
            br#"{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{}}"#
        );
    }

    #[test]
    fn object_keeps_the_metadata_bytes() {
        let members = br#""metadata":{"name":"a","labels":{"x":"\u003c"}},"data":{"k":"v"}}"#;
        assert_eq!(
            &object(members)[..],
            br#"{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"name":"a","labels":{"x":"\u003c"}}}"#
        );
    }

    #[test]
    fn object_finds_metadata_anywhere() {
        let members = br#""data":{"metadata":1}, "metadata" : {"name":"b"}}"#;
        assert_eq!(
            &object(members)[..],
            br#"{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"name":"b"}}"#
        );
    }

    #[test]
    fn a_daemonsets_conversion_annotation_is_not_metadata() {
        let k = DAEMONSET_CONVERSION_ANNOTATION;
        let only = object(
            format!(r#""metadata":{{"name":"d","annotations":{{"{k}":"1"}},"uid":"u"}}}}"#).as_bytes(),
        );
        assert_eq!(
            &without_annotation(only, k)[..],
            br#"{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"name":"d","uid":"u"}}"#
        );
        let two = object(format!(r#""metadata":{{"annotations":{{"a":"x","{k}":"2"}}}}}}"#).as_bytes());
        assert_eq!(
            &without_annotation(two, k)[..],
            br#"{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"annotations":{"a":"x"}}}"#
        );
        let first = object(format!(r#""metadata":{{"annotations":{{"{k}":"3","z":"y"}}}}}}"#).as_bytes());
        assert_eq!(
            &without_annotation(first, k)[..],
            br#"{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"annotations":{"z":"y"}}}"#
        );
        let none = object(br#""metadata":{"name":"d"}}"#);
        assert_eq!(without_annotation(none.clone(), k), none);
        // A label of the same key is the user's: kept, the annotation taken out.
        let labelled = object(
            format!(r#""metadata":{{"labels":{{"{k}":"l"}},"annotations":{{"{k}":"4","z":"y"}}}}}}"#)
                .as_bytes(),
        );
        assert_eq!(
            String::from_utf8_lossy(&without_annotation(labelled, k)),
            format!(
                r#"{{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{{"labels":{{"{k}":"l"}},"annotations":{{"z":"y"}}}}}}"#
            )
        );
        let label_only = object(format!(r#""metadata":{{"labels":{{"{k}":"l"}}}}}}"#).as_bytes());
        assert_eq!(without_annotation(label_only.clone(), k), label_only);
    }

    /// A Deployment's rollback annotation goes when it has a value (apps/v1's conversion moves
    /// it into the internal `spec.rollbackTo`); an empty one stays, as Go's conversion leaves it.
    #[test]
    fn a_deployments_rollback_annotation_with_a_value_is_not_metadata() {
        let k = DEPLOYMENT_ROLLBACK_ANNOTATION;
        let set = object(format!(r#""metadata":{{"annotations":{{"a":"x","{k}":"2"}}}}}}"#).as_bytes());
        assert_eq!(
            &without_set_annotation(set, k)[..],
            br#"{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"annotations":{"a":"x"}}}"#
        );
        let empty = object(format!(r#""metadata":{{"annotations":{{"{k}":""}}}}}}"#).as_bytes());
        assert_eq!(without_set_annotation(empty.clone(), k), empty);
        let none = object(br#""metadata":{"name":"d"}}"#);
        assert_eq!(without_set_annotation(none.clone(), k), none);
    }

    #[test]
    fn bookmark_objects() {
        assert_eq!(
            &bookmark("12", false)[..],
            br#"{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":"12"}}"#
        );
        assert_eq!(
            &bookmark("12", true)[..],
            br#"{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":"12","annotations":{"k8s.io/initial-events-end":"true"}}}"#
        );
    }
}
