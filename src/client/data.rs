//! Produce, Fetch and ListOffsets, each routed to the partition leader.

use std::collections::BTreeMap;

use bytes::{Buf, Bytes, BytesMut};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{BrokerId, FetchRequest, ListOffsetsRequest, ProduceRequest};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions};

use super::{check, topic_name, Client, Error};

/// Broker-side wait for acks of a produce.
pub const produce_timeout_ms: i32 = 30_000;
/// Most bytes asked for per partition and per fetch.
pub const fetch_partition_bytes_max: i32 = 1024 * 1024;
pub const fetch_bytes_max: i32 = 50 * 1024 * 1024;
/// Kafka's ListOffsets timestamps for "earliest" and "latest".
pub const timestamp_earliest: i64 = -2;
pub const timestamp_latest: i64 = -1;

/// One record to produce.
#[derive(Clone, Debug)]
pub struct ProduceRecord {
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    pub headers: Vec<(String, Option<Bytes>)>,
    pub timestamp_ms: i64,
}

/// What one fetch of one partition returned.
#[derive(Debug, Default)]
#[allow(dead_code)] // high_watermark and log_start_offset are for callers beyond the CLI
pub struct FetchedPartition {
    pub records: Vec<Record>,
    pub high_watermark: i64,
    pub log_start_offset: i64,
}

