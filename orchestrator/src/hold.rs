//! A held call (decision 0036): what it waits for, the key its request and
//! decision are kept under, what a person may decide, and, in one pure
//! function (`fate`), what becomes of the call given what was decided,
//! the clock and the timeout. The round asks `fate` and acts on the
//! answer; the store and the metrics stay outside it.
//!
//! A call is held for one of two things: a person's **approval** before it
//! runs (a [`Rule`] asked for it), or an operator's **verdict** on one
//! attempt whose outcome no worker could tell (the job asks,
//! `on_unknown_outcome = "ask"`). One call may be held for both, one after
//! the other (approved, then its outcome unknown): each hold has its own
//! key ([`Hold`]).

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use toolfleet_proto::{Envelope, ErrorCode, WireId};
use toolfleet_service::clock::millis;

use crate::approval::Rule;
use crate::job::JobEvent;

/// What a held call waits for, with the call's wire id: the key of its
/// request and decision in the job's approvals.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Hold {
    /// A person's approval of the call before it runs.
    Approval {
        /// The call's wire id.
        wire_id: WireId,
    },
    /// An operator's verdict on `attempt`, whose outcome is unknown.
    Verdict {
        /// The call's wire id.
        wire_id: WireId,
        /// The attempt.
        attempt: u32,
    },
}

impl Hold {
    /// The call's approval.
    pub fn approval(wire_id: &WireId) -> Self {
        Self::Approval {
            wire_id: wire_id.clone(),
        }
    }

    /// A verdict on the call's `attempt`.
    pub(crate) fn verdict(wire_id: &WireId, attempt: u32) -> Self {
        Self::Verdict {
            wire_id: wire_id.clone(),
            attempt,
        }
    }

    /// The held call's wire id.
    pub(crate) fn wire_id(&self) -> &WireId {
        match self {
            Self::Approval { wire_id } | Self::Verdict { wire_id, .. } => wire_id,
        }
    }

    /// `approval` or `outcome`, as the API and spans name the kind.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Self::Approval { .. } => "approval",
            Self::Verdict { .. } => "outcome",
        }
    }

    /// Its field in the job's approvals hash: the wire id for an approval,
    /// `<wire id>@<attempt>` for a verdict (a wire id holds no `@`, so the
    /// two never meet). The stored layout, read back by [`Hold::parse`].
    pub(crate) fn field(&self) -> String {
        self.to_string()
    }

    /// The hold a field of the approvals hash ([`Hold::field`]) names;
    /// `None` for a field of another shape, or whose wire id is not one.
    pub(crate) fn parse(field: &str) -> Option<Self> {
        match field.split_once('@') {
            None => Some(Self::approval(&WireId::parse(field)?)),
            Some((wire_id, attempt)) => Some(Self::verdict(
                &WireId::parse(wire_id)?,
                attempt.parse().ok()?,
            )),
        }
    }

    /// Whether `choice` answers this hold: an approval's choice for an
    /// approval, a verdict for a verdict.
    pub(crate) fn is_answered_by(&self, choice: Choice) -> bool {
        matches!(
            (self, choice),
            (Self::Approval { .. }, Choice::Approval(_))
                | (Self::Verdict { .. }, Choice::Verdict(_))
        )
    }
}

impl fmt::Display for Hold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Approval { wire_id } => f.write_str(wire_id),
            Self::Verdict { wire_id, attempt } => write!(f, "{wire_id}@{attempt}"),
        }
    }
}

/// Why a round holds a call, with what the hold's request and `fate`
/// need to know of it.
#[derive(Debug, Clone, Copy)]
pub enum HeldFor<'a> {
    /// Approval, asked by `rule`.
    Approval(Rule),
    /// A verdict on `attempt`, which its worker answered `answered`
    /// (`OUTCOME_UNKNOWN` or `MAX_DELIVERIES_EXCEEDED`).
    Verdict {
        /// The attempt.
        attempt: u32,
        /// What its worker answered.
        answered: &'a Envelope,
    },
}

/// The rule a verdict request is held by, in its record and metrics.
pub(crate) const VERDICT_RULE: &str = "on_unknown_outcome";

