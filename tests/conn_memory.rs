//! The heap an idle HTTP/2 connection with one watch open holds (issue 35 §1), counted by a
//! global allocator: the proxy's own connection builder (`server::conn::Builders`, the settings
//! `serve` uses) serving hyper HTTP/2 clients on loopback, every connection with one response
//! streaming, its first chunk delivered, then nothing. The figure is client and server sides
//! together (both run h2); h2 0.4.20 as published holds 28 KiB of fixed buffers per side (16 KiB
//! write, 8 KiB read, 4 KiB HPACK), which `vendor/h2` allocates on demand and releases when idle
//! (`vendor/h2/PATCHES.md`). If that patch were dropped, or an h2 upgrade brought the buffers
//! back, the bound here fails.
//!
//! Apart from the themed binaries: the allocator counts the whole process, so nothing else may
//! run beside these tests (one at a time here, `ONE_AT_A_TIME`). The second test drives raw
//! HTTP/2 frames at the same builder: the HPACK table's entries must not keep the header
//! blocks they came in alive.

use std::alloc::{GlobalAlloc, Layout, System};
use std::convert::Infallible;
use std::sync::atomic::{AtomicIsize, Ordering};

use bytes::Bytes;
use futures_util::stream::{self, StreamExt};
use http_body_util::{BodyExt, Empty, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use kube_watchcache::server::body::{Body, BoxError};
use kube_watchcache::server::conn::{live, Activity, Builders, Proto};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The live heap in bytes: what was allocated and not yet freed.
static LIVE: AtomicIsize = AtomicIsize::new(0);

struct Counting;

// SAFETY: every call is forwarded to the system allocator with the caller's arguments; the
// counter is only arithmetic on the sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_add(new_size as isize - layout.size() as isize, Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Held by each test for its whole run: the count is the process's, and `cargo test` runs a
/// binary's tests on threads of one process.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Connections opened before the first count (lazily built state, slabs grown) …
const WARM: usize = 20;
/// … and the ones counted.
const COUNTED: usize = 200;
/// Heap per connection, client and server sides together, that the test allows. Measured
/// (2026-11-26, this test, debug build): 27 949 bytes with vendor/h2's on-demand buffers,
/// 85 453 bytes with h2 0.4.20 as published (2 × 28 KiB more); the bound sits between them.
const BOUND: isize = 48 * 1024;

/// A watch as the proxy streams it: a first event, then nothing for as long as it is open.
async fn watch_like(_req: http::Request<Incoming>) -> Result<http::Response<Body>, Infallible> {
    let first = Bytes::from_static(br#"{"type":"ADDED","object":{"kind":"Pod","apiVersion":"v1"}}"#);
    let events = stream::iter([Ok::<_, BoxError>(Frame::data(first))]).chain(stream::pending());
    Ok(http::Response::new(BodyExt::boxed_unsync(StreamBody::new(events))))
}

/// An HTTP/2 client connection with one watch open and its first event read.
async fn open_watch(addr: std::net::SocketAddr) -> impl Sized {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let (mut send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
        .await
        .expect("HTTP/2 handshake");
    tokio::spawn(conn);
    let req = http::Request::get("/api/v1/pods?watch=true&fieldSelector=spec.nodeName%3Dnode-1")
        .header("accept", "application/vnd.kubernetes.protobuf;type=watch, application/json")
        .header("user-agent", "kubelet/v1.34.0 (linux/amd64) kubernetes/0000000")
        .body(Empty::<Bytes>::new())
        .expect("request");
    let mut resp = send.send_request(req).await.expect("response head");
    assert_eq!(resp.status(), 200);
    let first = resp.body_mut().frame().await.expect("a first event").expect("no error");
    assert!(first.is_data());
    (send, resp)
}

/// Lets every task and socket event run until the live heap stops changing (the runtime has a
/// single thread: a yield lets the others, and the I/O driver, run).
async fn settle() -> isize {
    let mut last = LIVE.load(Ordering::SeqCst);
    let mut still = 0;
    for _ in 0..100_000 {
        tokio::task::yield_now().await;
        let now = LIVE.load(Ordering::SeqCst);
        if now == last {
            still += 1;
            if still == 200 {
                return now;
            }
        } else {
            (last, still) = (now, 0);
        }
    }
    panic!("the heap did not settle");
}

// The lock orders whole tests, each on a runtime of its own: nothing else waits on it.
#[allow(clippy::await_holding_lock)]
#[tokio::test(flavor = "current_thread")]
async fn an_idle_http2_watch_connection_holds_no_fixed_h2_buffers() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let (live, _all_gone) = live();
    let (_stop_tx, stop) = watch::channel(false);
    tokio::spawn(async move {
        let builders = Builders::default();
        loop {
            let (tcp, _) = listener.accept().await.expect("accept");
            let svc = hyper::service::service_fn(watch_like);
            tokio::spawn(builders.serve(tcp, Proto::Http2, svc, stop.clone(), live.clone(), Activity::new()));
        }
    });

    let mut open = Vec::with_capacity(WARM + COUNTED);
    for _ in 0..WARM {
        open.push(open_watch(addr).await);
    }
    let before = settle().await;
    for _ in 0..COUNTED {
        open.push(open_watch(addr).await);
    }
    let after = settle().await;
    let per = (after - before) / COUNTED as isize;
    println!("{per} bytes of heap per idle HTTP/2 watch connection (client and server sides)");
    assert!(per > 0, "{per}: the connections are counted");
    assert!(
        per < BOUND,
        "{per} bytes per idle HTTP/2 connection (client and server), over {BOUND}: h2's fixed \
         buffers are back (vendor/h2/PATCHES.md)"
    );
    drop(open);
}

/// An HTTP/2 frame: its 9-byte head and `payload`.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// An HPACK integer with an `n`-bit prefix whose high bits are `high`.
fn hpack_int(high: u8, n: u32, mut v: usize, out: &mut Vec<u8>) {
    let max = (1usize << n) - 1;
    if v < max {
        out.push(high | v as u8);
        return;
    }
    out.push(high | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128) as u8 | 0x80);
        v /= 128;
    }
    out.push(v as u8);
}

