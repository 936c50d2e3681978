//! One run of the bench: the fleet it measures (in this process, as
//! processes, or `--target`), the load, the sequential jobs and the floors,
//! and the report. See docs/benchmarks.md for how to read the numbers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::StreamExt;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use toolfleet_proto::{JobEvent, v1};

use toolfleet_proto::names::RedisKeys;
use toolfleet_service::config::{RedisOptions, TelemetryOptions};
use toolfleet_service::traces;

use accounting::{Accounting, Probe, Reading, Readings, Sources};
use floor::{FloorShape, NatsAt};
use processes::{FleetShape, ProcessFleet};
use toolfleet_cli::output::outln;
use toolfleet_fleet::local::{LocalFleet, LocalFleetOptions};
use toolfleet_fleet::supervisor::otlp::Collector;
use toolfleet_fleet::{FleetBuilder, Serving};

mod accounting;
mod first_token;
mod floor;
mod mcp;
mod parked;
mod processes;
mod stored;

type Api = v1::agent_service_client::AgentServiceClient<tonic::transport::Channel>;

/// Measure end-to-end throughput and latency through a local fleet (or
/// --target), with raw NATS request/reply as the floor, in one run.
///
/// J jobs (-J) with C in flight (-C), each R rounds (-R) of K parallel
/// `echo` calls (-K) through the scripted model; then sequential one-call
/// jobs for latency; then raw NATS request/reply through the same server.
/// Build with --release for meaningful numbers. docs/benchmarks.md explains
/// the output.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "toolfleet bench", bin_name = "toolfleet bench", version)]
pub(crate) struct BenchArgs {
    /// Jobs in the load phase.
    #[arg(short = 'J', long, default_value_t = 2000)]
    jobs: usize,
    /// Jobs in flight at once.
    #[arg(short = 'C', long, default_value_t = 64)]
    concurrency: usize,
    /// Parallel calls per round.
    #[arg(short = 'K', long, default_value_t = 3)]
    calls: usize,
    /// Make every call a `sleep` of this many milliseconds (an I/O-bound
    /// tool) instead of a no-op `echo`.
    #[arg(long, value_name = "MS", conflicts_with = "calculate")]
    sleep_ms: Option<u64>,
    /// Make every call `calculate` of "1+1", a built-in tool of the shipped
    /// pool `general`, instead of `echo`: the tool `--nats-accounts` runs,
    /// so a run with this flag alone is what to compare it with.
    #[arg(long)]
    calculate: bool,
    /// Tool rounds per job.
    #[arg(short = 'R', long, default_value_t = 2)]
    rounds: usize,
    /// One-round one-call jobs run one after the other, for latency.
    #[arg(long, default_value_t = 300)]
    sequential: usize,
    /// Requests of the raw NATS request/reply floor. 0 skips it.
    #[arg(long, default_value_t = 20_000)]
    raw_requests: usize,
    /// Calls of the raw JetStream floor: each published to a work-queue
    /// stream and acked, pulled, replied to and acked, as a tool call is,
    /// with nothing else (no Redis, no model loop). 0 skips it.
    #[arg(long, default_value_t = 12_000)]
    raw_calls: usize,
    /// Run the fleet as a deployment does: nats-server, redis-server, and the
    /// orchestrator and each worker as processes of their own, every worker
    /// serving the whole default tool set. Without it, the orchestrator and
    /// the workers share the bench's process (like `toolfleet dev`).
    #[arg(long, conflicts_with = "target")]
    processes: bool,
    /// Workers to start.
    #[arg(long, value_name = "N", default_value_t = 2)]
    workers: usize,
    /// Execution slots of each worker (`runtime.max_in_flight`). Default:
    /// the worker's own default.
    #[arg(long, value_name = "N")]
    max_in_flight: Option<usize>,
    /// Threads of the orchestrator, of each worker and of the bench's own
    /// client (`threads`; 0: one per CPU), and of nats-server's Go runtime
    /// (`GOMAXPROCS`; 0: Go's default). 1, the default, is the cheapest
    /// shape for six busy processes on a few cores.
    #[arg(long, value_name = "N", default_value_t = 1, requires = "processes")]
    threads: usize,
    /// Jobs the orchestrator runs at once (`runner.max_jobs`). Default: the
    /// orchestrator's own default (64).
    #[arg(long, value_name = "N", conflicts_with = "target")]
    max_jobs: Option<std::num::NonZeroUsize>,
    /// Fill Redis with this many finished jobs after the warm-up (copies of
    /// a warm-up job's keys, indexed for its tenant), to show that a job's
    /// cost does not depend on what else is stored.
    #[arg(long, value_name = "N", conflicts_with_all = ["target", "tls"])]
    stored_jobs: Option<usize>,
    /// NATS and Redis speak TLS only (with certificates made for the run),
    /// and the orchestrator, the workers and the raw floor's clients connect
    /// over it: compare with a run without to see what TLS costs.
    #[arg(long, conflicts_with_all = ["target", "processes"])]
    tls: bool,
    /// JetStream and Redis fsync every write before acknowledging it
    /// (`sync_interval: always`, `appendfsync always`), as systems that fsync
    /// every step do. Without it, JetStream syncs every two minutes and the
    /// bench's Redis keeps nothing on disk.
    #[arg(long, conflicts_with = "target")]
    fsync_always: bool,
    /// With `--processes`: NATS is a cluster of 3 servers on loopback, each
    /// stream kept on all three (`nats.replicas = 3`).
    #[arg(long, requires = "processes", conflicts_with = "fsync_always")]
    nats_cluster: bool,
    /// With `--processes`: Redis is a Redis Cluster of 3 primaries with a
    /// replica each (`redis.cluster`).
    #[arg(long, requires = "processes", conflicts_with = "stored_jobs")]
    redis_cluster: bool,
    /// With `--processes`: every write waits for this many replicas
    /// (`redis.wait_replicas`; needs `--redis-cluster`, whose primaries have
    /// one).
    #[arg(long, value_name = "N", requires = "redis_cluster")]
    wait_replicas: Option<u32>,
    /// With `--processes`: NATS runs toolfleet's shipped accounts and users
    /// (deploy/nats/toolfleet-users.conf, decision 0029), the setup step
    /// creates the streams as `setup`, the orchestrator connects as
    /// `orchestrator`, and the workers as the pool `general`, in its own
    /// account, serving its tools; the load calls `calculate`. Compare with
    /// `--processes --calculate` to see what the accounts cost. The raw
    /// floors are skipped: their clients have no user there.
    #[arg(long, requires = "processes", conflicts_with_all = ["nats_cluster", "fsync_always", "sleep_ms"])]
    nats_accounts: bool,
    /// Trace the fleet with this sampling ratio (0.0 to 1.0), exporting over
    /// OTLP to a collector the bench starts, which counts the spans and
    /// drops them: compare with a run without to see what tracing costs.
    #[arg(long, value_name = "RATIO", value_parser = sample_ratio, conflicts_with = "target")]
    trace_ratio: Option<f64>,
    /// With `--processes`: instead of the load, measure what N jobs
    /// waiting for approval cost the orchestrator: after N jobs ran to
    /// their end, its CPU and memory over 30 s idle, then over 30 s with N
    /// jobs parked (docs/performance.md).
    #[arg(long, value_name = "N", requires = "processes")]
    parked: Option<usize>,
    /// Instead of the load, time N calls of an MCP server's tool made by
    /// one MCP client directly and N through the fleet (`mcp-serve`, a call
    /// job, a worker, the same server), interleaved, one at a time: what
    /// the fleet adds to an MCP call, at p50 and p99. The server, the
    /// fleet, the gateway and the client run in this process.
    #[arg(long, value_name = "N", conflicts_with_all = ["target", "processes", "tls"])]
    mcp: Option<usize>,
    /// Instead of the load, time N streamed jobs one after the other: from
    /// a local streaming model server handing over an answer's first bytes
    /// to the client receiving its first `model_output_delta`. The server,
    /// the fleet and the client run in this process.
    #[arg(long, value_name = "N", conflicts_with_all = ["target", "processes", "tls", "mcp"])]
    first_token: Option<usize>,
    /// Bench an existing fleet (with test tools enabled) instead of starting one.
    #[arg(long, requires = "nats_url")]
    target: Option<String>,
    /// That fleet's NATS URL, for the raw request/reply floor.
    #[arg(long)]
    nats_url: Option<String>,
    /// Print the results as JSON on stdout instead of the report (progress
    /// stays on stderr), as every `--json` of toolfleet does.
    #[arg(long)]
    json: bool,
    /// Also write the results as JSON to this file, beside the report.
    #[arg(long, value_name = "PATH")]
    json_file: Option<std::path::PathBuf>,
}

