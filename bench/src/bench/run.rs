//! One run of the bench, start to end: the fleet it measures (in this
//! process, as processes, or `--target`), the measuring, then the fleet
//! stopped and the report published.

use anyhow::Context as _;
use toolfleet_service::config::TelemetryOptions;
use toolfleet_service::traces::{self, Exporting};

use super::accounting::{Probe, Sources};
use super::args::BenchArgs;
use super::floor::NatsAt;
use super::idle_tools::IdleTools;
use super::load::Workload;
use super::measure::measure;
use super::processes::{Extras, FleetShape, ProcessFleet};
use super::report::{Report, publish};
use super::tenants::Tenants;
use super::{Api, first_token, jobs_page, mcp, parked};
use toolfleet_cli::output::outln;
use toolfleet_fleet::local::{LocalFleet, LocalFleetOptions};
use toolfleet_fleet::supervisor::otlp::Collector;
use toolfleet_fleet::{FleetBuilder, Serving};

/// Runs the benchmark and prints (and optionally writes) the report.
pub(crate) async fn run(args: BenchArgs) -> anyhow::Result<()> {
    if let Some(calls) = args.mcp {
        return mcp::run(&args, calls).await;
    }
    if let Some(jobs) = args.first_token {
        return first_token::run(&args, jobs).await;
    }
    match on_a_fleet(&args).await? {
        Measured::Load(report) => publish(&args, &report),
        Measured::Parked(report) => print_or_json(&args, &report, parked::print),
        Measured::JobsPage(report) => print_or_json(&args, &report, jobs_page::print),
    }
}

/// The load's report of one run on a fleet started for it (a `--sweep`
/// step).
pub(super) async fn measured_load(args: &BenchArgs) -> anyhow::Result<Report> {
    match on_a_fleet(args).await? {
        Measured::Load(report) => Ok(*report),
        Measured::Parked(_) | Measured::JobsPage(_) => {
            anyhow::bail!("a sweep runs the load, not --parked or --jobs-page")
        }
    }
}

/// What a run on a fleet measured, by what it ran.
enum Measured {
    Load(Box<Report>),
    Parked(parked::ParkedReport),
    JobsPage(jobs_page::JobsPageReport),
}

/// `report` as JSON with `--json`, else as `text` makes it.
fn print_or_json<T: serde::Serialize>(
    args: &BenchArgs,
    report: &T,
    text: impl FnOnce(&T) -> String,
) -> anyhow::Result<()> {
    if args.json {
        outln!("{}", serde_json::to_string_pretty(report)?)?;
    } else {
        outln!("{}", text(report))?;
    }
    Ok(())
}

/// Starts the fleet `args` asks for (or reaches `--target`), measures on
/// it what `args` asks for, and stops it.
async fn on_a_fleet(args: &BenchArgs) -> anyhow::Result<Measured> {
    let workers = args.workers.max(1);
    let collector = span_collector(args).await?;
    let telemetry = TelemetryOptions {
        otlp_endpoint: collector.as_ref().map(|c| c.endpoint.clone()),
        otlp_protocol: None,
        sample_ratio: args.trace_ratio,
        // What tracing costs without content, as it is deployed.
        capture_tool_content: false,
    };
    let tenants = args.tenants.map(|count| Tenants::new(count as usize));
    let idle_tools = match args.idle_tools.filter(|count| *count > 0) {
        Some(count) => Some(IdleTools::serve(count as usize).await?),
        None => None,
    };
    let extras = Extras {
        tenants: tenants.as_ref(),
        idle_tools: idle_tools.as_ref(),
    };
    let processes = match args.processes {
        true => Some(start_processes(args, workers, &telemetry, extras).await?),
        false => None,
    };
    // The fleet in this process exports through this process's tracer.
    let exporting = match (&processes, &args.target) {
        (None, None) => traces::install(&telemetry, "toolfleet-bench")?,
        _ => None,
    };
    let fleet = match (&args.target, &processes) {
        (None, None) => Some(start_local(args, workers).await?),
        _ => None,
    };
    let on = On {
        fleet: fleet.as_ref(),
        processes: processes.as_ref(),
        tenants: tenants.as_ref(),
    };
    let measured = measure_on(args, on).await;
    stop(fleet, processes, exporting).await;
    let mut measured = measured?;
    if let Measured::Load(report) = &mut measured {
        report.spans_received = collector.as_ref().map(Collector::received);
    }
    Ok(measured)
}

