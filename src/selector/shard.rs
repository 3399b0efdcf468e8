//! Shard selectors (`shardSelector`, KEP-5866, alpha in 1.36): the grammar, the 64-bit FNV-1a
//! hash of the sharded field, matching, and the canonical text echoed in `ListMeta.shardInfo`.
//!
//! The apiserver parses the parameter with the CEL parser and walks the tree
//! (`k8s.io/apiserver/pkg/sharding/parser.go`); its hash and range test live in
//! `k8s.io/apimachinery/pkg/sharding`. This port recognises exactly the plain forms — calls
//! `ident(arg, …)` joined by `||`, each argument a dotted path or a quoted string without
//! escapes — and, within them, gives every error of `parser.go` with its text. Anything else
//! CEL might read (parentheses, escapes, comments, numbers, member calls, non-ASCII, CEL
//! syntax errors, whose texts come from the CEL parser) is [`ShardError::Unsupported`]: the
//! cache never evaluates a selector it cannot parse exactly, and the request goes upstream.
//!
//! Pure. Called by `server::classify` (parsing) and `cache::filter` (matching).

use std::fmt;

use crate::resource::{go_quote, Header};

/// The field a selector hashes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShardField {
    Uid,
    Namespace,
}

impl ShardField {
    pub fn as_str(self) -> &'static str {
        match self {
            ShardField::Uid => "object.metadata.uid",
            ShardField::Namespace => "object.metadata.namespace",
        }
    }
}

/// One `shardRange(field, start, end)`: hashes in `[start, end)`; `end` may be 2^64.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardRange {
    pub start: u128,
    pub end: u128,
}

/// A parsed, validated shard selector: ranges ORed, all over the same field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardSelector {
    field: ShardField,
    ranges: Vec<ShardRange>,
}

/// Why a selector is not evaluated here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShardError {
    /// The apiserver's error, after `invalid shard selector: ` (it answers 500, no reason).
    Invalid(String),
    /// A form whose reading (or error text) only the CEL parser knows: forward it.
    Unsupported,
}

/// The 64-bit FNV-1a hash (`hash/fnv.New64a`), as `sharding.HashField` computes it.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// 2^64, the exclusive end of the hash space (`'0x10000000000000000'`).
const FULL: u128 = 1 << 64;

/// Selectors longer than this go upstream (CEL's default expression size limit is 100 000
/// code points; a real selector is a few hundred bytes).
const MAX_LEN: usize = 16 * 1024;
/// Ranges beyond this go upstream.
const MAX_RANGES: usize = 256;

impl ShardSelector {
    /// `sharding.Parse` for the plain forms (module doc).
    pub fn parse(raw: &str) -> Result<ShardSelector, ShardError> {
        if raw.len() > MAX_LEN || !raw.is_ascii() {
            return Err(ShardError::Unsupported);
        }
        // Go's strings.TrimSpace (ASCII part: the rest was refused above).
        let expr = raw.trim_matches(|c: char| matches!(c, ' ' | '\t' | '\n' | '\r' | '\x0b' | '\x0c'));
        if expr.is_empty() {
            return Err(ShardError::Invalid(
                "empty shard selector is not allowed; omit the parameter for unfiltered lists".into(),
            ));
        }
        let groups = parse_calls(&lex(expr)?)?;
        let mut reqs = Vec::with_capacity(groups.len());
        for group in &groups {
            // `a && b` is the call `_&&_(a, b)`, refused before its operands are looked at.
            match group.as_slice() {
                [call] => reqs.push(requirement(call)?),
                _ => {
                    return Err(ShardError::Invalid(
                        "unsupported function \"_&&_\"; only shardRange() and || are allowed".into(),
                    ))
                }
            }
        }
        let field = reqs[0].0;
        if let Some((other, _)) = reqs.iter().find(|(f, _)| *f != field) {
            return Err(ShardError::Invalid(format!(
                "all shard ranges must use the same field, got {} and {}",
                go_quote(field.as_str()),
                go_quote(other.as_str())
            )));
        }
        Ok(ShardSelector { field, ranges: reqs.into_iter().map(|(_, r)| r).collect() })
    }

    pub fn field(&self) -> ShardField {
        self.field
    }

    pub fn ranges(&self) -> &[ShardRange] {
        &self.ranges
    }

    /// Whether the field's value hashes into one of the ranges.
    pub fn matches_value(&self, value: &str) -> bool {
        let h = u128::from(fnv1a64(value.as_bytes()));
        self.ranges.iter().any(|r| r.start <= h && h < r.end)
    }

