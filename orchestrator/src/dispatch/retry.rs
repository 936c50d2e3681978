//! What happens after an attempt's envelope arrives: the call is settled with
//! it, or retried after a pause. A pure function of the envelope, the attempt
//! and the tool's [`RetryPolicy`], so every branch has a table test.

use std::time::Duration;

use toolfleet_proto::{Envelope, ErrorCode, RetryPolicy};

/// The decision after one attempt.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Verdict {
    /// The call is done: this envelope goes to the model.
    Settle(Envelope),
    /// Try again after this pause.
    Retry(Duration),
}

/// Attempts a call gets beyond its tool's own when results stored under its
/// ids were refused as another call's (`FOREIGN_RESULT`): such an attempt
/// never ran the real call, so it does not use up the tool's attempts, but
/// the allowance is bounded, so that a forger who can predict the next ids
/// cannot hold a call for ever.
const FOREIGN_RESULT_ALLOWANCE: u32 = 2;

/// Decides what follows `attempt` (1-based) whose answer is `envelope`:
/// success and terminal failures settle the call; a retryable failure is
/// retried as the policy says, and once the policy allows no more attempts
/// the call settles with `MAX_ATTEMPTS_EXCEEDED`, naming the last failure.
/// `jitter_sample` is a uniform draw from `0..1`.
pub(super) fn verdict(
    envelope: Envelope,
    attempt: u32,
    policy: &RetryPolicy,
    max_retry_after: Duration,
    jitter_sample: f64,
) -> Verdict {
    let Some(error) = envelope.error().filter(|e| e.retryable) else {
        return Verdict::Settle(envelope);
    };
    if error.code == ErrorCode::FOREIGN_RESULT
        && attempt < policy.max_attempts.saturating_add(FOREIGN_RESULT_ALLOWANCE)
    {
        return Verdict::Retry(Duration::ZERO);
    }
    // A tool's own wait is honoured up to `dispatch.max_retry_after`.
    let retry_after = error
        .retry_after_ms
        .map(|ms| Duration::from_millis(ms).min(max_retry_after));
    match policy.next_delay(attempt, retry_after, jitter_sample) {
        Some(delay) => Verdict::Retry(delay),
        None => Verdict::Settle(Envelope::terminal(
            ErrorCode::MAX_ATTEMPTS_EXCEEDED,
            format!(
                "gave up after {attempt} attempts; the last failed with {}: {}",
                error.code, error.message
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use toolfleet_proto::ErrorBody;

    use super::*;

    const POLICY: RetryPolicy = RetryPolicy {
        initial_backoff_ms: 100,
        max_backoff_ms: 1_000,
        multiplier: 2.0,
        jitter: 0.0,
        max_attempts: 3,
    };

    const MAX_WAIT: Duration = Duration::from_secs(60);

    fn failure(code: &'static str, retryable: bool, retry_after_ms: Option<u64>) -> Envelope {
        Envelope::Err(ErrorBody {
            code: ErrorCode::from_static(code),
            message: "down".into(),
            retryable,
            retry_after_ms,
            side_effect: None,
        })
    }

    #[test]
    fn every_answer_settles_or_retries_as_the_policy_says() {
        let ms = Duration::from_millis;
        let ok = Envelope::Ok(json!({"v": 1}));
        let terminal = failure("NOT_FOUND", false, None);
        let cases = [
            (ok.clone(), 1, Verdict::Settle(ok.clone())),
            (terminal.clone(), 1, Verdict::Settle(terminal.clone())),
            (
                failure("TOOL_TIMEOUT", true, None),
                1,
                Verdict::Retry(ms(100)),
            ),
            (
                failure("TOOL_TIMEOUT", true, None),
                2,
                Verdict::Retry(ms(200)),
            ),
            (
                failure("RATE_LIMITED", true, Some(1_500)),
                1,
                Verdict::Retry(ms(1_500)),
            ),
            (
                failure("RATE_LIMITED", true, Some(u64::MAX)),
                1,
                Verdict::Retry(MAX_WAIT),
            ),
            // A refused foreign result: again at once, beyond the tool's
            // own attempts, but not for ever.
            (
                failure("FOREIGN_RESULT", true, None),
                POLICY.max_attempts + 1,
                Verdict::Retry(Duration::ZERO),
            ),
        ];
        for (envelope, attempt, expected) in cases {
            assert_eq!(
                verdict(envelope.clone(), attempt, &POLICY, MAX_WAIT, 0.0),
                expected,
                "{envelope:?} attempt {attempt}"
            );
        }
        assert!(matches!(
            verdict(
                failure("FOREIGN_RESULT", true, None),
                POLICY.max_attempts + FOREIGN_RESULT_ALLOWANCE,
                &POLICY,
                MAX_WAIT,
                0.0
            ),
            Verdict::Settle(_)
        ));
        let Verdict::Settle(gave_up) = verdict(
            failure("TOOL_TIMEOUT", true, None),
            3,
            &POLICY,
            MAX_WAIT,
            0.0,
        ) else {
            panic!("the third attempt is the last");
        };
        let error = gave_up.error().expect("an error envelope");
        assert_eq!(error.code, ErrorCode::MAX_ATTEMPTS_EXCEEDED);
        assert!(!error.retryable);
        assert_eq!(
            error.message,
            "gave up after 3 attempts; the last failed with TOOL_TIMEOUT: down"
        );
    }
}
