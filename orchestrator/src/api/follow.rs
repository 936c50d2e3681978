//! `WatchJob`'s follower: streams a job's events from an offset until its
//! final one, the client leaving, or the job expiring. [`Follower`] decides
//! (a state type, tested without Redis); [`Watch`] does the reads, the
//! sends and the waits it asks for.
//!
//! Redis errors are retried (a restart of Redis is not the end of a watch)
//! for up to [`WATCH_OUTAGE`]. A finished job has all its events (its
//! status and final event are one write), so once the job is seen finished
//! the follower reads once more and stops. A stream that started past the
//! final event still ends with it, so every watch of a finished job says
//! how it ended.

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tonic::Status;
use toolfleet_proto::v1;

use super::convert::{to_event, to_status};
use crate::job::{DeltaPiece, Event, JobId, JobStatus, TurnDelta};
use crate::live::{Live, WakeUps, Woken};
use crate::store::{self, JobStore};

/// How long a watcher rides out a job store outage before it gives up.
const WATCH_OUTAGE: Duration = Duration::from_secs(30);

/// The pause between reads while the job store fails.
const RETRY_PAUSE: Duration = Duration::from_millis(250);

/// The kind of a streamed turn's delta events.
pub(super) const MODEL_OUTPUT_DELTA: &str = "model_output_delta";

/// Events a watch reads from Redis at once.
pub(super) const WATCH_BATCH: usize = 256;

/// How often a watcher re-reads Redis without a wake-up.
const WATCH_POLL: Duration = Duration::from_secs(1);

/// Where one watch stands.
#[derive(Debug)]
pub(super) struct Follower {
    job_id: JobId,
    /// The offset of the next event to send.
    offset: u64,
    /// The job's trace id, until the first event sent carries it.
    trace_id: Option<String>,
    /// Whether an empty read must look at the job: on the first read and
    /// after a poll, not after a wake-up, which only comes from a job that
    /// exists and has not ended (its final event ends the stream).
    check_job: bool,
    /// The job was seen finished, and its events read once more since.
    drained: bool,
    /// Since when the job store has failed, while it does.
    failing_since: Option<Instant>,
    /// Whether the job's turns are streamed: else it has no deltas to
    /// follow (and any that came would not be its runner's).
    streamed: bool,
    /// The last turn whose `model_turn` was sent: its deltas are stale.
    turn_sent: Option<u32>,
    /// The turn being streamed, the epoch of the run that streams it, and
    /// the sequence number of the next delta this watch takes.
    streaming: Option<(u32, u64, u64)>,
    /// The turn and run this watch asked for so far, once.
    asked: Option<(u32, u64)>,
}

/// What one read of the job found.
#[derive(Debug, Default)]
pub(super) struct Read {
    /// Its events from the follower's offset on, at most [`WATCH_BATCH`].
    pub(super) events: Vec<Event>,
    /// Its status, when the read asked: `Some(None)` when it is gone.
    pub(super) status: Option<Option<JobStatus>>,
}

/// What the follower does next.
#[derive(Debug)]
pub(super) enum Next {
    /// Send these events (the last may be the final one, which ends the
    /// stream); then read again at once when `more`, else wait.
    Send {
        events: Vec<v1::JobEvent>,
        more: bool,
    },
    /// Read again now: the job finished, and its last events are stored.
    ReadAgain,
    /// Read again after this pause: the job store failed.
    RetryAfter(Duration),
    /// Every event was read: send the final one if this stream has not
    /// (it started past it), then end.
    Finish,
    /// End the stream: the job expired, or never existed.
    End,
    /// The job store failed for too long: send this and end.
    Fail(Status),
}

impl Follower {
    /// A watch of `job_id` from `offset`, whose turns are `streamed` or
    /// not; `trace_id` goes on its first event.
    pub(super) fn new(
        job_id: JobId,
        offset: u64,
        trace_id: Option<String>,
        streamed: bool,
    ) -> Self {
        Self {
            job_id,
            offset,
            trace_id,
            check_job: true,
            drained: false,
            failing_since: None,
            streamed,
            turn_sent: None,
            streaming: None,
            asked: None,
        }
    }

