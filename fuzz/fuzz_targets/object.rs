//! `Object::parse` on arbitrary bytes, for a namespaced built-in and a cluster-scoped kind.
#![no_main]

use bytes::Bytes;
use kube_watchcache::resource::{typing, Object, ResourceKind};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for kind in [
        ResourceKind::new("", "v1", "pods", "Pod", true, true),
        ResourceKind::new("", "v1", "nodes", "Node", false, true),
    ] {
        let prefix = typing(&kind);
        let _ = Object::parse(&kind, &prefix, Bytes::copy_from_slice(data));
    }
});
