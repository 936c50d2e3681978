//! Following a job: its events as they happen, the job once it ended, and
//! the exit code of how it ended. `submit --watch`, `watch`, `trace`,
//! `get`, `call` and `dev` share these.

use std::process::ExitCode;

use anyhow::bail;
use toolfleet_proto::JobEvent;
use toolfleet_proto::v1;

use super::connection::{ApiClient, rpc_error};
use crate::output::{out, outln};
use crate::{EXIT_JOB_CANCELLED, EXIT_JOB_FAILED, transcript};

/// Streams the job's events, then prints the job; the exit code says how it ended.
pub(crate) async fn follow(
    client: &mut ApiClient,
    job_id: &str,
    json: bool,
) -> anyhow::Result<ExitCode> {
    stream_events(client, job_id, 0, None, json).await?;
    let job = get_job(client, job_id).await?;
    if !json {
        outln!()?;
    }
    print_job(&job, json)?;
    Ok(exit_code(&job))
}

/// The exit code for how a job ended.
pub(crate) fn exit_code(job: &v1::Job) -> ExitCode {
    match v1::JobStatus::try_from(job.status) {
        Ok(v1::JobStatus::Succeeded) => ExitCode::SUCCESS,
        Ok(v1::JobStatus::Cancelled) => ExitCode::from(EXIT_JOB_CANCELLED),
        _ => ExitCode::from(EXIT_JOB_FAILED),
    }
}

/// `--quiet`'s output: the answer of a job that succeeded on stdout, why one
/// did not on stderr; its exit code.
pub(super) fn say_ending(last: &v1::JobEvent) -> anyhow::Result<ExitCode> {
    match JobEvent::decode(&last.kind, &last.data) {
        Ok(JobEvent::JobSucceeded { output_text, .. }) => outln!("{output_text}")?,
        Ok(JobEvent::JobFailed { code, message, .. }) => {
            eprintln!(
                "job {} failed: {code} {}",
                last.job_id,
                message.unwrap_or_default()
            );
        }
        Ok(JobEvent::JobCancelled { .. }) => eprintln!("job {} was cancelled", last.job_id),
        _ => eprintln!(
            "job {} ended with an unreadable {} event",
            last.job_id, last.kind
        ),
    }
    Ok(ending_code(last))
}

/// The exit code for a job's final event.
pub(super) fn ending_code(last: &v1::JobEvent) -> ExitCode {
    match JobEvent::decode(&last.kind, &last.data) {
        Ok(JobEvent::JobFailed { .. }) => ExitCode::from(EXIT_JOB_FAILED),
        Ok(JobEvent::JobCancelled { .. }) => ExitCode::from(EXIT_JOB_CANCELLED),
        _ => ExitCode::SUCCESS,
    }
}

/// Prints the events from `from` on as they happen, and returns the final
/// one. Times are shown from `origin` (Unix ms), else from the first event.
pub(super) async fn stream_events(
    client: &mut ApiClient,
    job_id: &str,
    from: u64,
    origin: Option<u64>,
    json: bool,
) -> anyhow::Result<v1::JobEvent> {
    let mut start_ms = origin;
    let mut streaming = transcript::Streaming::default();
    each_event(client, job_id, from, |event| {
        if json {
            outln!("{}", transcript::event_json(event))
        } else if let Some(text) = streaming.delta(event) {
            // A streamed answer, printed as it is written.
            out!("{text}")
        } else {
            let start = *start_ms.get_or_insert(event.timestamp_ms);
            out!("{}", streaming.end())?;
            outln!("{}", transcript::event_line(event, start))
        }
    })
    .await
}

/// Hands each event from `from` on to `on_event` as it happens, and returns
/// the final one.
pub(crate) async fn each_event(
    client: &mut ApiClient,
    job_id: &str,
    from: u64,
    mut on_event: impl FnMut(&v1::JobEvent) -> std::io::Result<()>,
) -> anyhow::Result<v1::JobEvent> {
    let mut events = client
        .watch_job(v1::WatchJobRequest {
            job_id: job_id.to_owned(),
            from_offset: from,
        })
        .await
        .map_err(|status| rpc_error("WatchJob", &status))?
        .into_inner();
    let mut next = from;
    let resume = |next: u64| format!("resume with: toolfleet watch {job_id} --from {next}");
    loop {
        let event = events
            .message()
            .await
            .map_err(|status| rpc_error("WatchJob", &status).context(resume(next)))?;
        let Some(event) = event else {
            bail!(
                "the event stream of job {job_id} ended before its final event \
                 (did the orchestrator stop?); {}",
                resume(next)
            );
        };
        on_event(&event)?;
        next = event.offset.saturating_add(1);
        if event.r#final {
            // The server ends the stream after it: read that end, rather
            // than reset the stream by dropping it (docs/api.md).
            let _ = events.message().await;
            return Ok(event);
        }
    }
}

pub(crate) async fn get_job(client: &mut ApiClient, job_id: &str) -> anyhow::Result<v1::Job> {
    Ok(client
        .get_job(v1::GetJobRequest {
            job_id: job_id.to_owned(),
        })
        .await
        .map_err(|status| rpc_error("GetJob", &status))?
        .into_inner())
}

pub(super) fn print_job(job: &v1::Job, json: bool) -> std::io::Result<()> {
    if json {
        outln!("{}", transcript::job_json(job))?;
    } else {
        out!("{}", transcript::job_report(job))?;
    }
    Ok(())
}
