//! `toolfleet dev`: a [`LocalFleet`] and one demo job through it, or, with
//! `--serve`, the fleet until Ctrl-C.

use std::process::ExitCode;
use toolfleet_service::config::TelemetryOptions;
use toolfleet_service::traces;

use anyhow::{Context as _, bail};
use clap::Args;
use tokio_util::sync::CancellationToken;
use toolfleet_proto::v1;

use crate::client::{self, DEFAULT_OPENAI_MODEL, Provider};
use crate::demo;
use crate::output::outln;
use crate::{EXIT_INTERRUPTED, watch_signals_then};
use toolfleet_fleet::local::{KillSwitch, LocalFleet, LocalFleetOptions};
use toolfleet_fleet::{FleetBuilder, Serving};

#[derive(Debug, Args)]
pub(crate) struct DevArgs {
    /// Keep the fleet serving instead of running the demo job; Ctrl-C stops it.
    #[arg(long)]
    serve: bool,
    /// The orchestrator's gRPC port on 127.0.0.1 (0 picks a free one).
    #[arg(long, value_name = "N", default_value_t = 0)]
    grpc_port: u16,
    /// With --serve: the web console's port on 127.0.0.1 (0 picks a free
    /// one; docs/console.md).
    #[arg(long, value_name = "N", default_value_t = 0, requires = "serve")]
    console_port: u16,
    /// How many workers to run.
    #[arg(long, value_name = "N", default_value_t = 2,
          value_parser = clap::value_parser!(u16).range(1..=64))]
    workers: u16,
    #[arg(long, help = toolfleet_worker::tools::TEST_TOOLS_HELP)]
    test_tools: bool,
    /// The demo job's model provider. Default: openai-responses when
    /// OPENAI_API_KEY and --model are both given, else the scripted model,
    /// which plays parallel get_current_weather and calculate calls.
    #[arg(long, value_enum, conflicts_with = "serve")]
    provider: Option<Provider>,
    /// The model name for the openai-* providers. Default: gpt-4.1-mini.
    #[arg(long, value_name = "NAME", conflicts_with = "serve")]
    model: Option<String>,
    /// The demo job's user message. The scripted model answers these with
    /// real tool calls: "What's the weather in Boston in celsius, and what is
    /// 23*19?" (the default), and the knowledge-graph questions "What did AMD
    /// launch between 2016 and 2020?" and "How have AMD's research priorities
    /// changed over time?"; any other question gets the default demo.
    #[arg(long, value_name = "TEXT", default_value = demo::WEATHER_AND_MATH.question, conflicts_with = "serve")]
    input: String,
    /// Keep the temp dir (server data and logs, fleet.log) and print its path.
    #[arg(long)]
    keep_dir: bool,
    /// A worker configuration file (docs/configuration.md) the local
    /// workers take, e.g. its `[[mcp.servers]]` to put an MCP server behind
    /// the fleet (docs/tools/mcp.md); the fleet sets their NATS, Redis, ids
    /// and drain time.
    #[arg(long, value_name = "FILE")]
    worker_config: Option<std::path::PathBuf>,
}

impl DevArgs {
    /// The provider the demo job uses (see `--provider`).
    fn provider(&self) -> Provider {
        let has_key = std::env::var_os("OPENAI_API_KEY").is_some_and(|key| !key.is_empty());
        match (self.provider, &self.model) {
            (Some(provider), _) => provider,
            (None, Some(_)) if has_key => Provider::OpenaiResponses,
            (None, _) => Provider::Scripted,
        }
    }

    fn model(&self) -> String {
        self.model
            .clone()
            .unwrap_or_else(|| DEFAULT_OPENAI_MODEL.to_owned())
    }

