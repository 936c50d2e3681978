//! Held calls and their decisions (decision 0036): the runner holds a call
//! that needs a person's approval ([`JobStore::hold`], a commit of its run)
//! and parks its job when nothing else of the round can run
//! ([`JobStore::park`]); a person's decision ([`JobStore::decide`]) is
//! written once, whoever races for it, and re-queues a parked job.
//!
//! The same door serves a call whose outcome no worker could tell, in a job
//! that asks an operator (`on_unknown_outcome = "ask"`): the call is held
//! for a verdict on that attempt, and the verdict is a [`Decision`] too.
//!
//! Layout of `tf:{<job>}:approvals`, a hash by hold key ([`hold_key`]: the
//! wire id for an approval, `<wire id>@<attempt>` for a verdict):
//! `<key>` -> the request ([`ApprovalRequest`], JSON), `expires:<key>` ->
//! its expiry in Unix ms (for the scripts), `decided:<key>` -> the
//! [`Decision`] (JSON).
//! A parked job leaves the index of unfinished jobs, which the sweeper
//! re-queues from, for the index of parked jobs, scored by when it must
//! wake.

use std::collections::HashMap;
use std::sync::LazyLock;

use redis::Script;
use serde::{Deserialize, Serialize};

use toolfleet_proto::Envelope;

use crate::job::{JobEvent, JobStatus, Lease, now_ms};

use super::scripts::script;
use super::wake_ups::Written;
use super::*;

/// Where a held call's request and decision are kept in its job's
/// approvals: its wire id for an approval before it runs, and
/// `<wire id>@<attempt>` for a verdict on that attempt's unknown outcome
/// (a wire id holds no `@`, so the two never meet).
pub fn hold_key(wire_id: &str, attempt: Option<u32>) -> String {
    match attempt {
        Some(attempt) => format!("{wire_id}@{attempt}"),
        None => wire_id.to_owned(),
    }
}

/// The wire id of the call a hold key ([`hold_key`]) names.
pub fn wire_id_of(key: &str) -> &str {
    key.split_once('@').map_or(key, |(wire_id, _)| wire_id)
}

/// An attempt whose outcome its worker could not tell, held for an
/// operator's verdict.
#[derive(Debug, Clone)]
pub struct Unknown<'a> {
    /// The attempt.
    pub attempt: u32,
    /// What its worker answered (`OUTCOME_UNKNOWN` or
    /// `MAX_DELIVERIES_EXCEEDED`).
    pub envelope: &'a Envelope,
}

/// A call to hold, for [`JobStore::hold`].
#[derive(Debug, Clone)]
pub struct HeldCall<'a> {
    /// The id its attempts and approval are recorded under.
    pub wire_id: &'a str,
    /// For a verdict: the attempt whose outcome is unknown. `None`: an
    /// approval before the call runs.
    pub unknown: Option<Unknown<'a>>,
    /// The id the job's events show it by.
    pub call_id: &'a str,
    /// The tool.
    pub tool: &'a str,
    /// The model's arguments.
    pub arguments: &'a str,
    /// Who asked for the approval: `manifest`, `tenant` or `job`.
    pub rule: &'static str,
    /// Why it waits, for people.
    pub reason: String,
    /// When it is answered `APPROVAL_EXPIRED` if nobody decided (Unix ms).
    pub expires_at_ms: u64,
}

