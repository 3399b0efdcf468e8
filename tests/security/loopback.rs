//! `--auth=none` on loopback (issue 21 item 1): the proxy forwards with its own credentials,
//! so a web page must not be able to use it. DNS rebinding (a foreign `Host`), a cross-origin
//! request (`Origin`), and exec / attach are refused with 403 before anything reaches the
//! upstream; the loopback names `kubectl proxy` accepts keep working.

use crate::common;

use common::*;
use http::Method;

/// The sim's requests on `path` (whatever the query).
fn seen(env: &Env, path: &str) -> usize {
    env.upstream_path(path)
}

#[tokio::test]
async fn a_web_page_cannot_use_the_sidecar() {
    let env = start().await;
    env.ns("kube-system");
    let secrets = "/api/v1/namespaces/kube-system/secrets";
    let url = env.proxy_url(secrets);
    // DNS rebinding: the page's own name, resolved to 127.0.0.1, with the proxy's port.
    let r = send(&env.client, Method::GET, &url, None, &[("host", "attacker.example:18080")]).await;
    assert_eq!(r.status, 403, "{:?}", r.json());
    assert!(r.json()["message"].as_str().unwrap().contains("--accept-hosts"));
    assert_eq!(seen(&env, secrets), 0, "nothing forwarded");
    // A cross-origin request from a page on a loopback name.
    let port = env.proxy.addr.port();
    let local = format!("localhost:{port}");
    let r =
        send(&env.client, Method::GET, &url, None, &[("host", &local), ("origin", "https://evil.example")])
            .await;
    assert_eq!(r.status, 403);
    assert_eq!(seen(&env, secrets), 0);
    // A cross-origin WebSocket exec: refused (path and origin), never sent upstream.
    let exec = "/api/v1/namespaces/default/pods/p/exec";
    let ws = [
        ("host", local.as_str()),
        ("origin", "https://evil.example"),
        ("connection", "Upgrade"),
        ("upgrade", "websocket"),
        ("sec-websocket-version", "13"),
        ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ("sec-websocket-protocol", "v5.channel.k8s.io"),
    ];
    let r = send(&env.client, Method::GET, &env.proxy_url(&format!("{exec}?command=id")), None, &ws).await;
    assert_eq!(r.status, 403);
    // Exec and attach are refused even from a loopback name without an Origin (kubectl proxy's
    // --reject-paths default).
    let r = send(
        &env.client,
        Method::POST,
        &env.proxy_url(&format!("{exec}?command=id")),
        None,
        &[("host", &local)],
    )
    .await;
    assert_eq!(r.status, 403);
    assert_eq!(seen(&env, exec), 0);
    // Issue 30 §4: encoded forms of the same paths (the apiserver decodes them to exec and
    // attach) are refused too, and so is any encoded `/`; nothing reaches the upstream.
    for p in [
        "/api/v1/namespaces/default/pods/p/%65xec",
        "/api/v1/namespaces/default/%70ods/p/exec",
        "/api/v1/namespaces/default/pods/p/%61ttach",
        "/%61pi/v1/namespaces/default/pods/p/exec",
        "/api/v1/namespaces/default/pods/p%2Fexec",
    ] {
        let r = send(
            &env.client,
            Method::POST,
            &env.proxy_url(&format!("{p}?command=id")),
            None,
            &[("host", &local)],
        )
        .await;
        assert_eq!(r.status, 403, "{p}");
    }
    let reached = env.sim.sim.request_count(|r| {
        let decoded = percent_encoding::percent_decode_str(&r.path).decode_utf8_lossy().into_owned();
        decoded.ends_with("/exec") || decoded.ends_with("/attach")
    });
    assert_eq!(reached, 0, "no exec or attach reached the upstream");
    // The loopback names are accepted, the upstream answers.
    for host in [format!("localhost:{port}"), format!("127.0.0.1:{port}"), format!("[::1]:{port}")] {
        let r = send(&env.client, Method::GET, &url, None, &[("host", &host)]).await;
        assert_eq!(r.status, 200, "{host}");
    }
    assert_eq!(seen(&env, secrets), 3);
}

/// What the proxy logs at warn, captured (this test's runtime runs on one thread: the proxy's
/// tasks see the subscriber set for it).
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<parking_lot::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A web page can make the sidecar refuse requests at will (a review: each refusal was a warning
/// with its whole path, 16 KiB a line): one warning per 30 s with the count held back, the path
/// cut short.
#[tokio::test]
async fn refusals_a_page_can_repeat_are_warned_once_per_period() {
    let captured = Captured::default();
    let w = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || w.clone())
        .finish();
    let _log = tracing::subscriber::set_default(subscriber);
    let env = start().await;
    let long = format!("/api/v1/namespaces/{}/secrets", "a".repeat(10_000));
    for _ in 0..50 {
        let r = send(&env.client, Method::GET, &env.proxy_url(&long), None, &[("host", "attacker.example")])
            .await;
        assert_eq!(r.status, 403);
    }
    let text = String::from_utf8_lossy(&captured.0.lock()).into_owned();
    let refusals: Vec<&str> = text.lines().filter(|l| l.contains("request refused")).collect();
    assert_eq!(refusals.len(), 1, "{text}");
    assert!(refusals[0].len() < 1_000, "the path cut short: {} bytes", refusals[0].len());
}
