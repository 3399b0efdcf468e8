//! Plain data types shared by every module: resource kinds, resourceVersions, object keys,
//! cached objects (bytes as received + a small parsed header) and cache events.
//!
//! Nothing here does I/O. `Object::parse` reads only `metadata` and the few selectable
//! fields of an object; the rest of the JSON is skipped and kept as bytes, never re-encoded.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, OnceLock};

use bytes::{BufMut, Bytes, BytesMut};
use once_cell::race::OnceBox;
use serde::Deserialize;

use crate::managed_fields;
use crate::metadata_only::{self, Repr};
use crate::proto::{self, Encoded, ProtoType, Rope};

mod header;
mod key;
pub use header::{Header, Pairs, Uid};
pub use key::ObjectKey;

/// What a path segment the proxy builds escapes: everything but RFC 3986's unreserved
/// characters, so `/`, `?`, `#` and `%` in a value stay inside its segment.
const PATH_SEGMENT: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');

/// A resourceVersion issued by the upstream (an etcd revision). The proxy never invents one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Rv(pub u64);

impl fmt::Display for Rv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl Rv {
    /// Parses a resourceVersion as the apiserver does (`strconv.ParseUint`, base 10;
    /// `""` is 0, leading zeros are accepted). Returns the apiserver's error detail.
    pub fn parse(s: &str) -> Result<Rv, String> {
        if s.is_empty() {
            return Ok(Rv(0));
        }
        if !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!(
                "resourceVersion: Invalid value: {}: strconv.ParseUint: parsing {}: invalid syntax",
                go_quote(s),
                go_quote(s)
            ));
        }
        s.parse::<u64>().map(Rv).map_err(|_| {
            format!(
                "resourceVersion: Invalid value: {}: strconv.ParseUint: parsing {}: value out of range",
                go_quote(s),
                go_quote(s)
            )
        })
    }
}

/// Quotes a string the way Go's `%q` (`strconv.Quote`) does: `\"` and `\\`, the named control
/// escapes (`\a \b \f \n \r \t \v`), other ASCII controls as `\xNN`, characters that are not
/// printable (Go's `IsPrint`: not a letter, mark, number, punctuation or symbol, and not the
/// ASCII space) as `\uNNNN` / `\UNNNNNNNN`, the rest as they are. Printability is Rust's (the
/// same categories; its Unicode version may be newer than Go's for characters assigned since).
pub fn go_quote(s: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if c.is_ascii() || printable(c) => out.push(c),
            c if (c as u32) < 0x10000 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => {
                let _ = write!(out, "\\U{:08x}", c as u32);
            }
        }
    }
    out.push('"');
    out
}

/// Whether a non-ASCII character is printable: Rust's `escape_debug` leaves it as it is (after
/// another character, where a combining mark is not escaped either).
fn printable(c: char) -> bool {
    let mut buf = [0u8; 8];
    buf[0] = b'a';
    let n = 1 + c.encode_utf8(&mut buf[1..]).len();
    let text = std::str::from_utf8(&buf[..n]).unwrap_or("");
    text.escape_debug().eq(text.chars())
}

/// How the apiserver converts field selectors for a resource: it decides both which fields
/// exist and the wording of the 400 for an unknown one (docs/apiserver-watch-cache.md §1.4, §7.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldLabelStyle {
    /// Resources with a custom conversion func (pods, nodes, secrets, namespaces, …):
    /// `field label not supported: <label>`.
    Custom,
    /// The default conversion (configmaps, apps/*, CRDs …):
    /// `"<label>" is not a known field selector: only "metadata.name", "metadata.namespace"`.
    Default,
    /// batch/v1 Job: `field label "<label>" not supported for Job`.
    Job,
}

/// One API resource the proxy knows about (found by discovery, or built in for `sim`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceKind {
    /// API group, `""` for the core group.
    pub group: String,
    /// Served version, e.g. `v1`.
    pub version: String,
    /// Plural resource name as in URLs, e.g. `pods`.
    pub resource: String,
    /// Object kind, e.g. `Pod`.
    pub kind: String,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
    /// Built-in typed resources encode list items without `kind`/`apiVersion`;
    /// custom resources (unstructured) keep them and sort top-level keys.
    pub builtin: bool,
}

impl ResourceKind {
    /// Convenience constructor used by tests, `sim` and the built-in table.
    pub fn new(
        group: &str,
        version: &str,
        resource: &str,
        kind: &str,
        namespaced: bool,
        builtin: bool,
    ) -> Self {
        ResourceKind {
            group: group.into(),
            version: version.into(),
            resource: resource.into(),
            kind: kind.into(),
            namespaced,
            builtin,
        }
    }

    /// `v1` or `apps/v1`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `PodList`.
    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }

    /// `pods` or `deployments.apps`, as used in apiserver messages (`pods "x" not found`).
    pub fn group_resource(&self) -> String {
        if self.group.is_empty() {
            self.resource.clone()
        } else {
            format!("{}.{}", self.resource, self.group)
        }
    }

    /// `/api/v1` or `/apis/apps/v1`.
    pub fn group_version_path(&self) -> String {
        if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        }
    }

    /// The collection URL, cluster-wide when `namespace` is `None`. The namespace is
    /// percent-encoded as one path segment: whatever a caller named, it never adds a segment
    /// (or a query) to a URL the proxy requests with its own credentials.
    pub fn collection_path(&self, namespace: Option<&str>) -> String {
        match namespace {
            Some(ns) if self.namespaced => {
                let ns = percent_encoding::utf8_percent_encode(ns, PATH_SEGMENT);
                format!("{}/namespaces/{}/{}", self.group_version_path(), ns, self.resource)
            }
            _ => format!("{}/{}", self.group_version_path(), self.resource),
        }
    }

    /// The selectable fields besides `metadata.name` / `metadata.namespace`, and how unknown
    /// ones are reported (docs/apiserver-watch-cache.md §7.2).
    pub fn field_labels(&self) -> (&'static [&'static str], FieldLabelStyle) {
        field_labels(&self.group, &self.resource)
    }
}

/// The selectable fields of `group`/`resource` besides `metadata.name` / `metadata.namespace`
/// ([`ResourceKind::field_labels`]; also what a `--state-dir` file's objects carry, in this order).
pub fn field_labels(group: &str, resource: &str) -> (&'static [&'static str], FieldLabelStyle) {
    match (group, resource) {
        ("", "pods") => (
            &[
                "spec.nodeName",
                "spec.restartPolicy",
                "spec.schedulerName",
                "spec.serviceAccountName",
                "spec.hostNetwork",
                "status.phase",
                "status.podIP",
                "status.nominatedNodeName",
            ],
            FieldLabelStyle::Custom,
        ),
        ("", "nodes") => (&["spec.unschedulable"], FieldLabelStyle::Custom),
        ("", "secrets") => (&["type"], FieldLabelStyle::Custom),
        ("", "namespaces") => (&["status.phase"], FieldLabelStyle::Custom),
        ("", "services") => (&["spec.clusterIP", "spec.type"], FieldLabelStyle::Custom),
        ("", "replicationcontrollers") => (&["status.replicas"], FieldLabelStyle::Custom),
        ("", "events") => (
            &[
                "involvedObject.kind",
                "involvedObject.namespace",
                "involvedObject.name",
                "involvedObject.uid",
                "involvedObject.apiVersion",
                "involvedObject.resourceVersion",
                "involvedObject.fieldPath",
                "reason",
                "reportingComponent",
                "source",
                "type",
            ],
            FieldLabelStyle::Custom,
        ),
        ("batch", "jobs") => (&["status.successful"], FieldLabelStyle::Job),
        _ => (&[], FieldLabelStyle::Default),
    }
}

