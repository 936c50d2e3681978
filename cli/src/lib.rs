//! The `toolfleet` command line: a gRPC client of the API, and `dev`/`bench`
//! which run a local fleet. Its own crate, so that neither service links it.
//!
//! - `client`: `submit`, `get`, `watch`, `trace`, `cancel`, `jobs`, `tools`
//!   against any orchestrator replica, a module each over the shared
//!   connection and the following of a job; `call`: one call without a model.
//! - `transcript`: how jobs, events and tools are printed (text and JSON).
//! - `mcp_serve`: `mcp-serve`, the fleet as one MCP server.
//! - `console`: `console`, the web console (crate `toolfleet-console`).
//! - `toolfleet-fleet` runs the local fleet of `dev` and `bench` (servers as
//!   child processes, an orchestrator and workers in this process), and the
//!   test harness's servers.
//! - `dev`: the `dev` command.
//! - `bench`: runs `toolfleet-bench`, the bench's own binary (crate
//!   `toolfleet-bench`), with its arguments.

mod approvals;
mod bench;
mod call;
mod client;
mod console;
pub mod demo;
mod dev;
pub mod mcp_serve;
pub mod output;
mod timeline;
mod transcript;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use toolfleet_fleet::supervisor;

/// What the exit codes mean; shown at the end of `toolfleet --help`.
const EXIT_CODES: &str = "\
Exit status: 0 success; 1 error (orchestrator unreachable, request rejected, ...); \
2 bad usage; 3 the job failed; 4 the job was cancelled; 130 interrupted.";

/// Submit agent jobs to a toolfleet, follow them, cancel them and list the
/// live tools; or run a whole fleet on this machine with `toolfleet dev`.
#[derive(Debug, Parser)]
#[command(name = "toolfleet", version, after_help = EXIT_CODES, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Submit a job and print its id; with --watch, follow it to the end.
    ///
    /// Without --script or --script-file, the scripted model plays the demo
    /// script of the question asked (see `toolfleet dev --help`), or the
    /// default one: parallel get_current_weather and calculate calls, then a
    /// message quoting their results.
    Submit(Box<client::SubmitArgs>),
    /// Print a job: status, rounds, error, output and the whole transcript.
    Get(client::GetArgs),
    /// Stream a job's events until its final one.
    Watch(client::WatchArgs),
    /// Draw a job as a waterfall: each model turn and call on one time axis,
    /// retries marked, the slowest step pointed at. Waits for a running job
    /// to end.
    Trace(client::TraceArgs),
    /// Ask a job to stop; it stops at its next step.
    Cancel(client::CancelArgs),
    /// List your jobs, newest first: filter by status and metadata, a page
    /// at a time.
    Jobs(client::JobsArgs),
    /// List the tools the live workers serve.
    Tools(client::ToolsArgs),
    /// Print who the orchestrator takes your credential for: its tenant,
    /// the person it names, and its roles.
    Whoami(client::WhoamiArgs),
    /// Run one tool call through the fleet without a model (a call job) and
    /// print its envelope; exit 0 when the call succeeded, 3 when it failed.
    Call(call::CallArgs),
    /// List the calls of your jobs that wait for a person's approval,
    /// oldest first, with the commands that decide them.
    Approvals(approvals::ApprovalsArgs),
    /// Approve a held call: it runs (with --arguments, as given).
    Approve(approvals::ApproveArgs),
    /// Reject a held call: the model gets REJECTED_BY_APPROVER and your reason.
    Reject(approvals::RejectArgs),
    /// Give your verdict on a call whose outcome no worker could tell (a job
    /// submitted with --on-unknown-outcome ask): applied (with --result),
    /// not-applied (it runs again), or fail (with --reason).
    Resolve(approvals::ResolveArgs),
    /// Serve the fleet's tools as one MCP server: over stdio (for an MCP
    /// client that starts it; --token authenticates), or Streamable HTTP
    /// with --listen (each client sends its own bearer token). Each call
    /// runs through the fleet as a call job (docs/tools/mcp.md).
    McpServe(mcp_serve::McpServeArgs),
    /// Serve the web console: the jobs and their transcripts in a browser,
    /// each page an API call with the signed-in person's own token
    /// (docs/console.md).
    // Boxed: its flags make it the largest command by far.
    Console(Box<console::ConsoleArgs>),
    /// Run a whole fleet on this machine and one demo job through it, or
    /// keep it serving with --serve.
    ///
    /// Starts nats-server and redis-server as child processes on free loopback
    /// ports with their data in a temp dir (never the machine's own NATS or
    /// Redis), then an orchestrator and the workers (two by default) in this
    /// process. Everything is stopped and removed on exit or Ctrl-C; the
    /// orchestrator and the workers drain first.
    ///
    /// nats-server (2.10 or newer) is $TOOLFLEET_NATS_SERVER, else
    /// .tools/venv/bin/nats-server (scripts/setup installs it there) in the
    /// workspace toolfleet was built from, the current dir, the toolfleet
    /// binary's dir or one of their parents, else the one on PATH.
    /// redis-server is $TOOLFLEET_REDIS_SERVER, else the one on PATH.
    Dev(dev::DevArgs),
    /// Measure end-to-end throughput and latency through a local fleet (or
    /// --target), with raw NATS request/reply as the floor, in one run.
    ///
    /// J jobs (-J) with C in flight (-C), each R rounds (-R) of K parallel
    /// `echo` calls (-K) through the scripted model; then sequential one-call
    /// jobs for latency; then raw NATS request/reply through the same server.
    /// Build with --release for meaningful numbers. docs/benchmarks.md explains
    /// the output. Runs `toolfleet-bench` (next to this binary, else on
    /// PATH); `toolfleet bench --help` lists its flags.
    #[command(disable_help_flag = true)]
    Bench(bench::BenchArgs),
    /// The watchdog `dev` starts (see `supervisor::reaper`): not for people.
    #[command(name = supervisor::reaper::COMMAND, hide = true)]
    Reap,
}

