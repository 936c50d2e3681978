//! `toolfleet trace`: one job as a waterfall in the terminal, drawn from its
//! events. Each model turn and each call is a bar on one time axis; a call's
//! retries are marked where each attempt was dispatched; the slowest step is
//! pointed at. Users would rather look at this than read the events.

use std::fmt::Write as _;

use toolfleet_proto::timeline::{Row, Step, Timeline, millis};
use toolfleet_proto::v1;

/// Width of the label column (`turn 3`, `call_0_1 get_current_weather`).
const LABEL_WIDTH: usize = 34;

fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
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
    let mut line = format!(
        "job {job_id}: {outcome} in {}; {}, {}, {}",
        millis(total as f64),
        count(steps(Step::Turn), "turn", "turns"),
        count(steps(Step::Call), "call", "calls"),
        count(retries, "retry", "retries"),
    );
    if let Some(spent) = timeline.spent {
        line.push_str(&format!("; spent {spent}"));
    }
    line
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
