//! Mapping between the API's protobuf messages and the orchestrator's own
//! types, in one place: statuses from errors, jobs and events to the
//! client, and what a request carries besides its fields (its trace
//! context, its fingerprint).

use tonic::Status;
use tonic_types::StatusExt as _;
use toolfleet_proto::envelope::excerpt;
use toolfleet_proto::names;
use toolfleet_proto::v1::{self, item};
use toolfleet_service::traces::{self, SpanContext};
use tracing::warn;

use super::ECHO_CHARS;
use crate::job::{Event, Item, JobId, JobRecord, JobTrace};
use crate::quota::{AdmitError, Refusal};
use crate::registry::FleetTool;
use crate::store::{self, Approvals, JobCounts};

/// The one conversion from a store failure to a gRPC status. The detail goes
/// to the log, not to the client.
pub(crate) fn to_status(err: &store::Error) -> Status {
    match err {
        store::Error::Redis(source) => {
            warn!(error = %source, "job store unavailable");
            Status::unavailable("the job store is unavailable; retry later")
        }
        store::Error::LeaseLost(_) => Status::aborted("the job changed hands; retry"),
        store::Error::IdempotencyConflict(key) => Status::already_exists(format!(
            "idempotency_key: {:?} was used for a different request; use a new key for a new \
             request",
            excerpt(key, ECHO_CHARS)
        )),
        // Only a round's result commit meets it, and the round reads the
        // stored result instead; no request answers with it.
        store::Error::ResultMismatch(_) => Status::internal("a tool result was inconsistent"),
        store::Error::Corrupt { job_id, .. } => {
            warn!(error = %err, "corrupt job record");
            Status::internal(format!("the record of job {job_id} is unreadable"))
        }
        // Said whole: the format is the job's, not a secret, and tells the
        // operator which release can read it.
        store::Error::Unreadable { .. } => {
            warn!(error = %err, "a job in a format this release does not read");
            Status::failed_precondition(format!("{err}; ask an orchestrator of a newer release"))
        }
    }
}

/// `RESOURCE_EXHAUSTED` for a submission a tenant's limit refused, with a
/// `google.rpc.RetryInfo` saying when to try again.
pub(super) fn refused(refusal: &Refusal) -> Status {
    Status::with_error_details(
        tonic::Code::ResourceExhausted,
        refusal.to_string(),
        tonic_types::ErrorDetails::with_retry_info(Some(refusal.retry_after())),
    )
}

/// The status of a submission that was not admitted.
pub(super) fn not_admitted(err: &AdmitError) -> Status {
    match err {
        AdmitError::Refused(refusal) => refused(refusal),
        AdmitError::Store(err) => to_status(err),
    }
}

/// The same answer for a job of another tenant as for no job at all.
pub(super) fn not_found(job_id: &str) -> Status {
    Status::not_found(format!(
        "job {} not found (unknown or expired)",
        excerpt(job_id, ECHO_CHARS)
    ))
}

pub(super) fn invalid(field: &str, problem: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("{field}: {problem}"))
}

/// SHA-256 (hex) of everything a submission asks for, in a canonical form:
/// an idempotency key returns the first job only to the same request.
pub(super) fn fingerprint(request: &v1::SubmitJobRequest) -> String {
    use sha2::{Digest, Sha256};
    let model = request.model.as_ref().map(|m| match m.max_tokens {
        // Unset, as before the field: the fingerprints stay the same.
        0 => serde_json::json!([m.provider, m.name, m.script, m.base_url]),
        n => serde_json::json!([m.provider, m.name, m.script, m.base_url, n]),
    });
    let metadata: std::collections::BTreeMap<&String, &String> = request.metadata.iter().collect();
    let mut canonical = serde_json::json!({
        "input": request.input,
        "instructions": request.instructions,
        "model": model,
        "tools": request.tools,
        "max_tool_rounds": request.max_tool_rounds,
        "parallel_tool_calls": request.parallel_tool_calls,
        "deadline_ms": request.deadline_ms,
        "metadata": metadata,
    });
    // Only when set: the fingerprints of other jobs stay what they were.
    if let Some(call) = &request.call {
        canonical["call"] = serde_json::json!([call.tool, call.arguments]);
    }
    if let Some(stream) = request.stream {
        canonical["stream"] = serde_json::json!(stream);
    }
    // What may run unasked is part of the request: the same key with
    // another approval list or unknown-outcome rule is another request.
    // A set of names, so their order does not count.
    if !request.require_approval.is_empty() {
        let held: std::collections::BTreeSet<&String> = request.require_approval.iter().collect();
        canonical["require_approval"] = serde_json::json!(held);
    }
    // Empty means "report".
    if !matches!(request.on_unknown_outcome.as_str(), "" | "report") {
        canonical["on_unknown_outcome"] = serde_json::json!(request.on_unknown_outcome);
    }
    format!("{:x}", Sha256::digest(canonical.to_string().as_bytes()))
}

