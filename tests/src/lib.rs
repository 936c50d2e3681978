//! toolfleet's test harness: real processes, each owned by the test that started it.
//!
//! - [`NatsServer`]: a `nats-server` with JetStream on a port it picks itself.
//! - [`RedisServer`]: a `redis-server` on a free port, optionally with an
//!   append-only file ([`RedisConfig`]) so data survives a restart.
//! - [`ChildProcess`]: any other program, usually a workspace binary found with
//!   [`cargo_bin`]; its log can be waited on.
//! - [`fleet::Fleet`]: NATS, Redis and `toolfleet-worker` processes together,
//!   with helpers to publish calls and read their results.
//! - [`wait_until`]: polls a condition up to a deadline; readiness is always a
//!   probe, never a sleep.
//! - [`certificates::Certificates`]: a CA, server and client certificates
//!   generated at test time, for TLS.
//! - [`otlp::Collector`]: an OTLP trace collector in the test process.
//! - [`tally::Tally`]: each side-effecting call's answer held against its
//!   effect, so a fault test fails when the model was told something false.
//! - [`mcp`]: a fleet whose worker serves MCP servers.
//! - [`messages::MessagesServer`]: a fake of Anthropic's Messages API that
//!   refuses what the real one refuses and answers from a script.
//! - [`browser::Browser`]: Debian's Chromium, driven by a scenario of
//!   tests/console (puppeteer-core), for the web console's tests;
//!   [`console`]: the console itself, as they start it.
//!
//! All but the fleet are the process supervisor of `toolfleet dev`
//! ([`toolfleet_fleet::supervisor`]), re-exported here with its defaults, which
//! are the tests': every process runs in its own temp dir with one log file.
//! Dropping it kills the process, prints the log's last 50 lines to stderr
//! (shown by the test runner when the test fails) and removes the dir, unless
//! `TOOLFLEET_TEST_KEEP=1`. Servers bind 127.0.0.1 only, so they never clash
//! with a machine's own NATS or Redis on the default ports.

pub mod browser;
pub mod certificates;
pub mod console;
pub mod fleet;
pub mod identity;
pub mod markdown;
pub mod mcp;
pub mod messages;
pub mod snapshot;
pub mod tally;

pub use toolfleet_fleet::supervisor::otlp;
pub use toolfleet_fleet::supervisor::{
    ChildProcess, LogMark, NatsCluster, NatsServer, Outcome, RedisCluster, RedisConfig,
    RedisServer, RedisTls, ServerOptions, cargo_bin, free_port, wait_until,
};

use std::path::{Path, PathBuf};

/// `127.0.0.1:<port>`, with a port free right now: for a service's
/// `metrics.listen` and the like.
///
/// # Errors
///
/// No port could be reserved.
pub fn free_loopback_address() -> anyhow::Result<String> {
    Ok(format!("127.0.0.1:{}", free_port()?))
}

/// The repository's root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is in the repository")
        .to_owned()
}

/// Runs the `toolfleet` CLI under test as a user would (no
/// `TOOLFLEET_ADDR` of this environment, stdin closed) and returns what it
/// printed.
///
/// # Errors
///
/// It did not run, or ended with another status than 0 (the error has its
/// output).
pub async fn run_toolfleet(args: &[&str]) -> anyhow::Result<String> {
    let output = tokio::process::Command::new(cargo_bin("toolfleet")?)
        .args(args)
        .env_remove("TOOLFLEET_ADDR")
        .stdin(std::process::Stdio::null())
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    anyhow::ensure!(
        output.status.success(),
        "toolfleet {args:?}: {}\n{stdout}{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(stdout)
}

/// Builds the template of a worker of your own (`examples/custom-worker`),
/// a Cargo project of its own, as its user would (`cargo build --locked`),
/// in the workspace's target directory, where its dependencies are already
/// built: its binary, `orders-worker`, lands beside the workspace's. Two
/// tests building it at once wait for each other on Cargo's lock.
///
/// # Errors
///
/// The build failed, with Cargo's output.
pub async fn build_worker_template() -> anyhow::Result<PathBuf> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| repo_root().join("target"), PathBuf::from);
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let built = tokio::process::Command::new(cargo)
        .arg("build")
        .arg("--locked")
        .arg("--manifest-path")
        .arg(repo_root().join("examples/custom-worker/Cargo.toml"))
        .arg("--target-dir")
        .arg(&target)
        .output()
        .await?;
    anyhow::ensure!(
        built.status.success(),
        "cargo build of examples/custom-worker failed:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    Ok(target.join("debug/orders-worker"))
}

/// The Python of the venv that scripts/setup prepared, with the Python
/// client's gRPC packages and the deployment checks' packages
/// (`TOOLFLEET_PYTHON` overrides it).
///
/// # Errors
///
/// It is missing: scripts/setup was not run.
pub fn venv_python() -> anyhow::Result<PathBuf> {
    let path = std::env::var_os("TOOLFLEET_PYTHON")
        .map_or_else(|| repo_root().join(".tools/venv/bin/python"), PathBuf::from);
    anyhow::ensure!(
        path.is_file(),
        "{} not found: run scripts/setup (it installs the packages the tests use)",
        path.display()
    );
    Ok(path)
}

/// GETs `path` from `address` (`127.0.0.1:<port>`) over plain HTTP/1.0, as
/// a probe or a scraper does a service's metrics endpoint: the status code
/// and the body. Hand-written rather than an HTTP client crate: one request
/// of a known server, read to its end.
///
/// # Errors
///
/// Nothing listens, or the answer is not HTTP.
pub async fn http_get(address: &str, path: &str) -> anyhow::Result<(u16, String)> {
    http_get_with(address, path, &[]).await
}

/// Like [`http_get`], with `headers` (name, value) sent too.
///
/// # Errors
///
/// Nothing listens there, or the answer is not HTTP.
pub async fn http_get_with(
    address: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> anyhow::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(address).await?;
    let mut request = format!("GET {path} HTTP/1.0\r\nHost: {address}\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow::anyhow!("no HTTP response: {response}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no status in {head}"))?;
    Ok((status, body.to_owned()))
}
