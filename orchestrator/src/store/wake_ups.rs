//! Wake-ups of a job's watchers. After each write with events, the writer
//! says how many events the job has now: on NATS (`toolfleet.events.<job>`),
//! where every replica's watchers hear it, and, to the watchers in its own
//! process, directly. The direct one saves the bus's two hops on the path
//! from a job's last commit to its watcher's client (about a tenth of a
//! one-call job's latency in the bench); the NATS one is still sent, for the
//! other replicas, and the watcher skips it once it has read that far.
//!
//! A wake-up is never the news itself: the watcher reads the events from
//! Redis. A wrong one costs a read, never an event.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use futures::StreamExt;
use tokio::sync::watch;
use toolfleet_proto::names;

/// The watchers in this process, by job: each job's latest wake-up (how
/// many events it has, `None` when the writer did not say).
#[derive(Debug, Default)]
pub(super) struct LocalWatchers {
    by_job: Mutex<HashMap<String, watch::Sender<Option<u64>>>>,
}

impl LocalWatchers {
    /// Wakes this process's watchers of `job_id`, if it has any.
    pub(super) fn wake(&self, job_id: &str, events: Option<u64>) {
        let by_job = self.by_job.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(sender) = by_job.get(job_id) {
            sender.send_replace(events);
        }
    }

    fn watch(&self, job_id: &str) -> watch::Receiver<Option<u64>> {
        let mut by_job = self.by_job.lock().unwrap_or_else(PoisonError::into_inner);
        by_job
            .entry(job_id.to_owned())
            .or_insert_with(|| watch::channel(None).0)
            .subscribe()
    }

    /// Forgets `job_id` once its last watcher here is gone.
    fn unwatch(&self, job_id: &str) {
        let mut by_job = self.by_job.lock().unwrap_or_else(PoisonError::into_inner);
        if by_job
            .get(job_id)
            .is_some_and(|sender| sender.receiver_count() == 0)
        {
            by_job.remove(job_id);
        }
    }
}

/// One watcher's wake-ups for one job, from NATS and from this process
/// ([`JobStore::subscribe_events`](super::JobStore::subscribe_events)).
pub struct WakeUps {
    job_id: String,
    nats: Option<async_nats::Subscriber>,
    /// `None` while dropping, or once its sender is gone (which the
    /// registry never drops while a receiver lives).
    local: Option<watch::Receiver<Option<u64>>>,
    watchers: Arc<LocalWatchers>,
}

impl WakeUps {
    pub(super) async fn subscribe(
        nats: &async_nats::Client,
        watchers: Arc<LocalWatchers>,
        job_id: &str,
    ) -> Result<Self, async_nats::SubscribeError> {
        let subscriber = nats.subscribe(names::events_subject(job_id)).await?;
        let local = watchers.watch(job_id);
        Ok(Self {
            job_id: job_id.to_owned(),
            nats: Some(subscriber),
            local: Some(local),
            watchers,
        })
    }

    /// Returns at the first wake-up that may bring events past `offset` (the
    /// next one the watcher reads); pending forever if no wake-up can come
    /// any more. Cancel-safe: a wake-up is never half taken.
    pub async fn past(&mut self, offset: u64) {
        loop {
            let events = tokio::select! {
                message = next_message(&mut self.nats) => match message {
                    Some(message) => parse(&message.payload),
                    // A subscription that ended wakes nobody.
                    None => {
                        self.nats = None;
                        continue;
                    }
                },
                changed = changed(&mut self.local) => match changed {
                    Some(events) => events,
                    None => {
                        self.local = None;
                        continue;
                    }
                },
            };
            if needs_read(events, offset) {
                return;
            }
        }
    }
}

impl Drop for WakeUps {
    fn drop(&mut self) {
        drop(self.local.take());
        self.watchers.unwatch(&self.job_id);
    }
}

async fn next_message(nats: &mut Option<async_nats::Subscriber>) -> Option<async_nats::Message> {
    match nats {
        Some(subscriber) => subscriber.next().await,
        None => std::future::pending().await,
    }
}

/// The latest local wake-up once there is a new one; `None` once nobody
/// can send one.
async fn changed(local: &mut Option<watch::Receiver<Option<u64>>>) -> Option<Option<u64>> {
    match local {
        Some(receiver) => match receiver.changed().await {
            Ok(()) => Some(*receiver.borrow_and_update()),
            Err(_) => None,
        },
        None => std::future::pending().await,
    }
}

/// How many events a wake-up from the bus says the job has: `None` when it
/// says nothing or is not a number (anyone on the bus can publish one).
fn parse(payload: &[u8]) -> Option<u64> {
    std::str::from_utf8(payload)
        .ok()
        .and_then(|events| events.parse::<u64>().ok())
}

/// Whether a wake-up saying the job has `events` events (`None`: it did
/// not say) may bring events past `offset`.
fn needs_read(events: Option<u64>, offset: u64) -> bool {
    events.is_none_or(|events| events > offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether a wake-up from the bus may bring events past `offset`. A
    /// commit's wake-up says how many events the job has; one that says
    /// nothing, or is not a number (it came from anyone on the bus), is read:
    /// a wrong wake-up costs a read, never an event.
    fn wake_up_needs_read(payload: &[u8], offset: u64) -> bool {
        needs_read(parse(payload), offset)
    }

    #[test]
    fn a_wake_up_is_skipped_only_when_it_says_nothing_new_was_written() {
        // A commit's wake-up: the job now has 5 events (offsets 0 to 4).
        assert!(wake_up_needs_read(b"5", 4), "offset 4 is not read yet");
        assert!(!wake_up_needs_read(b"5", 5), "all 5 were read");
        assert!(!wake_up_needs_read(b"5", 9));
        // Anything else is read: an empty wake-up (creation, cancel), or
        // bytes from someone else on the bus.
        for payload in [
            &b""[..],
            b"-1",
            b"5 ",
            b"\xff\xfe",
            b"99999999999999999999999",
        ] {
            assert!(wake_up_needs_read(payload, 5), "{payload:?}");
        }
    }

    #[test]
    fn a_job_is_forgotten_with_its_last_local_watcher() {
        let watchers = LocalWatchers::default();
        let first = watchers.watch("job-a");
        let mut second = watchers.watch("job-a");
        watchers.wake("job-a", Some(3));
        assert_eq!(*second.borrow_and_update(), Some(3));
        drop(first);
        watchers.unwatch("job-a");
        assert_eq!(
            watchers.by_job.lock().unwrap().len(),
            1,
            "one watcher is left"
        );
        drop(second);
        watchers.unwatch("job-a");
        assert!(watchers.by_job.lock().unwrap().is_empty());
        // Waking a job nobody here watches is a no-op.
        watchers.wake("job-b", None);
        assert!(watchers.by_job.lock().unwrap().is_empty());
    }
}
