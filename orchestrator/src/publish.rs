//! Publishing to JetStream through a stream leader's election: every
//! publish the orchestrator makes (a job queued at submission or by the
//! sweeper, a tool call) waits for the stream's acknowledgement, and what a
//! NATS cluster answers while a stream elects a new leader (about 3 s after
//! a node dies: "no stream found for given subject", no responders, a
//! timeout) is retried here, with backoff, until a bound, instead of
//! failing the caller. Each publish that needed retries is counted and its
//! pause measured (`toolfleet_publish_retries_total`,
//! `toolfleet_publish_pause_seconds`), so an operator sees the elections.

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream;
use backon::BackoffBuilder as _;
use backon::ExponentialBuilder;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use toolfleet_proto::names;
use tracing::{debug, info, warn};

use crate::job::JobId;
use crate::metrics;

/// How long a publish whose caller waits for it (a submission, the
/// sweeper) keeps retrying before it fails: a leader election takes about
/// 3 s, and a client's call should not wait much longer than that.
/// docs/configuration.md (`nats.replicas`) and docs/capacity.md state it.
pub const RETRY_FOR: Duration = Duration::from_secs(10);

/// What is published, for the metrics' `what` label.
#[derive(Debug, Clone, Copy)]
pub enum What {
    /// A job, queued at submission or by the sweeper.
    Job,
    /// A tool call.
    Call,
}

impl What {
    fn label(self) -> &'static str {
        match self {
            Self::Job => "job",
            Self::Call => "call",
        }
    }
}

/// Queues `job_id` on the job stream, with `msg_id` as its JetStream
/// message id and `tenant` in its header, through a leader's election
/// (up to [`RETRY_FOR`]): a submission's, or the sweeper's re-queue.
///
/// # Errors
///
/// [`Unpublished::Failed`]: still refused after [`RETRY_FOR`].
pub async fn job(
    js: &jetstream::Context,
    job_id: &JobId,
    tenant: &str,
    msg_id: &str,
) -> Result<(), Unpublished> {
    let headers = || {
        let mut headers = HeaderMap::new();
        headers.insert(names::headers::MSG_ID, msg_id);
        headers.insert(names::headers::TENANT, tenant);
        headers
    };
    let until = Instant::now() + RETRY_FOR;
    let payload = job_id.to_string().into();
    acked(
        js,
        What::Job,
        names::JOB_SUBJECT,
        headers,
        payload,
        until,
        None,
    )
    .await
}

/// Why a publish did not land.
#[derive(Debug)]
pub enum Unpublished {
    /// Still failing at the bound; the last error.
    Failed(String),
    /// The caller stopped first.
    Stopped,
}

/// Publishes `payload` to `subject` with the headers `headers` makes (each
/// try gets its own: a header map is consumed), and waits for JetStream's
/// acknowledgement, retrying until `until`. The message id header makes a
/// retry of a publish that did land a duplicate JetStream drops.
///
/// # Errors
///
/// [`Unpublished`]: still failing at `until`, or `stop` cancelled.
pub async fn acked(
    js: &jetstream::Context,
    what: What,
    subject: &str,
    headers: impl Fn() -> HeaderMap,
    payload: bytes::Bytes,
    until: Instant,
    stop: Option<&CancellationToken>,
) -> Result<(), Unpublished> {
    let mut delays = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(50))
        .with_max_delay(Duration::from_secs(1))
        .with_jitter()
        .without_max_times()
        .build();
    let first = Instant::now();
    let mut retries = 0_u64;
    loop {
        let sent = js
            .publish_with_headers(subject.to_owned(), headers(), payload.clone())
            .await;
        let acked = match sent {
            Ok(ack) => ack.await.map(|_| ()).map_err(|e| e.to_string()),
            Err(err) => Err(err.to_string()),
        };
        let err = match acked {
            Ok(()) => {
                if retries > 0 {
                    metrics::publish_paused(what.label(), retries, first.elapsed());
                    info!(
                        what = what.label(),
                        retries,
                        pause_ms = first.elapsed().as_millis() as u64,
                        "published after retries"
                    );
                }
                return Ok(());
            }
            Err(err) => err,
        };
        // The first failure of a pause is worth a warning; the rest of it
        // (a few seconds of an election) is not.
        if retries == 0 {
            warn!(what = what.label(), error = %err, "publishing failed; retrying");
        } else {
            debug!(what = what.label(), error = %err, retries, "publishing failed; retrying");
        }
        retries += 1;
        let delay = delays.next().unwrap_or(Duration::from_secs(1));
        if Instant::now() + delay > until {
            metrics::publish_paused(what.label(), retries, first.elapsed());
            return Err(Unpublished::Failed(err));
        }
        let stopped = async {
            match stop {
                Some(stop) => stop.cancelled().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = stopped => return Err(Unpublished::Stopped),
            () = tokio::time::sleep(delay) => {}
        }
    }
}
