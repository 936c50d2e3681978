//! How many of a tenant's jobs are in each status, and how many of each
//! of its submitters' (decision 0051): what `ListJobs` answers with
//! `with_counts`, in one round trip that reads no job.
//!
//! Per tenant, under its hash tag (names in `RedisKeys`):
//! - `tf:jobs:{<tenant>}:live`: the status each unfinished job is counted
//!   in, stamped with the job's event count at the change, and its
//!   submitter's digest;
//! - `tf:jobs:{<tenant>}:counts`: their sums, by status and by submitter
//!   and status;
//! - `tf:jobs:{<tenant>}:ended:<status>` (and `…:<digest>:ended:<status>`
//!   per submitter): each finished job, scored by when its keys expire, so
//!   that those scored after now are exactly the ones stored.
//!
//! A job's status changes in a script on its own hash tag; its count
//! follows in a step of its own ([`JobStore::count`]), taken right after by
//! whoever made the change: submitting, taking the lease, parking, ending
//! (a run's end, a cancel, a lost job). The step is one script, stamped:
//! a live change counts only over an older one, and an end wins over
//! every live change, so a late or repeated step changes nothing. A job
//! leaves the sweeper's unfinished index only once its end is counted
//! ([`JobStore::count_end`]), and a parked job its place there only once
//! its park is, so a step lost to a crash leaves the job where the sweeper
//! looks, and the sweeper counts it again from its record
//! ([`JobStore::recount`]).
//!
//! A job id from before tenants is counted for no tenant.

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;
use toolfleet_proto::names::submitter_digest;

use crate::job::{JobRecord, JobStatus, now_ms};

use super::index::JobIndex;
use super::scripts::script;
use super::*;

/// A job's status as its tenant's counts take it ([`JobStore::count`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Queued, running or waiting for approval since the job's `events`-th
    /// event: a change stamped no later than the one counted is late, and
    /// changes nothing.
    Live {
        /// The status.
        status: JobStatus,
        /// The job's event count just after the change.
        events: u64,
    },
    /// Ended in `status`: counted until `expires_at_ms` (Unix ms), when
    /// its keys expire. It wins over every live change, and the first end
    /// counted is the job's.
    Ended {
        /// A final status.
        status: JobStatus,
        /// When the job's keys expire.
        expires_at_ms: u64,
    },
    /// Gone from Redis (expired, or lost): counted no more.
    Gone,
}

impl Change {
    /// The change `record` says the job's status is at, for a store that
    /// keeps finished jobs for `retention`.
    pub fn of(record: &JobRecord, retention: Duration) -> Self {
        Self::at(
            Stored {
                status: record.status,
                events: record.events,
                finished_at_ms: record.finished_at_ms,
            },
            millis(retention),
            now_ms(),
        )
    }

    /// The change a job `stored` so is at, `now`, kept `retention_ms` after
    /// its end.
    fn at(stored: Stored, retention_ms: u64, now: u64) -> Self {
        if !stored.status.is_final() {
            return Self::Live {
                status: stored.status,
                events: stored.events,
            };
        }
        // A record that says nothing of when it ended (a foreign writer's)
        // is kept from now on.
        let ended = match stored.finished_at_ms {
            0 => now,
            at => at,
        };
        Self::Ended {
            status: stored.status,
            expires_at_ms: ended.saturating_add(retention_ms),
        }
    }
}

/// What [`Change::of`] reads of a job's record.
#[derive(Debug, Clone, Copy)]
struct Stored {
    status: JobStatus,
    events: u64,
    finished_at_ms: u64,
}

/// How many jobs are in each status ([`JobStore::counts`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobCounts {
    /// Every status, in [`JobStatus::ALL`]'s order, with its jobs.
    pub by_status: Vec<(JobStatus, u64)>,
}

impl JobCounts {
    /// No job in any status.
    pub fn none() -> Self {
        Self {
            by_status: JobStatus::ALL.into_iter().map(|s| (s, 0)).collect(),
        }
    }

    /// The jobs in `status`.
    pub fn of(&self, status: JobStatus) -> u64 {
        self.by_status
            .iter()
            .find_map(|(s, n)| (*s == status).then_some(*n))
            .unwrap_or_default()
    }
}

