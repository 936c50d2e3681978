//! What a run measured (the JSON of `--json`), and the table it prints.

use std::time::Duration;

use anyhow::Context as _;
use serde::Serialize;
use toolfleet_cli::output::outln;

use super::accounting::Accounting;
use super::args::BenchArgs;
use super::plot::{Chart, Panel, Series};

#[derive(Debug, Default, Serialize)]
pub(super) struct Percentiles {
    pub(super) p50_ms: f64,
    pub(super) p90_ms: f64,
    pub(super) p99_ms: f64,
}

impl Percentiles {
    pub(super) fn of(mut samples: Vec<Duration>) -> Self {
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

#[derive(Debug, Default, Serialize)]
pub(super) struct Report {
    /// `echo`, or `sleep <ms>ms`.
    pub(super) tool: String,
    /// NATS and Redis over TLS (`--tls`).
    pub(super) tls: bool,
    /// JetStream and Redis fsync every write (`--fsync-always`), as the
    /// servers themselves report it when they can be asked.
    pub(super) fsync_always: bool,
    /// The sampling ratio of the fleet's traces (`--trace-ratio`); none when
    /// tracing was off.
    pub(super) trace_ratio: Option<f64>,
    /// Spans the bench's collector received over the whole run (warm-up
    /// included), when tracing was on.
    pub(super) spans_received: Option<u64>,
    /// Finished jobs Redis held before the load (`--stored-jobs`), besides
    /// the warm-up's.
    pub(super) stored_jobs: usize,
    /// Tenants of the tokens file the load's jobs took turns in
    /// (`--tenants`); 0: no tokens, every job the tenant `default`.
    pub(super) tenants: usize,
    /// Tools of an MCP server every worker also served, none of them
    /// called (`--idle-tools`).
    pub(super) idle_tools: usize,
    /// Jobs parked waiting for approval during the load
    /// (`--awaiting-approval`).
    pub(super) awaiting_approval: usize,
    /// The `threads` of the orchestrator and the workers, and nats-server's
    /// `GOMAXPROCS` (`--threads`), when they ran as processes of their own.
    pub(super) threads: Option<usize>,
    /// NATS ran as a cluster of 3, every stream on all three
    /// (`--nats-cluster`).
    pub(super) nats_cluster: bool,
    /// Redis ran as a Redis Cluster of 3 primaries with a replica each
    /// (`--redis-cluster`).
    pub(super) redis_cluster: bool,
    /// Replicas every write waited for (`--wait-replicas`; 0: none).
    pub(super) wait_replicas: u32,
    pub(super) jobs: usize,
    pub(super) concurrency: usize,
    pub(super) calls_per_round: usize,
    pub(super) rounds: usize,
    pub(super) jobs_per_sec: f64,
    pub(super) tool_calls_per_sec: f64,
    pub(super) tool_call_round_trip: Percentiles,
    pub(super) sequential_jobs: usize,
    pub(super) sequential_job_latency: Percentiles,
    pub(super) cpu_ms_per_job: Option<f64>,
    /// Wall time of the load phase.
    pub(super) load_seconds: f64,
    /// What the load phase cost, by process, in Redis commands and in NATS
    /// messages, per job.
    pub(super) accounting: Accounting,
    /// The raw NATS floor (`--raw-requests`); none when skipped.
    pub(super) raw_nats_requests_per_sec: Option<f64>,
    pub(super) raw_nats_round_trip: Option<Percentiles>,
    pub(super) tool_calls_vs_raw_nats: Option<f64>,
    /// NATS ran the shipped accounts and users (`--nats-accounts`).
    pub(super) nats_accounts: bool,
    /// The raw JetStream floor (`--raw-calls`); none when skipped, or when
    /// it could not run (the reason is printed).
    pub(super) raw_jetstream: Option<JetStreamFloor>,
    /// The one-call floor: raw JetStream calls one at a time, as many as
    /// the sequential jobs (skipped with the raw JetStream floor).
    pub(super) raw_one_call: Option<Percentiles>,
}

/// What the raw JetStream floor did, and what it cost per call.
#[derive(Debug, Serialize)]
pub(super) struct JetStreamFloor {
    pub(super) calls: usize,
    pub(super) concurrency: usize,
    pub(super) calls_per_sec: f64,
    pub(super) round_trip: Percentiles,
    /// CPU milliseconds per call, by process: the servers' and the bench
    /// client's (publisher and responders); the fleet's processes idle.
    pub(super) cpu_ms_per_call_by_process: std::collections::BTreeMap<String, f64>,
    pub(super) cpu_ms_per_call_total: f64,
    pub(super) nats_messages_in_per_call: Option<f64>,
    pub(super) nats_messages_out_per_call: Option<f64>,
    /// The load's tool calls/s over this floor's calls/s.
    pub(super) tool_calls_vs_raw_jetstream: f64,
}

/// The report on stdout (as JSON with `--json`), and in `--json-file`.
pub(super) fn publish(args: &BenchArgs, report: &Report) -> anyhow::Result<()> {
    if args.json {
        outln!("{}", serde_json::to_string_pretty(report)?)?;
    } else {
        print(report)?;
    }
    if let Some(path) = &args.chart {
        chart(report).render(path)?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(path) = &args.json_file {
        std::fs::write(path, serde_json::to_vec_pretty(report)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
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
    if let Some(floor) = &report.raw_one_call {
        outln!(
            "one-call floor       {}  (raw JetStream calls, one at a time)",
            p(floor)
        )?;
    }
    Ok(())
}

/// How the run was set up, where it differs from the default: transport,
/// stored jobs, tenants, idle tools, parked jobs, durability, servers,
/// replication, tracing.
fn print_setup(report: &Report) -> std::io::Result<()> {
    if report.tls {
        outln!("transport            NATS and Redis over TLS")?;
    }
    let counted = [
        (
            "stored",
            report.stored_jobs,
            "finished jobs in Redis before the load",
        ),
        (
            "tenants",
            report.tenants,
            "in the tokens file, with quotas and budgets, the jobs taking turns",
        ),
        (
            "idle tools",
            report.idle_tools,
            "more tools on every worker, none of them called",
        ),
        (
            "parked",
            report.awaiting_approval,
            "jobs waiting for approval during the load",
        ),
    ];
    for (label, count, what) in counted {
        if count > 0 {
            outln!("{label:<21}{count} {what}")?;
        }
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
        let top = largest(&accounting.redis_commands_per_job_by_name, 1);
        outln!("  Redis commands       {commands:.1} ({top})")?;
        let usec: f64 = accounting.redis_usec_per_job_by_name.values().sum();
        let top = largest(&accounting.redis_usec_per_job_by_name, 0);
        outln!("  Redis's time in them {usec:.0} µs ({top})")?;
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

/// The six largest of `by_name`, largest first, as "name value, ...",
/// with `decimals` decimals.
fn largest(by_name: &std::collections::BTreeMap<String, f64>, decimals: usize) -> String {
    let mut sorted: Vec<_> = by_name.iter().collect();
    sorted.sort_by(|a, b| b.1.total_cmp(a.1));
    let top: Vec<String> = sorted
        .iter()
        .take(6)
        .map(|(name, n)| format!("{name} {n:.decimals$}"))
        .collect();
    top.join(", ")
}

/// `--chart`: the run beside its floors. CPU per tool call by process
/// against the raw JetStream floor's per call, and the one-call job's
/// latency against the one-call floor's.
fn chart(report: &Report) -> Chart {
    let calls_per_job = (report.rounds * report.calls_per_round).max(1) as f64;
    let cost = &report.accounting.cpu_ms_per_job_by_process;
    let floor = report.raw_jetstream.as_ref();
    let mut names: Vec<&String> = cost.keys().collect();
    let fleet_per_call = |name: &str| cost.get(name).map_or(0.0, |ms| ms / calls_per_job);
    let floor_per_call = |name: &str| {
        floor
            .and_then(|f| f.cpu_ms_per_call_by_process.get(name))
            .copied()
            .unwrap_or(f64::NAN)
    };
    names.sort_by(|a, b| fleet_per_call(b).total_cmp(&fleet_per_call(a)));
    let mut labels: Vec<String> = names.iter().map(|name| (*name).clone()).collect();
    let mut fleet: Vec<f64> = labels.iter().map(|name| fleet_per_call(name)).collect();
    let mut raw: Vec<f64> = labels.iter().map(|name| floor_per_call(name)).collect();
    labels.push("total".to_owned());
    fleet.push(report.accounting.cpu_ms_per_job_total / calls_per_job);
    raw.push(floor.map_or(f64::NAN, |f| f.cpu_ms_per_call_total));
    let one_call = &report.sequential_job_latency;
    let one_call_floor = report.raw_one_call.as_ref();
    let floor_name = "floor: a raw JetStream call".to_owned();
    let cpu = Panel {
        title: "CPU ms per tool call, by process".to_owned(),
        x_axis: String::new(),
        x_labels: labels,
        bars: true,
        series: vec![
            Series {
                name: "toolfleet: a tool call".to_owned(),
                values: fleet,
            },
            Series {
                name: floor_name.clone(),
                values: raw,
            },
        ],
    };
    let latency = Panel {
        title: "a one-call job and the one-call floor, ms".to_owned(),
        x_axis: String::new(),
        x_labels: vec!["p50".to_owned(), "p99".to_owned()],
        bars: true,
        series: vec![
            Series {
                name: "toolfleet: a one-call job".to_owned(),
                values: vec![one_call.p50_ms, one_call.p99_ms],
            },
            Series {
                name: format!("{floor_name}, one at a time"),
                values: vec![
                    one_call_floor.map_or(f64::NAN, |f| f.p50_ms),
                    one_call_floor.map_or(f64::NAN, |f| f.p99_ms),
                ],
            },
        ],
    };
    Chart {
        title: format!(
            "toolfleet bench: {} jobs of {} x {} {} calls beside the raw floors",
            report.jobs, report.rounds, report.calls_per_round, report.tool
        ),
        panels: vec![cpu, latency],
    }
}
