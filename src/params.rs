//! Query parameters of GET / LIST / WATCH (`metav1.ListOptions`): decoding, the 1.34+
//! watch-list defaulting, validation with the apiserver's exact 422 texts, resourceVersion
//! parsing, and continue tokens.
//!
//! Pure: no I/O. Called by `server::classify` (the proxy) and by `sim` (the simulated
//! apiserver), so both validate exactly alike (docs/apiserver-watch-cache.md §1.1–§1.4, §6.1).

use std::borrow::Cow;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::error::{Cause, Error};
use crate::resource::Rv;

/// `resourceVersionMatch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RvMatch {
    Exact,
    NotOlderThan,
}

/// The `resourceVersion` parameter, parsed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RvParam {
    /// Absent or empty: Most Recent.
    Unset,
    /// `0` (any spelling that parses to zero): Any.
    Zero,
    /// `N > 0`.
    At(Rv),
}

/// A watch's life as its `timeoutSeconds` sets it ([`ListOptions::watch_timeout`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchTimeout {
    /// None or zero: the server's (`--min-request-timeout` × [1, 2)).
    Default,
    /// Negative: it ends at once.
    Now,
    After(std::time::Duration),
}

/// ListOptions as the apiserver decodes them from the query string.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListOptions {
    pub watch: bool,
    pub allow_watch_bookmarks: bool,
    /// `None` when absent (`sendInitialEvents=false` is a non-nil pointer).
    pub send_initial_events: Option<bool>,
    /// Raw `resourceVersion` (empty when absent).
    pub resource_version: String,
    /// Raw `resourceVersionMatch` (empty when absent).
    pub resource_version_match: String,
    /// Negative: the watch ends at once (Go's timer of a negative duration).
    pub timeout_seconds: Option<i64>,
    /// `limit` ≤ 0 means no limit.
    pub limit: i64,
    pub continue_token: String,
    pub label_selector: String,
    pub field_selector: String,
    /// Raw `shardSelector` (KEP-5866, 1.36 alpha; empty when absent). Parsed by
    /// `server::classify` only: the simulated 1.28 apiserver ignores it, as 1.28 does.
    pub shard_selector: String,
}

/// A raw query string's pairs as Go's `url.ParseQuery` reads them, which is what the
/// apiserver's handlers see (`req.URL.Query()`, its error ignored): split at `&`; a pair holding
/// a `;` or a bad `%` escape is dropped, not decoded leniently; `+` is a space; the key ends at
/// the first `=`. (Recorded from kube-apiserver 1.28.7: `fieldSelector=metadata.name%3Dx%ZZ`
/// selects nothing, so the whole list.) The query is the URI's, after its `?` separator: a
/// second `?` is part of the first key, as in Go.
pub fn query_pairs(query: &str) -> impl Iterator<Item = (Cow<'_, str>, Cow<'_, str>)> {
    query.split('&').filter_map(|pair| {
        if pair.is_empty() || pair.contains(';') {
            return None;
        }
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        Some((query_unescape(k)?, query_unescape(v)?))
    })
}

/// The first value of `key` as Go's `req.URL.Query().Get(key)` gives it, as bytes (a value
/// that is not UTF-8 kept as it is, for an error text that quotes it as Go does).
pub fn query_value_bytes(query: &str, key: &str) -> Option<Vec<u8>> {
    // (every request's query is asked for `timeout`: nothing is decoded when the key cannot be
    // in it, neither written out nor escaped)
    if !query.contains(key) && !query.contains('%') {
        return None;
    }
    query_pairs_bytes(query).find_map(|(k, v)| (k == key.as_bytes()).then_some(v))
}

/// [`query_pairs`] as bytes.
pub fn query_pairs_bytes(query: &str) -> impl Iterator<Item = (Vec<u8>, Vec<u8>)> + '_ {
    query.split('&').filter_map(|pair| {
        if pair.is_empty() || pair.contains(';') {
            return None;
        }
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        Some((unescape_bytes(k)?, unescape_bytes(v)?))
    })
}

/// Go's `url.QueryUnescape`: `%XX` (two hex digits, else `None`) and `+` for a space; bytes
/// that are not UTF-8 are replaced.
fn query_unescape(s: &str) -> Option<Cow<'_, str>> {
    if !s.contains(['%', '+']) {
        return Some(Cow::Borrowed(s));
    }
    let out = unescape_bytes(s)?;
    Some(Cow::Owned(String::from_utf8_lossy(&out).into_owned()))
}

