//! The bench's flags: what it runs, on which fleet, and how it reports.

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
    pub(super) jobs: usize,
    /// Jobs in flight at once.
    #[arg(short = 'C', long, default_value_t = 64)]
    pub(super) concurrency: usize,
    /// Parallel calls per round.
    #[arg(short = 'K', long, default_value_t = 3)]
    pub(super) calls: usize,
    /// Make every call a `sleep` of this many milliseconds (an I/O-bound
    /// tool) instead of a no-op `echo`.
    #[arg(long, value_name = "MS", conflicts_with = "calculate")]
    pub(super) sleep_ms: Option<u64>,
    /// Make every call `calculate` of "1+1", a built-in tool of the shipped
    /// pool `general`, instead of `echo`: the tool `--nats-accounts` runs,
    /// so a run with this flag alone is what to compare it with.
    #[arg(long)]
    pub(super) calculate: bool,
    /// Tool rounds per job.
    #[arg(short = 'R', long, default_value_t = 2)]
    pub(super) rounds: usize,
    /// One-round one-call jobs run one after the other, for latency.
    #[arg(long, default_value_t = 300)]
    pub(super) sequential: usize,
    /// Requests of the raw NATS request/reply floor. 0 skips it.
    #[arg(long, default_value_t = 20_000)]
    pub(super) raw_requests: usize,
    /// Calls of the raw JetStream floor: each published to a work-queue
    /// stream and acked, pulled, replied to and acked, as a tool call is,
    /// with nothing else (no Redis, no model loop). 0 skips it.
    #[arg(long, default_value_t = 12_000)]
    pub(super) raw_calls: usize,
    /// Run the fleet as a deployment does: nats-server, redis-server, and the
    /// orchestrator and each worker as processes of their own, every worker
    /// serving the whole default tool set. Without it, the orchestrator and
    /// the workers share the bench's process (like `toolfleet dev`).
    #[arg(long, conflicts_with = "target")]
    pub(super) processes: bool,
    /// Workers to start.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub(super) workers: usize,
    /// Execution slots of each worker (`runtime.max_in_flight`). Default:
    /// the worker's own default.
    #[arg(long, value_name = "N")]
    pub(super) max_in_flight: Option<usize>,
    /// With `--processes`: the workers declare `echo` with these effects
    /// (`runtime.tool_effects`) instead of its own `read_only`: compare
    /// `idempotent` with the default to see what a claim in the ledger
    /// costs a call (decision 0060).
    #[arg(long, value_name = "EFFECTS", requires = "processes",
          value_parser = ["read_only", "idempotent", "not_idempotent"])]
    pub(super) echo_effects: Option<String>,
    /// Threads of the orchestrator, of each worker and of the bench's own
    /// client (`threads`; 0: one per CPU), and of nats-server's Go runtime
    /// (`GOMAXPROCS`; 0: Go's default). 1, the default, is the cheapest
    /// shape for six busy processes on a few cores.
    #[arg(long, value_name = "N", default_value_t = 1, requires = "processes")]
    pub(super) threads: usize,
    /// Jobs the orchestrator runs at once (`runner.max_jobs`). Default: the
    /// orchestrator's own default (64).
    #[arg(long, value_name = "N", conflicts_with = "target")]
    pub(super) max_jobs: Option<std::num::NonZeroUsize>,
    /// Fill Redis with this many finished jobs after the warm-up (copies of
    /// a warm-up job's keys, indexed for its tenant), to show that a job's
    /// cost does not depend on what else is stored.
    #[arg(long, value_name = "N", conflicts_with_all = ["target", "tls"])]
    pub(super) stored_jobs: Option<usize>,
    /// Before the load, park this many jobs, each holding an `echo` call
    /// for approval (decision 0036), to show that jobs waiting for a person
    /// cost the running ones nothing. They are submitted through the fleet.
    #[arg(long, value_name = "N", conflicts_with_all = ["target", "parked"])]
    pub(super) awaiting_approval: Option<usize>,
    /// With `--processes`: the orchestrator takes bearer tokens
    /// (`api.auth = tokens`) from a tokens file of N tenants made for the
    /// run, each with every quota and budget the file can give (none of
    /// them reached), and the load's jobs go to the tenants in turn: to
    /// show that a job's cost does not depend on how many tenants there
    /// are.
    #[arg(long, value_name = "N", requires = "processes",
          value_parser = clap::value_parser!(u32).range(1..=100_000),
          conflicts_with_all = ["parked", "jobs_page", "awaiting_approval", "nats_accounts"])]
    pub(super) tenants: Option<u32>,
    /// With `--processes`: every worker also serves N tools of an MCP
    /// server the bench runs (each with its queue and consumer, announced
    /// and listed as any tool, none of them called), to show that the
    /// tools a fleet has registered cost a job nothing.
    #[arg(long, value_name = "N", requires = "processes",
          value_parser = clap::value_parser!(u32).range(0..=10_000),
          conflicts_with = "nats_accounts")]
    pub(super) idle_tools: Option<u32>,
    /// Instead of one run, one run of the load per value of each DIMENSION
    /// (a fresh fleet of processes each time, floors skipped), then a
    /// table, a JSON file and an SVG chart per dimension in --sweep-dir:
    /// CPU per job by process, Redis commands and NATS messages per job,
    /// latency and memory, against the dimension (docs/benchmarks.md,
    /// "Growth curves"). `all` sweeps every dimension.
    #[arg(long, value_name = "DIMENSION", value_delimiter = ',',
          conflicts_with_all = ["target", "parked", "jobs_page", "mcp", "first_token", "tls"])]
    pub(super) sweep: Vec<Dimension>,
    /// The values of a one-dimension --sweep, instead of its own
    /// (comma-separated).
    #[arg(long, value_name = "N,...", value_delimiter = ',', requires = "sweep")]
    pub(super) sweep_values: Vec<usize>,
    /// Runs of the load at each value of a --sweep, the values in turn;
    /// each value's median run (by CPU) is reported, with the range.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=20))]
    pub(super) sweep_runs: u16,
    /// Where --sweep writes its charts, tables and JSON.
    #[arg(long, value_name = "DIR", default_value = "bench-sweeps")]
    pub(super) sweep_dir: std::path::PathBuf,
    /// NATS and Redis speak TLS only (with certificates made for the run),
    /// and the orchestrator, the workers and the raw floor's clients connect
    /// over it: compare with a run without to see what TLS costs.
    #[arg(long, conflicts_with_all = ["target", "processes"])]
    pub(super) tls: bool,
    /// JetStream and Redis fsync every write before acknowledging it
    /// (`sync_interval: always`, `appendfsync always`), as systems that fsync
    /// every step do. Without it, JetStream syncs every two minutes and the
    /// bench's Redis keeps nothing on disk.
    #[arg(long, conflicts_with = "target")]
    pub(super) fsync_always: bool,
    /// With `--processes`: NATS is a cluster of 3 servers on loopback, each
    /// stream kept on all three (`nats.replicas = 3`).
    #[arg(long, requires = "processes", conflicts_with = "fsync_always")]
    pub(super) nats_cluster: bool,
    /// With `--processes`: Redis is a Redis Cluster of 3 primaries with a
    /// replica each (`redis.cluster`).
    #[arg(long, requires = "processes", conflicts_with = "stored_jobs")]
    pub(super) redis_cluster: bool,
    /// With `--processes`: every write waits for this many replicas
    /// (`redis.wait_replicas`; needs `--redis-cluster`, whose primaries have
    /// one).
    #[arg(long, value_name = "N", requires = "redis_cluster")]
    pub(super) wait_replicas: Option<u32>,
    /// With `--processes`: NATS runs toolfleet's shipped accounts and users
    /// (deploy/nats/toolfleet-users.conf, decision 0029), the setup step
    /// creates the streams as `setup`, the orchestrator connects as
    /// `orchestrator`, and the workers as the pool `general`, in its own
    /// account, serving its tools; the load calls `calculate`. Compare with
    /// `--processes --calculate` to see what the accounts cost. The raw
    /// floors are skipped: their clients have no user there.
    #[arg(long, requires = "processes", conflicts_with_all = ["nats_cluster", "fsync_always", "sleep_ms"])]
    pub(super) nats_accounts: bool,
    /// Trace the fleet with this sampling ratio (0.0 to 1.0), exporting over
    /// OTLP to a collector the bench starts, which counts the spans and
    /// drops them: compare with a run without to see what tracing costs.
    #[arg(long, value_name = "RATIO", value_parser = sample_ratio, conflicts_with = "target")]
    pub(super) trace_ratio: Option<f64>,
    /// With `--processes`: instead of the load, measure what N jobs
    /// waiting for approval cost the orchestrator: after N jobs ran to
    /// their end, its CPU and memory over 30 s idle, then over 30 s with N
    /// jobs parked (docs/performance.md).
    #[arg(long, value_name = "N", requires = "processes")]
    pub(super) parked: Option<usize>,
    /// Instead of the load, time the console's jobs page (`ListJobs` of 50
    /// jobs with the tenant's counts: the newest, the last hour, page after
    /// page, and a status filter nothing matches) with N finished jobs
    /// stored, spread over the last 23 hours (docs/benchmarks.md).
    #[arg(long, value_name = "N", conflicts_with_all = ["target", "tls", "redis_cluster", "stored_jobs", "parked", "mcp", "first_token"])]
    pub(super) jobs_page: Option<usize>,
    /// Instead of the load, time N calls of an MCP server's tool made by
    /// one MCP client directly and N through the fleet (`mcp-serve`, a call
    /// job, a worker, the same server), interleaved, one at a time: what
    /// the fleet adds to an MCP call, at p50 and p99. The server, the
    /// fleet, the gateway and the client run in this process.
    #[arg(long, value_name = "N", conflicts_with_all = ["target", "processes", "tls"])]
    pub(super) mcp: Option<usize>,
    /// Instead of the load, time N streamed jobs one after the other: from
    /// a local streaming model server handing over an answer's first bytes
    /// to the client receiving its first `model_output_delta`. The server,
    /// the fleet and the client run in this process.
    #[arg(long, value_name = "N", conflicts_with_all = ["target", "processes", "tls", "mcp"])]
    pub(super) first_token: Option<usize>,
    /// Bench an existing fleet (with test tools enabled) instead of starting one.
    #[arg(long, requires = "nats_url")]
    pub(super) target: Option<String>,
    /// That fleet's NATS URL, for the raw request/reply floor.
    #[arg(long)]
    pub(super) nats_url: Option<String>,
    /// Print the results as JSON on stdout instead of the report (progress
    /// stays on stderr), as every `--json` of toolfleet does.
    #[arg(long)]
    pub(super) json: bool,
    /// Also write the results as JSON to this file, beside the report.
    #[arg(long, value_name = "PATH")]
    pub(super) json_file: Option<std::path::PathBuf>,
    /// Also draw the run beside its floors as an SVG chart in this file:
    /// CPU per tool call by process against the raw JetStream floor's per
    /// call, and a one-call job's p50 and p99 against the one-call floor's.
    #[arg(long, value_name = "PATH", conflicts_with_all = ["sweep", "parked", "jobs_page", "mcp", "first_token"])]
    pub(super) chart: Option<std::path::PathBuf>,
}

/// A `--trace-ratio`: a number from 0.0 to 1.0.
fn sample_ratio(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(ratio) if (0.0..=1.0).contains(&ratio) => Ok(ratio),
        _ => Err(format!("{text:?} is not a ratio from 0.0 to 1.0")),
    }
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

/// A dimension of the work, as `--sweep` names it (what each is and
/// its values: `sweep.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub(crate) enum Dimension {
    /// Finished jobs stored in Redis before the load (`--stored-jobs`).
    StoredJobs,
    /// Tool rounds per job (`-R`).
    Rounds,
    /// Parallel calls per round (`-K`).
    Width,
    /// Jobs parked waiting for approval during the load
    /// (`--awaiting-approval`).
    AwaitingApproval,
    /// Tenants with quotas and budgets, the jobs taking turns
    /// (`--tenants`).
    Tenants,
    /// Tools registered besides the default set, none of them called
    /// (`--idle-tools`).
    Tools,
    /// Every dimension above, one after the other.
    All,
}
