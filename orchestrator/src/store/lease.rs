//! The fenced lease of a job's runner: taking it starts (or resumes) the
//! run and loads the job in the same round trip; renewing and releasing.

use std::sync::LazyLock;
use std::time::Duration;

use redis::AsyncCommands;
use redis::Script;

use crate::job::{JobEvent, JobStatus, Lease, now_ms};

use super::counts::Change;
use super::place::{Place, Stamp};
use super::read::parse_run_start;
use super::scripts::script;
use super::*;
use crate::live::Written;

impl JobStore {
    /// Takes the job's lease for `owner` for `ttl`, with the next epoch (see
    /// [`Acquired`] for a lease held elsewhere, a job that already ended and
    /// one whose state is gone), and starts the run: the job is running, with
    /// its `job_started` event (`job_resumed` when it ran before, as
    /// [`Lease::resumed`] says). With the lease comes what the run starts
    /// from ([`load_run`](Self::load_run)), all in one round trip: the reads
    /// follow the lease in one pipeline, so they see the job as its new
    /// holder does. The start is `None` without a lease, and when the job's
    /// state does not parse (the run's own read then says why). The run is
    /// counted for the job's tenant and its submitter, whom the lease names
    /// ([`count`](Self::count)).
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn acquire_and_load(
        &self,
        job_id: &JobId,
        owner: &str,
        ttl: Duration,
    ) -> Result<(Acquired, Option<RunStart>), Error> {
        let start_event = StartEvent::new(owner);
        let now = now_ms();
        let mut acquisition = ACQUIRE.prepare_invoke();
        acquisition
            .key(self.keys.job(job_id))
            .key(self.keys.job_lease(job_id))
            .key(self.keys.job_events(job_id))
            .arg(owner)
            .arg(millis(ttl))
            .arg(now)
            .arg(start_event.started)
            .arg(start_event.resumed)
            .arg(&start_event.before_epoch)
            .arg(&start_event.after_epoch)
            .arg(toolfleet_proto::format::CURRENT);
        let mut pipe = redis::pipe();
        pipe.invoke_script(&acquisition);
        self.load_run_commands(&mut pipe, job_id);
        let ((epoch, events, resumed, moved), fields, offered, items): (
            (i64, u64, u8, u64),
            Fields,
            Fields,
            Vec<String>,
        ) = self.query_invoking(&pipe, &[&ACQUIRE]).await?;
        let start = match epoch {
            1.. => parse_run_start(job_id, &fields, &offered, &items)
                .ok()
                .flatten(),
            _ => None,
        };
        let submitter = start.as_ref().and_then(|s| s.record.spec.submitter.clone());
        let acquired = match epoch {
            -3 => Acquired::Unreadable(toolfleet_proto::format::Unreadable {
                what: "the job",
                found: events.to_string(),
            }),
            _ => acquired(job_id, owner, epoch, resumed == 1, submitter),
        };
        if moved > 0 {
            // The run goes on without this move: a job left in the parked
            // index while it runs is put right by its next park, its end
            // or its wake-up, and its message comes again if it dies.
            let placed = self
                .steps()
                .place(job_id, Stamp::after(moved), Place::Unfinished);
            if let Err(err) = placed.await {
                tracing::warn!(%job_id, error = %err, "could not move a resumed parked job to the unfinished index");
            }
        }
        if let Acquired::Lease(lease) = &acquired {
            let stored = start_event.stored(lease, events, now);
            self.notify(job_id, stored).await;
            let running = Change::Live {
                status: JobStatus::Running,
                events,
            };
            // The job stays in the unfinished index while it runs, where
            // the sweeper counts it should this fail; so does its end.
            if let Err(err) = self
                .count(job_id, lease.submitter.as_deref(), running)
                .await
            {
                tracing::warn!(%job_id, error = %err, "could not count a job's run");
            }
        }
        Ok((acquired, start))
    }

    /// Extends the lease by `ttl`.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] when another runner has the job; [`Error::Redis`].
    pub async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<(), Error> {
        let renewed: i64 = RENEW
            .key(self.keys.job_lease(&lease.job_id))
            .arg(&lease.token)
            .arg(millis(ttl))
            .invoke_async(&mut self.conn())
            .await?;
        if renewed == 1 {
            Ok(())
        } else {
            Err(Error::LeaseLost(lease.job_id.clone()))
        }
    }

    /// Gives the lease up (shutdown), so another replica can take over at once.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn release(&self, lease: &Lease) -> Result<(), Error> {
        let _: i64 = RELEASE
            .key(self.keys.job_lease(&lease.job_id))
            .arg(&lease.token)
            .invoke_async(&mut self.conn())
            .await?;
        Ok(())
    }

    /// Whether a runner holds the job's lease right now.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn lease_held(&self, job_id: &JobId) -> Result<bool, Error> {
        Ok(self.conn().exists(self.keys.job_lease(job_id)).await?)
    }
}

