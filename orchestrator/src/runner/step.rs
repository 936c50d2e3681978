//! The runner's decisions as pure functions of the job's state, so that every
//! branch of the model loop has a table test and the loop itself only does
//! what they say:
//! - [`next_step`]: what a run does next, from the conversation, the spec,
//!   the clock and why (if at all) it was told to stop;
//! - [`ack_for`]: what happens to the job's queue message once a delivery is
//!   handled.

use std::collections::HashMap;
use std::time::Duration;

use async_nats::jetstream::AckKind;

use crate::budget::Over;
use crate::dispatch::PlannedCall;
use crate::job::{Ending, Item, JobErrorCode, JobSpec, WireIds, assistant_text};
use toolfleet_proto::call::EventId;

/// Why a run was told to stop. The first reason set wins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StopReason {
    /// The process is shutting down (or the drain ran out): hand the job to
    /// another replica.
    Shutdown,
    /// Another runner took the job over: stop at once, write nothing.
    LeaseLost,
    /// A client asked to cancel the job.
    CancelRequested,
}

/// What a run does next.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Step {
    /// End the job.
    Finish(Ending),
    /// Stop without ending the job (see the reason).
    Stop(StopReason),
    /// Dispatch the calls that have no result yet, in the model's order.
    Dispatch(Vec<PlannedCall>),
    /// Ask the model for its next turn.
    PlayTurn,
}

/// What the run knows besides the conversation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RunState<'a> {
    /// The job.
    pub(crate) spec: &'a JobSpec,
    /// Turns with tool calls so far.
    pub(crate) rounds: u32,
    /// A cancel was requested before this run started.
    pub(crate) cancel_requested: bool,
    /// Why the run was told to stop, if it was.
    pub(crate) stop: Option<StopReason>,
    /// Unix ms now.
    pub(crate) now_ms: u64,
    /// How the job's calls are named on the wire.
    pub(crate) wire_ids: &'a WireIds,
    /// The budget the job spent, if it did
    /// (`crate::spend::RunBudget::over`): it gets no more turns.
    pub(crate) over_budget: Option<&'a Over>,
}

/// The next step of a run over `items`, the conversation as stored. It also
/// covers a run that resumes where another one stopped: calls without a
/// result are dispatched, a final answer already stored ends the job, and a
/// turn already checkpointed is never played again.
pub(crate) fn next_step(items: &[Item], state: RunState<'_>) -> Step {
    let cancel = state.cancel_requested || state.stop == Some(StopReason::CancelRequested);
    match state.stop {
        // Another runner owns the job: not even a cancel is ours to write.
        Some(StopReason::LeaseLost) => return Step::Stop(StopReason::LeaseLost),
        // A requested cancel wins over a shutdown: the job needs no new home.
        _ if cancel => return Step::Finish(Ending::Cancelled),
        Some(reason) => return Step::Stop(reason),
        None => {}
    }
    if state.now_ms >= state.spec.deadline_ms {
        return Step::Finish(deadline_exceeded());
    }
    let pending = pending_calls(items, state.wire_ids);
    if !pending.is_empty() {
        // A resumed run whose last checkpointed turn was already over the
        // limit ends as an uninterrupted run would have.
        if state.rounds > state.spec.max_tool_rounds {
            return Step::Finish(max_rounds_exceeded(state.spec));
        }
        return Step::Dispatch(pending);
    }
    if let Some(text) = final_answer(items) {
        // Resumed after the final turn was stored but before the end was.
        return Step::Finish(Ending::Succeeded(text));
    }
    if let Some(over) = state.over_budget {
        return Step::Finish(crate::spend::ending(over));
    }
    Step::PlayTurn
}

/// How a just-played turn ends the job, if it does: no calls means the
/// model answered; a round over the limit fails the job.
pub(crate) fn after_turn(turn: &[Item], rounds: u32, spec: &JobSpec) -> Option<Ending> {
    let calls = turn
        .iter()
        .any(|item| matches!(item, Item::ToolCall { .. }));
    if !calls {
        return Some(Ending::Succeeded(assistant_text(turn)));
    }
    (rounds > spec.max_tool_rounds).then(|| max_rounds_exceeded(spec))
}