/// A request's header block: a long `:authority` (split over CONTINUATION frames: the decoder
/// gathers the frames into one buffer), then a short `:path` the decoder keeps in its dynamic
/// table (a literal with incremental indexing, no Huffman).
fn padded_block(path: &str, authority_len: usize) -> Vec<u8> {
    let mut b = vec![0x82, 0x86]; // :method GET, :scheme http
    b.push(0x01); // :authority (static index 1), without indexing
    hpack_int(0, 7, authority_len, &mut b);
    b.extend(std::iter::repeat_n(b'a', authority_len));
    hpack_int(0x40, 6, 4, &mut b); // :path (static index 4), with incremental indexing
    hpack_int(0, 7, path.len(), &mut b);
    b.extend_from_slice(path.as_bytes());
    b
}

/// An unauthenticated caller's cheap way to pin memory over HTTP/2: each header block puts a
/// short `:path` into the connection's HPACK table (4 KiB by its own count), and h2 0.4.20 as
/// published keeps the entry as a slice of the buffer the whole block was read into — here a
/// 60 KB authority each (valid: under the URI's 64 KiB), ~95 entries, ~6–12 MiB held by one
/// connection for its life (a 1 MiB authority, reset as too long after its `:path` is in the
/// table, pins 1–2 MiB an entry).
/// `vendor/h2` copies what its table keeps (PATCHES.md).
// The lock orders whole tests, each on a runtime of its own: nothing else waits on it.
#[allow(clippy::await_holding_lock)]
#[tokio::test(flavor = "current_thread")]
async fn an_http2_header_table_keeps_only_its_entries_not_the_blocks_they_came_in() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let (live, _all_gone) = live();
    let (_stop_tx, stop) = watch::channel(false);
    tokio::spawn(async move {
        let builders = Builders::default();
        let (tcp, _) = listener.accept().await.expect("accept");
        let svc = hyper::service::service_fn(|_req: http::Request<Incoming>| async {
            Ok::<_, Infallible>(http::Response::new(BodyExt::boxed_unsync(
                Empty::<Bytes>::new().map_err(|never| match never {}),
            )))
        });
        let _ = builders.serve(tcp, Proto::Http2, svc, stop, live, Activity::new()).await;
    });
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let (mut rx, mut tx) = tcp.into_split();
    let answered = std::sync::Arc::new(AtomicIsize::new(0));
    let seen = answered.clone();
    tokio::spawn(async move {
        // Every byte the server sends; HEADERS frames (responses) counted.
        let mut buf = Vec::new();
        let mut chunk = vec![0u8; 64 * 1024];
        while let Ok(n) = rx.read(&mut chunk).await {
            if n == 0 {
                return;
            }
            buf.extend_from_slice(&chunk[..n]);
            while buf.len() >= 9 {
                let len = (buf[0] as usize) << 16 | (buf[1] as usize) << 8 | buf[2] as usize;
                if buf.len() < 9 + len {
                    break;
                }
                if buf[3] == 1 {
                    seen.fetch_add(1, Ordering::SeqCst);
                }
                buf.drain(..9 + len);
            }
        }
    });
    tx.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.unwrap();
    tx.write_all(&frame(4, 0, 0, &[])).await.unwrap();
    const REQUESTS: usize = 120;
    const PAD: usize = 60_000;
    let mut sent = 0;
    let mut baseline = None;
    for i in 0..REQUESTS {
        let block = padded_block(&format!("/healthz?{i:04}"), PAD);
        let stream = 1 + 2 * i as u32;
        let mut chunks = block.chunks(16 * 1024).peekable();
        let first = chunks.next().unwrap();
        let end = if chunks.peek().is_none() { 0x4 } else { 0 };
        tx.write_all(&frame(1, 0x1 | end, stream, first)).await.unwrap();
        while let Some(c) = chunks.next() {
            let end = if chunks.peek().is_none() { 0x4 } else { 0 };
            tx.write_all(&frame(9, end, stream, c)).await.unwrap();
        }
        sent += 1;
        let mut spins = 0;
        while (answered.load(Ordering::SeqCst) as usize) < sent {
            tokio::task::yield_now().await;
            spins += 1;
            assert!(spins < 1_000_000, "request {i} not answered");
        }
        if i == 9 {
            // The connection's own buffers have grown to a block's size by now.
            baseline = Some(settle().await);
        }
    }
    let grown = settle().await - baseline.unwrap();
    println!("{grown} bytes of heap more after {} padded requests", REQUESTS - 10);
    assert!(
        grown < 2 * 1024 * 1024,
        "{grown} bytes held after {} requests with 60 KB authorities: the HPACK table keeps the blocks \
         its entries came in (vendor/h2/PATCHES.md)",
        REQUESTS - 10
    );
    drop(tx);
}
