//! Step 0: is the call this worker's at all? Pure, so a table test covers
//! every answer.
//!
//! This comes before the claim: a call that is not ours must not reach the
//! ledger, where another pool's keys are refused (Redis would answer with an
//! error that looks like an outage, and the call would be handed back and
//! redelivered until it ages out) and where a forged call could otherwise
//! take a claim. A call that is not ours is never answered either: its
//! result is not ours to store, and a reply would only wake its job for
//! nothing. Its message is terminated, so JetStream never delivers it again.

use std::sync::Arc;

use toolfleet_proto::ToolCall;
use toolfleet_proto::names;

use super::LoadedTool;
use crate::tool_set::ToolSet;

/// The `reason` of `toolfleet_worker_calls_rejected_total` for a call that
/// is not this worker's.
pub(super) const NOT_OURS: &str = "misrouted";

/// The tool that runs `call`, delivered on `subject` by the consumer of
/// `pulled` (the tool whose queue this worker pulled it from): only when
/// the subject is that tool's call subject, the call names that tool, and
/// this worker serves it. `None` otherwise.
pub(super) fn own(
    tools: &ToolSet,
    pulled: &str,
    subject: &str,
    call: &ToolCall,
) -> Option<Arc<LoadedTool>> {
    let subject_tool = names::tool_of_call_subject(subject)?;
    if subject_tool != pulled || call.tool != pulled {
        return None;
    }
    tools.get(pulled)
}

// With the test pack's `sleep` as the one tool served.
#[cfg(all(test, feature = "test-tools"))]
mod tests {
    use super::*;
    use crate::tools::testing::Sleep;

    fn call(tool: &str) -> ToolCall {
        ToolCall {
            job_id: "job_1".into(),
            call_id: "call_1".into(),
            attempt: 1,
            tool: tool.into(),
            arguments: "{}".into(),
            deadline_ms: None,
            idempotency_key: "job_1:call_1".into(),
            reply_to: None,
        }
    }

    #[test]
    fn a_call_is_ours_only_on_its_own_tools_subject_and_consumer() {
        let tools = ToolSet::new(|manifest| manifest);
        tools.offer(Sleep).expect("the sleep schema compiles");
        // (what, pulled from, subject, call's tool, ours)
        let cases = [
            ("ours", "sleep", names::call_subject("sleep"), "sleep", true),
            (
                "another tool's call on our subject (a misrouted or forged call)",
                "sleep",
                names::call_subject("sleep"),
                "calculate",
                false,
            ),
            (
                "our call on another tool's subject",
                "sleep",
                names::call_subject("calculate"),
                "sleep",
                false,
            ),
            (
                "a subject that is not a call subject",
                "sleep",
                names::JOB_SUBJECT.to_owned(),
                "sleep",
                false,
            ),
            (
                "a deeper subject under ours",
                "sleep",
                format!("{}.x", names::call_subject("sleep")),
                "sleep",
                false,
            ),
            (
                "a tool this worker does not serve, consistent everywhere",
                "echo",
                names::call_subject("echo"),
                "echo",
                false,
            ),
        ];
        for (what, pulled, subject, tool, ours) in cases {
            let owned = own(&tools, pulled, &subject, &call(tool));
            assert_eq!(owned.is_some(), ours, "{what}");
            if let Some(owned) = owned {
                assert_eq!(owned.manifest.name, "sleep", "{what}");
            }
        }
    }
}
