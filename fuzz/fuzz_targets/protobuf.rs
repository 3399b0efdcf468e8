//! The JSON → protobuf transcoder on arbitrary bytes, as a Pod, a ConfigMap and a
//! CustomResourceDefinition (the deepest schema): an error or bytes, never a panic; and when it
//! encodes, the shared rope is the same bytes as the copied encoding, and a next version (the
//! input with one byte changed, where and to what its first and last bytes say) encoded from
//! this one's encoding (`proto::after`) is the fresh encoding of that version, or both refuse; and
//! when the walk from both texts' ends (`proto::window`, given the bodies after `{`) or the splice
//! of changed scalars (`proto::splice`) gives an encoding, it is that same fresh encoding.
#![no_main]

use bytes::Bytes;
use kube_watchcache::proto::after::{object_after, Prior};
use kube_watchcache::proto::schema::schema;
use kube_watchcache::proto::splice::object_splice;
use kube_watchcache::proto::transcode::{object, object_shared};
use kube_watchcache::proto::window::object_edit;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let s = schema();
    for (g, v, k) in [("", "v1", "Pod"), ("", "v1", "ConfigMap"), ("apiextensions.k8s.io", "v1", "CustomResourceDefinition")] {
        let Some(msg) = s.kind(g, v, k) else { continue };
        let copied = object(s, msg, data, u32::MAX);
        let stored = Bytes::copy_from_slice(data);
        let shared = object_shared(s, msg, data, &stored, 0, u32::MAX);
        match (copied, shared) {
            (Ok(a), Ok(b)) => {
                assert_eq!(a, b.to_vec());
                next_version(msg, data, &stored, &b);
            }
            (Err(_), Err(_)) => {}
            (a, b) => panic!("copied {:?} vs shared {:?}", a.is_ok(), b.is_ok()),
        }
    }
});

fn next_version(msg: usize, data: &[u8], stored: &Bytes, rope: &kube_watchcache::proto::Rope) {
    let (Some(&first), Some(&last)) = (data.first(), data.last()) else { return };
    let mut next = data.to_vec();
    let at = usize::from(first) * next.len() / 256;
    next[at] = last ^ next[at].rotate_left(1);
    let next = Bytes::from(next);
    let prior = Prior { json: data, stored, prefix_len: 0, rope };
    let s = schema();
    let fresh = object_shared(s, msg, &next, &next, 0, u32::MAX);
    let after = object_after(s, msg, &next, &next, 0, u32::MAX, &prior);
    if next.first() == Some(&b'{') && data.first() == Some(&b'{') {
        let next_body = Bytes::copy_from_slice(&next[1..]);
        let old_body = stored.slice(1..);
        let walked = object_edit(s, msg, &next_body, &old_body, u32::MAX, rope);
        let spliced = object_splice(s, msg, &next_body, &old_body, u32::MAX, rope);
        for e in walked.map(|r| r.to_vec()).into_iter().chain(spliced.map(|e| e.to_vec())) {
            match &fresh {
                Ok(f) => assert_eq!(f.to_vec(), e),
                Err(err) => panic!("the walk or the splice encoded what a fresh encoding refuses: {err}"),
            }
        }
    }
    match (fresh, after) {
        (Ok(f), Ok(a)) => assert_eq!(f.to_vec(), a.to_vec()),
        (Err(_), Err(_)) => {}
        (f, a) => panic!("fresh {:?} vs after {:?}", f.is_ok(), a.is_ok()),
    }
}
