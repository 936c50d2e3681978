//! What one server's allow-listed tools are in the worker, after each
//! `tools/list`: served (with the manifest of that listing), not offered by
//! the server, or refused. Each listing is applied to the worker's
//! [`ToolSet`]; a tool's state is logged when it changes, not at each
//! listing, so that a server that lists often (or floods
//! `notifications/tools/list_changed`) costs no log lines.

use std::collections::HashMap;
use std::sync::Arc;

use rmcp::model::Tool as McpToolInfo;
use tracing::{error, info, warn};

use super::server::McpServer;
use super::tool::McpTool;
use crate::tool_set::ToolSet;

/// What an allow-listed tool is after a listing.
#[derive(Debug, Clone, PartialEq)]
enum State {
    Served,
    /// The server does not list it.
    Absent,
    /// Listed, but its description cannot be served; why.
    Refused(String),
}

/// One server's allow-listed tools in the worker.
pub(super) struct Listing {
    server: Arc<McpServer>,
    /// (MCP name, fleet name) of each tool.
    tools: Vec<(String, String)>,
    served: ToolSet,
    /// By fleet name, as of the last listing.
    states: HashMap<String, State>,
}

impl Listing {
    /// The `tools` ((MCP name, fleet name) pairs) of `server`, none listed
    /// yet, served in `served`.
    pub(super) fn new(
        server: Arc<McpServer>,
        tools: Vec<(String, String)>,
        served: ToolSet,
    ) -> Self {
        Self {
            server,
            tools,
            served,
            states: HashMap::new(),
        }
    }

    /// Applies the server's listing `listed`: each allow-listed tool it
    /// lists is served with its manifest (new or changed), each other one
    /// is down.
    pub(super) fn apply(&mut self, listed: &[McpToolInfo]) {
        for (mcp_name, fleet_name) in &self.tools {
            let state = match listed.iter().find(|tool| tool.name == mcp_name.as_str()) {
                None => State::Absent,
                Some(info) => McpTool::new(self.server.clone(), fleet_name.clone(), info)
                    .and_then(|tool| self.served.offer(tool).map_err(|err| err.to_string()))
                    .map_or_else(State::Refused, |()| State::Served),
            };
            if state != State::Served {
                self.served.take_down(std::slice::from_ref(fleet_name));
            }
            let before = self.states.insert(fleet_name.clone(), state.clone());
            if before.as_ref() != Some(&state) {
                self.log(mcp_name, fleet_name, &state, before.is_some());
            }
        }
    }

    /// Takes every tool down: the server is gone.
    pub(super) fn take_all_down(&self) {
        let names: Vec<String> = self.tools.iter().map(|(_, fleet)| fleet.clone()).collect();
        self.served.take_down(&names);
    }

    fn log(&self, mcp_name: &str, fleet_name: &str, state: &State, listed_before: bool) {
        let server = &self.server.options().name;
        match state {
            State::Served if listed_before => {
                info!(
                    server,
                    tool = mcp_name,
                    fleet_name,
                    "the MCP server offers this tool again; served"
                );
            }
            State::Served => info!(server, tool = mcp_name, fleet_name, "MCP tool served"),
            State::Absent if listed_before => {
                warn!(
                    server,
                    tool = mcp_name,
                    fleet_name,
                    "the MCP server no longer offers this tool; withdrawn until it does"
                );
            }
            State::Absent => {
                warn!(
                    server,
                    tool = mcp_name,
                    fleet_name,
                    "the MCP server does not offer this tool; served once it does"
                );
            }
            State::Refused(why) => {
                error!(server, tool = mcp_name, fleet_name, why, "MCP tool refused")
            }
        }
    }
}
