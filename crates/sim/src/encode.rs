//! JSON encoding the way the apiserver writes it: typed built-in objects with `kind`,
//! `apiVersion`, `metadata` first (metadata members in Go struct order), custom resources with
//! sorted keys, list envelopes, BOOKMARK objects, and the small values objects get on write
//! (uid, RFC 3339 timestamps).
//!
//! Called by `store` (stored object bytes), `read` (list bodies) and `watch` (bookmarks).

use bytes::{BufMut, Bytes, BytesMut};
use serde_json::{Map, Value};

use kube_watchcache::resource::{ResourceKind, Rv};

/// `ObjectMeta` members in the order Go encodes them; others follow, sorted.
const META_ORDER: &[&str] = &[
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
];

/// Top-level members after `metadata`, in the order the built-in types declare them.
const TOP_ORDER: &[&str] = &[
    "involvedObject",
    "reason",
    "message",
    "source",
    "firstTimestamp",
    "lastTimestamp",
    "count",
    "spec",
    "immutable",
    "data",
    "binaryData",
    "stringData",
    "type",
    "status",
];

/// Encodes an object for storage. Built-ins: `{"kind","apiVersion","metadata",…}` in Go order;
/// custom resources: every key sorted (unstructured encoding).
pub fn object(kind: &ResourceKind, v: &Map<String, Value>) -> Vec<u8> {
    if !kind.builtin {
        let mut m = v.clone();
        m.insert("apiVersion".into(), Value::String(kind.api_version()));
        m.insert("kind".into(), Value::String(kind.kind.clone()));
        return serde_json::to_vec(&m).unwrap_or_default();
    }
    let mut out = Vec::with_capacity(512);
    out.extend_from_slice(b"{\"kind\":");
    push_json(&mut out, &Value::String(kind.kind.clone()));
    out.extend_from_slice(b",\"apiVersion\":");
    push_json(&mut out, &Value::String(kind.api_version()));
    if let Some(Value::Object(meta)) = v.get("metadata") {
        out.extend_from_slice(b",\"metadata\":");
        ordered(&mut out, meta, META_ORDER);
    }
    let rest: Map<String, Value> = v
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "kind" | "apiVersion" | "metadata"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (k, val) in ordered_members(&rest, TOP_ORDER) {
        out.push(b',');
        push_json(&mut out, &Value::String(k.clone()));
        out.push(b':');
        push_json(&mut out, val);
    }
    out.push(b'}');
    out
}

fn ordered(out: &mut Vec<u8>, m: &Map<String, Value>, order: &[&str]) {
    out.push(b'{');
    for (i, (k, v)) in ordered_members(m, order).into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        push_json(out, &Value::String(k.clone()));
        out.push(b':');
        push_json(out, v);
    }
    out.push(b'}');
}

fn ordered_members<'a>(m: &'a Map<String, Value>, order: &[&str]) -> Vec<(&'a String, &'a Value)> {
    let mut members: Vec<(&String, &Value)> = m.iter().collect();
    members.sort_by_key(|(k, _)| order.iter().position(|o| o == k).unwrap_or(order.len()));
    members
}

fn push_json(out: &mut Vec<u8>, v: &Value) {
    // Writing to a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, v);
}

/// List metadata and envelope around already-encoded items.
pub struct ListMeta {
    pub rv: Rv,
    pub continue_token: Option<String>,
    pub remaining: Option<u64>,
}

