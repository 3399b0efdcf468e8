//! Integration: a new version encoded from its predecessor's encoding (`proto::after`, what a
//! protobuf watch event costs when the previous version was read in protobuf) is byte for byte
//! the fresh encoding, for every kind kube-apiserver 1.28.7 served in the recording
//! (`v1.28.7-raw/protobuf.json`), with edits at the top, inside metadata, in the status and in
//! nested lists; and shares its long strings with its own bytes only.

use bytes::Bytes;
use kube_watchcache::proto::after::{object_after, Prior};
use kube_watchcache::proto::schema::schema;
use kube_watchcache::proto::splice::object_splice;
use kube_watchcache::proto::transcode::object_shared;
use kube_watchcache::proto::window::object_edit;
use kube_watchcache::proto::NEWEST;
use serde_json::Value;

/// An object the apiserver sent (a GET of the recording whose kind the schema has).
pub(crate) struct Recorded {
    pub(crate) path: Value,
    pub(crate) obj: Value,
    pub(crate) msg: usize,
    /// Its JSON as sent, compact.
    pub(crate) base: String,
}

pub(crate) fn recorded() -> Vec<Recorded> {
    let p = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/recordings/v1.28.7-raw/protobuf.json");
    let rec: Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    let mut out = Vec::new();
    for entry in rec["gets"].as_array().unwrap() {
        let Some(body) = entry["json"]["body"].as_str().filter(|_| entry["json"]["status"] == 200) else {
            continue;
        };
        let obj: Value = serde_json::from_str(body).unwrap();
        let api = obj["apiVersion"].as_str().unwrap();
        let (group, version) = api.split_once('/').unwrap_or(("", api));
        let Some(msg) = schema().kind(group, version, obj["kind"].as_str().unwrap()) else { continue };
        out.push(Recorded { path: entry["path"].clone(), obj, msg, base: body.trim_end().to_owned() });
    }
    out
}

