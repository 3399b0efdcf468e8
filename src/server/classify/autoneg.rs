//! The clauses of an `Accept` header in the order the apiserver walks them: a port of
//! `github.com/munnerz/goautoneg`'s `ParseAccept` (the version Kubernetes 1.28 to 1.36 vendor),
//! quirks included, and the apiserver's choice of how an error `Status` is written
//! (`ErrorNegotiated`).
//!
//! What the port keeps, because the apiserver's answer follows it:
//! - nothing is lowercased: `Application/JSON` or `Q=0.5` are not JSON or a q-value there;
//! - only spaces are trimmed (not tabs), a parameter's value keeps its quotes, a `q` value is
//!   read untrimmed (`q= 0.5` is q 0), a clause without `/` is dropped unless it is `*`;
//! - `q=0` clauses are kept (the apiserver serves `application/json;q=0` as JSON);
//! - the order: `sort.Sort` with goautoneg's `Less`, which puts a clause with a concrete type
//!   (or subtype) before a wildcard one whatever their q-values. `sort.Sort` is an insertion
//!   sort up to 12 clauses (`pdqsort`'s `maxInsertion`), which is what [`parse`] does; past
//!   that, and for a `q` written in a form this port does not read as Go's `ParseFloat` does
//!   (hexadecimal, underscores), [`Accept::exact`] is false and the proxy leaves the request to
//!   the apiserver.
//!
//! Pure. Called by `accept` (the proxy's negotiation) and by the simulated apiserver (its own
//! negotiation and error encoding), checked against the 78 negotiations recorded from a real
//! apiserver (`tests/recordings/v1.28.7-raw/protobuf.json`).

/// One clause: `type/subtype;params`, as goautoneg's `Accept`.
#[derive(Clone, Debug, PartialEq)]
pub struct Clause<'a> {
    pub ty: &'a str,
    pub sub: &'a str,
    pub q: f64,
    /// Every parameter but `q`, as Go's map: a name given twice keeps its last value.
    pub params: Vec<(&'a str, &'a str)>,
}

impl<'a> Clause<'a> {
    /// The value of parameter `name` (exact name).
    pub fn param(&self, name: &str) -> Option<&'a str> {
        self.params.iter().find(|(k, _)| *k == name).map(|(_, v)| *v)
    }

    /// Whether the clause names `application/<sub>`, `application/*` or `*/*`: the
    /// apiserver's match of a clause against one of its serializers.
    pub fn matches(&self, sub: &str) -> bool {
        (self.ty == "application" && (self.sub == sub || self.sub == "*"))
            || (self.ty == "*" && self.sub == "*")
    }
}

/// The clauses of a header, in the apiserver's order.
#[derive(Debug)]
pub struct Accept<'a> {
    pub clauses: Vec<Clause<'a>>,
    /// The order and q-values are Go's for sure (see the module's text).
    pub exact: bool,
}

/// `pdqsort`'s `maxInsertion`: `sort.Sort` of at most this many elements is an insertion sort.
const GO_INSERTION_MAX: usize = 12;

/// Go's `nextSplitElement`.
fn split(s: &str, sep: char) -> (&str, &str) {
    match s.find(sep) {
        Some(i) => (&s[..i], &s[i + 1..]),
        None => (s, ""),
    }
}

fn trim(s: &str) -> &str {
    s.trim_matches(' ')
}

/// `strconv.ParseFloat(s, 32)` as goautoneg uses it (an error is 0); `None` for a form this
/// port does not read as Go does (Go's hexadecimal floats, and underscores between digits,
/// which Go takes as in its literals: `1_0` is 10).
fn go_q(s: &str) -> Option<f64> {
    let unsigned = s.strip_prefix(['+', '-']).unwrap_or(s);
    if unsigned.starts_with("0x") || unsigned.starts_with("0X") || s.contains('_') {
        return None;
    }
    // Go reads a sign before `inf` but not before `nan` (a syntax error: 0).
    if s.len() > 1 && s.starts_with(['+', '-']) && s[1..].starts_with(['n', 'N']) {
        return Some(0.0);
    }
    Some(s.parse::<f32>().map_or(0.0, f64::from))
}

