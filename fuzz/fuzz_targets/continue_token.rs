//! `ContinueToken::decode` on arbitrary strings.
#![no_main]

use kube_watchcache::params::ContinueToken;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = ContinueToken::decode(s);
    }
});
