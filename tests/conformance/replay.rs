//! Replays one recorded scenario (`tests/recordings/v1.28.7/<name>.json`) against a
//! target (the simulated apiserver directly, or the proxy in front of it) and compares the
//! answers semantically, by the rules of the conformance README ("What may legitimately differ
//! when a cache serves the request"). Used by `tests/conformance.rs`.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::Method;
use kube_watchcache::params::ContinueToken;
use serde_json::Value;

use super::fixtures::Vars;
use crate::common::{open_watch, send, HttpClient};

/// Where requests go.
pub struct Target<'a> {
    pub client: &'a HttpClient,
    /// `http://host:port` of the side under test.
    pub base: String,
    /// `http://host:port` of the sim (the `during` writes go there directly).
    pub sim_base: String,
}

/// The recordings use `capture.example.com/widgets`; the sim serves `example.com/widgets`.
pub fn map_group(raw: &str) -> String {
    raw.replace("capture.example.com", "example.com")
}

/// Mutable per-scenario state: recorded → run continue tokens, and the object versions seen.
#[derive(Default)]
pub struct Run {
    tokens: HashMap<String, String>,
    rvs: RvMap,
}

/// Recorded → actual resourceVersions of object versions (the RV a write gave an object), built
/// up over one scenario: seeded with the setup writes, then every write response, GET object,
/// list item and watch event object that lines up with a recorded one. The same recorded
/// version must always be the same actual version (an object's RV is the RV of the write that
/// made it, wherever it is read), two recorded versions never one actual version, and versions
/// written by this scenario keep their recorded order (against each other and the fixtures').
/// List and bookmark RVs are not object versions; they are checked by relations instead.
#[derive(Default)]
pub struct RvMap {
    fwd: HashMap<u64, u64>,
    back: HashMap<u64, u64>,
    /// Recorded RVs written by this scenario (own setup lines, steps, `during` writes).
    own: HashSet<u64>,
}

impl RvMap {
    fn seed(vars: &Vars) -> RvMap {
        let mut m = RvMap { own: vars.own.clone(), ..Default::default() };
        for (r, a) in vars.rvs.iter().filter(|(r, _)| !vars.derived.contains(r)) {
            m.fwd.insert(*r, *a);
            m.back.entry(*a).or_insert(*r);
        }
        m
    }

    /// Records that recorded version `rec` is actual version `got` (`what` names the place).
    fn observe(&mut self, rec: u64, got: u64, own: bool, what: &str, diffs: &mut Vec<String>) {
        if rec == 0 || got == 0 {
            return;
        }
        RVS_MAPPED.fetch_add(1, Ordering::Relaxed);
        if own {
            self.own.insert(rec);
        }
        if let Some(a) = self.fwd.get(&rec) {
            if *a != got {
                diffs.push(format!("{what}: RV {got} where recorded RV {rec} was {a} before (same version)"));
            }
            return;
        }
        if let Some(r) = self.back.get(&got) {
            if *r != rec {
                diffs.push(format!("{what}: RV {got} stands for two recorded versions, {r} and {rec}"));
                return;
            }
        }
        for (r, a) in &self.fwd {
            if (self.own.contains(r) || self.own.contains(&rec)) && r.cmp(&rec) != a.cmp(&got) {
                diffs.push(format!(
                    "{what}: RV order differs: recorded {rec} {:?} {r}, actual {got} {:?} {a}",
                    rec.cmp(r),
                    got.cmp(a)
                ));
                break;
            }
        }
        self.fwd.insert(rec, got);
        self.back.insert(got, rec);
    }
}

/// How much the body and RV checks looked at (printed with the suite's report, so a check
/// that silently stops running shows).
pub static BODIES_COMPARED: AtomicUsize = AtomicUsize::new(0);
pub static RVS_MAPPED: AtomicUsize = AtomicUsize::new(0);
pub static WATCH_EVENTS_CHECKED: AtomicUsize = AtomicUsize::new(0);

