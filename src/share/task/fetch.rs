//! The share task's fetches: a ShareFetch to one leader (the session's partitions, the
//! acknowledgements piggy-backed) and the delivery of the records it acquires.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;

use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::FutureExt;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::warn;

use super::{Acks, Reply, ShareTask};
use crate::group::AckToken;
use crate::protocol::messages::{
    ShareFetchAcknowledgementBatch, ShareFetchPartition, ShareFetchRequest, ShareFetchTopic,
    ShareForgottenTopic,
};
use crate::reader::Message;
use crate::record::decode_batches_within;
use crate::share::{ack_batches, Tp, REJECT};

impl ShareTask {
    pub(super) fn send_fetch(
        &mut self,
        inflight: &mut FuturesUnordered<BoxFuture<'static, Reply>>,
        broker: i32,
        want: BTreeSet<Tp>,
        acks: Acks,
        room: usize,
    ) {
        let Some(s) = self.sessions.get_mut(&broker) else {
            return;
        };
        s.busy = true;
        let sent_epoch = s.epoch;
        let forgotten: BTreeSet<Tp> = s.parts.difference(&want).copied().collect();
        let mut topics: BTreeMap<[u8; 16], Vec<ShareFetchPartition>> = BTreeMap::new();
        for tp in want
            .iter()
            .chain(acks.keys().filter(|tp| !want.contains(tp)))
        {
            let batches = acks
                .get(tp)
                .map(|v| {
                    ack_batches(v)
                        .into_iter()
                        .map(|(first, last, kind)| ShareFetchAcknowledgementBatch {
                            first_offset: first,
                            last_offset: last,
                            acknowledge_types: vec![kind],
                            ..Default::default()
                        })
                        .collect()
                })
                .unwrap_or_default();
            topics.entry(tp.0).or_default().push(ShareFetchPartition {
                partition_index: tp.1,
                acknowledgement_batches: batches,
                ..Default::default()
            });
        }
        let mut forgotten_topics: BTreeMap<[u8; 16], Vec<i32>> = BTreeMap::new();
        for (id, p) in &forgotten {
            forgotten_topics.entry(*id).or_default().push(*p);
        }
        let max_records = i32::try_from(room.min(self.config.max_records)).unwrap_or(i32::MAX);
        let req = ShareFetchRequest {
            group_id: Some(self.config.group_id.clone()),
            member_id: Some(self.member_id.clone()),
            share_session_epoch: sent_epoch,
            max_wait_ms: i32::try_from(self.config.max_wait.as_millis()).unwrap_or(i32::MAX),
            min_bytes: 1,
            max_bytes: self.config.max_bytes,
            max_records,
            batch_size: max_records,
            // record-limit: MaxRecords is a hard bound (v2; v1 brokers may exceed it to
            // the batch boundary)
            share_acquire_mode: 1,
            topics: topics
                .into_iter()
                .map(|(topic_id, partitions)| ShareFetchTopic {
                    topic_id,
                    partitions,
                    ..Default::default()
                })
                .collect(),
            forgotten_topics_data: forgotten_topics
                .into_iter()
                .map(|(topic_id, partitions)| ShareForgottenTopic {
                    topic_id,
                    partitions,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let cluster = self.cluster.clone();
        let sent = Instant::now();
        // a new session holds exactly what this request names; an open one keeps the
        // partitions not forgotten
        let mut parts = want;
        if sent_epoch != 0 {
            parts.extend(s.parts.difference(&forgotten).copied());
        }
        inflight.push(
            async move {
                let result = async {
                    let c = cluster.connection(broker).await?;
                    let v = c.version_for::<ShareFetchRequest>()?;
                    c.send_version(&req, v).await
                }
                .await;
                Reply::Fetch {
                    broker,
                    sent_epoch,
                    sent,
                    parts,
                    acks,
                    result,
                }
            }
            .boxed(),
        );
    }

    /// Yield the acquired records of a partition's fetched data; acquired offsets with
    /// nothing to yield are acknowledged GAP.
    pub(super) fn deliver(
        &mut self,
        tp: Tp,
        records: Option<bytes::Bytes>,
        acquired: &[crate::protocol::messages::AcquiredRecords],
        sent: Instant,
    ) {
        if acquired.is_empty() {
            return;
        }
        self.locks_start(sent);
        let Some(topic) = self.names.get(&tp.0).cloned() else {
            // cannot happen (only named partitions are fetched): let the locks expire
            self.metadata_stale = true;
            return;
        };
        let range_of = |o: i64| {
            acquired
                .iter()
                .find(|a| a.first_offset <= o && o <= a.last_offset)
                .map(|a| a.delivery_count)
        };
        let mut yielded = BTreeSet::new();
        let data = records.unwrap_or_default();
        let limit = usize::try_from(self.config.max_bytes)
            .unwrap_or(usize::MAX)
            .max(1 << 20);
        match decode_batches_within(data, limit, crate::record::MAX_BATCH_DECOMPRESSED) {
            Ok(d) => {
                for b in d.batches {
                    if b.is_control {
                        continue;
                    }
                    let epoch = b.partition_leader_epoch;
                    for r in b.records {
                        let Some(count) = range_of(r.offset) else {
                            continue;
                        };
                        let offset = r.offset;
                        if !yielded.insert(offset) {
                            continue;
                        }
                        let id = self.ledger.acquire(tp, offset, sent);
                        self.counters.acquired.fetch_add(1, Ordering::Relaxed);
                        let mut m = Message::from_record(&topic, tp.1, -1, epoch, r, 0);
                        m.set_delivery_count(count);
                        m.set_ack_token(AckToken::share_record(self.ledger.clone(), id));
                        if let Err(mpsc::error::SendError(Ok(mut m))) = self.tx.send(Ok(m)) {
                            m.take_ack_token().release();
                        }
                    }
                }
            }
            Err(e) => {
                warn!(group = %self.group(), topic = %topic, partition = tp.1, error = %e, "acquired records do not decode; rejecting them");
                for a in acquired {
                    for o in a.first_offset..=a.last_offset {
                        if yielded.insert(o) {
                            let id = self.ledger.acquire(tp, o, sent);
                            self.ledger.settle_now(id, REJECT);
                        }
                    }
                }
                return;
            }
        }
        for a in acquired {
            for o in a.first_offset..=a.last_offset {
                if !yielded.contains(&o) {
                    self.ledger.gap(tp, o);
                }
            }
        }
    }
}
