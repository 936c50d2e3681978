//! `--jobs-page N`: what the console's jobs page costs with N jobs stored.
//! A few jobs run to their end first; then Redis is filled with N finished
//! jobs (copies of one of them, spread over the last 23 hours, each in its
//! tenant's index and counts as a real one is: `--stored-jobs`); then each
//! query the page makes is timed, one request at a time, through the gRPC
//! API: the newest page with the tenant's counts, the page of the last
//! hour, pages deep into it, and a status filter that nothing matches
//! (the most a page reads). The counts must say every job stored.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;
use toolfleet_orchestrator::job::now_ms;
use toolfleet_proto::names::RedisKeys;
use toolfleet_proto::v1;
use toolfleet_service::config::RedisOptions;

use super::Api;
use super::load::{Work, Workload, load, script};
use super::report::Percentiles;
use super::stored;

/// Jobs run before the store is filled: one to copy, and a few of each
/// query's own.
const WARM_UP_JOBS: usize = 20;
/// Requests of each query.
const REQUESTS: usize = 200;
/// Jobs on a page, as the console asks.
const PAGE_SIZE: u32 = 50;
/// How far back the stored jobs reach: within the default retention, so
/// none expires during the run.
const SPREAD: Duration = Duration::from_secs(23 * 3600);

/// What `--jobs-page` measured.
#[derive(Debug, Serialize)]
pub(super) struct JobsPageReport {
    /// Finished jobs stored besides the warm-up's.
    pub(super) stored_jobs: usize,
    /// How long filling Redis took (seconds).
    pub(super) fill_s: f64,
    /// Each query, timed.
    pub(super) queries: Vec<Query>,
    /// The counts the page answered: status name -> jobs.
    pub(super) counts: Vec<(String, u64)>,
}

/// One query of the page, timed over [`REQUESTS`] requests.
#[derive(Debug, Serialize)]
pub(super) struct Query {
    pub(super) name: &'static str,
    pub(super) requests: usize,
    /// Jobs on its pages, on average.
    pub(super) jobs_per_page: f64,
    pub(super) latency: Percentiles,
    pub(super) max_ms: f64,
}

/// Runs the warm-up, fills Redis at `redis_url` with `stored` jobs, and
/// times the page's queries through `api`.
pub(super) async fn measure(
    api: &Api,
    redis_url: &str,
    stored: usize,
) -> anyhow::Result<JobsPageReport> {
    eprintln!("jobs page: running {WARM_UP_JOBS} jobs to their end...");
    let one_call = script(Workload::Echo, 1, 1);
    let work = Work {
        script: &one_call,
        tool: Workload::Echo,
        tenants: None,
    };
    load(api, work, WARM_UP_JOBS, 8, false).await?;
    let keys = RedisKeys::new(RedisOptions::default().key_prefix);
    let started = Instant::now();
    stored::fill(redis_url, &keys, stored, Some(SPREAD)).await?;
    let fill_s = started.elapsed().as_secs_f64();
    // The warm-up's last ends are counted just after their final events.
    let expected = (stored + WARM_UP_JOBS) as u64;
    let mut counts = Vec::new();
    for _ in 0..50 {
        counts = self::counts(api).await?;
        if counts.iter().map(|(_, n)| n).sum::<u64>() == expected {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let total: u64 = counts.iter().map(|(_, n)| n).sum();
    anyhow::ensure!(
        total == expected,
        "the counts say {total} jobs, not the {expected} stored: {counts:?}"
    );
    let hour_ago = now_ms() - 3_600_000;
    let newest = v1::ListJobsRequest {
        page_size: PAGE_SIZE,
        with_counts: true,
        ..Default::default()
    };
    let last_hour = v1::ListJobsRequest {
        created_after_ms: hour_ago,
        ..newest.clone()
    };
    let none_failed = v1::ListJobsRequest {
        status: v1::JobStatus::Failed.into(),
        ..newest.clone()
    };
    let mut queries = Vec::new();
    for (name, request) in [
        ("newest page, with counts", &newest),
        ("last hour, with counts", &last_hour),
        ("status nothing matches (reads 500)", &none_failed),
    ] {
        eprintln!("jobs page: {REQUESTS} requests of the {name}...");
        queries.push(time(api, name, request, false).await?);
    }
    eprintln!("jobs page: {REQUESTS} pages of the last hour, each the next...");
    queries.push(time(api, "last hour, page after page", &last_hour, true).await?);
    Ok(JobsPageReport {
        stored_jobs: stored,
        fill_s,
        queries,
        counts,
    })
}

/// The counts of the caller's jobs, by status name.
async fn counts(api: &Api) -> anyhow::Result<Vec<(String, u64)>> {
    let page = api
        .clone()
        .list_jobs(v1::ListJobsRequest {
            page_size: 1,
            with_counts: true,
            ..Default::default()
        })
        .await?
        .into_inner();
    Ok(page
        .counts
        .iter()
        .map(|c| (c.status().as_str_name().to_owned(), c.jobs))
        .collect())
}

/// Times [`REQUESTS`] requests of `request`, one at a time; with `follow`,
/// each asks for the page after the last (from the start again at the
/// end).
async fn time(
    api: &Api,
    name: &'static str,
    request: &v1::ListJobsRequest,
    follow: bool,
) -> anyhow::Result<Query> {
    let mut api = api.clone();
    let mut latencies = Vec::with_capacity(REQUESTS);
    let mut jobs = 0;
    let mut token = String::new();
    for _ in 0..REQUESTS {
        let request = v1::ListJobsRequest {
            page_token: token.clone(),
            ..request.clone()
        };
        let started = Instant::now();
        let page = api
            .list_jobs(request)
            .await
            .with_context(|| format!("ListJobs, {name}"))?
            .into_inner();
        latencies.push(started.elapsed());
        jobs += page.jobs.len();
        if follow {
            token = page.next_page_token;
        }
    }
    let max_ms = latencies
        .iter()
        .max()
        .map_or(0.0, |max| max.as_secs_f64() * 1000.0);
    Ok(Query {
        name,
        requests: REQUESTS,
        jobs_per_page: jobs as f64 / REQUESTS as f64,
        latency: Percentiles::of(latencies),
        max_ms,
    })
}

/// The report, for people.
pub(super) fn print(report: &JobsPageReport) -> String {
    let mut text = format!(
        "jobs page with {} finished jobs stored (filled in {:.1}s), {REQUESTS} requests \
         each, one at a time, {PAGE_SIZE} jobs a page:\n",
        report.stored_jobs, report.fill_s
    );
    for query in &report.queries {
        text.push_str(&format!(
            "  {:<38} p50 {:>6.2} ms  p90 {:>6.2} ms  p99 {:>6.2} ms  max {:>6.2} ms  ({:.0} jobs a page)\n",
            query.name,
            query.latency.p50_ms,
            query.latency.p90_ms,
            query.latency.p99_ms,
            query.max_ms,
            query.jobs_per_page,
        ));
    }
    let counts: Vec<String> = report
        .counts
        .iter()
        .map(|(status, n)| format!("{status} {n}"))
        .collect();
    text.push_str(&format!("counts: {}\n", counts.join(", ")));
    text
}