fn rv_num(o: &Value) -> u64 {
    o["metadata"]["resourceVersion"].as_str().and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// Fields of an object that legitimately differ between the recorded apiserver and the sim:
/// (kind or `*`, dotted path, `[]` = every array element, why). Everything else is compared:
/// kind/apiVersion presence and values, name, namespace, labels, annotations, generation,
/// finalizers, deletion (as presence), data, spec, status and the other top-level fields.
/// The proxy stores and serves the upstream's bytes, so none of these hides a proxy change
/// of an object: the same fields come from the sim on both sides.
pub const MASKED_FIELDS: &[(&str, &str, &str)] = &[
    ("*", "metadata.uid", "random per object"),
    ("*", "metadata.creationTimestamp", "wall clock"),
    ("*", "metadata.resourceVersion", "compared as relations (RvMap, list/watch/bookmark checks)"),
    ("*", "metadata.managedFields", "the sim tracks no field managers (the recorder's manager and times)"),
    (
        "Namespace",
        "metadata.labels.kubernetes.io/metadata.name",
        "the apiserver adds it on create; the sim does not",
    ),
    ("Pod", "spec.volumes", "ServiceAccount admission (projected token volume) is not modelled by the sim"),
    ("Pod", "spec.containers[].volumeMounts", "ServiceAccount admission (token volume mount)"),
    ("Pod", "spec.serviceAccount", "deprecated alias the apiserver fills in; not modelled"),
    ("Pod", "spec.tolerations", "DefaultTolerationSeconds admission; not modelled"),
    ("Pod", "spec.priority", "Priority admission; not modelled"),
    ("Pod", "spec.preemptionPolicy", "Priority admission; not modelled"),
    ("Pod", "spec.enableServiceLinks", "defaulting not modelled by the sim"),
    ("Pod", "spec.securityContext", "defaulting not modelled by the sim"),
    ("Pod", "spec.containers[].resources", "defaulting not modelled by the sim"),
    ("Pod", "spec.containers[].terminationMessagePath", "defaulting not modelled by the sim"),
    ("Pod", "spec.containers[].terminationMessagePolicy", "defaulting not modelled by the sim"),
    ("Pod", "spec.containers[].imagePullPolicy", "defaulting not modelled by the sim"),
    ("Pod", "status.qosClass", "computed by the apiserver; not modelled"),
    (
        "Pod",
        "status.conditions",
        "the binding subresource's PodScheduled condition (wall-clock time); not modelled",
    ),
    ("Node", "spec.taints", "TaintNodesByCondition admission (not-ready taint); not modelled"),
    ("Node", "status.daemonEndpoints", "zero-valued Go struct serialized by the apiserver; not modelled"),
    ("Node", "status.nodeInfo", "zero-valued Go struct serialized by the apiserver; not modelled"),
    ("Event", "firstTimestamp", "null from the typed Go struct (the sim keeps what was written)"),
    ("Event", "lastTimestamp", "null from the typed Go struct"),
    ("Event", "eventTime", "null from the typed Go struct"),
    ("Event", "reportingComponent", "empty string from the typed Go struct"),
    ("Event", "reportingInstance", "empty string from the typed Go struct"),
];

fn remove_path(v: &mut Value, path: &[&str]) {
    let Some((first, rest)) = path.split_first() else { return };
    if let Some(name) = first.strip_suffix("[]") {
        if let Some(a) = v.get_mut(name).and_then(Value::as_array_mut) {
            for e in a {
                remove_path(e, rest);
            }
        }
        return;
    }
    let Some(m) = v.as_object_mut() else { return };
    if rest.is_empty() {
        m.remove(*first);
    } else if let Some(next) = m.get_mut(*first) {
        remove_path(next, rest);
        // A parent that held nothing but masked fields goes too (`spec: {taints}` → no spec).
        if next.as_object().is_some_and(|o| o.is_empty()) && !rest[0].ends_with("[]") {
            m.remove(*first);
        }
    }
}

/// The object with [`MASKED_FIELDS`] removed and `deletionTimestamp` reduced to its presence.
/// `kind` is the object's kind (list items of built-in kinds carry none).
fn masked(o: &Value, kind: &str) -> Value {
    let mut o = o.clone();
    for (k, path, _) in MASKED_FIELDS {
        if *k == "*" || *k == kind {
            // Label keys contain dots: the first two segments are `metadata.labels`.
            let segs: Vec<&str> = match path.strip_prefix("metadata.labels.") {
                Some(key) => vec!["metadata", "labels", key],
                None => path.split('.').collect(),
            };
            remove_path(&mut o, &segs);
        }
    }
    if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
        if m.contains_key("deletionTimestamp") {
            m.insert("deletionTimestamp".into(), Value::from("<set>"));
        }
        if m.get("labels").and_then(Value::as_object).is_some_and(|l| l.is_empty()) {
            m.remove("labels");
        }
    }
    o
}

