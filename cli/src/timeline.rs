//! `toolfleet trace`: one job as a waterfall in the terminal, drawn from its
//! events. Each model turn and each call is a bar on one time axis; a call's
//! retries are marked where each attempt was dispatched; the slowest step is
//! pointed at. Users would rather look at this than read the events.

use std::collections::HashMap;
use std::fmt::Write as _;

use toolfleet_proto::JobEvent;
use toolfleet_proto::v1;

/// Width of the label column (`turn 3`, `call_0_1 get_current_weather`).
const LABEL_WIDTH: usize = 34;

/// What a row of the waterfall stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// A model turn: from the end of the step before it to its checkpoint.
    Turn,
    /// A call: from its first dispatch to its final envelope.
    Call,
    /// A moment: the job resumed by another replica.
    Mark,
}

#[derive(Debug, Clone)]
struct Row {
    step: Step,
    label: String,
    start_ms: u64,
    end_ms: u64,
    /// When each attempt after the first was dispatched.
    retries_ms: Vec<u64>,
    /// How long the worker worked on a call's last attempt; the bar before
    /// that is waiting (queue, network, earlier attempts, retry pauses).
    worked_ms: Option<u64>,
    detail: String,
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

    fn duration_ms(&self) -> u64 {
        self.end_ms.saturating_sub(self.start_ms)
    }
}

/// The job as rows on a time axis, read from its events in order.
#[derive(Debug, Default)]
struct Timeline {
    start_ms: u64,
    end_ms: u64,
    rows: Vec<Row>,
    outcome: Option<String>,
}

impl Timeline {
    fn of(events: &[v1::JobEvent]) -> Self {
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
            // A kind this CLI does not know (a newer server): not drawn.
            if let Ok(decoded) = JobEvent::decode(&event.kind, &event.data) {
                drawing.add(decoded, at);
            }
        }
        drawing.close_open_calls();
        drawing.timeline
    }

    /// The slowest turn or call, if any took time.
    fn slowest(&self) -> Option<usize> {
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
            JobEvent::ToolCallApprovalRequested { .. }
            | JobEvent::ToolCallVerdictRequested { .. }
            | JobEvent::ToolCallDecided { .. }
            | JobEvent::JobWaitingForApproval { .. } => rows.push(approval_mark(decoded, at)),
            JobEvent::JobSucceeded { .. } => self.timeline.outcome = Some("succeeded".into()),
            JobEvent::JobFailed { code, .. } => {
                self.timeline.outcome = Some(format!("failed ({})", code.as_str()));
            }
            JobEvent::JobCancelled { .. } => self.timeline.outcome = Some("cancelled".into()),
        }
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

fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn millis(ms: f64) -> String {
    if ms >= 1000.0 {
        format!("{:.2} s", ms / 1000.0)
    } else {
        format!("{ms:.1} ms")
    }
}

/// The waterfall of the job `job_id` from its `events` (in order, from the
/// first), with bars `width` columns wide.
pub(crate) fn waterfall(job_id: &str, events: &[v1::JobEvent], width: usize) -> String {
    let width = width.max(10);
    let timeline = Timeline::of(events);
    let total = timeline.end_ms.saturating_sub(timeline.start_ms);
    let mut out = String::new();
    let _ = writeln!(out, "{}", summary(job_id, &timeline));
    let end_label = millis(total as f64);
    let _ = writeln!(
        out,
        "{:LABEL_WIDTH$} 0{end_label:>width$}",
        "",
        width = width - 1
    );
    let axis = Axis {
        start_ms: timeline.start_ms,
        total_ms: total,
        width,
    };
    let slowest = timeline.slowest();
    for (index, row) in timeline.rows.iter().enumerate() {
        let bar = axis.bar(row);
        let took = match row.step {
            Step::Mark => String::new(),
            _ => millis(row.duration_ms() as f64),
        };
        let label: String = row.label.chars().take(LABEL_WIDTH).collect();
        let pointer = if Some(index) == slowest {
            "  ◀ slowest"
        } else {
            ""
        };
        let line = format!(
            "{label:LABEL_WIDTH$} {bar} {took:>9}  {}{pointer}",
            row.detail
        );
        let _ = writeln!(out, "{}", line.trim_end());
    }
    let _ = writeln!(
        out,
        "(█ turn: from the step before it to its checkpoint; call: first dispatch to its \
         final answer, ╌ waiting (queue, network, retries) then ━ the worker; ↻ a retry \
         dispatched)"
    );
    out
}

