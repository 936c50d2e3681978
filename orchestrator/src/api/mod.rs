//! `toolfleet.v1.AgentService`, a thin adapter: each call checks its
//! request (`validate`), asks the tenant's limits ([`crate::quota`]), the
//! store or the job queue, and maps what comes back (`convert`).
//! `WatchJob` streams from a follower (`follow`).
//!
//! - `options`: the API's limits and defaults (`api.*`);
//! - `validate`: what a request may say, as a table of checks;
//! - `convert`: protobuf to and from the orchestrator's types, and errors to
//!   statuses;
//! - `follow`: the event follower behind `WatchJob`, a state type.

mod convert;
mod decide;
mod follow;
mod options;
mod validate;

use std::pin::Pin;
use std::sync::{Arc, OnceLock};

use async_nats::jetstream;
use futures::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use toolfleet_proto::names::span_attributes;
use toolfleet_proto::v1::{self, agent_service_server::AgentService};
use tracing::{info, warn};

use crate::auth::{Caller, JobAccess, JobAction, Rpc, Sight, caller_for, caller_of};
use crate::job::{JobId, JobRecord, JobStatus, JobTrace, ProviderKind};
use crate::live::Live;
use crate::model::Providers;
use crate::publish;
use crate::quota::TenantLimits;
use crate::registry::{FleetTool, RegistryHandle};
use crate::store::{self, Approvals, Idempotency, JobCounts, JobIndex, JobStore, Page};
use convert::{client_trace, fingerprint, not_admitted, not_found, to_counts, to_job, to_tool};
use follow::{Follower, WATCH_BATCH, Watch};
use validate::{ListQuery, Rules, may_own};

pub(crate) use convert::to_status;
pub(crate) use options::ApiOptions;

/// How much of a client's value an error message repeats.
const ECHO_CHARS: usize = 64;

/// The AgentService implementation.
pub(crate) struct AgentApi {
    pub(crate) store: JobStore,
    /// What watchers hear of a job as it happens.
    pub(crate) live: Live,
    pub(crate) js: jetstream::Context,
    pub(crate) registry: RegistryHandle,
    pub(crate) providers: Arc<Providers>,
    /// Asked before a submission is stored.
    pub(crate) limits: TenantLimits,
    pub(crate) options: ApiOptions,
    /// Which tools have circuit breakers, to show ListTools their state.
    pub(crate) breaker: crate::breaker::BreakerOptions,
    /// Cancelled when the replica starts to drain: open watches end then.
    pub(crate) stopping: CancellationToken,
}

/// A job the API stored (or found stored, for a repeated idempotency key).
struct Submitted {
    job_id: JobId,
    duplicate: bool,
    /// Whether to queue it: a new job, or a duplicate still queued (which
    /// may never have been).
    queue: bool,
    provider: &'static str,
    model: String,
}

impl AgentApi {
    /// The states of the breakers of the `listed` tools that have one; none
    /// when Redis cannot be read (ListTools still answers: the breakers are
    /// a detail of the list).
    async fn breakers(
        &self,
        listed: &[FleetTool],
    ) -> std::collections::HashMap<String, crate::breaker::State> {
        let guarded: Vec<&str> = listed
            .iter()
            .filter(|l| {
                let own = l.tool.manifest.breaker.as_ref();
                self.breaker.for_tool(own).enabled
            })
            .map(|l| l.tool.manifest.name.as_str())
            .collect();
        if guarded.is_empty() {
            return std::collections::HashMap::new();
        }
        self.store.breakers(&guarded).await.unwrap_or_else(|err| {
            warn!(error = %err, "could not read the tools' breakers for ListTools");
            std::collections::HashMap::new()
        })
    }

