//! The caller side of a request on a [`Connection`]: encode the whole frame, take an
//! in-flight slot, stamp a fresh correlation id, hand the frame to the driver and await
//! the answer within [`ConnectionConfig::request_timeout`](super::ConnectionConfig).
//!
//! Owns the public request path ([`Connection::send`], [`Connection::send_version`],
//! [`Connection::send_no_response`]), the crate's ordered and observed variants, the
//! correlation id counter and the request timeout (which closes the connection). May not:
//! touch the stream or the in-flight map — both are the driver's (`driver.rs`); a request
//! reaches the driver only as a [`Command`].

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use tokio::sync::{oneshot, OwnedSemaphorePermit};
use tracing::{debug, trace};

use super::driver::{Command, Failure, Frame, Reply};
use super::Connection;
use crate::error::{Error, ErrorKind, Result};
use crate::protocol::{
    check_version, ApiKey, Decode, Request, RequestHeader, Splices, TaggedFields,
};

impl Connection {
    /// Send `req` at the negotiated version (see [`Connection::version_for`]) and await its
    /// response.
    ///
    /// # Errors
    ///
    /// `UnsupportedVersion` if no common version exists, and the errors of
    /// [`Connection::send_version`].
    ///
    /// # Cancellation safety
    ///
    /// Dropping the future at any point leaves the connection usable: before the request is
    /// handed to the connection task nothing was sent; afterwards the task either skips it
    /// (if not yet written) or writes it whole and reads and discards its response. The
    /// request may therefore still reach the broker after the future was dropped.
    pub async fn send<R: Request>(&self, req: &R) -> Result<R::Response> {
        let version = self.version_for::<R>()?;
        self.send_version(req, version).await
    }

    /// Send `req` at `version` and await its response, decoded at that version.
    ///
    /// # Errors
    ///
    /// `UnsupportedVersion` if `version` is outside `R`'s implemented range; `Encode` if the
    /// request cannot be encoded; `Timeout` after [`ConnectionConfig::request_timeout`](super::ConnectionConfig::request_timeout)
    /// (the connection stays usable); `Closed`, `Io` or `Protocol` if the connection is or
    /// becomes dead; `Protocol` if the response body cannot be decoded. Every error names
    /// the broker.
    ///
    /// # Cancellation safety
    ///
    /// As for [`Connection::send`].
    pub async fn send_version<R: Request>(&self, req: &R, version: i16) -> Result<R::Response> {
        let mut body = self.request_body(req, version).await?;
        R::Response::decode(&mut body, version).map_err(|e| self.err(e))
    }

    /// Like [`Connection::send`], calling `on_queued` with the request's correlation id as
    /// soon as the request is handed to the connection task (before the response), so a
    /// caller can log what it sent under the id the broker sees, even if no answer comes.
    pub(crate) async fn send_observed<R: Request>(
        &self,
        req: &R,
        on_queued: impl FnOnce(i32),
    ) -> Result<(i32, R::Response)> {
        let version = self.version_for::<R>()?;
        let mut id = -1;
        let mut body = self
            .request_body_observed(req, version, false, |c| {
                id = c;
                on_queued(c);
            })
            .await?;
        let resp = R::Response::decode(&mut body, version).map_err(|e| self.err(e))?;
        Ok((id, resp))
    }

