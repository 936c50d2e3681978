//! The job lifecycle as every side sees it: the orchestrator writes it, the
//! gRPC API serves it, clients read it.
//!
//! - [`JobStatus`]: where a job is in its life;
//! - [`JobErrorCode`]: why a job failed (or that it was cancelled);
//! - [`JobEvent`]: one entry of a job's event log, as `WatchJob` streams it
//!   (`kind` plus a JSON `data` object);
//! - [`JobId`]: the form of a job id, which names the job's tenant.
//!
//! The spellings here are the wire format: they are stored in Redis and sent
//! to clients, so a rename is a breaking change.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::v1;

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    /// Waiting for a runner.
    Queued,
    /// A runner works on it.
    Running,
    /// Parked until a person decides one of its held calls: no runner holds
    /// it (docs/approvals.md).
    WaitingForApproval,
    /// Finished with a final answer.
    Succeeded,
    /// Finished with an error.
    Failed,
    /// Stopped on request.
    Cancelled,
}

impl JobStatus {
    /// Every status, in life order.
    pub const ALL: [Self; 6] = [
        Self::Queued,
        Self::Running,
        Self::WaitingForApproval,
        Self::Succeeded,
        Self::Failed,
        Self::Cancelled,
    ];

    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::WaitingForApproval => "waiting_for_approval",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    /// Whether the job has ended: nothing is written to it any more.
    pub fn is_final(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Cancelled)
    }
}

impl fmt::Display for JobStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A status spelling that is not one of [`JobStatus::as_str`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown job status {0:?}")]
pub struct UnknownStatus(pub String);

impl FromStr for JobStatus {
    type Err = UnknownStatus;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|status| status.as_str() == text)
            .ok_or_else(|| UnknownStatus(text.to_owned()))
    }
}

impl From<JobStatus> for v1::JobStatus {
    fn from(status: JobStatus) -> Self {
        match status {
            JobStatus::Queued => Self::Queued,
            JobStatus::Running => Self::Running,
            JobStatus::WaitingForApproval => Self::WaitingForApproval,
            JobStatus::Succeeded => Self::Succeeded,
            JobStatus::Failed => Self::Failed,
            JobStatus::Cancelled => Self::Cancelled,
        }
    }
}

impl TryFrom<v1::JobStatus> for JobStatus {
    type Error = UnknownStatus;

    fn try_from(status: v1::JobStatus) -> Result<Self, Self::Error> {
        Ok(match status {
            v1::JobStatus::Queued => Self::Queued,
            v1::JobStatus::Running => Self::Running,
            v1::JobStatus::WaitingForApproval => Self::WaitingForApproval,
            v1::JobStatus::Succeeded => Self::Succeeded,
            v1::JobStatus::Failed => Self::Failed,
            v1::JobStatus::Cancelled => Self::Cancelled,
            v1::JobStatus::Unspecified => return Err(UnknownStatus("unspecified".into())),
        })
    }
}

/// Why a job ended without an answer. Stable, UPPER_SNAKE on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum JobErrorCode {
    /// The model asked for tools in more rounds than `max_tool_rounds`.
    MaxToolRoundsExceeded,
    /// The job did not finish before its deadline.
    DeadlineExceeded,
    /// A client cancelled the job.
    Cancelled,
    /// The job's state vanished from Redis (flushed, or a failover that lost
    /// writes).
    JobStateLost,
    /// The model API refused the request; retrying would not help.
    ModelRejected,
    /// The model API stayed unavailable through its retries.
    ModelUnavailable,
    /// The model API answered something that could not be understood.
    ModelInvalidResponse,
    /// The scripted model's script is invalid or has no turn left.
    ScriptError,
    /// The job, or its tenant, spent one of its budgets (the message names
    /// it): the job got no more model turns.
    BudgetExceeded,
}

