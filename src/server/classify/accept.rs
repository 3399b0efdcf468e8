//! Content negotiation for cached reads: which representation the apiserver would answer an
//! `Accept` header with, and whether the cache can give the client that representation, in
//! JSON or in protobuf (docs/design.md §3, issue 17).
//!
//! The apiserver (`negotiation.NegotiateMediaTypeOptions`) walks the clauses of
//! `goautoneg.ParseAccept` (`autoneg`: its order and its quirks; a header whose order this
//! port cannot vouch for is forwarded), skips those whose media type or parameters it does not serve, and
//! answers with the first one left. Its representation (the object itself, or
//! `as=PartialObjectMetadata[List];g=meta.k8s.io;v=v1`, or a Table) and its encoding are what
//! the client gets: JSON and protobuf from the cache (protobuf clauses are skipped for whole
//! custom resources, which have no protobuf — the apiserver's `StandardSerializers` — but not
//! for their metadata). Anything else (Table, v1beta1, YAML first, unknown parameters) is
//! forwarded, which is exact: a YAML-first client gets YAML from the apiserver (a WATCH its
//! 406: YAML has no stream serializer), whatever it accepts after it.
//!
//! `drop=metadata.managedFields` (KEP-5958, a 1.38 apiserver with `ManagedFieldsOptOut`) is
//! served as the same representation without `metadata.managedFields`, in JSON and protobuf,
//! objects and metadata alike. The apiserver accepts a `drop` whose `+`-separated targets it
//! all knows, each once; any other `drop` makes its clause unacceptable, skipped like an
//! unknown media type (the next clause answers; none left is a 406, which the cache leaves to
//! the upstream).
//!
//! Errors are negotiated apart (`error_encoding`), as the apiserver's `ErrorNegotiated` does:
//! without transforms, so a metadata-only protobuf client gets its Status in JSON; a client
//! whose errors would be YAML or raw JSON is forwarded (`classify`).
//!
//! Pure; called by `classify`, tested with a table.

use super::autoneg::{self, ErrorEncoding};
use crate::metadata_only::Repr;

/// What a clause asks for, as far as the cache is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wanted {
    /// The objects themselves.
    Object,
    /// `as=PartialObjectMetadata;g=meta.k8s.io;v=v1` (GET and WATCH).
    MetadataObject,
    /// `as=PartialObjectMetadataList;g=meta.k8s.io;v=v1` (LIST).
    MetadataList,
    /// Anything the cache does not produce (Table, v1beta1, other parameters).
    Other,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Media {
    /// `application/json`, `application/*`, `*/*`: the cache can answer it.
    Json,
    /// `application/vnd.kubernetes.protobuf`.
    Protobuf,
    /// YAML: the apiserver can, the cache cannot.
    OtherSupported,
    /// Not a type the apiserver serves: the clause is skipped.
    Unsupported,
}

struct Clause {
    media: Media,
    wanted: Wanted,
    /// `drop=metadata.managedFields`.
    lean: bool,
    /// 0 for `type/subtype`, 1 for `type/*`, 2 for `*/*`.
    wildcards: u8,
}