/// The event that starts a run, as the lease script writes it: its kind
/// for a first run and for a resumed one, and its data (the same for both)
/// around the epoch, which only the script knows.
struct StartEvent {
    started: &'static str,
    resumed: &'static str,
    before_epoch: String,
    after_epoch: String,
}

impl StartEvent {
    fn new(owner: &str) -> Self {
        // The data of an event with an epoch no lease reaches, cut where that
        // epoch is: its first digits in the text, since `epoch` is the data's
        // first field (serde_json orders fields by name).
        const PLACEHOLDER: u64 = u64::MAX;
        let started = JobEvent::run_started(PLACEHOLDER, owner.to_owned(), false);
        let data = started.data_json();
        let (before_epoch, after_epoch) = data
            .split_once(&PLACEHOLDER.to_string())
            .expect("the event's data holds its epoch");
        Self {
            started: started.kind(),
            resumed: JobEvent::run_started(PLACEHOLDER, String::new(), true).kind(),
            before_epoch: before_epoch.to_owned(),
            after_epoch: after_epoch.to_owned(),
        }
    }

    /// What the lease script wrote for `lease`, with the job's event count
    /// after it (`events`) and its time (`now`), as its watchers get it.
    fn stored(&self, lease: &Lease, events: u64, now: u64) -> Written {
        let event = Event {
            offset: 0,
            kind: (if lease.resumed {
                self.resumed
            } else {
                self.started
            })
            .to_owned(),
            data: format!("{}{}{}", self.before_epoch, lease.epoch, self.after_epoch),
            timestamp_ms: now,
            is_final: false,
        };
        Written::numbered(vec![event], Some(events))
    }
}

/// What the lease script of [`JobStore::acquire_and_load`] answered, as an
/// [`Acquired`], for the job `submitter` submitted.
fn acquired(
    job_id: &JobId,
    owner: &str,
    epoch: i64,
    resumed: bool,
    submitter: Option<String>,
) -> Acquired {
    match epoch {
        -2 => Acquired::Missing,
        -1 => Acquired::Finished,
        0 => Acquired::Held,
        epoch => {
            let epoch = u64::try_from(epoch).unwrap_or_default();
            Acquired::Lease(Lease {
                job_id: job_id.to_owned(),
                token: format!("{owner}:{epoch}"),
                epoch,
                resumed,
                submitter,
            })
        }
    }
}

/// Result of [`JobStore::acquire_and_load`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquired {
    /// The lease is ours.
    Lease(Lease),
    /// Another runner holds the job.
    Held,
    /// The job already finished.
    Finished,
    /// The job has a queue message but no record: its state was lost.
    Missing,
    /// The job is stored in a format this release does not read (a newer
    /// release's; decision 0059): left as it is.
    Unreadable(toolfleet_proto::format::Unreadable),
}

/// KEYS: job, lease, events. ARGV: owner, ttl_ms, now_ms, the kinds of the
/// events of a first run and of a resumed one, the event's data before
/// and after its epoch, and the newest format this release reads.
/// Takes the lease if it is free and the job is not finished, and starts
/// the run in the same step: the job is running, with a `job_started` event
/// (`job_resumed` when it ran before). Returns `{epoch, events, resumed,
/// moved}`: the new epoch (0 if another runner holds the lease, -1 if the
/// job is finished, -2 if it is missing, -3 if it is stored in a format
/// this release does not read, with that format, or 0 when it is not a
/// number, in place of the events; nothing is written then), the
/// number of events the job has, 1 when the run resumes, and the job's
/// count of moves if it took a parked job that nothing had queued again
/// (else 0): the caller moves it to the unfinished index.
static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {-2, 0, 0, 0} end
-- A format this release does not read: nothing is read or written.
local format = redis.call('HGET', KEYS[1], 'format')
if format then
  local number = tonumber(format)
  if not number or number < 1 or number > tonumber(ARGV[8]) then
    return {-3, math.max(0, math.floor(number or 0)), 0, 0}
  end
end
if $ENDED then return {-1, 0, 0, 0} end
if redis.call('EXISTS', KEYS[2]) == 1 then return {0, 0, 0, 0} end
-- Time parked for an approval does not count against the deadline.
local parked_at = tonumber(redis.call('HGET', KEYS[1], 'parked_at_ms'))
if parked_at then
  redis.call('HINCRBY', KEYS[1], 'parked_ms', math.max(0, tonumber(ARGV[3]) - parked_at))
  redis.call('HDEL', KEYS[1], 'parked_at_ms')
end
-- A parked job nothing queued again (a stray message) leaves the parked
-- index: one more move, which the caller makes.
local moved = 0
if status == '$WAITING' and redis.call('HDEL', KEYS[1], 'requeued') == 0 then
  moved = redis.call('HINCRBY', KEYS[1], 'moves', 1)
