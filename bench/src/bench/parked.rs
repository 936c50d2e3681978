//! `--parked N`: what jobs waiting for a person cost an orchestrator. The
//! orchestrator first runs N jobs to their end (each calls `echo` once),
//! so that its allocator has seen as much work as parking N jobs gives it,
//! and is measured idle; then N jobs are parked (each holds one `echo` call
//! for approval, decision 0036), and it is measured again over the same
//! window. Its CPU and memory should not move, since a parked job is in no
//! process, and its memory should not grow within either window. Redis
//! holds the parked jobs; its memory is reported too.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use serde_json::json;
use tokio::sync::Semaphore;
use toolfleet_proto::v1;

use super::Api;
use super::accounting::{Probe, cpu_of, rss_of};

/// How long each measurement lasts: several refreshes of the approvals'
/// gauges (every 5 s).
const WINDOW: Duration = Duration::from_secs(30);

/// What parking cost, as `--parked` reports it.
#[derive(Debug, Serialize)]
pub(super) struct ParkedReport {
    pub(super) parked_jobs: usize,
    pub(super) window_s: u64,
    pub(super) parking_s: f64,
    pub(super) idle: Window,
    pub(super) parked: Window,
    pub(super) redis_used_memory_mib_before: f64,
    pub(super) redis_used_memory_mib_after: f64,
}

/// The orchestrator over one measurement window.
#[derive(Debug, Serialize)]
pub(super) struct Window {
    /// CPU, in percent of one core.
    pub(super) cpu_percent: f64,
    /// Resident memory at the window's start (MiB).
    pub(super) rss_mib_start: f64,
    /// Resident memory at its end (MiB).
    pub(super) rss_mib_end: f64,
}

/// Runs `jobs` jobs to their end, measures `orchestrator` idle, parks
/// `jobs` jobs through `api`, and measures it again; `redis_url` is the
/// fleet's Redis.
pub(super) async fn measure(
    api: &Api,
    orchestrator: &Probe,
    redis_url: &str,
    jobs: usize,
    concurrency: usize,
) -> anyhow::Result<ParkedReport> {
    eprintln!("parked: running {jobs} jobs to their end first, {concurrency} at a time...");
    submit_all(api, jobs, concurrency, Outcome::Ended).await?;
    let redis_before = redis_used_memory(redis_url).await?;
    eprintln!("parked: the orchestrator idle for {}s...", WINDOW.as_secs());
    let idle = usage_over(orchestrator).await?;
    eprintln!("parked: parking {jobs} jobs, {concurrency} at a time...");
    let started = Instant::now();
    submit_all(api, jobs, concurrency, Outcome::Parked).await?;
    let parking = started.elapsed();
    eprintln!(
        "parked: {jobs} jobs parked in {:.1}s; the orchestrator for {}s...",
        parking.as_secs_f64(),
        WINDOW.as_secs()
    );
    let parked = usage_over(orchestrator).await?;
    let redis_after = redis_used_memory(redis_url).await?;
    Ok(ParkedReport {
        parked_jobs: jobs,
        window_s: WINDOW.as_secs(),
        parking_s: parking.as_secs_f64(),
        idle,
        parked,
        redis_used_memory_mib_before: redis_before,
        redis_used_memory_mib_after: redis_after,
    })
}

/// Parks `jobs` jobs, `concurrency` at a time (`--awaiting-approval`).
pub(super) async fn park(api: &Api, jobs: usize, concurrency: usize) -> anyhow::Result<()> {
    eprintln!("parking {jobs} jobs, each holding a call for approval...");
    submit_all(api, jobs, concurrency, Outcome::Parked).await
}

/// The orchestrator over [`WINDOW`].
async fn usage_over(orchestrator: &Probe) -> anyhow::Result<Window> {
    let gone = || anyhow::anyhow!("the orchestrator (pid {}) is gone", orchestrator.pid);
    let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
    let rss_start = rss_of(orchestrator.pid).ok_or_else(gone)?;
    let before = cpu_of(orchestrator.pid).ok_or_else(gone)?;
    tokio::time::sleep(WINDOW).await;
    let after = cpu_of(orchestrator.pid).ok_or_else(gone)?;
    let rss_end = rss_of(orchestrator.pid).ok_or_else(gone)?;
    Ok(Window {
        cpu_percent: (after - before).as_secs_f64() / WINDOW.as_secs_f64() * 100.0,
        rss_mib_start: mib(rss_start),
        rss_mib_end: mib(rss_end),
    })
}