    /// Queue `req` at `version` on the connection now, before returning: requests queued
    /// this way are written in the order of the calls (the writer relies on it to keep a
    /// partition's batches in sequence order on the wire). No in-flight slot is taken —
    /// the caller bounds its own requests. The returned future awaits the response, within
    /// [`ConnectionConfig::request_timeout`] from the first poll.
    ///
    /// Once queued, the request is written even if the future is dropped (timed out)
    /// before its turn: skipping it would leave a gap before the requests queued after it
    /// (for the writer, a sequence gap the broker refuses, and a batch that looks sent
    /// but never was).
    ///
    /// # Errors
    ///
    /// As for [`Connection::send_version`]; an error before anything was queued is
    /// returned at once.
    pub(crate) fn queue_request<R: Request>(
        &self,
        req: &R,
        version: i16,
    ) -> Result<impl std::future::Future<Output = Result<R::Response>> + Send + 'static>
    where
        R::Response: Send + 'static,
    {
        check_version::<R>(version).map_err(|e| self.err(e))?;
        if self.is_closed() {
            return Err(self.err(self.shared.state.error()));
        }
        let (mut head, splices) = self.encode_frame(req, version)?;
        let correlation_id = self.next_correlation_id();
        if let Some(slot) = head.get_mut(8..12) {
            slot.copy_from_slice(&correlation_id.to_be_bytes());
        }
        let (tx, rx) = oneshot::channel();
        self.submit(Command {
            correlation_id,
            frame: Frame {
                head: head.freeze(),
                splices,
            },
            permit: None,
            reply: Reply::Response {
                api_key: R::API_KEY,
                api_version: version,
                header_version: R::response_header_version(version),
                tx,
                ordered: true,
            },
        })
        .map_err(|e| self.err(e))?;
        let conn = self.clone();
        Ok(async move {
            let work = async { rx.await.unwrap_or_else(|_| Err(conn.shared.state.error())) };
            let mut body = conn.timed(R::API_KEY, version, work).await?;
            R::Response::decode(&mut body, version).map_err(|e| conn.err(e))
        })
    }

    /// Send `req` at `version` without expecting a response (Produce with `acks=0`). Returns
    /// once the frame is written and flushed. Takes an in-flight slot while waiting to be
    /// written, so it respects [`ConnectionConfig::max_in_flight`](super::ConnectionConfig::max_in_flight).
    ///
    /// # Errors
    ///
    /// As for [`Connection::send_version`], except that no response is decoded.
    ///
    /// # Cancellation safety
    ///
    /// Dropping the future never leaves a partial frame: once handed to the connection task
    /// the frame is written whole even if the future is dropped.
    pub async fn send_no_response<R: Request>(&self, req: &R, version: i16) -> Result<()> {
        check_version::<R>(version).map_err(|e| self.err(e))?;
        let frame = self.encode_frame(req, version)?;
        let work = async {
            let (permit, correlation_id, frame) = self.prepare(frame, false).await?;
            let (tx, rx) = oneshot::channel();
            self.submit(Command {
                correlation_id,
                frame,
                permit,
                reply: Reply::Written(tx),
            })?;
            trace!(
                broker = %self.shared.broker,
                api = %R::API_KEY,
                api_version = version,
                correlation_id,
                "queued request without response"
            );
            rx.await.unwrap_or_else(|_| Err(self.shared.state.error()))
        };
        self.timed(R::API_KEY, version, work).await
    }

    /// Encode, send and await the raw response body of `req` at `version`.
    pub(super) async fn request_body<R: Request>(&self, req: &R, version: i16) -> Result<Bytes> {
        self.request_body_with(req, version, false).await
    }

    /// Like [`Connection::request_body`]; with `exclusive` no in-flight slot is taken,
    /// because the caller holds them all (re-authentication).
    pub(super) async fn request_body_with<R: Request>(
        &self,
        req: &R,
        version: i16,
        exclusive: bool,
    ) -> Result<Bytes> {
        self.request_body_observed(req, version, exclusive, |_| {})
            .await
    }

    /// Like [`Connection::request_body_with`], calling `on_queued` with the correlation id
    /// once the request is handed to the connection task.
    async fn request_body_observed<R: Request>(
        &self,
        req: &R,
        version: i16,
        exclusive: bool,
        on_queued: impl FnOnce(i32),
    ) -> Result<Bytes> {
        check_version::<R>(version).map_err(|e| self.err(e))?;
        let frame = self.encode_frame(req, version)?;
        let header_version = R::response_header_version(version);
        let work = async {
            let (permit, correlation_id, frame) = self.prepare(frame, exclusive).await?;
            let (tx, rx) = oneshot::channel();
            self.submit(Command {
                correlation_id,
                frame,
                permit,
                reply: Reply::Response {
                    api_key: R::API_KEY,
                    api_version: version,
                    header_version,
                    tx,
                    ordered: false,
                },
            })?;
            trace!(
                broker = %self.shared.broker,
                api = %R::API_KEY,
                api_version = version,
                correlation_id,
                "queued request"
            );
            on_queued(correlation_id);
            rx.await.unwrap_or_else(|_| Err(self.shared.state.error()))
        };
        self.timed(R::API_KEY, version, work).await
    }

