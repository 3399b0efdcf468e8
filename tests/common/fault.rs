//! A TCP fault relay between the proxy and the simulated apiserver, for the reliability tests
//! (`tests/faults.rs`, `tests/reliability/relist.rs`): on command it drops every open connection, refuses
//! new ones (upstream down), delays every chunk (slow upstream), stops forwarding on the open
//! connections without closing them (blackhole, a stalled watch), holds every chunk until told
//! (a slow upstream ended by the test), or answers the next N LISTs of
//! configmaps with HTTP 500, or every GET of one path with 429 (APF), or holds the responses of watch requests (a stalled watch). It speaks bytes, not HTTP, so the proxy's client must use HTTP/1.1
//! to a plain-http upstream.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Shared state of the fault proxy: commands and counters.
pub struct FaultState {
    pub upstream: SocketAddr,
    /// Upstream down: new connections are accepted and closed at once.
    pub down: AtomicBool,
    /// Bumped to close every open connection.
    pub kill: watch::Sender<u64>,
    /// Connections with an id below this forward nothing more, and never close (partition).
    pub hole_below: AtomicU64,
    pub next_id: AtomicU64,
    /// Every chunk, each way, waits this long before it is forwarded.
    pub delay_ms: AtomicU64,
    /// The next this-many LISTs of configmaps are answered 500 by the fault proxy itself.
    pub fail_lists: AtomicUsize,
    /// Every GET of exactly this path (no query) is answered 429 with `Retry-After: 1`.
    pub busy_path: parking_lot::Mutex<Option<String>>,
    pub busy_answers: AtomicUsize,
    pub accepted: AtomicUsize,
    pub refused: AtomicUsize,
    pub failed_lists: AtomicUsize,
    pub delayed_chunks: AtomicUsize,
    pub held_chunks: AtomicUsize,
    /// Request heads seen (first line), to check what the proxy's client speaks.
    pub heads: AtomicUsize,
    pub h2_preface: AtomicBool,
    /// While set, no response bytes of a watch request (`watch=true`) are forwarded: they are
    /// held, as by a stalled TCP connection, until it is cleared (or the connection is cut).
    pub stall_watches: watch::Sender<bool>,
    /// While set, every chunk, each way, waits until it is cleared (a slow upstream whose
    /// slowness a test ends when it chooses, not after a time).
    pub held: watch::Sender<bool>,
}

pub struct Fault {
    pub addr: SocketAddr,
    pub st: Arc<FaultState>,
}

impl Fault {
    pub async fn start(upstream: SocketAddr) -> Fault {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let st = Arc::new(FaultState {
            upstream,
            down: AtomicBool::new(false),
            kill: watch::channel(0).0,
            hole_below: AtomicU64::new(0),
            next_id: AtomicU64::new(1),
            delay_ms: AtomicU64::new(0),
            fail_lists: AtomicUsize::new(0),
            busy_path: parking_lot::Mutex::new(None),
            busy_answers: AtomicUsize::new(0),
            accepted: AtomicUsize::new(0),
            refused: AtomicUsize::new(0),
            failed_lists: AtomicUsize::new(0),
            delayed_chunks: AtomicUsize::new(0),
            held_chunks: AtomicUsize::new(0),
            heads: AtomicUsize::new(0),
            h2_preface: AtomicBool::new(false),
            stall_watches: watch::channel(false).0,
            held: watch::channel(false).0,
        });
        let s = st.clone();
        tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                if s.down.load(SeqCst) {
                    s.refused.fetch_add(1, SeqCst);
                    drop(sock);
                    continue;
                }
                s.accepted.fetch_add(1, SeqCst);
                let id = s.next_id.fetch_add(1, SeqCst);
                tokio::spawn(connection(s.clone(), id, sock));
            }
        });
        Fault { addr, st }
    }

    /// Closes every open connection (FIN both ways).
    pub fn drop_all(&self) {
        self.st.kill.send_modify(|g| *g += 1);
    }

    /// Upstream down: closes every open connection and every new one.
    pub fn down(&self) {
        self.st.down.store(true, SeqCst);
        self.drop_all();
    }

    pub fn up(&self) {
        self.st.down.store(false, SeqCst);
    }

    /// Partition of the open connections: nothing more is forwarded on them, not even a FIN;
    /// new connections work.
    pub fn blackhole_open(&self) {
        self.st.hole_below.store(self.st.next_id.load(SeqCst), SeqCst);
    }

    /// Stalls (true) or releases (false) every watch response, open or new.
    pub fn stall_watches(&self, on: bool) {
        self.st.stall_watches.send_replace(on);
    }

    /// Holds (true) or releases (false) every chunk, each way, on every connection.
    pub fn hold(&self, on: bool) {
        self.st.held.send_replace(on);
    }

    pub fn set_delay(&self, d: Duration) {
        self.st.delay_ms.store(d.as_millis() as u64, SeqCst);
    }

    pub fn fail_next_lists(&self, n: usize) {
        self.st.fail_lists.store(n, SeqCst);
    }

    /// Answers every GET of `path` 429 (an apiserver shedding load), or nothing more so.
    pub fn busy(&self, path: Option<&str>) {
        *self.st.busy_path.lock() = path.map(str::to_owned);
    }

    pub fn count(&self, c: fn(&FaultState) -> &AtomicUsize) -> usize {
        c(&self.st).load(SeqCst)
    }
}

