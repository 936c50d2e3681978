//! The runner: takes jobs from the JetStream work queue (a durable pull
//! consumer shared by every replica) and drives each through the model loop.
//!
//! While a job runs, its message is kept alive (`in_progress`) and its fenced
//! lease renewed. On shutdown the runner stops pulling, lets running jobs go on
//! for `drain_timeout`, then hands the rest back: lease released, message
//! nak'ed, so another replica resumes them from Redis at once.

mod job;
pub(crate) mod step;
pub(crate) mod sweep;

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind, consumer};
use serde::{Deserialize, Serialize};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use toolfleet_proto::names;
use toolfleet_service::connect::patiently;
use toolfleet_service::drain;
use toolfleet_service::pull::pull;
use toolfleet_service::queue::{Missing, QueueError, SharedConsumer, WorkQueue};
use tracing::{debug, error, info, warn};

use crate::dispatch::Dispatcher;
use crate::job::JobId;
use crate::live::Live;
use crate::model::Providers;
use crate::store::{Acquired, JobStore};
use job::{JobRun, Stopped};
use step::{Delivery, ack_for};

/// How the runner takes and runs jobs.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunnerOptions {
    /// Jobs this replica runs at once. Default: 64.
    pub max_jobs: NonZeroUsize,
    /// Lease of a running job in Redis, renewed while it runs; a dead
    /// replica's jobs can be taken over once it expires. Default: 15s.
    #[serde(with = "toolfleet_service::config::duration")]
    pub lease_ttl: Duration,
    /// AckWait of the job consumer: a job whose replica died is redelivered
    /// after it. Default: 30s.
    #[serde(with = "toolfleet_service::config::duration")]
    pub job_ack_wait: Duration,
    /// How often a running job checks whether it was cancelled. Default: 250ms.
    #[serde(with = "toolfleet_service::config::duration")]
    pub cancel_poll_interval: Duration,
    /// On shutdown, how long running jobs may go on before they are handed
    /// back. Default: 20s.
    #[serde(with = "toolfleet_service::config::duration")]
    pub drain_timeout: Duration,
    /// How often unfinished jobs that no runner holds are looked for.
    /// Default: 30s.
    #[serde(with = "toolfleet_service::config::duration")]
    pub sweep_interval: Duration,
    /// How old an unfinished, unleased job must be before the sweeper
    /// re-queues it (its queue message is presumed lost). Default: 5m.
    #[serde(with = "toolfleet_service::config::duration")]
    pub sweep_after: Duration,
}

impl Default for RunnerOptions {
    fn default() -> Self {
        Self {
            max_jobs: NonZeroUsize::new(64).expect("64 is not zero"),
            lease_ttl: Duration::from_secs(15),
            job_ack_wait: Duration::from_secs(30),
            cancel_poll_interval: Duration::from_millis(250),
            drain_timeout: Duration::from_secs(20),
            sweep_interval: Duration::from_secs(30),
            sweep_after: Duration::from_secs(300),
        }
    }
}

/// Runs jobs.
pub(crate) struct Runner {
    pub(crate) js: jetstream::Context,
    pub(crate) store: JobStore,
    /// Where a streamed turn's deltas go.
    pub(crate) live: Live,
    pub(crate) dispatcher: Dispatcher,
    pub(crate) providers: Arc<Providers>,
    pub(crate) options: RunnerOptions,
    /// This replica's identity in leases.
    pub(crate) owner: String,
    /// Whether the job queue may be created here (`nats.create_missing`).
    pub(crate) missing: Missing,
}

impl Runner {
    /// Pulls and runs jobs until `shutdown`, then drains: running jobs go on
    /// for `drain_timeout`, the rest are handed back. Waits for JetStream
    /// first if it is unavailable.
    pub(crate) async fn run(self, shutdown: CancellationToken) {
        // Waited for while JetStream is unavailable; a shutdown ends the wait.
        let consumer = tokio::select! {
            consumer = patiently("the job consumer", || self.job_consumer()) => consumer,
            () = shutdown.cancelled() => return,
        };
        let slots = Arc::new(Semaphore::new(self.options.max_jobs.get()));
        let abandon = CancellationToken::new();
        let jobs = TaskTracker::new();
        let this = Arc::new(self);
        info!(owner = %this.owner, max_jobs = this.options.max_jobs.get(), "runner ready");
        let intake = async {
            while let Some(permits) = free_slots(&slots, &shutdown).await {
                this.pull_jobs(&consumer, permits, &jobs, &abandon, &shutdown)
                    .await;
            }
        };
        let ((), deadline) = tokio::join!(
            intake,
            drain::deadline(&shutdown, this.options.drain_timeout)
        );
        this.drain(jobs, abandon, deadline).await;
    }