/// An event for the client; `trace_id` goes on the first of a stream.
pub(super) fn to_event(job_id: &JobId, event: Event, trace_id: Option<String>) -> v1::JobEvent {
    v1::JobEvent {
        trace_id: trace_id.unwrap_or_default(),
        job_id: job_id.to_string(),
        offset: event.offset,
        kind: event.kind,
        data: event.data,
        timestamp_ms: event.timestamp_ms,
        r#final: event.is_final,
    }
}

/// The counts of a `ListJobs` answer: one entry per status, in the enum's
/// order.
pub(super) fn to_counts(counts: &JobCounts) -> Vec<v1::JobStatusCount> {
    counts
        .by_status
        .iter()
        .map(|(status, jobs)| v1::JobStatusCount {
            status: v1::JobStatus::from(*status).into(),
            jobs: *jobs,
        })
        .collect()
}

pub(super) fn to_job(record: JobRecord, items: &[Item], approvals: Approvals) -> v1::Job {
    v1::Job {
        held_calls: held_calls(approvals),
        job_id: record.job_id.into(),
        status: v1::JobStatus::from(record.status).into(),
        output_text: record.output_text,
        error: record.error.map(|e| v1::JobError {
            code: e.code.to_string(),
            message: e.message,
        }),
        rounds: record.rounds,
        items: items.iter().filter_map(to_item).collect(),
        metadata: record.spec.metadata.into_iter().collect(),
        created_at_ms: record.created_at_ms,
        finished_at_ms: record.finished_at_ms,
        trace_id: record
            .trace
            .as_ref()
            .map(JobTrace::trace_id)
            .unwrap_or_default(),
        submitter: record.spec.submitter.unwrap_or_default(),
        budget: (!record.spec.budget.is_empty()).then_some(v1::Budget {
            max_tokens: record.spec.budget.max_tokens,
            max_cost_units: record.spec.budget.max_cost_units,
            max_tool_calls: record.spec.budget.max_tool_calls,
        }),
        spent: Some(v1::Spend {
            tokens: record.spent.tokens,
            cost_units: record.spent.cost_units,
            tool_calls: record.spent.tool_calls,
        }),
    }
}

/// A job's held calls, in the order they were held, with their decisions.
fn held_calls(approvals: Approvals) -> Vec<v1::HeldCall> {
    let Approvals {
        requests,
        mut decisions,
    } = approvals;
    let mut held: Vec<v1::HeldCall> = requests
        .into_iter()
        .map(|(key, request)| {
            let decision = decisions.remove(&key);
            let kind = request.kind().to_owned();
            let mut call = v1::HeldCall {
                call_id: request.call_id.into(),
                tool: request.tool,
                tool_version: request.tool_version.unwrap_or_default(),
                kind,
                attempt: request.attempt.unwrap_or_default(),
                requested_at_ms: request.requested_at_ms,
                expires_at_ms: request.expires_at_ms,
                ..Default::default()
            };
            if let Some(decision) = decision {
                call.decision = decision.word().to_owned();
                call.reason = decision.reason;
                call.decided_by_tenant = decision.tenant;
                call.approver = decision.approver.unwrap_or_default();
                call.decided_at_ms = decision.at_ms;
                call.arguments = decision.arguments;
                call.result = decision.result;
            }
            call
        })
        .collect();
    held.sort_by(|a, b| {
        (a.requested_at_ms, &a.call_id, a.attempt).cmp(&(b.requested_at_ms, &b.call_id, b.attempt))
    });
    held
}

