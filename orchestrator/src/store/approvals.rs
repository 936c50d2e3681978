//! Held calls and their decisions (decision 0036): the runner holds a call
//! that needs a person's approval ([`JobStore::hold`], a commit of its run)
//! and parks its job when nothing else of the round can run
//! ([`JobStore::park`]); a person's decision ([`JobStore::decide`]) is
//! written once, whoever races for it, and queues a parked job again in
//! the same script.
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
//! Parking and waking a job are `park`'s; where the sweeper finds it,
//! `place`'s.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use toolfleet_proto::Envelope;

use crate::job::JobEvent;

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

    /// Whether this decision is a retry of `first`: the same decision,
    /// arguments, result, tenant and approver (the reason and the time may
    /// differ).
    pub fn repeats(&self, first: &Decision) -> bool {
        (
            self.choice,
            &self.arguments,
            &self.result,
            &self.tenant,
            &self.approver,
        ) == (
            first.choice,
            &first.arguments,
            &first.result,
            &first.tenant,
            &first.approver,
        )
    }

    /// Its `tool_call_decided` event, for the call `call_id`.
    pub(super) fn event(&self, call_id: &str) -> JobEvent {
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
}

/// The prefix of a decision's field.
pub(super) const DECIDED: &str = "decided:";
/// The prefix of an expiry's field.
const EXPIRES: &str = "expires:";

pub(super) fn decided_field(wire_id: &str) -> String {
    format!("{DECIDED}{wire_id}")
}

pub(super) fn expires_field(wire_id: &str) -> String {
    format!("{EXPIRES}{wire_id}")
}

#[cfg(test)]
mod tests {
    use super::*;

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
