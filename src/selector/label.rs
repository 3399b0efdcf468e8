//! Label selectors: a port of apimachinery `labels.Parse` (lexer, recursive-descent parser,
//! requirement validation and error texts) and `Requirement.Matches`.
//!
//! Used through `selector::LabelSelector` by `server::classify` (the `labelSelector` query
//! parameter), `cache` (filtering lists and watch events) and `sim`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::error::Error;
use crate::resource::go_quote;

use super::validation::{is_label_key, is_qualified_name, is_valid_label_value, Texts};

use LabelOp as Op;

/// A parsed `labelSelector`: requirements ANDed, sorted by key. Empty matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector {
    reqs: Vec<Requirement>,
}

/// One `key op values` term. `values` is sorted and deduplicated, as Go's `sets.String.List()`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Requirement {
    key: String,
    op: Op,
    values: Vec<String>,
}

/// apimachinery `selection.Operator`, as far as label selectors use it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LabelOp {
    Equals,
    DoubleEquals,
    NotEquals,
    In,
    NotIn,
    Exists,
    DoesNotExist,
    GreaterThan,
    LessThan,
}

/// Labels a selector reads: an object's (`resource::Pairs`) or a map of them.
pub trait LabelSet {
    /// The value of label `key`, if the set has it.
    fn label(&self, key: &str) -> Option<&str>;
}

impl LabelSet for crate::resource::Pairs<'_> {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key)
    }
}

impl LabelSet for BTreeMap<String, String> {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

impl LabelSelector {
    /// Parses like apimachinery `labels.Parse`; errors are `Error::BadRequest` with its text
    /// (1.35 and later: [`Texts::Content`]).
    pub fn parse(s: &str) -> Result<LabelSelector, Error> {
        LabelSelector::parse_as(s, Texts::Content)
    }

    /// [`LabelSelector::parse`] with the error texts of `texts` (the sim's are 1.28's).
    pub fn parse_as(s: &str, texts: Texts) -> Result<LabelSelector, Error> {
        let mut parser = Parser::new(s);
        parser.texts = texts;
        let mut reqs = parser.parse().map_err(Error::BadRequest)?;
        // Go sorts by key only (unstably); the rest of the order is ours, for a canonical form.
        reqs.sort();
        Ok(LabelSelector { reqs })
    }

    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    /// What matching one object costs, in label lookups and value comparisons: each
    /// requirement, with as many values as it lists.
    pub fn weight(&self) -> usize {
        self.reqs.iter().map(|r| r.values.len().max(1)).sum()
    }

    pub fn matches<L: LabelSet + ?Sized>(&self, labels: &L) -> bool {
        self.reqs.iter().all(|r| r.matches(labels))
    }

    /// The requirements as Go's `Selector.Requirements()` lists them: sorted by key, each
    /// with its values sorted and deduplicated (`sets.String.List()`).
    pub fn requirements(&self) -> impl Iterator<Item = (&str, LabelOp, &[String])> {
        self.reqs.iter().map(|r| (r.key.as_str(), r.op, r.values.as_slice()))
    }

    /// The value the selector requires for `key`, like Go's `RequiresExactMatch`: the first
    /// requirement on `key` decides, and only `=`, `==` or a one-value `in` give a value.
    pub fn exact(&self, key: &str) -> Option<&str> {
        let r = self.reqs.iter().find(|r| r.key == key)?;
        match (r.op, r.values.as_slice()) {
            (Op::Equals | Op::DoubleEquals | Op::In, [v]) => Some(v),
            _ => None,
        }
    }
}

impl Requirement {
    fn matches<L: LabelSet + ?Sized>(&self, labels: &L) -> bool {
        let has = |v: &str| self.values.iter().any(|x| x == v);
        match self.op {
            Op::In | Op::Equals | Op::DoubleEquals => labels.label(&self.key).is_some_and(has),
            Op::NotIn | Op::NotEquals => labels.label(&self.key).is_none_or(|v| !has(v)),
            Op::Exists => labels.label(&self.key).is_some(),
            Op::DoesNotExist => labels.label(&self.key).is_none(),
            Op::GreaterThan | Op::LessThan => {
                let Some(Ok(have)) = labels.label(&self.key).map(|v| v.parse::<i64>()) else {
                    return false;
                };
                let Some(Ok(want)) = self.values.first().map(|v| v.parse::<i64>()) else {
                    return false;
                };
                if self.op == Op::GreaterThan {
                    have > want
                } else {
                    have < want
                }
            }
        }
    }
}

impl fmt::Display for LabelSelector {
    /// Go's `String()`: requirements joined by `,`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.reqs.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = match self.op {
            Op::Exists => return f.write_str(&self.key),
            Op::DoesNotExist => return write!(f, "!{}", self.key),
            Op::Equals => "=",
            Op::DoubleEquals => "==",
            Op::NotEquals => "!=",
            Op::GreaterThan => ">",
            Op::LessThan => "<",
            Op::In => " in (",
            Op::NotIn => " notin (",
        };
        write!(f, "{}{}{}", self.key, op, self.values.join(","))?;
        if matches!(self.op, Op::In | Op::NotIn) {
            f.write_str(")")?;
        }
        Ok(())
    }
}