impl HeldCall<'_> {
    /// Its key in the job's approvals ([`hold_key`]).
    pub fn key(&self) -> String {
        hold_key(self.wire_id, self.unknown.as_ref().map(|u| u.attempt))
    }

    /// Its `tool_call_approval_requested` event, or
    /// `tool_call_verdict_requested` for a verdict.
    pub(super) fn event(&self) -> JobEvent {
        match &self.unknown {
            None => JobEvent::ToolCallApprovalRequested {
                arguments: self.arguments.to_owned(),
                call_id: self.call_id.to_owned(),
                expires_at: self.expires_at_ms,
                reason: self.reason.clone(),
                rule: self.rule.to_owned(),
                tool: self.tool.to_owned(),
            },
            Some(unknown) => {
                let error = unknown.envelope.error();
                JobEvent::ToolCallVerdictRequested {
                    attempt: unknown.attempt,
                    call_id: self.call_id.to_owned(),
                    code: error.map(|e| e.code.to_string()).unwrap_or_default(),
                    expires_at: self.expires_at_ms,
                    message: error.map(|e| e.message.clone()).unwrap_or_default(),
                    tool: self.tool.to_owned(),
                }
            }
        }
    }

    /// Its fields of the approvals hash, held at `now`.
    pub(super) fn fields(&self, now: u64) -> [(String, String); 2] {
        let request = ApprovalRequest {
            call_id: self.call_id.to_owned(),
            tool: self.tool.to_owned(),
            arguments: self.arguments.to_owned(),
            rule: self.rule.to_owned(),
            reason: self.reason.clone(),
            requested_at_ms: now,
            expires_at_ms: self.expires_at_ms,
            attempt: self.unknown.as_ref().map(|u| u.attempt),
            outcome: self.unknown.as_ref().map(|u| u.envelope.to_json()),
        };
        let json = serde_json::to_string(&request).expect("a request serializes");
        let key = self.key();
        let expires = expires_field(&key);
        [(key, json), (expires, self.expires_at_ms.to_string())]
    }
}

/// A held call, as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRequest {
    /// The id the job's events show it by.
    pub call_id: String,
    /// The tool.
    pub tool: String,
    /// The model's arguments.
    pub arguments: String,
    /// Who asked for the approval.
    pub rule: String,
    /// Why it waits.
    pub reason: String,
    /// When it was held (Unix ms).
    pub requested_at_ms: u64,
    /// When it expires (Unix ms).
    pub expires_at_ms: u64,
    /// For a verdict: the attempt whose outcome is unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// For a verdict: the envelope its worker answered (JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
}

impl ApprovalRequest {
    /// `approval` (approve or reject it) or `outcome` (a verdict).
    pub fn kind(&self) -> &'static str {
        if self.attempt.is_some() {
            "outcome"
        } else {
            "approval"
        }
    }
}

/// What a person decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Choice {
    /// The held call runs.
    Approved,
    /// The held call is answered `REJECTED_BY_APPROVER`.
    Rejected,
    /// The unknown outcome was applied: the model gets the given result.
    Applied,
    /// The unknown outcome was not applied: the call runs again.
    NotApplied,
    /// The call is answered `FAILED_BY_OPERATOR`.
    Failed,
}

impl Choice {
    /// As events and metrics name it.
    pub fn word(self) -> &'static str {
        match self {
            Self::Approved => "approved",
            Self::Rejected => "rejected",
            Self::Applied => "applied",
            Self::NotApplied => "not_applied",
            Self::Failed => "failed",
        }
    }

    /// Whether it answers a verdict request (else an approval).
    pub fn is_verdict(self) -> bool {
        matches!(self, Self::Applied | Self::NotApplied | Self::Failed)
    }
}

/// A person's decision on a held call, as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    /// What they decided.
    #[serde(rename = "decision")]
    pub choice: Choice,
    /// The approver's reason.
    pub reason: String,
    /// Arguments to run it with instead of the model's, already checked
    /// against the tool's schema.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
    /// For [`Choice::Applied`]: the result the model gets (JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// The tenant whose token or certificate decided.
    pub tenant: String,
    /// The approver's name, as the tokens file gives it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approver: Option<String>,
    /// When (Unix ms).
    pub at_ms: u64,
}

impl Decision {
    /// What was decided, as events and metrics name it.
    pub fn word(&self) -> &'static str {
        self.choice.word()
    }

    /// Its `tool_call_decided` event, for the call `call_id`.
    fn event(&self, call_id: &str) -> JobEvent {
        JobEvent::ToolCallDecided {
            approver: self.approver.clone(),
            arguments: self.arguments.clone(),
            call_id: call_id.to_owned(),
            decision: self.word().to_owned(),
            reason: self.reason.clone(),
            result: self.result.clone(),
            tenant: self.tenant.clone(),
        }
    }
}

