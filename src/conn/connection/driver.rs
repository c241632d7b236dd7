//! The driver task of a [`Connection`](super::Connection) and the state it shares with
//! the handles.
//!
//! The driver owns the stream (plain TCP, TLS or whatever the dialer opened), split into
//! a read half and a write half driven concurrently: the writer takes [`Command`]s off the
//! channel, records each request in the in-flight map (correlation id → reply, response
//! header version, permit) and writes its frame whole (vectored, splices and all); the
//! reader reads size-prefixed response frames (large ones into pooled buffers) and
//! [`State::dispatch`]es each to its request. Any failure kills the connection:
//! [`State::fail`] records the first reason and fails every pending request.
//!
//! May not: encode requests or choose versions (`requests.rs`, `versions.rs`); it reports
//! throttle times to `throttle.rs` and waits while one runs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, Notify, OwnedSemaphorePermit, Semaphore};
use tracing::{debug, trace, warn};

use super::lock;
use super::throttle::Throttle;
use crate::bufpool::BufPool;
use crate::error::{Error, ErrorKind, Result};
use crate::protocol::{throttle, ApiKey, ResponseHeader, Splices};

/// Why the connection died; turned into an [`Error`] for every affected request.
#[derive(Debug, Clone)]
pub(super) struct Failure {
    pub(super) kind: ErrorKind,
    pub(super) message: String,
}

impl Failure {
    pub(super) fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Failure {
            kind,
            message: message.into(),
        }
    }
}

/// State shared by the handles and the driver task.
pub(super) struct State {
    pub(super) broker: String,
    pub(super) in_flight: Arc<Semaphore>,
    pub(super) pending: Mutex<HashMap<i32, Pending>>,
    /// Correlation ids of recent requests sent without expecting a response (acks=0
    /// produce). Some brokers (tansu 0.6) answer them anyway; such a reply is discarded
    /// rather than treated as garbage. Bounded to [`UNANSWERED_MEMORY`] entries.
    pub(super) unanswered: Mutex<std::collections::VecDeque<i32>>,
    pub(super) failure: Mutex<Option<Failure>>,
    /// Buffers of large frames already written, for the next requests (at most
    /// [`SPARE_FRAMES`]): a stream of megabyte produce requests then fills memory it
    /// touched before instead of fresh pages.
    pub(super) spare_frames: Mutex<Vec<BytesMut>>,
    pub(super) shutdown: Notify,
    /// The quota throttle (KIP-219) the broker asked for.
    pub(super) throttle: Mutex<Throttle>,
}

/// Frame buffers kept per connection for reuse.
const SPARE_FRAMES: usize = 2;
/// Only frames at least this large are kept.
const SPARE_FRAME_MIN: usize = 64 * 1024;

impl State {
    /// An empty buffer for a frame: a reused one if any.
    pub(super) fn frame_buffer(&self) -> BytesMut {
        match lock(&self.spare_frames).pop() {
            Some(mut buf) => {
                buf.clear();
                buf
            }
            None => BytesMut::with_capacity(128),
        }
    }

    /// A frame is written: keep its buffer if it is large and nothing else holds it. The
    /// buffer's capacity counts, not the frame's length: a small request written into a
    /// reused large buffer hands that buffer back.
    fn recycle(&self, frame: Bytes) {
        let Ok(buf) = frame.try_into_mut() else {
            return;
        };
        if buf.capacity() < SPARE_FRAME_MIN {
            return;
        }
        let mut spare = lock(&self.spare_frames);
        if spare.len() < SPARE_FRAMES {
            spare.push(buf);
        }
    }

    pub(super) fn failure(&self) -> Option<Failure> {
        lock(&self.failure).clone()
    }

    pub(super) fn error_from(&self, f: &Failure) -> Error {
        Error::new(f.kind, f.message.clone()).with_broker(self.broker.clone())
    }

    /// The error for requests on this connection once it is dead.
    pub(super) fn error(&self) -> Error {
        match self.failure() {
            Some(f) => self.error_from(&f),
            None => Error::closed("connection closed").with_broker(self.broker.clone()),
        }
    }

    /// Record why the connection died (the first reason wins) and stop new requests.
    pub(super) fn set_failure(&self, failure: Failure) {
        let mut slot = lock(&self.failure);
        if slot.is_none() {
            *slot = Some(failure);
        }
        drop(slot);
        self.in_flight.close();
    }