impl JobErrorCode {
    /// Every code.
    pub const ALL: [Self; 9] = [
        Self::MaxToolRoundsExceeded,
        Self::DeadlineExceeded,
        Self::Cancelled,
        Self::JobStateLost,
        Self::ModelRejected,
        Self::ModelUnavailable,
        Self::ModelInvalidResponse,
        Self::ScriptError,
        Self::BudgetExceeded,
    ];

    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MaxToolRoundsExceeded => "MAX_TOOL_ROUNDS_EXCEEDED",
            Self::DeadlineExceeded => "DEADLINE_EXCEEDED",
            Self::Cancelled => "CANCELLED",
            Self::JobStateLost => "JOB_STATE_LOST",
            Self::ModelRejected => "MODEL_REJECTED",
            Self::ModelUnavailable => "MODEL_UNAVAILABLE",
            Self::ModelInvalidResponse => "MODEL_INVALID_RESPONSE",
            Self::ScriptError => "SCRIPT_ERROR",
            Self::BudgetExceeded => "BUDGET_EXCEEDED",
        }
    }
}

impl fmt::Display for JobErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for JobErrorCode {
    type Err = UnknownStatus;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|code| code.as_str() == text)
            .ok_or_else(|| UnknownStatus(text.to_owned()))
    }
}

/// The tokens a model turn used, as its provider reported them.
///
/// Fields in alphabetical order, as every event's (see [`JobEvent`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Of the prompt tokens, those read from the provider's prompt cache.
    #[serde(default)]
    pub cache_read_tokens: u64,
    /// Of the prompt tokens, those written to the provider's prompt cache
    /// (Anthropic's `cache_creation_input_tokens`).
    #[serde(default)]
    pub cache_write_tokens: u64,
    /// Prompt tokens, all of them: those read from or written to the
    /// provider's prompt cache included.
    pub input_tokens: u64,
    /// Completion tokens (reasoning included).
    pub output_tokens: u64,
}

impl Usage {
    /// Both usages added up (a turn of several responses); either alone
    /// when the other is unknown.
    pub fn sum(a: Option<Self>, b: Option<Self>) -> Option<Self> {
        match (a, b) {
            (Some(a), Some(b)) => Some(Self {
                input_tokens: a.input_tokens + b.input_tokens,
                output_tokens: a.output_tokens + b.output_tokens,
                cache_read_tokens: a.cache_read_tokens + b.cache_read_tokens,
                cache_write_tokens: a.cache_write_tokens + b.cache_write_tokens,
            }),
            (a, b) => a.or(b),
        }
    }
}

/// A piece of a streamed model turn, as the runner that asks the model
/// passes it to the job's watchers (on the job's events subject, marked
/// with the `Toolfleet-Delta` header, and directly in its own process).
/// Never stored: the checkpointed `model_turn` is the truth.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnDelta {
    /// The turn it belongs to (0-based, as `model_turn`'s `turn`).
    pub turn: u32,
    /// The lease epoch of the run that asked the model: a new one means
    /// the turn started again after a takeover.
    pub epoch: u64,
    /// Its position among the run's deltas of the turn, from 0.
    pub seq: u64,
    /// What it says.
    pub piece: DeltaPiece,
}

/// What a [`TurnDelta`] says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeltaPiece {
    /// More of the answer's text.
    Text(String),
    /// A tool call, named.
    ToolCall {
        /// Its position among the turn's calls.
        index: usize,
        /// The tool's name as the model wrote it.
        name: String,
    },
    /// The provider asks the model again: what came of the turn is void.
    Restart,
    /// Everything the turn said before the delta numbered `seq`, for a
    /// watcher that joins in the middle of it.
    SoFar {
        /// Its text so far.
        text: String,
        /// The calls it named so far, in order.
        tool_calls: Vec<String>,
    },
}

impl TurnDelta {
    /// Largest delta read from the bus.
    pub const MAX_BYTES: usize = 64 * 1024;

    /// A delta read from the bus; `None` when it is too large or not one.
    pub fn read(payload: &[u8]) -> Option<Self> {
        if payload.len() > Self::MAX_BYTES {
            return None;
        }
        serde_json::from_slice(payload).ok()
    }
}