/// [`query_unescape`]'s bytes.
fn unescape_bytes(s: &str) -> Option<Vec<u8>> {
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while let Some(&c) = b.get(i) {
        match c {
            b'%' => {
                let (hi, lo) = (hex(*b.get(i + 1)?)?, hex(*b.get(i + 2)?)?);
                out.push(hi << 4 | lo);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    Some(out)
}

/// Go's `Convert_Slice_string_To_bool`: absent → false; `0` / case-insensitive `false` →
/// false; anything else, the empty string included, → true.
pub fn parse_bool(v: &str) -> bool {
    !(v == "0" || v.eq_ignore_ascii_case("false"))
}

impl ListOptions {
    /// Decodes a raw query string (`a=b&c=d`, leading `?` or empty pairs ignored). The first
    /// value of a repeated parameter wins, as with Go's `url.Values` conversion.
    /// Integers that do not parse are the apiserver's 400 (`strconv.ParseInt: parsing "x":
    /// invalid syntax`), `timeoutSeconds`'s before `limit`'s whatever their order in the query
    /// (the fields' order in `metav1.ListOptions`), as kube-apiserver 1.28.7 answers.
    pub fn from_query(query: &str) -> Result<ListOptions, Error> {
        let mut o = ListOptions::default();
        let mut seen = std::collections::HashSet::new();
        let (mut timeout, mut limit) = (Ok(None), Ok(0));
        for (k, v) in query_pairs(query) {
            if k.is_empty() || !seen.insert(k.clone()) {
                continue;
            }
            match k.as_ref() {
                "watch" => o.watch = parse_bool(&v),
                "allowWatchBookmarks" => o.allow_watch_bookmarks = parse_bool(&v),
                "sendInitialEvents" => o.send_initial_events = Some(parse_bool(&v)),
                "resourceVersion" => o.resource_version = v.into_owned(),
                "resourceVersionMatch" => o.resource_version_match = v.into_owned(),
                "timeoutSeconds" => timeout = parse_int(&v).map(Some),
                "limit" => limit = parse_int(&v),
                "continue" => o.continue_token = v.into_owned(),
                "labelSelector" => o.label_selector = v.into_owned(),
                "fieldSelector" => o.field_selector = v.into_owned(),
                "shardSelector" => o.shard_selector = v.into_owned(),
                _ => {}
            }
        }
        o.timeout_seconds = timeout?;
        o.limit = limit?;
        Ok(o)
    }

    /// The options of a GET of one object (`metav1.GetOptions`): its `resourceVersion`, every
    /// other parameter ignored (`?limit=x` is no error there), and `export`, which the
    /// apiserver refuses when true (`GetResource`; recorded from kube-apiserver 1.28.7).
    pub fn for_get(query: &str) -> Result<ListOptions, Error> {
        let mut o = ListOptions::default();
        let (mut rv, mut export) = (None, None);
        for (k, v) in query_pairs(query) {
            match k.as_ref() {
                "resourceVersion" if rv.is_none() => rv = Some(v.into_owned()),
                "export" if export.is_none() => export = Some(parse_bool(&v)),
                _ => {}
            }
        }
        if export == Some(true) {
            return Err(Error::BadRequest(
                "the export parameter, deprecated since v1.14, is no longer supported".into(),
            ));
        }
        o.resource_version = rv.unwrap_or_default();
        Ok(o)
    }

    /// The selectors' syntax, checked where the apiserver's decoding parses them: after the
    /// integers, the label selector before the field selector, both before the 422 of
    /// [`ListOptions::validate`] (`fieldSelector=foo&resourceVersionMatch=Exact` is the field
    /// selector's 400; recorded from kube-apiserver 1.28.7). Whether a field is selectable for
    /// the resource is the registry's question, asked after validation.
    pub fn check_selector_syntax(&self, texts: crate::selector::Texts) -> Result<(), Error> {
        crate::selector::LabelSelector::parse_as(&self.label_selector, texts)?;
        crate::selector::parse_terms(&self.field_selector)?;
        Ok(())
    }

    /// `SetListOptionsDefaults` with the WatchList gate on (1.34+): a watch with RV unset or
    /// `0` and neither `sendInitialEvents` nor `resourceVersionMatch` becomes a watch-list.
    pub fn apply_defaults(&mut self) {
        if self.watch
            && self.send_initial_events.is_none()
            && self.resource_version_match.is_empty()
            && (self.resource_version.is_empty() || self.resource_version == "0")
        {
            self.send_initial_events = Some(true);
            self.resource_version_match = "NotOlderThan".into();
        }
    }

    /// `ValidateListOptions` (docs/apiserver-watch-cache.md §1.3): every 422, aggregated like the apiserver.
    pub fn validate(&self) -> Result<(), Error> {
        let mut causes = Vec::new();
        let rvm = self.resource_version_match.as_str();
        const F: &str = "resourceVersionMatch";
        if self.watch {
            let sie = self.send_initial_events.is_some();
            if sie && rvm != "NotOlderThan" {
                causes.push(Cause::forbidden(
                    F,
                    "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                ));
            }
            if !rvm.is_empty() {
                if !sie {
                    causes.push(Cause::forbidden(
                        F,
                        "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                    ));
                }
                if rvm != "NotOlderThan" {
                    causes.push(Cause::not_supported(F, rvm, &["NotOlderThan"]));
                }
                if !self.continue_token.is_empty() {
                    causes.push(Cause::forbidden(
                        F,
                        "resourceVersionMatch is forbidden when continue is provided",
                    ));
                }
            }
        } else {
            if !rvm.is_empty() {
                if self.resource_version.is_empty() {
                    causes.push(Cause::forbidden(
                        F,
                        "resourceVersionMatch is forbidden unless resourceVersion is provided",
                    ));
                }
                if !self.continue_token.is_empty() {
                    causes.push(Cause::forbidden(
                        F,
                        "resourceVersionMatch is forbidden when continue is provided",
                    ));
                }
                match rvm {
                    "NotOlderThan" => {}
                    "Exact" => {
                        if self.resource_version == "0" {
                            causes.push(Cause::forbidden(
                                F,
                                "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
                            ));
                        }
                    }
                    other => causes.push(Cause::not_supported(F, other, &["Exact", "NotOlderThan", ""])),
                }
            }
            if self.send_initial_events.is_some() {
                causes.push(Cause::forbidden("sendInitialEvents", "sendInitialEvents is forbidden for list"));
            }
        }
        if causes.is_empty() {
            Ok(())
        } else {
            Err(Error::InvalidListOptions { causes })
        }
    }

    /// The validated `resourceVersionMatch`.
    pub fn rv_match(&self) -> Option<RvMatch> {
        match self.resource_version_match.as_str() {
            "Exact" => Some(RvMatch::Exact),
            "NotOlderThan" => Some(RvMatch::NotOlderThan),
            _ => None,
        }
    }

    /// Parses `resourceVersion`; the error is the bare storage text (callers wrap it as the
    /// apiserver does for their verb: see `rv_for_list` / `rv_for_get_or_watch`).
    pub fn rv(&self) -> Result<RvParam, String> {
        if self.resource_version.is_empty() {
            return Ok(RvParam::Unset);
        }
        match Rv::parse(&self.resource_version)? {
            Rv(0) => Ok(RvParam::Zero),
            rv => Ok(RvParam::At(rv)),
        }
    }

    /// LIST: a non-numeric RV is 400 `invalid resource version: …` (1.36).
    pub fn rv_for_list(&self) -> Result<RvParam, Error> {
        self.rv().map_err(|e| Error::BadRequest(format!("invalid resource version: {e}")))
    }

    /// GET / WATCH: the cacher returns the raw storage error, rendered as a 500 without reason.
    pub fn rv_for_get_or_watch(&self) -> Result<RvParam, Error> {
        self.rv().map_err(Error::InternalRaw)
    }

    /// The LIST `continue` checks done by storage, in the apiserver's order: decode the token,
    /// then refuse it together with a resourceVersion other than ""/"0".
    pub fn continue_for_list(&self) -> Result<Option<ContinueToken>, Error> {
        if self.continue_token.is_empty() {
            return Ok(None);
        }
        let token = ContinueToken::decode(&self.continue_token)?;
        if !(self.resource_version.is_empty() || self.resource_version == "0") {
            return Err(Error::BadRequest(
                "specifying resource version is not allowed when using continue".into(),
            ));
        }
        Ok(Some(token))
    }

    /// The watch's `timeoutSeconds` as the apiserver reads it: Go's
    /// `time.Duration(timeoutSeconds) * time.Second`, which wraps (9 223 372 037 s is negative).
    pub fn watch_timeout(&self) -> WatchTimeout {
        match self.timeout_seconds.map(|s| s.wrapping_mul(1_000_000_000)) {
            Some(ns) if ns > 0 => WatchTimeout::After(std::time::Duration::from_nanos(ns.unsigned_abs())),
            // The watch's context is done at once: 200 and no event (recorded from 1.28.7).
            Some(ns) if ns < 0 => WatchTimeout::Now,
            _ => WatchTimeout::Default,
        }
    }

    /// `limit` when positive.
    pub fn limit(&self) -> Option<usize> {
        (self.limit > 0).then(|| usize::try_from(self.limit).unwrap_or(usize::MAX))
    }
}

/// Go's `strconv.ParseInt(v, 10, 64)`, its error as the apiserver's 400 text.
fn parse_int(v: &str) -> Result<i64, Error> {
    v.parse::<i64>().map_err(|e| {
        let why = match e.kind() {
            std::num::IntErrorKind::PosOverflow | std::num::IntErrorKind::NegOverflow => "value out of range",
            _ => "invalid syntax",
        };
        Error::BadRequest(format!("strconv.ParseInt: parsing {}: {why}", crate::resource::go_quote(v)))
    })
}

/// A decoded continue token (docs/apiserver-watch-cache.md §6.1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContinueToken {
    /// The list RV the pages belong to; negative means "continue at the latest state".
    pub rv: i64,
    /// The key to start from, relative to the list's prefix, cleaned, without a leading `/`
    /// (it usually ends with NUL: the first key strictly after the last one returned).
    pub start: String,
}

#[derive(Serialize, Deserialize)]
struct TokenJson {
    #[serde(default)]
    v: String,
    #[serde(default)]
    rv: i64,
    #[serde(default)]
    start: String,
}

const INVALID: &str = "invalid continue token: continue key is not valid";

impl ContinueToken {
    /// `storage.DecodeContinue` with the apiserver's 400 texts.
    pub fn decode(s: &str) -> Result<ContinueToken, Error> {
        let data = URL_SAFE_NO_PAD.decode(s.as_bytes()).map_err(|e| {
            let at = match e {
                base64::DecodeError::InvalidByte(off, _) => off,
                base64::DecodeError::InvalidLastSymbol(off, _) => off,
                base64::DecodeError::InvalidLength(len) => len - len % 4,
                base64::DecodeError::InvalidPadding => s.find('=').unwrap_or(s.len()),
            };
            Error::BadRequest(format!("{INVALID}: illegal base64 data at input byte {at}"))
        })?;
        let t: TokenJson = serde_json::from_slice(&data)
            .map_err(|e| Error::BadRequest(format!("{INVALID}: {}", go_json_error(&data, &e))))?;
        if t.v != "meta.k8s.io/v1" {
            return Err(Error::BadRequest(format!(
                "{INVALID}: server does not recognize this encoded version {}",
                t.v
            )));
        }
        if t.rv == 0 {
            return Err(Error::BadRequest(format!(
                "{INVALID}: incorrect encoded start resourceVersion (version meta.k8s.io/v1)"
            )));
        }
        if t.start.is_empty() {
            return Err(Error::BadRequest(format!(
                "{INVALID}: encoded start key empty (version meta.k8s.io/v1)"
            )));
        }
        let key = if t.start.starts_with('/') { t.start.clone() } else { format!("/{}", t.start) };
        if clean_path(&key) != key {
            return Err(Error::BadRequest(format!("{INVALID}: {}", t.start)));
        }
        Ok(ContinueToken { rv: t.rv, start: key[1..].to_owned() })
    }

    /// Encodes like the apiserver: base64url without padding of
    /// `{"v":"meta.k8s.io/v1","rv":N,"start":"<key>"}` with Go's JSON escaping.
    pub fn encode(&self) -> String {
        let json = format!(
            "{{\"v\":\"meta.k8s.io/v1\",\"rv\":{},\"start\":{}}}",
            self.rv,
            go_json_string(&self.start)
        );
        URL_SAFE_NO_PAD.encode(json.as_bytes())
    }

    /// The token that continues after `last_key` (relative to the list prefix).
    pub fn after(rv: i64, last_key: &str) -> ContinueToken {
        ContinueToken { rv, start: format!("{last_key}\u{0}") }
    }
}

/// Go's `encoding/json` string encoding: `\u0000`-style escapes for control characters and
/// HTML-sensitive `<`, `>`, `&`, U+2028/2029.
fn go_json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Approximates Go's `json.Unmarshal` error text for the common cases.
fn go_json_error(data: &[u8], e: &serde_json::Error) -> String {
    let first = data.iter().copied().find(|b| !b.is_ascii_whitespace());
    match first {
        None => "unexpected end of JSON input".into(),
        Some(b) if !matches!(b, b'{' | b'[' | b'"' | b'-' | b'0'..=b'9' | b't' | b'f' | b'n') => {
            format!("invalid character {} looking for beginning of value", go_char(b))
        }
        Some(b) if b != b'{' && b != b'n' => {
            "json: cannot unmarshal non-object into Go value of type storage.continueToken".into()
        }
        _ if e.is_eof() => "unexpected end of JSON input".into(),
        _ => e.to_string(),
    }
}

fn go_char(b: u8) -> String {
    match b {
        b'\'' => "'\\''".into(),
        b'"' => "'\"'".into(),
        b if b.is_ascii_graphic() => format!("'{}'", b as char),
        b => format!("'\\x{b:02x}'"),
    }
}

/// Go's `path.Clean` for absolute paths.
fn clean_path(p: &str) -> String {
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
mod tests;