    /// A piece of a streamed turn, as a `model_output_delta` event; and
    /// whether to ask for the turn so far (this watch joined in the middle
    /// of it). `None` when it is stale (its turn was checkpointed and
    /// sent, a later run streams the turn, or this watch already has it).
    /// The first delta of a turn another run had begun, and a provider's
    /// restart, say `restarted`: what the client has of the turn is void.
    pub(super) fn on_delta(&mut self, delta: TurnDelta) -> (Option<v1::JobEvent>, bool) {
        if !self.streamed || self.turn_sent.is_some_and(|sent| delta.turn <= sent) {
            return (None, false);
        }
        let run = (delta.turn, delta.epoch);
        let mut restarted = false;
        match self.streaming {
            Some((turn, epoch, _)) if (turn, epoch) > run => return (None, false),
            // Seen already, or a turn so far that this watch has.
            Some((turn, epoch, next))
                if (turn, epoch) == run
                    && (delta.seq < next || matches!(delta.piece, DeltaPiece::SoFar { .. })) =>
            {
                return (None, false);
            }
            Some((turn, epoch, _)) if (turn, epoch) == run => {}
            Some((turn, _, _)) if turn == delta.turn => restarted = true,
            _ => {}
        }
        let joined = self
            .streaming
            .is_some_and(|(turn, epoch, _)| (turn, epoch) == run);
        let is_so_far = matches!(delta.piece, DeltaPiece::SoFar { .. });
        if !joined && delta.seq > 0 && !is_so_far {
            // The turn began before this watch: ask for it so far, once.
            let ask = self.asked != Some(run);
            self.asked = Some(run);
            return (None, ask);
        }
        self.streaming = Some((delta.turn, delta.epoch, delta.seq + u64::from(!is_so_far)));
        let mut data = serde_json::json!({"turn": delta.turn});
        match delta.piece {
            DeltaPiece::Text(text) => data["text"] = text.into(),
            DeltaPiece::ToolCall { index, name } => {
                data["tool_call"] = serde_json::json!({"index": index, "name": name});
            }
            DeltaPiece::Restart => restarted = true,
            DeltaPiece::SoFar { text, tool_calls } => {
                data["text"] = text.into();
                data["so_far"] = true.into();
                if !tool_calls.is_empty() {
                    data["tool_calls"] = tool_calls.into();
                }
            }
        }
        if restarted {
            data["restarted"] = true.into();
        }
        let event = v1::JobEvent {
            job_id: self.job_id.to_string(),
            // Not in the log: the offset of the next stored event.
            offset: self.offset,
            kind: MODEL_OUTPUT_DELTA.to_owned(),
            data: data.to_string(),
            timestamp_ms: toolfleet_service::clock::now_ms(),
            r#final: false,
            trace_id: String::new(),
        };
        (Some(event), false)
    }

    /// Whether a read that found `events` must also read the job's status.
    pub(super) fn asks_status(&self, events: &[Event]) -> bool {
        events.is_empty() && self.check_job
    }

    /// What to do after a read (`at` is now).
    pub(super) fn on_read(&mut self, read: Result<Read, store::Error>, at: Instant) -> Next {
        let read = match read {
            Ok(read) => read,
            Err(err) => {
                let since = *self.failing_since.get_or_insert(at);
                return if at.duration_since(since) > WATCH_OUTAGE {
                    Next::Fail(to_status(&err))
                } else {
                    Next::RetryAfter(RETRY_PAUSE)
                };
            }
        };
        self.failing_since = None;
        match read.status {
            Some(None) => Next::End,
            Some(Some(status)) if status.is_final() => {
                if self.drained {
                    Next::Finish
                } else {
                    self.drained = true;
                    Next::ReadAgain
                }
            }
            _ => self.send(read.events),
        }
    }

    /// The events to send, up to and with a final one.
    fn send(&mut self, events: Vec<Event>) -> Next {
        let full = events.len() == WATCH_BATCH;
        let mut out = Vec::with_capacity(events.len());
        for event in events {
            let is_final = event.is_final;
            out.push(self.emit(event));
            if is_final {
                return Next::Send {
                    events: out,
                    more: false,
                };
            }
        }
        Next::Send {
            events: out,
            more: full,
        }
    }

