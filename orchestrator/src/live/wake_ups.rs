//! Wake-ups of a job's watchers. After each write with events, the writer
//! says how many events the job has now: on NATS (`toolfleet.events.<job>`),
//! where every replica's watchers hear it, and, to the watchers in its own
//! process, directly. The direct one saves the bus's two hops on the path
//! from a job's last commit to its watcher's client (about a tenth of a
//! one-call job's latency in the bench); the NATS one is still sent, for the
//! other replicas, and the watcher skips it once it has read that far.
//!
//! A wake-up from the bus is never the news itself: the watcher reads the
//! events from Redis, and a wrong one costs a read, never an event. A
//! direct one also hands over the events its write stored, so that a
//! watcher that has read everything before them sends them without reading
//! them back (about five reads of the job's log per job in the bench).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use futures::StreamExt;
use tokio::sync::{broadcast, watch};
use toolfleet_proto::names;

use crate::job::{Event, JobId, TurnDelta};

/// What a write tells the watchers of its job.
#[derive(Debug, Clone, Default)]
pub(crate) struct Written {
    /// How many events the job has now; `None` when the writer did not say.
    pub(crate) events: Option<u64>,
    /// The events the write stored, in order, the last of them being the
    /// job's last (so the first has offset `events - len`), when the
    /// writer handed them over; stored exactly so.
    pub(crate) stored: Option<Arc<[Event]>>,
}

impl Written {
    /// A write that says only how many events the job has.
    pub(crate) fn counted(events: Option<u64>) -> Self {
        Self {
            events,
            stored: None,
        }
    }

    /// A write that stored `stored`, after which the job has `events`
    /// events (as its script answered): numbers them, the last being
    /// `events - 1`. An answer that cannot be the count after them hands
    /// nothing over, and says nothing.
    pub(crate) fn numbered(mut stored: Vec<Event>, events: Option<u64>) -> Self {
        let Some(first) = events.and_then(|events| events.checked_sub(stored.len() as u64)) else {
            return Self::counted(None);
        };
        for (event, offset) in stored.iter_mut().zip(first..) {
            event.offset = offset;
        }
        Self {
            events: Some(first + stored.len() as u64),
            stored: Some(stored.into()),
        }
    }
}

/// What a watcher is woken to do ([`WakeUps::past`]).
#[derive(Debug)]
pub enum Woken {
    /// Events past its offset may be in Redis: read them.
    Read,
    /// The events from its offset on, as the write in this process that
    /// stored them handed them over: send them, no read needed.
    Handed(Arc<[Event]>),
    /// A piece of a streamed turn, which is never stored: pass it on.
    Delta(TurnDelta),
}

/// Deltas a watcher in this process may fall behind by before it skips
/// some (a streamed turn's checkpoint still says everything).
const LOCAL_DELTAS: usize = 256;

/// The watchers in this process, by job: each job's latest wake-up, and
/// its streamed turn's deltas. (The orchestrator's NATS connection does
/// not hear its own messages, so they come this way.)
#[derive(Debug, Default)]
pub(super) struct LocalWatchers {
    by_job: Mutex<HashMap<JobId, Channels>>,
}

#[derive(Debug)]
struct Channels {
    written: watch::Sender<Written>,
    /// Made by the first watcher of a streamed job
    /// ([`WakeUps::hear_deltas`]): a job that does not stream has none,
    /// and costs its watchers nothing for them.
    deltas: Option<broadcast::Sender<TurnDelta>>,
}

impl LocalWatchers {
    /// Wakes this process's watchers of `job_id`, if it has any.
    pub(super) fn wake(&self, job_id: &JobId, written: Written) {
        let by_job = self.by_job.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(channels) = by_job.get(job_id) {
            channels.written.send_replace(written);
        }
    }

    /// Passes a delta to this process's watchers of `job_id`, if any.
    pub(super) fn pass_on(&self, job_id: &JobId, delta: &TurnDelta) {
        let by_job = self.by_job.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(deltas) = by_job.get(job_id).and_then(|c| c.deltas.as_ref()) {
            let _ = deltas.send(delta.clone());
        }
    }

    fn watch(&self, job_id: &JobId) -> watch::Receiver<Written> {
        let mut by_job = self.by_job.lock().unwrap_or_else(PoisonError::into_inner);
        let channels = by_job.entry(job_id.to_owned()).or_insert_with(|| Channels {
            written: watch::channel(Written::default()).0,
            deltas: None,
        });
        channels.written.subscribe()
    }