/// The fleet that is up: in this process, or as processes (neither with
/// `--target`), and its tenants with `--tenants`.
struct On<'a> {
    fleet: Option<&'a LocalFleet>,
    processes: Option<&'a ProcessFleet>,
    tenants: Option<&'a Tenants>,
}

/// What `args` asks to measure on the fleet that is up.
async fn measure_on(
    args: &BenchArgs,
    On {
        fleet,
        processes,
        tenants,
    }: On<'_>,
) -> anyhow::Result<Measured> {
    let (address, nats_url) = addresses(args, fleet, processes)?;
    let api = Api::connect(address.clone())
        .await
        .with_context(|| format!("cannot reach the orchestrator at {address}"))?;
    let ca_file = fleet.and_then(LocalFleet::ca_file);
    let sources = sources(args, fleet, processes);
    let nats = NatsAt {
        url: &nats_url,
        ca_file: ca_file.as_deref(),
    };
    if let Some(jobs) = args.parked {
        return Ok(Measured::Parked(
            measure_parked(&api, &sources, jobs, args.concurrency).await?,
        ));
    }
    if let Some(stored) = args.jobs_page {
        return Ok(Measured::JobsPage(
            measure_jobs_page(&api, &sources, stored).await?,
        ));
    }
    let mut report = measure(args, &api, nats, &sources, tenants).await?;
    // What the servers say, where they can be asked.
    report.fsync_always = sources
        .fsync_every_write()
        .await
        .unwrap_or(args.fsync_always);
    report.trace_ratio = args.trace_ratio;
    report.idle_tools = args.idle_tools.unwrap_or(0) as usize;
    Ok(Measured::Load(Box::new(report)))
}

/// Stops the fleet: the one in this process, the processes, then this
/// process's exporter of traces.
async fn stop(
    fleet: Option<LocalFleet>,
    processes: Option<ProcessFleet>,
    exporting: Option<Exporting>,
) {
    if let Some(fleet) = fleet {
        fleet.shutdown().await;
    }
    // Stopped processes have sent what they buffered; this one sends its own.
    drop(processes);
    if let Some(exporting) = exporting {
        exporting.shutdown().await;
    }
}

/// The orchestrator's gRPC address and the NATS URL of the fleet measured:
/// the one started here, or `--target`'s.
fn addresses(
    args: &BenchArgs,
    fleet: Option<&LocalFleet>,
    processes: Option<&ProcessFleet>,
) -> anyhow::Result<(String, String)> {
    Ok(match (fleet, processes, &args.target, &args.nats_url) {
        (Some(fleet), _, _, _) => (fleet.grpc_addr(), fleet.nats_url()),
        (None, Some(processes), _, _) => (processes.address.clone(), processes.nats_url.clone()),
        (None, None, Some(target), Some(nats)) => (target.clone(), nats.clone()),
        _ => anyhow::bail!("--target needs --nats-url"),
    })
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

/// `--jobs-page`: the console's jobs page with `stored` jobs in the
/// fleet's one Redis server.
async fn measure_jobs_page(
    api: &Api,
    sources: &Sources,
    stored: usize,
) -> anyhow::Result<jobs_page::JobsPageReport> {
    let [redis_url] = sources.redis_urls.as_slice() else {
        anyhow::bail!("--jobs-page needs the fleet's one Redis server");
    };
    jobs_page::measure(api, redis_url, stored).await
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
    extras: Extras<'_>,
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
        echo_effects: args.echo_effects.as_deref().and_then(|name| {
            toolfleet_proto::manifest::Effects::ALL
                .into_iter()
                .find(|effects| effects.as_str() == name)
        }),
        max_jobs: args.max_jobs,
        threads: args.threads,
        fsync_always: args.fsync_always,
        nats_cluster: args.nats_cluster,
        redis_cluster: args.redis_cluster,
        wait_replicas: args.wait_replicas,
        nats_accounts: args.nats_accounts,
    };
    ProcessFleet::start(&shape, tool, telemetry, extras).await
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
