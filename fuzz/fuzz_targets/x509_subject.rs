//! The client-certificate subject reader (CommonName / Organizations) and the version check
//! on arbitrary DER.
#![no_main]

use kube_watchcache::server::auth::x509;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = x509::subject(data);
    let _ = x509::is_v1(data);
});
