//! `toolfleet.v1.AgentService`: thin; validates requests, calls the store and
//! the job queue, and maps errors to gRPC statuses in [`to_status`].

use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_nats::jetstream;
use futures::Stream;
use serde::{Deserialize, Serialize};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use toolfleet_proto::envelope::excerpt;
use toolfleet_proto::manifest::is_valid_tool_name;
use toolfleet_proto::names;
use toolfleet_proto::v1::{self, agent_service_server::AgentService, item};
use tracing::{info, warn};

use crate::auth::{AuthMode, Caller, caller_of};
use toolfleet_service::traces::{self, SpanContext};

use crate::job::{
    Item, JobId, JobLimits, JobRecord, JobSpec, JobStatus, JobTrace, ProviderKind, now_ms,
};
use crate::model::Providers;
use crate::model::scripted::Scripted;
use crate::registry::RegistryHandle;
use crate::store::{self, Idempotency, JobStore, ListCursor};
use tonic_types::StatusExt as _;

/// Limits and defaults of the API.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApiOptions {
    /// Largest `input` (and `instructions`), in bytes. Default: 262144.
    pub max_input_bytes: usize,
    /// Largest `model.script`, in bytes. Default: 1048576.
    pub max_script_bytes: usize,
    /// `max_tool_rounds` when a request gives 0. Default: 8.
    pub default_max_tool_rounds: u32,
    /// Largest `max_tool_rounds` accepted. Default: 64.
    pub max_tool_rounds_limit: u32,
    /// Job deadline when a request gives 0. Default: 10m.
    #[serde(with = "toolfleet_service::config::duration")]
    pub default_deadline: Duration,
    /// Longest deadline accepted. Default: 24h.
    #[serde(with = "toolfleet_service::config::duration")]
    pub max_deadline: Duration,
    /// The model of a request that names none. Default: none, and such a
    /// request is rejected with a message naming what to set.
    pub default_model: DefaultModel,
    /// How callers authenticate: `tokens` (bearer tokens from
    /// `api.tokens_file`) or `none` (every caller is the tenant `default`).
    /// The orchestrator refuses to start with `tokens` and no file.
    /// Default: `tokens`.
    pub auth: AuthMode,
    /// The tokens file: per tenant, the SHA-256 of its tokens and the tools
    /// its jobs may use (docs/security.md). Reloaded when it changes.
    /// Default: none.
    pub tokens_file: Option<std::path::PathBuf>,
    /// How often the tokens file is checked for changes. Default: 2s.
    #[serde(with = "toolfleet_service::config::duration")]
    pub tokens_reload_interval: Duration,
    /// A tenant's jobs queued or running at once, unless its entry in the
    /// tokens file says otherwise; 0: no limit. Default: 1000.
    pub default_max_active_jobs: u32,
    /// A tenant's sustained submissions per second, unless its entry says
    /// otherwise; 0: no limit. Default: 100.
    pub default_submissions_per_second: f64,
    /// A tenant's tool calls in flight at once, unless its entry says
    /// otherwise; 0: no limit. Default: 1000.
    pub default_max_calls_in_flight: u32,
    /// Accept jobs for the scripted model, which plays a client-supplied
    /// script: for demos and tests, never for production traffic. Default:
    /// false (on in `toolfleet dev` and the test harness).
    #[serde(deserialize_with = "figment::util::bool_from_str_or_int")]
    pub allow_scripted: bool,
    /// Most `metadata` entries of a job. Default: 32.
    pub max_metadata_entries: usize,
    /// Longest `metadata` key, in bytes. Default: 64.
    pub max_metadata_key_bytes: usize,
    /// Longest `metadata` value, in bytes. Default: 512.
    pub max_metadata_value_bytes: usize,
    /// Longest `idempotency_key`, in bytes (letters, digits and `-_.:/=+`).
    /// Default: 128.
    pub max_idempotency_key_bytes: usize,
    /// Most names in `tools`. Default: 128.
    pub max_tools: usize,
    /// Longest `model.name`, in bytes. Default: 128.
    pub max_model_name_bytes: usize,
    /// Calls of one model turn that run; each call beyond it is answered
    /// with a terminal `TOO_MANY_CALLS` envelope and the job goes on.
    /// Default: 64.
    pub max_calls_per_turn: u32,
    /// Largest answer of the scripted model once it has quoted tool outputs;
    /// a longer one fails the job with `SCRIPT_ERROR`. Default: 1048576.
    pub max_scripted_answer_bytes: u64,
}

/// How much of a client's value an error message repeats.
const ECHO_CHARS: usize = 64;

/// The model a request without one gets (`api.default_model`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DefaultModel {
    /// `openai-responses` or `openai-chat`. Default: empty (no default model).
    pub provider: String,
    /// The model name, e.g. `gpt-4.1-mini`. Default: empty.
    pub name: String,
}

