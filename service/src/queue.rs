//! Every JetStream object of toolfleet, its shape, and who creates it.
//!
//! - The **job queue** (stream `TOOLFLEET_JOBS`, durable consumer
//!   `orchestrators`) and the **call queue** (stream `TOOLFLEET_CALLS`, one
//!   durable consumer `tool_<name>` per tool) are work queues: a message
//!   lives until one consumer acks it, and every replica serving a queue
//!   shares its consumer (that is the horizontal scaling). Nothing is ever
//!   dropped by JetStream itself: no delivery limit, explicit acks, and a
//!   two-minute window in which a re-published `Nats-Msg-Id` is a duplicate.
//! - The **registry** is a KV bucket where workers announce their tools.
//!
//! Who creates them: `toolfleet-orchestrator setup` ([`set_up`]) creates or
//! updates all of them, for the tools it is told of, with a NATS user that
//! may; that is the one privileged step of a deployment (decision 0012).
//! The services only open them. With `nats.create_missing` (the default, for
//! development) a service creates what it finds missing; without it, it
//! waits for the setup step, so its NATS user needs no right to create
//! anything, and a pool's consumer exists before its first worker starts.
//!
//! On a NATS cluster each stream and the bucket keep `nats.replicas` copies
//! (consumers follow their stream), so that losing a server loses no call.

use std::time::Duration;

use async_nats::jetstream::{self, consumer, kv, stream};
use toolfleet_proto::names;

use crate::config::NatsOptions;

/// How long JetStream remembers a message id to drop a re-publish of it.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// Default AckWait of a tool's consumer (`runtime.ack_wait`,
/// `setup.call_ack_wait`).
pub const DEFAULT_CALL_ACK_WAIT: Duration = Duration::from_secs(30);

/// Default time a call may wait for a worker (`runtime.call_max_age`,
/// `setup.call_max_age`).
pub const DEFAULT_CALL_MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// A JetStream object could not be opened or set up.
#[derive(Debug, thiserror::Error)]
#[error("cannot {verb} JetStream {what}{hint}")]
pub struct QueueError {
    verb: &'static str,
    /// The object, e.g. `stream TOOLFLEET_JOBS`.
    pub what: String,
    hint: &'static str,
    /// What the server said.
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
    /// Whether asking again soon may succeed (see [`Failure`]).
    passing: bool,
}

impl QueueError {
    /// The setup step could not create or update `what`.
    fn refused<E>(what: &str, source: E) -> Self
    where
        E: std::error::Error + Classified + Send + Sync + 'static,
    {
        let failure = source.failure();
        Self {
            verb: "set up",
            what: what.to_owned(),
            hint: match failure {
                Failure::Unanswered => {
                    " (no answer: is JetStream up, and may this NATS user create it?)"
                }
                Failure::Passing | Failure::Lasting => "",
            },
            passing: failure != Failure::Lasting,
            source: Box::new(source),
        }
    }

    /// Whether a setup step's failure may pass: the request got no answer,
    /// or JetStream or its cluster was not ready. Anything else (a setting
    /// that cannot change in place, a name refused) comes back the same.
    pub fn is_passing(&self) -> bool {
        self.passing
    }
}

/// What a JetStream failure says of the next try.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// No answer in time, or no server to answer for JetStream. It may
    /// pass; it may also be a right the NATS user lacks, which the server
    /// answers with silence (and a line in its own log).
    Unanswered,
    /// JetStream's own "not now": unavailable (503), or a cluster without a
    /// leader, a quorum or enough live servers for the copies asked for, as
    /// while one of its servers restarts.
    Passing,
    /// A refusal that comes back the same.
    Lasting,
}

/// A JetStream error that says which [`Failure`] it is.
trait Classified {
    fn failure(&self) -> Failure;
}

impl Classified for jetstream::context::CreateStreamError {
    fn failure(&self) -> Failure {
        use jetstream::context::CreateStreamErrorKind as Kind;
        match self.kind() {
            Kind::TimedOut | Kind::JetStreamUnavailable => Failure::Unanswered,
            Kind::JetStream(err) => jetstream_failure(&err),
            _ => Failure::Lasting,
        }
    }
}

