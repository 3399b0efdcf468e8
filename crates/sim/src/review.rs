//! The sim's TokenReview and SubjectAccessReview endpoints: scripted users (token → user info)
//! and RBAC-like allow rules, set by tests with [`Sim::set_auth`], optionally preceded by the
//! Node authorizer (`node_authz`, `--authorization-mode=Node,RBAC` as kubeadm clusters run).
//! With no script every token is rejected and every access is denied. SubjectAccessReviews'
//! field selectors are read as a 1.34 apiserver reads them (`rawSelector` or `requirements`).
//!
//! Dispatched by `http::handle` for `POST /apis/authentication.k8s.io/v1/tokenreviews` and
//! `POST /apis/authorization.k8s.io/v1/subjectaccessreviews`; the requests are recorded like any
//! other, so tests count reviews with `Sim::request_count`.

use std::collections::{BTreeMap, HashMap};

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::{json, Value};

use super::node_authz;
use super::respond::{body_bytes, error_response, full, json as json_response, Body};
use super::Sim;
use kube_watchcache::error::Error;
use kube_watchcache::selector::{parse_terms, RawTerm};

pub const TOKEN_REVIEWS: &str = "/apis/authentication.k8s.io/v1/tokenreviews";
pub const ACCESS_REVIEWS: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews";

/// Who a token belongs to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScriptUser {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl ScriptUser {
    pub fn new(name: &str, groups: &[&str]) -> ScriptUser {
        ScriptUser {
            name: name.into(),
            uid: format!("uid-{name}"),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            extra: BTreeMap::new(),
        }
    }
}

/// Who a rule applies to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Subject {
    User(String),
    Group(String),
}

/// One allow rule. `*` matches anything in `verbs`, `groups`, `resources` and `names`; an empty
/// `names` matches every name. `resources` entries may be `resource/subresource`.
/// `namespace: None` applies everywhere (cluster scope included), `Some(ns)` only inside `ns`.
/// `paths` are non-resource URLs (`/metrics`); a rule with paths matches only those.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub subject: Subject,
    pub verbs: Vec<String>,
    pub groups: Vec<String>,
    pub resources: Vec<String>,
    pub names: Vec<String>,
    pub namespace: Option<String>,
    pub paths: Vec<String>,
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

impl Rule {
    /// `verbs` on `resources` of API group `group`, cluster-wide, for a user.
    pub fn user(user: &str, verbs: &[&str], group: &str, resources: &[&str]) -> Rule {
        Rule {
            subject: Subject::User(user.into()),
            verbs: strings(verbs),
            groups: vec![group.into()],
            resources: strings(resources),
            names: Vec::new(),
            namespace: None,
            paths: Vec::new(),
        }
    }

    /// Like [`Rule::user`] for every member of a group.
    pub fn group(group_subject: &str, verbs: &[&str], group: &str, resources: &[&str]) -> Rule {
        Rule { subject: Subject::Group(group_subject.into()), ..Rule::user("", verbs, group, resources) }
    }

    /// Non-resource URLs (`/metrics`) for a user.
    pub fn paths(user: &str, verbs: &[&str], paths: &[&str]) -> Rule {
        Rule {
            paths: strings(paths),
            groups: Vec::new(),
            resources: Vec::new(),
            ..Rule::user(user, verbs, "", &[])
        }
    }

    /// Only inside one namespace.
    pub fn in_namespace(mut self, ns: &str) -> Rule {
        self.namespace = Some(ns.into());
        self
    }

    /// Only these object names.
    pub fn named(mut self, names: &[&str]) -> Rule {
        self.names = strings(names);
        self
    }

    fn applies_to(&self, user: &str, groups: &[String]) -> bool {
        match &self.subject {
            Subject::User(u) => u == user,
            Subject::Group(g) => groups.iter().any(|x| x == g),
        }
    }

    fn allows(&self, spec: &Value) -> bool {
        let any = |list: &[String], v: &str| list.iter().any(|x| x == "*" || x == v);
        if let Some(ra) = spec.get("resourceAttributes") {
            let s = |k: &str| ra.get(k).and_then(Value::as_str).unwrap_or("");
            let resource = match s("subresource") {
                "" => s("resource").to_owned(),
                sub => format!("{}/{sub}", s("resource")),
            };
            let ns_ok = match &self.namespace {
                None => true,
                Some(ns) => ns == s("namespace"),
            };
            self.paths.is_empty()
                && ns_ok
                && any(&self.verbs, s("verb"))
                && any(&self.groups, s("group"))
                && any(&self.resources, &resource)
                && (self.names.is_empty() || any(&self.names, s("name")))
        } else if let Some(nra) = spec.get("nonResourceAttributes") {
            let s = |k: &str| nra.get(k).and_then(Value::as_str).unwrap_or("");
            // RBAC's NonResourceURLMatches: `*`, exact, or a trailing `*` as a prefix.
            let path = s("path");
            let url = |rule: &String| {
                rule == "*" || rule == path || rule.strip_suffix('*').is_some_and(|p| path.starts_with(p))
            };
            any(&self.verbs, s("verb")) && self.paths.iter().any(url)
        } else {
            false
        }
    }
}

