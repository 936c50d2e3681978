//! What each turn streamed by a runner in this process has said so far,
//! for a watcher that joins in the middle of it: it gets the text so far
//! as one delta, then the live ones (docs/api.md, "Streaming"). Kept in
//! memory only, for as long as the turn streams; bounded by what the
//! provider reads (its `max_response_bytes`).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use crate::job::{DeltaPiece, JobId, TurnDelta};

/// One streaming turn so far.
#[derive(Debug)]
struct SoFar {
    turn: u32,
    epoch: u64,
    /// The sequence number of the next delta.
    next: u64,
    text: String,
    tool_calls: Vec<String>,
}

/// The turns streamed in this process, by job.
#[derive(Debug, Default)]
pub(super) struct Streams {
    by_job: Mutex<HashMap<JobId, SoFar>>,
}

impl Streams {
    /// Takes `delta` into its turn's account.
    pub(super) fn record(&self, job_id: &JobId, delta: &TurnDelta) {
        let mut by_job = self.by_job.lock().unwrap_or_else(PoisonError::into_inner);
        let so_far = by_job.entry(job_id.to_owned()).or_insert_with(|| SoFar {
            turn: delta.turn,
            epoch: delta.epoch,
            next: 0,
            text: String::new(),
            tool_calls: Vec::new(),
        });
        if (so_far.turn, so_far.epoch) != (delta.turn, delta.epoch) {
            *so_far = SoFar {
                turn: delta.turn,
                epoch: delta.epoch,
                next: 0,
                text: String::new(),
                tool_calls: Vec::new(),
            };
        }
        match &delta.piece {
            DeltaPiece::Text(text) => so_far.text.push_str(text),
            DeltaPiece::ToolCall { name, .. } => so_far.tool_calls.push(name.clone()),
            DeltaPiece::Restart => {
                so_far.text.clear();
                so_far.tool_calls.clear();
            }
            DeltaPiece::SoFar { .. } => return,
        }
        so_far.next = delta.seq + 1;
    }

    /// The turn of `job_id` so far, as one delta whose `seq` is that of
    /// the next live one; `None` when no turn of it streams here.
    pub(super) fn so_far(&self, job_id: &JobId) -> Option<TurnDelta> {
        let by_job = self.by_job.lock().unwrap_or_else(PoisonError::into_inner);
        by_job.get(job_id).map(|so_far| TurnDelta {
            turn: so_far.turn,
            epoch: so_far.epoch,
            seq: so_far.next,
            piece: DeltaPiece::SoFar {
                text: so_far.text.clone(),
                tool_calls: so_far.tool_calls.clone(),
            },
        })
    }

    /// The turn of `job_id` stopped streaming.
    pub(super) fn end(&self, job_id: &JobId) {
        let mut by_job = self.by_job.lock().unwrap_or_else(PoisonError::into_inner);
        by_job.remove(job_id);
    }
}
