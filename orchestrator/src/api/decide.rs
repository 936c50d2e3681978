//! `DecideCall`: a person approves or rejects a held call (decision 0036).
//! The request is checked here (the job is the caller's, the call is held,
//! edited arguments match the tool's schema); the store writes the first
//! decision of a call only, and re-queues a parked job.

use tonic::Status;
use toolfleet_proto::envelope::excerpt;
use toolfleet_proto::names::span_attributes;
use toolfleet_proto::{EventId, check_arguments, v1};

use super::convert::{invalid, to_status};
use super::{AgentApi, ECHO_CHARS};
use crate::auth::{Caller, Role, Rpc};
use crate::hold::{ApprovalChoice, Choice, Decision, Hold, Verdict};
use crate::job::{JobRecord, JobStatus, now_ms};
use crate::publish;
use crate::registry::LiveTool;
use crate::spans;
use crate::store::{ApprovalRequest, Decided, PendingCursor, Seen};

/// Longest reason a decision may give: the model reads it.
const MAX_REASON_BYTES: usize = 4096;

impl AgentApi {
    /// Records a person's decision on a held call; the job's status after.
    pub(super) async fn decide(
        &self,
        request: v1::DecideCallRequest,
        caller: &Caller,
    ) -> Result<JobStatus, Status> {
        let choice = choice(request.decision)?;
        caller.check(match choice {
            Choice::Approval(_) => Rpc::DecideApproval,
            Choice::Verdict(_) => Rpc::DecideVerdict,
        })?;
        check_reason(&request.reason, choice)?;
        let result = self.checked_result(request.result, choice)?;
        let record = self.tenants_job(&request.job_id, caller).await?;
        let job_id = record.job_id.clone();
        let approvals = self
            .store
            .approvals(&job_id)
            .await
            .map_err(|e| to_status(&e))?;
        // A call id that is not an event id names no held call.
        let held = EventId::parse(&request.call_id).and_then(|id| approvals.hold_of(&id));
        let Some((hold, held)) = held else {
            return Err(Status::not_found(format!(
                "job {job_id} has no call {:?} held for a decision",
                excerpt(&request.call_id, ECHO_CHARS)
            )));
        };
        check_kind(hold, held, choice)?;
        let arguments = match request.arguments {
            Some(_) if choice != Choice::Approval(ApprovalChoice::Approved) => {
                return Err(invalid(
                    "arguments",
                    "are for an approval; only an approved call runs with them",
                ));
            }
            Some(arguments) => Some(self.checked_arguments(&record, held, arguments).await?),
            None => None,
        };
        let decision = Decision {
            choice,
            reason: request.reason,
            arguments,
            result,
            tenant: caller.tenant.clone(),
            approver: caller.person.clone(),
            at_ms: now_ms(),
        };
        let decided = self
            .store
            .decide(&job_id, hold, held, &decision, Seen::of(&record))
            .await
            .map_err(|e| to_status(&e))?;
        if let Decided::Recorded { .. } = decided {
            record_wait(&record, hold, held, &decision);
        }
        self.answer(decided, &decision, &record, hold, held).await
    }

    /// The result an operator gives with `DECISION_APPLIED`: JSON within
    /// the size limit, and given with no other decision.
    fn checked_result(
        &self,
        result: Option<String>,
        choice: Choice,
    ) -> Result<Option<String>, Status> {
        let Some(result) = result else {
            return Ok(None);
        };
        if choice != Choice::Verdict(Verdict::Applied) {
            return Err(invalid(
                "result",
                "is for DECISION_APPLIED: the result of a call that was applied",
            ));
        }
        if result.len() > self.options.max_input_bytes {
            return Err(invalid(
                "result",
                format!(
                    "is {} bytes; the limit is {}",
                    result.len(),
                    self.options.max_input_bytes
                ),
            ));
        }
        if let Err(err) = serde_json::from_str::<serde::de::IgnoredAny>(&result) {
            return Err(invalid("result", format!("is not JSON: {err}")));
        }
        Ok(Some(result))
    }