/// An object as cached: the JSON bytes as received, split so that both encodings the
/// apiserver uses can be produced without re-encoding:
/// `typed = {"kind":…,"apiVersion":…,` + `body`, `item = {` + `body` for built-ins.
///
/// Every cached object carries one, so it is kept small (docs/performance.md, "Memory per
/// cached object"): the header inline, the resource's typing shared, and the forms made at
/// other reads (metadata-only, protobuf, without managedFields) behind one pointer that stays
/// empty until the first such read.
#[derive(Clone, Debug)]
pub struct Object {
    pub header: Header,
    /// For built-in kinds: the object after its `{"kind":"…","apiVersion":"…",` (or after
    /// `{` when it came without them), i.e. starting at the first other member.
    /// For custom resources: the whole object as received.
    pub body: Bytes,
    /// The resource's typing (its JSON prefix and protobuf type), shared by all its objects.
    typing: Typing,
    /// The other forms of this version, made at their first read.
    forms: OnceBox<Forms>,
}

/// The forms of an object version made lazily, each at its first read and shared by every
/// later one.
#[derive(Clone, Debug, Default)]
struct Forms {
    /// The object as PartialObjectMetadata (`metadata_only::object`).
    meta: OnceLock<Bytes>,
    /// The object's protobuf message (no envelope), its long strings shared with `body`;
    /// `None` if it cannot be encoded exactly.
    proto: OnceLock<Option<Rope>>,
    /// The same for its PartialObjectMetadata (sharing with `meta`).
    proto_meta: OnceLock<Option<Rope>>,
    /// This version without `metadata.managedFields` (`drop=metadata.managedFields`), its own
    /// encodings made lazily as these are; `None` when it has none (the object itself is lean).
    lean: OnceLock<Option<Box<Object>>>,
}

/// Why an object could not be taken from upstream bytes.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    #[error("invalid object JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("object has no metadata.name")]
    NoName,
    #[error("object resourceVersion: {0}")]
    Rv(String),
}

#[derive(Deserialize)]
struct RawObject<'a> {
    #[serde(borrow, default)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default, rename = "apiVersion")]
    api_version: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    metadata: RawMeta<'a>,
    #[serde(borrow, default)]
    spec: Option<RawFields<'a>>,
    #[serde(borrow, default)]
    status: Option<RawFields<'a>>,
    #[serde(borrow, default, rename = "type")]
    type_: Option<Scalar<'a>>,
    #[serde(borrow, default, rename = "involvedObject")]
    involved_object: Option<RawFields<'a>>,
    #[serde(borrow, default)]
    reason: Option<Scalar<'a>>,
    #[serde(borrow, default, rename = "reportingComponent")]
    reporting_component: Option<Scalar<'a>>,
    #[serde(borrow, default)]
    source: Option<RawFields<'a>>,
}

#[derive(Deserialize, Default)]
struct RawMeta<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    namespace: Option<Cow<'a, str>>,
    #[serde(borrow, default, rename = "resourceVersion")]
    resource_version: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    labels: Option<BTreeMap<Cow<'a, str>, Cow<'a, str>>>,
    #[serde(borrow, default)]
    uid: Option<Cow<'a, str>>,
}

/// A flat bag of the scalar members of `spec`, `status`, `involvedObject` or `source`, borrowed
/// from the input where possible (strings without escapes); other members are skipped. Only
/// the selectable ones are rendered, by [`RawFields::get`]. Any other value (a custom
/// resource's schema may make `status` a string, `spec` a list) is an empty bag: only
/// built-in kinds select by these, and the object must parse whatever its schema (an object
/// that does not is an event lost).
#[derive(Default)]
struct RawFields<'a>(Vec<(Cow<'a, str>, Scalar<'a>)>);

