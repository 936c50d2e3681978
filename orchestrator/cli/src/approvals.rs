//! `toolfleet approvals`, `approve` and `reject`: the calls of your jobs
//! that wait for a person, and your decisions on them (docs/approvals.md).

use std::process::ExitCode;

use clap::Args;
use serde_json::json;
use toolfleet_proto::v1;

use crate::client::{Server, rpc_error};
use crate::output::outln;
use crate::transcript;

#[derive(Debug, Args)]
pub(crate) struct ApprovalsArgs {
    #[command(flatten)]
    server: Server,
    /// Most calls to list (1 to 500).
    #[arg(long, default_value_t = 50)]
    limit: u32,
    /// Continue after the page that printed this token.
    #[arg(long, value_name = "TOKEN")]
    page_token: Option<String>,
    /// Print the page as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct ApproveArgs {
    #[command(flatten)]
    server: Server,
    /// The job id.
    job_id: String,
    /// The call id, as `toolfleet approvals` lists it.
    call_id: String,
    /// Run the call with these arguments (a JSON object) instead of the
    /// model's; checked against the tool's schema now.
    #[arg(long, value_name = "JSON")]
    arguments: Option<String>,
    /// Why, for the record.
    #[arg(long, default_value = "")]
    reason: String,
}

#[derive(Debug, Args)]
pub(crate) struct RejectArgs {
    #[command(flatten)]
    server: Server,
    /// The job id.
    job_id: String,
    /// The call id, as `toolfleet approvals` lists it.
    call_id: String,
    /// Why: the model reads it.
    #[arg(long)]
    reason: String,
}

/// `toolfleet approvals`.
pub(crate) async fn list(args: ApprovalsArgs) -> anyhow::Result<ExitCode> {
    let mut client = args.server.connect().await?;
    let page = client
        .list_pending_approvals(v1::ListPendingApprovalsRequest {
            page_size: args.limit,
            page_token: args.page_token.clone().unwrap_or_default(),
        })
        .await
        .map_err(|status| rpc_error("ListPendingApprovals", &status))?
        .into_inner();
    if args.json {
        let approvals: Vec<_> = page
            .approvals
            .iter()
            .map(|a| {
                json!({"job_id": a.job_id, "call_id": a.call_id, "tool": a.tool,
                       "arguments": a.arguments, "reason": a.reason, "rule": a.rule,
                       "requested_at_ms": a.requested_at_ms, "expires_at_ms": a.expires_at_ms})
            })
            .collect();
        outln!(
            "{}",
            json!({"approvals": approvals, "next_page_token": page.next_page_token})
        )?;
        return Ok(ExitCode::SUCCESS);
    }
    if page.approvals.is_empty() {
        outln!("no call waits for a decision")?;
    }
    for approval in &page.approvals {
        outln!(
            "{} {} {}({})\n  waits because {}; expires at {} (Unix ms)\n  \
             toolfleet approve {} {}   |   toolfleet reject {} {} --reason TEXT",
            approval.job_id,
            approval.call_id,
            approval.tool,
            transcript::excerpt(&approval.arguments),
            approval.reason,
            approval.expires_at_ms,
            approval.job_id,
            approval.call_id,
            approval.job_id,
            approval.call_id,
        )?;
    }
    if !page.next_page_token.is_empty() {
        outln!(
            "more: toolfleet approvals --limit {} --page-token {}",
            args.limit,
            page.next_page_token
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `toolfleet approve`.
pub(crate) async fn approve(args: ApproveArgs) -> anyhow::Result<ExitCode> {
    let request = v1::DecideCallRequest {
        job_id: args.job_id,
        call_id: args.call_id,
        decision: v1::Decision::Approve.into(),
        reason: args.reason,
        arguments: args.arguments,
    };
    decide(&args.server, request).await
}

/// `toolfleet reject`.
pub(crate) async fn reject(args: RejectArgs) -> anyhow::Result<ExitCode> {
    let request = v1::DecideCallRequest {
        job_id: args.job_id,
        call_id: args.call_id,
        decision: v1::Decision::Reject.into(),
        reason: args.reason,
        arguments: None,
    };
    decide(&args.server, request).await
}

async fn decide(server: &Server, request: v1::DecideCallRequest) -> anyhow::Result<ExitCode> {
    let mut client = server.connect().await?;
    let (job_id, call_id) = (request.job_id.clone(), request.call_id.clone());
    let word = if request.decision == i32::from(v1::Decision::Approve) {
        "approved"
    } else {
        "rejected"
    };
    client
        .decide_call(request)
        .await
        .map_err(|status| rpc_error("DecideCall", &status))?;
    outln!("{word} call {call_id} of job {job_id}; follow it with: toolfleet watch {job_id}")?;
    Ok(ExitCode::SUCCESS)
}
