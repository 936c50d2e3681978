//! A call whose outcome no worker could tell (`OUTCOME_UNKNOWN`, or
//! `MAX_DELIVERIES_EXCEEDED`), in a job that asks an operator
//! (`on_unknown_outcome = "ask"`, decision 0036): instead of settling it
//! with the worker's envelope, the round holds it for a verdict on that
//! attempt, through the same door as an approval. The verdict is the
//! operator's, kept with the job's approvals and never in the tool's
//! ledger: the worker's stored envelope stays what the worker wrote.

use toolfleet_proto::{Envelope, ErrorCode};

use super::{Dispatcher, PlannedCall, Round, RoundError, Waiting};
use crate::job::{UnknownOutcome, now_ms};
use crate::store::{Choice, HeldCall, Unknown, hold_key};

/// What a settled attempt's envelope comes to ([`Dispatcher::verdict_on`]).
pub(super) enum AfterVerdict {
    /// The call settles with this envelope; `Some("operator")` when it is
    /// an operator's verdict, not the worker's.
    Settle(Envelope, Option<&'static str>),
    /// The operator said the attempt was not applied: run the next one.
    RunAgain,
    /// It waits for an operator's verdict.
    Wait(Waiting),
}

/// Who produced an envelope that no worker did.
pub(super) const OPERATOR: &str = "operator";

/// Whether `envelope` is an outcome the worker could not tell, in a job
/// that asks an operator about it.
pub(super) fn asks(round: &Round<'_>, envelope: &Envelope) -> bool {
    let unknown = envelope.error().is_some_and(|error| {
        error.code == ErrorCode::OUTCOME_UNKNOWN || error.code == ErrorCode::MAX_DELIVERIES_EXCEEDED
    });
    unknown && round.spec.approval.on_unknown_outcome == UnknownOutcome::Ask
}

impl Dispatcher {
    /// What becomes of `call`'s `attempt`, which settled with `envelope`
    /// as stored in Redis: the envelope itself, unless it is an unknown
    /// outcome in a job that asks; then the operator's verdict, held for
    /// one now if none was asked before, or the worker's envelope once the
    /// question expired.
    pub(super) async fn verdict_on(
        &self,
        round: &Round<'_>,
        call: &PlannedCall,
        attempt: u32,
        envelope: Envelope,
    ) -> Result<AfterVerdict, RoundError> {
        if !asks(round, &envelope) {
            return Ok(AfterVerdict::Settle(envelope, None));
        }
        let lease = round.lease;
        let approvals = self.store.approvals(&lease.job_id).await?;
        let key = hold_key(&call.wire_id, Some(attempt));
        if let Some(decision) = approvals.decisions.get(&key) {
            return Ok(match decision.choice {
                Choice::Applied => {
                    let data = decision
                        .result
                        .as_deref()
                        .and_then(|text| serde_json::from_str(text).ok())
                        .unwrap_or_default();
                    AfterVerdict::Settle(Envelope::Ok(data), Some(OPERATOR))
                }
                Choice::Failed => AfterVerdict::Settle(
                    Envelope::terminal(
                        ErrorCode::FAILED_BY_OPERATOR,
                        format!("an operator failed the call: {}", decision.reason),
                    ),
                    Some(OPERATOR),
                ),
                Choice::NotApplied => AfterVerdict::RunAgain,
                // The API writes no approval under a verdict's key.
                Choice::Approved | Choice::Rejected => AfterVerdict::Settle(envelope, None),
            });
        }
        let now = now_ms();
        let expires_at_ms = match approvals.requests.get(&key) {
            Some(request) => request.expires_at_ms,
            None => {
                let timeout = toolfleet_service::clock::millis(self.approval_timeout(round.spec));
                let expires_at_ms = now.saturating_add(timeout);
                let held = HeldCall {
                    wire_id: &call.wire_id,
                    unknown: Some(Unknown {
                        attempt,
                        envelope: &envelope,
                    }),
                    call_id: &call.event_id,
                    tool: &call.name,
                    arguments: &call.arguments,
                    rule: RULE,
                    reason: "the job asks an operator when a call's outcome is unknown".into(),
                    expires_at_ms,
                };
                self.store
                    .hold(lease, &round.spec.tenant, std::slice::from_ref(&held))
                    .await?;
                crate::metrics::approval_requested(&call.name, RULE);
                expires_at_ms
            }
        };
        if expires_at_ms <= now {
            // Nobody gave a verdict: the model is told what the worker said.
            crate::metrics::approval_decided(&call.name, "expired", None);
            return Ok(AfterVerdict::Settle(envelope, None));
        }
        Ok(AfterVerdict::Wait(Waiting {
            key,
            event_id: call.event_id.clone(),
            expires_at_ms,
        }))
    }
}

/// The rule a verdict request is held by, in its event and metrics.
pub(super) const RULE: &str = "on_unknown_outcome";
