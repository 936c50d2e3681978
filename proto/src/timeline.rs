//! A job as a timeline: each model turn and each call a row on one time
//! axis, read from the job's events, with how each call ended, its retries
//! and the worker's share of it. `toolfleet trace` draws it as text and the
//! web console as a picture; both read it from here.

use std::collections::HashMap;

use crate::JobEvent;
use crate::job::Spend;
use crate::v1;

/// What a row of a timeline stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// A model turn: from the end of the step before it to its checkpoint.
    Turn,
    /// A call: from its first dispatch to its final envelope.
    Call,
    /// A moment: the job resumed by another replica.
    Mark,
}

/// One row: a model turn, a call or a moment, with its span.
#[derive(Debug, Clone)]
pub struct Row {
    /// What it stands for.
    pub step: Step,
    /// `turn 2`, `  call_0_1 get_current_weather`, `resumed`.
    pub label: String,
    /// Unix epoch milliseconds.
    pub start_ms: u64,
    /// Unix epoch milliseconds.
    pub end_ms: u64,
    /// When each attempt after the first was dispatched.
    pub retries_ms: Vec<u64>,
    /// How long the worker worked on a call's last attempt; the bar before
    /// that is waiting (queue, network, earlier attempts, retry pauses).
    pub worked_ms: Option<u64>,
    /// What came of it, in words: `ok, 2 attempts, worker 3.1 ms`.
    pub detail: String,
}

impl Row {
    /// A row that starts and (so far) ends `at`.
    fn at(step: Step, label: String, at: u64, detail: String) -> Self {
        Self {
            step,
            label,
            start_ms: at,
            end_ms: at,
            retries_ms: Vec::new(),
            worked_ms: None,
            detail,
        }
    }

    /// How long it took.
    pub fn duration_ms(&self) -> u64 {
        self.end_ms.saturating_sub(self.start_ms)
    }
}

/// The job as rows on a time axis, read from its events in order.
#[derive(Debug, Default)]
pub struct Timeline {
    /// The first event's time (Unix epoch milliseconds).
    pub start_ms: u64,
    /// The last event's.
    pub end_ms: u64,
    /// Turns, calls and moments, in the order they started.
    pub rows: Vec<Row>,
    /// `succeeded`, `failed (CODE)`, `cancelled`; `None` while it runs.
    pub outcome: Option<String>,
    /// What the job spent, as the event that ended it says.
    pub spent: Option<Spend>,
}

impl Timeline {
    /// The timeline of `events`, a job's, in order from its first.
    pub fn of(events: &[v1::JobEvent]) -> Self {
        let Some(first) = events.first() else {
            return Self::default();
        };
        let mut drawing = Drawing {
            timeline: Self {
                start_ms: first.timestamp_ms,
                ..Self::default()
            },
            phase_start: first.timestamp_ms,
            open_calls: HashMap::new(),
        };
        for event in events {
            let at = event.timestamp_ms;
            drawing.timeline.end_ms = drawing.timeline.end_ms.max(at);
            // A kind this release does not know (a newer server): not drawn.
            if let Ok(decoded) = JobEvent::decode(&event.kind, &event.data) {
                drawing.add(decoded, at);
            }
        }
        drawing.close_open_calls();
        drawing.timeline
    }

    /// The index of the slowest turn or call, if any took time.
    pub fn slowest(&self) -> Option<usize> {
        self.rows
            .iter()
            .enumerate()
            .filter(|(_, row)| row.step != Step::Mark && row.duration_ms() > 0)
            .max_by_key(|(_, row)| row.duration_ms())
            .map(|(index, _)| index)
    }
}

/// The mark of an approval event at `at`: a call held, decided, or its job
/// parked.
fn approval_mark(event: JobEvent, at: u64) -> Row {
    let (label, detail) = match event {
        JobEvent::ToolCallApprovalRequested {
            call_id,
            tool,
            reason,
            ..
        } => (format!("  {call_id} {tool} waits"), reason),
        JobEvent::ToolCallVerdictRequested {
            attempt,
            call_id,
            code,
            tool,
            ..
        } => (
            format!("  {call_id} {tool} unknown"),
            format!("{code} after attempt {attempt}: waits for a verdict"),
        ),
        JobEvent::ToolCallDecided {
            approver,
            call_id,
            decision,
            tenant,
            ..
        } => (
            format!("  {call_id} {decision}"),
            format!("by {}", approver.unwrap_or(tenant)),
        ),
        JobEvent::JobWaitingForApproval { calls } => (
            "parked".to_owned(),
            format!("waits for {}", calls.join(", ")),
        ),
        other => (other.kind().to_owned(), String::new()),
    };
    Row::at(Step::Mark, label, at, detail)
}

/// A timeline as its events are read.
struct Drawing {
    timeline: Timeline,
    /// Where the next model turn started: the end of the step before it.
    phase_start: u64,
    /// The row of each call in flight, by call id.
    open_calls: HashMap<String, usize>,
}

