//! A held call joins its tenant's indexes, after the commit that held it.

use std::sync::LazyLock;

use redis::Script;

use super::super::approvals::HeldCall;
use super::super::scripts::script;
use super::*;

impl JobStore {
    /// Adds the calls `held` of `job_id`, held at `now`, to their tenant's
    /// indexes of pending approvals, after the commit that held them: an
    /// entry always names a held call. The tenant joins the set of tenants
    /// the pending gauge reads.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub(in crate::store) async fn index_held(
        &self,
        tenant: &str,
        job_id: &JobId,
        held: &[HeldCall<'_>],
        now: u64,
    ) -> Result<(), Error> {
        let mut invocation = INDEX.prepare_invoke();
        invocation
            .key(self.keys.tenant_approvals(tenant))
            .key(self.keys.tenant_approvals_expiry(tenant))
            .key(self.keys.tenant_approval_tools(tenant))
            .arg(now);
        for call in held {
            invocation
                .key(self.keys.tenant_tool_approvals(tenant, call.tool))
                .arg(call.tool)
                .arg(pending_member(job_id, call.call_id))
                .arg(call.expires_at_ms);
        }
        let _: i64 = invocation.invoke_async(&mut self.conn()).await?;
        let _: i64 = redis::cmd("SADD")
            .arg(self.keys.approval_tenants())
            .arg(tenant)
            .query_async(&mut self.conn())
            .await?;
        Ok(())
    }
}

/// KEYS: the tenant's index, expiry index, set of tools, then each held
/// call's tool index. ARGV: now_ms, then for each call its tool, member
/// and expiry (Unix ms). Indexes the calls in all four at once.
pub(super) static INDEX: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
for k = 4, #KEYS do
  local at = 2 + (k - 4) * 3
  redis.call('ZADD', KEYS[1], ARGV[1], ARGV[at + 1])
  redis.call('ZADD', KEYS[2], ARGV[at + 2], ARGV[at + 1])
  redis.call('ZADD', KEYS[k], ARGV[1], ARGV[at + 1])
  redis.call('SADD', KEYS[3], ARGV[at])
end
return 0
",
    )
});