/// Textual edits of a compact object (the rest of its bytes untouched).
fn edits(json: &str) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(at) = json.find(r#""resourceVersion":""#) {
        let v = at + r#""resourceVersion":""#.len();
        out.push(format!("{}9{}", &json[..v], &json[v..]));
    }
    out.push(json.replacen(r#""metadata":{"#, r#""metadata":{"labels":{"edited":"yes"},"#, 1));
    out.push(json.replacen(r#""metadata":{"#, r#""metadata":{"annotations":{"a":"a long value that is long enough to be shared with the stored bytes of the object"},"#, 1));
    out.push(json.replacen(r#""status":{"#, r#""status":{"phase":"Edited","#, 1));
    out.push(json.replacen(r#""name":""#, r#""name":"x"#, 2));
    out.push(json.replacen(r#""type":""#, r#""type":"Edited"#, 1));
    out.push(json.replacen(r#""metadata":{"#, r#""metadata":{"unknownMember":1,"#, 1));
    out.retain(|e| e != json);
    out
}

#[test]
fn a_version_encoded_from_its_predecessors_encoding_is_the_fresh_encoding() {
    let (mut compared, mut reused) = (0, 0);
    for Recorded { path, msg, base, .. } in recorded() {
        for new in edits(&base) {
            for (old, new) in [(base.clone(), new.clone()), (new, base.clone())] {
                let (old_b, new_b) = (Bytes::from(old), Bytes::from(new));
                let Ok(prior) = object_shared(schema(), msg, &old_b, &old_b, 0, NEWEST) else { continue };
                let p = Prior { json: &old_b, stored: &old_b, prefix_len: 0, rope: &prior };
                let fresh = object_shared(schema(), msg, &new_b, &new_b, 0, NEWEST);
                let after = object_after(schema(), msg, &new_b, &new_b, 0, NEWEST, &p);
                let what = format!("{path} {}", String::from_utf8_lossy(&new_b));
                match (fresh, after) {
                    (Ok(f), Ok(a)) => {
                        assert_eq!(a.to_vec(), f.to_vec(), "{what}");
                        assert_eq!(a.own_bytes(&new_b), f.own_bytes(&new_b), "{what}");
                        let theirs = old_b.as_ptr_range();
                        assert!(a.parts().iter().all(|x| !theirs.contains(&x.as_ptr())), "{what}");
                        reused += 1;
                    }
                    (Err(_), Err(_)) => {}
                    (f, a) => panic!("{what}: fresh {f:?}, after {a:?}"),
                }
                compared += 1;
            }
        }
    }
    assert!(compared > 200 && reused > 150, "{compared} compared, {reused} encoded");
}

/// The same versions given as the cache stores them (the body after `{"kind":…,"apiVersion":…,`),
/// encoded by walking both texts from their ends (`proto::window`) and by splicing new scalars
/// into the old encoding (`proto::splice`): whenever either gives an encoding, it is the fresh
/// one, byte for byte and in what it shares; the walk gives one for most.
#[test]
fn a_version_walked_against_its_predecessor_is_the_fresh_encoding() {
    let (mut compared, mut walked, mut spliced) = (0, 0, 0);
    for Recorded { path, obj, msg, base } in recorded() {
        // The typed prefix as the apiserver writes it: kind, then apiVersion.
        let prefix = format!(r#"{{"kind":{},"apiVersion":{},"#, obj["kind"], obj["apiVersion"]);
        assert!(base.starts_with(&prefix), "{prefix}");
        let mut versions = edits(&base);
        versions.push(base.replacen(r#""metadata":{"#, r#""metadata":{"generation":7,"#, 1));
        let body = &base[prefix.len()..];
        versions.push(format!("{prefix}{}", body.replacen(r#"","#, r#"-edited","#, 3)));
        for new in versions {
            for (old, new) in [(base.clone(), new.clone()), (new, base.clone())] {
                let (old_b, new_b) = (Bytes::from(old), Bytes::from(new));
                let (old_body, new_body) = (old_b.slice(prefix.len()..), new_b.slice(prefix.len()..));
                let Ok(prior) = object_shared(schema(), msg, &old_b, &old_body, prefix.len(), NEWEST) else {
                    continue;
                };
                let fresh = object_shared(schema(), msg, &new_b, &new_body, prefix.len(), NEWEST);
                let edit = object_edit(schema(), msg, &new_body, &old_body, NEWEST, &prior);
                let splice = object_splice(schema(), msg, &new_body, &old_body, NEWEST, &prior);
                let what = format!("{path} {}", String::from_utf8_lossy(&new_b));
                compared += 1;
                walked += usize::from(edit.is_some());
                spliced += usize::from(splice.is_some());
                // Giving up is allowed (then `proto::after` reads the objects whole).
                let fresh = || {
                    fresh
                        .as_ref()
                        .unwrap_or_else(|err| panic!("{what}: encoded what a fresh encoding refuses: {err}"))
                };
                if let Some(e) = edit {
                    let f = fresh();
                    assert_eq!(e.to_vec(), f.to_vec(), "{what}");
                    assert_eq!(e.own_bytes(&new_body), f.own_bytes(&new_body), "{what}");
                    let theirs = old_b.as_ptr_range();
                    assert!(e.parts().iter().all(|x| !theirs.contains(&x.as_ptr())), "{what}");
                }
                // A splice is pieces copied into the watch frame: its bytes are what counts.
                if let Some(e) = splice {
                    assert_eq!((e.to_vec(), e.len()), (fresh().to_vec(), fresh().len()), "{what}");
                }
            }
        }
    }
    assert!(compared > 200 && walked * 10 > compared * 7, "{compared} compared, {walked} walked");
    // The resourceVersion changed and strings edited in place are scalars: spliced.
    assert!(spliced * 10 > compared * 2, "{compared} compared, {spliced} spliced");
    eprintln!("{compared} compared, {walked} walked, {spliced} spliced");
}
