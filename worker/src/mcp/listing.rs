//! What one server's allow-listed tools are in the worker, after each
//! `tools/list`: served (with the manifest of that listing), not offered by
//! the server, or refused. Each listing is applied to the worker's
//! [`ToolSet`]; a tool's state is logged when it changes, not at each
//! listing, so that a server that lists often (or floods
//! `notifications/tools/list_changed`) costs no log lines.
//!
//! A listing is bounded ([`Bounds`]): a server that pages forever, or lists
//! more tools or bytes than the worker will hold, costs at most the bounds,
//! and is given up on.

use std::collections::HashMap;
use std::sync::Arc;

use rmcp::model::Tool as McpToolInfo;
use tracing::{error, info, warn};

use super::config::Bounds;
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

/// What the pages of one listing read so far add up to.
#[derive(Debug, Default)]
pub(super) struct Tally {
    pages: usize,
    tools: usize,
    bytes: usize,
}

impl Tally {
    /// One more page of `tools` tools in `bytes` bytes, within `bounds`.
    ///
    /// # Errors
    ///
    /// The bound it would pass: its key, and its value.
    pub(super) fn add(
        &mut self,
        tools: usize,
        bytes: usize,
        bounds: &Bounds,
    ) -> Result<(), String> {
        let next = Self {
            pages: self.pages + 1,
            tools: self.tools.saturating_add(tools),
            bytes: self.bytes.saturating_add(bytes),
        };
        let past = if next.pages > bounds.pages {
            Some(("max_listed_pages", bounds.pages, "pages"))
        } else if next.tools > bounds.tools {
            Some(("max_listed_tools", bounds.tools, "tools"))
        } else if next.bytes > bounds.bytes {
            Some(("max_listed_bytes", bounds.bytes, "bytes"))
        } else {
            None
        };
        if let Some((key, limit, unit)) = past {
            return Err(format!("its tools/list goes past {key} ({limit} {unit})"));
        }
        *self = next;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_stops_at_the_first_bound_it_would_pass() {
        let bounds = Bounds {
            pages: 3,
            tools: 10,
            bytes: 1_000,
        };
        /// A page: (tools, bytes).
        type Page = (usize, usize);
        // (pages so far, the next page) -> the bound passed
        let table: [(&[Page], Page, Option<&str>); 7] = [
            (&[], (10, 1_000), None),
            (&[(1, 1), (1, 1)], (1, 1), None),
            (
                &[(1, 1), (1, 1), (1, 1)],
                (0, 0),
                Some("max_listed_pages (3 pages)"),
            ),
            (&[(6, 10)], (5, 10), Some("max_listed_tools (10 tools)")),
            (&[(1, 600)], (1, 401), Some("max_listed_bytes (1000 bytes)")),
            (&[], (11, 2_000), Some("max_listed_tools (10 tools)")),
            (
                &[],
                (usize::MAX, usize::MAX),
                Some("max_listed_tools (10 tools)"),
            ),
        ];
        for (before, page, expected) in table {
            let mut tally = Tally::default();
            for (tools, bytes) in before {
                tally
                    .add(*tools, *bytes, &bounds)
                    .expect("within the bounds");
            }
            let result = tally.add(page.0, page.1, &bounds);
            match expected {
                None => assert!(result.is_ok(), "{before:?} + {page:?}: {result:?}"),
                Some(bound) => {
                    let why = result.expect_err("past a bound");
                    assert!(why.contains(bound), "{before:?} + {page:?}: {why}");
                }
            }
        }
    }
}
