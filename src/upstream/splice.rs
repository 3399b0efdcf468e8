//! The splice of an upgraded session (`kubectl exec` / `attach` / `port-forward`): bytes copied
//! both ways between the caller's and the upstream's upgraded connections until both are done,
//! or until one side has closed and nothing has moved either way for [`HALF_CLOSED_IDLE`].
//!
//! Without that bound a caller that half-closes (sends its FIN) and goes away, while the
//! upstream's session stays open and quiet, would hold the session's two connection slots and
//! its per-user slot until the upstream gave up (a kubelet's streaming idle timeout: 4 h by
//! default). A session whose two sides are both open is never ended here: an idle interactive
//! shell is the kubelet's to time out.
//!
//! Called by `forward` when the upstream switches protocols, in its own task.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// How long a session may stay quiet both ways once one side has closed its half.
pub const HALF_CLOSED_IDLE: Duration = Duration::from_secs(5 * 60);

/// How a splice ended.
#[derive(Debug)]
pub enum Ended {
    /// Both sides closed: bytes copied to the upstream and to the caller.
    Closed { to_upstream: u64, to_caller: u64 },
    /// A read or write failed.
    Failed(io::Error),
    /// One side had closed and nothing moved for [`HALF_CLOSED_IDLE`].
    QuietAfterClose,
}

/// Copies between `caller` and `upstream` (see the module doc); `idle` is
/// [`HALF_CLOSED_IDLE`] but for tests.
pub async fn splice<A, B>(caller: A, upstream: B, idle: Duration) -> Ended
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let activity = Arc::new(Mutex::new(Activity { last: Instant::now(), closed: false }));
    let mut caller = Watched { io: caller, activity: activity.clone() };
    let mut upstream = Watched { io: upstream, activity: activity.clone() };
    tokio::select! {
        copied = tokio::io::copy_bidirectional(&mut caller, &mut upstream) => match copied {
            Ok((to_upstream, to_caller)) => Ended::Closed { to_upstream, to_caller },
            Err(e) => Ended::Failed(e),
        },
        () = quiet_after_close(&activity, idle) => Ended::QuietAfterClose,
    }
}

/// When the last byte moved either way, and whether either side has closed its half.
struct Activity {
    last: Instant,
    closed: bool,
}

/// Returns once a side has closed and nothing has moved for `idle`.
async fn quiet_after_close(activity: &Mutex<Activity>, idle: Duration) {
    loop {
        let (last, closed) = {
            let a = activity.lock();
            (a.last, a.closed)
        };
        if !closed {
            // Looked at again later: a close is noticed within a quarter of `idle`, and the
            // bound still counts from the last byte.
            tokio::time::sleep(idle / 4).await;
            continue;
        }
        if Instant::now() >= last + idle {
            return;
        }
        tokio::time::sleep_until(last + idle).await;
    }
}

/// One side's connection, noting each byte read or written and its end of input.
struct Watched<T> {
    io: T,
    activity: Arc<Mutex<Activity>>,
}

impl<T> Watched<T> {
    fn moved(&self, eof: bool) {
        let mut a = self.activity.lock();
        a.last = Instant::now();
        a.closed |= eof;
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            let eof = buf.filled().len() == before && buf.remaining() > 0;
            self.moved(eof);
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, data);
        if let Poll::Ready(Ok(n)) = polled {
            if n > 0 {
                self.moved(false);
            }
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = polled {
            if n > 0 {
                self.moved(false);
            }
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const IDLE: Duration = HALF_CLOSED_IDLE;

    /// A splice between two in-memory connections: (the caller's end, the upstream's end, the
    /// splice's task).
    fn session() -> (tokio::io::DuplexStream, tokio::io::DuplexStream, tokio::task::JoinHandle<Ended>) {
        let (caller, caller_side) = tokio::io::duplex(1024);
        let (upstream_side, upstream) = tokio::io::duplex(1024);
        let task = tokio::spawn(splice(caller_side, upstream_side, IDLE));
        (caller, upstream, task)
    }

    async fn pass(from: &mut tokio::io::DuplexStream, to: &mut tokio::io::DuplexStream) {
        from.write_all(b"ping").await.unwrap();
        let mut got = [0u8; 4];
        to.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping");
    }

    #[tokio::test(start_paused = true)]
    async fn a_session_open_both_ways_is_never_ended_for_being_quiet() {
        let (mut caller, mut upstream, task) = session();
        pass(&mut caller, &mut upstream).await;
        tokio::time::sleep(IDLE * 20).await;
        assert!(!task.is_finished(), "an idle shell is the kubelet's to time out");
        pass(&mut upstream, &mut caller).await;
        // Both close: the splice ends with what it copied.
        caller.shutdown().await.unwrap();
        upstream.shutdown().await.unwrap();
        let ended = tokio::time::timeout(IDLE, task).await.expect("ended").unwrap();
        assert!(matches!(ended, Ended::Closed { to_upstream: 4, to_caller: 4 }), "{ended:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_caller_that_half_closes_and_goes_quiet_ends_the_session_after_the_bound() {
        let (mut caller, mut upstream, task) = session();
        pass(&mut caller, &mut upstream).await;
        caller.shutdown().await.unwrap();
        // The upstream sees the caller's end of input, and stays open, quiet.
        let mut rest = Vec::new();
        upstream.read_to_end(&mut rest).await.unwrap();
        let closed_at = Instant::now();
        // The upstream's output still flows to the caller, and keeps the session going.
        for _ in 0..3 {
            tokio::time::sleep(IDLE / 2).await;
            pass(&mut upstream, &mut caller).await;
        }
        assert!(!task.is_finished(), "bytes moved within the bound");
        let last = Instant::now();
        tokio::time::sleep(IDLE - Duration::from_secs(1)).await;
        assert!(!task.is_finished(), "ended before the bound");
        let ended = tokio::time::timeout(IDLE * 10, task).await.expect("ended").unwrap();
        assert!(matches!(ended, Ended::QuietAfterClose), "{ended:?}");
        assert_eq!(Instant::now() - last, IDLE, "counted from the last byte");
        assert!(Instant::now() - closed_at > IDLE, "not from the close");
        // Both of the proxy's ends are dropped: the caller sees its end of input too.
        let mut tail = Vec::new();
        assert_eq!(caller.read_to_end(&mut tail).await.unwrap(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn an_upstream_that_closes_while_the_caller_stays_quiet_ends_the_session_too() {
        let (mut caller, mut upstream, task) = session();
        pass(&mut upstream, &mut caller).await;
        upstream.shutdown().await.unwrap();
        let mut rest = Vec::new();
        caller.read_to_end(&mut rest).await.unwrap();
        tokio::time::sleep(IDLE * 3).await;
        assert!(task.is_finished());
        assert!(matches!(task.await.unwrap(), Ended::QuietAfterClose));
    }
}
