//! A job's news as it happens, on the bus: the wake-ups of its watchers
//! after each write with events, the deltas of a turn it streams (never
//! stored), and the asks of watchers that join a streamed turn in the
//! middle. NATS carries them to the other replicas (`toolfleet.events.<job>`);
//! the watchers in this process get them directly. The store
//! (`store::JobStore`) says what it wrote; everything
//! here is best effort, since Redis stays the source of truth.
//!
//! - `wake_ups`: one watcher's wake-ups, and what a write tells them;
//! - `streams`: what each turn streamed here has said so far.

mod streams;
mod wake_ups;

use std::sync::Arc;

use toolfleet_proto::names;

use crate::job::{JobId, TurnDelta};
pub(crate) use wake_ups::Written;
pub use wake_ups::{WakeUps, Woken};

/// The `Toolfleet-Delta` header of a delta.
const DELTA: &str = "1";
/// The `Toolfleet-Delta` header of a watcher's ask for a streaming turn so
/// far (an empty message).
const ASK: &str = "ask";

/// The news of this replica's jobs, to their watchers here and on the bus.
/// Clones share the watchers and the streams.
#[derive(Clone)]
pub struct Live {
    nats: async_nats::Client,
    /// The watchers in this process, woken without NATS.
    watchers: Arc<wake_ups::LocalWatchers>,
    /// The turns streamed by this process's runners, so far.
    streams: Arc<streams::Streams>,
}

impl Live {
    /// The news of this process's jobs, told to other replicas through
    /// `nats`.
    pub fn new(nats: async_nats::Client) -> Self {
        Self {
            nats,
            watchers: Arc::default(),
            streams: Arc::default(),
        }
    }

    /// Wakes the watchers of `job_id`, in this process and, through NATS,
    /// in every other. Best effort: a watcher that misses it reads Redis on
    /// its next poll. `written.events`, when known, is how many events the
    /// job has now: a watcher that has read that many skips the read.
    pub(crate) async fn wrote(&self, job_id: &JobId, written: Written) {
        let payload = written
            .events
            .map_or_else(bytes::Bytes::new, |n| n.to_string().into());
        self.watchers.wake(job_id, written);
        let _ = self
            .nats
            .publish(names::events_subject(job_id), payload)
            .await;
    }

    /// Subscribes to the wake-ups sent whenever `job_id` gets new events.
    /// Redis stays the source of truth: a wake-up only says "read again".
    ///
    /// # Errors
    ///
    /// NATS refused the subscription.
    pub async fn wake_ups(&self, job_id: &JobId) -> Result<WakeUps, async_nats::SubscribeError> {
        WakeUps::subscribe(&self.nats, self.watchers.clone(), job_id).await
    }

    /// Passes a piece of a streamed turn of `job_id` to its watchers: in
    /// this process directly, in every other through NATS (marked, on the
    /// job's events subject). Never stored; best effort, as a wake-up.
    pub(crate) async fn pass_on_delta(&self, job_id: &JobId, delta: &TurnDelta) {
        self.streams.record(job_id, delta);
        self.watchers.pass_on(job_id, delta);
        self.publish_delta(job_id, delta).await;
    }

    /// The turn of `job_id` streamed here stopped: nothing of it is kept.
    pub(crate) fn end_stream(&self, job_id: &JobId) {
        self.streams.end(job_id);
    }

    /// What the streaming turn of `job_id` has said so far, for a watcher
    /// that joined in the middle of it: at once when it streams in this
    /// process; else the replica that streams it is asked, and answers on
    /// the job's events subject (`None` here).
    pub(crate) async fn ask_so_far(&self, job_id: &JobId) -> Option<TurnDelta> {
        if let Some(so_far) = self.streams.so_far(job_id) {
            return Some(so_far);
        }
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(names::headers::DELTA, ASK);
        let _ = self
            .nats
            .publish_with_headers(names::events_subject(job_id), headers, bytes::Bytes::new())
            .await;
        None
    }

    /// The asks of other replicas' watchers for the streaming turn of
    /// `job_id` (see [`ask_so_far`](Self::ask_so_far)).
    ///
    /// # Errors
    ///
    /// NATS refused the subscription.
    pub(crate) async fn asks(
        &self,
        job_id: &JobId,
    ) -> Result<async_nats::Subscriber, async_nats::SubscribeError> {
        self.nats.subscribe(names::events_subject(job_id)).await
    }

    /// Answers an ask (a message of [`asks`](Self::asks) that is one):
    /// what the turn has said so far, to every watcher of the job.
    pub(crate) async fn answer_ask(&self, job_id: &JobId, message: &async_nats::Message) {
        let asked = message
            .headers
            .as_ref()
            .and_then(|headers| headers.get(names::headers::DELTA))
            .is_some_and(|value| value.as_str() == ASK);
        if let (true, Some(so_far)) = (asked, self.streams.so_far(job_id)) {
            self.publish_delta(job_id, &so_far).await;
        }
    }

    async fn publish_delta(&self, job_id: &JobId, delta: &TurnDelta) {
        let Ok(payload) = serde_json::to_vec(delta) else {
            return;
        };
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(names::headers::DELTA, DELTA);
        let _ = self
            .nats
            .publish_with_headers(names::events_subject(job_id), headers, payload.into())
            .await;
    }
}