    /// One pull request for as many jobs as `permits`, each run with one;
    /// a job that comes after the shutdown goes back to the queue.
    async fn pull_jobs(
        self: &Arc<Self>,
        consumer: &consumer::PullConsumer,
        mut permits: Vec<OwnedSemaphorePermit>,
        jobs: &TaskTracker,
        abandon: &CancellationToken,
        shutdown: &CancellationToken,
    ) {
        let mut pulled = match pull(consumer, permits.len(), shutdown).await {
            Ok(pulled) => pulled,
            Err(err) => {
                warn!(error = %err, "pulling jobs failed; retrying");
                drop(permits);
                let pause = tokio::time::sleep(Duration::from_millis(500));
                shutdown.run_until_cancelled(pause).await;
                return;
            }
        };
        while let Some(message) = pulled.next().await {
            // A message the batch delivers after shutdown (or past the
            // slots it asked for) goes straight back to the queue.
            let permit = permits.pop().filter(|_| !pulled.stopped());
            let Some(permit) = permit else {
                let _ = message.ack_with(AckKind::Nak(None)).await;
                continue;
            };
            let (this, abandon) = (self.clone(), abandon.clone());
            jobs.spawn(async move {
                this.handle(message, abandon).await;
                drop(permit);
            });
        }
    }

    /// The durable consumer that every replica pulls jobs from.
    async fn job_consumer(&self) -> Result<consumer::PullConsumer, QueueError> {
        let stream = WorkQueue::jobs().open(&self.js, self.missing).await?;
        SharedConsumer::orchestrators(self.options.job_ack_wait)
            .open(&stream, self.missing)
            .await
    }

    /// Lets running jobs go on until `deadline`, then hands the rest back
    /// within [`drain::HAND_BACK`].
    async fn drain(&self, jobs: TaskTracker, abandon: CancellationToken, deadline: Instant) {
        info!(running = jobs.len(), "draining jobs");
        jobs.close();
        if tokio::time::timeout_at(deadline, jobs.wait())
            .await
            .is_err()
        {
            warn!(
                handed_back = jobs.len(),
                "drain timeout; handing the remaining jobs back"
            );
            abandon.cancel();
            let what =
                "handing the jobs back (those not handed back resume when their lease expires)";
            drain::bounded(what, drain::HAND_BACK, jobs.wait()).await;
        }
    }

    /// A job whose state vanished: record it as failed, for its tenant (the
    /// queue message's header), so that its owner sees why.
    async fn lost(&self, job_id: &JobId, message: &jetstream::Message) -> Delivery {
        tracing::error!(
            %job_id,
            "job state lost from Redis; failing the job with JOB_STATE_LOST"
        );
        let tenant = message
            .headers
            .as_ref()
            .and_then(|h| h.get(names::headers::TENANT))
            .map(|value| value.as_str())
            .filter(|tenant| crate::auth::is_valid_tenant(tenant))
            .unwrap_or(crate::auth::DEFAULT_TENANT);
        match self.store.record_lost(job_id, tenant).await {
            Ok(()) => Delivery::Done,
            Err(err) => {
                warn!(%job_id, error = %err, "cannot record the lost job; retrying later");
                Delivery::RetryLater
            }
        }
    }

