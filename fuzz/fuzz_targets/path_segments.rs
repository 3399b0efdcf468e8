//! Namespace and name segments (issue 30 §1) against the apiserver's rules: a request the
//! cache would serve has a namespace that is a DNS-1123 label and a name that is a valid path
//! segment (Go's `IsDNS1123Label` and `IsValidPathSegmentName`, written out again here), and
//! its RequestInfo (what is authorized) names exactly what is served; any string put into a URL
//! the proxy builds stays one segment. Input: one path (the first line) and a namespace (the
//! rest).
#![no_main]

use std::sync::Arc;

use http::Method;
use kube_watchcache::resource::ResourceKind;
use kube_watchcache::server::classify::{classify, request_info, Route};
use libfuzzer_sys::fuzz_target;

/// `IsDNS1123Label`: `^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`, at most 63.
fn go_dns_label(s: &str) -> bool {
    let ok = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    s.len() <= 63
        && s.chars().next().is_some_and(ok)
        && s.chars().last().is_some_and(ok)
        && s.chars().all(|c| ok(c) || c == '-')
}

/// `IsValidPathSegmentName`.
fn go_segment(s: &str) -> bool {
    s != "." && s != ".." && !s.contains('/') && !s.contains('%')
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (path, ns) = text.split_once('\n').unwrap_or((text, ""));
    let kinds = [
        Arc::new(ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true)),
        Arc::new(ResourceKind::new("", "v1", "nodes", "Node", false, true)),
        Arc::new(ResourceKind::new("", "v1", "namespaces", "Namespace", false, true)),
    ];
    for query in ["resourceVersion=0", "watch=1&resourceVersion=0"] {
        if let Route::Cache(cr) = classify(&Method::GET, path, Some(query), None, &kinds[..]) {
            let info = request_info(&Method::GET, path, Some(query));
            if let Some(n) = &cr.namespace {
                assert!(go_dns_label(n), "{path}: served namespace {n:?}");
                assert_eq!(&info.namespace, n, "{path}");
            }
            if let Some(n) = &cr.name {
                assert!(go_segment(n), "{path}: served name {n:?}");
                assert_eq!(&info.name, n, "{path}");
            }
            assert_eq!(info.resource, cr.kind.resource, "{path}");
            assert!(info.subresource.is_empty(), "{path}: {info:?}");
        }
    }
    let built = kinds[0].collection_path(Some(ns));
    let seg = built
        .strip_prefix("/api/v1/namespaces/")
        .and_then(|s| s.strip_suffix("/configmaps"))
        .expect("the collection's shape");
    assert!(!seg.contains(['/', '?', '#']), "{ns:?} → {built}");
    assert_eq!(percent_encoding::percent_decode_str(seg).decode_utf8().expect("UTF-8"), ns);
});
