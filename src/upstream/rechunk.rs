//! Re-chunking of forwarded bodies: consecutive DATA frames that are already available are
//! joined (up to [`TARGET`] bytes) before they go on, so an upstream that streams a LIST as
//! hundreds of small chunks (one per item) costs the caller's connection a few large writes
//! instead of one write per chunk. Bytes and their order are unchanged; data is never held back
//! waiting for the upstream (only what is ready now is joined). Trailers pass through.
//!
//! Used by `upstream::forward` for every forwarded response.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};

/// Joined frames grow up to about this many bytes.
pub const TARGET: usize = 64 * 1024;

/// Frames a pump may read ahead of the caller's connection.
const PUMP_FRAMES: usize = 64;

/// Bytes a pump may read ahead of the caller's connection (beside the one frame it holds while
/// it waits): a client that reads slowly holds this much per forwarded stream, not
/// [`PUMP_FRAMES`] frames of whatever size the upstream's decoder hands over (an HTTP/1.1
/// chunk can be hundreds of KiB).
pub const PUMP_BYTES: usize = 256 * 1024;

/// The pump joins frames smaller than this that follow one another at once ([`gather`]);
/// larger ones (an HTTP/2 upstream's 16 KiB DATA frames) leave the pump as they are: joining
/// them would copy each for no fewer writes worth having. (The re-chunker on the caller's side
/// still joins ready frames up to [`TARGET`].)
const GATHER_BELOW: usize = 8 * 1024;

/// The boxed error of pumped bodies.
pub type PumpError = Box<dyn std::error::Error + Send + Sync>;

/// A forwarded body read ahead by a task of its own (at most [`PUMP_FRAMES`] frames and
/// [`PUMP_BYTES`] bytes), joined as it comes ([`gather`]), then re-chunked. hyper's client
/// hands a body over one chunk at a time and decodes the next only when the previous one was
/// taken, so without the pump no two chunks are ever ready together.
/// The pump ends when the body ends or the caller goes away (at once, even while the upstream
/// sends nothing).
pub fn pumped<B>(mut body: B) -> Rechunk<impl Body<Data = Bytes, Error = PumpError> + Unpin>
where
    B: Body + Unpin + Send + 'static,
    B::Data: Buf + Send,
    B::Error: Into<PumpError> + Send,
{
    use http_body_util::BodyExt;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(Result<Frame<Bytes>, PumpError>, u32)>(PUMP_FRAMES);
    // Bytes in the channel: taken by the pump before it sends a frame, given back when the
    // frame is taken out.
    let budget = std::sync::Arc::new(tokio::sync::Semaphore::new(PUMP_BYTES));
    let room = budget.clone();
    tokio::spawn(async move {
        // A frame read past the data joined before it (trailers, an error, the end).
        let mut after: Option<Pumped> = None;
        loop {
            // A caller gone (its body dropped, or cut at the write stall) ends the pump at once,
            // not at the upstream's next frame: an idle watch's next frame may never come, and
            // until the pump ends the upstream stream and its lane slot stay open.
            let f = match after.take() {
                Some(f) => f,
                None => tokio::select! {
                    biased;
                    _ = tx.closed() => return,
                    f = body.frame() => f.map(owned::<B>),
                },
            };
            let Some(mut f) = f else { return };
            if let Some(d) = f.as_mut().ok().and_then(Frame::data_mut).filter(|d| d.len() < GATHER_BELOW) {
                let (joined, past) = gather(&mut body, std::mem::take(d)).await;
                *d = joined;
                after = past;
            }
            let end = f.is_err();
            let len = f.as_ref().ok().and_then(Frame::data_ref).map_or(0, Bytes::len);
            // At most the whole budget: a frame larger than it goes alone.
            let n = len.min(PUMP_BYTES) as u32;
            if n > 0 {
                let permit = tokio::select! {
                    biased;
                    _ = tx.closed() => return,
                    p = room.acquire_many(n) => p,
                };
                match permit {
                    Ok(p) => p.forget(),
                    Err(_) => return,
                }
            }
            if tx.send((f, n)).await.is_err() || end {
                return;
            }
        }
    });
    let frames = futures_util::stream::poll_fn(move |cx| {
        rx.poll_recv(cx).map(|f| {
            f.map(|(f, n)| {
                budget.add_permits(n as usize);
                f
            })
        })
    });
    Rechunk::new(http_body_util::StreamBody::new(frames))
}