impl RawFields<'_> {
    /// The member's field-selector text (strings as they are, booleans and numbers as Go
    /// formats them), if it is present and a scalar.
    fn get(&self, name: &str) -> Option<String> {
        // The last occurrence wins, as in Go's decoder.
        self.0.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v.render())
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for RawFields<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for V<'a> {
            type Value = RawFields<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some(k) = m.next_key::<Cow<'de, str>>()? {
                    let v: Scalar<'de> = m.next_value()?;
                    if !matches!(v, Scalar::None) {
                        out.push((k, v));
                    }
                }
                Ok(RawFields(out))
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(RawFields::default())
            }
            fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
                Ok(RawFields::default())
            }
            fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                Ok(RawFields::default())
            }
            fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
                Ok(RawFields::default())
            }
            fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
                Ok(RawFields::default())
            }
            fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
                Ok(RawFields::default())
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut s: A) -> Result<Self::Value, A::Error> {
                while s.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(RawFields::default())
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

/// A JSON value kept only if it is a scalar; rendered as a field selector compares it only
/// when asked, so unselectable members cost no allocation.
enum Scalar<'a> {
    None,
    Str(Cow<'a, str>),
    Bool(bool),
    I64(i64),
    U64(u64),
    F64(f64),
}

impl Scalar<'_> {
    /// A string's text (a built-in kind's `type`, `reason`, `reportingComponent` are strings).
    fn text(&self) -> Option<String> {
        match self {
            Scalar::Str(s) => Some(s.to_string()),
            _ => None,
        }
    }

    fn render(&self) -> String {
        match self {
            Scalar::None => String::new(),
            Scalar::Str(s) => s.to_string(),
            Scalar::Bool(b) => b.to_string(),
            Scalar::I64(n) => n.to_string(),
            Scalar::U64(n) => n.to_string(),
            Scalar::F64(n) => n.to_string(),
        }
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Scalar<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for V<'a> {
            type Value = Scalar<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Scalar::Str(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Scalar::Str(Cow::Owned(v.to_owned())))
            }
            fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
                Ok(Scalar::Bool(v))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
                Ok(Scalar::I64(v))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
                Ok(Scalar::U64(v))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
                Ok(Scalar::F64(v))
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(Scalar::None)
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
                while m.next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?.is_some() {}
                Ok(Scalar::None)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut s: A) -> Result<Self::Value, A::Error> {
                while s.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(Scalar::None)
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

impl Object {
    /// Takes an object from upstream JSON bytes (a list item, a watch event's object or a
    /// GET body). Only `metadata` and the selectable fields are parsed. What it derives is
    /// saved beside the bytes by `--state-dir` (`state::format`): a change to it needs a new
    /// `state::format::VERSION`.
    pub fn parse(kind: &ResourceKind, typing: &Typing, bytes: Bytes) -> Result<Object, ParseError> {
        let raw: RawObject = serde_json::from_slice(&bytes)?;
        let name = raw.metadata.name.as_deref().filter(|n| !n.is_empty()).ok_or(ParseError::NoName)?;
        let namespace = raw.metadata.namespace.as_deref().unwrap_or("");
        let rv = Rv::parse(raw.metadata.resource_version.as_deref().unwrap_or("")).map_err(ParseError::Rv)?;
        let mut fields: Vec<(&'static str, String)> = Vec::new();
        let (known, _) = kind.field_labels();
        for &label in known {
            let value = match label.split_once('.') {
                Some(("spec", f)) => raw.spec.as_ref().and_then(|s| s.get(f)),
                Some(("status", f)) => raw.status.as_ref().and_then(|s| s.get(f)),
                Some(("involvedObject", f)) => raw.involved_object.as_ref().and_then(|s| s.get(f)),
                _ => match label {
                    "type" => raw.type_.as_ref().and_then(Scalar::text),
                    "reason" => raw.reason.as_ref().and_then(Scalar::text),
                    "reportingComponent" => raw.reporting_component.as_ref().and_then(Scalar::text),
                    // `source.component`, else `reportingComponent` (core/v1's name of the
                    // internal `ReportingController`): the apiserver's `ToSelectableFields`, so
                    // an event written through events.k8s.io is found by its controller.
                    "source" => raw
                        .source
                        .as_ref()
                        .and_then(|s| s.get("component"))
                        .filter(|c| !c.is_empty())
                        .or_else(|| raw.reporting_component.as_ref().and_then(Scalar::text)),
                    _ => None,
                },
            };
            // Go's field sets render absent values as their zero value.
            let value = value.unwrap_or_else(|| match label {
                "spec.hostNetwork" | "spec.unschedulable" => "false".into(),
                "status.replicas" | "status.successful" => "0".into(),
                _ => String::new(),
            });
            fields.push((label, value));
        }
        let header = Header::new(
            namespace,
            name,
            rv,
            raw.metadata.uid.as_deref().unwrap_or(""),
            raw.metadata.labels.iter().flatten().map(|(k, v)| (k.as_ref(), v.as_ref())),
            fields.iter().map(|(k, v)| (*k, v.as_str())),
        );
        let has_type_meta = raw.kind.is_some() || raw.api_version.is_some();
        drop(raw);
        let body = match (kind.builtin, has_type_meta) {
            (false, _) => bytes,
            (true, true) => strip_type_meta(&bytes),
            (true, false) => bytes.slice(skip_ws(&bytes, 0) + 1..),
        };
        Ok(Object::restored(typing, header, body))
    }

    /// An object from what [`Object::parse`] made of it before (its header and body, as a warm
    /// restart's state file keeps them): nothing is parsed. The body starts after the type
    /// members for a built-in kind (`typing` has its prefix).
    pub fn restored(typing: &Typing, header: Header, body: Bytes) -> Object {
        Object { header, body, typing: typing.clone(), forms: OnceBox::new() }
    }

    /// This version with its JSON copied into a buffer of its own, so that the buffer it was
    /// a slice of (a list page) can be freed (`cache::pages`): the same bytes and header; the
    /// other forms are let go (they may share the old buffer) and made again at their next read.
    pub fn compacted(&self) -> Object {
        Object::restored(&self.typing, self.header.clone(), Bytes::copy_from_slice(&self.body))
    }

    /// Built-ins: the shared `{"kind":"Pod","apiVersion":"v1",` prefix. Empty for CRs.
    pub fn type_prefix(&self) -> &Bytes {
        &self.typing.prefix
    }

    fn forms(&self) -> &Forms {
        self.forms.get_or_init(Box::default)
    }

    /// A form already made, without making the others' room.
    fn made<T>(&self, f: impl FnOnce(&Forms) -> Option<&T>) -> Option<&T> {
        self.forms.get().and_then(f)
    }

    /// This version without `metadata.managedFields`, as a 1.38 apiserver encodes it for
    /// `drop=metadata.managedFields` (`managed_fields`): made once, then shared.
    pub fn without_managed_fields(&self) -> &Object {
        self.forms()
            .lean
            .get_or_init(|| {
                let cut = if self.type_prefix().is_empty() {
                    managed_fields::cut(&self.body)
                } else {
                    // A built-in's body is its members after `{`: cut in `{` + body.
                    let mut whole = Vec::with_capacity(self.body.len() + 1);
                    whole.push(b'{');
                    whole.extend_from_slice(&self.body);
                    managed_fields::cut(&whole).map(|r| r.start - 1..r.end - 1)
                }?;
                let mut body = BytesMut::with_capacity(self.body.len() - cut.len());
                body.put_slice(&self.body[..cut.start]);
                body.put_slice(&self.body[cut.end..]);
                Some(Box::new(Object {
                    header: self.header.clone(),
                    body: body.freeze(),
                    typing: self.typing.clone(),
                    forms: OnceBox::new(),
                }))
            })
            .as_deref()
            .unwrap_or(self)
    }

    /// The object whose bytes a representation encodes: this one, or it without managedFields.
    pub fn view(&self, repr: Repr) -> &Object {
        if repr.is_lean() {
            self.without_managed_fields()
        } else {
            self
        }
    }

    /// The protobuf message of the object in a protobuf representation (`proto_message` of its
    /// `view`).
    pub fn proto_message_as(&self, repr: Repr) -> Option<&Rope> {
        self.view(repr).proto_message(repr.is_metadata())
    }

    /// The object as `meta.k8s.io/v1` PartialObjectMetadata (encoded once per version).
    pub fn metadata_bytes(&self) -> Bytes {
        self.metadata_ref().clone()
    }

    /// [`Object::metadata_bytes`], borrowed.
    fn metadata_ref(&self) -> &Bytes {
        self.forms().meta.get_or_init(|| {
            if self.type_prefix().is_empty() {
                // A custom resource: unstructured JSON, its metadata re-ordered as typed.
                let i = skip_ws(&self.body, 0);
                metadata_only::custom_object(self.body.get(i + 1..).unwrap_or_default())
            } else if self.type_prefix().starts_with(br#"{"kind":"DaemonSet","apiVersion":"apps/"#) {
                let pom = metadata_only::object(&self.body[..]);
                metadata_only::without_annotation(pom, metadata_only::DAEMONSET_CONVERSION_ANNOTATION)
            } else if [
                &br#"{"kind":"Deployment","apiVersion":"apps/v1","#[..],
                br#"{"kind":"Deployment","apiVersion":"apps/v1beta2","#,
            ]
            .contains(&&self.type_prefix()[..])
            {
                let pom = metadata_only::object(&self.body[..]);
                metadata_only::without_set_annotation(pom, metadata_only::DEPLOYMENT_ROLLBACK_ANNOTATION)
            } else {
                metadata_only::object(&self.body[..])
            }
        })
    }

    /// How the resource encodes in protobuf.
    pub fn proto_type(&self) -> &ProtoType {
        &self.typing.proto
    }

    /// The object's protobuf message without envelope, whole or metadata only (made once per
    /// version); `None` if it cannot be encoded exactly (the read goes upstream).
    pub fn proto_message(&self, metadata: bool) -> Option<&Rope> {
        if metadata {
            self.forms()
                .proto_meta
                .get_or_init(|| self.proto_type().encode_metadata_shared(&self.metadata_bytes()))
                .as_ref()
        } else {
            self.forms().proto.get_or_init(|| self.encode_fresh()).as_ref()
        }
    }

    /// The whole protobuf message made from the JSON alone, its long strings shared with it.
    fn encode_fresh(&self) -> Option<Rope> {
        let typed = self.typed_bytes();
        let prefix = typed.len() - self.body.len();
        self.proto_type().encode_shared(&typed, &self.body, prefix)
    }

    /// This version's protobuf message made from that of `prev`, the version it replaced: only
    /// what changed is read and encoded again (`proto::splice`, `proto::window`,
    /// `proto::after`; a kubelet's pod changes in its status). The outer `None` when `prev` has
    /// no encoding or the two are not of one typing (then [`Object::encode_fresh`]).
    fn encode_after<'a>(&'a self, prev: &'a Object) -> Option<Option<Encoded<'a>>> {
        let Some(Some(prior)) = prev.made(|f| f.proto.get()) else { return None };
        if !Arc::ptr_eq(&self.typing.0, &prev.typing.0) {
            return None;
        }
        // A built-in object's body is its JSON after `{"kind":…,"apiVersion":…,`.
        let built_in = !self.type_prefix().is_empty() && self.type_prefix() == prev.type_prefix();
        if let Some(edited) =
            built_in.then(|| self.proto_type().encode_edit(&self.body, &prev.body, prior)).flatten()
        {
            return Some(Some(edited));
        }
        let typed = self.typed_bytes();
        let prior_typed = prev.typed_bytes();
        let now = (&typed[..], &self.body, typed.len() - self.body.len());
        let before = (&prior_typed[..], &prev.body, prior_typed.len() - prev.body.len());
        Some(self.proto_type().encode_after(now, before, prior).map(|r| Encoded::Rope(Cow::Owned(r))))
    }

    /// The whole protobuf watch frame of type `event_type` of this version, `prev` the version
    /// it replaced. When the version has no encoding yet, it is made (from `prev`'s when there
    /// is one: [`Object::encode_after`]), framed, and the version then keeps its message as the
    /// slice of that frame which holds it: one buffer per version instead of a rope and a
    /// frame, the rope's parts let go while they are still in the processor's cache rather
    /// than when the event leaves the history, and the next version's encoding made from one
    /// buffer. (A rope's long strings were shared with the JSON; in the frame they are
    /// copied — a protobuf-watched object's message costs its full length.)
    pub fn proto_watch_event_after(&self, event_type: &str, prev: Option<&Object>) -> Option<Bytes> {
        let forms = self.forms();
        if forms.proto.get().is_some() {
            return self.proto_watch_event(event_type, Repr::FullProto);
        }
        let made = prev
            .and_then(|p| self.encode_after(p))
            .unwrap_or_else(|| self.encode_fresh().map(|r| Encoded::Rope(Cow::Owned(r))));
        let Some(msg) = made else {
            let _ = forms.proto.set(None);
            return None;
        };
        let frame = self.frame_message(event_type, false, &msg);
        let end = frame.len() - proto::envelope::UNKNOWN_TAIL.len();
        let kept = frame.slice(end - msg.len()..end);
        debug_assert!({
            let mut pieces = Vec::new();
            msg.pieces_into(&mut pieces);
            pieces.concat() == kept
        });
        // Another reader may have made it meanwhile (a LIST): the same bytes either way.
        let _ = forms.proto.set(Some(Rope::in_one(kept, msg.repeated())));
        Some(frame)
    }

    /// Bytes of `frame` that this version's JSON is a slice of (`Object::framed`).
    fn json_within(&self, frame: &Bytes) -> usize {
        if frame.as_ptr_range().contains(&self.body.as_ptr()) {
            self.body.len()
        } else {
            0
        }
    }

    /// Bytes of `frame` that this version's whole protobuf message is a slice of.
    fn proto_within(&self, frame: &Bytes) -> usize {
        let Some(Some(msg)) = self.made(|f| f.proto.get()) else { return 0 };
        let range = frame.as_ptr_range();
        msg.parts().iter().filter(|p| range.contains(&p.as_ptr())).map(Bytes::len).sum()
    }

    /// Chunks of the object with `kind`/`apiVersion` in the representation asked for (GET
    /// answers, watch events, metadata-only list items); in protobuf, the enveloped object
    /// (`k8s\0` + Unknown). `None`: no exact protobuf for it.
    pub fn chunks_as(&self, repr: Repr) -> Option<[Bytes; 3]> {
        if repr.is_lean() {
            return self.without_managed_fields().chunks_as(repr.keeping_managed_fields());
        }
        Some(match repr {
            Repr::Full => {
                let [a, b] = self.typed_chunks();
                [a, b, Bytes::new()]
            }
            Repr::Metadata => [self.metadata_bytes(), Bytes::new(), Bytes::new()],
            _ => {
                let msg = self.proto_message(repr.is_metadata())?;
                let head = proto::envelope::head(self.proto_type().type_meta(repr.is_metadata()), msg.len());
                [Bytes::from(head), msg.to_bytes(), Bytes::from_static(proto::envelope::UNKNOWN_TAIL)]
            }
        })
    }

    /// A protobuf watch frame of type `event_type` holding the enveloped object in `repr` (a
    /// protobuf one): the kept message's parts are copied once, into the frame (one watcher per
    /// event, a kubelet's pods, pays this per delivery). `None`: no exact protobuf for it.
    pub fn proto_watch_event(&self, event_type: &str, repr: Repr) -> Option<Bytes> {
        if repr.is_lean() {
            return self
                .without_managed_fields()
                .proto_watch_event(event_type, repr.keeping_managed_fields());
        }
        let msg = self.proto_message(repr.is_metadata())?;
        Some(self.frame_message(event_type, repr.is_metadata(), &Encoded::Rope(Cow::Borrowed(msg))))
    }

    /// The watch frame of type `event_type` around `msg`, this object's message (its
    /// PartialObjectMetadata when `metadata`), enveloped: its pieces copied once.
    fn frame_message(&self, event_type: &str, metadata: bool, msg: &Encoded) -> Bytes {
        let mut pieces: Vec<&[u8]> = Vec::with_capacity(12);
        msg.pieces_into(&mut pieces);
        proto::envelope::watch_event_enveloped(event_type, self.proto_type().type_meta(metadata), &pieces)
    }

    /// Chunks of the object as a JSON list item in the representation asked for; `None` in
    /// protobuf, whose list items are the kept message's parts (`proto_message`), written by the
    /// list without a copy of their own.
    pub fn item_chunks_as(&self, repr: Repr) -> Option<[Bytes; 2]> {
        let o = self.view(repr);
        match repr.keeping_managed_fields() {
            Repr::Full => Some(o.item_chunks()),
            Repr::Metadata => Some([o.metadata_bytes(), Bytes::new()]),
            _ => None,
        }
    }

    /// [`Object::item_chunks_as`] borrowed, as LIST bodies read it once per item: the item's
    /// opening (`{` before a built-in's body, nothing else) and its stored bytes. No reference
    /// count is touched.
    pub fn item_parts_as(&self, repr: Repr) -> Option<(&'static [u8], &Bytes)> {
        let o = self.view(repr);
        match repr.keeping_managed_fields() {
            Repr::Full if o.type_prefix().is_empty() => Some((b"", &o.body)),
            Repr::Full => Some((b"{", &o.body)),
            Repr::Metadata => Some((b"", o.metadata_ref())),
            _ => None,
        }
    }

    /// Chunks of the object as a built-in list item (no kind/apiVersion) or as a CR list item.
    pub fn item_chunks(&self) -> [Bytes; 2] {
        if self.type_prefix().is_empty() {
            [self.body.clone(), Bytes::new()]
        } else {
            [Bytes::from_static(b"{"), self.body.clone()]
        }
    }

    /// Chunks of the object with `kind`/`apiVersion`, as GET and watch events carry it.
    pub fn typed_chunks(&self) -> [Bytes; 2] {
        let prefix = self.type_prefix();
        if prefix.is_empty() {
            [self.body.clone(), Bytes::new()]
        } else if self.body.first() == Some(&b'}') {
            // An object with nothing but kind/apiVersion: drop the prefix's trailing comma.
            [prefix.slice(..prefix.len() - 1), self.body.clone()]
        } else {
            [prefix.clone(), self.body.clone()]
        }
    }

    /// The typed object as one buffer (GET responses, event framing).
    pub fn typed_bytes(&self) -> Bytes {
        let [a, b] = self.typed_chunks();
        if b.is_empty() {
            return a;
        }
        let mut out = BytesMut::with_capacity(a.len() + b.len());
        out.put_slice(&a);
        out.put_slice(&b);
        out.freeze()
    }

    /// A copy of this object whose `metadata.resourceVersion` says `rv` (for DELETED events made
    /// from a previous state). The member is found by reading the object's top level and its
    /// `metadata` (a custom resource's members are sorted, so one like `data` may come first and
    /// hold the same text; an annotation may be named `resourceVersion`).
    pub fn with_rv(&self, rv: Rv) -> Object {
        let mut out = self.clone();
        if rv == self.header.rv {
            return out;
        }
        out.forms = OnceBox::new();
        if let Some(at) = metadata_rv_range(&self.body) {
            let mut b = BytesMut::with_capacity(self.body.len() + 8);
            b.put_slice(&self.body[..at.start]);
            b.put_slice(format!("\"{rv}\"").as_bytes());
            b.put_slice(&self.body[at.end..]);
            out.body = b.freeze();
        }
        out.header.rv = rv;
        out
    }

    /// Frames the watch event `t` of this object (`frame_event`) and takes its JSON from that
    /// frame: the history's frame and the object then share one buffer, and the buffer the
    /// object was sliced from (an upstream watch frame, possibly holding other events) is let
    /// go. Same bytes.
    pub fn framed(mut self, t: EventType) -> (Object, Bytes) {
        let frame = frame_event(t, &self.typed_chunks());
        // `{"type":"T","object":` + (prefix) + body + `}\n`: the body ends 2 bytes before.
        let end = frame.len() - 2;
        let start = end - self.body.len();
        debug_assert_eq!(&frame[start..end], &self.body[..]);
        self.body = frame.slice(start..end);
        (self, frame)
    }

    /// Bytes this object keeps (`--cache-memory-limit`'s accounting, `cache::memory`): its
    /// JSON, its parsed header, the lazily made metadata-only and protobuf forms built so far
    /// (a protobuf rope's parts shared with the JSON counted once), and the struct itself. The
    /// shared type prefix is not counted; a body that is a slice of a larger buffer (a list
    /// page, a watch frame) counts its own length only.
    pub fn kept_bytes(&self) -> usize {
        // The lean copy (managedFields left out) has a header of its own: its heap counted too.
        let lean = self
            .made(|f| f.lean.get().and_then(Option::as_deref))
            .map_or(0, |l| l.forms_bytes() + l.header.heap_bytes());
        self.forms_bytes() + self.header.heap_bytes() + lean
    }

    /// The struct, its JSON and the metadata-only and protobuf forms built so far (a protobuf
    /// rope's parts shared with the JSON counted once): what `kept_bytes` counts besides the
    /// header's heap.
    fn forms_bytes(&self) -> usize {
        let Some(forms) = self.forms.get() else {
            return std::mem::size_of::<Object>() + self.body.len();
        };
        let meta = forms.meta.get().map_or(0, Bytes::len);
        let rope = |r: &OnceLock<Option<Rope>>, of: &Bytes| {
            r.get().and_then(Option::as_ref).map_or(0, |r| r.own_bytes(of) + r.list_bytes())
        };
        let empty = Bytes::new();
        let proto = rope(&forms.proto, &self.body);
        let proto_meta = rope(&forms.proto_meta, forms.meta.get().unwrap_or(&empty));
        std::mem::size_of::<Object>()
            + std::mem::size_of::<Forms>()
            + self.body.len()
            + meta
            + proto
            + proto_meta
    }

    /// Length of the object as a list item, for sizing buffers.
    pub fn item_len(&self) -> usize {
        self.item_len_as(Repr::Full)
    }

    /// Length of the object as a list item in the representation asked for (0 if it has no
    /// exact protobuf).
    pub fn item_len_as(&self, repr: Repr) -> usize {
        if repr.is_proto() {
            return self
                .proto_message_as(repr)
                .map_or(0, |m| proto::envelope::item_prefix_len(m.len()) + m.len());
        }
        self.item_parts_as(repr).map_or(0, |(a, b)| a.len() + b.len())
    }
}

/// How the objects of one resource are typed when encoded: in JSON, the prefix of a typed
/// object; in protobuf, the kind's message and envelope. Made once per resource, shared by its
/// objects (a clone is a pointer).
#[derive(Clone, Debug)]
pub struct Typing(Arc<TypeInfo>);

/// What a [`Typing`] shares.
#[derive(Debug)]
pub struct TypeInfo {
    /// `{"kind":"Pod","apiVersion":"v1",` for a built-in kind: the bytes that precede the
    /// other members of a typed object as the apiserver encodes it. Empty for custom
    /// resources, whose objects are kept whole.
    pub prefix: Bytes,
    pub proto: Arc<ProtoType>,
}

impl std::ops::Deref for Typing {
    type Target = TypeInfo;

    fn deref(&self) -> &TypeInfo {
        &self.0
    }
}

/// The [`Typing`] of a resource kind.
pub fn typing(kind: &ResourceKind) -> Typing {
    let prefix = if kind.builtin {
        Bytes::from(format!(
            "{{\"kind\":{},\"apiVersion\":{},",
            serde_json::Value::String(kind.kind.clone()),
            serde_json::Value::String(kind.api_version())
        ))
    } else {
        Bytes::new()
    };
    Typing(Arc::new(TypeInfo {
        prefix,
        proto: Arc::new(ProtoType::new(
            &kind.group,
            &kind.version,
            &kind.kind,
            kind.builtin,
            kind.group_resource(),
        )),
    }))
}

/// Returns the bytes of a JSON object that has top-level `kind`/`apiVersion` after those
/// members (and after the `{`), so that `{` + result is the object without them. Falls back
/// to re-encoding when they are not at the front (never the case for apiserver output).
fn strip_type_meta(bytes: &Bytes) -> Bytes {
    let s = bytes.as_ref();
    let i = skip_ws(s, 0);
    if s.get(i) != Some(&b'{') {
        return bytes.clone();
    }
    let mut pos = i + 1;
    let mut stripped = 0;
    loop {
        let j = skip_ws(s, pos);
        let member = if s[j..].starts_with(b"\"kind\"") {
            6
        } else if s[j..].starts_with(b"\"apiVersion\"") {
            12
        } else {
            break;
        };
        let mut k = skip_ws(s, j + member);
        if s.get(k) != Some(&b':') {
            break;
        }
        k = skip_ws(s, k + 1);
        match scan_string(s, k) {
            Some(end) => {
                let e = skip_ws(s, end);
                match s.get(e) {
                    Some(b',') => pos = e + 1,
                    Some(b'}') => {
                        pos = e;
                        stripped += 1;
                        break;
                    }
                    _ => return reencode_without_type_meta(bytes),
                }
                stripped += 1;
            }
            None => return reencode_without_type_meta(bytes),
        }
    }
    if stripped < 2 {
        // kind/apiVersion exist but not (both) in front: rare, non-apiserver input.
        return reencode_without_type_meta(bytes);
    }
    let pos = skip_ws(s, pos);
    bytes.slice(pos..)
}

/// Slow path: removes top-level `kind`/`apiVersion` by re-encoding. Only non-apiserver input
/// gets here.
fn reencode_without_type_meta(bytes: &Bytes) -> Bytes {
    match serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(bytes) {
        Ok(mut m) => {
            if !m.contains_key("kind") && !m.contains_key("apiVersion") {
                return bytes.slice(skip_ws(bytes, 0) + 1..);
            }
            m.remove("kind");
            m.remove("apiVersion");
            let v = serde_json::to_vec(&m).unwrap_or_default();
            Bytes::from(v).slice(1..)
        }
        Err(_) => bytes.slice(skip_ws(bytes, 0).min(bytes.len())..),
    }
}

fn skip_ws(s: &[u8], mut i: usize) -> usize {
    while i < s.len() && matches!(s[i], b' ' | b'\n' | b'\r' | b'\t') {
        i += 1;
    }
    i
}

/// Given `s[i] == '"'`, returns the index just past the closing quote.
fn scan_string(s: &[u8], i: usize) -> Option<usize> {
    if s.get(i) != Some(&b'"') {
        return None;
    }
    let mut j = i + 1;
    while j < s.len() {
        match s[j] {
            b'\\' => j += 2,
            b'"' => return Some(j + 1),
            _ => j += 1,
        }
    }
    None
}

/// The type of a watch event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
    Bookmark,
    Error,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
            EventType::Bookmark => "BOOKMARK",
            EventType::Error => "ERROR",
        }
    }

    pub fn parse(s: &str) -> Option<EventType> {
        Some(match s {
            "ADDED" => EventType::Added,
            "MODIFIED" => EventType::Modified,
            "DELETED" => EventType::Deleted,
            "BOOKMARK" => EventType::Bookmark,
            "ERROR" => EventType::Error,
            _ => return None,
        })
    }
}

