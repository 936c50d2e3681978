//! The pull loop of one tool: fetch as many calls as there are free execution
//! slots, hand each to the executor, repeat until shutdown.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::AckKind;
use async_nats::jetstream::consumer::PullConsumer;
use backon::{BackoffBuilder, ExponentialBuilder};
use futures::StreamExt;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, warn};

use super::execute::Executor;

/// How long one pull request waits for calls on an idle consumer. Short, so
/// that shutdown never waits long for an open request.
const PULL_EXPIRES: Duration = Duration::from_secs(2);

/// Delays between failed pulls (NATS down or restarting): quick at first,
/// capped so a recovered server is used within seconds.
fn pull_backoff() -> impl Iterator<Item = Duration> {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(50))
        .with_max_delay(Duration::from_secs(2))
        .with_jitter()
        .without_max_times()
        .build()
}

/// One tool's intake.
pub(crate) struct PullLoop {
    pub(crate) tool: String,
    pub(crate) consumer: PullConsumer,
    pub(crate) executor: Arc<Executor>,
    pub(crate) slots: Arc<Semaphore>,
    /// Most slots one pull may reserve, so that an idle tool waiting on an open
    /// request cannot hold every slot of the process.
    pub(crate) max_batch: usize,
    pub(crate) tasks: TaskTracker,
}

impl PullLoop {
    /// Runs until `shutdown`; returns once no pull request is open any more.
    pub(crate) async fn run(self, shutdown: CancellationToken) {
        let mut backoff = pull_backoff();
        loop {
            let first = tokio::select! {
                biased;
                () = shutdown.cancelled() => return,
                permit = self.slots.clone().acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_) => return, // the semaphore is only closed at shutdown
                },
            };
            let mut permits = vec![first];
            while permits.len() < self.max_batch {
                match self.slots.clone().try_acquire_owned() {
                    Ok(permit) => permits.push(permit),
                    Err(_) => break,
                }
            }
            let batch = self
                .consumer
                .batch()
                .max_messages(permits.len())
                .expires(PULL_EXPIRES)
                .messages()
                .await;
            let mut batch = match batch {
                Ok(batch) => {
                    backoff = pull_backoff();
                    batch
                }
                Err(err) => {
                    // The iterator is endless (no max_times), so it always yields.
                    let pause = backoff.next().unwrap_or(Duration::from_secs(2));
                    warn!(tool = %self.tool, error = %err, "pull failed; retrying");
                    drop(permits);
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = tokio::time::sleep(pause) => continue,
                    }
                }
            };
            while let Some(message) = batch.next().await {
                let message = match message {
                    Ok(message) => message,
                    Err(err) => {
                        debug!(tool = %self.tool, error = %err, "pull request ended");
                        break;
                    }
                };
                if shutdown.is_cancelled() {
                    // Intake has stopped: hand the call straight back.
                    if let Err(err) = message.ack_with(AckKind::Nak(None)).await {
                        warn!(error = %err, "nak failed; the call is redelivered after AckWait");
                    }
                    continue;
                }
                let Some(permit) = permits.pop() else {
                    // The server never sends more than max_messages.
                    debug_assert!(false, "pull delivered more messages than requested");
                    let _ = message.ack_with(AckKind::Nak(None)).await;
                    continue;
                };
                let executor = self.executor.clone();
                let tool = self.tool.clone();
                self.tasks.spawn(async move {
                    executor.handle(tool, message).await;
                    drop(permit);
                });
            }
        }
    }
}
