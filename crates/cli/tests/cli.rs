//! The binary's command line: bad configuration is one clear line and exit code 2.

mod common;

use std::process::Command;

use common::Stderr;

/// Runs the binary; returns (exit code, stdout, stderr).
fn exec(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kube-watchcache"))
        .args(args)
        .env_remove("KUBECONFIG")
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

/// Exit code and stderr.
fn run(args: &[&str]) -> (i32, String) {
    let (code, _, err) = exec(args);
    (code, err)
}

#[test]
fn bad_configuration_exits_2_with_one_line() {
    let missing = std::env::temp_dir().join("kwc-no-such-kubeconfig");
    let cases: Vec<Vec<&str>> = vec![
        vec![
            "serve",
            "--resources",
            "pods",
            "--insecure-listen",
            "127.0.0.1:0",
            "--auth=none",
            "--kubeconfig",
            missing.to_str().unwrap(),
        ],
        vec![
            "serve",
            "--resources",
            "pods",
            "--insecure-listen",
            "0.0.0.0:0",
            "--auth=none",
            "--upstream",
            "http://127.0.0.1:9",
        ],
        vec!["serve", "--insecure-listen", "127.0.0.1:0", "--auth=none", "--upstream", "http://127.0.0.1:9"],
    ];
    for args in cases {
        let (code, err) = run(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("kube-watchcache:")).collect();
        assert_eq!(lines.len(), 1, "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    // Unknown flags: clap's usage error, also exit 2.
    assert_eq!(run(&["serve", "--no-such-flag"]).0, 2);
}

#[test]
fn help_lists_the_subcommands() {
    let (_, text, _) = exec(&["--help"]);
    assert!(text.starts_with("An in-memory watch cache for the Kubernetes API"), "{text}");
    for sub in ["serve", "sim", "demo", "bench"] {
        // Each a line of the "Commands:" list.
        assert!(text.contains(&format!("\n  {sub} ")), "{sub}: {text}");
    }
}

#[test]
fn out_of_range_and_malformed_durations_exit_2_without_a_panic() {
    for value in ["100000000000000000000s", "2562048h", "1.5", "-1s", "1d"] {
        for flag in ["--history-window", "--request-timeout", "--min-request-timeout"] {
            let arg = format!("{flag}={value}");
            let (code, err) = run(&[
                "serve",
                "--resources",
                "pods",
                "--insecure-listen",
                "127.0.0.1:0",
                "--auth=none",
                "--upstream",
                "http://127.0.0.1:9",
                &arg,
            ]);
            assert_eq!(code, 2, "{flag} {value}: {err}");
            assert!(err.contains("invalid duration"), "{flag} {value}: {err}");
            assert!(!err.contains("panicked"), "{flag} {value}: {err}");
        }
    }
}

/// `KUBECONFIG=a:b` is a list of files merged like kubectl's (the first to set a value wins),
/// not one path: the context comes from the first file, the cluster and user from the second.
#[test]
fn kubeconfig_variable_lists_files_that_are_merged() {
    let dir = std::env::temp_dir().join(format!("kwc-cli-kubeconfig-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let a = dir.join("a.yaml");
    let b = dir.join("b.yaml");
    std::fs::write(
        &a,
        "apiVersion: v1\nkind: Config\ncurrent-context: ctx\ncontexts:\n- name: ctx\n  context: {cluster: c1, user: u1}\n",
    )
    .unwrap();
    std::fs::write(
        &b,
        "apiVersion: v1\nkind: Config\ncurrent-context: other\nclusters:\n- name: c1\n  cluster: {server: 'http://127.0.0.1:9'}\nusers:\n- name: u1\n  user: {token: secret-token}\n",
    )
    .unwrap();
    let list = std::env::join_paths([&a, &b]).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kube-watchcache"))
        .args(["serve", "--resources", "pods", "--insecure-listen", "127.0.0.1:0", "--auth=none"])
        .env("KUBECONFIG", &list)
        .env("HOME", &dir)
        .env("RUST_LOG", "info")
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The merged config is usable: the proxy gets as far as discovery against the (closed)
    // upstream of the second file, with the first file's context, and keeps running.
    let err = read_until(&mut child, "retrying in the background");
    let _ = child.kill();
    let _ = child.wait();
    assert!(err.contains("discovery failed"), "{err}");
    assert!(err.contains("kubeconfig") && err.contains("context ctx"), "{err}");
    assert!(!err.contains("secret-token"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Reads a child's stderr until a line contains `marker` (at most 20 s); returns what was read.
fn read_until(child: &mut std::process::Child, marker: &str) -> String {
    let mut seen = Stderr::of(child).until(|l| l.contains(marker)).join("\n");
    seen.push('\n');
    seen
}

/// An unreachable upstream is not a crash loop: `serve` keeps running, alive and not ready.
#[test]
fn serve_keeps_running_while_the_upstream_is_unreachable() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kube-watchcache"))
        .args(["serve", "--resources", "pods", "--insecure-listen", "127.0.0.1:0", "--auth=none"])
        .args(["--upstream", "http://127.0.0.1:9", "--log-level", "info"])
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let err = read_until(&mut child, "serving");
    assert!(err.contains("discovery failed"), "{err}");
    assert!(child.try_wait().unwrap().is_none(), "still running: {err}");
    let _ = child.kill();
    let _ = child.wait();
}

/// SIGTERM starts the shutdown (not ready, then `--shutdown-delay-duration`, then drain); a
/// second SIGTERM exits at once with status 1, like kube-apiserver.
#[test]
fn a_second_sigterm_exits_at_once() {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(env!("CARGO_BIN_EXE_kube-watchcache"))
        .args(["serve", "--resources", "pods", "--insecure-listen", "127.0.0.1:0", "--auth=none"])
        .args(["--upstream", "http://127.0.0.1:9", "--log-level", "info", "--shutdown-delay-duration", "1h"])
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let wait_for = |marker: &str| loop {
        let line = rx.recv_timeout(std::time::Duration::from_secs(20)).expect(marker);
        if line.contains(marker) {
            return;
        }
    };
    let pid = child.id().to_string();
    let term = || assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    wait_for("tls=false"); // the listener's "serving" line: the signal handler is next
    term();
    // The first signal starts the (hour-long) delay: not ready, still running.
    wait_for("still serving until the shutdown delay ends");
    assert!(child.try_wait().unwrap().is_none(), "the first SIGTERM waits out the shutdown delay");
    term();
    wait_for("second signal received, exiting at once");
    assert_eq!(child.wait().unwrap().code(), Some(1));
}