/// Paths (`a.b[2].c`) where `got` and `want` differ.
fn json_diff(got: &Value, want: &Value, path: &str, out: &mut Vec<String>) {
    match (got, want) {
        (Value::Object(g), Value::Object(w)) => {
            let keys: std::collections::BTreeSet<&String> = g.keys().chain(w.keys()).collect();
            for k in keys {
                let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                match (g.get(k), w.get(k)) {
                    (Some(a), Some(b)) => json_diff(a, b, &p, out),
                    (Some(a), None) => out.push(format!("{p}: unexpected {}", short(&a.to_string()))),
                    (None, Some(b)) => out.push(format!("{p}: missing (want {})", short(&b.to_string()))),
                    (None, None) => {}
                }
            }
        }
        (Value::Array(g), Value::Array(w)) if g.len() == w.len() => {
            for (i, (a, b)) in g.iter().zip(w).enumerate() {
                json_diff(a, b, &format!("{path}[{i}]"), out);
            }
        }
        _ if got != want => {
            out.push(format!("{path}: {} want {}", short(&got.to_string()), short(&want.to_string())))
        }
        _ => {}
    }
}

/// Compares one object body (after [`masked`]) and maps its RV. `kind` is the kind to mask
/// by when the object carries none (list items).
fn compare_object(
    got: &Value,
    want: &Value,
    kind: &str,
    what: &str,
    own: bool,
    run: &mut Run,
    diffs: &mut Vec<String>,
) {
    let kind = want["kind"].as_str().unwrap_or(kind);
    if kind == "Status" {
        return;
    }
    BODIES_COMPARED.fetch_add(1, Ordering::Relaxed);
    let mut d = Vec::new();
    json_diff(&masked(got, kind), &masked(want, kind), "", &mut d);
    if !d.is_empty() {
        diffs.push(format!("{what} body differs: {}", d.join("; ")));
    }
    run.rvs.observe(rv_num(want), rv_num(got), own, what, diffs);
}

/// A list's RV is at least the RV of each of its items.
fn list_rv_covers_items(list_rv: u64, items: &[Value]) -> Option<String> {
    let max = items.iter().map(rv_num).max()?;
    (list_rv < max).then(|| format!("list RV {list_rv} < the RV {max} of one of its items"))
}

/// The kind of a list's items (`ConfigMapList` → `ConfigMap`).
fn item_kind(list: &Value) -> String {
    list["kind"].as_str().unwrap_or("").trim_end_matches("List").to_owned()
}

fn encode_query(q: &Value, vars: &Vars, run: &Run) -> String {
    let mut ser = form_urlencoded::Serializer::new(String::new());
    if let Some(m) = q.as_object() {
        for (k, v) in m {
            let v = v.as_str().unwrap_or("");
            let v = match k.as_str() {
                "resourceVersion" => vars.map_rv_text(v),
                "continue" => map_token(v, vars, run),
                // Keep the suite fast: watches never run longer than 3 s here.
                "timeoutSeconds" => v.parse::<u64>().map(|n| n.min(3).to_string()).unwrap_or(v.to_owned()),
                _ => v.to_owned(),
            };
            ser.append_pair(k, &v);
        }
    }
    ser.finish()
}

fn map_token(v: &str, vars: &Vars, run: &Run) -> String {
    if let Some(t) = run.tokens.get(v).or_else(|| vars.tokens.get(v)) {
        return t.clone();
    }
    match ContinueToken::decode(v) {
        Ok(t) if t.rv > 0 => match vars.rvs.get(&(t.rv as u64)) {
            Some(run_rv) => ContinueToken { rv: *run_rv as i64, start: t.start }.encode(),
            None => v.to_owned(),
        },
        _ => v.to_owned(),
    }
}

fn url(base: &str, path: &str, query: &str) -> String {
    if query.is_empty() {
        format!("{base}{path}")
    } else {
        format!("{base}{path}?{query}")
    }
}

fn headers(req: &Value) -> Vec<(String, String)> {
    req["headers"]
        .as_object()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), map_group(v.as_str().unwrap_or("")))).collect())
        .unwrap_or_default()
}

/// Sends one write of a `during` list (or a write step) to `base`: status and JSON body.
pub async fn write(client: &HttpClient, base: &str, req: &Value, vars: &Vars, run: &Run) -> (u16, Value) {
    let method = Method::from_bytes(req["method"].as_str().unwrap_or("GET").as_bytes()).unwrap();
    let q = encode_query(&req["query"], vars, run);
    let body = (!req["body"].is_null()).then(|| req["body"].clone());
    let h = headers(req);
    let hr: Vec<(&str, &str)> = h.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let r = send(client, method, &url(base, req["path"].as_str().unwrap_or(""), &q), body, &hr).await;
    (r.status.as_u16(), serde_json::from_slice(&r.body).unwrap_or(Value::Null))
}

