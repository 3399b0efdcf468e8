//! Replays one recorded scenario (`tests/recordings/v1.28.7/<name>.json`) against a
//! target (the simulated apiserver directly, or the proxy in front of it) and compares the
//! answers semantically, by the rules of the conformance README ("What may legitimately differ
//! when a cache serves the request"). Used by `tests/conformance.rs`.

use std::collections::HashMap;
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

/// Mutable per-scenario state: recorded → run continue tokens and their list RVs.
#[derive(Default)]
pub struct Run {
    tokens: HashMap<String, String>,
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

/// Sends one write of a `during` list (or a write step) to `base`.
pub async fn write(client: &HttpClient, base: &str, req: &Value, vars: &Vars, run: &Run) -> u16 {
    let method = Method::from_bytes(req["method"].as_str().unwrap_or("GET").as_bytes()).unwrap();
    let q = encode_query(&req["query"], vars, run);
    let body = (!req["body"].is_null()).then(|| req["body"].clone());
    let h = headers(req);
    let hr: Vec<(&str, &str)> = h.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let r = send(client, method, &url(base, req["path"].as_str().unwrap_or(""), &q), body, &hr).await;
    r.status.as_u16()
}

/// Replays every step; returns one line per difference (`step N: …`).
pub async fn scenario(t: &Target<'_>, sc: &Value, vars: &Vars) -> Vec<String> {
    let mut run = Run::default();
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
        let got = write(t.client, &t.base, req, vars, run).await;
        return if got == want { vec![] } else { vec![format!("{method} status {got}, want {want}")] };
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
        return;
    }
    // One object.
    if ident(got) != ident(want) {
        diffs.push(format!("object {}, want {}", ident(got), ident(want)));
    }
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

async fn watch(t: &Target<'_>, step: &Value, u: &str, vars: &Vars, run: &Run) -> Vec<String> {
    let rec = &step["response"];
    let events = rec["body"].as_array().cloned().unwrap_or_default();
    let offsets: Vec<f64> =
        rec["event_offsets_s"].as_array().into_iter().flatten().filter_map(Value::as_f64).collect();
    // Initial events: those that arrived before the recorder's writes (0.5 s after headers).
    let mut initial = Vec::new();
    let mut live = Vec::new();
    for (i, e) in events.iter().enumerate() {
        if e["type"] == "BOOKMARK" {
            continue;
        }
        if e["type"] == "ADDED" && offsets.get(i).is_some_and(|o| *o < 0.45) {
            initial.push(event_id(e));
        } else {
            live.push(event_id(e));
        }
    }
    let mut w = open_watch(t.client, u).await;
    let want_status = rec["status"].as_u64().unwrap_or(0) as u16;
    if w.status.as_u16() != want_status {
        return vec![format!("watch status {}, want {want_status}", w.status)];
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    for d in step["during"].as_array().into_iter().flatten() {
        let code = write(t.client, &t.sim_base, &d["request"], vars, run).await;
        let want = d["response"]["status"].as_u64().unwrap_or(0) as u16;
        if code != want {
            return vec![format!(
                "during write {} {}: status {code}, want {want}",
                d["request"]["method"], d["request"]["path"]
            )];
        }
    }
    let expected = initial.len() + live.len();
    let timeout: u64 =
        step["request"]["query"]["timeoutSeconds"].as_str().and_then(|s| s.parse().ok()).unwrap_or(3);
    // Nothing expected: a short look for unexpected events is enough.
    let limit =
        if expected == 0 { Duration::from_millis(700) } else { Duration::from_secs(timeout.min(3) + 1) };
    let deadline = tokio::time::Instant::now() + limit;
    let mut got = Vec::new();
    loop {
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
            Some(e) if e["type"] == "BOOKMARK" => {}
            Some(e) => got.push(event_id(&e)),
            None => break,
        }
    }
    let n = initial.len().min(got.len());
    let mut gi: Vec<String> = got[..n].to_vec();
    let mut wi = initial.clone();
    gi.sort();
    wi.sort();
    let gl = &got[n..];
    if gi != wi || gl != live.as_slice() {
        return vec![format!("events initial {gi:?} then {gl:?}, want initial {wi:?} then {live:?}")];
    }
    vec![]
}