/// The scripted users and rules.
#[derive(Clone, Debug, Default)]
pub struct AuthScript {
    /// Bearer token → user.
    pub tokens: HashMap<String, ScriptUser>,
    pub rules: Vec<Rule>,
    /// The Node authorizer decides first (`--authorization-mode=Node,RBAC`).
    pub node_authorizer: bool,
    /// How long each review takes to be answered (a loaded apiserver; tests that need a review
    /// still in flight).
    pub delay: std::time::Duration,
}

impl AuthScript {
    pub fn token(mut self, token: &str, user: ScriptUser) -> AuthScript {
        self.tokens.insert(token.into(), user);
        self
    }

    pub fn rule(mut self, rule: Rule) -> AuthScript {
        self.rules.push(rule);
        self
    }

    /// Answer each review after `delay`.
    pub fn delayed(mut self, delay: std::time::Duration) -> AuthScript {
        self.delay = delay;
        self
    }

    /// Authorize like `--authorization-mode=Node,RBAC`: the Node authorizer first.
    pub fn with_node_authorizer(mut self) -> AuthScript {
        self.node_authorizer = true;
        self
    }

    /// One bearer token for user `admin` in group `system:masters`, which may do everything
    /// (every verb on every resource and non-resource URL), like kube-apiserver's
    /// `cluster-admin` binding. What `sim --admin-token-file` and `bench --tls` install.
    pub fn admin(token: &str) -> AuthScript {
        const MASTERS: &str = "system:masters";
        AuthScript::default()
            .with_node_authorizer()
            .token(token, ScriptUser::new("admin", &[MASTERS]))
            .rule(Rule::group(MASTERS, &["*"], "*", &["*"]))
            .rule(Rule { subject: Subject::Group(MASTERS.into()), ..Rule::paths("", &["*"], &["*"]) })
    }
}

impl Sim {
    /// Replaces the scripted users and rules the review endpoints answer from.
    pub fn set_auth(&self, script: AuthScript) {
        *self.inner.auth.lock() = script;
    }
}

/// Whether this request is one of the review endpoints.
pub fn is_review(method: &Method, path: &str) -> bool {
    method == Method::POST && (path == TOKEN_REVIEWS || path == ACCESS_REVIEWS)
}

/// Answers a TokenReview or SubjectAccessReview.
pub async fn handle(sim: Sim, req: Request<Incoming>) -> Response<Body> {
    let token_review = req.uri().path() == TOKEN_REVIEWS;
    let body = match body_bytes(req).await {
        Ok(b) => b,
        Err(e) => return error_response(e),
    };
    let Ok(v) = serde_json::from_slice::<Value>(&body) else {
        return error_response(Error::BadRequest("the review body is not JSON".into()));
    };
    let script = sim.inner.auth.lock().clone();
    if !script.delay.is_zero() {
        tokio::time::sleep(script.delay).await;
    }
    let spec = v.get("spec").cloned().unwrap_or(Value::Null);
    let out = if token_review {
        token_review_answer(&script, &spec)
    } else {
        match access_review_answer(&sim, &script, &spec) {
            Ok(v) => v,
            Err(e) => return error_response(e),
        }
    };
    json_response(StatusCode::CREATED, full(out.to_string()))
}

fn token_review_answer(script: &AuthScript, spec: &Value) -> Value {
    let token = spec.get("token").and_then(Value::as_str).unwrap_or("");
    let status = match script.tokens.get(token) {
        Some(u) => {
            let mut groups = u.groups.clone();
            if !groups.iter().any(|g| g == "system:authenticated") {
                groups.push("system:authenticated".into());
            }
            json!({"authenticated": true, "user": {"username": u.name, "uid": u.uid, "groups": groups, "extra": u.extra}})
        }
        None => json!({"user": {}, "error": "[invalid bearer token, token lookup failed]"}),
    };
    json!({"kind":"TokenReview","apiVersion":"authentication.k8s.io/v1","metadata":{"creationTimestamp":null},
           "spec":{"token":"<redacted>"},"status": status})
}