/// goautoneg's `Less`: not an order (a concrete type is "less" than a wildcard whatever q).
fn less(a: &Clause<'_>, b: &Clause<'_>) -> bool {
    a.q > b.q || (a.ty != "*" && b.ty == "*") || (a.sub != "*" && b.sub == "*")
}

/// goautoneg's `ParseAccept`, sorted as Go's `sort.Sort` sorts up to 12 clauses.
pub fn parse(header: &str) -> Accept<'_> {
    let mut clauses = Vec::new();
    let mut exact = true;
    let mut remaining = header;
    while !remaining.is_empty() {
        let part;
        (part, remaining) = split(remaining, ',');
        let part = trim(part);
        let (sp, mut rest) = split(part, ';');
        let (ty, sub_rest) = split(sp, '/');
        let ty = trim(ty);
        let sub = if sub_rest.is_empty() {
            if ty != "*" {
                continue;
            }
            "*"
        } else {
            let (sub, more) = split(sub_rest, '/');
            if !more.is_empty() {
                continue;
            }
            trim(sub)
        };
        let mut clause = Clause { ty, sub, q: 1.0, params: Vec::new() };
        while !rest.is_empty() {
            let param;
            (param, rest) = split(rest, ';');
            let (name, value_rest) = split(param, '=');
            if value_rest.is_empty() {
                continue;
            }
            let (value, more) = split(value_rest, '=');
            if !more.is_empty() {
                continue;
            }
            let name = trim(name);
            if name == "q" {
                match go_q(value) {
                    Some(q) => clause.q = q,
                    None => exact = false,
                }
            } else {
                clause.params.retain(|(k, _)| *k != name);
                clause.params.push((name, trim(value)));
            }
        }
        clauses.push(clause);
    }
    // Go's insertionSort(data, 0, n).
    for i in 1..clauses.len() {
        let mut j = i;
        while j > 0 && less(&clauses[j], &clauses[j - 1]) {
            clauses.swap(j, j - 1);
            j -= 1;
        }
    }
    exact &= clauses.len() <= GO_INSERTION_MAX;
    Accept { clauses, exact }
}

/// How the apiserver writes an error `Status` for a request (`ErrorNegotiated` →
/// `WriteObjectNegotiated` with `DefaultEndpointRestrictions`): in the first clause's
/// encoding among those that ask for no transform (no `as`, `g` or `v`), no server version
/// (`sv`) and no stream but `watch`; when none does, raw indented JSON without a newline
/// (`WriteRawJSON`). JSON with `pretty=1` is its pretty serializer, `json.MarshalIndent` too:
/// the same bytes as `RawJson`. An absent or empty header is JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorEncoding {
    Json,
    Yaml,
    Protobuf,
    RawJson,
}

