//! The commands that talk to an orchestrator over gRPC: `submit`, `get`,
//! `watch`, `cancel` and `tools`.

use std::collections::HashMap;
use std::io::Read as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use clap::{Args, ValueEnum};
use tonic::metadata::errors::InvalidMetadataValue;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use toolfleet_proto::v1::{self, agent_service_client::AgentServiceClient};
use toolfleet_proto::{JobEvent, JobStatus};

use crate::demo::{self, Demo};
use crate::output::{out, outln};
use crate::{EXIT_JOB_CANCELLED, EXIT_JOB_FAILED, timeline, transcript};
use toolfleet_orchestrator::job::ProviderKind;
use toolfleet_orchestrator::model::scripted::Scripted;

/// A connected client of `toolfleet.v1.AgentService`, sending the token.
pub(crate) type ApiClient = AgentServiceClient<InterceptedService<Channel, Credentials>>;

/// Adds `authorization: Bearer <token>` to every call, when there is a token.
#[derive(Clone)]
pub(crate) struct Credentials(Option<MetadataValue<Ascii>>);

impl Interceptor for Credentials {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// The model of the `openai-*` providers when `--model` is not given.
pub(crate) const DEFAULT_OPENAI_MODEL: &str = "gpt-4.1-mini";

/// How long connecting to the orchestrator may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Which model runs a job.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub(crate) enum Provider {
    /// Plays a script given with the job: no API key, deterministic.
    #[default]
    Scripted,
    /// OpenAI Responses API (needs OPENAI_API_KEY on the orchestrator).
    OpenaiResponses,
    /// OpenAI-compatible Chat Completions API, e.g. vLLM (needs OPENAI_API_KEY
    /// on the orchestrator).
    OpenaiChat,
    /// Anthropic's Messages API, i.e. Claude (needs ANTHROPIC_API_KEY on
    /// the orchestrator).
    AnthropicMessages,
}

impl Provider {
    /// The orchestrator's provider this flag value names.
    pub(crate) fn kind(self) -> ProviderKind {
        match self {
            Self::Scripted => ProviderKind::Scripted,
            Self::OpenaiResponses => ProviderKind::OpenaiResponses,
            Self::OpenaiChat => ProviderKind::OpenaiChat,
            Self::AnthropicMessages => ProviderKind::AnthropicMessages,
        }
    }

    /// The name in `ModelSpec.provider`: the orchestrator's spelling.
    pub(crate) fn as_str(self) -> &'static str {
        self.kind().as_str()
    }
}

/// Where the orchestrator is: every client command has this flag.
#[derive(Debug, Args)]
pub(crate) struct Server {
    /// gRPC address of an orchestrator (any replica).
    #[arg(
        long,
        env = "TOOLFLEET_ADDR",
        default_value = "http://127.0.0.1:50051",
        value_name = "URL"
    )]
    addr: String,
    /// API token of your tenant, sent as `authorization: Bearer <token>`.
    #[arg(
        long,
        env = "TOOLFLEET_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    token: Option<String>,
    #[command(flatten)]
    tls: TlsArgs,
}

impl Server {
    /// A client of the orchestrator these flags name.
    ///
    /// # Errors
    ///
    /// As [`connect`].
    pub(crate) async fn connect(&self) -> anyhow::Result<ApiClient> {
        connect(&self.addr, self.token.as_deref(), &self.tls).await
    }

    /// A channel to the orchestrator these flags name, for clients with
    /// tokens of their own ([`with_token`]).
    ///
    /// # Errors
    ///
    /// As [`connect`].
    pub(crate) async fn channel(&self) -> anyhow::Result<Channel> {
        channel(&self.addr, &self.tls).await
    }

    /// `--token`, if given.
    pub(crate) fn token(&self) -> Option<&str> {
        self.token.as_deref().filter(|token| !token.is_empty())
    }
}

/// TLS to the orchestrator: an `https://` address, or any of these flags.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct TlsArgs {
    /// CA certificate (PEM) the orchestrator's certificate chains to
    /// (default: the system's roots).
    #[arg(long, env = "TOOLFLEET_TLS_CA_FILE", value_name = "PEM")]
    tls_ca_file: Option<PathBuf>,
    /// Client certificate (PEM), for an orchestrator that requires mutual TLS.
    #[arg(
        long,
        env = "TOOLFLEET_TLS_CERT_FILE",
        value_name = "PEM",
        requires = "tls_key_file"
    )]
    tls_cert_file: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(
        long,
        env = "TOOLFLEET_TLS_KEY_FILE",
        value_name = "PEM",
        requires = "tls_cert_file"
    )]
    tls_key_file: Option<PathBuf>,
}