/// Lexer tokens (Go's `Token`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tok {
    Error,
    EndOfString,
    ClosedPar,
    Comma,
    DoesNotExist,
    DoubleEquals,
    Equals,
    GreaterThan,
    Identifier,
    In,
    LessThan,
    NotEquals,
    NotIn,
    OpenPar,
}

/// Go's `string2token`.
fn keyword(s: &[u8]) -> Option<Tok> {
    Some(match s {
        b")" => Tok::ClosedPar,
        b"," => Tok::Comma,
        b"!" => Tok::DoesNotExist,
        b"==" => Tok::DoubleEquals,
        b"=" => Tok::Equals,
        b">" => Tok::GreaterThan,
        b"in" => Tok::In,
        b"<" => Tok::LessThan,
        b"!=" => Tok::NotEquals,
        b"notin" => Tok::NotIn,
        b"(" => Tok::OpenPar,
        _ => return None,
    })
}

fn is_whitespace(ch: u8) -> bool {
    matches!(ch, b' ' | b'\t' | b'\r' | b'\n')
}

fn is_special_symbol(ch: u8) -> bool {
    matches!(ch, b'=' | b'!' | b'(' | b')' | b',' | b'>' | b'<')
}

/// Go's `Lexer`, byte by byte. Like Go, a NUL byte reads as "end of input": it ends the
/// token being scanned, and ends the input where a new token would start.
struct Lexer<'a> {
    s: &'a [u8],
    pos: usize,
}

impl Lexer<'_> {
    fn read(&mut self) -> u8 {
        match self.s.get(self.pos) {
            Some(&b) => {
                self.pos += 1;
                b
            }
            None => 0,
        }
    }

    fn unread(&mut self) {
        self.pos = self.pos.saturating_sub(1);
    }

    fn scan_id_or_keyword(&mut self) -> (Tok, String) {
        let mut buf = Vec::new();
        loop {
            match self.read() {
                0 => break,
                ch if is_special_symbol(ch) || is_whitespace(ch) => {
                    self.unread();
                    break;
                }
                ch => buf.push(ch),
            }
        }
        let tok = keyword(&buf).unwrap_or(Tok::Identifier);
        (tok, String::from_utf8_lossy(&buf).into_owned())
    }

    fn scan_special_symbol(&mut self) -> (Tok, String) {
        let mut last: Option<(Tok, usize)> = None;
        let mut buf = Vec::new();
        loop {
            match self.read() {
                0 => break,
                ch if is_special_symbol(ch) => {
                    buf.push(ch);
                    if let Some(tok) = keyword(&buf) {
                        last = Some((tok, buf.len()));
                    } else if last.is_some() {
                        self.unread();
                        break;
                    }
                }
                _ => {
                    self.unread();
                    break;
                }
            }
        }
        match last {
            Some((tok, len)) => (tok, String::from_utf8_lossy(&buf[..len]).into_owned()),
            None => {
                (Tok::Error, format!("error expected: keyword found '{}'", String::from_utf8_lossy(&buf)))
            }
        }
    }

    fn lex(&mut self) -> (Tok, String) {
        let mut ch = self.read();
        while is_whitespace(ch) {
            ch = self.read();
        }
        match ch {
            0 => (Tok::EndOfString, String::new()),
            ch if is_special_symbol(ch) => {
                self.unread();
                self.scan_special_symbol()
            }
            _ => {
                self.unread();
                self.scan_id_or_keyword()
            }
        }
    }
}

/// Go's `ParserContext`: in `Values`, the keywords `in` / `notin` are plain identifiers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ctx {
    KeyAndOperator,
    Values,
}

