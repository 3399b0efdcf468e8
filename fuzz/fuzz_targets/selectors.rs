//! `LabelSelector::parse` and `FieldSelector::parse` (built-in and custom kinds), plus matching
//! whatever parses against a small object.
#![no_main]

use kube_watchcache::resource::ResourceKind;
use kube_watchcache::selector::{FieldSelector, LabelSelector};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    let _ = LabelSelector::parse(s);
    for kind in [
        ResourceKind::new("", "v1", "pods", "Pod", true, true),
        ResourceKind::new("example.com", "v1", "widgets", "Widget", true, false),
    ] {
        let _ = FieldSelector::parse(s, &kind);
    }
});