/// A job's held calls and the decisions made, by hold key ([`hold_key`]).
#[derive(Debug, Clone, Default)]
pub struct Approvals {
    /// Every call held in the job.
    pub requests: HashMap<String, ApprovalRequest>,
    /// The decisions made.
    pub decisions: HashMap<String, Decision>,
}

impl Approvals {
    /// The hold of the call `call_id` (as events name it) that a decision
    /// is for: the one waiting, else the latest (whose decision a second
    /// one is told of). With its key.
    pub fn hold_of(&self, call_id: &str) -> Option<(&str, &ApprovalRequest)> {
        self.requests
            .iter()
            .filter(|(_, request)| request.call_id == call_id)
            .max_by_key(|(key, request)| {
                (!self.decisions.contains_key(*key), request.requested_at_ms)
            })
            .map(|(key, request)| (key.as_str(), request))
    }
}

/// What [`JobStore::park`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parked {
    /// The job waits, held by no runner.
    Parked,
    /// Every call it would wait for was decided meanwhile: run on.
    Decided,
    /// A client asked to cancel the job: end it instead.
    CancelRequested,
}

/// What [`JobStore::decide`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Decided {
    /// The decision is recorded; `requeue`: the job was parked, and must be
    /// queued again for a runner to resume it.
    Recorded {
        /// The job was parked.
        requeue: bool,
    },
    /// The call was decided before: this decision changed nothing.
    Already(Decision),
    /// The job has no held call with that id (never held, or not a call).
    NotHeld,
    /// The call's approval expired before the decision.
    Expired,
    /// The job has ended (or does not exist).
    Ended,
}

impl JobStore {
    /// The job's held calls and decisions.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`]. A record that does not parse is left out (it was
    /// not written by this store).
    pub async fn approvals(&self, job_id: &JobId) -> Result<Approvals, Error> {
        let fields: HashMap<String, String> = redis::cmd("HGETALL")
            .arg(self.keys.job_approvals(job_id))
            .query_async(&mut self.conn())
            .await?;
        let mut approvals = Approvals::default();
        for (field, value) in fields {
            if let Some(wire_id) = field.strip_prefix(DECIDED) {
                if let Ok(decision) = serde_json::from_str(&value) {
                    approvals.decisions.insert(wire_id.to_owned(), decision);
                }
            } else if !field.starts_with(EXPIRES)
                && let Ok(request) = serde_json::from_str(&value)
            {
                approvals.requests.insert(field, request);
            }
        }
        Ok(approvals)
    }

