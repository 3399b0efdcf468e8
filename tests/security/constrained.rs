//! Constrained impersonation end to end (1.36's `ConstrainedImpersonation`, on by default from
//! that version, as the sim reports itself): a caller allowed only `impersonate:<mode>` on what
//! it wants and `impersonate-on:<mode>:<verb>` on what it does is served from the cache as the
//! impersonated user, and only for those verbs; refusals and impersonation without a user carry
//! the apiserver's texts; with the gate off, only legacy `impersonate` counts.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{send, serve_args, Resp};
use http::{Method, StatusCode};
use kube_watchcache::app::{self, Running};
use kube_watchcache_sim::{AuthScript, Rule, ScriptUser, Sim, SimHandle, SimOptions};
use serde_json::json;

const AUTHN: &str = "authentication.k8s.io";
const LIST: &str = "/api/v1/namespaces/ns-a/configmaps?resourceVersion=0";
const GET: &str = "/api/v1/namespaces/ns-a/configmaps/cm1?resourceVersion=0";

/// carol: may impersonate users with `user-info` and only to list configmaps; agent (a pod's
/// service account on node n1): may impersonate its own node, to list configmaps; bob and the
/// nodes may read configmaps; legacy-admin: legacy `impersonate` on users.
fn script() -> AuthScript {
    let mut agent = ScriptUser::new("system:serviceaccount:kube-system:agent", &["system:serviceaccounts"]);
    agent.extra = BTreeMap::from([("authentication.kubernetes.io/node-name".into(), vec!["n1".into()])]);
    AuthScript::default()
        .token("carol-token", ScriptUser::new("carol", &[]))
        .token("agent-token", agent)
        .token("legacy-token", ScriptUser::new("legacy-admin", &[]))
        .rule(Rule::user("carol", &["impersonate:user-info"], AUTHN, &["users"]))
        .rule(Rule::user("carol", &["impersonate-on:user-info:list"], "", &["configmaps"]))
        .rule(Rule::user(
            "system:serviceaccount:kube-system:agent",
            &["impersonate:associated-node"],
            AUTHN,
            &["nodes"],
        ))
        .rule(Rule::user(
            "system:serviceaccount:kube-system:agent",
            &["impersonate-on:associated-node:list"],
            "",
            &["configmaps"],
        ))
        .rule(Rule::user("legacy-admin", &["impersonate"], "", &["users"]))
        .rule(Rule::user("bob", &["get", "list"], "", &["configmaps"]))
        .rule(Rule::group("system:nodes", &["list"], "", &["configmaps"]))
}

struct Env {
    _sim: SimHandle,
    proxy: Running,
    client: common::HttpClient,
}

async fn start(gate: Option<bool>) -> Env {
    let sim = Sim::start(SimOptions::default()).await.expect("sim starts");
    sim.sim.set_auth(script());
    let ns = json!({"apiVersion":"v1","kind":"Namespace","metadata":{"name":"ns-a"}});
    sim.sim.create("namespaces", "", ns).expect("create");
    sim.sim
        .create("configmaps", "ns-a", json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cm1"}}))
        .expect("create");
    let mut args = serve_args(sim.addr, &["configmaps"]);
    args.security.auth = "upstream".into();
    args.security.feature_gates.constrained_impersonation = gate;
    let proxy = app::start(&args).await.expect("proxy starts");
    assert!(proxy.wait_ready(Duration::from_secs(10)).await);
    Env { _sim: sim, proxy, client: common::client() }
}

impl Env {
    async fn get(&self, token: &str, path: &str, imp: &[(&str, &str)]) -> Resp {
        let auth = format!("Bearer {token}");
        let mut headers = imp.to_vec();
        headers.push(("authorization", &auth));
        send(&self.client, Method::GET, &format!("http://{}{path}", self.proxy.addr), None, &headers).await
    }
}

fn message(r: &Resp) -> String {
    r.json()["message"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn constrained_modes_allow_what_their_verbs_name_and_no_more() {
    // Unset: on, as the sim reports Kubernetes 1.36.
    let env = start(None).await;
    let as_bob = [("impersonate-user", "bob")];
    let r = env.get("carol-token", LIST, &as_bob).await;
    assert_eq!(r.status, StatusCode::OK, "{}", message(&r));
    assert_eq!(r.json()["items"][0]["metadata"]["name"], "cm1");
    // bob may get, but carol may impersonate only to list: the user-info mode's refusal.
    let r = env.get("carol-token", GET, &as_bob).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(
        message(&r),
        r#"configmaps "cm1" is forbidden: User "carol" cannot impersonate-on:user-info:get resource "configmaps" in API group "" in the namespace "ns-a""#
    );
    // A pod's service account as its own node (associated-node), not as another node.
    let r = env.get("agent-token", LIST, &[("impersonate-user", "system:node:n1")]).await;
    assert_eq!(r.status, StatusCode::OK, "{}", message(&r));
    let r = env.get("agent-token", LIST, &[("impersonate-user", "system:node:n2")]).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(message(&r).contains("cannot impersonate-on:arbitrary-node:list"), "{}", message(&r));
    // system:masters is never impersonated by a constrained mode.
    let r = env
        .get("carol-token", LIST, &[("impersonate-user", "bob"), ("impersonate-group", "system:masters")])
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(
        message(&r).ends_with("impersonating the system:masters group is not allowed"),
        "{}",
        message(&r)
    );
    // Legacy impersonation still counts.
    let r = env.get("legacy-token", GET, &as_bob).await;
    assert_eq!(r.status, StatusCode::OK, "{}", message(&r));
    // Without a user: 400 and constrained impersonation's text.
    let r = env.get("carol-token", LIST, &[("impersonate-group", "g1")]).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        message(&r),
        r#"requested &user.DefaultInfo{Name:"", UID:"", Groups:[]string{"g1"}, Extra:map[string][]string(nil)} without impersonating a user name"#
    );
}

#[tokio::test]
async fn with_the_gate_off_only_legacy_impersonation_counts() {
    let env = start(Some(false)).await;
    let r = env.get("carol-token", LIST, &[("impersonate-user", "bob")]).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(
        message(&r),
        r#"users "bob" is forbidden: User "carol" cannot impersonate resource "users" in API group "" at the cluster scope"#
    );
    let r = env.get("agent-token", LIST, &[("impersonate-user", "system:node:n1")]).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let r = env.get("legacy-token", GET, &[("impersonate-user", "bob")]).await;
    assert_eq!(r.status, StatusCode::OK, "{}", message(&r));
    let r = env.get("carol-token", LIST, &[("impersonate-group", "g1"), ("impersonate-uid", "u1")]).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        message(&r),
        "requested [{Group  g1    } {UID  u1  authentication.k8s.io/v1  }] without impersonating a user"
    );
}
