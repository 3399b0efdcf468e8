//! Write batching for HTTP/2 connections: what the connection writes during one poll of its
//! task goes to the socket as one write at the end of that poll, not as one write per frame.
//!
//! The h2 crate writes every DATA frame of 256 bytes or more with its own `writev` and flushes
//! after it; when one event reaches the 100 watches of a connection, that was 100 writes (and
//! over TLS 200 records, see `server::tlsio`). [`Batched`] takes the
//! connection's writes into one buffer (up to [`MAX_BATCH`]) and its flushes as no-ops;
//! [`Flusher`] writes the buffer out, and `coalesce::Coalesce` calls it after every poll of the
//! connection future — so nothing waits past the poll that wrote it, and a full buffer waits
//! for the socket (the connection sees `Pending`, its usual backpressure). Shutdown writes
//! everything out first.
//!
//! Built by `server::listener` for plain HTTP/2 connections (TLS ones get the same from
//! `server::tlsio`, which also keeps records full); HTTP/1.1 responses are one stream per
//! connection and are written as they come.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The most a connection buffers before its writes wait for the socket; a write at least this
/// large with nothing buffered goes straight through.
pub const MAX_BATCH: usize = 64 * 1024;
/// A drained buffer larger than this is freed (an idle connection keeps no batch memory).
const KEEP: usize = 8 * 1024;

struct State<T> {
    io: T,
    buf: Vec<u8>,
    /// Bytes of `buf` already written.
    sent: usize,
    /// A failed write out: the connection's next write or flush fails with it.
    failed: Option<io::ErrorKind>,
}

impl<T: AsyncWrite + Unpin> State<T> {
    /// Writes the whole buffer; `Pending` (the socket's waker registered) while it cannot.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(kind) = self.failed {
            return Poll::Ready(Err(kind.into()));
        }
        while self.sent < self.buf.len() {
            let n = match ready!(Pin::new(&mut self.io).poll_write(cx, &self.buf[self.sent..])) {
                Ok(0) => Err(io::ErrorKind::WriteZero.into()),
                r => r,
            };
            match n {
                Ok(n) => self.sent += n,
                Err(e) => {
                    self.failed = Some(e.kind());
                    return Poll::Ready(Err(e));
                }
            }
        }
        self.sent = 0;
        if self.buf.capacity() > KEEP {
            self.buf = Vec::new();
        } else {
            self.buf.clear();
        }
        Poll::Ready(Ok(()))
    }

    /// Makes room for `len` more bytes: drains first when they would not fit.
    fn poll_room(&mut self, cx: &mut Context<'_>, len: usize) -> Poll<io::Result<()>> {
        if !self.buf.is_empty() && self.buf.len() + len > MAX_BATCH {
            ready!(self.poll_drain(cx))?;
        }
        Poll::Ready(Ok(()))
    }
}

/// The connection's side: an IO whose writes are batched until the [`Flusher`] runs.
pub struct Batched<T> {
    state: Arc<Mutex<State<T>>>,
}

/// The task's side: writes out what the connection wrote (see the module documentation).
pub struct Flusher<T> {
    state: Arc<Mutex<State<T>>>,
}

/// Wraps `io`; the two halves share it.
pub fn batched<T>(io: T) -> (Batched<T>, Flusher<T>) {
    let state = Arc::new(Mutex::new(State { io, buf: Vec::new(), sent: 0, failed: None }));
    (Batched { state: state.clone() }, Flusher { state })
}

