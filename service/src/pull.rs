//! One pull request to a shared consumer, read until a stop.
//!
//! Both services take work the same way: ask a durable consumer for as
//! many messages as they have room for, for [`PULL_EXPIRES`] at most, and
//! read what comes. A stop must not wait on the request (with NATS gone,
//! async-nats ends a dead one only 5 s after it expires), nor lose what it
//! still delivers: once stopped, the request is read until it would have
//! expired on the server, which a healthy server answers by then, so each
//! message that still arrives can be handed straight back; then it is
//! dropped, and anything that arrives later is redelivered after AckWait.

use std::time::Duration;

use async_nats::jetstream::Message;
use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::consumer::pull::{Batch, BatchError};
use futures::StreamExt;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How long one pull request waits for messages on an idle consumer. Short,
/// so that a stop never waits long for an open request.
pub const PULL_EXPIRES: Duration = Duration::from_secs(2);

/// The messages of one pull request.
pub struct Pulled {
    batch: Batch,
    stop: CancellationToken,
    /// Once stopped: when the request is given up.
    given_up_at: Option<Instant>,
}

/// Asks `consumer` for up to `max` messages, read until `stop` (see the
/// module docs).
///
/// # Errors
///
/// The request could not be sent (NATS unavailable).
pub async fn pull(
    consumer: &PullConsumer,
    max: usize,
    stop: &CancellationToken,
) -> Result<Pulled, BatchError> {
    let batch = consumer
        .batch()
        .max_messages(max)
        .expires(PULL_EXPIRES)
        .messages()
        .await?;
    Ok(Pulled {
        batch,
        stop: stop.clone(),
        given_up_at: None,
    })
}

impl Pulled {
    /// The next message; `None` once the request is over, failed, or given
    /// up after the stop. A message read after the stop is the caller's to
    /// hand back ([`Self::stopped`] says so).
    pub async fn next(&mut self) -> Option<Message> {
        if self.given_up_at.is_none() {
            tokio::select! {
                biased;
                () = self.stop.cancelled() => {
                    self.given_up_at = Some(Instant::now() + PULL_EXPIRES);
                }
                next = self.batch.next() => return message(next),
            }
        }
        let given_up_at = self.given_up_at?;
        message(
            tokio::time::timeout_at(given_up_at, self.batch.next())
                .await
                .ok()?,
        )
    }

    /// Whether the stop was asked: a message read now goes back at once.
    #[must_use]
    pub fn stopped(&self) -> bool {
        self.stop.is_cancelled()
    }
}

/// A batch's next item as a message; its end and its errors (the request
/// expired, NATS went away) both end the request.
fn message(next: Option<Result<Message, async_nats::Error>>) -> Option<Message> {
    match next? {
        Ok(message) => Some(message),
        Err(err) => {
            tracing::debug!(error = %err, "pull request ended");
            None
        }
    }
}
