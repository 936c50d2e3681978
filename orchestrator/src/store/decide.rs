//! A person's decision on a held call (decision 0036): written once,
//! whoever races for it, and, for a parked job, with the job's return to
//! the queue in the same script. The job's move between the sweeper's
//! indexes (another hash slot) is made in fenced steps around it, in an
//! order that leaves the job where the sweeper finds it wherever they stop
//! ([`Stamp`](super::Stamp)): into the unfinished index first, then the
//! decision, then out of the parked index. [`Decide`] is a decision in
//! progress, one step at a time; [`JobStore::decide`] takes every step.

use std::sync::LazyLock;

use redis::Script;

use crate::job::{JobRecord, JobStatus, now_ms};

use super::approvals::{ApprovalRequest, decided_field, expires_field};
use super::place::{Place, Stamp};
use super::scripts::script;
use super::*;
use crate::hold::{Decision, Hold};
use crate::live::Written;

/// What a decision did.
#[derive(Debug, Clone, PartialEq)]
pub enum Decided {
    /// The decision is recorded. `requeued`: the job was parked, and this
    /// decision queued it again: publish it for a runner.
    Recorded {
        /// This decision queued the parked job again.
        requeued: bool,
    },
    /// The call was decided before: this decision changed nothing.
    Already {
        /// The first decision.
        first: Decision,
        /// A decision queued the parked job again and no runner has taken
        /// it yet: it is in the unfinished index, and a retry of that
        /// decision publishes it again.
        requeued: bool,
    },
    /// The job has no held call with that id (never held, or not a call).
    NotHeld,
    /// The call's approval expired before the decision.
    Expired,
    /// The job has ended (or does not exist).
    Ended,
    /// The job parked again each time the decision was tried: nothing was
    /// written. Try again.
    Busy,
}

/// What the decider saw of the job before deciding: whether it was
/// parked (and not queued again yet), and its count of moves
/// ([`Stamp`](super::Stamp)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    /// Parked, and not queued again yet.
    pub parked: bool,
    /// Its count of moves.
    pub moves: u64,
}

impl Seen {
    /// As `record` shows it.
    pub fn of(record: &JobRecord) -> Self {
        Self {
            parked: record.status == JobStatus::WaitingForApproval && !record.requeued,
            moves: record.moves,
        }
    }
}

/// Where a decision in progress is: the step it takes next.
#[derive(Debug, Clone, PartialEq)]
pub enum DecideStep {
    /// The decider read the job. Next: the move ahead of the decision if
    /// the job was parked, else the decision.
    Seen(Seen),
    /// The job is in the unfinished index. Next: the decision.
    Ahead(Seen),
    /// The job was queued again with this count of moves (by this
    /// decision, or by the first one, when this one found it written).
    /// Next: its move out of the parked index.
    Requeued {
        /// Its count of moves.
        moves: u64,
        /// What the decision did.
        decided: Decided,
    },
    /// Done.
    Done(Decided),
}

/// A decision in progress, one step at a time: [`JobStore::decide`] takes
/// every step; a test may stop between two, as a crash would.
#[derive(Debug, Clone)]
pub struct Decide {
    job_id: JobId,
    hold: Hold,
    held: ApprovalRequest,
    decision: Decision,
    /// Tries left for a job that parks again in between.
    tries: usize,
    at: DecideStep,
}

impl Decide {
    /// `decision` on the call `held`, under its `hold` in
    /// `job_id`, which the decider saw as `seen`.
    pub fn new(
        job_id: &JobId,
        hold: &Hold,
        held: &ApprovalRequest,
        decision: &Decision,
        seen: Seen,
    ) -> Self {
        Self {
            job_id: job_id.clone(),
            hold: hold.clone(),
            held: held.clone(),
            decision: decision.clone(),
            tries: DECISION_TRIES,
            at: DecideStep::Seen(seen),
        }
    }

    /// Where it is.
    pub fn at(&self) -> &DecideStep {
        &self.at
    }

    /// What it did, once done.
    pub fn done(&self) -> Option<&Decided> {
        match &self.at {
            DecideStep::Done(decided) => Some(decided),
            _ => None,
        }
    }

    /// Takes the next step in `store`.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`]: the step may or may not have been taken; so may
    /// the next try of it, safely.
    pub async fn step(&mut self, store: &JobStore) -> Result<(), Error> {
        let steps = store.steps();
        let job_id = &self.job_id;
        self.at = match self.at.clone() {
            DecideStep::Seen(seen) if seen.parked => {
                // Ahead of the decision, so that whether it is written or
                // not, and however far its decider gets, the sweeper finds
                // the job.
                steps
                    .place(job_id, Stamp::ahead_of(seen.moves), Place::Both)
                    .await?;
                DecideStep::Ahead(seen)
            }
            DecideStep::Seen(seen) | DecideStep::Ahead(seen) => self.write(store, seen).await?,
            DecideStep::Requeued { moves, decided } => {
                steps
                    .place(job_id, Stamp::after(moves), Place::Unfinished)
                    .await?;
                DecideStep::Done(decided)
            }
            done @ DecideStep::Done(_) => done,
        };
        Ok(())
    }

