//! A whole toolfleet on this machine, for `toolfleet dev`, the bench and
//! the tests: the one place that starts servers and services locally.
//!
//! - [`supervisor`]: nats-server, redis-server (single or clusters) and
//!   other programs as child processes with a scratch dir and a log, killed
//!   on drop; also the certificates of a fleet over TLS and an OTLP
//!   collector.
//! - [`servers`]: a fleet's NATS and Redis, one server or a cluster each,
//!   started together as a [`ServersSpec`](servers::ServersSpec) says.
//! - [`local`]: the [`LocalFleet`](local::LocalFleet): the servers as child
//!   processes, an orchestrator and workers in this process (`toolfleet
//!   dev`, `toolfleet bench` without `--processes`).

pub mod local;
pub mod servers;
pub mod supervisor;