/// The job's deadline passed.
pub(crate) fn deadline_exceeded() -> Ending {
    Ending::failed(
        JobErrorCode::DeadlineExceeded,
        "the job did not finish before its deadline",
    )
}

fn max_rounds_exceeded(spec: &JobSpec) -> Ending {
    Ending::failed(
        JobErrorCode::MaxToolRoundsExceeded,
        format!(
            "the model asked for tools in more than {} rounds",
            spec.max_tool_rounds
        ),
    )
}

/// The calls of the conversation that have no result yet, in order, with
/// their wire ids.
///
/// A model's call ids are data: the k-th result with an id answers the k-th
/// call with that id, and only the first call with an id runs (the others
/// are duplicates). A call's wire id is [`WireIds::of`] its position in the
/// conversation, which never changes (items are only appended), so a
/// resumed round finds its earlier attempts.
pub(crate) fn pending_calls(items: &[Item], wire_ids: &WireIds) -> Vec<PlannedCall> {
    let mut answered: HashMap<&str, usize> = HashMap::new();
    for item in items {
        if let Item::ToolResult { call_id, .. } = item {
            *answered.entry(call_id.as_str()).or_default() += 1;
        }
    }
    let mut seen: HashMap<&str, usize> = HashMap::new();
    let mut pending = Vec::new();
    for (position, item) in items.iter().enumerate() {
        let Item::ToolCall {
            call_id,
            name,
            arguments,
            ..
        } = item
        else {
            continue;
        };
        let occurrence = seen.entry(call_id.as_str()).or_default();
        let duplicate = *occurrence > 0;
        let is_answered = answered
            .get(call_id.as_str())
            .is_some_and(|n| *n > *occurrence);
        *occurrence += 1;
        if is_answered {
            continue;
        }
        let wire_id = wire_ids.of(position, call_id, duplicate);
        pending.push(PlannedCall {
            call_id: call_id.clone(),
            wire_id,
            event_id: EventId::of(position, call_id, duplicate),
            name: name.clone(),
            arguments: arguments.clone(),
            duplicate,
        });
    }
    pending
}

/// The answer of a stored final turn: the assistant text at the end of the
/// conversation (after its reasoning items), if the conversation ends with
/// the model speaking.
fn final_answer(items: &[Item]) -> Option<String> {
    let start = items
        .iter()
        .rposition(|item| !matches!(item, Item::Assistant { .. } | Item::Reasoning { .. }))
        .map_or(0, |last_other| last_other + 1);
    let tail = &items[start..];
    tail.iter()
        .any(|item| matches!(item, Item::Assistant { .. }))
        .then(|| assistant_text(tail))
}

/// How a delivery of a job message was handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Delivery {
    /// The job has ended (now, or before this delivery), or was recorded as
    /// lost: the message is done.
    Done,
    /// Another live runner holds the job; look again once its lease could
    /// have expired.
    HeldElsewhere,
    /// This replica is shutting down and gave the job up: redeliver at once.
    HandedBack,
    /// Another runner took the job over and owns its redelivered message:
    /// leave this stale delivery alone.
    Stale,
    /// Redis failed on the way: try again shortly.
    RetryLater,
    /// Not a job id: nothing this service queued, and never runnable.
    /// Terminate it, so that JetStream never delivers it again.
    Rejected,
    /// The job, or its message, is in a format this release does not read
    /// (decision 0059): left as it is for an orchestrator of a newer
    /// release, delivered again after [`NEWER_FORMAT_WAIT`].
    Newer,
}

/// Pause before a job this release cannot read is delivered again: long
/// enough not to spin while no newer orchestrator runs.
pub(crate) const NEWER_FORMAT_WAIT: Duration = Duration::from_secs(30);

/// Pause before a job whose store failed is delivered again.
const RETRY_LATER: Duration = Duration::from_secs(1);