/// A frame as the pump passes it on (`None`: the body ended).
type Pumped = Option<Result<Frame<Bytes>, PumpError>>;

/// An upstream body's frame with its data as `Bytes` and its error boxed.
fn owned<B>(f: Result<Frame<B::Data>, B::Error>) -> Result<Frame<Bytes>, PumpError>
where
    B: Body,
    B::Error: Into<PumpError>,
{
    f.map_err(Into::into).map(|f| f.map_data(|mut d| d.copy_to_bytes(d.remaining())))
}

/// `first` joined with the small data frames that follow it at once (up to [`TARGET`] bytes),
/// and the frame read past them: not data, [`GATHER_BELOW`] or larger, or one that would pass
/// the target. "At once": ready now, or after one yield —
/// hyper's HTTP/1.1 client decodes a chunk only when the previous one was taken, in the
/// connection's own task, which the yield lets run. Before, every chunk (one per item of a
/// LIST from some upstreams, ~2–4 KB) went through the channel alone and woke the caller's
/// connection: a forwarded 30 MB LIST cost the proxy ~2× the CPU.
async fn gather<B>(body: &mut B, first: Bytes) -> (Bytes, Option<Pumped>)
where
    B: Body + Unpin,
    B::Data: Buf,
    B::Error: Into<PumpError>,
{
    use futures_util::FutureExt;
    use http_body_util::BodyExt;
    let mut single = Some(first);
    let mut joined = BytesMut::new();
    let take = |single: Option<Bytes>, joined: BytesMut| single.unwrap_or_else(|| joined.freeze());
    // Empty frames count too: endless ones end the gathering.
    let mut empty = 0;
    while single.as_ref().map_or(joined.len(), Bytes::len) < TARGET && empty < PUMP_FRAMES {
        let ready = match body.frame().now_or_never() {
            Some(f) => Some(f),
            None => {
                tokio::task::yield_now().await;
                body.frame().now_or_never()
            }
        };
        let Some(f) = ready else { break };
        match f.map(owned::<B>) {
            Some(Ok(f)) if f.is_data() => {
                let d = f.into_data().unwrap_or_default();
                if d.is_empty() {
                    empty += 1;
                    continue;
                }
                // A large frame, or one past the target, goes on by itself, uncopied.
                let pending = single.as_ref().map_or(joined.len(), Bytes::len);
                if d.len() >= GATHER_BELOW || pending + d.len() > TARGET {
                    return (take(single, joined), Some(Some(Ok(Frame::data(d)))));
                }
                if let Some(s) = single.take() {
                    joined.reserve(TARGET.max(s.len() + d.len()));
                    joined.extend_from_slice(&s);
                }
                joined.extend_from_slice(&d);
            }
            other => return (take(single, joined), Some(other)),
        }
    }
    (take(single, joined), None)
}

/// A body whose ready DATA frames are joined.
pub struct Rechunk<B: Body> {
    inner: B,
    /// Data read and not yet passed on: one frame as it came, or several joined.
    single: Option<Bytes>,
    joined: BytesMut,
    /// A frame read past the pending data (trailers, or data that would overflow `TARGET`).
    held: Option<Frame<Bytes>>,
    /// An error read after pending data: returned after it, so a truncated body still ends in
    /// an error, never cleanly.
    failed: Option<B::Error>,
    done: bool,
}

impl<B: Body> Rechunk<B> {
    pub fn new(inner: B) -> Self {
        Rechunk { inner, single: None, joined: BytesMut::new(), held: None, failed: None, done: false }
    }

    fn pending_len(&self) -> usize {
        self.single.as_ref().map_or(0, Bytes::len) + self.joined.len()
    }

    fn push(&mut self, d: Bytes) {
        if self.pending_len() == 0 {
            self.single = Some(d);
            return;
        }
        if let Some(first) = self.single.take() {
            self.joined.reserve(TARGET);
            self.joined.extend_from_slice(&first);
        }
        self.joined.extend_from_slice(&d);
    }