/// Compares a write's answer with the recorded one (object body, RV mapped as this scenario's).
/// A recorded Status (a DELETE's Success, a refusal) is compared by its kind, status, code and
/// what its details name (not the uid, made per run).
fn compare_write(got: &Value, rec: &Value, what: &str, run: &mut Run, diffs: &mut Vec<String>) {
    let want = &rec["body"];
    if !want["kind"].is_string() {
        return;
    }
    if want["kind"] != got["kind"] {
        diffs.push(format!(
            "{what}: answered a {} where the apiserver answered a {}",
            got["kind"], want["kind"]
        ));
        return;
    }
    if want["kind"] != "Status" {
        compare_object(got, want, "", what, true, run, diffs);
        return;
    }
    for p in ["/status", "/code", "/reason", "/details/name", "/details/group", "/details/kind"] {
        if got.pointer(p) != want.pointer(p) {
            diffs.push(format!("{what}: Status {p} {:?} (recorded {:?})", got.pointer(p), want.pointer(p)));
        }
    }
}

/// Replays every step; returns one line per difference (`step N: …`).
pub async fn scenario(t: &Target<'_>, sc: &Value, vars: &Vars) -> Vec<String> {
    let mut run = Run { rvs: RvMap::seed(vars), ..Default::default() };
    let mut diffs = Vec::new();
    for (i, step) in sc["steps"].as_array().into_iter().flatten().enumerate() {
        let before = vars.current_rv();
        let mut d = self::step(t, step, vars, &mut run, before).await;
        diffs.extend(d.drain(..).map(|x| format!("step {}: {x}", i + 1)));
    }
    diffs
}

async fn step(t: &Target<'_>, step: &Value, vars: &Vars, run: &mut Run, before: u64) -> Vec<String> {
    let req = &step["request"];
    let rec = &step["response"];
    let method = req["method"].as_str().unwrap_or("GET");
    let q = encode_query(&req["query"], vars, run);
    let u = url(&t.base, req["path"].as_str().unwrap_or(""), &q);
    let want = rec["status"].as_u64().unwrap_or(0) as u16;
    if rec["body"].is_array() {
        return watch(t, step, &u, vars, run).await;
    }
    if method != "GET" {
        let (got, body) = write(t.client, &t.base, req, vars, run).await;
        if got != want {
            return vec![format!("{method} status {got}, want {want}")];
        }
        let mut diffs = Vec::new();
        compare_write(&body, rec, &format!("{method} answer"), run, &mut diffs);
        return diffs;
    }
    let h = headers(req);
    let hr: Vec<(&str, &str)> = h.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let r = send(t.client, Method::GET, &u, None, &hr).await;
    let mut diffs = Vec::new();
    if r.status.as_u16() != want {
        diffs.push(format!(
            "status {}, want {want} ({})",
            r.status,
            short(&String::from_utf8_lossy(&r.body))
        ));
        return diffs;
    }
    let ct = |h: &http::HeaderMap| {
        h.get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .split(';')
            .next()
            .unwrap_or("")
            .to_owned()
    };
    let want_ct =
        rec["headers"]["content-type"].as_str().unwrap_or("").split(';').next().unwrap_or("").to_owned();
    if !want_ct.is_empty() && ct(&r.headers) != want_ct {
        diffs.push(format!("content-type {:?}, want {want_ct:?}", ct(&r.headers)));
    }
    let body = &rec["body"];
    if body.get("encoding").is_some() {
        return diffs; // protobuf: status and content type only
    }
    if let Some(text) = body.get("text").and_then(Value::as_str) {
        if String::from_utf8_lossy(&r.body).trim() != text.trim() {
            diffs.push(format!("text {:?}, want {text:?}", String::from_utf8_lossy(&r.body)));
        }
        return diffs;
    }
    let got: Value = match serde_json::from_slice(&r.body) {
        Ok(v) => v,
        Err(e) => return vec![format!("body is not JSON ({e})")],
    };
    if body.get("summary").is_some() {
        // as=Table summary.
        if got["kind"] != body["kind"] {
            diffs.push(format!("kind {}, want {}", got["kind"], body["kind"]));
        }
        let rows = got["rows"].as_array().map(|a| a.len() as u64);
        if rows != body["rows_count"].as_u64() {
            diffs.push(format!("rows {rows:?}, want {}", body["rows_count"]));
        }
        return diffs;
    }
    compare_json(&got, body, req, vars, run, before, &mut diffs);
    diffs
}