    /// The deltas of `job_id` passed on in this process, for one of its
    /// watchers here; `None` when it has none (it stopped watching).
    fn hear_deltas(&self, job_id: &JobId) -> Option<broadcast::Receiver<TurnDelta>> {
        let mut by_job = self.by_job.lock().unwrap_or_else(PoisonError::into_inner);
        let channels = by_job.get_mut(job_id)?;
        let deltas = channels
            .deltas
            .get_or_insert_with(|| broadcast::channel(LOCAL_DELTAS).0);
        Some(deltas.subscribe())
    }

    /// Forgets `job_id` once its last watcher here is gone.
    fn unwatch(&self, job_id: &JobId) {
        let mut by_job = self.by_job.lock().unwrap_or_else(PoisonError::into_inner);
        if by_job
            .get(job_id)
            .is_some_and(|channels| channels.written.receiver_count() == 0)
        {
            by_job.remove(job_id);
        }
    }
}

/// One watcher's wake-ups for one job, from NATS and from this process
/// ([`Live::wake_ups`](super::Live::wake_ups)).
pub struct WakeUps {
    job_id: JobId,
    nats: Option<async_nats::Subscriber>,
    /// `None` while dropping, or once its sender is gone (which the
    /// registry never drops while a receiver lives).
    local: Option<watch::Receiver<Written>>,
    /// Deltas of the job's streamed turns run in this process, once the
    /// watcher asked for them.
    local_deltas: Option<broadcast::Receiver<TurnDelta>>,
    watchers: Arc<LocalWatchers>,
}

impl WakeUps {
    pub(super) async fn subscribe(
        nats: &async_nats::Client,
        watchers: Arc<LocalWatchers>,
        job_id: &JobId,
    ) -> Result<Self, async_nats::SubscribeError> {
        let subscriber = nats.subscribe(names::events_subject(job_id)).await?;
        let local = watchers.watch(job_id);
        Ok(Self {
            job_id: job_id.to_owned(),
            nats: Some(subscriber),
            local: Some(local),
            local_deltas: None,
            watchers,
        })
    }

    /// Hears the deltas of the job's streamed turns run in this process
    /// too (those run elsewhere come over NATS anyway). For a streamed job
    /// only, once its first read said so: a delta passed on before it is
    /// missed, and the watcher asks for the turn so far at the next one.
    pub(crate) fn hear_deltas(&mut self) {
        self.local_deltas = self.watchers.hear_deltas(&self.job_id);
    }

    /// Returns at the first wake-up that may bring events past `offset` (the
    /// next one the watcher reads), with those events when this process
    /// stored them and they start at `offset`; pending forever if no
    /// wake-up can come any more. Cancel-safe: a wake-up is never half
    /// taken.
    pub async fn past(&mut self, offset: u64) -> Woken {
        loop {
            let written = tokio::select! {
                // The bus first: a streamed turn's deltas, published before
                // the turn's commit, go out before the local wake-up of
                // that commit, which would make them stale.
                biased;
                message = next_message(&mut self.nats) => match message {
                    // A delta; or another watcher's ask, which is empty.
                    Some(message) if is_delta(&message) => {
                        match TurnDelta::read(&message.payload) {
                            Some(delta) => return Woken::Delta(delta),
                            None => continue,
                        }
                    }
                    Some(message) => Written::counted(parse(&message.payload)),
                    // A subscription that ended wakes nobody.
                    None => {
                        self.nats = None;
                        continue;
                    }
                },
                delta = next_delta(&mut self.local_deltas) => match delta {
                    Some(delta) => return Woken::Delta(delta),
                    None => {
                        self.local_deltas = None;
                        continue;
                    }
                },
                changed = changed(&mut self.local) => match changed {
                    Some(written) => written,
                    None => {
                        self.local = None;
                        continue;
                    }
                },
            };
            if needs_read(written.events, offset) {
                return woken(written.stored, offset);
            }
        }
    }
}

impl Drop for WakeUps {
    fn drop(&mut self) {
        drop(self.local.take());
        drop(self.local_deltas.take());
        self.watchers.unwatch(&self.job_id);
    }
}

async fn next_message(nats: &mut Option<async_nats::Subscriber>) -> Option<async_nats::Message> {
    match nats {
        Some(subscriber) => subscriber.next().await,
        None => std::future::pending().await,
    }
}

