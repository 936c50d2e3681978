//! `toolfleet-worker`: serves the built-in tools from NATS JetStream.
//!
//! Stops on SIGTERM or SIGINT after draining in-flight calls (see
//! `toolfleet_worker::runtime`); a second signal exits at once.

use std::process::ExitCode;

/// mimalloc, not glibc's allocator, as in the orchestrator: in a profile of
/// the bench's load about a fifth of a worker's CPU was in glibc's `malloc`
/// and `free` (the NATS and Redis clients' messages and replies); mimalloc
/// cut the workers' CPU per job by about 15% for about 2 MB more memory,
/// well inside their 30 MB (decision 0027).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::Parser;
use toolfleet_worker::binary::{self, WorkerFlags};
use toolfleet_worker::tools::{self, TEST_TOOLS_HELP};

/// Executes whitelisted tool calls from NATS JetStream and answers each with an envelope.
///
/// Configuration is layered: defaults < --config TOML file < TOOLFLEET_* environment
/// (e.g. TOOLFLEET_NATS__URL, TOOLFLEET_RUNTIME__MAX_IN_FLIGHT) < these flags.
/// docs/configuration.md lists every key.
#[derive(Debug, Parser)]
#[command(version)]
struct Flags {
    #[command(flatten)]
    worker: WorkerFlags,
    /// Serve only these tools (tools), comma separated.
    #[arg(long, value_delimiter = ',')]
    tools: Vec<String>,
    #[arg(long, help = TEST_TOOLS_HELP)]
    test_tools: bool,
    /// The knowledge graph of factual_qa and trend_analysis, a JSON Lines file of
    /// facts (kg.graph_path). Default: the sample graph built into the binary.
    #[arg(long, value_name = "FILE")]
    kg_graph: Option<std::path::PathBuf>,
}

fn main() -> ExitCode {
    let Flags {
        worker,
        tools,
        test_tools,
        kg_graph,
    } = Flags::parse();
    let builtin = |keys: toolfleet_worker::service::config::Overrides| {
        keys.set("tools", Some(tools).filter(|t| !t.is_empty()))
            .set("test_tools", test_tools.then_some(true))
            .set("kg.graph_path", kg_graph)
    };
    let options = worker.load(builtin);
    worker.main("toolfleet-worker", options, |options, process| async move {
        // Built (the graph read) before any connection: a bad graph fails
        // now, not once NATS and Redis answer.
        let prepared = tools::prepare(options.tool_selection())?;
        binary::serve(options, process, |worker| {
            prepared.with_redis(worker.redis())
        })
        .await
    })
}