impl Cli {
    /// Threads of the runtime this command runs on (0: one per CPU; `bench`
    /// runs in a binary of its own, which picks its own).
    #[must_use]
    pub fn threads(&self) -> usize {
        0
    }

    /// Runs the command and returns the process's exit code (see
    /// `toolfleet --help`).
    ///
    /// # Errors
    ///
    /// Anything that stopped the command: the orchestrator is unreachable, it
    /// rejected the request, the local fleet did not start. Each message says
    /// what to do.
    pub async fn run(self) -> anyhow::Result<ExitCode> {
        match self.command {
            Command::Submit(args) => client::submit(*args).await,
            Command::Get(args) => client::get(args).await,
            Command::Watch(args) => client::watch(args).await,
            Command::Trace(args) => client::trace(args).await,
            Command::Cancel(args) => client::cancel(args).await,
            Command::Jobs(args) => client::jobs(args).await,
            Command::Tools(args) => client::tools(args).await,
            Command::Whoami(args) => client::whoami(args).await,
            Command::Call(args) => call::run(args).await,
            Command::Approvals(args) => approvals::list(args).await,
            Command::Approve(args) => approvals::approve(args).await,
            Command::Reject(args) => approvals::reject(args).await,
            Command::Resolve(args) => approvals::resolve(args).await,
            Command::McpServe(args) => mcp_serve::run(args).await,
            Command::Console(args) => console::run(*args).await,
            Command::Dev(args) => dev::run(args).await,
            Command::Bench(args) => bench::run(args),
            Command::Reap => {
                supervisor::reaper::serve(std::io::stdin().lock());
                Ok(ExitCode::SUCCESS)
            }
        }
    }
}

/// Exit code of a job that failed.
const EXIT_JOB_FAILED: u8 = 3;
/// Exit code of a job that was cancelled.
const EXIT_JOB_CANCELLED: u8 = 4;
/// Exit code after Ctrl-C, as a shell reports a SIGINT death.
const EXIT_INTERRUPTED: u8 = 130;

pub use toolfleet_service::signals::{watch_signals, watch_signals_then};