    /// Encode the whole frame with correlation id 0 ([`Connection::prepare`] stamps the
    /// real one): the buffer, and the large byte strings left out of it (record batches),
    /// which are written from their own memory.
    pub(super) fn encode_frame<R: Request>(
        &self,
        req: &R,
        version: i16,
    ) -> Result<(BytesMut, Splices)> {
        let mut buf = self.shared.state.frame_buffer();
        let mut splices = Splices::new();
        buf.put_i32(0); // size, patched below
        RequestHeader {
            api_key: R::API_KEY,
            api_version: version,
            correlation_id: 0,
            client_id: Some(self.shared.config.client_id.clone()),
            tagged_fields: TaggedFields::new(),
        }
        .encode(&mut buf, R::request_header_version(version))
        .map_err(|e| self.err(e))?;
        req.encode_spliced(&mut buf, &mut splices, version)
            .map_err(|e| self.err(e))?;
        let len = (buf.len() - 4).saturating_add(splices.len());
        let size = i32::try_from(len).map_err(|_| {
            self.err(Error::encode(format!(
                "{} request of {len} bytes exceeds the frame size limit",
                R::API_KEY,
            )))
        })?;
        buf[..4].copy_from_slice(&size.to_be_bytes());
        Ok((buf, splices))
    }

    /// Wait for an in-flight slot (unless `exclusive`: the caller holds every slot), then
    /// stamp a fresh correlation id into `frame`.
    async fn prepare(
        &self,
        (mut head, splices): (BytesMut, Splices),
        exclusive: bool,
    ) -> Result<(Option<OwnedSemaphorePermit>, i32, Frame)> {
        if self.is_closed() {
            return Err(self.shared.state.error());
        }
        let permit = if exclusive {
            None
        } else {
            Some(
                Arc::clone(&self.shared.state.in_flight)
                    .acquire_owned()
                    .await
                    .map_err(|_| self.shared.state.error())?,
            )
        };
        let correlation_id = self.next_correlation_id();
        // Every request header starts with api_key (2), api_version (2), correlation_id (4),
        // right after the 4-byte size prefix.
        if let Some(slot) = head.get_mut(8..12) {
            slot.copy_from_slice(&correlation_id.to_be_bytes());
        }
        let frame = Frame {
            head: head.freeze(),
            splices,
        };
        Ok((permit, correlation_id, frame))
    }

    fn submit(&self, command: Command) -> Result<()> {
        self.shared
            .commands
            .send(command)
            .map_err(|_| self.shared.state.error())
    }

    async fn timed<T>(
        &self,
        api_key: ApiKey,
        version: i16,
        work: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let timeout = self.shared.config.request_timeout;
        match self.timeout_unthrottled(timeout, work).await {
            Some(result) => result,
            None => {
                debug!(broker = %self.shared.broker, api = %api_key, api_version = version, "request timed out; closing the connection");
                // Like the Java client: a broker that does not answer in time on this
                // socket is treated as gone. Every other in-flight request fails with
                // `Closed` (retriable), and the cluster layer dials a fresh connection.
                self.shared.state.fail(Failure::new(
                    ErrorKind::Closed,
                    format!("connection closed after a {api_key} request timed out"),
                ));
                self.shared.state.shutdown.notify_one();
                Err(self.err(Error::timeout(format!(
                    "{api_key} v{version} request timed out after {} ms",
                    timeout.as_millis()
                ))))
            }
        }
    }

    /// Correlation ids count up from 0 and wrap back to 0 after `i32::MAX`.
    pub(super) fn next_correlation_id(&self) -> i32 {
        self.shared
            .next_correlation_id
            .fetch_add(1, Ordering::Relaxed)
            & i32::MAX
    }
}
