//! Recreates a scenario's `setup` lines (shared fixtures once, then the scenario's own lines) in
//! the simulated apiserver, and maps the recorded resourceVersions (`vars`, `-> resourceVersion
//! N`) to the ones of this run. Used by `tests/conformance.rs` before `replay::scenario`.

use std::collections::{HashMap, HashSet};

use http::Method;
use kube_watchcache_sim::Sim;
use serde_json::{json, Value};

use crate::common::{send, HttpClient};

/// Recorded → run resourceVersions and continue tokens.
pub struct Vars {
    pub rvs: HashMap<u64, u64>,
    pub tokens: HashMap<String, String>,
    /// Recorded RVs of the writes made by this scenario's own setup lines (not the fixtures').
    pub own: HashSet<u64>,
    /// Recorded RVs mapped from `vars` that are not the RV of a write (`R_W`, `COMPACTED_AT`:
    /// mapped to the sim's current RV); not object versions.
    pub derived: HashSet<u64>,
    sim: Sim,
}

impl Vars {
    pub fn current_rv(&self) -> u64 {
        self.sim.current_rv().0
    }

    /// A recorded `resourceVersion` parameter in this run's terms (leading zeros and the
    /// `+100000` future RVs kept).
    pub fn map_rv_text(&self, v: &str) -> String {
        if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
            return v.to_owned();
        }
        let digits = v.trim_start_matches('0');
        let zeros = &v[..v.len() - digits.len()];
        let Ok(n) = digits.parse::<u64>() else { return v.to_owned() };
        if n == 0 {
            return v.to_owned();
        }
        let m = match self.rvs.get(&n) {
            Some(m) => *m,
            None if n >= 100_000 => match self.rvs.get(&(n - 100_000)) {
                Some(m) => m + 100_000,
                None => n,
            },
            None => n,
        };
        format!("{zeros}{m}")
    }
}

/// Fixture state shared by every scenario of one environment.
pub struct Setup {
    pub client: HttpClient,
    pub sim_base: String,
    pub sim: Sim,
    /// The proxy's caches when the proxy is under test: fixtures that compact wait for them,
    /// as the recording's watch cache had every event before `etcdctl compact`.
    pub proxy_caches: Vec<kube_watchcache::cache::Reader>,
    done: HashSet<String>,
    rvs: HashMap<u64, u64>,
    tokens: HashMap<String, String>,
    /// Resource (plural) → the sim's RV right after the last setup write to it: the proxy's
    /// cache of that resource has seen the setup once it reaches this RV.
    last_write: HashMap<String, u64>,
}

fn rv_of(v: &Value) -> u64 {
    v["metadata"]["resourceVersion"].as_str().and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// `a=b,c=d` (or `-`) → labels.
fn labels(s: &str) -> Value {
    let mut m = serde_json::Map::new();
    for kv in s.split(',').filter(|p| p.contains('=')) {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        m.insert(k.into(), json!(v));
    }
    Value::Object(m)
}

/// The word after `key` in `line`.
fn after<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_once(key).and_then(|(_, r)| r.split_whitespace().next())
}

fn recorded_rv(line: &str) -> Option<u64> {
    after(line, "-> resourceVersion ").and_then(|s| s.parse().ok())
}

fn pod(name: &str, node: Option<&str>, labels: Value, grace: Option<u64>) -> Value {
    let mut spec = json!({"containers": [{"name": "c", "image": "registry.example/pause:1"}]});
    if let Some(n) = node {
        spec["nodeName"] = json!(n);
    }
    if let Some(g) = grace {
        spec["terminationGracePeriodSeconds"] = json!(g);
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels}, "spec": spec})
}

impl Setup {
    pub fn new(client: HttpClient, sim_base: String, sim: Sim) -> Setup {
        Setup {
            client,
            sim_base,
            sim,
            proxy_caches: Vec::new(),
            done: HashSet::new(),
            rvs: HashMap::new(),
            tokens: HashMap::new(),
            last_write: HashMap::new(),
        }
    }

