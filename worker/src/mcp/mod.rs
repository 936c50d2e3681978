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

use tokio_util::sync::CancellationToken;
use tracing::{error, warn};

use crate::availability::Availability;
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
/// the tool. Each server is then supervised until `end` (after the
/// worker's drain, so that calls in flight finish): while it is down, its
/// tools are down in `availability`.
///
/// # Errors
///
/// `stop` came first.
pub async fn toolbox(
    options: &McpOptions,
    selected: &[String],
    taken: &[String],
    (availability, stop, end): (&Availability, &CancellationToken, &CancellationToken),
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
        let server = McpServer::new(server_options.clone(), availability.clone());
        let (client, listed) = stop
            .run_until_cancelled(server.connect_and_list())
            .await
            .ok_or("stopped while waiting for an MCP server")?;
        let mut served = Vec::new();
        for (mcp_name, fleet_name) in wanted {
            if let Some(tool) = served_tool(&server, (mcp_name, fleet_name), &listed, taken) {
                served.push(fleet_name.clone());
                toolbox = toolbox.with(tool);
            }
        }
        tokio::spawn(server.supervise(client, served, end.clone()));
    }
    Ok(toolbox)
}

/// The tool `mcp_name` of `server` as `fleet_name`, if the server lists it
/// and it can be served; else why not, logged.
fn served_tool(
    server: &Arc<McpServer>,
    (mcp_name, fleet_name): (&String, &String),
    listed: &[rmcp::model::Tool],
    taken: &[String],
) -> Option<McpTool> {
    let name = &server.options().name;
    if taken.contains(fleet_name) {
        error!(server = %name, tool = %mcp_name, fleet_name, "MCP tool refused: the worker has another tool of that name; give the server another prefix");
        return None;
    }
    let Some(info) = listed.iter().find(|tool| tool.name == mcp_name.as_str()) else {
        warn!(server = %name, tool = %mcp_name, "the MCP server does not offer this tool; not served");
        return None;
    };
    McpTool::new(server.clone(), fleet_name.clone(), info)
        .inspect_err(|why| error!(server = %name, tool = %mcp_name, why, "MCP tool refused"))
        .ok()
}
