//! [`MockCluster`]'s changes to the cluster under a running client: raw appends and
//! deleted records, producer and transaction state (epochs, expiry), leaders removed and
//! moved, unclean truncation, brokers killed and restarted.

use super::*;

impl MockCluster {
    /// Append record batches to a partition as they are — only their base offsets are
    /// rewritten, nothing is checked beyond the framing — so a test can serve batches
    /// that fail their CRC or do not decode. Returns the first batch's offset, or `None`
    /// if the partition does not exist or the bytes are not framed as batches.
    ///
    /// ```
    /// use kafkapipe::compression::Compression;
    /// use kafkapipe::mock::MockCluster;
    /// use kafkapipe::reader::{Reader, ReaderConfig};
    /// use kafkapipe::record::RecordBatchBuilder;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().topic("t", 1).start().await?;
    /// let mut b = RecordBatchBuilder::new(Compression::None);
    /// b.append(0, None, Some(b"v"), &[])?;
    /// let mut bad = b.build()?.to_vec();
    /// let last = bad.len() - 1;
    /// bad[last] ^= 0xff; // covered by the CRC
    /// assert_eq!(cluster.append_raw("t", 0, bad.into()), Some(0));
    /// let mut reader = Reader::new(ReaderConfig::new(cluster.bootstrap()).partition("t", 0)).await?;
    /// let err = reader.next_message().await.unwrap_err();
    /// assert!(err.to_string().contains("CRC"), "{err}");
    /// reader.close().await;
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn append_raw(&self, topic: &str, partition: i32, batches: Bytes) -> Option<i64> {
        let offset = self
            .shared
            .lock()
            .partition_mut(topic, partition)?
            .append_raw(&batches);
        self.shared.changed();
        offset
    }

    /// Delete the records before `offset` (as DeleteRecords does): the log start moves
    /// there (at most to the high-water mark). Returns the new log start.
    ///
    /// ```
    /// use kafkapipe::conn::{Conn, ProduceOptions};
    /// use kafkapipe::mock::MockCluster;
    /// use kafkapipe::record::Record;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().topic("t", 1).start().await?;
    /// let conn = Conn::connect(&cluster.bootstrap()[0]).await?;
    /// let records: Vec<Record> = (0..10).map(|i| Record::new("k", format!("{i}"))).collect();
    /// conn.produce("t", 0, &records, &ProduceOptions::default()).await?;
    /// assert_eq!(cluster.delete_records("t", 0, 4), Some(4));
    /// assert_eq!(conn.first_offset("t", 0).await?, 4);
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn delete_records(&self, topic: &str, partition: i32, offset: i64) -> Option<i64> {
        let start = self
            .shared
            .lock()
            .partition_mut(topic, partition)?
            .delete_before(offset);
        self.shared.changed();
        Some(start)
    }

    /// Set the producer epoch the transaction coordinator holds for `transactional_id`
    /// (registering the id with a new producer id if it is unknown); the next
    /// InitProducerId answers `epoch + 1`. For epoch exhaustion: with
    /// `transaction.version` >= 2, an EndTxn v5 at epoch `i16::MAX - 1` or later answers a
    /// new producer id with epoch 0, as Kafka does. Returns the producer id.
    ///
    /// ```
    /// use kafkapipe::mock::MockCluster;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().start().await?;
    /// let pid = cluster.set_transaction_epoch("tx-1", i16::MAX - 2);
    /// assert_eq!(cluster.set_transaction_epoch("tx-1", 0), pid);
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn set_transaction_epoch(&self, transactional_id: &str, epoch: i16) -> i64 {
        let mut st = self.shared.lock();
        if !st.transactions.contains_key(transactional_id) {
            st.next_producer_id += 1;
            let producer_id = st.next_producer_id;
            let mut t = txn::Txn::default();
            t.producer_id = producer_id;
            st.transactions.insert(transactional_id.to_string(), t);
        }
        match st.transactions.get_mut(transactional_id) {
            Some(t) => {
                t.epoch = epoch;
                t.producer_id
            }
            None => -1,
        }
    }

