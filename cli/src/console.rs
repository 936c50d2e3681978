//! `toolfleet console`: the web console (crate `toolfleet-console`) in
//! front of an orchestrator.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

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
    /// The password of the URL's user, when the URL does not hold it: a
    /// password of any characters, unescaped. Give it in the variable; a
    /// flag is seen by every user of the machine.
    #[arg(
        long,
        env = "TOOLFLEET_CONSOLE_REDIS_PASSWORD",
        hide_env_values = true,
        value_name = "PASSWORD"
    )]
    redis_password: Option<String>,
    /// CA certificate (PEM) of a `rediss://` Redis's certificate (default:
    /// the system's roots).
    #[arg(long, env = "TOOLFLEET_CONSOLE_REDIS_CA_FILE", value_name = "PEM")]
    redis_ca_file: Option<PathBuf>,
    /// Client certificate (PEM), for a Redis that verifies clients.
    #[arg(
        long,
        env = "TOOLFLEET_CONSOLE_REDIS_CERT_FILE",
        value_name = "PEM",
        requires = "redis_key_file"
    )]
    redis_cert_file: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(
        long,
        env = "TOOLFLEET_CONSOLE_REDIS_KEY_FILE",
        value_name = "PEM",
        requires = "redis_cert_file"
    )]
    redis_key_file: Option<PathBuf>,
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
    oidc_client_secret_file: Option<PathBuf>,
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
    /// How its log lines (on stderr) are written: `text`, or `json`, one
    /// object a line, for a collector. `RUST_LOG` filters them (`info`).
    #[arg(long, value_name = "FORMAT", default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
    /// Print the settings these flags make as JSON, passwords and secrets
    /// left out, and exit without connecting: what a deployment's checks
    /// read (the files it names are read, so a missing one fails here).
    #[arg(long)]
    print_config: bool,
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

    /// Prints the settings as JSON, with no password, token or client
    /// secret in them, having checked that the files they name are there.
    fn print_config(&self, oidc: Option<&toolfleet_console::OidcOptions>) -> anyhow::Result<()> {
        for (flag, file) in [
            ("--redis-ca-file", &self.redis_ca_file),
            ("--redis-cert-file", &self.redis_cert_file),
            ("--redis-key-file", &self.redis_key_file),
        ] {
            if let Some(path) = file {
                std::fs::metadata(path)
                    .with_context(|| format!("cannot read {flag} {}", path.display()))?;
            }
        }
        let mut redis_url = url::Url::parse(&self.redis_url).context("--redis-url is not a URL")?;
        let in_url = redis_url.password().is_some();
        // A URL with a password has a host, so it can be taken out.
        let _ = redis_url.set_password(None);
        let shown = serde_json::json!({
            "listen": self.listen.to_string(),
            "orchestrator": self.server.shown(),
            "redis": {
                "url": redis_url.as_str(),
                "user": redis_url.username(),
                "password": in_url || self.redis_password.is_some(),
                "tls": {
                    "ca_file": self.redis_ca_file,
                    "cert_file": self.redis_cert_file,
                    "key_file": self.redis_key_file,
                },
            },
            "key_prefix": self.key_prefix,
            "session_ttl": humantime::format_duration(self.session_ttl).to_string(),
            "oidc": oidc.map(|oidc| serde_json::json!({
                "issuer": oidc.issuer,
                "client_id": oidc.client_id,
                "client_secret_file": self.oidc_client_secret_file,
                "redirect_url": oidc.redirect_url,
                "resource": oidc.resource,
                "scopes": oidc.scopes,
            })),
            "trace_url": self.trace_url,
            "log_format": self.log_format,
        });
        println!("{}", serde_json::to_string_pretty(&shown)?);
        Ok(())
    }
}

pub(crate) async fn run(args: ConsoleArgs) -> anyhow::Result<ExitCode> {
    let oidc = args.oidc()?;
    if args.print_config {
        args.print_config(oidc.as_ref())?;
        return Ok(ExitCode::SUCCESS);
    }
    // Its own log, as the services write theirs: the console's warnings
    // (a session Redis could not store, a provider that refused) go there.
    toolfleet_service::telemetry::init_logging(&toolfleet_service::config::LogOptions {
        format: if args.log_format == "json" {
            toolfleet_service::config::LogFormat::Json
        } else {
            toolfleet_service::config::LogFormat::Text
        },
        ..Default::default()
    });
    let stop = CancellationToken::new();
    tokio::spawn(crate::watch_signals(stop.clone()));
    let Some(channel) = reach_orchestrator(&args.server, &stop).await? else {
        return Ok(ExitCode::SUCCESS);
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    eprintln!(
        "toolfleet console: http://{}/ (sign in with a token of your tenant)",
        listener.local_addr()?
    );
    let options = toolfleet_console::ConsoleOptions {
        redis_url: args.redis_url,
        redis_password: args.redis_password,
        redis_tls: toolfleet_console::RedisTls {
            ca_file: args.redis_ca_file,
            cert_file: args.redis_cert_file,
            key_file: args.redis_key_file,
        },
        key_prefix: args.key_prefix,
        session_ttl: args.session_ttl,
        oidc,
        trace_url: args.trace_url,
    };
    toolfleet_console::serve(channel, options, listener, stop.cancelled_owned()).await?;
    Ok(ExitCode::SUCCESS)
}

/// A channel to the orchestrator, once one answers: in a cluster the
/// console may start before any orchestrator does, and waits for one as
/// the services wait for NATS and Redis (decision 0007). `None`: stopped
/// while waiting.
async fn reach_orchestrator(
    server: &Server,
    stop: &CancellationToken,
) -> anyhow::Result<Option<Channel>> {
    let (endpoint, url) = server.endpoint()?;
    let mut told = false;
    loop {
        match endpoint.connect().await {
            Ok(channel) => return Ok(Some(channel)),
            Err(err) if !told => {
                eprintln!("toolfleet console: waiting for the orchestrator at {url}: {err}");
                told = true;
            }
            Err(_) => {}
        }
        tokio::select! {
            () = stop.cancelled() => return Ok(None),
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}
