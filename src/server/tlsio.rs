//! Full TLS records, few writes: the IO that hyper reads and writes on a TLS connection, in
//! front of tokio-rustls. rustls ends a record at the end of every write it is given, and the h2
//! crate writes each DATA frame (a 9-byte header and up to 16 KiB of payload) with its own write
//! and a flush, so a 16 KiB frame became a full record plus a 9-byte one, each frame one `writev`:
//! twice the records (reads, decryptions) for the client and a syscall per 16 KiB here.
//!
//! Here rustls is given whole records: the bytes that would make a short record are held back
//! (copied, only when fewer than [`TAIL_COPY_MAX`]; everything else goes to rustls straight from
//! hyper's buffers, and rustls makes the one copy, into the record) and handed over ahead of the
//! next write. While the connection task polls the connection ([`Cork`], set by `listener`),
//! hyper's flushes do not write to the socket: rustls's records go out when it holds
//! [`HAND`] bytes, and everything (records and the held tail) when that poll of the connection
//! ends — never later. Outside that scope (an upgraded connection driven by another task) a
//! flush sends everything. Memory stays bounded: the tail is less than one record (and freed
//! once sent, so an idle watch connection keeps no buffer here) and rustls's buffer at most
//! [`HAND`] (a write waits for the socket to take it first).
//!
//! Used by `server::listener` for every TLS connection.

use std::future::Future;
use std::io::{self, IoSlice, Write};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_rustls::server::TlsStream;

/// rustls's largest record payload: what it cuts a write into.
const RECORD: usize = 16 * 1024;
/// rustls holds at most this much plaintext (four records) before it goes to the socket.
pub const HAND: usize = 4 * RECORD;
/// A tail shorter than this (after the full records of a write) is held back and copied; a
/// longer one is sent as a short record (copying it costs more than the record saves).
pub const TAIL_COPY_MAX: usize = 1024;

struct State<S> {
    tls: TlsStream<S>,
    /// Bytes accepted from hyper that rustls has not been given yet: less than one record.
    tail: Vec<u8>,
    /// Plaintext given to rustls since its buffer last went to the socket (at most `HAND`).
    unsent: usize,
    /// Set while the connection task polls the connection: flushes keep data back.
    corked: bool,
}

/// The connection's IO, handed to hyper.
pub struct TlsIo<S> {
    state: Arc<Mutex<State<S>>>,
}

/// The driver's handle: corks the IO for one poll of the connection.
pub struct Cork<S> {
    state: Arc<Mutex<State<S>>>,
}

/// A TLS stream wrapped for hyper, and the handle that corks it around each poll.
pub fn wrap<S>(mut tls: TlsStream<S>) -> (TlsIo<S>, Cork<S>) {
    // `HAND` of plaintext is a little more in records (headers, tags): room for it and for
    // what rustls itself sends (alerts, key updates).
    tls.get_mut().1.set_buffer_limit(Some(HAND + 4096));
    let state = Arc::new(Mutex::new(State { tls, tail: Vec::new(), unsent: 0, corked: false }));
    (TlsIo { state: state.clone() }, Cork { state })
}

/// Runs the connection future `conn` to its end, corked around each of its polls.
pub async fn corked<F: Future, S: AsyncRead + AsyncWrite + Unpin>(conn: F, cork: Cork<S>) -> F::Output {
    let mut conn = std::pin::pin!(conn);
    std::future::poll_fn(|cx| cork.around(cx, |cx| conn.as_mut().poll(cx))).await
}

