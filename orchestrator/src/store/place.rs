//! Where the sweeper finds an unfinished job: in the index of unfinished
//! jobs (re-queued once no runner has held it for `runner.sweep_after`) or
//! in that of parked jobs (woken when its first held call expires).
//!
//! The job's own record says which, by its status, and counts each change
//! of it (`moves`), in the same script as the change. The indexes live in
//! another hash slot (decision 0022), so they follow in a step of their
//! own, and two processes' steps may land in any order: a runner's park
//! and a person's decision, one of them late, or dead half way. So every
//! move is stamped with the count it follows ([`Stamp`]), the shard keeps
//! the last stamp it applied per job, and a move older than that is
//! dropped: the indexes end where the job's latest change put them,
//! whatever order the moves land in. A move made ahead of a change
//! ([`Stamp::ahead_of`]) ranks between the count before the change and the
//! one after, so a late move of the job's previous change cannot undo it,
//! and the change's own move can (decision 0036).

use std::sync::LazyLock;

use redis::Script;

use crate::job::now_ms;

use super::scripts::script;
use super::*;

/// Where a job is found by the sweeper.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// In the index of unfinished jobs, scored now: re-queued if no runner
    /// holds it `runner.sweep_after` from now.
    Unfinished,
    /// In the index of parked jobs, woken at `wake_at_ms`, and not in the
    /// unfinished one.
    Parked {
        /// When the sweeper wakes it (Unix ms): its first held call's expiry.
        wake_at_ms: u64,
    },
    /// In the index of unfinished jobs, scored now, and left in the parked
    /// one: where a parked job waits for a change that may queue it again
    /// (a decision), so that whether the change is made or not, and however
    /// far its maker got, the sweeper finds it.
    Both,
}

/// The change of a job's place a move follows: its record's `moves` count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Stamp {
    /// The job's `moves` count.
    moves: u64,
    /// Made ahead of the change that will count `moves + 1`.
    ahead: bool,
}

impl Stamp {
    /// The move that follows the change that made the job's count `moves`.
    pub fn after(moves: u64) -> Self {
        Self {
            moves,
            ahead: false,
        }
    }

    /// A move made before a change of a job whose count is `moves` now: it
    /// wins over every move of that count, and loses to the change's own.
    pub(crate) fn ahead_of(moves: u64) -> Self {
        Self { moves, ahead: true }
    }

    /// As the shard keeps it: moves are ranked in the order of the job's
    /// changes, a move ahead of a change just before the change's own.
    fn rank(self) -> u64 {
        self.moves
            .saturating_mul(2)
            .saturating_add(u64::from(self.ahead))
    }
}

/// The steps of the store's verbs that change a job's place, one script
/// on one hash slot each, in the order the verbs run them
/// ([`JobStore::park`], [`JobStore::decide`], [`JobStore::wake`]). A verb
/// is these steps and nothing else; they are public so that tests can
/// interleave two processes' steps, or stop one half way as a crash would.
#[derive(Clone, Copy)]
pub struct Steps<'a>(&'a JobStore);

impl JobStore {
    /// The steps of the verbs that change a job's place.
    pub fn steps(&self) -> Steps<'_> {
        Steps(self)
    }
}

impl<'a> Steps<'a> {
    pub(super) fn store(self) -> &'a JobStore {
        self.0
    }

    /// Moves `job_id` to `place`, unless the shard already applied a move
    /// stamped `stamp` or later (`Ok(false)`: nothing written). Safe to run
    /// twice.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn place(self, job_id: &JobId, stamp: Stamp, place: Place) -> Result<bool, Error> {
        let (name, score) = match place {
            Place::Unfinished => ("unfinished", now_ms()),
            Place::Parked { wake_at_ms } => ("parked", wake_at_ms),
            Place::Both => ("both", now_ms()),
        };
        let keys = &self.0.keys;
        let applied: i64 = PLACE
            .key(keys.unfinished_jobs(job_id))
            .key(keys.parked_jobs(job_id))
            .key(keys.index_moves(job_id))
            .arg(job_id.as_str())
            .arg(stamp.rank())
            .arg(name)
            .arg(score)
            .invoke_async(&mut self.0.conn())
            .await?;
        Ok(applied == 1)
    }
}

impl JobStore {
    /// Drops an ended job from the sweeper's indexes. Best effort: a job
    /// left there by a failure (or put back by a late move) is dropped by
    /// the sweeper once it sees it ended.
    pub async fn forget_place(&self, job_id: &JobId) {
        let mut forget = redis::pipe();
        forget
            .cmd("ZREM")
            .arg(self.keys.unfinished_jobs(job_id))
            .arg(job_id.as_str())
            .ignore()
            .cmd("ZREM")
            .arg(self.keys.parked_jobs(job_id))
            .arg(job_id.as_str())
            .ignore()
            .cmd("HDEL")
            .arg(self.keys.index_moves(job_id))
            .arg(job_id.as_str())
            .ignore();
        let forgotten: redis::RedisResult<()> = forget.query_async(&mut self.conn()).await;
        if let Err(err) = forgotten {
            tracing::debug!(%job_id, error = %err, "could not drop a job from the sweeper's indexes");
        }
    }
}

/// KEYS: the job's shard of the unfinished index, of the parked index, and
/// its shard's moves. ARGV: job id, the move's rank, `unfinished`, `parked`
/// or `both`, the score. Returns 1 if moved, 0 if a move of this rank or a
/// later one was applied before.
static PLACE: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
local seen = tonumber(redis.call('HGET', KEYS[3], ARGV[1]))
if seen and seen >= tonumber(ARGV[2]) then return 0 end
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
if ARGV[3] == 'parked' then
  redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1])
  redis.call('ZREM', KEYS[1], ARGV[1])
else
  redis.call('ZADD', KEYS[1], ARGV[4], ARGV[1])
  if ARGV[3] == 'unfinished' then redis.call('ZREM', KEYS[2], ARGV[1]) end
end
return 1
",
    )
});

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::scripts::tests::assert_filled;

    #[test]
    fn a_move_ahead_of_a_change_ranks_between_the_counts_around_it() {
        assert_filled("PLACE", &PLACE);
        let ranks = [
            Stamp::after(0),
            Stamp::ahead_of(0),
            Stamp::after(1),
            Stamp::ahead_of(1),
            Stamp::after(2),
        ]
        .map(Stamp::rank);
        assert!(ranks.windows(2).all(|pair| pair[0] < pair[1]), "{ranks:?}");
        assert_eq!(Stamp::ahead_of(u64::MAX).rank(), u64::MAX, "saturates");
    }
}