    /// Record `failure` and fail every pending request.
    pub(super) fn fail(&self, failure: Failure) {
        self.set_failure(failure);
        let pending = std::mem::take(&mut *lock(&self.pending));
        let error_count = pending.len();
        for (_, p) in pending {
            let _ = p.tx.send(Err(self.error()));
        }
        if error_count > 0 {
            debug!(broker = %self.broker, failed = error_count, "failed in-flight requests");
        }
    }

    /// Hand one response frame (without its size prefix) to its request.
    fn dispatch(&self, frame: Bytes) -> Result<(), Failure> {
        let Some(correlation_id) = frame
            .get(..4)
            .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        else {
            return Err(Failure::new(
                ErrorKind::Protocol,
                "response frame too short for a header",
            ));
        };
        let Some(pending) = lock(&self.pending).remove(&correlation_id) else {
            let mut unanswered = lock(&self.unanswered);
            if let Some(i) = unanswered.iter().position(|id| *id == correlation_id) {
                unanswered.remove(i);
                debug!(
                    broker = %self.broker,
                    correlation_id,
                    "discarded a response to a request sent without expecting one"
                );
                return Ok(());
            }
            // The response stream is out of step with the requests: the connection is
            // dropped and what was in flight failed with it (retriable: a request's fate
            // is unknown, as after a cut connection).
            return Err(Failure::new(
                ErrorKind::Closed,
                format!(
                    "connection dropped: response with unknown correlation id {correlation_id}"
                ),
            ));
        };
        let mut body = frame;
        if let Err(e) = ResponseHeader::decode(&mut body, pending.header_version) {
            let failure = Failure::new(
                ErrorKind::Protocol,
                format!(
                    "undecodable {} response header (correlation id {correlation_id}): {e}",
                    pending.api_key
                ),
            );
            let _ = pending.tx.send(Err(self.error_from(&failure)));
            return Err(failure);
        }
        trace!(
            broker = %self.broker,
            api = %pending.api_key,
            correlation_id,
            size = body.len(),
            "received response"
        );
        if let Some(ms) = throttle::client_throttle_ms(pending.api_key, pending.api_version, &body)
        {
            self.throttle(tokio::time::Instant::now(), ms);
            debug!(
                broker = %self.broker,
                api = %pending.api_key,
                correlation_id,
                throttle_time_ms = ms,
                "throttled by a broker quota: holding further requests (KIP-219)"
            );
        }
        if pending.tx.send(Ok(body)).is_err() {
            debug!(
                broker = %self.broker,
                api = %pending.api_key,
                correlation_id,
                "discarded response to an abandoned request"
            );
        }
        Ok(())
    }
}

/// How many correlation ids of no-response requests are remembered.
const UNANSWERED_MEMORY: usize = 1024;

/// A request written and awaiting its response. Holds its in-flight permit until then.
pub(super) struct Pending {
    api_key: ApiKey,
    api_version: i16,
    header_version: i16,
    tx: oneshot::Sender<Result<Bytes>>,
    _permit: Option<OwnedSemaphorePermit>,
}

/// A request frame: its encoded buffer and the byte strings spliced into it.
pub(super) struct Frame {
    pub(super) head: Bytes,
    pub(super) splices: Splices,
}

/// The most pieces handed to one vectored write.
const MAX_PIECES: usize = 64;

impl Frame {
    /// Write the whole frame: one write of its buffer, or vectored writes of the buffer's
    /// pieces and the splices between them (nothing is copied into one buffer first).
    pub(super) async fn write_to<W: AsyncWrite + Unpin>(
        &self,
        writer: &mut W,
    ) -> std::io::Result<()> {
        if self.splices.is_empty() {
            return writer.write_all(&self.head).await;
        }
        let mut pieces: Vec<&[u8]> = self.splices.pieces(&self.head).collect();
        let mut first = 0;
        let mut slices = Vec::with_capacity(pieces.len().min(MAX_PIECES));
        while first < pieces.len() {
            slices.clear();
            slices.extend(
                pieces[first..]
                    .iter()
                    .take(MAX_PIECES)
                    .map(|p| std::io::IoSlice::new(p)),
            );
            let mut n = writer.write_vectored(&slices).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            while n > 0 {
                let piece = pieces[first];
                if n >= piece.len() {
                    n -= piece.len();
                    first += 1;
                } else {
                    pieces[first] = &piece[n..];
                    n = 0;
                }
            }
        }
        Ok(())
    }
}