/// Frames one watch event of `object` in the representation asked for (JSON line or protobuf
/// frame); `None` if it has no exact protobuf encoding.
pub fn frame_object(t: EventType, object: &Object, repr: Repr) -> Option<Bytes> {
    if repr.is_proto() {
        return object.proto_watch_event(t.as_str(), repr);
    }
    let chunks = object.chunks_as(repr)?;
    Some(frame_event(t, &chunks))
}

/// Frames one watch event line: `{"type":"T","object":<obj>}\n`.
pub fn frame_event(t: EventType, object: &[Bytes]) -> Bytes {
    let len: usize = object.iter().map(Bytes::len).sum();
    let mut out = BytesMut::with_capacity(len + 32);
    out.put_slice(b"{\"type\":\"");
    out.put_slice(t.as_str().as_bytes());
    out.put_slice(b"\",\"object\":");
    for c in object {
        out.put_slice(c);
    }
    out.put_slice(b"}\n");
    out.freeze()
}

/// One change applied to the cache, kept in the history ring and sent to watchers.
#[derive(Debug)]
pub struct Event {
    pub kind: EventType,
    /// The event's resourceVersion (for DELETED, the deletion revision).
    pub rv: Rv,
    /// The new state (for DELETED, the last state, carrying the deletion RV as upstream sent it).
    pub object: Arc<Object>,
    /// The state before this event (`None` for ADDED).
    pub prev: Option<Arc<Object>>,
    /// The event framed once for every watcher: `{"type":…,"object":…}\n`.
    pub frame: Bytes,
    /// The same, metadata only: framed at the first metadata-only watcher, once for all.
    meta_frame: OnceLock<Bytes>,
    /// The same in protobuf, whole and metadata only (`None`: no exact protobuf).
    proto_frames: [OnceLock<Option<Bytes>>; 2],
    /// The four representations without managedFields, each framed at its first watcher; boxed
    /// at the first lean watcher, so an event nobody reads lean (most of the history) carries a
    /// pointer, not four empty slots.
    lean_frames: OnceLock<Box<[OnceLock<Option<Bytes>>; 4]>>,
}