impl HeldFor<'_> {
    /// The hold of the call `wire_id`.
    pub(crate) fn hold(&self, wire_id: &WireId) -> Hold {
        match self {
            Self::Approval(_) => Hold::approval(wire_id),
            Self::Verdict { attempt, .. } => Hold::verdict(wire_id, *attempt),
        }
    }

    /// Who asked: `manifest`, `tenant`, `job`, or [`VERDICT_RULE`].
    pub(crate) fn rule(&self) -> &'static str {
        match self {
            Self::Approval(rule) => rule.source(),
            Self::Verdict { .. } => VERDICT_RULE,
        }
    }

    /// Why a call of `tool` waits, for people.
    pub(crate) fn reason(&self, tool: &str) -> String {
        match self {
            Self::Approval(rule) => rule.reason(tool),
            Self::Verdict { .. } => {
                "the job asks an operator when a call's outcome is unknown".to_owned()
            }
        }
    }
}

/// What a person decided on a held call: an approval's choice, or a
/// verdict. Stored as one word (`Choice::word`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Choice {
    /// On a call held for approval.
    Approval(ApprovalChoice),
    /// On an attempt whose outcome is unknown.
    Verdict(Verdict),
}

/// What an approver decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalChoice {
    /// The held call runs.
    Approved,
    /// The held call is answered `REJECTED_BY_APPROVER`.
    Rejected,
}

/// What an operator said of an attempt whose outcome is unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// It was applied: the model gets the given result.
    Applied,
    /// It was not applied: the call runs again.
    NotApplied,
    /// The call is answered `FAILED_BY_OPERATOR`.
    Failed,
}

impl Choice {
    /// As events and metrics name it.
    pub(crate) fn word(self) -> &'static str {
        match self {
            Self::Approval(ApprovalChoice::Approved) => "approved",
            Self::Approval(ApprovalChoice::Rejected) => "rejected",
            Self::Verdict(Verdict::Applied) => "applied",
            Self::Verdict(Verdict::NotApplied) => "not_applied",
            Self::Verdict(Verdict::Failed) => "failed",
        }
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
    /// For [`Verdict::Applied`]: the result the model gets (JSON).
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
    pub(crate) fn word(&self) -> &'static str {
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
    pub(crate) fn event(&self, call_id: &str) -> JobEvent {
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

/// What becomes of a held call ([`fate`]).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Fate {
    /// Run it: approved (with the approver's arguments, if they gave
    /// some), or, after a verdict that its attempt was not applied, run
    /// its next attempt.
    Run {
        /// The approver's arguments.
        arguments: Option<String>,
    },
    /// Answer it with `envelope`.
    Answer {
        /// The call's answer.
        envelope: Envelope,
        /// Whose answer it is.
        by: AnsweredBy,
    },
    /// It waits for a decision until then (Unix ms); it was held before.
    Wait {
        /// When the hold expires.
        until_ms: u64,
    },
    /// Hold it now (nothing was recorded yet): it waits until then.
    Hold {
        /// When the hold expires.
        until_ms: u64,
    },
}

/// Whose answer a held call gets ([`Fate::Answer`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AnsweredBy {
    /// An approver rejected the call.
    Approver,
    /// An operator's verdict: the result they gave, or their failure.
    Operator,
    /// Nobody decided in time: `APPROVAL_EXPIRED` for an approval, the
    /// worker's own envelope for a verdict.
    Expiry,
}

/// What becomes of a call held for `held_for`, given the `decision` made
/// on it (if any), the expiry of its recorded request (`None`: not held
/// yet), the clock (`now_ms`) and how long a hold waits (`timeout`).
///
/// A decision of the other kind (an approval's choice on a verdict's hold,
/// which the API never writes) is not a decision on this hold: the call
/// waits until its hold expires.
pub(crate) fn fate(
    held_for: HeldFor<'_>,
    decision: Option<&Decision>,
    expires_at_ms: Option<u64>,
    now_ms: u64,
    timeout: Duration,
) -> Fate {
    let decided = decision.map(|d| (d.choice, d));
    match (held_for, decided) {
        (HeldFor::Approval(_), Some((Choice::Approval(ApprovalChoice::Approved), decision))) => {
            Fate::Run {
                arguments: decision.arguments.clone(),
            }
        }
        (HeldFor::Approval(_), Some((Choice::Approval(ApprovalChoice::Rejected), decision))) => {
            Fate::Answer {
                envelope: Envelope::terminal(
                    ErrorCode::REJECTED_BY_APPROVER,
                    format!("a person rejected the call: {}", decision.reason),
                ),
                by: AnsweredBy::Approver,
            }
        }
        (HeldFor::Verdict { .. }, Some((Choice::Verdict(Verdict::Applied), decision))) => {
            let data = decision
                .result
                .as_deref()
                .and_then(|text| serde_json::from_str(text).ok())
                .unwrap_or_default();
            Fate::Answer {
                envelope: Envelope::Ok(data),
                by: AnsweredBy::Operator,
            }
        }
        (HeldFor::Verdict { .. }, Some((Choice::Verdict(Verdict::Failed), decision))) => {
            Fate::Answer {
                envelope: Envelope::terminal(
                    ErrorCode::FAILED_BY_OPERATOR,
                    format!("an operator failed the call: {}", decision.reason),
                ),
                by: AnsweredBy::Operator,
            }
        }
        (HeldFor::Verdict { .. }, Some((Choice::Verdict(Verdict::NotApplied), _))) => {
            Fate::Run { arguments: None }
        }
        // Undecided, or decided in the other kind.
        _ => undecided(held_for, expires_at_ms, now_ms, timeout),
    }
}

