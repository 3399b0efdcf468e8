//! LIST assembly from the cache (issue 4, bench 2): `Reader::list` of every pod at RV=0 (the
//! body is the concatenation of the stored bytes: throughput in bytes/s), and one page of 500
//! with and without a label selector (`limit=500`, continue token minted); and the same full
//! LIST metadata-only (PartialObjectMetadataList, issue 17), whose size and extra memory (each
//! object's PartialObjectMetadata, kept once made) are printed; and the same full LIST in
//! protobuf (issue 17), measured in JSON bytes per second so that the two throughputs compare
//! as lists of the same objects, with its size and the memory its kept encodings add.
//!
//! Run: `cargo bench --bench list`; smoke: `BENCH_SMOKE=1 cargo bench --bench list`.

mod support;

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kube_watchcache::cache::{CacheOptions, Filter, Page};
use kube_watchcache::metadata_only::Repr;
use kube_watchcache::resource::{frame_object, EventType};
use kube_watchcache::selector::{FieldSelector, LabelSelector};

fn list(c: &mut Criterion) {
    let n = support::size(10_000, 200);
    let (_w, reader) = support::filled_cache(n, 100, CacheOptions::default());
    let everything = Filter::default();
    let app3 = match LabelSelector::parse("app=app-3") {
        Ok(s) => Filter::new(None, None, s, FieldSelector::default()),
        Err(e) => panic!("{e}"),
    };
    let token_rv = reader.progress().rv.0 as i64;
    let page = |limit: usize| Some(Page { limit, start: None, token_rv });

    let mut g = c.benchmark_group("list");
    let full = reader.list(&reader.snapshot(), &everything, None).unwrap();
    assert_eq!(full.items, n);
    g.throughput(Throughput::Bytes(full.len as u64));
    g.bench_function(format!("rv0_all_{n}_pods"), |b| {
        b.iter(|| drain(reader.list(&reader.snapshot(), black_box(&everything), None).unwrap()))
    });

    let metadata = Filter::default().with_repr(Repr::Metadata);
    let meta = reader.list(&reader.snapshot(), &metadata, None).unwrap();
    assert_eq!(meta.items, n);
    // The metadata copies are made by the first metadata-only read and kept per object version.
    let kept: usize = reader.snapshot().store.values().map(|o| o.metadata_bytes().len()).sum();
    println!(
        "list: {n} pods: full {} bytes, metadata-only {} bytes ({:.0} %); metadata kept: {kept} bytes ({} per object)",
        full.len,
        meta.len,
        100.0 * meta.len as f64 / full.len as f64,
        kept / n.max(1)
    );
    g.throughput(Throughput::Bytes(meta.len as u64));
    g.bench_function(format!("rv0_all_{n}_pods_metadata_only"), |b| {
        b.iter(|| drain(reader.list(&reader.snapshot(), black_box(&metadata), None).unwrap()))
    });

    // Protobuf (issue 17): the first read encodes each object version once and keeps it; the
    // figures are the bytes on the wire and what the kept encodings add to the JSON store.
    let proto = Filter::default().with_repr(Repr::FullProto);
    let pb = reader.list(&reader.snapshot(), &proto, None).expect("bench pods encode");
    assert_eq!(pb.items, n);
    let json_kept: usize = reader.snapshot().store.values().map(|o| o.body.len()).sum();
    // What the kept encodings hold of their own: the copied parts and a `Bytes` (32 bytes) per
    // part; long strings and managedFields' JSON are shared with the stored JSON.
    let pb_kept: usize = reader
        .snapshot()
        .store
        .values()
        .filter_map(|o| o.proto_message(false).map(|m| m.own_bytes(&o.body) + 32 * m.parts().len() + 24))
        .sum();
    println!(
        "list: {n} pods: JSON {} bytes, protobuf {} bytes ({:.0} %); JSON store {json_kept} bytes, protobuf kept {pb_kept} bytes of its own: {:.2}x the JSON store with protobuf readers",
        full.len,
        pb.len,
        100.0 * pb.len as f64 / full.len as f64,
        (json_kept + pb_kept) as f64 / json_kept as f64,
    );
    // One watch event of a pod, each way (an event is framed once for all its watchers).
    if let Some(pod) = reader.snapshot().store.values().next() {
        let frame = |repr| frame_object(EventType::Modified, pod, repr).map_or(0, |f| f.len());
        println!(
            "event: one pod MODIFIED: JSON {} bytes, protobuf {} bytes; metadata-only JSON {} bytes, protobuf {} bytes",
            frame(Repr::Full),
            frame(Repr::FullProto),
            frame(Repr::Metadata),
            frame(Repr::MetadataProto)
        );
    }
    g.throughput(Throughput::Bytes(full.len as u64));
    g.bench_function(format!("rv0_all_{n}_pods_protobuf"), |b| {
        b.iter(|| drain(reader.list(&reader.snapshot(), black_box(&proto), None).unwrap()))
    });

    let limit = support::size(500, 20);
    let one = reader.list(&reader.snapshot(), &everything, page(limit)).unwrap();
    assert_eq!(one.items, limit);
    assert!(one.continue_token.is_some());
    g.throughput(Throughput::Bytes(one.len as u64));
    g.bench_function(format!("page_{limit}_of_{n}"), |b| {
        b.iter(|| drain(reader.list(&reader.snapshot(), black_box(&everything), page(limit)).unwrap()))
    });

    let sel = reader.list(&reader.snapshot(), &app3, page(limit)).unwrap();
    assert_eq!(sel.items, limit);
    g.throughput(Throughput::Bytes(sel.len as u64));
    g.bench_function(format!("page_{limit}_of_{n}_label_app_eq"), |b| {
        b.iter(|| drain(reader.list(&reader.snapshot(), black_box(&app3), page(limit)).unwrap()))
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = support::criterion();
    targets = list
}
criterion_main!(benches);

/// Produces every chunk of the body, as the connection would, and returns its length.
fn drain(body: kube_watchcache::cache::ListBody) -> usize {
    body.into_chunks().map(|c| black_box(c).len()).sum()
}