impl TlsArgs {
    fn is_set(&self) -> bool {
        self.tls_ca_file.is_some() || self.tls_cert_file.is_some()
    }

    fn config(&self) -> anyhow::Result<ClientTlsConfig> {
        let read = |flag: &str, path: &PathBuf| {
            std::fs::read(path).with_context(|| format!("cannot read {flag} {}", path.display()))
        };
        let mut config = ClientTlsConfig::new();
        config = match &self.tls_ca_file {
            Some(ca) => config.ca_certificate(Certificate::from_pem(read("--tls-ca-file", ca)?)),
            None => config.with_native_roots(),
        };
        if let (Some(cert), Some(key)) = (&self.tls_cert_file, &self.tls_key_file) {
            config = config.identity(Identity::from_pem(
                read("--tls-cert-file", cert)?,
                read("--tls-key-file", key)?,
            ));
        }
        Ok(config)
    }
}

#[derive(Debug, Args)]
pub(crate) struct SubmitArgs {
    #[command(flatten)]
    server: Server,
    /// The user message (or --input-file).
    #[arg(required_unless_present = "input_file")]
    input: Option<String>,
    /// Read the user message from a file ("-" reads stdin), for messages too
    /// long for the command line (the API takes up to 256 KiB).
    #[arg(long, value_name = "PATH", conflicts_with = "input")]
    input_file: Option<PathBuf>,
    /// System / developer instructions for the model.
    #[arg(long, value_name = "TEXT", default_value = "")]
    instructions: String,
    /// Which model runs the job.
    #[arg(long, value_enum, default_value_t)]
    provider: Provider,
    /// The model name for the openai-* providers (ignored by scripted).
    #[arg(long, value_name = "NAME", default_value = DEFAULT_OPENAI_MODEL)]
    model: String,
    /// The scripted model's script. Default: the demo script of the question
    /// asked, when it is one of the demo questions (see `toolfleet dev --help`),
    /// else the weather-and-arithmetic demo, which ignores the question.
    ///
    /// A JSON array of turns; turn N of the job plays entry N. A turn has
    /// `tool_calls` (each with `name`, `arguments` and an optional `id`; ids
    /// default to call_<turn>_<index>) and/or a `message`, which may quote
    /// results as {{call_0_0.data.result}}; `delay_ms` slows a turn down.
    /// Example: '[{"tool_calls":[{"name":"calculate","arguments":{"expression":"2+2"}}]},
    /// {"message":"2+2={{call_0_0.data.result}}"}]'
    #[arg(long, value_name = "JSON", conflicts_with = "script_file")]
    script: Option<String>,
    /// Read the scripted model's script from a file ("-" reads stdin).
    #[arg(long, value_name = "PATH")]
    script_file: Option<PathBuf>,
    /// Let the model use only this tool (repeat for more; default: every live tool).
    #[arg(long = "tool", value_name = "NAME")]
    tools: Vec<String>,
    /// Hold every call of this tool until a person approves it (repeat for
    /// more; "*" for every tool): DecideCall decides, docs/approvals.md.
    #[arg(long, value_name = "TOOL")]
    require_approval: Vec<String>,
    /// What becomes of a call whose outcome no worker could tell
    /// (OUTCOME_UNKNOWN, MAX_DELIVERIES_EXCEEDED): "report" tells the model;
    /// "ask" holds it for your verdict (toolfleet resolve).
    #[arg(long, value_name = "WHAT", value_parser = ["report", "ask"])]
    on_unknown_outcome: Option<String>,
    /// Most model turns that may request tools (default: the server's, 8).
    #[arg(long, value_name = "N")]
    max_tool_rounds: Option<u32>,
    /// Ask the model for at most one tool call per turn.
    #[arg(long)]
    no_parallel: bool,
    /// Stream the model's answer: with --watch, its text is printed as it
    /// is written.
    #[arg(long)]
    stream: bool,
    /// Submitting again with the same key returns the same job instead of a new one.
    #[arg(long, value_name = "KEY")]
    idempotency_key: Option<String>,
    /// Time budget of the whole job, in milliseconds (default: the server's, 10 minutes).
    #[arg(long, value_name = "MS")]
    deadline_ms: Option<u64>,
    /// A label returned with the job (repeat for more).
    #[arg(long = "meta", value_name = "KEY=VALUE", value_parser = parse_meta)]
    metadata: Vec<(String, String)>,
    /// Follow the job: print its events as they happen, then the transcript;
    /// the exit status tells whether it succeeded.
    #[arg(long)]
    watch: bool,
    /// Print JSON instead of text (JSON lines with --watch: the submission,
    /// each event, then the job).
    #[arg(long, conflicts_with = "quiet")]
    json: bool,
    /// With --watch: print only the job's answer (stdout), or why it failed
    /// (stderr), not its id and events; the exit status says how it ended.
    #[arg(long, short, requires = "watch")]
    quiet: bool,
}