/// What the cache makes of one of goautoneg's clauses (exact names and values: the
/// apiserver lowercases nothing and keeps quotes).
fn clause(c: &autoneg::Clause<'_>) -> Clause {
    let wildcards = match (c.ty, c.sub) {
        ("*", _) => 2,
        (_, "*") => 1,
        _ => 0,
    };
    let media = match (c.ty, c.sub) {
        ("application", "json" | "*") | ("*", "*") => Media::Json,
        ("application", "vnd.kubernetes.protobuf") => Media::Protobuf,
        ("application", "yaml") => Media::OtherSupported,
        _ => Media::Unsupported,
    };
    let skipped = Clause { media: Media::Unsupported, wanted: Wanted::Other, lean: false, wildcards };
    let (mut as_, mut g, mut v, mut other) = (None, None, None, false);
    let mut stream = false;
    let mut lean = false;
    for &(k, val) in &c.params {
        match k {
            "as" => as_ = Some(val),
            "g" => g = Some(val),
            "v" => v = Some(val),
            // Recorded: `vnd.kubernetes.protobuf;stream=watch` is served as protobuf (LIST and
            // GET included); JSON's is the apiserver's to judge. Another value makes the
            // apiserver skip the clause.
            "stream" if val == "watch" => stream = true,
            "stream" if val.is_empty() => {}
            "stream" => return skipped,
            // An unknown, repeated or empty target: the apiserver skips the clause.
            "drop" => match drop_targets(val) {
                Some(l) => lean = l,
                None => return skipped,
            },
            _ => other = true,
        }
    }
    let meta_v1 = g == Some("meta.k8s.io") && v == Some("v1");
    let other = other || (stream && media != Media::Protobuf);
    let wanted = match (as_, other) {
        (_, true) => Wanted::Other,
        (None, false) if g.is_none() && v.is_none() => Wanted::Object,
        (Some("PartialObjectMetadata"), false) if meta_v1 => Wanted::MetadataObject,
        (Some("PartialObjectMetadataList"), false) if meta_v1 => Wanted::MetadataList,
        _ => Wanted::Other,
    };
    Clause { media, wanted, lean, wildcards }
}

/// The fields a 1.38 apiserver can drop (`drop=a+b`).
const DROPPABLE: &[&str] = &["metadata.managedFields"];

/// Whether a `drop` value asks for managedFields to be left out; `None` if the apiserver
/// refuses the value (a target it does not know, one named twice, an empty one).
fn drop_targets(value: &str) -> Option<bool> {
    let mut seen: Vec<&str> = Vec::new();
    for t in value.split('+') {
        if !DROPPABLE.contains(&t) || seen.contains(&t) {
            return None;
        }
        seen.push(t);
    }
    Some(seen.contains(&"metadata.managedFields"))
}

/// The clauses the apiserver would consider, in its order; `None` when that order is not
/// surely Go's (`autoneg::Accept::exact`).
fn clauses(accept: &str) -> Option<Vec<Clause>> {
    let parsed = autoneg::parse(accept);
    if !parsed.exact {
        return None;
    }
    Some(parsed.clauses.iter().map(clause).filter(|c| c.media != Media::Unsupported).collect())
}

/// What negotiation chose: the representation, protobuf or JSON, managedFields dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Negotiated {
    pub wanted: Wanted,
    pub proto: bool,
    /// `drop=metadata.managedFields`.
    pub lean: bool,
}

/// The representation the apiserver would answer `accept` with for a resource (`builtin`:
/// not a custom resource), whether in protobuf and whether without managedFields, if the
/// cache can give it; `None` if the request must go upstream. An absent or empty header is
/// JSON.
pub fn negotiate(accept: Option<&str>, builtin: bool) -> Option<Negotiated> {
    let Some(accept) = accept.map(str::trim).filter(|a| !a.is_empty()) else {
        return Some(Negotiated { wanted: Wanted::Object, proto: false, lean: false });
    };
    let clauses = clauses(accept)?;
    // A custom resource has no protobuf of its own; its PartialObjectMetadata has.
    let usable =
        || clauses.iter().filter(|c| c.media != Media::Protobuf || builtin || c.wanted != Wanted::Object);
    let first = usable().next()?;
    // Recorded: `application/*` alone is a 406 for a built-in kind (200 JSON for a custom
    // resource); the apiserver answers it.
    if first.wanted == Wanted::Other || (builtin && first.media == Media::Json && first.wildcards == 1) {
        return None;
    }
    let chosen = |c: &Clause, proto| Negotiated { wanted: c.wanted, proto, lean: c.lean };
    match first.media {
        Media::Json => Some(chosen(first, false)),
        Media::Protobuf => Some(chosen(first, true)),
        // YAML first: the apiserver's YAML (or, for a WATCH, its 406).
        _ => None,
    }
}

/// Whether some clause of `accept` asks for `drop=metadata.managedFields` (with a value the
/// apiserver takes), for the metric of such requests whatever answers them.
pub fn asks_to_drop_managed_fields(accept: Option<&str>) -> bool {
    accept.and_then(clauses).is_some_and(|cs| cs.iter().any(|c| c.lean))
}

