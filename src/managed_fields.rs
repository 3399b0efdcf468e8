//! The managedFields opt-out (KEP-5958, issue 34 item 2): an object's JSON as a 1.38 apiserver
//! with `ManagedFieldsOptOut` encodes it for `Accept: …;drop=metadata.managedFields`, made from
//! the bytes the cache holds.
//!
//! The apiserver clears `metadata.managedFields` on the object it is about to encode and
//! encodes the rest as always (`responsewriters.withoutManagedFields`, JSON, protobuf and CBOR
//! alike). `ObjectMeta.ManagedFields` is `omitempty`, so in JSON that is the object as received
//! with the `"managedFields":[…]` member and its separating comma cut out, every other byte
//! kept: typed objects (managedFields is the last member of `ObjectMeta`) and unstructured
//! custom resources (sorted keys) alike. The protobuf and metadata-only forms follow from those
//! bytes (`resource::Object::without_managed_fields`).
//!
//! Pure byte work; called by `resource` (once per object version, lazily).

use std::ops::Range;

use serde::Deserialize;

use crate::proto::transcode::RawMembers;
use serde_json::value::RawValue;

#[derive(Deserialize)]
struct WithMetadata<'a> {
    #[serde(borrow)]
    metadata: Option<&'a RawValue>,
}

/// Where a RawValue borrowed from `whole` starts in it.
fn offset_in(whole: &[u8], raw: &RawValue) -> usize {
    raw.get().as_ptr() as usize - whole.as_ptr() as usize
}

fn skip_ws_back(s: &[u8], mut end: usize) -> usize {
    while end > 0 && s[end - 1].is_ascii_whitespace() {
        end -= 1;
    }
    end
}

fn skip_ws(s: &[u8], mut i: usize) -> usize {
    while i < s.len() && s[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

/// The bytes to cut from the JSON object `whole` to leave it without `metadata.managedFields`
/// (the member and one separating comma); `None` if it has none (or is not an object with a
/// `metadata` object). `whole` was parsed once already, so it is valid JSON.
pub fn cut(whole: &[u8]) -> Option<Range<usize>> {
    let meta = serde_json::from_slice::<WithMetadata>(whole).ok()?.metadata?;
    let meta_at = offset_in(whole, meta);
    let members = members(meta.get())?;
    let (_, value) = members.iter().find(|(k, _)| k == "managedFields")?;
    let value_start = meta_at + offset_in(meta.get().as_bytes(), value);
    let value_end = value_start + value.get().len();
    // Back from the value over `:` and the key `"managedFields"` (the apiserver writes it so).
    let colon = skip_ws_back(whole, value_start);
    if colon == 0 || whole[colon - 1] != b':' {
        return None;
    }
    let key_end = skip_ws_back(whole, colon - 1);
    let key = br#""managedFields""#;
    let key_start = key_end.checked_sub(key.len())?;
    if &whole[key_start..key_end] != key {
        return None;
    }
    let before = skip_ws_back(whole, key_start);
    match whole.get(before.checked_sub(1)?)? {
        // Not the first member: cut from the comma before it.
        b',' => Some(before - 1..value_end),
        // The first member: cut through the comma after it, if any.
        b'{' => {
            let after = skip_ws(whole, value_end);
            match whole.get(after)? {
                b',' => Some(key_start..skip_ws(whole, after + 1)),
                b'}' => Some(key_start..value_end),
                _ => None,
            }
        }
        _ => None,
    }
}

/// The members of a JSON object, values kept raw (keys unescaped).
fn members(object: &str) -> Option<Vec<(std::borrow::Cow<'_, str>, &RawValue)>> {
    serde_json::from_str::<RawMembers>(object).ok().map(|m| m.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strip(s: &str) -> String {
        match cut(s.as_bytes()) {
            Some(r) => format!("{}{}", &s[..r.start], &s[r.end..]),
            None => s.to_owned(),
        }
    }

    #[test]
    fn the_member_and_one_comma_go() {
        let mf = r#""managedFields":[{"manager":"kubectl","fieldsV1":{"f:metadata":{"f:labels":{}}}}]"#;
        // Typed: the last member of ObjectMeta.
        assert_eq!(
            strip(&format!(r#"{{"metadata":{{"name":"a","labels":{{"x":"y"}},{mf}}},"spec":{{}}}}"#)),
            r#"{"metadata":{"name":"a","labels":{"x":"y"}},"spec":{}}"#
        );
        // Unstructured: keys sorted, so in the middle.
        assert_eq!(
            strip(&format!(r#"{{"apiVersion":"v1","metadata":{{"generation":1,{mf},"name":"a"}}}}"#)),
            r#"{"apiVersion":"v1","metadata":{"generation":1,"name":"a"}}"#
        );
        // First and only members.
        assert_eq!(strip(&format!(r#"{{"metadata":{{{mf},"name":"a"}}}}"#)), r#"{"metadata":{"name":"a"}}"#);
        assert_eq!(strip(&format!(r#"{{"metadata":{{{mf}}}}}"#)), r#"{"metadata":{}}"#);
        // Whitespace (not the apiserver's, but JSON): what surrounds the cut stays.
        assert_eq!(
            strip("{ \"metadata\" : { \"name\" : \"a\" ,\n \"managedFields\" : [ ] } }"),
            "{ \"metadata\" : { \"name\" : \"a\"  } }"
        );
    }

    #[test]
    fn only_metadata_managed_fields_goes() {
        // Nothing to cut: none, or a managedFields elsewhere (in spec, in an annotation's text).
        for s in [
            r#"{"metadata":{"name":"a"}}"#,
            r#"{"metadata":{"name":"a","annotations":{"managedFields":"[1]"}},"spec":{"managedFields":[1]}}"#,
            r#"{"spec":{"metadata":{"managedFields":[1]}}}"#,
            r#"{"metadata":"x"}"#,
            r#"[1]"#,
        ] {
            assert_eq!(cut(s.as_bytes()), None, "{s}");
        }
        // A key written with an escape is the same key; the apiserver never writes one, and
        // what cannot be cut exactly is left alone rather than cut wrong.
        assert_eq!(cut(br#"{"metadata":{"name":"a","managed\u0046ields":[]}}"#), None);
        // Strings holding quotes, braces and the key itself do not confuse the cut.
        let s = r#"{"metadata":{"annotations":{"k":"\"managedFields\":[}{"},"managedFields":[{"m":"\"]}"}]},"data":{"a":"b"}}"#;
        assert_eq!(
            strip(s),
            r#"{"metadata":{"annotations":{"k":"\"managedFields\":[}{"}},"data":{"a":"b"}}"#
        );
    }
}
