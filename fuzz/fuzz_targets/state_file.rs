//! `state::decode` on arbitrary bytes (a `--state-dir` file), and what decodes put into an
//! empty cache of the file's resource with `state::fill` (saved headers and bodies rebuilt,
//! a sample parsed again): refused or restored, never a panic.
#![no_main]

use kube_watchcache::cache::{self, CacheOptions};
use kube_watchcache::resource::ResourceKind;
use kube_watchcache::state::{self, fill};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // As read, and with the checksums made to match (so altered records reach the decoder).
    for bytes in [data.to_vec(), state::reseal(data)] {
        if let Ok(saved) = state::decode(&bytes) {
            let kind = ResourceKind::new(&saved.group, &saved.version, &saved.resource, "Thing", true, saved.builtin);
            let (mut writer, _reader) = cache::new(kind, CacheOptions::default());
            let _ = fill(&mut writer, saved);
        }
    }
});
