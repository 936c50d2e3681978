//! A call that stops waiting leaves every index of its tenant at once.

use std::sync::LazyLock;

use super::super::scripts::script;
use super::*;

/// What [`FORGET`] answers when the tenant's set of tools holds one that
/// was not passed: read the set again and retry.
const TOOLS_CHANGED: i64 = -1;

impl JobStore {
    /// Drops the job's calls that still wait for a decision from their
    /// tenant's indexes: the job ended holding them (a cancel, a failed
    /// run). Best effort: what a failure leaves is dropped by the heal.
    pub(crate) async fn forget_held(&self, job_id: &JobId) {
        let approvals = match self.approvals(job_id).await {
            Ok(approvals) => approvals,
            Err(err) => {
                tracing::debug!(%job_id, error = %err, "could not read an ended job's held calls");
                return;
            }
        };
        let waiting: Vec<&ApprovalRequest> = approvals
            .requests
            .iter()
            .filter(|(key, _)| !approvals.decisions.contains_key(*key))
            .map(|(_, request)| request)
            .collect();
        self.forget_pending(job_id, &waiting).await;
    }

    /// Drops the held calls `held` of `job_id` from their tenant's indexes,
    /// each only if its entry is still that hold's (held at the same time):
    /// a later hold of the same call keeps its entry. Best effort: what a
    /// failure leaves is dropped by the heal.
    pub(in crate::store) async fn forget_pending(&self, job_id: &JobId, held: &[&ApprovalRequest]) {
        let Some(tenant) = job_id.tenant() else {
            return;
        };
        if held.is_empty() {
            return;
        }
        let entries: Vec<(String, u64)> = held
            .iter()
            .map(|request| {
                (
                    pending_member(job_id, &request.call_id),
                    request.requested_at_ms,
                )
            })
            .collect();
        if let Err(err) = self.forget(tenant, &entries).await {
            tracing::debug!(%job_id, error = %err, "could not drop held calls from the pending index");
        }
    }

    /// Drops `entries` (member, when held) from every index of `tenant`,
    /// each only if the tenant's index still holds it with that score.
    pub(super) async fn forget(
        &self,
        tenant: &str,
        entries: &[(String, u64)],
    ) -> Result<(), Error> {
        // A tool whose index appears between reading the set and the
        // script is retried; a tool that kept appearing is the heal's.
        for _ in 0..3 {
            let tools = self.approval_tools(tenant).await?;
            let mut invocation = self.on_tenant_indexes(&FORGET, tenant, &tools);
            for (member, held_at) in entries {
                invocation.arg(member).arg(held_at);
            }
            let dropped: i64 = invocation.invoke_async(&mut self.conn()).await?;
            if dropped != TOOLS_CHANGED {
                break;
            }
        }
        Ok(())
    }
}

/// ARGV after the tools: pairs of member and when it was held (Unix ms).
/// Drops each entry whose score in the tenant's index is still that time.
/// Returns the count dropped, or -1 ([`TOOLS_CHANGED`]) when the set of
/// tools holds one not passed: nothing is written then.
pub(super) static FORGET: LazyLock<Script> = LazyLock::new(|| {
    script(&format!(
        r"{TENANT_INDEXES}
if not complete then return -1 end
local dropped = 0
for k = 2 + tools, #ARGV, 2 do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[k])
  if score and tonumber(score) == tonumber(ARGV[k + 1]) then
    drop(ARGV[k])
    dropped = dropped + 1
  end
end
return dropped
"
    ))
});
