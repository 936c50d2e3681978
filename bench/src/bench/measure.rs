//! What one run measures on a fleet that is up: the warm-up, the load
//! phase, the sequential jobs and the floors, each accounted.

use std::time::{Duration, Instant};

use toolfleet_proto::names::RedisKeys;
use toolfleet_service::config::RedisOptions;

use super::Api;
use super::accounting::{self, Accounting, Reading, Readings, Sources};
use super::args::BenchArgs;
use super::floor::{self, FloorShape, NatsAt};
use super::load::{Job, Work, Workload, load, run_job, script};
use super::report::{JetStreamFloor, Percentiles, Report};
use super::tenants::Tenants;
use super::{parked, stored};

/// Runs the raw JetStream floor with as many calls in flight as the load
/// had (jobs in flight times parallel calls) and as many responders as the
/// fleet has workers, and accounts it. A floor that cannot run (a
/// `--target` whose NATS refuses a new stream) is reported and skipped.
async fn jetstream_floor(
    args: &BenchArgs,
    nats: NatsAt<'_>,
    sources: &Sources,
    tool_calls_per_sec: f64,
) -> Option<JetStreamFloor> {
    let concurrency = args.concurrency * args.calls;
    eprintln!(
        "floor: {} raw JetStream calls, {concurrency} in flight...",
        args.raw_calls
    );
    let replicas = if args.nats_cluster { 3 } else { 1 };
    let before = sources.read().await;
    let started = Instant::now();
    let shape = FloorShape {
        calls: args.raw_calls,
        concurrency,
        responders: args.workers.max(1),
        replicas,
        idle_consumers: idle_consumers(args),
    };
    let ran = floor::jetstream_calls(nats, shape).await;
    let elapsed = started.elapsed();
    let (rate, latencies) = match ran {
        Ok(ran) => ran,
        Err(err) => {
            eprintln!("floor: the raw JetStream calls could not run: {err:#}");
            return None;
        }
    };
    let after = sources.read().await;
    let readings = Readings {
        idle: &before,
        before: &before,
        after: &after,
    };
    let cost = Accounting::of(readings, args.raw_calls, elapsed);
    Some(JetStreamFloor {
        calls: args.raw_calls,
        concurrency,
        calls_per_sec: rate,
        round_trip: Percentiles::of(latencies),
        cpu_ms_per_call_by_process: cost.cpu_ms_per_job_by_process,
        cpu_ms_per_call_total: cost.cpu_ms_per_job_total,
        nats_messages_in_per_call: cost.nats_messages_in_per_job,
        nats_messages_out_per_call: cost.nats_messages_out_per_job,
        tool_calls_vs_raw_jetstream: tool_calls_per_sec / rate,
    })
}

/// The one-call floor: as many raw JetStream calls as `--sequential`
/// one-call jobs, one at a time, one responder: what a one-call job's trip
/// through the bus costs with nothing else in its way.
async fn one_call_floor(args: &BenchArgs, nats: NatsAt<'_>) -> Option<Percentiles> {
    eprintln!(
        "floor: {} raw JetStream calls, one at a time...",
        args.sequential
    );
    let shape = FloorShape {
        calls: args.sequential.max(1),
        concurrency: 1,
        responders: 1,
        replicas: if args.nats_cluster { 3 } else { 1 },
        idle_consumers: idle_consumers(args),
    };
    match floor::jetstream_calls(nats, shape).await {
        Ok((_, latencies)) => Some(Percentiles::of(latencies)),
        Err(err) => {
            eprintln!("floor: the raw JetStream calls could not run: {err:#}");
            None
        }
    }
}

/// The floors' idle consumers: one per idle tool, as the fleet's calls
/// stream has.
fn idle_consumers(args: &BenchArgs) -> usize {
    args.idle_tools.map_or(0, |n| n as usize)
}

/// The raw NATS floor's requests: none where its client has no NATS user.
fn raw_requests(args: &BenchArgs) -> usize {
    if args.nats_accounts {
        0
    } else {
        args.raw_requests
    }
}

/// The raw JetStream floor's calls: none where its client has no NATS user.
fn raw_calls(args: &BenchArgs) -> usize {
    if args.nats_accounts {
        0
    } else {
        args.raw_calls
    }
}

/// Warms the fleet up, runs the load phase, the sequential jobs and the
/// floors, and reports them.
pub(super) async fn measure(
    args: &BenchArgs,
    api: &Api,
    nats: NatsAt<'_>,
    sources: &Sources,
    tenants: Option<&Tenants>,
) -> anyhow::Result<Report> {
    let tool = Workload::of(args);
    let load_script = script(tool, args.rounds, args.calls);
    let work = Work {
        script: &load_script,
        tool,
        tenants,
    };
    let idle = sources.read().await;
    warm_up(args, api, work, sources).await?;
    let phase = load_phase(args, api, work, sources, &idle).await?;
    let latencies = sequential_jobs(args, api, work).await?;
    let raw_nats = nats_floor(args, nats).await?;
    let tool_calls = args.jobs * args.calls * args.rounds;
    let tool_calls_per_sec = tool_calls as f64 / phase.seconds;
    let (raw_jetstream, raw_one_call) = if raw_calls(args) == 0 {
        (None, None)
    } else {
        (
            jetstream_floor(args, nats, sources, tool_calls_per_sec).await,
            one_call_floor(args, nats).await,
        )
    };
    Ok(Report {
        tool: tool.name(),
        tls: nats.ca_file.is_some(),
        stored_jobs: args.stored_jobs.unwrap_or(0),
        tenants: tenants.map_or(0, Tenants::count),
        awaiting_approval: args.awaiting_approval.unwrap_or(0),
        // Filled in by the caller, which served them.
        idle_tools: 0,
        nats_cluster: args.nats_cluster,
        redis_cluster: args.redis_cluster,
        wait_replicas: args.wait_replicas.unwrap_or(0),
        threads: args.processes.then_some(args.threads),
        jobs: args.jobs,
        concurrency: args.concurrency,
        calls_per_round: args.calls,
        rounds: args.rounds,
        jobs_per_sec: args.jobs as f64 / phase.seconds,
        tool_calls_per_sec,
        tool_call_round_trip: Percentiles::of(phase.round_trips),
        sequential_jobs: args.sequential,
        sequential_job_latency: Percentiles::of(latencies),
        cpu_ms_per_job: phase.cpu_ms_per_job,
        load_seconds: phase.seconds,
        accounting: phase.accounting,
        raw_nats_requests_per_sec: raw_nats.as_ref().map(|(rate, _)| *rate),
        tool_calls_vs_raw_nats: raw_nats.as_ref().map(|(rate, _)| tool_calls_per_sec / rate),
        raw_nats_round_trip: raw_nats.map(|(_, latencies)| Percentiles::of(latencies)),
        nats_accounts: args.nats_accounts,
        raw_jetstream,
        raw_one_call,
        // Filled in by the caller, which owns the collector and the servers.
        trace_ratio: None,
        spans_received: None,
        fsync_always: false,
    })
}

