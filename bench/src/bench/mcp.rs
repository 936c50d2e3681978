//! `--mcp N`: what the fleet adds to a call of an MCP tool. One MCP client
//! calls the same tool of the same MCP server N times directly, and N
//! times through the fleet (`toolfleet mcp-serve` → a call job → a worker
//! → the server), the two interleaved so that both see the same machine.
//! Everything runs in this process over loopback: the server, the fleet
//! (nats-server and redis-server as processes), the gateway and the
//! client. docs/benchmarks.md shows a run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, Implementation, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::streamable_http_server::{
    StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
};
use rmcp::{ErrorData as McpError, RoleClient, RoleServer, ServerHandler, ServiceExt};
use serde::Serialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use toolfleet_cli::output::outln;
use toolfleet_fleet::local::LocalFleetOptions;
use toolfleet_fleet::{FleetBuilder, Serving};
use toolfleet_proto::v1;

use super::Api;
use super::args::BenchArgs;
use super::report::Percentiles;

/// The server's name in the worker's configuration, so the tool's fleet
/// name is `bench__echo`.
const SERVER: &str = "bench";

/// The fleet name of the server's tool.
const FLEET_TOOL: &str = "bench__echo";

/// Calls of each path before the measured ones (connections, caches).
const WARM_UP: usize = 30;

/// What `--mcp` measured.
#[derive(Debug, Serialize)]
pub(super) struct McpReport {
    /// Calls measured on each path.
    calls: usize,
    /// The MCP server's tool called directly by the client.
    direct: Percentiles,
    /// The same tool called through `mcp-serve` and the fleet.
    through_the_fleet: Percentiles,
    /// What the fleet adds: through the fleet minus direct, at the median
    /// and at the 99th percentile.
    overhead_p50_ms: f64,
    overhead_p99_ms: f64,
}

/// Runs `--mcp calls` and prints its report.
pub(super) async fn run(args: &BenchArgs, calls: usize) -> anyhow::Result<()> {
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let server = serve_echoes(vec!["echo".to_owned()], stop.clone()).await?;
    let workers = args.workers.max(1);
    eprintln!(
        "starting a local fleet (nats-server, redis-server, 1 orchestrator, {workers} \
         workers serving the MCP server at {server}, in this process)..."
    );
    let mut options = LocalFleetOptions::default();
    options.worker.mcp = serde_json::from_value(json!({"servers": [{
        "name": SERVER, "url": server, "tools": ["echo"],
    }]}))?;
    let fleet = FleetBuilder::new()
        .workers(workers)
        .serving(Serving::Tools(vec![FLEET_TOOL.to_owned()]))
        .start_in_process(options)
        .await?;
    let measured = measure(&fleet.grpc_addr(), &server, calls, &stop).await;
    fleet.shutdown().await;
    let report = measured?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        outln!("{}", print(&report))?;
    }
    if let Some(path) = &args.json_file {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// Starts the gateway, waits for the tool to be live, and times the calls.
async fn measure(
    address: &str,
    server: &str,
    calls: usize,
    stop: &CancellationToken,
) -> anyhow::Result<McpReport> {
    let api = Api::connect(address.to_owned()).await?;
    wait_for_tool(&api).await?;
    let gateway = serve_gateway(address, stop.clone()).await?;
    let direct = McpClient::connect(server).await?;
    let fleet = McpClient::connect(&gateway).await?;
    eprintln!("warming up ({WARM_UP} calls each)...");
    for n in 0..WARM_UP {
        direct.echo("echo", n).await?;
        fleet.echo(FLEET_TOOL, n).await?;
    }
    eprintln!("mcp: {calls} calls directly and {calls} through the fleet, interleaved...");
    let mut direct_took = Vec::with_capacity(calls);
    let mut fleet_took = Vec::with_capacity(calls);
    for n in 0..calls {
        // Which path goes first alternates, so neither always meets a
        // machine the other just warmed.
        if n % 2 == 0 {
            direct_took.push(direct.echo("echo", n).await?);
            fleet_took.push(fleet.echo(FLEET_TOOL, n).await?);
        } else {
            fleet_took.push(fleet.echo(FLEET_TOOL, n).await?);
            direct_took.push(direct.echo("echo", n).await?);
        }
    }
    let direct = Percentiles::of(direct_took);
    let through_the_fleet = Percentiles::of(fleet_took);
    Ok(McpReport {
        calls,
        overhead_p50_ms: through_the_fleet.p50_ms - direct.p50_ms,
        overhead_p99_ms: through_the_fleet.p99_ms - direct.p99_ms,
        direct,
        through_the_fleet,
    })
}

/// Waits until `ListTools` offers the server's tool: the worker serves it
/// once the server has answered its listing.
async fn wait_for_tool(api: &Api) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let listed = api
            .clone()
            .list_tools(v1::ListToolsRequest::default())
            .await?;
        if listed
            .into_inner()
            .tools
            .iter()
            .any(|t| t.name == FLEET_TOOL)
        {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the fleet never offered {FLEET_TOOL}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Serves the fleet at `address` as an MCP server on a free loopback port,
/// as `toolfleet mcp-serve --listen` does; returns its URL.
async fn serve_gateway(address: &str, stop: CancellationToken) -> anyhow::Result<String> {
    let channel = tonic::transport::Endpoint::from_shared(address.to_owned())?
        .connect()
        .await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/mcp", listener.local_addr()?);
    tokio::spawn(async move {
        if let Err(err) = toolfleet_cli::mcp_serve::serve_http(
            channel,
            listener,
            toolfleet_cli::mcp_serve::HttpOptions::default(),
            toolfleet_cli::mcp_serve::TaskOptions::default(),
            stop,
        )
        .await
        {
            eprintln!("mcp: the gateway stopped: {err:#}");
        }
    });
    Ok(url)
}

/// An MCP server of tools that each answer their `text` as structured
/// content, so that what is timed is the path: `--mcp`'s `echo`, which
/// both paths call, or `--tools`'s many, which nobody calls.
#[derive(Clone)]
pub(super) struct Echoes {
    names: Arc<Vec<String>>,
}

impl ServerHandler for Echoes {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build()).with_server_info(
            Implementation::new("toolfleet-bench", env!("CARGO_PKG_VERSION")),
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let schema = json!({
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
            "additionalProperties": false,
        });
        let Value::Object(schema) = schema else {
            unreachable!("an object literal")
        };
        let schema = Arc::new(schema);
        let tools = (self.names.iter())
            .map(|name| Tool::new(name.clone(), "Answers its text.", schema.clone()))
            .collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let text = request
            .arguments
            .and_then(|mut arguments| arguments.remove("text"))
            .unwrap_or_default();
        Ok(CallToolResponse::Complete(CallToolResult::structured(
            json!({"text": text}),
        )))
    }
}

/// Serves [`Echoes`] of `names` over Streamable HTTP on a free loopback
/// port until `stop`; returns its URL.
pub(super) async fn serve_echoes(
    names: Vec<String>,
    stop: CancellationToken,
) -> anyhow::Result<String> {
    let config = StreamableHttpServerConfig::default().with_cancellation_token(stop.child_token());
    let names = Arc::new(names);
    let service = StreamableHttpService::new(
        move || {
            Ok(Echoes {
                names: names.clone(),
            })
        },
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let app = axum::Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/mcp", listener.local_addr()?);
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
        if let Err(err) = served {
            eprintln!("mcp: the MCP server stopped: {err}");
        }
    });
    Ok(url)
}

