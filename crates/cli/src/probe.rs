//! `kube-watchcache probe <url>`: one plain-HTTP GET of a health path on this host, exit 0 on
//! 200 and 1 otherwise, for exec probes. A sidecar listening on its pod's loopback
//! (`--auth=none`, `deploy/sidecar/app.yaml`) cannot be probed by the kubelet's `httpGet`,
//! which connects from the node's network namespace (`host: 127.0.0.1` is the node's own
//! loopback), and the image has no shell or curl. Blocking std I/O, no runtime. Called by
//! `main`.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// `kube-watchcache probe`'s arguments.
#[derive(Debug, clap::Args)]
pub struct ProbeArgs {
    /// `http://<host>:<port><path>`, e.g. `http://127.0.0.1:8001/readyz`.
    pub url: String,
    /// Seconds before giving up (connecting, sending, reading).
    #[arg(long, default_value_t = 5)]
    pub timeout: u64,
}

/// The most of an answer read (a `?verbose` body is a few KiB).
const MAX_ANSWER: u64 = 64 * 1024;

/// Probes `args.url`; the answer's body is printed (stdout), a failure says why.
pub fn run(args: &ProbeArgs) -> Result<(), String> {
    let rest = args.url.strip_prefix("http://").ok_or("only http:// URLs are probed")?;
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, "/"),
    };
    let path = if path.starts_with('?') { format!("/{path}") } else { path.to_owned() };
    let timeout = Duration::from_secs(args.timeout.max(1));
    // Every address the name has (`localhost` may be ::1 first, the proxy on 127.0.0.1).
    let addrs: Vec<_> = authority.to_socket_addrs().map_err(|e| format!("{authority}: {e}"))?.collect();
    let mut failures = Vec::new();
    let mut conn = None;
    for addr in &addrs {
        match TcpStream::connect_timeout(addr, timeout) {
            Ok(c) => {
                conn = Some(c);
                break;
            }
            Err(e) => failures.push(format!("{addr}: {e}")),
        }
    }
    let Some(mut conn) = conn else {
        return Err(if failures.is_empty() {
            format!("{authority}: no address")
        } else {
            failures.join("; ")
        });
    };
    conn.set_read_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    conn.set_write_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    // One write (`write!` writes each formatted piece apart: a server answering after the first
    // piece and closing failed the rest with a broken pipe, and the answer went unread).
    let request = format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n");
    let sent = conn.write_all(request.as_bytes());
    let mut answer = Vec::new();
    // What came before a write or read error, or the timeout, still says the status.
    let read = conn.take(MAX_ANSWER).read_to_end(&mut answer);
    if answer.is_empty() {
        sent.map_err(|e| format!("{authority}: {e}"))?;
        read.map_err(|e| format!("{authority}: {e}"))?;
    }
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.lines().next().unwrap_or("");
    print!("{body}");
    match status.split(' ').nth(1) {
        Some("200") => Ok(()),
        _ => Err(format!("{}: {status}", args.url)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// Serves one connection with `answer`.
    fn answering(answer: &'static str) -> String {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            // The request's head, whole.
            let mut head = Vec::new();
            let mut b = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && c.read(&mut b).unwrap() == 1 {
                head.push(b[0]);
            }
            c.write_all(answer.as_bytes()).unwrap();
        });
        format!("http://{addr}/readyz")
    }

    fn probe(url: String) -> Result<(), String> {
        run(&ProbeArgs { url, timeout: 5 })
    }

    #[test]
    fn a_200_passes_and_anything_else_fails() {
        assert_eq!(probe(answering("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")), Ok(()));
        let failed = probe(answering("HTTP/1.1 500 Internal Server Error\r\n\r\nreadyz check failed"));
        assert!(failed.is_err_and(|e| e.ends_with("HTTP/1.1 500 Internal Server Error")));
        // Nothing listening, a URL that is not plain HTTP, an address without a port.
        let closed = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        assert!(probe(format!("http://{closed}/livez")).is_err());
        assert!(probe("https://127.0.0.1:1/readyz".into()).is_err());
        assert!(probe("http://127.0.0.1/readyz".into()).is_err());
        // A query without a path.
        let url = answering("HTTP/1.1 200 OK\r\n\r\nok");
        let base = url.trim_end_matches("/readyz");
        assert_eq!(probe(format!("{base}?verbose")), Ok(()));
    }
}