/// The one mapping from a handled delivery to its JetStream acknowledgement
/// (`None`: neither ack nor nak).
pub(crate) fn ack_for(delivery: Delivery, lease_ttl: Duration) -> Option<AckKind> {
    match delivery {
        Delivery::Done => Some(AckKind::Ack),
        Delivery::HeldElsewhere => Some(AckKind::Nak(Some(lease_ttl))),
        Delivery::HandedBack => Some(AckKind::Nak(None)),
        Delivery::Stale => None,
        Delivery::RetryLater => Some(AckKind::Nak(Some(RETRY_LATER))),
        Delivery::Rejected => Some(AckKind::Term),
        Delivery::Newer => Some(AckKind::Nak(Some(NEWER_FORMAT_WAIT))),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::job::ProviderKind;
    use toolfleet_proto::WireId;

    /// A scripted job of tenant `default`, with two rounds and no limits.
    pub(crate) fn spec() -> JobSpec {
        JobSpec {
            input: "hi".into(),
            instructions: String::new(),
            provider: ProviderKind::Scripted,
            model: String::new(),
            script: None,
            max_tokens: None,
            stream: false,
            no_result_cache: false,
            call: None,
            tools: Vec::new(),
            max_tool_rounds: 2,
            parallel_tool_calls: true,
            deadline_ms: 1_000,
            metadata: BTreeMap::new(),
            tenant: "default".into(),
            submitter: None,
            approval: Default::default(),
            limits: Default::default(),
            budget: Default::default(),
        }
    }

    fn user() -> Item {
        Item::User { text: "hi".into() }
    }
    fn call(id: &str) -> Item {
        Item::ToolCall {
            call_id: id.into(),
            name: "echo".into(),
            arguments: "{}".into(),
            raw: None,
        }
    }
    fn result(id: &str) -> Item {
        Item::ToolResult {
            call_id: id.into(),
            name: "echo".into(),
            output: "{}".into(),
            attempts: 1,
        }
    }
    fn over_budget() -> &'static Over {
        static OVER: Over = Over::Job(crate::budget::Exceeded {
            limit: crate::budget::Limit::ToolCalls,
            spent: 4,
            max: 4,
        });
        &OVER
    }
    fn said(text: &str) -> Item {
        Item::Assistant {
            text: text.into(),
            raw: None,
        }
    }
    fn reasoning() -> Item {
        Item::Reasoning {
            raw: serde_json::json!({"type": "reasoning"}),
        }
    }
    fn planned(id: &str) -> PlannedCall {
        PlannedCall::new(id, "echo", "{}")
    }

    #[test]
    fn wire_ids_come_from_the_job_secret_and_the_position_alone() {
        let items = vec![user(), call("call_a"), call("call_a"), call("bad\nid")];
        let secret = WireIds::Secret("0123456789abcdef0123456789abcdef".into());
        let ids: Vec<WireId> = pending_calls(&items, &secret)
            .into_iter()
            .map(|p| p.wire_id)
            .collect();
        assert_eq!(ids.len(), 3);
        // Events still show the ids the conversation has, where safe.
        let shown: Vec<EventId> = pending_calls(&items, &secret)
            .into_iter()
            .map(|p| p.event_id)
            .collect();
        assert_eq!(shown, ["call_a", "x.2", "x.3"]);
        for id in &ids {
            assert_eq!(id.len(), 25, "{id}");
            assert!(id.starts_with('c'), "{id}");
            assert!(toolfleet_proto::call::is_valid_wire_id(id), "{id}");
        }
        assert!(ids[0] != ids[1] && ids[1] != ids[2], "{ids:?}");
        // Stable: a resumed run over more items finds the same ids.
        let mut answered = items.clone();
        answered.push(result("call_a"));
        let resumed: Vec<WireId> = pending_calls(&answered, &secret)
            .into_iter()
            .map(|p| p.wire_id)
            .collect();
        assert_eq!(resumed, ids[1..]);
        // Nothing of the model's id, nor anything one job's ids tell about
        // another's: a different secret names every call differently.
        let renamed = vec![user(), call("other"), call("other"), call("x")];
        let same_positions: Vec<WireId> = pending_calls(&renamed, &secret)
            .into_iter()
            .map(|p| p.wire_id)
            .collect();
        assert_eq!(same_positions, ids);
        let other = WireIds::Secret(WireIds::new_secret());
        for planned in pending_calls(&items, &other) {
            assert!(!ids.contains(&planned.wire_id));
        }
        assert_eq!(format!("{secret:?}"), "WireIds::Secret(..)");
    }

    #[test]
    fn legacy_jobs_put_model_call_ids_on_the_wire_when_safe_and_stable() {
        let items = vec![
            user(),
            call("call_a"),
            call("bad\nid: with spaces"),
            call("call_a"),
            call(&"x".repeat(65)),
            call(""),
        ];
        let pending = pending_calls(&items, &WireIds::Legacy);
        let view: Vec<(&str, &str, bool)> = pending
            .iter()
            .map(|p| (p.call_id.as_str(), p.wire_id.as_str(), p.duplicate))
            .collect();
        let long = "x".repeat(65);
        assert_eq!(
            view,
            [
                ("call_a", "call_a", false),
                ("bad\nid: with spaces", "x.2", false),
                ("call_a", "x.3", true),
                (long.as_str(), "x.4", false),
                ("", "x.5", false),
            ]
        );
        // The first result of an id answers the first call with it, the
        // second the second; the wire ids of the rest do not move.
        let mut answered = items.clone();
        answered.push(result("call_a"));
        let pending = pending_calls(&answered, &WireIds::Legacy);
        assert_eq!(pending[0].wire_id, "x.2");
        assert_eq!(
            (pending[1].wire_id.as_str(), pending[1].duplicate),
            ("x.3", true)
        );
        answered.push(result("call_a"));
        assert_eq!(pending_calls(&answered, &WireIds::Legacy).len(), 3);
        for planned in pending_calls(&items, &WireIds::Legacy) {
            assert!(
                toolfleet_proto::call::is_valid_call_id(&planned.wire_id)
                    || planned.wire_id.starts_with("x.")
            );
            assert!(!planned.wire_id.contains([':', '\n', ' ']));
        }
    }

    /// A case of `next_step`: its story, the job's items, the run's state,
    /// and what the step must be.
    type Case<'a> = (&'a str, Vec<Item>, RunState<'a>, Box<dyn Fn(&Step) -> bool>);

    /// Every branch of `next_step`, from a run in its first round at 500 ms
    /// of a job whose deadline is 1 s.
    fn next_step_cases(state: RunState<'_>) -> Vec<Case<'_>> {
        let failed = |code| move |step: &Step| matches!(step, Step::Finish(Ending::Failed(e)) if e.code == code);
        vec![
            (
                "a new job plays a turn",
                vec![user()],
                state,
                Box::new(|s| *s == Step::PlayTurn),
            ),
            (
                "pending calls are dispatched in order",
                vec![user(), call("a"), call("b"), result("a")],
                state,
                Box::new(|s| *s == Step::Dispatch(vec![planned("b")])),
            ),
            (
                "answered calls lead to the next turn",
                vec![user(), call("a"), result("a")],
                state,
                Box::new(|s| *s == Step::PlayTurn),
            ),
            (
                "a stored final turn ends the job with its text",
                vec![user(), reasoning(), said("4"), said("2")],
                state,
                Box::new(|s| *s == Step::Finish(Ending::Succeeded("42".into()))),
            ),
            (
                "text before the calls is not an answer",
                vec![user(), said("let me see"), call("a"), result("a")],
                state,
                Box::new(|s| *s == Step::PlayTurn),
            ),
            (
                "a requested cancel wins",
                vec![user(), call("a")],
                RunState {
                    cancel_requested: true,
                    ..state
                },
                Box::new(|s| *s == Step::Finish(Ending::Cancelled)),
            ),
            (
                "a cancel signalled during the run",
                vec![user()],
                RunState {
                    stop: Some(StopReason::CancelRequested),
                    ..state
                },
                Box::new(|s| *s == Step::Finish(Ending::Cancelled)),
            ),
            (
                "shutdown hands the job back",
                vec![user(), call("a")],
                RunState {
                    stop: Some(StopReason::Shutdown),
                    ..state
                },
                Box::new(|s| *s == Step::Stop(StopReason::Shutdown)),
            ),
            (
                "a cancel requested before a shutdown still cancels",
                vec![user()],
                RunState {
                    stop: Some(StopReason::Shutdown),
                    cancel_requested: true,
                    ..state
                },
                Box::new(|s| *s == Step::Finish(Ending::Cancelled)),
            ),
            (
                "a lost lease stops before anything else",
                vec![user()],
                RunState {
                    stop: Some(StopReason::LeaseLost),
                    cancel_requested: true,
                    ..state
                },
                Box::new(|s| *s == Step::Stop(StopReason::LeaseLost)),
            ),
            (
                "a spent budget ends the job instead of a turn",
                vec![user(), call("a"), result("a")],
                RunState {
                    over_budget: Some(over_budget()),
                    ..state
                },
                Box::new(|s| *s == Step::Finish(crate::spend::ending(over_budget()))),
            ),
            (
                "a spent budget lets the round's calls be answered first",
                vec![user(), call("a")],
                RunState {
                    over_budget: Some(over_budget()),
                    ..state
                },
                Box::new(|s| matches!(s, Step::Dispatch(calls) if calls.len() == 1)),
            ),
            (
                "the deadline",
                vec![user(), call("a")],
                RunState {
                    now_ms: 1_000,
                    ..state
                },
                Box::new(failed(JobErrorCode::DeadlineExceeded)),
            ),
            (
                "a resumed turn over the round limit",
                vec![user(), call("a")],
                RunState { rounds: 3, ..state },
                Box::new(failed(JobErrorCode::MaxToolRoundsExceeded)),
            ),
        ]
    }

    /// Each case of `next_step_cases` takes the step its story says.
    #[test]
    fn next_step_covers_every_branch() {
        let spec = spec();
        let state = RunState {
            spec: &spec,
            rounds: 1,
            cancel_requested: false,
            stop: None,
            now_ms: 500,
            wire_ids: &WireIds::Legacy,
            over_budget: None,
        };
        for (story, items, state, expected) in next_step_cases(state) {
            let step = next_step(&items, state);
            assert!(expected(&step), "{story}: got {step:?}");
        }
    }

    #[test]
    fn after_turn_ends_on_an_answer_or_too_many_rounds() {
        let spec = spec();
        assert_eq!(
            after_turn(&[reasoning(), said("a"), said("b")], 1, &spec),
            Some(Ending::Succeeded("ab".into()))
        );
        assert_eq!(
            after_turn(&[], 0, &spec),
            Some(Ending::Succeeded(String::new()))
        );
        assert_eq!(after_turn(&[call("a")], 2, &spec), None);
        assert!(matches!(
            after_turn(&[call("a")], 3, &spec),
            Some(Ending::Failed(e)) if e.code == JobErrorCode::MaxToolRoundsExceeded
        ));
    }

    #[test]
    fn every_delivery_has_its_ack() {
        let ttl = Duration::from_secs(15);
        let cases = [
            (Delivery::Done, Some(AckKind::Ack)),
            (Delivery::HeldElsewhere, Some(AckKind::Nak(Some(ttl)))),
            (Delivery::HandedBack, Some(AckKind::Nak(None))),
            (Delivery::Stale, None),
            (Delivery::RetryLater, Some(AckKind::Nak(Some(RETRY_LATER)))),
            (Delivery::Rejected, Some(AckKind::Term)),
            (Delivery::Newer, Some(AckKind::Nak(Some(NEWER_FORMAT_WAIT)))),
        ];
        for (delivery, ack) in cases {
            assert_eq!(
                format!("{:?}", ack_for(delivery, ttl)),
                format!("{ack:?}"),
                "{delivery:?}"
            );
        }
    }
}
