//! The managedFields opt-out (`Accept: …;drop=metadata.managedFields`, KEP-5958, issue 34
//! item 2) on recorded objects: every built-in kind of `tests/recordings/v1.28.7-raw/protobuf.json`
//! (a real kube-apiserver 1.28.7, objects written by clients and controllers, most with
//! managedFields) goes into a cache, and its lean lists and GETs must be the recorded answers
//! without managedFields:
//!
//! - in JSON, the recorded objects with their `metadata.managedFields` member taken out and
//!   every other byte as recorded (checked as values, and by length);
//! - in protobuf, whole and metadata-only, the recorded bytes with `ObjectMeta` field 17
//!   (managedFields) taken out of each object by the rewriting written here. Go's marshaller
//!   writes a message's fields in order and nothing for an empty repeated field, so that is,
//!   byte for byte, what an apiserver that clears the field before encoding sends (the 1.38
//!   `ManagedFieldsOptOut` encoders do).
//!
//! And the stripping is done once per object version: the lean object is shared.

use crate::common;

use std::path::PathBuf;

use base64::Engine;
use bytes::Bytes;
use common::pb::{lean_envelope, lean_list, lean_object};
use common::recorded::{group_version, RawList};
use kube_watchcache::cache::{self, CacheOptions, Filter};
use kube_watchcache::metadata_only::Repr;
use kube_watchcache::resource::{ResourceKind, Rv};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

/// Objects never served in protobuf (their bytes cannot be proven).
use crate::protobuf::forwarded;

fn recording() -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/recordings/v1.28.7-raw/protobuf.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn b64(v: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD.decode(v["body_b64"].as_str().expect("body_b64")).unwrap()
}

fn options() -> CacheOptions {
    CacheOptions { upstream_minor: Some(28), ..CacheOptions::default() }
}

#[derive(Deserialize)]
struct Mf<'a> {
    #[serde(borrow)]
    metadata: MfMeta<'a>,
}

#[derive(Deserialize)]
struct MfMeta<'a> {
    #[serde(borrow, rename = "managedFields")]
    managed_fields: Option<&'a RawValue>,
}