/// Go's `Parser`: all tokens are scanned first, then parsed with one token of lookahead.
struct Parser {
    items: Vec<(Tok, String)>,
    position: usize,
    texts: Texts,
}

impl Parser {
    fn new(s: &str) -> Parser {
        let mut lexer = Lexer { s: s.as_bytes(), pos: 0 };
        let mut items = Vec::new();
        loop {
            let item = lexer.lex();
            let end = item.0 == Tok::EndOfString;
            items.push(item);
            if end {
                break;
            }
        }
        Parser { items, position: 0, texts: Texts::Content }
    }

    fn lookahead(&self, ctx: Ctx) -> (Tok, String) {
        let (tok, lit) = self.items.get(self.position).cloned().unwrap_or((Tok::EndOfString, String::new()));
        match tok {
            Tok::In | Tok::NotIn if ctx == Ctx::Values => (Tok::Identifier, lit),
            _ => (tok, lit),
        }
    }

    fn consume(&mut self, ctx: Ctx) -> (Tok, String) {
        let item = self.lookahead(ctx);
        self.position += 1;
        item
    }

    fn parse(&mut self) -> Result<Vec<Requirement>, String> {
        let mut reqs = Vec::new();
        loop {
            let (tok, lit) = self.lookahead(Ctx::Values);
            match tok {
                Tok::Identifier | Tok::DoesNotExist => {
                    let r =
                        self.parse_requirement().map_err(|e| format!("unable to parse requirement: {e}"))?;
                    reqs.push(r);
                    let (t, l) = self.consume(Ctx::Values);
                    match t {
                        Tok::EndOfString => return Ok(reqs),
                        Tok::Comma => {
                            let (t2, l2) = self.lookahead(Ctx::Values);
                            if t2 != Tok::Identifier && t2 != Tok::DoesNotExist {
                                return Err(format!("found '{l2}', expected: identifier after ','"));
                            }
                        }
                        _ => return Err(format!("found '{l}', expected: ',' or 'end of string'")),
                    }
                }
                Tok::EndOfString => return Ok(reqs),
                _ => return Err(format!("found '{lit}', expected: !, identifier, or 'end of string'")),
            }
        }
    }

    fn parse_requirement(&mut self) -> Result<Requirement, String> {
        let (key, op) = self.parse_key_and_infer_operator()?;
        if let Some(op @ (Op::Exists | Op::DoesNotExist)) = op {
            return new_requirement(key, op, Vec::new(), self.texts);
        }
        let op = self.parse_operator()?;
        let values = match op {
            Op::In | Op::NotIn => self.parse_values()?,
            _ => self.parse_exact_value()?,
        };
        new_requirement(key, op, values.into_iter().collect(), self.texts)
    }

    /// The key, and `Exists` / `DoesNotExist` when no binary operator follows.
    fn parse_key_and_infer_operator(&mut self) -> Result<(String, Option<Op>), String> {
        let mut op = None;
        let (mut tok, mut lit) = self.consume(Ctx::Values);
        if tok == Tok::DoesNotExist {
            op = Some(Op::DoesNotExist);
            (tok, lit) = self.consume(Ctx::Values);
        }
        if tok != Tok::Identifier {
            return Err(format!("found '{lit}', expected: identifier"));
        }
        let errs = match self.texts {
            Texts::Qualified => is_qualified_name(&lit),
            Texts::Content => is_label_key(&lit),
        };
        if !errs.is_empty() {
            // The parser's field path is nil, which Go prints as `<nil>`.
            return Err(invalid("<nil>", &lit, &errs.join("; ")));
        }
        let (next, _) = self.lookahead(Ctx::Values);
        if matches!(next, Tok::EndOfString | Tok::Comma) && op != Some(Op::DoesNotExist) {
            op = Some(Op::Exists);
        }
        Ok((lit, op))
    }

    fn parse_operator(&mut self) -> Result<Op, String> {
        let (tok, lit) = self.consume(Ctx::KeyAndOperator);
        Ok(match tok {
            Tok::In => Op::In,
            Tok::Equals => Op::Equals,
            Tok::DoubleEquals => Op::DoubleEquals,
            Tok::GreaterThan => Op::GreaterThan,
            Tok::LessThan => Op::LessThan,
            Tok::NotIn => Op::NotIn,
            Tok::NotEquals => Op::NotEquals,
            _ => return Err(format!("found '{lit}', expected: in, notin, =, ==, !=, gt, lt")),
        })
    }

