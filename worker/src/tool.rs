//! The `Tool` trait: what a tool author implements.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::Value;
use tokio_util::sync::CancellationToken;
use toolfleet_proto::{ErrorCode, ToolManifest};

pub use crate::checkpoint::Checkpoint;
pub use crate::progress::Progress;

/// A tool the worker can execute.
///
/// The runtime validates the arguments against the manifest's JSON Schema before
/// `call` sees them, enforces the timeout, and turns the result (or a panic) into
/// an envelope. `call` only has to do the work and classify its failures.
///
/// ```no_run
/// use serde_json::{json, Value};
/// use toolfleet_worker::{ErrorCode, Tool, ToolContext, ToolError, ToolManifest, Toolbox};
///
/// /// A business rule the model can act on: no point in retrying.
/// const PALINDROME: ErrorCode = ErrorCode::from_static("PALINDROME");
///
/// /// Reverses a string.
/// struct ReverseText;
///
/// impl Tool for ReverseText {
///     fn manifest(&self) -> ToolManifest {
///         ToolManifest::new(
///             "reverse_text",
///             "Reverse a piece of text. Use it only when asked to reverse text.",
///             json!({"type": "object", "additionalProperties": false, "required": ["text"],
///                    "properties": {"text": {"type": "string", "maxLength": 10000}}}),
///         )
///     }
///
///     async fn call(&self, args: Value, _ctx: ToolContext) -> Result<Value, ToolError> {
///         let text = args["text"].as_str().unwrap_or_default(); // the schema made it a string
///         let reversed: String = text.chars().rev().collect();
///         if reversed == text {
///             // Terminal: the same arguments would fail again. A failure
///             // that may pass later (a backend down) is ToolError::retryable.
///             return Err(ToolError::terminal(PALINDROME, "the text reads the same reversed"));
///         }
///         Ok(json!({"reversed": reversed}))
///     }
/// }
///
/// #[tokio::main]
/// async fn main() -> anyhow::Result<()> {
///     // As the real worker reads its configuration: defaults, then the TOML
///     // file $TOOLFLEET_CONFIG names, then the TOOLFLEET_* variables
///     // (TOOLFLEET_NATS__URL, ...). WorkerOptions::default() reads none.
///     let file = std::env::var_os("TOOLFLEET_CONFIG").map(std::path::PathBuf::from);
///     let options = toolfleet_worker::WorkerOptions::load(file.as_deref(), json!({}))?;
///     let toolbox = Toolbox::new().with(ReverseText);
///     let shutdown = tokio_util::sync::CancellationToken::new();
///     toolfleet_worker::Worker::connect(options).await?.run(toolbox, shutdown).await?;
///     Ok(())
/// }
/// ```
pub trait Tool: Send + Sync + 'static {
    /// Name, description, schema and execution policy of the tool.
    fn manifest(&self) -> ToolManifest;

    /// Executes one call with arguments that already match the schema.
    ///
    /// # Errors
    ///
    /// A [`ToolError`] that says whether another attempt may succeed.
    fn call(
        &self,
        args: Value,
        ctx: ToolContext,
    ) -> impl Future<Output = Result<Value, ToolError>> + Send;

    /// For a tool with side effects: was the call with `ctx.idempotency_key`
    /// already applied? The runtime asks before it runs a call again whose
    /// earlier execution died without a result. The default cannot tell, and
    /// the call is then answered with `OUTCOME_UNKNOWN` instead of running it
    /// a second time.
    fn probe(&self, args: Value, ctx: ToolContext) -> impl Future<Output = Applied> + Send {
        let _ = (args, ctx);
        async { Applied::Unknown }
    }

    /// Whether the tool saves checkpoints ([`ToolContext::checkpoint`]) to
    /// be resumed from should its worker die (decision 0044). A `read_only`
    /// call of a tool that does not is first run without a claim in the
    /// ledger (decision 0060), where a checkpoint could not be kept.
    /// Default: false.
    fn saves_checkpoints(&self) -> bool {
        false
    }
}