/// Where a job submitted by [`submit_all`] is waited for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Its call runs and the job ends.
    Ended,
    /// Its call waits for approval and the job parks.
    Parked,
}

/// Submits `jobs` jobs of one `echo` call each, and waits until each has
/// reached `outcome`.
async fn submit_all(
    api: &Api,
    jobs: usize,
    concurrency: usize,
    outcome: Outcome,
) -> anyhow::Result<()> {
    let script = json!([
        {"tool_calls": [{"id": "held", "name": "echo", "arguments": {}}]},
        {"message": "done"}
    ])
    .to_string();
    let window = Arc::new(Semaphore::new(concurrency.max(1)));
    let mut tasks = Vec::with_capacity(jobs);
    for _ in 0..jobs {
        let permit = window.clone().acquire_owned().await?;
        let (api, script) = (api.clone(), script.clone());
        tasks.push(tokio::spawn(async move {
            let reached = submit_one(api, script, outcome).await;
            drop(permit);
            reached
        }));
    }
    let every = (jobs / 10).max(1);
    for (done, task) in tasks.into_iter().enumerate() {
        task.await??;
        if (done + 1).is_multiple_of(every) {
            eprintln!("  {}/{jobs} {outcome:?}", done + 1);
        }
    }
    Ok(())
}

async fn submit_one(mut api: Api, script: String, outcome: Outcome) -> anyhow::Result<()> {
    let held = outcome == Outcome::Parked;
    let request = v1::SubmitJobRequest {
        input: "parked".into(),
        model: Some(v1::ModelSpec {
            provider: "scripted".into(),
            script,
            ..Default::default()
        }),
        tools: vec!["echo".into()],
        require_approval: if held {
            vec!["echo".into()]
        } else {
            Vec::new()
        },
        ..Default::default()
    };
    let job_id = api.submit_job(request).await?.into_inner().job_id;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let job = api
            .get_job(v1::GetJobRequest {
                job_id: job_id.clone(),
            })
            .await?
            .into_inner();
        match (job.status(), outcome) {
            (v1::JobStatus::WaitingForApproval, Outcome::Parked)
            | (v1::JobStatus::Succeeded, Outcome::Ended) => return Ok(()),
            (v1::JobStatus::Failed | v1::JobStatus::Cancelled, _) => {
                anyhow::bail!("job {job_id} ended {:?}: {:?}", job.status(), job.error)
            }
            _ => {}
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "job {job_id} did not reach {outcome:?} within 2 minutes ({:?})",
            job.status()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Redis's `used_memory`, in MiB.
async fn redis_used_memory(url: &str) -> anyhow::Result<f64> {
    let client = redis::Client::open(url)?;
    let mut connection = client.get_multiplexed_async_connection().await?;
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut connection)
        .await?;
    let bytes: f64 = info
        .lines()
        .find_map(|line| line.strip_prefix("used_memory:"))
        .context("INFO memory has no used_memory")?
        .trim()
        .parse()?;
    Ok(bytes / (1024.0 * 1024.0))
}

/// The report, for people.
pub(super) fn print(report: &ParkedReport) -> String {
    let window = |name: &str, w: &Window| {
        format!(
            "  {name}: {:.2}% of a core; {:.1} MiB at the start, {:.1} MiB at the end\n",
            w.cpu_percent, w.rss_mib_start, w.rss_mib_end
        )
    };
    format!(
        "parked jobs: {} (parked in {:.1}s)\n\
         orchestrator over {}s, after as many jobs ran to their end:\n{}{}\
         redis used memory: {:.1} MiB before, {:.1} MiB after ({:.2} KiB a parked job)\n",
        report.parked_jobs,
        report.parking_s,
        report.window_s,
        window("idle", &report.idle),
        window("with them parked", &report.parked),
        report.redis_used_memory_mib_before,
        report.redis_used_memory_mib_after,
        (report.redis_used_memory_mib_after - report.redis_used_memory_mib_before) * 1024.0
            / report.parked_jobs.max(1) as f64,
    )
}