end
local epoch = redis.call('HINCRBY', KEYS[1], 'epoch', 1)
redis.call('SET', KEYS[2], ARGV[1] .. ':' .. epoch, 'PX', ARGV[2])
local resumed = 0
local kind = ARGV[4]
if status ~= '$QUEUED' then resumed = 1; kind = ARGV[5] end
redis.call('HSET', KEYS[1], 'status', '$RUNNING')
local events = redis.call('HINCRBY', KEYS[1], 'events', 1)
redis.call('XADD', KEYS[3], '0-' .. events, 'kind', kind, 'data', ARGV[6] .. epoch .. ARGV[7],
           'ts', ARGV[3], 'final', '0')
return {epoch, events, resumed, moved}
",
    )
});

/// KEYS: lease. ARGV: token, ttl_ms. Returns 1 if renewed, 0 if lost.
static RENEW: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
",
    )
});

/// KEYS: lease. ARGV: token. Drops the lease if still ours.
static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
",
    )
});

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(epoch: u64, resumed: bool) -> Lease {
        Lease {
            job_id: JobId::new("acme", 1, 2),
            token: format!("o-1:{epoch}"),
            epoch,
            resumed,
            submitter: None,
        }
    }

    /// What the lease script writes, as its watchers are handed it, is the
    /// event the run would have written itself.
    #[test]
    fn the_start_event_a_lease_writes_is_the_runs_own() {
        let start = StartEvent::new("o-1");
        for (epoch, resumed) in [(1, false), (7, true), (u64::MAX - 1, true)] {
            let written = start.stored(&lease(epoch, resumed), 4, 1_000);
            assert_eq!(written.events, Some(4));
            let events = written.stored.expect("handed over");
            let [event] = &events[..] else {
                panic!("one event: {events:?}");
            };
            assert_eq!(event.offset, 3, "the job's last");
            let expected = JobEvent::run_started(epoch, "o-1".into(), resumed);
            assert_eq!(event.kind, expected.kind());
            assert_eq!(event.data, expected.data_json());
            assert_eq!(
                JobEvent::decode(&event.kind, &event.data).unwrap(),
                expected
            );
            assert_eq!((event.timestamp_ms, event.is_final), (1_000, false));
        }
    }

    #[test]
    fn the_lease_scripts_answer_reads_as_what_happened() {
        let job = JobId::new("acme", 1, 2);
        assert!(matches!(
            acquired(&job, "o", -2, false, None),
            Acquired::Missing
        ));
        assert!(matches!(
            acquired(&job, "o", -1, false, None),
            Acquired::Finished
        ));
        assert!(matches!(
            acquired(&job, "o", 0, false, None),
            Acquired::Held
        ));
        let Acquired::Lease(taken) = acquired(&job, "o-1", 3, true, None) else {
            panic!("a lease");
        };
        assert_eq!(taken, lease(3, true));
    }

    /// The lease script splices the epoch into the data around it: an
    /// owner whose name the data must escape, or that holds the digits the
    /// split looks for, still gives the run's own event.
    #[test]
    fn the_start_event_is_the_runs_own_for_any_owner() {
        for owner in [
            "",
            "o\"1\\",
            "pod-7:18446744073709551615",
            "18446744073709551615",
            "ünïcødé\n\u{0}",
        ] {
            let start = StartEvent::new(owner);
            for resumed in [false, true] {
                let lease = Lease {
                    job_id: JobId::new("acme", 1, 2),
                    token: format!("{owner}:9"),
                    epoch: 9,
                    resumed,
                    submitter: None,
                };
                let events = start.stored(&lease, 1, 5).stored.expect("handed over");
                let expected = JobEvent::run_started(9, owner.to_owned(), resumed);
                assert_eq!(events[0].kind, expected.kind(), "{owner:?}");
                assert_eq!(
                    JobEvent::decode(&events[0].kind, &events[0].data).unwrap(),
                    expected,
                    "{owner:?}"
                );
            }
        }
    }

    #[test]
    fn a_lease_token_is_its_owner_and_epoch() {
        let job = JobId::new("acme", 1, 2);
        let Acquired::Lease(taken) = acquired(&job, "pod-7", i64::MAX, false, None) else {
            panic!("a lease");
        };
        assert_eq!(taken.token, format!("pod-7:{}", i64::MAX));
        assert_eq!(taken.epoch, u64::try_from(i64::MAX).unwrap());
        assert!(!taken.resumed);
    }

    #[test]
    fn the_lease_scripts_are_filled_and_a_lease_never_starts_an_ended_job() {
        use super::super::scripts::tests::{assert_ended_reads_status, assert_filled};
        let acquire = assert_filled("ACQUIRE", &ACQUIRE);
        assert_ended_reads_status("ACQUIRE", &acquire);
        assert!(acquire.contains("status ~= 'queued'"), "a resumed run");
        assert!(acquire.contains("'status', 'running'"));
        assert_filled("RENEW", &RENEW);
        assert_filled("RELEASE", &RELEASE);
    }
}