/// A call as a [`JobEvent::ModelTurn`] lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallRef {
    /// The model's call id.
    pub call_id: String,
    /// The tool name the model wrote.
    pub name: String,
}

/// One entry of a job's event log. On the wire, `kind` is the variant's
/// snake_case name and `data` the JSON object of its fields.
///
/// Fields are declared in alphabetical order: that is the order the events
/// were written in before this type existed (a `serde_json::Map` sorts its
/// keys), so stored and streamed events stay byte for byte the same.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "data", rename_all = "snake_case")]
pub enum JobEvent {
    /// The job was submitted and waits for a runner.
    JobQueued {
        /// The client's labels.
        metadata: BTreeMap<String, String>,
    },
    /// A runner took the queued job.
    JobStarted {
        /// The lease epoch of the run.
        epoch: u64,
        /// The replica that runs it.
        owner: String,
    },
    /// A runner took over a job another runner had started (crash, drain).
    JobResumed {
        /// The lease epoch of the run; higher than every earlier one.
        epoch: u64,
        /// The replica that runs it now.
        owner: String,
    },
    /// A model turn was played and checkpointed.
    ModelTurn {
        /// Rounds with tool calls so far, this one included.
        round: u32,
        /// The turn's assistant text.
        text: String,
        /// The calls the model made in this turn, in order.
        tool_calls: Vec<CallRef>,
        /// 0-based index of the turn.
        turn: u32,
        /// The tokens the turn used, when the provider said.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        usage: Option<Usage>,
    },
    /// An attempt of a call is about to be published to the workers.
    ToolCallDispatched {
        /// 1 for the first attempt.
        attempt: u32,
        /// The call: the model's id where it is safe to show (1 to 64 of
        /// `[A-Za-z0-9_-]`) and the first with that id in the job, else
        /// `x.<position in the conversation>`.
        call_id: String,
        /// The tool.
        name: String,
        /// The version of the tool the attempt is pinned to: the contract
        /// hash of the manifest its model was shown (decision 0058).
        /// Absent from orchestrators older than this field.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tool_version: Option<String>,
    },
    /// A running call's tool reported how far it has come (an MCP server's
    /// `notifications/progress`). Advisory: at most one a second per
    /// attempt, and at most 100 per attempt, are recorded.
    ToolCallProgress {
        /// The attempt that reported it.
        attempt: u32,
        /// The call, as in `tool_call_dispatched`.
        call_id: String,
        /// A short note for people (at most 200 characters, no control
        /// characters).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
        /// How far, in the tool's unit.
        progress: f64,
        /// Where `progress` ends, when the tool knows.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        total: Option<f64>,
    },
    /// A tool's circuit breaker is open (docs/protection.md): the turn
    /// about to be played leaves it out of the model's tools (no
    /// `call_id`), or a call made to it is answered `TOOL_UNAVAILABLE`
    /// without running (`call_id`, as in `tool_call_result`). Advisory.
    ToolUnavailable {
        /// The tool.
        tool: String,
        /// Why, as the model is told: `N of its last M calls failed`.
        reason: String,
        /// The refused call, if a call was refused.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        call_id: Option<String>,
    },
    /// A call has its final envelope.
    ToolCallResult {
        /// Attempts it took (0: answered by the orchestrator's own checks).
        attempts: u32,
        /// The call: the model's id where it is safe to show (1 to 64 of
        /// `[A-Za-z0-9_-]`) and the first with that id in the job, else
        /// `x.<position in the conversation>`.
        call_id: String,
        /// The envelope's error code, if it failed.
        code: Option<String>,
        /// The tool.
        name: String,
        /// Whether the envelope is a success.
        ok: bool,
        /// Publish to result of the last attempt, as the runner saw it.
        round_trip_us: Option<u64>,
        /// Who produced the envelope when no worker did: `operator` (a
        /// person's verdict on an outcome the worker could not tell), or
        /// `built_in` (the orchestrator's own tool, `read_result`).
        /// Absent: the tool's worker, or the orchestrator's own checks
        /// (`attempts` 0).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        source: Option<String>,
        /// The version of the tool the worker ran the last attempt on (the
        /// contract hash its record says): the version its model was shown
        /// (decision 0058). Absent for calls answered without running, and
        /// from workers older than this field.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tool_version: Option<String>,
        /// How long the worker worked on the last attempt (checks and run),
        /// by its own clock; the rest of the round trip is the wait in the
        /// queue and the way there and back. Absent for calls answered
        /// without a worker, and from workers older than this field.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        worked_us: Option<u64>,
    },
    /// A call waits for a person's approval before it runs (it is held,
    /// not published).
    ToolCallApprovalRequested {
        /// The model's arguments, as it wrote them.
        arguments: String,
        /// The call, as [`ToolCallResult`](Self::ToolCallResult) names it.
        call_id: String,
        /// When it is answered `APPROVAL_EXPIRED` if nobody decided (Unix ms).
        expires_at: u64,
        /// Why it waits, for people.
        reason: String,
        /// Who asked: `manifest`, `tenant` or `job`.
        rule: String,
        /// The tool.
        tool: String,
    },
    /// A call's outcome is unknown (`OUTCOME_UNKNOWN` or
    /// `MAX_DELIVERIES_EXCEEDED`) and its job asks an operator
    /// (`on_unknown_outcome = "ask"`): it waits for a verdict before the
    /// model sees anything.
    ToolCallVerdictRequested {
        /// The attempt whose outcome is unknown.
        attempt: u32,
        /// The call, as [`ToolCallResult`](Self::ToolCallResult) names it.
        call_id: String,
        /// The worker's error code.
        code: String,
        /// When the worker's envelope is the answer if nobody gave a
        /// verdict (Unix ms).
        expires_at: u64,
        /// The worker's error message.
        message: String,
        /// The tool.
        tool: String,
    },
    /// A person decided a held call: it runs (`approved`) or is answered
    /// `REJECTED_BY_APPROVER` (`rejected`); or gave a verdict on a call
    /// whose outcome was unknown: `applied` (the model gets `result`),
    /// `not_applied` (it runs again) or `failed` (`FAILED_BY_OPERATOR`).
    ToolCallDecided {
        /// Whoever decided, as the tokens file names the token or client
        /// certificate; absent when it names none.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        approver: Option<String>,
        /// Arguments the approver gave instead of the model's, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        arguments: Option<String>,
        /// The call.
        call_id: String,
        /// `approved`, `rejected`, `applied`, `not_applied` or `failed`.
        decision: String,
        /// The approver's reason.
        reason: String,
        /// For `applied`: the result the model gets (JSON).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        result: Option<String>,
        /// The tenant whose token or certificate decided.
        tenant: String,
    },
    /// Every call of the round that could run has settled, and the rest
    /// wait for a decision: the job is parked, held by no runner, until one
    /// comes (or the first expires).
    JobWaitingForApproval {
        /// The held calls it waits for.
        calls: Vec<String>,
    },
    /// The job ended with the model's answer.
    JobSucceeded {
        /// The answer.
        output_text: String,
        /// What the job spent, when its run ended it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        spent: Option<Spend>,
    },
    /// The job ended with an error.
    JobFailed {
        /// Why.
        code: JobErrorCode,
        /// Detail for humans; absent on a job whose state was lost.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
        /// What the job spent, when its run ended it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        spent: Option<Spend>,
    },
    /// The job was cancelled.
    JobCancelled {
        /// Always [`JobErrorCode::Cancelled`].
        code: JobErrorCode,
        /// What the job spent, when its run ended it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        spent: Option<Spend>,
    },
}

