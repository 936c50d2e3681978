//! How the CLI prints jobs, events and tools: readable text for people, and
//! JSON (proto field names, statuses in lowercase) for scripts.

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{Value, json};
use toolfleet_proto::v1::{self, item};
use toolfleet_proto::{JobEvent, JobStatus};

/// Widest event kind (`tool_call_dispatched`), so summaries line up.
const KIND_WIDTH: usize = 20;
/// Longest model text quoted in an event line.
const QUOTE_CHARS: usize = 100;
/// Longest tool description in the tools table.
const DESCRIPTION_CHARS: usize = 70;

/// `succeeded`, `failed`, ... for a status of the API.
pub(crate) fn status_name(status: i32) -> &'static str {
    job_status(status).map_or("unknown", JobStatus::as_str)
}

/// The API's status number as a status, if it is one.
pub(crate) fn job_status(status: i32) -> Option<JobStatus> {
    v1::JobStatus::try_from(status)
        .ok()
        .and_then(|s| JobStatus::try_from(s).ok())
}

/// One line for an event: offset, time since `start_ms`, kind, and a summary
/// of its data.
pub(crate) fn event_line(event: &v1::JobEvent, start_ms: u64) -> String {
    let elapsed = event.timestamp_ms.saturating_sub(start_ms);
    let offset = format!("#{}", event.offset);
    let summary = match JobEvent::decode(&event.kind, &event.data) {
        Ok(decoded) => event_summary(&decoded),
        // A kind this CLI does not know (a newer server), or data it cannot
        // read: show the data as it came.
        Err(_) => match json_or_text(&event.data) {
            Value::Object(map) if map.is_empty() => String::new(),
            data => compact(&data),
        },
    };
    let line = format!(
        "{offset:>4} {:>7.3}s  {:<KIND_WIDTH$}  {summary}",
        Duration::from_millis(elapsed).as_secs_f64(),
        event.kind,
    );
    line.trim_end().to_owned()
}

/// A streamed turn being printed: its `model_output_delta` events become
/// one growing line, ended when another event comes.
#[derive(Debug, Default)]
pub(crate) struct Streaming {
    /// The turn on the line, while there is one.
    turn: Option<u64>,
}

impl Streaming {
    /// What to print of `event` when it is a delta (`None` otherwise): the
    /// line's start for a turn's first delta, a new line for a restarted
    /// turn, then its text or the call it names.
    pub(crate) fn delta(&mut self, event: &v1::JobEvent) -> Option<String> {
        if event.kind != "model_output_delta" {
            return None;
        }
        let data = json_or_text(&event.data);
        let turn = data["turn"].as_u64().unwrap_or_default();
        let mut text = String::new();
        let restarted = data["restarted"] == true;
        if self.turn != Some(turn) || restarted {
            text.push_str(&self.end());
            let again = if restarted { " (asked again)" } else { "" };
            let _ = write!(text, "           turn {}{again} > ", turn + 1);
            self.turn = Some(turn);
        }
        if let Some(piece) = data["text"].as_str() {
            // Control characters would let a model move the terminal's cursor.
            text.extend(
                piece
                    .chars()
                    .map(|c| if c.is_control() && c != '\n' { ' ' } else { c }),
            );
        }
        if let Some(name) = data["tool_call"]["name"].as_str() {
            let _ = write!(text, " [calls {}]", quote(name, QUOTE_CHARS));
        }
        Some(text)
    }

    /// Ends the streamed line, if one is open: a newline, else nothing.
    pub(crate) fn end(&mut self) -> String {
        match self.turn.take() {
            Some(_) => "\n".to_owned(),
            None => String::new(),
        }
    }
}

/// What an event says, in a few words.
fn event_summary(event: &JobEvent) -> String {
    match event {
        JobEvent::JobQueued { metadata } if metadata.is_empty() => String::new(),
        JobEvent::JobQueued { metadata } => format!("metadata {}", compact(&json!(metadata))),
        JobEvent::JobStarted { epoch, owner } | JobEvent::JobResumed { epoch, owner } => {
            format!("by {owner} (lease epoch {epoch})")
        }
        JobEvent::ModelTurn { .. } => turn_summary(event),
        JobEvent::ToolCallDispatched {
            attempt,
            call_id,
            name,
            ..
        } => format!("{call_id} {name}, attempt {attempt}"),
        JobEvent::ToolCallProgress { .. } => progress_summary(event),
        JobEvent::ToolUnavailable {
            tool,
            reason,
            call_id: Some(call_id),
        } => format!("{call_id} {tool} refused: its breaker is open ({reason})"),
        JobEvent::ToolUnavailable { tool, reason, .. } => {
            format!("{tool} left out of the turn: its breaker is open ({reason})")
        }
        JobEvent::ToolCallResult { .. } => call_result_summary(event),
        JobEvent::ToolCallApprovalRequested {
            arguments,
            call_id,
            reason,
            tool,
            ..
        } => format!(
            "{call_id} {tool}({}) waits for approval: {reason}",
            quote(arguments, QUOTE_CHARS)
        ),
        JobEvent::ToolCallVerdictRequested {
            attempt,
            call_id,
            code,
            message,
            tool,
            ..
        } => format!(
            "{call_id} {tool}: attempt {attempt} ended {code} ({}); waits for an operator's verdict",
            quote(message, QUOTE_CHARS)
        ),
        JobEvent::ToolCallDecided { .. } => decided_summary(event),
        JobEvent::JobWaitingForApproval { calls } => {
            format!("parked until a person decides {}", calls.join(", "))
        }
        JobEvent::JobSucceeded { output_text, spent } => {
            quote(output_text, QUOTE_CHARS) + &spent_summary(*spent)
        }
        JobEvent::JobFailed {
            code,
            message,
            spent,
        } => format!(
            "{code}: {}{}",
            message.as_deref().unwrap_or_default(),
            spent_summary(*spent)
        ),
        JobEvent::JobCancelled { code, spent } => code.to_string() + &spent_summary(*spent),
    }
}