    fn rules(&self) -> Rules<'_> {
        let has = |provider| self.providers.has_api_key(&provider) == Some(true);
        Rules {
            options: &self.options,
            keys: validate::ApiKeys {
                openai: has(ProviderKind::OpenaiChat),
                anthropic: has(ProviderKind::AnthropicMessages),
            },
        }
    }

    /// Checks, admits, stores and queues one submission.
    async fn submit(
        &self,
        request: v1::SubmitJobRequest,
        caller: &Caller,
        trace: Option<&JobTrace>,
    ) -> Result<Submitted, Status> {
        let key = (!request.idempotency_key.is_empty()).then(|| request.idempotency_key.clone());
        let fingerprint = fingerprint(&request);
        let spec = validate::job_spec(request, caller, self.rules())?;
        self.limits
            .admit(&caller.tenant, &caller.quotas)
            .await
            .map_err(|e| not_admitted(&e))?;
        let idempotency = key.as_deref().map(|key| Idempotency {
            key,
            fingerprint: &fingerprint,
        });
        let (job_id, duplicate) = self
            .store
            .submit(&spec, idempotency, trace)
            .await
            .map_err(|e| to_status(&e))?;
        let queue = match key {
            Some(key) if duplicate => self.first_submission(&job_id, caller, key).await?,
            _ => true,
        };
        Ok(Submitted {
            job_id,
            duplicate,
            queue,
            provider: spec.provider.as_str(),
            model: spec.model,
        })
    }

    /// Whether the job a repeated idempotency key names is still queued.
    /// A job the caller may not see (another agent's) is never named: its
    /// key answers as a key used for a different request.
    async fn first_submission(
        &self,
        job_id: &JobId,
        caller: &Caller,
        key: String,
    ) -> Result<bool, Status> {
        let record = self.store.get(job_id).await.map_err(|e| to_status(&e))?;
        let submitter = record.as_ref().and_then(|r| r.spec.submitter.as_deref());
        if record.is_some() && caller.access(JobAction::Read, submitter) != JobAccess::Allowed {
            return Err(to_status(&store::Error::IdempotencyConflict(key)));
        }
        Ok(record.is_some_and(|r| r.status == JobStatus::Queued))
    }

    /// Queues the job unless it is a duplicate that was queued already:
    /// one that is still queued may never have been, and the message id
    /// makes queueing it again a no-op when it was.
    async fn queue(&self, submitted: &Submitted, tenant: &str) -> Result<(), Status> {
        if !submitted.queue {
            return Ok(());
        }
        self.enqueue(&submitted.job_id, tenant).await
    }

    /// The record of `job_id` if it belongs to the caller's tenant; the
    /// same `NOT_FOUND` for another tenant's job as for a missing one. An id
    /// that is not a job id, or names another tenant, is refused before
    /// Redis is asked. Whoever submitted it: for `DecideCall`, whose
    /// approvers and operators decide every held call of their tenant.
    async fn tenants_job(&self, job_id: &str, caller: &Caller) -> Result<JobRecord, Status> {
        let id = may_own(job_id, caller)?;
        let record = self.store.get(&id).await.map_err(|e| to_status(&e))?;
        record
            .filter(|record| record.spec.tenant == caller.tenant)
            .ok_or_else(|| not_found(job_id))
    }

    /// The record of `job_id` if it is the caller's tenant's
    /// ([`tenants_job`](Self::tenants_job)) and the caller may `action` it
    /// ([`Caller::access`]): a job it does not see (another agent's) is the
    /// same `NOT_FOUND` as a missing one.
    async fn own_job(
        &self,
        job_id: &str,
        caller: &Caller,
        action: JobAction,
    ) -> Result<JobRecord, Status> {
        let record = self.tenants_job(job_id, caller).await?;
        match caller.access(action, record.spec.submitter.as_deref()) {
            JobAccess::Allowed => Ok(record),
            JobAccess::Hidden => Err(not_found(job_id)),
            JobAccess::Refused => Err(caller.refusal(action)),
        }
    }

    /// Queues a stored job, through a stream leader's election
    /// ([`publish::RETRY_FOR`]).
    async fn enqueue(&self, job_id: &JobId, tenant: &str) -> Result<(), Status> {
        let queued = publish::job(&self.js, job_id, tenant, job_id.as_str());
        queued.await.map_err(|err| {
            warn!(%job_id, error = ?err, "could not queue the job");
            Status::unavailable(format!(
                "job {job_id} is stored but could not be queued; submit again with the same idempotency_key"
            ))
        })
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<v1::JobEvent, Status>> + Send>>;

/// The API as served from the moment the replica listens: every call answers
/// `UNAVAILABLE` until the replica is ready (connected to NATS and Redis,
/// its streams set up), then goes to the [`AgentApi`]. Serving that early
/// lets gRPC health answer `NOT_SERVING` while the replica waits, instead of
/// a port that does not answer at all.
#[derive(Clone, Default)]
pub(crate) struct StartingApi {
    ready: Arc<OnceLock<AgentApi>>,
}

impl StartingApi {
    /// From now on, calls go to `api`. Only the first call has an effect.
    pub(crate) fn serve(&self, api: AgentApi) {
        let _ = self.ready.set(api);
    }

    fn api(&self) -> Result<&AgentApi, Status> {
        self.ready.get().ok_or_else(|| {
            Status::unavailable(
                "the orchestrator is starting (waiting for NATS, Redis and the JetStream objects \
                 `toolfleet-orchestrator setup` creates); retry",
            )
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

    async fn decide_call(
        &self,
        request: Request<v1::DecideCallRequest>,
    ) -> Result<Response<v1::DecideCallResponse>, Status> {
        self.api()?.decide_call(request).await
    }

    async fn list_pending_approvals(
        &self,
        request: Request<v1::ListPendingApprovalsRequest>,
    ) -> Result<Response<v1::ListPendingApprovalsResponse>, Status> {
        self.api()?.list_pending_approvals(request).await
    }

    async fn who_am_i(
        &self,
        request: Request<v1::WhoAmIRequest>,
    ) -> Result<Response<v1::WhoAmIResponse>, Status> {
        self.api()?.who_am_i(request).await
    }
}

#[tonic::async_trait]
impl AgentService for AgentApi {
    async fn submit_job(
        &self,
        request: Request<v1::SubmitJobRequest>,
    ) -> Result<Response<v1::SubmitJobResponse>, Status> {
        let caller = caller_for(&request, Rpc::SubmitJob)?;
        let (trace, mut span) = JobTrace::begin(client_trace(request.metadata()), "submit job");
        span.set(span_attributes::RPC_SYSTEM, "grpc");
        span.set(span_attributes::RPC_METHOD, "SubmitJob");
        span.set(span_attributes::TENANT, caller.tenant.clone());
        let submitted = match self
            .submit(request.into_inner(), &caller, trace.as_ref())
            .await
        {
            Ok(submitted) => submitted,
            Err(status) => {
                span.fail(format!("{:?}", status.code()));
                return Err(status);
            }
        };
        span.set(span_attributes::JOB_ID, submitted.job_id.to_string());
        span.set(span_attributes::PROVIDER, submitted.provider);
        span.set(
            span_attributes::GEN_AI_REQUEST_MODEL,
            submitted.model.clone(),
        );
        span.set(span_attributes::DUPLICATE, submitted.duplicate);
        self.queue(&submitted, &caller.tenant).await?;
        let Submitted {
            job_id, duplicate, ..
        } = submitted;
        if !duplicate {
            let trace_id = trace.as_ref().map(JobTrace::trace_id).unwrap_or_default();
            info!(%job_id, trace_id, "job submitted");
            crate::metrics::job_submitted();
        }
        span.end();
        Ok(Response::new(v1::SubmitJobResponse {
            job_id: job_id.into(),
            duplicate,
        }))
    }

    async fn get_job(
        &self,
        request: Request<v1::GetJobRequest>,
    ) -> Result<Response<v1::Job>, Status> {
        let caller = caller_for(&request, Rpc::ReadJobs)?;
        let job_id = request.into_inner().job_id;
        let record = self.own_job(&job_id, &caller, JobAction::Read).await?;
        let items = self
            .store
            .items(&record.job_id, 0)
            .await
            .map_err(|e| to_status(&e))?;
        let approvals = self
            .store
            .approvals(&record.job_id)
            .await
            .map_err(|e| to_status(&e))?;
        Ok(Response::new(to_job(record, &items, approvals)))
    }

    type WatchJobStream = EventStream;

    async fn watch_job(
        &self,
        request: Request<v1::WatchJobRequest>,
    ) -> Result<Response<Self::WatchJobStream>, Status> {
        let caller = caller_for(&request, Rpc::ReadJobs)?;
        let request = request.into_inner();
        // The id's shape first: nothing else of it reaches a subject.
        let job_id = may_own(&request.job_id, &caller)?;
        // Subscribe before the first read, so no wake-up is missed; the
        // first read also says whose job it is (one round trip for both).
        let mut wakeups = self.live.wake_ups(&job_id).await.map_err(|err| {
            warn!(error = %err, "cannot subscribe to job events");
            Status::unavailable("event notifications are unavailable; retry later")
        })?;
        let start = self
            .store
            .watch_start(&job_id, request.from_offset, WATCH_BATCH)
            .await
            .map_err(|e| to_status(&e))?
            .filter(|start| {
                start.tenant == caller.tenant
                    && caller.access(JobAction::Read, start.submitter.as_deref())
                        == JobAccess::Allowed
            })
            .ok_or_else(|| not_found(&job_id))?;
        let trace_id = start.trace.as_ref().map(JobTrace::trace_id);
        if start.stream {
            wakeups.hear_deltas();
        }
        let follower = Follower::new(job_id, request.from_offset, trace_id, start.stream);
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        // Owned by the client's stream: it ends with the job's final event,
        // as soon as the stream is dropped (the client went away), which
        // closes `tx`, or when this replica starts to drain: then with
        // UNAVAILABLE, so that the client watches again on another replica
        // from the last offset it read, and the drain waits for no watch.
        let (stopping, stopped) = (self.stopping.clone(), tx.clone());
        let watch = Watch {
            store: self.store.clone(),
            live: self.live.clone(),
            follower,
            wakeups,
            tx,
        };
        let following = watch.follow(start.events);
        tokio::spawn(async move {
            if stopping.run_until_cancelled(following).await.is_none() {
                let _ = stopped.try_send(Err(Status::unavailable(
                    "this orchestrator is shutting down; watch again from the offset after the last event received",
                )));
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn decide_call(
        &self,
        request: Request<v1::DecideCallRequest>,
    ) -> Result<Response<v1::DecideCallResponse>, Status> {
        let caller = caller_of(&request);
        let status = self.decide(request.into_inner(), &caller).await?;
        Ok(Response::new(v1::DecideCallResponse {
            status: v1::JobStatus::from(status).into(),
        }))
    }

    async fn list_pending_approvals(
        &self,
        request: Request<v1::ListPendingApprovalsRequest>,
    ) -> Result<Response<v1::ListPendingApprovalsResponse>, Status> {
        let caller = caller_of(&request);
        let page = self
            .pending_approvals(request.into_inner(), &caller)
            .await?;
        Ok(Response::new(page))
    }

    async fn cancel_job(
        &self,
        request: Request<v1::CancelJobRequest>,
    ) -> Result<Response<v1::CancelJobResponse>, Status> {
        let caller = caller_for(&request, Rpc::CancelJob)?;
        let job_id = request.into_inner().job_id;
        let job_id = self
            .own_job(&job_id, &caller, JobAction::Cancel)
            .await?
            .job_id;
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
        let caller = caller_for(&request, Rpc::ReadJobs)?;
        let mut query = ListQuery::parse(request.into_inner())?;
        let page = Page {
            before: query.before.take(),
            window: query.window,
            limit: query.limit,
            scan: query.limit * 10,
        };
        // An agent that sees only its own jobs reads its own index, and its
        // own counts: its pages are as full as an operator's, and it learns
        // nothing of another's jobs (decisions 0049, 0051).
        let sight = caller.sight();
        let index = match &sight {
            Sight::Every => JobIndex::Tenant(&caller.tenant),
            Sight::Submitted(Some(submitter)) => JobIndex::Submitter {
                tenant: &caller.tenant,
                submitter,
            },
            Sight::Submitted(None) => {
                return Ok(Response::new(v1::ListJobsResponse {
                    counts: if query.with_counts {
                        to_counts(&JobCounts::none())
                    } else {
                        Vec::new()
                    },
                    ..Default::default()
                }));
            }
        };
        let keep = |record: &JobRecord| {
            query.keeps(record)
                && caller.access(JobAction::Read, record.spec.submitter.as_deref())
                    == JobAccess::Allowed
        };
        let listed = self.store.list(index, page, keep);
        let (listed, counts) = if query.with_counts {
            let (listed, counts) = tokio::join!(listed, self.store.counts(index));
            (listed, Some(counts.map_err(|e| to_status(&e))?))
        } else {
            (listed.await, None)
        };
        let (records, next) = listed.map_err(|e| to_status(&e))?;
        Ok(Response::new(v1::ListJobsResponse {
            jobs: records
                .into_iter()
                .map(|r| to_job(r, &[], Approvals::default()))
                .collect(),
            next_page_token: next.map(|c| c.to_token()).unwrap_or_default(),
            counts: counts.as_ref().map(to_counts).unwrap_or_default(),
        }))
    }

    async fn list_tools(
        &self,
        request: Request<v1::ListToolsRequest>,
    ) -> Result<Response<v1::ListToolsResponse>, Status> {
        // Only what the tenant may call: another tool's name and schema
        // are none of its business. The fleet's details (pools, queues,
        // workers that cannot run a tool) are the whole fleet's, shared
        // by every tenant: only to those who watch it (decision 0052).
        let caller = caller_for(&request, Rpc::ListTools)?;
        let fleet = caller.roles.see_the_fleet();
        let include_unavailable = fleet && request.get_ref().include_unavailable;
        let listed: Vec<_> = self
            .registry
            .fleet_tools(include_unavailable)
            .into_iter()
            .filter(|listed| caller.may_use(&listed.tool.manifest.name))
            .collect();
        let breakers = self.breakers(&listed).await;
        let tools = listed
            .iter()
            .map(|listed| to_tool(listed, fleet, breakers.get(&listed.tool.manifest.name)))
            .collect();
        Ok(Response::new(v1::ListToolsResponse { tools }))
    }

    async fn who_am_i(
        &self,
        request: Request<v1::WhoAmIRequest>,
    ) -> Result<Response<v1::WhoAmIResponse>, Status> {
        // No role: whoever the authenticator let in may ask who it is.
        let caller = caller_of(&request);
        Ok(Response::new(v1::WhoAmIResponse {
            roles: caller
                .roles
                .names()
                .into_iter()
                .map(str::to_owned)
                .collect(),
            person: caller.person.unwrap_or_default(),
            tenant: caller.tenant,
        }))
    }
}