    /// The answer to `decision`, which the store `decided`, on the call
    /// `held` (under its `hold`) of the job `record`; a job the
    /// decision queued again is published. A retry of the decision that
    /// was recorded (the same decision, arguments, result, tenant and
    /// approver; the reason may differ) is answered as the first was, and
    /// publishes the job again if no runner has taken it yet.
    async fn answer(
        &self,
        decided: Decided,
        decision: &Decision,
        record: &JobRecord,
        hold: &Hold,
        held: &ApprovalRequest,
    ) -> Result<JobStatus, Status> {
        let (job_id, call_id) = (&record.job_id, &held.call_id);
        match decided {
            Decided::Recorded { requeued: false } => Ok(record.status),
            Decided::Recorded { requeued: true } => {
                self.queue_decided(record, hold).await;
                Ok(JobStatus::WaitingForApproval)
            }
            Decided::Already { first, requeued } if decision.repeats(&first) => {
                if requeued {
                    self.queue_decided(record, hold).await;
                    return Ok(JobStatus::WaitingForApproval);
                }
                Ok(record.status)
            }
            Decided::Already { first, .. } => Err(Status::failed_precondition(format!(
                "call {call_id} of job {job_id} was already {} by {} at {} (Unix ms); \
                 a call is decided once",
                first.word(),
                who(&first),
                first.at_ms
            ))),
            Decided::Expired => {
                let (what, then) = match hold {
                    Hold::Approval { .. } => ("approval", "it is answered APPROVAL_EXPIRED"),
                    Hold::Verdict { .. } => (
                        "request for a verdict",
                        "the model is told what its worker answered",
                    ),
                };
                Err(Status::failed_precondition(format!(
                    "the {what} of call {call_id} of job {job_id} expired at {} (Unix ms); {then}",
                    held.expires_at_ms,
                )))
            }
            Decided::Ended => Err(Status::failed_precondition(format!(
                "job {job_id} has ended; its calls can no longer be decided"
            ))),
            Decided::NotHeld => Err(Status::not_found(format!(
                "job {job_id} has no call {call_id} held for a decision"
            ))),
            Decided::Busy => Err(Status::unavailable(format!(
                "job {job_id} parked again each time the decision was tried; \
                 nothing was recorded: try again"
            ))),
        }
    }

    /// Publishes the job `record`, which a decision on the call's `hold`
    /// queued again. A lost publish is found by the sweeper
    /// (the job is in the index of unfinished jobs), and a retried one is
    /// one message: its id is the decision's.
    async fn queue_decided(&self, record: &JobRecord, hold: &Hold) {
        let job_id = &record.job_id;
        let message_id = format!("{job_id}:decided:{hold}");
        let queued = publish::job(&self.js, job_id, &record.spec.tenant, &message_id);
        if let Err(err) = queued.await {
            tracing::warn!(%job_id, error = ?err, "could not queue the decided job; the sweeper will");
        }
    }

    /// `arguments` for the held call `held`, if they are a JSON object
    /// within the size limit that matches its tool's schema.
    async fn checked_arguments(
        &self,
        record: &JobRecord,
        held: &ApprovalRequest,
        arguments: String,
    ) -> Result<String, Status> {
        if arguments.len() > self.options.max_input_bytes {
            return Err(invalid(
                "arguments",
                format!(
                    "are {} bytes; the limit is {}",
                    arguments.len(),
                    self.options.max_input_bytes
                ),
            ));
        }
        let tool = self.pinned_tool(record, held).await?;
        check_arguments(&held.tool, &tool.validator, &arguments)
            .map_err(|envelope| invalid("arguments", envelope_message(&envelope)))?;
        Ok(arguments)
    }

