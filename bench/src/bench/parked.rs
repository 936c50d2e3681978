//! `--parked N`: what jobs waiting for a person cost an orchestrator. The
//! orchestrator is measured idle, then N jobs are parked (each holds one
//! `echo` call for approval, decision 0036), and it is measured again over
//! the same window: its CPU and memory should not move, since a parked job
//! is in no process. Redis holds them; its memory is reported too.

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
/// gauges (every 5 s), which read every pending call.
const WINDOW: Duration = Duration::from_secs(30);

/// What parking cost, as `--parked` reports it.
#[derive(Debug, Serialize)]
pub(super) struct ParkedReport {
    pub(super) parked_jobs: usize,
    pub(super) window_s: u64,
    pub(super) parking_s: f64,
    pub(super) idle_cpu_percent: f64,
    pub(super) parked_cpu_percent: f64,
    pub(super) idle_rss_mib: f64,
    pub(super) parked_rss_mib: f64,
    pub(super) redis_used_memory_mib_before: f64,
    pub(super) redis_used_memory_mib_after: f64,
}

/// Measures `orchestrator` idle, parks `jobs` jobs through `api`, and
/// measures it again; `redis_url` is the fleet's Redis.
pub(super) async fn measure(
    api: &Api,
    orchestrator: &Probe,
    redis_url: &str,
    jobs: usize,
    concurrency: usize,
) -> anyhow::Result<ParkedReport> {
    let redis_before = redis_used_memory(redis_url).await?;
    eprintln!("parked: the orchestrator idle for {}s...", WINDOW.as_secs());
    let (idle_cpu, idle_rss) = usage_over(orchestrator).await?;
    eprintln!("parked: parking {jobs} jobs, {concurrency} at a time...");
    let started = Instant::now();
    park(api, jobs, concurrency).await?;
    let parking = started.elapsed();
    eprintln!(
        "parked: {jobs} jobs parked in {:.1}s; the orchestrator for {}s...",
        parking.as_secs_f64(),
        WINDOW.as_secs()
    );
    let (parked_cpu, parked_rss) = usage_over(orchestrator).await?;
    let redis_after = redis_used_memory(redis_url).await?;
    Ok(ParkedReport {
        parked_jobs: jobs,
        window_s: WINDOW.as_secs(),
        parking_s: parking.as_secs_f64(),
        idle_cpu_percent: idle_cpu,
        parked_cpu_percent: parked_cpu,
        idle_rss_mib: idle_rss,
        parked_rss_mib: parked_rss,
        redis_used_memory_mib_before: redis_before,
        redis_used_memory_mib_after: redis_after,
    })
}

/// The orchestrator's CPU (percent of one core) over [`WINDOW`], and its
/// resident memory at the end (MiB).
async fn usage_over(orchestrator: &Probe) -> anyhow::Result<(f64, f64)> {
    let gone = || anyhow::anyhow!("the orchestrator (pid {}) is gone", orchestrator.pid);
    let before = cpu_of(orchestrator.pid).ok_or_else(gone)?;
    tokio::time::sleep(WINDOW).await;
    let after = cpu_of(orchestrator.pid).ok_or_else(gone)?;
    let rss = rss_of(orchestrator.pid).ok_or_else(gone)?;
    let cpu = (after - before).as_secs_f64() / WINDOW.as_secs_f64() * 100.0;
    Ok((cpu, rss as f64 / (1024.0 * 1024.0)))
}

/// Submits `jobs` jobs whose one call waits for approval, and waits until
/// each is parked.
async fn park(api: &Api, jobs: usize, concurrency: usize) -> anyhow::Result<()> {
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
            let parked = park_one(api, script).await;
            drop(permit);
            parked
        }));
    }
    let every = (jobs / 10).max(1);
    for (done, task) in tasks.into_iter().enumerate() {
        task.await??;
        if (done + 1).is_multiple_of(every) {
            eprintln!("  {}/{jobs} parked", done + 1);
        }
    }
    Ok(())
}

async fn park_one(mut api: Api, script: String) -> anyhow::Result<()> {
    let request = v1::SubmitJobRequest {
        input: "parked".into(),
        model: Some(v1::ModelSpec {
            provider: "scripted".into(),
            script,
            ..Default::default()
        }),
        tools: vec!["echo".into()],
        require_approval: vec!["echo".into()],
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
        if job.status() == v1::JobStatus::WaitingForApproval {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "job {job_id} did not park within 2 minutes ({:?})",
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
    format!(
        "parked jobs: {} (parked in {:.1}s)\n\
         orchestrator over {}s: idle {:.2}% of a core, {:.1} MiB; with them parked {:.2}% of a core, {:.1} MiB\n\
         redis used memory: {:.1} MiB before, {:.1} MiB after ({:.2} KiB a parked job)\n",
        report.parked_jobs,
        report.parking_s,
        report.window_s,
        report.idle_cpu_percent,
        report.idle_rss_mib,
        report.parked_cpu_percent,
        report.parked_rss_mib,
        report.redis_used_memory_mib_before,
        report.redis_used_memory_mib_after,
        (report.redis_used_memory_mib_after - report.redis_used_memory_mib_before) * 1024.0
            / report.parked_jobs.max(1) as f64,
    )
}
