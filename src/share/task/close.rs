//! The share task's close: the requests in flight finished, the last acknowledgements
//! sent while closing the sessions (epoch -1), and leaving the group.

use std::collections::{BTreeSet, HashMap};

use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use tokio::time::Instant;
use tracing::{info, warn};

use super::{acks::ack_request, Reply, ShareTask};
use crate::error::Error;
use crate::group::coordinator::Lane;
use crate::protocol::messages::{ShareAcknowledgeRequest, ShareGroupHeartbeatRequest};
use crate::protocol::ErrorCode;
use crate::share::Tp;

impl ShareTask {
    /// Stop: finish the requests in flight, wait (an orderly close) for the records the
    /// consumer holds, release the rest, send the last acknowledgements while closing
    /// the sessions, and leave the group.
    pub(super) async fn shutdown(
        &mut self,
        mut inflight: FuturesUnordered<BoxFuture<'static, Reply>>,
    ) {
        let deadline = Instant::now() + self.config.close_timeout;
        // let fetches in flight finish: their records go back at once (the stream is
        // closed: sending them fails and releases them)
        while let Ok(Some(reply)) = tokio::time::timeout_at(deadline, inflight.next()).await {
            let _ = self.handle(reply);
        }
        // wait for what the consumer holds (only after an orderly close: a dropped
        // reader's drops were released already)
        loop {
            if self.ledger.outstanding() == 0 {
                break;
            }
            self.dispatch(&mut inflight, false);
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => break,
                _ = self.ledger.changed.notified() => {}
                Some(reply) = inflight.next(), if !inflight.is_empty() => { let _ = self.handle(reply); }
            }
        }
        while let Ok(Some(reply)) =
            tokio::time::timeout(self.config.connection.request_timeout, inflight.next()).await
        {
            let _ = self.handle(reply);
        }
        let left = self.ledger.outstanding();
        if left > 0 {
            info!(group = %self.group(), records = left, "releasing records still held at close");
        }
        self.ledger.release_all();
        // the last acknowledgements close each session (epoch -1)
        let brokers: Vec<i32> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.epoch > 0)
            .map(|(b, _)| *b)
            .collect();
        for b in brokers {
            let mine: BTreeSet<Tp> = self
                .leaders
                .iter()
                .filter(|(_, l)| **l == b)
                .map(|(tp, _)| *tp)
                .collect();
            let acks = self.ledger.take_acks(|tp| mine.contains(tp));
            let req = ack_request(&self.config.group_id, &self.member_id, -1, &acks);
            let r = async {
                let c = self.cluster.connection(b).await?;
                let v = c.version_for::<ShareAcknowledgeRequest>()?;
                c.send_version(&req, v).await
            };
            match tokio::time::timeout(self.config.connection.request_timeout, r).await {
                Ok(Ok(resp)) => {
                    let errors: HashMap<Tp, i16> = resp
                        .responses
                        .iter()
                        .flat_map(|t| {
                            t.partitions
                                .iter()
                                .map(move |p| ((t.topic_id, p.partition_index), p.error_code))
                        })
                        .collect();
                    if let Some(code) = ErrorCode::non_zero(resp.error_code) {
                        warn!(group = %self.group(), broker = b, error = %Error::kafka(code), "closing the share session failed");
                    } else {
                        self.acked(&acks, &errors);
                    }
                }
                Ok(Err(e)) => {
                    warn!(group = %self.group(), broker = b, error = %e, "closing the share session failed")
                }
                Err(_) => {
                    warn!(group = %self.group(), broker = b, "closing the share session timed out")
                }
            }
        }
        let rest = self.ledger.take_acks(|_| true);
        if !rest.is_empty() {
            warn!(group = %self.group(), partitions = rest.len(), "acknowledgements without a share session left unsent; their locks expire");
        }
        // leave
        if self.epoch > 0 {
            let req = ShareGroupHeartbeatRequest {
                group_id: self.config.group_id.clone(),
                member_id: self.member_id.clone(),
                member_epoch: -1,
                ..Default::default()
            };
            let r = async {
                let c = self.coord.connection(Lane::Membership).await?;
                let v = c.version_for::<ShareGroupHeartbeatRequest>()?;
                let resp = c.send_version(&req, v).await?;
                match ErrorCode::non_zero(resp.error_code) {
                    None => Ok(()),
                    Some(code) => Err(Error::kafka(code)),
                }
            };
            match tokio::time::timeout(self.config.connection.request_timeout, r).await {
                Ok(Ok(())) => {
                    info!(group = %self.group(), member_id = %self.member_id, "left share group")
                }
                Ok(Err(e)) => {
                    warn!(group = %self.group(), error = %e, "leaving the share group failed")
                }
                Err(_) => warn!(group = %self.group(), "leaving the share group timed out"),
            }
        }
        self.coord.close().await;
        self.cluster.close().await;
    }
}
