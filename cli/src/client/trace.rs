//! `toolfleet trace`: a job drawn as a waterfall.

use std::process::ExitCode;

use clap::Args;

use super::connection::Server;
use super::events::{each_event, ending_code};
use crate::output::out;
use crate::timeline;

#[derive(Debug, Args)]
pub(crate) struct TraceArgs {
    #[command(flatten)]
    server: Server,
    /// The job id, as `submit` printed it.
    job_id: String,
    /// Columns of the time axis, 10 to 1000.
    #[arg(long, value_name = "N", default_value_t = 60,
          value_parser = clap::value_parser!(u16).range(10..=1000))]
    width: u16,
}

/// `toolfleet trace`: reads every event up to the final one, then draws
/// them; exits like `watch`.
pub(crate) async fn trace(args: TraceArgs) -> anyhow::Result<ExitCode> {
    let mut client = args.server.connect().await?;
    let mut events = Vec::new();
    let last = each_event(&mut client, &args.job_id, 0, |event| {
        events.push(event.clone());
        Ok(())
    })
    .await?;
    out!(
        "{}",
        timeline::waterfall(&args.job_id, &events, usize::from(args.width))
    )?;
    Ok(ending_code(&last))
}
