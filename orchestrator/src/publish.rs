//! Publishing to JetStream through a stream leader's election: every
//! publish the orchestrator makes (a job queued at submission or by the
//! sweeper, a tool call) waits for the stream's acknowledgement, and what a
//! NATS cluster answers while a stream elects a new leader (about 3 s after
//! a node dies: "no stream found for given subject", no responders, a
//! timeout) is retried here, with backoff, until a bound, instead of
//! failing the caller. A publish refused for another reason (a message
//! larger than the stream takes, a full or sealed stream) is not retried:
//! it would be refused again, and the caller is told at once
//! ([`Unpublished::Refused`]). Each publish that needed retries is counted and its
//! pause measured (`toolfleet_publish_retries_total`,
//! `toolfleet_publish_pause_seconds`), so an operator sees the elections.

use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_nats::{HeaderMap, SubjectError};
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
pub(crate) const RETRY_FOR: Duration = Duration::from_secs(10);

/// What is published, for the metrics' `what` label.
#[derive(Debug, Clone, Copy)]
pub(crate) enum What {
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
/// [`Unpublished::Failed`]: still failing after [`RETRY_FOR`];
/// [`Unpublished::Refused`]: refused for good.
pub(crate) async fn job(
    js: &jetstream::Context,
    job_id: &JobId,
    tenant: &str,
    msg_id: &str,
) -> Result<(), Unpublished> {
    let headers = || {
        let mut headers = HeaderMap::new();
        headers.insert(names::headers::MSG_ID, msg_id);
        if let Some(format) = toolfleet_proto::format::written() {
            headers.insert(names::headers::FORMAT, format);
        }
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
pub(crate) enum Unpublished {
    /// Still unanswered at the bound: an election or an outage outlasted
    /// it (the last error is logged).
    Failed,
    /// Refused for a reason no election explains: trying again would be
    /// refused the same way. What was refused (what was said is logged).
    Refused(Refusal),
    /// The caller stopped first.
    Stopped,
}

/// A publish refused for good (`judge`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The message is larger than the server (`max_payload`) or the
    /// stream (`max_msg_size`) takes.
    TooLarge,
    /// Anything else: a full or sealed stream, a subject no message may be
    /// published to, an answer that is not JetStream's.
    Other,
}

/// Where a failed publish's error came from, as `judge` reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cause {
    /// An error answer of the JetStream API, by its code.
    Api(ErrorCode),
    /// The subject is not one a message may be published to.
    Subject,
    /// An answer that is not JetStream's (not its JSON).
    NotJetStream,
    /// Nothing said beyond the kind of the error (the client's own: no
    /// answer in time, the connection lost, the client closed).
    Client,
}

impl Cause {
    fn of(err: &PublishError) -> Self {
        let Some(source) = std::error::Error::source(err) else {
            return Self::Client;
        };
        if let Some(api) = source.downcast_ref::<jetstream::Error>() {
            Self::Api(api.error_code())
        } else if source.is::<SubjectError>() {
            Self::Subject
        } else if source.is::<serde_json::Error>() {
            Self::NotJetStream
        } else {
            Self::Client
        }
    }
}

/// What a failed publish calls for: `None`, another try, for what an
/// election or an outage answers (no responders while a stream has no
/// leader, "not leader", "temporarily unavailable", no answer in time, a
/// connection lost, acks in flight at the client's bound); the
/// [`Refusal`] for the rest, which would be refused again.
fn judge(kind: PublishErrorKind, cause: Cause) -> Option<Refusal> {
    use PublishErrorKind as Kind;
    match (kind, cause) {
        (Kind::MaxPayloadExceeded, _)
        | (_, Cause::Api(ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM)) => Some(Refusal::TooLarge),
        (_, Cause::Api(ErrorCode::CLUSTER_NOT_AVAILABLE | ErrorCode::CLUSTER_NOT_LEADER)) => None,
        (_, Cause::Api(_) | Cause::Subject | Cause::NotJetStream) => Some(Refusal::Other),
        (Kind::WrongLastMessageId | Kind::WrongLastSequence, Cause::Client) => Some(Refusal::Other),
        (
            Kind::StreamNotFound
            | Kind::TimedOut
            | Kind::BrokenPipe
            | Kind::MaxAckPending
            | Kind::Other,
            Cause::Client,
        ) => None,
    }
}

/// One try: the message sent, and JetStream's acknowledgement.
async fn publish_once(
    js: &jetstream::Context,
    subject: &str,
    headers: HeaderMap,
    payload: bytes::Bytes,
) -> Result<(), PublishError> {
    let ack = js
        .publish_with_headers(subject.to_owned(), headers, payload)
        .await?;
    ack.await.map(drop)
}

/// Publishes `payload` to `subject` with the headers `headers` makes (each
/// try gets its own: a header map is consumed), and waits for JetStream's
/// acknowledgement, retrying what an election or an outage answers
/// (`judge`) until `until`. The message id header makes a retry of a
/// publish that did land a duplicate JetStream drops.
///
/// # Errors
///
/// [`Unpublished`]: still failing at `until`, refused for good, or `stop`
/// cancelled.
pub(crate) async fn acked(
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
        let err = match publish_once(js, subject, headers(), payload.clone()).await {
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
        if let Some(refusal) = judge(err.kind(), Cause::of(&err)) {
            warn!(what = what.label(), error = %err, ?refusal, "publishing refused; not retried");
            if retries > 0 {
                metrics::publish_paused(what.label(), retries, first.elapsed());
            }
            return Err(Unpublished::Refused(refusal));
        }
        let err = err.to_string();
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
            return Err(Unpublished::Failed);
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

#[cfg(test)]
mod tests {
    use async_nats::jetstream::context::PublishErrorKind as Kind;

    use super::*;

    /// What an election or an outage answers is retried; what JetStream
    /// refuses for another reason is not, and a message too large is told
    /// apart.
    #[test]
    fn only_elections_and_outages_are_retried() {
        use Cause::{Api, Client, NotJetStream, Subject};
        let too_large = Some(Refusal::TooLarge);
        let refused = Some(Refusal::Other);
        let cases = [
            // No responders: the stream has no leader (or no stream).
            (Kind::StreamNotFound, Client, None),
            (Kind::TimedOut, Client, None),
            (Kind::BrokenPipe, Client, None),
            (Kind::MaxAckPending, Client, None),
            // The client's own, e.g. closed while reconnecting.
            (Kind::Other, Client, None),
            (Kind::Other, Api(ErrorCode::CLUSTER_NOT_LEADER), None),
            (Kind::Other, Api(ErrorCode::CLUSTER_NOT_AVAILABLE), None),
            (Kind::MaxPayloadExceeded, Client, too_large),
            (
                Kind::Other,
                Api(ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM),
                too_large,
            ),
            // A full stream (discard new), resources, JetStream off.
            (Kind::Other, Api(ErrorCode::STREAM_STORE_FAILED), refused),
            (Kind::Other, Api(ErrorCode::INSUFFICIENT_RESOURCES), refused),
            (
                Kind::Other,
                Api(ErrorCode::JETSTREAM_NOT_ENABLED_FOR_ACCOUNT),
                refused,
            ),
            (Kind::Other, Subject, refused),
            (Kind::Other, NotJetStream, refused),
            (
                Kind::WrongLastSequence,
                Api(ErrorCode::STREAM_WRONG_LAST_SEQUENCE),
                refused,
            ),
            (Kind::WrongLastMessageId, Client, refused),
        ];
        for (kind, cause, expected) in cases {
            assert_eq!(judge(kind, cause), expected, "{kind:?} {cause:?}");
        }
    }

    #[test]
    fn the_cause_is_read_from_the_errors_source() {
        let api: jetstream::Error = serde_json::from_value(serde_json::json!({
            "code": 503, "err_code": 10008, "description": "JetStream system temporarily unavailable"
        }))
        .unwrap();
        let not_json = serde_json::from_str::<serde_json::Value>("<html>").unwrap_err();
        let cases = [
            (
                PublishError::with_source(Kind::Other, api),
                Cause::Api(ErrorCode::CLUSTER_NOT_AVAILABLE),
            ),
            (
                PublishError::with_source(Kind::Other, SubjectError::InvalidFormat),
                Cause::Subject,
            ),
            (
                PublishError::with_source(Kind::Other, not_json),
                Cause::NotJetStream,
            ),
            (PublishError::new(Kind::StreamNotFound), Cause::Client),
            (
                PublishError::with_source(Kind::MaxPayloadExceeded, "over 1 MiB"),
                Cause::Client,
            ),
        ];
        for (err, cause) in cases {
            assert_eq!(Cause::of(&err), cause, "{err}");
        }
    }
}