    /// The decision's script, for a job seen as `seen`.
    async fn write(&mut self, store: &JobStore, seen: Seen) -> Result<DecideStep, Error> {
        let (job_id, held) = (&self.job_id, &self.held);
        let event = self.decision.event(&held.call_id);
        let json = serde_json::to_string(&self.decision).expect("a decision serializes");
        let field = self.hold.field();
        let answer: Vec<String> = DECIDE
            .key(store.keys.job(job_id))
            .key(store.keys.job_approvals(job_id))
            .key(store.keys.job_events(job_id))
            .arg(&field)
            .arg(expires_field(&field))
            .arg(decided_field(&field))
            .arg(now_ms())
            .arg(json)
            .arg(event.kind())
            .arg(event.data_json())
            .arg(seen.moves)
            .invoke_async(&mut store.conn())
            .await?;
        let text = |at: usize| answer.get(at).map_or("", String::as_str);
        let number = |at: usize| text(at).parse::<u64>().ok();
        let then = |requeued: Option<u64>, decided: Decided| match requeued {
            Some(moves) => DecideStep::Requeued { moves, decided },
            None => DecideStep::Done(decided),
        };
        Ok(match text(0) {
            "recorded" => {
                store.notify(job_id, Written::counted(number(1))).await;
                store.forget_pending(job_id, &[held]).await;
                let requeued = (text(3) == "1").then(|| number(2).unwrap_or_default());
                then(
                    requeued,
                    Decided::Recorded {
                        requeued: requeued.is_some(),
                    },
                )
            }
            "moved" if self.tries > 1 => {
                self.tries -= 1;
                DecideStep::Seen(Seen {
                    parked: true,
                    moves: number(1).unwrap_or_default(),
                })
            }
            "moved" => DecideStep::Done(Decided::Busy),
            "decided" => match serde_json::from_str(text(1)) {
                // A decider that died before it moved the job: its retry
                // moves it.
                Ok(first) => then(
                    number(2),
                    Decided::Already {
                        first,
                        requeued: number(2).is_some(),
                    },
                ),
                Err(_) => DecideStep::Done(Decided::NotHeld),
            },
            "expired" => DecideStep::Done(Decided::Expired),
            "not_held" => DecideStep::Done(Decided::NotHeld),
            _ => DecideStep::Done(Decided::Ended),
        })
    }
}

impl JobStore {
    /// Records `decision` on the call `held` under its `hold` in
    /// `job_id`, if it is held, undecided and not expired; the call leaves
    /// its tenant's pending index. A parked job is queued again in the
    /// same script, and moved to the unfinished index ([`Decide`]); the
    /// caller publishes it. `seen`: the job as the caller read it.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn decide(
        &self,
        job_id: &JobId,
        hold: &Hold,
        held: &ApprovalRequest,
        decision: &Decision,
        seen: Seen,
    ) -> Result<Decided, Error> {
        let mut deciding = Decide::new(job_id, hold, held, decision, seen);
        loop {
            if let Some(decided) = deciding.done() {
                return Ok(decided.clone());
            }
            deciding.step(self).await?;
        }
    }
}

/// How many times a decision is tried on a job that parks again in
/// between: each try needs a runner to take the job and park it, which
/// takes far longer than a try.
const DECISION_TRIES: usize = 8;

/// KEYS: job, approvals, events. ARGV: hold key, its expiry field, its
/// decision field, now_ms, the decision, event kind, event data, the
/// job's count of moves as the decider saw it. Writes the decision only on
/// a held, undecided, unexpired call of an unfinished job: of two racing
/// decisions exactly one is written, and the other is told the first, also
/// once the job has ended. A parked job is queued again with it
/// (`requeued`, one more move), if its count of moves is the decider's:
/// else the decider's move ahead of it may have been undone by the park's
/// own, and nothing is written (`{moved, <moves>}`: try again). Returns
/// `{recorded, <events>, <moves>, <1 if requeued>}`, `{decided, <the first
/// decision>, <moves while requeued, else empty>}`, `{expired}`,
/// `{not_held}` or `{ended}`.
static DECIDE: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {'ended'} end
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 0 then return {'not_held'} end
local moves = tonumber(redis.call('HGET', KEYS[1], 'moves')) or 0
local parked = status == '$WAITING'
local requeued = parked and redis.call('HGET', KEYS[1], 'requeued') == '1'
-- Before the end: a retry after the job ended is told the first decision.
local first = redis.call('HGET', KEYS[2], ARGV[3])
if first then
  if requeued then return {'decided', first, tostring(moves)} end
  return {'decided', first, ''}
end
if $ENDED then return {'ended'} end
local expires = tonumber(redis.call('HGET', KEYS[2], ARGV[2]))
if expires and expires <= tonumber(ARGV[4]) then return {'expired'} end
local requeue = '0'
if parked and not requeued then
  if moves ~= tonumber(ARGV[8]) then return {'moved', tostring(moves)} end
  redis.call('HSET', KEYS[1], 'requeued', '1')
  moves = redis.call('HINCRBY', KEYS[1], 'moves', 1)
  requeue = '1'
end
redis.call('HSET', KEYS[2], ARGV[3], ARGV[5])
local events = redis.call('HINCRBY', KEYS[1], 'events', 1)
redis.call('XADD', KEYS[3], '0-' .. events, 'kind', ARGV[6], 'data', ARGV[7], 'ts', ARGV[4], 'final', '0')
return {'recorded', tostring(events), tostring(moves), requeue}
",
    )
});

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::scripts::tests::{assert_ended_reads_status, assert_filled};

    #[test]
    fn the_decision_script_is_filled_and_never_writes_an_ended_job() {
        let shown = assert_filled("DECIDE", &DECIDE);
        assert_ended_reads_status("DECIDE", &shown);
    }
}