/// The final statuses, in the order [`COUNT`] takes their sets.
const ENDED: [JobStatus; 3] = [
    JobStatus::Succeeded,
    JobStatus::Failed,
    JobStatus::Cancelled,
];

/// The statuses of an unfinished job, in [`JobStatus::ALL`]'s order.
const LIVE: [JobStatus; 3] = [
    JobStatus::Queued,
    JobStatus::Running,
    JobStatus::WaitingForApproval,
];

impl JobStore {
    /// Counts `change` of the job `job_id`, which `submitter` submitted,
    /// for its tenant (and its submitter): one script on the tenant's hash
    /// tag, safe to run twice and in any order with the job's other
    /// changes. Returns whether a count changed (`false`: a late or
    /// repeated change, or a job id from before tenants).
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn count(
        &self,
        job_id: &JobId,
        submitter: Option<&str>,
        change: Change,
    ) -> Result<bool, Error> {
        let Some(invocation) = self.counting(job_id, submitter, change) else {
            return Ok(false);
        };
        let counted: i64 = invocation.invoke_async(&mut self.conn()).await?;
        Ok(counted == 1)
    }

    /// Counts the job as its stored `record` says (the sweeper's repair of
    /// a count step that was lost).
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn recount(&self, record: &JobRecord) -> Result<bool, Error> {
        let change = Change::of(record, self.retention);
        self.count(&record.job_id, record.spec.submitter.as_deref(), change)
            .await
    }

    /// Counts the end of the job `job_id` in `status`, then drops it from
    /// the sweeper's indexes: a count that failed leaves it there, where
    /// the sweeper counts it again ([`recount`](Self::recount)) before it
    /// drops it.
    pub(super) async fn count_end(
        &self,
        job_id: &JobId,
        submitter: Option<&str>,
        status: JobStatus,
    ) {
        let change = Change::Ended {
            status,
            expires_at_ms: now_ms().saturating_add(millis(self.retention)),
        };
        match self.count(job_id, submitter, change).await {
            Ok(_) => self.forget_place(job_id).await,
            Err(err) => {
                tracing::warn!(%job_id, error = %err, "could not count the job's end; the sweeper counts it");
            }
        }
    }

    /// The jobs of `index` in each status, now: its unfinished jobs as
    /// counted, and its finished jobs that have not expired.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`]. A count that does not read as a number (a
    /// foreign writer's) reads as 0.
    pub async fn counts(&self, index: JobIndex<'_>) -> Result<JobCounts, Error> {
        let (tenant, submitter) = match index {
            JobIndex::Tenant(tenant) => (tenant, None),
            JobIndex::Submitter { tenant, submitter } => (tenant, Some(submitter)),
        };
        let digest = submitter.map(submitter_digest);
        let fields: Vec<String> = LIVE
            .iter()
            .map(|status| count_field(digest.as_deref(), *status))
            .collect();
        let now = now_ms();
        let mut pipe = redis::pipe();
        pipe.cmd("HMGET")
            .arg(self.keys.tenant_job_counts(tenant))
            .arg(&fields);
        for status in ENDED {
            pipe.cmd("ZCOUNT")
                .arg(self.keys.ended_jobs(tenant, submitter, status))
                .arg(format!("({now}"))
                .arg("+inf");
        }
        let (live, succeeded, failed, cancelled): (Vec<Option<String>>, u64, u64, u64) =
            read_with_retry(|| async { pipe.query_async(&mut self.conn()).await }).await?;
        let live = live
            .into_iter()
            .map(|n| n.and_then(|n| n.parse::<u64>().ok()).unwrap_or_default());
        Ok(JobCounts {
            by_status: LIVE
                .into_iter()
                .zip(live)
                .chain(ENDED.into_iter().zip([succeeded, failed, cancelled]))
                .collect(),
        })
    }