    /// Whether an object is in the shard (`sharding.ResolveFieldValue` + `Matches`).
    pub fn matches(&self, h: &Header) -> bool {
        match self.field {
            ShardField::Uid => self.matches_value(&h.uid()),
            ShardField::Namespace => self.matches_value(h.namespace()),
        }
    }
}

/// `Selector.String()`: what `ListMeta.shardInfo.selector` echoes (normalised spacing and
/// single quotes, whatever the request's spelling).
impl fmt::Display for ShardSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.ranges.iter().enumerate() {
            if i > 0 {
                f.write_str(" || ")?;
            }
            write!(f, "shardRange({}, '{}', '{}')", self.field.as_str(), hex(r.start), hex(r.end))?;
        }
        Ok(())
    }
}

fn hex(v: u128) -> String {
    if v == FULL {
        "0x10000000000000000".into()
    } else {
        format!("0x{v:016x}")
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Tok {
    Ident(String),
    Str(String),
    LParen,
    RParen,
    Comma,
    Dot,
    Or,
    And,
}

/// CEL's reserved identifiers (cel-go `parser.reservedIds`) and its keyword tokens: not a
/// function or variable name, a parse error whose text is CEL's.
const RESERVED: &[&str] = &[
    "as",
    "break",
    "const",
    "continue",
    "else",
    "false",
    "for",
    "function",
    "if",
    "import",
    "in",
    "let",
    "loop",
    "package",
    "namespace",
    "null",
    "return",
    "true",
    "var",
    "void",
    "while",
];
/// Keyword tokens, not identifiers, even after a `.`.
const KEYWORDS: &[&str] = &["in", "true", "false", "null"];

fn lex(s: &str) -> Result<Vec<Tok>, ShardError> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        match c {
            b' ' | b'\t' | b'\n' | b'\r' | b'\x0c' => i += 1,
            b'(' | b')' | b',' | b'.' => {
                out.push(match c {
                    b'(' => Tok::LParen,
                    b')' => Tok::RParen,
                    b',' => Tok::Comma,
                    _ => Tok::Dot,
                });
                i += 1;
            }
            b'|' if b.get(i + 1) == Some(&b'|') => {
                out.push(Tok::Or);
                i += 2;
            }
            b'&' if b.get(i + 1) == Some(&b'&') => {
                out.push(Tok::And);
                i += 2;
            }
            b'\'' | b'"' => {
                // A plain one-quote literal; triple quotes, escapes and control characters are
                // CEL's to read.
                if b.get(i + 1) == Some(&c) && b.get(i + 2) == Some(&c) {
                    return Err(ShardError::Unsupported);
                }
                let end = b[i + 1..].iter().position(|&x| x == c).ok_or(ShardError::Unsupported)? + i + 1;
                let body = &s[i + 1..end];
                if body.bytes().any(|x| x == b'\\' || !(0x20..0x7f).contains(&x)) {
                    return Err(ShardError::Unsupported);
                }
                out.push(Tok::Str(body.to_owned()));
                i = end + 1;
            }
            c if c == b'_' || c.is_ascii_alphabetic() => {
                let end = b[i..]
                    .iter()
                    .position(|&x| !(x == b'_' || x.is_ascii_alphanumeric()))
                    .map_or(b.len(), |p| p + i);
                // `r'…'`, `b"…"`: raw and bytes literals.
                if matches!(b.get(end), Some(b'\'' | b'"')) {
                    return Err(ShardError::Unsupported);
                }
                out.push(Tok::Ident(s[i..end].to_owned()));
                i = end;
            }
            _ => return Err(ShardError::Unsupported),
        }
    }
    Ok(out)
}

/// One argument as the walker sees it.
#[derive(Debug)]
enum Arg {
    Path(String),
    Str(String),
}

#[derive(Debug)]
struct Call {
    name: String,
    args: Vec<Arg>,
}

/// `and ('||' and)*`, `and = call ('&&' call)*`, `call = ident '(' [arg (',' arg)*] ')'`:
/// the `||` operands in source order (the order `walkExpr` visits them), each the calls of
/// one `&&` chain.
fn parse_calls(toks: &[Tok]) -> Result<Vec<Vec<Call>>, ShardError> {
    let mut groups: Vec<Vec<Call>> = Vec::new();
    let mut calls = Vec::new();
    let mut count = 0;
    let mut i = 0;
    loop {
        let Some(Tok::Ident(name)) = toks.get(i) else { return Err(ShardError::Unsupported) };
        if RESERVED.contains(&name.as_str()) || toks.get(i + 1) != Some(&Tok::LParen) {
            return Err(ShardError::Unsupported);
        }
        i += 2;
        let mut args = Vec::new();
        if toks.get(i) == Some(&Tok::RParen) {
            i += 1;
        } else {
            loop {
                let (arg, next) = parse_arg(toks, i)?;
                args.push(arg);
                i = next;
                match toks.get(i) {
                    Some(Tok::Comma) => i += 1,
                    Some(Tok::RParen) => {
                        i += 1;
                        break;
                    }
                    _ => return Err(ShardError::Unsupported),
                }
            }
        }
        calls.push(Call { name: name.clone(), args });
        count += 1;
        if count > MAX_RANGES {
            return Err(ShardError::Unsupported);
        }
        match toks.get(i) {
            None => {
                groups.push(calls);
                return Ok(groups);
            }
            Some(Tok::Or) => groups.push(std::mem::take(&mut calls)),
            Some(Tok::And) => {}
            Some(_) => return Err(ShardError::Unsupported),
        }
        i += 1;
    }
}

