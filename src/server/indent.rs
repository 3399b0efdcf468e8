//! Pretty JSON as the apiserver writes it for people: `?pretty=true`, or a user agent starting
//! with `curl`, `Wget` or `Mozilla/5.0` (`negotiation.isPrettyPrint`), makes its JSON serializer
//! `json.MarshalIndent(obj, "", "  ")` — which is `json.Indent` of the compact encoding, with no
//! trailing newline (the compact encoder ends with one). Watches are never indented (their
//! stream serializer is not the pretty one); protobuf has no pretty form.
//!
//! Pure; called by `phase::pretty` (the decision and the indentation of a whole body).

use bytes::Bytes;

/// Whether the apiserver would indent its JSON answer to a request with this query string and
/// `User-Agent`: a non-empty `pretty` parameter decides alone (Go's `strconv.ParseBool`, an
/// invalid value being false); otherwise the user agent does.
pub fn wanted(query: Option<&str>, user_agent: Option<&[u8]>) -> bool {
    if let Some(v) = query.filter(|q| q.contains("pretty")).and_then(pretty_param) {
        return matches!(v.as_str(), "1" | "t" | "T" | "TRUE" | "true" | "True");
    }
    user_agent.is_some_and(|ua| [&b"curl"[..], b"Wget", b"Mozilla/5.0"].iter().any(|p| ua.starts_with(p)))
}

/// The first value of `pretty`, as Go's `url.Values.Get` gives it (pairs holding a `;` are
/// dropped by `url.ParseQuery`), if it is non-empty.
fn pretty_param(query: &str) -> Option<String> {
    query
        .split('&')
        .filter(|pair| !pair.contains(';'))
        .flat_map(|pair| form_urlencoded::parse(pair.as_bytes()))
        .find(|(k, _)| k == "pretty")
        .map(|(_, v)| v.into_owned())
        .filter(|v| !v.is_empty())
}

/// `json.Indent(dst, src, "", "  ")` of a compact JSON document, its surrounding whitespace
/// left out (`MarshalIndent`'s output has none). Input that is not JSON is indented as far as
/// its brackets go, never rejected: the cache only holds what it parsed.
pub fn indent(src: &[u8]) -> Bytes {
    let src = src.trim_ascii();
    let mut out = Vec::with_capacity(src.len() + src.len() / 2);
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    // An opening bracket whose newline waits for the next byte (`{}` and `[]` stay as they are).
    let mut opened = false;
    let newline = |out: &mut Vec<u8>, depth: usize| {
        out.push(b'\n');
        out.resize(out.len() + 2 * depth, b' ');
    };
    for &c in src {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == b'\\' {
                escaped = true;
            } else if c == b'"' {
                in_string = false;
            }
            continue;
        }
        if matches!(c, b' ' | b'\t' | b'\n' | b'\r') {
            continue;
        }
        if opened {
            opened = false;
            if c == b'}' || c == b']' {
                depth = depth.saturating_sub(1);
                out.push(c);
                continue;
            }
            newline(&mut out, depth);
        }
        match c {
            b'"' => {
                in_string = true;
                out.push(c);
            }
            b'{' | b'[' => {
                out.push(c);
                depth += 1;
                opened = true;
            }
            b',' => {
                out.push(c);
                newline(&mut out, depth);
            }
            b':' => out.extend_from_slice(b": "),
            b'}' | b']' => {
                depth = depth.saturating_sub(1);
                newline(&mut out, depth);
                out.push(c);
            }
            _ => out.push(c),
        }
    }
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(b: Bytes) -> String {
        String::from_utf8(b.to_vec()).unwrap()
    }

    /// Go 1.22: `json.MarshalIndent` of a Status and of a list, as the apiserver sends them
    /// to curl (the compact form ends with the encoder's newline).
    #[test]
    fn indents_as_go_marshal_indent() {
        let status = br#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Unauthorized","reason":"Unauthorized","code":401}
"#;
        assert_eq!(
            s(indent(status)),
            "{\n  \"kind\": \"Status\",\n  \"apiVersion\": \"v1\",\n  \"metadata\": {},\n  \"status\": \"Failure\",\n  \"message\": \"Unauthorized\",\n  \"reason\": \"Unauthorized\",\n  \"code\": 401\n}"
        );
        let list = br#"{"items":[{"a":[1,2],"b":[],"c":"x,{}:[\"]\\"}],"d":{},"e":null}"#;
        assert_eq!(
            s(indent(list)),
            "{\n  \"items\": [\n    {\n      \"a\": [\n        1,\n        2\n      ],\n      \"b\": [],\n      \"c\": \"x,{}:[\\\"]\\\\\"\n    }\n  ],\n  \"d\": {},\n  \"e\": null\n}"
        );
        assert_eq!(s(indent(b"[]\n")), "[]");
    }

    #[test]
    fn who_gets_pretty_json() {
        let curl = Some(&b"curl/8.5.0"[..]);
        assert!(wanted(None, curl));
        assert!(wanted(Some("limit=5"), Some(b"Wget/1.21")));
        assert!(wanted(None, Some(b"Mozilla/5.0 (X11)")));
        assert!(!wanted(None, Some(b"kubectl/v1.28.7")));
        assert!(!wanted(None, None));
        // The parameter decides alone when it has a value.
        assert!(!wanted(Some("pretty=false"), curl));
        assert!(!wanted(Some("pretty=yes"), curl), "not a Go bool: false");
        assert!(wanted(Some("pretty=1"), None));
        assert!(wanted(Some("limit=1&pretty=True&pretty=0"), None), "the first value");
        assert!(wanted(Some("pretty="), curl), "empty: the user agent decides");
        assert!(!wanted(Some("pretty="), None));
        assert!(!wanted(Some("a=1;pretty=true"), None), "a pair with `;` is dropped");
        assert!(wanted(Some("pretty=%74rue"), None), "decoded");
    }
}
