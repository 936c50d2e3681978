//! A running call's progress reports (its tool's, sent by the worker on the
//! job's reply subject with the `Toolfleet-Progress` header): recorded as
//! `tool_call_progress` events by the runner that waits for the attempt.
//! Anyone who can publish a reply can publish a report, so a report is
//! only advisory: bounded (`ProgressReport::read`), for the attempt being
//! waited for only, at most one every [`GAP`] and [`MAX_PER_ATTEMPT`] in
//! all; a report that fails to be recorded is dropped.

use std::time::Duration;

use tokio::time::Instant;
use toolfleet_proto::ProgressReport;
use tracing::debug;

use super::{Dispatcher, PlannedCall, Round};
use crate::job::JobEvent;

/// The shortest time between two recorded reports of one attempt. Below
/// the worker's own gap (1 s), so that the bus's jitter drops none.
const GAP: Duration = Duration::from_millis(500);

/// Most reports recorded for one attempt: a call that runs for hours
/// reporting every second still adds a bounded number of events.
const MAX_PER_ATTEMPT: u32 = 100;

/// What has been recorded of one attempt's reports.
#[derive(Debug, Default)]
pub(super) struct ProgressGate {
    last: Option<Instant>,
    recorded: u32,
}

impl ProgressGate {
    /// Whether a report arriving now may be recorded; counts it if so.
    fn admit(&mut self) -> bool {
        let now = Instant::now();
        let too_soon = self.last.is_some_and(|last| now < last + GAP);
        if too_soon || self.recorded >= MAX_PER_ATTEMPT {
            return false;
        }
        self.last = Some(now);
        self.recorded += 1;
        true
    }
}

impl Dispatcher {
    /// Records the report `payload` of `attempt` of `call`, if `gate`
    /// admits it and it reads as a report.
    pub(super) async fn record_progress(
        &self,
        round: &Round<'_>,
        (call, attempt): (&PlannedCall, u32),
        payload: &[u8],
        gate: &mut ProgressGate,
    ) {
        let Some(report) = ProgressReport::read(payload) else {
            debug!(call_id = %call.wire_id, "an unreadable progress report was dropped");
            return;
        };
        if !gate.admit() {
            return;
        }
        let event = JobEvent::ToolCallProgress {
            attempt,
            call_id: call.event_id.to_string(),
            message: report.message,
            progress: report.progress,
            total: report.total,
        };
        if let Err(err) = self.store.record_events(round.lease, vec![event]).await {
            debug!(call_id = %call.wire_id, error = %err, "a progress report was not recorded");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn reports_are_recorded_at_most_every_gap_and_up_to_a_bound() {
        let mut gate = ProgressGate::default();
        assert!(gate.admit());
        assert!(!gate.admit(), "too soon");
        tokio::time::advance(GAP).await;
        assert!(gate.admit());
        for _ in 2..MAX_PER_ATTEMPT {
            tokio::time::advance(GAP).await;
            assert!(gate.admit());
        }
        tokio::time::advance(GAP * 10).await;
        assert!(!gate.admit(), "past the bound");
    }
}
