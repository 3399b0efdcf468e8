//! Tests for `params`: validation and continue-token texts against the recordings.

use std::path::{Path, PathBuf};

use super::*;

fn recordings() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/recordings/v1.28.7")
}

fn query_of(req: &serde_json::Value) -> String {
    let mut ser = form_urlencoded::Serializer::new(String::new());
    for (k, v) in req["query"].as_object().into_iter().flatten() {
        ser.append_pair(k, v.as_str().unwrap_or(""));
    }
    ser.finish()
}

/// Runs the proxy's own pipeline for a recorded LIST/WATCH request up to storage checks.
fn check(query: &str) -> Result<(), Error> {
    let mut o = ListOptions::from_query(query)?;
    o.apply_defaults();
    o.validate()?;
    if !o.watch {
        o.continue_for_list()?;
    }
    Ok(())
}

#[test]
fn every_recorded_422_and_continue_400_matches() {
    let mut checked = 0;
    for entry in std::fs::read_dir(recordings()).expect("recordings present") {
        let path = entry.unwrap().path();
        if path.file_name().unwrap() == "index.json" {
            continue;
        }
        let sc: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        for step in sc["steps"].as_array().unwrap() {
            let resp = &step["response"];
            let msg = resp["body"]["message"].as_str().unwrap_or("");
            let code = resp["status"].as_u64().unwrap();
            // 1.28 recordings made with the WatchList gate off (W2) are not 1.36 behaviour.
            if msg.contains("feature gate") || sc["phase"] == "main" && sc["name"] == "watch-sie-gate-off" {
                continue;
            }
            let relevant = code == 422 || (code == 400 && msg.contains("continue"));
            if !relevant {
                continue;
            }
            let q = query_of(&step["request"]);
            let err = check(&q).expect_err(&format!("{}: {q} should fail", path.display()));
            let got: serde_json::Value = serde_json::from_slice(&err.to_status().body).unwrap();
            assert_eq!(got["message"], resp["body"]["message"], "{}: {q}", path.display());
            assert_eq!(got["code"], resp["body"]["code"], "{}: {q}", path.display());
            assert_eq!(got["details"], resp["body"]["details"], "{}: {q}", path.display());
            checked += 1;
        }
    }
    assert!(checked >= 15, "only {checked} recorded errors checked");
}

#[test]
fn bool_params_follow_go_conversion() {
    for (v, want) in [
        ("true", true),
        ("", true),
        ("yes", true),
        ("1", true),
        ("false", false),
        ("0", false),
        ("False", false),
    ] {
        assert_eq!(ListOptions::from_query(&format!("watch={v}")).unwrap().watch, want, "watch={v}");
    }
    assert!(!ListOptions::from_query("").unwrap().watch);
    assert!(ListOptions::from_query("?&watch=true&&").unwrap().watch);
}

#[test]
fn watch_with_rv_unset_or_zero_defaults_to_watch_list() {
    for q in ["watch=1", "watch=1&resourceVersion=0"] {
        let mut o = ListOptions::from_query(q).unwrap();
        o.apply_defaults();
        assert_eq!(o.send_initial_events, Some(true));
        assert_eq!(o.rv_match(), Some(RvMatch::NotOlderThan));
    }
    let mut o = ListOptions::from_query("watch=1&resourceVersion=5").unwrap();
    o.apply_defaults();
    assert_eq!(o.send_initial_events, None);
    let mut o = ListOptions::from_query("resourceVersion=0").unwrap();
    o.apply_defaults();
    assert_eq!(o.send_initial_events, None, "lists are never defaulted");
}

#[test]
fn resource_versions() {
    let o = |q: &str| ListOptions::from_query(q).unwrap();
    assert_eq!(o("").rv(), Ok(RvParam::Unset));
    assert_eq!(o("resourceVersion=0").rv(), Ok(RvParam::Zero));
    assert_eq!(o("resourceVersion=00198").rv(), Ok(RvParam::At(Rv(198))));
    let e = o("resourceVersion=abc").rv_for_list().unwrap_err();
    assert_eq!(
        e.to_string(),
        r#"invalid resource version: resourceVersion: Invalid value: "abc": strconv.ParseUint: parsing "abc": invalid syntax"#
    );
    assert_eq!(e.to_status().code, 400);
    let e = o("resourceVersion=-1").rv_for_get_or_watch().unwrap_err();
    assert_eq!(e.to_status().code, 500);
}

#[test]
fn continue_tokens_round_trip_in_the_apiserver_format() {
    let t = ContinueToken::after(12345, "foo");
    assert_eq!(t.encode(), "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MTIzNDUsInN0YXJ0IjoiZm9vXHUwMDAwIn0");
    assert_eq!(ContinueToken::decode(&t.encode()).unwrap(), t);
    let m = ContinueToken::after(-1, "foo");
    assert_eq!(m.encode(), "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6LTEsInN0YXJ0IjoiZm9vXHUwMDAwIn0");
    // A cache-issued token with a leading slash decodes to the same start.
    let slash = URL_SAFE_NO_PAD.encode(br#"{"v":"meta.k8s.io/v1","rv":7,"start":"/foo\u0000"}"#);
    assert_eq!(ContinueToken::decode(&slash).unwrap().start, "foo\u{0}");
}

#[test]
fn limits_and_bad_integers() {
    assert_eq!(ListOptions::from_query("limit=0").unwrap().limit(), None);
    assert_eq!(ListOptions::from_query("limit=-3").unwrap().limit(), None);
    assert_eq!(ListOptions::from_query("limit=2").unwrap().limit(), Some(2));
    assert_eq!(ListOptions::from_query("limit=x").unwrap_err().to_status().code, 400);
}

/// Pairs as Go's `url.ParseQuery` reads them (recorded from kube-apiserver 1.28.7: a field
/// selector with a bad escape or a `;` is no selector at all, the whole list).
#[test]
fn query_pairs_are_gos() {
    let pairs = |q: &str| -> Vec<(String, String)> {
        super::query_pairs(q).map(|(k, v)| (k.into_owned(), v.into_owned())).collect()
    };
    let owned = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    };
    assert_eq!(
        pairs("a=1&b=x%3Dy&c=p+q&d&=e&&f=%e2%82%ac"),
        owned(&[("a", "1"), ("b", "x=y"), ("c", "p q"), ("d", ""), ("", "e"), ("f", "€")])
    );
    // A bad escape or a `;` drops the pair, not the rest.
    assert_eq!(pairs("fieldSelector=metadata.name%3Da%ZZ&limit=2"), owned(&[("limit", "2")]));
    assert_eq!(pairs("fieldSelector=a%3&limit=2"), owned(&[("limit", "2")]));
    assert_eq!(pairs("limit=1;&fieldSelector=x%3Dy"), owned(&[("fieldSelector", "x=y")]));
    assert_eq!(pairs("?watch=1"), owned(&[("?watch", "1")]), "`path??watch=1`: Go's key is `?watch`");
    let o = ListOptions::from_query("fieldSelector=metadata.name%3Dcm-1%ZZ&labelSelector=a;b").unwrap();
    assert_eq!((o.field_selector.as_str(), o.label_selector.as_str()), ("", ""));
}
