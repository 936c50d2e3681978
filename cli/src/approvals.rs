//! `toolfleet approvals`, `approve`, `reject` and `resolve`: the calls of
//! your jobs that wait for a person (an approval before they run, or a
//! verdict on an outcome no worker could tell), and your decisions on them
//! (docs/approvals.md).

use std::process::ExitCode;

use clap::{Args, ValueEnum};
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

#[derive(Debug, Args)]
pub(crate) struct ResolveArgs {
    #[command(flatten)]
    server: Server,
    /// The job id.
    job_id: String,
    /// The call id, as `toolfleet approvals` lists it.
    call_id: String,
    /// What happened to the call.
    verdict: Verdict,
    /// With `applied`: the call's result (JSON), what the model gets as
    /// its data (default: null).
    #[arg(long, value_name = "JSON")]
    result: Option<String>,
    /// Why (required to fail the call: the model reads it).
    #[arg(long, default_value = "")]
    reason: String,
}

/// An operator's verdict on a call whose outcome is unknown.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum Verdict {
    /// It was applied: the model gets --result.
    Applied,
    /// It was not applied: it runs again.
    NotApplied,
    /// The model is told it failed (FAILED_BY_OPERATOR, with --reason).
    Fail,
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
                       "tool_version": a.tool_version, "arguments": a.arguments, "reason": a.reason, "rule": a.rule,
                       "requested_at_ms": a.requested_at_ms, "expires_at_ms": a.expires_at_ms,
                       "kind": a.kind, "attempt": a.attempt, "outcome": a.outcome})
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
        let (job, call) = (&approval.job_id, &approval.call_id);
        let (why, commands) = if approval.kind == "outcome" {
            (
                format!(
                    "attempt {} ended {}",
                    approval.attempt,
                    transcript::excerpt(&approval.outcome)
                ),
                format!(
                    "toolfleet resolve {job} {call} applied --result JSON   |   \
                     toolfleet resolve {job} {call} not-applied   |   \
                     toolfleet resolve {job} {call} fail --reason TEXT"
                ),
            )
        } else {
            (
                format!("waits because {}", approval.reason),
                format!(
                    "toolfleet approve {job} {call}   |   toolfleet reject {job} {call} --reason TEXT"
                ),
            )
        };
        let version = match approval.tool_version.get(..12) {
            Some(short) => format!(" [version {short}]"),
            None => String::new(),
        };
        outln!(
            "{job} {call} {}({}){version}\n  {why}; expires at {} (Unix ms)\n  {commands}",
            approval.tool,
            transcript::excerpt(&approval.arguments),
            approval.expires_at_ms,
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
        result: None,
    };
    decide(&args.server, request, "approved").await
}

/// `toolfleet reject`.
pub(crate) async fn reject(args: RejectArgs) -> anyhow::Result<ExitCode> {
    let request = v1::DecideCallRequest {
        job_id: args.job_id,
        call_id: args.call_id,
        decision: v1::Decision::Reject.into(),
        reason: args.reason,
        arguments: None,
        result: None,
    };
    decide(&args.server, request, "rejected").await
}

/// `toolfleet resolve`.
pub(crate) async fn resolve(args: ResolveArgs) -> anyhow::Result<ExitCode> {
    let (decision, word) = match args.verdict {
        Verdict::Applied => (v1::Decision::Applied, "resolved as applied"),
        Verdict::NotApplied => (
            v1::Decision::NotApplied,
            "resolved as not applied (it runs again)",
        ),
        Verdict::Fail => (v1::Decision::Fail, "failed"),
    };
    let request = v1::DecideCallRequest {
        job_id: args.job_id,
        call_id: args.call_id,
        decision: decision.into(),
        reason: args.reason,
        arguments: None,
        result: args.result,
    };
    decide(&args.server, request, word).await
}

async fn decide(
    server: &Server,
    request: v1::DecideCallRequest,
    word: &str,
) -> anyhow::Result<ExitCode> {
    let mut client = server.connect().await?;
    let (job_id, call_id) = (request.job_id.clone(), request.call_id.clone());
    client
        .decide_call(request)
        .await
        .map_err(|status| rpc_error("DecideCall", &status))?;
    outln!("call {call_id} of job {job_id} {word}; follow it with: toolfleet watch {job_id}")?;
    Ok(ExitCode::SUCCESS)
}