#[derive(Debug, Args)]
pub(crate) struct GetArgs {
    #[command(flatten)]
    server: Server,
    /// The job id, as `submit` printed it.
    job_id: String,
    /// Print the job as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct WatchArgs {
    #[command(flatten)]
    server: Server,
    /// The job id, as `submit` printed it.
    job_id: String,
    /// Skip the events before this offset (0: from the job's start).
    #[arg(long, value_name = "N", default_value_t = 0)]
    from: u64,
    /// Print each event as a line of JSON.
    #[arg(long, conflicts_with = "quiet")]
    json: bool,
    /// Print only the job's answer (stdout), or why it failed (stderr); the
    /// exit status says how it ended.
    #[arg(long, short)]
    quiet: bool,
}

#[derive(Debug, Args)]
pub(crate) struct TraceArgs {
    #[command(flatten)]
    server: Server,
    /// The job id, as `submit` printed it.
    job_id: String,
    /// Columns of the time axis, 10 to 1000.
    #[arg(long, value_name = "N", default_value_t = 60,
          value_parser = clap::value_parser!(u16).range(10..=1000))]
    width: u16,
}

#[derive(Debug, Args)]
pub(crate) struct CancelArgs {
    #[command(flatten)]
    server: Server,
    /// The job id, as `submit` printed it.
    job_id: String,
    /// Print the answer as JSON: the job's id and its status when the
    /// cancel arrived.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct JobsArgs {
    #[command(flatten)]
    server: Server,
    /// Only jobs in this status.
    #[arg(long, value_enum)]
    status: Option<StatusFilter>,
    /// Only jobs with this metadata pair (repeat: all must match).
    #[arg(long = "meta", value_name = "KEY=VALUE", value_parser = parse_meta)]
    metadata: Vec<(String, String)>,
    /// Most jobs to list (1-500).
    #[arg(long, value_name = "N", default_value_t = 20,
          value_parser = clap::value_parser!(u32).range(1..=500))]
    limit: u32,
    /// Continue after an earlier page (the token it printed).
    #[arg(long, value_name = "TOKEN")]
    page_token: Option<String>,
    /// Print the page as JSON.
    #[arg(long)]
    json: bool,
}

/// A job status to filter on.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum StatusFilter {
    Queued,
    Running,
    /// Parked until a person decides a held call.
    #[value(name = "waiting_for_approval", alias = "waiting-for-approval")]
    WaitingForApproval,
    Succeeded,
    Failed,
    Cancelled,
}

impl From<StatusFilter> for v1::JobStatus {
    fn from(status: StatusFilter) -> Self {
        match status {
            StatusFilter::Queued => Self::Queued,
            StatusFilter::Running => Self::Running,
            StatusFilter::WaitingForApproval => Self::WaitingForApproval,
            StatusFilter::Succeeded => Self::Succeeded,
            StatusFilter::Failed => Self::Failed,
            StatusFilter::Cancelled => Self::Cancelled,
        }
    }
}

#[derive(Debug, Args)]
pub(crate) struct ToolsArgs {
    #[command(flatten)]
    server: Server,
    /// Print the tools as JSON, schemas included.
    #[arg(long)]
    json: bool,
    /// Exit 1, naming each, unless every one of these tools is served by
    /// at least one live worker (a check for scripts and `helm test`).
    #[arg(long, value_name = "TOOL,...", value_delimiter = ',')]
    require: Vec<String>,
}

/// `toolfleet submit`.
pub(crate) async fn submit(args: SubmitArgs) -> anyhow::Result<ExitCode> {
    let request = args.request()?;
    let mut client = args.server.connect().await?;
    warn_of_unserved_tools(&mut client, &request.tools).await;
    let submitted = submit_job(&mut client, request).await?;
    if args.quiet {
        let last = each_event(&mut client, &submitted.job_id, 0, |_| Ok(())).await?;
        return say_ending(&last);
    }
    if args.json {
        let line =
            serde_json::json!({"job_id": submitted.job_id, "duplicate": submitted.duplicate});
        outln!("{line}")?;
    } else {
        outln!("{}", submitted.job_id)?;
        if submitted.duplicate {
            eprintln!(
                "duplicate: the idempotency key matched an earlier submission; this is its job"
            );
        }
    }
    if !args.watch {
        return Ok(ExitCode::SUCCESS);
    }
    follow(&mut client, &submitted.job_id, args.json).await
}

