//! Every wire name of toolfleet: NATS subjects, streams, consumers, headers,
//! KV buckets and inbox prefixes, the Redis key layout, the keys of a job's
//! metadata that toolfleet sets, and the attribute names of a job's spans.
//! No other module spells one.
//!
//! Redis keys of one job share the hash tag `{<job_id>}` so that a job's
//! updates can be atomic (MULTI or Lua) and the layout works on Redis Cluster.
//! Whatever names one job takes its checked [`JobId`]; a call's keys take the
//! job id of a call the worker checked ([`ToolCall::check`](crate::ToolCall::check)).

use crate::job::{JobId, JobStatus};

/// JetStream work-queue stream that holds tool calls until a worker acks them.
pub const CALL_STREAM: &str = "TOOLFLEET_CALLS";
/// Subjects captured by [`CALL_STREAM`]: one token per tool.
pub const CALL_SUBJECTS: &str = "toolfleet.call.*";
const CALL_SUBJECT_PREFIX: &str = "toolfleet.call.";

/// JetStream work-queue stream of jobs waiting for an orchestrator.
pub const JOB_STREAM: &str = "TOOLFLEET_JOBS";
/// The subject a submitted job's id is published to.
pub const JOB_SUBJECT: &str = "toolfleet.job.run";
/// The durable consumer all orchestrator replicas share.
pub const JOB_CONSUMER: &str = "orchestrators";

/// NATS KV bucket where workers announce their tools with a TTL.
pub const REGISTRY_BUCKET: &str = "toolfleet_registry";
/// The JetStream API prefix a worker pool's NATS account imports the API
/// under (`nats.api_prefix` of its workers; decision 0029).
pub const POOL_API_PREFIX: &str = "JS.toolfleet.API";
/// The stream that holds the registry bucket (JetStream's `KV_<bucket>`).
pub const REGISTRY_STREAM: &str = "KV_toolfleet_registry";
/// The subject prefix of the registry's keys (JetStream's `$KV.<bucket>.`):
/// a worker's announcement of `tool` is published to this prefix and
/// [`registry_key`].
pub const REGISTRY_KEY_PREFIX: &str = "$KV.toolfleet_registry.";

/// Prefix of the core NATS subjects results are published to.
const REPLY_SUBJECT_PREFIX: &str = "toolfleet.reply.";

/// Message headers set on calls and results.
pub mod headers {
    /// JetStream's own dedup header.
    pub const MSG_ID: &str = "Nats-Msg-Id";
    /// Job id of a call or result.
    pub const JOB_ID: &str = "Toolfleet-Job-Id";
    /// Call id of a call or result.
    pub const CALL_ID: &str = "Toolfleet-Call-Id";
    /// Attempt number of a call or result.
    pub const ATTEMPT: &str = "Toolfleet-Attempt";
    /// Tool name of a call or result.
    pub const TOOL: &str = "Toolfleet-Tool";
    /// The model's own id of a call (what the model wrote, such as
    /// `call_…` or `toolu_…`), set on a call when that id is a safe one
    /// (`call::is_valid_call_id`); absent otherwise. A tool gets it as `ToolContext::model_call_id`; the
    /// call's id in the fleet is [`CALL_ID`].
    pub const MODEL_CALL_ID: &str = "Toolfleet-Model-Call-Id";
    /// The version of its tool a call is pinned to: the contract hash
    /// (`ToolManifest::contract_hash`) of the manifest its model was shown.
    /// A worker that serves another version hands the call back unclaimed
    /// (decision 0058); a call without it (from an orchestrator that
    /// predates pinning) runs on any worker of its tool.
    pub const TOOL_VERSION: &str = "Toolfleet-Tool-Version";
    /// The format of the message (`toolfleet_proto::format`): a call, a
    /// reply, a job's queue message. Absent: format 1, the release before
    /// formats were marked. A reader that does not know the format leaves
    /// the message to a newer process (decision 0059).
    pub const FORMAT: &str = "Toolfleet-Format";
    /// The tenant of a queued job (set by the orchestrator), so that a job
    /// whose state Redis lost is still reported to its owner.
    pub const TENANT: &str = "Toolfleet-Tenant";
    /// Set to "true" on a result that was answered from the stored record.
    pub const DEDUP_HIT: &str = "Toolfleet-Dedup-Hit";
    /// Set (to "1") on a message of a reply subject that reports a running
    /// call's progress (a `ProgressReport`), not its result.
    pub const PROGRESS: &str = "Toolfleet-Progress";
    /// Set (to "1") on a message of a job's events subject that carries a
    /// piece of a streamed model turn (a delta), not a wake-up.
    pub const DELTA: &str = "Toolfleet-Delta";
    /// JetStream KV's marker of what a message does to its key; a worker
    /// withdraws its announcement with [`KV_DELETE`].
    pub const KV_OPERATION: &str = "KV-Operation";
    /// The [`KV_OPERATION`] of a delete marker.
    pub const KV_DELETE: &str = "DEL";
    /// Set (to "1") on a message of a call subject that cancels the call it
    /// names (its job was cancelled), rather than asking for it to run.
    pub const CANCEL: &str = "Toolfleet-Cancel";
    /// Set (to "1") on a message of a call subject that retires the call it
    /// names: the version of its tool it is pinned to has had no live
    /// worker for longer than the orchestrator waits
    /// (`dispatch.version_gone_after`). Sent without [`TOOL_VERSION`], so
    /// any worker of the tool takes it: it claims the attempt and answers
    /// `TOOL_VERSION_GONE` without running it, unless the attempt has a
    /// result or a live claim already (decision 0058).
    pub const VERSION_GONE: &str = "Toolfleet-Version-Gone";
    /// W3C trace context: the span a call message (or a client's request to
    /// the API, in its gRPC metadata) continues.
    pub const TRACEPARENT: &str = "traceparent";
    /// W3C trace context: the vendors' entries that go with [`TRACEPARENT`].
    pub const TRACESTATE: &str = "tracestate";
}