/// A frame handed from a caller to the driver.
pub(super) struct Command {
    pub(super) correlation_id: i32,
    pub(super) frame: Frame,
    pub(super) permit: Option<OwnedSemaphorePermit>,
    pub(super) reply: Reply,
}

pub(super) enum Reply {
    /// A response is expected, with a header of `header_version`.
    Response {
        api_key: ApiKey,
        api_version: i16,
        header_version: i16,
        tx: oneshot::Sender<Result<Bytes>>,
        /// Written even when the caller gave up before its turn (see
        /// [`Connection::queue_request`]); otherwise such a request is skipped.
        ordered: bool,
    },
    /// No response is expected; report once the frame is written.
    Written(oneshot::Sender<Result<()>>),
}

pub(super) async fn drive<S>(
    stream: S,
    mut commands: mpsc::UnboundedReceiver<Command>,
    state: Arc<State>,
    max_frame_size: usize,
) where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (reader, writer) = tokio::io::split(stream);
    let outcome = tokio::select! {
        r = write_loop(writer, &mut commands, &state) => r,
        r = read_loop(reader, &state, max_frame_size) => r,
        () = state.shutdown.notified() => {
            Err(Failure::new(ErrorKind::Closed, "connection closed by client"))
        }
    };
    let failure = match outcome {
        Ok(()) => Failure::new(ErrorKind::Closed, "connection dropped by client"),
        Err(f) => f,
    };
    match failure.kind {
        ErrorKind::Closed => {
            debug!(broker = %state.broker, reason = %failure.message, "connection ended")
        }
        _ => warn!(broker = %state.broker, reason = %failure.message, "connection failed"),
    }
    state.fail(failure);
    // Requests still queued fail when their reply senders drop with `commands`.
    commands.close();
}

async fn write_loop<W: AsyncWrite + Unpin>(
    mut writer: W,
    commands: &mut mpsc::UnboundedReceiver<Command>,
    state: &State,
) -> Result<(), Failure> {
    while let Some(first) = commands.recv().await {
        let mut next = Some(first);
        while let Some(command) = next {
            if state.throttled_until().is_some() {
                writer.flush().await.map_err(write_failure)?;
                while let Some(until) = state.throttled_until() {
                    tokio::time::sleep_until(until).await;
                }
                trace!(broker = %state.broker, "quota throttle over: writing again");
            }
            write_one(&mut writer, command, state).await?;
            next = commands.try_recv().ok();
        }
        writer.flush().await.map_err(write_failure)?;
    }
    Ok(())
}

fn write_failure(e: std::io::Error) -> Failure {
    Failure::new(io_kind(&e), format!("write failed: {e}"))
}

/// `Tls` for a TLS-level failure after the handshake (e.g. a server that demands a client
/// certificate sends its alert on the first read with TLS 1.3), else `Io`.
fn io_kind(e: &std::io::Error) -> ErrorKind {
    #[cfg(feature = "tls")]
    if e.get_ref()
        .is_some_and(|inner| inner.is::<tokio_rustls::rustls::Error>())
    {
        return ErrorKind::Tls;
    }
    let _ = e;
    ErrorKind::Io
}