/// `spec.resourceAttributes.fieldSelector` as the SAR handler reads it
/// (pkg/registry/authorization/util/helpers.go `ResourceAttributesFrom`, 1.31+): `rawSelector`
/// parsed like a query's, or `requirements` (`In` / `NotIn` with exactly one value: `=` /
/// `!=`). `Ok(Err(why))`: it does not parse and is ignored (the decision is made without it);
/// `Err`: both forms at once, an invalid review.
fn field_selector(ra: &Value) -> Result<Result<Vec<RawTerm>, String>, Error> {
    let Some(fs) = ra.get("fieldSelector").filter(|v| !v.is_null()) else { return Ok(Ok(Vec::new())) };
    let raw = fs.get("rawSelector").and_then(Value::as_str).unwrap_or("");
    let reqs = fs.get("requirements").and_then(Value::as_array).cloned().unwrap_or_default();
    if !raw.is_empty() && !reqs.is_empty() {
        return Err(Error::BadRequest(
            "spec.resourceAttributes.fieldSelector.rawSelector: Invalid value: may not specified at the same time as requirements".into(),
        ));
    }
    if !raw.is_empty() {
        return Ok(parse_terms(raw).map_err(|e| e.to_string()));
    }
    let mut out = Vec::new();
    for r in &reqs {
        let key = r.get("key").and_then(Value::as_str).unwrap_or("");
        let values: Vec<&str> = r
            .get("values")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let op = r.get("operator").and_then(Value::as_str).unwrap_or("");
        if values.len() > 1 {
            return Ok(Err("fieldSelectors do not yet support multiple values".into()));
        }
        let equals = match op {
            "In" => true,
            "NotIn" => false,
            "Exists" | "DoesNotExist" => return Ok(Err(format!("fieldSelectors do not yet support {op}"))),
            other => return Ok(Err(format!("{other:?} is not a valid field selector operator"))),
        };
        let Some(value) = values.first() else {
            return Ok(Err(format!("fieldSelectors {} must have one value", op.to_lowercase())));
        };
        out.push(RawTerm { field: key.to_owned(), equals, value: (*value).to_owned() });
    }
    Ok(Ok(out))
}

