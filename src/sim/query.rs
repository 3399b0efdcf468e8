//! Query parameters of GET / LIST / WATCH (ListOptions): parsing with the apiserver's boolean
//! rules, 1.36 defaulting and validation (reference §1.2–§1.4), and continue tokens (§6.1).
//!
//! Private to `sim` until `crate::params` lands; then this file is swapped for it. Called by
//! `http` (parse) and `read` / `watch` (validate, tokens).

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::{alphabet, Engine};

use crate::error::{Cause, Error};

/// ListOptions as sent (before defaulting).
#[derive(Clone, Debug, Default)]
pub struct Query {
    pub watch: bool,
    pub allow_bookmarks: bool,
    /// Raw `resourceVersion`; `None` when absent.
    pub resource_version: Option<String>,
    pub rv_match: Option<String>,
    pub send_initial_events: Option<bool>,
    pub timeout_seconds: Option<u64>,
    /// 0 = no limit.
    pub limit: u64,
    pub continue_token: Option<String>,
    pub label_selector: Option<String>,
    pub field_selector: Option<String>,
    /// `follow` (pod logs).
    pub follow: bool,
}

/// `Convert_Slice_string_To_bool`: `"0"` and case-insensitive `"false"` are false, anything
/// else (even empty) is true.
fn truthy(v: &str) -> bool {
    !(v == "0" || v.eq_ignore_ascii_case("false"))
}

impl Query {
    pub fn parse(raw: &str) -> Query {
        let mut q = Query::default();
        let mut seen = std::collections::HashSet::new();
        for (k, v) in form_urlencoded::parse(raw.as_bytes()) {
            // Like Go's url.Values.Get, the first value of a repeated parameter wins.
            if !seen.insert(k.to_string()) {
                continue;
            }
            let v = v.into_owned();
            match k.as_ref() {
                "watch" => q.watch = truthy(&v),
                "allowWatchBookmarks" => q.allow_bookmarks = truthy(&v),
                "resourceVersion" => q.resource_version = Some(v),
                "resourceVersionMatch" => q.rv_match = Some(v).filter(|s| !s.is_empty()),
                "sendInitialEvents" => q.send_initial_events = Some(truthy(&v)),
                "timeoutSeconds" => q.timeout_seconds = v.parse().ok(),
                "limit" => q.limit = v.parse::<i64>().ok().filter(|n| *n > 0).unwrap_or(0) as u64,
                "continue" => q.continue_token = Some(v).filter(|s| !s.is_empty()),
                "labelSelector" => q.label_selector = Some(v).filter(|s| !s.is_empty()),
                "fieldSelector" => q.field_selector = Some(v).filter(|s| !s.is_empty()),
                "follow" => q.follow = truthy(&v),
                _ => {}
            }
        }
        q
    }

    pub fn rv_str(&self) -> &str {
        self.resource_version.as_deref().unwrap_or("")
    }

    /// 1.36 defaulting (WatchList on): a watch from RV ""/"0" without sendInitialEvents or
    /// resourceVersionMatch becomes a watch-list.
    pub fn defaulted(mut self) -> Query {
        if self.watch
            && self.send_initial_events.is_none()
            && self.rv_match.is_none()
            && matches!(self.rv_str(), "" | "0")
        {
            self.send_initial_events = Some(true);
            self.rv_match = Some("NotOlderThan".into());
        }
        self
    }