/// A conversation item as a client sees it; reasoning stays inside.
fn to_item(item: &Item) -> Option<v1::Item> {
    let kind = match item {
        Item::User { text } => item::Kind::User(v1::UserMessage { text: text.clone() }),
        Item::Assistant { text, .. } => {
            item::Kind::Assistant(v1::AssistantMessage { text: text.clone() })
        }
        Item::ToolCall {
            call_id,
            name,
            arguments,
            ..
        } => item::Kind::ToolCall(v1::ToolCallItem {
            call_id: call_id.clone(),
            name: name.clone(),
            arguments: arguments.clone(),
        }),
        Item::ToolResult {
            call_id,
            name,
            output,
            attempts,
        } => item::Kind::ToolResult(v1::ToolResultItem {
            call_id: call_id.clone(),
            name: name.clone(),
            output: output.clone(),
            attempts: *attempts,
        }),
        Item::Reasoning { .. } => return None,
    };
    Some(v1::Item { kind: Some(kind) })
}

/// A live tool as `ListTools` shows it.
/// `listed` as `ListTools` tells it; with the fleet's details only when
/// `fleet` (decision 0052).
/// `breaker` is its breaker's state, if it has one (`crate::breaker`).
pub(super) fn to_tool(
    listed: &FleetTool,
    fleet: bool,
    breaker: Option<&crate::breaker::State>,
) -> v1::Tool {
    let (tool, manifest) = (&listed.tool, &listed.tool.manifest);
    let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    let details = fleet.then_some(listed);
    v1::Tool {
        name: manifest.name.clone(),
        description: manifest.description.clone(),
        parameters: manifest.parameters.to_string(),
        strict: manifest.strict,
        workers: count(tool.workers),
        timeout_ms: manifest.timeout_ms,
        max_attempts: manifest.max_attempts,
        side_effects: manifest.effects.changes_things(),
        effects: manifest.effects.as_str().to_owned(),
        version: manifest.version.clone(),
        approval: manifest.approval.as_str().to_owned(),
        pools: details.map(|d| d.pools.clone()).unwrap_or_default(),
        workers_unavailable: details.map_or(0, |d| count(d.workers_unavailable)),
        calls_waiting: details.and_then(|d| d.calls_waiting),
        mcp_server: details.map(|d| d.mcp_server.clone()).unwrap_or_default(),
        available: listed.available,
        contract_hash: tool.contract.to_string(),
        breaker: breaker.map(|b| b.name().to_owned()).unwrap_or_default(),
        breaker_since_ms: breaker.and_then(crate::breaker::State::since_ms),
        versions: details
            .map(|d| {
                d.versions
                    .iter()
                    .map(|version| v1::ToolVersion {
                        contract_hash: version.contract.to_string(),
                        workers: count(version.workers),
                        offered: version.offered,
                    })
                    .collect()
            })
            .unwrap_or_default(),
    }
}