/// The chunks of a list body: envelope, items separated by commas, closing `]}` + `\n`.
pub fn list_chunks(kind: &ResourceKind, meta: &ListMeta, items: Vec<[Bytes; 2]>) -> Vec<Bytes> {
    let mut out = Vec::with_capacity(items.len() * 3 + 2);
    let rv = Value::String(meta.rv.to_string());
    let token = Value::String(meta.continue_token.clone().unwrap_or_default());
    let mut head = Vec::with_capacity(256);
    if kind.builtin {
        head.extend_from_slice(b"{\"kind\":");
        push_json(&mut head, &Value::String(kind.list_kind()));
        head.extend_from_slice(b",\"apiVersion\":");
        push_json(&mut head, &Value::String(kind.api_version()));
        head.extend_from_slice(b",\"metadata\":{\"resourceVersion\":");
        push_json(&mut head, &rv);
        if meta.continue_token.is_some() {
            head.extend_from_slice(b",\"continue\":");
            push_json(&mut head, &token);
        }
        if let Some(n) = meta.remaining {
            head.extend_from_slice(format!(",\"remainingItemCount\":{n}").as_bytes());
        }
        head.extend_from_slice(b"},\"items\":[");
    } else {
        head.extend_from_slice(b"{\"apiVersion\":");
        push_json(&mut head, &Value::String(kind.api_version()));
        head.extend_from_slice(b",\"items\":[");
    }
    out.push(Bytes::from(head));
    for (i, [a, b]) in items.into_iter().enumerate() {
        if i > 0 {
            out.push(Bytes::from_static(b","));
        }
        out.push(a);
        if !b.is_empty() {
            out.push(b);
        }
    }
    if kind.builtin {
        out.push(Bytes::from_static(b"]}\n"));
    } else {
        // Unstructured lists always carry `continue` (possibly empty); keys sorted.
        let mut tail = Vec::with_capacity(128);
        tail.extend_from_slice(b"],\"kind\":");
        push_json(&mut tail, &Value::String(kind.list_kind()));
        tail.extend_from_slice(b",\"metadata\":{\"continue\":");
        push_json(&mut tail, &token);
        if let Some(n) = meta.remaining {
            tail.extend_from_slice(format!(",\"remainingItemCount\":{n}").as_bytes());
        }
        tail.extend_from_slice(b",\"resourceVersion\":");
        push_json(&mut tail, &rv);
        tail.extend_from_slice(b"}}\n");
        out.push(Bytes::from(tail));
    }
    out
}

/// The object of a BOOKMARK event (docs/apiserver-watch-cache.md §3.2, 1.34+ shapes): the kind's empty object with
/// only `metadata.resourceVersion` (and the initial-events-end annotation when `end`).
pub fn bookmark(kind: &ResourceKind, rv: Rv, end: bool) -> Bytes {
    let rv_json = Value::String(rv.to_string());
    let ann = if end { ",\"annotations\":{\"k8s.io/initial-events-end\":\"true\"}" } else { "" };
    let mut out = BytesMut::with_capacity(160);
    if kind.builtin {
        out.put_slice(b"{\"kind\":");
        out.put_slice(Value::String(kind.kind.clone()).to_string().as_bytes());
        out.put_slice(b",\"apiVersion\":");
        out.put_slice(Value::String(kind.api_version()).to_string().as_bytes());
        out.put_slice(format!(",\"metadata\":{{\"resourceVersion\":{rv_json}{ann}}}").as_bytes());
        out.put_slice(zero_fields(kind).as_bytes());
        out.put_slice(b"}");
    } else {
        let ann = if end { "\"annotations\":{\"k8s.io/initial-events-end\":\"true\"}," } else { "" };
        out.put_slice(b"{\"apiVersion\":");
        out.put_slice(Value::String(kind.api_version()).to_string().as_bytes());
        out.put_slice(b",\"kind\":");
        out.put_slice(Value::String(kind.kind.clone()).to_string().as_bytes());
        out.put_slice(format!(",\"metadata\":{{{ann}\"resourceVersion\":{rv_json}}}}}").as_bytes());
    }
    out.freeze()
}