/// A `model_turn` event on one line (any other event: nothing): what the
/// model said and the calls it made.
fn turn_summary(event: &JobEvent) -> String {
    let JobEvent::ModelTurn {
        text,
        tool_calls,
        turn,
        ..
    } = event
    else {
        return String::new();
    };
    let calls: Vec<String> = tool_calls
        .iter()
        .map(|call| format!("{} [{}]", call.name, call.call_id))
        .collect();
    let mut summary = format!("turn {turn}:");
    if !text.is_empty() {
        let _ = write!(summary, " says {}", quote(text, QUOTE_CHARS));
        if !calls.is_empty() {
            summary.push(';');
        }
    }
    if !calls.is_empty() {
        let _ = write!(summary, " calls {}", calls.join(", "));
    }
    summary
}

/// What a job spent, as its final event's summary ends: `; spent ...`.
fn spent_summary(spent: Option<toolfleet_proto::job::Spend>) -> String {
    spent.map_or_else(String::new, |spent| format!("; spent {spent}"))
}

/// A `tool_call_progress` event on one line (any other event: nothing).
fn progress_summary(event: &JobEvent) -> String {
    let JobEvent::ToolCallProgress {
        call_id,
        message,
        progress,
        total,
        ..
    } = event
    else {
        return String::new();
    };
    let mut summary = match total {
        Some(total) => format!("{call_id} at {progress} of {total}"),
        None => format!("{call_id} at {progress}"),
    };
    if let Some(message) = message {
        let _ = write!(summary, ": {}", quote(message, QUOTE_CHARS));
    }
    summary
}

/// A `tool_call_decided` event on one line (any other event: nothing).
fn decided_summary(event: &JobEvent) -> String {
    let JobEvent::ToolCallDecided {
        approver,
        arguments,
        call_id,
        decision,
        reason,
        result,
        tenant,
    } = event
    else {
        return String::new();
    };
    let who = approver.as_deref().map_or_else(
        || format!("tenant {tenant}"),
        |name| format!("{name} ({tenant})"),
    );
    let mut summary = format!("{call_id} {decision} by {who}");
    if !reason.is_empty() {
        let _ = write!(summary, ": {}", quote(reason, QUOTE_CHARS));
    }
    if let Some(arguments) = arguments {
        let _ = write!(summary, "; runs with {}", quote(arguments, QUOTE_CHARS));
    }
    if let Some(result) = result {
        let _ = write!(summary, "; its result {}", quote(result, QUOTE_CHARS));
    }
    summary
}

/// A `tool_call_result` event on one line (any other event: nothing).
fn call_result_summary(event: &JobEvent) -> String {
    let JobEvent::ToolCallResult {
        attempts: made,
        call_id,
        code,
        name,
        ok,
        round_trip_us,
        source,
        worked_us,
        tool_version,
    } = event
    else {
        return String::new();
    };
    let outcome = if *ok {
        "ok".to_owned()
    } else {
        format!("error {}", code.as_deref().unwrap_or("?"))
    };
    let mut summary = format!("{call_id} {name}: {outcome}");
    if let Some(source) = source {
        let _ = write!(summary, " (by the {source})");
    }
    match made {
        0 => summary.push_str(" (not dispatched)"),
        n => {
            let _ = write!(summary, " after {}", attempts(u64::from(*n)));
        }
    }
    // The round trip is the last attempt's: said so when there were
    // more (the whole call, retries and pauses included, is the
    // time since its dispatch event, and `trace` draws it).
    if let Some(micros) = round_trip_us {
        let which = if *made > 1 { "last attempt " } else { "" };
        let _ = write!(
            summary,
            ", {which}{:.1} ms",
            Duration::from_micros(*micros).as_secs_f64() * 1e3
        );
    }
    if let Some(micros) = worked_us {
        let _ = write!(
            summary,
            " (worker {:.1} ms)",
            Duration::from_micros(*micros).as_secs_f64() * 1e3
        );
    }
    if let Some(version) = tool_version {
        let _ = write!(
            summary,
            " [version {}]",
            version.get(..12).unwrap_or(version)
        );
    }
    summary
}