/// The W3C trace context a client sent with its request, if valid.
pub(super) fn client_trace(metadata: &tonic::metadata::MetadataMap) -> Option<SpanContext> {
    let header = |name: &str| metadata.get(name).and_then(|v| v.to_str().ok());
    traces::extract(
        header(names::headers::TRACEPARENT),
        header(names::headers::TRACESTATE),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_store_error_maps_to_a_status() {
        let redis = store::Error::Redis(redis::RedisError::from(std::io::Error::other(
            "down at 10.0.0.1",
        )));
        let status = to_status(&redis);
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert!(!status.message().contains("10.0.0.1"));
        assert_eq!(
            to_status(&store::Error::LeaseLost(JobId::new("t", 1, 2))).code(),
            tonic::Code::Aborted
        );
        let corrupt = store::Error::Corrupt {
            job_id: JobId::new("t", 1, 2),
            detail: "spec".into(),
        };
        assert_eq!(to_status(&corrupt).code(), tonic::Code::Internal);
        let conflict = to_status(&store::Error::IdempotencyConflict("k".repeat(10_000)));
        assert_eq!(conflict.code(), tonic::Code::AlreadyExists);
        assert!(conflict.message().starts_with("idempotency_key: "));
        assert!(conflict.message().len() < 300);
    }

    #[test]
    fn fingerprints_tell_requests_apart_and_ignore_map_order() {
        let request = |input: &str, metadata: &[(&str, &str)]| v1::SubmitJobRequest {
            input: input.into(),
            metadata: metadata
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ..Default::default()
        };
        let a = fingerprint(&request("hi", &[("a", "1"), ("b", "2")]));
        assert_eq!(a, fingerprint(&request("hi", &[("b", "2"), ("a", "1")])));
        assert_ne!(a, fingerprint(&request("hi!", &[("a", "1"), ("b", "2")])));
        assert_ne!(a, fingerprint(&request("hi", &[("a", "1")])));
        assert_eq!(a.len(), 64);
        // max_tokens counts when set, and an unset one leaves a request's
        // fingerprint what it was before the field.
        let model = |max_tokens| v1::SubmitJobRequest {
            model: Some(v1::ModelSpec {
                provider: "anthropic-messages".into(),
                name: "claude".into(),
                max_tokens,
                ..Default::default()
            }),
            ..Default::default()
        };
        let before = serde_json::json!({
            "input": "", "instructions": "",
            "model": ["anthropic-messages", "claude", "", ""],
            "tools": [], "max_tool_rounds": 0, "parallel_tool_calls": null,
            "deadline_ms": 0, "metadata": {},
        });
        use sha2::{Digest, Sha256};
        let hashed = format!("{:x}", Sha256::digest(before.to_string().as_bytes()));
        assert_eq!(fingerprint(&model(0)), hashed);
        assert_ne!(fingerprint(&model(0)), fingerprint(&model(512)));
    }

    /// A retry with the same key that asks for approvals, or another
    /// unknown-outcome rule, must not get the first job, which runs its
    /// calls unasked.
    #[test]
    fn fingerprints_count_approvals_and_the_unknown_outcome_rule() {
        let request = |held: &[&str], rule: &str| v1::SubmitJobRequest {
            input: "pay the invoice".into(),
            require_approval: held.iter().map(|t| (*t).to_owned()).collect(),
            on_unknown_outcome: rule.into(),
            ..Default::default()
        };
        let plain = fingerprint(&request(&[], ""));
        let held = fingerprint(&request(&["pay", "refund"], ""));
        assert_ne!(plain, held);
        assert_eq!(held, fingerprint(&request(&["refund", "pay"], "")));
        assert_ne!(held, fingerprint(&request(&["pay"], "")));
        assert_ne!(plain, fingerprint(&request(&[], "ask")));
        assert_eq!(plain, fingerprint(&request(&[], "report")), "the default");
    }

    #[test]
    fn the_fleets_details_go_only_to_those_who_watch_it() {
        use crate::registry::LiveTool;
        use toolfleet_proto::ToolManifest;
        let manifest = ToolManifest::new("crm__find", "Finds.", serde_json::json!({}));
        let listed = FleetTool {
            tool: LiveTool {
                workers: 1,
                ..LiveTool::known(manifest).expect("the schema compiles")
            },
            available: true,
            pools: vec!["mcp".into()],
            workers_unavailable: 2,
            calls_waiting: Some(7),
            mcp_server: "crm".into(),
            versions: vec![crate::registry::LiveVersion {
                contract: "c0ffee".into(),
                workers: 1,
                offered: true,
            }],
        };
        let watcher = to_tool(&listed, true, None);
        assert_eq!(
            watcher.versions,
            [v1::ToolVersion {
                contract_hash: "c0ffee".into(),
                workers: 1,
                offered: true
            }]
        );
        assert_eq!(watcher.pools, ["mcp"]);
        assert_eq!(
            (
                watcher.workers,
                watcher.workers_unavailable,
                watcher.calls_waiting
            ),
            (1, 2, Some(7))
        );
        assert_eq!(watcher.mcp_server, "crm");
        assert!(watcher.available);
        let open = crate::breaker::State::from_field("open:1700000000000:1700000030000:6:10");
        let agent = to_tool(&listed, false, Some(&open));
        // The breaker is every tenant's business: its calls are refused.
        assert_eq!(
            (agent.breaker.as_str(), agent.breaker_since_ms),
            ("open", Some(1_700_000_000_000))
        );
        assert_eq!(
            (watcher.breaker.as_str(), watcher.breaker_since_ms),
            ("", None)
        );
        assert!(agent.pools.is_empty() && agent.mcp_server.is_empty());
        assert!(agent.versions.is_empty());
        assert_eq!(
            (
                agent.workers,
                agent.workers_unavailable,
                agent.calls_waiting
            ),
            (1, 0, None)
        );
        assert_eq!(agent.name, watcher.name);
    }
}