/// What a tool's [`Tool::probe`] knows about an earlier execution.
#[derive(Debug, Clone, PartialEq)]
pub enum Applied {
    /// The effect happened; answer with this data instead of running again.
    Yes(Value),
    /// The effect did not happen; running the call is safe.
    No,
    /// The tool cannot tell (it has no way to know).
    Unknown,
    /// The tool could tell, but what it asks is unreachable right now (a
    /// dropped connection, a restart). The runtime hands the call back and
    /// asks again on its next delivery, instead of answering
    /// `OUTCOME_UNKNOWN` about an effect that can still be known.
    Unavailable,
}

/// What a tool knows about the call it is executing.
#[derive(Debug, Clone)]
pub struct ToolContext {
    /// The job the call belongs to.
    pub job_id: String,
    /// The call's id in the fleet, its wire id
    /// ([`ToolCall::call_id`](toolfleet_proto::ToolCall::call_id)): the same
    /// for every attempt and delivery of the call. Not the model's own id.
    pub call_id: String,
    /// The model's own id of the call (what the model wrote, such as
    /// `call_…` or `toolu_…`), to match the model's transcript with: `None`
    /// when the model's id was not 1 to 64 ASCII letters, digits, `_` and
    /// `-`, or the orchestrator is older than this field. The call's
    /// identity in the fleet is [`call_id`](Self::call_id), never this.
    pub model_call_id: Option<String>,
    /// 1-based attempt number.
    pub attempt: u32,
    /// The same for every attempt and delivery of this call: pass it to the
    /// systems the tool changes so that they apply the change once.
    pub idempotency_key: String,
    /// When the result stops being useful, if the call has a deadline.
    pub deadline: Option<SystemTime>,
    /// Cancelled when the runtime gives up on the call (timeout, shutdown,
    /// or the call's job was cancelled: the tool is then dropped).
    pub cancelled: CancellationToken,
    /// Cancelled, before `cancelled`, when the drain hands the call back
    /// unfinished: another worker runs it next, or resumes it from its
    /// [`checkpoint`](Self::checkpoint). Work the tool started elsewhere (a
    /// server's task) is then left running for it.
    pub handed_back: CancellationToken,
    /// What an earlier execution of this attempt saved to resume from, and
    /// where this one saves its own (decision 0044).
    pub checkpoint: Checkpoint,
    /// Where the tool may report how far it has come (`report`): the job's
    /// watchers see it as a `tool_call_progress` event. Its default reports
    /// nowhere.
    pub progress: Progress,
}

#[cfg(test)]
impl ToolContext {
    /// A context for calling a tool directly in a unit test: attempt 1, no
    /// deadline, never cancelled.
    pub(crate) fn for_test() -> Self {
        Self {
            job_id: "job".into(),
            call_id: "call".into(),
            model_call_id: None,
            attempt: 1,
            idempotency_key: "key".into(),
            deadline: None,
            cancelled: CancellationToken::new(),
            handed_back: CancellationToken::new(),
            checkpoint: Checkpoint::default(),
            progress: Progress::default(),
        }
    }
}

/// How a tool call failed. Decide retryability where the error is created:
/// everything is terminal unless it says otherwise.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// The arguments passed the schema but break a rule of the tool. Retrying
    /// with the same arguments won't help.
    #[error("invalid arguments: {0}")]
    InvalidArguments(String),
    /// A dependency did not answer in time; another attempt may succeed.
    #[error("upstream timed out after {0:?}")]
    UpstreamTimeout(Duration),
    /// A dependency asked us to slow down.
    #[error("rate limited")]
    RateLimited {
        /// How long the dependency asked us to wait, if it said.
        retry_after: Option<Duration>,
    },
    /// A failure with a tool-specific code (`LOCATION_NOT_FOUND`). The message is
    /// shown to the model, so it must not contain internals.
    #[error("{code}: {message}")]
    Coded {
        /// Stable UPPER_SNAKE code.
        code: ErrorCode,
        /// Shown to the model.
        message: String,
        /// Whether another attempt may succeed.
        retryable: bool,
    },
    /// Anything else. The detail is logged; the model sees a generic message.
    #[error("tool failed")]
    Internal(#[source] anyhow::Error),
}