/// What a job spent, each against its budget where it has one:
/// `300 model tokens, 15 of 20 tool cost units, 5 tool calls`.
fn spend_line(job: &v1::Job) -> Option<String> {
    let spent = job.spent?;
    let budget = job.budget.unwrap_or_default();
    let part = |spent: u64, max: Option<u64>, unit: &str| match max {
        Some(max) => format!("{spent} of {max} {unit}"),
        None => format!("{spent} {unit}"),
    };
    Some(
        [
            part(spent.tokens, budget.max_tokens, "model tokens"),
            part(spent.cost_units, budget.max_cost_units, "tool cost units"),
            part(spent.tool_calls, budget.max_tool_calls, "tool calls"),
        ]
        .join(", "),
    )
}

/// A job as text: a status line, metadata, error, the transcript and the output.
pub(crate) fn job_report(job: &v1::Job) -> String {
    let mut out = String::new();
    let mut headline = format!("job {}: {}", job.job_id, status_name(job.status));
    if job.finished_at_ms > 0 && job.created_at_ms > 0 {
        let took = Duration::from_millis(job.finished_at_ms.saturating_sub(job.created_at_ms));
        let _ = write!(headline, " in {:.3}s", took.as_secs_f64());
    }
    let rounds = if job.rounds == 1 { "round" } else { "rounds" };
    let _ = writeln!(out, "{headline}, {} tool {rounds}", job.rounds);
    if !job.metadata.is_empty() {
        let mut pairs: Vec<_> = job
            .metadata
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        pairs.sort();
        let _ = writeln!(out, "metadata: {}", pairs.join(" "));
    }
    if let Some(error) = &job.error {
        let _ = writeln!(out, "error: {}: {}", error.code, error.message);
    }
    if !job.submitter.is_empty() {
        let _ = writeln!(out, "submitter: {}", job.submitter);
    }
    if !job.trace_id.is_empty() {
        let _ = writeln!(out, "trace: {}", job.trace_id);
    }
    if let Some(spent) = spend_line(job) {
        let _ = writeln!(out, "spent: {spent}");
    }
    let _ = writeln!(out, "transcript:");
    let succeeded = job.status == v1::JobStatus::Succeeded as i32;
    let last = job.items.len().saturating_sub(1);
    for (index, entry) in job.items.iter().enumerate() {
        let Some(kind) = &entry.kind else { continue };
        let (label, text) = match kind {
            item::Kind::User(m) => ("user", m.text.clone()),
            // The answer is printed once, as the output below.
            item::Kind::Assistant(m) if succeeded && index == last && m.text == job.output_text => {
                ("assistant", "(the output, below)".to_owned())
            }
            item::Kind::Assistant(m) => ("assistant", m.text.clone()),
            item::Kind::ToolCall(c) => (
                "tool_call",
                format!("{}  {}({})", c.call_id, c.name, compact_text(&c.arguments)),
            ),
            item::Kind::ToolResult(r) => (
                "tool_result",
                format!(
                    "{}  {}, {}: {}",
                    r.call_id,
                    r.name,
                    attempts(u64::from(r.attempts)),
                    result_excerpt(&r.output)
                ),
            ),
        };
        let _ = writeln!(out, "  {label:<11}  {}", indent(&text, 2 + 11 + 2));
    }
    if !job.held_calls.is_empty() {
        let _ = writeln!(out, "held for a person:");
        for held in &job.held_calls {
            let _ = writeln!(out, "  {}", held_call_line(held));
        }
    }
    if succeeded {
        let _ = writeln!(out, "output:\n  {}", indent(&job.output_text, 2));
    }
    out
}

/// A held call on one line: what it waited for, and who decided what
/// after how long (or that it still waits).
fn held_call_line(held: &v1::HeldCall) -> String {
    let what = if held.kind == "outcome" {
        format!("a verdict on attempt {}", held.attempt)
    } else {
        "approval".to_owned()
    };
    let mut line = format!("{} {}: {what}", held.call_id, held.tool);
    if held.decision.is_empty() {
        let _ = write!(
            line,
            ", undecided (expires at {} Unix ms)",
            held.expires_at_ms
        );
        return line;
    }
    let who = if held.approver.is_empty() {
        format!("tenant {}", held.decided_by_tenant)
    } else {
        format!("{} (tenant {})", held.approver, held.decided_by_tenant)
    };
    let waited = Duration::from_millis(held.decided_at_ms.saturating_sub(held.requested_at_ms));
    let _ = write!(
        line,
        ", {} by {who} after {:.1}s",
        held.decision,
        waited.as_secs_f64()
    );
    if !held.reason.is_empty() {
        let _ = write!(line, ": {}", quote(&held.reason, QUOTE_CHARS));
    }
    if let Some(arguments) = &held.arguments {
        let _ = write!(line, "; ran with {}", quote(arguments, QUOTE_CHARS));
    }
    if let Some(result) = &held.result {
        let _ = write!(line, "; result {}", quote(result, QUOTE_CHARS));
    }
    line
}

/// Longest tool result shown in a transcript, in characters: a tool's
/// whole answer (a knowledge graph's facts) is what the model read, and
/// its answer quotes what matters.
const RESULT_CHARS: usize = 300;

