//! The binary's logs: `--logging-format=json` lines carry the version, the effective
//! configuration and the forwarding decisions; text logs have no ANSI colours when stderr is
//! not a terminal. Runs the built `kube-watchcache` against an unreachable upstream.

mod common;

use common::Stderr;

use serde_json::{json, Value};

/// Runs the binary against an unreachable upstream (it keeps running and logs).
fn spawn(format: Option<&str>, level: &str) -> std::process::Child {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_kube-watchcache"));
    cmd.args([
        "serve",
        "--upstream",
        "http://127.0.0.1:9",
        "--resources",
        "pods",
        "--insecure-listen",
        "127.0.0.1:0",
        "--auth=none",
    ]);
    if let Some(f) = format {
        cmd.arg(format!("--logging-format={f}"));
    }
    cmd.arg(format!("--log-level={level}"));
    cmd.env_remove("RUST_LOG")
        .env_remove("WATCHCACHE_LOGGING_FORMAT")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("binary starts")
}

fn message_is(line: &str, message: &str) -> bool {
    serde_json::from_str::<Value>(line).is_ok_and(|v| v["message"] == message)
}

#[test]
fn json_logs_carry_the_version_the_configuration_and_forwarding_decisions() {
    let mut child = spawn(Some("json"), "kube_watchcache=debug");
    let err = Stderr::of(&mut child);
    let mut lines = err.until(|l| message_is(l, "serving"));
    let serving: Value = serde_json::from_str(lines.last().unwrap()).unwrap();
    let addr = serving["addr"].as_str().expect("addr").to_owned();
    // An uncached resource: forwarded (to nowhere), the decision logged at debug with its reason.
    let mut tcp = std::net::TcpStream::connect(&addr).expect("connect");
    std::io::Write::write_all(
        &mut tcp,
        b"GET /api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    lines.extend(err.until(|l| message_is(l, "forward upstream")));
    let still_running = child.try_wait().unwrap().is_none();
    let _ = child.kill();
    let _ = child.wait();
    assert!(still_running, "{lines:?}");
    for l in &lines {
        let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
        assert!(v["timestamp"].is_string() && v["level"].is_string() && v["target"].is_string(), "{l}");
    }
    let find = |m: &str| -> Value {
        serde_json::from_str(lines.iter().find(|l| message_is(l, m)).expect(m)).unwrap()
    };
    let start = find("kube-watchcache serve starting");
    assert_eq!(start["level"], "INFO");
    assert_eq!(start["version"], env!("CARGO_PKG_VERSION"));
    let config: Value =
        serde_json::from_str(start["config"].as_str().expect("config")).expect("config is JSON");
    assert_eq!(config["upstream"], "http://127.0.0.1:9");
    assert_eq!(config["resources"], json!(["pods"]));
    assert_eq!(config["auth"], "none");
    assert_eq!(config["historyWindow"], "75s");
    let fwd = find("forward upstream");
    assert_eq!((fwd["level"].as_str(), fwd["reason"].as_str()), (Some("DEBUG"), Some("not_cached")));
    assert_eq!(fwd["path"], "/api/v1/namespaces/default/configmaps");
}

#[test]
fn text_logs_have_no_ansi_colours_when_stderr_is_not_a_terminal() {
    let mut child = spawn(None, "info");
    let lines = Stderr::of(&mut child).until(|l| l.contains(" serving "));
    let _ = child.kill();
    let _ = child.wait();
    let all = lines.join("\n");
    assert!(!all.contains('\u{1b}'), "{all:?}");
    assert!(all.contains("INFO") && all.contains("kube-watchcache serve starting"), "{all}");
}
