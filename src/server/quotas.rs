//! Client quotas on a shard: the request's principal and client id are looked up in the
//! view's quotas (`security::entity`), the measured value is added to the broker-wide
//! `QuotaManager` (held by `Metrics`, shared by every shard, lock-free), and the throttle
//! time it answers goes into the response's `throttle_time_ms` and
//! `Response::throttle_ms`, which mutes the connection after the response is sent
//! (`connection.rs`, KIP-219).
//!
//! What is measured, as Kafka's quota managers do:
//! - produce: the request's body bytes, against `producer_byte_rate` (`handlers/produce.rs`);
//! - fetch by a consumer: the response's bytes, against `consumer_byte_rate`
//!   (`handlers/fetch.rs`, `record_fetch`); a throttled fetch is answered empty and its
//!   bytes taken back;
//! - every request but those exempt (`request_quota_exempt`): the time the handler's
//!   future spent in `poll` on this core, against `request_percentage` (the connection is
//!   muted; the body's `throttle_time_ms` carries only the byte quotas').

use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use kafka_protocol::messages::ApiKey;

use crate::protocol::RequestFrame;
use crate::security::entity::QuotaKind;
use crate::security::quota::handler_time_value;

use super::context::ShardContext;

/// Milliseconds on a monotonic clock shared by every shard (windows are aligned to it).
pub fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// Who a request is accounted to: its principal's name and its client id.
pub struct QuotaClient {
    pub user: std::sync::Arc<crate::security::Principal>,
    pub client_id: String,
}

impl QuotaClient {
    pub fn of(frame: &RequestFrame) -> Self {
        let client_id = frame.header.as_ref().and_then(|h| h.client_id.as_ref()).map(|c| c.to_string());
        QuotaClient { user: frame.principal.clone(), client_id: client_id.unwrap_or_default() }
    }
}

/// Whether a quota applies to this request's client: its connection is then served one
/// request at a time (`connection.rs`), as Kafka serves every connection, so that a
/// pipelining client cannot have several requests measured before its first throttle.
pub fn applies(ctx: &ShardContext, frame: &RequestFrame) -> bool {
    let view = ctx.view();
    let configs = view.entity_configs();
    if configs.quotas.is_empty() {
        return false;
    }
    let client = QuotaClient::of(frame);
    [QuotaKind::Produce, QuotaKind::Fetch, QuotaKind::Request]
        .into_iter()
        .any(|kind| configs.quota_for(kind, &client.user.name, &client.client_id).is_some())
}

/// Record `value` of `kind` for this request; the throttle time its quota asks for (0
/// without a quota).
pub fn record(ctx: &ShardContext, frame: &RequestFrame, kind: QuotaKind, value: u64) -> u64 {
    let view = ctx.view();
    if view.entity_configs().quotas.is_empty() {
        return 0;
    }
    record_for(ctx, &QuotaClient::of(frame), kind, value)
}

fn record_for(ctx: &ShardContext, client: &QuotaClient, kind: QuotaKind, value: u64) -> u64 {
    let view = ctx.view();
    let configs = view.entity_configs();
    let Some(r) = ctx.metrics.quotas.record(configs, kind, &client.user.name, &client.client_id, value, now_ms())
    else {
        return 0;
    };
    ctx.metrics.record_quota(ctx.id, kind, &r.entity, value, r.throttle_ms);
    r.throttle_ms
}

/// Record a consumer fetch response of `value` bytes; the throttle time its quota asks
/// for (0 without a quota). A throttled fetch is answered empty (Kafka's answer), so its
/// bytes are taken back from the rate (Kafka's `unrecordQuotaSensor`) and not counted
/// in `spate_quota_bytes_total`, which counts the bytes sent.
pub fn record_fetch(ctx: &ShardContext, frame: &RequestFrame, value: u64) -> u64 {
    let view = ctx.view();
    let configs = view.entity_configs();
    if configs.quotas.is_empty() {
        return 0;
    }
    let client = QuotaClient::of(frame);
    let quotas = &ctx.metrics.quotas;
    let Some(r) = quotas.record(configs, QuotaKind::Fetch, &client.user.name, &client.client_id, value, now_ms())
    else {
        return 0;
    };
    let sent = if r.throttle_ms > 0 {
        quotas.unrecord(QuotaKind::Fetch, &r.entity, value, now_ms());
        0
    } else {
        value
    };
    ctx.metrics.record_quota(ctx.id, QuotaKind::Fetch, &r.entity, sent, r.throttle_ms);
    r.throttle_ms
}

/// Requests the request quota leaves alone: ApiVersions (Kafka exempts it too) and the
/// brokers' own APIs (Kafka's cluster actions); replication fetches are not told apart
/// here (they are exempt from the fetch byte quota in `handlers/fetch.rs`).
pub fn request_quota_exempt(key: ApiKey) -> bool {
    matches!(
        key,
        ApiKey::ApiVersions
            | ApiKey::BrokerRegistration
            | ApiKey::BrokerHeartbeat
            | ApiKey::AlterPartition
            | ApiKey::WriteTxnMarkers
            | ApiKey::Envelope
    )
}

/// Whether any request quota is configured (else the handler is not timed).
pub fn request_quota_configured(ctx: &ShardContext) -> bool {
    ctx.view().entity_configs().quotas.values().any(|q| q.request_percentage.is_some())
}

/// Record a handler's busy time against the request quota.
pub fn record_handler_time(ctx: &ShardContext, client: &QuotaClient, busy: Duration) -> u64 {
    record_for(ctx, client, QuotaKind::Request, handler_time_value(busy.as_nanos() as u64))
}

/// A future and the time it spent in `poll` (its work on this core, not its waits).
pub struct Busy<F> {
    inner: Pin<Box<F>>,
    busy: Duration,
}

impl<F: Future> Busy<F> {
    pub fn new(inner: F) -> Self {
        Busy { inner: Box::pin(inner), busy: Duration::ZERO }
    }
}

impl<F: Future> Future for Busy<F> {
    type Output = (F::Output, Duration);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let started = Instant::now();
        let polled = this.inner.as_mut().poll(cx);
        this.busy += started.elapsed();
        polled.map(|out| (out, this.busy))
    }
}