    async fn handle(&self, message: jetstream::Message, abandon: CancellationToken) {
        let payload = String::from_utf8_lossy(&message.payload);
        let job_id = JobId::parse(&payload);
        let marker = message
            .headers
            .as_ref()
            .and_then(|headers| headers.get(names::headers::FORMAT))
            .map(|value| value.as_str());
        let readable = toolfleet_proto::format::read("a job's queue message", marker);
        let delivery = match &job_id {
            Some(job_id) if let Err(unreadable) = readable => {
                error!(%job_id, error = %unreadable, "a job this orchestrator cannot read is left for a newer one");
                Delivery::Newer
            }
            Some(job_id) => self.take_and_run(job_id, &message, abandon).await,
            None => {
                // Not one this service queued: nothing to run, and its bytes
                // go into no key and, beyond an excerpt, into no log line.
                warn!(
                    job_id = toolfleet_proto::envelope::excerpt(&payload, 64),
                    "dropping a queue message that is not a job id"
                );
                crate::metrics::job_message_rejected();
                Delivery::Rejected
            }
        };
        if let Some(ack) = ack_for(delivery, self.options.lease_ttl)
            && let Err(err) = message.ack_with(ack).await
        {
            let job_id = job_id.as_ref().map_or("(not a job id)", JobId::as_str);
            warn!(job_id, error = %err, "job ack failed; the job is redelivered and found finished");
        }
    }

    /// Takes the job's lease and runs it; says how the delivery went.
    async fn take_and_run(
        &self,
        job_id: &JobId,
        message: &jetstream::Message,
        abandon: CancellationToken,
    ) -> Delivery {
        // The lease, the run's start and what it starts from, in one round
        // trip.
        let taken_at = std::time::SystemTime::now();
        let taken = self
            .store
            .acquire_and_load(job_id, &self.owner, self.options.lease_ttl)
            .await;
        let (lease, start) = match taken {
            Ok((Acquired::Lease(lease), start)) => (lease, start),
            Ok((Acquired::Finished, _)) => {
                debug!(%job_id, "job already finished");
                return Delivery::Done;
            }
            Ok((Acquired::Missing, _)) => return self.lost(job_id, message).await,
            Ok((Acquired::Unreadable(unreadable), _)) => {
                error!(%job_id, error = %unreadable, "a job this orchestrator cannot read is left for a newer one");
                return Delivery::Newer;
            }
            Ok((Acquired::Held, _)) => {
                debug!(%job_id, "job is held by another runner");
                return Delivery::HeldElsewhere;
            }
            Err(err) => {
                warn!(%job_id, error = %err, "cannot take the job; retrying later");
                return Delivery::RetryLater;
            }
        };
        let run = JobRun {
            runner: self,
            lease: lease.clone(),
            message,
            created_at_ms: Default::default(),
            taken_at,
            replies: tokio::sync::OnceCell::new(),
        };
        match run.drive(abandon, start).await {
            // A parked job's message is done: a decision queues it again.
            Ok(()) | Err(Stopped::Parked) => Delivery::Done,
            Err(Stopped::HandedBack) => {
                if let Err(err) = self.store.release(&lease).await {
                    warn!(%job_id, error = %err, "could not release the lease; the job resumes when it expires");
                }
                Delivery::HandedBack
            }
            // Unless the lease vanished with the whole job: Redis lost it.
            Err(Stopped::LeaseLost) => match self.store.get(job_id).await {
                Ok(None) => self.lost(job_id, message).await,
                _ => Delivery::Stale,
            },
            Err(Stopped::Store(err)) => {
                let _ = self.store.release(&lease).await;
                if let crate::store::Error::Unreadable { .. } = err {
                    error!(%job_id, error = %err, "a job this orchestrator cannot read is left for a newer one");
                    return Delivery::Newer;
                }
                warn!(%job_id, error = %err, "job store failed; the job resumes later");
                Delivery::RetryLater
            }
        }
    }
}

/// Waits for at least one free job slot and takes up to 16 at once (one pull
/// request's worth); `None` once `shutdown` is cancelled.
async fn free_slots(
    slots: &Arc<Semaphore>,
    shutdown: &CancellationToken,
) -> Option<Vec<OwnedSemaphorePermit>> {
    let first = tokio::select! {
        biased;
        () = shutdown.cancelled() => return None,
        permit = slots.clone().acquire_owned() => permit.ok()?,
    };
    let mut permits = vec![first];
    while permits.len() < 16 {
        match slots.clone().try_acquire_owned() {
            Ok(permit) => permits.push(permit),
            Err(_) => break,
        }
    }
    Some(permits)
}
