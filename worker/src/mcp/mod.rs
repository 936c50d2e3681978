//! MCP servers as tool sources (decision 0038, docs/tools/mcp.md): each
//! configured server's allow-listed tools are served as fleet tools, under
//! fleet names ([`fleet_name`]), with the server's schema, its annotations
//! mapped to [`Effects`](toolfleet_proto::Effects), and each call sent as
//! `tools/call` with the queue, ledger, retries and envelopes of any tool.
//!
//! - [`config`]: the `[[mcp.servers]]` keys, checked before connecting;
//! - `names`: the documented mapping from MCP names to fleet names;
//! - `server`: one server's process or endpoint, connection and calls;
//! - `supervisor`: reaching it, listing its tools, following the
//!   connection until it fails, and reaching it again;
//! - `listing`: what its allow-listed tools are in the worker, after each
//!   `tools/list`;
//! - `tool`: a server's tool as a fleet tool (its manifest);
//! - `results`: what a server's answer becomes for the model;
//! - `sandbox`: what a stdio server may reach of the worker;
//! - `stdio`: a stdio server's process and lines, read within bounds;
//! - `http`: a Streamable HTTP server's transport, its answers read within
//!   bounds;
//! - `defect`: why a call got no answer, as its connection found;
//! - `task`: a server's task (MCP Tasks), and what each of its states
//!   means for the call that follows it.

pub mod config;
mod defect;
mod http;
mod listing;
mod names;
mod results;
mod sandbox;
mod server;
mod stdio;
mod supervisor;
mod task;
mod tool;

use tokio_util::sync::CancellationToken;
use tracing::error;

use crate::tool_set::ToolSet;
pub use config::{EnvValue, McpApproval, McpOptions, McpServerOptions, Secret};
pub use names::fleet_name;
pub use results::{INPUT_REQUIRED, TOOL_ERROR};
pub use sandbox::{Sandbox, SandboxMode, make_the_worker_undumpable};
pub use server::McpServer;
pub use tool::{McpTool, effects_of_hints, is_strict};

/// What the worker gives each of its MCP servers.
#[derive(Clone)]
pub struct McpHost {
    /// Where a stdio server starts.
    pub sandbox: Sandbox,
    /// The largest output of a tool (`runtime.max_output_bytes`): an
    /// answer much larger is not read (decision 0043).
    pub max_output_bytes: usize,
}

/// Serves, in `tools`, the tools of the servers of `options` that
/// `selected` names (every one when `selected` is empty). Each is declared
/// at once, down, so that the worker serves its other tools without
/// waiting; each server is started or reached in the background, tried
/// again with a growing pause until it answers, and then supervised until
/// `end` (after the worker's drain, so that calls in flight finish). A tool
/// is up while its server answers and lists it, with the manifest of its
/// latest listing. A tool whose fleet name is one of `taken` (the worker's
/// other tools) is left out, with an error naming the server and the tool.
/// Stdio servers start in `host`'s sandbox.
pub fn serve(
    options: &McpOptions,
    host: &McpHost,
    selected: &[String],
    taken: &[String],
    tools: &ToolSet,
    end: &CancellationToken,
) {
    for server_options in &options.servers {
        let server = &server_options.name;
        // Checked with the configuration: a name that cannot map was refused.
        let names = server_options.fleet_names().unwrap_or_default();
        let wanted: Vec<(String, String)> = names
            .into_iter()
            .filter(|(_, fleet)| selected.is_empty() || selected.contains(fleet))
            .filter(|(mcp_name, fleet_name)| {
                let clash = taken.contains(fleet_name);
                if clash {
                    error!(server, tool = %mcp_name, fleet_name, "MCP tool refused: the worker has another tool of that name; give the server another prefix");
                }
                !clash
            })
            .collect();
        if wanted.is_empty() {
            continue;
        }
        for (_, fleet_name) in &wanted {
            tools.declare_from(fleet_name, server);
        }
        let server = McpServer::new(server_options.clone(), host.clone());
        tokio::spawn(server.run(wanted, tools.clone(), end.clone()));
    }
}
