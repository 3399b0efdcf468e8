//! Discovery documents (the plain, non-aggregated forms; aggregated-discovery Accept
//! parameters are ignored and kubectl falls back): `/version`, `/api`, `/api/v1`, `/apis`,
//! `/apis/<g>`, `/apis/<g>/<v>`. Called by `http`.

use http::{HeaderMap, Response, StatusCode};
use serde_json::{json, Value};

use super::kinds::{Kinds, Served};
use super::respond::{full, json as respond, Body};

fn ok(v: Value) -> Response<Body> {
    respond(StatusCode::OK, full(serde_json::to_vec(&v).unwrap_or_default()))
}

pub fn version() -> Response<Body> {
    ok(json!({
        "major": "1",
        "minor": "36",
        "gitVersion": "v1.36.0-sim",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.25.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    }))
}

pub fn core_versions(headers: &HeaderMap) -> Response<Body> {
    let host = headers.get(http::header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("127.0.0.1");
    ok(json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": host}],
    }))
}

fn group_json(g: &str, v: &str) -> Value {
    let gv = json!({"groupVersion": format!("{g}/{v}"), "version": v});
    json!({"name": g, "versions": [gv.clone()], "preferredVersion": gv})
}

pub fn groups(kinds: &Kinds) -> Response<Body> {
    let groups: Vec<Value> = kinds.groups().into_iter().map(|(g, v)| group_json(g, v)).collect();
    ok(json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}))
}

pub fn group(kinds: &Kinds, g: &str) -> Response<Body> {
    let v = kinds.groups().into_iter().find(|(kg, _)| *kg == g).map(|(_, v)| v).unwrap_or("v1");
    let mut doc = group_json(g, v);
    doc["kind"] = json!("APIGroup");
    doc["apiVersion"] = json!("v1");
    ok(doc)
}

fn resource_json(s: &Served) -> Vec<Value> {
    let k = &s.kind;
    let mut verbs = vec!["create", "delete", "get", "list", "patch", "update", "watch"];
    if k.resource != "namespaces" {
        verbs.insert(1, "deletecollection");
    }
    let mut main = json!({
        "name": k.resource,
        "singularName": s.singular,
        "namespaced": k.namespaced,
        "kind": k.kind,
        "verbs": verbs,
    });
    if !s.short_names.is_empty() {
        main["shortNames"] = json!(s.short_names);
    }
    let mut out = vec![main];
    for sub in s.subresources {
        let (kind, verbs) = match *sub {
            "status" => (k.kind.as_str(), json!(["get", "patch", "update"])),
            "log" => ("Pod", json!(["get"])),
            _ => ("PodExecOptions", json!(["create", "get"])),
        };
        out.push(json!({
            "name": format!("{}/{}", k.resource, sub),
            "singularName": "",
            "namespaced": k.namespaced,
            "kind": if *sub == "attach" { "PodAttachOptions" } else { kind },
            "verbs": verbs,
        }));
    }
    out
}

pub fn resources(kinds: &Kinds, g: &str, v: &str) -> Response<Body> {
    let resources: Vec<Value> = kinds
        .all
        .iter()
        .filter(|s| s.kind.group == g && s.kind.version == v)
        .flat_map(resource_json)
        .collect();
    let gv = if g.is_empty() { v.to_owned() } else { format!("{g}/{v}") };
    let mut doc = json!({"kind": "APIResourceList", "groupVersion": gv, "resources": resources});
    if !g.is_empty() {
        doc["apiVersion"] = json!("v1");
    }
    ok(doc)
}
