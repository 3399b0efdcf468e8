use proptest::prelude::*;

use super::*;
use crate::resource::Rv;

fn kind(group: &str, resource: &str, namespaced: bool, builtin: bool) -> ResourceKind {
    ResourceKind::new(group, "v1", resource, "X", namespaced, builtin)
}

fn pods() -> ResourceKind {
    kind("", "pods", true, true)
}

fn configmaps() -> ResourceKind {
    kind("", "configmaps", true, true)
}

fn err(s: &str, k: &ResourceKind) -> String {
    match FieldSelector::parse(s, k) {
        Err(Error::BadRequest(m)) => m,
        other => panic!("{s:?}: expected BadRequest, got {other:?}"),
    }
}

fn sel(s: &str, k: &ResourceKind) -> FieldSelector {
    FieldSelector::parse(s, k).unwrap_or_else(|e| panic!("{s:?}: {e}"))
}

fn header(namespace: &str, name: &str, fields: &[(&'static str, &str)]) -> Header {
    Header::new(namespace, name, Rv(1), "", [], fields.iter().copied())
}

#[test]
fn syntax_errors() {
    let cm = configmaps();
    for (input, want) in [
        ("metadata.name", "invalid selector: 'metadata.name'; can't understand 'metadata.name'"),
        (
            "metadata.name~cm-1",
            "invalid selector: 'metadata.name~cm-1'; can't understand 'metadata.name~cm-1'",
        ),
        (
            "metadata.name in (cm-1)",
            "invalid selector: 'metadata.name in (cm-1)'; can't understand 'metadata.name in (cm-1)'",
        ),
        ("x,metadata.name=a", "invalid selector: 'x,metadata.name=a'; can't understand 'x'"),
        ("metadata.name=a=b", "invalid field selector: unescaped character in value: 61"),
        ("metadata.name===b", "invalid field selector: unescaped character in value: 61"),
        ("metadata.name=a\\x", "invalid field selector: invalid escape sequence: \\x"),
        ("metadata.name=a\\", "invalid field selector: invalid escape sequence: \\"),
    ] {
        assert_eq!(err(input, &cm), want, "{input:?}");
    }
}

#[test]
fn syntax_errors_come_before_unknown_fields_in_sorted_order() {
    let cm = configmaps();
    // `b` sorts after `a.x=1` but its syntax error still wins over the unknown field.
    assert_eq!(err("a.x=1,b", &cm), "invalid selector: 'a.x=1,b'; can't understand 'b'");
    // Unknown fields are reported in sorted order of the raw terms.
    assert_eq!(
        err("zz=1,aa=1", &cm),
        r#""aa" is not a known field selector: only "metadata.name", "metadata.namespace""#
    );
    assert_eq!(err("status.podIP=10.0.0.1,spec.foo=bar", &pods()), "field label not supported: spec.foo");
}

#[test]
fn unknown_field_texts_per_style() {
    let cases = [
        (
            configmaps(),
            "=cm-1",
            r#""" is not a known field selector: only "metadata.name", "metadata.namespace""#,
        ),
        (
            configmaps(),
            "data.x=1",
            r#""data.x" is not a known field selector: only "metadata.name", "metadata.namespace""#,
        ),
        (pods(), "spec.foo=bar", "field label not supported: spec.foo"),
        (kind("", "nodes", false, true), "spec.foo=bar", "field label not supported: spec.foo"),
        (
            kind("", "nodes", false, true),
            "metadata.namespace=x",
            "field label not supported: metadata.namespace",
        ),
        (
            kind("", "namespaces", false, true),
            "metadata.namespace=x",
            "field label not supported: metadata.namespace",
        ),
        (kind("", "secrets", true, true), "data.x=1", "field label not supported: data.x"),
        (
            kind("batch", "jobs", true, true),
            "spec.foo=bar",
            r#"field label "spec.foo" not supported for Job"#,
        ),
        (
            kind("apps", "deployments", true, true),
            "spec.replicas=1",
            r#""spec.replicas" is not a known field selector: only "metadata.name", "metadata.namespace""#,
        ),
        (
            kind("capture.example.com", "widgets", true, false),
            "spec.size=1",
            "field label not supported: spec.size",
        ),
        (
            kind("capture.example.com", "things", false, false),
            "metadata.namespace=x",
            "field label not supported: metadata.namespace",
        ),
        (
            configmaps(),
            "spec.host=x",
            r#""spec.host" is not a known field selector: only "metadata.name", "metadata.namespace""#,
        ),
    ];
    for (k, input, want) in cases {
        assert_eq!(err(input, &k), want, "{input:?} on {}", k.resource);
    }
}

#[test]
fn accepted_fields() {
    for (k, input) in [
        (configmaps(), "metadata.name=a,metadata.namespace=b"),
        (kind("rbac.authorization.k8s.io", "clusterroles", false, true), "metadata.namespace="),
        (kind("", "nodes", false, true), "metadata.name=n,spec.unschedulable=false"),
        (kind("", "namespaces", false, true), "status.phase=Active"),
        (kind("", "secrets", true, true), "type=Opaque"),
        (kind("", "events", true, true), "involvedObject.name=cm-1,source=x,reason=y"),
        (kind("batch", "jobs", true, true), "status.successful=1,metadata.namespace=x"),
        (kind("capture.example.com", "widgets", true, false), "metadata.name=w,metadata.namespace=ns"),
        (pods(), "spec.nodeName=n,status.phase=Pending,status.podIPs=,spec.host=n"),
        (configmaps(), ""),
        (configmaps(), ","),
    ] {
        assert!(FieldSelector::parse(input, &k).is_ok(), "{input:?} on {}", k.resource);
    }
}

#[test]
fn spec_host_is_spec_node_name() {
    let s = sel("spec.host=n1", &pods());
    assert_eq!(s.exact("spec.nodeName"), Some("n1"));
    assert_eq!(s.to_string(), "spec.nodeName=n1");
    assert_eq!(s, sel("spec.nodeName==n1", &pods()));
}

#[test]
fn escapes() {
    let cm = configmaps();
    let s = sel(r"metadata.name=a\,b\=c\\d", &cm);
    assert_eq!(s.exact("metadata.name"), Some(r"a,b=c\d"));
    assert_eq!(s.to_string(), r"metadata.name=a\,b\=c\\d");
    assert!(s.matches(&header("ns", r"a,b=c\d", &[])));
    // An escaped comma does not split terms.
    let s = sel(r"metadata.name!=x\,y,metadata.namespace=ns", &cm);
    assert_eq!(s.to_string(), r"metadata.name!=x\,y,metadata.namespace=ns");
    assert!(s.matches(&header("ns", "x", &[])));
    assert!(!s.matches(&header("ns", "x,y", &[])));
}

#[test]
fn operators_and_precedence() {
    let cm = configmaps();
    // `!=` wins where it starts; `==` before `=`.
    assert_eq!(sel("metadata.name!=a", &cm).to_string(), "metadata.name!=a");
    assert_eq!(sel("metadata.name==a", &cm).to_string(), "metadata.name=a");
    assert_eq!(sel("metadata.name=!a", &cm).exact("metadata.name"), Some("!a"));
    assert_eq!(sel("metadata.name==", &cm).exact("metadata.name"), Some(""));
    assert_eq!(sel("metadata.name!=a", &cm).exact("metadata.name"), None);
}

#[test]
fn matching() {
    let p = pods();
    let on_n1 = header("ns", "p1", &[("spec.nodeName", "n1"), ("status.phase", "Pending")]);
    let unscheduled = header("ns", "p4", &[("spec.nodeName", ""), ("status.phase", "Pending")]);
    let cases = [
        ("spec.nodeName=n1", &on_n1, true),
        ("spec.nodeName=n1", &unscheduled, false),
        ("spec.nodeName=", &unscheduled, true),
        ("spec.nodeName!=n1", &unscheduled, true),
        ("spec.nodeName!=n1", &on_n1, false),
        ("spec.host=n1", &on_n1, true),
        ("status.phase=Pending,spec.nodeName=n1", &on_n1, true),
        ("status.phase=Running", &on_n1, false),
        ("metadata.name=p1", &on_n1, true),
        ("metadata.name!=p1", &on_n1, false),
        ("metadata.namespace=ns", &on_n1, true),
        ("metadata.namespace=other", &on_n1, false),
        // Not in the pod's field set: compares to "".
        ("status.podIPs=", &on_n1, true),
        ("status.podIPs=10.0.0.1", &on_n1, false),
        ("", &on_n1, true),
    ];
    for (s, h, want) in cases {
        assert_eq!(sel(s, &p).matches(h), want, "{s:?} on {}", h.name());
    }
}

#[test]
fn exact_follows_go_order() {
    let cm = configmaps();
    // Raw terms sort as `metadata.name==b` < `metadata.name=a`: Go returns b.
    assert_eq!(sel("metadata.name=a,metadata.name==b", &cm).exact("metadata.name"), Some("b"));
    assert_eq!(sel("metadata.name=a,metadata.name=b", &cm).exact("metadata.name"), Some("a"));
    assert!(sel("", &cm).is_empty());
    assert!(!sel("metadata.name=a", &cm).is_empty());
}

fn value() -> impl Strategy<Value = String> {
    "[-a-z0-9.,=\\\\ ]{0,8}"
}

fn term() -> impl Strategy<Value = (&'static str, bool, String)> {
    let fields = prop_oneof![
        Just("metadata.name"),
        Just("metadata.namespace"),
        Just("spec.nodeName"),
        Just("status.phase"),
        Just("spec.hostNetwork"),
    ];
    (fields, any::<bool>(), value())
}

proptest! {
    #[test]
    fn display_parse_round_trips(terms in prop::collection::vec(term(), 0..5)) {
        let p = pods();
        let built = FieldSelector {
            terms: terms
                .iter()
                .map(|(f, eq, v)| Term { field: f, op: if *eq { Op::Equals } else { Op::NotEquals }, value: v.clone() })
                .collect(),
        };
        let shown = built.to_string();
        let parsed = FieldSelector::parse(&shown, &p).map_err(|e| TestCaseError::fail(format!("{shown:?}: {e}")))?;
        prop_assert_eq!(&parsed, &built);
        let again = FieldSelector::parse(&parsed.to_string(), &p).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(again, parsed);
    }

    #[test]
    fn escape_round_trips(v in "\\PC{0,12}") {
        prop_assert_eq!(unescape(&escape(&v)), Ok(v));
    }

    #[test]
    fn never_panics(s in "[ a-z.=!,~\\\\]{0,24}|\\PC{0,12}") {
        let _ = FieldSelector::parse(&s, &pods());
        let _ = FieldSelector::parse(&s, &configmaps());
    }
}
