//! Step 1: claim the attempt in the ledger, and decide from what the ledger
//! holds whether this delivery answers, waits, or runs the call.

use std::time::Duration;

use serde_json::Value;
use toolfleet_proto::{Envelope, ErrorCode, ToolCall};
use tracing::{debug, warn};

use super::Executor;
use crate::ledger::Claim;
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

/// What earlier executions of a claimed attempt left behind.
#[derive(Debug, Clone, PartialEq)]
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
