//! `toolfleet cancel`: ask a job to stop.

use std::process::ExitCode;

use clap::Args;
use toolfleet_proto::{JobStatus, v1};

use super::connection::{Server, rpc_error};
use crate::output::outln;
use crate::transcript;

#[derive(Debug, Args)]
pub(crate) struct CancelArgs {
    #[command(flatten)]
    server: Server,
    /// The job id, as `submit` printed it.
    job_id: String,
    /// Print the answer as JSON: the job's id and its status when the
    /// cancel arrived.
    #[arg(long)]
    json: bool,
}

/// `toolfleet cancel`.
pub(crate) async fn cancel(args: CancelArgs) -> anyhow::Result<ExitCode> {
    let mut client = args.server.connect().await?;
    let response = client
        .cancel_job(v1::CancelJobRequest {
            job_id: args.job_id.clone(),
        })
        .await
        .map_err(|status| rpc_error("CancelJob", &status))?
        .into_inner();
    let status = transcript::status_name(response.status);
    let id = &args.job_id;
    if args.json {
        outln!("{}", serde_json::json!({"job_id": id, "status": status}))?;
    } else if transcript::job_status(response.status).is_some_and(JobStatus::is_final) {
        outln!("job {id} had already {}; nothing to cancel", status)?;
    } else {
        outln!(
            "cancel requested: job {id} was {status}; it stops at its next step \
             (follow it with: toolfleet watch {id})"
        )?;
    }
    Ok(ExitCode::SUCCESS)
}