/// Keys of a job's metadata (`SubmitJobRequest.metadata`) that toolfleet
/// itself sets and reads back.
pub mod job_metadata {
    /// Marks a call job that `toolfleet mcp-serve` made (its value the MCP
    /// method, `tools/call`): an MCP task names no other job of the tenant.
    pub const MCP: &str = "toolfleet.mcp";
}

/// The inbox prefix of the NATS user `user` (its `nats.inbox_prefix`): the
/// NATS users file lets each user subscribe to its own inboxes only
/// (`deploy/nats/toolfleet-users.conf`).
pub fn inbox_prefix(user: &str) -> String {
    format!("_INBOX.{user}")
}

/// The attribute names of the spans of a job's trace (docs/observability.md
/// draws the tree): toolfleet's own under `toolfleet.`, and the
/// OpenTelemetry semantic conventions the spans follow. What a trace view or
/// a test reads of a span is one of these.
pub mod span_attributes {
    /// The job's id (the submission's root span and each run's span).
    pub const JOB_ID: &str = "toolfleet.job_id";
    /// The tenant that submitted the job, or that decided a held call.
    pub const TENANT: &str = "toolfleet.tenant";
    /// The model provider the job names, as toolfleet's API names it
    /// (`openai-responses`, ...): on the submission's root span and each
    /// model turn's.
    pub const PROVIDER: &str = "toolfleet.provider";
    /// Whether a submission was a repeat of an earlier one (its idempotency
    /// key named a job already submitted).
    pub const DUPLICATE: &str = "toolfleet.duplicate";
    /// The lease epoch of a run of the job.
    pub const EPOCH: &str = "toolfleet.epoch";
    /// The replica (lease owner) that ran the job.
    pub const REPLICA: &str = "toolfleet.replica";
    /// Whether a run, a call or an attempt picked up what an earlier
    /// runner had begun.
    pub const RESUMED: &str = "toolfleet.resumed";
    /// The number of a model turn, from 1.
    pub const TURN: &str = "toolfleet.turn";
    /// How many tool calls a model turn made.
    pub const TOOL_CALLS: &str = "toolfleet.tool_calls";
    /// The tool of a call, an approval, an attempt or an execution.
    pub const TOOL: &str = "toolfleet.tool";
    /// The id a call's events show (its event id), on its call and approval
    /// spans.
    pub const CALL_ID: &str = "toolfleet.call_id";
    /// The number of an attempt, from 1.
    pub const ATTEMPT: &str = "toolfleet.attempt";
    /// How many attempts a call took when it settled (0: answered by the
    /// orchestrator's own checks).
    pub const ATTEMPTS: &str = "toolfleet.attempts";
    /// How a call, an attempt, an execution or a model turn ended: `ok` or
    /// the error code.
    pub const OUTCOME: &str = "toolfleet.outcome";
    /// Who produced a call's envelope when it was not a worker (`operator`).
    pub const OUTCOME_SOURCE: &str = "toolfleet.outcome.source";
    /// Whether a failed envelope may be retried.
    pub const RETRYABLE: &str = "toolfleet.retryable";
    /// What a failed envelope says of its side effect.
    pub const SIDE_EFFECT: &str = "toolfleet.side_effect";
    /// The decision taken on a held call (`approved`, `rejected`, or an
    /// operator's verdict: `applied`, `not_applied`, `failed`).
    pub const DECISION: &str = "toolfleet.decision";
    /// The approval rule that held a call.
    pub const APPROVAL_RULE: &str = "toolfleet.approval.rule";
    /// What a held call waited for: `approval`, or `outcome` (an
    /// operator's verdict on an unknown outcome).
    pub const APPROVAL_KIND: &str = "toolfleet.approval.kind";
    /// Who decided a held call, when the decision names them.
    pub const APPROVER: &str = "toolfleet.approver";
    /// Whether an execution was answered from the worker's ledger (a stored
    /// result) without running.
    pub const LEDGER_HIT: &str = "toolfleet.ledger_hit";
    /// Whether an execution handed its call back to be delivered again.
    pub const HANDED_BACK: &str = "toolfleet.handed_back";
    /// How long the tool ran, in milliseconds.
    pub const RUN_MS: &str = "toolfleet.run_ms";
    /// Which delivery of the call message an execution was (from 1).
    pub const DELIVERY: &str = "toolfleet.delivery";
    /// How long the call message waited in its queue, in milliseconds.
    pub const QUEUE_WAIT_MS: &str = "toolfleet.queue_wait_ms";