impl Drawing {
    /// Draws the event `decoded`, which happened `at`.
    fn add(&mut self, decoded: JobEvent, at: u64) {
        let rows = &mut self.timeline.rows;
        match decoded {
            // Progress is in the watch output; the timeline shows the
            // call's span.
            JobEvent::JobQueued { .. } | JobEvent::ToolCallProgress { .. } => {}
            JobEvent::JobStarted { .. } => self.phase_start = at,
            JobEvent::JobResumed { epoch, owner } => {
                self.phase_start = at;
                let detail = format!("by {owner} (lease epoch {epoch})");
                rows.push(Row::at(Step::Mark, "resumed".into(), at, detail));
            }
            JobEvent::ModelTurn {
                turn, tool_calls, ..
            } => {
                let detail = match tool_calls.len() {
                    0 => "answered".to_owned(),
                    1 => "1 call".to_owned(),
                    n => format!("{n} calls"),
                };
                rows.push(Row {
                    start_ms: self.phase_start,
                    ..Row::at(Step::Turn, format!("turn {turn}"), at, detail)
                });
                self.phase_start = at;
            }
            JobEvent::ToolCallDispatched {
                attempt,
                call_id,
                name,
                ..
            } => match self.open_calls.get(&call_id) {
                Some(&row) if attempt > 1 => rows[row].retries_ms.push(at),
                Some(_) => {}
                None => {
                    self.open_calls.insert(call_id.clone(), rows.len());
                    let label = format!("  {call_id} {name}");
                    rows.push(Row::at(Step::Call, label, at, String::new()));
                }
            },
            JobEvent::ToolCallResult {
                attempts,
                call_id,
                code,
                name,
                ok,
                round_trip_us,
                source,
                worked_us,
                ..
            } => {
                let row = self.call_row(&call_id, &name, at);
                let row = &mut self.timeline.rows[row];
                row.end_ms = at;
                row.worked_ms = worked_us.map(|us| us / 1000);
                row.detail = call_detail(ok, code.as_deref(), attempts, round_trip_us, worked_us);
                if let Some(source) = source {
                    row.detail.push_str(&format!(", by the {source}"));
                }
                self.phase_start = self.phase_start.max(at);
            }
            JobEvent::ToolUnavailable { tool, reason, .. } => {
                let detail = format!("{tool} left out: {reason}");
                rows.push(Row::at(Step::Mark, "unavailable".into(), at, detail));
            }
            JobEvent::ToolCallApprovalRequested { .. }
            | JobEvent::ToolCallVerdictRequested { .. }
            | JobEvent::ToolCallDecided { .. }
            | JobEvent::JobWaitingForApproval { .. } => rows.push(approval_mark(decoded, at)),
            JobEvent::JobSucceeded { spent, .. } => self.end("succeeded".into(), spent),
            JobEvent::JobFailed { code, spent, .. } => {
                self.end(format!("failed ({})", code.as_str()), spent);
            }
            JobEvent::JobCancelled { spent, .. } => self.end("cancelled".into(), spent),
        }
    }

    /// The job ended as `outcome` said, having spent `spent`.
    fn end(&mut self, outcome: String, spent: Option<Spend>) {
        self.timeline.outcome = Some(outcome);
        self.timeline.spent = spent;
    }

    /// Calls without a result run to the end of what is drawn: the job
    /// ended first (a cancel, a failure, a deadline), or they are still in
    /// flight. Without this, a call cut short by a cancel would be drawn as
    /// taking no time at all.
    fn close_open_calls(&mut self) {
        let (end, ended) = (self.timeline.end_ms, self.timeline.outcome.is_some());
        for &row in self.open_calls.values() {
            let row = &mut self.timeline.rows[row];
            row.end_ms = end;
            row.detail = if ended {
                "no result: the job ended first".into()
            } else {
                "in flight".into()
            };
        }
    }

    /// The row of the call `call_id` that settled `at`: the one its
    /// dispatch opened, or a new one for a call the orchestrator's own
    /// checks answered (a moment).
    fn call_row(&mut self, call_id: &str, name: &str, at: u64) -> usize {
        if let Some(row) = self.open_calls.remove(call_id) {
            return row;
        }
        let label = format!("  {call_id} {name}");
        let rows = &mut self.timeline.rows;
        rows.push(Row::at(Step::Call, label, at, String::new()));
        rows.len() - 1
    }
}

fn call_detail(
    ok: bool,
    code: Option<&str>,
    attempts: u32,
    round_trip_us: Option<u64>,
    worked_us: Option<u64>,
) -> String {
    let outcome = match (ok, code) {
        (true, _) => "ok".to_owned(),
        (false, Some(code)) => code.to_owned(),
        (false, None) => "failed".to_owned(),
    };
    let tries = match attempts {
        0 => ", answered without running".to_owned(),
        1 => String::new(),
        n => format!(", {n} attempts"),
    };
    let last = round_trip_us
        .filter(|_| attempts > 1)
        .map(|us| format!(", last {}", millis(us as f64 / 1000.0)))
        .unwrap_or_default();
    let worker = worked_us
        .map(|us| format!(", worker {}", millis(us as f64 / 1000.0)))
        .unwrap_or_default();
    format!("{outcome}{tries}{last}{worker}")
}

/// A duration for people: `3.1 ms`, `1.25 s`.
pub fn millis(ms: f64) -> String {
    if ms >= 1000.0 {
        format!("{:.2} s", ms / 1000.0)
    } else {
        format!("{ms:.1} ms")
    }
}