    /// Expire the idempotent producers' state of a partition, as a broker does when a
    /// producer stays idle past `producer.id.expiration.ms` or retention deletes all its
    /// batches. The next batch of such a producer is answered `UNKNOWN_PRODUCER_ID` unless
    /// its sequence is 0 (the behaviour of brokers before Kafka 2.5, which the Java
    /// client's KIP-360 recovery handles by bumping the epoch). Returns how many producers
    /// were forgotten, or `None` for an unknown partition.
    ///
    /// ```
    /// use futures::SinkExt;
    /// use kafkapipe::mock::MockCluster;
    /// use kafkapipe::writer::{Message, Writer, WriterConfig};
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().topic("t", 1).start().await?;
    /// let mut writer = Writer::new(WriterConfig::new(cluster.bootstrap()).topic("t"))?;
    /// writer.write_messages([Message::new("a")]).await?;
    /// assert_eq!(cluster.expire_producers("t", 0), Some(1));
    /// // The writer bumps its epoch and goes on.
    /// writer.write_messages([Message::new("b")]).await?;
    /// assert_eq!(cluster.high_watermark("t", 0), Some(2));
    /// writer.close().await?;
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn expire_producers(&self, topic: &str, partition: i32) -> Option<usize> {
        let n = self
            .shared
            .lock()
            .partition_mut(topic, partition)?
            .expire_producers();
        self.shared.changed();
        Some(n)
    }

    /// Forget the idempotent producers' state of a partition the way Kafka 2.5 and later
    /// do when retention or DeleteRecords removes every batch of a producer: the next
    /// batch of such a producer is taken at whatever sequence it carries (KIP-360), as
    /// is the first batch of a producer a partition never saw. (Compare
    /// [`expire_producers`](Self::expire_producers), the older brokers' answer.) Returns
    /// how many producers were forgotten, or `None` for an unknown partition.
    ///
    /// ```
    /// use kafkapipe::mock::MockCluster;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().topic("t", 1).start().await?;
    /// assert_eq!(cluster.forget_producers("t", 0), Some(0));
    /// assert_eq!(cluster.forget_producers("t", 9), None);
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn forget_producers(&self, topic: &str, partition: i32) -> Option<usize> {
        let n = self
            .shared
            .lock()
            .partition_mut(topic, partition)?
            .forget_producers();
        self.shared.changed();
        Some(n)
    }

    /// Leave a partition without a leader (as while every replica is down): Metadata
    /// reports `LEADER_NOT_AVAILABLE` for it and every broker answers
    /// `NOT_LEADER_OR_FOLLOWER` until [`move_leader`](Self::move_leader).
    ///
    /// ```
    /// use kafkapipe::conn::Conn;
    /// use kafkapipe::mock::MockCluster;
    /// use kafkapipe::protocol::ErrorCode;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().topic("t", 1).start().await?;
    /// assert!(cluster.remove_leader("t", 0));
    /// let conn = Conn::connect(&cluster.bootstrap()[0]).await?;
    /// let err = conn.last_offset("t", 0).await.unwrap_err();
    /// assert_eq!(err.kafka_code(), Some(ErrorCode::NotLeaderOrFollower));
    /// cluster.move_leader("t", 0, 1)?;
    /// assert_eq!(conn.last_offset("t", 0).await?, 0);
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn remove_leader(&self, topic: &str, partition: i32) -> bool {
        let found = match self.shared.lock().partition_mut(topic, partition) {
            Some(p) => {
                p.set_leader(-1);
                true
            }
            None => false,
        };
        self.shared.changed();
        found
    }

    /// Make broker `to` the leader of a partition (bumping its leader epoch). The old
    /// leader answers `NOT_LEADER_OR_FOLLOWER` from now on; clients find the new one in
    /// Metadata.
    ///
    /// ```
    /// use futures::SinkExt;
    /// use kafkapipe::mock::MockCluster;
    /// use kafkapipe::protocol::ApiKey;
    /// use kafkapipe::writer::{Message, Writer, WriterConfig};
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().brokers(2).topic("t", 1).start().await?;
    /// assert_eq!(cluster.leader("t", 0), Some(1));
    /// let mut writer = Writer::new(WriterConfig::new(cluster.bootstrap()).topic("t"))?;
    /// writer.send(Message::new("before")).await?;
    /// cluster.move_leader("t", 0, 2)?;
    /// writer.send(Message::new("after")).await?;
    /// writer.close().await?;
    /// assert_eq!(cluster.high_watermark("t", 0), Some(2));
    /// assert!(cluster.requests_to(2, ApiKey::PRODUCE) >= 1);
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn move_leader(&self, topic: &str, partition: i32, to: i32) -> Result<()> {
        let mut st = self.shared.lock();
        if !st.brokers.iter().any(|b| b.id == to) {
            return Err(Error::new(
                ErrorKind::Config,
                format!("mock cluster has no broker {to}"),
            ));
        }
        let p = st.partition_mut(topic, partition).ok_or_else(|| {
            Error::new(
                ErrorKind::Config,
                format!("mock cluster has no partition {topic}/{partition}"),
            )
        })?;
        p.set_leader(to);
        drop(st);
        self.shared.changed();
        Ok(())
    }

