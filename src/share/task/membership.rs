//! The share task's membership: ShareGroupHeartbeat with the group coordinator (joining,
//! the assignment, fencing and rejoining) and the metadata of the assigned partitions'
//! leaders.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, info, warn};

use super::ShareTask;
use crate::error::{Error, ErrorKind, Result};
use crate::group::coordinator::{coordinator_lost, Lane};
use crate::protocol::messages::ShareGroupHeartbeatRequest;
use crate::protocol::ErrorCode;
use crate::share::Tp;

impl ShareTask {
    /// One heartbeat; the wait before the next. Errors are fatal.
    pub(super) async fn heartbeat(&mut self) -> Result<Duration> {
        let req = ShareGroupHeartbeatRequest {
            group_id: self.config.group_id.clone(),
            member_id: self.member_id.clone(),
            member_epoch: self.epoch,
            rack_id: self.config.client_rack.clone(),
            subscribed_topic_names: (self.epoch == 0).then(|| self.config.topics.clone()),
            ..Default::default()
        };
        let soon = Duration::from_millis(500);
        let c = match self.coord.connection(Lane::Membership).await {
            Ok(c) => c,
            Err(e) => {
                debug!(group = %self.group(), error = %e, "share group coordinator not reachable");
                return Ok(soon);
            }
        };
        let v = c.version_for::<ShareGroupHeartbeatRequest>().map_err(|e| {
            Error::new(
                ErrorKind::UnsupportedVersion,
                format!(
                    "share group {}: broker {} offers no ShareGroupHeartbeat v1 (share groups need Apache Kafka 4.2+): {e}",
                    self.group(),
                    c.broker()
                ),
            )
        })?;
        let timeout = self.config.connection.request_timeout;
        let resp = match tokio::time::timeout(timeout, c.send_version(&req, v)).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                if coordinator_lost(&e) {
                    self.coord.mark_unknown(&c, &e);
                }
                debug!(group = %self.group(), error = %e, "ShareGroupHeartbeat failed");
                return Ok(soon);
            }
            Err(_) => {
                let e = Error::new(ErrorKind::Timeout, "ShareGroupHeartbeat timed out");
                self.coord.mark_unknown(&c, &e);
                return Ok(soon);
            }
        };
        match ErrorCode::non_zero(resp.error_code) {
            None => {}
            Some(ErrorCode::UnknownMemberId | ErrorCode::FencedMemberEpoch) => {
                warn!(group = %self.group(), member_id = %self.member_id, epoch = self.epoch, code = ?resp.error_code, "fenced from the share group; joining again");
                self.epoch = 0;
                self.set_assignment(BTreeSet::new());
                return Ok(Duration::ZERO);
            }
            Some(code) => {
                let e = Error::kafka(code).with_broker(c.broker());
                if coordinator_lost(&e) {
                    self.coord.mark_unknown(&c, &e);
                    return Ok(soon);
                }
                if code.is_retriable() {
                    return Ok(soon);
                }
                if code == ErrorCode::UnsupportedVersion {
                    // Kafka 4.0/4.1 list ShareGroupHeartbeat (the share-group preview) and
                    // refuse it unless the cluster finalizes share.version
                    let level = c
                        .api_versions()
                        .map_or(0, |v| v.finalized_level("share.version"));
                    return Err(Error::new(
                        ErrorKind::UnsupportedVersion,
                        format!(
                            "share group {}: broker {} refused ShareGroupHeartbeat with UNSUPPORTED_VERSION: share groups need Apache Kafka 4.2+, or a cluster that finalizes the share.version feature (this one finalizes share.version={level})",
                            self.group(),
                            c.broker()
                        ),
                    ));
                }
                return Err(Error::new(
                    e.kind(),
                    format!(
                        "share group {}: ShareGroupHeartbeat: {e}{}",
                        self.group(),
                        resp.error_message
                            .map(|m| format!(" ({m})"))
                            .unwrap_or_default()
                    ),
                ));
            }
        }
        if self.epoch == 0 {
            info!(group = %self.group(), member_id = %self.member_id, epoch = resp.member_epoch, "joined share group");
        }
        self.epoch = resp.member_epoch;
        self.counters
            .member_epoch
            .store(self.epoch, Ordering::Relaxed);
        if resp.heartbeat_interval_ms > 0 {
            self.hb_interval = Duration::from_millis(resp.heartbeat_interval_ms as u64);
        }
        if let Some(a) = resp.assignment {
            let set: BTreeSet<Tp> = a
                .topic_partitions
                .iter()
                .flat_map(|t| t.partitions.iter().map(move |p| (t.topic_id, *p)))
                .collect();
            self.set_assignment(set);
        }
        Ok(self.hb_interval)
    }

    fn set_assignment(&mut self, set: BTreeSet<Tp>) {
        if set != self.assigned {
            info!(group = %self.group(), partitions = set.len(), "share group assignment");
            if set.iter().any(|(id, _)| !self.names.contains_key(id))
                || set.iter().any(|tp| !self.leaders.contains_key(tp))
            {
                self.metadata_stale = true;
            }
            self.assigned = set;
            self.counters
                .assigned
                .store(self.assigned.len(), Ordering::Relaxed);
        }
    }

    pub(super) async fn refresh_metadata(&mut self) {
        let topics: Vec<&str> = self.config.topics.iter().map(String::as_str).collect();
        let timeout = self.config.connection.request_timeout;
        match tokio::time::timeout(timeout, self.admin.metadata(Some(&topics))).await {
            Ok(Ok(md)) => {
                for t in md.topics {
                    if t.id == [0; 16] || t.error.is_some() {
                        continue;
                    }
                    let name: Arc<str> = Arc::from(t.name.as_str());
                    self.names.insert(t.id, name);
                    for p in t.partitions {
                        if p.leader >= 0 {
                            self.leaders.insert((t.id, p.id), p.leader);
                        } else {
                            self.leaders.remove(&(t.id, p.id));
                        }
                    }
                }
                self.metadata_stale = false;
            }
            Ok(Err(e)) => debug!(group = %self.group(), error = %e, "share reader metadata failed"),
            Err(_) => debug!(group = %self.group(), "share reader metadata timed out"),
        }
    }
}
