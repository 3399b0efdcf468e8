//! The field and label selectors of a SubjectAccessReview (authorization.k8s.io/v1
//! `resourceAttributes.fieldSelector` / `labelSelector`), built exactly as a 1.34 apiserver
//! builds them for its own authorizers (KEP-4601, AuthorizeWithSelectors, GA in 1.34):
//!
//! - only for list, watch and deletecollection (`classify::request_info` fills the raw
//!   selectors only then);
//! - parsed like `GetAuthorizerAttributes` (filters/authorization.go): `fields.ParseSelector`
//!   (no per-resource conversion) and `labels.Parse`; a selector that does not parse, or has
//!   no requirements, gives no attribute at all (the request is authorized without it, which
//!   is only broader);
//! - each requirement mapped like the webhook authorizer's `fieldSelectorToAuthorizationAPI`
//!   / `labelSelectorToAuthorizationAPI` (plugin/pkg/authorizer/webhook/webhook.go): `=`,
//!   `==`, `in` → `In`; `!=`, `notin` → `NotIn`; `exists` → `Exists`; `!key` →
//!   `DoesNotExist`; `>` and `<` dropped (requirements are ANDed, so dropping one only
//!   broadens the check); all dropped → no attribute. Field values are one-element lists;
//!   label values sorted and deduplicated, omitted when empty.
//!
//! Called by `phase::authorize::attributes`; rendered by `authz::review_body`. An upstream older than
//! 1.31 ignores these fields, so its decisions are those of a request without selectors.

use serde_json::{json, Value};

use crate::selector::{parse_terms, LabelOp, LabelSelector};

/// One `metav1.FieldSelectorRequirement` / `LabelSelectorRequirement`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Requirement {
    pub key: String,
    pub operator: &'static str,
    pub values: Vec<String>,
}

/// The field selector's requirements (empty: no `fieldSelector` attribute).
pub fn field(raw: &str) -> Vec<Requirement> {
    if raw.is_empty() {
        return Vec::new();
    }
    let Ok(terms) = parse_terms(raw) else {
        return Vec::new();
    };
    terms
        .into_iter()
        .map(|t| Requirement {
            key: t.field,
            operator: if t.equals { "In" } else { "NotIn" },
            values: vec![t.value],
        })
        .collect()
}

/// The label selector's requirements (empty: no `labelSelector` attribute).
pub fn label(raw: &str) -> Vec<Requirement> {
    if raw.is_empty() {
        return Vec::new();
    }
    let Ok(sel) = LabelSelector::parse(raw) else {
        return Vec::new();
    };
    sel.requirements()
        .filter_map(|(key, op, values)| {
            let operator = match op {
                LabelOp::Equals | LabelOp::DoubleEquals | LabelOp::In => "In",
                LabelOp::NotEquals | LabelOp::NotIn => "NotIn",
                LabelOp::Exists => "Exists",
                LabelOp::DoesNotExist => "DoesNotExist",
                LabelOp::GreaterThan | LabelOp::LessThan => return None,
            };
            Some(Requirement { key: key.to_owned(), operator, values: values.to_vec() })
        })
        .collect()
}

/// `{"requirements": [...]}`, or `None` when there are none.
pub fn to_json(reqs: &[Requirement]) -> Option<Value> {
    if reqs.is_empty() {
        return None;
    }
    let reqs: Vec<Value> = reqs
        .iter()
        .map(|r| {
            let mut v = json!({"key": r.key, "operator": r.operator});
            if !r.values.is_empty() {
                v["values"] = json!(r.values);
            }
            v
        })
        .collect();
    Some(json!({ "requirements": reqs }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(raw: &str) -> Option<Value> {
        to_json(&field(raw))
    }

    fn l(raw: &str) -> Option<Value> {
        to_json(&label(raw))
    }

    /// Every selector shape, as a 1.34 apiserver sends it to an authorization webhook.
    #[test]
    fn selector_attributes_for_every_shape() {
        let cases: &[(&str, Option<Value>)] = &[
            ("", None),
            (
                "spec.nodeName=n1",
                Some(json!({"requirements":[{"key":"spec.nodeName","operator":"In","values":["n1"]}]})),
            ),
            (
                "spec.nodeName==n1",
                Some(json!({"requirements":[{"key":"spec.nodeName","operator":"In","values":["n1"]}]})),
            ),
            (
                "spec.nodeName!=n1",
                Some(json!({"requirements":[{"key":"spec.nodeName","operator":"NotIn","values":["n1"]}]})),
            ),
            // An empty value is a value.
            (
                "spec.nodeName=",
                Some(json!({"requirements":[{"key":"spec.nodeName","operator":"In","values":[""]}]})),
            ),
            // Terms sorted bytewise as fields.ParseSelector sorts them; escapes undone.
            (
                "status.phase!=Failed,metadata.name=a\\,b",
                Some(json!({"requirements":[
                    {"key":"metadata.name","operator":"In","values":["a,b"]},
                    {"key":"status.phase","operator":"NotIn","values":["Failed"]}]})),
            ),
            // Any field: the apiserver does not convert field labels for authorization.
            (
                "spec.host=n1",
                Some(json!({"requirements":[{"key":"spec.host","operator":"In","values":["n1"]}]})),
            ),
            // Does not parse: no attribute.
            ("spec.nodeName", None),
            ("a=b\\x", None),
            (",", None),
        ];
        for (raw, want) in cases {
            assert_eq!(&f(raw), want, "fieldSelector={raw:?}");
        }
        let cases: &[(&str, Option<Value>)] = &[
            ("", None),
            ("app=web", Some(json!({"requirements":[{"key":"app","operator":"In","values":["web"]}]}))),
            ("app==web", Some(json!({"requirements":[{"key":"app","operator":"In","values":["web"]}]}))),
            ("app!=web", Some(json!({"requirements":[{"key":"app","operator":"NotIn","values":["web"]}]}))),
            (
                "tier in (b,a,b)",
                Some(json!({"requirements":[{"key":"tier","operator":"In","values":["a","b"]}]})),
            ),
            (
                "tier notin (x)",
                Some(json!({"requirements":[{"key":"tier","operator":"NotIn","values":["x"]}]})),
            ),
            (
                // kube-proxy's selector: sorted by key, no values for the existence operators.
                "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless",
                Some(json!({"requirements":[
                    {"key":"service.kubernetes.io/headless","operator":"DoesNotExist"},
                    {"key":"service.kubernetes.io/service-proxy-name","operator":"DoesNotExist"}]})),
            ),
            ("app", Some(json!({"requirements":[{"key":"app","operator":"Exists"}]}))),
            // Numeric comparisons are dropped; with nothing left there is no attribute.
            ("n>3", None),
            ("n<3,app=x", Some(json!({"requirements":[{"key":"app","operator":"In","values":["x"]}]}))),
            // Does not parse: no attribute.
            ("app in (", None),
            ("-bad=x", None),
        ];
        for (raw, want) in cases {
            assert_eq!(&l(raw), want, "labelSelector={raw:?}");
        }
    }
}
