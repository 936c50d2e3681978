//! The "model" of a call job (`SubmitJobRequest.call`, decision 0039):
//! there is none. Its first turn is the job's one call; once that call has
//! its result, its next turn ends the job with the result envelope as the
//! answer. So a call job's call is queued, checked, held for approval,
//! deduplicated, retried, traced and counted against its tenant's quotas
//! exactly as a model's call is, by the same runner.

use futures::future::BoxFuture;

use super::{ModelError, Provider, Turn, TurnRequest};
use crate::job::{CallSpec, Item};

/// The id of a call job's call, in its events and conversation.
pub(crate) const CALL_ID: &str = "call";

/// The turns of one call job.
pub(crate) struct OneCall {
    call: CallSpec,
}

impl OneCall {
    /// The turns of the call job of `call`.
    pub(crate) fn new(call: CallSpec) -> Self {
        Self { call }
    }
}

impl Provider for OneCall {
    fn turn<'a>(&'a self, request: TurnRequest<'a>) -> BoxFuture<'a, Result<Turn, ModelError>> {
        // By what the conversation holds, not the turn's number: a run
        // resumed after a crash finds the result there.
        let answered = request.items.iter().find_map(|item| match item {
            Item::ToolResult {
                call_id, output, ..
            } if call_id == CALL_ID => Some(output.clone()),
            _ => None,
        });
        let item = match answered {
            Some(envelope) => Item::Assistant {
                text: envelope,
                raw: None,
            },
            None => Item::ToolCall {
                call_id: CALL_ID.to_owned(),
                name: self.call.tool.clone(),
                arguments: self.call.arguments.clone(),
                raw: None,
            },
        };
        Box::pin(async move {
            Ok(Turn {
                items: vec![item],
                ..Turn::default()
            })
        })
    }
}
