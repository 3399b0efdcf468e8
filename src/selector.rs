//! Label and field selectors: parsing with the apiserver's grammar and error texts, and
//! matching against an object's parsed `Header`.
//!
//! Called by `server::classify` (parsing query parameters), `cache` (filtering lists and
//! watch events) and `sim`.
//!
//! SKELETON: the real implementation replaces the bodies below.

use std::collections::BTreeMap;

use crate::error::Error;
use crate::resource::{Header, ResourceKind};

/// A parsed `labelSelector` (requirements ANDed). The empty selector matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector {
    _reqs: Vec<()>,
}

impl LabelSelector {
    /// Parses like apimachinery `labels.Parse`; errors are `Error::BadRequest` with its text.
    pub fn parse(_s: &str) -> Result<LabelSelector, Error> {
        todo!("selector")
    }
    pub fn is_empty(&self) -> bool {
        todo!("selector")
    }
    pub fn matches(&self, _labels: &BTreeMap<String, String>) -> bool {
        todo!("selector")
    }
}

/// A parsed `fieldSelector` (requirements ANDed), validated for one resource.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSelector {
    _reqs: Vec<()>,
}

impl FieldSelector {
    /// Parses like apimachinery `fields.ParseSelector` and checks each field against the
    /// resource's selectable fields (`ResourceKind::field_labels`), with the apiserver's 400
    /// texts.
    pub fn parse(_s: &str, _kind: &ResourceKind) -> Result<FieldSelector, Error> {
        todo!("selector")
    }
    pub fn is_empty(&self) -> bool {
        todo!("selector")
    }
    /// The value of an exact `field=value` / `field==value` requirement, if there is one
    /// (used for `metadata.name`, `metadata.namespace`, `spec.nodeName`).
    pub fn exact(&self, _field: &str) -> Option<&str> {
        todo!("selector")
    }
    pub fn matches(&self, _header: &Header) -> bool {
        todo!("selector")
    }
}
