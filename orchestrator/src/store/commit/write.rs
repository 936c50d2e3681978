//! The one write of every commit: what a verb says happened, as the job's
//! hash fields, items, events and attempts, stored by one script fenced by
//! the lease.

use std::sync::LazyLock;

use redis::Script;

use crate::job::{
    Ending, FullResult, Item, JobErrorCode, JobEvent, JobStatus, Lease, ToolManifest,
    TurnCheckpoint, now_ms,
};
use crate::live::Written;

use super::super::scripts::script;
use super::*;

impl JobStore {
    /// Writes `commit` atomically, if `lease` still holds and the job has not
    /// ended.
    pub(super) async fn commit(&self, lease: &Lease, commit: Commit<'_>) -> Result<(), Error> {
        let job_id = &lease.job_id;
        let finished = commit.ending.is_some();
        let fields = commit.fields();
        let now = now_ms();
        // The events as the script stores them, and as this process's
        // watchers get them; their offsets are known once it answers.
        let events: Vec<Event> = commit
            .events
            .iter()
            .map(|event| Event {
                offset: 0,
                kind: event.kind().to_owned(),
                data: event.data_json(),
                timestamp_ms: now,
                is_final: event.is_final(),
            })
            .collect();
        let mut invocation = COMMIT.prepare_invoke();
        invocation
            .key(self.keys.job(job_id))
            .key(self.keys.job_items(job_id))
            .key(self.keys.job_events(job_id))
            .key(self.keys.job_lease(job_id))
            .key(self.keys.job_attempts(job_id))
            .key(self.keys.job_tools(job_id))
            .key(self.keys.job_approvals(job_id))
            .key(self.keys.job_shaped(job_id))
            .arg(&lease.token)
            .arg(now)
            .arg(if finished { millis(self.retention) } else { 0 });
        counted_lists(&mut invocation, &commit, &events, &fields);
        let answer: i64 = invocation.invoke_async(&mut self.conn()).await?;
        if answer == LEASE_LOST {
            return Err(Error::LeaseLost(job_id.clone()));
        }
        if answer == RESULT_MISMATCH {
            return Err(Error::ResultMismatch(job_id.clone()));
        }
        if !events.is_empty() {
            self.notify(
                job_id,
                Written::numbered(events, u64::try_from(answer).ok()),
            )
            .await;
        }
        if let Some(ending) = commit.ending {
            self.count_end(job_id, lease.submitter.as_deref(), ending.status())
                .await;
        }
        Ok(())
    }
}

/// Adds the counted lists of [`COMMIT`]'s arguments that `commit` fills:
/// the results to check, the items, the `events`, the job's `fields`, the
/// attempts, the offered manifests, the approvals and the whole data of
/// shaped results.
fn counted_lists(
    invocation: &mut redis::ScriptInvocation<'_>,
    commit: &Commit<'_>,
    events: &[Event],
    fields: &[(&str, String)],
) {
    pairs(invocation, commit.checks.iter().map(|(k, t)| (k, *t)));
    invocation.arg(commit.results.len() + commit.items.len());
    for item in commit.results.iter().chain(commit.items) {
        invocation.arg(item.stored_json());
    }
    invocation.arg(events.len());
    for event in events {
        invocation
            .arg(&event.kind)
            .arg(&event.data)
            .arg(if event.is_final { "1" } else { "0" });
    }
    pairs(invocation, fields.iter().map(|(f, v)| (*f, v)));
    pairs(invocation, commit.attempts.iter().map(|(c, a)| (c, *a)));
    invocation.arg(commit.offers.len());
    for manifest in commit.offers {
        let json = serde_json::to_string(manifest).expect("a manifest serializes");
        invocation.arg(&manifest.name).arg(json);
    }
    pairs(invocation, commit.approvals.iter().map(|(f, v)| (f, v)));
    pairs(
        invocation,
        commit
            .full
            .iter()
            .map(|full| (full.call.as_str(), &full.data)),
    );
    pairs(invocation, commit.spend_increments().into_iter());
}

