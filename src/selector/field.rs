//! Field selectors: a port of apimachinery `fields.ParseSelector` (terms, operators, escapes
//! and error texts) followed by the apiserver's per-resource field-label conversion, which
//! decides which fields exist and how an unknown one is reported.
//!
//! Used through `selector::FieldSelector` by `server::classify` (the `fieldSelector` query
//! parameter), `cache` (filtering, and `exact` for scoping and the pod `spec.nodeName`
//! index) and `sim`.

use std::fmt;

use crate::error::Error;
use crate::resource::{go_quote, FieldLabelStyle, Header, ResourceKind};

/// A parsed `fieldSelector` (requirements ANDed), validated for one resource.
///
/// Terms are kept in Go's order (the raw terms sorted bytewise), which decides what `exact`
/// returns when a field is required twice. Equality ignores the order.
#[derive(Clone, Debug, Default)]
pub struct FieldSelector {
    terms: Vec<Term>,
}

/// One `field=value` / `field!=value` term; `field` is the converted (canonical) name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Term {
    field: &'static str,
    op: Op,
    value: String,
}

/// `=` and `==` are the same requirement (Go's `hasTerm`); `!=` is `notHasTerm`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Op {
    Equals,
    NotEquals,
}

impl FieldSelector {
    /// Parses like apimachinery `fields.ParseSelector` and checks each field against the
    /// resource's selectable fields (`ResourceKind::field_labels`), with the apiserver's 400
    /// texts. Syntax errors in any term are reported before unknown fields, each in the
    /// sorted order of the raw terms, as the apiserver does.
    pub fn parse(s: &str, kind: &ResourceKind) -> Result<FieldSelector, Error> {
        let raw = parse_terms(s)?;
        let mut terms = Vec::with_capacity(raw.len());
        for t in raw {
            let field = convert_field_label(kind, &t.field).map_err(Error::BadRequest)?;
            let op = if t.equals { Op::Equals } else { Op::NotEquals };
            terms.push(Term { field, op, value: t.value });
        }
        Ok(FieldSelector { terms })
    }

    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// How many terms (each a field read and a comparison per object).
    pub fn len(&self) -> usize {
        self.terms.len()
    }

    /// The value of an exact `field=value` / `field==value` requirement, if there is one
    /// (used for `metadata.name`, `metadata.namespace`, `spec.nodeName`).
    pub fn exact(&self, field: &str) -> Option<&str> {
        self.terms.iter().find(|t| t.field == field && t.op == Op::Equals).map(|t| t.value.as_str())
    }

    pub fn matches(&self, header: &Header) -> bool {
        self.terms.iter().all(|t| {
            let have = field_value(header, t.field);
            match t.op {
                Op::Equals => have == t.value,
                Op::NotEquals => have != t.value,
            }
        })
    }

    fn sorted_terms(&self) -> Vec<&Term> {
        let mut v: Vec<&Term> = self.terms.iter().collect();
        v.sort();
        v
    }
}

impl PartialEq for FieldSelector {
    fn eq(&self, other: &FieldSelector) -> bool {
        self.sorted_terms() == other.sorted_terms()
    }
}

impl Eq for FieldSelector {}

impl fmt::Display for FieldSelector {
    /// Go's `String()`: `field=value` / `field!=value` with the value escaped, joined by `,`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, t) in self.terms.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            let op = match t.op {
                Op::Equals => "=",
                Op::NotEquals => "!=",
            };
            write!(f, "{}{}{}", t.field, op, escape(&t.value))?;
        }
        Ok(())
    }
}

/// One term of a field selector as apimachinery `fields.ParseSelector(s).Requirements()` gives
/// it, before any per-resource conversion: the field as written, `=` / `==` (`equals`) or `!=`,
/// and the unescaped value. Used where the apiserver parses without a resource: the
/// authorization attributes (`server::auth::selectors`) and the `metadata.name` of a request.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RawTerm {
    pub field: String,
    pub equals: bool,
    pub value: String,
}

/// `fields.ParseSelector`: terms split on unescaped commas, sorted bytewise as Go sorts them,
/// empty ones dropped; the 400 texts of a term without an operator or with a bad escape.
pub fn parse_terms(s: &str) -> Result<Vec<RawTerm>, Error> {
    let mut parts = split_terms(s);
    parts.sort_unstable();
    let mut out = Vec::with_capacity(parts.len());
    for part in parts.into_iter().filter(|p| !p.is_empty()) {
        let Some((lhs, op, rhs)) = split_term(part) else {
            return Err(Error::BadRequest(format!("invalid selector: '{s}'; can't understand '{part}'")));
        };
        let value = unescape(rhs).map_err(Error::BadRequest)?;
        out.push(RawTerm { field: lhs.to_owned(), equals: op == Op::Equals, value });
    }
    Ok(out)
}