fn parse_arg(toks: &[Tok], mut i: usize) -> Result<(Arg, usize), ShardError> {
    match toks.get(i) {
        Some(Tok::Str(s)) => Ok((Arg::Str(s.clone()), i + 1)),
        Some(Tok::Ident(first)) if !RESERVED.contains(&first.as_str()) => {
            let mut path = first.clone();
            i += 1;
            while toks.get(i) == Some(&Tok::Dot) {
                match toks.get(i + 1) {
                    Some(Tok::Ident(f)) if !KEYWORDS.contains(&f.as_str()) => {
                        path.push('.');
                        path.push_str(f);
                        i += 2;
                    }
                    _ => return Err(ShardError::Unsupported),
                }
            }
            Ok((Arg::Path(path), i))
        }
        _ => Err(ShardError::Unsupported),
    }
}

/// `walkExpr` + `parseShardRangeCall` for one call, in their order of checks.
fn requirement(call: &Call) -> Result<(ShardField, ShardRange), ShardError> {
    let invalid = |m: String| Err(ShardError::Invalid(m));
    if call.name != "shardRange" {
        return invalid(format!(
            "unsupported function {}; only shardRange() and || are allowed",
            go_quote(&call.name)
        ));
    }
    if call.args.len() != 3 {
        return invalid(format!("shardRange() requires exactly 3 arguments, got {}", call.args.len()));
    }
    // A literal where a path goes: the text names the CEL expression kind; not ours to spell.
    let Arg::Path(path) = &call.args[0] else { return Err(ShardError::Unsupported) };
    let field = match path.as_str() {
        "object.metadata.uid" => ShardField::Uid,
        "object.metadata.namespace" => ShardField::Namespace,
        _ => {
            return invalid(format!(
                "unsupported field path {}; supported: object.metadata.uid, object.metadata.namespace",
                go_quote(path)
            ))
        }
    };
    let start = hex_literal(&call.args[1], "hexStart")?;
    let end = hex_literal(&call.args[2], "hexEnd")?;
    if start >= end {
        return invalid(format!("shard range start {} must be less than end {}", hex(start), hex(end)));
    }
    Ok((field, ShardRange { start, end }))
}

/// `extractHexLiteral`: `'0x'` and 16 lowercase hex digits, or exactly `'0x10000000000000000'`.
fn hex_literal(arg: &Arg, name: &str) -> Result<u128, ShardError> {
    let Arg::Str(s) = arg else { return Err(ShardError::Unsupported) };
    let invalid = |m: String| Err(ShardError::Invalid(m));
    let Some(digits) = s.strip_prefix("0x") else {
        return invalid(format!("{name} must have '0x' prefix, got {}", go_quote(s)));
    };
    if digits.is_empty() {
        return invalid(format!("{name}: hex value is required after '0x'"));
    }
    if digits.len() > 17 {
        return invalid(format!(
            "{name}: hex value too long ({} chars, max 17): {}",
            digits.len(),
            go_quote(digits)
        ));
    }
    if let Some(c) = digits.chars().find(|c| !matches!(c, '0'..='9' | 'a'..='f')) {
        return invalid(format!(
            "{name}: invalid hex character {} in {}",
            go_quote(&c.to_string()),
            go_quote(s)
        ));
    }
    if digits.len() == 17 {
        if s != "0x10000000000000000" {
            return invalid(format!(
                "{name}: 17-digit hex value must be '0x10000000000000000' (2^64), got {}",
                go_quote(s)
            ));
        }
        return Ok(FULL);
    }
    if digits.len() != 16 {
        let padded = format!("0x{}{digits}", "0".repeat(16 - digits.len()));
        return invalid(format!(
            "{name} must be a 0x-prefixed 16-digit hex value, got {} (did you mean {}?)",
            go_quote(s),
            go_quote(&padded)
        ));
    }
    u128::from_str_radix(digits, 16).map_err(|_| ShardError::Unsupported)
}

#[cfg(test)]
mod tests;
