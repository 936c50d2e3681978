//! A finished job's waterfall, drawn in the page: the timeline of
//! `toolfleet trace` (`toolfleet_proto::timeline`) as one SVG bar a row.
//! SVG, since its geometry is attributes: the Content-Security-Policy
//! allows no inline style.

use std::time::Duration;

use toolfleet_proto::timeline::{Step, Timeline, millis};
use toolfleet_proto::v1;

use crate::session::Session;
use crate::{Console, as_person};

/// Most events read for a waterfall.
const MAX_EVENTS: usize = 20_000;

/// Longest a page waits for a job's events.
const READ_FOR: Duration = Duration::from_secs(5);

/// The bars' width, in the SVG's units.
const WIDTH: u64 = 1000;

/// One row, as drawn.
pub(crate) struct Bar {
    pub label: String,
    pub kind: &'static str,
    /// The span, in SVG units: where it starts, and where the worker's
    /// part (a call's) starts, and where it ends.
    pub from: u64,
    pub worked_from: u64,
    /// The widths of its waiting and working parts.
    pub waited: u64,
    pub worked: u64,
    pub retries: Vec<u64>,
    pub took: String,
    pub detail: String,
    pub slowest: bool,
}

/// The waterfall: a summary line and its bars.
pub(crate) struct Waterfall {
    pub summary: String,
    pub bars: Vec<Bar>,
}

/// The waterfall of the finished job `job_id`, read from its events as
/// the person's token sees them; `None` if they cannot be read.
pub(crate) async fn of(console: &Console, session: &Session, job_id: &str) -> Option<Waterfall> {
    let request = v1::WatchJobRequest {
        job_id: job_id.to_owned(),
        from_offset: 0,
    };
    let mut stream = console
        .api()
        .watch_job(as_person(session, request))
        .await
        .ok()?
        .into_inner();
    let mut events = Vec::new();
    let read = async {
        while let Ok(Some(event)) = stream.message().await {
            let last = event.r#final;
            events.push(event);
            if last || events.len() >= MAX_EVENTS {
                break;
            }
        }
    };
    tokio::time::timeout(READ_FOR, read).await.ok()?;
    Some(drawn(&Timeline::of(&events)))
}

fn drawn(timeline: &Timeline) -> Waterfall {
    let total = timeline.end_ms.saturating_sub(timeline.start_ms).max(1);
    let x = |at: u64| at.saturating_sub(timeline.start_ms).saturating_mul(WIDTH) / total;
    let slowest = timeline.slowest();
    let bars = timeline
        .rows
        .iter()
        .enumerate()
        .map(|(index, row)| {
            let (from, to) = (x(row.start_ms), x(row.end_ms).max(x(row.start_ms) + 2));
            let worked_from = match (row.step, row.worked_ms) {
                (Step::Call, Some(worked)) => x(row.end_ms.saturating_sub(worked)).max(from),
                _ => from,
            };
            Bar {
                label: row.label.trim().to_owned(),
                kind: match row.step {
                    Step::Turn => "turn",
                    Step::Call => "call",
                    Step::Mark => "mark",
                },
                from,
                worked_from,
                waited: worked_from.saturating_sub(from),
                worked: to.saturating_sub(worked_from),
                retries: row.retries_ms.iter().map(|at| x(*at)).collect(),
                took: match row.step {
                    Step::Mark => String::new(),
                    _ => millis(row.duration_ms() as f64),
                },
                detail: row.detail.clone(),
                slowest: Some(index) == slowest,
            }
        })
        .collect();
    let outcome = timeline.outcome.as_deref().unwrap_or("running");
    Waterfall {
        summary: format!(
            "{outcome} in {}",
            millis(timeline.end_ms.saturating_sub(timeline.start_ms) as f64)
        ),
        bars,
    }
}