    /// OpenTelemetry's RPC convention: the RPC system (`grpc`).
    pub const RPC_SYSTEM: &str = "rpc.system";
    /// OpenTelemetry's RPC convention: the method called (`SubmitJob`).
    pub const RPC_METHOD: &str = "rpc.method";
    /// OpenTelemetry's messaging convention: the messaging system (`nats`).
    pub const MESSAGING_SYSTEM: &str = "messaging.system";
    /// OpenTelemetry's database convention: the database system (`redis`).
    pub const DB_SYSTEM: &str = "db.system";
    /// OpenTelemetry's database convention: the operation (the job
    /// store's verb, such as `record_turn`).
    pub const DB_OPERATION: &str = "db.operation";
    /// OpenTelemetry's general convention: the class of error a failed
    /// operation ended with (the envelope's or the model's error code).
    pub const ERROR_TYPE: &str = "error.type";
    /// OpenTelemetry's GenAI convention: the operation, `chat` on a model
    /// turn and `execute_tool` on a call.
    pub const GEN_AI_OPERATION_NAME: &str = "gen_ai.operation.name";
    /// OpenTelemetry's GenAI convention: the model provider, in the
    /// conventions' words (`openai`, `anthropic`); toolfleet's own name
    /// of the API is [`PROVIDER`].
    pub const GEN_AI_PROVIDER_NAME: &str = "gen_ai.provider.name";
    /// OpenTelemetry's GenAI convention: the model the job asked for.
    pub const GEN_AI_REQUEST_MODEL: &str = "gen_ai.request.model";
    /// OpenTelemetry's GenAI convention: the most tokens a turn may write,
    /// when the job says.
    pub const GEN_AI_REQUEST_MAX_TOKENS: &str = "gen_ai.request.max_tokens";
    /// OpenTelemetry's GenAI convention: whether the turn was asked for as
    /// a stream (set only when it was).
    pub const GEN_AI_REQUEST_STREAM: &str = "gen_ai.request.stream";
    /// OpenTelemetry's GenAI convention: the model that answered, as the
    /// provider names it.
    pub const GEN_AI_RESPONSE_MODEL: &str = "gen_ai.response.model";
    /// OpenTelemetry's GenAI convention: the provider's id of its answer.
    pub const GEN_AI_RESPONSE_ID: &str = "gen_ai.response.id";
    /// OpenTelemetry's GenAI convention: why the model stopped, in the
    /// provider's words (`stop`, `tool_calls`, `end_turn`, ...).
    pub const GEN_AI_RESPONSE_FINISH_REASONS: &str = "gen_ai.response.finish_reasons";
    /// OpenTelemetry's GenAI convention: a turn's input tokens.
    pub const GEN_AI_USAGE_INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
    /// OpenTelemetry's GenAI convention: a turn's output tokens.
    pub const GEN_AI_USAGE_OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
    /// OpenTelemetry's GenAI convention: a turn's input tokens read from
    /// the provider's prompt cache.
    pub const GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: &str = "gen_ai.usage.cache_read.input_tokens";
    /// OpenTelemetry's GenAI convention: a turn's input tokens written to
    /// the provider's prompt cache.
    pub const GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS: &str =
        "gen_ai.usage.cache_creation.input_tokens";
    /// OpenTelemetry's GenAI convention: the tool a call names.
    pub const GEN_AI_TOOL_NAME: &str = "gen_ai.tool.name";
    /// OpenTelemetry's GenAI convention: the kind of tool (`function`).
    pub const GEN_AI_TOOL_TYPE: &str = "gen_ai.tool.type";
    /// OpenTelemetry's GenAI convention: the model's own id of a call, when
    /// it is a safe one (its wire id is never in a span).
    pub const GEN_AI_TOOL_CALL_ID: &str = "gen_ai.tool.call.id";
    /// OpenTelemetry's GenAI convention (opt-in): the arguments a call was
    /// made with, as the model wrote them, cut to a bound.
    pub const GEN_AI_TOOL_CALL_ARGUMENTS: &str = "gen_ai.tool.call.arguments";
    /// OpenTelemetry's GenAI convention (opt-in): the `data` of a call's
    /// successful envelope, cut to a bound.
    pub const GEN_AI_TOOL_CALL_RESULT: &str = "gen_ai.tool.call.result";
    /// OpenTelemetry's OpenAI convention: which OpenAI API a turn used
    /// (`responses`, `chat_completions`).
    pub const OPENAI_API_TYPE: &str = "openai.api.type";
}

/// The subject calls of `tool` are published to.
pub fn call_subject(tool: &str) -> String {
    format!("{CALL_SUBJECT_PREFIX}{tool}")
}

/// The tool a call subject belongs to, or `None` if it is not a call subject.
pub fn tool_of_call_subject(subject: &str) -> Option<&str> {
    subject
        .strip_prefix(CALL_SUBJECT_PREFIX)
        .filter(|tool| !tool.is_empty() && !tool.contains('.'))
}

/// The durable pull consumer that every worker serving `tool` shares.
pub fn call_consumer(tool: &str) -> String {
    format!("tool_{tool}")
}

/// The subject the results of `job_id`'s calls are published to.
pub fn reply_subject(job_id: &JobId) -> String {
    format!("{REPLY_SUBJECT_PREFIX}{job_id}")
}

/// The wildcard that matches every reply subject (for an orchestrator that
/// gathers the results of all its jobs on one subscription).
pub const REPLY_SUBJECTS: &str = "toolfleet.reply.*";

/// The job a reply subject belongs to.
pub fn job_of_reply_subject(subject: &str) -> Option<&str> {
    subject
        .strip_prefix(REPLY_SUBJECT_PREFIX)
        .filter(|job| !job.is_empty() && !job.contains('.'))
}

/// Core NATS subject that wakes the watchers of a job when it has new events
/// (the events themselves are in Redis).
pub fn events_subject(job_id: &JobId) -> String {
    format!("toolfleet.events.{job_id}")
}

/// The registry KV key of one worker's announcement of one tool.
pub fn registry_key(tool: &str, worker_id: &str) -> String {
    format!("{tool}.{worker_id}")
}

/// The tool and worker of a registry key.
pub fn parse_registry_key(key: &str) -> Option<(&str, &str)> {
    key.split_once('.')
        .filter(|(tool, worker)| !tool.is_empty() && !worker.is_empty())
}

