//! The binary's command line: bad configuration is one clear line and exit code 2.

use std::process::Command;

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
        // Unreachable upstream: discovery fails.
        vec![
            "serve",
            "--resources",
            "pods",
            "--insecure-listen",
            "127.0.0.1:0",
            "--auth=none",
            "--upstream",
            "http://127.0.0.1:9",
        ],
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
    for sub in ["serve", "sim", "demo", "bench"] {
        assert!(text.contains(sub), "{text}");
    }
}