impl Default for ApiOptions {
    fn default() -> Self {
        Self {
            max_input_bytes: 256 * 1024,
            max_script_bytes: 1024 * 1024,
            default_max_tool_rounds: 8,
            max_tool_rounds_limit: 64,
            default_deadline: Duration::from_secs(600),
            max_deadline: Duration::from_secs(24 * 3600),
            default_model: DefaultModel::default(),
            auth: AuthMode::Tokens,
            tokens_file: None,
            tokens_reload_interval: Duration::from_secs(2),
            default_max_active_jobs: 1000,
            default_submissions_per_second: 100.0,
            default_max_calls_in_flight: 1000,
            allow_scripted: false,
            max_metadata_entries: 32,
            max_metadata_key_bytes: 64,
            max_metadata_value_bytes: 512,
            max_idempotency_key_bytes: 128,
            max_tools: 128,
            max_model_name_bytes: 128,
            max_calls_per_turn: 64,
            max_scripted_answer_bytes: 1024 * 1024,
        }
    }
}

/// The AgentService implementation.
pub struct AgentApi {
    pub(crate) store: JobStore,
    pub(crate) js: jetstream::Context,
    pub(crate) registry: RegistryHandle,
    pub(crate) providers: Arc<Providers>,
    pub(crate) options: ApiOptions,
}

/// The one conversion from a store failure to a gRPC status. The detail goes
/// to the log, not to the client.
pub fn to_status(err: &store::Error) -> Status {
    match err {
        store::Error::Redis(source) => {
            warn!(error = %source, "job store unavailable");
            Status::unavailable("the job store is unavailable; retry later")
        }
        store::Error::LeaseLost(_) => Status::aborted("the job changed hands; retry"),
        store::Error::IdempotencyConflict(key) => Status::already_exists(format!(
            "idempotency_key: {:?} was used for a different request; use a new key for a new \
             request",
            excerpt(key, ECHO_CHARS)
        )),
        // Only a round's result commit meets it, and the round reads the
        // stored result instead; no request answers with it.
        store::Error::ResultMismatch(_) => Status::internal("a tool result was inconsistent"),
        store::Error::Corrupt { job_id, .. } => {
            warn!(error = %err, "corrupt job record");
            Status::internal(format!("the record of job {job_id} is unreadable"))
        }
    }
}

/// SHA-256 (hex) of everything a submission asks for, in a canonical form:
/// an idempotency key returns the first job only to the same request.
fn fingerprint(request: &v1::SubmitJobRequest) -> String {
    use sha2::{Digest, Sha256};
    let model = request
        .model
        .as_ref()
        .map(|m| serde_json::json!([m.provider, m.name, m.script, m.base_url]));
    let metadata: std::collections::BTreeMap<&String, &String> = request.metadata.iter().collect();
    let canonical = serde_json::json!({
        "input": request.input,
        "instructions": request.instructions,
        "model": model,
        "tools": request.tools,
        "max_tool_rounds": request.max_tool_rounds,
        "parallel_tool_calls": request.parallel_tool_calls,
        "deadline_ms": request.deadline_ms,
        "metadata": metadata,
    });
    format!("{:x}", Sha256::digest(canonical.to_string().as_bytes()))
}

/// A model spec with nothing set: the same as none (proto3 cannot tell).
fn is_unset(model: &v1::ModelSpec) -> bool {
    model.provider.is_empty()
        && model.name.is_empty()
        && model.script.is_empty()
        && model.base_url.is_empty()
}

/// `ListJobs` page size when a request gives 0.
const DEFAULT_PAGE_SIZE: usize = 50;
/// Largest `ListJobs` page.
const MAX_PAGE_SIZE: usize = 500;
/// Most metadata pairs one `ListJobs` filter may name.
const MAX_METADATA_FILTERS: usize = 16;

/// The tools a job may use: those it names, within its tenant's allow-list
/// (all of the allow-list when it names none).
fn allowed_tools(named: Vec<String>, caller: &Caller) -> Result<Vec<String>, Status> {
    let Some(allowed) = &caller.tools else {
        return Ok(named);
    };
    if named.is_empty() {
        return Ok(allowed.clone());
    }
    if let Some(name) = named.iter().find(|name| !allowed.contains(name)) {
        return Err(Status::permission_denied(format!(
            "tools: {:?} is not allowed for tenant {:?}",
            excerpt(name, ECHO_CHARS),
            caller.tenant
        )));
    }
    Ok(named)
}

/// The same answer for a job of another tenant as for no job at all.
fn not_found(job_id: &str) -> Status {
    Status::not_found(format!(
        "job {} not found (unknown or expired)",
        excerpt(job_id, ECHO_CHARS)
    ))
}

fn invalid(field: &str, problem: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("{field}: {problem}"))
}