impl ToolError {
    /// A terminal failure with a tool-specific code.
    pub fn terminal(code: ErrorCode, message: impl Into<String>) -> Self {
        Self::Coded {
            code,
            message: message.into(),
            retryable: false,
        }
    }

    /// A retryable failure with a tool-specific code.
    pub fn retryable(code: ErrorCode, message: impl Into<String>) -> Self {
        Self::Coded {
            code,
            message: message.into(),
            retryable: true,
        }
    }

    /// Whether another attempt of the same call may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::UpstreamTimeout(_) | Self::RateLimited { .. } => true,
            Self::Coded { retryable, .. } => *retryable,
            Self::InvalidArguments(_) | Self::Internal(_) => false,
        }
    }
}

/// The set of tools one worker process serves, by name.
#[derive(Clone, Default)]
pub struct Toolbox {
    tools: Vec<Arc<dyn ErasedTool>>,
}

impl Toolbox {
    /// An empty toolbox.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a tool. A later tool with the same name replaces the earlier one.
    #[must_use]
    pub fn with(mut self, tool: impl Tool) -> Self {
        let tool: Arc<dyn ErasedTool> = Arc::new(tool);
        let name = tool.manifest().name;
        self.tools.retain(|t| t.manifest().name != name);
        self.tools.push(tool);
        self
    }

    /// Adds every tool of another toolbox.
    #[must_use]
    pub fn merge(mut self, other: Toolbox) -> Self {
        for tool in other.tools {
            let name = tool.manifest().name;
            self.tools.retain(|t| t.manifest().name != name);
            self.tools.push(tool);
        }
        self
    }

    /// Keeps only the tools named in `names`.
    #[must_use]
    pub fn only(mut self, names: &[String]) -> Self {
        self.tools.retain(|t| names.contains(&t.manifest().name));
        self
    }

    /// The manifests of all tools, in insertion order.
    pub fn manifests(&self) -> Vec<ToolManifest> {
        self.tools.iter().map(|t| t.manifest()).collect()
    }

    pub(crate) fn into_tools(self) -> Vec<Arc<dyn ErasedTool>> {
        self.tools
    }
}

/// Object-safe form of [`Tool`], so a toolbox can hold different tool types.
pub(crate) trait ErasedTool: Send + Sync {
    fn manifest(&self) -> ToolManifest;
    fn call(
        &self,
        args: Value,
        ctx: ToolContext,
    ) -> Pin<Box<dyn Future<Output = Result<Value, ToolError>> + Send + '_>>;
    fn probe(
        &self,
        args: Value,
        ctx: ToolContext,
    ) -> Pin<Box<dyn Future<Output = Applied> + Send + '_>>;
    fn saves_checkpoints(&self) -> bool;
}

impl<T: Tool> ErasedTool for T {
    fn manifest(&self) -> ToolManifest {
        Tool::manifest(self)
    }

    fn call(
        &self,
        args: Value,
        ctx: ToolContext,
    ) -> Pin<Box<dyn Future<Output = Result<Value, ToolError>> + Send + '_>> {
        Box::pin(Tool::call(self, args, ctx))
    }

    fn probe(
        &self,
        args: Value,
        ctx: ToolContext,
    ) -> Pin<Box<dyn Future<Output = Applied> + Send + '_>> {
        Box::pin(Tool::probe(self, args, ctx))
    }

    fn saves_checkpoints(&self) -> bool {
        Tool::saves_checkpoints(self)
    }
}
