//! The sim's TokenReview and SubjectAccessReview endpoints: scripted users (token → user info)
//! and RBAC-like allow rules, set by tests with [`Sim::set_auth`]. With no script every token is
//! rejected and every access is denied.
//!
//! Dispatched by `http::handle` for `POST /apis/authentication.k8s.io/v1/tokenreviews` and
//! `POST /apis/authorization.k8s.io/v1/subjectaccessreviews`; the requests are recorded like any
//! other, so tests count reviews with `Sim::request_count`.

use std::collections::{BTreeMap, HashMap};

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::{json, Value};

use super::http::{body_bytes, error_response, full, json as json_response, Body};
use super::Sim;
use crate::error::Error;

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

    /// One bearer token for user `admin` in group `system:masters`, which may do everything
    /// (every verb on every resource and non-resource URL), like kube-apiserver's
    /// `cluster-admin` binding. What `sim --admin-token-file` and `bench --tls` install.
    pub fn admin(token: &str) -> AuthScript {
        const MASTERS: &str = "system:masters";
        AuthScript::default()
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
    let spec = v.get("spec").cloned().unwrap_or(Value::Null);
    let out =
        if token_review { token_review_answer(&script, &spec) } else { access_review_answer(&script, &spec) };
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

fn access_review_answer(script: &AuthScript, spec: &Value) -> Value {
    let user = spec.get("user").and_then(Value::as_str).unwrap_or("");
    let groups: Vec<String> = spec
        .get("groups")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|g| g.as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    let allowed = script.rules.iter().any(|r| r.applies_to(user, &groups) && r.allows(spec));
    let status = if allowed {
        json!({"allowed": true, "reason": "allowed by the sim's script"})
    } else {
        json!({"allowed": false})
    };
    json!({"kind":"SubjectAccessReview","apiVersion":"authorization.k8s.io/v1","metadata":{"creationTimestamp":null},
           "spec": spec, "status": status})
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
        let allowed = |s: Value| access_review_answer(&script, &s)["status"]["allowed"] == true;
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
        let allowed = |s: Value| access_review_answer(&script, &s)["status"]["allowed"] == true;
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
}
