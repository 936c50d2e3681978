//! The floors a run is compared with, measured through the same NATS
//! server: what the bus does with none of toolfleet's work around it.
//!
//! - **raw NATS request/reply**: core NATS only, the bus's own ceiling;
//! - **raw JetStream calls**: what a tool call needs from NATS and nothing
//!   else: a publish to a work-queue stream, kept in its storage and acked
//!   (with a message id, as calls are), a pull by a consumer, a reply on
//!   core NATS, the consumer's ack. No Redis, no ledger, no model loop, no
//!   gRPC: the JetStream part of a call's cost, which no change to toolfleet
//!   can take away.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use futures::StreamExt;
use tokio::sync::{Semaphore, oneshot};
use toolfleet_proto::{ToolCall, names};
use toolfleet_service::queue::{Missing, SharedConsumer, WorkQueue};

use toolfleet_fleet::supervisor::wait_until;

/// The subject the raw request/reply floor's responder answers on.
const RAW_SUBJECT: &str = "toolfleet.bench.raw";

/// The JetStream floor's stream, subject, consumer and reply subject: apart
/// from the fleet's, and removed after the run.
const FLOOR_STREAM: &str = "TOOLFLEET_BENCH_FLOOR";
const FLOOR_SUBJECTS: &str = "toolfleet.bench.floor.>";
const FLOOR_SUBJECT: &str = "toolfleet.bench.floor.call";
/// The subjects of the floor's idle consumers: `<prefix><n>`.
const FLOOR_IDLE_PREFIX: &str = "toolfleet.bench.floor.idle.";
const FLOOR_CONSUMER: &str = "bench-floor";
const FLOOR_REPLIES: &str = "toolfleet.bench.floor-replies";

/// Where the floors reach NATS: the fleet's URL, and its CA file when the
/// fleet runs over TLS.
#[derive(Debug, Clone, Copy)]
pub(super) struct NatsAt<'a> {
    pub(super) url: &'a str,
    pub(super) ca_file: Option<&'a str>,
}

/// Connects to the first server of `nats`: a floor goes through one server,
/// a cluster's first.
async fn connect(nats: NatsAt<'_>) -> anyhow::Result<async_nats::Client> {
    let server = toolfleet_service::config::url_list(nats.url)
        .first()
        .copied()
        .unwrap_or(nats.url)
        .to_owned();
    let mut options = async_nats::ConnectOptions::new();
    if let Some(ca) = nats.ca_file {
        options = options.add_root_certificates(ca.into()).require_tls(true);
    }
    Ok(options.connect(server.as_str()).await?)
}

/// `requests` core NATS request/replies, `concurrency` at a time: the rate
/// and each one's round trip.
pub(super) async fn request_reply(
    nats: NatsAt<'_>,
    requests: usize,
    concurrency: usize,
) -> anyhow::Result<(f64, Vec<Duration>)> {
    let responder = connect(nats).await?;
    let client = connect(nats).await?;
    let mut inbox = responder.subscribe(RAW_SUBJECT).await?;
    responder.flush().await?;
    let echo = tokio::spawn(async move {
        while let Some(message) = inbox.next().await {
            if let Some(reply) = message.reply {
                let _ = responder.publish(reply, message.payload).await;
            }
        }
    });
    // `flush` only sends the subscription; the server may not have it yet
    // when the other connection's first request arrives (then "no
    // responders"), so the floor starts once one request was answered.
    wait_until(
        "the raw floor's responder",
        Duration::from_secs(5),
        || async { client.request(RAW_SUBJECT, "{}".into()).await.is_ok() },
    )
    .await?;
    let window = Arc::new(Semaphore::new(concurrency.max(1)));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(requests);
    for _ in 0..requests {
        let permit = window.clone().acquire_owned().await?;
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let sent = Instant::now();
            let reply = client
                .request(RAW_SUBJECT, r#"{"round":0,"call":0}"#.into())
                .await;
            drop(permit);
            reply.map(|_| sent.elapsed())
        }));
    }
    let mut latencies = Vec::with_capacity(requests);
    for task in tasks {
        latencies.push(task.await??);
    }
    let rate = requests as f64 / started.elapsed().as_secs_f64();
    echo.abort();
    Ok((rate, latencies))
}