impl AgentApi {
    /// Checks a submission and applies defaults; errors name the field.
    fn spec(&self, mut request: v1::SubmitJobRequest, caller: &Caller) -> Result<JobSpec, Status> {
        self.check_text(&request)?;
        let model = match request.model.take() {
            Some(model) if !is_unset(&model) => model,
            _ => self.default_model()?,
        };
        let (provider, model, script) = self.check_model(model)?;
        self.check_labels(&request)?;
        let (max_tool_rounds, deadline) = self.check_limits(&request)?;
        let tools = allowed_tools(std::mem::take(&mut request.tools), caller)?;
        Ok(JobSpec {
            input: request.input,
            instructions: request.instructions,
            provider,
            model,
            script,
            tools,
            max_tool_rounds,
            parallel_tool_calls: request.parallel_tool_calls.unwrap_or(true),
            deadline_ms: now_ms() + u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX / 2),
            metadata: request.metadata.into_iter().collect(),
            tenant: caller.tenant.clone(),
            limits: JobLimits {
                max_calls_per_turn: self.options.max_calls_per_turn,
                max_scripted_answer_bytes: self.options.max_scripted_answer_bytes,
                max_active_jobs: caller.quotas.max_active_jobs,
                max_calls_in_flight: caller.quotas.max_calls_in_flight,
            },
        })
    }

    /// The caller's tenant may submit one more job: its submissions per
    /// second, its active jobs and its tool calls in flight are within its
    /// quotas. Otherwise
    /// `RESOURCE_EXHAUSTED` with a `google.rpc.RetryInfo` saying when to try
    /// again.
    async fn check_quotas(&self, caller: &Caller) -> Result<(), Status> {
        let exhausted = |message: String, retry_after: Duration| {
            Status::with_error_details(
                tonic::Code::ResourceExhausted,
                message,
                tonic_types::ErrorDetails::with_retry_info(Some(retry_after)),
            )
        };
        let quotas = caller.quotas;
        // The rate first: it is one cheap script, and it bounds how often
        // the active-jobs count (a scan when at the quota) runs.
        if let Some(rate) = quotas.submissions_per_second {
            let wait = self
                .store
                .take_submission(&caller.tenant, rate)
                .await
                .map_err(|e| to_status(&e))?;
            if let Some(wait) = wait {
                return Err(exhausted(
                    format!(
                        "tenant {:?} submits faster than its quota of {rate} jobs per second \
                         (submissions_per_second); retry after {} ms",
                        caller.tenant,
                        wait.as_millis()
                    ),
                    wait,
                ));
            }
        }
        if let Some(limit) = quotas.max_active_jobs {
            let active = self
                .store
                .active_jobs(&caller.tenant, limit)
                .await
                .map_err(|e| to_status(&e))?;
            if active >= limit {
                return Err(exhausted(
                    format!(
                        "tenant {:?} has {active} jobs queued or running, its quota \
                         (max_active_jobs); retry when one has finished",
                        caller.tenant
                    ),
                    Duration::from_secs(1),
                ));
            }
        }
        if let Some(limit) = quotas.max_calls_in_flight {
            let in_flight = self
                .store
                .calls_in_flight(&caller.tenant)
                .await
                .map_err(|e| to_status(&e))?;
            if in_flight >= limit {
                return Err(exhausted(
                    format!(
                        "tenant {:?} has {in_flight} tool calls in flight, its quota \
                         (max_calls_in_flight); retry when some have finished",
                        caller.tenant
                    ),
                    Duration::from_secs(1),
                ));
            }
        }
        Ok(())
    }

    /// The record of `job_id` if it belongs to the caller's tenant; the
    /// same `NOT_FOUND` for another tenant's job as for a missing one. An id
    /// that is not a job id, or names another tenant, is refused before
    /// Redis is asked.
    async fn own_job(&self, job_id: &str, caller: &Caller) -> Result<JobRecord, Status> {
        may_own(job_id, caller)?;
        let record = self.store.get(job_id).await.map_err(|e| to_status(&e))?;
        record
            .filter(|record| record.spec.tenant == caller.tenant)
            .ok_or_else(|| not_found(job_id))
    }

    /// `tools`, `metadata` and `idempotency_key` are within their limits.
    fn check_labels(&self, request: &v1::SubmitJobRequest) -> Result<(), Status> {
        let o = &self.options;
        if request.tools.len() > o.max_tools {
            return Err(invalid(
                "tools",
                format!(
                    "names {} tools; the limit is {}",
                    request.tools.len(),
                    o.max_tools
                ),
            ));
        }
        if let Some(name) = request.tools.iter().find(|name| !is_valid_tool_name(name)) {
            return Err(invalid(
                "tools",
                format!("{:?} is not a valid tool name", excerpt(name, ECHO_CHARS)),
            ));
        }
        if request.metadata.len() > o.max_metadata_entries {
            return Err(invalid(
                "metadata",
                format!(
                    "has {} entries; the limit is {}",
                    request.metadata.len(),
                    o.max_metadata_entries
                ),
            ));
        }
        for (key, value) in &request.metadata {
            if key.is_empty() || key.len() > o.max_metadata_key_bytes {
                return Err(invalid(
                    "metadata",
                    format!(
                        "key {:?} must be 1 to {} bytes",
                        excerpt(key, ECHO_CHARS),
                        o.max_metadata_key_bytes
                    ),
                ));
            }
            if value.len() > o.max_metadata_value_bytes {
                return Err(invalid(
                    "metadata",
                    format!(
                        "the value of {:?} is {} bytes; the limit is {}",
                        excerpt(key, ECHO_CHARS),
                        value.len(),
                        o.max_metadata_value_bytes
                    ),
                ));
            }
        }
        let key = &request.idempotency_key;
        let key_chars = key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:/=+".contains(&b));
        if key.len() > o.max_idempotency_key_bytes || !key_chars {
            return Err(invalid(
                "idempotency_key",
                format!(
                    "must be at most {} bytes of letters, digits and -_.:/=+",
                    o.max_idempotency_key_bytes
                ),
            ));
        }
        Ok(())
    }

    /// `input` is given, and it and `instructions` are within the size limit.
    fn check_text(&self, request: &v1::SubmitJobRequest) -> Result<(), Status> {
        let limit = self.options.max_input_bytes;
        if request.input.trim().is_empty() {
            return Err(invalid("input", "must not be empty"));
        }
        for (field, text) in [
            ("input", &request.input),
            ("instructions", &request.instructions),
        ] {
            if text.len() > limit {
                return Err(invalid(
                    field,
                    format!("is {} bytes; the limit is {limit}", text.len()),
                ));
            }
        }
        Ok(())
    }

    /// `api.default_model`, for a request that names no model.
    fn default_model(&self) -> Result<v1::ModelSpec, Status> {
        let default = &self.options.default_model;
        if default.provider.is_empty() {
            return Err(invalid(
                "model",
                "is required: set model.provider to \"scripted\" (with model.script), \
                 \"openai-responses\" or \"openai-chat\" (with model.name); or configure \
                 api.default_model on the orchestrator",
            ));
        }
        Ok(v1::ModelSpec {
            provider: default.provider.clone(),
            name: default.name.clone(),
            ..v1::ModelSpec::default()
        })
    }

    /// The provider, model name and script of `model` (the scripted model
    /// when a script but no provider is given), checked.
    fn check_model(
        &self,
        model: v1::ModelSpec,
    ) -> Result<(ProviderKind, String, Option<String>), Status> {
        let provider_name = if model.provider.is_empty() {
            ProviderKind::Scripted.as_str()
        } else {
            model.provider.as_str()
        };
        let provider = ProviderKind::parse(provider_name).ok_or_else(|| {
            let known: Vec<&str> = ProviderKind::ALL.iter().map(ProviderKind::as_str).collect();
            invalid(
                "model.provider",
                format!(
                    "unknown provider {:?}; use {}",
                    excerpt(provider_name, ECHO_CHARS),
                    known.join(", ")
                ),
            )
        })?;
        if !model.base_url.is_empty() {
            return Err(invalid(
                "model.base_url",
                "per-job base URLs are disabled; configure openai.base_url on the orchestrator",
            ));
        }
        if provider == ProviderKind::Scripted {
            if !self.options.allow_scripted {
                return Err(Status::failed_precondition(
                    "model.provider: the scripted model is off on this orchestrator \
                     (api.allow_scripted = false; it plays client-supplied scripts, for \
                     demos and tests); name a real model",
                ));
            }
            if model.script.len() > self.options.max_script_bytes {
                return Err(invalid("model.script", "is over the size limit"));
            }
            Scripted::parse(&model.script).map_err(|e| invalid("model.script", e))?;
            return Ok((provider, model.name, Some(model.script)));
        }
        if model.name.is_empty() {
            return Err(invalid(
                "model.name",
                format!("is required for {provider_name}"),
            ));
        }
        if model.name.len() > self.options.max_model_name_bytes {
            return Err(invalid(
                "model.name",
                format!(
                    "is {} bytes; the limit is {}",
                    model.name.len(),
                    self.options.max_model_name_bytes
                ),
            ));
        }
        if !self.providers.has_api_key() {
            return Err(Status::failed_precondition(format!(
                "model.provider: {provider_name} needs an API key; set OPENAI_API_KEY on the orchestrator"
            )));
        }
        Ok((provider, model.name, None))
    }

    /// `max_tool_rounds` and the deadline, defaulted and within their limits.
    fn check_limits(&self, request: &v1::SubmitJobRequest) -> Result<(u32, Duration), Status> {
        let max_tool_rounds = match request.max_tool_rounds {
            0 => self.options.default_max_tool_rounds,
            n if n > self.options.max_tool_rounds_limit => {
                return Err(invalid(
                    "max_tool_rounds",
                    format!("the limit is {}", self.options.max_tool_rounds_limit),
                ));
            }
            n => n,
        };
        let deadline = match request.deadline_ms {
            0 => self.options.default_deadline,
            ms => Duration::from_millis(ms),
        };
        if deadline > self.options.max_deadline {
            return Err(invalid(
                "deadline_ms",
                format!("the limit is {} ms", self.options.max_deadline.as_millis()),
            ));
        }
        Ok((max_tool_rounds, deadline))
    }

    async fn enqueue(&self, job_id: &str, tenant: &str) -> Result<(), Status> {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(names::headers::MSG_ID, job_id);
        headers.insert(names::headers::TENANT, tenant);
        let publish = self
            .js
            .publish_with_headers(names::JOB_SUBJECT, headers, job_id.to_owned().into())
            .await;
        let acked = match publish {
            Ok(ack) => ack.await.map(|_| ()).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        acked.map_err(|err| {
            warn!(job_id, error = %err, "could not queue the job");
            Status::unavailable(format!(
                "job {job_id} is stored but could not be queued; submit again with the same idempotency_key"
            ))
        })
    }
}

