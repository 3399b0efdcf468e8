//! Content negotiation for cached reads: which representation the apiserver would answer an
//! `Accept` header with, and whether the cache can give the client that representation in
//! JSON (DESIGN §3, issue 17).
//!
//! The apiserver (`negotiation.NegotiateMediaTypeOptions`) walks the clauses of
//! `goautoneg.ParseAccept` (sorted by q, then by specificity; stable for the handful of
//! clauses clients send), skips those whose media type or parameters it does not serve, and
//! answers with the first one left. Its representation (the object itself, or
//! `as=PartialObjectMetadata[List];g=meta.k8s.io;v=v1`, or a Table) is what the client wants;
//! the cache serves it when the first JSON clause the client accepts asks for the same one
//! (protobuf- or YAML-first clients that also accept it in JSON get JSON, as before). Anything
//! else (Table, v1beta1, protobuf only, unknown parameters) is forwarded, which is exact.
//!
//! Pure; called by `classify`, tested with a table.

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
    /// YAML or protobuf: the apiserver can, the cache cannot.
    OtherSupported,
    /// Not a type the apiserver serves: the clause is skipped.
    Unsupported,
}

struct Clause {
    media: Media,
    wanted: Wanted,
    q: f32,
    /// 0 for `type/subtype`, 1 for `type/*`, 2 for `*/*` (goautoneg's tie-break).
    wildcards: u8,
}

fn parse(range: &str) -> Option<Clause> {
    let mut it = range.split(';').map(str::trim);
    let media = it.next()?.to_ascii_lowercase();
    if media.is_empty() {
        return None;
    }
    let (ty, sub) = media.split_once('/').unwrap_or((media.as_str(), ""));
    let wildcards = match (ty, sub) {
        ("*", _) => 2,
        (_, "*") => 1,
        _ => 0,
    };
    let media = match media.as_str() {
        "application/json" | "application/*" | "*/*" => Media::Json,
        "application/yaml" | "application/vnd.kubernetes.protobuf" => Media::OtherSupported,
        _ => Media::Unsupported,
    };
    let (mut as_, mut g, mut v, mut q, mut other) = (None, None, None, 1.0f32, false);
    for p in it {
        let (k, val) = p.split_once('=').unwrap_or((p, ""));
        let val = val.trim().trim_matches('"');
        match k.trim().to_ascii_lowercase().as_str() {
            "as" => as_ = Some(val.to_owned()),
            "g" => g = Some(val.to_owned()),
            "v" => v = Some(val.to_owned()),
            "q" => q = val.parse::<f32>().unwrap_or(0.0),
            "" => {}
            _ => other = true,
        }
    }
    let meta_v1 = g.as_deref() == Some("meta.k8s.io") && v.as_deref() == Some("v1");
    let wanted = match (as_.as_deref(), other) {
        (_, true) => Wanted::Other,
        (None, false) if g.is_none() && v.is_none() => Wanted::Object,
        (Some("PartialObjectMetadata"), false) if meta_v1 => Wanted::MetadataObject,
        (Some("PartialObjectMetadataList"), false) if meta_v1 => Wanted::MetadataList,
        _ => Wanted::Other,
    };
    Some(Clause { media, wanted, q, wildcards })
}

/// The representation the apiserver would answer `accept` with, if the cache can give it in
/// JSON; `None` if the request must go upstream. An absent or empty header is JSON.
pub fn negotiate(accept: Option<&str>) -> Option<Wanted> {
    let Some(accept) = accept.map(str::trim).filter(|a| !a.is_empty()) else {
        return Some(Wanted::Object);
    };
    let mut clauses: Vec<Clause> = accept.split(',').filter_map(parse).collect();
    // Stable: equal clauses keep the client's order.
    clauses.sort_by(|a, b| b.q.total_cmp(&a.q).then(a.wildcards.cmp(&b.wildcards)));
    // q=0 means "not acceptable" (RFC 9110); the cache never relies on such a clause.
    let usable = || clauses.iter().filter(|c| c.q > 0.0 && c.media != Media::Unsupported);
    let first = usable().next()?;
    let json = usable().find(|c| c.media == Media::Json)?;
    (json.wanted == first.wanted && json.wanted != Wanted::Other).then_some(json.wanted)
}

/// The representation the cache serves a request in, given what negotiation found and the
/// request's verb; `None` when only the apiserver can answer (e.g. a LIST asked for as
/// PartialObjectMetadata gets the apiserver's 406, a watch asked for as a list gets objects).
/// Built-in kinds and custom resources alike (a custom resource's metadata is re-ordered as
/// `ObjectMeta` by `metadata_only::custom_object`).
pub fn repr_for(wanted: Wanted, is_list: bool) -> Option<Repr> {
    match (wanted, is_list) {
        (Wanted::Object, _) => Some(Repr::Full),
        (Wanted::MetadataObject, false) | (Wanted::MetadataList, true) => Some(Repr::Metadata),
        _ => None,
    }
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
        let cases: &[(&str, Option<Wanted>)] = &[
            ("", Some(Wanted::Object)),
            ("application/json", Some(Wanted::Object)),
            ("*/*", Some(Wanted::Object)),
            ("application/vnd.kubernetes.protobuf,application/json", Some(Wanted::Object)),
            ("application/vnd.kubernetes.protobuf, */*", Some(Wanted::Object)),
            ("application/yaml,application/json", Some(Wanted::Object)),
            ("application/vnd.kubernetes.protobuf", None),
            ("text/html", None),
            ("text/html, application/json", Some(Wanted::Object)),
            (META, Some(Wanted::MetadataObject)),
            (META_LIST, Some(Wanted::MetadataList)),
            // client-go's metadata client (the garbage collector, the quota controller).
            (&format!("{pb_meta_list},{META_LIST},application/json"), Some(Wanted::MetadataList)),
            // It wants metadata; its only JSON clause is the whole object: the apiserver's
            // protobuf metadata is not what the cache can give.
            (&format!("{pb_meta_list},application/json"), None),
            // q-values order the clauses (recorded: plain JSON wins over metadata at q=0.5).
            (&format!("{META_LIST};q=0.5,application/json"), Some(Wanted::Object)),
            (&format!("application/json;q=0.5,{META_LIST}"), Some(Wanted::MetadataList)),
            ("application/json;q=0", None),
            // Table (kubectl), v1beta1, no g/v, unknown parameters: upstream.
            ("application/json;as=Table;v=v1;g=meta.k8s.io,application/json", None),
            ("application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1beta1", None),
            ("application/json;as=PartialObjectMetadataList", None),
            (&format!("{META_LIST};sv=v1"), None),
            ("application/json;g=meta.k8s.io;v=v1", None),
        ];
        for (accept, want) in cases {
            assert_eq!(negotiate(Some(accept)), *want, "Accept: {accept}");
        }
    }

    #[test]
    fn verbs_and_kinds() {
        assert_eq!(repr_for(Wanted::MetadataList, true), Some(Repr::Metadata));
        assert_eq!(repr_for(Wanted::MetadataObject, false), Some(Repr::Metadata));
        // The apiserver's 406s (recorded) and its watch quirk stay its own.
        assert_eq!(repr_for(Wanted::MetadataObject, true), None);
        assert_eq!(repr_for(Wanted::MetadataList, false), None);
        assert_eq!(repr_for(Wanted::Object, true), Some(Repr::Full));
    }
}
