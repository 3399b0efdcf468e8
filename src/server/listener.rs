//! The listening socket: accepts TCP connections, terminates TLS (rustls, ALPN `h2` and
//! `http/1.1`; config from `server::tls`) when configured, and serves HTTP/1.1 (with upgrades,
//! for `kubectl exec`) and HTTP/2 on each connection; drains connections gracefully on shutdown.
//! The user of a verified client certificate is attached to every request of its connection
//! ([`PeerUser`]). HTTP/2 is hardened: bounded concurrent streams per connection, bounded
//! pending-accept and locally-errored resets (rapid reset, CVE-2023-44487), bounded header
//! lists; HTTP/1 heads are bounded too. TLS connections write through `tlsio` (full records).
//!
//! Called by `app` with a listener bound by [`bind`] and the shared `Server` (the sim binds
//! with [`bind`] too).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use super::auth::client_ca::ClientCa;
use super::auth::{x509, PeerUser};
use super::batch;
use super::coalesce::{Coalesce, FlushAfterPoll};
use super::conn::{self, Proto};
use super::crowd::{self, Crowd};
use super::Server;
use crate::shutdown::until_true;

/// Binds `addr` with the accept queue the system allows (`net.core.somaxconn`, as Go's
/// listeners and so kube-apiserver have), not tokio's 1 024: thousands of kubelets
/// reconnecting at once (an apiserver or proxy restart) overflow a short queue, their SYNs are
/// dropped and each retries a second or more later.
pub async fn bind(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let socket =
        if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog())
}

/// TCP keepalive probes on an accepted connection, as kube-apiserver sets them on its own
/// (`tcpKeepAliveListener`, k8s.io/apiserver `secure_serving.go`: every 3 minutes after 3 idle
/// minutes): a client that vanished (a node powered off, a partition) holding an HTTP/1.1
/// watch with nothing to send is found, and its connection closed, instead of holding its
/// watcher and slot until the watch's deadline. HTTP/2 connections are pinged too (`conn`).
/// Best effort: a socket that refuses is served without.
fn keepalive(stream: &tokio::net::TcpStream) {
    use rustix::net::sockopt;
    let set = sockopt::set_socket_keepalive(stream, true)
        .and_then(|()| sockopt::set_tcp_keepidle(stream, KEEPALIVE_PERIOD))
        .and_then(|()| sockopt::set_tcp_keepintvl(stream, KEEPALIVE_PERIOD));
    if let Err(e) = set {
        tracing::debug!(error = %e, "TCP keepalive not set on an accepted connection");
    }
}

/// kube-apiserver's `defaultKeepAlivePeriod`.
const KEEPALIVE_PERIOD: Duration = Duration::from_secs(180);

/// `net.core.somaxconn` (4 096 on recent kernels; the kernel caps a larger request at it), or
/// 4 096 where it cannot be read.
/// Whether a connection waits in `listener`'s accept queue (a poll that does not wait).
fn someone_waits(listener: &TcpListener) -> bool {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let mut fds = [PollFd::new(listener, PollFlags::IN)];
    let now = Timespec { tv_sec: 0, tv_nsec: 0 };
    poll(&mut fds, Some(&now)).is_ok_and(|n| n > 0)
}

fn backlog() -> u32 {
    std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(4096)
        .min(65_535)
}

