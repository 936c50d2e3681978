//! A model turn's checkpoint, the dispatch of calls' attempts, and a
//! running call's progress.

use toolfleet_proto::{EventId, WireId};

use crate::job::{JobEvent, Lease, TurnCheckpoint};

use super::*;

impl JobStore {
    /// Checkpoints a model turn: the results before it, its items, its
    /// `model_turn` event and the job's counters, and the first attempt of
    /// each of its calls about to be published (`dispatched`, as
    /// [`record_dispatch`](Self::record_dispatch) records one), in one
    /// commit. Once it lands the turn is never played again.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] when another runner took the job; [`Error::Redis`].
    pub async fn record_turn(
        &self,
        lease: &Lease,
        turn: TurnCheckpoint<'_>,
        dispatched: &[DispatchedCall<'_>],
    ) -> Result<(), Error> {
        let mut commit = Commit::of_turn(turn);
        commit.dispatched(dispatched, 1);
        self.commit(lease, commit).await
    }

    /// Records that `attempt` of each call is about to be published: a
    /// `tool_call_dispatched` event each, and the attempt a resumed runner
    /// looks up first.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] when another runner took the job; [`Error::Redis`].
    pub async fn record_dispatch(
        &self,
        lease: &Lease,
        calls: &[DispatchedCall<'_>],
        attempt: u32,
    ) -> Result<(), Error> {
        if calls.is_empty() {
            return Ok(());
        }
        let mut commit = Commit::default();
        commit.dispatched(calls, attempt);
        self.commit(lease, commit).await
    }

    /// Records advisory events alone in a commit: a running call's
    /// `tool_call_progress` (the caller bounds how often), or a turn's or a
    /// round's `tool_unavailable`s.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] when another runner took the job; [`Error::Redis`].
    pub(crate) async fn record_events(
        &self,
        lease: &Lease,
        events: Vec<JobEvent>,
    ) -> Result<(), Error> {
        let commit = Commit {
            events,
            ..Commit::default()
        };
        self.commit(lease, commit).await
    }
}

/// A call about to be published, for [`JobStore::record_dispatch`].
#[derive(Debug, Clone, Copy)]
pub struct DispatchedCall<'a> {
    /// The id the job's events show the call by.
    pub event_id: &'a EventId,
    /// The id its attempts are recorded under.
    pub wire_id: &'a WireId,
    /// The tool.
    pub name: &'a str,
    /// What the attempt costs in budgets' cost units (its tool's `cost`).
    pub cost: u64,
    /// The version of its tool it is pinned to (its contract hash).
    pub version: Option<&'a str>,
}