    /// `event` for the client, past which the follower now stands.
    fn emit(&mut self, event: Event) -> v1::JobEvent {
        self.offset = event.offset + 1;
        if self.streamed && event.kind == "model_turn" {
            /// The one field read; serde skips the others.
            #[derive(serde::Deserialize)]
            struct TurnNumber {
                turn: u32,
            }
            let turn = serde_json::from_str::<TurnNumber>(&event.data).ok();
            self.turn_sent = self.turn_sent.max(turn.map(|t| t.turn));
        }
        to_event(&self.job_id, event, self.trace_id.take())
    }

    /// The job's last event, for [`Next::Finish`]: sent when it is the
    /// final one.
    pub(super) fn last(&mut self, event: Event) -> Option<v1::JobEvent> {
        event.is_final.then(|| self.emit(event))
    }

    /// A wake-up came: the job exists and has not ended.
    pub(super) fn on_woken(&mut self) {
        self.check_job = false;
    }

    /// No wake-up came within a poll: the next empty read looks at the job.
    pub(super) fn on_poll(&mut self) {
        self.check_job = true;
    }
}

type Sender = mpsc::Sender<Result<v1::JobEvent, Status>>;

/// A watch as it runs: where it reads the job's events, what it hears of
/// them, what it decides, and the client's stream it sends to.
pub(super) struct Watch {
    pub(super) store: JobStore,
    pub(super) live: Live,
    pub(super) follower: Follower,
    pub(super) wakeups: WakeUps,
    pub(super) tx: Sender,
}

/// What a watch does after one read.
enum Sent {
    /// Read again at once: more is there, or the read is to be retried.
    ReadNow,
    /// Everything was sent: wait for a wake-up.
    Wait,
    /// The watch is over: the final event sent, the client gone, or a
    /// failure sent.
    Over,
}

impl Watch {
    /// Streams what the follower decides, starting with `first`, the events
    /// the watch read when it began. Owned by the client's stream: ends as
    /// soon as the stream is dropped, which closes `tx`.
    pub(super) async fn follow(mut self, first: Vec<Event>) {
        // The next events, when they are at hand: the watch's first read, or
        // what a write in this process handed over. An empty first read is
        // read again here, where an empty read looks at the job.
        let mut handed = (!first.is_empty()).then_some(first);
        loop {
            let read = match handed.take() {
                Some(events) => Ok(Read {
                    events,
                    status: None,
                }),
                None => read(&self.store, &self.follower).await,
            };
            match self.send(read).await {
                Sent::ReadNow => continue,
                Sent::Wait => {}
                Sent::Over => return,
            }
            match self.wait().await {
                ControlFlow::Continue(events) => handed = events,
                ControlFlow::Break(()) => return,
            }
        }
    }

    /// Sends what the follower makes of `read`, and says what comes next.
    async fn send(&mut self, read: Result<Read, store::Error>) -> Sent {
        match self.follower.on_read(read, Instant::now()) {
            Next::Send { events, more } => {
                for event in events {
                    let is_final = event.r#final;
                    if self.tx.send(Ok(event)).await.is_err() || is_final {
                        return Sent::Over;
                    }
                }
                if more { Sent::ReadNow } else { Sent::Wait }
            }
            Next::ReadAgain => Sent::ReadNow,
            Next::RetryAfter(pause) => {
                tokio::select! {
                    () = self.tx.closed() => Sent::Over,
                    () = tokio::time::sleep(pause) => Sent::ReadNow,
                }
            }
            Next::Finish => {
                if let Ok(Some(last)) = self.store.last_event(&self.follower.job_id).await
                    && let Some(event) = self.follower.last(last)
                {
                    let _ = self.tx.send(Ok(event)).await;
                }
                Sent::Over
            }
            Next::End => Sent::Over,
            Next::Fail(status) => {
                let _ = self.tx.send(Err(status)).await;
                Sent::Over
            }
        }
    }