    /// The invocation of [`COUNT`] that counts `change` of `job_id`; `None`
    /// for a job id that names no tenant.
    pub(super) fn counting(
        &self,
        job_id: &JobId,
        submitter: Option<&str>,
        change: Change,
    ) -> Option<redis::ScriptInvocation<'static>> {
        let tenant = job_id.tenant()?;
        let mut invocation = COUNT.prepare_invoke();
        invocation
            .key(self.keys.tenant_job_counts(tenant))
            .key(self.keys.tenant_live_jobs(tenant));
        for status in ENDED {
            invocation.key(self.keys.ended_jobs(tenant, None, status));
        }
        if let Some(submitter) = submitter {
            for status in ENDED {
                invocation.key(self.keys.ended_jobs(tenant, Some(submitter), status));
            }
        }
        let (kind, status, stamp) = match change {
            Change::Live { status, events } => ("live", status.as_str().to_owned(), events),
            Change::Ended {
                status,
                expires_at_ms,
            } => {
                let Some(set) = ENDED.iter().position(|s| *s == status) else {
                    tracing::error!(%job_id, %status, "an end in a status that is not final");
                    debug_assert!(false, "an end in {status}");
                    return None;
                };
                ("ended", (set + 1).to_string(), expires_at_ms)
            }
            Change::Gone => ("gone", String::new(), 0),
        };
        invocation
            .arg(job_id.as_str())
            .arg(kind)
            .arg(status)
            .arg(stamp)
            .arg(submitter.map(submitter_digest).unwrap_or_default())
            .arg(now_ms());
        Some(invocation)
    }
}

/// The field of the counts hash that counts `status`: the tenant's, or
/// the submitter's whose digest is `digest`, as [`COUNT`] spells it.
fn count_field(digest: Option<&str>, status: JobStatus) -> String {
    match digest {
        Some(digest) => format!("{digest}:{status}"),
        None => status.as_str().to_owned(),
    }
}

/// KEYS: the tenant's counts hash, its live jobs hash, its ended sets
/// (succeeded, failed, cancelled), and with a submitter, the submitter's.
/// ARGV: job id, `live`, `ended` or `gone`, the status (live: its
/// spelling; ended: 1 to 3, which set), the stamp (live: the job's event
/// count; ended: when it expires, Unix ms), the submitter's digest ('':
/// none), now (Unix ms).
/// Counts the change unless the job has ended (a live change or a second
/// end) or a change stamped as late or later was counted (a live change).
/// Returns 1 if it changed a count, 0 if not.
pub(super) static COUNT: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
local job, change, status, stamp = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local digest, now = ARGV[5], tonumber(ARGV[6])
local ended = false
for k = 3, 5 do
  local expires = tonumber(redis.call('ZSCORE', KEYS[k], job))
  if expires and expires > now then ended = true end
end
if ended and change ~= 'gone' then return 0 end
local was = redis.call('HGET', KEYS[2], job)
local was_stamp, was_status, was_digest
if was then
  was_stamp, was_status, was_digest = string.match(was, '^(%d+) (%S+) (%x*)$')
  was_stamp = tonumber(was_stamp)
end
if change == 'live' and was_stamp and was_stamp >= stamp then return 0 end
local function add(field, n)
  if redis.call('HINCRBY', KEYS[1], field, n) <= 0 then redis.call('HDEL', KEYS[1], field) end
end
local function tally(counted, of, n)
  add(counted, n)
  if of ~= '' then add(of .. ':' .. counted, n) end
end
if was_status then tally(was_status, was_digest, -1) end
if change == 'live' then
  redis.call('HSET', KEYS[2], job, stamp .. ' ' .. status .. ' ' .. digest)
  tally(status, digest, 1)
  return 1
end
redis.call('HDEL', KEYS[2], job)
if change == 'gone' then
  for k = 3, #KEYS do redis.call('ZREM', KEYS[k], job) end
  return 1
end
if stamp <= now then return 1 end
local function keep(key)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  redis.call('ZADD', key, stamp, job)
  if redis.call('PTTL', key) < stamp - now then redis.call('PEXPIRE', key, stamp - now) end