    /// The local fleet's options these flags give: its port, its dir, and
    /// the workers' `--worker-config` (with the fleet's drain time).
    fn fleet_options(&self, kill_switch: KillSwitch) -> anyhow::Result<LocalFleetOptions> {
        let mut options = LocalFleetOptions {
            grpc_port: self.grpc_port,
            keep_dir: self.keep_dir,
            kill_switch,
            ..LocalFleetOptions::default()
        };
        if let Some(path) = &self.worker_config {
            let drain = options.worker.runtime.drain_timeout;
            options.worker =
                toolfleet_worker::WorkerOptions::load(Some(path), serde_json::json!({}))?;
            options.worker.runtime.drain_timeout = drain;
            options.worker.check_own().map_err(|problem| {
                anyhow::anyhow!("--worker-config {}: {problem}", path.display())
            })?;
        }
        Ok(options)
    }
}

/// `toolfleet dev`.
pub(crate) async fn run(args: DevArgs) -> anyhow::Result<ExitCode> {
    if args.provider() != Provider::Scripted
        && std::env::var_os("OPENAI_API_KEY").is_none_or(|key| key.is_empty())
    {
        bail!(
            "--provider {} needs OPENAI_API_KEY in the environment; export it, or drop \
             --provider to run the scripted model",
            args.provider().as_str()
        );
    }
    // With a reaper, even `kill -9` of this process stops the servers and
    // removes the temp dir.
    let kill_switch = match std::env::current_exe() {
        Ok(toolfleet) => KillSwitch::with_reaper(&toolfleet),
        Err(_) => KillSwitch::default(),
    };
    let outcome = run_fleet(args, kill_switch.clone()).await;
    // Every path out of `run_fleet` stopped what it started.
    kill_switch.disarm();
    outcome
}

async fn run_fleet(args: DevArgs, kill_switch: KillSwitch) -> anyhow::Result<ExitCode> {
    let shutdown = CancellationToken::new();
    let signals = tokio::spawn(watch_signals_then(shutdown.clone(), {
        let kill_switch = kill_switch.clone();
        move || {
            kill_switch.kill();
            eprintln!("\nsecond signal: killed nats-server and redis-server, removed the temp dir");
        }
    }));
    // The fleet in this process traces when the standard variables say where
    // to (OTEL_EXPORTER_OTLP_ENDPOINT), like the services do.
    let exporting = traces::install(&TelemetryOptions::default(), "toolfleet-dev")?;
    if exporting.is_some() {
        eprintln!("exporting traces to the OTLP collector the OTEL_EXPORTER_OTLP_* variables name");
    }
    let builder = FleetBuilder::new()
        .workers(args.workers.into())
        .serving(match args.test_tools {
            true => Serving::TestTools,
            false => Serving::BuiltIn,
        });
    let options = args.fleet_options(kill_switch)?;
    let fleet = tokio::select! {
        fleet = builder.start_in_process(options) => fleet?,
        () = shutdown.cancelled() => {
            // Dropping the half-started fleet kills and removes what it started.
            eprintln!("interrupted");
            return Ok(ExitCode::from(EXIT_INTERRUPTED));
        }
    };
    let outcome = if args.serve {
        serve(&fleet, args.console_port, &shutdown).await
    } else {
        run_demo(&fleet, &args, &shutdown).await
    };
    // A fleet that does not stop cleanly says so on stderr; the job's
    // outcome still decides the exit code.
    fleet.shutdown().await;
    if let Some(exporting) = exporting {
        exporting.shutdown().await;
    }
    signals.abort();
    outcome
}

/// The demo job until it ends or Ctrl-C; when it failed, a note that the
/// fleet's logs go with its temp dir.
async fn run_demo(
    fleet: &LocalFleet,
    args: &DevArgs,
    shutdown: &CancellationToken,
) -> anyhow::Result<ExitCode> {
    let outcome = tokio::select! {
        code = demo(fleet, args) => code,
        () = shutdown.cancelled() => {
            eprintln!("interrupted");
            Ok(ExitCode::from(EXIT_INTERRUPTED))
        }
    };
    if !args.keep_dir
        && outcome
            .as_ref()
            .is_ok_and(|code| *code != ExitCode::SUCCESS)
    {
        eprintln!("the fleet's logs go with its temp dir; --keep-dir keeps them");
    }
    outcome
}

