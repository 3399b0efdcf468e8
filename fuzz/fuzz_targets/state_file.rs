//! `state::format::decode` on arbitrary bytes (a `--state-dir` file), and what decodes put
//! into an empty cache with `state::fill`: refused or restored, never a panic.
#![no_main]

use kube_watchcache::cache::{self, CacheOptions};
use kube_watchcache::resource::ResourceKind;
use kube_watchcache::state::{fill, format};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // As read, and with the checksum made to match (so altered bodies reach the parser).
    for bytes in [data.to_vec(), format::reseal(data)] {
        if let Ok(saved) = format::decode(&bytes) {
            let kind = ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true);
            let (mut writer, _reader) = cache::new(kind, CacheOptions::default());
            let _ = fill(&mut writer, saved);
        }
    }
});
