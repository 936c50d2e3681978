//! `toolfleet call`: one tool call through the fleet, without a model (a
//! call job, docs/api.md): the call is queued, checked, approved when a
//! policy asks, retried and traced as a model's would be, and its envelope
//! is printed.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;
use serde_json::Value;
use toolfleet_proto::v1;

use crate::client::{self, Server};
use crate::output::outln;

/// Run one tool call through the fleet without a model, and print its
/// envelope as the model would see it: `{"ok": true, "data": ...}` or
/// `{"ok": false, "error": {...}}`. Exit status 0 when the call succeeded,
/// 3 when it (or its job) failed, 4 when the job was cancelled.
#[derive(Debug, Args)]
pub(crate) struct CallArgs {
    /// The tool, e.g. calculate.
    tool: String,
    /// Its arguments, a JSON object, e.g. '{"expression": "6*7"}'.
    #[arg(default_value = "{}")]
    arguments: String,
    /// Same key, same call: a repeat returns the first call's job.
    #[arg(long, value_name = "KEY")]
    idempotency_key: Option<String>,
    #[command(flatten)]
    server: Server,
}

/// `toolfleet call`.
pub(crate) async fn run(args: CallArgs) -> anyhow::Result<ExitCode> {
    serde_json::from_str::<serde_json::Map<String, Value>>(&args.arguments)
        .context("the arguments must be a JSON object, e.g. '{\"expression\": \"6*7\"}'")?;
    let mut api = args.server.connect().await?;
    let request = v1::SubmitJobRequest {
        call: Some(v1::ToolCallRequest {
            tool: args.tool,
            arguments: args.arguments,
        }),
        idempotency_key: args.idempotency_key.unwrap_or_default(),
        ..Default::default()
    };
    let job_id = client::submit_job(&mut api, request).await?.job_id;
    client::each_event(&mut api, &job_id, 0, |_| Ok(())).await?;
    let job = client::get_job(&mut api, &job_id).await?;
    if job.status() != v1::JobStatus::Succeeded {
        return Ok(client::exit_code(&job));
    }
    let envelope: Value = serde_json::from_str(&job.output_text)
        .with_context(|| format!("job {job_id}'s output is not an envelope"))?;
    outln!("{}", serde_json::to_string_pretty(&envelope)?)?;
    Ok(match envelope["ok"] {
        Value::Bool(true) => ExitCode::SUCCESS,
        _ => ExitCode::from(crate::EXIT_JOB_FAILED),
    })
}
