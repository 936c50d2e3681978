//! The job as the orchestrator's modules share it: what was submitted
//! ([`JobSpec`]), the conversation ([`Item`]), what is stored
//! ([`JobRecord`], its log's [`Event`]s), the runner's hold on it ([`Lease`]), how it ends
//! ([`Ending`]), its id and the clock. Plain data, owned by no single step,
//! so that the store, the model providers, the runner and the API can all
//! use it without depending on each other.
//!
//! What crosses a process boundary (status, events, error codes) is in
//! `toolfleet_proto::job` and re-exported here.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
pub use toolfleet_proto::ToolManifest;
use toolfleet_proto::call::{EventId, WireId};
pub use toolfleet_proto::job::{
    CallRef, DeltaPiece, JobErrorCode, JobEvent, JobId, JobStatus, Spend, TurnDelta, Usage,
};
pub use toolfleet_service::clock::now_ms;
pub use toolfleet_service::traces::JobTrace;

/// A new id for a job of `tenant` (a checked name): the tenant, then 28
/// time-ordered hex digits ([`JobId`]); safe in subjects and keys.
pub fn new_job_id(tenant: &str) -> JobId {
    JobId::new(tenant, now_ms(), rand::random::<u64>())
}

/// How a job's calls are named on the wire (NATS headers and message ids,
/// Redis keys). Anyone who knows a call's ids could take its JetStream
/// message id or write its ledger keys, so new jobs name their calls from a
/// secret of their own, kept in the job record, which only orchestrators may
/// read: a worker pool learns the ids of the calls it serves and no others.
/// The id of a call depends only on the secret and the call's position in
/// the conversation (which only grows), so a resumed run finds its calls
/// again.
#[derive(Clone, PartialEq, Eq)]
pub enum WireIds {
    /// `c` and 24 hex digits of SHA-256 over the secret and the position.
    Secret(String),
    /// Jobs stored before call secrets: the model's id where it is safe and
    /// the first with that id, else `x.<position>`.
    Legacy,
}

impl WireIds {
    /// A new job's secret: 128 random bits, in hex.
    pub(crate) fn new_secret() -> String {
        format!("{:032x}", rand::random::<u128>())
    }

    /// The ids of a job whose record holds `secret` (empty for a job stored
    /// before secrets).
    pub(crate) fn from_secret(secret: &str) -> Self {
        if secret.is_empty() {
            Self::Legacy
        } else {
            Self::Secret(secret.to_owned())
        }
    }

    /// The wire id of the call at `position` in the conversation, whose
    /// model id is `call_id`; `duplicate` when an earlier call had that id.
    pub(crate) fn of(&self, position: usize, call_id: &str, duplicate: bool) -> WireId {
        use sha2::{Digest, Sha256};
        match self {
            Self::Secret(secret) => {
                let digest = Sha256::new()
                    .chain_update(secret.as_bytes())
                    .chain_update(b":")
                    .chain_update(position.to_string().as_bytes())
                    .finalize();
                // The first 12 bytes, in one formatting call: a `format!` per
                // byte showed in the orchestrator's profile.
                WireId::parse(&format!("c{digest:.24x}"))
                    .expect("`c` and 24 hex digits is a wire id")
            }
            Self::Legacy => EventId::of(position, call_id, duplicate).into(),
        }
    }
}

/// The secret never reaches a log line.
impl std::fmt::Debug for WireIds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Secret(_) => f.write_str("WireIds::Secret(..)"),
            Self::Legacy => f.write_str("WireIds::Legacy"),
        }
    }
}

/// Which model runs a job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProviderKind {
    /// The deterministic scripted model.
    Scripted,
    /// OpenAI Responses API.
    OpenaiResponses,
    /// OpenAI Chat Completions and compatible servers.
    OpenaiChat,
    /// Anthropic's Messages API.
    AnthropicMessages,
    /// No model: a call job's one call ([`CallSpec`]). Not a provider a
    /// request can name: `SubmitJobRequest.call` makes it.
    Call,
}

impl ProviderKind {
    /// Parses the provider name of the API.
    pub(crate) fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == name)
    }

    /// Every provider, as the API spells them.
    pub const ALL: [Self; 4] = [
        Self::Scripted,
        Self::OpenaiResponses,
        Self::OpenaiChat,
        Self::AnthropicMessages,
    ];

    /// The API's name of the provider.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Scripted => "scripted",
            Self::OpenaiResponses => "openai-responses",
            Self::OpenaiChat => "openai-chat",
            Self::AnthropicMessages => "anthropic-messages",
            Self::Call => "call",
        }
    }
}