impl<S: AsyncRead + AsyncWrite + Unpin> Cork<S> {
    /// Polls `f` (one poll of the connection) with flushes keeping data back, then sends it
    /// all. A socket that cannot take it now has the task's waker: the task runs again (and
    /// sends the rest) when the socket is writable. Errors are the connection's to report.
    pub fn around<T>(&self, cx: &mut Context<'_>, f: impl FnOnce(&mut Context<'_>) -> T) -> T {
        self.state.lock().corked = true;
        let out = f(cx);
        let mut s = self.state.lock();
        s.corked = false;
        let _ = s.send_all(cx);
        out
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> State<S> {
    /// Gets what rustls holds to the socket.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(Pin::new(&mut self.tls).poll_flush(cx))?;
        self.unsent = 0;
        Poll::Ready(Ok(()))
    }

    /// Gives rustls `bufs` (at most `HAND` bytes), its buffer going to the socket first when
    /// they would not fit; how much it took.
    fn give(&mut self, cx: &mut Context<'_>, bufs: &[IoSlice<'_>], len: usize) -> Poll<io::Result<usize>> {
        if self.unsent + len > HAND {
            ready!(self.drain(cx))?;
        }
        let mut took = self.tls.get_mut().1.writer().write_vectored(bufs)?;
        if took == 0 {
            // rustls's own messages filled its buffer: let them out and try once more.
            ready!(self.drain(cx))?;
            took = self.tls.get_mut().1.writer().write_vectored(bufs)?;
            if took == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
        }
        self.unsent += took;
        if !self.corked {
            // Uncorked, what was written goes out now; a full socket keeps it in rustls's
            // buffer (a later write or flush retries), as tokio-rustls does.
            if let Poll::Ready(Err(e)) = self.drain(cx) {
                return Poll::Ready(Err(e));
            }
        }
        Poll::Ready(Ok(took))
    }

    /// Hands rustls the held tail (as one write) and gets everything to the socket.
    fn send_all(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.tail.is_empty() {
            let len = self.tail.len().min(HAND);
            let tail = std::mem::take(&mut self.tail);
            let took = self.give(cx, &[IoSlice::new(&tail[..len])], len);
            self.tail = tail;
            let took = ready!(took)?;
            self.tail.drain(..took);
        }
        // An idle connection (a watch between events) keeps no buffer.
        self.tail = Vec::new();
        self.drain(cx)
    }

    fn write(&mut self, cx: &mut Context<'_>, bufs: &[IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let n: usize = bufs.iter().map(|b| b.len()).sum();
        if n == 0 {
            return Poll::Ready(Ok(0));
        }
        loop {
            let total = self.tail.len() + n;
            if total < RECORD {
                // Not a record's worth yet: keep it (less than one record in all).
                for b in bufs {
                    self.tail.extend_from_slice(b);
                }
                return Poll::Ready(Ok(n));
            }
            let hand = if total > HAND {
                HAND
            } else {
                let full = total / RECORD * RECORD;
                if total - full < TAIL_COPY_MAX {
                    full
                } else {
                    total
                }
            };
            // The tail, then hyper's buffers, cut at `hand` bytes.
            let tail = std::mem::take(&mut self.tail);
            let mut slices = [IoSlice::new(&[]); 33];
            let (mut used, mut left) = (0, hand);
            let parts = std::iter::once(&tail[..]).chain(bufs.iter().map(|b| &b[..]));
            for (slot, b) in slices.iter_mut().zip(parts) {
                if left == 0 {
                    break;
                }
                let take = b.len().min(left);
                *slot = IoSlice::new(&b[..take]);
                left -= take;
                used += 1;
            }
            let given = hand - left;
            let took = self.give(cx, &slices[..used], given);
            self.tail = tail;
            let took = ready!(took)?;
            let from_tail = took.min(self.tail.len());
            self.tail.drain(..from_tail);
            let from_bufs = took - from_tail;
            if took == hand && hand < total && total <= HAND {
                // Every full record went; the short rest of this write is the new tail.
                let mut skip = from_bufs;
                for b in bufs {
                    if skip >= b.len() {
                        skip -= b.len();
                        continue;
                    }
                    self.tail.extend_from_slice(&b[skip..]);
                    skip = 0;
                }
                return Poll::Ready(Ok(n));
            }
            if from_bufs > 0 {
                return Poll::Ready(Ok(from_bufs));
            }
            // rustls took only (part of) the held tail: go on with the rest.
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for TlsIo<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.state.lock().tls).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for TlsIo<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.state.lock().write(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.state.lock().write(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut s = self.state.lock();
        if s.corked {
            // It all goes out when the connection's poll ends (`Cork::around`).
            Poll::Ready(Ok(()))
        } else {
            s.send_all(cx)
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut s = self.state.lock();
        ready!(s.send_all(cx))?;
        Pin::new(&mut s.tls).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    fn testdata(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/testdata/security").join(name)
    }

    /// A transport that notes the length of every TLS record it reads, and counts its writes.
    struct Recorder {
        io: DuplexStream,
        /// Bytes of the record header being parsed, and bytes left of the current record.
        head: Vec<u8>,
        left: usize,
        records: Arc<Mutex<Vec<usize>>>,
        writes: Arc<Mutex<usize>>,
    }

    impl Recorder {
        fn new(io: DuplexStream) -> Recorder {
            Recorder {
                io,
                head: Vec::new(),
                left: 0,
                records: Default::default(),
                writes: Default::default(),
            }
        }
    }

    impl AsyncRead for Recorder {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let before = buf.filled().len();
            ready!(Pin::new(&mut self.io).poll_read(cx, buf))?;
            let this = &mut *self;
            for &b in &buf.filled()[before..] {
                if this.left > 0 {
                    this.left -= 1;
                    continue;
                }
                this.head.push(b);
                if this.head.len() == 5 {
                    this.left = usize::from(u16::from_be_bytes([this.head[3], this.head[4]]));
                    this.records.lock().push(this.left);
                    this.head.clear();
                }
            }
            Poll::Ready(Ok(()))
        }
    }

    impl AsyncWrite for Recorder {
        fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
            *self.writes.lock() += 1;
            Pin::new(&mut self.io).poll_write(cx, buf)
        }
        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            *self.writes.lock() += 1;
            Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
        }
        fn is_write_vectored(&self) -> bool {
            true
        }
        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.io).poll_flush(cx)
        }
        fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.io).poll_shutdown(cx)
        }
    }

    type Client = tokio_rustls::client::TlsStream<Recorder>;

    type Io = TlsIo<Recorder>;

    /// A TLS 1.3 connection over an in-memory pipe of `pipe` bytes: the adapter, its cork, the
    /// client, the lengths of the records the client read and the count of the server's writes.
    async fn connect(pipe: usize) -> (Io, Cork<Recorder>, Client, Arc<Mutex<Vec<usize>>>, Arc<Mutex<usize>>) {
        let files = super::super::tls::TlsFiles {
            cert: testdata("server1.crt"),
            key: testdata("server1.key"),
            client_ca: None,
            reload_interval: Duration::from_secs(10),
        };
        let (server_cfg, _) = super::super::tls::server_config(&files).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        use rustls_pki_types::pem::PemObject;
        for c in rustls_pki_types::CertificateDer::pem_file_iter(testdata("server-ca.crt")).unwrap() {
            roots.add(c.unwrap()).unwrap();
        }
        let client_cfg =
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_protocol_versions(&[&rustls::version::TLS13])
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth();
        let (a, b) = tokio::io::duplex(pipe);
        let (server_io, client_io) = (Recorder::new(a), Recorder::new(b));
        let (records, writes) = (client_io.records.clone(), server_io.writes.clone());
        let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(client_cfg));
        let acceptor = tokio_rustls::TlsAcceptor::from(server_cfg);
        let (server, client) = tokio::join!(acceptor.accept(server_io), connector.connect(name, client_io));
        let (io, cork) = wrap(server.unwrap());
        (io, cork, client.unwrap(), records, writes)
    }

    /// Reads exactly `n` bytes, or fails after 5 s (data held back would never come).
    async fn receive(client: &mut Client, n: usize) -> Vec<u8> {
        let mut got = vec![0; n];
        tokio::time::timeout(Duration::from_secs(5), client.read_exact(&mut got))
            .await
            .expect("the data reached the client")
            .unwrap();
        got
    }

    fn pattern(n: usize, seed: u8) -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    /// One poll of a "connection" that runs `f` on the IO, corked as `listener` does.
    async fn corked_poll<F>(io: &mut Io, cork: &Cork<Recorder>, f: F)
    where
        F: AsyncFnOnce(&mut Io),
    {
        corked(f(io), Cork { state: cork.state.clone() }).await
    }

    #[tokio::test]
    async fn small_writes_then_a_flush_reach_the_peer() {
        let (mut io, _cork, mut client, _, _) = connect(1 << 20).await;
        io.write_all(b"hello ").await.unwrap();
        io.write_all(b"world").await.unwrap();
        io.flush().await.unwrap();
        assert_eq!(receive(&mut client, 11).await, b"hello world");
    }

    #[tokio::test]
    async fn a_big_write_is_delivered_whole() {
        let (mut io, _cork, mut client, _, _) = connect(1 << 20).await;
        let big = pattern(3 << 20, 7);
        let reader = tokio::spawn(async move { receive(&mut client, 3 << 20).await });
        io.write_all(&big).await.unwrap();
        io.flush().await.unwrap();
        assert!(reader.await.unwrap() == big);
    }

    #[tokio::test]
    async fn h2_frames_make_full_records_and_a_corked_flush_is_sent_when_the_poll_ends() {
        let (mut io, cork, mut client, records, writes) = connect(4 << 20).await;
        // The handshake's and tickets' records are behind us once this arrives.
        io.write_all(b"x").await.unwrap();
        io.flush().await.unwrap();
        receive(&mut client, 1).await;
        let (before, writes_before) = (records.lock().len(), *writes.lock());
        // 100 DATA frames as h2 writes them: header and payload in one vectored write, then a
        // flush, all within one poll of the connection.
        let payload = pattern(16 * 1024, 3);
        let header = [0u8, 64, 0, 0, 0, 0, 0, 0, 1];
        corked_poll(&mut io, &cork, async |io: &mut Io| {
            for _ in 0..100 {
                let mut done = 0;
                while done < header.len() + payload.len() {
                    // What an earlier partial write took is not written again.
                    let (h, p) = if done < header.len() {
                        (&header[done..], &payload[..])
                    } else {
                        (&header[..0], &payload[done - header.len()..])
                    };
                    done += io.write_vectored(&[IoSlice::new(h), IoSlice::new(p)]).await.unwrap();
                }
                io.flush().await.unwrap();
            }
        })
        .await;
        let want: Vec<u8> = (0..100).flat_map(|_| header.iter().chain(&payload).copied()).collect();
        assert!(receive(&mut client, want.len()).await == want);
        let sent = records.lock()[before..].to_vec();
        // 100 × 16 393 bytes: 100 full records and one for the rest (900 bytes, held back
        // until the poll ended), where rustls alone makes 200 (16 384 + 9 bytes each).
        let full = 16 * 1024 + 1 + 16; // TLS 1.3: content type and AEAD tag
        assert_eq!(sent.len(), 101, "{sent:?}");
        assert!(sent[..100].iter().all(|&l| l == full), "{sent:?}");
        // And about one write to the socket per four records, instead of one per frame.
        let n = *writes.lock() - writes_before;
        assert!(n <= 100 / 4 + 2, "{n} writes");
    }

    #[tokio::test]
    async fn a_flush_within_a_poll_is_sent_when_the_poll_ends_and_not_later() {
        let (mut io, cork, mut client, _, _) = connect(1 << 20).await;
        for i in 0..3u8 {
            // One watch event per poll: written, flushed, and the connection waits again.
            corked_poll(&mut io, &cork, async |io: &mut Io| {
                io.write_all(&[b'a' + i; 300]).await.unwrap();
                io.flush().await.unwrap();
            })
            .await;
            assert_eq!(receive(&mut client, 300).await, [b'a' + i; 300]);
        }
    }

    #[tokio::test]
    async fn a_stalled_client_stops_the_writer_with_little_buffered() {
        let (mut io, _cork, _client, _, _) = connect(64 * 1024).await;
        let chunk = pattern(64 * 1024, 1);
        let mut accepted = 0;
        // The client reads nothing: writes must stop being accepted.
        while let Ok(n) = tokio::time::timeout(Duration::from_millis(200), io.write(&chunk)).await {
            accepted += n.unwrap();
            assert!(accepted < 1 << 20, "kept accepting: {accepted} bytes");
        }
        // The pipe, rustls's buffer and at most one record held back here.
        assert!(accepted <= 64 * 1024 + HAND + 4096 + RECORD, "{accepted}");
        assert!(io.state.lock().tail.len() < RECORD);
    }
}
