//! The jobs the bench submits: a scripted model's turns of calls to one
//! tool, `concurrency` jobs at a time, each followed to its end.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use toolfleet_proto::{JobEvent, v1};

use super::Api;
use super::args::BenchArgs;
use super::tenants::{Tenants, authorized};

/// What every job of a phase runs: the scripted model's script, and the
/// tool its calls call.
#[derive(Clone, Copy)]
pub(super) struct Work<'a> {
    pub(super) script: &'a Script,
    pub(super) tool: Workload,
    /// With `--tenants`, whose the jobs are, in turn.
    pub(super) tenants: Option<&'a Tenants>,
}

/// The tool every call of the bench runs.
#[derive(Debug, Clone, Copy)]
pub(super) enum Workload {
    /// `echo`: no work, so the numbers are the fleet's own cost.
    Echo,
    /// `calculate` of "1+1": next to no work, in a tool of the shipped
    /// pool `general`.
    Calculate,
    /// `sleep`: a tool that waits, as most real tools wait on I/O; the
    /// numbers show how well a worker keeps its slots busy.
    Sleep { ms: u64 },
}

impl Workload {
    pub(super) fn of(args: &BenchArgs) -> Self {
        match args.sleep_ms {
            Some(ms) => Self::Sleep { ms },
            None if args.calculate || args.nats_accounts => Self::Calculate,
            None => Self::Echo,
        }
    }

    pub(super) fn name(self) -> String {
        match self {
            Self::Echo => "echo".to_owned(),
            Self::Calculate => "calculate".to_owned(),
            Self::Sleep { ms } => format!("sleep {ms}ms"),
        }
    }

    pub(super) fn tool(self) -> &'static str {
        match self {
            Self::Echo => "echo",
            Self::Calculate => "calculate",
            Self::Sleep { .. } => "sleep",
        }
    }

    fn call(self, round: usize, call: usize) -> Value {
        match self {
            Self::Echo => json!({"name": "echo", "arguments": {"round": round, "call": call}}),
            Self::Calculate => json!({"name": "calculate", "arguments": {"expression": "1+1"}}),
            Self::Sleep { ms } => json!({"name": "sleep", "arguments": {"ms": ms}}),
        }
    }
}

/// A scripted model's turns, and how many of them ask for tools: the job's
/// `max_tool_rounds`, so that a script of more rounds than the API's
/// default (8) runs to its end.
#[derive(Clone)]
pub(super) struct Script {
    pub(super) text: String,
    pub(super) rounds: u32,
}

/// `rounds` turns of `calls` parallel calls of `tool`, then a final message.
pub(super) fn script(tool: Workload, rounds: usize, calls: usize) -> Script {
    let mut turns: Vec<Value> = (0..rounds)
        .map(|round| {
            let calls: Vec<Value> = (0..calls).map(|i| tool.call(round, i)).collect();
            json!({"tool_calls": calls})
        })
        .collect();
    turns.push(json!({"message": "done"}));
    Script {
        text: Value::Array(turns).to_string(),
        rounds: u32::try_from(rounds).unwrap_or(u32::MAX),
    }
}

/// Runs `jobs` jobs, `concurrency` at a time; returns the tool call round
/// trips the runner reported (when `collect`).
pub(super) async fn load(
    api: &Api,
    Work {
        script,
        tool,
        tenants,
    }: Work<'_>,
    jobs: usize,
    concurrency: usize,
    collect: bool,
) -> anyhow::Result<Vec<Duration>> {
    let window = Arc::new(Semaphore::new(concurrency.max(1)));
    let mut tasks = Vec::with_capacity(jobs);
    let mut done = 0usize;
    let progress_every = (jobs / 10).max(1);
    for n in 0..jobs {
        let permit = window.clone().acquire_owned().await?;
        let api = api.clone();
        let script = script.clone();
        let token = tenants.map(|tenants| tenants.token(n).to_owned());
        tasks.push(tokio::spawn(async move {
            let job = Job {
                script: &script,
                tool,
                token: token.as_deref(),
            };
            let result = run_job(api, job, collect).await;
            drop(permit);
            result
        }));
    }
    let mut round_trips = Vec::new();
    for task in tasks {
        round_trips.extend(task.await??);
        done += 1;
        if collect && done.is_multiple_of(progress_every) {
            eprintln!("  {done}/{jobs} jobs done");
        }
    }
    Ok(round_trips)
}

/// One job to run: its script and rounds, the tool it calls, and its
/// tenant's token when the fleet takes tokens.
#[derive(Clone, Copy)]
pub(super) struct Job<'a> {
    pub(super) script: &'a Script,
    pub(super) tool: Workload,
    pub(super) token: Option<&'a str>,
}

/// Submits one scripted job and follows its events to the end.
pub(super) async fn run_job(
    mut api: Api,
    Job {
        script,
        tool,
        token,
    }: Job<'_>,
    collect: bool,
) -> anyhow::Result<Vec<Duration>> {
    let request = v1::SubmitJobRequest {
        input: "bench".into(),
        model: Some(v1::ModelSpec {
            provider: "scripted".into(),
            script: script.text.clone(),
            ..Default::default()
        }),
        tools: vec![tool.tool().into()],
        max_tool_rounds: script.rounds,
        ..Default::default()
    };
    let job_id = api
        .submit_job(authorized(request, token))
        .await?
        .into_inner()
        .job_id;
    let watch = v1::WatchJobRequest {
        job_id: job_id.clone(),
        from_offset: 0,
    };
    let mut events = api.watch_job(authorized(watch, token)).await?.into_inner();
    let mut round_trips = Vec::new();
    while let Some(event) = events.next().await {
        let event = event?;
        let decoded = JobEvent::decode(&event.kind, &event.data);
        if collect
            && let Ok(JobEvent::ToolCallResult {
                round_trip_us: Some(us),
                ..
            }) = decoded
        {
            round_trips.push(Duration::from_micros(us));
        }
        if event.r#final {
            // Read the stream's end rather than reset it by dropping it: a
            // connection that resets too many streams is closed (docs/api.md).
            let _ = events.next().await;
            anyhow::ensure!(
                matches!(decoded, Ok(JobEvent::JobSucceeded { .. })),
                "job {job_id} ended with {}: {}",
                event.kind,
                event.data
            );
            return Ok(round_trips);
        }
    }
    anyhow::bail!("the event stream of job {job_id} ended before the job did")
}
