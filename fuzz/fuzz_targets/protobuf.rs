//! The JSON → protobuf transcoder on arbitrary bytes, as a Pod, a ConfigMap and a
//! CustomResourceDefinition (the deepest schema): an error or bytes, never a panic; and when it
//! encodes, the shared rope is the same bytes as the copied encoding.
#![no_main]

use bytes::Bytes;
use kube_watchcache::proto::schema::schema;
use kube_watchcache::proto::transcode::{object, object_shared};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let s = schema();
    for (g, v, k) in [("", "v1", "Pod"), ("", "v1", "ConfigMap"), ("apiextensions.k8s.io", "v1", "CustomResourceDefinition")] {
        let Some(msg) = s.kind(g, v, k) else { continue };
        let copied = object(s, msg, data, u32::MAX);
        let stored = Bytes::copy_from_slice(data);
        let shared = object_shared(s, msg, data, &stored, 0, u32::MAX);
        match (copied, shared) {
            (Ok(a), Ok(b)) => assert_eq!(a, b.to_vec()),
            (Err(_), Err(_)) => {}
            (a, b) => panic!("copied {:?} vs shared {:?}", a.is_ok(), b.is_ok()),
        }
    }
});