/// What a field selector compares for `field`: Go's `fields.Set.Get`, absent = `""`.
fn field_value<'h>(header: &'h Header, field: &str) -> &'h str {
    match field {
        "metadata.name" => header.name(),
        "metadata.namespace" => header.namespace(),
        f => header.fields().get(f).unwrap_or(""),
    }
}

/// The apiserver's field-label conversion for `kind`: the canonical field name, or the 400
/// text for a field the resource does not support.
fn convert_field_label(kind: &ResourceKind, label: &str) -> Result<&'static str, String> {
    let (extra, style) = kind.field_labels();
    // Custom resources: apiextensions' converter, which words errors like the custom funcs.
    let style = if kind.builtin { style } else { FieldLabelStyle::Custom };
    match label {
        "metadata.name" => return Ok("metadata.name"),
        // The default conversion accepts it even for cluster-scoped kinds; the custom ones
        // (nodes, namespaces, cluster-scoped CRDs) do not.
        "metadata.namespace" if kind.namespaced || style == FieldLabelStyle::Default => {
            return Ok("metadata.namespace")
        }
        _ => {}
    }
    if kind.group.is_empty() && kind.resource == "pods" {
        match label {
            // Backwards compatibility with old v1 clients.
            "spec.host" => return Ok("spec.nodeName"),
            // Accepted by the conversion but not in the pod's field set: it compares to "".
            "status.podIPs" => return Ok("status.podIPs"),
            _ => {}
        }
    }
    if let Some(f) = extra.iter().find(|f| **f == label) {
        return Ok(f);
    }
    Err(match style {
        FieldLabelStyle::Custom => format!("field label not supported: {label}"),
        FieldLabelStyle::Default => format!(
            "{} is not a known field selector: only \"metadata.name\", \"metadata.namespace\"",
            go_quote(label)
        ),
        FieldLabelStyle::Job => format!("field label {} not supported for Job", go_quote(label)),
    })
}

/// Go's `splitTerms`: splits on commas not escaped by a backslash (escapes are kept).
fn split_terms(s: &str) -> Vec<&str> {
    if s.is_empty() {
        return Vec::new();
    }
    let mut terms = Vec::new();
    let mut start = 0;
    let mut in_slash = false;
    for (i, c) in s.char_indices() {
        if in_slash {
            in_slash = false;
        } else if c == '\\' {
            in_slash = true;
        } else if c == ',' {
            terms.push(&s[start..i]);
            start = i + 1;
        }
    }
    terms.push(&s[start..]);
    terms
}

/// Go's `splitTerm`: the first position where `!=`, `==` or `=` starts (tried in that
/// order) splits the term; the right-hand side is still escaped.
fn split_term(term: &str) -> Option<(&str, Op, &str)> {
    for (i, _) in term.char_indices() {
        let rest = &term[i..];
        if let Some(rhs) = rest.strip_prefix("!=") {
            return Some((&term[..i], Op::NotEquals, rhs));
        }
        if let Some(rhs) = rest.strip_prefix("==").or_else(|| rest.strip_prefix('=')) {
            return Some((&term[..i], Op::Equals, rhs));
        }
    }
    None
}

/// Go's `UnescapeValue`: `\\`, `\,`, `\=` are the only escapes; bare `,` / `=` are errors.
fn unescape(s: &str) -> Result<String, String> {
    if !s.contains(['\\', ',', '=']) {
        return Ok(s.to_owned());
    }
    let mut out = String::with_capacity(s.len());
    let mut in_slash = false;
    for c in s.chars() {
        if in_slash {
            match c {
                '\\' | ',' | '=' => out.push(c),
                _ => return Err(format!("invalid field selector: invalid escape sequence: \\{c}")),
            }
            in_slash = false;
            continue;
        }
        match c {
            '\\' => in_slash = true,
            // Go prints the rune with %v, i.e. as a number.
            ',' | '=' => {
                return Err(format!("invalid field selector: unescaped character in value: {}", c as u32))
            }
            _ => out.push(c),
        }
    }
    if in_slash {
        return Err("invalid field selector: invalid escape sequence: \\".to_owned());
    }
    Ok(out)
}

/// Go's `fields.EscapeValue`: a value that stays one value in a field selector.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '\\' | ',' | '=') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests;