/// The warm-up: a few jobs of `work`, unmeasured; then, with
/// `--stored-jobs`, Redis filled with finished jobs, and with
/// `--awaiting-approval`, jobs parked.
async fn warm_up(
    args: &BenchArgs,
    api: &Api,
    work: Work<'_>,
    sources: &Sources,
) -> anyhow::Result<()> {
    eprintln!("warming up...");
    load(api, work, 50.min(args.jobs), args.concurrency, false).await?;
    if let Some(count) = args.stored_jobs {
        let [url] = sources.redis_urls.as_slice() else {
            anyhow::bail!("--stored-jobs needs the fleet's one Redis server");
        };
        let keys = RedisKeys::new(RedisOptions::default().key_prefix);
        stored::fill(url, &keys, count, None).await?;
    }
    if let Some(jobs) = args.awaiting_approval.filter(|jobs| *jobs > 0) {
        parked::park(api, jobs, args.concurrency).await?;
        if let [url] = sources.redis_urls.as_slice() {
            stored::settle(url).await?;
        }
    }
    Ok(())
}

/// The latency of `--sequential` one-call jobs of `work`'s tool (of its
/// first tenant, with `--tenants`), run one after the other.
async fn sequential_jobs(
    args: &BenchArgs,
    api: &Api,
    work: Work<'_>,
) -> anyhow::Result<Vec<Duration>> {
    eprintln!("latency: {} sequential one-call jobs...", args.sequential);
    let one_call = script(work.tool, 1, 1);
    let mut latencies = Vec::with_capacity(args.sequential);
    for _ in 0..args.sequential {
        let started = Instant::now();
        let job = Job {
            script: &one_call,
            tool: work.tool,
            token: work.tenants.map(|tenants| tenants.token(0)),
        };
        run_job(api.clone(), job, false).await?;
        latencies.push(started.elapsed());
    }
    Ok(latencies)
}

/// The raw NATS request/reply floor: its rate and its round trips; none
/// when skipped.
async fn nats_floor(
    args: &BenchArgs,
    nats: NatsAt<'_>,
) -> anyhow::Result<Option<(f64, Vec<Duration>)>> {
    if raw_requests(args) == 0 {
        return Ok(None);
    }
    eprintln!(
        "floor: {} raw NATS requests, {} in flight...",
        args.raw_requests, args.concurrency
    );
    Ok(Some(
        floor::request_reply(nats, args.raw_requests, args.concurrency).await?,
    ))
}

/// What the load phase measured.
struct LoadPhase {
    seconds: f64,
    /// Each tool call's round trip, as the runner reported it.
    round_trips: Vec<Duration>,
    accounting: Accounting,
    /// The bench's own CPU per job, when the fleet runs in it.
    cpu_ms_per_job: Option<f64>,
}

/// The load phase: `args.jobs` jobs of `work`, `args.concurrency` at a
/// time, accounted against `idle`.
async fn load_phase(
    args: &BenchArgs,
    api: &Api,
    work: Work<'_>,
    sources: &Sources,
    idle: &Reading,
) -> anyhow::Result<LoadPhase> {
    eprintln!(
        "load: {} jobs, {} in flight, {} rounds of {} parallel {} calls...",
        args.jobs,
        args.concurrency,
        args.rounds,
        args.calls,
        work.tool.name()
    );
    let before = sources.read().await;
    let cpu_before = accounting::cpu_of(std::process::id());
    let started = Instant::now();
    let round_trips = load(api, work, args.jobs, args.concurrency, true).await?;
    let load_time = started.elapsed();
    let after = sources.read().await;
    let readings = Readings {
        idle,
        before: &before,
        after: &after,
    };
    let accounting = Accounting::of(readings, args.jobs, load_time);
    let cpu_ms_per_job = match (cpu_before, accounting::cpu_of(std::process::id())) {
        // The bench's own CPU covers the fleet only when the fleet runs in it.
        (Some(before), Some(after)) if args.target.is_none() && !args.processes => {
            Some((after - before).as_secs_f64() * 1000.0 / args.jobs as f64)
        }
        _ => None,
    };
    Ok(LoadPhase {
        seconds: load_time.as_secs_f64(),
        round_trips,
        accounting,
        cpu_ms_per_job,
    })
}
