//! Exec credential plugins end to end at the configuration level: a small shell plugin in a
//! temp dir, run by `resolve` as `serve --kubeconfig` and `bench --kubeconfig` run it.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use base64::Engine;
use serde_json::Value;

use super::auth::Credentials;
use super::config::{resolve_with, Env, UpstreamOptions};
use super::testutil::{TempDir, CA_PEM, CLIENT_KEY, CLIENT_PEM};

/// Counts its runs in `count`, keeps `KUBERNETES_EXEC_INFO` in `info`, answers `tok-<n>` valid
/// for `$LIFETIME` seconds (and the client certificate in `cert`/`key` when present).
const PLUGIN: &str = r#"#!/bin/sh
dir=$(dirname "$0")
n=$(( $(cat "$dir/count" 2>/dev/null || echo 0) + 1 ))
echo "$n" > "$dir/count"
printf '%s' "$KUBERNETES_EXEC_INFO" > "$dir/info"
if [ -n "$FAIL" ]; then echo "starting login" >&2; echo "error: $FAIL" >&2; exit 1; fi
exp=$(date -u -d "@$(( $(date +%s) + ${LIFETIME:-3600} ))" +%Y-%m-%dT%H:%M:%SZ)
cert=""
if [ -f "$dir/cert" ]; then
  cert=$(printf ',"clientCertificateData":"%s","clientKeyData":"%s"' "$(awk 1 ORS='\\n' "$dir/cert")" "$(awk 1 ORS='\\n' "$dir/key")")
fi
printf '{"apiVersion":"%s","kind":"ExecCredential","status":{"token":"tok-%s","expirationTimestamp":"%s"%s}}' \
  "${ANSWER_VERSION:-client.authentication.k8s.io/v1}" "$n" "$exp" "$cert"
"#;

fn plugin(dir: &TempDir) -> String {
    let p = dir.write("plugin.sh", PLUGIN);
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p.display().to_string()
}

/// A kubeconfig whose user runs `command` with `extra` lines under `exec:` and `env` pairs.
fn kubeconfig(dir: &TempDir, command: &str, extra: &str, env: &[(&str, &str)]) -> UpstreamOptions {
    let env: String =
        env.iter().map(|(k, v)| format!("\n      - name: {k}\n        value: \"{v}\"")).collect();
    let ca = base64::engine::general_purpose::STANDARD.encode(CA_PEM);
    let yaml = format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: x\nclusters:\n- name: c\n  cluster:\n    \
         server: https://127.0.0.1:6443\n    certificate-authority-data: {ca}\n    tls-server-name: api.test\n\
         contexts:\n- name: x\n  context: {{cluster: c, user: u}}\nusers:\n- name: u\n  user:\n    exec:\n      \
         apiVersion: client.authentication.k8s.io/v1\n      command: {command}\n{extra}      env:{env}\n",
    );
    let path = dir.write("config", &yaml);
    UpstreamOptions { kubeconfig: Some(path), ..Default::default() }
}

fn env() -> Env {
    Env { kubeconfig_var: None, home: None, in_cluster: false, ssl_cert_file: None }
}

fn runs(dir: &TempDir) -> u64 {
    std::fs::read_to_string(dir.path().join("count")).unwrap().trim().parse().unwrap()
}

#[test]
fn the_plugin_is_run_once_with_exec_info_and_its_token_is_the_bearer() {
    let dir = TempDir::new();
    let cmd = plugin(&dir);
    let opts = kubeconfig(&dir, &cmd, "      interactiveMode: Never\n      provideClusterInfo: true\n", &[]);
    let r = resolve_with(&opts, &env()).unwrap();
    assert!(matches!(r.auth, Credentials::Exec(_)));
    assert_eq!(r.auth.header().unwrap(), "Bearer tok-1");
    assert!(r.auth.header().unwrap().is_sensitive());
    assert!(!r.auth.describe().contains("tok-1"), "{}", r.auth.describe());
    assert_eq!(runs(&dir), 1);

    let info: Value = serde_json::from_slice(&std::fs::read(dir.path().join("info")).unwrap()).unwrap();
    assert_eq!(info["apiVersion"], "client.authentication.k8s.io/v1");
    assert_eq!(info["kind"], "ExecCredential");
    assert_eq!(info["spec"]["interactive"], false);
    let cluster = &info["spec"]["cluster"];
    assert_eq!(cluster["server"], "https://127.0.0.1:6443");
    assert_eq!(cluster["tlsServerName"], "api.test");
    let ca = base64::engine::general_purpose::STANDARD
        .decode(cluster["certificateAuthorityData"].as_str().unwrap())
        .unwrap();
    assert_eq!(
        super::identity::parse_certs(&ca).unwrap(),
        super::identity::parse_certs(CA_PEM.as_bytes()).unwrap(),
        "the cluster's CA, as client-go passes it"
    );

    // Without provideClusterInfo the plugin gets no cluster.
    let opts = kubeconfig(&dir, &cmd, "", &[]);
    resolve_with(&opts, &env()).unwrap();
    let info: Value = serde_json::from_slice(&std::fs::read(dir.path().join("info")).unwrap()).unwrap();
    assert!(info["spec"].get("cluster").is_none(), "{info}");
}