fn compare_json(
    got: &Value,
    want: &Value,
    req: &Value,
    vars: &Vars,
    run: &mut Run,
    before: u64,
    diffs: &mut Vec<String>,
) {
    if want["kind"] == "Status" {
        compare_status(got, want, diffs);
        if let (Some(w), Some(g)) =
            (want["metadata"]["continue"].as_str(), got["metadata"]["continue"].as_str())
        {
            run.tokens.insert(w.to_owned(), g.to_owned());
        }
        return;
    }
    if got["kind"] != want["kind"] {
        diffs.push(format!("kind {}, want {}", got["kind"], want["kind"]));
        return;
    }
    if let Some(items) = want["items"].as_array() {
        let ids = |a: &[Value]| -> Vec<String> { a.iter().map(ident).collect() };
        let g = ids(got["items"].as_array().map(Vec::as_slice).unwrap_or(&[]));
        let w = ids(items);
        if g != w {
            diffs.push(format!("items {g:?}, want {w:?}"));
        }
        let (gm, wm) = (&got["metadata"], &want["metadata"]);
        let has = |m: &Value, k: &str| m.get(k).is_some_and(|v| v.as_str() != Some(""));
        if has(gm, "continue") != has(wm, "continue") {
            diffs.push(format!("continue present: {}, want {}", has(gm, "continue"), has(wm, "continue")));
        }
        if gm.get("remainingItemCount") != wm.get("remainingItemCount") {
            diffs.push(format!(
                "remainingItemCount {:?}, want {:?}",
                gm.get("remainingItemCount"),
                wm.get("remainingItemCount")
            ));
        }
        if let (Some(w), Some(g)) = (wm["continue"].as_str(), gm["continue"].as_str()) {
            if !w.is_empty() {
                run.tokens.insert(w.to_owned(), g.to_owned());
            }
        }
        let list_rv: u64 = gm["resourceVersion"].as_str().and_then(|s| s.parse().ok()).unwrap_or(0);
        if let Some(e) = check_list_rv(list_rv, req, vars, run, before) {
            diffs.push(e);
        }
        let got_items = got["items"].as_array().map(Vec::as_slice).unwrap_or(&[]);
        diffs.extend(list_rv_covers_items(list_rv, got_items));
        if g == w {
            let kind = item_kind(want);
            for (gi, wi) in got_items.iter().zip(items) {
                compare_object(gi, wi, &kind, &format!("item {}", ident(wi)), false, run, diffs);
            }
        }
        return;
    }
    // One object.
    if ident(got) != ident(want) {
        diffs.push(format!("object {}, want {}", ident(got), ident(want)));
        return;
    }
    compare_object(got, want, "", "object", false, run, diffs);
}

/// `namespace/name` plus the configmap data, when there is some.
fn ident(o: &Value) -> String {
    let m = &o["metadata"];
    let mut s = format!("{}/{}", m["namespace"].as_str().unwrap_or(""), m["name"].as_str().unwrap_or(""));
    if let Some(d) = o.get("data") {
        s.push_str(&format!(" {d}"));
    }
    s
}

/// The list RV must satisfy the request: Exact / legacy-exact / continue → equal; NotOlderThan →
/// ≥ N; unset → ≥ the last write before the request; 0 → anything.
fn check_list_rv(got: u64, req: &Value, vars: &Vars, run: &Run, before: u64) -> Option<String> {
    let q = &req["query"];
    let rv_text = q["resourceVersion"].as_str().unwrap_or("");
    let mapped = vars.map_rv_text(rv_text);
    let n: u64 = mapped.parse().unwrap_or(0);
    let exact = q["resourceVersionMatch"] == "Exact"
        || (q["resourceVersionMatch"].is_null() && q["limit"].as_str().is_some_and(|l| l != "0") && n > 0);
    if let Some(c) = q["continue"].as_str() {
        let token = map_token(c, vars, run);
        return match ContinueToken::decode(&token) {
            Ok(t) if t.rv > 0 && got != t.rv as u64 => {
                Some(format!("list RV {got}, want the token's {}", t.rv))
            }
            Ok(t) if t.rv < 0 && got < before => Some(format!("list RV {got} < last write {before}")),
            _ => None,
        };
    }
    if rv_text.is_empty() {
        return (got < before).then(|| format!("list RV {got} < last write {before}"));
    }
    if n == 0 {
        return None;
    }
    if exact {
        return (got != n).then(|| format!("list RV {got}, want exactly {n}"));
    }
    (got < n).then(|| format!("list RV {got} < requested {n}"))
}