/// The bytes `,"managedFields":[…]` take in an apiserver object (0 without them).
fn mf_len(object: &str) -> usize {
    let m: Mf = serde_json::from_str(object).unwrap();
    m.metadata.managed_fields.map_or(0, |v| r#","managedFields":"#.len() + v.get().len())
}

#[test]
fn lean_lists_of_every_builtin_kind_are_the_recorded_lists_without_managed_fields() {
    let rec = recording();
    let (mut compared, mut with_mf) = (0, 0);
    for entry in rec["lists"].as_array().unwrap() {
        let name = format!("{} {}", entry["group"], entry["resource"]);
        let json = entry["json"]["body"].as_str().unwrap();
        let list: RawList = serde_json::from_str(json).unwrap();
        let meta: Value = serde_json::from_str(list.metadata.get()).unwrap();
        let Some(rv) = meta["resourceVersion"].as_str() else { continue };
        let (g, v) = group_version(entry["path"].as_str().unwrap());
        let resource = entry["resource"].as_str().unwrap();
        let kind = ResourceKind::new(
            &g,
            &v,
            resource,
            entry["kind"].as_str().unwrap(),
            entry["namespaced"].as_bool().unwrap(),
            true,
        );
        let (mut w, r) = cache::new(kind, options());
        let items = list.items.unwrap_or_default();
        let mf: usize = items.iter().map(|i| mf_len(i.get())).sum();
        with_mf += usize::from(mf > 0);
        w.replace(
            items.iter().map(|i| w.parse(Bytes::from(i.get().to_owned())).unwrap()).collect(),
            Rv(rv.parse().unwrap()),
        );
        let snap = r.snapshot();

        let full = r.list(&snap, &Filter::default(), None).unwrap().to_vec();
        let lean = r.list(&snap, &Filter::default().with_repr(Repr::FullLean), None).unwrap().to_vec();
        let full_v: Value = serde_json::from_slice(&full).unwrap();
        let lean_v: Value = serde_json::from_slice(&lean).unwrap();
        assert_eq!(lean_v, common::without_managed_fields(full_v), "{name}: JSON values");
        assert_eq!(lean.len(), full.len() - mf, "{name}: only the managedFields members go");
        assert!(!String::from_utf8_lossy(&lean).contains("\"managedFields\""), "{name}");

        let meta_lean =
            r.list(&snap, &Filter::default().with_repr(Repr::MetadataLean), None).unwrap().to_vec();
        let meta_full = r.list(&snap, &Filter::default().with_repr(Repr::Metadata), None).unwrap().to_vec();
        let (a, b): (Value, Value) =
            (serde_json::from_slice(&meta_lean).unwrap(), serde_json::from_slice(&meta_full).unwrap());
        assert_eq!(a, common::without_managed_fields(b), "{name}: metadata-only JSON");
        assert_eq!(meta_lean.len(), meta_full.len() - mf, "{name}: metadata-only JSON length");

        for (repr, recorded) in
            [(Repr::FullProtoLean, &entry["proto"]), (Repr::MetadataProtoLean, &entry["meta_proto"])]
        {
            let got = r.list(&snap, &Filter::default().with_repr(repr), None);
            if repr == Repr::FullProtoLean && forwarded(resource, items.iter().map(|i| i.get())) {
                assert!(got.is_none(), "{name}: not provable in protobuf, lean or not");
                continue;
            }
            let want = lean_envelope(&b64(recorded), &lean_list);
            assert!(
                got.is_some_and(|g| g.to_vec() == want),
                "{name} {repr:?}: the recorded protobuf less field 17"
            );
            compared += 1;
        }
    }
    assert!(with_mf >= 40, "the recording has managedFields on most kinds ({with_mf})");
    assert!(compared >= 90, "{compared}");
}

#[test]
fn lean_gets_are_the_recorded_objects_without_managed_fields_made_once() {
    let rec = recording();
    let mut compared = 0;
    for entry in rec["gets"].as_array().unwrap() {
        let path = entry["path"].as_str().unwrap();
        let json = entry["json"]["body"].as_str().unwrap().trim_end();
        let obj: Value = serde_json::from_str(json).unwrap();
        let (g, v) = group_version(path);
        let ns = obj["metadata"]["namespace"].as_str().unwrap_or("");
        let kind = ResourceKind::new(&g, &v, "things", obj["kind"].as_str().unwrap(), !ns.is_empty(), true);
        let (mut w, r) = cache::new(kind, options());
        let o = w.parse(Bytes::from(json.to_owned())).unwrap();
        let rv = o.header.rv;
        w.replace(vec![o], rv);
        let cached = r.get(ns, obj["metadata"]["name"].as_str().unwrap()).unwrap();

        let [a, b, c] = cached.chunks_as(Repr::FullLean).unwrap();
        let got = [&a[..], &b[..], &c[..]].concat();
        assert_eq!(
            serde_json::from_slice::<Value>(&got).unwrap(),
            common::without_managed_fields(obj.clone()),
            "{path}"
        );
        assert_eq!(got.len(), json.len() - mf_len(json), "{path}");

        // Made once per object version, shared by every later read; an object without
        // managedFields is its own lean form.
        let lean = cached.without_managed_fields();
        assert!(std::ptr::eq(lean, cached.without_managed_fields()), "{path}");
        assert_eq!(std::ptr::eq(lean, &*cached), mf_len(json) == 0, "{path}");

        for (repr, recorded) in
            [(Repr::FullProtoLean, &entry["proto"]), (Repr::MetadataProtoLean, &entry["meta_proto"])]
        {
            if recorded["status"].as_u64() != Some(200) {
                continue; // a custom resource in protobuf: the apiserver's 406, forwarded
            }
            let chunks = cached.chunks_as(repr);
            if repr == Repr::FullProtoLean
                && forwarded(path.split('/').rev().nth(1).unwrap(), std::iter::once(json))
            {
                assert!(chunks.is_none(), "{path}");
                continue;
            }
            let got = chunks.unwrap().concat();
            assert_eq!(got, lean_envelope(&b64(recorded), &lean_object), "{path} {repr:?}");
            compared += 1;
        }
    }
    assert!(compared >= 100, "{compared}");
}

/// `v1.28.7-raw/ssa-pod.json`: a pod applied server-side and its status patched by a kubelet
/// (managedFields of two managers, a third of its bytes). The cache's lean forms are its
/// recorded bytes less managedFields; and the 1.28 apiserver itself ignores `drop=`: what a
/// forwarded read gets from an upstream before 1.38.
#[test]
fn a_server_side_applied_pod_without_managed_fields() {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/recordings/v1.28.7-raw/ssa-pod.json");
    let rec: Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    let answers = rec["answers"].as_array().unwrap();
    let by_accept = |a: &str| answers.iter().find(|x| x["accept"] == a).unwrap();
    let json = by_accept("application/json")["body"].as_str().unwrap().trim_end();
    let pb = b64(by_accept("application/vnd.kubernetes.protobuf"));
    for (accept, full) in [
        ("application/json;drop=metadata.managedFields", "application/json"),
        ("application/json;drop=spec", "application/json"),
        (
            "application/vnd.kubernetes.protobuf;drop=metadata.managedFields",
            "application/vnd.kubernetes.protobuf",
        ),
    ] {
        let (a, f) = (by_accept(accept), by_accept(full));
        assert_eq!((a["status"].as_u64(), &a["content_type"]), (Some(200), &f["content_type"]), "{accept}");
        assert_eq!((&a["body"], &a["body_b64"]), (&f["body"], &f["body_b64"]), "1.28 ignores {accept}");
    }
    let obj: Value = serde_json::from_str(json).unwrap();
    let managers: Vec<&str> = obj["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["manager"].as_str().unwrap())
        .collect();
    assert_eq!(managers, ["kubectl", "kubelet"]);

    let kind = ResourceKind::new("", "v1", "pods", "Pod", true, true);
    let (mut w, r) = cache::new(kind, options());
    let o = w.parse(Bytes::from(json.to_owned())).unwrap();
    let rv = o.header.rv;
    w.replace(vec![o], rv);
    let cached = r.get("mf", obj["metadata"]["name"].as_str().unwrap()).unwrap();
    let lean = cached.chunks_as(Repr::FullLean).unwrap().concat();
    assert_eq!(serde_json::from_slice::<Value>(&lean).unwrap(), common::without_managed_fields(obj));
    assert_eq!(lean.len(), json.len() - mf_len(json));
    assert!(mf_len(json) * 3 > json.len(), "managedFields are a third of this pod");
    assert_eq!(cached.chunks_as(Repr::FullProto).unwrap().concat(), pb, "the recorded protobuf, first");
    assert_eq!(cached.chunks_as(Repr::FullProtoLean).unwrap().concat(), lean_envelope(&pb, &lean_object));
}