/// Warns on stderr about each `--tool` no live worker serves: its calls
/// would all be answered `UNKNOWN_TOOL`. The job is submitted anyway, since
/// workers may start later; a failed lookup only skips the warning.
async fn warn_of_unserved_tools(client: &mut ApiClient, named: &[String]) {
    if named.is_empty() {
        return;
    }
    let Ok(live) = client.list_tools(v1::ListToolsRequest {}).await else {
        return;
    };
    let live: Vec<String> = live
        .into_inner()
        .tools
        .into_iter()
        .map(|t| t.name)
        .collect();
    for name in named.iter().filter(|name| !live.contains(name)) {
        eprintln!(
            "warning: no live worker serves {name:?}; the model's calls to it will be answered \
             UNKNOWN_TOOL until one does (live tools: {})",
            if live.is_empty() {
                "none".to_owned()
            } else {
                live.join(", ")
            }
        );
    }
}

/// `toolfleet get`.
pub(crate) async fn get(args: GetArgs) -> anyhow::Result<ExitCode> {
    let mut client = args.server.connect().await?;
    let job = get_job(&mut client, &args.job_id).await?;
    print_job(&job, args.json)?;
    // The same table as `watch`: a finished job's code says how it ended.
    let finished = transcript::job_status(job.status).is_some_and(JobStatus::is_final);
    Ok(if finished {
        exit_code(&job)
    } else {
        ExitCode::SUCCESS
    })
}

/// `toolfleet watch`: exits like `submit --watch`, by how the job ended.
pub(crate) async fn watch(args: WatchArgs) -> anyhow::Result<ExitCode> {
    let mut client = args.server.connect().await?;
    if args.quiet {
        let last = each_event(&mut client, &args.job_id, args.from, |_| Ok(())).await?;
        return say_ending(&last);
    }
    // Times are shown from the job's start, also when the watch starts later.
    let origin = if args.from > 0 {
        Some(get_job(&mut client, &args.job_id).await?.created_at_ms)
    } else {
        None
    };
    let last = stream_events(&mut client, &args.job_id, args.from, origin, args.json).await?;
    Ok(ending_code(&last))
}

/// `--quiet`'s output: the answer of a job that succeeded on stdout, why one
/// did not on stderr; its exit code.
fn say_ending(last: &v1::JobEvent) -> anyhow::Result<ExitCode> {
    match JobEvent::decode(&last.kind, &last.data) {
        Ok(JobEvent::JobSucceeded { output_text }) => outln!("{output_text}")?,
        Ok(JobEvent::JobFailed { code, message }) => {
            eprintln!(
                "job {} failed: {code} {}",
                last.job_id,
                message.unwrap_or_default()
            );
        }
        Ok(JobEvent::JobCancelled { .. }) => eprintln!("job {} was cancelled", last.job_id),
        _ => eprintln!(
            "job {} ended with an unreadable {} event",
            last.job_id, last.kind
        ),
    }
    Ok(ending_code(last))
}

/// The exit code for a job's final event.
fn ending_code(last: &v1::JobEvent) -> ExitCode {
    match JobEvent::decode(&last.kind, &last.data) {
        Ok(JobEvent::JobFailed { .. }) => ExitCode::from(EXIT_JOB_FAILED),
        Ok(JobEvent::JobCancelled { .. }) => ExitCode::from(EXIT_JOB_CANCELLED),
        _ => ExitCode::SUCCESS,
    }
}

/// `toolfleet trace`: reads every event up to the final one, then draws
/// them; exits like `watch`.
pub(crate) async fn trace(args: TraceArgs) -> anyhow::Result<ExitCode> {
    let mut client = args.server.connect().await?;
    let mut events = Vec::new();
    let last = each_event(&mut client, &args.job_id, 0, |event| {
        events.push(event.clone());
        Ok(())
    })
    .await?;
    out!(
        "{}",
        timeline::waterfall(&args.job_id, &events, usize::from(args.width))
    )?;
    Ok(ending_code(&last))
}