/// Redis key layout under a configurable prefix (default `tf`).
#[derive(Debug, Clone)]
pub struct RedisKeys {
    prefix: String,
}

/// How many sorted sets the index of unfinished jobs is spread over, each
/// in a hash slot of its own, so that on a Redis Cluster no one node holds
/// (and serves the writes of) every job's entry.
pub const UNFINISHED_SHARDS: u32 = 16;

/// The shard of the unfinished index that holds `job_id`: FNV-1a of its
/// bytes. Stored data depends on it: it never changes across versions.
fn unfinished_shard_of(job_id: &JobId) -> u32 {
    let hash = job_id.bytes().fold(0x811c_9dc5_u32, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    });
    hash % UNFINISHED_SHARDS
}

impl Default for RedisKeys {
    fn default() -> Self {
        Self::new(Self::DEFAULT_PREFIX)
    }
}

impl RedisKeys {
    /// The prefix of the keys when none is configured (`redis.key_prefix`).
    pub const DEFAULT_PREFIX: &str = "tf";

    /// Keys under `prefix`, e.g. `tf` or `tenant-a:tf`.
    pub fn new(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
        }
    }

    /// The prefix every key starts with.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn job_key(&self, job_id: &JobId, rest: &str) -> String {
        format!("{}:{{{job_id}}}:{rest}", self.prefix)
    }

    /// A key of one call attempt's ledger, under its tool's own key space
    /// (`<prefix>:{<job>}:tool:<tool>:<kind>:<call>:<attempt>`), so that a
    /// Redis ACL pattern can give each worker pool its own tools' keys and
    /// nothing else (`deploy/redis/`). Tool names and wire call ids never
    /// hold `{`, `}` or `:`, so no key of one tool matches another's pattern.
    fn call_key(
        &self,
        job_id: &str,
        tool: &str,
        kind: &str,
        call_id: &str,
        attempt: u32,
    ) -> String {
        // One `format!`, not the job key's and another inside it: four of
        // these keys are built for every call a worker claims.
        let prefix = &self.prefix;
        format!("{prefix}:{{{job_id}}}:tool:{tool}:{kind}:{call_id}:{attempt}")
    }

    /// The claim of one call attempt: the worker executing it, with a lease TTL.
    pub fn call_claim(&self, job_id: &str, tool: &str, call_id: &str, attempt: u32) -> String {
        self.call_key(job_id, tool, "claim", call_id, attempt)
    }

    /// Marks that an execution of a side-effecting call attempt began; it
    /// outlives the claim so a redelivery knows the effect may have happened.
    pub fn call_started(&self, job_id: &str, tool: &str, call_id: &str, attempt: u32) -> String {
        self.call_key(job_id, tool, "started", call_id, attempt)
    }

    /// What an execution of one call attempt saved to be resumed from,
    /// should it die (a server's task id; the worker's `Checkpoint`).
    pub fn call_checkpoint(&self, job_id: &str, tool: &str, call_id: &str, attempt: u32) -> String {
        self.call_key(job_id, tool, "checkpoint", call_id, attempt)
    }

    /// Marks that one call attempt's job was cancelled: the worker running
    /// it stops it, and a worker yet to run it answers without running.
    pub fn call_cancelled(&self, job_id: &str, tool: &str, call_id: &str, attempt: u32) -> String {
        self.call_key(job_id, tool, "cancelled", call_id, attempt)
    }

    /// How many executions of one call attempt took its claim and neither
    /// stored a result nor released the claim: the executions that died.
    pub fn call_claims(&self, job_id: &str, tool: &str, call_id: &str, attempt: u32) -> String {
        self.call_key(job_id, tool, "claims", call_id, attempt)
    }

    /// The stored result of one call attempt (written by workers only).
    pub fn call_result(&self, job_id: &str, tool: &str, call_id: &str, attempt: u32) -> String {
        self.call_key(job_id, tool, "result", call_id, attempt)
    }

    /// The job record (a hash).
    pub fn job(&self, job_id: &JobId) -> String {
        self.job_key(job_id, "job")
    }

    /// The job's conversation items (a list, appended to).
    pub fn job_items(&self, job_id: &JobId) -> String {
        self.job_key(job_id, "items")
    }

    /// The job's event log (a stream).
    pub fn job_events(&self, job_id: &JobId) -> String {
        self.job_key(job_id, "events")
    }

    /// The attempt last dispatched for each call of the job (a hash).
    pub fn job_attempts(&self, job_id: &JobId) -> String {
        self.job_key(job_id, "attempts")
    }

    /// The manifests of the tools the job's model was offered (a hash: tool
    /// name -> manifest JSON), so that a call to one of them whose workers are
    /// briefly gone waits for them instead of being unknown.
    pub fn job_tools(&self, job_id: &JobId) -> String {
        self.job_key(job_id, "tools")
    }

    /// The job's held calls and their decisions (a hash: `<wire id>` ->
    /// the approval request, `expires:<wire id>` -> its expiry in Unix ms,
    /// `decided:<wire id>` -> the decision; decision 0036).
    pub fn job_approvals(&self, job_id: &JobId) -> String {
        self.job_key(job_id, "approvals")
    }

    /// The whole results of the job's shaped calls (a hash: the call's event
    /// id -> the JSON text of its `data`), stored by the commit that shows
    /// the model their view, paged by `read_result` (docs/protection.md).
    pub fn job_shaped(&self, job_id: &JobId) -> String {
        self.job_key(job_id, "shaped")
    }

    /// The job's fenced lease (owner and epoch of the replica running it).
    pub fn job_lease(&self, job_id: &JobId) -> String {
        self.job_key(job_id, "lease")
    }

    /// The `SCAN MATCH` pattern of every key of one job: those under its
    /// hash tag, its calls' ledger keys among them (not its tenant's
    /// indexes, nor the shards that list it).
    pub fn job_keys_pattern(&self, job_id: &JobId) -> String {
        self.job_key(job_id, "*")
    }

    /// The key of job `to` that is what `key` is of job `from` (a copy of a
    /// job keeps every key's layout; only the hash tag changes); `None` if
    /// `key` is not one of `from`'s.
    pub fn retag_job_key(&self, key: &str, from: &JobId, to: &JobId) -> Option<String> {
        let rest = key.strip_prefix(self.job_key(from, "").as_str())?;
        Some(self.job_key(to, rest))
    }

    /// The shard of the index of unfinished jobs that holds `job_id`
    /// (`<prefix>:unfinished:{<shard>}`, a sorted set scored by submission
    /// time). The sweeper finds jobs there whose queue message was lost.
    pub fn unfinished_jobs(&self, job_id: &JobId) -> String {
        self.unfinished_shard(unfinished_shard_of(job_id))
    }

    /// Every shard of the index of unfinished jobs, for the sweeper.
    pub fn unfinished_shards(&self) -> impl Iterator<Item = String> + '_ {
        (0..UNFINISHED_SHARDS).map(|shard| self.unfinished_shard(shard))
    }

    fn unfinished_shard(&self, shard: u32) -> String {
        format!("{}:unfinished:{{{shard}}}", self.prefix)
    }

    /// The shard of the index of parked jobs (waiting for an approval) that
    /// holds `job_id` (`<prefix>:parked:{<shard>}`, a sorted set scored by
    /// when the job must wake: its first approval expiry). A parked job is
    /// in this index instead of the unfinished one.
    pub fn parked_jobs(&self, job_id: &JobId) -> String {
        self.parked_shard(unfinished_shard_of(job_id))
    }

    /// Every shard of the index of parked jobs, for the sweeper.
    pub fn parked_shards(&self) -> impl Iterator<Item = String> + '_ {
        (0..UNFINISHED_SHARDS).map(|shard| self.parked_shard(shard))
    }

    fn parked_shard(&self, shard: u32) -> String {
        format!("{}:parked:{{{shard}}}", self.prefix)
    }

    /// The hash, in the slot of `job_id`'s shards of the unfinished and
    /// parked indexes, that keeps for each job of the shard the last move
    /// between the two it applied (`<prefix>:parked:{<shard>}:moves`, job id
    /// -> rank), so that a late move never undoes a later one.
    pub fn index_moves(&self, job_id: &JobId) -> String {
        format!("{}:moves", self.parked_shard(unfinished_shard_of(job_id)))
    }

    /// The manifest of every tool a worker ever announced (a hash of tool
    /// name to manifest JSON), so that a tool whose pool is scaled to zero
    /// stays known: its calls wait in its queue for the next worker.
    pub fn tool_catalog(&self) -> String {
        format!("{}:catalog", self.prefix)
    }

    /// A tenant's jobs, scored by submission time (a sorted set): the index
    /// that `ListJobs` reads, newest first.
    pub fn tenant_jobs(&self, tenant: &str) -> String {
        format!("{}:jobs:{{{tenant}}}", self.prefix)
    }

    /// The jobs one submitter submitted in a tenant, scored by submission
    /// time (a sorted set): the index `ListJobs` reads for an agent that
    /// sees only its own jobs (decision 0049). `submitter` is the credential's
    /// (`token:…`, `client:…`, or a person's name) and any text: the key
    /// holds 128 bits of its SHA-256, in hex, so that no `{`, `}` or `:` of
    /// it reaches the key. It shares the tenant's hash tag with
    /// [`tenant_jobs`](Self::tenant_jobs), so both are written in one
    /// pipeline; stored data depends on the hash, which never changes.
    pub fn submitter_jobs(&self, tenant: &str, submitter: &str) -> String {
        format!(
            "{}:{}",
            self.tenant_jobs(tenant),
            submitter_digest(submitter)
        )
    }

    /// How many of a tenant's jobs are queued, running or waiting for
    /// approval (a hash: `<status>` -> jobs, and `<digest>:<status>` -> a
    /// submitter's, `<digest>` its [`submitter_digest`]; a field at 0 is
    /// deleted). Kept with [`tenant_live_jobs`](Self::tenant_live_jobs),
    /// which it sums, in one script (decision 0051).
    pub fn tenant_job_counts(&self, tenant: &str) -> String {
        format!("{}:counts", self.tenant_jobs(tenant))
    }

    /// The status each of a tenant's unfinished jobs is counted in (a hash:
    /// job id -> `<stamp> <status> <digest>`: the job's event count at the
    /// change, its status, and its submitter's digest, empty when none), so
    /// that a late or repeated change of a job's status counts once.
    pub fn tenant_live_jobs(&self, tenant: &str) -> String {
        format!("{}:live", self.tenant_jobs(tenant))
    }

    /// A tenant's finished jobs in the final `status`, or one submitter's
    /// (a sorted set scored by when each job expires, Unix ms): those
    /// scored after now are the ones stored, so the count of a status is
    /// exact without anything removed at the retention's end.
    pub fn ended_jobs(&self, tenant: &str, submitter: Option<&str>, status: JobStatus) -> String {
        match submitter {
            Some(submitter) => format!("{}:ended:{status}", self.submitter_jobs(tenant, submitter)),
            None => format!("{}:ended:{status}", self.tenant_jobs(tenant)),
        }
    }

    /// The `SCAN MATCH` pattern of every tenant's
    /// [`tenant_jobs`](Self::tenant_jobs) index, and of no
    /// [`submitter_jobs`](Self::submitter_jobs) index (which ends in hex,
    /// never in `}`).
    pub fn tenant_jobs_pattern(&self) -> String {
        format!("{}:jobs:{{*}}", self.prefix)
    }

    /// The tenant whose [`tenant_jobs`](Self::tenant_jobs) index `key` is;
    /// `None` for any other key.
    pub fn tenant_of_jobs_index<'k>(&self, key: &'k str) -> Option<&'k str> {
        key.strip_prefix(self.prefix.as_str())?
            .strip_prefix(":jobs:{")?
            .strip_suffix('}')
    }

    /// A tenant's held calls, scored by when they were held (a sorted set
    /// of `<job id>/<call id>`): what `ListPendingApprovals` reads, oldest
    /// first. An entry leaves it, and the tenant's other approval indexes,
    /// when its call is decided, expires or its job ends.
    pub fn tenant_approvals(&self, tenant: &str) -> String {
        format!("{}:approvals:{{{tenant}}}", self.prefix)
    }

    /// The same held calls scored by when they expire: where the
    /// pending-approvals gauge finds the expired ones to drop.
    pub fn tenant_approvals_expiry(&self, tenant: &str) -> String {
        format!("{}:approvals:{{{tenant}}}:expiry", self.prefix)
    }

    /// The tenant's held calls of one tool, scored by when they were held:
    /// their count and oldest are the pending-approvals gauge.
    pub fn tenant_tool_approvals(&self, tenant: &str, tool: &str) -> String {
        format!("{}:approvals:{{{tenant}}}:by-tool:{tool}", self.prefix)
    }

    /// The tools that have a [`tenant_tool_approvals`](Self::tenant_tool_approvals)
    /// index for the tenant (a set).
    pub fn tenant_approval_tools(&self, tenant: &str) -> String {
        format!("{}:approvals:{{{tenant}}}:tools", self.prefix)
    }

    /// Every tenant that ever held a call for approval (a set): the
    /// tenants whose indexes the pending-approvals gauge reads. Outside the
    /// braces, so that no tenant's name can make it one of their indexes.
    pub fn approval_tenants(&self) -> String {
        format!("{}:approvals:tenants", self.prefix)
    }

    /// A tenant's jobs that may still be queued or running (a set): its
    /// `max_active_jobs` quota counts them, dropping the finished ones.
    pub fn tenant_active_jobs(&self, tenant: &str) -> String {
        format!("{}:active:{{{tenant}}}", self.prefix)
    }

    /// A tenant's tool calls in flight (a sorted set of `<job>/<call>`,
    /// scored by when the entry expires): its `max_calls_in_flight` quota.
    pub fn tenant_calls(&self, tenant: &str) -> String {
        format!("{}:calls:{{{tenant}}}", self.prefix)
    }

    /// A tenant's submission token bucket (a hash): its
    /// `submissions_per_second` quota.
    pub fn tenant_submissions(&self, tenant: &str) -> String {
        format!("{}:rate:{{{tenant}}}", self.prefix)
    }

    /// A result of a read-only tool that may answer a call of another job of
    /// the tenant (a string: the envelope's JSON, expiring with the tool's
    /// `cache_ttl_ms`); `digest` is the hex digest of the tool, its contract
    /// and the call's arguments (docs/protection.md).
    pub fn tenant_cached_result(&self, tenant: &str, digest: &str) -> String {
        format!("{}:cache:{{{tenant}}}:{digest}", self.prefix)
    }

    /// What a tenant's jobs spent in the last day (a hash of counters per
    /// minute and per hour, `<kind>:m:<minute>` and `<kind>:h:<hour>`):
    /// its period budgets (docs/protection.md, "Budgets").
    pub fn tenant_budget(&self, tenant: &str) -> String {
        format!("{}:budget:{{{tenant}}}", self.prefix)
    }

    /// A tool's circuit breaker, shared by every orchestrator (a hash:
    /// `state`, and the calls and failures of each bucket of its window,
    /// `c:<bucket>` and `f:<bucket>`; expiring when the tool is idle).
    /// `tool` is a valid tool name (checked where a manifest is read).
    pub fn tool_breaker(&self, tool: &str) -> String {
        format!("{}:breaker:{tool}", self.prefix)
    }

    /// A tenant's submission idempotency record, pointing at a job id.
    pub fn submission(&self, tenant: &str, idempotency_key: &str) -> String {
        format!("{}:idem:{{{tenant}}}:{idempotency_key}", self.prefix)
    }
}

