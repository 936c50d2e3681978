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
//! Layout of `tf:{<job>}:approvals`, a hash by hold ([`Hold::field`]: the
//! wire id for an approval, `<wire id>@<attempt>` for a verdict):
//! `<key>` -> the request ([`ApprovalRequest`], JSON), `expires:<key>` ->
//! its expiry in Unix ms (for the scripts), `decided:<key>` -> the
//! [`Decision`] (JSON).
//! Parking and waking a job are `park`'s; where the sweeper finds it,
//! `place`'s.

use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::hold::{Decision, HeldFor, Hold};
use crate::job::JobEvent;
use toolfleet_proto::{EventId, WireId};

use super::*;

/// A call to hold, for [`JobStore::hold`].
#[derive(Debug, Clone)]
pub struct HeldCall<'a> {
    /// The id its attempts and holds are recorded under.
    pub wire_id: &'a WireId,
    /// What it is held for, and why.
    pub held_for: HeldFor<'a>,
    /// The id the job's events show it by.
    pub call_id: &'a EventId,
    /// The tool.
    pub tool: &'a str,
    /// The version of the tool its model was shown (its contract hash),
    /// which it runs on and its arguments are checked against.
    pub version: Option<Arc<str>>,
    /// The model's arguments.
    pub arguments: &'a str,
    /// When it is answered `APPROVAL_EXPIRED` (an approval), or the
    /// worker's envelope (a verdict), if nobody decided (Unix ms).
    pub expires_at_ms: u64,
}

impl HeldCall<'_> {
    /// Its hold, the key of its request in the job's approvals.
    pub(crate) fn hold(&self) -> Hold {
        self.held_for.hold(self.wire_id)
    }

    /// Its `tool_call_approval_requested` event, or
    /// `tool_call_verdict_requested` for a verdict.
    pub(super) fn event(&self) -> JobEvent {
        match self.held_for {
            HeldFor::Approval(rule) => JobEvent::ToolCallApprovalRequested {
                arguments: self.arguments.to_owned(),
                call_id: self.call_id.to_string(),
                expires_at: self.expires_at_ms,
                reason: rule.reason(self.tool),
                rule: rule.source().to_owned(),
                tool: self.tool.to_owned(),
            },
            HeldFor::Verdict { attempt, answered } => {
                let error = answered.error();
                JobEvent::ToolCallVerdictRequested {
                    attempt,
                    call_id: self.call_id.to_string(),
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
        let (attempt, outcome) = match self.held_for {
            HeldFor::Approval(_) => (None, None),
            HeldFor::Verdict { attempt, answered } => (Some(attempt), Some(answered.to_json())),
        };
        let request = ApprovalRequest {
            call_id: self.call_id.clone(),
            tool: self.tool.to_owned(),
            tool_version: self.version.as_deref().map(str::to_owned),
            arguments: self.arguments.to_owned(),
            rule: self.held_for.rule().to_owned(),
            reason: self.held_for.reason(self.tool),
            requested_at_ms: now,
            expires_at_ms: self.expires_at_ms,
            attempt,
            outcome,
        };
        let json = serde_json::to_string(&request).expect("a request serializes");
        let field = self.hold().field();
        let expires = expires_field(&field);
        [(field, json), (expires, self.expires_at_ms.to_string())]
    }
}

/// A held call, as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRequest {
    /// The id the job's events show it by.
    pub call_id: EventId,
    /// The tool.
    pub tool: String,
    /// The version of the tool the call was made for (its contract hash);
    /// absent in a record written before pinning (decision 0058).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_version: Option<String>,
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
    pub(crate) fn kind(&self) -> &'static str {
        if self.attempt.is_some() {
            "outcome"
        } else {
            "approval"
        }
    }
}

/// A job's held calls and the decisions made, by hold.
#[derive(Debug, Clone, Default)]
pub struct Approvals {
    /// Every call held in the job.
    pub requests: HashMap<Hold, ApprovalRequest>,
    /// The decisions made.
    pub decisions: HashMap<Hold, Decision>,
}

impl Approvals {
    /// The hold of the call `call_id` (as events name it) that a decision
    /// is for: the one waiting, else the latest (whose decision a second
    /// one is told of). With its hold.
    pub(crate) fn hold_of(&self, call_id: &EventId) -> Option<(&Hold, &ApprovalRequest)> {
        self.requests
            .iter()
            .filter(|(_, request)| request.call_id == *call_id)
            .max_by_key(|(key, request)| {
                (!self.decisions.contains_key(*key), request.requested_at_ms)
            })
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
            if let Some(held) = field.strip_prefix(DECIDED) {
                if let (Some(hold), Ok(decision)) =
                    (Hold::parse(held), serde_json::from_str(&value))
                {
                    approvals.decisions.insert(hold, decision);
                }
            } else if !field.starts_with(EXPIRES)
                && let (Some(hold), Ok(request)) =
                    (Hold::parse(&field), serde_json::from_str(&value))
            {
                approvals.requests.insert(hold, request);
            }
        }
        Ok(approvals)
    }
}

/// The prefix of a decision's field.
pub(super) const DECIDED: &str = "decided:";
/// The prefix of an expiry's field.
const EXPIRES: &str = "expires:";

/// The field of the decision on the hold whose field is `hold`.
pub(super) fn decided_field(hold: &str) -> String {
    format!("{DECIDED}{hold}")
}

/// The field of the expiry of the hold whose field is `hold`.
pub(super) fn expires_field(hold: &str) -> String {
    format!("{EXPIRES}{hold}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::approval::Rule;
    use toolfleet_proto::Envelope;

    #[test]
    fn a_held_calls_fields_are_its_request_and_expiry() {
        let (wire_id, call_id) = (WireId::parse("w1"), EventId::parse("call_1"));
        let held = HeldCall {
            wire_id: wire_id.as_ref().expect("a wire id"),
            held_for: HeldFor::Approval(Rule::Job { every_tool: true }),
            call_id: call_id.as_ref().expect("an event id"),
            tool: "transfer",
            version: Some("c0ffee".into()),
            arguments: "{\"amount\":5}",
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
        assert_eq!(request.tool_version.as_deref(), Some("c0ffee"));
        assert_eq!(
            (request.rule.as_str(), request.reason.as_str()),
            ("job", "the job requires approval of every call")
        );
        // A verdict's fields name its attempt, and keep the worker's answer.
        let unknown = Envelope::terminal(toolfleet_proto::ErrorCode::OUTCOME_UNKNOWN, "died");
        let verdict = HeldCall {
            held_for: HeldFor::Verdict {
                attempt: 2,
                answered: &unknown,
            },
            ..held
        };
        let [(field, request), _] = verdict.fields(1_000);
        assert_eq!(field, "w1@2");
        let request: ApprovalRequest = serde_json::from_str(&request).unwrap();
        assert_eq!(request.attempt, Some(2));
        assert_eq!(request.outcome, Some(unknown.to_json()));
        assert_eq!(request.rule, crate::hold::VERDICT_RULE);
        // A decision's field can never be a call's: a wire id has no colon.
        assert!(!toolfleet_proto::call::is_valid_wire_id(&decided_field(
            "w1"
        )));
    }
}
