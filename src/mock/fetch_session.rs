//! Fetch sessions (KIP-227) in the mock, as a Kafka broker keeps them: a Fetch with epoch
//! 0 opens a session (closing the one it names), answered with its id; one with the
//! session's id and next epoch updates the cached partitions with those it lists, drops
//! the forgotten ones, and is served for every cached partition, answering only for those
//! with records, an error, or a changed high-water mark, last stable or log start offset.
//! An unknown id is `FETCH_SESSION_ID_NOT_FOUND`, an unexpected epoch
//! `INVALID_FETCH_SESSION_EPOCH`. Epoch -1 is a sessionless fetch.

use std::collections::{BTreeMap, HashMap};

use crate::protocol::messages::{FetchPartition, FetchRequest, FetchResponse, FetchTopic};
use crate::protocol::ErrorCode;

type Marks = (i64, i64, i64);

#[derive(Debug, Default)]
pub(super) struct Sessions {
    last_id: i32,
    open: HashMap<i32, Open>,
}

#[derive(Debug)]
struct Open {
    broker: i32,
    epoch: i32,
    /// Per partition: what was last sent for it, and the marks last answered.
    parts: BTreeMap<(String, i32), (FetchPartition, Option<Marks>)>,
}

/// How one request is served.
pub(super) struct Served {
    /// The request with every partition of the session.
    pub(super) req: FetchRequest,
    pub(super) session_id: i32,
    pub(super) incremental: bool,
}

impl Sessions {
    /// Apply `req` to broker `broker`'s sessions.
    /// How many sessions are open.
    pub(super) fn open(&self) -> usize {
        self.open.len()
    }

    pub(super) fn apply(
        &mut self,
        broker: i32,
        req: &FetchRequest,
    ) -> std::result::Result<Served, ErrorCode> {
        let listed = req.topics.iter().flat_map(|t| {
            t.partitions
                .iter()
                .map(|p| ((t.topic.clone(), p.partition), p.clone()))
        });
        if req.session_epoch < 0 {
            if req.session_id != 0 {
                self.open.remove(&req.session_id);
            }
            return Ok(Served {
                req: req.clone(),
                session_id: 0,
                incremental: false,
            });
        }
        if req.session_epoch == 0 {
            self.open.remove(&req.session_id);
            self.last_id += 1;
            let parts = listed.map(|(k, p)| (k, (p, None))).collect();
            let open = Open {
                broker,
                epoch: 1,
                parts,
            };
            self.open.insert(self.last_id, open);
            return Ok(Served {
                req: req.clone(),
                session_id: self.last_id,
                incremental: false,
            });
        }
        let open = self
            .open
            .get_mut(&req.session_id)
            .filter(|o| o.broker == broker)
            .ok_or(ErrorCode::FetchSessionIdNotFound)?;
        if req.session_epoch != open.epoch {
            return Err(ErrorCode::InvalidFetchSessionEpoch);
        }
        open.epoch = if open.epoch == i32::MAX {
            1
        } else {
            open.epoch + 1
        };
        for (k, p) in listed {
            let marks = open.parts.get(&k).and_then(|(_, m)| *m);
            open.parts.insert(k, (p, marks));
        }
        for t in &req.forgotten_topics_data {
            for p in &t.partitions {
                open.parts.remove(&(t.topic.clone(), *p));
            }
        }
        let mut topics: Vec<FetchTopic> = Vec::new();
        for ((topic, _), (p, _)) in &open.parts {
            match topics.last_mut().filter(|t| t.topic == *topic) {
                Some(t) => t.partitions.push(p.clone()),
                None => topics.push(FetchTopic {
                    topic: topic.clone(),
                    partitions: vec![p.clone()],
                    ..FetchTopic::default()
                }),
            }
        }
        Ok(Served {
            req: FetchRequest {
                topics,
                forgotten_topics_data: Vec::new(),
                ..req.clone()
            },
            session_id: req.session_id,
            incremental: true,
        })
    }

    /// Name the session in `resp` and, for an incremental one, leave out the partitions
    /// with nothing new.
    pub(super) fn answer(&mut self, served: &Served, resp: &mut FetchResponse) {
        resp.session_id = served.session_id;
        let Some(open) = self.open.get_mut(&served.session_id) else {
            return;
        };
        for t in &mut resp.responses {
            t.partitions.retain(|d| {
                let marks = (d.high_watermark, d.last_stable_offset, d.log_start_offset);
                let cached = open.parts.get_mut(&(t.topic.clone(), d.partition_index));
                let changed = cached
                    .map(|(_, m)| m.replace(marks) != Some(marks))
                    .unwrap_or(true);
                !served.incremental
                    || changed
                    || d.error_code != 0
                    || d.records.as_ref().is_some_and(|r| !r.is_empty())
            });
        }
        resp.responses.retain(|t| !t.partitions.is_empty());
    }
}