/// A job as submitted, after defaults were applied.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    /// The user message.
    pub input: String,
    /// Instructions for the model.
    pub instructions: String,
    /// The provider.
    pub provider: ProviderKind,
    /// The provider's model name.
    pub model: String,
    /// The script, for the scripted provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script: Option<String>,
    /// The most tokens the model may write in one turn (`model.max_tokens`);
    /// none: the provider's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Whether its turns are streamed to its watchers as they are written.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stream: bool,
    /// Its calls are never answered from the tenant's result cache, nor
    /// their results stored in it (`SubmitJobRequest.result_cache` false).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_result_cache: bool,
    /// The one call of a call job (provider [`ProviderKind::Call`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call: Option<CallSpec>,
    /// Allow-list of tools; empty means every live tool.
    pub tools: Vec<String>,
    /// Most model turns with tool calls.
    pub max_tool_rounds: u32,
    /// Whether one turn's calls run concurrently.
    pub parallel_tool_calls: bool,
    /// Unix epoch ms after which the job fails with `DEADLINE_EXCEEDED`.
    pub deadline_ms: u64,
    /// Client labels.
    pub metadata: BTreeMap<String, String>,
    /// Who submitted it.
    pub tenant: String,
    /// Which credential of the tenant submitted it, from the credential
    /// alone (`auth::Caller::submitter`): the person it
    /// names, else `token:…` or `client:…`. `None` without authentication,
    /// and for a job stored before submitters were recorded (decision
    /// 0049). An agent that is neither operator nor reader sees only its
    /// own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitter: Option<String>,
    /// Which calls wait for a person's approval, besides what their tools'
    /// manifests ask; kept with the job so that every run of it decides
    /// the same (a job stored before approvals has none).
    #[serde(default, skip_serializing_if = "ApprovalPolicy::is_empty")]
    pub approval: ApprovalPolicy,
    /// The limits the API set when the job was submitted; kept with the job
    /// so that a resumed run obeys the same ones.
    #[serde(default)]
    pub limits: JobLimits,
    /// What the job may spend (`SubmitJobRequest.budget`).
    #[serde(default, skip_serializing_if = "crate::budget::Budget::is_empty")]
    pub budget: crate::budget::Budget,
}

/// The one call of a call job: a job without a model, whose output is the
/// call's result envelope (decision 0039).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallSpec {
    /// The tool.
    pub tool: String,
    /// Its arguments, a JSON object as text.
    pub arguments: String,
}

/// The tools whose calls wait for a person's approval in one job, by who
/// asked: tool names, or `"*"` for every tool (docs/approvals.md).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ApprovalPolicy {
    /// The tenant's `require_approval` when the job was submitted.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tenant: Vec<String>,
    /// The job's own, from its request.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub job: Vec<String>,
    /// How long a held call waits for a decision: the tenant's
    /// `approval_timeout` when it has one; else `approval.timeout`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// What becomes of a call whose outcome no worker could tell.
    #[serde(skip_serializing_if = "UnknownOutcome::is_report")]
    pub on_unknown_outcome: UnknownOutcome,
}

impl ApprovalPolicy {
    fn is_empty(&self) -> bool {
        self.tenant.is_empty()
            && self.job.is_empty()
            && self.timeout_ms.is_none()
            && self.on_unknown_outcome.is_report()
    }
}

/// What becomes of a call that ended `OUTCOME_UNKNOWN` or
/// `MAX_DELIVERIES_EXCEEDED` (a job's `on_unknown_outcome`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnknownOutcome {
    /// The model is told, as the worker answered.
    #[default]
    Report,
    /// An operator is asked first: applied (with a result), not applied
    /// (run again), or failed.
    Ask,
}

impl UnknownOutcome {
    /// The request's word for it: `report` (or empty) or `ask`.
    pub(crate) fn parse(word: &str) -> Option<Self> {
        match word {
            "" | "report" => Some(Self::Report),
            "ask" => Some(Self::Ask),
            _ => None,
        }
    }

    fn is_report(&self) -> bool {
        *self == Self::Report
    }
}

/// Per-job limits, from the API's options at submission.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct JobLimits {
    /// Calls of one model turn that are run; the rest are answered
    /// `TOO_MANY_CALLS` (`api.max_calls_per_turn`).
    pub max_calls_per_turn: u32,
    /// Largest answer the scripted model may write after quoting tool
    /// outputs (`api.max_scripted_answer_bytes`).
    pub max_scripted_answer_bytes: u64,
    /// The tenant's active-jobs quota when the job was submitted; only then
    /// is the job counted in the tenant's set of active jobs (which the
    /// quota check prunes), so that tenants without the quota leave no set
    /// growing in Redis.
    pub max_active_jobs: Option<u32>,
    /// The tenant's quota of tool calls in flight when the job was
    /// submitted: the job's calls beyond it wait for a slot.
    pub max_calls_in_flight: Option<u32>,
    /// The tenant's period budgets when the job was submitted (its
    /// `[tenants.<name>.budget]`), which every run of it takes from.
    #[serde(skip_serializing_if = "crate::budget::tenant::TenantBudget::is_empty")]
    pub tenant_budget: crate::budget::tenant::TenantBudget,
}

