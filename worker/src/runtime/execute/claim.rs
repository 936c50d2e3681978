//! Step 1: claim the attempt in the ledger, and decide from what the ledger
//! holds whether this delivery answers, waits, or runs the call.

use std::time::Duration;

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
    /// This delivery owns the attempt, but every earlier delivery died
    /// without an answer: answer with this envelope instead of running.
    MaxDeliveries(Envelope),
    /// This delivery owns the attempt and runs it. `previously_started`: an
    /// earlier delivery of a side-effecting call started and left no result.
    Acquired { previously_started: bool },
}

impl Executor {
    /// Claims `call` for `owner`, the `delivered`-th delivery of its message.
    pub(super) async fn claim(&self, call: &ToolCall, owner: &str, delivered: i64) -> Claimed {
        let side_effects = self
            .tools
            .get(&call.tool)
            .is_some_and(|t| t.manifest.side_effects);
        let claim = match self.ledger.claim(call, owner, side_effects).await {
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
            Claim::Acquired { previously_started } => {
                match poison(delivered, self.options.max_deliveries) {
                    Some(envelope) => Claimed::MaxDeliveries(envelope),
                    None => Claimed::Acquired { previously_started },
                }
            }
        }
    }
}

/// The answer to a claimed delivery numbered `delivered` when it is over
/// `max_deliveries`: every earlier delivery died without an answer (no
/// result, no live claim), so the call is a poison call. Answering instead of
/// running it again keeps the job from being stuck (decision 0004).
fn poison(delivered: i64, max_deliveries: i64) -> Option<Envelope> {
    if delivered <= max_deliveries {
        return None;
    }
    warn!(delivered, "poison call: answered without executing");
    Some(Envelope::terminal(
        ErrorCode::MAX_DELIVERIES_EXCEEDED,
        format!(
            "the call was delivered {} times and no worker finished it; it was not run again",
            delivered - 1
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_delivery_past_the_limit_is_poison() {
        // (delivered, max_deliveries, poison)
        let cases = [
            (1, 5, false),
            (5, 5, false),
            (6, 5, true),
            (2, 1, true),
            (1, 0, true),
        ];
        for (delivered, max, expected) in cases {
            let answer = poison(delivered, max);
            assert_eq!(
                answer.is_some(),
                expected,
                "delivery {delivered} of max {max}"
            );
            if let Some(envelope) = answer {
                let error = envelope.error().expect("an error envelope");
                assert_eq!(error.code, ErrorCode::MAX_DELIVERIES_EXCEEDED);
                assert!(!error.retryable);
                // The earlier deliveries, not counting this one.
                assert!(
                    error
                        .message
                        .contains(&format!("delivered {} times", delivered - 1))
                );
            }
        }
    }
}