/// Starts the web console on `console_port`, prints how to use the fleet
/// and waits for Ctrl-C.
async fn serve(
    fleet: &LocalFleet,
    console_port: u16,
    shutdown: &CancellationToken,
) -> anyhow::Result<ExitCode> {
    let console = console(fleet, console_port, shutdown).await?;
    let url = fleet.grpc_addr();
    let addr = fleet.grpc_socket_addr();
    let grpcurl_body =
        r#"{"input":"hi","model":{"provider":"scripted","script":"[{\"message\":\"hello\"}]"}}"#;
    eprintln!("logs: {}", fleet.log_path().display());
    outln!(
        "\ntoolfleet is serving gRPC on {url} (NATS {}, Redis {}); Ctrl-C stops it.\n\
         The web console: {console}\n\
         Authentication is off (api.auth = \"none\"): every caller is the tenant \"default\".\n\
         \nTry, from another terminal:\n\
         \x20 toolfleet submit --addr {url} \"What did AMD launch between 2016 and 2020?\" --watch\n\
         \x20 toolfleet submit --addr {url} \"hi\" --script '[{{\"message\":\"hello\"}}]' --watch\n\
         \x20 toolfleet tools --addr {url}\n\
         \x20 export TOOLFLEET_ADDR={url}   # then --addr can go\n\
         \x20 grpcurl -plaintext {addr} list   # reflection is on\n\
         \x20 grpcurl -plaintext -d '{grpcurl_body}' {addr} toolfleet.v1.AgentService/SubmitJob\n",
        fleet.nats_url(),
        fleet.redis_url(),
    )?;
    shutdown.cancelled().await;
    eprintln!();
    Ok(ExitCode::SUCCESS)
}

/// Serves the web console of `fleet` on 127.0.0.1:`port` until
/// `shutdown`; its URL.
async fn console(
    fleet: &LocalFleet,
    port: u16,
    shutdown: &CancellationToken,
) -> anyhow::Result<String> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .with_context(|| format!("cannot listen on 127.0.0.1:{port} for the console"))?;
    let url = format!("http://{}/", listener.local_addr()?);
    let channel = tonic::transport::Endpoint::from_shared(fleet.grpc_addr())?
        .connect()
        .await?;
    let options = toolfleet_console::ConsoleOptions {
        redis_url: fleet.redis_url(),
        redis_password: None,
        redis_tls: toolfleet_console::RedisTls::default(),
        key_prefix: "tf:".to_owned(),
        session_ttl: std::time::Duration::from_secs(8 * 3600),
        oidc: None,
        trace_url: None,
    };
    let stop = shutdown.clone().cancelled_owned();
    tokio::spawn(async move {
        if let Err(err) = toolfleet_console::serve(channel, options, listener, stop).await {
            eprintln!("the console stopped: {err:#}");
        }
    });
    Ok(url)
}

/// Submits the demo job, prints its events live, then its transcript.
async fn demo(fleet: &LocalFleet, args: &DevArgs) -> anyhow::Result<ExitCode> {
    let provider = args.provider();
    let model = match provider {
        Provider::Scripted => v1::ModelSpec {
            provider: provider.as_str().into(),
            script: client::scripted_demo(&args.input).script.into(),
            ..v1::ModelSpec::default()
        },
        provider => v1::ModelSpec {
            provider: provider.as_str().into(),
            name: args.model(),
            ..v1::ModelSpec::default()
        },
    };
    let model_name = if provider == Provider::Scripted {
        "the scripted model".to_owned()
    } else {
        format!("{} {}", provider.as_str(), args.model())
    };
    let mut client = client::connect(&fleet.grpc_addr(), None, &client::TlsArgs::default()).await?;
    let request = v1::SubmitJobRequest {
        input: args.input.clone(),
        model: Some(model),
        ..v1::SubmitJobRequest::default()
    };
    let submitted = client::submit_job(&mut client, request).await?;
    outln!(
        "\njob {} submitted to {model_name}: {:?}\n",
        submitted.job_id,
        args.input
    )?;
    client::follow(&mut client, &submitted.job_id, false).await
}
