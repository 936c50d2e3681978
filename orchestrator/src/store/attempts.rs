//! A job's attempts record (`tf:{<job>}:attempts`): the last attempt
//! dispatched for each call, by wire id, and a mark on each call whose
//! result is recorded. This module owns the hash's layout; the rest of the
//! orchestrator reads it as [`Attempts`].

use std::collections::{HashMap, HashSet};

use toolfleet_proto::WireId;

use super::{Error, JobStore};
use crate::job::JobId;

/// What a job's attempts record holds, read once per round.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attempts {
    /// The last attempt dispatched for each call.
    dispatched: HashMap<WireId, u32>,
    /// The calls whose result is recorded
    /// ([`JobStore::record_call_results`]).
    settled: HashSet<WireId>,
}

impl Attempts {
    /// Reads the hash's fields: `<wire id>` holds a call's last attempt,
    /// `settled:<wire id>` marks its result recorded. A field of neither
    /// form is not the orchestrator's and is left out.
    fn from_fields(fields: HashMap<String, u32>) -> Self {
        let mut attempts = Self::default();
        for (field, attempt) in fields {
            if let Some(wire_id) = field.strip_prefix(SETTLED).and_then(WireId::parse) {
                attempts.settled.insert(wire_id);
            } else if let Some(wire_id) = WireId::parse(&field) {
                attempts.dispatched.insert(wire_id, attempt);
            }
        }
        attempts
    }

    /// The last attempt dispatched for the call `wire_id`; `None` if it was
    /// never dispatched.
    pub fn last(&self, wire_id: &WireId) -> Option<u32> {
        self.dispatched.get(wire_id).copied()
    }

    /// Whether the result of call `wire_id` was recorded: a resumed round
    /// answers it again from the stored envelope, but records neither its
    /// event nor its spans a second time.
    pub fn settled(&self, wire_id: &WireId) -> bool {
        self.settled.contains(wire_id)
    }

    /// Notes that `wire_id` was dispatched up to `attempt`, as the store
    /// has just recorded.
    pub(crate) fn record(&mut self, wire_id: WireId, attempt: u32) {
        self.dispatched.insert(wire_id, attempt);
    }

    /// How many calls were dispatched.
    pub fn dispatched_calls(&self) -> usize {
        self.dispatched.len()
    }
}

/// A fresh round's record: each of its calls dispatched at `0`, the
/// attempt recorded as the round starts.
impl FromIterator<(WireId, u32)> for Attempts {
    fn from_iter<I: IntoIterator<Item = (WireId, u32)>>(calls: I) -> Self {
        Self {
            dispatched: calls.into_iter().collect(),
            settled: HashSet::new(),
        }
    }
}

/// The prefix of the field that marks a call settled. A wire id never
/// holds a colon ([`is_valid_wire_id`](toolfleet_proto::call::is_valid_wire_id)),
/// so no call's own field can be mistaken for a mark.
const SETTLED: &str = "settled:";

/// The attempts-hash field that marks call `wire_id` settled.
pub(super) fn settled_field(wire_id: &WireId) -> String {
    format!("{SETTLED}{wire_id}")
}

impl JobStore {
    /// The job's attempts record.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn attempts(&self, job_id: &JobId) -> Result<Attempts, Error> {
        let fields: HashMap<String, u32> =
            redis::AsyncCommands::hgetall(&mut self.conn(), self.keys.job_attempts(job_id)).await?;
        Ok(Attempts::from_fields(fields))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(text: &str) -> WireId {
        WireId::parse(text).expect("a wire id")
    }

    #[test]
    fn a_settled_mark_is_its_own_field_no_call_can_name() {
        let attempts = Attempts::from_fields(HashMap::from([
            ("c1".to_owned(), 2),
            ("x.3".to_owned(), 1),
            (settled_field(&id("c2")), 0),
            ("not:an id".to_owned(), 7),
        ]));
        assert_eq!(attempts.last(&id("c1")), Some(2));
        assert_eq!(attempts.last(&id("x.3")), Some(1));
        assert!(!attempts.settled(&id("c1")), "attempted, not settled");
        assert!(attempts.settled(&id("c2")));
        assert_eq!(attempts.last(&id("c2")), None, "a mark is no attempt");
        assert_eq!(
            attempts.dispatched_calls(),
            2,
            "a stranger's field is left out"
        );
        // A wire id holds no colon, so no call's attempts field is a mark.
        assert!(WireId::parse(&settled_field(&id("c1"))).is_none());
    }
}
