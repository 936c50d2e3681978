//! The bounded steps of a service's drain.
//!
//! A drain has a deadline: the moment the stop was asked plus the service's
//! `drain_timeout`. Until then, work in flight may finish. After it, what is
//! left is handed back ([`HAND_BACK`]), and each last step (stopping the
//! background tasks, withdrawing announcements, flushing NATS) gets
//! [`LAST_STEP`]. A step that runs out is logged and left behind: what it
//! held is taken over as after a crash (leases expire, messages are
//! redelivered), which the services are built for. So a drain ends within
//! its deadline and [`SHUTDOWN_MARGIN`] whatever NATS and Redis do, and
//! the process exits 0; the watchdog of [`crate::binary`] is the backstop
//! for a drain that would not, not the way a drain ends.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::binary::SHUTDOWN_MARGIN;

/// How long work still running at the deadline has to hand itself back
/// (release its lease or claim, nak its message).
pub const HAND_BACK: Duration = Duration::from_secs(2);

/// How long each step after the hand-back may take.
pub const LAST_STEP: Duration = Duration::from_secs(1);

// The orchestrator's drain after its deadline: the hand-back, then the
// background tasks, then the flush. The worker's has one step fewer.
const _: () = assert!(
    HAND_BACK.as_millis() + 2 * LAST_STEP.as_millis() < SHUTDOWN_MARGIN.as_millis(),
    "a drain's steps after its deadline must end before the watchdog fires"
);

/// When the drain asked for by `stop` must be over: `drain_timeout` after
/// `stop` is cancelled. Awaited next to the work that stops, so that the
/// time that work takes to notice counts against the drain.
pub async fn deadline(stop: &CancellationToken, drain_timeout: Duration) -> Instant {
    stop.cancelled().await;
    Instant::now() + drain_timeout
}

/// Runs `step` for at most `within`; its output if it finished. One that
/// did not is logged with `what`, which says what becomes of what it left,
/// and dropped.
pub async fn bounded<T>(what: &str, within: Duration, step: impl Future<Output = T>) -> Option<T> {
    let finished = tokio::time::timeout(within, step).await.ok();
    if finished.is_none() {
        warn!(
            within_ms = within.as_millis(),
            "{what}: not done in time; given up"
        );
    }
    finished
}

/// Flushes what is still buffered for NATS (the last acks and naks), for
/// [`LAST_STEP`] at most: with NATS gone, a flush would wait for it.
pub async fn flush(nats: &async_nats::Client) {
    let what = "flushing NATS (messages whose ack was not sent are redelivered)";
    if let Some(Err(err)) = bounded(what, LAST_STEP, nats.flush()).await {
        warn!(error = %err, "could not flush NATS; messages whose ack was not sent are redelivered");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_step_that_finishes_in_time_reports_it() {
        assert_eq!(bounded("quick", LAST_STEP, async { 7 }).await, Some(7));
    }

    #[tokio::test(start_paused = true)]
    async fn a_step_that_hangs_is_dropped_at_its_bound() {
        let started = Instant::now();
        assert_eq!(
            bounded("hung", HAND_BACK, std::future::pending::<()>()).await,
            None
        );
        assert_eq!(started.elapsed(), HAND_BACK);
    }
}