/// The waterfall's first line: how the job ended, in how long, with how
/// many turns, calls and retries.
fn summary(job_id: &str, timeline: &Timeline) -> String {
    let total = timeline.end_ms.saturating_sub(timeline.start_ms);
    let steps = |step: Step| timeline.rows.iter().filter(|r| r.step == step).count();
    let retries: usize = timeline.rows.iter().map(|r| r.retries_ms.len()).sum();
    let outcome = timeline.outcome.as_deref().unwrap_or("running");
    format!(
        "job {job_id}: {outcome} in {}; {}, {}, {}",
        millis(total as f64),
        count(steps(Step::Turn), "turn", "turns"),
        count(steps(Step::Call), "call", "calls"),
        count(retries, "retry", "retries"),
    )
}

/// The time axis of the bars: the job's span over `width` columns.
struct Axis {
    start_ms: u64,
    total_ms: u64,
    width: usize,
}

impl Axis {
    /// The column of the moment `at`.
    fn column(&self, at: u64) -> usize {
        let offset = at.saturating_sub(self.start_ms);
        let scaled = offset.saturating_mul(self.width as u64) / self.total_ms.max(1);
        usize::try_from(scaled)
            .unwrap_or(usize::MAX)
            .min(self.width - 1)
    }

    /// The bar of `row`: a call's wait, then the worker's share at its end,
    /// and its retries.
    fn bar(&self, row: &Row) -> String {
        let (from, to) = (self.column(row.start_ms), self.column(row.end_ms));
        let fill = match row.step {
            Step::Turn => '█',
            Step::Call => '━',
            Step::Mark => '│',
        };
        let mut bar: Vec<char> = vec![' '; self.width];
        let worked_from = match (row.step, row.worked_ms) {
            (Step::Call, Some(worked)) => self.column(row.end_ms.saturating_sub(worked)).max(from),
            _ => from,
        };
        for (offset, cell) in bar[from..=to.max(from)].iter_mut().enumerate() {
            *cell = if from + offset < worked_from {
                '╌'
            } else {
                fill
            };
        }
        for retry in &row.retries_ms {
            bar[self.column(*retry)] = '↻';
        }
        bar.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn event(offset: u64, kind: &str, data: Value, timestamp_ms: u64) -> v1::JobEvent {
        v1::JobEvent {
            job_id: "t-1".into(),
            offset,
            kind: kind.to_owned(),
            data: data.to_string(),
            timestamp_ms,
            r#final: matches!(kind, "job_succeeded" | "job_failed" | "job_cancelled"),
            trace_id: String::new(),
        }
    }

    fn job() -> Vec<v1::JobEvent> {
        let calls = json!([{"call_id": "c1", "name": "sleep"}, {"call_id": "c2", "name": "fail"}]);
        vec![
            event(0, "job_queued", json!({"metadata": {}}), 1_000),
            event(1, "job_started", json!({"epoch": 1, "owner": "o1"}), 1_002),
            event(
                2,
                "model_turn",
                json!({"round": 1, "text": "", "tool_calls": calls, "turn": 0}),
                1_010,
            ),
            event(
                3,
                "tool_call_dispatched",
                json!({"attempt": 1, "call_id": "c1", "name": "sleep"}),
                1_011,
            ),
            event(
                4,
                "tool_call_dispatched",
                json!({"attempt": 1, "call_id": "c2", "name": "fail"}),
                1_011,
            ),
            event(
                5,
                "tool_call_dispatched",
                json!({"attempt": 2, "call_id": "c2", "name": "fail"}),
                1_030,
            ),
            event(
                6,
                "tool_call_result",
                json!({"attempts": 2, "call_id": "c2", "code": null, "name": "fail", "ok": true, "round_trip_us": 4000}),
                1_035,
            ),
            event(
                7,
                "tool_call_result",
                json!({"attempts": 1, "call_id": "c1", "code": null, "name": "sleep", "ok": true,
                       "round_trip_us": 89_000, "worked_us": 45_000}),
                1_100,
            ),
            event(
                8,
                "model_turn",
                json!({"round": 1, "text": "done", "tool_calls": [], "turn": 1}),
                1_105,
            ),
            event(9, "job_succeeded", json!({"output_text": "done"}), 1_106),
        ]
    }

    #[test]
    fn a_job_reads_as_turns_and_calls_on_one_axis() {
        let drawn = waterfall("t-1", &job(), 53);
        let lines: Vec<&str> = drawn.lines().collect();
        assert_eq!(
            lines[0],
            "job t-1: succeeded in 106.0 ms; 2 turns, 2 calls, 1 retry"
        );
        let row = |label: &str| {
            *lines
                .iter()
                .find(|line| line.starts_with(label))
                .unwrap_or_else(|| panic!("no row {label} in\n{drawn}"))
        };
        // turn 0 runs from the start to 10 ms: the first columns.
        assert!(row("turn 0").contains(" █████ "), "{drawn}");
        assert!(row("turn 0").ends_with("8.0 ms  2 calls"), "{drawn}");
        // The sleep is the slowest step, from 11 ms to 100 ms: it waited,
        // then the worker worked its last 45 ms.
        let sleep = row("  c1 sleep");
        assert!(
            sleep.ends_with("89.0 ms  ok, worker 45.0 ms  ◀ slowest"),
            "{drawn}"
        );
        let bar: String = sleep.chars().skip(LABEL_WIDTH + 1).take(53).collect();
        let (waited, worked) = (bar.matches('╌').count(), bar.matches('━').count());
        assert!(waited > 0 && worked > 0, "{drawn}");
        assert!(
            bar.trim_end().ends_with('━'),
            "the worker's share comes last: {drawn}"
        );
        // The retried call shows where its second attempt went out.
        assert!(row("  c2 fail").contains('↻'), "{drawn}");
        assert!(
            row("  c2 fail").ends_with("24.0 ms  ok, 2 attempts, last 4.0 ms"),
            "{drawn}"
        );
        assert!(row("turn 1").ends_with("5.0 ms  answered"), "{drawn}");
        // Every bar ends inside the axis.
        let bar_end = LABEL_WIDTH + 1 + 53;
        for line in &lines[2..lines.len() - 1] {
            let bar: String = line.chars().skip(LABEL_WIDTH + 1).take(53).collect();
            assert_eq!(bar.chars().count(), 53, "{line}");
            assert!(line.chars().count() > bar_end, "{line}");
        }
    }

    #[test]
    fn a_resumed_job_and_an_unanswered_call_are_drawn_too() {
        let mut events = job();
        events.truncate(5);
        events.push(event(
            5,
            "job_resumed",
            json!({"epoch": 2, "owner": "o2"}),
            1_050,
        ));
        let drawn = waterfall("t-1", &events, 40);
        assert!(drawn.starts_with("job t-1: running in 50.0 ms"), "{drawn}");
        assert!(drawn.contains("resumed"), "{drawn}");
        assert!(drawn.contains("by o2 (lease epoch 2)"), "{drawn}");
        // Calls still in flight are drawn from their dispatch to now.
        assert!(
            drawn
                .lines()
                .any(|l| l.starts_with("  c1 sleep") && l.ends_with("in flight")),
            "{drawn}"
        );
        // A job cancelled while its slow call ran: the call, not the short
        // turn, is the slowest step, and says it had no result.
        let mut cancelled = job();
        cancelled.truncate(7);
        cancelled.push(event(
            7,
            "job_cancelled",
            json!({"code": "CANCELLED"}),
            2_500,
        ));
        let drawn = waterfall("t-3", &cancelled, 40);
        let c1 = drawn
            .lines()
            .find(|l| l.starts_with("  c1 sleep"))
            .unwrap_or_default();
        assert!(
            c1.contains("1.49 s")
                && c1.contains("no result: the job ended first")
                && c1.ends_with("◀ slowest"),
            "{drawn}"
        );
        assert_eq!(
            waterfall("t-2", &[], 40).lines().next(),
            Some("job t-2: running in 0.0 ms; 0 turns, 0 calls, 0 retries")
        );
    }
}
