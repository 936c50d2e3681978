//! Parking a job whose round waits only for people, and queueing it again
//! (decision 0036). A parked job's status is `waiting_for_approval`; a
//! change that makes it runnable again (a decision, [`JobStore::decide`],
//! or its first held call's expiry, [`JobStore::wake`]) marks it
//! `requeued` in the same script, until a runner takes it (the lease
//! script clears the mark) or it parks again. Each of these changes counts
//! in the job's `moves`, which fences its place in the sweeper's indexes
//! ([`Stamp`](super::Stamp)).

use std::sync::LazyLock;

use redis::Script;

use crate::job::{JobEvent, JobStatus, Lease, now_ms};

use super::counts::Change;
use super::place::{Place, Stamp, Steps};
use super::scripts::script;
use super::*;
use crate::live::Written;

/// What [`JobStore::park`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parked {
    /// The job waits, held by no runner.
    Parked,
    /// A call it would wait for was decided meanwhile: run on, and
    /// dispatch it.
    Decided,
    /// A client asked to cancel the job: end it instead.
    CancelRequested,
}

/// What [`JobStore::wake`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// The job waits for a runner (it was parked, or a decision queued
    /// it): it is in the unfinished index; queue it.
    Queued,
    /// A runner holds the job: it is in the unfinished index, and nothing
    /// is to be queued.
    Running,
    /// The job ended, or is gone: it left the sweeper's indexes.
    Ended,
}

/// What the park's script did ([`Steps::write_park`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParkWrite {
    /// Parked: its event count and its count of moves after the park.
    Parked {
        /// The job's event count after its parking event.
        events: u64,
        /// The job's count of moves with this park.
        moves: u64,
    },
    /// Nothing written, as [`Parked`] says.
    Not(Parked),
}

impl JobStore {
    /// Parks the job under `lease` until a person decides one of the held
    /// calls `waiting` (hold keys, with the ids events show them by), or
    /// `wake_at_ms`: its status `waiting_for_approval`, its
    /// `job_waiting_for_approval` event, the lease dropped; then it is
    /// counted waiting, and moves to the index of parked jobs. Unless one of
    /// them was decided meanwhile ([`Parked::Decided`]): nothing is
    /// written, and the run goes on, so that no decision waits for another.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] when another runner took the job; [`Error::Redis`].
    pub async fn park(
        &self,
        lease: &Lease,
        waiting: &[(&str, &str)],
        wake_at_ms: u64,
    ) -> Result<Parked, Error> {
        let steps = self.steps();
        let (events, moves) = match steps.write_park(lease, waiting).await? {
            ParkWrite::Parked { events, moves } => (events, moves),
            ParkWrite::Not(parked) => return Ok(parked),
        };
        self.notify(&lease.job_id, Written::counted(Some(events)))
            .await;
        // Counted before it moves: a crash (or a failed count) before the
        // move leaves the job in the unfinished index, where the sweeper
        // counts it and queues it, and a runner parks it again.
        let waiting = Change::Live {
            status: JobStatus::WaitingForApproval,
            events,
        };
        self.count(&lease.job_id, lease.submitter.as_deref(), waiting)
            .await?;
        steps
            .place(
                &lease.job_id,
                Stamp::after(moves),
                Place::Parked { wake_at_ms },
            )
            .await?;
        Ok(Parked::Parked)
    }

    /// Marks the parked job `job_id` requeued (its first held call
    /// expired: a runner answers it) and moves it to the unfinished index;
    /// a job a decision queued is moved there too, should its decider have
    /// died before it moved it. The caller queues a [`Wake::Queued`] job.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn wake(&self, job_id: &JobId) -> Result<Wake, Error> {
        let steps = self.steps();
        let (wake, moves) = steps.write_wake(job_id).await?;
        if wake == Wake::Ended {
            self.forget_place(job_id).await;
            return Ok(wake);
        }
        steps
            .place(job_id, Stamp::after(moves), Place::Unfinished)
            .await?;
        Ok(wake)
    }

    /// Parked jobs whose wake time has passed (at most `limit`), for the
    /// sweeper to wake: their first held call expired.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub(crate) async fn parked_due(&self, now: u64, limit: usize) -> Result<Vec<JobId>, Error> {
        let mut due = Vec::new();
        for shard in self.keys.parked_shards() {
            let found: Vec<String> = redis::cmd("ZRANGEBYSCORE")
                .arg(shard)
                .arg(0)
                .arg(now)
                .arg("LIMIT")
                .arg(0)
                .arg(limit)
                .query_async(&mut self.conn())
                .await?;
            due.extend(found.iter().filter_map(|id| JobId::parse(id)));
            if due.len() >= limit {
                break;
            }
        }
        due.truncate(limit);
        Ok(due)
    }
}