/// Masks the numbers that legitimately differ (`current: N`, `(N)`, RVs in RV messages).
fn mask(msg: &str) -> String {
    if !msg.contains("resource version") {
        return msg.to_owned();
    }
    let mut out = String::new();
    let mut in_digits = false;
    for c in msg.chars() {
        if c.is_ascii_digit() {
            if !in_digits {
                out.push('N');
            }
            in_digits = true;
        } else {
            in_digits = false;
            out.push(c);
        }
    }
    out
}

fn compare_status(got: &Value, want: &Value, diffs: &mut Vec<String>) {
    if got["kind"] != "Status" {
        diffs.push(format!("not a Status: {}", short(&got.to_string())));
        return;
    }
    for k in ["code", "reason", "status"] {
        if got.get(k) != want.get(k) {
            diffs.push(format!("{k} {:?}, want {:?}", got.get(k), want.get(k)));
        }
    }
    let (g, w) = (mask(got["message"].as_str().unwrap_or("")), mask(want["message"].as_str().unwrap_or("")));
    if g != w {
        diffs.push(format!("message {g:?}, want {w:?}"));
    }
    if got["details"]["causes"] != want["details"]["causes"] {
        diffs.push(format!("causes {}, want {}", got["details"]["causes"], want["details"]["causes"]));
    }
}

fn short(s: &str) -> String {
    s.chars().take(200).collect()
}

/// One event as compared: `TYPE ns/name`, or `ERROR <masked message>`.
fn event_id(e: &Value) -> String {
    let ty = e["type"].as_str().unwrap_or("");
    if ty == "ERROR" {
        return format!(
            "ERROR {} {}",
            e["object"]["code"],
            mask(e["object"]["message"].as_str().unwrap_or(""))
        );
    }
    let m = &e["object"]["metadata"];
    format!("{ty} {}/{}", m["namespace"].as_str().unwrap_or(""), m["name"].as_str().unwrap_or(""))
}

async fn watch(t: &Target<'_>, step: &Value, u: &str, vars: &Vars, run: &mut Run) -> Vec<String> {
    let rec = &step["response"];
    let events = rec["body"].as_array().cloned().unwrap_or_default();
    let offsets: Vec<f64> =
        rec["event_offsets_s"].as_array().into_iter().flatten().filter_map(Value::as_f64).collect();
    // Initial events: those that arrived before the recorder's writes (0.5 s after headers).
    let mut initial: Vec<Value> = Vec::new();
    let mut live: Vec<Value> = Vec::new();
    for (i, e) in events.iter().enumerate() {
        if e["type"] == "BOOKMARK" {
            continue;
        }
        if e["type"] == "ADDED" && offsets.get(i).is_some_and(|o| *o < 0.45) {
            initial.push(e.clone());
        } else {
            live.push(e.clone());
        }
    }
    let mut w = open_watch(t.client, u).await;
    let want_status = rec["status"].as_u64().unwrap_or(0) as u16;
    if w.status.as_u16() != want_status {
        return vec![format!("watch status {}, want {want_status}", w.status)];
    }
    let expected = initial.len() + live.len();
    let timeout: u64 =
        step["request"]["query"]["timeoutSeconds"].as_str().and_then(|s| s.parse().ok()).unwrap_or(3);
    // Nothing expected: a short look for unexpected events is enough.
    let limit =
        if expected == 0 { Duration::from_millis(700) } else { Duration::from_secs(timeout.min(3) + 1) };
    let deadline = tokio::time::Instant::now() + limit;
    // Every event in arrival order (bookmarks included) and the others apart.
    let mut all: Vec<Value> = Vec::new();
    let mut got: Vec<Value> = Vec::new();
    let mut ended = false;
    // As the recorder did, the writes come once the initial events are in (instead of 0.5 s).
    while got.len() < initial.len() {
        let now = tokio::time::Instant::now();
        match w.next(deadline.saturating_duration_since(now)).await {
            Some(e) => {
                if e["type"] != "BOOKMARK" {
                    got.push(e.clone());
                }
                all.push(e);
            }
            None => {
                ended = true;
                break;
            }
        }
    }
    let mut write_diffs = Vec::new();
    for d in step["during"].as_array().into_iter().flatten() {
        let (code, body) = write(t.client, &t.sim_base, &d["request"], vars, run).await;
        let want = d["response"]["status"].as_u64().unwrap_or(0) as u16;
        if code != want {
            return vec![format!(
                "during write {} {}: status {code}, want {want}",
                d["request"]["method"], d["request"]["path"]
            )];
        }
        let what = format!("during {} {}", d["request"]["method"], d["request"]["path"]);
        compare_write(&body, &d["response"], &what, run, &mut write_diffs);
    }
    while !ended {
        let now = tokio::time::Instant::now();
        if now >= deadline {
            break;
        }
        // Once everything expected arrived, wait a little for extras only.
        let wait = if got.len() >= expected {
            Duration::from_millis(200).min(deadline - now)
        } else {
            deadline - now
        };
        match w.next(wait).await {
            Some(e) => {
                if e["type"] != "BOOKMARK" {
                    got.push(e.clone());
                }
                all.push(e);
            }
            None => ended = true,
        }
    }
    let ids = |v: &[Value]| -> Vec<String> { v.iter().map(event_id).collect() };
    let n = initial.len().min(got.len());
    let mut gi = ids(&got[..n]);
    let mut wi = ids(&initial);
    gi.sort();
    wi.sort();
    let gl = ids(&got[n..]);
    let wl = ids(&live);
    if gi != wi || gl != wl {
        return [
            write_diffs,
            vec![format!("events initial {gi:?} then {gl:?}, want initial {wi:?} then {wl:?}")],
        ]
        .concat();
    }
    let mut diffs = write_diffs;
    // Bodies and object versions: initial events paired by identity, live ones in order.
    let mut gi_sorted: Vec<&Value> = got[..n].iter().collect();
    let mut wi_sorted: Vec<&Value> = initial.iter().collect();
    gi_sorted.sort_by_key(|e| event_id(e));
    wi_sorted.sort_by_key(|e| event_id(e));
    let pairs = gi_sorted.into_iter().zip(wi_sorted).chain(got[n..].iter().zip(&live));
    for (g, want) in pairs {
        if g["type"] == "ERROR" {
            continue;
        }
        let what = format!("event {}", event_id(want));
        compare_object(&g["object"], &want["object"], "", &what, false, run, &mut diffs);
    }
    let query = &step["request"]["query"];
    let start = vars.map_rv_text(query["resourceVersion"].as_str().unwrap_or("")).parse().unwrap_or(0);
    diffs.extend(watch_rv_relations(&all, n, start, query["sendInitialEvents"] == "true"));
    diffs
}

