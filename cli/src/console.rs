//! `toolfleet console`: the web console (crate `toolfleet-console`) in
//! front of an orchestrator.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;

use crate::client::Server;

/// Serve the web console.
#[derive(Debug, Args)]
pub(crate) struct ConsoleArgs {
    #[command(flatten)]
    server: Server,
    /// Where the console listens (HTTP). Put TLS in front of it on a
    /// network: its session cookie is sent only over secure connections
    /// (a browser counts localhost as one).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// The Redis the sessions live in: the fleet's, as the console's own
    /// user (docs/console.md).
    #[arg(
        long,
        env = "TOOLFLEET_CONSOLE_REDIS_URL",
        hide_env_values = true,
        value_name = "URL"
    )]
    redis_url: String,
    /// The prefix of its Redis keys: the fleet's `store.key_prefix`.
    #[arg(long, value_name = "PREFIX", default_value = "tf:")]
    key_prefix: String,
    /// How long a session lasts before its person signs in again.
    #[arg(long, value_name = "DURATION", default_value = "8h", value_parser = humantime::parse_duration)]
    session_ttl: Duration,
}

pub(crate) async fn run(args: ConsoleArgs) -> anyhow::Result<ExitCode> {
    let channel = args.server.channel().await?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    eprintln!(
        "toolfleet console: http://{}/ (sign in with a token of your tenant)",
        listener.local_addr()?
    );
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn(crate::watch_signals(stop.clone()));
    let options = toolfleet_console::ConsoleOptions {
        redis_url: args.redis_url,
        key_prefix: args.key_prefix,
        session_ttl: args.session_ttl,
    };
    toolfleet_console::serve(channel, options, listener, stop.cancelled_owned()).await?;
    Ok(ExitCode::SUCCESS)
}
