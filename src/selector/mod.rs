//! Label, field and shard selectors: parsing with the apiserver's grammar and error texts,
//! and matching against an object's parsed `Header`.
//!
//! Called by `server::classify` (parsing query parameters), `cache` (filtering lists and
//! watch events) and `sim`. Both types render their canonical string with `Display`, so a
//! parsed selector can be put back into a URL.
//!
//! Layout: `label` (lexer, parser, matching), `field` (terms, escapes, per-resource field
//! labels), `shard` (`shardSelector`: grammar, FNV-1a hash, ranges), `validation` (label key /
//! value checks); `tests` replays the recordings.
//!
//! The apiserver parses `labelSelector` before `fieldSelector`, and converts the field names
//! only after both parsed: a caller that validates both should do the same.

mod field;
mod label;
mod shard;
mod validation;

pub use field::{escape as escape_field_value, parse_terms, FieldSelector, RawTerm};
pub use label::{LabelOp, LabelSelector, LabelSet};
pub use shard::{fnv1a64, ShardError, ShardField, ShardRange, ShardSelector};
pub use validation::{is_dns1123_label_name, is_dns1123_subdomain, is_dns1123_subdomain_name, Texts};

#[cfg(test)]
mod tests;
