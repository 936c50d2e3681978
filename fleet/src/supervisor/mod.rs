//! The process supervisor: `nats-server`, `redis-server` and other programs as
//! child processes on loopback ports, each with a scratch dir and one log
//! file, waited on with probes and killed on drop. `toolfleet dev` and
//! `toolfleet bench` run their servers with it, and the test harness
//! (`toolfleet-tests`) is built on it.
//!
//! - [`NatsServer`]: a `nats-server` with JetStream on a port it picks itself.
//! - [`NatsCluster`]: nats-servers routed into one cluster, each a
//!   [`NatsServer`] that can be killed and restarted.
//! - [`RedisServer`]: a `redis-server` on a free port, optionally with an
//!   append-only file ([`RedisConfig`]) so data survives a restart.
//! - [`RedisCluster`]: redis-servers formed into a Redis Cluster, primaries
//!   and replicas, each a [`RedisServer`].
//! - [`ChildProcess`]: any other program, usually a workspace binary found with
//!   [`cargo_bin`]; its log can be waited on.
//! - [`wait_until`]: polls a condition up to a deadline; readiness is always a
//!   probe, never a sleep. [`log_tail_report`] frames a log's last lines for
//!   an error to carry.
//! - [`ServerOptions`]: where a server's dir goes, its process group, whether
//!   its log is printed on drop, how long it may take to start. The defaults
//!   are the tests'.
//! - [`certificates`]: a CA, server and client certificates for a fleet
//!   with TLS (`toolfleet bench --tls`, the TLS tests; made with the `tls`
//!   feature).
//! - `otlp::Collector`: an OTLP trace collector (gRPC and HTTP) in the
//!   process, for the trace tests and `toolfleet bench --trace-ratio` (the
//!   `otlp` feature).
//! - [`KillHandle`]: kills a process from any thread without owning it, for a
//!   signal handler that exits without running destructors.
//! - [`Reaper`]: a watchdog process that kills the servers and removes the
//!   dir when its parent dies without running any code (`kill -9`).
//!
//! By default every process runs in its own temp dir with one log file.
//! Dropping it kills the process, prints the log's last 50 lines to stderr
//! (shown by the test runner when the test fails) and removes the dir, unless
//! `TOOLFLEET_TEST_KEEP=1`. `toolfleet dev` puts its servers' dirs in its own
//! temp dir instead, in a process group of their own, and prints no logs.
//! Servers bind 127.0.0.1 only, so they never clash with a machine's own NATS
//! or Redis on the default ports.

pub mod certificates;
mod nats_cluster;
mod nats_server;
#[cfg(feature = "otlp")]
pub mod otlp;
mod process;
pub mod reaper;
mod redis_cluster;
mod redis_server;
mod wait;

pub use nats_cluster::{NatsCluster, StreamCopies};
pub use nats_server::{JETSTREAM_SYNC_ALWAYS, NatsServer};
pub use process::{ChildProcess, KillHandle, LogMark, ServerOptions, cargo_bin, log_tail_report};
pub use reaper::Reaper;
pub use redis_cluster::RedisCluster;
pub use redis_server::{RedisConfig, RedisServer, RedisTls};
pub use wait::{Outcome, wait_until};

/// A loopback port the kernel considers free right now. Another process can
/// take it before whoever it is for binds it: a server started on it must
/// retry then ([`RedisServer::start_with`] does).
///
/// # Errors
///
/// No port could be reserved.
pub fn free_port() -> anyhow::Result<u16> {
    use anyhow::Context as _;
    let listener =
        std::net::TcpListener::bind("127.0.0.1:0").context("cannot reserve a loopback port")?;
    Ok(listener.local_addr()?.port())
}

/// The gRPC URL (`http://<address>`) in a line an orchestrator logged with
/// its address (`grpc=<address>`, or a `grpc` field in JSON: "grpc
/// listening", "orchestrator ready").
pub fn logged_grpc_url(line: &str) -> Option<String> {
    // `log.format = "json"` writes the field as `"grpc":"<address>"`.
    let address = match serde_json::from_str::<serde_json::Value>(line) {
        Ok(json) => json["fields"]["grpc"].as_str()?.to_owned(),
        Err(_) => line
            .split("grpc=")
            .nth(1)?
            .split_whitespace()
            .next()?
            .to_owned(),
    };
    Some(format!("http://{address}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grpc_url_is_read_from_the_orchestrators_line() {
        let ready = "INFO toolfleet_orchestrator::server: orchestrator ready instance=o-1 grpc=127.0.0.1:43127";
        assert_eq!(
            logged_grpc_url(ready).as_deref(),
            Some("http://127.0.0.1:43127")
        );
        let json = r#"{"level":"INFO","fields":{"message":"orchestrator ready","grpc":"127.0.0.1:43127"}}"#;
        assert_eq!(
            logged_grpc_url(json).as_deref(),
            Some("http://127.0.0.1:43127")
        );
        assert_eq!(logged_grpc_url("orchestrator ready instance=o-1"), None);
        assert_eq!(logged_grpc_url("grpc="), None);
    }
}
