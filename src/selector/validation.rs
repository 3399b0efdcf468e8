//! apimachinery's label key / value validation (`k8s.io/apimachinery/pkg/util/validation`):
//! `IsQualifiedName`, `IsValidLabelValue`, `IsDNS1123Subdomain`, with their exact texts; and
//! 1.35's `pkg/api/validate/content` (`IsLabelKey`, `IsLabelValue`), which label selectors use
//! since: "a valid label key", lengths in bytes ([`Texts`]).
//!
//! Called by `selector::label` while parsing; returns the list of problems (empty = valid),
//! which the caller joins with `"; "` as apimachinery does.

const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const QUALIFIED_NAME_ERR: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const QUALIFIED_NAME_MAX: usize = 63;
const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const LABEL_VALUE_ERR: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_MAX: usize = 63;
const DNS1123_SUBDOMAIN_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1123_SUBDOMAIN_ERR: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_MAX: usize = 253;

/// Which apimachinery's texts a label selector's errors have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Texts {
    /// Up to 1.34 (`validation.IsQualifiedName`: "a qualified name", "characters"): the sim's.
    Qualified,
    /// 1.35 and later (`content.IsLabelKey` / `IsLabelValue`: "a valid label key", "bytes").
    Content,
}

/// `IsQualifiedName`: `[prefix/]name`, prefix a DNS-1123 subdomain, name ≤ 63 characters.
pub(crate) fn is_qualified_name(value: &str) -> Vec<String> {
    key_errors(value, Texts::Qualified)
}

/// 1.35's `content.IsLabelKey`: `IsQualifiedName` with its own wording.
pub(crate) fn is_label_key(value: &str) -> Vec<String> {
    key_errors(value, Texts::Content)
}

fn key_errors(value: &str, texts: Texts) -> Vec<String> {
    let what = match texts {
        Texts::Qualified => "a qualified name",
        Texts::Content => "a valid label key",
    };
    let mut errs = Vec::new();
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push(format!("prefix part {}", empty_error()));
            } else {
                errs.extend(subdomain_errors(prefix, texts).into_iter().map(|m| format!("prefix part {m}")));
            }
            *name
        }
        _ => {
            errs.push(format!(
                "{what} {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(QUALIFIED_NAME_ERR, QUALIFIED_NAME_FMT, &["MyName", "my.name", "123-abc"])
            ));
            return errs;
        }
    };
    if name.is_empty() {
        errs.push(format!("name part {}", empty_error()));
    } else if name.len() > QUALIFIED_NAME_MAX {
        errs.push(format!("name part {}", max_len_error(QUALIFIED_NAME_MAX, texts)));
    }
    if !is_qualified_name_part(name) {
        errs.push(format!(
            "name part {}",
            regex_error(QUALIFIED_NAME_ERR, QUALIFIED_NAME_FMT, &["MyName", "my.name", "123-abc"])
        ));
    }
    errs
}

/// `IsValidLabelValue`: empty, or a qualified-name part of ≤ 63 characters.
pub(crate) fn is_valid_label_value(value: &str, texts: Texts) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > LABEL_VALUE_MAX {
        errs.push(max_len_error(LABEL_VALUE_MAX, texts));
    }
    if !value.is_empty() && !is_qualified_name_part(value) {
        errs.push(regex_error(LABEL_VALUE_ERR, LABEL_VALUE_FMT, &["MyValue", "my_value", "12345"]));
    }
    errs
}

/// `IsDNS1123Label` as a yes or no: at most 63 characters of `[a-z0-9-]`, alphanumeric at both
/// ends (what `ValidateNamespaceName` asks of a namespace).
pub fn is_dns1123_label_name(s: &str) -> bool {
    s.len() <= 63 && is_dns1123_label(s)
}

/// `IsDNS1123Subdomain` as a yes or no (what `ValidateServiceAccountName` asks): only the total
/// length is bounded (253), not each dot-separated part's.
pub fn is_dns1123_subdomain_name(s: &str) -> bool {
    is_dns1123_subdomain(s).is_empty()
}