/// The next local delta; `None` once nobody can send one. A watcher that
/// fell behind skips what it missed.
async fn next_delta(deltas: &mut Option<broadcast::Receiver<TurnDelta>>) -> Option<TurnDelta> {
    let Some(receiver) = deltas else {
        return std::future::pending().await;
    };
    loop {
        match receiver.recv().await {
            Ok(delta) => return Some(delta),
            Err(broadcast::error::RecvError::Lagged(_)) => {}
            Err(broadcast::error::RecvError::Closed) => return None,
        }
    }
}

/// The latest local wake-up once there is a new one; `None` once nobody
/// can send one.
async fn changed(local: &mut Option<watch::Receiver<Written>>) -> Option<Written> {
    match local {
        Some(receiver) => match receiver.changed().await {
            Ok(()) => Some(receiver.borrow_and_update().clone()),
            Err(_) => None,
        },
        None => std::future::pending().await,
    }
}

/// Whether a message of the events subject is a delta, not a wake-up.
fn is_delta(message: &async_nats::Message) -> bool {
    message
        .headers
        .as_ref()
        .is_some_and(|headers| headers.get(names::headers::DELTA).is_some())
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

/// What a wake-up that may bring events past `offset` asks of its watcher:
/// to send the `stored` events when they are exactly the next ones, else
/// to read. Only the latest of a job's local wake-ups is kept, so a watcher
/// that missed one finds a gap here, and reads.
fn woken(stored: Option<Arc<[Event]>>, offset: u64) -> Woken {
    match stored {
        Some(events) if events.first().is_some_and(|first| first.offset == offset) => {
            Woken::Handed(events)
        }
        _ => Woken::Read,
    }
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

    fn event(kind: &str) -> Event {
        Event {
            offset: 0,
            kind: kind.to_owned(),
            data: "{}".to_owned(),
            timestamp_ms: 1,
            is_final: false,
        }
    }

    fn offsets(woken: &Woken) -> Option<Vec<u64>> {
        match woken {
            Woken::Read | Woken::Delta(_) => None,
            Woken::Handed(events) => Some(events.iter().map(|e| e.offset).collect()),
        }
    }

    #[test]
    fn a_local_wake_up_hands_over_its_events_only_when_they_are_the_next_ones() {
        // A commit of two events after which the job has 7: offsets 5 and 6.
        let written = Written::numbered(vec![event("a"), event("b")], Some(7));
        assert_eq!(written.events, Some(7));
        let handed = |offset| offsets(&woken(written.stored.clone(), offset));
        assert_eq!(handed(5), Some(vec![5, 6]), "the watcher read 0 to 4");
        // A watcher that missed an earlier write, or has read part of
        // these, reads Redis.
        assert_eq!(handed(4), None);
        assert_eq!(handed(6), None);
        // An answer that cannot count them hands nothing over.
        for events in [Some(1), None] {
            let written = Written::numbered(vec![event("a"), event("b")], events);
            assert_eq!(written.events, None);
            assert!(written.stored.is_none());
        }
        assert_eq!(offsets(&woken(None, 5)), None, "a count alone is read");
    }

    #[test]
    fn a_job_is_forgotten_with_its_last_local_watcher() {
        let watchers = LocalWatchers::default();
        let job = JobId::new("acme", 1, 2);
        let first = watchers.watch(&job);
        let mut second = watchers.watch(&job);
        watchers.wake(&job, Written::counted(Some(3)));
        assert_eq!(second.borrow_and_update().events, Some(3));
        let delta = TurnDelta {
            turn: 0,
            epoch: 1,
            seq: 0,
            piece: crate::job::DeltaPiece::Text("hi".into()),
        };
        // Nobody here hears deltas yet: nothing is made for them.
        watchers.pass_on(&job, &delta);
        assert!(watchers.by_job.lock().unwrap()[&job].deltas.is_none());
        let mut second_deltas = watchers.hear_deltas(&job).expect("watched");
        watchers.pass_on(&job, &delta);
        assert_eq!(second_deltas.try_recv().ok(), Some(delta));
        assert!(watchers.hear_deltas(&JobId::new("acme", 5, 6)).is_none());
        drop(first);
        watchers.unwatch(&job);
        assert_eq!(
            watchers.by_job.lock().unwrap().len(),
            1,
            "one watcher is left"
        );
        drop((second, second_deltas));
        watchers.unwatch(&job);
        assert!(watchers.by_job.lock().unwrap().is_empty());
        // Waking a job nobody here watches is a no-op.
        watchers.wake(&JobId::new("acme", 3, 4), Written::counted(None));
        assert!(watchers.by_job.lock().unwrap().is_empty());
    }
}
