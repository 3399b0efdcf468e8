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
//! run beside this test.

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

#[tokio::test(flavor = "current_thread")]
async fn an_idle_http2_watch_connection_holds_no_fixed_h2_buffers() {
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