#[derive(Debug, Default, Serialize)]
struct Percentiles {
    p50_ms: f64,
    p90_ms: f64,
    p99_ms: f64,
}

impl Percentiles {
    fn of(mut samples: Vec<Duration>) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        samples.sort();
        let at = |q: f64| {
            let index = ((samples.len() - 1) as f64 * q).round() as usize;
            samples[index].as_secs_f64() * 1000.0
        };
        Self {
            p50_ms: at(0.5),
            p90_ms: at(0.9),
            p99_ms: at(0.99),
        }
    }
}

/// A `--trace-ratio`: a number from 0.0 to 1.0.
fn sample_ratio(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(ratio) if (0.0..=1.0).contains(&ratio) => Ok(ratio),
        _ => Err(format!("{text:?} is not a ratio from 0.0 to 1.0")),
    }
}

#[derive(Debug, Default, Serialize)]
struct Report {
    /// `echo`, or `sleep <ms>ms`.
    tool: String,
    /// NATS and Redis over TLS (`--tls`).
    tls: bool,
    /// JetStream and Redis fsync every write (`--fsync-always`), as the
    /// servers themselves report it when they can be asked.
    fsync_always: bool,
    /// The sampling ratio of the fleet's traces (`--trace-ratio`); none when
    /// tracing was off.
    trace_ratio: Option<f64>,
    /// Spans the bench's collector received over the whole run (warm-up
    /// included), when tracing was on.
    spans_received: Option<u64>,
    /// Finished jobs Redis held before the load (`--stored-jobs`), besides
    /// the warm-up's.
    stored_jobs: usize,
    /// The `threads` of the orchestrator and the workers, and nats-server's
    /// `GOMAXPROCS` (`--threads`), when they ran as processes of their own.
    threads: Option<usize>,
    /// NATS ran as a cluster of 3, every stream on all three
    /// (`--nats-cluster`).
    nats_cluster: bool,
    /// Redis ran as a Redis Cluster of 3 primaries with a replica each
    /// (`--redis-cluster`).
    redis_cluster: bool,
    /// Replicas every write waited for (`--wait-replicas`; 0: none).
    wait_replicas: u32,
    jobs: usize,
    concurrency: usize,
    calls_per_round: usize,
    rounds: usize,
    jobs_per_sec: f64,
    tool_calls_per_sec: f64,
    tool_call_round_trip: Percentiles,
    sequential_jobs: usize,
    sequential_job_latency: Percentiles,
    cpu_ms_per_job: Option<f64>,
    /// Wall time of the load phase.
    load_seconds: f64,
    /// What the load phase cost, by process, in Redis commands and in NATS
    /// messages, per job.
    accounting: Accounting,
    /// The raw NATS floor (`--raw-requests`); none when skipped.
    raw_nats_requests_per_sec: Option<f64>,
    raw_nats_round_trip: Option<Percentiles>,
    tool_calls_vs_raw_nats: Option<f64>,
    /// NATS ran the shipped accounts and users (`--nats-accounts`).
    nats_accounts: bool,
    /// The raw JetStream floor (`--raw-calls`); none when skipped, or when
    /// it could not run (the reason is printed).
    raw_jetstream: Option<JetStreamFloor>,
}