type ClientWriter = Arc<tokio::sync::Mutex<tokio::net::tcp::OwnedWriteHalf>>;

async fn connection(st: Arc<FaultState>, id: u64, client: TcpStream) {
    let mut kill = st.kill.subscribe();
    let Ok(up) = TcpStream::connect(st.upstream).await else { return };
    let _ = client.set_nodelay(true);
    let _ = up.set_nodelay(true);
    let (cr, cw) = client.into_split();
    let (ur, uw) = up.into_split();
    let cw: ClientWriter = Arc::new(tokio::sync::Mutex::new(cw));
    let is_watch = AtomicBool::new(false);
    tokio::select! {
        _ = requests(&st, id, cr, uw, cw.clone(), &is_watch) => {}
        _ = responses(&st, id, ur, cw, &is_watch) => {}
        _ = kill.changed() => {}
    }
}

/// Holds forever once the connection is blackholed.
async fn gate(st: &FaultState, id: u64) {
    if id < st.hole_below.load(SeqCst) {
        st.held_chunks.fetch_add(1, SeqCst);
        std::future::pending::<()>().await;
    }
}

async fn delay(st: &FaultState) {
    let mut held = st.held.subscribe();
    if *held.borrow_and_update() {
        st.delayed_chunks.fetch_add(1, SeqCst);
        let _ = held.wait_for(|on| !on).await;
    }
    let ms = st.delay_ms.load(SeqCst);
    if ms > 0 {
        st.delayed_chunks.fetch_add(1, SeqCst);
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}

/// Whether a chunk from the client starts a LIST of all configmaps (the reflector's list).
/// Answers the client with `status` (the status line's code and reason, then any header
/// lines) and the JSON `body`, and closes its connection.
async fn answer_and_close(cw: &ClientWriter, status: &str, body: &str) {
    let resp = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut w = cw.lock().await;
    let _ = w.write_all(resp.as_bytes()).await;
    let _ = w.shutdown().await;
}

fn is_configmap_list(chunk: &[u8]) -> bool {
    let Some(rest) = chunk.strip_prefix(b"GET ") else { return false };
    let target = rest.split(|b| *b == b' ').next().unwrap_or_default();
    let target = String::from_utf8_lossy(target);
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    path == "/api/v1/configmaps" && !query.split('&').any(|p| p == "watch=true" || p == "watch=1")
}

const STATUS_500: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"injected by the fault proxy","reason":"InternalError","code":500}"#;

/// Client → upstream; answers a LIST with 500 itself when told to (then closes).
async fn requests(
    st: &FaultState,
    id: u64,
    mut cr: tokio::net::tcp::OwnedReadHalf,
    mut uw: tokio::net::tcp::OwnedWriteHalf,
    cw: ClientWriter,
    is_watch: &AtomicBool,
) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match cr.read(&mut buf).await {
            Ok(0) | Err(_) => {
                gate(st, id).await;
                let _ = uw.shutdown().await;
                // Let the response side finish.
                return std::future::pending().await;
            }
            Ok(n) => n,
        };
        let chunk = &buf[..n];
        if chunk.starts_with(b"PRI * HTTP/2.0") {
            st.h2_preface.store(true, SeqCst);
        }
        if [&b"GET "[..], b"POST ", b"PUT ", b"PATCH ", b"DELETE "].iter().any(|m| chunk.starts_with(m)) {
            st.heads.fetch_add(1, SeqCst);
            let line = chunk.split(|b| *b == b'\n').next().unwrap_or_default();
            let line = String::from_utf8_lossy(line);
            is_watch.store(line.contains("watch=true") || line.contains("watch=1"), SeqCst);
        }
        let busy = st.busy_path.lock().as_ref().is_some_and(|p| {
            chunk.starts_with(format!("GET {p} ").as_bytes())
                || chunk.starts_with(format!("GET {p}?").as_bytes())
        });
        if busy {
            st.busy_answers.fetch_add(1, SeqCst);
            let body = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Too many requests, please try again later.","reason":"TooManyRequests","details":{"retryAfterSeconds":1},"code":429}"#;
            answer_and_close(&cw, "429 Too Many Requests\r\nretry-after: 1", body).await;
            return;
        }
        if is_configmap_list(chunk)
            && st.fail_lists.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1)).is_ok()
        {
            st.failed_lists.fetch_add(1, SeqCst);
            answer_and_close(&cw, "500 Internal Server Error", STATUS_500).await;
            return;
        }
        delay(st).await;
        gate(st, id).await;
        if uw.write_all(chunk).await.is_err() {
            return;
        }
    }
}

/// Upstream → client.
async fn responses(
    st: &FaultState,
    id: u64,
    mut ur: tokio::net::tcp::OwnedReadHalf,
    cw: ClientWriter,
    is_watch: &AtomicBool,
) {
    let mut stalled = st.stall_watches.subscribe();
    let born = *st.kill.borrow();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match ur.read(&mut buf).await {
            Ok(0) | Err(_) => {
                gate(st, id).await;
                let _ = cw.lock().await.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        delay(st).await;
        gate(st, id).await;
        if is_watch.load(SeqCst) {
            let _ = stalled.wait_for(|s| !*s).await;
            if *st.kill.borrow() != born {
                // Cut while stalled: what was held is lost with the connection.
                return std::future::pending().await;
            }
        }
        if cw.lock().await.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