/// RV relations every watch answer must show, whatever the timing: with a start RV N (no
/// initial events asked for) every event is after N; the events after the initial ones
/// strictly increase and come after every initial one; bookmarks never go backwards, never
/// before N, and never before an event already sent.
/// `start` is the (mapped) resourceVersion of the request, `sie` whether initial events were
/// asked for.
fn watch_rv_relations(all: &[Value], initial: usize, start: u64, sie: bool) -> Vec<String> {
    let mut diffs = Vec::new();
    let mut seen = 0; // non-bookmark events so far
    let mut max_initial = 0;
    let mut last_live: Option<u64> = None;
    let mut last_event = 0;
    let mut last_bookmark = 0;
    for e in all {
        let ty = e["type"].as_str().unwrap_or("");
        if ty == "ERROR" {
            continue;
        }
        WATCH_EVENTS_CHECKED.fetch_add(1, Ordering::Relaxed);
        let rv = rv_num(&e["object"]);
        if ty == "BOOKMARK" {
            if rv < last_bookmark {
                diffs.push(format!("bookmark RV {rv} after bookmark RV {last_bookmark}"));
            }
            if rv < last_event {
                diffs.push(format!("bookmark RV {rv} < the RV {last_event} of an event already sent"));
            }
            if rv < start {
                diffs.push(format!("bookmark RV {rv} < the watch's start RV {start}"));
            }
            last_bookmark = last_bookmark.max(rv);
            continue;
        }
        if start > 0 && !sie && rv <= start {
            diffs.push(format!("{ty} RV {rv} not after the watch's start RV {start}"));
        }
        if seen < initial {
            max_initial = max_initial.max(rv);
        } else {
            if rv <= max_initial {
                diffs.push(format!("{ty} RV {rv} not after the initial events (up to {max_initial})"));
            }
            if let Some(l) = last_live.filter(|l| rv <= *l) {
                diffs.push(format!("{ty} RV {rv} after {l}: watch RVs must strictly increase"));
            }
            last_live = Some(rv);
        }
        last_event = last_event.max(rv);
        seen += 1;
    }
    diffs
}

// The checks above must be able to fail: each is fed an answer that breaks it.