impl Event {
    pub fn new(kind: EventType, rv: Rv, object: Arc<Object>, prev: Option<Arc<Object>>) -> Event {
        let frame = frame_event(kind, &object.typed_chunks());
        Event::with_frame(kind, rv, object, prev, frame)
    }

    /// An event whose frame was made already ([`Object::framed`]).
    pub fn with_frame(
        kind: EventType,
        rv: Rv,
        object: Arc<Object>,
        prev: Option<Arc<Object>>,
        frame: Bytes,
    ) -> Event {
        Event {
            kind,
            rv,
            object,
            prev,
            frame,
            meta_frame: OnceLock::new(),
            proto_frames: Default::default(),
            lean_frames: Default::default(),
        }
    }

    /// Bytes the event keeps besides its objects (`cache::memory` counts those apart): its
    /// frames built so far and the struct itself.
    pub fn frame_bytes(&self) -> usize {
        let filled = |fs: &[OnceLock<Option<Bytes>>]| -> usize {
            fs.iter().filter_map(|f| f.get()?.as_ref().map(Bytes::len)).sum()
        };
        let lean = self.lean_frames.get().map_or(0, |fs| filled(&fs[..]));
        // The object's JSON is usually a slice of the JSON frame (`Object::framed`) and it may
        // keep its protobuf message as a slice of the protobuf frame
        // (`Object::proto_watch_event_after`): both counted with the object, not twice.
        let shared =
            self.proto_frames[0].get().and_then(Option::as_ref).map_or(0, |f| self.object.proto_within(f));
        let json_shared = self.object.json_within(&self.frame);
        std::mem::size_of::<Event>() + self.frame.len() - json_shared
            + self.meta_frame.get().map_or(0, Bytes::len)
            + filled(&self.proto_frames)
            - shared
            + lean
    }