/// What a job spent against its budget (docs/protection.md, "Budgets"):
/// in `GetJob`'s `spent` and on the event that ends it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spend {
    /// Tool cost units. (Fields in the order of their names: an event's
    /// data is written with its keys sorted.)
    pub cost_units: u64,
    /// Model tokens, input (cached included) and output.
    pub tokens: u64,
    /// Tool calls run by workers.
    pub tool_calls: u64,
}

impl std::fmt::Display for Spend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} model tokens, {} tool cost units, {} tool calls",
            self.tokens, self.cost_units, self.tool_calls
        )
    }
}

/// The `kind` and `data` of an event that does not decode.
#[derive(Debug, thiserror::Error)]
#[error("unreadable {kind:?} event")]
pub struct EventDecodeError {
    /// The kind as received.
    pub kind: String,
    /// What did not parse.
    #[source]
    pub source: serde_json::Error,
}

impl JobEvent {
    /// The event of a run's start under lease `epoch` by replica `owner`:
    /// [`JobResumed`](Self::JobResumed) when the job ran before, else
    /// [`JobStarted`](Self::JobStarted).
    pub fn run_started(epoch: u64, owner: String, resumed: bool) -> Self {
        if resumed {
            Self::JobResumed { epoch, owner }
        } else {
            Self::JobStarted { epoch, owner }
        }
    }