/// [`fate`] of a call nobody decided on.
fn undecided(
    held_for: HeldFor<'_>,
    expires_at_ms: Option<u64>,
    now_ms: u64,
    timeout: Duration,
) -> Fate {
    let Some(until_ms) = expires_at_ms else {
        return Fate::Hold {
            until_ms: now_ms.saturating_add(millis(timeout)),
        };
    };
    if until_ms > now_ms {
        return Fate::Wait { until_ms };
    }
    let envelope = match held_for {
        HeldFor::Approval(_) => Envelope::terminal(
            ErrorCode::APPROVAL_EXPIRED,
            "nobody approved or rejected the call in time; it was not run",
        ),
        // Nobody gave a verdict: the model is told what the worker said.
        HeldFor::Verdict { answered, .. } => answered.clone(),
    };
    Fate::Answer {
        envelope,
        by: AnsweredBy::Expiry,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 10_000;
    const TIMEOUT: Duration = Duration::from_secs(5);

    fn decision(choice: Choice, arguments: Option<&str>, result: Option<&str>) -> Decision {
        Decision {
            choice,
            reason: "because".into(),
            arguments: arguments.map(str::to_owned),
            result: result.map(str::to_owned),
            tenant: "acme".into(),
            approver: None,
            at_ms: NOW - 1,
        }
    }

    fn approve(arguments: Option<&str>) -> Decision {
        decision(Choice::Approval(ApprovalChoice::Approved), arguments, None)
    }

    fn give(verdict: Verdict, result: Option<&str>) -> Decision {
        decision(Choice::Verdict(verdict), None, result)
    }

    /// A request whose expiry is still ahead, and one whose expiry is now.
    const HELD: Option<u64> = Some(NOW + 1);
    const EXPIRED: Option<u64> = Some(NOW);

    fn run(arguments: Option<&str>) -> Fate {
        Fate::Run {
            arguments: arguments.map(str::to_owned),
        }
    }

    fn answer(envelope: Envelope, by: AnsweredBy) -> Fate {
        Fate::Answer { envelope, by }
    }

    /// A row: what it shows, its decision, its request's expiry, and the
    /// call's fate.
    type Row<'a> = (&'a str, Option<&'a Decision>, Option<u64>, Fate);

    fn assert_fates(held_for: HeldFor<'_>, rows: Vec<Row<'_>>) {
        for (row, decision, expires, expected) in rows {
            let fate = fate(held_for, decision, expires, NOW, TIMEOUT);
            assert_eq!(fate, expected, "{row}");
        }
    }

    /// A held call's fate on an approval: approved (with the approver's
    /// arguments even after the expiry), rejected, not held yet, waiting,
    /// expired, and a verdict on it taken for no decision.
    #[test]
    fn an_approvals_fate_follows_its_decision_and_the_clock() {
        let approval = HeldFor::Approval(Rule::Job { every_tool: true });
        let (approved, approved_edited) = (approve(None), approve(Some("{}")));
        let reject = decision(Choice::Approval(ApprovalChoice::Rejected), None, None);
        let failed = give(Verdict::Failed, None);
        let rejected = Envelope::terminal(
            ErrorCode::REJECTED_BY_APPROVER,
            "a person rejected the call: because",
        );
        let expired = Envelope::terminal(
            ErrorCode::APPROVAL_EXPIRED,
            "nobody approved or rejected the call in time; it was not run",
        );
        let rows: Vec<Row<'_>> = vec![
            ("approved", Some(&approved), HELD, run(None)),
            (
                "approved with arguments, even after the expiry",
                Some(&approved_edited),
                EXPIRED,
                run(Some("{}")),
            ),
            (
                "rejected",
                Some(&reject),
                HELD,
                answer(rejected, AnsweredBy::Approver),
            ),
            (
                "approval not held yet",
                None,
                None,
                Fate::Hold {
                    until_ms: NOW + 5_000,
                },
            ),
            (
                "approval waiting",
                None,
                HELD,
                Fate::Wait { until_ms: NOW + 1 },
            ),
            (
                "approval expired",
                None,
                EXPIRED,
                answer(expired, AnsweredBy::Expiry),
            ),
            (
                "a verdict on an approval is no decision",
                Some(&failed),
                HELD,
                Fate::Wait { until_ms: NOW + 1 },
            ),
        ];
        assert_fates(approval, rows);
    }

    /// A held call's fate on an operator's verdict: applied (with its result,
    /// or null when that is not JSON), not applied (run again), failed, not
    /// held yet, waiting, expired (the worker's answer), and an approval on
    /// it taken for no decision.
    #[test]
    fn a_verdicts_fate_follows_its_decision_and_the_clock() {
        let unknown = Envelope::terminal(ErrorCode::OUTCOME_UNKNOWN, "the worker died");
        let verdict = HeldFor::Verdict {
            attempt: 2,
            answered: &unknown,
        };
        let applied = give(Verdict::Applied, Some(r#"{"n":1}"#));
        let applied_no_json = give(Verdict::Applied, Some("{"));
        let (not_applied, failed) = (give(Verdict::NotApplied, None), give(Verdict::Failed, None));
        let approved = approve(None);
        let by_operator = |envelope| answer(envelope, AnsweredBy::Operator);
        let failed_by = Envelope::terminal(
            ErrorCode::FAILED_BY_OPERATOR,
            "an operator failed the call: because",
        );
        let rows: Vec<Row<'_>> = vec![
            (
                "applied",
                Some(&applied),
                HELD,
                by_operator(Envelope::Ok(serde_json::json!({"n": 1}))),
            ),
            (
                "applied with a result that is not JSON",
                Some(&applied_no_json),
                HELD,
                by_operator(Envelope::Ok(serde_json::Value::Null)),
            ),
            ("not applied", Some(&not_applied), HELD, run(None)),
            ("failed", Some(&failed), HELD, by_operator(failed_by)),
            (
                "verdict not held yet",
                None,
                None,
                Fate::Hold {
                    until_ms: NOW + 5_000,
                },
            ),
            (
                "verdict waiting",
                None,
                HELD,
                Fate::Wait { until_ms: NOW + 1 },
            ),
            (
                "verdict expired: the worker's answer",
                None,
                EXPIRED,
                answer(unknown.clone(), AnsweredBy::Expiry),
            ),
            (
                "an approval on a verdict is no decision, and it expires",
                Some(&approved),
                EXPIRED,
                answer(unknown.clone(), AnsweredBy::Expiry),
            ),
        ];
        assert_fates(verdict, rows);
    }

    fn w(id: &str) -> WireId {
        WireId::parse(id).expect("a wire id")
    }

    #[test]
    fn a_holds_field_is_its_stored_key_and_reads_back() {
        for (hold, field) in [
            (Hold::approval(&w("w1")), "w1"),
            (Hold::verdict(&w("w1"), 2), "w1@2"),
        ] {
            assert_eq!(hold.field(), field);
            assert_eq!(Hold::parse(field), Some(hold.clone()));
            assert_eq!(hold.wire_id(), "w1");
        }
        assert_eq!(Hold::parse("w1@two"), None);
        assert_eq!(Hold::parse("w:1"), None, "not a wire id");
        assert_eq!(Hold::approval(&w("w1")).kind(), "approval");
        assert_eq!(Hold::verdict(&w("w1"), 1).kind(), "outcome");
    }

    #[test]
    fn a_choice_is_stored_as_the_one_word_of_before_and_answers_its_own_kind() {
        let every = [
            (Choice::Approval(ApprovalChoice::Approved), "approved"),
            (Choice::Approval(ApprovalChoice::Rejected), "rejected"),
            (Choice::Verdict(Verdict::Applied), "applied"),
            (Choice::Verdict(Verdict::NotApplied), "not_applied"),
            (Choice::Verdict(Verdict::Failed), "failed"),
        ];
        for (choice, word) in every {
            let json = serde_json::to_string(&choice).unwrap();
            assert_eq!(json, format!("\"{word}\""));
            assert_eq!(serde_json::from_str::<Choice>(&json).unwrap(), choice);
            assert_eq!(choice.word(), word);
            let verdict = matches!(choice, Choice::Verdict(_));
            assert_eq!(Hold::verdict(&w("w"), 1).is_answered_by(choice), verdict);
            assert_eq!(Hold::approval(&w("w")).is_answered_by(choice), !verdict);
        }
        assert!(serde_json::from_str::<Choice>("\"maybe\"").is_err());
    }
}
