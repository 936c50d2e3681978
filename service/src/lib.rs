#![warn(missing_docs)]
//! The plumbing every toolfleet service process shares, written once so the
//! orchestrator and the worker cannot drift apart (and so the orchestrator
//! never links the worker's tools to get it):
//!
//! - [`config`]: layered options (defaults < TOML < `TOOLFLEET_*` < flags),
//!   the connection, log and metrics sections, URL redaction;
//! - [`connect`]: NATS and Redis connections with the settings both sides need;
//! - [`pull`]: one pull request to a shared consumer, read until a stop;
//! - [`drain`]: the bounded steps of a drain after a stop;
//! - [`queue`]: every JetStream object (work queues, shared consumers, the
//!   registry bucket), and the setup step that creates them;
//! - [`reload`]: reference files held in memory, reloaded when they change;
//! - [`binary`]: a binary's `main` around its options: print-config, logging,
//!   metrics, signals and exit codes;
//! - [`telemetry`]: the tracing subscriber and the Prometheus endpoint;
//! - [`traces`]: OpenTelemetry: one trace per job across every process;
//! - [`signals`]: SIGTERM/SIGINT into a cancellation, a second one exits;
//! - [`identity`]: default replica ids; [`clock`]: Unix milliseconds.
//!
//! The contracts themselves (wire types, names) are in `toolfleet-proto`.

pub mod binary;
pub mod clock;
pub mod config;
pub mod connect;
pub mod drain;
pub mod identity;
mod otlp;
pub mod pull;
pub mod queue;
mod redis_connection;
pub mod reload;
pub mod signals;
pub mod telemetry;
pub mod traces;