/// How often a watcher re-reads Redis without a wake-up.
const WATCH_POLL: Duration = Duration::from_secs(1);

type EventStream = Pin<Box<dyn Stream<Item = Result<v1::JobEvent, Status>> + Send>>;

/// The API as served from the moment the replica listens: every call answers
/// `UNAVAILABLE` until the replica is ready (connected to NATS and Redis,
/// its streams set up), then goes to the [`AgentApi`]. Serving that early
/// lets gRPC health answer `NOT_SERVING` while the replica waits, instead of
/// a port that does not answer at all.
#[derive(Clone, Default)]
pub struct StartingApi {
    ready: Arc<OnceLock<AgentApi>>,
}

impl StartingApi {
    /// From now on, calls go to `api`. Only the first call has an effect.
    pub fn serve(&self, api: AgentApi) {
        let _ = self.ready.set(api);
    }

    fn api(&self) -> Result<&AgentApi, Status> {
        self.ready.get().ok_or_else(|| {
            Status::unavailable("the orchestrator is starting (waiting for NATS and Redis); retry")
        })
    }
}

#[tonic::async_trait]
impl AgentService for StartingApi {
    async fn submit_job(
        &self,
        request: Request<v1::SubmitJobRequest>,
    ) -> Result<Response<v1::SubmitJobResponse>, Status> {
        self.api()?.submit_job(request).await
    }

