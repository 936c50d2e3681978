//! The pull loop of one tool: when execution slots are free, fetch as many
//! calls as there are free slots, hand each to the executor, repeat until
//! shutdown.
//!
//! A slot is taken when a call arrives, never reserved for a pull request:
//! a tool without work holds none, while every tool's request stays open so
//! that a call is fetched as soon as a slot frees. When calls of several
//! tools arrive together for the same free slots, the extra ones wait their
//! turn in this process (the slots are handed out first come, first served),
//! kept alive meanwhile so that JetStream does not redeliver them.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::{AckKind, Message};
use backon::{BackoffBuilder, ExponentialBuilder};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use toolfleet_service::pull::pull;
use tracing::warn;

use super::execute::Executor;

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
    /// How often a call waiting for a slot is kept alive (a third of AckWait).
    pub(crate) keep_alive: Duration,
    pub(crate) tasks: TaskTracker,
}

impl PullLoop {
    /// Runs until `shutdown`; returns once no pull request is open any more.
    pub(crate) async fn run(self, shutdown: CancellationToken) {
        let mut backoff = pull_backoff();
        loop {
            // A tool that is down (its MCP server is, or no longer offers
            // it) pulls nothing: its calls wait in the queue, or go to a
            // worker that can run them.
            let up = self.executor.tools.until_up(&self.tool);
            if shutdown.run_until_cancelled(up).await.is_none() {
                return;
            }
            let free = tokio::select! {
                biased;
                () = shutdown.cancelled() => return,
                free = free_slots(&self.slots) => match free {
                    Some(free) => free,
                    None => return, // the semaphore is only closed at shutdown
                },
            };
            let mut pulled = match pull(&self.consumer, free, &shutdown).await {
                Ok(pulled) => {
                    backoff = pull_backoff();
                    pulled
                }
                Err(err) => {
                    // The iterator is endless (no max_times), so it always yields.
                    let pause = backoff.next().unwrap_or(Duration::from_secs(2));
                    warn!(tool = %self.tool, error = %err, "pull failed; retrying");
                    let paused = shutdown.run_until_cancelled(tokio::time::sleep(pause));
                    if paused.await.is_none() {
                        return;
                    }
                    continue;
                }
            };
            while let Some(message) = pulled.next().await {
                if pulled.stopped() {
                    // Intake has stopped: hand the call straight back.
                    if let Err(err) = message.ack_with(AckKind::Nak(None)).await {
                        warn!(error = %err, "nak failed; the call is redelivered after AckWait");
                    }
                    continue;
                }
                let executor = self.executor.clone();
                let tool = self.tool.clone();
                let slots = self.slots.clone();
                let (shutdown, keep_alive) = (shutdown.clone(), self.keep_alive);
                self.tasks.spawn(async move {
                    let Some(permit) = take_slot(slots, &message, &shutdown, keep_alive).await
                    else {
                        return;
                    };
                    executor.handle(tool, message).await;
                    drop(permit);
                });
            }
        }
    }
}

/// Waits until at least one execution slot is free and says how many are,
/// without taking any: the calls take them when they arrive. `None` once the
/// semaphore is closed.
async fn free_slots(slots: &Semaphore) -> Option<usize> {
    let one = slots.acquire().await.ok()?;
    let free = slots.available_permits() + 1;
    drop(one);
    Some(free)
}

/// The slot of a call that has arrived: at once if one is free, else when
/// its turn comes (first come, first served), keeping the message alive
/// meanwhile. `None` when intake stops first: the call is handed back.
async fn take_slot(
    slots: Arc<Semaphore>,
    message: &Message,
    shutdown: &CancellationToken,
    keep_alive: Duration,
) -> Option<OwnedSemaphorePermit> {
    if let Ok(permit) = slots.clone().try_acquire_owned() {
        return Some(permit);
    }
    let period = keep_alive.max(Duration::from_millis(10));
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    let acquire = slots.acquire_owned();
    tokio::pin!(acquire);
    loop {
        tokio::select! {
            biased;
            permit = &mut acquire => return permit.ok(),
            () = shutdown.cancelled() => {
                if let Err(err) = message.ack_with(AckKind::Nak(None)).await {
                    warn!(error = %err, "nak failed; the call is redelivered after AckWait");
                }
                return None;
            }
            _ = ticker.tick() => {
                if let Err(err) = message.ack_with(AckKind::Progress).await {
                    warn!(error = %err, "could not keep a waiting call alive");
                }
            }
        }
    }
}