fn access_review_answer(sim: &Sim, script: &AuthScript, spec: &Value) -> Result<Value, Error> {
    let user = spec.get("user").and_then(Value::as_str).unwrap_or("");
    let groups: Vec<String> = spec
        .get("groups")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|g| g.as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    let mut evaluation_error = None;
    let mut reasons = Vec::new();
    let mut allowed = false;
    if script.node_authorizer {
        let ra = spec.get("resourceAttributes").cloned().unwrap_or(Value::Null);
        let fields = match field_selector(&ra)? {
            Ok(f) => f,
            Err(_) => {
                evaluation_error = Some("spec.resourceAttributes.fieldSelector ignored due to parse error");
                Vec::new()
            }
        };
        let s = |k: &str| ra.get(k).and_then(Value::as_str).unwrap_or("");
        let req = node_authz::Request {
            user,
            groups: &groups,
            verb: s("verb"),
            group: s("group"),
            resource: s("resource"),
            subresource: s("subresource"),
            namespace: s("namespace"),
            name: s("name"),
            fields: &fields,
            non_resource: spec.get("resourceAttributes").is_none(),
        };
        match node_authz::authorize(sim, &req) {
            node_authz::Decision::Allow => allowed = true,
            node_authz::Decision::NoOpinion(why) if !why.is_empty() => reasons.push(why),
            node_authz::Decision::NoOpinion(_) => {}
        }
    }
    if !allowed && script.rules.iter().any(|r| r.applies_to(user, &groups) && r.allows(spec)) {
        allowed = true;
        reasons = vec!["allowed by the sim's script".into()];
    }
    // The union authorizer joins the reasons of those with no opinion.
    let mut status = json!({"allowed": allowed});
    if !reasons.is_empty() {
        status["reason"] = reasons.join("\n").into();
    }
    if let Some(e) = evaluation_error {
        status["evaluationError"] = e.into();
    }
    Ok(
        json!({"kind":"SubjectAccessReview","apiVersion":"authorization.k8s.io/v1","metadata":{"creationTimestamp":null},
           "spec": spec, "status": status}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_match_like_rbac() {
        let script = AuthScript::default()
            .rule(Rule::user("dev", &["get", "list"], "", &["configmaps"]).in_namespace("ns"))
            .rule(Rule::group("ops", &["*"], "*", &["*"]));
        let spec = |user: &str, groups: &[&str], verb: &str, ns: &str| {
            json!({"user": user, "groups": groups,
                   "resourceAttributes": {"verb": verb, "group": "", "resource": "configmaps", "namespace": ns}})
        };
        let sim = Sim::new(crate::SimOptions::default());
        let allowed =
            |s: Value| access_review_answer(&sim, &script, &s).unwrap()["status"]["allowed"] == true;
        assert!(allowed(spec("dev", &[], "list", "ns")));
        assert!(!allowed(spec("dev", &[], "list", "")), "cluster-wide is not inside ns");
        assert!(!allowed(spec("dev", &[], "watch", "ns")));
        assert!(!allowed(spec("eve", &[], "list", "ns")));
        assert!(allowed(spec("eve", &["ops"], "watch", "")));
    }

    #[test]
    fn tokens_map_to_users() {
        let script = AuthScript::default().token("t1", ScriptUser::new("alice", &["devs"]));
        let ok = token_review_answer(&script, &json!({"token": "t1"}));
        assert_eq!(ok["status"]["authenticated"], true);
        assert_eq!(ok["status"]["user"]["groups"], json!(["devs", "system:authenticated"]));
        let bad = token_review_answer(&script, &json!({"token": "nope"}));
        assert!(bad["status"].get("authenticated").is_none());
    }

    #[test]
    fn the_admin_token_may_do_everything_and_nothing_else_is_accepted() {
        let script = AuthScript::admin("s3cret");
        let user = token_review_answer(&script, &json!({"token": "s3cret"}))["status"]["user"].clone();
        assert_eq!(user["groups"], json!(["system:masters", "system:authenticated"]));
        let sim = Sim::new(crate::SimOptions::default());
        let allowed =
            |s: Value| access_review_answer(&sim, &script, &s).unwrap()["status"]["allowed"] == true;
        let who = json!({"user": "admin", "groups": ["system:masters", "system:authenticated"]});
        let mut list = who.clone();
        list["resourceAttributes"] = json!({"verb": "watch", "group": "", "resource": "pods"});
        assert!(allowed(list.clone()));
        let mut metrics = who.clone();
        metrics["nonResourceAttributes"] = json!({"verb": "get", "path": "/metrics"});
        assert!(allowed(metrics));
        list["groups"] = json!(["system:authenticated"]);
        assert!(!allowed(list), "only the group is allowed");
        assert!(token_review_answer(&script, &json!({"token": "other"}))["status"]["authenticated"].is_null());
    }

    /// SubjectAccessReviews with field selectors, read as the 1.34 SAR handler reads them, and
    /// the Node authorizer deciding from them.
    #[test]
    fn field_selectors_of_reviews_and_the_node_authorizer() {
        let sim = Sim::new(crate::SimOptions { objects: 0, ..Default::default() });
        let script = AuthScript::default().with_node_authorizer();
        let review = |fs: Value| {
            json!({"user": "system:node:n1", "groups": ["system:nodes", "system:authenticated"],
                   "resourceAttributes": {"verb": "list", "group": "", "resource": "pods", "fieldSelector": fs}})
        };
        let answer = |fs: Value| access_review_answer(&sim, &script, &review(fs));
        let ok =
            answer(json!({"requirements": [{"key": "spec.nodeName", "operator": "In", "values": ["n1"]}]}))
                .unwrap();
        assert_eq!(ok["status"]["allowed"], true);
        assert_eq!(answer(json!({"rawSelector": "spec.nodeName=n1"})).unwrap()["status"]["allowed"], true);
        let other = answer(json!({"rawSelector": "spec.nodeName=n2"})).unwrap();
        assert_eq!(
            other["status"],
            json!({"allowed": false, "reason": "can only list/watch pods with spec.nodeName field selector"})
        );
        // Does not parse: ignored, said so, decided without it.
        for bad in [
            json!({"rawSelector": "spec.nodeName"}),
            json!({"requirements": [{"key": "spec.nodeName", "operator": "In", "values": ["n1", "n2"]}]}),
            json!({"requirements": [{"key": "spec.nodeName", "operator": "Exists"}]}),
        ] {
            let a = answer(bad.clone()).unwrap();
            assert_eq!(a["status"]["allowed"], false, "{bad}");
            assert_eq!(
                a["status"]["evaluationError"],
                "spec.resourceAttributes.fieldSelector ignored due to parse error",
                "{bad}"
            );
        }
        // Both forms: an invalid review.
        let both =
            json!({"rawSelector": "a=b", "requirements": [{"key": "a", "operator": "In", "values": ["b"]}]});
        assert!(answer(both).is_err());
        // Without the Node authorizer, a node is just a user with no rules.
        let plain = access_review_answer(
            &sim,
            &AuthScript::default(),
            &review(json!({"rawSelector": "spec.nodeName=n1"})),
        );
        assert_eq!(plain.unwrap()["status"]["allowed"], false);
    }
}
