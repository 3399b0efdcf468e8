//! Replays every recorded request that carries a `labelSelector` or `fieldSelector`
//! (conformance/v1.28.7) through the parsers and the matchers:
//! - a 400 about a selector must be our error, byte for byte;
//! - any other answer means both selectors parse;
//! - every listed item, and every ADDED / MODIFIED watch object, matches them;
//! - on a namespaced collection, filtering everything ever listed there gives exactly the
//!   recorded items (the fixtures do not change their labels or selectable fields).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use bytes::Bytes;
use serde_json::Value;

use super::{FieldSelector, LabelSelector};
use crate::error::Error;
use crate::resource::{typing, Header, Object, ResourceKind};

/// 400s the apiserver gives for requests whose selectors are fine.
const NOT_SELECTOR_ERRORS: &[&str] = &["fieldSelector metadata.name doesn't match requested name"];

struct Step {
    file: String,
    /// The collection path (no object name, no `/watch/`), with the kind it serves.
    collection: String,
    kind: ResourceKind,
    query: BTreeMap<String, String>,
    status: u64,
    body: Value,
}

fn recordings() -> Vec<Step> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/recordings/v1.28.7");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let mut steps = Vec::new();
    for path in files {
        let doc: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        for step in doc.get("steps").and_then(Value::as_array).into_iter().flatten() {
            let req = &step["request"];
            let query: BTreeMap<String, String> = req["query"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                .collect();
            if !query.contains_key("labelSelector") && !query.contains_key("fieldSelector") {
                continue;
            }
            let url_path = req["path"].as_str().unwrap();
            let (collection, kind) =
                collection_of(url_path).unwrap_or_else(|| panic!("{file}: unknown resource in {url_path}"));
            steps.push(Step {
                file: file.clone(),
                collection,
                kind,
                query,
                status: step["response"]["status"].as_u64().unwrap(),
                body: step["response"]["body"].clone(),
            });
        }
    }
    steps
}

/// `/api/v1/namespaces/ns/pods/p1` → (`/api/v1/namespaces/ns/pods`, pods).
fn collection_of(path: &str) -> Option<(String, ResourceKind)> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, mut rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    if rest.first() == Some(&"watch") {
        rest = &rest[1..];
    }
    let (namespace, resource) = match rest {
        ["namespaces", ns, r, ..] => (Some(*ns), *r),
        [r, ..] => (None, *r),
        [] => return None,
    };
    let (kind, namespaced, builtin) = match (group, resource) {
        ("", "configmaps") => ("ConfigMap", true, true),
        ("", "pods") => ("Pod", true, true),
        ("", "secrets") => ("Secret", true, true),
        ("", "events") => ("Event", true, true),
        ("", "nodes") => ("Node", false, true),
        ("", "namespaces") => ("Namespace", false, true),
        ("apps", "deployments") => ("Deployment", true, true),
        ("batch", "jobs") => ("Job", true, true),
        ("capture.example.com", "widgets") => ("Widget", true, false),
        _ => return None,
    };
    let kind = ResourceKind::new(group, version, resource, kind, namespaced, builtin);
    Some((kind.collection_path(namespace), kind))
}

/// Parses the step's selectors in the apiserver's order (label, then field).
fn parse(step: &Step) -> Result<(LabelSelector, FieldSelector), Error> {
    let labels = LabelSelector::parse(step.query.get("labelSelector").map_or("", String::as_str))?;
    let fields =
        FieldSelector::parse(step.query.get("fieldSelector").map_or("", String::as_str), &step.kind)?;
    Ok((labels, fields))
}

fn header(kind: &ResourceKind, object: &Value) -> Header {
    let bytes = Bytes::from(serde_json::to_vec(object).unwrap());
    Object::parse(kind, &typing(kind), bytes).unwrap().header
}

fn is_watch(step: &Step) -> bool {
    step.query.get("watch").is_some_and(|w| w == "1" || w == "true") || step.body.is_array()
}

#[test]
fn recorded_errors_are_ours() {
    let steps = recordings();
    assert!(steps.len() > 60, "only {} recorded steps with selectors", steps.len());
    let mut checked = 0;
    for step in &steps {
        let ctx = format!("{} {:?}", step.file, step.query);
        match (step.status, parse(step)) {
            (400, Err(Error::BadRequest(ours))) => {
                assert_eq!(step.body["message"].as_str(), Some(ours.as_str()), "{ctx}");
                assert_eq!(step.body["reason"], "BadRequest", "{ctx}");
                checked += 1;
            }
            (400, Ok(_)) => {
                let theirs = step.body["message"].as_str().unwrap_or_default();
                assert!(NOT_SELECTOR_ERRORS.contains(&theirs), "{ctx}: we accept what gave 400 {theirs:?}");
            }
            (status, Err(e)) => panic!("{ctx}: recorded {status}, we fail with {e}"),
            (_, Ok(_)) => {}
        }
    }
    assert!(checked >= 15, "only {checked} selector 400s compared");
}

#[test]
fn recorded_items_match() {
    let mut checked = 0;
    for step in recordings().iter().filter(|s| s.status == 200) {
        let ctx = format!("{} {:?}", step.file, step.query);
        let (labels, fields) = parse(step).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        let objects: Vec<&Value> = if is_watch(step) {
            let events = step.body.as_array().into_iter().flatten();
            events.filter(|e| e["type"] == "ADDED" || e["type"] == "MODIFIED").map(|e| &e["object"]).collect()
        } else {
            step.body["items"].as_array().into_iter().flatten().collect()
        };
        for object in objects {
            let h = header(&step.kind, object);
            assert!(labels.matches(&h.labels()), "{ctx}: {} does not match the labels", h.key.as_str());
            assert!(fields.matches(&h), "{ctx}: {} does not match the fields", h.key.as_str());
            checked += 1;
        }
    }
    assert!(checked > 50, "only {checked} objects checked");
}

#[test]
fn recorded_lists_are_exactly_the_matching_objects() {
    let steps: Vec<Step> = recordings()
        .into_iter()
        .filter(|s| s.status == 200 && !is_watch(s) && s.body["items"].is_array())
        .collect();
    // Everything ever listed in each namespaced collection.
    let mut universe: BTreeMap<&str, BTreeMap<String, Header>> = BTreeMap::new();
    for step in steps.iter().filter(|s| s.collection.contains("/namespaces/")) {
        for item in step.body["items"].as_array().into_iter().flatten() {
            let h = header(&step.kind, item);
            universe.entry(&step.collection).or_default().insert(h.name().to_owned(), h);
        }
    }
    let mut checked = 0;
    for step in &steps {
        let Some(all) = universe.get(step.collection.as_str()) else { continue };
        if step.query.contains_key("limit") || step.query.contains_key("continue") {
            continue;
        }
        let ctx = format!("{} {:?}", step.file, step.query);
        let (labels, fields) = parse(step).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        let ours: BTreeSet<&str> = all
            .values()
            .filter(|h| labels.matches(&h.labels()) && fields.matches(h))
            .map(|h| h.name())
            .collect();
        let theirs: BTreeSet<&str> = step.body["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|i| i["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(ours, theirs, "{ctx}");
        checked += 1;
    }
    assert!(checked >= 20, "only {checked} lists compared");
}