    /// Parks the job under `lease` until a person decides one of the held
    /// calls `waiting` (wire ids), or `wake_at_ms`: its status
    /// `waiting_for_approval`, its `job_waiting_for_approval` event, the
    /// lease dropped, and the job moved from the index of unfinished jobs
    /// to that of parked jobs. Unless every one of them was decided
    /// meanwhile ([`Parked::Decided`]): then nothing is written.
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
        let job_id = &lease.job_id;
        let now = now_ms();
        let event = JobEvent::JobWaitingForApproval {
            calls: waiting
                .iter()
                .map(|(_, call_id)| (*call_id).to_owned())
                .collect(),
        };
        let mut invocation = PARK.prepare_invoke();
        invocation
            .key(self.keys.job(job_id))
            .key(self.keys.job_lease(job_id))
            .key(self.keys.job_approvals(job_id))
            .key(self.keys.job_events(job_id))
            .arg(&lease.token)
            .arg(now)
            .arg(event.kind())
            .arg(event.data_json())
            .arg(waiting.len());
        for (wire_id, _) in waiting {
            invocation.arg(decided_field(wire_id));
        }
        let answer: i64 = invocation.invoke_async(&mut self.conn()).await?;
        match answer {
            LEASE_LOST => return Err(Error::LeaseLost(job_id.clone())),
            CANCEL_REQUESTED => return Ok(Parked::CancelRequested),
            0 => return Ok(Parked::Decided),
            _ => {}
        }
        self.notify(job_id, Written::counted(u64::try_from(answer).ok()))
            .await;
        // In order, after the job's own keys: a crash in between leaves the
        // job in the unfinished index, where the sweeper re-queues it and a
        // runner parks it again.
        let mut parked = redis::pipe();
        parked
            .cmd("ZADD")
            .arg(self.keys.parked_jobs(job_id))
            .arg(wake_at_ms)
            .arg(job_id.as_str())
            .ignore();
        let mut unfinished = redis::pipe();
        unfinished
            .cmd("ZREM")
            .arg(self.keys.unfinished_jobs(job_id))
            .arg(job_id.as_str())
            .ignore();
        self.conn().run_in_order(vec![parked, unfinished]).await?;
        Ok(Parked::Parked)
    }

    /// Records `decision` on the call `held` under the hold key `key` of
    /// `job_id`, if it is held, undecided and not expired; the call leaves
    /// its tenant's pending index, and a parked job moves back to the
    /// index of unfinished jobs (the caller queues it).
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn decide(
        &self,
        job_id: &JobId,
        key: &str,
        held: &ApprovalRequest,
        decision: &Decision,
    ) -> Result<Decided, Error> {
        let event = decision.event(&held.call_id);
        let json = serde_json::to_string(decision).expect("a decision serializes");
        let answer: Vec<redis::Value> = DECIDE
            .key(self.keys.job(job_id))
            .key(self.keys.job_approvals(job_id))
            .key(self.keys.job_events(job_id))
            .arg(key)
            .arg(expires_field(key))
            .arg(decided_field(key))
            .arg(now_ms())
            .arg(json)
            .arg(event.kind())
            .arg(event.data_json())
            .invoke_async(&mut self.conn())
            .await?;
        let text = |at: usize| {
            answer
                .get(at)
                .and_then(|value| redis::from_redis_value::<String>(value.clone()).ok())
                .unwrap_or_default()
        };
        let decided = match text(0).as_str() {
            "recorded" => {
                let events = text(2).parse().ok();
                self.notify(job_id, Written::counted(events)).await;
                self.forget_pending(job_id, &[held]).await;
                let requeue = text(1) == JobStatus::WaitingForApproval.as_str();
                if requeue {
                    self.unpark(job_id).await?;
                }
                Decided::Recorded { requeue }
            }
            "decided" => match serde_json::from_str(&text(1)) {
                Ok(first) => Decided::Already(first),
                Err(_) => Decided::NotHeld,
            },
            "expired" => Decided::Expired,
            "not_held" => Decided::NotHeld,
            _ => Decided::Ended,
        };
        Ok(decided)
    }

    /// Moves a parked job back to the index of unfinished jobs (scored now,
    /// so that the sweeper looks at it only once `runner.sweep_after` has
    /// passed), in order: it is never in neither index.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn unpark(&self, job_id: &JobId) -> Result<(), Error> {
        let mut unfinished = redis::pipe();
        unfinished
            .cmd("ZADD")
            .arg(self.keys.unfinished_jobs(job_id))
            .arg(now_ms())
            .arg(job_id.as_str())
            .ignore();
        let mut parked = redis::pipe();
        parked
            .cmd("ZREM")
            .arg(self.keys.parked_jobs(job_id))
            .arg(job_id.as_str())
            .ignore();
        self.conn().run_in_order(vec![unfinished, parked]).await?;
        Ok(())
    }

    /// Parked jobs whose wake time has passed (at most `limit`), for the
    /// sweeper to re-queue: their first held call expired.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn parked_due(&self, now: u64, limit: usize) -> Result<Vec<JobId>, Error> {
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

/// The prefix of a decision's field.
pub(super) const DECIDED: &str = "decided:";
/// The prefix of an expiry's field.
const EXPIRES: &str = "expires:";

pub(super) fn decided_field(wire_id: &str) -> String {
    format!("{DECIDED}{wire_id}")
}

fn expires_field(wire_id: &str) -> String {
    format!("{EXPIRES}{wire_id}")
}

/// What [`PARK`] returns when the lease is not held (or the job ended).
const LEASE_LOST: i64 = -1;
/// What [`PARK`] returns when a client asked to cancel the job.
const CANCEL_REQUESTED: i64 = -3;