/// The one MCP client of both paths (rmcp over Streamable HTTP).
struct McpClient(RunningService<RoleClient, ()>);

impl McpClient {
    /// Connects to `url`, with a bearer token the gateway's door lets in
    /// (the local fleet's orchestrator takes any).
    async fn connect(url: &str) -> anyhow::Result<Self> {
        let config =
            StreamableHttpClientTransportConfig::with_uri(url.to_owned()).auth_header("bench");
        let transport = StreamableHttpClientTransport::with_client(reqwest::Client::new(), config);
        let client = ().serve(transport).await.with_context(|| format!("cannot reach {url}"))?;
        Ok(Self(client))
    }

    /// Calls `tool` with a text made of `n`; returns how long it took.
    async fn echo(&self, tool: &str, n: usize) -> anyhow::Result<Duration> {
        let text = format!("call {n}");
        let arguments = json!({"text": text});
        let Value::Object(arguments) = arguments else {
            unreachable!("an object literal")
        };
        let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        let started = Instant::now();
        let result = self.0.call_tool(params).await?;
        let took = started.elapsed();
        let answered = result
            .structured_content
            .as_ref()
            .and_then(|data| data.get("text"))
            .and_then(Value::as_str);
        anyhow::ensure!(
            result.is_error != Some(true) && answered == Some(text.as_str()),
            "{tool} answered {result:?}"
        );
        Ok(took)
    }
}

/// The report, as the bench prints it.
fn print(report: &McpReport) -> String {
    let line = |name: &str, p: &Percentiles| {
        format!(
            "  {name:<19} p50 {:>7.2} ms   p90 {:>7.2} ms   p99 {:>7.2} ms\n",
            p.p50_ms, p.p90_ms, p.p99_ms
        )
    };
    format!(
        "MCP tool calls, one at a time, {} on each path:\n{}{}\
         the fleet adds {:.2} ms at p50, {:.2} ms at p99\n",
        report.calls,
        line("direct", &report.direct),
        line("through the fleet", &report.through_the_fleet),
        report.overhead_p50_ms,
        report.overhead_p99_ms,
    )
}