/// A tool result on one line, cut at [`RESULT_CHARS`] with a word on where
/// the rest is.
fn result_excerpt(output: &str) -> String {
    let text = compact_text(output);
    let chars = text.chars().count();
    if chars <= RESULT_CHARS {
        return text;
    }
    format!(
        "{} ({chars} characters; `toolfleet get --json` shows it whole)",
        truncate(&text, RESULT_CHARS)
    )
}

/// The tools as a table with a header row; with the fleet's columns
/// (`POOLS`, `WAITING`, `MCP`) when `ListTools` told any of them (to an
/// operator or a reader).
pub(crate) fn tools_table(tools: &[v1::Tool]) -> String {
    let told = tools.iter().any(|tool| {
        !tool.pools.is_empty()
            || tool.calls_waiting.is_some()
            || tool.workers_unavailable > 0
            || !tool.mcp_server.is_empty()
            || !tool.available
    });
    if told {
        return fleet_tools_table(tools);
    }
    let rows: Vec<[String; 6]> = tools
        .iter()
        .map(|tool| {
            [
                tool.name.clone(),
                with_breaker(tool.workers.to_string(), tool),
                humantime::format_duration(Duration::from_millis(tool.timeout_ms)).to_string(),
                tool.max_attempts.to_string(),
                tool.effects.clone(),
                first_sentence(&tool.description, DESCRIPTION_CHARS),
            ]
        })
        .collect();
    table(
        [
            "NAME",
            "WORKERS",
            "TIMEOUT",
            "ATTEMPTS",
            "EFFECTS",
            "DESCRIPTION",
        ],
        &rows,
        &[1, 3],
    )
}

/// [`tools_table`] with the fleet's columns: the workers that cannot run
/// a tool beside those that can, its pools, its calls waiting and its MCP
/// server (`-` for none).
fn fleet_tools_table(tools: &[v1::Tool]) -> String {
    let or_dash = |text: String| if text.is_empty() { "-".into() } else { text };
    let rows: Vec<[String; 8]> = tools
        .iter()
        .map(|tool| {
            let workers = match tool.workers_unavailable {
                0 => tool.workers.to_string(),
                n => format!("{} (+{n} unavailable)", tool.workers),
            };
            let workers = with_breaker(with_versions(workers, tool), tool);
            [
                tool.name.clone(),
                workers,
                or_dash(tool.pools.join(",")),
                tool.calls_waiting
                    .map_or_else(|| "unknown".into(), |n| n.to_string()),
                or_dash(tool.mcp_server.clone()),
                humantime::format_duration(Duration::from_millis(tool.timeout_ms)).to_string(),
                tool.effects.clone(),
                first_sentence(&tool.description, DESCRIPTION_CHARS),
            ]
        })
        .collect();
    table(
        [
            "NAME",
            "WORKERS",
            "POOLS",
            "WAITING",
            "MCP",
            "TIMEOUT",
            "EFFECTS",
            "DESCRIPTION",
        ],
        &rows,
        &[1, 3],
    )
}

/// A tool's `WORKERS` cell, with its live versions when it has more than
/// one (a rolling upgrade that changes its schema): each version's first
/// 12 digits and workers, the one new turns are offered marked.
fn with_versions(workers: String, tool: &v1::Tool) -> String {
    if tool.versions.len() < 2 {
        return workers;
    }
    let versions: Vec<String> = tool
        .versions
        .iter()
        .map(|version| {
            let short = version
                .contract_hash
                .get(..12)
                .unwrap_or(&version.contract_hash);
            let offered = if version.offered { " offered" } else { "" };
            format!("{short}: {}{offered}", version.workers)
        })
        .collect();
    format!("{workers} ({})", versions.join(", "))
}

/// A tool's `WORKERS` cell, with its circuit breaker when it is not
/// closed: `2 (breaker open)`, for the reader who wonders why the models
/// are not offered it.
fn with_breaker(workers: String, tool: &v1::Tool) -> String {
    match tool.breaker.as_str() {
        "" | "closed" => workers,
        state => format!("{workers} (breaker {state})"),
    }
}

/// Jobs (of `ListJobs`) as a table, newest first as given; ages are counted
/// back from `now_ms`.
pub(crate) fn jobs_table(jobs: &[v1::Job], now_ms: u64) -> String {
    let rows: Vec<[String; 5]> = jobs
        .iter()
        .map(|job| {
            let age = Duration::from_secs(now_ms.saturating_sub(job.created_at_ms) / 1000);
            let mut metadata: Vec<String> = job
                .metadata
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            metadata.sort();
            [
                job.job_id.clone(),
                status_name(job.status).to_owned(),
                format!("{} ago", humantime::format_duration(age)),
                job.rounds.to_string(),
                first_sentence(&metadata.join(" "), DESCRIPTION_CHARS),
            ]
        })
        .collect();
    table(
        ["JOB ID", "STATUS", "SUBMITTED", "ROUNDS", "METADATA"],
        &rows,
        &[3],
    )
}

