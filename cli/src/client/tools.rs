//! `toolfleet tools`: the tools the live workers serve; to an operator or
//! a reader, with their pools, calls waiting and MCP servers.

use std::process::ExitCode;

use clap::Args;
use toolfleet_proto::v1;

use super::connection::{Server, rpc_error};
use crate::output::{out, outln};
use crate::transcript;

#[derive(Debug, Args)]
pub(crate) struct ToolsArgs {
    #[command(flatten)]
    server: Server,
    /// Print the tools as JSON, schemas included.
    #[arg(long)]
    json: bool,
    /// Exit 1, naming each, unless every one of these tools is served by
    /// at least one live worker (a check for scripts and `helm test`).
    #[arg(long, value_name = "TOOL,...", value_delimiter = ',')]
    require: Vec<String>,
    /// Also list the tools no live worker can run now (their MCP server is
    /// down). Needs the role operator or reader; ignored otherwise.
    #[arg(long)]
    include_unavailable: bool,
}

/// `toolfleet tools`.
pub(crate) async fn tools(args: ToolsArgs) -> anyhow::Result<ExitCode> {
    let mut client = args.server.connect().await?;
    let mut tools = client
        .list_tools(v1::ListToolsRequest {
            include_unavailable: args.include_unavailable,
        })
        .await
        .map_err(|status| rpc_error("ListTools", &status))?
        .into_inner()
        .tools;
    tools.sort_by(|a, b| a.name.cmp(&b.name));
    if args.json {
        outln!("{}", transcript::tools_json(&tools))?;
    } else if tools.is_empty() {
        eprintln!(
            "no live tools: no worker announces any; start workers (toolfleet-worker), \
             or a whole local fleet with toolfleet dev --serve"
        );
    } else {
        out!("{}", transcript::tools_table(&tools))?;
    }
    let unserved = unserved(&tools, &args.require);
    if unserved.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!("not served: {}", unserved.join(", "));
    Ok(ExitCode::FAILURE)
}

/// Each of `required` that no live worker serves, and why.
fn unserved(tools: &[v1::Tool], required: &[String]) -> Vec<String> {
    required
        .iter()
        .filter_map(|name| match tools.iter().find(|tool| &tool.name == name) {
            None => Some(format!("{name} (no worker announces it)")),
            Some(tool) if !tool.available => Some(format!("{name} (no live worker can run it)")),
            Some(tool) if tool.workers == 0 => Some(format!("{name} (0 workers)")),
            Some(_) => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_required_tool_is_served_only_by_a_live_worker() {
        let tool = |name: &str, workers| v1::Tool {
            name: name.into(),
            workers,
            available: true,
            ..Default::default()
        };
        let live = [tool("calculate", 2), tool("factual_qa", 0)];
        let required = ["calculate", "factual_qa", "route_plan"].map(String::from);
        assert_eq!(
            unserved(&live, &required),
            [
                "factual_qa (0 workers)",
                "route_plan (no worker announces it)"
            ]
        );
        assert!(unserved(&live, &required[..1]).is_empty());
        assert!(unserved(&live, &[]).is_empty());
    }
}