impl Steps<'_> {
    /// The park's script alone, as [`JobStore::park`] runs it.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] when another runner took the job; [`Error::Redis`].
    pub async fn write_park(
        self,
        lease: &Lease,
        waiting: &[(&str, &str)],
    ) -> Result<ParkWrite, Error> {
        let (store, job_id) = (self.store(), &lease.job_id);
        let event = JobEvent::JobWaitingForApproval {
            calls: waiting
                .iter()
                .map(|(_, call_id)| (*call_id).to_owned())
                .collect(),
        };
        let mut invocation = PARK.prepare_invoke();
        invocation
            .key(store.keys.job(job_id))
            .key(store.keys.job_lease(job_id))
            .key(store.keys.job_approvals(job_id))
            .key(store.keys.job_events(job_id))
            .arg(&lease.token)
            .arg(now_ms())
            .arg(event.kind())
            .arg(event.data_json())
            .arg(waiting.len());
        for (key, _) in waiting {
            invocation.arg(super::approvals::decided_field(key));
        }
        let answer: Vec<i64> = invocation.invoke_async(&mut store.conn()).await?;
        let count = |n: i64| u64::try_from(n).unwrap_or_default();
        Ok(match answer[..] {
            [LEASE_LOST] => return Err(Error::LeaseLost(job_id.clone())),
            [CANCEL_REQUESTED] => ParkWrite::Not(Parked::CancelRequested),
            [events, moves] => ParkWrite::Parked {
                events: count(events),
                moves: count(moves),
            },
            _ => ParkWrite::Not(Parked::Decided),
        })
    }

    /// The wake's script alone, as [`JobStore::wake`] runs it: what it
    /// found, and the job's count of moves.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub(crate) async fn write_wake(self, job_id: &JobId) -> Result<(Wake, u64), Error> {
        let store = self.store();
        let (found, moves): (String, u64) = WAKE
            .key(store.keys.job(job_id))
            .key(store.keys.job_lease(job_id))
            .invoke_async(&mut store.conn())
            .await?;
        let wake = match found.as_str() {
            "queued" => Wake::Queued,
            "running" => Wake::Running,
            _ => Wake::Ended,
        };
        Ok((wake, moves))
    }
}

/// What [`PARK`] returns when the lease is not held (or the job ended).
const LEASE_LOST: i64 = -1;
/// What [`PARK`] returns when a client asked to cancel the job.
const CANCEL_REQUESTED: i64 = -3;

/// KEYS: job, lease, approvals, events. ARGV: token, now_ms, event kind,
/// event data, n, the decision fields of the n calls the job waits for.
/// Returns `{-1}` (lease lost, or the job ended), `{-3}` (a cancel was
/// asked: the run ends the job), `{0}` (a call was decided: nothing
/// written), or `{events, moves}`: the job's event count after its
/// parking event, and its count of moves with this one.
static PARK: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return {-1} end
local status = redis.call('HGET', KEYS[1], 'status')
if $ENDED then return {-1} end
if redis.call('HGET', KEYS[1], 'cancel_requested') == '1' then return {-3} end
for k = 1, tonumber(ARGV[5]) do
  if redis.call('HEXISTS', KEYS[3], ARGV[5 + k]) == 1 then return {0} end
end
redis.call('HSET', KEYS[1], 'status', '$WAITING', 'parked_at_ms', ARGV[2])
redis.call('HDEL', KEYS[1], 'requeued')
local moves = redis.call('HINCRBY', KEYS[1], 'moves', 1)
local events = redis.call('HINCRBY', KEYS[1], 'events', 1)
redis.call('XADD', KEYS[4], '0-' .. events, 'kind', ARGV[3], 'data', ARGV[4], 'ts', ARGV[2], 'final', '0')
redis.call('DEL', KEYS[2])
return {events, moves}
",
    )
});

/// KEYS: job, lease. Marks a parked job nobody holds requeued. Returns
/// `{found, moves}`: `queued` (it waits for a runner: parked, now
/// requeued, or requeued before), `running` (a runner holds it) or `ended`
/// (ended or missing), and the job's count of moves.
static WAKE: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {'ended', 0} end
if $ENDED then return {'ended', 0} end
local moves = tonumber(redis.call('HGET', KEYS[1], 'moves')) or 0
if redis.call('EXISTS', KEYS[2]) == 1 then return {'running', moves} end
if status == '$WAITING' and not redis.call('HGET', KEYS[1], 'requeued') then
  redis.call('HSET', KEYS[1], 'requeued', '1')
  moves = redis.call('HINCRBY', KEYS[1], 'moves', 1)
end
return {'queued', moves}
",
    )
});

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::scripts::tests::{assert_ended_reads_status, assert_filled};

    #[test]
    fn the_parking_scripts_are_filled_and_never_write_an_ended_job() {
        for (name, script) in [("PARK", &*PARK), ("WAKE", &*WAKE)] {
            let shown = assert_filled(name, script);
            assert_ended_reads_status(name, &shown);
        }
    }
}
