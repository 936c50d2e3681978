//! A tenant's quota of tool calls in flight (`max_calls_in_flight`): each
//! call takes a slot in a per-tenant sorted set in Redis, shared by every
//! replica, before its first attempt is published, and holds it until it
//! settles. A call over the quota waits here, unpublished, until a slot
//! frees up; it is never failed for it (only the job's deadline or a stop
//! ends the wait). A slot whose runner died expires with the job's deadline,
//! and a resumed round takes the slot its call already held.

use std::time::Duration;

use tracing::debug;

use super::{Dispatcher, PlannedCall, Round, RoundError};
use crate::job::now_ms;
use crate::store::JobStore;

/// The first pause of a call waiting for a slot; doubled up to
/// [`LONGEST_PAUSE`]. Slots are polled rather than announced: a freed one
/// is found within a pause, which only matters at the quota.
const FIRST_PAUSE: Duration = Duration::from_millis(20);
const LONGEST_PAUSE: Duration = Duration::from_millis(500);

/// A slot held by one call; freed when dropped (the call settled, or its
/// round ended any other way).
pub(super) struct CallSlot {
    store: JobStore,
    tenant: String,
    member: String,
}

impl Drop for CallSlot {
    fn drop(&mut self) {
        let (store, tenant, member) = (
            self.store.clone(),
            std::mem::take(&mut self.tenant),
            std::mem::take(&mut self.member),
        );
        // Dropped inside the runtime (a round's future); if the release is
        // lost, the entry expires with the job's deadline.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(err) = store.release_call_slot(&tenant, &member).await {
                    debug!(error = %err, "could not free a call slot; it expires with its job");
                }
            });
        }
    }
}

impl Dispatcher {
    /// A slot for `call` in its tenant's calls in flight, waiting while the
    /// tenant is at its quota; `None` when the job has no such quota.
    pub(super) async fn call_slot(
        &self,
        round: &Round<'_>,
        call: &PlannedCall,
    ) -> Result<Option<CallSlot>, RoundError> {
        let Some(limit) = round.spec.limits.max_calls_in_flight else {
            return Ok(None);
        };
        let tenant = &round.spec.tenant;
        let member = format!("{}/{}", round.lease.job_id, call.wire_id);
        let mut pause = FIRST_PAUSE;
        let mut waited = false;
        loop {
            if self
                .store
                .take_call_slot(tenant, &member, limit, round.spec.deadline_ms)
                .await?
            {
                return Ok(Some(CallSlot {
                    store: self.store.clone(),
                    tenant: tenant.clone(),
                    member,
                }));
            }
            if !waited {
                waited = true;
                crate::metrics::tool_call_throttled(&call.name);
                debug!(call_id = %call.wire_id, limit, "tenant at its calls in flight; the call waits");
            }
            if now_ms().saturating_add(toolfleet_service::clock::millis(pause))
                >= round.spec.deadline_ms
            {
                return Err(RoundError::DeadlineExceeded);
            }
            tokio::select! {
                () = round.stop.cancelled() => return Err(RoundError::Interrupted),
                () = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).min(LONGEST_PAUSE);
        }
    }
}