/// `IsDNS1123Subdomain`: its error messages, none for a valid name.
pub fn is_dns1123_subdomain(value: &str) -> Vec<String> {
    subdomain_errors(value, Texts::Qualified)
}

fn subdomain_errors(value: &str, texts: Texts) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX {
        errs.push(max_len_error(DNS1123_SUBDOMAIN_MAX, texts));
    }
    if !value.split('.').all(is_dns1123_label) {
        errs.push(regex_error(DNS1123_SUBDOMAIN_ERR, DNS1123_SUBDOMAIN_FMT, &["example.com"]));
    }
    errs
}

/// `^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$`
fn is_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(f), Some(l)) => {
            f.is_ascii_alphanumeric()
                && l.is_ascii_alphanumeric()
                && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

/// `^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    match (b.first(), b.last()) {
        (Some(f), Some(l)) => alnum(f) && alnum(l) && b.iter().all(|c| alnum(c) || *c == b'-'),
        _ => false,
    }
}

fn empty_error() -> &'static str {
    "must be non-empty"
}

/// `MaxLenError`: characters up to 1.34, bytes in `content` (the length was always in bytes).
fn max_len_error(n: usize, texts: Texts) -> String {
    match texts {
        Texts::Qualified => format!("must be no more than {n} characters"),
        Texts::Content => format!("must be no more than {n} bytes"),
    }
}

/// `RegexError`, including its quirk of a double space before each " or ".
fn regex_error(msg: &str, fmt: &str, examples: &[&str]) -> String {
    let mut out = format!("{msg} (e.g. ");
    for (i, e) in examples.iter().enumerate() {
        if i > 0 {
            out.push_str(" or ");
        }
        out.push_str(&format!("'{e}', "));
    }
    out.push_str(&format!("regex used for validation is '{fmt}')"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qualified_names() {
        for ok in ["a", "A", "tier", "app.kubernetes.io/name", "a-b_c.d", "x/Y", "k8s.io/a"] {
            assert!(is_qualified_name(ok).is_empty(), "{ok}");
        }
        for bad in ["", "-a", "a-", "a_", "/a", "a/", "a/b/c", "Tier_/x", "A.io/x", &"a".repeat(64)] {
            assert!(!is_qualified_name(bad).is_empty(), "{bad}");
        }
        assert!(is_qualified_name(&"a".repeat(63)).is_empty());
        assert!(is_qualified_name(&format!("{}/x", "a".repeat(254))).len() == 1);
    }

    #[test]
    fn texts() {
        assert_eq!(
            is_qualified_name("Tier_/x"),
            vec!["prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"]
        );
        assert_eq!(
            is_qualified_name("/"),
            vec![
                "prefix part must be non-empty".to_string(),
                "name part must be non-empty".to_string(),
                "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')".to_string(),
            ]
        );
        assert_eq!(
            is_valid_label_value("b_", Texts::Qualified),
            vec!["a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"]
        );
        assert_eq!(
            is_valid_label_value(&"a".repeat(64), Texts::Qualified),
            vec!["must be no more than 63 characters"]
        );
        assert!(is_valid_label_value("", Texts::Qualified).is_empty());
    }

    /// 1.35's `content` package (what 1.36's label selectors say): "a valid label key", bytes.
    #[test]
    fn content_texts() {
        assert_eq!(
            is_label_key("a/b/c"),
            vec!["a valid label key must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"]
        );
        assert_eq!(is_label_key(&"a".repeat(64)), vec!["name part must be no more than 63 bytes"]);
        assert_eq!(
            is_label_key(&format!("{}/a", "b".repeat(254))),
            vec!["prefix part must be no more than 253 bytes"]
        );
        assert_eq!(
            is_valid_label_value(&"a".repeat(64), Texts::Content),
            vec!["must be no more than 63 bytes"]
        );
        assert_eq!(is_qualified_name("a/b/c")[0][..16], *"a qualified name");
    }
}