    async fn get_job(
        &self,
        request: Request<v1::GetJobRequest>,
    ) -> Result<Response<v1::Job>, Status> {
        self.api()?.get_job(request).await
    }

    type WatchJobStream = EventStream;

    async fn watch_job(
        &self,
        request: Request<v1::WatchJobRequest>,
    ) -> Result<Response<Self::WatchJobStream>, Status> {
        self.api()?.watch_job(request).await
    }

    async fn cancel_job(
        &self,
        request: Request<v1::CancelJobRequest>,
    ) -> Result<Response<v1::CancelJobResponse>, Status> {
        self.api()?.cancel_job(request).await
    }

    async fn list_jobs(
        &self,
        request: Request<v1::ListJobsRequest>,
    ) -> Result<Response<v1::ListJobsResponse>, Status> {
        self.api()?.list_jobs(request).await
    }

    async fn list_tools(
        &self,
        request: Request<v1::ListToolsRequest>,
    ) -> Result<Response<v1::ListToolsResponse>, Status> {
        self.api()?.list_tools(request).await
    }
}

#[tonic::async_trait]
impl AgentService for AgentApi {
    async fn submit_job(
        &self,
        request: Request<v1::SubmitJobRequest>,
    ) -> Result<Response<v1::SubmitJobResponse>, Status> {
        let caller = caller_of(&request);
        let (trace, mut span) = JobTrace::begin(client_trace(request.metadata()), "submit job");
        span.set("rpc.system", "grpc");
        span.set("rpc.method", "SubmitJob");
        span.set("toolfleet.tenant", caller.tenant.clone());
        let request = request.into_inner();
        let key = (!request.idempotency_key.is_empty()).then(|| request.idempotency_key.clone());
        let fingerprint = fingerprint(&request);
        let submitted = async {
            let spec = self.spec(request, &caller)?;
            self.check_quotas(&caller).await?;
            let idempotency = key.as_deref().map(|key| Idempotency {
                key,
                fingerprint: &fingerprint,
            });
            let (job_id, duplicate) = self
                .store
                .submit(&spec, idempotency, trace.as_ref())
                .await
                .map_err(|e| to_status(&e))?;
            Ok::<_, Status>((spec, job_id, duplicate))
        };
        let (spec, job_id, duplicate) = match submitted.await {
            Ok(submitted) => submitted,
            Err(status) => {
                span.fail(format!("{:?}", status.code()));
                return Err(status);
            }
        };
        span.set("toolfleet.job_id", job_id.clone());
        span.set("toolfleet.provider", spec.provider.as_str());
        span.set("gen_ai.request.model", spec.model.clone());
        span.set("toolfleet.duplicate", duplicate);
        let queued = if duplicate {
            // Queue again only if it may never have been queued; the message
            // id makes this a no-op when it was.
            let record = self.store.get(&job_id).await.map_err(|e| to_status(&e))?;
            record.is_some_and(|r| r.status == JobStatus::Queued)
        } else {
            true
        };
        if queued {
            self.enqueue(&job_id, &spec.tenant).await?;
        }
        if !duplicate {
            let trace_id = trace.as_ref().map(JobTrace::trace_id).unwrap_or_default();
            info!(job_id, trace_id, "job submitted");
            crate::metrics::job_submitted();
        }
        span.end();
        Ok(Response::new(v1::SubmitJobResponse { job_id, duplicate }))
    }

