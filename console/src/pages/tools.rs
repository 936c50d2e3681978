//! The tools page: what the tenant's jobs may use, and the live workers
//! behind each (`ListTools`, as the person's token sees it). To an
//! operator or a reader, the API also tells the fleet's details (decision
//! 0052): the pools serving each tool, its calls waiting, the workers that
//! cannot run it, the tools no live worker can run now, and the MCP servers
//! the tools come from, each up or down. Everyone sees a tool's circuit
//! breaker when it is open or half-open.

use std::collections::BTreeMap;

use askama::Template;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use toolfleet_proto::v1;

use super::{Chrome, html, pretty};
use crate::session::Session;
use crate::{Console, as_person, web};

/// One tool, as shown.
struct Shown {
    name: String,
    description: String,
    version: String,
    workers: u32,
    /// Live workers that serve it but cannot run it now.
    unavailable: u32,
    /// Whether a job may be offered it.
    available: bool,
    /// Its pools, comma separated; empty when none is said.
    pools: String,
    /// Its calls waiting, or `unknown`.
    waiting: String,
    mcp_server: String,
    /// What its circuit breaker says, when it is not closed: why the
    /// models are not offered it; empty otherwise.
    breaker: String,
    effects: String,
    approval: String,
    timeout: String,
    attempts: u32,
    strict: bool,
    parameters: String,
}

/// An MCP server the tools come from.
#[derive(Debug, PartialEq)]
struct Server {
    name: String,
    /// Its tools, by name.
    tools: Vec<String>,
    /// Whether some live worker can run its tools.
    up: bool,
}

#[derive(Template)]
#[template(path = "tools.html")]
struct Tools<'a> {
    chrome: Chrome<'a>,
    tools: Vec<Shown>,
    servers: Vec<Server>,
    /// Whether the person sees the fleet's details (operator or reader).
    fleet: bool,
}

pub(crate) async fn tools(State(console): State<Console>, session: Session) -> Response {
    // The API tells the fleet's details, and the unavailable tools, only to
    // an operator or a reader; it ignores the ask for anyone else.
    let ask = v1::ListToolsRequest {
        include_unavailable: true,
    };
    let listed = match console.api().list_tools(as_person(&session, ask)).await {
        Ok(listed) => listed.into_inner(),
        Err(failed) => return web::api_failed(&failed),
    };
    let mut tools: Vec<Shown> = listed.tools.iter().map(shown).collect();
    tools.sort_by(|a, b| a.name.cmp(&b.name));
    let page = Tools {
        chrome: Chrome {
            who: Some(&session),
            open: console.open,
        },
        tools,
        servers: servers(&listed.tools),
        fleet: session.has("operator") || session.has("reader"),
    };
    html(&page).into_response()
}

fn shown(tool: &v1::Tool) -> Shown {
    Shown {
        name: tool.name.clone(),
        description: tool.description.clone(),
        version: tool.version.clone(),
        workers: tool.workers,
        unavailable: tool.workers_unavailable,
        available: tool.available,
        pools: tool.pools.join(", "),
        waiting: tool
            .calls_waiting
            .map_or_else(|| "unknown".to_owned(), |n| n.to_string()),
        mcp_server: tool.mcp_server.clone(),
        breaker: breaker_note(&tool.breaker).to_owned(),
        effects: tool.effects.clone(),
        approval: tool.approval.clone(),
        timeout: format!("{} s", tool.timeout_ms as f64 / 1000.0),
        attempts: tool.max_attempts,
        strict: tool.strict,
        parameters: pretty(&tool.parameters),
    }
}

/// What the page says of a tool's circuit breaker (docs/protection.md).
fn breaker_note(state: &str) -> &'static str {
    match state {
        "open" => "breaker open: too many of its recent calls failed; no job is offered it for now",
        "half_open" => "breaker half-open: one call probes whether it recovered",
        _ => "",
    }
}

/// Every MCP server a tool names, by name, with its tools: up when a live
/// worker can run any of them, else down.
fn servers(tools: &[v1::Tool]) -> Vec<Server> {
    let mut servers: BTreeMap<&str, Server> = BTreeMap::new();
    for tool in tools.iter().filter(|tool| !tool.mcp_server.is_empty()) {
        let server = servers.entry(&tool.mcp_server).or_insert_with(|| Server {
            name: tool.mcp_server.clone(),
            tools: Vec::new(),
            up: false,
        });
        server.tools.push(tool.name.clone());
        server.up |= tool.available && tool.workers > 0;
    }
    servers
        .into_values()
        .map(|mut server| {
            server.tools.sort();
            server
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_is_up_while_a_live_worker_can_run_one_of_its_tools() {
        let tool = |name: &str, server: &str, workers, available| v1::Tool {
            name: name.into(),
            mcp_server: server.into(),
            workers,
            available,
            ..Default::default()
        };
        let tools = [
            tool("crm__update", "crm", 0, false),
            tool("crm__find", "crm", 1, true),
            tool("web__add", "web", 0, false),
            // Queued for a pool scaled to zero: nothing runs it now.
            tool("docs__search", "docs", 0, true),
            tool("calculate", "", 2, true),
        ];
        let server = |name: &str, tools: &[&str], up| Server {
            name: name.into(),
            tools: tools.iter().map(|&t| t.to_owned()).collect(),
            up,
        };
        assert_eq!(
            servers(&tools),
            [
                server("crm", &["crm__find", "crm__update"], true),
                server("docs", &["docs__search"], false),
                server("web", &["web__add"], false),
            ]
        );
    }

    #[test]
    fn a_breaker_is_said_only_when_it_is_not_closed() {
        for state in ["", "closed", "shut"] {
            assert_eq!(breaker_note(state), "", "{state}");
        }
        assert!(breaker_note("open").starts_with("breaker open: "));
        assert!(breaker_note("half_open").starts_with("breaker half-open: "));
    }
}