impl Client {
    /// Produce `records` as one batch to one partition (one request); returns the base
    /// offset (-1 with acks=0, where the broker does not answer).
    pub fn produce(
        &mut self,
        topic: &str,
        partition: i32,
        records: &[ProduceRecord],
        acks: i16,
        compression: Compression,
    ) -> Result<i64, Error> {
        let batch: Vec<Record> = records
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let mut record = crate::protocol::plain_record(
                    i as i64,
                    -1,
                    r.timestamp_ms,
                    r.key.clone(),
                    r.value.clone(),
                    r.headers.iter().map(|(k, v)| (StrBytes::from_string(k.clone()), v.clone())).collect(),
                );
                // The encoder starts a new batch wherever `offset - sequence` changes (so a
                // fixed NO_SEQUENCE made one batch per record); a sequence that follows the
                // offset delta from NO_SEQUENCE keeps every record in one batch, whose
                // baseSequence is still -1 (no idempotence).
                record.sequence = kafka_protocol::records::NO_SEQUENCE.wrapping_add(i as i32);
                record
            })
            .collect();
        let mut buf = BytesMut::new();
        RecordBatchEncoder::encode(&mut buf, &batch, &RecordEncodeOptions { version: 2, compression })
            .map_err(|e| Error::Protocol(format!("encoding a record batch: {e}")))?;
        let records = buf.freeze();
        let req = ProduceRequest::default().with_acks(acks).with_timeout_ms(produce_timeout_ms).with_topic_data(vec![
            TopicProduceData::default().with_name(topic_name(topic)).with_partition_data(vec![
                PartitionProduceData::default().with_index(partition).with_records(Some(records.clone())),
            ]),
        ]);
        let context = || format!("produce to '{topic}' partition {partition}");
        self.with_retries(|c| {
            let leader = c.leader(topic, partition)?;
            if acks == 0 {
                let addr = c.node_addr(leader)?;
                return c.conn_to_addr(&addr)?.send_only(&req).map(|_| -1);
            }
            let (_, resp) = c.send_to(leader, &req)?;
            let p = resp
                .responses
                .iter()
                .flat_map(|t| t.partition_responses.iter())
                .find(|p| p.index == partition)
                .ok_or_else(|| Error::Protocol(format!("{}: no answer for the partition", context())))?;
            check(context, p.error_code, p.error_message.as_ref())?;
            Ok(p.base_offset)
        })
    }

    /// Fetch from one partition starting at `offset`. Records before `offset` (the head
    /// of a compressed batch) and control records are dropped.
    pub fn fetch(
        &mut self,
        topic: &str,
        partition: i32,
        offset: i64,
        max_wait_ms: i32,
    ) -> Result<FetchedPartition, Error> {
        let req = FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(max_wait_ms)
            .with_min_bytes(1)
            .with_max_bytes(fetch_bytes_max)
            .with_isolation_level(0)
            .with_session_epoch(-1)
            .with_topics(vec![FetchTopic::default().with_topic(topic_name(topic)).with_partitions(vec![
                FetchPartition::default()
                    .with_partition(partition)
                    .with_fetch_offset(offset)
                    .with_partition_max_bytes(fetch_partition_bytes_max)
                    .with_log_start_offset(-1)
                    .with_current_leader_epoch(-1),
            ])]);
        let context = || format!("fetch from '{topic}' partition {partition} at offset {offset}");
        self.with_retries(|c| {
            let leader = c.leader(topic, partition)?;
            let (_, resp) = c.send_to(leader, &req)?;
            check(context, resp.error_code, None)?;
            let p = resp
                .responses
                .iter()
                .flat_map(|t| t.partitions.iter())
                .find(|p| p.partition_index == partition)
                .ok_or_else(|| Error::Protocol(format!("{}: no answer for the partition", context())))?;
            check(context, p.error_code, None)?;
            let mut out = FetchedPartition {
                records: Vec::new(),
                high_watermark: p.high_watermark,
                log_start_offset: p.log_start_offset,
            };
            if let Some(records) = &p.records {
                for mut batch in split_batches(records.clone()) {
                    // Uncompressed batches are walked before the codec sees them (it
                    // reserves memory for the header counts it reads); compressed ones
                    // are inflated by the codec first and cannot be checked beforehand.
                    if batch.len() >= crate::log::batch::HEADER_BYTES {
                        let h = crate::log::batch::BatchHeader::parse(&batch);
                        if h.compression() == 0 {
                            crate::log::batch::check_records(&batch, &h)
                                .map_err(|e| Error::Protocol(format!("{}: bad record batch: {e}", context())))?;
                        }
                    }
                    let set = RecordBatchDecoder::decode(&mut batch)
                        .map_err(|e| Error::Protocol(format!("{}: bad record batch: {e}", context())))?;
                    out.records.extend(set.records.into_iter().filter(|r| !r.control && r.offset >= offset));
                }
            }
            Ok(out)
        })
    }

    /// Offsets for `timestamp` (or `timestamp_earliest` / `timestamp_latest`) of each
    /// partition, asking each partition's leader.
    pub fn list_offsets(
        &mut self,
        topic: &str,
        partitions: &[i32],
        timestamp: i64,
    ) -> Result<BTreeMap<i32, i64>, Error> {
        let mut out = BTreeMap::new();
        for &partition in partitions {
            let req = ListOffsetsRequest::default().with_replica_id(BrokerId(-1)).with_topics(vec![
                ListOffsetsTopic::default().with_name(topic_name(topic)).with_partitions(vec![
                    ListOffsetsPartition::default()
                        .with_partition_index(partition)
                        .with_timestamp(timestamp)
                        .with_current_leader_epoch(-1),
                ]),
            ]);
            let context = || format!("list offsets of '{topic}' partition {partition}");
            let offset = self.with_retries(|c| {
                let leader = c.leader(topic, partition)?;
                let (_, resp) = c.send_to(leader, &req)?;
                let p = resp
                    .topics
                    .iter()
                    .flat_map(|t| t.partitions.iter())
                    .find(|p| p.partition_index == partition)
                    .ok_or_else(|| Error::Protocol(format!("{}: no answer for the partition", context())))?;
                check(context, p.error_code, None)?;
                Ok(p.offset)
            })?;
            out.insert(partition, offset);
        }
        Ok(out)
    }
}

/// The complete record batches of a fetched record set (a trailing partial batch,
/// which the protocol allows, is left out).
fn split_batches(mut records: Bytes) -> Vec<Bytes> {
    let mut out = Vec::new();
    while records.len() >= 12 {
        let batch_len = (&records[8..12]).get_i32();
        if batch_len < 0 {
            break;
        }
        let total = 12 + batch_len as usize;
        if records.len() < total {
            break;
        }
        out.push(records.split_to(total));
    }
    out
}
