//! The toolfleet orchestrator: the gRPC API, the model loop and the dispatch
//! of tool calls to the worker fleet.
//!
//! - `api`: `toolfleet.v1.AgentService`, a thin adapter over the store and the queue;
//!   [`auth`] says who each caller is (bearer tokens to tenants), and
//!   `quota` what each tenant may use at once.
//! - `runner`: takes jobs from JetStream and runs the model loop, resumable
//!   from Redis at every step.
//! - `dispatch`: checks, publishes and gathers one turn's tool calls, with
//!   retries.
//! - `model`: the provider-neutral conversation and the providers
//!   (OpenAI Responses, OpenAI Chat Completions, Anthropic Messages,
//!   scripted).
//! - [`budget`]: what a job, and its tenant per hour and day, may spend on
//!   model tokens, tool cost units, tool calls and job time; `spend`: a
//!   run's view of both, asked before every turn and attempt.
//! - [`approval`]: which calls a person must approve (the typed rules);
//!   [`hold`]: a held call, its decisions and its fate (a pure function);
//!   `publish`: every publish to JetStream, through a stream leader's
//!   election.
//! - [`setup`]: `toolfleet-orchestrator setup`, the one privileged step that
//!   makes every JetStream object of the fleet; [`credentials`]:
//!   `toolfleet-orchestrator credentials`, a new pool's passwords and hashes.
//! - [`job`]: the job as every module shares it: spec, conversation items,
//!   record, lease, ending, ids and the clock.
//! - [`store`]: jobs, items, events and leases in Redis, written in verbs;
//!   [`live`]: what watchers hear of a job as it happens (wake-ups after
//!   its writes, its streamed turn's deltas), on the bus.
//! - `registry`: the live tools announced by workers; `backlog` reports
//!   each tool's workers and waiting calls as gauges.
//! - `shaping`: a result too large to show whole, shown as a view within
//!   its limit and paged with `read_result`, the orchestrator's own tool;
//!   `result_cache`: which calls a read-only tool's earlier result may
//!   answer, across the jobs of a tenant, and under which key.
//! - `breaker`: a tool whose calls keep failing is left out of the
//!   models' turns and its calls refused, for a cool-down (the policy; its
//!   state is in Redis, shared by every replica).
//! - `spans`: the OpenTelemetry spans of a job's steps.
//! - `server`: wires a replica together; [`config`] and `metrics`
//!   around it (the plumbing it shares with the worker is `toolfleet-service`).

pub(crate) mod api;
pub mod approval;
pub mod auth;
pub(crate) mod backlog;
pub mod breaker;
pub mod budget;
pub mod config;
pub mod credentials;
pub(crate) mod dispatch;
#[cfg(fuzzing)]
#[doc(hidden)]
pub mod fuzzing;
pub mod hold;
pub mod job;
pub mod live;
pub(crate) mod metrics;
pub(crate) mod model;
pub(crate) mod publish;
pub(crate) mod quota;
pub(crate) mod registry;
pub(crate) mod result_cache;
pub(crate) mod runner;
pub(crate) mod server;
pub mod setup;
pub(crate) mod shaping;
pub(crate) mod spans;
pub(crate) mod spend;
pub mod store;

pub use config::OrchestratorOptions;
pub use model::scripted::Scripted;
pub use server::Orchestrator;
