//! The sweeper: re-queues unfinished jobs that nobody runs and whose queue
//! message is gone (a NATS store lost, a publish that failed after the job
//! was stored). Without it such a job would wait forever. It also wakes
//! parked jobs (waiting for approval) whose first held call expired, so
//! that a runner answers it `APPROVAL_EXPIRED`; it never looks at other
//! parked jobs, which are in an index of their own (decision 0036).
//!
//! A job is re-queued when it was submitted more than `runner.sweep_after`
//! ago, is neither finished nor leased by a runner. A re-queued job that did
//! still have its message gets two: the second finds it leased or finished
//! and is dropped, so sweeping is always safe. Each job it looks at is
//! counted again as its record says, which repairs a count its last change
//! did not make (decision 0051).

use std::time::Duration;

use async_nats::jetstream;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::job::{JobId, now_ms};
use crate::publish;
use crate::store::{Change, JobStore, Wake};

/// Jobs looked at per sweep.
const BATCH: usize = 100;

/// Sweeps every `interval` until `shutdown`.
pub(crate) async fn run(
    store: JobStore,
    js: jetstream::Context,
    interval: Duration,
    after: Duration,
    shutdown: CancellationToken,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if shutdown.run_until_cancelled(ticker.tick()).await.is_none() {
            return;
        }
        let cutoff = now_ms().saturating_sub(u64::try_from(after.as_millis()).unwrap_or(u64::MAX));
        // Every wait raced with the shutdown: a sweep cut short is done
        // again by the next one, on this replica or another.
        let candidates = shutdown.run_until_cancelled(store.unfinished_before(cutoff, BATCH));
        let candidates = match candidates.await {
            None => return,
            Some(Ok(candidates)) => candidates,
            Some(Err(err)) => {
                debug!(error = %err, "sweep skipped: job store unavailable");
                continue;
            }
        };
        for job_id in candidates {
            match shutdown
                .run_until_cancelled(sweep_one(&store, &js, &job_id))
                .await
            {
                None => return,
                Some(Ok(())) => {}
                Some(Err(err)) => debug!(%job_id, error = %err, "sweep of a job failed; next time"),
            }
        }
        if shutdown
            .run_until_cancelled(wake_parked(&store, &js))
            .await
            .is_none()
        {
            return;
        }
    }
}

/// Queues the parked jobs whose wake time (their first approval expiry)
/// has passed, each marked requeued and moved to the unfinished index
/// first ([`JobStore::wake`]), so that a lost publish is found by the next
/// sweeps. A job queued twice (two replicas sweeping) runs once: the second
/// delivery finds it leased or parked again.
async fn wake_parked(store: &JobStore, js: &jetstream::Context) {
    let now = now_ms();
    let due = match store.parked_due(now, BATCH).await {
        Ok(due) => due,
        Err(err) => {
            return debug!(error = %err, "wake-up of parked jobs skipped: job store unavailable");
        }
    };
    for job_id in due {
        let woken = async {
            if store.wake(&job_id).await? != Wake::Queued {
                return Ok(());
            }
            let Some(job) = store.get(&job_id).await? else {
                return Ok(());
            };
            let msg_id = format!("{job_id}:wake-{now}");
            publish::job(js, &job_id, &job.spec.tenant, &msg_id)
                .await
                .map_err(|err| anyhow::anyhow!("cannot queue the job: {err:?}"))
        };
        if let Err(err) = woken.await {
            debug!(%job_id, error = %err, "wake-up of a parked job failed; next time");
        }
    }
}

/// Counts the job as its record says, then drops it from the sweeper's
/// indexes if it ended or is gone, or re-queues it if no runner holds it.
/// A job whose count a crash (or a failed write) left behind its status is
/// here: it leaves the unfinished index only once its end is counted
/// (decision 0051).
async fn sweep_one(
    store: &JobStore,
    js: &jetstream::Context,
    job_id: &JobId,
) -> anyhow::Result<()> {
    let job = store.get(job_id).await?;
    match &job {
        Some(job) => store.recount(job).await?,
        None => store.count(job_id, None, Change::Gone).await?,
    };
    match job {
        // Expired, or lost with Redis: nothing to run.
        None => store.forget_place(job_id).await,
        Some(job) if job.status.is_final() => store.forget_place(job_id).await,
        Some(_) if store.lease_held(job_id).await? => {}
        Some(job) => {
            warn!(%job_id, "re-queueing an unfinished job that no runner holds");
            let msg_id = format!("{job_id}:sweep-{}", now_ms());
            publish::job(js, job_id, &job.spec.tenant, &msg_id)
                .await
                .map_err(|err| anyhow::anyhow!("cannot queue the job: {err:?}"))?;
        }
    }
    Ok(())
}
