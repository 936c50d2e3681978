//! A whole toolfleet on this machine, for `toolfleet dev`, the bench and
//! the tests: the one place that starts servers and services locally.
//!
//! - [`FleetBuilder`]: the one way to describe a fleet (one server of each
//!   or clusters, its workers and what they serve) and start it, in-process
//!   or as processes.
//! - [`local`]: the [`LocalFleet`](local::LocalFleet): the servers as child
//!   processes, an orchestrator and workers in this process (`toolfleet
//!   dev`, `toolfleet bench` without `--processes`).
//! - [`processes`]: the [`ProcessFleet`](processes::ProcessFleet): every
//!   service a process of its own (`toolfleet bench --processes`, the
//!   tests).
//! - [`servers`]: a fleet's NATS and Redis, one server or a cluster each,
//!   started together as a [`ServersSpec`](servers::ServersSpec) says.
//! - [`supervisor`]: nats-server, redis-server (single or clusters) and
//!   other programs as child processes with a scratch dir and a log, killed
//!   on drop; also the certificates of a fleet over TLS and an OTLP
//!   collector.

mod builder;
pub mod local;
pub mod processes;
pub mod servers;
mod spec;
pub mod supervisor;

pub use builder::FleetBuilder;
pub use spec::{Env, Serving};