    async fn call(
        &mut self,
        method: Method,
        path: &str,
        body: Option<Value>,
        ct: Option<&str>,
    ) -> Result<Value, String> {
        let url = format!("{}{path}", self.sim_base);
        let h: Vec<(&str, &str)> = ct.map(|c| vec![("Content-Type", c)]).unwrap_or_default();
        let r = send(&self.client, method.clone(), &url, body, &h).await;
        if !r.status.is_success() && r.status != 409 {
            return Err(format!("setup {method} {path}: {} {}", r.status, String::from_utf8_lossy(&r.body)));
        }
        if method != Method::GET && r.status.is_success() {
            // One lane, one sim, sequential setup: the current RV is this write's (or later).
            self.last_write.insert(resource_of(path), self.sim.current_rv().0);
        }
        Ok(serde_json::from_slice(&r.body).unwrap_or(Value::Null))
    }

    async fn create(&mut self, path: &str, body: Value, line: &str) -> Result<(), String> {
        if let Some(ns) = path.split("/namespaces/").nth(1).and_then(|r| r.split('/').next()) {
            self.namespace(ns).await?;
        }
        let v = self.call(Method::POST, path, Some(body), None).await?;
        if let Some(rec) = recorded_rv(line) {
            self.rvs.insert(rec, rv_of(&v));
        }
        Ok(())
    }

