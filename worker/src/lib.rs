//! The toolfleet worker: executes whitelisted tool calls pulled from NATS
//! JetStream and answers each with an envelope.
//!
//! - [`tool`]: the [`Tool`] trait a tool implements, and the [`Toolbox`] of a worker.
//! - [`progress`]: how a running call reports how far it has come.
//! - [`tools`]: the built-in tools (`calculate`, `get_current_weather`, test tools).
//! - [`tool_set`]: the tools a worker serves, as their sources (MCP servers) change them.
//! - [`runtime`]: the [`Worker`]: pull calls, validate, claim, execute, reply, ack.
//! - `ledger`: the Redis claim and result records that make redelivery harmless.
//! - [`checkpoint`]: what a call saves to be resumed from, should its worker die.
//! - [`envelope`]: the one conversion from a tool failure to its envelope.
//! - [`mcp`]: MCP servers as tool sources (`[[mcp.servers]]`).
//! - [`registry`]: the heartbeat announcements of the worker's tools.
//! - [`binary`]: the `main` of a worker binary, this crate's and your own.
//! - [`config`], [`metrics`]: the process around it; the plumbing it shares
//!   with the orchestrator (connections, telemetry, signals) is [`service`].
#![warn(missing_docs)]

pub mod binary;
pub mod checkpoint;
pub mod config;
pub mod envelope;
#[cfg(fuzzing)]
#[doc(hidden)]
pub mod fuzzing;
mod ledger;
pub mod mcp;
pub mod metrics;
pub mod progress;
pub mod registry;
pub mod runtime;
pub mod tool;
pub mod tool_set;
pub mod tools;

pub use checkpoint::Checkpoint;
pub use config::WorkerOptions;
pub use runtime::{StartError, Worker};
pub use tool::{Applied, Tool, ToolContext, ToolError, Toolbox};
pub use toolfleet_proto::{Approval, Effects, ErrorCode, ToolManifest};
pub use toolfleet_service as service;