/// How the apiserver would write an error `Status` for `accept` (`autoneg::error_encoding`:
/// its `ErrorNegotiated`, without transforms, so a metadata-only protobuf client gets its
/// Status in JSON). An absent header is JSON.
pub fn error_encoding(accept: Option<&str>) -> ErrorEncoding {
    autoneg::error_encoding(accept.map(str::trim).unwrap_or(""))
}

/// [`error_encoding`] when the proxy can write it as the apiserver would: not for a YAML
/// client, nor for a header whose order is not surely Go's (`autoneg::Accept::exact`); those
/// requests are the apiserver's to answer.
pub fn error_encoding_known(accept: Option<&str>) -> Option<ErrorEncoding> {
    if accept.is_some_and(|a| !autoneg::parse(a.trim()).exact) {
        return None;
    }
    Some(error_encoding(accept)).filter(|e| *e != ErrorEncoding::Yaml)
}

/// Whether the apiserver would send an error `Status` for `accept` in protobuf.
pub fn error_in_proto(accept: Option<&str>) -> bool {
    error_encoding(accept) == ErrorEncoding::Protobuf
}

/// The representation the cache serves a request in, given what negotiation found and the
/// request's verb; `None` when only the apiserver can answer (e.g. a LIST asked for as
/// PartialObjectMetadata gets the apiserver's 406, a watch asked for as a list gets objects).
/// Built-in kinds and custom resources alike (a custom resource's metadata is re-ordered as
/// `ObjectMeta` by `metadata_only::custom_object`).
pub fn repr_for(n: Negotiated, is_list: bool) -> Option<Repr> {
    let repr = match (n.wanted, is_list) {
        (Wanted::Object, _) => Repr::Full,
        (Wanted::MetadataObject, false) | (Wanted::MetadataList, true) => Repr::Metadata,
        _ => return None,
    };
    Some(repr.with_proto(n.proto).lean(n.lean))
}

#[cfg(test)]
mod tests {
    use super::*;

    const META: &str = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";
    const META_LIST: &str = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";

    #[test]
    fn negotiation_table() {
        let pb_meta_list =
            "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";
        const J: bool = false;
        const P: bool = true;
        let cases: &[(&str, Option<(Wanted, bool)>)] = &[
            ("", Some((Wanted::Object, J))),
            ("application/json", Some((Wanted::Object, J))),
            ("*/*", Some((Wanted::Object, J))),
            ("application/*", None),
            ("application/vnd.kubernetes.protobuf,application/json", Some((Wanted::Object, P))),
            ("application/vnd.kubernetes.protobuf, */*", Some((Wanted::Object, P))),
            ("application/json, application/vnd.kubernetes.protobuf", Some((Wanted::Object, J))),
            ("application/json;q=0.9, application/vnd.kubernetes.protobuf", Some((Wanted::Object, P))),
            ("application/vnd.kubernetes.protobuf;q=0.5, application/json;q=0.9", Some((Wanted::Object, J))),
            ("application/vnd.kubernetes.protobuf;q=0, application/json", Some((Wanted::Object, J))),
            // YAML first is the apiserver's (YAML, or a WATCH's 406), JSON after it or not.
            ("application/yaml,application/json", None),
            ("application/vnd.kubernetes.protobuf", Some((Wanted::Object, P))),
            // Recorded: the stream parameter of protobuf is served (LIST and GET too); JSON's
            // and other values are the apiserver's to judge.
            ("application/vnd.kubernetes.protobuf;stream=watch", Some((Wanted::Object, P))),
            ("application/json;stream=watch", None),
            ("application/vnd.kubernetes.protobuf;stream=other", None),
            ("text/html", None),
            ("text/html, application/json", Some((Wanted::Object, J))),
            (META, Some((Wanted::MetadataObject, J))),
            (META_LIST, Some((Wanted::MetadataList, J))),
            // client-go's metadata client (the garbage collector, the quota controller).
            (&format!("{pb_meta_list},{META_LIST},application/json"), Some((Wanted::MetadataList, P))),
            (&format!("{pb_meta_list},application/json"), Some((Wanted::MetadataList, P))),
            // q-values order the clauses (recorded: plain JSON wins over metadata at q=0.5).
            (&format!("{META_LIST};q=0.5,application/json"), Some((Wanted::Object, J))),
            (&format!("application/json;q=0.5,{META_LIST}"), Some((Wanted::MetadataList, J))),
            // goautoneg keeps q=0 clauses, and the apiserver serves them.
            ("application/json;q=0", Some((Wanted::Object, J))),
            // goautoneg's order: a concrete type before a wildcard whatever q.
            ("*/*, application/vnd.kubernetes.protobuf;q=0.5", Some((Wanted::Object, P))),
            ("application/*;q=0.9, application/vnd.kubernetes.protobuf;q=0.1", Some((Wanted::Object, P))),
            // Nothing lowercased, values kept as written (quotes too): not what the cache serves.
            ("Application/JSON", None),
            // `Q` is no q-value there but an unknown parameter (left to the apiserver).
            ("application/json;Q=0.5, application/vnd.kubernetes.protobuf", None),
            ("application/json;as=\"PartialObjectMetadata\";g=meta.k8s.io;v=v1", None),
            // A stream value the apiserver does not serve skips its clause.
            ("application/vnd.kubernetes.protobuf;stream=other, application/json", Some((Wanted::Object, J))),
            // More clauses than Go sorts by insertion: the apiserver's.
            (&["application/json"; 13].join(","), None),
            // Table (kubectl), v1beta1, no g/v, unknown parameters: upstream.
            ("application/json;as=Table;v=v1;g=meta.k8s.io,application/json", None),
            ("application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1beta1", None),
            ("application/json;as=PartialObjectMetadataList", None),
            (&format!("{META_LIST};sv=v1"), None),
            ("application/json;g=meta.k8s.io;v=v1", None),
        ];
        for (accept, want) in cases {
            let got = negotiate(Some(accept), true);
            assert_eq!(got.map(|n| (n.wanted, n.proto)), *want, "Accept: {accept}");
            assert!(!got.is_some_and(|n| n.lean), "Accept: {accept}");
        }
    }