    /// The version of `held`'s tool its call was made for: as the job's
    /// model was offered it (the job keeps it), which is what the call runs
    /// on (decision 0058); for a tool the model was never offered, the live
    /// one.
    async fn pinned_tool(
        &self,
        record: &JobRecord,
        held: &ApprovalRequest,
    ) -> Result<LiveTool, Status> {
        let name = held.tool.as_str();
        let start = self
            .store
            .load_run(&record.job_id)
            .await
            .map_err(|e| to_status(&e))?;
        start
            .and_then(|start| start.offered.into_iter().find(|m| m.name == name))
            .and_then(LiveTool::known)
            .or_else(|| self.registry.get(name))
            .ok_or_else(|| {
                Status::failed_precondition(format!(
                    "the tool {name} is not known now; its arguments cannot be checked: \
                     approve without arguments, or when its workers are back"
                ))
            })
    }
}

/// The wait that `decision` ended, in the metrics and as a span of the
/// job's trace, from when the call was held.
fn record_wait(record: &JobRecord, hold: &Hold, held: &ApprovalRequest, decision: &Decision) {
    // The span names the call, not its hold.
    let wire_id = hold.wire_id();
    let waited = decision.at_ms.saturating_sub(held.requested_at_ms);
    let waited = std::time::Duration::from_millis(waited);
    crate::metrics::approval_decided(&held.tool, decision.word(), Some(waited));
    let call = spans::CallRef {
        tool: &held.tool,
        wire_id,
        event_id: &held.call_id,
        // Not set on an approval's span: what the call said is its own.
        call_id: held.call_id.as_str(),
        arguments: &held.arguments,
    };
    let mut span = spans::approval(record.trace.as_ref(), call);
    let held_at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(held.requested_at_ms);
    span.started_at(held_at);
    span.set(span_attributes::DECISION, decision.word());
    span.set(span_attributes::APPROVAL_RULE, held.rule.clone());
    span.set(span_attributes::APPROVAL_KIND, hold.kind());
    span.set(span_attributes::TENANT, decision.tenant.clone());
    if let Some(approver) = &decision.approver {
        span.set(span_attributes::APPROVER, approver.clone());
    }
    span.end();
}

/// What the request's `decision` asks for.
fn choice(decision: i32) -> Result<Choice, Status> {
    Ok(match v1::Decision::try_from(decision) {
        Ok(v1::Decision::Approve) => Choice::Approval(ApprovalChoice::Approved),
        Ok(v1::Decision::Reject) => Choice::Approval(ApprovalChoice::Rejected),
        Ok(v1::Decision::Applied) => Choice::Verdict(Verdict::Applied),
        Ok(v1::Decision::NotApplied) => Choice::Verdict(Verdict::NotApplied),
        Ok(v1::Decision::Fail) => Choice::Verdict(Verdict::Failed),
        _ => {
            return Err(invalid(
                "decision",
                "must be DECISION_APPROVE or DECISION_REJECT (a call held for approval), \
                 or DECISION_APPLIED, DECISION_NOT_APPLIED or DECISION_FAIL (a call whose \
                 outcome is unknown)",
            ));
        }
    })
}

/// Whether `choice` answers what `held` waits for (its `hold`): an
/// approval, or a verdict on an unknown outcome.
fn check_kind(hold: &Hold, held: &ApprovalRequest, choice: Choice) -> Result<(), Status> {
    if hold.is_answered_by(choice) {
        return Ok(());
    }
    match hold {
        Hold::Approval { .. } => Err(invalid(
            "decision",
            format!(
                "call {} waits for approval before it runs: DECISION_APPROVE or DECISION_REJECT",
                held.call_id
            ),
        )),
        Hold::Verdict { attempt, .. } => Err(invalid(
            "decision",
            format!(
                "the outcome of attempt {attempt} of call {} is unknown: DECISION_APPLIED, \
                 DECISION_NOT_APPLIED or DECISION_FAIL",
                held.call_id
            ),
        )),
    }
}