    /// The wire kind, e.g. `tool_call_result`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::JobQueued { .. } => "job_queued",
            Self::JobStarted { .. } => "job_started",
            Self::JobResumed { .. } => "job_resumed",
            Self::ModelTurn { .. } => "model_turn",
            Self::ToolCallDispatched { .. } => "tool_call_dispatched",
            Self::ToolCallProgress { .. } => "tool_call_progress",
            Self::ToolUnavailable { .. } => "tool_unavailable",
            Self::ToolCallResult { .. } => "tool_call_result",
            Self::ToolCallApprovalRequested { .. } => "tool_call_approval_requested",
            Self::ToolCallVerdictRequested { .. } => "tool_call_verdict_requested",
            Self::ToolCallDecided { .. } => "tool_call_decided",
            Self::JobWaitingForApproval { .. } => "job_waiting_for_approval",
            Self::JobSucceeded { .. } => "job_succeeded",
            Self::JobFailed { .. } => "job_failed",
            Self::JobCancelled { .. } => "job_cancelled",
        }
    }

    /// Whether the event ends the job: the last of its log.
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            Self::JobSucceeded { .. } | Self::JobFailed { .. } | Self::JobCancelled { .. }
        )
    }

    /// The status a job has after this event, if the event changes it.
    pub fn status(&self) -> Option<JobStatus> {
        match self {
            Self::JobQueued { .. } => Some(JobStatus::Queued),
            Self::JobStarted { .. } | Self::JobResumed { .. } => Some(JobStatus::Running),
            Self::JobWaitingForApproval { .. } => Some(JobStatus::WaitingForApproval),
            Self::JobSucceeded { .. } => Some(JobStatus::Succeeded),
            Self::JobFailed { .. } => Some(JobStatus::Failed),
            Self::JobCancelled { .. } => Some(JobStatus::Cancelled),
            Self::ModelTurn { .. }
            | Self::ToolCallDispatched { .. }
            | Self::ToolCallProgress { .. }
            | Self::ToolUnavailable { .. }
            | Self::ToolCallResult { .. }
            | Self::ToolCallApprovalRequested { .. }
            | Self::ToolCallVerdictRequested { .. }
            | Self::ToolCallDecided { .. } => None,
        }
    }

    /// The `data` JSON object, as stored and streamed.
    pub fn data_json(&self) -> String {
        // Adjacent tagging writes `{"kind":"<kind>","data":<data>}`: the data
        // is what follows the kind, less the closing brace. Written straight
        // to text, not through a `serde_json::Value` (a map and a string per
        // field; about 3% of the orchestrator's CPU in a profile of the
        // bench). Every variant declares its fields in name order, so the
        // keys come sorted, as they did through a `Value`. The event is
        // plain data: serializing it cannot fail.
        let whole = serde_json::to_string(self).unwrap_or_default();
        let data_at = r#"{"kind":"","data":"#.len() + self.kind().len();
        whole
            .get(data_at..whole.len().saturating_sub(1))
            .map_or_else(|| "{}".to_owned(), str::to_owned)
    }

    /// Decodes an event from its wire `kind` and `data`.
    ///
    /// # Errors
    ///
    /// An unknown kind (a newer server) or data that does not match it.
    pub fn decode(kind: &str, data: &str) -> Result<Self, EventDecodeError> {
        let error = |source| EventDecodeError {
            kind: kind.to_owned(),
            source,
        };
        let data: serde_json::Value = serde_json::from_str(data).map_err(error)?;
        serde_json::from_value(serde_json::json!({"kind": kind, "data": data})).map_err(error)
    }
}

