//! The fuzz targets' functions on their seed corpora (fuzz/seeds/<target>/) and on cheap
//! deterministic mutations of them (truncations, byte flips, splices), so stable CI exercises
//! the same parsers without cargo-fuzz. A crash found by `fuzz/smoke.sh` is added to the seeds
//! (and so becomes a regression test here) once fixed.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use kube_watchcache::params::ContinueToken;
use kube_watchcache::resource::{typing, Object, ResourceKind};
use kube_watchcache::selector::{FieldSelector, LabelSelector};
use kube_watchcache::server::auth::x509;
use kube_watchcache::server::classify::{classify, parse_path};

fn seeds(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds").join(target);
    let mut out: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .collect();
    assert!(!out.is_empty(), "no seeds for {target}");
    out.sort();
    out
}

/// The seeds plus mutations of them.
fn inputs(target: &str) -> Vec<Vec<u8>> {
    let base = seeds(target);
    let mut rng = fastrand::Rng::with_seed(5);
    let mut out = base.clone();
    for s in &base {
        for n in 0..s.len() {
            out.push(s[..n].to_vec());
        }
        for _ in 0..300 {
            let mut m = s.clone();
            for _ in 0..rng.usize(1..4) {
                if m.is_empty() {
                    break;
                }
                let i = rng.usize(..m.len());
                match rng.u8(..3) {
                    0 => m[i] = rng.u8(..),
                    1 => {
                        m.remove(i);
                    }
                    _ => {
                        let other = &base[rng.usize(..base.len())];
                        m.splice(i..i, other[..rng.usize(..=other.len())].iter().copied());
                    }
                }
            }
            out.push(m);
        }
    }
    out
}

fn kinds() -> Vec<Arc<ResourceKind>> {
    vec![
        Arc::new(ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true)),
        Arc::new(ResourceKind::new("", "v1", "nodes", "Node", false, true)),
        Arc::new(ResourceKind::new("", "v1", "pods", "Pod", true, true)),
        Arc::new(ResourceKind::new("example.com", "v1", "widgets", "Widget", true, false)),
    ]
}

#[test]
fn classify_never_panics() {
    let kinds = kinds();
    for input in inputs("classify") {
        let text = String::from_utf8_lossy(&input);
        let mut parts = text.splitn(4, '\n');
        let method = parts.next().unwrap_or("GET");
        let path = parts.next().unwrap_or("/");
        let (query, accept) = (parts.next(), parts.next());
        let Ok(method) = http::Method::from_bytes(method.as_bytes()) else { continue };
        let _ = parse_path(path);
        let _ = classify(&method, path, query, accept, &kinds[..]);
    }
}

#[test]
fn selectors_never_panic() {
    let kinds = kinds();
    for input in inputs("selectors") {
        let s = String::from_utf8_lossy(&input);
        let _ = LabelSelector::parse(&s);
        for k in &kinds {
            let _ = FieldSelector::parse(&s, k);
        }
    }
}

#[test]
fn continue_tokens_never_panic() {
    for input in inputs("continue_token") {
        let _ = ContinueToken::decode(&String::from_utf8_lossy(&input));
    }
}

#[test]
fn objects_never_panic() {
    let kinds = kinds();
    for input in inputs("object") {
        for k in &kinds {
            let _ = Object::parse(k, &typing(k), Bytes::from(input.clone()));
        }
    }
}

/// Issue 33: a `--state-dir` file of any content is refused or restored, never a panic; the
/// seeds themselves restore. Mutations are also tried with their checksums made to match, so
/// altered records reach the decoder and the cache (a cache of the file's own resource).
#[test]
fn state_files_never_panic() {
    use kube_watchcache::cache::{self, CacheOptions};
    use kube_watchcache::state::{self, fill};
    let cache_of = |s: &state::Saved| {
        let kind = ResourceKind::new(&s.group, &s.version, &s.resource, "Thing", true, s.builtin);
        cache::new(kind, CacheOptions::default())
    };
    for seed in seeds("state_file") {
        let saved = state::decode(&seed).expect("a seed decodes");
        let (mut w, r) = cache_of(&saved);
        fill(&mut w, saved).expect("a seed restores");
        assert!(r.progress().ready);
    }
    let (mut restored, mut refused) = (0, 0);
    for input in inputs("state_file") {
        for bytes in [input.clone(), state::reseal(&input)] {
            let Ok(saved) = state::decode(&bytes) else { continue };
            let (mut w, _r) = cache_of(&saved);
            match fill(&mut w, saved) {
                Ok(_) => restored += 1,
                Err(_) => refused += 1,
            }
        }
    }
    assert!(restored > 0 && refused > 0, "restored {restored}, refused {refused}");
}

#[test]
fn certificate_subjects_never_panic() {
    let all = inputs("x509_subject");
    assert_eq!(x509::subject(&seeds("x509_subject")[0]).map(|s| s.0), Some("alice".to_string()));
    for input in all {
        let _ = x509::subject(&input);
    }
}

/// Issue 30 §1, as `fuzz/fuzz_targets/path_segments.rs` checks it: what the cache would serve
/// has a namespace that is a DNS-1123 label and a name that is a valid path segment, and the
/// RequestInfo (what is authorized) names it; a namespace put in a URL the proxy builds stays
/// one segment.
#[test]
fn path_segments_follow_the_apiservers_rules() {
    use kube_watchcache::server::classify::{request_info, Route};
    let go_dns_label = |s: &str| {
        let ok = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
        s.len() <= 63
            && s.chars().next().is_some_and(ok)
            && s.chars().last().is_some_and(ok)
            && s.chars().all(|c| ok(c) || c == '-')
    };
    let go_segment = |s: &str| s != "." && s != ".." && !s.contains('/') && !s.contains('%');
    let kinds = kinds();
    let mut served = 0;
    for input in inputs("path_segments") {
        let text = String::from_utf8_lossy(&input);
        let (path, ns) = text.split_once('\n').unwrap_or((&text, ""));
        if let Route::Cache(cr) =
            classify(&http::Method::GET, path, Some("resourceVersion=0"), None, &kinds[..])
        {
            served += 1;
            let info = request_info(&http::Method::GET, path, Some("resourceVersion=0"));
            if let Some(n) = &cr.namespace {
                assert!(go_dns_label(n) && &info.namespace == n, "{path}: {n:?}");
            }
            if let Some(n) = &cr.name {
                assert!(go_segment(n) && &info.name == n, "{path}: {n:?}");
            }
            assert!(info.subresource.is_empty() && info.resource == cr.kind.resource, "{path}: {info:?}");
        }
        let built = kinds[0].collection_path(Some(ns));
        let seg =
            built.strip_prefix("/api/v1/namespaces/").and_then(|s| s.strip_suffix("/configmaps")).unwrap();
        assert!(!seg.contains(['/', '?', '#']), "{ns:?} → {built}");
        assert_eq!(percent_encoding::percent_decode_str(seg).decode_utf8_lossy(), ns);
    }
    assert!(served > 0, "some inputs are served from the cache");
}
