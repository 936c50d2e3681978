//! A round's settled calls: their final envelopes.

use std::time::Duration;

use toolfleet_proto::{Envelope, EventId, WireId};

use crate::job::{JobEvent, Lease};

use super::super::attempts::settled_field;
use super::*;

impl JobStore {
    /// Records calls' final envelopes, one `tool_call_result` event each in
    /// the order given, in one commit (the result items themselves join the
    /// conversation with the round's others in the next commit of the run,
    /// [`record_turn`](Self::record_turn) or [`finish`](Self::finish)).
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] when another runner took the job; [`Error::Redis`].
    pub async fn record_call_results(
        &self,
        lease: &Lease,
        settled: &[SettledCall<'_>],
    ) -> Result<(), Error> {
        let events = settled
            .iter()
            .map(|settled| JobEvent::ToolCallResult {
                attempts: settled.attempts,
                call_id: settled.call_id.to_string(),
                code: settled.envelope.error().map(|e| e.code.to_string()),
                name: settled.name.to_owned(),
                ok: settled.envelope.is_ok(),
                round_trip_us: settled.round_trip.map(micros),
                source: settled.source.map(str::to_owned),
                worked_us: settled.worked.map(micros),
                tool_version: settled.ran_on.map(str::to_owned),
            })
            .collect();
        let attempts = settled
            .iter()
            .map(|settled| (settled_field(settled.wire_id), settled.attempts))
            .collect();
        let job_id = &lease.job_id;
        let checks = settled
            .iter()
            .filter_map(|settled| {
                let text = settled.unchecked?;
                let key =
                    self.keys
                        .call_result(job_id, settled.name, settled.wire_id, settled.attempts);
                Some((key, text))
            })
            .collect();
        // A refusal for a budget is stored with the call's result: a run
        // that resumes the job gives it no more turns either.
        let budget_exceeded = settled.iter().find_map(|settled| settled.budget_exceeded);
        self.commit(
            lease,
            Commit {
                events,
                attempts,
                checks,
                budget_exceeded,
                ..Commit::default()
            },
        )
        .await
    }
}

/// A call with its final envelope, for [`JobStore::record_call_results`].
#[derive(Debug, Clone, Copy)]
pub struct SettledCall<'a> {
    /// The id the job's events show the call by.
    pub call_id: &'a EventId,
    /// The id its attempts are recorded under.
    pub wire_id: &'a WireId,
    /// The tool name.
    pub name: &'a str,
    /// Attempts made (0: answered by the orchestrator's own checks).
    pub attempts: u32,
    /// Publish to result of the last attempt, as the runner saw it.
    pub round_trip: Option<Duration>,
    /// How long the worker worked on the last attempt, by its own clock.
    pub worked: Option<Duration>,
    /// The version of the tool the worker ran it on, as its record says.
    pub ran_on: Option<&'a str>,
    /// The final envelope.
    pub envelope: &'a Envelope,
    /// Who produced it when no worker did: `operator` (a verdict).
    pub source: Option<&'static str>,
    /// The stored result's text as the worker's reply carried it, when it
    /// was not read from Redis: the commit checks it against what Redis
    /// holds and writes nothing if it differs ([`Error::ResultMismatch`]).
    pub unchecked: Option<&'a str>,
    /// The budget whose check refused the call (its envelope says
    /// `BUDGET_EXCEEDED`): stored with it, so that the job gets no more
    /// turns (`crate::budget`).
    pub budget_exceeded: Option<Limit>,
}
