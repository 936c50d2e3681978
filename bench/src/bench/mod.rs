//! One run of the bench: the fleet it measures (in this process, as
//! processes, or `--target`), the load, the sequential jobs and the floors,
//! and the report. See docs/benchmarks.md for how to read the numbers.
//!
//! - `args`: the flags; `run`: a run start to end, the fleet started and
//!   stopped; `measure`: what a run measures on it; `load`: the jobs it
//!   submits; `report`: the results and their table.
//! - `accounting`: what a phase cost, process by process; `floor`: the raw
//!   NATS and JetStream floors; `processes`: the fleet as processes;
//!   `stored`: `--stored-jobs`; `parked`, `jobs_page`, `mcp` and
//!   `first_token`: the runs of `--parked`, `--jobs-page`, `--mcp` and
//!   `--first-token`; `sweep`: `--sweep`, runs of the load with one
//!   dimension grown; `plot`: the charts; `tenants` and `idle_tools`:
//!   `--tenants` and `--idle-tools`.

mod accounting;
mod args;
mod first_token;
mod floor;
mod idle_tools;
mod jobs_page;
mod load;
mod mcp;
mod measure;
mod parked;
mod plot;
mod processes;
mod report;
mod run;
mod stored;
mod sweep;
mod tenants;

pub(crate) use args::BenchArgs;
/// Runs the benchmark `args` asks for: a sweep of runs (`--sweep`), or one.
pub(crate) async fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.sweep.is_empty() {
        run::run(args).await
    } else {
        sweep::run(&args).await
    }
}

type Api = toolfleet_proto::v1::agent_service_client::AgentServiceClient<tonic::transport::Channel>;
