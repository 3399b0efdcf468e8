//! `classify::parse_path` and `classify::classify` on arbitrary method / path / query / Accept.
//! Input: `METHOD\nPATH\nQUERY\nACCEPT` (missing parts are absent).
#![no_main]

use std::sync::Arc;

use kube_watchcache::resource::ResourceKind;
use kube_watchcache::server::classify::{classify, parse_path};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let mut parts = text.splitn(4, '\n');
    let method = parts.next().unwrap_or("GET");
    let path = parts.next().unwrap_or("/");
    let query = parts.next();
    let accept = parts.next();
    let Ok(method) = http::Method::from_bytes(method.as_bytes()) else { return };
    let _ = parse_path(path);
    let kinds = [
        Arc::new(ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true)),
        Arc::new(ResourceKind::new("", "v1", "nodes", "Node", false, true)),
        Arc::new(ResourceKind::new("", "v1", "pods", "Pod", true, true)),
        Arc::new(ResourceKind::new("example.com", "v1", "widgets", "Widget", true, false)),
    ];
    let _ = classify(&method, path, query, accept, &kinds[..]);
});
