//! Per-object costs on the filling path (issue 4, benches 1, 3, 5): parsing the header of a
//! ~2.5 KiB pod (against a full `serde_json::Value` parse, the baseline docs/design.md §4 rejects),
//! framing a watch event once, label / field selector matching on a typical header, and the
//! protobuf transcoding of the pod (issue 17: once per object version, for every protobuf
//! reader of it).
//!
//! Run: `cargo bench --bench objects`; smoke: `BENCH_SMOKE=1 cargo bench --bench objects`.

mod support;

use bytes::Bytes;
use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kube_watchcache::resource::{typing, Event, EventType, Object, Rv};
use kube_watchcache::selector::{FieldSelector, LabelSelector};
use support::PodSpec;

fn spec(i: usize) -> PodSpec {
    PodSpec { i, rv: 123_456, nodes: 100, generation: 7 }
}

fn header_parse(c: &mut Criterion) {
    let kind = support::pods();
    let prefix = typing(&kind);
    let bytes = support::pod_json(&spec(42));
    let mut g = c.benchmark_group("header_parse");
    g.throughput(Throughput::Bytes(bytes.len() as u64));
    g.bench_function("object_parse", |b| {
        b.iter(|| Object::parse(&kind, &prefix, black_box(bytes.clone())).map(|o| o.header.rv))
    });
    g.bench_function("serde_json_value", |b| {
        b.iter(|| serde_json::from_slice::<serde_json::Value>(black_box(&bytes)).map(|v| v.is_object()))
    });
    g.bench_function("serde_json_ignored_any", |b| {
        b.iter(|| serde_json::from_slice::<serde::de::IgnoredAny>(black_box(&bytes)).is_ok())
    });
    g.finish();
}

fn event_framing(c: &mut Criterion) {
    let prev = support::arc_pod(&spec(42));
    let obj = support::arc_pod(&PodSpec { rv: 123_457, ..spec(42) });
    let mut g = c.benchmark_group("event_framing");
    g.throughput(Throughput::Bytes(obj.typed_bytes().len() as u64));
    g.bench_function("event_new_modified", |b| {
        b.iter(|| {
            Event::new(EventType::Modified, Rv(123_457), black_box(obj.clone()), Some(prev.clone()))
                .frame
                .len()
        })
    });
    g.finish();
}

fn selectors(c: &mut Criterion) {
    let kind = support::pods();
    let obj: Arc<Object> = support::arc_pod(&spec(42));
    let h = &obj.header;
    let mut g = c.benchmark_group("selector_match");
    let labels = [
        ("label_eq", "app=app-2"),
        ("label_eq_miss", "app=app-3"),
        ("label_set_3terms", "app in (app-1,app-2),tier!=db,version"),
        ("label_not_exists", "!canary"),
    ];
    for (name, s) in labels {
        let sel = match LabelSelector::parse(s) {
            Ok(sel) => sel,
            Err(e) => panic!("{s}: {e}"),
        };
        g.bench_function(name, |b| b.iter(|| black_box(&sel).matches(&h.labels())));
    }
    let fields = [
        ("field_node", "spec.nodeName=node-42"),
        ("field_node_miss", "spec.nodeName=node-7"),
        ("field_phase_and_node", "status.phase!=Succeeded,spec.nodeName=node-42"),
    ];
    for (name, s) in fields {
        let sel = match FieldSelector::parse(s, &kind) {
            Ok(sel) => sel,
            Err(e) => panic!("{s}: {e}"),
        };
        g.bench_function(name, |b| b.iter(|| black_box(&sel).matches(h)));
    }
    g.bench_function("label_parse_3terms", |b| {
        b.iter(|| LabelSelector::parse(black_box("app in (app-1,app-2),tier!=db,version")).is_ok())
    });
    g.finish();
}

fn protobuf(c: &mut Criterion) {
    let kind = support::pods();
    let prefix = typing(&kind);
    let bytes = support::pod_json(&spec(42));
    let obj = match Object::parse(&kind, &prefix, bytes.clone()) {
        Ok(o) => o,
        Err(e) => panic!("{e}"),
    };
    let pt = kube_watchcache::proto::ProtoType::new("", "v1", "Pod", true, "pods".into());
    let json = obj.typed_bytes();
    let whole = pt.encode(&json).map(|b| b.len());
    assert!(whole.is_some_and(|n| n > 1000), "the pod encodes: {whole:?}");
    let mut g = c.benchmark_group("protobuf");
    g.throughput(Throughput::Bytes(json.len() as u64));
    g.bench_function("transcode_pod", |b| b.iter(|| pt.encode(black_box(&json)).map(|b| b.len())));
    // The next version of the pod (a new resourceVersion), from the encoding of this one
    // (`proto::after`: what a protobuf watch event costs when the replaced version was encoded).
    let body = obj.body.clone();
    let prior = pt.encode_shared(&json, &body, json.len() - body.len()).expect("encodes");
    let rv = obj.header.rv.0.to_string();
    let next_json = Bytes::from(String::from_utf8_lossy(&json).replacen(
        &format!("\"resourceVersion\":\"{rv}\""),
        &format!("\"resourceVersion\":\"{}\"", obj.header.rv.0 + 1),
        1,
    ));
    assert_ne!(next_json, json, "the resourceVersion changed");
    let next_body = next_json.slice(json.len() - body.len()..);
    let before = (&json[..], &body, json.len() - body.len());
    g.bench_function("transcode_pod_after", |b| {
        b.iter(|| {
            let now = (black_box(&next_json[..]), &next_body, next_json.len() - next_body.len());
            pt.encode_after(now, before, &prior).map(|r| r.len())
        })
    });
    // The same, as a watch event makes it: only the changed scalars encoded (`proto::splice`),
    // else the bodies walked from both ends (`proto::window`); copied into one buffer, as the
    // event's frame copies it.
    g.bench_function("transcode_pod_edit", |b| {
        b.iter(|| {
            pt.encode_edit(black_box(&next_body), &body, &prior).map(|e| {
                let mut pieces = Vec::new();
                e.pieces_into(&mut pieces);
                pieces.concat().len()
            })
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = support::criterion();
    targets = header_parse, event_framing, selectors, protobuf
}
criterion_main!(benches);
