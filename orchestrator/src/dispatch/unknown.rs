//! A call whose outcome no worker could tell (`OUTCOME_UNKNOWN`, or
//! `MAX_DELIVERIES_EXCEEDED`), in a job that asks an operator
//! (`on_unknown_outcome = "ask"`, decision 0036): instead of settling it
//! with the worker's envelope, the round holds it for a verdict on that
//! attempt, through the same door as an approval. The verdict is the
//! operator's, kept with the job's approvals and never in the tool's
//! ledger: the worker's stored envelope stays what the worker wrote.

use toolfleet_proto::{Envelope, ErrorCode};

use super::{Dispatcher, PlannedCall, Round, RoundError, Waiting};
use crate::hold::{self, AnsweredBy, Fate, HeldFor};
use crate::job::{UnknownOutcome, now_ms};

/// What a settled attempt's envelope comes to ([`Dispatcher::verdict_on`]).
pub(super) enum AfterVerdict {
    /// The call settles with this envelope; `true` when it is an
    /// operator's verdict, not the worker's.
    Settle(Envelope, bool),
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
    /// outcome in a job that asks; then what [`hold::fate`] says of the
    /// verdict: held for one now if none was asked before, the operator's
    /// verdict, or the worker's envelope once the question expired.
    pub(super) async fn verdict_on(
        &self,
        round: &Round<'_>,
        call: &PlannedCall,
        attempt: u32,
        envelope: Envelope,
    ) -> Result<AfterVerdict, RoundError> {
        if !asks(round, &envelope) {
            return Ok(AfterVerdict::Settle(envelope, false));
        }
        let approvals = self.store.approvals(&round.lease.job_id).await?;
        let held_for = HeldFor::Verdict {
            attempt,
            answered: &envelope,
        };
        let hold = held_for.hold(&call.wire_id);
        let fate = hold::fate(
            held_for,
            approvals.decisions.get(&hold),
            approvals.requests.get(&hold).map(|r| r.expires_at_ms),
            now_ms(),
            self.approval_timeout(round.spec),
        );
        Ok(match fate {
            Fate::Run { .. } => AfterVerdict::RunAgain,
            Fate::Answer { envelope, by } => {
                if by == AnsweredBy::Expiry {
                    crate::metrics::approval_decided(&call.name, "expired", None);
                }
                AfterVerdict::Settle(envelope, by == AnsweredBy::Operator)
            }
            Fate::Hold { until_ms } => {
                let version = self
                    .shown(&call.name, round.offered)
                    .map(|tool| tool.contract);
                let held = call.held(held_for, until_ms, version);
                self.store
                    .hold(round.lease, &round.spec.tenant, std::slice::from_ref(&held))
                    .await?;
                crate::metrics::approval_requested(&call.name, held_for.rule());
                AfterVerdict::Wait(call.waiting(hold, until_ms))
            }
            Fate::Wait { until_ms } => AfterVerdict::Wait(call.waiting(hold, until_ms)),
        })
    }
}