/// Accepts connections until `shutdown` turns true, turns `told` true once the listener is
/// closed and every connection has been told to finish (at most a second later), then waits up
/// to `grace` for open connections to finish (watches are ended by the caches closing their
/// watchers, which the caller does after `told`).
pub async fn run(
    listener: TcpListener,
    tls: Option<(Arc<rustls::ServerConfig>, Option<Arc<ClientCa>>)>,
    server: Arc<Server>,
    mut shutdown: watch::Receiver<bool>,
    told: watch::Sender<bool>,
    grace: Duration,
    conn_opts: conn::ConnOptions,
) {
    let (live, mut all_gone) = conn::live();
    let (acceptor, client_ca) = match tls {
        Some((cfg, ca)) => (Some(tokio_rustls::TlsAcceptor::from(cfg)), ca),
        None => (None, None),
    };
    let builders = Arc::new(conn::Builders::new(conn_opts));
    let goaway_chance = conn_opts.goaway_chance;
    let slots = (conn_opts.max_connections > 0)
        .then(|| Arc::new(Semaphore::new(conn_opts.max_connections.min(Semaphore::MAX_PERMITS))));
    let mut warned: Option<tokio::time::Instant> = None;
    let crowd = Arc::new(Crowd::default());
    'accept: loop {
        // A slot before the accept: at the bound, new connections wait in the kernel's queue
        // (and past it are refused there) until one closes; the descriptors left are the
        // proxy's own (upstream connections, files). Meanwhile, while one waits there, an idle
        // connection of the source holding the most gives way (`crowd`), one a second at most.
        let slot = match &slots {
            Some(s) => loop {
                if s.available_permits() == 0 && warned.is_none_or(|t| t.elapsed() >= Duration::from_secs(30))
                {
                    tracing::warn!(
                        max = conn_opts.max_connections,
                        "client connections at --max-connections; new ones wait, idle ones give way"
                    );
                    warned = Some(tokio::time::Instant::now());
                }
                tokio::select! {
                    p = s.clone().acquire_owned() => break p.ok().map(Arc::new),
                    // Once a second at most, and only while a connection waits to be accepted.
                    _ = tokio::time::sleep(crowd::GIVE_WAY_EVERY) => {
                        if someone_waits(&listener) && crowd.make_room() {
                            tracing::debug!("an idle connection asked to close: one waits to be accepted");
                        }
                    }
                    _ = until_true(&mut shutdown) => break 'accept,
                }
            },
            None => None,
        };
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = until_true(&mut shutdown) => break,
        };
        let _ = stream.set_nodelay(true);
        keepalive(&stream);
        let (server, builders, stop, live, slots) =
            (server.clone(), builders.clone(), shutdown.clone(), live.clone(), slots.clone());
        // Counted only under a bound (`--max-connections`).
        let crowd = slots.as_ref().map(|_| crowd.clone());
        let source = Some(super::auth::rate::source_key(peer.ip()));
        match &acceptor {
            None => {
                tokio::spawn(async move {
                    let activity = conn::Activity::new();
                    let _member = crowd.map(|c| c.join(source, activity.clone()));
                    // Within the head timeout: a silent connection is closed when it ends, or
                    // when it is asked to give way (as over TLS: a review).
                    let proto = tokio::select! {
                        p = sniff(&stream, conn_opts.read_header_timeout.min(Duration::from_secs(10))) => p,
                        () = activity.told_to_close() => return,
                    };
                    let svc = service(
                        server,
                        None,
                        peer,
                        activity.clone(),
                        false,
                        goaway_chance,
                        // The connection's slot, held by its service until the connection ends.
                        slot.zip(slots),
                    );
                    if proto == Proto::Http2 {
                        let (io, flusher) = batch::batched(stream);
                        let conn = builders.serve(io, proto, svc, stop, live, activity);
                        drive(conn, true, Some(Box::new(flusher)), peer).await;
                    } else {
                        drive(builders.serve(stream, proto, svc, stop, live, activity), false, None, peer)
                            .await;
                    }
                });
            }
            Some(acceptor) => {
                let acceptor = acceptor.clone();
                let client_ca = client_ca.clone();
                tokio::spawn(async move {
                    // The client CA bundle's generation this handshake verifies against.
                    let generation = client_ca.as_ref().map(|ca| ca.generation());
                    // In the crowd from its accept: a connection that sends nothing, or half a
                    // ClientHello, holds its slot for the handshake's 10 s and must give way
                    // like an idle one (a review: a connect flood kept every slot).
                    let activity = conn::Activity::new();
                    let _member = crowd.map(|c| c.join(source, activity.clone()));
                    // Boxed: the handshake's state is not kept for the connection's life.
                    let accept =
                        Box::pin(tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream)));
                    let tls = tokio::select! {
                        r = accept => match r {
                            Ok(Ok(tls)) => tls,
                            Ok(Err(e)) => {
                                tracing::debug!(%peer, error = %e, "TLS handshake failed");
                                return;
                            }
                            Err(_) => return,
                        },
                        () = activity.told_to_close() => {
                            tracing::debug!(%peer, "TLS handshake given up: its slot given to a waiting connection");
                            return;
                        }
                    };
                    let session = tls.get_ref().1;
                    let chain = session.peer_certificates().unwrap_or_default();
                    // An X.509 v1 certificate passed the handshake unverified (`tls`): it
                    // authenticates nothing, every request gets 401.
                    let v1 = chain.first().is_some_and(|l| x509::is_v1(l));
                    // Verified by this handshake against the bundle of `generation`, unless the
                    // session was resumed (its chain restored, not verified) or the bundle was
                    // reloaded meanwhile: then verified again at the first request.
                    let resumed = session.handshake_kind() == Some(rustls::HandshakeKind::Resumed);
                    let verified_at = client_ca
                        .as_ref()
                        .map(|ca| ca.generation())
                        .filter(|g| !resumed && Some(*g) == generation);
                    let peer_user =
                        if v1 { None } else { PeerUser::of_chain(chain, client_ca.clone(), verified_at) };
                    let proto = match tls.get_ref().1.alpn_protocol() {
                        Some(b"h2") => Proto::Http2,
                        Some(b"http/1.1") => Proto::Http1,
                        _ => Proto::Detect,
                    };
                    let svc = service(
                        server,
                        peer_user,
                        peer,
                        activity.clone(),
                        v1,
                        goaway_chance,
                        // The connection's slot, held by its service until the connection ends.
                        slot.zip(slots),
                    );
                    // Full TLS records: short tails wait for the end of each poll (`tlsio`), which
                    // also batches an HTTP/2 connection's frames into few writes (as `batch` does
                    // in the clear).
                    let (io, cork) = super::tlsio::wrap(tls);
                    let conn = builders.serve(io, proto, svc, stop, live, activity);
                    drive(super::tlsio::corked(conn, cork), proto == Proto::Http2, None, peer).await;
                });
            }
        }
    }
    drop(listener);
    drop(live);
    let _ = tokio::time::timeout(Duration::from_secs(1), all_gone.all_told()).await;
    told.send_replace(true);
    if tokio::time::timeout(grace, all_gone.wait()).await.is_err() {
        tracing::warn!("grace period over; closing remaining connections");
        all_gone.kill();
    }
}

