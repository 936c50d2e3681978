//! Why a call to an MCP server got no answer, as its connection found:
//! the stdio transport (a line too long, or not a message) and the HTTP
//! one (an event too large) tell the call by its request's id, which the
//! call takes when its answer is an error (decision 0043).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use rmcp::model::RequestId;

/// Most defects kept that no call took (it ended first): past it, all are
/// forgotten.
const MAX_UNTAKEN: usize = 1024;

/// Why a call got no answer from its server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Defect {
    /// Its answer is longer than the bound (in bytes).
    TooLarge(usize),
    /// The server wrote this while the call was in flight.
    Malformed(&'static str),
}

/// The defects of calls in flight, by their request's id: written by the
/// connection, taken by the call.
#[derive(Default)]
pub(super) struct Defects {
    by_id: Mutex<HashMap<RequestId, Defect>>,
}

impl Defects {
    /// The defect of the request `id`, if its connection found one.
    pub(super) fn take(&self, id: &RequestId) -> Option<Defect> {
        self.lock().remove(id)
    }

    /// Tells the call of request `id` why it gets no answer.
    pub(super) fn put(&self, id: RequestId, defect: Defect) {
        let mut by_id = self.lock();
        // A defect no call took (it ended first) is not kept for ever.
        if by_id.len() >= MAX_UNTAKEN {
            by_id.clear();
        }
        by_id.insert(id, defect);
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<RequestId, Defect>> {
        self.by_id.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