/// What the raw JetStream floor did, and what it cost per call.
#[derive(Debug, Serialize)]
struct JetStreamFloor {
    calls: usize,
    concurrency: usize,
    calls_per_sec: f64,
    round_trip: Percentiles,
    /// CPU milliseconds per call, by process: the servers' and the bench
    /// client's (publisher and responders); the fleet's processes idle.
    cpu_ms_per_call_by_process: std::collections::BTreeMap<String, f64>,
    cpu_ms_per_call_total: f64,
    nats_messages_in_per_call: Option<f64>,
    nats_messages_out_per_call: Option<f64>,
    /// The load's tool calls/s over this floor's calls/s.
    tool_calls_vs_raw_jetstream: f64,
}

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

impl BenchArgs {
    /// Threads of the bench's own runtime, which drives the load, the watches
    /// and the floors: with `--processes`, `--threads`, like every process of
    /// the fleet (decision 0026); without, one per CPU, since the fleet runs
    /// on it too.
    pub(crate) fn client_threads(&self) -> usize {
        if self.processes { self.threads } else { 0 }
    }
}

/// Runs the benchmark and prints (and optionally writes) the report.
pub(crate) async fn run(args: BenchArgs) -> anyhow::Result<()> {
    if let Some(calls) = args.mcp {
        return mcp::run(&args, calls).await;
    }
    if let Some(jobs) = args.first_token {
        return first_token::run(&args, jobs).await;
    }
    let workers = args.workers.max(1);
    let collector = span_collector(&args).await?;
    let telemetry = TelemetryOptions {
        otlp_endpoint: collector.as_ref().map(|c| c.endpoint.clone()),
        otlp_protocol: None,
        sample_ratio: args.trace_ratio,
    };
    let processes = match args.processes {
        true => Some(start_processes(&args, workers, &telemetry).await?),
        false => None,
    };
    // The fleet in this process exports through this process's tracer.
    let exporting = match (&processes, &args.target) {
        (None, None) => traces::install(&telemetry, "toolfleet-bench")?,
        _ => None,
    };
    let fleet = match (&args.target, &processes) {
        (None, None) => Some(start_local(&args, workers).await?),
        _ => None,
    };
    let (address, nats_url) = match (&fleet, &processes, &args.target, &args.nats_url) {
        (Some(fleet), _, _, _) => (fleet.grpc_addr(), fleet.nats_url()),
        (None, Some(processes), _, _) => (processes.address.clone(), processes.nats_url.clone()),
        (None, None, Some(target), Some(nats)) => (target.clone(), nats.clone()),
        _ => anyhow::bail!("--target needs --nats-url"),
    };
    let api = Api::connect(address.clone())
        .await
        .with_context(|| format!("cannot reach the orchestrator at {address}"))?;
    let ca_file = fleet.as_ref().and_then(LocalFleet::ca_file);
    let sources = sources(&args, fleet.as_ref(), processes.as_ref());
    let nats = NatsAt {
        url: &nats_url,
        ca_file: ca_file.as_deref(),
    };
    if let Some(jobs) = args.parked {
        let measured = measure_parked(&api, &sources, jobs, args.concurrency).await;
        drop(processes);
        let report = measured?;
        if args.json {
            outln!("{}", serde_json::to_string_pretty(&report)?)?;
        } else {
            outln!("{}", parked::print(&report))?;
        }
        return Ok(());
    }
    let result = measure(&args, &api, nats, &sources).await;
    // What the servers say, where they can be asked.
    let fsync_always = sources
        .fsync_every_write()
        .await
        .unwrap_or(args.fsync_always);
    if let Some(fleet) = fleet {
        fleet.shutdown().await;
    }
    // Stopped processes have sent what they buffered; this one sends its own.
    drop(processes);
    if let Some(exporting) = exporting {
        exporting.shutdown().await;
    }
    let mut report = result?;
    report.trace_ratio = args.trace_ratio;
    report.fsync_always = fsync_always;
    report.spans_received = collector.as_ref().map(Collector::received);
    publish(&args, &report)
}