/// 128 bits of the SHA-256 of a submitter's name (the credential's
/// `token:…`, `client:…`, or a person's name: any text), in hex: what names
/// it in a key or a hash field, so that no `{`, `}`, `:` or space of it
/// reaches one. Stored data depends on it, which never changes.
pub fn submitter_digest(submitter: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(submitter.as_bytes());
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_registry_stream_and_keys_are_jetstreams_names_for_the_bucket() {
        assert_eq!(REGISTRY_STREAM, format!("KV_{REGISTRY_BUCKET}"));
        assert_eq!(REGISTRY_KEY_PREFIX, format!("$KV.{REGISTRY_BUCKET}."));
    }

    proptest! {
        #[test]
        fn every_call_subject_parses_back_to_its_tool(tool in "[a-zA-Z0-9_-]{1,64}") {
            let subject = call_subject(&tool);
            prop_assert_eq!(tool_of_call_subject(&subject), Some(tool.as_str()));
        }

        #[test]
        fn every_reply_subject_parses_back_to_its_job(tenant in "[a-z0-9_-]{1,64}", at: u64, random: u64) {
            let job = JobId::new(&tenant, at, random);
            let subject = reply_subject(&job);
            prop_assert_eq!(job_of_reply_subject(&subject), Some(job.as_str()));
        }

        #[test]
        fn every_tenant_jobs_index_parses_back_to_its_tenant(tenant in "[a-z0-9_-]{1,64}") {
            let keys = RedisKeys::default();
            let index = keys.tenant_jobs(&tenant);
            prop_assert_eq!(keys.tenant_of_jobs_index(&index), Some(tenant.as_str()));
        }

        #[test]
        fn a_submitters_index_is_its_tenants_index_and_hex_whatever_the_name(
            tenant in "[a-z0-9_-]{1,64}",
            submitter in any::<String>(),
        ) {
            let keys = RedisKeys::default();
            let index = keys.submitter_jobs(&tenant, &submitter);
            let rest = index.strip_prefix(&format!("{}:", keys.tenant_jobs(&tenant)));
            prop_assert!(
                rest.is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))),
                "{}", index
            );
        }

        #[test]
        fn every_registry_key_parses_back(tool in "[a-zA-Z0-9_-]{1,64}", worker in "[a-z0-9-]{1,40}") {
            let key = registry_key(&tool, &worker);
            prop_assert_eq!(parse_registry_key(&key), Some((tool.as_str(), worker.as_str())));
        }
    }

    #[test]
    fn foreign_subjects_are_not_call_subjects() {
        assert_eq!(tool_of_call_subject("toolfleet.call."), None);
        assert_eq!(tool_of_call_subject("toolfleet.call.a.b"), None);
        assert_eq!(tool_of_call_subject("other.call.echo"), None);
    }

    #[test]
    fn call_keys_live_under_their_tool() {
        let keys = RedisKeys::default();
        assert_eq!(
            keys.call_result("t-1", "calculate", "x.3", 2),
            "tf:{t-1}:tool:calculate:result:x.3:2"
        );
        assert_eq!(
            keys.call_claims("t-1", "calculate", "c", 1),
            "tf:{t-1}:tool:calculate:claims:c:1"
        );
    }

    #[test]
    fn job_keys_share_one_hash_tag() {
        let keys = RedisKeys::default();
        let job = JobId::new("acme", 1, 2);
        for key in [
            keys.call_claim(&job, "echo", "c", 1),
            keys.call_result(&job, "echo", "c", 1),
            keys.call_started(&job, "echo", "c", 1),
            keys.job(&job),
            keys.job_items(&job),
            keys.job_events(&job),
            keys.job_lease(&job),
            keys.job_attempts(&job),
            keys.job_tools(&job),
            keys.job_shaped(&job),
        ] {
            assert!(key.starts_with(&format!("tf:{{{job}}}:")), "{key}");
        }
    }

    /// Every key starts with the prefix; a tenant's keys share one hash tag
    /// of their own, apart from another tenant's and from any job's.
    #[test]
    fn keys_carry_the_prefix_and_a_tenants_keys_share_its_tag() {
        let keys = RedisKeys::new("tenant-a:tf");
        let job = JobId::new("acme", 1, 2);
        let tenant_keys = [
            keys.tenant_jobs("acme"),
            keys.tenant_active_jobs("acme"),
            keys.tenant_calls("acme"),
            keys.tenant_submissions("acme"),
            keys.submission("acme", "key-1"),
            keys.tenant_cached_result("acme", "0f"),
            keys.tenant_budget("acme"),
            keys.tenant_approvals("acme"),
            keys.tenant_approvals_expiry("acme"),
            keys.tenant_approval_tools("acme"),
            keys.tenant_tool_approvals("acme", "tools"),
            keys.tenant_tool_approvals("acme", "expiry"),
            keys.submitter_jobs("acme", "client:a.example"),
            keys.tenant_job_counts("acme"),
            keys.tenant_live_jobs("acme"),
            keys.ended_jobs("acme", None, JobStatus::Failed),
            keys.ended_jobs("acme", None, JobStatus::Succeeded),
            keys.ended_jobs("acme", Some("client:a.example"), JobStatus::Failed),
        ];
        for key in &tenant_keys {
            assert!(key.starts_with("tenant-a:tf:"), "{key}");
            assert!(key.contains(":{acme}"), "{key}");
        }
        let distinct: std::collections::HashSet<&String> = tenant_keys.iter().collect();
        assert_eq!(distinct.len(), tenant_keys.len());
        assert_ne!(keys.tenant_calls("acme"), keys.tenant_calls("acme2"));
        assert!(keys.job(&job).starts_with("tenant-a:tf:{acme-"));
        assert_eq!(keys.tool_catalog(), "tenant-a:tf:catalog");
        assert!(
            keys.unfinished_shards()
                .all(|k| k.starts_with("tenant-a:tf:unfinished:{"))
        );
    }

    /// The counts of a tenant's jobs live beside its index, found by no
    /// pattern that finds an index, and apart from every submitter's index
    /// (whose last part is 32 hex digits).
    #[test]
    fn a_tenants_counts_are_beside_its_index_and_no_index() {
        let keys = RedisKeys::default();
        assert_eq!(keys.tenant_job_counts("acme"), "tf:jobs:{acme}:counts");
        assert_eq!(keys.tenant_live_jobs("acme"), "tf:jobs:{acme}:live");
        assert_eq!(
            keys.ended_jobs("acme", None, JobStatus::Cancelled),
            "tf:jobs:{acme}:ended:cancelled"
        );
        assert_eq!(
            keys.ended_jobs(
                "search",
                Some("client:search.clients.example"),
                JobStatus::Failed
            ),
            "tf:jobs:{search}:2ffdec32f7e8dcf31cf0b1937ac46106:ended:failed"
        );
        let pattern = keys.tenant_jobs_pattern();
        let (head, tail) = pattern.split_once('*').unwrap();
        for key in [
            keys.tenant_job_counts("acme"),
            keys.tenant_live_jobs("acme"),
            keys.ended_jobs("acme", None, JobStatus::Succeeded),
            keys.ended_jobs("acme", Some("Ana"), JobStatus::Succeeded),
        ] {
            assert!(!(key.starts_with(head) && key.ends_with(tail)), "{key}");
            assert_eq!(keys.tenant_of_jobs_index(&key), None, "{key}");
        }
    }

    /// What a tool that reads the store back (the bench's `--stored-jobs`)
    /// finds by pattern: every tenant's job index, and every key of a job.
    #[test]
    fn the_patterns_find_the_indexes_and_a_jobs_keys() {
        let keys = RedisKeys::new("tenant-a:tf");
        assert_eq!(keys.tenant_jobs_pattern(), "tenant-a:tf:jobs:{*}");
        let index = keys.tenant_jobs("acme");
        let pattern = keys.tenant_jobs_pattern();
        let (head, tail) = pattern.split_once('*').unwrap();
        assert!(index.starts_with(head) && index.ends_with(tail));
        assert_eq!(keys.tenant_of_jobs_index(&index), Some("acme"));
        let submitters = keys.submitter_jobs("acme", "token:0123456789abcdef");
        assert!(
            !submitters.ends_with(tail),
            "the pattern finds no submitter's index"
        );
        for other in [
            keys.tenant_active_jobs("acme"),
            keys.tenant_approvals("acme"),
            RedisKeys::new("tf").tenant_jobs("acme"),
            format!("{index}:more"),
            submitters,
        ] {
            assert_eq!(keys.tenant_of_jobs_index(&other), None, "{other}");
        }

        let job = JobId::new("acme", 1, 2);
        let copy = JobId::new("acme", 3, 4);
        let pattern = keys.job_keys_pattern(&job);
        assert_eq!(pattern, format!("tenant-a:tf:{{{job}}}:*"));
        let of_job = [
            keys.job(&job),
            keys.job_items(&job),
            keys.job_events(&job),
            keys.job_attempts(&job),
            keys.job_tools(&job),
            keys.job_approvals(&job),
            keys.job_shaped(&job),
            keys.job_lease(&job),
            keys.call_result(&job, "echo", "c", 1),
            keys.call_claim(&job, "echo", "c", 1),
        ];
        for key in &of_job {
            assert!(key.starts_with(pattern.trim_end_matches('*')), "{key}");
            let copied = keys.retag_job_key(key, &job, &copy).unwrap();
            assert_eq!(copied, key.replacen(job.as_str(), copy.as_str(), 1));
            assert_eq!(keys.retag_job_key(&copied, &job, &copy), None);
        }
        assert_eq!(
            keys.retag_job_key(&keys.job(&job), &job, &copy),
            Some(keys.job(&copy))
        );
        assert_eq!(
            keys.retag_job_key(&keys.tenant_jobs("acme"), &job, &copy),
            None
        );
    }

    /// Pinned: a submitter's entries are found again only where they were
    /// put (`printf %s client:search.clients.example | sha256sum`).
    #[test]
    fn a_submitters_index_never_moves() {
        assert_eq!(
            RedisKeys::default().submitter_jobs("search", "client:search.clients.example"),
            "tf:jobs:{search}:2ffdec32f7e8dcf31cf0b1937ac46106"
        );
        assert_eq!(
            submitter_digest("client:search.clients.example"),
            "2ffdec32f7e8dcf31cf0b1937ac46106"
        );
        let keys = RedisKeys::default();
        assert_ne!(
            keys.submitter_jobs("search", "Ana"),
            keys.submitter_jobs("search", "ana")
        );
        assert_ne!(
            keys.submitter_jobs("search", "Ana"),
            keys.submitter_jobs("ads", "Ana")
        );
    }

    #[test]
    fn the_unfinished_index_is_spread_over_shards_that_never_move() {
        let keys = RedisKeys::default();
        // Pinned: stored entries are found again only where they were put.
        // FNV-1a, as Python computes it independently.
        let job = |id: &str| JobId::parse(id).unwrap();
        assert_eq!(
            keys.unfinished_jobs(&job("acme-019000000001000000000000beef")),
            "tf:unfinished:{9}"
        );
        assert_eq!(
            keys.unfinished_jobs(&job("t-7f3a-0192b3c4d5e6f708a1b2c3d4e5f6")),
            "tf:unfinished:{15}"
        );
        let shards: Vec<String> = keys.unfinished_shards().collect();
        assert_eq!(shards.len(), 16);
        assert_eq!(shards[0], "tf:unfinished:{0}");
        let used: std::collections::HashSet<String> = (0..1000)
            .map(|n| {
                keys.unfinished_jobs(&JobId::new("job", n, n.wrapping_mul(0x9e37_79b9_7f4a_7c15)))
            })
            .collect();
        assert_eq!(used.len(), 16, "1,000 jobs use every shard");
        assert!(used.iter().all(|key| shards.contains(key)));
        // A job's move between its indexes is one script: its shard of
        // each, and of their moves, share a hash slot.
        let beef = job("acme-019000000001000000000000beef");
        assert_eq!(
            [keys.parked_jobs(&beef), keys.index_moves(&beef)],
            ["tf:parked:{9}", "tf:parked:{9}:moves"]
        );
    }
}
