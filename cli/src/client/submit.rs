//! `toolfleet submit`: a job from its flags, optionally followed to its end.

use std::collections::HashMap;
use std::io::Read as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context as _, anyhow, bail};
use clap::{Args, ValueEnum};
use toolfleet_orchestrator::Scripted;
use toolfleet_orchestrator::job::ProviderKind;
use toolfleet_proto::v1;

use super::connection::{ApiClient, Server, rpc_error};
use super::events::{each_event, follow, say_ending};
use crate::demo::{self, Demo};
use crate::output::outln;

/// The model of the `openai-*` providers when `--model` is not given.
pub(crate) const DEFAULT_OPENAI_MODEL: &str = "gpt-4.1-mini";

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
    /// Run every call of the job, even one the tenant's result cache could
    /// answer, and cache none of its results (docs/protection.md).
    #[arg(long)]
    no_result_cache: bool,
    /// The job's budget of model tokens, input and output: a job that
    /// spent them gets no more turns and fails BUDGET_EXCEEDED
    /// (docs/protection.md, "Budgets").
    #[arg(long, value_name = "N")]
    budget_tokens: Option<u64>,
    /// The job's budget of tool cost units: each attempt costs its tool's
    /// `cost` (default 1).
    #[arg(long, value_name = "N")]
    budget_cost_units: Option<u64>,
    /// The job's budget of tool calls, each counted once.
    #[arg(long, value_name = "N")]
    budget_tool_calls: Option<u64>,
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
    let Ok(live) = client.list_tools(v1::ListToolsRequest::default()).await else {
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
            result_cache: self.no_result_cache.then_some(false),
            budget: self.budget(),
        })
    }

    /// The `--budget-*` flags, if any is given.
    fn budget(&self) -> Option<v1::Budget> {
        let budget = v1::Budget {
            max_tokens: self.budget_tokens,
            max_cost_units: self.budget_cost_units,
            max_tool_calls: self.budget_tool_calls,
        };
        (budget != v1::Budget::default()).then_some(budget)
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

pub(super) fn parse_meta(text: &str) -> Result<(String, String), String> {
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
            "--no-result-cache",
            "--budget-tokens",
            "5000",
            "--budget-tool-calls",
            "7",
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
        assert_eq!(request.result_cache, Some(false));
        let budget = request.budget.unwrap();
        assert_eq!(
            (
                budget.max_tokens,
                budget.max_cost_units,
                budget.max_tool_calls
            ),
            (Some(5000), None, Some(7))
        );
        assert_eq!(request.idempotency_key, "k1");
        assert_eq!(request.deadline_ms, 5000);
        assert_eq!(request.metadata["note"], "a=b");

        let plain = parse(&["hi"]).unwrap();
        let model = plain.model.unwrap();
        assert_eq!(model.script, demo::WEATHER_AND_MATH.script);
        assert_eq!(plain.parallel_tool_calls, None);
        assert_eq!(plain.result_cache, None, "the cache is the default");
        assert_eq!(plain.budget, None, "no budget of the job's own");
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