/// Adds a counted list of pairs to a script's arguments: their count, then
/// each pair.
fn pairs<A, B>(
    invocation: &mut redis::ScriptInvocation<'_>,
    pairs: impl ExactSizeIterator<Item = (A, B)>,
) where
    A: redis::ToRedisArgs,
    B: redis::ToRedisArgs,
{
    invocation.arg(pairs.len());
    for (first, second) in pairs {
        invocation.arg(first).arg(second);
    }
}

/// The writes of one verb, committed atomically under a lease. Private: a
/// caller says what happened, and only [`Commit::fields`] names hash fields.
#[derive(Debug, Default)]
pub(super) struct Commit<'a> {
    /// Results of a round, appended to the conversation before `items`.
    pub(super) results: &'a [Item],
    pub(super) items: &'a [Item],
    pub(super) events: Vec<JobEvent>,
    pub(super) status: Option<JobStatus>,
    /// Turns and rounds after a checkpointed turn.
    pub(super) counters: Option<(u32, u32)>,
    /// The job ended: its outcome is stored and every key expires.
    pub(super) ending: Option<&'a Ending>,
    /// Dispatched attempts: call id, attempt.
    pub(super) attempts: Vec<(String, u32)>,
    /// Tool manifests offered to the model, to remember.
    pub(super) offers: &'a [ToolManifest],
    /// Stored results (key, text) that must be in Redis as given, or the
    /// commit writes nothing.
    pub(super) checks: Vec<(String, &'a str)>,
    /// Fields of the job's approvals hash: held calls' requests.
    pub(super) approvals: Vec<(String, String)>,
    /// The whole data of the shaped results among `results`, for the
    /// job's `shaped` hash.
    pub(super) full: &'a [FullResult],
    /// What the commit adds to the job's spend (`crate::budget`).
    pub(super) spend: Spend,
    /// A call was refused for this budget: the job gets no more turns.
    pub(super) budget_exceeded: Option<Limit>,
}

impl<'a> Commit<'a> {
    /// A checkpointed turn: the results before it, its items, its
    /// `model_turn` event, the job's counters and the tools it offered.
    pub(super) fn of_turn(turn: TurnCheckpoint<'a>) -> Self {
        Commit {
            results: turn.results,
            full: turn.full,
            items: turn.items,
            events: vec![turn.event()],
            counters: Some((turn.turns, turn.rounds)),
            offers: turn.offered,
            spend: Spend {
                tokens: turn.tokens,
                ..Spend::default()
            },
            ..Commit::default()
        }
    }