    /// The 422 checks of reference §1.3 (run after defaulting).
    pub fn validate(&self) -> Result<(), Error> {
        let mut causes = Vec::new();
        let rvm = self.rv_match.as_deref();
        let f = "resourceVersionMatch";
        if !self.watch {
            if let Some(m) = rvm {
                if self.rv_str().is_empty() {
                    causes.push(Cause::forbidden(
                        f,
                        "resourceVersionMatch is forbidden unless resourceVersion is provided",
                    ));
                }
                if self.continue_token.is_some() {
                    causes.push(Cause::forbidden(
                        f,
                        "resourceVersionMatch is forbidden when continue is provided",
                    ));
                }
                match m {
                    "Exact" if self.rv_str() == "0" => causes.push(Cause::forbidden(
                        f,
                        "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
                    )),
                    "Exact" | "NotOlderThan" => {}
                    other => causes.push(Cause::not_supported(f, other, &["Exact", "NotOlderThan", ""])),
                }
            }
            if self.send_initial_events.is_some() {
                causes.push(Cause::forbidden("sendInitialEvents", "sendInitialEvents is forbidden for list"));
            }
        } else {
            if self.send_initial_events.is_some() && rvm != Some("NotOlderThan") {
                causes.push(Cause::forbidden(
                    f,
                    "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                ));
            }
            if let Some(m) = rvm {
                if self.send_initial_events.is_none() {
                    causes.push(Cause::forbidden(
                        f,
                        "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                    ));
                }
                if m != "NotOlderThan" {
                    causes.push(Cause::not_supported(f, m, &["NotOlderThan"]));
                }
                if self.continue_token.is_some() {
                    causes.push(Cause::forbidden(
                        f,
                        "resourceVersionMatch is forbidden when continue is provided",
                    ));
                }
            }
        }
        if causes.is_empty() {
            Ok(())
        } else {
            Err(Error::InvalidListOptions { causes })
        }
    }
}

/// A decoded continue token: `rv` (−1 = continue at the latest revision) and the start key
/// relative to the list's prefix (ending in NUL for "strictly after").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Continue {
    pub rv: i64,
    pub start: String,
}

fn engine() -> GeneralPurpose {
    GeneralPurpose::new(
        &alphabet::URL_SAFE,
        GeneralPurposeConfig::new()
            .with_encode_padding(false)
            .with_decode_padding_mode(DecodePaddingMode::RequireNone)
            .with_decode_allow_trailing_bits(true),
    )
}

/// Encodes a token exactly as etcd3's `EncodeContinue`: base64url (no padding) of
/// `{"v":"meta.k8s.io/v1","rv":N,"start":"<key>"}`.
pub fn encode_continue(rv: i64, start: &str) -> String {
    let json = format!(
        "{{\"v\":\"meta.k8s.io/v1\",\"rv\":{rv},\"start\":{}}}",
        serde_json::Value::String(start.to_owned())
    );
    engine().encode(json)
}

/// Decodes a token, with the apiserver's 400 texts.
pub fn decode_continue(token: &str) -> Result<Continue, Error> {
    let bad =
        |d: String| Error::BadRequest(format!("invalid continue token: continue key is not valid: {d}"));
    let valid = |b: u8| b.is_ascii_alphanumeric() || b == b'-' || b == b'_';
    if let Some(i) = token.bytes().position(|b| !valid(b)) {
        return Err(bad(format!("illegal base64 data at input byte {i}")));
    }
    if token.len() % 4 == 1 {
        return Err(bad(format!("illegal base64 data at input byte {}", token.len() - 1)));
    }
    let raw = engine().decode(token).map_err(|e| bad(e.to_string()))?;
    #[derive(serde::Deserialize)]
    struct Token {
        #[serde(default)]
        v: String,
        #[serde(default)]
        rv: i64,
        #[serde(default)]
        start: String,
    }
    let t: Token = serde_json::from_slice(&raw).map_err(|e| bad(go_json_error(&raw, &e)))?;
    if t.v != "meta.k8s.io/v1" {
        return Err(bad(format!("server does not recognize this encoded version {}", t.v)));
    }
    if t.rv == 0 {
        return Err(bad("incorrect encoded start resourceVersion (version meta.k8s.io/v1)".into()));
    }
    if t.start.is_empty() {
        return Err(bad("encoded start key empty (version meta.k8s.io/v1)".into()));
    }
    let key = if t.start.starts_with('/') { t.start.clone() } else { format!("/{}", t.start) };
    if path_clean(&key) != key {
        return Err(bad(t.start));
    }
    Ok(Continue { rv: t.rv, start: key[1..].to_owned() })
}

/// Go's `encoding/json` wording for the common syntax errors.
fn go_json_error(raw: &[u8], e: &serde_json::Error) -> String {
    match raw.iter().find(|b| !b.is_ascii_whitespace()) {
        None => "unexpected end of JSON input".into(),
        Some(&b) if b != b'{' && b != b'[' && b != b'"' && !b.is_ascii_digit() && b != b'-' => {
            format!("invalid character '{}' looking for beginning of value", b as char)
        }
        _ => e.to_string(),
    }
}

/// Go's `path.Clean` for absolute paths.
fn path_clean(p: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for seg in p.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    format!("/{}", parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Query {
        Query::parse(s).defaulted()
    }

    fn message(e: Error) -> String {
        let v: serde_json::Value = serde_json::from_slice(&e.to_status().body).unwrap();
        v["message"].as_str().unwrap().to_owned()
    }

    #[test]
    fn booleans_follow_go_rules() {
        for (s, w) in [
            ("watch=1", true),
            ("watch=", true),
            ("watch=yes", true),
            ("watch=False", false),
            ("watch=0", false),
        ] {
            assert_eq!(Query::parse(s).watch, w, "{s}");
        }
    }

    #[test]
    fn defaulting_makes_watch_list() {
        let d = q("watch=1&resourceVersion=0");
        assert_eq!(d.send_initial_events, Some(true));
        assert_eq!(d.rv_match.as_deref(), Some("NotOlderThan"));
        assert!(q("watch=1&resourceVersion=5").send_initial_events.is_none());
    }

    #[test]
    fn validation_texts() {
        let e = q("watch=1&sendInitialEvents=true&resourceVersionMatch=Exact").validate().unwrap_err();
        assert_eq!(
            message(e),
            "ListOptions.meta.k8s.io \"\" is invalid: [resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan, resourceVersionMatch: Unsupported value: \"Exact\": supported values: \"NotOlderThan\"]"
        );
        let e = q("resourceVersionMatch=Exact&resourceVersion=0").validate().unwrap_err();
        assert!(message(e).ends_with("resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\""));
        let e = q("sendInitialEvents=false").validate().unwrap_err();
        assert!(message(e).ends_with("sendInitialEvents: Forbidden: sendInitialEvents is forbidden for list"));
        assert!(q("watch=1&resourceVersionMatch=NotOlderThan").validate().is_err());
        assert!(q("limit=2&resourceVersion=5").validate().is_ok());
    }

    #[test]
    fn tokens_roundtrip_like_etcd() {
        // list-pagination-3-pages.json, page 1.
        let t = encode_continue(198, "cm-2\u{0}");
        assert_eq!(t, "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MTk4LCJzdGFydCI6ImNtLTJcdTAwMDAifQ");
        assert_eq!(decode_continue(&t).unwrap(), Continue { rv: 198, start: "cm-2\u{0}".into() });
        assert_eq!(
            encode_continue(-1, "c1\u{0}"),
            "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6LTEsInN0YXJ0IjoiYzFcdTAwMDAifQ"
        );
    }

    #[test]
    fn token_errors_match_recordings() {
        let m = |t: &str| message(decode_continue(t).unwrap_err());
        let p = "invalid continue token: continue key is not valid: ";
        assert_eq!(m("abc!"), format!("{p}illegal base64 data at input byte 3"));
        assert_eq!(m("aGVsbG8"), format!("{p}invalid character 'h' looking for beginning of value"));
        assert_eq!(
            m("eyJ2IjoibWV0YS5rOHMuaW8vdjIiLCJydiI6MTk4LCJzdGFydCI6ImNtLTJcdTAwMDAifQ"),
            format!("{p}server does not recognize this encoded version meta.k8s.io/v2")
        );
        assert_eq!(
            m("eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MCwic3RhcnQiOiJjbS0yXHUwMDAwIn0"),
            format!("{p}incorrect encoded start resourceVersion (version meta.k8s.io/v1)")
        );
        assert_eq!(
            m("eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MTk4LCJzdGFydCI6IiJ9"),
            format!("{p}encoded start key empty (version meta.k8s.io/v1)")
        );
        assert_eq!(m("eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MTk4LCJzdGFydCI6Ii4uL3gifQ"), format!("{p}../x"));
    }
}