    fn take(&mut self) -> Option<Bytes> {
        match self.single.take() {
            Some(d) => Some(d),
            None if !self.joined.is_empty() => Some(self.joined.split().freeze()),
            None => None,
        }
    }
}

// Nothing is pinned structurally: `inner` is `Unpin`, the rest is plain data.
impl<B: Body + Unpin> Unpin for Rechunk<B> {}

impl<B> Body for Rechunk<B>
where
    B: Body + Unpin,
    B::Data: Buf,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        loop {
            if let Some(f) = this.held.take() {
                if this.pending_len() > 0 {
                    this.held = Some(f);
                    break;
                }
                match f.into_data() {
                    Ok(d) => this.push(d),
                    Err(trailers) => return Poll::Ready(Some(Ok(trailers))),
                }
                continue;
            }
            if let Some(e) = this.failed.take() {
                if this.pending_len() > 0 {
                    this.failed = Some(e);
                    break;
                }
                return Poll::Ready(Some(Err(e)));
            }
            if this.done {
                break;
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(f))) => match f.into_data() {
                    Ok(mut d) => {
                        let d = d.copy_to_bytes(d.remaining());
                        if d.is_empty() {
                            continue;
                        }
                        if this.pending_len() > 0 && this.pending_len() + d.len() > TARGET {
                            this.held = Some(Frame::data(d));
                            break;
                        }
                        this.push(d);
                        if this.pending_len() >= TARGET {
                            break;
                        }
                    }
                    Err(other) => {
                        // Not data: trailers (the only other kind of frame).
                        if let Ok(t) = other.into_trailers() {
                            this.held = Some(Frame::trailers(t));
                        }
                    }
                },
                Poll::Ready(Some(Err(e))) => {
                    this.done = true;
                    this.failed = Some(e);
                }
                Poll::Ready(None) => this.done = true,
                Poll::Pending => {
                    if this.pending_len() == 0 {
                        return Poll::Pending;
                    }
                    break;
                }
            }
        }
        match this.take() {
            Some(d) => Poll::Ready(Some(Ok(Frame::data(d)))),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.held.is_none() && self.failed.is_none() && self.pending_len() == 0
    }

    fn size_hint(&self) -> SizeHint {
        if self.held.is_some() || self.pending_len() > 0 {
            return SizeHint::default();
        }
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use futures_util::stream;
    use http_body_util::{BodyExt, StreamBody};

    use super::*;

    type Frames = Vec<Result<Frame<Bytes>, Infallible>>;
    type Framed = StreamBody<stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>>>;

    fn body(frames: Frames) -> Rechunk<Framed> {
        Rechunk::new(StreamBody::new(stream::iter(frames)))
    }

    async fn frames_of<B: Body<Data = Bytes> + Unpin>(mut b: B) -> Vec<Frame<Bytes>>
    where
        B::Error: std::fmt::Debug,
    {
        let mut out = Vec::new();
        while let Some(f) = b.frame().await {
            out.push(f.unwrap());
        }
        out
    }

    #[tokio::test]
    async fn ready_small_frames_are_joined_in_order_up_to_the_target() {
        let items: Frames = (0..1000).map(|i| Ok(Frame::data(Bytes::from(format!("{i:0100}"))))).collect();
        let expected: Vec<u8> = (0..1000).flat_map(|i| format!("{i:0100}").into_bytes()).collect();
        let frames = frames_of(body(items)).await;
        assert!(frames.len() <= 3, "{} frames for 100 KB of ready data", frames.len());
        assert!(frames.iter().all(|f| f.data_ref().unwrap().len() <= TARGET));
        let got: Vec<u8> = frames.into_iter().flat_map(|f| f.into_data().unwrap().to_vec()).collect();
        assert_eq!(got, expected);
    }

    #[tokio::test]
    async fn a_large_frame_passes_alone_and_trailers_come_last() {
        let big = Bytes::from(vec![b'x'; TARGET + 10]);
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", "0".parse().unwrap());
        let frames = frames_of(body(vec![
            Ok(Frame::data(Bytes::from_static(b"a"))),
            Ok(Frame::data(big.clone())),
            Ok(Frame::data(Bytes::from_static(b"b"))),
            Ok(Frame::trailers(trailers.clone())),
        ]))
        .await;
        assert_eq!(frames.len(), 4);
        assert_eq!(frames[0].data_ref().unwrap(), &Bytes::from_static(b"a"));
        assert_eq!(frames[1].data_ref().unwrap(), &big);
        assert_eq!(frames[2].data_ref().unwrap(), &Bytes::from_static(b"b"));
        assert_eq!(frames[3].trailers_ref().unwrap(), &trailers);
    }

    #[tokio::test]
    async fn an_error_after_joined_data_still_ends_the_body_in_error() {
        let frames: Vec<Result<Frame<Bytes>, &'static str>> = vec![
            Ok(Frame::data(Bytes::from_static(b"a"))),
            Ok(Frame::data(Bytes::from_static(b"b"))),
            Err("upstream reset"),
        ];
        let mut b = Rechunk::new(StreamBody::new(stream::iter(frames)));
        assert_eq!(b.frame().await.unwrap().unwrap().into_data().unwrap(), Bytes::from_static(b"ab"));
        assert_eq!(b.frame().await.unwrap().unwrap_err(), "upstream reset");
        assert!(b.frame().await.is_none());
    }

    #[tokio::test]
    async fn what_is_ready_goes_at_once_without_waiting_for_more() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(8);
        let mut b = Rechunk::new(StreamBody::new(tokio_stream_from(rx)));
        tx.send(Ok(Frame::data(Bytes::from_static(b"one")))).await.unwrap();
        tx.send(Ok(Frame::data(Bytes::from_static(b"two")))).await.unwrap();
        let f = b.frame().await.unwrap().unwrap();
        assert_eq!(f.into_data().unwrap(), Bytes::from_static(b"onetwo"));
        // Nothing ready: the body waits (does not end, does not spin).
        let pending = tokio::time::timeout(std::time::Duration::from_millis(20), b.frame()).await;
        assert!(pending.is_err(), "nothing was ready");
        tx.send(Ok(Frame::data(Bytes::from_static(b"three")))).await.unwrap();
        drop(tx);
        assert_eq!(b.frame().await.unwrap().unwrap().into_data().unwrap(), Bytes::from_static(b"three"));
        assert!(b.frame().await.is_none());
    }

    /// A caller that takes nothing: the pump reads at most its byte budget (and the frame it
    /// waits with) from the upstream's body, however many frames that is.
    #[tokio::test(start_paused = true)]
    async fn the_pump_reads_ahead_at_most_its_byte_budget() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let chunk = 48 * 1024;
        let read = std::sync::Arc::new(AtomicUsize::new(0));
        let counted = read.clone();
        let source = stream::iter((0..64).map(move |_| {
            counted.fetch_add(chunk, Ordering::Relaxed);
            Ok::<_, Infallible>(Frame::data(Bytes::from(vec![b'x'; chunk])))
        }));
        let mut b = pumped(StreamBody::new(source));
        // Every task idle before the clock moves: the pump has read all it may.
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        let ahead = read.load(Ordering::Relaxed);
        assert!(ahead <= PUMP_BYTES + chunk, "read {ahead} bytes ahead of a caller that took nothing");
        assert!(ahead >= PUMP_BYTES - chunk, "read ahead only {ahead} bytes");
        // Taken out, the budget comes back: the rest is read and comes in order, whole.
        let mut got = 0;
        while let Some(f) = b.frame().await {
            got += f.unwrap().into_data().unwrap().len();
        }
        assert_eq!(got, 64 * chunk);
        assert_eq!(read.load(Ordering::Relaxed), 64 * chunk);
    }

    /// An upstream body that has its next chunk only once its own task ran (hyper's HTTP/1.1
    /// client: a chunk is decoded when the previous one was taken): the pump joins the chunks
    /// that come at once, so a caller reading as fast as they come gets few large frames, not
    /// one per chunk.
    #[tokio::test]
    async fn chunks_an_upstream_task_hands_over_one_by_one_are_joined_by_the_pump() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(1);
        tokio::spawn(async move {
            for i in 0..1000 {
                let chunk = Ok(Frame::data(Bytes::from(format!("{i:0100}"))));
                if tx.send(chunk).await.is_err() {
                    return;
                }
            }
        });
        let frames = frames_of(pumped(StreamBody::new(tokio_stream_from(rx)))).await;
        let expected: Vec<u8> = (0..1000).flat_map(|i| format!("{i:0100}").into_bytes()).collect();
        assert!(
            frames.len() <= 4,
            "{} frames for 100 KB handed over one 100-byte chunk at a time",
            frames.len()
        );
        let got: Vec<u8> = frames.into_iter().flat_map(|f| f.into_data().unwrap().to_vec()).collect();
        assert_eq!(got, expected);
    }

    /// Endless empty frames do not hold the pump in its gathering: the data before them goes.
    #[tokio::test]
    async fn endless_empty_frames_end_the_gathering() {
        let first = stream::iter([Ok::<_, Infallible>(Frame::data(Bytes::from_static(b"a")))]);
        let empties = stream::repeat_with(|| Ok::<_, Infallible>(Frame::data(Bytes::new())));
        let mut b = pumped(StreamBody::new(futures_util::StreamExt::chain(first, empties)));
        let f = tokio::time::timeout(std::time::Duration::from_secs(5), b.frame()).await.expect("not held");
        assert_eq!(f.unwrap().unwrap().into_data().unwrap(), Bytes::from_static(b"a"));
    }

    /// A frame too large to gather, or one past the target, is handed back, not copied in.
    #[tokio::test]
    async fn a_large_frame_is_not_gathered() {
        let big = Bytes::from(vec![b'x'; GATHER_BELOW]);
        let frames: Vec<Result<Frame<Bytes>, Infallible>> =
            vec![Ok(Frame::data(Bytes::from_static(b"b"))), Ok(Frame::data(big.clone()))];
        let mut body = StreamBody::new(stream::iter(frames));
        let (joined, past) = gather(&mut body, Bytes::from_static(b"a")).await;
        assert_eq!(joined, Bytes::from_static(b"ab"));
        let past = past.flatten().unwrap().unwrap().into_data().unwrap();
        assert_eq!(past, big);
        // Small frames past the target: the one that would overflow it is handed back.
        let small = Bytes::from(vec![b'y'; GATHER_BELOW - 1]);
        let frames: Vec<Result<Frame<Bytes>, Infallible>> =
            (0..TARGET / small.len() + 2).map(|_| Ok(Frame::data(small.clone()))).collect();
        let mut body = StreamBody::new(stream::iter(frames));
        let (joined, past) = gather(&mut body, small.clone()).await;
        assert!(joined.len() <= TARGET && joined.len() + small.len() > TARGET, "{}", joined.len());
        assert_eq!(past.flatten().unwrap().unwrap().into_data().unwrap(), small);
    }

    /// Trailers and an error read past joined data still come after it, in order.
    #[tokio::test]
    async fn what_the_pump_reads_past_joined_data_comes_after_it() {
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", "0".parse().unwrap());
        let frames: Vec<Result<Frame<Bytes>, &'static str>> = vec![
            Ok(Frame::data(Bytes::from_static(b"a"))),
            Ok(Frame::data(Bytes::from_static(b"b"))),
            Ok(Frame::trailers(trailers.clone())),
        ];
        let got = frames_of(pumped(StreamBody::new(stream::iter(frames)))).await;
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].data_ref().unwrap(), &Bytes::from_static(b"ab"));
        assert_eq!(got[1].trailers_ref().unwrap(), &trailers);
        let frames: Vec<Result<Frame<Bytes>, &'static str>> = vec![
            Ok(Frame::data(Bytes::from_static(b"a"))),
            Ok(Frame::data(Bytes::from_static(b"b"))),
            Err("reset"),
        ];
        let mut b = pumped(StreamBody::new(stream::iter(frames)));
        assert_eq!(b.frame().await.unwrap().unwrap().into_data().unwrap(), Bytes::from_static(b"ab"));
        assert_eq!(b.frame().await.unwrap().unwrap_err().to_string(), "reset");
        assert!(b.frame().await.is_none());
    }

    fn tokio_stream_from<T: Send + 'static>(
        mut rx: tokio::sync::mpsc::Receiver<T>,
    ) -> impl futures_util::Stream<Item = T> + Unpin {
        Box::pin(futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)))
    }
}
