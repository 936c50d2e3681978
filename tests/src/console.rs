//! The web console (`toolfleet console`) as the console's tests start it:
//! over HTTP (tests/tests/console.rs) and in a browser
//! (tests/tests/console_browser.rs).

use std::time::Duration;

use crate::{ChildProcess, cargo_bin};

/// How long the console has to say it serves.
const READY: Duration = Duration::from_secs(30);

/// Spawns `toolfleet console` in front of the orchestrator at `addr`
/// (`http://...`), keeping its sessions in the Redis at `redis`, listening
/// on `listen`, with `flags` too; not waited for ([`start`] is).
///
/// # Errors
///
/// The binary is missing or cannot be started.
pub fn spawn(
    addr: &str,
    redis: &str,
    listen: &str,
    flags: &[&str],
) -> anyhow::Result<ChildProcess> {
    let mut args = vec![
        "console",
        "--addr",
        addr,
        "--listen",
        listen,
        "--redis-url",
        redis,
    ];
    args.extend_from_slice(flags);
    ChildProcess::spawn(
        "console",
        cargo_bin("toolfleet")?,
        args,
        std::iter::empty::<(&str, &str)>(),
    )
}

/// [`spawn`], returned once the console says where it serves.
///
/// # Errors
///
/// It cannot be started, or does not say so in time.
pub async fn start(
    addr: &str,
    redis: &str,
    listen: &str,
    flags: &[&str],
) -> anyhow::Result<ChildProcess> {
    let console = spawn(addr, redis, listen, flags)?;
    console
        .wait_for_log("toolfleet console: http://", READY)
        .await?;
    Ok(console)
}