    pub async fn namespace(&mut self, ns: &str) -> Result<(), String> {
        // The recorder labelled everything it created `capture=yes`.
        let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {"capture": "yes"}}});
        self.call(Method::POST, "/api/v1/namespaces", Some(body), None).await.map(|_| ())
    }

    /// Runs the setup lines of `sc` that have not run yet; `Err` is a reason to skip the scenario.
    pub async fn prepare(&mut self, sc: &Value) -> Result<Vars, String> {
        let lines: Vec<String> = sc["setup"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|l| l.as_str().map(str::to_owned))
            .collect();
        let mut fixtures: Vec<&str> = Vec::new();
        for l in &lines {
            if let Some(tag) = l.strip_prefix("[fixture ").and_then(|r| r.split(']').next()) {
                if !fixtures.contains(&tag) {
                    fixtures.push(tag);
                }
            }
        }
        for tag in fixtures {
            if self.done.insert(tag.to_owned()) {
                let prefix = format!("[fixture {tag}] ");
                let own: Vec<&str> = lines.iter().filter_map(|l| l.strip_prefix(prefix.as_str())).collect();
                // Namespaces first (the recorder listed some after their objects).
                for l in own.iter().filter(|l| l.contains("create namespace")) {
                    self.line(l).await?;
                }
                for l in own.iter().filter(|l| !l.contains("create namespace")) {
                    self.line(l).await?;
                }
            }
        }
        let fixture_rvs: HashSet<u64> = self.rvs.keys().copied().collect();
        for l in lines.iter().filter(|l| !l.starts_with("[fixture ")) {
            if l.starts_with("restart the apiserver") {
                return Err("needs an apiserver restart".into());
            }
            self.line(l).await?;
        }
        let own = self.rvs.keys().filter(|r| !fixture_rvs.contains(r)).copied().collect();
        let mut vars = Vars {
            rvs: self.rvs.clone(),
            tokens: self.tokens.clone(),
            own,
            derived: HashSet::new(),
            sim: self.sim.clone(),
        };
        let current = self.sim.current_rv().0;
        for (name, v) in sc["vars"].as_object().into_iter().flatten() {
            let Some(n) = v.as_str().and_then(|s| s.parse::<u64>().ok()) else { continue };
            if vars.rvs.contains_key(&n) || (n >= 100_000 && vars.rvs.contains_key(&(n - 100_000))) {
                continue;
            }
            match name.as_str() {
                // "list RV just before the watch" and the like.
                "R_W" | "COMPACTED_AT" => {
                    vars.rvs.insert(n, current);
                    vars.derived.insert(n);
                }
                _ => return Err(format!("cannot map var {name}={n}")),
            }
        }
        Ok(vars)
    }

    /// Waits (bounded) until every proxy cache has seen the setup writes to its resource.
    pub async fn proxy_caught_up(&self) -> Result<(), String> {
        for c in &self.proxy_caches {
            let Some(rv) = self.last_write.get(c.kind().resource.as_str()) else { continue };
            c.wait_for(kube_watchcache::resource::Rv(*rv), std::time::Duration::from_secs(10))
                .await
                .map_err(|e| format!("proxy cache of {} did not reach {rv}: {e}", c.kind().resource))?;
        }
        Ok(())
    }

    async fn line(&mut self, l: &str) -> Result<(), String> {
        let words: Vec<&str> = l.split_whitespace().collect();
        if let Some(ns) = after(l, "create namespace ") {
            return self.namespace(ns).await;
        }
        match words.as_slice() {
            ["create", "configmap", key, ..] => {
                let (ns, name) = key.split_once('/').unwrap_or(("", key));
                // The compaction fixture's lines omit the labels its recorded objects carry.
                let unlisted = if ns == "cap-compact" { json!({"app": "c"}) } else { json!({}) };
                let lbl = after(l, " labels ").map(labels).unwrap_or(unlisted);
                let data = after(l, " data k=").map(str::to_owned).unwrap_or_else(|| default_data(name));
                let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": lbl}, "data": {"k": data}});
                self.create(&format!("/api/v1/namespaces/{ns}/configmaps"), body, l).await
            }
            ["patch", "configmap", key, ..] => {
                let (ns, name) = key.split_once('/').unwrap_or(("", key));
                let data = after(l, " data k=")
                    .map(str::to_owned)
                    .unwrap_or_else(|| format!("{}-updated", default_data(name)));
                let v = self
                    .call(
                        Method::PATCH,
                        &format!("/api/v1/namespaces/{ns}/configmaps/{name}"),
                        Some(json!({"data": {"k": data}})),
                        Some("application/merge-patch+json"),
                    )
                    .await?;
                if let Some(rec) = recorded_rv(l) {
                    self.rvs.insert(rec, rv_of(&v));
                }
                Ok(())
            }
            ["create", "node", name, ..] => {
                let body = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"capture": "yes"}}});
                self.create("/api/v1/nodes", body, l).await
            }
            ["create", "pod", key, ..] => {
                let (ns, name) = key.split_once('/').unwrap_or(("", key));
                let node = after(l, "spec.nodeName=").filter(|n| !n.starts_with('('));
                let lbl = after(l, " labels ").map(labels).unwrap_or(json!({}));
                // The recorded fixture pods have terminationGracePeriodSeconds 0 (not in the line).
                self.create(&format!("/api/v1/namespaces/{ns}/pods"), pod(name, node, lbl, Some(0)), l).await
            }
            ["create", "widget", key, ..] => {
                let (ns, name) = key.split_once('/').unwrap_or(("", key));
                let size: u64 = after(l, "spec.size=").and_then(|s| s.parse().ok()).unwrap_or(0);
                let body = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": name, "labels": {"app": "w"}}, "spec": {"size": size}});
                self.create(&format!("/apis/example.com/v1/namespaces/{ns}/widgets"), body, l).await
            }
            ["POST", path, "(pod", name, ..] => {
                let name = name.trim_end_matches(',');
                let node = l.contains(" on n1").then_some("cap-n1");
                // Unless the line says otherwise the recorder's pods had a grace period of 0.
                let grace = after(l, "terminationGracePeriodSeconds ")
                    .and_then(|g| g.trim_end_matches(')').parse().ok())
                    .or(Some(0));
                self.create(path, pod(name, node, json!({"app": "web"}), grace), l).await
            }
            ["POST", path, "(event", name, ..] => {
                let name = name.trim_end_matches(')');
                let ns = path.split('/').nth(4).unwrap_or("");
                let body = json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": name},
                    "involvedObject": {"apiVersion": "v1", "kind": "ConfigMap", "namespace": ns, "name": "x"},
                    "reason": "Capture", "message": "recorded by capture.py", "type": "Normal",
                    "source": {"component": "capture"}});
                self.create(path, body, l).await
            }
            ["POST", path, "(widget", name, ..] => {
                let name = name.trim_end_matches(')');
                let body = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": name}, "spec": {"size": 1}});
                self.create(&path.replace("capture.example.com", "example.com"), body, l).await
            }
            ["POST", _, "(serviceaccount", ..] | ["create", "serviceaccount", ..] => Ok(()),
            ["PATCH", path, ..] => {
                // The only such line (watch-rv-old-replay): its recorded result has data k=2.
                let v = self
                    .call(
                        Method::PATCH,
                        path,
                        Some(json!({"data": {"k": "2"}})),
                        Some("application/merge-patch+json"),
                    )
                    .await?;
                if let Some(rec) = recorded_rv(l) {
                    self.rvs.insert(rec, rv_of(&v));
                }
                Ok(())
            }
            ["DELETE", path, ..] => self.call(Method::DELETE, path, None, None).await.map(|_| ()),
            ["GET", path_q, ..] if l.contains("continue token saved as") => {
                let v = self.call(Method::GET, path_q, None, None).await?;
                let var = after(l, "continue token saved as ").unwrap_or("");
                let _ = var;
                let tok = v["metadata"]["continue"].as_str().unwrap_or("").to_owned();
                // The recorded token is the only one with `"rv":<recorded list RV>` in this fixture.
                let rec_rv: u64 = after(l, "list resourceVersion ")
                    .and_then(|s| s.trim_end_matches(',').parse().ok())
                    .unwrap_or(0);
                let rec =
                    kube_watchcache::params::ContinueToken { rv: rec_rv as i64, start: "c1\u{0}".into() }
                        .encode();
                self.tokens.insert(rec, tok);
                Ok(())
            }
            ["etcdctl", "compact", ..] => {
                // The last write before the compaction was a configmap's: the proxy's configmaps
                // cache must hold it first, or its upstream watch may meet the compaction (410,
                // relist) and lose the window this fixture is about.
                let rv = self.sim.current_rv();
                for c in self.proxy_caches.iter().filter(|c| c.kind().resource == "configmaps") {
                    c.wait_for(rv, std::time::Duration::from_secs(10))
                        .await
                        .map_err(|e| format!("proxy cache did not catch up before compaction: {e}"))?;
                }
                self.sim.compact();
                Ok(())
            }
            ["create", "CustomResourceDefinition", ..] | ["vars:", ..] | ["wait", ..] => Ok(()),
            _ => Err(format!("setup line not understood: {l}")),
        }
    }
}

/// `/api/v1/namespaces/ns/configmaps/a?x` → `configmaps`; `/api/v1/namespaces/ns` → `namespaces`.
fn resource_of(path: &str) -> String {
    let path = path.split('?').next().unwrap_or(path);
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    // api/v1/... or apis/group/version/...
    let rest = match segs.first() {
        Some(&"api") => segs.get(2..).unwrap_or(&[]),
        _ => segs.get(3..).unwrap_or(&[]),
    };
    match rest {
        ["namespaces", _, res, ..] => (*res).to_owned(),
        [res, ..] => (*res).to_owned(),
        [] => String::new(),
    }
}

/// The data of configmaps whose setup line gives none: `v<digit>` for `c1`…, else `v`.
fn default_data(name: &str) -> String {
    match name.strip_prefix('c').filter(|d| d.len() == 1 && d.bytes().all(|b| b.is_ascii_digit())) {
        Some(d) => format!("v{d}"),
        None => "v".into(),
    }
}