impl Default for JobLimits {
    fn default() -> Self {
        Self {
            max_calls_per_turn: 64,
            max_scripted_answer_bytes: 1024 * 1024,
            max_active_jobs: None,
            max_calls_in_flight: None,
            tenant_budget: crate::budget::tenant::TenantBudget::default(),
        }
    }
}

/// One entry of a job's conversation, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Item {
    /// The user's input.
    User {
        /// The message text.
        text: String,
    },
    /// Text the model produced. A turn with no tool calls ends the job with it.
    Assistant {
        /// The message text.
        text: String,
        /// The provider's own item, passed back verbatim (Responses API).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        raw: Option<Value>,
    },
    /// A function call the model made.
    ToolCall {
        /// The provider's call id (`call_...`), unique within the job.
        call_id: String,
        /// The tool name as the model wrote it (may name no tool at all).
        name: String,
        /// The arguments text exactly as the model produced it.
        arguments: String,
        /// The provider's own item, passed back verbatim (Responses API).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        raw: Option<Value>,
    },
    /// The envelope answering a call, as the model sees it.
    ToolResult {
        /// The call it answers.
        call_id: String,
        /// The tool name of that call.
        name: String,
        /// The envelope JSON.
        output: String,
        /// Attempts it took (0 when the orchestrator answered without dispatching).
        attempts: u32,
    },
    /// A reasoning item, opaque to us, passed back verbatim and in order.
    Reasoning {
        /// The provider's item.
        raw: Value,
    },
}

impl Item {
    /// The item as a job's conversation stores it: one element of its list
    /// in Redis, and one argument of the commit that appends it.
    pub fn stored_json(&self) -> String {
        serde_json::to_string(self).expect("an item serializes")
    }
}

/// The assistant text of `items`, concatenated.
pub(crate) fn assistant_text(items: &[Item]) -> String {
    items
        .iter()
        .filter_map(|item| match item {
            Item::Assistant { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

/// How a job ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// With the model's final answer.
    Succeeded(String),
    /// With an error.
    Failed(JobError),
    /// On a client's request.
    Cancelled,
}

impl Ending {
    /// A failure with `code` and a human-readable `message`.
    pub fn failed(code: JobErrorCode, message: impl Into<String>) -> Self {
        Self::Failed(JobError {
            code,
            message: message.into(),
        })
    }

    /// The status the job ends in.
    pub(crate) fn status(&self) -> JobStatus {
        match self {
            Self::Succeeded(_) => JobStatus::Succeeded,
            Self::Failed(_) => JobStatus::Failed,
            Self::Cancelled => JobStatus::Cancelled,
        }
    }

    /// The job's final event, with what the job `spent` when its run
    /// ended it.
    pub(crate) fn event(&self, spent: Option<Spend>) -> JobEvent {
        match self {
            Self::Succeeded(text) => JobEvent::JobSucceeded {
                output_text: text.clone(),
                spent,
            },
            Self::Failed(error) => JobEvent::JobFailed {
                code: error.code,
                message: Some(error.message.clone()),
                spent,
            },
            Self::Cancelled => JobEvent::JobCancelled {
                code: JobErrorCode::Cancelled,
                spent,
            },
        }
    }
}

/// A job's error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobError {
    /// Stable UPPER_SNAKE code.
    pub code: JobErrorCode,
    /// Human-readable detail.
    pub message: String,
}

/// A job record (without its items).
#[derive(Debug, Clone)]
pub struct JobRecord {
    /// The job id.
    pub job_id: JobId,
    /// The spec.
    pub spec: JobSpec,
    /// The status.
    pub status: JobStatus,
    /// Final answer of a succeeded job.
    pub output_text: String,
    /// Error of a failed or cancelled job.
    pub error: Option<JobError>,
    /// Model turns with tool calls so far.
    pub rounds: u32,
    /// Model turns so far (checkpointed: a turn counted here is never played again).
    pub turns: u32,
    /// Unix epoch ms.
    pub created_at_ms: u64,
    /// Unix epoch ms; 0 while running.
    pub finished_at_ms: u64,
    /// A client asked to cancel.
    pub cancel_requested: bool,
    /// How many times it was parked or queued again after a park: the
    /// stamp of its place in the sweeper's indexes (`store::Stamp`).
    pub moves: u64,
    /// Parked, and queued again (a decision, or its first held call's
    /// expiry) for a runner to take it.
    pub requeued: bool,
    /// How many events it has: every change of its status writes one, so
    /// this orders its changes (the stamp of its status in its tenant's
    /// counts, `store::Change`).
    pub events: u64,
    /// How its calls are named on the wire.
    pub wire_ids: WireIds,
    /// Its trace, when it has one ([`JobTrace`]).
    pub trace: Option<JobTrace>,
    /// Whether it holds a shaped result (one whose model was shown a view
    /// of it): its model is offered `read_result` (docs/protection.md).
    pub shaped: bool,
    /// What it spent against its budget (docs/protection.md, "Budgets").
    pub spent: crate::budget::Spend,
    /// The budget a run found spent when it refused a call for it: the job
    /// gets no more model turns.
    pub budget_exceeded: Option<crate::budget::Limit>,
}

/// The whole `data` of a call whose result the model is shown shaped
/// (docs/protection.md): stored in the job's `shaped` hash by the commit
/// that appends the view to the conversation, so that whoever reads the
/// view can page through it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FullResult {
    /// The call, as its events show it (the view's reference names it).
    pub call: EventId,
    /// The JSON text of the result's `data`.
    pub data: String,
}

/// One entry of a job's event log.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// Position in the log, from 0.
    pub offset: u64,
    /// `job_queued`, `model_turn`, ...
    pub kind: String,
    /// Details (JSON text).
    pub data: String,
    /// Unix epoch ms.
    pub timestamp_ms: u64,
    /// The job's last event.
    pub is_final: bool,
}

