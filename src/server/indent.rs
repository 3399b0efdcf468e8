//! Pretty JSON as the apiserver writes it for people: `?pretty=true`, or a user agent starting
//! with `curl`, `Wget` or `Mozilla/5.0` (`negotiation.isPrettyPrint`), makes its JSON serializer
//! `json.MarshalIndent(obj, "", "  ")` — which is `json.Indent` of the compact encoding, with no
//! trailing newline (the compact encoder ends with one). Watches are never indented (their
//! stream serializer is not the pretty one); protobuf has no pretty form.
//!
//! Pure; called by `phase::pretty` (the decision, and the indentation whole or a piece at a
//! time).

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

/// The first value of `pretty`, as Go's `url.Values.Get` gives it (`params::query_pairs`: pairs
/// holding a `;` or a bad escape are dropped by `url.ParseQuery`), if it is non-empty.
fn pretty_param(query: &str) -> Option<String> {
    crate::params::query_pairs(query)
        .find(|(k, _)| k == "pretty")
        .map(|(_, v)| v.into_owned())
        .filter(|v| !v.is_empty())
}

/// `json.Indent(dst, src, "", "  ")` of a compact JSON document, its surrounding whitespace
/// left out (`MarshalIndent`'s output has none). Input that is not JSON is indented as far as
/// its brackets go, never rejected: the cache only holds what it parsed.
pub fn indent(src: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(src.len() + src.len() / 2);
    Indenter::default().feed(src, &mut out);
    Bytes::from(out)
}

/// How far a piece of input may grow by indentation: [`GROWTH`] times itself and
/// [`GROWTH_SLACK`] more (then the rest of it, compact). Real objects grow ~1.5–2× (the recordings' largest: 2.04×); one nested
/// thousands deep (a custom resource preserving unknown fields) would grow with the square of its
/// depth — `json.Indent` writes `2 × depth` spaces a line: 10 000 deep, 20 KB → 200 MB. Past the
/// bound the rest of the answer is sent compact: the same JSON, without its whitespace.
pub const GROWTH: usize = 8;
/// See [`GROWTH`].
pub const GROWTH_SLACK: usize = 64 * 1024;

/// `json.Indent`'s state between two pieces of its input.
#[derive(Default)]
pub struct Indenter {
    depth: usize,
    in_string: bool,
    escaped: bool,
    /// An opening bracket whose newline waits for the next byte (`{}` and `[]` stay as they
    /// are).
    opened: bool,
    /// A piece grew past [`GROWTH`]: the rest is written compact.
    compact: bool,
}

impl Indenter {
    /// The indentation of the next piece of the document.
    pub fn piece(&mut self, src: &[u8]) -> Bytes {
        let mut out = Vec::with_capacity(src.len() + src.len() / 2);
        self.feed(src, &mut out);
        Bytes::from(out)
    }

    /// Indents the next piece of the document into `out`.
    pub fn feed(&mut self, src: &[u8], out: &mut Vec<u8>) {
        let limit = out.len() + GROWTH * src.len() + GROWTH_SLACK;
        let newline = |out: &mut Vec<u8>, depth: usize, compact: &mut bool| {
            if *compact || out.len() + 1 + 2 * depth > limit {
                *compact = true;
                return;
            }
            out.push(b'\n');
            out.resize(out.len() + 2 * depth, b' ');
        };
        let mut i = 0;
        while i < src.len() {
            if self.in_string {
                // A string's bytes as they are, up to its closing quote or an escape.
                let rest = &src[i..];
                if self.escaped {
                    self.escaped = false;
                    out.push(rest[0]);
                    i += 1;
                    continue;
                }
                match memchr::memchr2(b'"', b'\\', rest) {
                    None => {
                        out.extend_from_slice(rest);
                        return;
                    }
                    Some(j) => {
                        out.extend_from_slice(&rest[..=j]);
                        if rest[j] == b'"' {
                            self.in_string = false;
                        } else {
                            self.escaped = true;
                        }
                        i += j + 1;
                        continue;
                    }
                }
            }
            let c = src[i];
            i += 1;
            if matches!(c, b' ' | b'\t' | b'\n' | b'\r') {
                continue;
            }
            if self.opened {
                self.opened = false;
                if c == b'}' || c == b']' {
                    self.depth = self.depth.saturating_sub(1);
                    out.push(c);
                    continue;
                }
                newline(out, self.depth, &mut self.compact);
            }
            match c {
                b'"' => {
                    self.in_string = true;
                    out.push(c);
                }
                b'{' | b'[' => {
                    out.push(c);
                    self.depth += 1;
                    self.opened = true;
                }
                b',' => {
                    out.push(c);
                    newline(out, self.depth, &mut self.compact);
                }
                b':' if self.compact => out.push(c),
                b':' => out.extend_from_slice(b": "),
                b'}' | b']' => {
                    self.depth = self.depth.saturating_sub(1);
                    newline(out, self.depth, &mut self.compact);
                    out.push(c);
                }
                _ => out.push(c),
            }
        }
    }
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

    /// Cut anywhere — inside a string, an escape, between a bracket and what follows it — the
    /// pieces indent to the whole's indentation.
    #[test]
    fn a_document_in_pieces_indents_as_the_whole() {
        let doc = br#"{"kind":"PodList","items":[{"a":[1,2],"b":[],"c":"x,{}:[\"]\\","d":{}},{"e":"\u00e9 \\\"q\""}],"f":null}
"#;
        let whole = indent(doc);
        for cut in 0..=doc.len() {
            for cut2 in cut..=doc.len() {
                let mut ind = Indenter::default();
                let got = [&doc[..cut], &doc[cut..cut2], &doc[cut2..]].map(|p| ind.piece(p)).concat();
                assert_eq!(got, whole, "cut at {cut}, {cut2}");
            }
        }
    }

    /// An object nested 5 000 deep would grow to 50 MB indented (`2 × depth` spaces a line):
    /// past [`GROWTH`] the rest goes compact, the same JSON. Whole or in pieces.
    #[test]
    fn deep_nesting_grows_at_most_growth_times() {
        let depth = 5_000;
        let mut doc = br#"{"kind":"Widget","spec":"#.to_vec();
        doc.extend(std::iter::repeat_n(&b"{\"a\":["[..], depth).flatten());
        doc.extend_from_slice(b"1");
        doc.extend(std::iter::repeat_n(&b"]}"[..], depth).flatten());
        doc.extend_from_slice(b"}");
        let whole = indent(&doc);
        assert!(
            whole.len() <= (GROWTH + 1) * doc.len() + GROWTH_SLACK,
            "{} bytes from {}",
            whole.len(),
            doc.len()
        );
        assert!(
            whole.starts_with(b"{\n  \"kind\": \"Widget\",\n  \"spec\": {\n"),
            "indented as far as the bound"
        );
        let mut ind = Indenter::default();
        let pieces: Vec<u8> = doc.chunks(1000).flat_map(|c| ind.piece(c).to_vec()).collect();
        assert!(pieces.len() <= (GROWTH + 1) * doc.len() + GROWTH_SLACK * doc.len().div_ceil(1000));
        for out in [&whole[..], &pieces[..]] {
            let compact: Vec<u8> = out.iter().copied().filter(|b| !matches!(b, b' ' | b'\n')).collect();
            assert_eq!(compact, doc, "the same JSON, whitespace aside");
        }
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
        assert!(
            wanted(Some("pretty=%ZZ&pretty=true"), None),
            "a pair with a bad escape is dropped (Go), not the first value"
        );
        assert!(wanted(Some("pretty=%74rue"), None), "decoded");
    }
}