/// The report on stdout (as JSON with `--json`), and in `--json-file`.
fn publish(args: &BenchArgs, report: &Report) -> anyhow::Result<()> {
    if args.json {
        outln!("{}", serde_json::to_string_pretty(report)?)?;
    } else {
        print(report)?;
    }
    if let Some(path) = &args.json_file {
        std::fs::write(path, serde_json::to_vec_pretty(report)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// `--parked`: the orchestrator idle, then with `jobs` jobs parked.
async fn measure_parked(
    api: &Api,
    sources: &Sources,
    jobs: usize,
    concurrency: usize,
) -> anyhow::Result<parked::ParkedReport> {
    let orchestrator = sources
        .processes
        .iter()
        .find(|p| p.name == "orchestrator")
        .context("no orchestrator process to measure")?;
    let [redis_url] = sources.redis_urls.as_slice() else {
        anyhow::bail!("--parked needs the fleet's one Redis server");
    };
    parked::measure(api, orchestrator, redis_url, jobs, concurrency).await
}

/// With `--trace-ratio`, a collector that counts the spans the fleet sends.
async fn span_collector(args: &BenchArgs) -> anyhow::Result<Option<Collector>> {
    let Some(ratio) = args.trace_ratio else {
        return Ok(None);
    };
    let collector = Collector::counting().await?;
    eprintln!(
        "tracing with sampling ratio {ratio}, to a collector at {} that counts spans...",
        collector.endpoint
    );
    Ok(Some(collector))
}

/// The fleet as processes (`--processes`).
async fn start_processes(
    args: &BenchArgs,
    workers: usize,
    telemetry: &TelemetryOptions,
) -> anyhow::Result<ProcessFleet> {
    let nats = if args.nats_cluster {
        "a NATS cluster of 3"
    } else {
        "nats-server"
    };
    let redis = if args.redis_cluster {
        "a Redis Cluster of 3 primaries and 3 replicas"
    } else {
        "redis-server"
    };
    eprintln!(
        "starting a fleet of processes ({nats}, {redis}, 1 orchestrator, {workers} workers \
         serving every tool; threads = {}, nats-server's too)...",
        args.threads
    );
    let tool = Workload::of(args).tool();
    let shape = FleetShape {
        workers,
        max_in_flight: args.max_in_flight,
        max_jobs: args.max_jobs,
        threads: args.threads,
        fsync_always: args.fsync_always,
        nats_cluster: args.nats_cluster,
        redis_cluster: args.redis_cluster,
        wait_replicas: args.wait_replicas,
        nats_accounts: args.nats_accounts,
    };
    ProcessFleet::start(&shape, tool, telemetry).await
}

/// The fleet in this process, with its servers as processes.
async fn start_local(args: &BenchArgs, workers: usize) -> anyhow::Result<LocalFleet> {
    eprintln!(
        "starting a local fleet (nats-server, redis-server, 1 orchestrator, {workers} \
         workers, in this process)..."
    );
    let builder = FleetBuilder::new()
        .workers(workers)
        .serving(Serving::TestTools)
        .tls(args.tls)
        .fsync_always(args.fsync_always);
    let mut options = LocalFleetOptions::default();
    if let Some(slots) = args.max_in_flight.and_then(std::num::NonZeroUsize::new) {
        options.worker.runtime.max_in_flight = slots;
    }
    if let Some(jobs) = args.max_jobs {
        options.orchestrator.runner.max_jobs = jobs;
    }
    builder.start_in_process(options).await
}

/// The processes the bench accounts, and where their servers report.
fn sources(
    args: &BenchArgs,
    fleet: Option<&LocalFleet>,
    processes: Option<&ProcessFleet>,
) -> Sources {
    match (fleet, processes) {
        (Some(fleet), _) => Sources {
            processes: vec![
                Probe::this("bench (orchestrator, workers, client)"),
                Probe::new("nats-server", fleet.nats().process().pid()),
                Probe::new("redis-server", fleet.redis().process().pid()),
            ],
            // Over TLS the bench would need the fleet's client settings.
            redis_urls: (!args.tls).then(|| fleet.redis_url()).into_iter().collect(),
            nats_monitoring: vec![fleet.nats().monitoring_url()],
        },
        (None, Some(processes)) => {
            let mut sources = processes.sources();
            sources.processes.push(Probe::this("bench client"));
            sources
        }
        (None, None) => Sources {
            processes: vec![Probe::this("bench client")],
            ..Sources::default()
        },
    }
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
async fn measure(
    args: &BenchArgs,
    api: &Api,
    nats: NatsAt<'_>,
    sources: &Sources,
) -> anyhow::Result<Report> {
    let tool = Workload::of(args);
    let load_script = script(tool, args.rounds, args.calls);
    let work = Work {
        script: &load_script,
        tool,
    };
    let idle = sources.read().await;
    eprintln!("warming up...");
    load(api, work, 50.min(args.jobs), args.concurrency, false).await?;
    if let Some(count) = args.stored_jobs {
        let [url] = sources.redis_urls.as_slice() else {
            anyhow::bail!("--stored-jobs needs the fleet's one Redis server");
        };
        let keys = RedisKeys::new(RedisOptions::default().key_prefix);
        stored::fill(url, &keys, count).await?;
    }
    let phase = load_phase(args, api, work, sources, &idle).await?;
    eprintln!("latency: {} sequential one-call jobs...", args.sequential);
    let one_call = script(tool, 1, 1);
    let mut latencies = Vec::with_capacity(args.sequential);
    for _ in 0..args.sequential {
        let started = Instant::now();
        run_job(api.clone(), &one_call, tool, false).await?;
        latencies.push(started.elapsed());
    }
    let raw_nats = if raw_requests(args) == 0 {
        None
    } else {
        eprintln!(
            "floor: {} raw NATS requests, {} in flight...",
            args.raw_requests, args.concurrency
        );
        Some(floor::request_reply(nats, args.raw_requests, args.concurrency).await?)
    };
    let tool_calls = args.jobs * args.calls * args.rounds;
    let tool_calls_per_sec = tool_calls as f64 / phase.seconds;
    let raw_jetstream = if raw_calls(args) == 0 {
        None
    } else {
        jetstream_floor(args, nats, sources, tool_calls_per_sec).await
    };
    Ok(Report {
        tool: tool.name(),
        tls: nats.ca_file.is_some(),
        stored_jobs: args.stored_jobs.unwrap_or(0),
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
        // Filled in by the caller, which owns the collector and the servers.
        trace_ratio: None,
        spans_received: None,
        fsync_always: false,
    })
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

/// What every job of a phase runs: the scripted model's script, and the
/// tool its calls call.
#[derive(Clone, Copy)]
struct Work<'a> {
    script: &'a str,
    tool: Workload,
}

/// The tool every call of the bench runs.
#[derive(Debug, Clone, Copy)]
enum Workload {
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
    fn of(args: &BenchArgs) -> Self {
        match args.sleep_ms {
            Some(ms) => Self::Sleep { ms },
            None if args.calculate || args.nats_accounts => Self::Calculate,
            None => Self::Echo,
        }
    }

    fn name(self) -> String {
        match self {
            Self::Echo => "echo".to_owned(),
            Self::Calculate => "calculate".to_owned(),
            Self::Sleep { ms } => format!("sleep {ms}ms"),
        }
    }

    fn tool(self) -> &'static str {
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

/// `rounds` turns of `calls` parallel calls of `tool`, then a final message.
fn script(tool: Workload, rounds: usize, calls: usize) -> String {
    let mut turns: Vec<Value> = (0..rounds)
        .map(|round| {
            let calls: Vec<Value> = (0..calls).map(|i| tool.call(round, i)).collect();
            json!({"tool_calls": calls})
        })
        .collect();
    turns.push(json!({"message": "done"}));
    Value::Array(turns).to_string()
}

/// Runs `jobs` jobs, `concurrency` at a time; returns the tool call round
/// trips the runner reported (when `collect`).
async fn load(
    api: &Api,
    Work { script, tool }: Work<'_>,
    jobs: usize,
    concurrency: usize,
    collect: bool,
) -> anyhow::Result<Vec<Duration>> {
    let window = Arc::new(Semaphore::new(concurrency.max(1)));
    let mut tasks = Vec::with_capacity(jobs);
    let mut done = 0usize;
    let progress_every = (jobs / 10).max(1);
    for _ in 0..jobs {
        let permit = window.clone().acquire_owned().await?;
        let api = api.clone();
        let script = script.to_owned();
        tasks.push(tokio::spawn(async move {
            let result = run_job(api, &script, tool, collect).await;
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

/// Submits one scripted job and follows its events to the end.
async fn run_job(
    mut api: Api,
    script: &str,
    tool: Workload,
    collect: bool,
) -> anyhow::Result<Vec<Duration>> {
    let request = v1::SubmitJobRequest {
        input: "bench".into(),
        model: Some(v1::ModelSpec {
            provider: "scripted".into(),
            script: script.to_owned(),
            ..Default::default()
        }),
        tools: vec![tool.tool().into()],
        ..Default::default()
    };
    let job_id = api.submit_job(request).await?.into_inner().job_id;
    let mut events = api
        .watch_job(v1::WatchJobRequest {
            job_id: job_id.clone(),
            from_offset: 0,
        })
        .await?
        .into_inner();
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

/// Percentiles as the report prints them.
fn percentiles(x: &Percentiles) -> String {
    format!(
        "p50 {:.2} ms  p90 {:.2} ms  p99 {:.2} ms",
        x.p50_ms, x.p90_ms, x.p99_ms
    )
}

/// The report, as a table on stdout.
fn print(report: &Report) -> std::io::Result<()> {
    let p = percentiles;
    outln!()?;
    outln!(
        "jobs                 {} ({} in flight, {} rounds x {} parallel {} calls)",
        report.jobs,
        report.concurrency,
        report.rounds,
        report.calls_per_round,
        report.tool
    )?;
    print_setup(report)?;
    outln!("jobs/s               {:.0}", report.jobs_per_sec)?;
    outln!("tool calls/s         {:.0}", report.tool_calls_per_sec)?;
    outln!("tool call round trip {}", p(&report.tool_call_round_trip))?;
    outln!(
        "sequential job       {}  ({} one-call jobs)",
        p(&report.sequential_job_latency),
        report.sequential_jobs
    )?;
    match report.cpu_ms_per_job {
        Some(cpu) => outln!(
            "CPU per job          {cpu:.2} ms (orchestrator + workers + bench client; NATS and Redis not included)"
        )?,
        None => outln!("CPU per job          n/a (the fleet runs in other processes; see below)")?,
    }
    print_accounting(&report.accounting)?;
    match (
        report.raw_nats_requests_per_sec,
        &report.raw_nats_round_trip,
        report.tool_calls_vs_raw_nats,
    ) {
        (Some(rate), Some(round_trip), Some(ratio)) => {
            outln!("raw NATS req/reply   {rate:.0} req/s  {}", p(round_trip))?;
            outln!("tool calls vs raw    {:.1}%", ratio * 100.0)?;
        }
        _ if report.nats_accounts => {
            outln!("raw NATS floors      skipped (--nats-accounts: no user of theirs)")?;
        }
        _ => outln!("raw NATS req/reply   skipped")?,
    }
    if let Some(floor) = &report.raw_jetstream {
        print_jetstream_floor(floor)?;
    }
    Ok(())
}

/// How the run was set up, where it differs from the default: transport,
/// stored jobs, durability, servers, replication, tracing.
fn print_setup(report: &Report) -> std::io::Result<()> {
    if report.tls {
        outln!("transport            NATS and Redis over TLS")?;
    }
    if report.stored_jobs > 0 {
        outln!(
            "stored               {} finished jobs in Redis before the load",
            report.stored_jobs
        )?;
    }
    if report.fsync_always {
        outln!("durability           JetStream and Redis fsync every write")?;
    }
    if report.nats_cluster || report.redis_cluster {
        let nats = if report.nats_cluster {
            "NATS cluster of 3 (3 copies of each stream)"
        } else {
            "one NATS server"
        };
        let redis = if report.redis_cluster {
            "Redis Cluster of 3 primaries, 1 replica each"
        } else {
            "one Redis server"
        };
        outln!("servers              {nats}, {redis}")?;
    }
    if report.wait_replicas > 0 {
        outln!(
            "replication          every write waits for {} replica(s)",
            report.wait_replicas
        )?;
    }
    if let (Some(ratio), Some(spans)) = (report.trace_ratio, report.spans_received) {
        outln!("tracing              sampling ratio {ratio}, {spans} spans received")?;
    }
    Ok(())
}

/// The raw JetStream floor: its rate, its cost per call, and the load's
/// share of it.
fn print_jetstream_floor(floor: &JetStreamFloor) -> std::io::Result<()> {
    outln!(
        "raw JetStream calls  {:.0} calls/s  {}  ({} in flight)",
        floor.calls_per_sec,
        percentiles(&floor.round_trip),
        floor.concurrency
    )?;
    let busy: Vec<String> = floor
        .cpu_ms_per_call_by_process
        .iter()
        .filter(|(_, ms)| **ms >= 0.0005)
        .map(|(name, ms)| format!("{name} {ms:.3}"))
        .collect();
    outln!(
        "  CPU per call       {:.3} ms ({})",
        floor.cpu_ms_per_call_total,
        busy.join(", ")
    )?;
    if let (Some(sent), Some(received)) = (
        floor.nats_messages_in_per_call,
        floor.nats_messages_out_per_call,
    ) {
        outln!("  NATS messages      {sent:.1} in, {received:.1} out")?;
    }
    outln!(
        "tool calls vs raw JS {:.1}%",
        floor.tool_calls_vs_raw_jetstream * 100.0
    )
}

/// The load phase's cost: a row per process, then Redis and NATS.
fn print_accounting(accounting: &Accounting) -> std::io::Result<()> {
    if accounting.cpu_ms_per_job_by_process.is_empty() {
        return Ok(());
    }
    outln!("load phase, per job:")?;
    outln!(
        "  {:<40} {:>10} {:>10} {:>10} {:>10}",
        "process",
        "CPU ms",
        "RSS idle",
        "RSS load",
        "RSS peak"
    )?;
    let mb = |value: Option<&f64>| value.map_or("-".to_owned(), |mb| format!("{mb:.1} MB"));
    for (name, cpu) in &accounting.cpu_ms_per_job_by_process {
        outln!(
            "  {name:<40} {cpu:>10.3} {:>10} {:>10} {:>10}",
            mb(accounting.idle_rss_mb_by_process.get(name)),
            mb(accounting.rss_mb_by_process.get(name)),
            mb(accounting.peak_rss_mb_by_process.get(name)),
        )?;
    }
    outln!(
        "  {:<40} {:>10.3}   ({:.2} cores busy)",
        "all",
        accounting.cpu_ms_per_job_total,
        accounting.cores_busy
    )?;
    if let Some(commands) = accounting.redis_commands_per_job {
        let mut by_name: Vec<_> = accounting.redis_commands_per_job_by_name.iter().collect();
        by_name.sort_by(|a, b| b.1.total_cmp(a.1));
        let top: Vec<String> = by_name
            .iter()
            .take(6)
            .map(|(name, n)| format!("{name} {n:.1}"))
            .collect();
        outln!("  Redis commands       {commands:.1} ({})", top.join(", "))?;
    }
    if let (Some(msgs_in), Some(msgs_out), Some(bytes_in), Some(bytes_out)) = (
        accounting.nats_messages_in_per_job,
        accounting.nats_messages_out_per_job,
        accounting.nats_bytes_in_per_job,
        accounting.nats_bytes_out_per_job,
    ) {
        outln!(
            "  NATS messages        {msgs_in:.1} in, {msgs_out:.1} out ({bytes_in:.0} B in, {bytes_out:.0} B out)"
        )?;
    }
    Ok(())
}