/// How long one floor call may take before the floor gives up (a responder
/// that died would otherwise leave it waiting for ever).
const FLOOR_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Calls waiting for their reply, by message id.
type Waiting = Arc<Mutex<HashMap<u64, oneshot::Sender<()>>>>;

/// The shape of a raw JetStream floor.
#[derive(Debug, Clone, Copy)]
pub(super) struct FloorShape {
    /// Calls in all.
    pub(super) calls: usize,
    /// Calls in flight at once.
    pub(super) concurrency: usize,
    /// Connections serving them (as many as the fleet has workers).
    pub(super) responders: usize,
    /// Copies of the floor's stream (as the fleet's streams have).
    pub(super) replicas: usize,
    /// Consumers of other subjects on the floor's stream that nobody pulls
    /// from, as the calls stream has one per tool (`--idle-tools`): an ack
    /// on a work queue costs nats-server a look at every consumer of the
    /// stream, which this puts on the floor too.
    pub(super) idle_consumers: usize,
}

/// Raw JetStream calls as `shape` says: the rate and each call's round trip
/// (publish to reply). Each call carries a payload the size of the bench's
/// own calls.
pub(super) async fn jetstream_calls(
    nats: NatsAt<'_>,
    shape: FloorShape,
) -> anyhow::Result<(f64, Vec<Duration>)> {
    let caller = connect(nats).await?;
    let js = async_nats::jetstream::new(caller.clone());
    // A run that was interrupted may have left it, with calls in it.
    let _ = js.delete_stream(FLOOR_STREAM).await;
    let queue = WorkQueue {
        name: FLOOR_STREAM,
        subjects: FLOOR_SUBJECTS,
        description: "toolfleet bench: the raw JetStream floor's calls",
        max_age: Duration::ZERO,
    };
    let missing = Missing::Create {
        replicas: shape.replicas,
    };
    let stream = queue.open(&js, missing).await?;
    SharedConsumer {
        name: FLOOR_CONSUMER.to_owned(),
        description: "toolfleet bench: the raw JetStream floor's responders".to_owned(),
        filter_subject: FLOOR_SUBJECT.to_owned(),
        ack_wait: FLOOR_CALL_TIMEOUT,
        max_ack_pending: 10_000,
    }
    .open(&stream, missing)
    .await?;
    for n in 0..shape.idle_consumers {
        SharedConsumer {
            name: format!("{FLOOR_CONSUMER}-idle-{n}"),
            description: "toolfleet bench: an idle consumer, as an idle tool's".to_owned(),
            filter_subject: format!("{FLOOR_IDLE_PREFIX}{n}"),
            ack_wait: FLOOR_CALL_TIMEOUT,
            max_ack_pending: 10_000,
        }
        .open(&stream, missing)
        .await?;
    }
    let result = serve_and_call(nats, &caller, &js, shape).await;
    let _ = js.delete_stream(FLOOR_STREAM).await;
    result
}

/// Serves the floor's stream with `shape.responders` connections and makes
/// its calls.
async fn serve_and_call(
    nats: NatsAt<'_>,
    caller: &async_nats::Client,
    js: &async_nats::jetstream::Context,
    shape: FloorShape,
) -> anyhow::Result<(f64, Vec<Duration>)> {
    let mut serving = Vec::with_capacity(shape.responders);
    for _ in 0..shape.responders.max(1) {
        serving.push(respond(nats).await?);
    }
    let waiting: Waiting = Arc::default();
    let mut replies = caller.subscribe(FLOOR_REPLIES).await?;
    caller.flush().await?;
    let routing = {
        let waiting = waiting.clone();
        tokio::spawn(async move {
            while let Some(reply) = replies.next().await {
                let id = std::str::from_utf8(&reply.payload)
                    .ok()
                    .and_then(|id| id.parse::<u64>().ok());
                let sender = id.and_then(|id| {
                    waiting
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .remove(&id)
                });
                if let Some(sender) = sender {
                    let _ = sender.send(());
                }
            }
        })
    };
    let result = call(js, &waiting, shape).await;
    routing.abort();
    for responder in serving {
        responder.abort();
    }
    result
}

