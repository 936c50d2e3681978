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
    /// Sign people in with this OpenID provider (its issuer), by the
    /// authorization code flow with PKCE, beside tokens. The orchestrators
    /// must trust it (api.identity.issuers).
    #[arg(long, value_name = "URL", requires_all = ["oidc_client_id", "oidc_redirect_url"])]
    oidc_issuer: Option<String>,
    /// The console's client id at the provider.
    #[arg(long, value_name = "ID", requires = "oidc_issuer")]
    oidc_client_id: Option<String>,
    /// A file holding the console's client secret, for a confidential
    /// client; without it, a public client (PKCE alone).
    #[arg(long, value_name = "FILE", requires = "oidc_issuer")]
    oidc_client_secret_file: Option<std::path::PathBuf>,
    /// The console's callback URL as registered at the provider:
    /// `https://<console>/oidc/callback`.
    #[arg(long, value_name = "URL", requires = "oidc_issuer")]
    oidc_redirect_url: Option<String>,
    /// The API's resource indicator (RFC 8707), so that the tokens'
    /// audience is the API's (one of its issuer's `audiences`).
    #[arg(long, value_name = "URI", requires = "oidc_issuer")]
    oidc_resource: Option<String>,
    /// The scopes asked for.
    #[arg(long, value_name = "SCOPES", default_value = "openid")]
    oidc_scopes: String,
    /// Your tracing UI's page of a trace, `{trace_id}` standing for its id
    /// (`https://jaeger.example.com/trace/{trace_id}`): a job's trace id
    /// links there.
    #[arg(long, value_name = "URL")]
    trace_url: Option<String>,
}

impl ConsoleArgs {
    /// The provider these flags name, its secret read from its file.
    fn oidc(&self) -> anyhow::Result<Option<toolfleet_console::OidcOptions>> {
        let Some(issuer) = &self.oidc_issuer else {
            return Ok(None);
        };
        let client_secret = self
            .oidc_client_secret_file
            .as_ref()
            .map(|path| {
                std::fs::read_to_string(path)
                    .map(|secret| secret.trim().to_owned())
                    .with_context(|| {
                        format!("cannot read --oidc-client-secret-file {}", path.display())
                    })
            })
            .transpose()?;
        Ok(Some(toolfleet_console::OidcOptions {
            issuer: issuer.clone(),
            client_id: self.oidc_client_id.clone().unwrap_or_default(),
            client_secret,
            redirect_url: self.oidc_redirect_url.clone().unwrap_or_default(),
            resource: self.oidc_resource.clone(),
            scopes: self.oidc_scopes.clone(),
        }))
    }
}

pub(crate) async fn run(args: ConsoleArgs) -> anyhow::Result<ExitCode> {
    let oidc = args.oidc()?;
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
        oidc,
        trace_url: args.trace_url,
    };
    toolfleet_console::serve(channel, options, listener, stop.cancelled_owned()).await?;
    Ok(ExitCode::SUCCESS)
}