    /// KEP-5958 as the 1.38 sources and their tests have it: `drop=metadata.managedFields`
    /// on any clause the cache serves; an unknown, repeated or empty target makes the clause
    /// unacceptable (the next one answers); the response's media type is the clause's.
    #[test]
    fn drop_managed_fields() {
        let pb = "application/vnd.kubernetes.protobuf";
        let d = ";drop=metadata.managedFields";
        const J: bool = false;
        const P: bool = true;
        let n = |wanted, proto, lean| Some(Negotiated { wanted, proto, lean });
        let cases: &[(String, Option<Negotiated>)] = &[
            (format!("application/json{d}"), n(Wanted::Object, J, true)),
            ("application/json; drop=metadata.managedFields".to_owned(), n(Wanted::Object, J, true)),
            (format!("{pb}{d}"), n(Wanted::Object, P, true)),
            (format!("{pb};stream=watch{d}"), n(Wanted::Object, P, true)),
            // client-go with the opt-out: the parameter on every clause.
            (format!("{pb}{d}, application/json{d}"), n(Wanted::Object, P, true)),
            (format!("application/json{d},*/*{d}"), n(Wanted::Object, J, true)),
            // Only the chosen clause's parameter counts.
            (format!("{pb}, application/json{d}"), n(Wanted::Object, P, false)),
            (format!("{pb}{d};q=0.5, application/json"), n(Wanted::Object, J, false)),
            (format!("{META}{d}"), n(Wanted::MetadataObject, J, true)),
            (format!("{META_LIST}{d}"), n(Wanted::MetadataList, J, true)),
            (
                format!("{pb};as=PartialObjectMetadataList;g=meta.k8s.io;v=v1{d},{META_LIST}{d}"),
                n(Wanted::MetadataList, P, true),
            ),
            // The 1.38 integration test: an unsupported value skips its clause.
            ("application/json;drop=spec, application/json".to_owned(), n(Wanted::Object, J, false)),
            (format!("{pb};drop=spec, application/json{d}"), n(Wanted::Object, J, true)),
            (
                format!("application/json;drop=metadata.managedFields+metadata.managedFields, {pb}"),
                n(Wanted::Object, P, false),
            ),
            (
                format!("application/json;drop=spec.x+metadata.managedFields, {pb}"),
                n(Wanted::Object, P, false),
            ),
            // goautoneg drops a parameter without a value: plain JSON.
            (format!("application/json;drop=, {pb}"), n(Wanted::Object, J, false)),
            // No clause left: the apiserver's 406, left to the upstream.
            ("application/json;drop=spec".to_owned(), None),
            // YAML first: the apiserver's.
            (format!("application/yaml{d},application/json{d}"), None),
            (format!("application/yaml{d},application/json"), None),
            // Table is the apiserver's, with or without the parameter.
            (format!("application/json;as=Table;v=v1;g=meta.k8s.io{d}"), None),
        ];
        for (accept, want) in cases {
            assert_eq!(negotiate(Some(accept), true), *want, "Accept: {accept}");
        }
        // A custom resource: JSON only, metadata in protobuf too.
        assert_eq!(
            negotiate(Some(&format!("{pb}{d}, application/json{d}")), false),
            n(Wanted::Object, J, true)
        );
    }