end
local set = tonumber(status)
keep(KEYS[2 + set])
if #KEYS == 8 then keep(KEYS[5 + set]) end
return 1
",
    )
});

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::scripts::tests::assert_filled;

    #[test]
    fn the_count_script_is_filled_and_its_sets_are_the_final_statuses() {
        assert_filled("COUNT", &COUNT);
        let finals: Vec<JobStatus> = JobStatus::ALL
            .into_iter()
            .filter(|s| s.is_final())
            .collect();
        assert_eq!(finals, ENDED);
        let live: Vec<JobStatus> = JobStatus::ALL
            .into_iter()
            .filter(|s| !s.is_final())
            .collect();
        assert_eq!(live, LIVE);
    }

    /// What a record says of its job's count: a live status with its
    /// stamp, or an end kept for the retention from when it ended.
    #[test]
    fn a_record_counts_as_its_status_stamped_or_its_end_until_it_expires() {
        let stored = |status, events, finished_at_ms| Stored {
            status,
            events,
            finished_at_ms,
        };
        let (retention, now) = (1_000, 50_000);
        let rows = [
            (
                stored(JobStatus::Queued, 1, 0),
                Change::Live {
                    status: JobStatus::Queued,
                    events: 1,
                },
            ),
            (
                stored(JobStatus::WaitingForApproval, 9, 0),
                Change::Live {
                    status: JobStatus::WaitingForApproval,
                    events: 9,
                },
            ),
            (
                stored(JobStatus::Succeeded, 12, 40_000),
                Change::Ended {
                    status: JobStatus::Succeeded,
                    expires_at_ms: 41_000,
                },
            ),
            (
                stored(JobStatus::Cancelled, 2, 0),
                Change::Ended {
                    status: JobStatus::Cancelled,
                    expires_at_ms: 51_000,
                },
            ),
            (
                stored(JobStatus::Failed, 3, u64::MAX),
                Change::Ended {
                    status: JobStatus::Failed,
                    expires_at_ms: u64::MAX,
                },
            ),
        ];
        for (stored, expected) in rows {
            assert_eq!(Change::at(stored, retention, now), expected, "{stored:?}");
        }
    }

    /// Every script of the store that sets a job's status is in a verb
    /// that counts the change (its module asks for a count), and a run's
    /// end, whose status the commit sets as a field, is counted where the
    /// commit ends a job: a new status-writing script fails this until its
    /// verb counts it, and this list names it.
    #[test]
    fn every_verb_that_sets_a_status_counts_it() {
        let sources = [
            ("submit.rs", include_str!("submit.rs")),
            ("lease.rs", include_str!("lease.rs")),
            ("park.rs", include_str!("park.rs")),
            ("cancel.rs", include_str!("cancel.rs")),
            ("decide.rs", include_str!("decide.rs")),
            ("place.rs", include_str!("place.rs")),
            ("approvals.rs", include_str!("approvals.rs")),
            ("quota.rs", include_str!("quota.rs")),
            ("read.rs", include_str!("read.rs")),
            ("index.rs", include_str!("index.rs")),
            ("catalog.rs", include_str!("catalog.rs")),
            ("attempts.rs", include_str!("attempts.rs")),
            ("commit/write.rs", include_str!("commit/write.rs")),
            ("commit/hold.rs", include_str!("commit/hold.rs")),
            ("commit/turn.rs", include_str!("commit/turn.rs")),
            ("commit/results.rs", include_str!("commit/results.rs")),
            ("commit/finish.rs", include_str!("commit/finish.rs")),
        ];
        let writes_status: Vec<&str> = sources
            .iter()
            .filter(|(_, source)| source.contains("'status', '$"))
            .map(|(name, _)| *name)
            .collect();
        assert_eq!(
            writes_status,
            ["submit.rs", "lease.rs", "park.rs", "cancel.rs"],
            "the scripts that set a status"
        );
        for (name, source) in sources {
            if writes_status.contains(&name) || name == "commit/write.rs" {
                // However rustfmt breaks the call's line.
                assert!(
                    [".count(", ".count_end(", ".counting("]
                        .iter()
                        .any(|call| source.contains(call)),
                    "{name} sets a status and counts nothing"
                );
            }
        }
        let write = include_str!("commit/write.rs");
        assert!(write.contains("fields.push((\"status\""), "a run's end");
    }

    #[test]
    fn a_count_field_is_the_status_or_the_submitters_digest_and_status() {
        assert_eq!(count_field(None, JobStatus::Queued), "queued");
        let digest = submitter_digest("Ana");
        assert_eq!(
            count_field(Some(&digest), JobStatus::WaitingForApproval),
            format!("{digest}:waiting_for_approval")
        );
    }
}
