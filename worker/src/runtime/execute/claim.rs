//! Step 1: claim the attempt in the ledger, and decide from what the ledger
//! holds whether this delivery answers, waits, or runs the call. A
//! read-only call's first delivery claims nothing and runs (decision 0060).

use std::time::Duration;

use async_nats::jetstream::Message;
use serde_json::Value;
use toolfleet_proto::manifest::Effects;
use toolfleet_proto::names::span_attributes;
use toolfleet_proto::{Envelope, ErrorCode, ToolCall};
use toolfleet_service::traces::StepSpan;
use tracing::{debug, warn};

use super::settle::Outcome;
use super::{Executor, LoadedTool, pin};
use crate::ledger::{Claim, Owner};
use crate::metrics;

/// What this delivery does after claiming its attempt.
pub(super) enum Claimed {
    /// The attempt has a result (this JSON envelope): answer with it again.
    Stored(String),
    /// Not this delivery's to run now (another live worker holds the claim,
    /// or Redis is down): hand it back, redelivered after the delay.
    Later(Duration),
    /// This delivery owns the attempt.
    Acquired(Earlier),
}

/// What earlier executions of a claimed attempt left behind; nothing, for
/// a delivery that runs without a claim.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Earlier {
    /// An earlier execution of a call that is not idempotent started and left no
    /// result: its effect may have happened.
    pub(super) started: bool,
    /// Enough earlier executions died that the call is poison: this is the
    /// answer, unless the probe knows better. The call is not run again.
    pub(super) poisoned: Option<Envelope>,
    /// What an earlier execution saved to resume from: the tool resumes
    /// from it rather than being probed (decision 0044).
    pub(super) checkpoint: Option<Value>,
    /// The call's job was cancelled: it is answered without running.
    pub(super) cancelled: bool,
}

impl Executor {
    /// Takes this delivery of `call`, of `tool`: its owner, and what earlier
    /// executions left. Claimed in the ledger, unless it runs without a
    /// claim ([`runs_unclaimed`]). `Err`: how the delivery ends instead (a
    /// stored result answered again, or handed back for later).
    pub(super) async fn take(
        &self,
        tool: &LoadedTool,
        call: &ToolCall,
        message: &Message,
        span: &mut StepSpan,
    ) -> Result<(Owner, Earlier), Outcome> {
        let owner = Owner {
            // Unique per delivery: a redelivery to this same process while
            // the first delivery still runs must not count as the same owner.
            id: format!("{}:{:016x}", self.worker_id, rand::random::<u64>()),
            claimed: !runs_unclaimed(tool, message),
        };
        if !owner.claimed {
            return Ok((owner, Earlier::default()));
        }
        let claimed = self
            .claim(call, &owner.id, tool.manifest.effects.repeats_harm())
            .await;
        span.event("claimed");
        match claimed {
            Claimed::Stored(envelope) => {
                span.set(span_attributes::LEDGER_HIT, true);
                Err(self.reply_stored(call, envelope).await)
            }
            Claimed::Later(delay) => {
                span.set(span_attributes::HANDED_BACK, true);
                Err(Outcome::Retry(delay))
            }
            Claimed::Acquired(earlier) => Ok((owner, earlier)),
        }
    }

    /// Claims `call` for `owner`; `mark_start`: its tool is not idempotent,
    /// so the claim marks that an execution started.
    pub(super) async fn claim(&self, call: &ToolCall, owner: &str, mark_start: bool) -> Claimed {
        let claim = match self.ledger.claim(call, owner, mark_start).await {
            Ok(claim) => claim,
            Err(err) => {
                warn!(error = %err, "redis unavailable; call handed back without executing");
                return Claimed::Later(Duration::from_secs(1));
            }
        };
        match claim {
            Claim::Stored(envelope) => {
                debug!("answered from the stored result");
                metrics::dedup_hit(&call.tool);
                Claimed::Stored(envelope)
            }
            Claim::HeldBy(holder) => {
                debug!(holder = %holder, "call is being executed elsewhere");
                Claimed::Later(self.ledger.lease())
            }
            Claim::Acquired {
                previously_started,
                died,
                checkpoint,
                cancelled,
            } => Claimed::Acquired(Earlier {
                started: previously_started,
                poisoned: poison(died, self.options.max_deliveries),
                checkpoint: checkpoint.and_then(|json| parsed_checkpoint(&json)),
                cancelled,
            }),
        }
    }
}

/// Whether `message` runs without a claim in the ledger (decision 0060):
/// the first delivery of a call of a `read_only` tool that saves no
/// checkpoints, unless it retires the call (that is decided once, under
/// the claim). Nothing such a run does is harmed by another: it may run
/// again, and only one result is ever stored. Any redelivery claims, so
/// the deaths that make a call poison are counted from the second.
fn runs_unclaimed(tool: &LoadedTool, message: &Message) -> bool {
    tool.manifest.effects == Effects::ReadOnly
        && !tool.tool.saves_checkpoints()
        && !pin::is_version_gone(message)
        && message.info().is_ok_and(|info| info.delivered == 1)
}

/// A saved checkpoint, parsed; one that is not JSON (written by something
/// other than a worker) is ignored, and the call is treated as if none was
/// saved: probed, if its effect may have happened.
fn parsed_checkpoint(json: &str) -> Option<Value> {
    serde_json::from_str(json)
        .inspect_err(|err| warn!(error = %err, "the call's checkpoint is not JSON; ignored"))
        .ok()
}

/// The answer to a call whose executions died `died` times (each took the
/// claim, then neither stored a result nor released it) when that reaches
/// `max_deliveries`: a poison call that kills its workers. Answering instead
/// of running it again keeps the job from being stuck (decision 0004).
/// Deliveries handed back without a claim (Redis down, the claim held
/// elsewhere) are not deaths and never count.
fn poison(died: u32, max_deliveries: i64) -> Option<Envelope> {
    if i64::from(died) < max_deliveries {
        return None;
    }
    warn!(died, "poison call: not run again");
    Some(Envelope::terminal(
        ErrorCode::MAX_DELIVERIES_EXCEEDED,
        format!(
            "the call was started {died} times and no worker finished it; it was not run again"
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_as_many_deaths_as_max_deliveries_make_a_call_poison() {
        // (executions that died, max_deliveries, poison)
        let cases = [
            (0, 5, false),
            (4, 5, false),
            (5, 5, true),
            (1, 1, true),
            (0, 0, true),
        ];
        for (died, max, expected) in cases {
            let answer = poison(died, max);
            assert_eq!(answer.is_some(), expected, "{died} deaths of max {max}");
            if let Some(envelope) = answer {
                let error = envelope.error().expect("an error envelope");
                assert_eq!(error.code, ErrorCode::MAX_DELIVERIES_EXCEEDED);
                assert!(!error.retryable);
                assert!(error.message.contains(&format!("started {died} times")));
            }
        }
    }
}