    #[test]
    fn custom_resources_have_protobuf_metadata_only() {
        let pb = "application/vnd.kubernetes.protobuf";
        // Recorded (crd-accept-protobuf.json): protobuf alone is a 406 (upstream answers it),
        // protobuf-first gets JSON.
        let n = |wanted, proto| Some(Negotiated { wanted, proto, lean: false });
        assert_eq!(negotiate(Some(pb), false), None);
        assert_eq!(negotiate(Some(&format!("{pb}, application/json")), false), n(Wanted::Object, false));
        let gc = format!("{pb};as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,{META_LIST},application/json");
        assert_eq!(negotiate(Some(&gc), false), n(Wanted::MetadataList, true));
    }

    #[test]
    fn errors_are_negotiated_without_transforms() {
        let pb = "application/vnd.kubernetes.protobuf";
        assert!(error_in_proto(Some(&format!("{pb}, application/json"))));
        assert!(error_in_proto(Some(pb)));
        assert!(!error_in_proto(Some("application/json")));
        assert!(!error_in_proto(None));
        assert!(!error_in_proto(Some(&format!("{pb};q=0.5, application/json"))));
        // The garbage collector: its protobuf clause asks for a transform; JSON Status.
        let gc = format!("{pb};as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,{META_LIST},application/json");
        assert!(!error_in_proto(Some(&gc)));
    }

    #[test]
    fn verbs_and_kinds() {
        let n = |wanted, proto| Negotiated { wanted, proto, lean: false };
        assert_eq!(repr_for(n(Wanted::MetadataList, false), true), Some(Repr::Metadata));
        assert_eq!(repr_for(n(Wanted::MetadataObject, false), false), Some(Repr::Metadata));
        assert_eq!(repr_for(n(Wanted::MetadataObject, true), false), Some(Repr::MetadataProto));
        // The apiserver's 406s (recorded) and its watch quirk stay its own.
        assert_eq!(repr_for(n(Wanted::MetadataObject, true), true), None);
        assert_eq!(repr_for(n(Wanted::MetadataList, false), false), None);
        assert_eq!(repr_for(n(Wanted::Object, false), true), Some(Repr::Full));
        assert_eq!(repr_for(n(Wanted::Object, true), true), Some(Repr::FullProto));
        // drop=metadata.managedFields: the same representations, lean.
        let lean = |wanted, proto| Negotiated { wanted, proto, lean: true };
        assert_eq!(repr_for(lean(Wanted::Object, false), true), Some(Repr::FullLean));
        assert_eq!(repr_for(lean(Wanted::Object, true), false), Some(Repr::FullProtoLean));
        assert_eq!(repr_for(lean(Wanted::MetadataList, false), true), Some(Repr::MetadataLean));
        assert_eq!(repr_for(lean(Wanted::MetadataObject, true), false), Some(Repr::MetadataProtoLean));
        assert_eq!(repr_for(lean(Wanted::MetadataList, true), false), None);
    }
}