    /// Records that `attempt` of each of `calls` is about to be published.
    pub(super) fn dispatched(&mut self, calls: &[DispatchedCall<'_>], attempt: u32) {
        for call in calls {
            self.events.push(JobEvent::ToolCallDispatched {
                attempt,
                call_id: call.event_id.to_string(),
                name: call.name.to_owned(),
                tool_version: call.version.map(str::to_owned),
            });
            self.attempts.push((call.wire_id.to_string(), attempt));
            // A call counts once, each attempt's cost each time.
            self.spend.tool_calls += u64::from(attempt == 1);
            self.spend.cost_units += call.cost;
        }
    }

    /// The job hash fields this commit adds to, and by how much.
    fn spend_increments(&self) -> Vec<(&'static str, u64)> {
        [
            (SPENT_TOKENS, self.spend.tokens),
            (SPENT_COST_UNITS, self.spend.cost_units),
            (SPENT_TOOL_CALLS, self.spend.tool_calls),
        ]
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .collect()
    }

    /// The job hash fields this commit sets.
    fn fields(&self) -> Vec<(&'static str, String)> {
        let mut fields = Vec::new();
        if let Some(status) = self.status {
            fields.push(("status", status.as_str().to_owned()));
        }
        if let Some((turns, rounds)) = self.counters {
            fields.push(("turns", turns.to_string()));
            fields.push(("rounds", rounds.to_string()));
        }
        match self.ending {
            Some(Ending::Succeeded(text)) => fields.push(("output_text", text.clone())),
            Some(Ending::Failed(error)) => {
                fields.push(("error_code", error.code.as_str().to_owned()));
                fields.push(("error_message", error.message.clone()));
            }
            Some(Ending::Cancelled) => {
                fields.push(("error_code", JobErrorCode::Cancelled.as_str().to_owned()));
                fields.push(("error_message", "the job was cancelled".to_owned()));
            }
            None => {}
        }
        if self.ending.is_some() {
            fields.push(("finished_at_ms", now_ms().to_string()));
        }
        if !self.full.is_empty() {
            // Read with the run's start: its model is offered read_result.
            fields.push(("shaped", "1".to_owned()));
        }
        if let Some(limit) = self.budget_exceeded {
            fields.push((BUDGET_EXCEEDED, limit.field().to_owned()));
        }
        fields
    }
}

/// What [`COMMIT`] returns when the lease is not held (or the job ended).
const LEASE_LOST: i64 = -1;

/// What [`COMMIT`] returns when a stored result it was asked to check is
/// not the text given.
const RESULT_MISMATCH: i64 = -2;

/// KEYS: job, items, events, lease, attempts, tools, approvals, shaped.
/// ARGV: token, now_ms, retention_ms (0: keep), then nine counted lists:
/// n, (result key, the text it must hold)...; n, items...; n, (kind, data,
/// final)...; n, (field, value)...; n, (call_id, attempt)...; n, (tool,
/// manifest)...; n, (approvals field, value)...; n, (call, whole data of
/// a shaped result)...; n, (job field, increment)... (the spend)
/// Appends items and events and updates fields, only while the lease holds
/// and each result to check holds its text (else [`RESULT_MISMATCH`], and
/// nothing is written).
///
/// The result keys to check are arguments, not KEYS (decision 0028): Redis
/// checks every key given to `EVALSHA` as read-write, and the orchestrator
/// may only read a call's result; the script's `GET` of it is checked as a
/// read. A call's result key has its job's hash tag, so it is in the slot of
/// the declared keys, which is what Redis Cluster requires of a key a
/// script reaches; a key that is not there (a slot being migrated) reads as
/// missing, a mismatch, which the round answers by reading Redis.
/// With retention_ms > 0 (the job finished) every key of the job expires.
/// Returns the number of events the job has after the commit (0 for a
/// commit without events), or [`LEASE_LOST`] (also when the job already
/// finished: nothing is written after the end).
///
/// One command per list, not per element: the commands a script runs cost
/// Redis CPU like any other (`INFO commandstats` counts them), so the items
/// are one `RPUSH`, the fields of each hash one `HSET`, and the events take
/// their sequence numbers with one `HINCRBY` (older replicas, which add one
/// at a time, still agree with it during a rolling upgrade). `unpack` has a
/// limit on how many values it returns, so very long lists go in chunks.
static COMMIT: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
if redis.call('GET', KEYS[4]) ~= ARGV[1] then return -1 end
local status = redis.call('HGET', KEYS[1], 'status')
if $ENDED then return -1 end
local CHUNK = 512
-- Runs `command key ARGV[first .. first + count - 1]`, CHUNK values a time
-- (an even number, so that field-value pairs stay together).
local function each_chunk(command, key, first, count)
  local last = first + count - 1
  for from = first, last, CHUNK do
    redis.call(command, key, unpack(ARGV, from, math.min(from + CHUNK - 1, last)))
  end
end
local i = 4
local n = tonumber(ARGV[i]); i = i + 1
for k = 1, n do
  if redis.call('GET', ARGV[i]) ~= ARGV[i + 1] then return -2 end
  i = i + 2
end
n = tonumber(ARGV[i]); i = i + 1
each_chunk('RPUSH', KEYS[2], i, n); i = i + n
n = tonumber(ARGV[i]); i = i + 1
local events = 0
if n > 0 then
  events = redis.call('HINCRBY', KEYS[1], 'events', n)
  for seq = events - n + 1, events do
    redis.call('XADD', KEYS[3], '0-' .. seq, 'kind', ARGV[i], 'data', ARGV[i + 1], 'ts', ARGV[2], 'final', ARGV[i + 2])
    i = i + 3
  end
end
for k = 1, 5 do
  n = tonumber(ARGV[i]); i = i + 1
  local hash = ({KEYS[1], KEYS[5], KEYS[6], KEYS[7], KEYS[8]})[k]
  each_chunk('HSET', hash, i, 2 * n); i = i + 2 * n
end
n = tonumber(ARGV[i]); i = i + 1
for k = 1, n do
  redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1]); i = i + 2