impl<T: AsyncWrite + Unpin> Flusher<T> {
    /// Writes out the batch and flushes the IO; `Pending` while the socket is full.
    pub fn poll_flush(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut st = self.state.lock();
        ready!(st.poll_drain(cx))?;
        Pin::new(&mut st.io).poll_flush(cx)
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Batched<T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.state.lock().io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Batched<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let mut st = self.state.lock();
        ready!(st.poll_room(cx, data.len()))?;
        if st.buf.is_empty() && data.len() >= MAX_BATCH {
            return Pin::new(&mut st.io).poll_write(cx, data);
        }
        st.buf.extend_from_slice(data);
        Poll::Ready(Ok(data.len()))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        let mut st = self.state.lock();
        ready!(st.poll_room(cx, len))?;
        if st.buf.is_empty() && len >= MAX_BATCH {
            return Pin::new(&mut st.io).poll_write_vectored(cx, bufs);
        }
        st.buf.reserve(len);
        bufs.iter().for_each(|b| st.buf.extend_from_slice(b));
        Poll::Ready(Ok(len))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    /// Deferred: the [`Flusher`] writes the batch when the connection's poll ends (a failure
    /// to do so is reported here).
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.state.lock().failed {
            Some(kind) => Poll::Ready(Err(kind.into())),
            None => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut st = self.state.lock();
        ready!(st.poll_drain(cx))?;
        ready!(Pin::new(&mut st.io).poll_flush(cx))?;
        Pin::new(&mut st.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;
    use std::future::poll_fn;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn writes_reach_the_peer_only_when_flushed_and_then_in_one_piece() {
        let (a, mut b) = tokio::io::duplex(1 << 20);
        let (mut w, f) = batched(a);
        w.write_all(b"frame-1;").await.unwrap();
        w.write_all(b"frame-2;").await.unwrap();
        w.flush().await.unwrap(); // deferred: nothing reached the peer yet
        let mut buf = [0u8; 64];
        assert!(b.read(&mut buf).now_or_never().is_none(), "nothing before the flusher runs");
        poll_fn(|cx| f.poll_flush(cx)).await.unwrap();
        let n = b.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"frame-1;frame-2;", "both frames in one read");
    }

    #[tokio::test]
    async fn a_full_batch_waits_for_the_socket_and_loses_nothing() {
        // The peer's pipe holds 1 KiB: the batch cannot drain until the peer reads.
        let (a, mut b) = tokio::io::duplex(1024);
        let (mut w, f) = batched(a);
        let writer = tokio::spawn(async move {
            for i in 0..200u32 {
                let chunk = vec![(i % 251) as u8; 1000];
                w.write_all(&chunk).await.unwrap();
                // What a connection task does after each poll.
                poll_fn(|cx| match f.poll_flush(cx) {
                    Poll::Pending => Poll::Ready(()),
                    Poll::Ready(r) => {
                        r.unwrap();
                        Poll::Ready(())
                    }
                })
                .await;
            }
            w.shutdown().await.unwrap(); // drains what is left
        });
        let mut got = Vec::new();
        b.read_to_end(&mut got).await.unwrap();
        writer.await.unwrap();
        assert_eq!(got.len(), 200 * 1000);
        for (i, c) in got.chunks(1000).enumerate() {
            assert!(c.iter().all(|&x| x == (i % 251) as u8), "chunk {i} in order and whole");
        }
    }

    #[tokio::test]
    async fn a_large_write_with_nothing_buffered_goes_straight_through() {
        let (a, mut b) = tokio::io::duplex(1 << 20);
        let (mut w, _f) = batched(a);
        let big = vec![7u8; MAX_BATCH];
        let n = w.write(&big).await.unwrap();
        assert!(n > 0);
        let mut buf = vec![0u8; MAX_BATCH];
        let got = b.read(&mut buf).await.unwrap();
        assert_eq!(got, n, "written to the IO at once, without the flusher");
    }

    #[tokio::test]
    async fn a_failed_write_out_fails_the_connections_next_write() {
        let (a, b) = tokio::io::duplex(1024);
        drop(b); // the peer is gone
        let (mut w, f) = batched(a);
        w.write_all(b"event").await.unwrap();
        assert!(poll_fn(|cx| f.poll_flush(cx)).await.is_err());
        assert!(w.flush().await.is_err(), "the connection learns of it");
        assert!(w.write_all(&[0u8; MAX_BATCH]).await.is_err());
    }
}