/// What every step of a run reads of its job: the spec and the trace.
#[derive(Debug, Clone, Copy)]
pub(crate) struct JobRef<'a> {
    /// The job as submitted.
    pub spec: &'a JobSpec,
    /// Its trace, if it has one.
    pub trace: Option<&'a JobTrace>,
}

/// A runner's hold on a job. Writes made with it fail once another runner
/// took the job over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The job.
    pub job_id: JobId,
    /// `<owner>:<epoch>`.
    pub token: String,
    /// Incremented by every takeover.
    pub epoch: u64,
    /// Whether the job ran before this lease (its run resumes).
    pub resumed: bool,
    /// Who submitted the job (its spec's submitter, read with the lease):
    /// the run's changes of its status are counted for them too.
    pub submitter: Option<String>,
}

/// A model turn as it is checkpointed: its output items, and the job's
/// counters once it is counted. Once stored, the turn is never played again.
#[derive(Debug, Clone, Copy)]
pub struct TurnCheckpoint<'a> {
    /// The results of the round before the turn (the model's input), if the
    /// run has not stored them yet: a run stores a round's results with the
    /// turn that follows, not in a commit of their own. They are stored
    /// before the turn's items.
    pub results: &'a [Item],
    /// The whole data of those of `results` that are shaped views, stored
    /// in the same commit.
    pub full: &'a [FullResult],
    /// The turn's output items, in the provider's order.
    pub items: &'a [Item],
    /// Turns played, this one included.
    pub turns: u32,
    /// Turns with tool calls, this one included if it has any.
    pub rounds: u32,
    /// Manifests offered to the model in this turn that the job has not
    /// recorded yet (new tools, or changed manifests).
    pub offered: &'a [ToolManifest],
    /// The tokens the turn used, when the provider said.
    pub usage: Option<Usage>,
    /// The tokens the turn counts against the job's budget
    /// (the run's `RunBudget::add_turn`).
    pub tokens: u64,
}

impl TurnCheckpoint<'_> {
    /// The calls of the turn, in order.
    pub(crate) fn calls(&self) -> Vec<CallRef> {
        self.items
            .iter()
            .filter_map(|item| match item {
                Item::ToolCall { call_id, name, .. } => Some(CallRef {
                    call_id: call_id.clone(),
                    name: name.clone(),
                }),
                _ => None,
            })
            .collect()
    }

    /// The turn's assistant text, concatenated.
    pub(crate) fn text(&self) -> String {
        assistant_text(self.items)
    }

    /// The `model_turn` event of the turn.
    pub(crate) fn event(&self) -> JobEvent {
        JobEvent::ModelTurn {
            round: self.rounds,
            text: self.text(),
            tool_calls: self.calls(),
            turn: self.turns.saturating_sub(1),
            usage: self.usage,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_s_wire_id_never_changes_between_versions() {
        // A resumed run finds its calls by these ids, also across an
        // upgrade: `c` and the first 24 hex digits of SHA-256 over
        // `<secret>:<position>` (`printf secret:3 | sha256sum`).
        let ids = WireIds::from_secret("secret");
        assert_eq!(ids.of(3, "call_1", false), "c3c52a68f851dd972861e665b");
        assert_eq!(ids.of(3, "other", true), "c3c52a68f851dd972861e665b");
        assert_eq!(WireIds::Legacy.of(3, "call_1", false), "call_1");
        assert_eq!(WireIds::Legacy.of(3, "call_1", true), "x.3");
    }
}