/// Runs one connection to its end. HTTP/2 ones defer their wake-ups behind the runnable tasks
/// (`coalesce`), so one connection poll serves all the streams that sent; with a `batch`
/// flusher, what that poll wrote leaves in one write.
async fn drive<F, E>(conn: F, h2: bool, flusher: Option<Box<dyn FlushAfterPoll>>, peer: std::net::SocketAddr)
where
    F: std::future::Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let res = match (h2, flusher) {
        (true, Some(flusher)) => Coalesce::new(conn).flushing(flusher).await,
        (true, None) => Coalesce::new(conn).await,
        (false, _) => conn.await,
    };
    if let Err(e) = res {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
}

/// What a plain connection speaks, from its first bytes (looked at without consuming them):
/// HTTP/2 opens with its preface (prior knowledge), HTTP/1.1 with a request line. When they do
/// not arrive within 10 s (or the peer closes) hyper's auto-detection decides.
async fn sniff(stream: &tokio::net::TcpStream, within: Duration) -> Proto {
    let mut buf = [0u8; 3];
    let peek = async {
        // `peek` returns at once while the bytes already there stay unread: the pause between
        // looks doubles (1 ms up to 64 ms), so a peer that sends `P` and nothing more costs a
        // few hundred wake-ups in 10 s, not ten thousand.
        let mut pause = Duration::from_millis(1);
        loop {
            match stream.peek(&mut buf).await {
                Ok(3) => return Some(&buf == b"PRI"),
                Ok(0) | Err(_) => return None,
                // A first byte that is not `P` settles it; else wait for the rest.
                Ok(_) if buf[0] != b'P' => return Some(false),
                Ok(_) => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(64));
                }
            }
        }
    };
    match tokio::time::timeout(within, peek).await {
        Ok(Some(true)) => Proto::Http2,
        Ok(Some(false)) => Proto::Http1,
        _ => Proto::Detect,
    }
}

/// The per-connection service: every request gets the connection's certificate user.
fn service(
    server: Arc<Server>,
    peer_user: Option<PeerUser>,
    peer: std::net::SocketAddr,
    activity: Arc<conn::Activity>,
    v1_certificate: bool,
    goaway_chance: f64,
    slot: Option<(Arc<tokio::sync::OwnedSemaphorePermit>, Arc<Semaphore>)>,
) -> impl hyper::service::Service<
    http::Request<hyper::body::Incoming>,
    Response = http::Response<super::Body>,
    Error = Infallible,
    Future = impl std::future::Future<Output = Result<http::Response<super::Body>, Infallible>> + Send + 'static,