    /// An unclean leader election onto a replica whose log ends at `offset`: the
    /// partition's records from `offset` on are gone (whole batches: a batch holding
    /// `offset` goes too) and its leader starts a new leader epoch at the new log end,
    /// which the records produced from now on carry. Returns the new log end and leader
    /// epoch. A consumer that had read past the new end finds out through
    /// OffsetForLeaderEpoch (KIP-320).
    ///
    /// ```
    /// use kafkapipe::mock::MockCluster;
    /// use kafkapipe::record::Record;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().topic("t", 1).start().await?;
    /// cluster.produce("t", 0, &[Record::new("k", "a"), Record::new("k", "b")])?;
    /// cluster.produce("t", 0, &[Record::new("k", "c")])?;
    /// assert_eq!(cluster.truncate("t", 0, 2)?, (2, 1));
    /// assert_eq!(cluster.high_watermark("t", 0), Some(2));
    /// # Ok(()) })
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `Config` if the partition does not exist.
    pub fn truncate(&self, topic: &str, partition: i32, offset: i64) -> Result<(i64, i32)> {
        let mut st = self.shared.lock();
        let p = st.partition_mut(topic, partition).ok_or_else(|| {
            Error::new(
                ErrorKind::Config,
                format!("mock cluster has no partition {topic}/{partition}"),
            )
        })?;
        let end = p.truncate(offset);
        let leader = p.leader;
        p.set_leader(leader);
        let epoch = p.leader_epoch;
        drop(st);
        self.shared.changed();
        Ok((end, epoch))
    }

    /// Stop broker `id` as a crash would: it stops accepting, every connection to it is
    /// closed and requests in progress are never answered. The partitions it led move to
    /// live brokers; groups it coordinated move with the coordinator.
    ///
    /// ```
    /// use kafkapipe::conn::Conn;
    /// use kafkapipe::mock::MockCluster;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().brokers(2).topic("t", 2).start().await?;
    /// let addr = cluster.broker_addr(1).unwrap_or_default();
    /// cluster.kill(1);
    /// assert!(Conn::connect(&addr).await.is_err());
    /// assert_eq!(cluster.leader("t", 0), Some(2), "moved to the live broker");
    /// cluster.restart(1).await?;
    /// assert!(Conn::connect(&addr).await.is_ok());
    /// # Ok(()) })
    /// # }
    /// ```
    pub fn kill(&self, id: i32) {
        let tasks = self
            .tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id)
            .unwrap_or_default();
        for t in tasks {
            t.abort();
        }
        let mut st = self.shared.lock();
        let mut moved = 0;
        if let Some(b) = st.brokers.iter_mut().find(|b| b.id == id) {
            b.up = false;
        }
        let live: Vec<i32> = st.live_brokers().map(|b| b.id).collect();
        for topic in st.topics.values_mut() {
            for p in &mut topic.partitions {
                if p.leader == id {
                    let to = if live.is_empty() {
                        -1
                    } else {
                        live[moved % live.len()]
                    };
                    moved += 1;
                    p.set_leader(to);
                }
            }
        }
        drop(st);
        self.shared.changed();
    }

    /// Start broker `id` again on its old port after [`kill`](Self::kill). Partitions
    /// without a leader (every broker was down) are led by it.
    ///
    /// # Cancellation safety
    ///
    /// Binding is the only await; dropping the future before it completes leaves the
    /// broker down.
    ///
    /// ```
    /// use kafkapipe::conn::Conn;
    /// use kafkapipe::mock::MockCluster;
    ///
    /// # fn main() -> kafkapipe::Result<()> {
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| kafkapipe::Error::io("runtime", e))?.block_on(async {
    /// let cluster = MockCluster::builder().start().await?;
    /// let addr = cluster.bootstrap()[0].clone();
    /// cluster.kill(1);
    /// assert!(Conn::connect(&addr).await.is_err());
    /// cluster.restart(1).await?;
    /// assert!(Conn::connect(&addr).await.is_ok());
    /// # Ok(()) })
    /// # }
    /// ```
    pub async fn restart(&self, id: i32) -> Result<()> {
        let addr = self
            .shared
            .lock()
            .brokers
            .iter()
            .find(|b| b.id == id)
            .map(|b| (b.addr, b.up));
        let Some((addr, up)) = addr else {
            return Err(Error::new(
                ErrorKind::Config,
                format!("mock cluster has no broker {id}"),
            ));
        };
        if up {
            return Ok(());
        }
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| Error::io(format!("mock broker {id} rebind {addr}"), e))?;
        self.listen(id, listener);
        let mut st = self.shared.lock();
        if let Some(b) = st.brokers.iter_mut().find(|b| b.id == id) {
            b.up = true;
        }
        for topic in st.topics.values_mut() {
            for p in &mut topic.partitions {
                if p.leader < 0 {
                    p.set_leader(id);
                }
            }
        }
        drop(st);
        self.shared.changed();
        Ok(())
    }
}