end
local retention = tonumber(ARGV[3])
if retention > 0 then
  for k = 1, 3 do redis.call('PEXPIRE', KEYS[k], retention) end
  for k = 5, 8 do redis.call('PEXPIRE', KEYS[k], retention) end
  redis.call('DEL', KEYS[4])
end
return events
",
    )
});

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::JobError;
    use toolfleet_proto::{EventId, WireId};

    fn call(text: &str) -> Item {
        Item::ToolCall {
            call_id: "c1".into(),
            name: "echo".into(),
            arguments: text.into(),
            raw: None,
        }
    }

    #[test]
    fn a_turn_commits_its_items_event_counters_and_offers() {
        let (results, items) = (vec![call("{}")], vec![call("{\"a\":1}")]);
        let turn = TurnCheckpoint {
            results: &results,
            full: &[],
            items: &items,
            turns: 3,
            rounds: 2,
            offered: &[],
            usage: None,
            tokens: 0,
        };
        let commit = Commit::of_turn(turn);
        assert_eq!((commit.results.len(), commit.items.len()), (1, 1));
        assert_eq!(commit.events, [turn.event()]);
        assert_eq!(
            commit.fields(),
            [("turns", "3".to_owned()), ("rounds", "2".to_owned())],
            "counters only: the job runs on"
        );
    }

    #[test]
    fn a_dispatch_records_an_event_and_an_attempt_per_call() {
        let mut commit = Commit::default();
        let id = |text| (EventId::parse(text).unwrap(), WireId::parse(text).unwrap());
        let ((call_a, _), (x1, _), (_, w1), (_, w2)) =
            (id("call_a"), id("x.1"), id("w1"), id("w2"));
        let calls = [
            DispatchedCall {
                event_id: &call_a,
                wire_id: &w1,
                name: "echo",
                cost: 3,
                version: Some("c0ffee"),
            },
            DispatchedCall {
                event_id: &x1,
                wire_id: &w2,
                name: "sleep",
                cost: 0,
                version: None,
            },
        ];
        commit.dispatched(&calls, 2);
        // A retry: each attempt's cost, no new call.
        assert_eq!(commit.spend_increments(), [(SPENT_COST_UNITS, 3)]);
        assert_eq!(
            commit.attempts,
            [("w1".to_owned(), 2), ("w2".to_owned(), 2)],
            "by wire id"
        );
        assert_eq!(
            commit.events,
            [
                JobEvent::ToolCallDispatched {
                    attempt: 2,
                    call_id: "call_a".into(),
                    name: "echo".into(),
                    tool_version: Some("c0ffee".into()),
                },
                JobEvent::ToolCallDispatched {
                    attempt: 2,
                    call_id: "x.1".into(),
                    name: "sleep".into(),
                    tool_version: None,
                },
            ],
            "by the id the events show"
        );
        assert!(commit.fields().is_empty());
    }

    /// The fields each ending writes: its outcome, and when it finished.
    #[test]
    fn each_ending_writes_its_outcome_and_its_time() {
        let field = |fields: &[(&str, String)], name: &str| {
            fields
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.clone())
        };
        let failed = Ending::Failed(JobError {
            code: JobErrorCode::ModelRejected,
            message: "no".into(),
        });
        for (ending, code, message, output) in [
            (Ending::Succeeded("42".into()), None, None, Some("42")),
            (failed, Some("MODEL_REJECTED"), Some("no"), None),
            (
                Ending::Cancelled,
                Some("CANCELLED"),
                Some("the job was cancelled"),
                None,
            ),
        ] {
            let commit = Commit {
                status: Some(ending.status()),
                ending: Some(&ending),
                ..Commit::default()
            };
            let fields = commit.fields();
            assert_eq!(
                field(&fields, "status").as_deref(),
                Some(ending.status().as_str())
            );
            assert_eq!(field(&fields, "error_code").as_deref(), code);
            assert_eq!(field(&fields, "error_message").as_deref(), message);
            assert_eq!(field(&fields, "output_text").as_deref(), output);
            let finished: u64 = field(&fields, "finished_at_ms").unwrap().parse().unwrap();
            assert!(finished > 0);
        }
    }

    #[test]
    fn a_turn_remembers_the_tools_it_offered_and_leaves_the_status_alone() {
        let offered = [
            ToolManifest::new("echo", "says it back", serde_json::json!({})),
            ToolManifest::new("sleep", "waits", serde_json::json!({})),
        ];
        let turn = TurnCheckpoint {
            results: &[],
            full: &[],
            items: &[],
            turns: 1,
            rounds: 0,
            offered: &offered,
            usage: None,
            tokens: 0,
        };
        let commit = Commit::of_turn(turn);
        assert_eq!(commit.offers, offered);
        assert!(commit.attempts.is_empty() && commit.checks.is_empty());
        let fields = commit.fields();
        assert!(
            fields.iter().all(|(name, _)| *name != "status"),
            "a turn runs on: {fields:?}"
        );
    }

    /// The commit of [`JobStore::finish`] with the turn that ended the job
    /// sets that turn's counters and the outcome, each field once.
    #[test]
    fn a_turn_that_ends_the_job_writes_its_counters_and_its_outcome_once() {
        let items = [Item::Assistant {
            text: "42".into(),
            raw: None,
        }];
        let turn = TurnCheckpoint {
            results: &[],
            full: &[],
            items: &items,
            turns: 4,
            rounds: 3,
            offered: &[],
            usage: None,
            tokens: 0,
        };
        let ending = Ending::Succeeded("42".into());
        let commit = Commit {
            status: Some(ending.status()),
            ending: Some(&ending),
            ..Commit::of_turn(turn)
        };
        let fields = commit.fields();
        let written: HashMap<&str, &str> = fields
            .iter()
            .map(|(name, value)| (*name, value.as_str()))
            .collect();
        assert_eq!(written.len(), fields.len(), "a field twice: {fields:?}");
        assert_eq!(written.len(), 5, "{fields:?}");
        assert_eq!(written["status"], "succeeded");
        assert_eq!((written["turns"], written["rounds"]), ("4", "3"));
        assert_eq!(written["output_text"], "42");
        assert!(written["finished_at_ms"].parse::<u64>().unwrap() > 0);
    }

    /// Every field a commit writes is one the store reads back: a field
    /// the readers do not know would be written and never seen.
    #[test]
    fn a_commit_writes_only_fields_the_store_reads() {
        // The reading code, without its tests' own spellings.
        let read = include_str!("../read.rs")
            .split("#[cfg(test)]")
            .next()
            .unwrap();
        let failed = Ending::failed(JobErrorCode::ModelRejected, "no");
        let turn = TurnCheckpoint {
            results: &[],
            full: &[],
            items: &[],
            turns: 1,
            rounds: 1,
            offered: &[],
            usage: None,
            tokens: 0,
        };
        for ending in [Ending::Succeeded("ok".into()), failed, Ending::Cancelled] {
            let commit = Commit {
                status: Some(ending.status()),
                ending: Some(&ending),
                ..Commit::of_turn(turn)
            };
            for (name, _) in commit.fields() {
                assert!(read.contains(&format!("\"{name}\"")), "{name}");
            }
        }
    }

    #[test]
    fn the_commit_script_is_filled_and_writes_nothing_to_an_ended_job() {
        use super::super::scripts::tests::{assert_ended_reads_status, assert_filled};
        let shown = assert_filled("COMMIT", &COMMIT);
        assert_ended_reads_status("COMMIT", &shown);
        assert!(shown.contains(&format!("then return {LEASE_LOST} end")));
        assert!(shown.contains(&format!("then return {RESULT_MISMATCH} end")));
    }
}