impl Classified for jetstream::stream::ConsumerError {
    fn failure(&self) -> Failure {
        use jetstream::stream::ConsumerErrorKind as Kind;
        match self.kind() {
            // `Request`: no server answered, or the connection was lost.
            Kind::TimedOut | Kind::Request => Failure::Unanswered,
            Kind::JetStream(err) => jetstream_failure(&err),
            _ => Failure::Lasting,
        }
    }
}

fn jetstream_failure(err: &jetstream::Error) -> Failure {
    use jetstream::ErrorCode;
    let not_ready = [
        ErrorCode::CLUSTER_NO_PEERS,
        ErrorCode::CLUSTER_NOT_ACTIVE,
        ErrorCode::CLUSTER_NOT_ASSIGNED,
        ErrorCode::CLUSTER_NOT_LEADER,
        ErrorCode::CLUSTER_INCOMPLETE,
    ];
    if err.code() == 503 || not_ready.contains(&err.error_code()) {
        Failure::Passing
    } else {
        Failure::Lasting
    }
}

/// Whether a service may create the objects it opens (`nats.create_missing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missing {
    /// Create an object that does not exist yet (development, one user),
    /// with this many copies of its stream (`nats.replicas`).
    Create {
        /// Copies JetStream keeps, on as many servers of its cluster.
        replicas: usize,
    },
    /// Only open it; a missing one is an error that names the setup step.
    Wait,
}

impl Missing {
    /// `nats.create_missing` and `nats.replicas` as a [`Missing`].
    pub fn from_options(options: &NatsOptions) -> Self {
        if options.create_missing {
            Self::Create {
                replicas: options.replicas,
            }
        } else {
            Self::Wait
        }
    }

    fn error(
        self,
        what: String,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> QueueError {
        QueueError {
            verb: "open",
            what,
            hint: match self {
                Self::Create { replicas: 1 } => "",
                Self::Create { .. } => {
                    " (nats.replicas above 1 needs a NATS cluster of at least as many servers)"
                }
                Self::Wait => {
                    " (nats.create_missing is off: `toolfleet-orchestrator setup` creates it)"
                }
            },
            source: source.into(),
            // The services wait for what they open whatever the failure.
            passing: false,
        }
    }
}

/// A work-queue stream.
#[derive(Debug, Clone)]
pub struct WorkQueue {
    /// Stream name (from `toolfleet_proto::names`).
    pub name: &'static str,
    /// The subjects it captures.
    pub subjects: &'static str,
    /// What waits in it, for operators.
    pub description: &'static str,
    /// How long a message may wait; zero for no limit.
    pub max_age: Duration,
}

impl WorkQueue {
    /// The stream of job ids waiting for an orchestrator.
    pub fn jobs() -> Self {
        Self {
            name: names::JOB_STREAM,
            subjects: names::JOB_SUBJECT,
            description: "toolfleet: jobs waiting for an orchestrator",
            max_age: Duration::ZERO,
        }
    }

    /// The stream of tool calls waiting for a worker, each kept `max_age`.
    pub fn calls(max_age: Duration) -> Self {
        Self {
            name: names::CALL_STREAM,
            subjects: names::CALL_SUBJECTS,
            description: "toolfleet: tool calls waiting for a worker",
            max_age,
        }
    }

    fn config(&self, replicas: usize) -> stream::Config {
        stream::Config {
            name: self.name.to_owned(),
            num_replicas: replicas,
            description: Some(self.description.to_owned()),
            subjects: vec![self.subjects.to_owned()],
            retention: stream::RetentionPolicy::WorkQueue,
            max_age: self.max_age,
            duplicate_window: DUPLICATE_WINDOW,
            ..Default::default()
        }
    }

