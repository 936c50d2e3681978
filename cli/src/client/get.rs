//! `toolfleet get`: a job, its transcript included.

use std::process::ExitCode;

use clap::Args;
use toolfleet_proto::JobStatus;

use super::connection::Server;
use super::events::{exit_code, get_job, print_job};
use crate::transcript;

#[derive(Debug, Args)]
pub(crate) struct GetArgs {
    #[command(flatten)]
    server: Server,
    /// The job id, as `submit` printed it.
    job_id: String,
    /// Print the job as JSON.
    #[arg(long)]
    json: bool,
}

/// `toolfleet get`.
pub(crate) async fn get(args: GetArgs) -> anyhow::Result<ExitCode> {
    let mut client = args.server.connect().await?;
    let job = get_job(&mut client, &args.job_id).await?;
    print_job(&job, args.json)?;
    // The same table as `watch`: a finished job's code says how it ended.
    let finished = transcript::job_status(job.status).is_some_and(JobStatus::is_final);
    Ok(if finished {
        exit_code(&job)
    } else {
        ExitCode::SUCCESS
    })
}