#[test]
fn a_client_certificate_from_the_plugin_is_the_proxys_identity() {
    let dir = TempDir::new();
    let cmd = plugin(&dir);
    dir.write("cert", CLIENT_PEM);
    dir.write("key", CLIENT_KEY);
    let r = resolve_with(&kubeconfig(&dir, &cmd, "", &[]), &env()).unwrap();
    let id = r.tls.identity.as_ref().expect("the plugin's certificate");
    assert_eq!(id.current().cert, super::identity::parse_certs(CLIENT_PEM.as_bytes()).unwrap());
    assert_eq!(r.auth.header().unwrap(), "Bearer tok-1", "and its token");
}

#[test]
fn a_plugin_that_fails_stops_the_start_with_its_stderr() {
    let dir = TempDir::new();
    let cmd = plugin(&dir);
    let e = resolve_with(&kubeconfig(&dir, &cmd, "", &[("FAIL", "login required")]), &env())
        .err()
        .unwrap()
        .to_string();
    assert!(e.starts_with("user \"u\": exec plugin "), "{e}");
    assert!(e.ends_with("stderr: starting login | error: login required"), "{e}");
    assert!(!e.contains('\n'));

    let e = resolve_with(
        &kubeconfig(&dir, "/no/such/plugin", "      installHint: install it with brew\n", &[]),
        &env(),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("/no/such/plugin") && e.ends_with("(install it with brew)"), "{e}");

    let e = resolve_with(&kubeconfig(&dir, &cmd, "      interactiveMode: Always\n", &[]), &env())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("interactiveMode Always"), "{e}");

    let e = resolve_with(
        &kubeconfig(&dir, &cmd, "", &[("ANSWER_VERSION", "client.authentication.k8s.io/v1beta1")]),
        &env(),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("expected ExecCredential, client.authentication.k8s.io/v1"), "{e}");
}

/// A plugin's output or a kubeconfig that does not parse is reported by where, never with the
/// parser's text (it quotes values and shows the lines around: the token beside the mistake).
#[test]
fn a_parse_error_never_shows_the_credentials_beside_it() {
    let dir = TempDir::new();
    let bad = dir.write(
        "bad.sh",
        "#!/bin/sh\nprintf '%s' '{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":{\"token\":\"SEKRIT-tok\",\"expirationTimestamp\":[\"x\"]}}'\n",
    );
    std::fs::set_permissions(&bad, std::fs::Permissions::from_mode(0o755)).unwrap();
    let e = resolve_with(&kubeconfig(&dir, &bad.display().to_string(), "", &[]), &env())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("output is not an ExecCredential at line 1"), "{e}");
    assert!(!e.contains("SEKRIT"), "{e}");

    let yaml =
        "apiVersion: v1\nkind: Config\nusers:\n- name: u\n  user:\n    token: SEKRIT-tok\n    username: [\n";
    let path = dir.write("broken", yaml);
    let e = resolve_with(&UpstreamOptions { kubeconfig: Some(path), ..Default::default() }, &env())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("not valid YAML at line"), "{e}");
    assert!(!e.contains("SEKRIT"), "{e}");
}

