//! Calls held for a person's decision.

use crate::job::{Lease, now_ms};

use super::super::approvals::HeldCall;
use super::*;

impl JobStore {
    /// Holds calls for a person's decision: each call's request in the
    /// job's approvals and its `tool_call_approval_requested` (or
    /// `tool_call_verdict_requested`) event, in one commit. A held call is
    /// not published until it is approved, nor answered until its verdict
    /// is given (decision 0036).
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] when another runner took the job; [`Error::Redis`].
    pub async fn hold(
        &self,
        lease: &Lease,
        tenant: &str,
        held: &[HeldCall<'_>],
    ) -> Result<(), Error> {
        if held.is_empty() {
            return Ok(());
        }
        let now = now_ms();
        let mut commit = Commit::default();
        for call in held {
            commit.events.push(call.event());
            commit.approvals.extend(call.fields(now));
        }
        self.commit(lease, commit).await?;
        self.index_held(tenant, &lease.job_id, held, now).await
    }
}