/// The non-omitempty zero members Go emits for an empty object of a built-in kind.
fn zero_fields(kind: &ResourceKind) -> &'static str {
    match (kind.group.as_str(), kind.resource.as_str()) {
        ("", "pods") => ",\"spec\":{\"containers\":null},\"status\":{}",
        ("", "nodes") | ("", "namespaces") => ",\"spec\":{},\"status\":{}",
        ("", "services") => ",\"spec\":{},\"status\":{\"loadBalancer\":{}}",
        ("apps", "deployments") => {
            ",\"spec\":{\"selector\":null,\"template\":{\"metadata\":{},\"spec\":{\"containers\":null}},\"strategy\":{}},\"status\":{}"
        }
        ("batch", "jobs") => ",\"spec\":{\"template\":{\"metadata\":{},\"spec\":{\"containers\":null}}},\"status\":{}",
        ("", "events") => {
            ",\"involvedObject\":{},\"reason\":\"\",\"message\":\"\",\"source\":{},\"firstTimestamp\":null,\"lastTimestamp\":null,\"count\":0,\"type\":\"\",\"eventTime\":null,\"reportingComponent\":\"\",\"reportingInstance\":\"\""
        }
        _ => "",
    }
}

/// A random version-4 UUID, as metadata.uid.
pub fn uid() -> String {
    let n = fastrand::u128(..);
    let n = (n & !(0xF << 76) | (0x4 << 76)) & !(0x3 << 62) | (0x2 << 62);
    let h = format!("{n:032x}");
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

/// The current time as RFC 3339 with second precision (`2026-11-22T00:36:36Z`).
pub fn now_rfc3339() -> String {
    let secs =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    rfc3339(secs)
}

fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn builtin_objects_put_type_and_metadata_first() {
        let k = ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true);
        let v = json!({"data":{"k":"v"},"metadata":{"labels":{"a":"b"},"name":"a","namespace":"ns","resourceVersion":"5"}});
        let b = object(&k, v.as_object().unwrap());
        assert_eq!(
            std::str::from_utf8(&b).unwrap(),
            r#"{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"a","namespace":"ns","resourceVersion":"5","labels":{"a":"b"}},"data":{"k":"v"}}"#
        );
    }

    #[test]
    fn custom_resources_sort_keys() {
        let k = ResourceKind::new("example.com", "v1", "widgets", "Widget", true, false);
        let v = json!({"spec":{"size":1},"metadata":{"name":"w"}});
        let b = object(&k, v.as_object().unwrap());
        assert_eq!(
            std::str::from_utf8(&b).unwrap(),
            r#"{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w"},"spec":{"size":1}}"#
        );
    }

    #[test]
    fn bookmark_shapes() {
        let pods = ResourceKind::new("", "v1", "pods", "Pod", true, true);
        assert_eq!(
            bookmark(&pods, Rv(12746), true).as_ref(),
            br#"{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"12746","annotations":{"k8s.io/initial-events-end":"true"}},"spec":{"containers":null},"status":{}}"#
        );
        let w = ResourceKind::new("example.com", "v1", "widgets", "Widget", true, false);
        let v: Value = serde_json::from_slice(&bookmark(&w, Rv(3), true)).unwrap();
        assert_eq!(v["metadata"]["annotations"]["k8s.io/initial-events-end"], "true");
        assert_eq!(v["kind"], "Widget");
    }

    #[test]
    fn crd_list_envelope_has_sorted_keys_and_empty_continue() {
        let w = ResourceKind::new("example.com", "v1", "widgets", "Widget", true, false);
        let meta = ListMeta { rv: Rv(9), continue_token: None, remaining: None };
        let body: Vec<u8> = list_chunks(&w, &meta, vec![]).concat();
        assert_eq!(
            std::str::from_utf8(&body).unwrap(),
            "{\"apiVersion\":\"example.com/v1\",\"items\":[],\"kind\":\"WidgetList\",\"metadata\":{\"continue\":\"\",\"resourceVersion\":\"9\"}}\n"
        );
    }

    #[test]
    fn dates_and_uids() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_795_307_796), "2026-11-22T00:36:36Z");
        let u = uid();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
    }
}