    /// The event's frame in the representation a watcher asked for; `None` if it has no exact
    /// protobuf encoding.
    pub fn frame_as(&self, repr: Repr) -> Option<Bytes> {
        match repr {
            Repr::Full => Some(self.frame.clone()),
            Repr::Metadata => Some(
                self.meta_frame
                    .get_or_init(|| frame_event(self.kind, &[self.object.metadata_bytes()]))
                    .clone(),
            ),
            Repr::FullProto | Repr::MetadataProto => self.proto_frames[usize::from(repr.is_metadata())]
                .get_or_init(|| match repr {
                    Repr::FullProto => {
                        self.object.proto_watch_event_after(self.kind.as_str(), self.prev.as_deref())
                    }
                    _ => frame_object(self.kind, &self.object, repr),
                })
                .clone(),
            _ => self.lean_frames.get_or_init(Default::default)[repr.index() - 4]
                .get_or_init(|| frame_object(self.kind, &self.object, repr))
                .clone(),
        }
    }
}

/// Where in `body` (an [`Object`]'s: a whole JSON object, or a built-in's members after its
/// TypeMeta) the value of `metadata.resourceVersion` is, quotes included.
fn metadata_rv_range(body: &[u8]) -> Option<std::ops::Range<usize>> {
    if body.get(skip_ws(body, 0)) == Some(&b'{') {
        return rv_range_in(body);
    }
    let mut whole = Vec::with_capacity(body.len() + 1);
    whole.push(b'{');
    whole.extend_from_slice(body);
    let at = rv_range_in(&whole)?;
    Some(at.start - 1..at.end - 1)
}

