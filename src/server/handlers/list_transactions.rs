//! ListTransactions (v0-2): every shard coordinates some ids, so ask them all. Filters
//! by state name (unknown names are listed back in `unknown_state_filters`, as Kafka),
//! by producer id, (v1) by duration: open transactions running longer than it, and (v2,
//! KIP-1152) by a regular expression the whole id must match (Kafka compiles it with
//! java.util.regex; here RE2 syntax, which KIP-848's topic regexes use too: what RE2
//! lacks, backreferences and lookaround, is refused). A pattern that does not compile
//! answers INVALID_REGULAR_EXPRESSION with no transactions.
//! While a shard loads a `__transaction_state` partition the answer is
//! COORDINATOR_LOAD_IN_PROGRESS with no transactions, as Kafka's. Only the ids the
//! principal may DESCRIBE are listed (the others are left out, not refused).

use bytes::Bytes;
use kafka_protocol::messages::list_transactions_response::TransactionState;
use kafka_protocol::messages::{
    ApiKey, ListTransactionsRequest, ListTransactionsResponse, ProducerId as WireProducerId, TransactionalId,
};

use crate::model::ShardId;
use crate::protocol::{decode_body, error_code, ProtocolError, RequestFrame};
use crate::security::acl::{AclOperation, ResourceType};
use crate::shard::TxnOp;

use super::super::context::ShardContext;
use super::super::now_ms;
use super::super::txn::{self, TxnOutcome};
use super::{authz, respond, str_bytes};

pub async fn handle(ctx: &ShardContext, frame: &RequestFrame) -> Result<Bytes, ProtocolError> {
    let req: ListTransactionsRequest = decode_body(frame)?;
    let pattern = match req.transactional_id_pattern.as_ref().map(|p| p.as_str()).filter(|p| !p.is_empty()) {
        None => None,
        Some(p) => match regex::Regex::new(&format!("^(?:{p})$")) {
            Ok(re) => Some(re),
            Err(e) => {
                tracing::debug!(pattern = p, error = %e, "ListTransactions: pattern refused");
                let body = ListTransactionsResponse::default().with_error_code(error_code::INVALID_REGULAR_EXPRESSION);
                return respond(ApiKey::ListTransactions, frame, &body);
            }
        },
    };
    let unknown: Vec<_> =
        req.state_filters.iter().filter(|s| txn::state_from_name(s.as_str()).is_none()).cloned().collect();
    let calls = (0..ctx.nr_shards).map(|s| txn::call(ctx, TxnOp::List, Some(ShardId(s))));
    let now = now_ms();
    let view = ctx.view();
    let describable = |id: &str| {
        authz::authorize_quietly(ctx, frame, &view, AclOperation::Describe, ResourceType::TransactionalId, id)
    };
    let mut listed = Vec::new();
    let mut loading = false;
    for outcome in futures::future::join_all(calls).await {
        match outcome {
            TxnOutcome::List(list) => {
                for (id, r) in list {
                    if !describable(&id) || pattern.as_ref().is_some_and(|re| !re.is_match(&id)) {
                        continue;
                    }
                    let name = txn::state_name(r.state);
                    if !req.state_filters.is_empty() && !req.state_filters.iter().any(|s| s.as_str() == name) {
                        continue;
                    }
                    if !req.producer_id_filters.is_empty()
                        && !req.producer_id_filters.iter().any(|p| p.0 == r.producer_id)
                    {
                        continue;
                    }
                    // v1: only transactions running longer than the filter (-1: any). As
                    // Kafka, an id with no open transaction (start -1) passes it.
                    if frame.api_version >= 1 && req.duration_filter >= 0 && now - r.start_ms <= req.duration_filter {
                        continue;
                    }
                    listed.push(
                        TransactionState::default()
                            .with_transactional_id(TransactionalId(str_bytes(id)))
                            .with_producer_id(WireProducerId(r.producer_id))
                            .with_transaction_state(str_bytes(name)),
                    );
                }
            }
            TxnOutcome::Loading => loading = true,
            _ => {}
        }
    }
    let body = if loading {
        ListTransactionsResponse::default().with_error_code(error_code::COORDINATOR_LOAD_IN_PROGRESS)
    } else {
        ListTransactionsResponse::default().with_transaction_states(listed)
    };
    respond(ApiKey::ListTransactions, frame, &body.with_unknown_state_filters(unknown))
}