/// Rows under a header, columns padded to their widest cell; the columns
/// in `numeric` align right.
fn table<const N: usize>(header: [&str; N], rows: &[[String; N]], numeric: &[usize]) -> String {
    let mut widths = header.map(str::len);
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header = header.map(str::to_owned);
    for (n, row) in std::iter::once(&header).chain(rows).enumerate() {
        let mut line = String::new();
        for (column, (cell, width)) in row.iter().zip(widths).enumerate() {
            if n > 0 && numeric.contains(&column) {
                let _ = write!(line, "{cell:>width$}  ");
            } else {
                let _ = write!(line, "{cell:<width$}  ");
            }
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
    out
}

/// An event as JSON.
pub(crate) fn event_json(event: &v1::JobEvent) -> Value {
    json!({
        "job_id": event.job_id,
        "offset": event.offset,
        "kind": event.kind,
        "data": json_or_text(&event.data),
        "timestamp_ms": event.timestamp_ms,
        "final": event.r#final,
        "trace_id": event.trace_id,
    })
}

/// Counts of jobs by status (of `ListJobs` `with_counts`) on one line:
/// `queued 0 · running 2 · ...`.
pub(crate) fn counts_line(counts: &[v1::JobStatusCount]) -> String {
    counts
        .iter()
        .map(|count| format!("{} {}", status_name(count.status), count.jobs))
        .collect::<Vec<_>>()
        .join(" · ")
}

/// Counts of jobs by status as a JSON object: `{"queued": 0, ...}`.
pub(crate) fn counts_json(counts: &[v1::JobStatusCount]) -> Value {
    counts
        .iter()
        .map(|count| (status_name(count.status).to_owned(), json!(count.jobs)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// A page of jobs as JSON: the jobs (without items) and the next token.
pub(crate) fn jobs_json(jobs: &[v1::Job], next_page_token: &str) -> Value {
    json!({
        "jobs": jobs.iter().map(job_json).collect::<Vec<_>>(),
        "next_page_token": next_page_token,
    })
}

/// A job as JSON. `arguments` and `output` stay the exact strings the model
/// produced and received.
pub(crate) fn job_json(job: &v1::Job) -> Value {
    let items: Vec<Value> = job
        .items
        .iter()
        .filter_map(|entry| entry.kind.as_ref())
        .map(|kind| match kind {
            item::Kind::User(m) => json!({"user": {"text": m.text}}),
            item::Kind::Assistant(m) => json!({"assistant": {"text": m.text}}),
            item::Kind::ToolCall(c) => json!({"tool_call": {
                "call_id": c.call_id, "name": c.name, "arguments": c.arguments,
            }}),
            item::Kind::ToolResult(r) => json!({"tool_result": {
                "call_id": r.call_id, "name": r.name, "output": r.output, "attempts": r.attempts,
            }}),
        })
        .collect();
    json!({
        "job_id": job.job_id,
        "status": status_name(job.status),
        "output_text": job.output_text,
        "error": job.error.as_ref().map(|e| json!({"code": e.code, "message": e.message})),
        "rounds": job.rounds,
        "items": items,
        "metadata": job.metadata,
        "created_at_ms": job.created_at_ms,
        "finished_at_ms": job.finished_at_ms,
        "trace_id": job.trace_id,
        "submitter": job.submitter,
        "budget": job.budget.map(|b| json!({
            "max_tokens": b.max_tokens, "max_cost_units": b.max_cost_units,
            "max_tool_calls": b.max_tool_calls,
        })),
        "spent": job.spent.map(|s| json!({
            "tokens": s.tokens, "cost_units": s.cost_units, "tool_calls": s.tool_calls,
        })),
        "held_calls": job.held_calls.iter().map(|h| json!({
            "call_id": h.call_id, "tool": h.tool, "kind": h.kind, "attempt": h.attempt,
            "requested_at_ms": h.requested_at_ms, "expires_at_ms": h.expires_at_ms,
            "decision": h.decision, "reason": h.reason,
            "decided_by_tenant": h.decided_by_tenant, "approver": h.approver,
            "decided_at_ms": h.decided_at_ms, "arguments": h.arguments, "result": h.result,
        })).collect::<Vec<_>>(),
    })
}

/// The tools as JSON; `parameters` is the schema as JSON, not a string.
pub(crate) fn tools_json(tools: &[v1::Tool]) -> Value {
    tools
        .iter()
        .map(|tool| {
            json!({
                "name": tool.name,
                "description": tool.description,
                "parameters": json_or_text(&tool.parameters),
                "strict": tool.strict,
                "workers": tool.workers,
                "timeout_ms": tool.timeout_ms,
                "max_attempts": tool.max_attempts,
                "effects": tool.effects,
                "side_effects": tool.side_effects,
                "version": tool.version,
                "approval": tool.approval,
                "available": tool.available,
                "pools": tool.pools,
                "workers_unavailable": tool.workers_unavailable,
                "calls_waiting": tool.calls_waiting,
                "mcp_server": tool.mcp_server,
                "contract_hash": tool.contract_hash,
                "versions": tool.versions.iter().map(|version| json!({
                    "contract_hash": version.contract_hash,
                    "workers": version.workers,
                    "offered": version.offered,
                })).collect::<Vec<_>>(),
                "breaker": tool.breaker,
                "breaker_since_ms": tool.breaker_since_ms,
            })
        })
        .collect()
}

/// `text` parsed as JSON, or as a JSON string if it is not JSON.
fn json_or_text(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

fn attempts(n: u64) -> String {
    if n == 1 {
        "1 attempt".into()
    } else {
        format!("{n} attempts")
    }
}

fn compact(value: &Value) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

/// JSON text as it is when it fits on one line, else re-serialized without
/// whitespace (which sorts its keys).
fn compact_text(text: &str) -> String {
    if !text.contains('\n') {
        return text.to_owned();
    }
    serde_json::from_str::<Value>(text).map_or_else(|_| text.to_owned(), |v| compact(&v))
}

/// A model's text (arguments, a reason) on one line, cut short: what a
/// list shows of it.
pub(crate) fn excerpt(text: &str) -> String {
    truncate(&compact_text(text), QUOTE_CHARS)
}

/// `text` in quotes, on one line, cut at `max` characters.
fn quote(text: &str, max: usize) -> String {
    let one_line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    format!("\"{}\"", truncate(&one_line, max))
}

fn truncate(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let cut: String = text.chars().take(max.saturating_sub(1)).collect();
    format!("{}…", cut.trim_end())
}

/// The first sentence of a description, cut at `max` characters.
fn first_sentence(text: &str, max: usize) -> String {
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let sentence = text.find(". ").map_or(text.as_str(), |end| &text[..=end]);
    truncate(sentence, max)
}

/// Continuation lines of `text` indented by `width` spaces.
fn indent(text: &str, width: usize) -> String {
    text.replace('\n', &format!("\n{:width$}", ""))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(offset: u64, kind: &str, data: Value, timestamp_ms: u64) -> v1::JobEvent {
        v1::JobEvent {
            job_id: "j1".into(),
            offset,
            kind: kind.into(),
            data: data.to_string(),
            timestamp_ms,
            r#final: kind.starts_with("job_") && kind != "job_queued" && kind != "job_started",
            trace_id: String::new(),
        }
    }

    /// An event of each kind, and what its line must contain.
    fn one_line_cases() -> [(v1::JobEvent, &'static str); 15] {
        [
            (
                event(0, "job_queued", json!({"metadata": {}}), 1000),
                "#0   0.000s  job_queued",
            ),
            (
                event(1, "job_started", json!({"owner": "dev", "epoch": 1}), 1012),
                "job_started           by dev (lease epoch 1)",
            ),
            (
                event(
                    2,
                    "model_turn",
                    json!({"turn": 0, "round": 1, "text": "", "tool_calls": [
                        {"call_id": "call_0_0", "name": "calculate"},
                        {"call_id": "call_0_1", "name": "get_current_weather"}]}),
                    1100,
                ),
                "turn 0: calls calculate [call_0_0], get_current_weather [call_0_1]",
            ),
            (
                event(
                    3,
                    "model_turn",
                    json!({"turn": 1, "round": 1, "text": "It is\n12 °C", "tool_calls": []}),
                    1200,
                ),
                "turn 1: says \"It is 12 °C\"",
            ),
            (
                event(
                    4,
                    "tool_call_dispatched",
                    json!({"call_id": "c", "name": "calculate", "attempt": 2}),
                    1300,
                ),
                "c calculate, attempt 2",
            ),
            (
                event(
                    4,
                    "tool_call_progress",
                    json!({"call_id": "c", "attempt": 1, "progress": 2.0, "total": 5.0, "message": "rows read"}),
                    1350,
                ),
                "c at 2 of 5: \"rows read\"",
            ),
            (
                event(
                    4,
                    "tool_call_progress",
                    json!({"call_id": "c", "attempt": 1, "progress": 0.5}),
                    1350,
                ),
                "c at 0.5",
            ),
            (
                event(
                    5,
                    "tool_call_result",
                    json!({"call_id": "c", "name": "calculate", "attempts": 1, "ok": true, "code": null, "round_trip_us": 4982}),
                    1400,
                ),
                "c calculate: ok after 1 attempt, 5.0 ms",
            ),
            (
                event(
                    6,
                    "tool_call_result",
                    json!({"call_id": "c", "name": "sleep", "attempts": 3, "ok": false, "code": "TOOL_TIMEOUT"}),
                    1500,
                ),
                "c sleep: error TOOL_TIMEOUT after 3 attempts",
            ),
            (
                event(
                    6,
                    "tool_call_result",
                    json!({"call_id": "c", "name": "fail", "attempts": 2, "ok": true, "code": null, "round_trip_us": 4900}),
                    1500,
                ),
                "c fail: ok after 2 attempts, last attempt 4.9 ms",
            ),
            (
                event(
                    6,
                    "tool_call_result",
                    json!({"call_id": "c", "name": "nope", "attempts": 0, "ok": false, "code": "UNKNOWN_TOOL"}),
                    1500,
                ),
                "c nope: error UNKNOWN_TOOL (not dispatched)",
            ),
            (
                event(7, "job_succeeded", json!({"output_text": "done"}), 1600),
                "\"done\"",
            ),
            (
                event(
                    7,
                    "job_failed",
                    json!({"code": "SCRIPT_ERROR", "message": "no turn 2"}),
                    1600,
                ),
                "SCRIPT_ERROR: no turn 2",
            ),
            (
                event(7, "job_cancelled", json!({"code": "CANCELLED"}), 1600),
                "CANCELLED",
            ),
            (
                event(8, "something_new", json!({"x": 1}), 2500),
                "something_new         {\"x\":1}",
            ),
        ]
    }

    /// Every event kind (and one the CLI does not know) reads as one line
    /// saying what `one_line_cases` expects, the first at offset 0 and 0 s.
    #[test]
    fn every_event_kind_reads_as_one_line() {
        for (event, expected) in one_line_cases() {
            let line = event_line(&event, 1000);
            assert!(line.contains(expected), "{line:?} lacks {expected:?}");
            assert!(!line.contains('\n'), "{line:?}");
        }
        let queued = event(0, "job_queued", json!({"metadata": {}}), 1000);
        assert_eq!(event_line(&queued, 1000), "  #0   0.000s  job_queued");
    }

    #[test]
    fn a_job_report_shows_the_whole_transcript() {
        let item = |kind| v1::Item { kind: Some(kind) };
        let job = v1::Job {
            job_id: "j1".into(),
            status: v1::JobStatus::Succeeded as i32,
            output_text: "437".into(),
            error: None,
            rounds: 1,
            items: vec![
                item(item::Kind::User(v1::UserMessage {
                    text: "what is 23*19?".into(),
                })),
                item(item::Kind::ToolCall(v1::ToolCallItem {
                    call_id: "call_0_0".into(),
                    name: "calculate".into(),
                    arguments: "{\"expression\": \"23 * 19\"}".into(),
                })),
                item(item::Kind::ToolResult(v1::ToolResultItem {
                    call_id: "call_0_0".into(),
                    name: "calculate".into(),
                    output: "{\n  \"data\": {\"result\": 437},\n  \"ok\": true\n}".into(),
                    attempts: 1,
                })),
                item(item::Kind::Assistant(v1::AssistantMessage {
                    text: "437\nthat is all".into(),
                })),
            ],
            metadata: [("team".to_owned(), "a".to_owned())].into(),
            created_at_ms: 1000,
            finished_at_ms: 2500,
            trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".into(),
            submitter: "token:0123456789abcdef".into(),
            held_calls: vec![v1::HeldCall {
                call_id: "call_0_0".into(),
                tool: "calculate".into(),
                kind: "approval".into(),
                requested_at_ms: 1100,
                expires_at_ms: 90_000,
                decision: "approved".into(),
                reason: "fine".into(),
                decided_by_tenant: "acme".into(),
                approver: "Ana Lima".into(),
                decided_at_ms: 2300,
                ..Default::default()
            }],
            budget: Some(v1::Budget {
                max_tool_calls: Some(4),
                ..Default::default()
            }),
            spent: Some(v1::Spend {
                tokens: 120,
                cost_units: 3,
                tool_calls: 1,
            }),
        };
        let report = job_report(&job);
        for expected in [
            "job j1: succeeded in 1.500s, 1 tool round\n",
            "metadata: team=a\n",
            "submitter: token:0123456789abcdef\n",
            "trace: 4bf92f3577b34da6a3ce929d0e0e4736\n",
            "spent: 120 model tokens, 3 tool cost units, 1 of 4 tool calls\n",
            "  user         what is 23*19?\n",
            "  tool_call    call_0_0  calculate({\"expression\": \"23 * 19\"})\n",
            "  tool_result  call_0_0  calculate, 1 attempt: {\"data\":{\"result\":437},\"ok\":true}\n",
            "  assistant    437\n               that is all\n",
            "held for a person:\n  call_0_0 calculate: approval, approved by Ana Lima (tenant acme) after 1.2s: \"fine\"\n",
            "output:\n  437\n",
        ] {
            assert!(report.contains(expected), "{report}\nlacks {expected:?}");
        }
        let json = job_json(&job);
        assert_eq!(json["status"], "succeeded");
        assert_eq!(json["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(json["submitter"], "token:0123456789abcdef");
        assert_eq!(json["budget"]["max_tool_calls"], 4);
        assert_eq!(json["spent"]["tokens"], 120);
        assert_eq!(
            json["items"][1]["tool_call"]["arguments"],
            "{\"expression\": \"23 * 19\"}"
        );

        let failed = v1::Job {
            status: v1::JobStatus::Failed as i32,
            error: Some(v1::JobError {
                code: "SCRIPT_ERROR".into(),
                message: "bad".into(),
            }),
            ..job
        };
        let report = job_report(&failed);
        assert!(report.contains("error: SCRIPT_ERROR: bad\n"), "{report}");
        assert!(!report.contains("output:"), "{report}");
    }

    #[test]
    fn the_tools_table_lines_up() {
        let tool = |name: &str, workers, description: &str| v1::Tool {
            name: name.into(),
            description: description.into(),
            parameters: "{}".into(),
            strict: true,
            workers,
            timeout_ms: 5000,
            max_attempts: 3,
            side_effects: false,
            version: "1".into(),
            approval: "never".into(),
            effects: "read_only".into(),
            available: true,
            ..Default::default()
        };
        let table = tools_table(&[
            tool(
                "calculate",
                2,
                "Evaluate an arithmetic expression. Use it for maths.",
            ),
            tool("get_current_weather", 12, "Get the weather."),
        ]);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3, "{table}");
        assert!(
            lines[0].starts_with(
                "NAME                 WORKERS  TIMEOUT  ATTEMPTS  EFFECTS    DESCRIPTION"
            ),
            "{table}"
        );
        assert!(lines[1].starts_with("calculate                  2  5s              3  read_only  Evaluate an arithmetic expression."), "{table}");
        assert!(lines[2].contains("get_current_weather       12"), "{table}");
    }

    #[test]
    fn the_tools_table_shows_the_fleet_when_told() {
        let tool = |name: &str, workers| v1::Tool {
            name: name.into(),
            workers,
            timeout_ms: 5000,
            effects: "read_only".into(),
            available: true,
            ..Default::default()
        };
        let table = tools_table(&[
            v1::Tool {
                pools: vec!["general".into(), "spare".into()],
                calls_waiting: Some(12),
                ..tool("calculate", 2)
            },
            v1::Tool {
                workers_unavailable: 1,
                mcp_server: "crm".into(),
                available: false,
                ..tool("crm__find", 0)
            },
        ]);
        let lines: Vec<&str> = table.lines().collect();
        assert!(
            lines[0]
                .starts_with("NAME       WORKERS             POOLS          WAITING  MCP  TIMEOUT"),
            "{table}"
        );
        assert!(
            lines[1].starts_with("calculate                   2  general,spare       12  -    5s"),
            "{table}"
        );
        assert!(
            lines[2].starts_with("crm__find  0 (+1 unavailable)  -              unknown  crm"),
            "{table}"
        );
        let json = tools_json(&[v1::Tool {
            contract_hash: "c0ffee".into(),
            ..tool("calculate", 1)
        }]);
        assert_eq!(
            json[0]["calls_waiting"],
            Value::Null,
            "absent: not known or not told"
        );
        assert_eq!(json[0]["pools"], json!([]));
        assert_eq!(json[0]["contract_hash"], "c0ffee");
        // A breaker that is not closed is said beside the workers.
        let open = v1::Tool {
            breaker: "open".into(),
            breaker_since_ms: Some(1_700_000_000_000),
            ..tool("calculate", 2)
        };
        let table = tools_table(std::slice::from_ref(&open));
        assert!(table.contains("2 (breaker open)"), "{table}");
        let closed = tools_table(&[v1::Tool {
            breaker: "closed".into(),
            ..tool("calculate", 2)
        }]);
        assert!(!closed.contains("breaker"), "{closed}");
        let json = tools_json(&[open]);
        assert_eq!(json[0]["breaker"], "open");
        assert_eq!(json[0]["breaker_since_ms"], 1_700_000_000_000_u64);
        // Two live versions (a rolling upgrade) are said beside the workers.
        let version = |hash: &str, workers, offered| v1::ToolVersion {
            contract_hash: hash.into(),
            workers,
            offered,
        };
        let rolling = v1::Tool {
            pools: vec!["general".into()],
            versions: vec![
                version("0123456789abcdef", 1, false),
                version("fedcba9876543210", 2, true),
            ],
            ..tool("calculate", 3)
        };
        let table = tools_table(std::slice::from_ref(&rolling));
        assert!(
            table.contains("3 (0123456789ab: 1, fedcba987654: 2 offered)"),
            "{table}"
        );
        let json = tools_json(&[rolling]);
        assert_eq!(json[0]["versions"][1]["contract_hash"], "fedcba9876543210");
        assert_eq!(json[0]["versions"][1]["offered"], true);
    }

    #[test]
    fn a_streamed_turn_is_one_growing_line_ended_by_the_next_event() {
        let delta = |data: Value| event(2, "model_output_delta", data, 10);
        let mut streaming = Streaming::default();
        let turn = event(
            2,
            "model_turn",
            json!({"turn": 0, "round": 0, "text": "Hi!", "tool_calls": []}),
            20,
        );
        assert_eq!(streaming.delta(&turn), None, "not a delta");
        let printed: String = [
            json!({"turn": 0, "text": "H"}),
            json!({"turn": 0, "text": "i\u{1b}[2J"}),
            json!({"turn": 0, "restarted": true}),
            json!({"turn": 0, "text": "Hi!"}),
            json!({"turn": 0, "tool_call": {"index": 0, "name": "calculate"}}),
        ]
        .into_iter()
        .map(|data| streaming.delta(&delta(data)).unwrap())
        .collect();
        assert_eq!(
            printed,
            "           turn 1 > Hi [2J\n           turn 1 (asked again) > Hi! [calls \"calculate\"]"
        );
        assert_eq!(streaming.end(), "\n");
        assert_eq!(streaming.end(), "", "ended once");
    }
}