    /// Opens the stream; with [`Missing::Create`], creates it if need be.
    ///
    /// # Errors
    ///
    /// [`QueueError`] when JetStream is unavailable, refuses, or (with
    /// [`Missing::Wait`]) has no such stream.
    pub async fn open(
        &self,
        js: &jetstream::Context,
        missing: Missing,
    ) -> Result<stream::Stream, QueueError> {
        let what = || format!("stream {}", self.name);
        match missing {
            Missing::Create { replicas } => {
                let stream = js
                    .get_or_create_stream(self.config(replicas))
                    .await
                    .map_err(|e| missing.error(what(), e))?;
                let kept = stream.cached_info().config.num_replicas;
                if kept != replicas {
                    // An existing stream keeps its settings: only the
                    // setup step changes them.
                    tracing::warn!(
                        stream = self.name,
                        replicas = kept,
                        configured = replicas,
                        "the stream keeps {kept} copies, not nats.replicas: \
                         `toolfleet-orchestrator setup` scales it"
                    );
                }
                Ok(stream)
            }
            Missing::Wait => js
                .get_stream(self.name)
                .await
                .map_err(|e| missing.error(what(), e)),
        }
    }
}

/// A durable pull consumer that every replica serving a queue shares.
#[derive(Debug, Clone)]
pub struct SharedConsumer {
    /// Durable name (from `toolfleet_proto::names`).
    pub name: String,
    /// Who consumes, for operators.
    pub description: String,
    /// Only messages on this subject; empty for all of the stream's.
    pub filter_subject: String,
    /// A message not acked (nor kept alive) within it is redelivered.
    pub ack_wait: Duration,
    /// Messages delivered and not yet acked, over all replicas.
    pub max_ack_pending: i64,
}

impl SharedConsumer {
    /// The consumer every orchestrator replica pulls job ids from.
    pub fn orchestrators(ack_wait: Duration) -> Self {
        Self {
            name: names::JOB_CONSUMER.to_owned(),
            description: "toolfleet: orchestrator replicas".to_owned(),
            filter_subject: String::new(),
            ack_wait,
            max_ack_pending: 100_000,
        }
    }

    /// The consumer every worker serving `tool` pulls its calls from.
    pub fn tool(tool: &str, ack_wait: Duration) -> Self {
        Self {
            name: names::call_consumer(tool),
            description: format!("toolfleet: workers serving {tool}"),
            filter_subject: names::call_subject(tool),
            ack_wait,
            max_ack_pending: 10_000,
        }
    }

    fn config(&self) -> consumer::pull::Config {
        consumer::pull::Config {
            durable_name: Some(self.name.clone()),
            description: Some(self.description.clone()),
            filter_subject: self.filter_subject.clone(),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: self.ack_wait,
            // Unlimited: a message is never dropped by JetStream. The
            // consumers end what cannot be done themselves (a job that
            // ended, a poison call answered MAX_DELIVERIES_EXCEEDED).
            max_deliver: -1,
            max_ack_pending: self.max_ack_pending,
            ..Default::default()
        }
    }

    /// Opens the consumer on `stream`; with [`Missing::Create`], creates it
    /// if need be. An existing consumer keeps its own settings: read its
    /// AckWait from [`consumer::PullConsumer::cached_info`].
    ///
    /// # Errors
    ///
    /// [`QueueError`] when JetStream is unavailable, refuses, or (with
    /// [`Missing::Wait`]) has no such consumer.
    pub async fn open(
        &self,
        stream: &stream::Stream,
        missing: Missing,
    ) -> Result<consumer::PullConsumer, QueueError> {
        let what = || format!("consumer {}", self.name);
        match missing {
            Missing::Create { .. } => stream
                .get_or_create_consumer(&self.name, self.config())
                .await
                .map_err(|e| missing.error(what(), e)),
            Missing::Wait => stream
                .get_consumer(&self.name)
                .await
                .map_err(|e| missing.error(what(), e)),
        }
    }