/// Longest tenant name.
pub const MAX_TENANT_LEN: usize = 64;

/// Whether `name` can name a tenant: 1 to 64 lowercase ASCII letters,
/// digits, `-` and `_`. Tenant names go into job ids and so into NATS
/// subjects and Redis keys: a closed alphabet.
pub fn is_valid_tenant(name: &str) -> bool {
    (1..=MAX_TENANT_LEN).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// The hex digits that end every job id: 12 of the submission time in
/// milliseconds (so ids sort by time), 16 random.
const SERIAL_LEN: usize = 28;

/// A job's id, checked: `<tenant>-<28 lowercase hex digits>`. Made by
/// [`JobId::new`] or read by [`JobId::parse`] where an id comes in (a
/// client's request, a job message, an index in Redis), and passed as this
/// type from there on: an id that reaches a subject or a key is one of this
/// form.
///
/// The tenant is part of the id so that everything keyed by the id carries
/// it: the job's Redis keys (`tf:{acme-0190…}:events`, which a per-tenant
/// Redis ACL or a scan can select) and its reply subject. An id whose tenant
/// is not the caller's is refused before anything is read. Ids made before
/// tenants existed are the 28 digits alone; they stay valid, with no tenant.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobId(String);

impl JobId {
    /// A new id for `tenant`'s job submitted at `millis`, with `random`
    /// for uniqueness.
    ///
    /// # Panics
    ///
    /// If `tenant` is not a valid tenant name: callers hold a checked one.
    pub fn new(tenant: &str, millis: u64, random: u64) -> Self {
        assert!(is_valid_tenant(tenant), "a checked tenant name");
        // 12 hex digits of milliseconds last until the year 10889.
        Self(format!(
            "{tenant}-{:012x}{random:016x}",
            millis & 0xffff_ffff_ffff
        ))
    }

    /// Reads `id`; `None` when it is not a job id of this form (a client's
    /// or a message's bytes can be anything).
    pub fn parse(id: &str) -> Option<Self> {
        tenant_of(id).map(|_| Self(id.to_owned()))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The tenant the id names; `None` for an id from before tenants.
    pub fn tenant(&self) -> Option<&str> {
        tenant_of(&self.0).flatten()
    }

    /// Whether a caller of `tenant` may see the job with this id as far as
    /// the id tells (an id without a tenant defers to the stored record).
    pub fn may_belong_to(&self, tenant: &str) -> bool {
        self.tenant().is_none_or(|named| named == tenant)
    }
}

/// The tenant `id` names (`Some(None)`: an id from before tenants), or
/// `None` when `id` is not a job id.
fn tenant_of(id: &str) -> Option<Option<&str>> {
    let serial_start = id.len().checked_sub(SERIAL_LEN)?;
    let serial = id.get(serial_start..)?;
    if !serial
        .bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return None;
    }
    if serial_start == 0 {
        return Some(None);
    }
    let tenant = id[..serial_start].strip_suffix('-')?;
    is_valid_tenant(tenant).then_some(Some(tenant))
}

crate::id::checked_id!(
    JobId,
    |id| tenant_of(id).is_some(),
    "not a job id (<tenant>-<28 lowercase hex digits>)"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_ids_name_their_tenant_and_read_back() {
        let id = JobId::new("acme-eu_1", 0x0190_0000_0001, 0xdead_beef);
        assert_eq!(id, "acme-eu_1-01900000000100000000deadbeef");
        assert_eq!(JobId::parse(&id), Some(id.clone()));
        assert_eq!(id.tenant(), Some("acme-eu_1"));
        assert!(id.may_belong_to("acme-eu_1"));
        assert!(!id.may_belong_to("acme"));
        // Ids from before tenants: the digits alone, owner unknown.
        let legacy = JobId::parse("019000000001000000000000beef").unwrap();
        assert_eq!(legacy.tenant(), None);
        assert!(legacy.may_belong_to("anyone"));
        // On the wire, the text alone; read back only when valid.
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(json, "\"acme-eu_1-01900000000100000000deadbeef\"");
        assert_eq!(serde_json::from_str::<JobId>(&json).unwrap(), id);
        assert!(serde_json::from_str::<JobId>("\"acme\"").is_err());
    }

    #[test]
    fn anything_else_is_not_a_job_id() {
        for bad in [
            "",
            "acme",
            "acme-",
            "-019000000001000000000000beef",
            "Acme-019000000001000000000000beef",
            "acme019000000001000000000000beef",
            "acme-019000000001000000000000BEEF",
            "acme-01900000000100000000000beef",
            "ac.me-019000000001000000000000beef",
            "acme\n-019000000001000000000000beef",
            "a}{b-019000000001000000000000beef",
            "é-019000000001000000000000beef",
            "acme-019000000001000000000000beeé",
        ] {
            assert_eq!(JobId::parse(bad), None, "{bad:?}");
        }
        let long = format!("{}-019000000001000000000000beef", "a".repeat(65));
        assert_eq!(JobId::parse(&long), None);
    }

    fn every_event() -> Vec<(JobEvent, &'static str)> {
        vec![
            (
                JobEvent::JobQueued {
                    metadata: BTreeMap::from([("team".into(), "a".into())]),
                },
                r#"{"metadata":{"team":"a"}}"#,
            ),
            (
                JobEvent::JobStarted {
                    epoch: 1,
                    owner: "o-1".into(),
                },
                r#"{"epoch":1,"owner":"o-1"}"#,
            ),
            (
                JobEvent::JobResumed {
                    epoch: 2,
                    owner: "o-2".into(),
                },
                r#"{"epoch":2,"owner":"o-2"}"#,
            ),
            (
                JobEvent::ModelTurn {
                    round: 1,
                    text: String::new(),
                    tool_calls: vec![CallRef {
                        call_id: "c1".into(),
                        name: "echo".into(),
                    }],
                    turn: 0,
                    usage: None,
                },
                r#"{"round":1,"text":"","tool_calls":[{"call_id":"c1","name":"echo"}],"turn":0}"#,
            ),
            (
                JobEvent::ModelTurn {
                    round: 0,
                    text: "hi".into(),
                    tool_calls: vec![],
                    turn: 1,
                    usage: Some(Usage {
                        cache_read_tokens: 2,
                        cache_write_tokens: 0,
                        input_tokens: 10,
                        output_tokens: 3,
                    }),
                },
                r#"{"round":0,"text":"hi","tool_calls":[],"turn":1,"usage":{"cache_read_tokens":2,"cache_write_tokens":0,"input_tokens":10,"output_tokens":3}}"#,
            ),
            (
                JobEvent::ToolCallDispatched {
                    attempt: 1,
                    call_id: "c1".into(),
                    name: "echo".into(),
                    tool_version: None,
                },
                r#"{"attempt":1,"call_id":"c1","name":"echo"}"#,
            ),
            (
                JobEvent::ToolCallDispatched {
                    attempt: 2,
                    call_id: "c1".into(),
                    name: "echo".into(),
                    tool_version: Some("c0ffee".into()),
                },
                r#"{"attempt":2,"call_id":"c1","name":"echo","tool_version":"c0ffee"}"#,
            ),
            (
                JobEvent::ToolCallResult {
                    attempts: 0,
                    call_id: "c2".into(),
                    code: Some("UNKNOWN_TOOL".into()),
                    name: "rm".into(),
                    ok: false,
                    round_trip_us: None,
                    source: None,
                    worked_us: None,
                    tool_version: None,
                },
                r#"{"attempts":0,"call_id":"c2","code":"UNKNOWN_TOOL","name":"rm","ok":false,"round_trip_us":null}"#,
            ),
            (
                JobEvent::ToolCallResult {
                    attempts: 2,
                    call_id: "c3".into(),
                    code: None,
                    name: "charge".into(),
                    ok: true,
                    round_trip_us: Some(900),
                    source: Some("operator".into()),
                    worked_us: None,
                    tool_version: None,
                },
                r#"{"attempts":2,"call_id":"c3","code":null,"name":"charge","ok":true,"round_trip_us":900,"source":"operator"}"#,
            ),
            (
                JobEvent::ToolCallResult {
                    attempts: 1,
                    call_id: "c1".into(),
                    code: None,
                    name: "echo".into(),
                    ok: true,
                    round_trip_us: Some(900),
                    source: None,
                    worked_us: Some(150),
                    tool_version: Some("c0ffee".into()),
                },
                r#"{"attempts":1,"call_id":"c1","code":null,"name":"echo","ok":true,"round_trip_us":900,"tool_version":"c0ffee","worked_us":150}"#,
            ),
            (
                JobEvent::JobSucceeded {
                    output_text: "4".into(),
                    spent: None,
                },
                r#"{"output_text":"4"}"#,
            ),
            (
                JobEvent::JobFailed {
                    code: JobErrorCode::MaxToolRoundsExceeded,
                    message: Some("too many".into()),
                    spent: Some(Spend {
                        tokens: 300,
                        cost_units: 15,
                        tool_calls: 5,
                    }),
                },
                r#"{"code":"MAX_TOOL_ROUNDS_EXCEEDED","message":"too many","spent":{"cost_units":15,"tokens":300,"tool_calls":5}}"#,
            ),
            (
                JobEvent::JobFailed {
                    code: JobErrorCode::JobStateLost,
                    message: None,
                    spent: None,
                },
                r#"{"code":"JOB_STATE_LOST"}"#,
            ),
            (
                JobEvent::JobCancelled {
                    code: JobErrorCode::Cancelled,
                    spent: None,
                },
                r#"{"code":"CANCELLED"}"#,
            ),
        ]
    }

    #[test]
    fn events_keep_the_wire_format_and_decode_back() {
        for (event, data) in every_event() {
            assert_eq!(event.data_json(), data, "{}", event.kind());
            // Keys in name order, as a `Value` (a sorted map) writes them: a
            // field declared out of order fails here.
            let value = serde_json::to_value(&event).unwrap();
            assert_eq!(value["data"].to_string(), data, "{}", event.kind());
            assert_eq!(JobEvent::decode(event.kind(), data).unwrap(), event);
            assert_eq!(
                event.is_final(),
                event.status().is_some_and(JobStatus::is_final),
                "{}",
                event.kind()
            );
        }
        assert!(JobEvent::decode("job_exploded", "{}").is_err());
        assert!(JobEvent::decode("job_succeeded", "{").is_err());
        assert!(JobEvent::decode("job_succeeded", r#"{"output":"x"}"#).is_err());
    }

    #[test]
    fn statuses_and_codes_round_trip_their_spelling() {
        for status in JobStatus::ALL {
            assert_eq!(status.as_str().parse::<JobStatus>().unwrap(), status);
            assert_eq!(
                serde_json::to_string(&status).unwrap(),
                format!("\"{status}\"")
            );
            assert_eq!(
                JobStatus::try_from(v1::JobStatus::from(status)).unwrap(),
                status
            );
        }
        assert!("done".parse::<JobStatus>().is_err());
        for code in JobErrorCode::ALL {
            assert_eq!(code.as_str().parse::<JobErrorCode>().unwrap(), code);
            assert_eq!(serde_json::to_string(&code).unwrap(), format!("\"{code}\""));
        }
    }
}