    /// Waits for a wake-up that brings events not read yet, and gives the
    /// events it handed over, if any; polls anyway now and then, since
    /// wake-ups are best effort. A streamed turn's deltas are passed on
    /// meanwhile: nothing is stored for them. `Break` once the client is
    /// gone.
    async fn wait(&mut self) -> ControlFlow<(), Option<Vec<Event>>> {
        loop {
            let woken = tokio::select! {
                () = self.tx.closed() => return ControlFlow::Break(()),
                woken = self.wakeups.past(self.follower.offset) => woken,
                () = tokio::time::sleep(WATCH_POLL) => {
                    self.follower.on_poll();
                    return ControlFlow::Continue(None);
                }
            };
            match woken {
                Woken::Delta(delta) => {
                    if !self.pass_on(delta).await {
                        return ControlFlow::Break(());
                    }
                }
                Woken::Handed(events) => {
                    self.follower.on_woken();
                    return ControlFlow::Continue(Some(events.to_vec()));
                }
                Woken::Read => {
                    self.follower.on_woken();
                    return ControlFlow::Continue(None);
                }
            }
        }
    }

    /// Sends a streamed turn's delta, if it is one to send, asking for the
    /// turn so far when the watch joined in the middle of it (answered at
    /// once when the turn streams in this process, else by the replica that
    /// streams it, as a delta). `false` once the client is gone.
    async fn pass_on(&mut self, delta: TurnDelta) -> bool {
        let (mut event, ask) = self.follower.on_delta(delta);
        if ask && let Some(so_far) = self.live.ask_so_far(&self.follower.job_id).await {
            event = self.follower.on_delta(so_far).0;
        }
        match event {
            Some(event) => self.tx.send(Ok(event)).await.is_ok(),
            None => true,
        }
    }
}