> + Clone
       + Send
       + 'static {
    service_fn(move |mut req: http::Request<hyper::body::Incoming>| {
        let server = server.clone();
        if let Some(p) = &peer_user {
            req.extensions_mut().insert(p.clone());
        }
        if v1_certificate {
            req.extensions_mut().insert(super::auth::VersionOneCertificate);
        }
        req.extensions_mut().insert(super::proxy::PeerAddr(peer));
        // An upgraded session's sockets outlive hyper's connection task (it ends at the 101):
        // the connection's slot goes on with the splice, and the session takes a second for its
        // upstream connection (`phase::watch_slot`).
        if let Some((slot, slots)) =
            slot.as_ref().filter(|_| crate::upstream::upgrade_protocol(req.headers()).is_some())
        {
            crate::upstream::HeldWhileUpgraded::hold(&mut req, slot.clone());
            req.extensions_mut().insert(super::limits::ConnectionSlots(slots.clone()));
        }
        // In flight until its response body ends: the connection is not idle meanwhile.
        let busy = activity.begin();
        // An HTTP/2 stream reset before its response is ready counts against the connection.
        let handling = (req.version() == http::Version::HTTP_2).then(|| activity.handling());
        if req.version() == http::Version::HTTP_2 {
            activity.maybe_goaway(goaway_chance);
        }
        // Boxed: hyper keeps the service future's slot for the whole connection (HTTP/1) or
        // stream (HTTP/2); unboxed, its ~5 KiB would stay allocated for every open watch.
        Box::pin(async move {
            let resp = server.handle(req).await;
            if let Some(h) = handling {
                h.done();
            }
            Ok::<_, Infallible>(super::conn::Stalled::wrap(resp, busy))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// 1 500 clients connect at once to a listener that accepts none of them: the kernel
    /// queues them all (tokio's own `bind` queues 1 024, and the rest would wait for SYN
    /// retransmits, a second and more).
    #[tokio::test]
    async fn the_accept_queue_holds_a_burst_of_connections() {
        let want = 1500;
        if backlog() < want as u32 + 10 || crate::rlimit::raise_nofile().0 < 2 * want as u64 + 100 {
            eprintln!("skipped: somaxconn {} or the open-files limit is too low here", backlog());
            return;
        }
        let l = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = l.local_addr().unwrap();
        let connects = (0..want).map(|_| tokio::net::TcpStream::connect(addr));
        let all =
            tokio::time::timeout(Duration::from_millis(900), futures_util::future::try_join_all(connects));
        let streams = all.await.expect("every connection queued without a SYN retransmit").unwrap();
        assert_eq!(streams.len(), want);
        drop(l);
    }

    async fn first_bytes(sent: &'static [u8]) -> Proto {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut c = tokio::net::TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        c.write_all(sent).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        let proto = sniff(&s, Duration::from_secs(10)).await;
        // Nothing was consumed: the connection still starts with what the client sent.
        let mut buf = vec![0; sent.len()];
        let mut got = 0;
        while got < buf.len() {
            s.readable().await.unwrap();
            got += s.try_read(&mut buf[got..]).unwrap_or(0);
        }
        assert_eq!(buf, sent);
        proto
    }

    #[tokio::test]
    async fn the_protocol_is_recognised_without_consuming_it() {
        assert_eq!(first_bytes(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await, Proto::Http2);
        assert_eq!(first_bytes(b"GET /api HTTP/1.1\r\nHost: x\r\n\r\n").await, Proto::Http1);
        assert_eq!(first_bytes(b"PUT /api HTTP/1.1\r\nHost: x\r\n\r\n").await, Proto::Http1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_partial_preface_waits_for_the_rest_and_silence_leaves_it_to_hyper() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut c = tokio::net::TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        c.write_all(b"PR").await.unwrap();
        let sniffing = tokio::spawn(async move { sniff(&s, Duration::from_secs(10)).await });
        tokio::task::yield_now().await;
        c.write_all(b"I * HTTP/2.0\r\n").await.unwrap();
        assert_eq!(sniffing.await.unwrap(), Proto::Http2);
        // Nothing sent within 10 s: auto-detection.
        let _silent = tokio::net::TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        assert_eq!(sniff(&s, Duration::from_secs(10)).await, Proto::Detect);
    }
}