    /// `(a,b,…)`. Like Go, `()` is the set `{""}`.
    fn parse_values(&mut self) -> Result<BTreeSet<String>, String> {
        let (tok, lit) = self.consume(Ctx::Values);
        if tok != Tok::OpenPar {
            return Err(format!("found '{lit}' expected: '('"));
        }
        let (tok, lit) = self.lookahead(Ctx::Values);
        match tok {
            Tok::Identifier | Tok::Comma => {
                let set = self.parse_identifiers_list()?;
                if self.consume(Ctx::Values).0 != Tok::ClosedPar {
                    return Err(format!("found '{lit}', expected: ')'"));
                }
                Ok(set)
            }
            Tok::ClosedPar => {
                self.consume(Ctx::Values);
                Ok(BTreeSet::from([String::new()]))
            }
            _ => Err(format!("found '{lit}', expected: ',', ')' or identifier")),
        }
    }

    /// A comma-separated list of possibly empty identifiers, up to (not including) `)`.
    fn parse_identifiers_list(&mut self) -> Result<BTreeSet<String>, String> {
        let mut set = BTreeSet::new();
        loop {
            let (tok, lit) = self.consume(Ctx::Values);
            match tok {
                Tok::Identifier => {
                    set.insert(lit);
                    let (tok2, lit2) = self.lookahead(Ctx::Values);
                    match tok2 {
                        Tok::Comma => continue,
                        Tok::ClosedPar => return Ok(set),
                        _ => return Err(format!("found '{lit2}', expected: ',' or ')'")),
                    }
                }
                Tok::Comma => {
                    if set.is_empty() {
                        set.insert(String::new());
                    }
                    let (tok2, _) = self.lookahead(Ctx::Values);
                    if tok2 == Tok::ClosedPar {
                        set.insert(String::new());
                        return Ok(set);
                    }
                    if tok2 == Tok::Comma {
                        self.consume(Ctx::Values);
                        set.insert(String::new());
                    }
                }
                _ => return Err(format!("found '{lit}', expected: ',', or identifier")),
            }
        }
    }

    /// The value after `=`, `==`, `!=`, `>`, `<`; empty when the term ends there.
    fn parse_exact_value(&mut self) -> Result<BTreeSet<String>, String> {
        let (tok, _) = self.lookahead(Ctx::Values);
        if matches!(tok, Tok::EndOfString | Tok::Comma) {
            return Ok(BTreeSet::from([String::new()]));
        }
        let (tok, lit) = self.consume(Ctx::Values);
        if tok == Tok::Identifier {
            return Ok(BTreeSet::from([lit]));
        }
        Err(format!("found '{lit}', expected: identifier"))
    }
}

/// Go's `NewRequirement` as the parser reaches it: the key is already validated and the
/// number of values already fits the operator, so only the values are checked here.
fn new_requirement(key: String, op: Op, values: Vec<String>, texts: Texts) -> Result<Requirement, String> {
    let mut errs = Vec::new();
    if matches!(op, Op::GreaterThan | Op::LessThan) {
        for (i, v) in values.iter().enumerate() {
            if v.parse::<i64>().is_err() {
                let detail = "for 'Gt', 'Lt' operators, the value must be an integer";
                errs.push(invalid(&format!("values[{i}]"), v, detail));
            }
        }
    }
    for (i, v) in values.iter().enumerate() {
        let problems = is_valid_label_value(v, texts);
        if !problems.is_empty() {
            errs.push(invalid(&format!("values[{i}][{key}]"), v, &problems.join("; ")));
        }
    }
    aggregate(errs)?;
    Ok(Requirement { key, op, values })
}

/// A `field.Invalid` error's text.
fn invalid(path: &str, value: &str, detail: &str) -> String {
    format!("{path}: Invalid value: {}: {detail}", go_quote(value))
}

/// `utilerrors.Aggregate` text: one message alone, several deduplicated in `[a, b]`.
fn aggregate(errs: Vec<String>) -> Result<(), String> {
    let mut seen: Vec<String> = Vec::new();
    for e in errs {
        if !seen.contains(&e) {
            seen.push(e);
        }
    }
    match seen.len() {
        0 => Ok(()),
        1 => Err(seen.remove(0)),
        _ => Err(format!("[{}]", seen.join(", "))),
    }
}

#[cfg(test)]
mod tests;
