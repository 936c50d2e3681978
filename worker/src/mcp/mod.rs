//! MCP servers as tool sources (decision 0038, docs/tools/mcp.md): each
//! configured server's allow-listed tools are served as fleet tools, under
//! fleet names ([`fleet_name`]), with the server's schema, its annotations
//! mapped to [`Effects`](toolfleet_proto::Effects), and each call sent as
//! `tools/call` with the queue, ledger, retries and envelopes of any tool.
//!
//! - [`config`]: the `[[mcp.servers]]` keys, checked before connecting;
//! - `names`: the documented mapping from MCP names to fleet names;
//! - `server`: one server's process or endpoint, connection and calls;
//! - `tool`: a server's tool as a fleet tool (its manifest);
//! - `results`: what a server's answer becomes for the model.

pub mod config;
mod names;
mod results;
mod server;
mod tool;

use std::sync::Arc;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, warn};

use crate::tool::Toolbox;
pub use config::{EnvValue, McpApproval, McpOptions, McpServerOptions, Secret};
pub use names::fleet_name;
pub use results::{INPUT_REQUIRED, TOOL_ERROR};
pub use server::McpServer;
pub use tool::{McpTool, effects_of_hints, is_strict};

/// The tools of the servers of `options` that `selected` names (every one
/// when `selected` is empty), each server started or reached and its
/// tools listed first. A server that does not answer is tried again, with
/// a growing pause, until it does or `stop`. A tool that cannot be served
/// (its description refused, or its fleet name one of `taken`, the
/// worker's other tools) is left out with an error naming the server and
/// the tool.
///
/// # Errors
///
/// `stop` came first.
pub async fn toolbox(
    options: &McpOptions,
    selected: &[String],
    taken: &[String],
    stop: &CancellationToken,
) -> Result<Toolbox, &'static str> {
    let mut toolbox = Toolbox::new();
    for server_options in &options.servers {
        // Checked with the configuration: a name that cannot map was refused.
        let names = server_options.fleet_names().unwrap_or_default();
        let wanted: Vec<(&String, &String)> = names
            .iter()
            .filter(|(_, fleet)| selected.is_empty() || selected.contains(fleet))
            .collect();
        if wanted.is_empty() {
            continue;
        }
        let server = McpServer::new(server_options.clone());
        let listed = stop
            .run_until_cancelled(listed_when_up(&server))
            .await
            .ok_or("stopped while waiting for an MCP server")?;
        for (mcp_name, fleet_name) in wanted {
            if taken.contains(fleet_name) {
                error!(server = %server_options.name, tool = %mcp_name, fleet_name, "MCP tool refused: the worker has another tool of that name; give the server another prefix");
                continue;
            }
            let Some(info) = listed.iter().find(|tool| tool.name == mcp_name.as_str()) else {
                warn!(server = %server_options.name, tool = %mcp_name, "the MCP server does not offer this tool; not served");
                continue;
            };
            match McpTool::new(server.clone(), fleet_name.clone(), info) {
                Ok(tool) => toolbox = toolbox.with(tool),
                Err(why) => {
                    error!(server = %server_options.name, tool = %mcp_name, why, "MCP tool refused");
                }
            }
        }
    }
    Ok(toolbox)
}

/// The server's tools, once it answers.
async fn listed_when_up(server: &Arc<McpServer>) -> Vec<rmcp::model::Tool> {
    let backoff = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_secs(10))
        .with_jitter()
        .without_max_times();
    let list = || async { server.list_tools().await };
    let listed = list
        .retry(backoff)
        .notify(|why: &String, after| {
            warn!(server = %server.options().name, why, retry_in = ?after, "MCP server not answering");
        })
        .await;
    let tools = listed.unwrap_or_default();
    debug!(server = %server.options().name, tools = tools.len(), "MCP server listed its tools");
    tools
}