/// KEYS: job, lease, approvals, events. ARGV: token, now_ms, event kind,
/// event data, n, the decision fields of the n calls the job waits for.
/// Returns -1 (lease lost, or the job ended), -3 (a cancel was asked: the
/// run ends the job), 0 (every call was decided: nothing written), or the
/// job's event count after its parking event.
static PARK: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return -1 end
local status = redis.call('HGET', KEYS[1], 'status')
if $ENDED then return -1 end
if redis.call('HGET', KEYS[1], 'cancel_requested') == '1' then return -3 end
local waiting = 0
for k = 1, tonumber(ARGV[5]) do
  if redis.call('HEXISTS', KEYS[3], ARGV[5 + k]) == 0 then waiting = waiting + 1 end
end
if waiting == 0 then return 0 end
redis.call('HSET', KEYS[1], 'status', '$WAITING', 'parked_at_ms', ARGV[2])
local events = redis.call('HINCRBY', KEYS[1], 'events', 1)
redis.call('XADD', KEYS[4], '0-' .. events, 'kind', ARGV[3], 'data', ARGV[4], 'ts', ARGV[2], 'final', '0')
redis.call('DEL', KEYS[2])
return events
",
    )
});

/// KEYS: job, approvals, events. ARGV: wire id, its expiry field, its
/// decision field, now_ms, the decision, event kind, event data. Writes the
/// decision only on a held, undecided, unexpired call of an unfinished job:
/// of two racing decisions exactly one is written. Returns `{recorded,
/// <status>, <events>}`, `{decided, <the first decision>}`, `{expired}`,
/// `{not_held}` or `{ended}`.
static DECIDE: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {'ended'} end
if $ENDED then return {'ended'} end
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 0 then return {'not_held'} end
local first = redis.call('HGET', KEYS[2], ARGV[3])
if first then return {'decided', first} end
local expires = tonumber(redis.call('HGET', KEYS[2], ARGV[2]))
if expires and expires <= tonumber(ARGV[4]) then return {'expired'} end
redis.call('HSET', KEYS[2], ARGV[3], ARGV[5])
local events = redis.call('HINCRBY', KEYS[1], 'events', 1)
redis.call('XADD', KEYS[3], '0-' .. events, 'kind', ARGV[6], 'data', ARGV[7], 'ts', ARGV[4], 'final', '0')
return {'recorded', status, tostring(events)}
",
    )
});

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::scripts::tests::{assert_ended_reads_status, assert_filled};

    #[test]
    fn the_approval_scripts_are_filled_and_never_write_an_ended_job() {
        for (name, script) in [("PARK", &*PARK), ("DECIDE", &*DECIDE)] {
            let shown = assert_filled(name, script);
            assert_ended_reads_status(name, &shown);
        }
    }

    #[test]
    fn a_held_calls_fields_are_its_request_and_expiry() {
        let held = HeldCall {
            wire_id: "w1",
            unknown: None,
            call_id: "call_1",
            tool: "transfer",
            arguments: "{\"amount\":5}",
            rule: "job",
            reason: "the job requires approval of every call".into(),
            expires_at_ms: 2_000,
        };
        let [(field, request), (expires, at)] = held.fields(1_000);
        assert_eq!(
            (field.as_str(), expires.as_str(), at.as_str()),
            ("w1", "expires:w1", "2000")
        );
        let request: ApprovalRequest = serde_json::from_str(&request).unwrap();
        assert_eq!(request.requested_at_ms, 1_000);
        assert_eq!(request.arguments, "{\"amount\":5}");
        // A verdict's key names its call's wire id, as an approval's does.
        assert_eq!(hold_key("w1", Some(2)), "w1@2");
        assert_eq!(wire_id_of(&hold_key("w1", Some(2))), "w1");
        assert_eq!(wire_id_of(&hold_key("w1", None)), "w1");
        // A decision's field can never be a call's: a wire id has no colon.
        assert!(!toolfleet_proto::call::is_valid_wire_id(&decided_field(
            "w1"
        )));
    }
}