async fn write_one<W: AsyncWrite + Unpin>(
    writer: &mut W,
    command: Command,
    state: &State,
) -> Result<(), Failure> {
    let Command {
        correlation_id,
        frame,
        permit,
        reply,
    } = command;
    match reply {
        Reply::Response {
            api_key,
            api_version,
            header_version,
            tx,
            ordered,
        } => {
            if tx.is_closed() && !ordered {
                trace!(broker = %state.broker, api = %api_key, correlation_id, "skipped abandoned request");
                return Ok(());
            }
            {
                let mut pending = lock(&state.pending);
                if pending.contains_key(&correlation_id) {
                    // Only after 2^31 requests with one still unanswered.
                    let _ = tx.send(Err(Error::protocol(format!(
                        "correlation id {correlation_id} is still in flight"
                    ))
                    .with_broker(state.broker.clone())));
                    return Ok(());
                }
                pending.insert(
                    correlation_id,
                    Pending {
                        api_key,
                        api_version,
                        header_version,
                        tx,
                        _permit: permit,
                    },
                );
            }
            frame.write_to(writer).await.map_err(write_failure)?;
            state.recycle(frame.head);
        }
        Reply::Written(tx) => {
            let written = match frame.write_to(writer).await {
                Ok(()) => writer.flush().await,
                Err(e) => Err(e),
            };
            state.recycle(frame.head);
            drop(permit);
            match written {
                Ok(()) => {
                    let mut unanswered = lock(&state.unanswered);
                    if unanswered.len() >= UNANSWERED_MEMORY {
                        unanswered.pop_front();
                    }
                    unanswered.push_back(correlation_id);
                    drop(unanswered);
                    let _ = tx.send(Ok(()));
                }
                Err(e) => {
                    let failure = write_failure(e);
                    let _ = tx.send(Err(state.error_from(&failure)));
                    return Err(failure);
                }
            }
        }
    }
    Ok(())
}

async fn read_loop<R: AsyncRead + Unpin>(
    mut reader: R,
    state: &State,
    max_frame_size: usize,
) -> Result<(), Failure> {
    let mut buf = BytesMut::with_capacity(8 * 1024);
    // Large frames (fetch responses) are read into buffers reused from frame to frame:
    // a fresh multi-megabyte buffer per response costs a page fault per 4 KiB page.
    let pool = BufPool::for_fetches();
    loop {
        while buf.len() < 4 {
            read_more(&mut reader, &mut buf).await?;
        }
        let size = i32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
        let size = match usize::try_from(size) {
            Ok(s) if (4..=max_frame_size).contains(&s) => s,
            _ => {
                return Err(Failure::new(
                    ErrorKind::Protocol,
                    format!("invalid response frame size {size} (allowed 4..={max_frame_size})"),
                ))
            }
        };
        let total = 4 + size;
        if size >= POOLED_FRAME_MIN {
            buf.advance(4);
            let frame = read_pooled_frame(&mut reader, &mut buf, size, &pool).await?;
            state.dispatch(frame)?;
            continue;
        }
        if buf.len() < total {
            buf.reserve(total - buf.len());
        }
        while buf.len() < total {
            read_more(&mut reader, &mut buf).await?;
        }
        buf.advance(4);
        let frame = buf.split_to(size).freeze();
        state.dispatch(frame)?;
    }
}

/// Frames from this size on are read into a pooled buffer (see [`read_pooled_frame`]).
pub(super) const POOLED_FRAME_MIN: usize = 64 * 1024;

/// Read the rest of a `size`-byte frame whose first bytes (if any) are in `buf` into a
/// buffer of `pool`, which gets it back once the last slice of the frame is dropped.
pub(super) async fn read_pooled_frame<R: AsyncRead + Unpin>(
    reader: &mut R,
    buf: &mut BytesMut,
    size: usize,
    pool: &Arc<BufPool>,
) -> Result<Bytes, Failure> {
    let mut frame = pool.take_rounded(size);
    let have = buf.len().min(size);
    frame.extend_from_slice(&buf[..have]);
    buf.advance(have);
    while frame.len() < size {
        let want = size - frame.len();
        let n = reader
            .read_buf(&mut (&mut frame).limit(want))
            .await
            .map_err(|e| Failure::new(io_kind(&e), format!("read failed: {e}")))?;
        if n == 0 {
            return Err(Failure::new(
                ErrorKind::Closed,
                "connection closed by peer in the middle of a response",
            ));
        }
    }
    Ok(pool.freeze(frame))
}

async fn read_more<R: AsyncRead + Unpin>(
    reader: &mut R,
    buf: &mut BytesMut,
) -> Result<(), Failure> {
    if buf.capacity() == buf.len() {
        buf.reserve(8 * 1024);
    }
    let n = reader
        .read_buf(buf)
        .await
        .map_err(|e| Failure::new(io_kind(&e), format!("read failed: {e}")))?;
    if n == 0 {
        let message = if buf.is_empty() {
            "connection closed by peer"
        } else {
            "connection closed by peer in the middle of a response"
        };
        return Err(Failure::new(ErrorKind::Closed, message));
    }
    Ok(())
}