/// [`metadata_rv_range`] in a whole JSON object.
fn rv_range_in(body: &[u8]) -> Option<std::ops::Range<usize>> {
    #[derive(Deserialize)]
    struct Top<'a> {
        #[serde(borrow)]
        metadata: Option<&'a serde_json::value::RawValue>,
    }
    #[derive(Deserialize)]
    struct Meta<'a> {
        #[serde(borrow, rename = "resourceVersion")]
        rv: Option<&'a serde_json::value::RawValue>,
    }
    let top: Top = serde_json::from_slice(body).ok()?;
    let meta: Meta = serde_json::from_str(top.metadata?.get()).ok()?;
    let value = meta.rv?.get();
    let start = (value.as_ptr() as usize).checked_sub(body.as_ptr() as usize)?;
    let end = start + value.len();
    (end <= body.len() && value.starts_with('"')).then_some(start..end)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An apps/v1 Deployment's PartialObjectMetadata lacks a set rollback annotation (as the
    /// apiserver's, made from the internal object); a ConfigMap keeps an annotation of that key.
    #[test]
    fn a_deployments_metadata_lacks_its_rollback_annotation() {
        let raw = br#"{"metadata":{"name":"d","namespace":"n","resourceVersion":"5","annotations":{"a":"x","deprecated.deployment.rollback.to":"3"}},"spec":{}}"#;
        let k = ResourceKind::new("apps", "v1", "deployments", "Deployment", true, true);
        let o = Object::parse(&k, &typing(&k), Bytes::from_static(raw)).unwrap();
        let meta = String::from_utf8(o.metadata_bytes().to_vec()).unwrap();
        assert!(!meta.contains("rollback"), "{meta}");
        assert!(meta.contains(r#""annotations":{"a":"x"}"#), "{meta}");
        let k = ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true);
        let o = Object::parse(&k, &typing(&k), Bytes::from_static(raw)).unwrap();
        assert!(String::from_utf8(o.metadata_bytes().to_vec()).unwrap().contains("rollback"));
    }

    /// Go's `strconv.Quote` (`fmt`'s `%q`), as `go run` prints them.
    #[test]
    fn go_quote_is_gos_strconv_quote() {
        assert_eq!(go_quote("a\"b\\c"), r#""a\"b\\c""#);
        assert_eq!(go_quote("\u{7}\u{8}\u{c}\n\r\t\u{b}"), r#""\a\b\f\n\r\t\v""#);
        assert_eq!(go_quote("\u{0}\u{1b}\u{7f}"), r#""\x00\x1b\x7f""#);
        assert_eq!(go_quote("café ü 日本 é"), "\"café ü 日本 é\"", "letters and combining marks");
        assert_eq!(go_quote("a\u{a0}b\u{200b}c\u{2028}\u{feff}"), r#""a\u00a0b\u200bc\u2028\ufeff""#);
        assert_eq!(go_quote("\u{e000}\u{10ffff}\u{1f600}"), r#""\ue000\U0010ffff😀""#);
        assert_eq!(go_quote("\u{85}"), r#""\u0085""#, "a C1 control");
    }

    fn pods() -> ResourceKind {
        ResourceKind::new("", "v1", "pods", "Pod", true, true)
    }

    /// Issue 30 §1: whatever a caller names, it stays one segment of the URL the proxy asks.
    #[test]
    fn a_collection_path_keeps_the_namespace_in_its_segment() {
        let k = pods();
        assert_eq!(k.collection_path(Some("ns")), "/api/v1/namespaces/ns/pods");
        assert_eq!(
            k.collection_path(Some("kube-system/secrets/super-secret?x=")),
            "/api/v1/namespaces/kube-system%2Fsecrets%2Fsuper-secret%3Fx%3D/pods"
        );
        assert_eq!(k.collection_path(Some("a%2F#b")), "/api/v1/namespaces/a%252F%23b/pods");
        assert_eq!(k.collection_path(None), "/api/v1/pods");
    }

    #[test]
    fn rv_parse_matches_apiserver() {
        assert_eq!(Rv::parse(""), Ok(Rv(0)));
        assert_eq!(Rv::parse("007"), Ok(Rv(7)));
        assert_eq!(
            Rv::parse("abc").unwrap_err(),
            r#"resourceVersion: Invalid value: "abc": strconv.ParseUint: parsing "abc": invalid syntax"#
        );
        assert!(Rv::parse("-1").is_err());
    }

    #[test]
    fn key_order_is_byte_order_of_namespace_slash_name() {
        assert!(ObjectKey::new("a-b", "y") < ObjectKey::new("a", "x"));
        assert_eq!(ObjectKey::new("", "n1").as_str(), "n1");
    }

    #[test]
    fn parse_strips_type_meta_and_reads_fields() {
        let k = pods();
        let p = typing(&k);
        let raw = br#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p1","namespace":"ns","resourceVersion":"12","labels":{"app":"a"}},"spec":{"nodeName":"n1","hostNetwork":true,"containers":[{"name":"c"}]},"status":{"phase":"Pending"}}"#;
        let o = Object::parse(&k, &p, Bytes::from_static(raw)).unwrap();
        assert_eq!(o.header.key.as_str(), "ns/p1");
        assert_eq!(o.header.rv, Rv(12));
        assert_eq!(o.header.labels().get("app"), Some("a"));
        assert_eq!(o.header.fields().get("spec.nodeName"), Some("n1"));
        assert_eq!(o.header.fields().get("spec.hostNetwork"), Some("true"));
        assert_eq!(o.header.fields().get("status.phase"), Some("Pending"));
        assert_eq!(o.header.fields().get("spec.schedulerName"), Some(""));
        assert_eq!(o.typed_bytes().as_ref(), &raw[..]);
        let item: Vec<u8> = o.item_chunks().concat();
        assert!(item.starts_with(br#"{"metadata":"#));
        let v: serde_json::Value = serde_json::from_slice(&item).unwrap();
        assert!(v.get("kind").is_none());
    }

    #[test]
    fn list_item_without_type_meta_gains_it_for_watch() {
        let k = pods();
        let p = typing(&k);
        let raw = br#"{"metadata":{"name":"p1","namespace":"ns","resourceVersion":"3"}}"#;
        let o = Object::parse(&k, &p, Bytes::from_static(raw)).unwrap();
        assert_eq!(o.item_chunks().concat(), raw.to_vec());
        assert_eq!(
            o.typed_bytes().as_ref(),
            br#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p1","namespace":"ns","resourceVersion":"3"}}"#
        );
    }

    #[test]
    fn custom_resources_are_kept_whole() {
        let k = ResourceKind::new("example.com", "v1", "widgets", "Widget", true, false);
        let raw = br#"{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w","namespace":"ns","resourceVersion":"9"}}"#;
        let o = Object::parse(&k, &typing(&k), Bytes::from_static(raw)).unwrap();
        assert_eq!(o.item_chunks().concat(), raw.to_vec());
        assert_eq!(o.typed_bytes().as_ref(), &raw[..]);
    }

    /// A custom resource's schema may make its top-level `type`, `reason`, `status`, `spec`…
    /// anything: the object parses whatever they are (one that did not was an event lost, and
    /// a deleted object kept), and a built-in kind selects only by their string values.
    #[test]
    fn members_a_field_selector_reads_parse_whatever_their_json() {
        let k = ResourceKind::new("example.com", "v1", "widgets", "Widget", true, false);
        for odd in [
            r#""type":3,"reason":["r"],"reportingComponent":{"a":1}"#,
            r#""status":"Ready","spec":["x",{"y":1}],"source":7,"involvedObject":true"#,
            r#""spec":1.5,"status":false,"type":null,"involvedObject":"o","source":[]"#,
        ] {
            let raw = format!(
                r#"{{"apiVersion":"example.com/v1","kind":"Widget","metadata":{{"name":"w","namespace":"ns","resourceVersion":"9","labels":{{"a":"b"}}}},{odd}}}"#
            );
            let o = Object::parse(&k, &typing(&k), Bytes::from(raw.clone()))
                .unwrap_or_else(|e| panic!("{odd}: {e}"));
            assert_eq!((o.header.key.as_str(), o.header.rv), ("ns/w", Rv(9)));
            assert_eq!(o.header.labels().get("a"), Some("b"));
            assert_eq!(o.typed_bytes().as_ref(), raw.as_bytes());
        }
        // A built-in kind's selectable member that is not a string selects as absent.
        let events = ResourceKind::new("", "v1", "events", "Event", true, true);
        let raw = br#"{"metadata":{"name":"e","namespace":"ns","resourceVersion":"4"},"type":1,"reason":"Started","involvedObject":"x"}"#;
        let o = Object::parse(&events, &typing(&events), Bytes::from_static(raw)).unwrap();
        assert_eq!(o.header.fields().get("reason"), Some("Started"));
        assert_eq!(o.header.fields().get("type"), Some(""));
    }

    /// An event's `source` is `source.component`, else its `reportingComponent` (the
    /// apiserver's `ToSelectableFields`: an event written through events.k8s.io has no
    /// `source.component`; a review found `fieldSelector=source=…` missed it).
    #[test]
    fn an_events_source_falls_back_to_its_reporting_component() {
        let events = ResourceKind::new("", "v1", "events", "Event", true, true);
        let source = |body: &str| {
            let raw =
                format!(r#"{{"metadata":{{"name":"e","namespace":"ns","resourceVersion":"4"}},{body}}}"#);
            let o = Object::parse(&events, &typing(&events), Bytes::from(raw)).unwrap();
            o.header.fields().get("source").map(str::to_owned)
        };
        assert_eq!(
            source(r#""source":{"component":"kubelet"},"reportingComponent":"x""#).as_deref(),
            Some("kubelet")
        );
        assert_eq!(
            source(r#""source":{},"reportingComponent":"default-scheduler""#).as_deref(),
            Some("default-scheduler")
        );
        assert_eq!(source(r#""source":{"component":""},"reportingComponent":"r""#).as_deref(), Some("r"));
        assert_eq!(source(r#""reportingComponent":"r""#).as_deref(), Some("r"));
        assert_eq!(source(r#""type":"Normal""#).as_deref(), Some(""));
    }

    #[test]
    fn type_meta_out_of_front_is_reencoded() {
        let k = pods();
        let raw = br#"{"metadata":{"name":"p1","resourceVersion":"3"},"kind":"Pod","apiVersion":"v1"}"#;
        let o = Object::parse(&k, &typing(&k), Bytes::from_static(raw)).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&o.item_chunks().concat()).unwrap();
        assert!(v.get("kind").is_none());
        let v: serde_json::Value = serde_json::from_slice(&o.typed_bytes()).unwrap();
        assert_eq!(v["kind"], "Pod");
    }

    #[test]
    fn with_rv_rewrites_metadata_resource_version() {
        let k = pods();
        let raw = br#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p1","resourceVersion":"3"}}"#;
        let o = Object::parse(&k, &typing(&k), Bytes::from_static(raw)).unwrap();
        let d = o.with_rv(Rv(17));
        assert_eq!(d.header.rv, Rv(17));
        let v: serde_json::Value = serde_json::from_slice(&d.typed_bytes()).unwrap();
        assert_eq!(v["metadata"]["resourceVersion"], "17");
    }

    /// A custom resource's members come sorted (`data` before `metadata`), and an annotation may
    /// be named `resourceVersion`: only `metadata.resourceVersion` is rewritten.
    #[test]
    fn with_rv_rewrites_only_the_metadata_member() {
        for k in [pods(), ResourceKind::new("example.com", "v1", "widgets", "Widget", true, false)] {
            with_rv_of_a_sorted_object(&k);
        }
    }

    fn with_rv_of_a_sorted_object(k: &ResourceKind) {
        let k = k.clone();
        let raw = br#"{"apiVersion":"v1","data":{"resourceVersion":"3"},"kind":"Pod","metadata":{"annotations":{"resourceVersion":"3"},"name":"p1","resourceVersion":"3"},"spec":{"x":"\"resourceVersion\":\"3\""}}"#;
        let o = Object::parse(&k, &typing(&k), Bytes::from_static(raw)).unwrap();
        let d = o.with_rv(Rv(17));
        let v: serde_json::Value = serde_json::from_slice(&d.typed_bytes()).unwrap();
        assert_eq!(v["metadata"]["resourceVersion"], "17");
        assert_eq!(v["data"]["resourceVersion"], "3");
        assert_eq!(v["metadata"]["annotations"]["resourceVersion"], "3");
        assert_eq!(v["spec"]["x"], "\"resourceVersion\":\"3\"");
        let before: serde_json::Value = serde_json::from_slice(&o.typed_bytes()).unwrap();
        let mut expected = before.clone();
        expected["metadata"]["resourceVersion"] = "17".into();
        assert_eq!(v, expected, "nothing else changed");
    }

    #[test]
    fn frames_events() {
        let f = frame_event(EventType::Added, &[Bytes::from_static(b"{}")]);
        assert_eq!(f.as_ref(), b"{\"type\":\"ADDED\",\"object\":{}}\n");
    }

    #[test]
    fn a_framed_object_keeps_its_json_in_its_event_frame() {
        let k = pods();
        let raw = br#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p1","namespace":"ns","resourceVersion":"5"}}"#;
        let o = Object::parse(&k, &typing(&k), Bytes::copy_from_slice(raw)).unwrap();
        let (framed, frame) = o.framed(EventType::Modified);
        assert_eq!(frame, frame_event(EventType::Modified, &[Bytes::from_static(raw)]));
        assert_eq!(framed.typed_bytes().as_ref(), &raw[..]);
        // The body is a slice of the frame itself, not a copy.
        let inside = frame.as_ptr_range();
        assert!(inside.contains(&framed.body.as_ptr()));
        assert_eq!(framed.header.key.as_str(), "ns/p1");
        // A custom resource, kept whole, too.
        let cr = ResourceKind::new("example.com", "v1", "widgets", "Widget", true, false);
        let raw = br#"{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w","resourceVersion":"9"}}"#;
        let o = Object::parse(&cr, &typing(&cr), Bytes::copy_from_slice(raw)).unwrap();
        let (framed, frame) = o.framed(EventType::Deleted);
        assert_eq!(frame.as_ref(), [&b"{\"type\":\"DELETED\",\"object\":"[..], raw, b"}\n"].concat());
        assert_eq!(framed.typed_bytes().as_ref(), &raw[..]);
        assert!(frame.as_ptr_range().contains(&framed.body.as_ptr()));
        // The memory count: the JSON the object and its event share is counted with the
        // object only; an event whose frame is a copy counts it whole.
        let body = framed.body.len();
        let framed = Arc::new(framed);
        let e = Event::with_frame(EventType::Deleted, Rv(9), framed.clone(), None, frame.clone());
        assert_eq!(e.frame_bytes(), std::mem::size_of::<Event>() + frame.len() - body);
        let copy = Event::new(EventType::Deleted, Rv(9), framed, None);
        assert_eq!(copy.frame_bytes(), std::mem::size_of::<Event>() + frame.len());
    }

    /// A version first encoded for its protobuf watch event keeps its message as the slice of
    /// the event's frame that holds it (one buffer, not a rope and a copy), counted once; the
    /// frame is the one made from the message alone, and the next version's, made from it, too.
    #[test]
    fn a_version_encoded_for_its_watch_event_keeps_its_message_in_the_frame() {
        let k = pods();
        let t = typing(&k);
        let pod = |rv: u32, restarts: u32| {
            let raw = format!(
                r#"{{"metadata":{{"name":"p1","namespace":"ns","resourceVersion":"{rv}","annotations":{{"note":"{}"}}}},"status":{{"containerStatuses":[{{"name":"c","restartCount":{restarts}}}]}}}}"#,
                "a long annotation value, long enough to be shared with the JSON in a rope".repeat(2)
            );
            Arc::new(Object::parse(&k, &t, Bytes::from(raw)).unwrap())
        };
        let (v1, v2, v3) = (pod(5, 0), pod(6, 1), pod(7, 2));
        // The first version read in protobuf by a LIST: a rope sharing its long string.
        let listed = v1.proto_message(false).unwrap().clone();
        assert!(listed.parts().len() > 1 && listed.own_bytes(&v1.body) < listed.len());
        for (now, prev, fresh) in [(&v2, &v1, pod(6, 1)), (&v3, &v2, pod(7, 2))] {
            let e = Event::new(EventType::Modified, now.header.rv, now.clone(), Some(prev.clone()));
            let frame = e.frame_as(Repr::FullProto).unwrap();
            assert_eq!(frame, fresh.proto_watch_event("MODIFIED", Repr::FullProto).unwrap());
            let msg = now.proto_message(false).unwrap();
            assert_eq!(msg.parts().len(), 1, "one buffer");
            assert!(frame.as_ptr_range().contains(&msg.parts()[0].as_ptr()), "a slice of the frame");
            assert_eq!(now.proto_within(&frame), msg.len());
            assert_eq!(
                e.frame_bytes(),
                std::mem::size_of::<Event>() + e.frame.len() + frame.len() - msg.len(),
                "the message is counted with the object only"
            );
            assert_eq!(msg.own_bytes(&now.body), msg.len());
        }
        // A version encoded before its event (a LIST read it first) keeps its rope: the frame
        // is a copy, counted whole.
        let e = Event::new(EventType::Modified, v1.header.rv, v1.clone(), None);
        let frame = e.frame_as(Repr::FullProto).unwrap();
        assert_eq!(v1.proto_message(false), Some(&listed));
        assert_eq!(v1.proto_within(&frame), 0);
        assert_eq!(e.frame_bytes(), std::mem::size_of::<Event>() + e.frame.len() + frame.len());
    }

    /// Every cached object carries these (docs/performance.md, "Memory per cached object"):
    /// a field added here costs its size 100 000 times over in a large cache.
    #[test]
    fn an_object_stays_small_until_its_other_forms_are_read() {
        assert!(std::mem::size_of::<Object>() <= 88, "{}", std::mem::size_of::<Object>());
        assert!(std::mem::size_of::<Header>() <= 40, "{}", std::mem::size_of::<Header>());
        let k = pods();
        let raw = br#"{"metadata":{"name":"p1","namespace":"ns","uid":"6a3f5e3c-93a1-4a7e-9f0e-2b7d0c1e4f55","resourceVersion":"3","labels":{"app":"a"}}}"#;
        let o = Object::parse(&k, &typing(&k), Bytes::from_static(raw)).unwrap();
        assert!(o.forms.get().is_none(), "a JSON read makes no other form");
        let plain = o.kept_bytes();
        assert_eq!(o.header.uid(), "6a3f5e3c-93a1-4a7e-9f0e-2b7d0c1e4f55");
        o.metadata_bytes();
        assert!(o.forms.get().is_some());
        assert!(o.kept_bytes() > plain + std::mem::size_of::<Forms>());
    }

    #[test]
    fn rejects_objects_without_name() {
        let k = pods();
        assert!(Object::parse(&k, &typing(&k), Bytes::from_static(br#"{"metadata":{}}"#)).is_err());
        assert!(Object::parse(&k, &typing(&k), Bytes::from_static(b"not json")).is_err());
    }
}