    /// Opens the consumer on `queue`'s stream, as [`open`](Self::open)
    /// does, but with [`Missing::Wait`] it asks only for the consumer's
    /// state, never the stream's: a worker pool's NATS account reaches its
    /// own tools' consumers and nothing else of the stream (the stream's
    /// state can list every subject in it, so every tool).
    ///
    /// # Errors
    ///
    /// [`QueueError`] when JetStream is unavailable, refuses, or (with
    /// [`Missing::Wait`]) has no such consumer.
    pub async fn open_in(
        &self,
        js: &jetstream::Context,
        queue: &WorkQueue,
        missing: Missing,
    ) -> Result<consumer::PullConsumer, QueueError> {
        match missing {
            Missing::Create { .. } => self.open(&queue.open(js, missing).await?, missing).await,
            Missing::Wait => js
                .get_consumer_from_stream(&self.name, queue.name)
                .await
                .map_err(|e| missing.error(format!("consumer {}", self.name), e)),
        }
    }
}

/// The stream behind the registry bucket, whose entries live `ttl` without
/// a refresh: what `create_key_value` would make of a bucket with one value
/// per key, except that a message may not roll the stream up. A rollup
/// header (`Nats-Rollup: all`) on any worker's own key would otherwise
/// erase every pool's announcements; the stream refuses such a message. A
/// worker withdraws its announcement with a delete marker, never a purge
/// (which is a rollup of its key).
fn registry_config(ttl: Duration, replicas: usize) -> stream::Config {
    stream::Config {
        name: names::REGISTRY_STREAM.to_owned(),
        description: Some("toolfleet: live tool announcements of workers".to_owned()),
        subjects: vec![format!("{}>", names::REGISTRY_KEY_PREFIX)],
        max_messages_per_subject: 1,
        max_age: ttl,
        discard: stream::DiscardPolicy::New,
        allow_rollup: false,
        deny_delete: true,
        allow_direct: true,
        num_replicas: replicas.max(1),
        ..Default::default()
    }
}

/// Opens the registry bucket (workers announce their tools there); with
/// [`Missing::Create`], creates it with `ttl` as the entries' max age if it
/// does not exist yet.
///
/// # Errors
///
/// [`QueueError`] when JetStream is unavailable, refuses, or (with
/// [`Missing::Wait`]) has no such bucket.
pub async fn registry(
    js: &jetstream::Context,
    ttl: Duration,
    missing: Missing,
) -> Result<kv::Store, QueueError> {
    let what = || format!("bucket {}", names::REGISTRY_BUCKET);
    match (js.get_key_value(names::REGISTRY_BUCKET).await, missing) {
        (Ok(store), _) => Ok(store),
        (Err(err), Missing::Wait) => Err(missing.error(what(), err)),
        (Err(_), Missing::Create { replicas }) => {
            js.get_or_create_stream(registry_config(ttl, replicas))
                .await
                .map_err(|e| missing.error(what(), e))?;
            js.get_key_value(names::REGISTRY_BUCKET)
                .await
                .map_err(|e| missing.error(what(), e))
        }
    }
}

/// What `toolfleet-orchestrator setup` creates: the settings of every
/// object, and the tools whose consumers must exist before any worker.
#[derive(Debug, Clone)]
pub struct Layout {
    /// AckWait of the orchestrators' job consumer (`runner.job_ack_wait`).
    pub job_ack_wait: Duration,
    /// How long a call may wait for a worker (`setup.call_max_age`).
    pub call_max_age: Duration,
    /// AckWait of every tool's consumer (`setup.call_ack_wait`).
    pub call_ack_wait: Duration,
    /// Max age of a registry entry (`registry.ttl`).
    pub registry_ttl: Duration,
    /// The tools whose consumers to create (`setup.tools`).
    pub tools: Vec<String>,
    /// Copies of each stream and of the bucket (`nats.replicas`); an
    /// existing stream is scaled to it in place.
    pub replicas: usize,
}

/// Creates every object of `layout`, or updates it to `layout`'s settings
/// where it exists: the one privileged step. Returns what it set up, in
/// order, for the operator (`stream TOOLFLEET_JOBS`, ...).
///
/// # Errors
///
/// [`QueueError`] naming the first object JetStream refused (the caller's
/// NATS user may lack the right, or a setting cannot change in place).
pub async fn set_up(js: &jetstream::Context, layout: &Layout) -> Result<Vec<String>, QueueError> {
    let tool_consumers = layout
        .tools
        .iter()
        .map(|tool| SharedConsumer::tool(tool, layout.call_ack_wait));
    let queues = [
        (
            WorkQueue::jobs(),
            vec![SharedConsumer::orchestrators(layout.job_ack_wait)],
        ),
        (
            WorkQueue::calls(layout.call_max_age),
            tool_consumers.collect(),
        ),
    ];
    // The bucket first: a worker that finds its consumer can announce at
    // once (it has no right to see whether the bucket exists).
    let what = format!("bucket {}", names::REGISTRY_BUCKET);
    js.create_or_update_stream(registry_config(layout.registry_ttl, layout.replicas))
        .await
        .map_err(|e| QueueError::refused(&what, e))?;
    let mut done = vec![what];
    for (queue, consumers) in queues {
        let what = format!("stream {}", queue.name);
        js.create_or_update_stream(queue.config(layout.replicas))
            .await
            .map_err(|e| QueueError::refused(&what, e))?;
        done.push(what);
        for consumer in consumers {
            let what = format!("consumer {}", consumer.name);
            js.create_consumer_on_stream(consumer.config(), queue.name)
                .await
                .map_err(|e| QueueError::refused(&what, e))?;
            done.push(what);
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use jetstream::context::{CreateStreamError, CreateStreamErrorKind};
    use jetstream::stream::{ConsumerError, ConsumerErrorKind};

    /// What JetStream answers, as it sends it.
    fn answer(code: u16, err_code: u64) -> jetstream::Error {
        serde_json::from_value(serde_json::json!({
            "code": code,
            "err_code": err_code,
            "description": "as the server words it",
        }))
        .expect("a JetStream error")
    }

    #[test]
    fn setup_tries_again_only_what_may_pass() {
        let stream = |kind| QueueError::refused("stream S", CreateStreamError::new(kind));
        let consumer = |kind| QueueError::refused("consumer C", ConsumerError::new(kind));
        let cluster_not_available = answer(503, 10008);
        let no_peers_for_the_copies = answer(400, 10005);
        let name_in_use_with_other_subjects = answer(400, 10065);
        let cannot_change_retention = answer(500, 10052);
        for (error, passing) in [
            (stream(CreateStreamErrorKind::TimedOut), true),
            (stream(CreateStreamErrorKind::JetStreamUnavailable), true),
            (
                stream(CreateStreamErrorKind::JetStream(
                    cluster_not_available.clone(),
                )),
                true,
            ),
            (
                stream(CreateStreamErrorKind::JetStream(no_peers_for_the_copies)),
                true,
            ),
            (
                stream(CreateStreamErrorKind::JetStream(
                    name_in_use_with_other_subjects,
                )),
                false,
            ),
            (stream(CreateStreamErrorKind::InvalidStreamName), false),
            (consumer(ConsumerErrorKind::TimedOut), true),
            (consumer(ConsumerErrorKind::Request), true),
            (
                consumer(ConsumerErrorKind::JetStream(cluster_not_available)),
                true,
            ),
            (
                consumer(ConsumerErrorKind::JetStream(cannot_change_retention)),
                false,
            ),
            (consumer(ConsumerErrorKind::InvalidName), false),
        ] {
            assert_eq!(error.is_passing(), passing, "{error}: {}", error.source);
        }
        // Silence may be a right the user lacks: the error says so.
        let unanswered = stream(CreateStreamErrorKind::TimedOut).to_string();
        assert!(
            unanswered.contains("may this NATS user create it"),
            "{unanswered}"
        );
        let refused = stream(CreateStreamErrorKind::InvalidStreamName).to_string();
        assert_eq!(refused, "cannot set up JetStream stream S");
    }
}
