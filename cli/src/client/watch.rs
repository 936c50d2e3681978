//! `toolfleet watch`: a job's events as they happen.

use std::process::ExitCode;

use clap::Args;

use super::connection::Server;
use super::events::{each_event, ending_code, get_job, say_ending, stream_events};

#[derive(Debug, Args)]
pub(crate) struct WatchArgs {
    #[command(flatten)]
    server: Server,
    /// The job id, as `submit` printed it.
    job_id: String,
    /// Skip the events before this offset (0: from the job's start).
    #[arg(long, value_name = "N", default_value_t = 0)]
    from: u64,
    /// Print each event as a line of JSON.
    #[arg(long, conflicts_with = "quiet")]
    json: bool,
    /// Print only the job's answer (stdout), or why it failed (stderr); the
    /// exit status says how it ended.
    #[arg(long, short)]
    quiet: bool,
}

/// `toolfleet watch`: exits like `submit --watch`, by how the job ended.
pub(crate) async fn watch(args: WatchArgs) -> anyhow::Result<ExitCode> {
    let mut client = args.server.connect().await?;
    if args.quiet {
        let last = each_event(&mut client, &args.job_id, args.from, |_| Ok(())).await?;
        return say_ending(&last);
    }
    // Times are shown from the job's start, also when the watch starts later.
    let origin = if args.from > 0 {
        Some(get_job(&mut client, &args.job_id).await?.created_at_ms)
    } else {
        None
    };
    let last = stream_events(&mut client, &args.job_id, args.from, origin, args.json).await?;
    Ok(ending_code(&last))
}