/// `expirationTimestamp` is honoured: the plugin is not run again while its token is fresh,
/// and is run again before the token expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_is_renewed_before_it_expires_and_not_before_it_is_due() {
    let dir = TempDir::new();
    let cmd = plugin(&dir);
    let r = resolve_with(&kubeconfig(&dir, &cmd, "", &[("LIFETIME", "3")]), &env()).unwrap();
    let Credentials::Exec(exec) = &r.auth else { panic!("exec credentials") };
    for _ in 0..100 {
        assert_eq!(r.auth.header().unwrap(), "Bearer tok-1", "fresh: no second run");
    }
    assert_eq!(exec.runs(), 1);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while r.auth.header().unwrap() == "Bearer tok-1" {
        assert!(tokio::time::Instant::now() < deadline, "never renewed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(r.auth.header().unwrap(), "Bearer tok-2");
    assert_eq!(exec.runs(), 2);
    assert_eq!(runs(&dir), 2);

    // A long-lived one is left alone.
    let long = TempDir::new();
    let cmd = plugin(&long);
    let r = resolve_with(&kubeconfig(&long, &cmd, "", &[]), &env()).unwrap();
    let Credentials::Exec(exec) = &r.auth else { panic!("exec credentials") };
    assert_eq!(r.auth.header().unwrap(), "Bearer tok-1");
    tokio::task::yield_now().await;
    assert_eq!(exec.runs(), 1);
}

/// A token the upstream refuses (401) is renewed at once, whatever its expiry said (client-go's
/// `maybeRefreshCreds`: one revoked, or without an expiry, was otherwise sent for good); a 401
/// to a request sent with an older token renews nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_token_is_renewed() {
    let dir = TempDir::new();
    let cmd = plugin(&dir);
    let r = resolve_with(&kubeconfig(&dir, &cmd, "", &[]), &env()).unwrap();
    let Credentials::Exec(exec) = &r.auth else { panic!("exec credentials") };
    let first = r.auth.header().unwrap();
    assert_eq!(first, "Bearer tok-1");
    r.auth.unauthorized(Some(&http::HeaderValue::from_static("Bearer tok-0")));
    tokio::task::yield_now().await;
    assert_eq!(exec.runs(), 1, "an older token's refusal");
    // (the renewal task waiting: each refusal below finds it where a real one would)
    tokio::time::sleep(Duration::from_millis(300)).await;
    r.auth.unauthorized(Some(&first));
    // A second refusal of the same token before the renewal lands renews nothing more.
    tokio::time::sleep(Duration::from_millis(300)).await;
    r.auth.unauthorized(Some(&first));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while r.auth.header().unwrap() == "Bearer tok-1" {
        assert!(tokio::time::Instant::now() < deadline, "never renewed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(r.auth.header().unwrap(), "Bearer tok-2");
    // And a refusal of the token renewed away neither (the plugin would run 5 s after the last).
    r.auth.unauthorized(Some(&first));
    tokio::time::sleep(super::auth::EXEC_RETRY + Duration::from_secs(1)).await;
    assert_eq!((runs(&dir), exec.runs()), (2, 2));
}

/// The proxy's own request answered 401 renews the token it carried (the wiring in
/// `send_own`): an upstream that refuses everything sees the next request with a new token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_own_request_answered_401_renews_the_token() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = std::sync::Arc::new(parking_lot::Mutex::new(Vec::<String>::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = listener.accept().await {
            let mut head = Vec::new();
            let mut buf = [0u8; 4096];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match c.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let head = String::from_utf8_lossy(&head).to_string();
            let auth = head.lines().find_map(|l| l.strip_prefix("authorization: ")).unwrap_or("").to_owned();
            log.lock().push(auth);
            let _ = c
                .write_all(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                .await;
        }
    });
    let dir = TempDir::new();
    let cmd = plugin(&dir);
    let opts = kubeconfig(&dir, &cmd, "", &[]);
    let path = opts.kubeconfig.clone().unwrap();
    let yaml =
        std::fs::read_to_string(&path).unwrap().replace("https://127.0.0.1:6443", &format!("http://{addr}"));
    std::fs::write(&path, yaml).unwrap();
    let inner = super::client::Inner::build(resolve_with(&opts, &env()).unwrap(), 0).unwrap();
    assert!(inner.request_bytes(http::Method::GET, "/version", None).await.is_err());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    // (the plugin counts its run as it starts; its token is taken once it has answered)
    while inner.own_authorization().is_none_or(|h| h != "Bearer tok-2") {
        assert!(tokio::time::Instant::now() < deadline, "never renewed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = inner.request_bytes(http::Method::GET, "/version", None).await;
    assert_eq!(*seen.lock(), ["Bearer tok-1", "Bearer tok-2"]);
}

/// A credential's `Debug` says what it holds, never the values (a `?` in a log line one day).
#[test]
fn credentials_debug_without_their_values() {
    let c = super::exec::Credential {
        token: Some("S3CRET-token".into()),
        identity: Some((b"CERT".to_vec(), b"PRIVATE-KEY-S3CRET".to_vec())),
        expiry: None,
    };
    let shown = format!("{c:?}");
    assert!(!shown.contains("S3CRET") && shown.contains("<redacted>"), "{shown}");
}