/// A reason within [`MAX_REASON_BYTES`], and given when rejecting or
/// failing a call (the model reads it).
fn check_reason(reason: &str, choice: Choice) -> Result<(), Status> {
    if reason.len() > MAX_REASON_BYTES {
        return Err(invalid(
            "reason",
            format!("is {} bytes; the limit is {MAX_REASON_BYTES}", reason.len()),
        ));
    }
    let rejects = matches!(
        choice,
        Choice::Approval(ApprovalChoice::Rejected) | Choice::Verdict(Verdict::Failed)
    );
    if rejects && reason.trim().is_empty() {
        return Err(invalid(
            "reason",
            format!("is required to {}: the model reads it", choice_verb(choice)),
        ));
    }
    Ok(())
}

fn choice_verb(choice: Choice) -> &'static str {
    if choice == Choice::Verdict(Verdict::Failed) {
        "fail a call"
    } else {
        "reject"
    }
}

/// Who made a decision, for people.
fn who(decision: &Decision) -> String {
    match &decision.approver {
        Some(name) => format!("{name} (tenant {})", decision.tenant),
        None => format!("tenant {}", decision.tenant),
    }
}

fn envelope_message(envelope: &toolfleet_proto::Envelope) -> String {
    envelope.error().map_or_else(
        || "do not match the tool's schema".to_owned(),
        |e| e.message.clone(),
    )
}

/// `ListPendingApprovals` page size when a request gives 0.
const DEFAULT_PAGE_SIZE: usize = 50;
/// Largest `ListPendingApprovals` page.
const MAX_PAGE_SIZE: usize = 500;

impl AgentApi {
    /// A page of the caller's pending approvals, oldest first: the calls
    /// held for approval to an approver, the unknown outcomes waiting for a
    /// verdict to an operator.
    pub(super) async fn pending_approvals(
        &self,
        request: v1::ListPendingApprovalsRequest,
        caller: &Caller,
    ) -> Result<v1::ListPendingApprovalsResponse, Status> {
        caller.check(Rpc::ListPending)?;
        let limit = match request.page_size as usize {
            0 => DEFAULT_PAGE_SIZE,
            n if n > MAX_PAGE_SIZE => {
                return Err(invalid(
                    "page_size",
                    format!("the limit is {MAX_PAGE_SIZE}"),
                ));
            }
            n => n,
        };
        let cursor = match request.page_token.as_str() {
            "" => None,
            token => Some(parse_token(token)?),
        };
        let (page, next) = self
            .store
            .pending(&caller.tenant, cursor.as_ref(), limit, |pending| {
                // An approval is an approver's; a verdict, an operator's.
                let needs = match pending.request.attempt {
                    None => Role::Approver,
                    Some(_) => Role::Operator,
                };
                caller.roles.has(needs)
            })
            .await
            .map_err(|e| to_status(&e))?;
        Ok(v1::ListPendingApprovalsResponse {
            approvals: page
                .into_iter()
                .map(|pending| {
                    let request = pending.request;
                    let kind = request.kind().to_owned();
                    v1::PendingApproval {
                        job_id: pending.job_id.to_string(),
                        call_id: request.call_id.into(),
                        tool: request.tool,
                        tool_version: request.tool_version.unwrap_or_default(),
                        arguments: request.arguments,
                        reason: request.reason,
                        rule: request.rule,
                        requested_at_ms: request.requested_at_ms,
                        expires_at_ms: request.expires_at_ms,
                        kind,
                        attempt: request.attempt.unwrap_or_default(),
                        outcome: request.outcome.unwrap_or_default(),
                    }
                })
                .collect(),
            next_page_token: next
                .map_or_else(String::new, |c| format!("{}.{}", c.held_at_ms, c.member)),
        })
    }
}

/// A `page_token` read back: `<held at ms>.<member>`.
fn parse_token(token: &str) -> Result<PendingCursor, Status> {
    token
        .split_once('.')
        .and_then(|(at, member)| {
            let held_at_ms = at.parse().ok()?;
            (!member.is_empty() && member.len() <= 256).then(|| PendingCursor {
                held_at_ms,
                member: member.to_owned(),
            })
        })
        .ok_or_else(|| {
            invalid(
                "page_token",
                "is not a token this API gave; start again without one",
            )
        })
}