#[cfg(test)]
fn cm(name: &str, rv: u64, data: &str) -> Value {
    serde_json::json!({"kind": "ConfigMap", "apiVersion": "v1",
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{rv}"), "resourceVersion": rv.to_string(),
            "creationTimestamp": "2026-11-22T00:37:01Z", "labels": {"app": "w"},
            "managedFields": [{"manager": "m", "time": "2026-11-22T00:37:01Z"}]},
        "data": {"k": data}})
}

#[test]
fn rv_map_catches_versions_that_do_not_line_up() {
    let mut m = RvMap::default();
    let mut d = Vec::new();
    m.observe(100, 10, false, "fixture", &mut d);
    m.observe(200, 20, true, "own write", &mut d);
    m.observe(100, 10, false, "same version read again", &mut d);
    assert!(d.is_empty(), "{d:?}");
    m.observe(100, 11, false, "x", &mut d);
    assert!(d.pop().unwrap().contains("was 10 before"), "one version read as another");
    m.observe(101, 10, false, "x", &mut d);
    assert!(d.pop().unwrap().contains("two recorded versions"), "two versions read as one");
    m.observe(300, 15, true, "x", &mut d);
    assert!(d.pop().unwrap().contains("order differs"), "a later own write with an earlier RV");
    // Fixture against fixture: their relative order is not this scenario's to check.
    m.observe(90, 12, false, "x", &mut d);
    assert!(d.is_empty(), "{d:?}");
}

#[test]
fn bodies_are_compared_with_only_the_masked_fields_ignored() {
    let want = cm("a", 5, "v");
    let mut d = Vec::new();
    let mut run = Run::default();
    compare_object(&cm("a", 77, "v"), &want, "", "same", false, &mut run, &mut d);
    assert!(d.is_empty(), "uid, times, managedFields and the RV number are masked: {d:?}");
    for (what, mutate) in [
        ("data", Box::new(|o: &mut Value| o["data"]["k"] = "w".into()) as Box<dyn Fn(&mut Value)>),
        ("labels", Box::new(|o: &mut Value| o["metadata"]["labels"]["app"] = "x".into())),
        (
            "annotations",
            Box::new(|o: &mut Value| o["metadata"]["annotations"] = serde_json::json!({"a": "b"})),
        ),
        ("kind", Box::new(|o: &mut Value| drop(o.as_object_mut().unwrap().remove("kind")))),
        ("apiVersion", Box::new(|o: &mut Value| o["apiVersion"] = "v2".into())),
        ("namespace", Box::new(|o: &mut Value| o["metadata"]["namespace"] = "other".into())),
        ("deletion", Box::new(|o: &mut Value| o["metadata"]["deletionTimestamp"] = "t".into())),
    ] {
        let mut got = cm("a", 78, "v");
        mutate(&mut got);
        let mut run = Run::default();
        compare_object(&got, &want, "", what, false, &mut run, &mut d);
        assert!(d.pop().is_some_and(|x| x.contains("body differs")), "{what} change caught");
    }
}

#[test]
fn list_and_watch_rv_relations_catch_broken_answers() {
    let items = [cm("a", 5, "v"), cm("b", 9, "v")];
    assert!(list_rv_covers_items(9, &items).is_none());
    assert!(list_rv_covers_items(8, &items).is_some(), "list RV below an item's");
    let ev = |ty: &str, rv: u64| serde_json::json!({"type": ty, "object": cm("a", rv, "v")});
    let ok = [ev("ADDED", 3), ev("ADDED", 2), ev("BOOKMARK", 4), ev("MODIFIED", 6), ev("BOOKMARK", 6)];
    assert!(watch_rv_relations(&ok, 2, 0, false).is_empty(), "initial events may come in any order");
    let cases: [(&str, Vec<Value>, usize, u64); 6] = [
        ("not increasing", vec![ev("MODIFIED", 7), ev("MODIFIED", 6)], 0, 5),
        ("duplicate", vec![ev("MODIFIED", 7), ev("MODIFIED", 7)], 0, 5),
        ("at the start RV", vec![ev("MODIFIED", 5)], 0, 5),
        ("live before an initial", vec![ev("ADDED", 8), ev("MODIFIED", 7)], 1, 0),
        ("bookmark backwards", vec![ev("BOOKMARK", 9), ev("BOOKMARK", 8)], 0, 5),
        ("bookmark before an event", vec![ev("MODIFIED", 9), ev("BOOKMARK", 8)], 0, 5),
    ];
    for (what, events, initial, start) in cases {
        assert!(!watch_rv_relations(&events, initial, start, false).is_empty(), "{what} caught");
    }
}