/// The job's events from the follower's offset, and its status when the
/// follower asks.
async fn read(store: &JobStore, follower: &Follower) -> Result<Read, store::Error> {
    let events = store
        .events(&follower.job_id, follower.offset, WATCH_BATCH)
        .await?;
    let status = if follower.asks_status(&events) {
        Some(store.status(&follower.job_id).await?)
    } else {
        None
    };
    Ok(Read { events, status })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> JobId {
        JobId::new("acme", 1, 2)
    }

    fn event(offset: u64, is_final: bool) -> Event {
        Event {
            offset,
            kind: if is_final {
                "job_succeeded"
            } else {
                "model_turn"
            }
            .into(),
            data: "{}".into(),
            timestamp_ms: 1_000 + offset,
            is_final,
        }
    }

    fn events(read: &mut Follower, events: Vec<Event>) -> (Vec<v1::JobEvent>, bool) {
        let read = read.on_read(
            Ok(Read {
                events,
                status: None,
            }),
            Instant::now(),
        );
        match read {
            Next::Send { events, more } => (events, more),
            other => panic!("{other:?}"),
        }
    }

    fn status(status: Option<JobStatus>) -> Result<Read, store::Error> {
        Ok(Read {
            events: Vec::new(),
            status: Some(status),
        })
    }

    fn redis_down() -> Result<Read, store::Error> {
        Err(store::Error::Redis(redis::RedisError::from(
            std::io::Error::other("down"),
        )))
    }

    #[test]
    fn events_are_sent_in_order_with_the_trace_id_on_the_first() {
        let mut follower = Follower::new(job(), 3, Some("t".into()), false);
        let (sent, more) = events(&mut follower, vec![event(3, false), event(4, false)]);
        assert!(!more);
        assert_eq!(sent.iter().map(|e| e.offset).collect::<Vec<_>>(), [3, 4]);
        assert_eq!(sent[0].trace_id, "t");
        assert_eq!(sent[1].trace_id, "");
        assert_eq!(sent[0].job_id, job().as_str());
        assert_eq!(follower.offset, 5);
        let (sent, _) = events(&mut follower, vec![event(5, false)]);
        assert_eq!(sent[0].trace_id, "", "only the stream's first event");
    }

    #[test]
    fn a_full_batch_reads_again_and_a_final_event_ends_the_stream() {
        let mut follower = Follower::new(job(), 0, None, false);
        let batch = (0..WATCH_BATCH as u64).map(|i| event(i, false)).collect();
        let (sent, more) = events(&mut follower, batch);
        assert_eq!((sent.len(), more), (WATCH_BATCH, true));
        let offset = WATCH_BATCH as u64;
        let (sent, more) = events(
            &mut follower,
            vec![event(offset, true), event(offset + 1, false)],
        );
        assert_eq!(sent.len(), 1, "nothing after the final event");
        assert!(sent[0].r#final && !more);
    }

    #[test]
    fn an_empty_read_asks_the_job_only_on_the_first_read_and_after_a_poll() {
        let mut follower = Follower::new(job(), 0, None, false);
        assert!(follower.asks_status(&[]));
        assert!(!follower.asks_status(&[event(0, false)]));
        follower.on_woken();
        assert!(
            !follower.asks_status(&[]),
            "a wake-up comes from a live job"
        );
        follower.on_poll();
        assert!(follower.asks_status(&[]));
    }

    #[test]
    fn a_running_job_with_nothing_new_is_waited_for() {
        let mut follower = Follower::new(job(), 2, None, false);
        match follower.on_read(status(Some(JobStatus::Running)), Instant::now()) {
            Next::Send { events, more } => assert!(events.is_empty() && !more),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_gone_job_ends_the_stream() {
        let mut follower = Follower::new(job(), 0, None, false);
        let next = follower.on_read(status(None), Instant::now());
        assert!(matches!(next, Next::End), "{next:?}");
    }

    #[test]
    fn a_finished_job_is_read_once_more_then_its_final_event_closes_the_stream() {
        let mut follower = Follower::new(job(), 9, Some("t".into()), false);
        let done = || status(Some(JobStatus::Succeeded));
        assert!(matches!(
            follower.on_read(done(), Instant::now()),
            Next::ReadAgain
        ));
        assert!(matches!(
            follower.on_read(done(), Instant::now()),
            Next::Finish
        ));
        assert!(
            follower.last(event(4, false)).is_none(),
            "not a final event"
        );
        let last = follower.last(event(7, true)).expect("the final event");
        assert_eq!((last.offset, last.trace_id.as_str()), (7, "t"));
        assert!(last.r#final);
    }

    #[test]
    fn the_job_store_failing_is_ridden_out_for_the_outage_bound() {
        let mut follower = Follower::new(job(), 0, None, false);
        let start = Instant::now();
        assert!(matches!(
            follower.on_read(redis_down(), start),
            Next::RetryAfter(RETRY_PAUSE)
        ));
        let later = start + WATCH_OUTAGE;
        assert!(matches!(
            follower.on_read(redis_down(), later),
            Next::RetryAfter(_)
        ));
        // A success in between starts the count again.
        events(&mut follower, vec![]);
        let much_later = later + WATCH_OUTAGE + Duration::from_secs(1);
        assert!(matches!(
            follower.on_read(redis_down(), much_later),
            Next::RetryAfter(_)
        ));
        match follower.on_read(
            redis_down(),
            much_later + WATCH_OUTAGE + Duration::from_millis(1),
        ) {
            Next::Fail(status) => {
                assert_eq!(status.code(), tonic::Code::Unavailable);
                assert!(
                    !status.message().contains("down"),
                    "no detail to the client"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    fn delta(turn: u32, epoch: u64, seq: u64, piece: DeltaPiece) -> TurnDelta {
        TurnDelta {
            turn,
            epoch,
            seq,
            piece,
        }
    }

    fn data(event: &v1::JobEvent) -> serde_json::Value {
        assert_eq!(event.kind, MODEL_OUTPUT_DELTA);
        serde_json::from_str(&event.data).unwrap()
    }

    fn text(t: &str) -> DeltaPiece {
        DeltaPiece::Text(t.into())
    }

    #[test]
    fn deltas_pass_until_their_turn_is_sent_and_a_restart_says_so() {
        let mut follower = Follower::new(job(), 0, None, true);
        let sent = |follower: &mut Follower, delta| follower.on_delta(delta).0;
        let first = sent(&mut follower, delta(0, 1, 0, text("Hel"))).unwrap();
        assert_eq!(data(&first), serde_json::json!({"turn": 0, "text": "Hel"}));
        assert_eq!(first.offset, 0, "the next stored event's offset");
        assert!(!first.r#final);
        // A delta heard twice (locally and over the bus) is sent once.
        assert!(sent(&mut follower, delta(0, 1, 0, text("Hel"))).is_none());
        // The provider asked again.
        let restart = sent(&mut follower, delta(0, 1, 1, DeltaPiece::Restart)).unwrap();
        assert_eq!(data(&restart)["restarted"], true);
        // Another run took the job over and streams the turn again; the
        // old run's late deltas are dropped.
        let again = sent(&mut follower, delta(0, 2, 0, text("Hello"))).unwrap();
        assert_eq!(data(&again)["restarted"], true);
        assert!(sent(&mut follower, delta(0, 1, 2, text("late"))).is_none());
        let call = DeltaPiece::ToolCall {
            index: 0,
            name: "calculate".into(),
        };
        let named = sent(&mut follower, delta(0, 2, 1, call)).unwrap();
        assert_eq!(data(&named)["tool_call"]["name"], "calculate");
        // The turn's checkpoint is sent: its deltas are stale from then on.
        let mut turn = event(0, false);
        turn.data = r#"{"turn":0}"#.into();
        let (sent_events, _) = events(&mut follower, vec![turn]);
        assert_eq!(sent_events.len(), 1);
        assert!(sent(&mut follower, delta(0, 2, 2, text("stale"))).is_none());
        let next = sent(&mut follower, delta(1, 2, 0, text("Next"))).unwrap();
        assert_eq!(data(&next)["turn"], 1);
        assert_eq!(next.offset, 1);
    }

    /// A job that does not stream has no deltas: one that comes anyway
    /// (a message on its subject that says it is one) is dropped, asks for
    /// nothing, and its turns are sent as ever.
    #[test]
    fn a_watch_of_a_job_that_does_not_stream_drops_deltas() {
        let mut follower = Follower::new(job(), 0, None, false);
        assert_eq!(follower.on_delta(delta(0, 1, 0, text("Hi"))), (None, false));
        assert_eq!(follower.on_delta(delta(0, 1, 3, text("x"))), (None, false));
        let mut turn = event(0, false);
        turn.data = r#"{"turn":0}"#.into();
        let (sent, _) = events(&mut follower, vec![turn]);
        assert_eq!(sent.len(), 1);
        assert_eq!(
            follower.turn_sent, None,
            "not read: nothing to compare it to"
        );
    }

    #[test]
    fn a_watch_that_joins_mid_turn_asks_once_and_sends_the_turn_so_far_first() {
        let mut follower = Follower::new(job(), 3, None, true);
        // Deltas 0 to 4 were sent before this watch: 5 asks, 6 does not.
        assert_eq!(follower.on_delta(delta(2, 1, 5, text("x"))), (None, true));
        assert_eq!(follower.on_delta(delta(2, 1, 6, text("y"))), (None, false));
        let so_far = DeltaPiece::SoFar {
            text: "Hello wor".into(),
            tool_calls: vec!["calculate".into()],
        };
        // The answer covers the deltas before 7.
        let (joined, ask) = follower.on_delta(delta(2, 1, 7, so_far));
        assert!(!ask);
        let joined = data(&joined.unwrap());
        assert_eq!(joined["text"], "Hello wor");
        assert_eq!(joined["so_far"], true);
        assert_eq!(joined["tool_calls"], serde_json::json!(["calculate"]));
        // What it covers is not sent again; what follows is.
        assert!(follower.on_delta(delta(2, 1, 6, text("y"))).0.is_none());
        let live = follower.on_delta(delta(2, 1, 7, text("ld"))).0.unwrap();
        assert_eq!(data(&live)["text"], "ld");
        // A second answer (another watcher asked too) changes nothing.
        let again = DeltaPiece::SoFar {
            text: "Hello world".into(),
            tool_calls: vec![],
        };
        assert!(follower.on_delta(delta(2, 1, 8, again)).0.is_none());
    }
}
