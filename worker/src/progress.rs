//! A running call's progress, as its tool reports it: sent to the
//! orchestrator that runs the call's job on the call's reply subject (with
//! the `Toolfleet-Progress` header), the one subject of the job's a pool
//! may publish to, which the orchestrator records as a
//! `tool_call_progress` event (decision 0038). A pool never writes a job's
//! keys itself.
//!
//! Advisory: a report is sent at most once a second per call, bounded, and
//! never stored or retried by the worker; one that is lost is harmless.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use toolfleet_proto::names::headers;
use toolfleet_proto::{ProgressReport, ToolCall};
use tracing::debug;

/// The shortest time between two reports of one call sent to the bus.
const REPORT_GAP: Duration = Duration::from_secs(1);

/// Where a call's progress goes; does nothing for a call without a reply
/// subject, or in a test ([`Progress::default`]).
#[derive(Clone, Default)]
pub struct Progress {
    route: Option<Arc<Route>>,
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Progress")
            .field("reported", &self.route.is_some())
            .finish()
    }
}

struct Route {
    nats: async_nats::Client,
    subject: String,
    call_id: String,
    attempt: u32,
    /// When the last report was sent.
    last: Mutex<Option<Instant>>,
}

impl Progress {
    /// The progress of `call`, sent over `nats` to its reply subject.
    pub(crate) fn of(nats: &async_nats::Client, call: &ToolCall) -> Self {
        let route = call.reply_to.as_ref().map(|subject| {
            Arc::new(Route {
                nats: nats.clone(),
                subject: subject.clone(),
                call_id: call.call_id.clone(),
                attempt: call.attempt,
                last: Mutex::new(None),
            })
        });
        Self { route }
    }

    /// Reports that the call is `progress` of the way (to `total`, when
    /// known), with a short `message` for people. Returns at once: the
    /// report is sent in the background. A report less than a second after
    /// the last one sent, or whose numbers are not finite and positive, is
    /// dropped.
    pub fn report(&self, progress: f64, total: Option<f64>, message: Option<&str>) {
        let Some(route) = &self.route else {
            return;
        };
        let report = ProgressReport {
            progress,
            total,
            message: message.map(str::to_owned),
        };
        let Some(report) = report.sanitized() else {
            return;
        };
        {
            let mut last = route.last.lock().unwrap_or_else(PoisonError::into_inner);
            if last.is_some_and(|at| at.elapsed() < REPORT_GAP) {
                return;
            }
            *last = Some(Instant::now());
        }
        // A report is plain data: serializing it cannot fail.
        let payload = serde_json::to_vec(&report).unwrap_or_default();
        let mut message_headers = async_nats::HeaderMap::new();
        message_headers.insert(headers::CALL_ID, route.call_id.as_str());
        message_headers.insert(headers::ATTEMPT, route.attempt.to_string().as_str());
        message_headers.insert(headers::PROGRESS, "1");
        let route = route.clone();
        tokio::spawn(async move {
            let sent = route
                .nats
                .publish_with_headers(route.subject.clone(), message_headers, payload.into())
                .await;
            if let Err(err) = sent {
                debug!(error = %err, call_id = %route.call_id, "a progress report was not sent");
            }
        });
    }
}