    async fn get_job(
        &self,
        request: Request<v1::GetJobRequest>,
    ) -> Result<Response<v1::Job>, Status> {
        let caller = caller_of(&request);
        let job_id = request.into_inner().job_id;
        let record = self.own_job(&job_id, &caller).await?;
        let items = self
            .store
            .items(&job_id, 0)
            .await
            .map_err(|e| to_status(&e))?;
        Ok(Response::new(to_job(record, &items)))
    }

    type WatchJobStream = EventStream;

    async fn watch_job(
        &self,
        request: Request<v1::WatchJobRequest>,
    ) -> Result<Response<Self::WatchJobStream>, Status> {
        let caller = caller_of(&request);
        let request = request.into_inner();
        let job_id = request.job_id;
        // The id's shape first: nothing else of it reaches a subject.
        may_own(&job_id, &caller)?;
        // Subscribe before the first read, so no wake-up is missed; the
        // first read also says whose job it is (one round trip for both).
        let wakeups = self.store.subscribe_events(&job_id).await.map_err(|err| {
            warn!(error = %err, "cannot subscribe to job events");
            Status::unavailable("event notifications are unavailable; retry later")
        })?;
        let start = self
            .store
            .watch_start(&job_id, request.from_offset, WATCH_BATCH)
            .await
            .map_err(|e| to_status(&e))?
            .filter(|start| start.tenant == caller.tenant)
            .ok_or_else(|| not_found(&job_id))?;
        let trace_id = start.trace.as_ref().map(JobTrace::trace_id);
        let store = self.store.clone();
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        // Owned by the client's stream: it ends with the job's final event,
        // or as soon as the stream is dropped (the client went away, or the
        // server shut down), which closes `tx`.
        tokio::spawn(follow_events(
            store,
            job_id,
            (request.from_offset, start.events),
            trace_id,
            wakeups,
            tx,
        ));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn cancel_job(
        &self,
        request: Request<v1::CancelJobRequest>,
    ) -> Result<Response<v1::CancelJobResponse>, Status> {
        let caller = caller_of(&request);
        let job_id = request.into_inner().job_id;
        self.own_job(&job_id, &caller).await?;
        let status = self
            .store
            .cancel(&job_id)
            .await
            .map_err(|e| to_status(&e))?
            .ok_or_else(|| not_found(&job_id))?;
        Ok(Response::new(v1::CancelJobResponse {
            status: v1::JobStatus::from(status).into(),
        }))
    }

    async fn list_jobs(
        &self,
        request: Request<v1::ListJobsRequest>,
    ) -> Result<Response<v1::ListJobsResponse>, Status> {
        let caller = caller_of(&request);
        let request = request.into_inner();
        let limit = match request.page_size {
            0 => DEFAULT_PAGE_SIZE,
            n if n as usize > MAX_PAGE_SIZE => {
                return Err(invalid(
                    "page_size",
                    format!("the limit is {MAX_PAGE_SIZE}"),
                ));
            }
            n => n as usize,
        };
        let before = match request.page_token.as_str() {
            "" => None,
            token => Some(ListCursor::from_token(token).ok_or_else(|| {
                invalid(
                    "page_token",
                    "is not a token from an earlier page; pass next_page_token as it came",
                )
            })?),
        };
        let status = match v1::JobStatus::try_from(request.status) {
            Ok(v1::JobStatus::Unspecified) => None,
            Ok(status) => {
                Some(JobStatus::try_from(status).map_err(|_| invalid("status", "unknown"))?)
            }
            Err(_) => return Err(invalid("status", "unknown")),
        };
        if request.metadata.len() > MAX_METADATA_FILTERS {
            return Err(invalid(
                "metadata",
                format!("at most {MAX_METADATA_FILTERS} pairs"),
            ));
        }
        let keep = |record: &JobRecord| {
            status.is_none_or(|s| record.status == s)
                && request
                    .metadata
                    .iter()
                    .all(|(key, value)| record.spec.metadata.get(key) == Some(value))
        };
        let (records, next) = self
            .store
            .list(&caller.tenant, before, limit, limit * 10, keep)
            .await
            .map_err(|e| to_status(&e))?;
        Ok(Response::new(v1::ListJobsResponse {
            jobs: records.into_iter().map(|r| to_job(r, &[])).collect(),
            next_page_token: next.map(|c| c.to_token()).unwrap_or_default(),
        }))
    }

    async fn list_tools(
        &self,
        _request: Request<v1::ListToolsRequest>,
    ) -> Result<Response<v1::ListToolsResponse>, Status> {
        let tools = self
            .registry
            .available_tools()
            .into_iter()
            .map(|t| v1::Tool {
                name: t.manifest.name.clone(),
                description: t.manifest.description.clone(),
                parameters: t.manifest.parameters.to_string(),
                strict: t.manifest.strict,
                workers: u32::try_from(t.workers).unwrap_or(u32::MAX),
                timeout_ms: t.manifest.timeout_ms,
                max_attempts: t.manifest.max_attempts,
                side_effects: t.manifest.side_effects,
                version: t.manifest.version.clone(),
            })
            .collect();
        Ok(Response::new(v1::ListToolsResponse { tools }))
    }
}

/// Refuses, before Redis is asked, an id that is not a job id or names
/// another tenant than the caller's: the same `NOT_FOUND` as for a missing
/// job.
fn may_own(job_id: &str, caller: &Caller) -> Result<(), Status> {
    if JobId::parse(job_id).is_some_and(|id| id.may_belong_to(&caller.tenant)) {
        Ok(())
    } else {
        Err(not_found(job_id))
    }
}

/// How long a watcher rides out a job store outage before it gives up.
const WATCH_OUTAGE: Duration = Duration::from_secs(30);

/// Events a watch reads from Redis at once.
const WATCH_BATCH: usize = 256;

/// Streams a job's events from `offset` into `tx` until the final one, the
/// client leaving, or the job expiring, starting with `first`, the events
/// from `offset` on that the watch read when it began. Redis errors are
/// retried (a restart of Redis is not the end of a watch) for up to
/// [`WATCH_OUTAGE`].
async fn follow_events(
    store: JobStore,
    job_id: String,
    (mut offset, first): (u64, Vec<store::Event>),
    mut trace_id: Option<String>,
    mut wakeups: store::WakeUps,
    tx: tokio::sync::mpsc::Sender<Result<v1::JobEvent, Status>>,
) {
    let mut drained = false;
    let mut failing_since: Option<std::time::Instant> = None;
    // Whether an empty read must look at the job: on the first read and
    // after a poll, not after each wake-up, which only comes from a job
    // that exists and has not ended (its final event ends the stream).
    let mut check_job = true;
    // The next events, when they are at hand: the watch's first read, or
    // what a write in this process handed over. An empty first read is
    // read again here, where an empty read looks at the job.
    let mut handed = (!first.is_empty()).then_some(first);
    loop {
        let read = match handed.take() {
            Some(events) => Ok((events, None)),
            None => {
                async {
                    let events = store.events(&job_id, offset, WATCH_BATCH).await?;
                    let status = if events.is_empty() && check_job {
                        Some(store.status(&job_id).await?)
                    } else {
                        None
                    };
                    Ok::<_, store::Error>((events, status))
                }
                .await
            }
        };
        let (events, status) = match read {
            Ok(read) => {
                failing_since = None;
                read
            }
            Err(err) => {
                let since = *failing_since.get_or_insert_with(std::time::Instant::now);
                if since.elapsed() > WATCH_OUTAGE {
                    let _ = tx.send(Err(to_status(&err))).await;
                    return;
                }
                tokio::select! {
                    () = tx.closed() => return,
                    () = tokio::time::sleep(Duration::from_millis(250)) => continue,
                }
            }
        };
        match status {
            // Expired, or never existed.
            Some(None) => return,
            // A finished job has all its events (status and final event
            // are one write): read once more, then stop. A stream that
            // started past the final event still ends with it, so every
            // watch of a finished job says how it ended.
            Some(Some(status)) if status.is_final() => {
                if drained {
                    if let Ok(Some(last)) = store.last_event(&job_id).await
                        && last.is_final
                    {
                        let event = to_event(&job_id, last, trace_id.take());
                        let _ = tx.send(Ok(event)).await;
                    }
                    return;
                }
                drained = true;
                continue;
            }
            _ => {}
        }
        let full = events.len() == WATCH_BATCH;
        for event in events {
            offset = event.offset + 1;
            let is_final = event.is_final;
            let sent = tx.send(Ok(to_event(&job_id, event, trace_id.take()))).await;
            if sent.is_err() || is_final {
                return;
            }
        }
        if full {
            continue;
        }
        // Wait for a wake-up that brings events not read yet; poll anyway
        // now and then, since wake-ups are best effort.
        check_job = tokio::select! {
            () = tx.closed() => return,
            woken = wakeups.past(offset) => {
                if let store::Woken::Handed(events) = woken {
                    handed = Some(events.to_vec());
                }
                false
            }
            () = tokio::time::sleep(WATCH_POLL) => true,
        };
    }
}

/// An event for the client; `trace_id` goes on the first of a stream.
fn to_event(job_id: &str, event: store::Event, trace_id: Option<String>) -> v1::JobEvent {
    v1::JobEvent {
        trace_id: trace_id.unwrap_or_default(),
        job_id: job_id.to_owned(),
        offset: event.offset,
        kind: event.kind,
        data: event.data,
        timestamp_ms: event.timestamp_ms,
        r#final: event.is_final,
    }
}

fn to_job(record: JobRecord, items: &[Item]) -> v1::Job {
    let items = items
        .iter()
        .filter_map(|item| {
            let kind = match item {
                Item::User { text } => item::Kind::User(v1::UserMessage { text: text.clone() }),
                Item::Assistant { text, .. } => {
                    item::Kind::Assistant(v1::AssistantMessage { text: text.clone() })
                }
                Item::ToolCall {
                    call_id,
                    name,
                    arguments,
                    ..
                } => item::Kind::ToolCall(v1::ToolCallItem {
                    call_id: call_id.clone(),
                    name: name.clone(),
                    arguments: arguments.clone(),
                }),
                Item::ToolResult {
                    call_id,
                    name,
                    output,
                    attempts,
                } => item::Kind::ToolResult(v1::ToolResultItem {
                    call_id: call_id.clone(),
                    name: name.clone(),
                    output: output.clone(),
                    attempts: *attempts,
                }),
                Item::Reasoning { .. } => return None,
            };
            Some(v1::Item { kind: Some(kind) })
        })
        .collect();
    v1::Job {
        job_id: record.job_id,
        status: v1::JobStatus::from(record.status).into(),
        output_text: record.output_text,
        error: record.error.map(|e| v1::JobError {
            code: e.code.to_string(),
            message: e.message,
        }),
        rounds: record.rounds,
        items,
        metadata: record.spec.metadata.into_iter().collect(),
        created_at_ms: record.created_at_ms,
        finished_at_ms: record.finished_at_ms,
        trace_id: record
            .trace
            .as_ref()
            .map(JobTrace::trace_id)
            .unwrap_or_default(),
    }
}

/// The W3C trace context a client sent with its request, if valid.
fn client_trace(metadata: &tonic::metadata::MetadataMap) -> Option<SpanContext> {
    let header = |name: &str| metadata.get(name).and_then(|v| v.to_str().ok());
    traces::extract(header("traceparent"), header("tracestate"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_store_error_maps_to_a_status() {
        let redis = store::Error::Redis(redis::RedisError::from(std::io::Error::other(
            "down at 10.0.0.1",
        )));
        let status = to_status(&redis);
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert!(!status.message().contains("10.0.0.1"));
        assert_eq!(
            to_status(&store::Error::LeaseLost("j".into())).code(),
            tonic::Code::Aborted
        );
        let corrupt = store::Error::Corrupt {
            job_id: "j".into(),
            detail: "spec".into(),
        };
        assert_eq!(to_status(&corrupt).code(), tonic::Code::Internal);
        let conflict = to_status(&store::Error::IdempotencyConflict("k".repeat(10_000)));
        assert_eq!(conflict.code(), tonic::Code::AlreadyExists);
        assert!(conflict.message().starts_with("idempotency_key: "));
        assert!(conflict.message().len() < 300);
    }

    #[test]
    fn fingerprints_tell_requests_apart_and_ignore_map_order() {
        let request = |input: &str, metadata: &[(&str, &str)]| v1::SubmitJobRequest {
            input: input.into(),
            metadata: metadata
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ..Default::default()
        };
        let a = fingerprint(&request("hi", &[("a", "1"), ("b", "2")]));
        assert_eq!(a, fingerprint(&request("hi", &[("b", "2"), ("a", "1")])));
        assert_ne!(a, fingerprint(&request("hi!", &[("a", "1"), ("b", "2")])));
        assert_ne!(a, fingerprint(&request("hi", &[("a", "1")])));
        assert_eq!(a.len(), 64);
    }
}