/// `toolfleet cancel`.
pub(crate) async fn cancel(args: CancelArgs) -> anyhow::Result<ExitCode> {
    let mut client = args.server.connect().await?;
    let response = client
        .cancel_job(v1::CancelJobRequest {
            job_id: args.job_id.clone(),
        })
        .await
        .map_err(|status| rpc_error("CancelJob", &status))?
        .into_inner();
    let status = transcript::status_name(response.status);
    let id = &args.job_id;
    if args.json {
        outln!("{}", serde_json::json!({"job_id": id, "status": status}))?;
    } else if transcript::job_status(response.status).is_some_and(JobStatus::is_final) {
        outln!("job {id} had already {}; nothing to cancel", status)?;
    } else {
        outln!(
            "cancel requested: job {id} was {status}; it stops at its next step \
             (follow it with: toolfleet watch {id})"
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `toolfleet jobs`.
pub(crate) async fn jobs(args: JobsArgs) -> anyhow::Result<ExitCode> {
    let mut client = args.server.connect().await?;
    let page = client
        .list_jobs(v1::ListJobsRequest {
            page_size: args.limit,
            page_token: args.page_token.clone().unwrap_or_default(),
            status: args.status.map_or(0, |s| v1::JobStatus::from(s).into()),
            metadata: args.metadata.iter().cloned().collect(),
        })
        .await
        .map_err(|status| rpc_error("ListJobs", &status))?
        .into_inner();
    if args.json {
        outln!(
            "{}",
            transcript::jobs_json(&page.jobs, &page.next_page_token)
        )?;
        return Ok(ExitCode::SUCCESS);
    }
    if page.jobs.is_empty() {
        eprintln!("no jobs match (finished jobs are kept for store.job_retention, 24h by default)");
    } else {
        out!(
            "{}",
            transcript::jobs_table(&page.jobs, toolfleet_service::clock::now_ms())
        )?;
    }
    if !page.next_page_token.is_empty() {
        eprintln!("more: {}", args.next_page(&page.next_page_token));
    }
    Ok(ExitCode::SUCCESS)
}

impl JobsArgs {
    /// The command that lists the page after this one: the same filters and
    /// page size (a token continues a listing only with the filters it was
    /// made for), and `token`. The server flags are left out: they come from
    /// the environment or are typed again.
    fn next_page(&self, token: &str) -> String {
        let mut command = String::from("toolfleet jobs");
        if let Some(status) = self.status
            && let Some(value) = status.to_possible_value()
        {
            command.push_str(&format!(" --status {}", value.get_name()));
        }
        for (key, value) in &self.metadata {
            command.push_str(&format!(
                " --meta {}",
                shell_word(&format!("{key}={value}"))
            ));
        }
        command.push_str(&format!(
            " --limit {} --page-token {}",
            self.limit,
            shell_word(token)
        ));
        command
    }
}

/// `word` as one word of a POSIX shell command line: as it is when it is
/// plain, else in single quotes.
fn shell_word(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_=.,:/@%+".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// `toolfleet tools`.
pub(crate) async fn tools(args: ToolsArgs) -> anyhow::Result<ExitCode> {
    let mut client = args.server.connect().await?;
    let mut tools = client
        .list_tools(v1::ListToolsRequest {})
        .await
        .map_err(|status| rpc_error("ListTools", &status))?
        .into_inner()
        .tools;
    tools.sort_by(|a, b| a.name.cmp(&b.name));
    if args.json {
        outln!("{}", transcript::tools_json(&tools))?;
    } else if tools.is_empty() {
        eprintln!(
            "no live tools: no worker announces any; start workers (toolfleet-worker), \
             or a whole local fleet with toolfleet dev --serve"
        );
    } else {
        out!("{}", transcript::tools_table(&tools))?;
    }
    let unserved = unserved(&tools, &args.require);
    if unserved.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!("not served: {}", unserved.join(", "));
    Ok(ExitCode::FAILURE)
}

/// Each of `required` that no live worker serves, and why.
fn unserved(tools: &[v1::Tool], required: &[String]) -> Vec<String> {
    required
        .iter()
        .filter_map(|name| match tools.iter().find(|tool| &tool.name == name) {
            None => Some(format!("{name} (no worker announces it)")),
            Some(tool) if tool.workers == 0 => Some(format!("{name} (0 workers)")),
            Some(_) => None,
        })
        .collect()
}

/// Connects to the orchestrator at `addr` (`http://` is assumed without a scheme).
///
/// # Errors
///
/// The address is not a URL, or nothing answers there; the message says what to do.
pub(crate) async fn connect(
    addr: &str,
    token: Option<&str>,
    tls: &TlsArgs,
) -> anyhow::Result<ApiClient> {
    let channel = channel(addr, tls).await?;
    with_token(channel, token)
        .map_err(|_| anyhow!("--token holds characters a header cannot carry"))
}

/// A client over `channel` that sends `token`.
///
/// # Errors
///
/// The token holds characters a header cannot carry.
pub(crate) fn with_token(
    channel: Channel,
    token: Option<&str>,
) -> Result<ApiClient, InvalidMetadataValue> {
    let credentials = match token.filter(|t| !t.is_empty()) {
        Some(token) => Some(format!("Bearer {token}").parse::<MetadataValue<Ascii>>()?),
        None => None,
    };
    Ok(AgentServiceClient::with_interceptor(
        channel,
        Credentials(credentials),
    ))
}

/// A channel to the orchestrator at `addr`.
async fn channel(addr: &str, tls: &TlsArgs) -> anyhow::Result<Channel> {
    let scheme = if tls.is_set() { "https" } else { "http" };
    let url = if addr.contains("://") {
        addr.to_owned()
    } else {
        format!("{scheme}://{addr}")
    };
    let mut endpoint = Endpoint::from_shared(url.clone())
        .with_context(|| {
            format!("--addr {addr:?} is not a valid URL; use one like http://127.0.0.1:50051")
        })?
        .connect_timeout(CONNECT_TIMEOUT);
    if url.starts_with("https://") || tls.is_set() {
        endpoint = endpoint.tls_config(tls.config()?)?;
    }
    endpoint.connect().await.with_context(|| {
        format!(
            "cannot reach the orchestrator at {url}; start one (`toolfleet dev --serve` runs \
             a local fleet) or point --addr / TOOLFLEET_ADDR at yours"
        )
    })
}

/// Streams the job's events, then prints the job; the exit code says how it ended.
pub(crate) async fn follow(
    client: &mut ApiClient,
    job_id: &str,
    json: bool,
) -> anyhow::Result<ExitCode> {
    stream_events(client, job_id, 0, None, json).await?;
    let job = get_job(client, job_id).await?;
    if !json {
        outln!()?;
    }
    print_job(&job, json)?;
    Ok(exit_code(&job))
}

/// The exit code for how a job ended.
pub(crate) fn exit_code(job: &v1::Job) -> ExitCode {
    match v1::JobStatus::try_from(job.status) {
        Ok(v1::JobStatus::Succeeded) => ExitCode::SUCCESS,
        Ok(v1::JobStatus::Cancelled) => ExitCode::from(EXIT_JOB_CANCELLED),
        _ => ExitCode::from(EXIT_JOB_FAILED),
    }
}

/// Prints the events from `from` on as they happen, and returns the final
/// one. Times are shown from `origin` (Unix ms), else from the first event.
async fn stream_events(
    client: &mut ApiClient,
    job_id: &str,
    from: u64,
    origin: Option<u64>,
    json: bool,
) -> anyhow::Result<v1::JobEvent> {
    let mut start_ms = origin;
    let mut streaming = transcript::Streaming::default();
    each_event(client, job_id, from, |event| {
        if json {
            outln!("{}", transcript::event_json(event))
        } else if let Some(text) = streaming.delta(event) {
            // A streamed answer, printed as it is written.
            out!("{text}")
        } else {
            let start = *start_ms.get_or_insert(event.timestamp_ms);
            out!("{}", streaming.end())?;
            outln!("{}", transcript::event_line(event, start))
        }
    })
    .await
}

/// Hands each event from `from` on to `on_event` as it happens, and returns
/// the final one.
pub(crate) async fn each_event(
    client: &mut ApiClient,
    job_id: &str,
    from: u64,
    mut on_event: impl FnMut(&v1::JobEvent) -> std::io::Result<()>,
) -> anyhow::Result<v1::JobEvent> {
    let mut events = client
        .watch_job(v1::WatchJobRequest {
            job_id: job_id.to_owned(),
            from_offset: from,
        })
        .await
        .map_err(|status| rpc_error("WatchJob", &status))?
        .into_inner();
    let mut next = from;
    let resume = |next: u64| format!("resume with: toolfleet watch {job_id} --from {next}");
    loop {
        let event = events
            .message()
            .await
            .map_err(|status| rpc_error("WatchJob", &status).context(resume(next)))?;
        let Some(event) = event else {
            bail!(
                "the event stream of job {job_id} ended before its final event \
                 (did the orchestrator stop?); {}",
                resume(next)
            );
        };
        on_event(&event)?;
        next = event.offset.saturating_add(1);
        if event.r#final {
            // The server ends the stream after it: read that end, rather
            // than reset the stream by dropping it (docs/api.md).
            let _ = events.message().await;
            return Ok(event);
        }
    }
}

/// Submits a job.
pub(crate) async fn submit_job(
    client: &mut ApiClient,
    request: v1::SubmitJobRequest,
) -> anyhow::Result<v1::SubmitJobResponse> {
    Ok(client
        .submit_job(request)
        .await
        .map_err(|status| rpc_error("SubmitJob", &status))?
        .into_inner())
}

pub(crate) async fn get_job(client: &mut ApiClient, job_id: &str) -> anyhow::Result<v1::Job> {
    Ok(client
        .get_job(v1::GetJobRequest {
            job_id: job_id.to_owned(),
        })
        .await
        .map_err(|status| rpc_error("GetJob", &status))?
        .into_inner())
}

fn print_job(job: &v1::Job, json: bool) -> std::io::Result<()> {
    if json {
        outln!("{}", transcript::job_json(job))?;
    } else {
        out!("{}", transcript::job_report(job))?;
    }
    Ok(())
}

/// The demo the scripted model plays for `input` when no script is given:
/// the question's own, else the default one, with a note on stderr that it
/// answers another question.
pub(crate) fn scripted_demo(input: &str) -> Demo {
    demo::for_question(input).unwrap_or_else(|| {
        eprintln!(
            "note: the scripted model answers only its demo questions; for any other it \
             plays the weather-and-arithmetic demo. Its questions:\n{}\nPass --script \
             for your own turns, or --provider openai-responses for a real model.",
            demo::questions()
        );
        demo::WEATHER_AND_MATH
    })
}

/// A failed call, in words: the server's message is written for people.
pub(crate) fn rpc_error(rpc: &str, status: &tonic::Status) -> anyhow::Error {
    use tonic::Code;
    let hint = match status.code() {
        Code::Unavailable => "; is the orchestrator still running? retry, or check --addr",
        Code::Unimplemented => "; is --addr the gRPC address of a toolfleet orchestrator?",
        Code::Unauthenticated => "; pass your tenant's token with --token or TOOLFLEET_TOKEN",
        _ => "",
    };
    anyhow!(
        "{rpc} failed: {} ({:?}){hint}",
        status.message(),
        status.code()
    )
}

impl SubmitArgs {
    /// The request, checked here where a mistake can name its flag.
    fn request(&self) -> anyhow::Result<v1::SubmitJobRequest> {
        if self
            .input_file
            .as_deref()
            .is_some_and(|p| p.as_os_str() == "-")
            && self
                .script_file
                .as_deref()
                .is_some_and(|p| p.as_os_str() == "-")
        {
            bail!("--input-file - and --script-file - both read stdin; give one of them a file");
        }
        let input = match (&self.input, &self.input_file) {
            (Some(input), _) => input.clone(),
            (None, Some(path)) => read_text("--input-file", path)?,
            (None, None) => bail!("give the user message, or --input-file"),
        };
        let script = match (&self.script, &self.script_file) {
            (Some(script), _) => Some(script.clone()),
            (None, Some(path)) => Some(read_text("--script-file", path)?),
            (None, None) => None,
        };
        let model = if self.provider == Provider::Scripted {
            let script = script.unwrap_or_else(|| scripted_demo(&input).script.to_owned());
            Scripted::parse(&script).map_err(|err| {
                anyhow!("invalid script: {err}; `toolfleet submit --help` describes the format")
            })?;
            v1::ModelSpec {
                provider: self.provider.as_str().to_owned(),
                script,
                ..v1::ModelSpec::default()
            }
        } else {
            if script.is_some() {
                bail!(
                    "--script and --script-file are for --provider scripted; drop them, or \
                     choose --provider scripted"
                );
            }
            v1::ModelSpec {
                provider: self.provider.as_str().to_owned(),
                name: self.model.clone(),
                ..v1::ModelSpec::default()
            }
        };
        Ok(v1::SubmitJobRequest {
            input,
            instructions: self.instructions.clone(),
            model: Some(model),
            tools: self.tools.clone(),
            max_tool_rounds: self.max_tool_rounds.unwrap_or(0),
            parallel_tool_calls: self.no_parallel.then_some(false),
            idempotency_key: self.idempotency_key.clone().unwrap_or_default(),
            deadline_ms: self.deadline_ms.unwrap_or(0),
            metadata: self.metadata.iter().cloned().collect::<HashMap<_, _>>(),
            require_approval: self.require_approval.clone(),
            on_unknown_outcome: self.on_unknown_outcome.clone().unwrap_or_default(),
            call: None,
            stream: self.stream.then_some(true),
        })
    }
}

/// The text of the file `flag` names, or of stdin for "-".
fn read_text(flag: &str, path: &std::path::Path) -> anyhow::Result<String> {
    if path.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .with_context(|| format!("cannot read {flag} from stdin"))?;
        return Ok(text);
    }
    std::fs::read_to_string(path).with_context(|| format!("cannot read {flag} {}", path.display()))
}

fn parse_meta(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!(
            "expected KEY=VALUE, e.g. --meta team=search, not {text:?}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[test]
    fn provider_flags_are_spelled_as_the_orchestrator_spells_them() {
        for provider in Provider::value_variants() {
            let flag = provider
                .to_possible_value()
                .expect("every variant is a value");
            assert_eq!(flag.get_name(), provider.as_str());
        }
        assert_eq!(Provider::value_variants().len(), ProviderKind::ALL.len());
    }

    #[test]
    fn a_required_tool_is_served_only_by_a_live_worker() {
        let tool = |name: &str, workers| v1::Tool {
            name: name.into(),
            workers,
            ..Default::default()
        };
        let live = [tool("calculate", 2), tool("factual_qa", 0)];
        let required = ["calculate", "factual_qa", "route_plan"].map(String::from);
        assert_eq!(
            unserved(&live, &required),
            [
                "factual_qa (0 workers)",
                "route_plan (no worker announces it)"
            ]
        );
        assert!(unserved(&live, &required[..1]).is_empty());
        assert!(unserved(&live, &[]).is_empty());
    }

    #[derive(Debug, Parser)]
    struct Jobs {
        #[command(flatten)]
        args: JobsArgs,
    }

    #[test]
    fn the_next_page_command_keeps_the_filters() {
        let parse = |args: &[&str]| {
            let args = std::iter::once("jobs").chain(args.iter().copied());
            Jobs::try_parse_from(args).unwrap().args
        };
        let args = parse(&["--meta", "team=ux", "--status", "succeeded", "--limit", "1"]);
        assert_eq!(
            args.next_page("abc"),
            "toolfleet jobs --status succeeded --meta team=ux --limit 1 --page-token abc"
        );
        let args = parse(&["--meta", "note=it's mine", "--meta", "a=b"]);
        assert_eq!(
            args.next_page("t"),
            r"toolfleet jobs --meta 'note=it'\''s mine' --meta a=b --limit 20 --page-token t"
        );
        // Parsed back as the same words by a shell.
        let line = args.next_page("t");
        let output = std::process::Command::new("sh")
            .args([
                "-c",
                &format!("printf '%s\\n' {}", &line["toolfleet ".len()..]),
            ])
            .output()
            .unwrap();
        let words: Vec<_> = String::from_utf8(output.stdout)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect();
        assert_eq!(words[2], "note=it's mine");
    }

    #[derive(Debug, Parser)]
    struct Submit {
        #[command(flatten)]
        args: SubmitArgs,
    }

    fn parse(args: &[&str]) -> anyhow::Result<v1::SubmitJobRequest> {
        let args = std::iter::once("submit").chain(args.iter().copied());
        Submit::try_parse_from(args)?.args.request()
    }

    #[test]
    fn flags_become_the_request() {
        let request = parse(&[
            "hi",
            "--instructions",
            "be brief",
            "--script",
            r#"[{"message":"hello"}]"#,
            "--tool",
            "calculate",
            "--tool",
            "echo",
            "--max-tool-rounds",
            "3",
            "--no-parallel",
            "--idempotency-key",
            "k1",
            "--deadline-ms",
            "5000",
            "--meta",
            "team=search",
            "--meta",
            "note=a=b",
        ])
        .unwrap();
        assert_eq!(request.input, "hi");
        assert_eq!(request.instructions, "be brief");
        let model = request.model.unwrap();
        assert_eq!(
            (model.provider.as_str(), model.script.as_str()),
            ("scripted", r#"[{"message":"hello"}]"#)
        );
        assert_eq!(request.tools, ["calculate", "echo"]);
        assert_eq!(request.max_tool_rounds, 3);
        assert_eq!(request.parallel_tool_calls, Some(false));
        assert_eq!(request.idempotency_key, "k1");
        assert_eq!(request.deadline_ms, 5000);
        assert_eq!(request.metadata["note"], "a=b");

        let plain = parse(&["hi"]).unwrap();
        let model = plain.model.unwrap();
        assert_eq!(model.script, demo::WEATHER_AND_MATH.script);
        assert_eq!(plain.parallel_tool_calls, None);
        let kg = parse(&["what did AMD launch between 2016 and 2020?"]).unwrap();
        assert_eq!(kg.model.unwrap().script, demo::AMD_LAUNCHES.script);

        let openai = parse(&["hi", "--provider", "openai-chat", "--model", "m"]).unwrap();
        let model = openai.model.unwrap();
        assert_eq!(
            (
                model.provider.as_str(),
                model.name.as_str(),
                model.script.as_str()
            ),
            ("openai-chat", "m", "")
        );
    }

    #[test]
    fn mistakes_name_the_flag() {
        let err = parse(&["hi", "--script", "[]"]).unwrap_err().to_string();
        assert!(
            err.contains("invalid script") && err.contains("no turns"),
            "{err}"
        );
        let err = parse(&["hi", "--provider", "openai-responses", "--script", "[]"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--provider scripted"), "{err}");
        let err = parse(&["hi", "--meta", "novalue"]).unwrap_err().to_string();
        assert!(err.contains("KEY=VALUE"), "{err}");
        let err = parse(&["hi", "--script", "[]", "--script-file", "x"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot be used with"), "{err}");
    }
}