/// One responder: a connection of its own, as each worker has (its pulls,
/// the deliveries, its replies and its acks all go over it), that answers
/// each call with its message id and acks it.
async fn respond(nats: NatsAt<'_>) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let client = connect(nats).await?;
    let mut messages = async_nats::jetstream::new(client.clone())
        .get_stream(FLOOR_STREAM)
        .await?
        .get_consumer::<async_nats::jetstream::consumer::pull::Config>(FLOOR_CONSUMER)
        .await
        .map_err(|err| anyhow::anyhow!(err))?
        .messages()
        .await?;
    Ok(tokio::spawn(async move {
        while let Some(Ok(message)) = messages.next().await {
            let id = message
                .headers
                .as_ref()
                .and_then(|h| h.get(names::headers::MSG_ID))
                .map(|id| id.as_str().to_owned());
            if let Some(id) = id {
                let _ = client.publish(FLOOR_REPLIES, id.into()).await;
            }
            let _ = message.ack().await;
        }
    }))
}

/// What each floor call carries: a call the size of the bench's own.
fn floor_payload() -> anyhow::Result<bytes::Bytes> {
    Ok(serde_json::to_vec(&ToolCall {
        job_id: "0123456789abcdef0123456789abcdef".to_owned(),
        call_id: "call_1_0".to_owned(),
        attempt: 1,
        tool: "echo".to_owned(),
        arguments: r#"{"round":0,"call":0}"#.to_owned(),
        deadline_ms: Some(u64::MAX / 2),
        idempotency_key: "0123456789abcdef0123456789abcdef:call_1_0".to_owned(),
        reply_to: Some(FLOOR_REPLIES.to_owned()),
    })?
    .into())
}

/// Makes the floor's calls, `shape.concurrency` at a time, each answered
/// through `waiting`: the rate and each call's round trip.
async fn call(
    js: &async_nats::jetstream::Context,
    waiting: &Waiting,
    shape: FloorShape,
) -> anyhow::Result<(f64, Vec<Duration>)> {
    let payload = floor_payload()?;
    let window = Arc::new(Semaphore::new(shape.concurrency.max(1)));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(shape.calls);
    for id in 0..shape.calls as u64 {
        let permit = window.clone().acquire_owned().await?;
        let (js, payload, waiting) = (js.clone(), payload.clone(), waiting.clone());
        tasks.push(tokio::spawn(async move {
            let sent = Instant::now();
            let (replied, reply) = oneshot::channel();
            waiting
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(id, replied);
            let mut headers = HeaderMap::new();
            headers.insert(names::headers::MSG_ID, id.to_string().as_str());
            let answered = tokio::time::timeout(FLOOR_CALL_TIMEOUT, async {
                js.publish_with_headers(FLOOR_SUBJECT, headers, payload)
                    .await?
                    .await?;
                reply.await?;
                anyhow::Ok(())
            })
            .await;
            drop(permit);
            match answered {
                Ok(Ok(())) => Ok(sent.elapsed()),
                Ok(Err(err)) => Err(err.context(format!("raw JetStream call {id}"))),
                Err(_) => anyhow::bail!("raw JetStream call {id} got no reply in 30s"),
            }
        }));
    }
    let mut latencies = Vec::with_capacity(shape.calls);
    let mut failed = None;
    for task in tasks {
        match task.await? {
            Ok(latency) => latencies.push(latency),
            Err(err) => failed = failed.or(Some(err)),
        }
    }
    let rate = shape.calls as f64 / started.elapsed().as_secs_f64();
    match failed {
        Some(err) => Err(err),
        None => Ok((rate, latencies)),
    }
}