/// The [`ErrorEncoding`] of an `Accept` header.
pub fn error_encoding(header: &str) -> ErrorEncoding {
    if header.is_empty() {
        return ErrorEncoding::Json;
    }
    // The apiserver's serializers in their order; YAML has no stream serializer.
    const SERIALIZERS: [(&str, bool, ErrorEncoding); 3] = [
        ("json", true, ErrorEncoding::Json),
        ("yaml", false, ErrorEncoding::Yaml),
        ("vnd.kubernetes.protobuf", true, ErrorEncoding::Protobuf),
    ];
    for c in parse(header).clauses {
        let transform =
            c.params.iter().any(|(k, v)| matches!(*k, "as" | "g" | "v") || (*k == "sv" && !v.is_empty()));
        if transform {
            continue;
        }
        let stream = c.param("stream").unwrap_or("");
        for (sub, streams, encoding) in SERIALIZERS {
            if c.matches(sub) && (stream.is_empty() || (streams && stream == "watch")) {
                if encoding == ErrorEncoding::Json && c.param("pretty") == Some("1") {
                    return ErrorEncoding::RawJson;
                }
                return encoding;
            }
        }
    }
    ErrorEncoding::RawJson
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(h: &str) -> Vec<String> {
        parse(h).clauses.iter().map(|c| format!("{}/{} {}", c.ty, c.sub, c.q)).collect()
    }

    #[test]
    fn parses_as_goautoneg() {
        // goautoneg's own test: q first, then specificity.
        assert_eq!(
            order("text/html, text/*;q=0.9, */*;q=0.8, text/plain;q=0.95"),
            [
                "text/html 1",
                "text/plain 0.949999988079071",
                "text/* 0.8999999761581421",
                "*/* 0.800000011920929"
            ]
        );
        // Less puts a concrete type before a wildcard whatever q.
        assert_eq!(
            order("*/*, application/vnd.kubernetes.protobuf;q=0.5"),
            ["application/vnd.kubernetes.protobuf 0.5", "*/* 1"]
        );
        assert_eq!(
            order("application/*, application/json;q=0.1"),
            ["application/json 0.10000000149011612", "application/* 1"]
        );
        // Equal clauses keep their order; q=0 is kept, last.
        assert_eq!(
            order("application/json;q=0, application/yaml"),
            ["application/yaml 1", "application/json 0"]
        );
        // Nothing lowercased; only spaces trimmed; no `/` dropped unless `*`; `a/b/c` dropped.
        assert_eq!(
            order("Application/JSON, \tapplication/json, *, application, a/b/c, application/json/"),
            ["Application/JSON 1", "\tapplication/json 1", "application/json 1", "*/* 1"]
        );
        // q read untrimmed; a bad q is 0; Q is a parameter.
        assert_eq!(order("a/b; q= 0.5"), ["a/b 0"]);
        assert_eq!(order("a/b;q=x1"), ["a/b 0"]);
        assert_eq!(order("a/b;q=-nan"), ["a/b 0"]);
        let h = parse("a/b;Q=0.5;as=\"X\";as=Y; g = meta ;novalue;x=y=z");
        assert_eq!(h.clauses[0].q, 1.0);
        assert_eq!(h.clauses[0].params, [("Q", "0.5"), ("as", "Y"), ("g", "meta")]);
        assert_eq!(parse("a/b;as=\"X\"").clauses[0].param("as"), Some("\"X\""));
        assert!(h.exact);
        assert!(!parse("a/b;q=0x1p-1").exact);
        assert!(!parse("a/b;q=-0X1p-1").exact);
        assert!(!parse("a/b;q=1_0").exact, "Go reads 10");
        assert!(parse(&["a/b"; 12].join(",")).exact);
        assert!(!parse(&["a/b"; 13].join(",")).exact);
        assert!(parse("").clauses.is_empty());
    }

    #[test]
    fn errors_follow_the_first_plain_clause() {
        use ErrorEncoding::*;
        let pb = "application/vnd.kubernetes.protobuf";
        let meta = "as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";
        let cases: &[(String, ErrorEncoding)] = &[
            (String::new(), Json),
            (pb.into(), Protobuf),
            (format!("{pb}, application/json"), Protobuf),
            (format!("{pb};q=0.5, application/json"), Json),
            (format!("{pb};{meta}, application/json;{meta}, application/json"), Json),
            (format!("{pb};{meta}, application/json;{meta}"), RawJson),
            (format!("application/json;{meta}, application/yaml"), Yaml),
            (format!("application/json;{meta}, */*"), Json),
            (format!("application/json;{meta}, application/*"), Json),
            (format!("{pb};stream=watch"), Protobuf),
            (format!("{pb};stream=other, application/yaml"), Yaml),
            // YAML has no stream serializer: `*/*;stream=watch` is JSON, YAML's is skipped.
            ("application/yaml;stream=watch, */*;stream=watch".into(), Json),
            ("application/yaml;stream=watch".into(), RawJson),
            (format!("{pb};sv=v1, application/json"), Json),
            (format!("{pb};sv=, application/json"), Protobuf),
            ("text/html".into(), RawJson),
            // `pretty=1`: JSON's pretty serializer, the same bytes as WriteRawJSON's.
            (format!("application/json;{meta}, application/json;pretty=1"), RawJson),
            ("application/json;pretty=true".into(), Json),
            (format!("{pb};pretty=1"), Protobuf),
            ("Application/Json".into(), RawJson),
            (format!("*/*, {pb};q=0.1"), Protobuf),
        ];
        for (h, want) in cases {
            assert_eq!(error_encoding(h), *want, "Accept: {h}");
        }
    }
}
