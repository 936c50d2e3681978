//! JetStream as toolfleet's queues, set up the same way on both sides: a
//! work-queue stream (a message lives until one consumer acks it) and one
//! durable pull consumer shared by every replica that serves it (that is the
//! horizontal scaling). Nothing is ever dropped by JetStream itself: no
//! delivery limit, explicit acks, and a two-minute window in which a
//! re-published `Nats-Msg-Id` is a duplicate.

use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};

/// How long JetStream remembers a message id to drop a re-publish of it.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// JetStream refused a stream or consumer.
#[derive(Debug, thiserror::Error)]
#[error("cannot set up JetStream {what}")]
pub struct QueueError {
    /// The stream or consumer, e.g. `stream TOOLFLEET_JOBS`.
    pub what: String,
    /// What the server said.
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

/// A work-queue stream.
#[derive(Debug, Clone)]
pub struct WorkQueue<'a> {
    /// Stream name (from `toolfleet_proto::names`).
    pub name: &'a str,
    /// The subjects it captures.
    pub subjects: &'a str,
    /// What waits in it, for operators.
    pub description: &'a str,
    /// How long a message may wait; zero for no limit.
    pub max_age: Duration,
}

/// A durable pull consumer that every replica serving the queue shares.
#[derive(Debug, Clone)]
pub struct SharedConsumer<'a> {
    /// Durable name (from `toolfleet_proto::names`).
    pub name: &'a str,
    /// Who consumes, for operators.
    pub description: String,
    /// Only messages on this subject; empty for all of the stream's.
    pub filter_subject: String,
    /// A message not acked (nor kept alive) within it is redelivered.
    pub ack_wait: Duration,
    /// Messages delivered and not yet acked, over all replicas.
    pub max_ack_pending: i64,
}

/// Opens the stream `queue`, creating it if it does not exist.
///
/// # Errors
///
/// [`QueueError`] when JetStream is unavailable or refuses the stream.
pub async fn work_queue(
    js: &jetstream::Context,
    queue: &WorkQueue<'_>,
) -> Result<stream::Stream, QueueError> {
    js.get_or_create_stream(stream::Config {
        name: queue.name.to_owned(),
        description: Some(queue.description.to_owned()),
        subjects: vec![queue.subjects.to_owned()],
        retention: stream::RetentionPolicy::WorkQueue,
        max_age: queue.max_age,
        duplicate_window: DUPLICATE_WINDOW,
        ..Default::default()
    })
    .await
    .map_err(|e| QueueError {
        what: format!("stream {}", queue.name),
        source: Box::new(e),
    })
}

/// Opens the consumer `shared` on `stream`, creating it if need be.
///
/// # Errors
///
/// [`QueueError`] when JetStream is unavailable or refuses the consumer.
pub async fn shared_consumer(
    stream: &stream::Stream,
    shared: SharedConsumer<'_>,
) -> Result<consumer::PullConsumer, QueueError> {
    stream
        .get_or_create_consumer(
            shared.name,
            consumer::pull::Config {
                durable_name: Some(shared.name.to_owned()),
                description: Some(shared.description),
                filter_subject: shared.filter_subject,
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: shared.ack_wait,
                // Unlimited: a message is never dropped by JetStream. The
                // consumers end what cannot be done themselves (a job that
                // ended, a poison call answered MAX_DELIVERIES_EXCEEDED).
                max_deliver: -1,
                max_ack_pending: shared.max_ack_pending,
                ..Default::default()
            },
        )
        .await
        .map_err(|e| QueueError {
            what: format!("consumer {}", shared.name),
            source: Box::new(e),
        })
}
