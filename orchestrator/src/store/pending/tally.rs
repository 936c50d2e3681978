//! The pending gauges' count, by tenant and tool, in O(tools).

use std::sync::LazyLock;

use crate::job::now_ms;

use super::super::scripts::script;
use super::*;

/// Expired entries one refresh of the gauge drops, per tenant: a bound on
/// one script's run; a burst of more expiries is dropped over a few
/// refreshes.
const EXPIRED_PER_REFRESH: usize = 1_000;

impl JobStore {
    /// Every call waiting for a decision, counted by tenant and tool, with
    /// when the oldest was held: what the pending gauges report. Costs a
    /// set read and a script per tenant, each O(its tools), however many
    /// calls wait; the script first drops the tenant's expired entries.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn pending_tally(&self) -> Result<Vec<PendingTally>, Error> {
        let now = now_ms();
        let mut tally = Vec::new();
        for tenant in self.approval_tenants().await? {
            let tools = self.approval_tools(&tenant).await?;
            if tools.is_empty() {
                continue;
            }
            let mut invocation = self.on_tenant_indexes(&TALLY, &tenant, &tools);
            invocation.arg(now).arg(EXPIRED_PER_REFRESH);
            let answer: Vec<redis::Value> = invocation.invoke_async(&mut self.conn()).await?;
            for entry in answer.chunks_exact(3) {
                let (Ok(tool), Ok(calls), Ok(oldest)) = (
                    redis::from_redis_value::<String>(entry[0].clone()),
                    redis::from_redis_value::<u64>(entry[1].clone()),
                    redis::from_redis_value::<String>(entry[2].clone()),
                ) else {
                    continue;
                };
                tally.push(PendingTally {
                    tenant: tenant.clone(),
                    tool,
                    calls,
                    oldest_held_at_ms: score_ms(&oldest),
                });
            }
        }
        Ok(tally)
    }
}

/// ARGV after the tools: now_ms, and how many expired entries to drop at
/// most. Drops entries expired by now (unless a tool index was not
/// passed), forgets tools left without entries, and returns a flat list
/// of tool, count and when its oldest was held, for each other tool.
pub(super) static TALLY: LazyLock<Script> = LazyLock::new(|| {
    script(&format!(
        r"{TENANT_INDEXES}
if complete then
  local now, most = ARGV[2 + tools], ARGV[3 + tools]
  for _, member in ipairs(redis.call('ZRANGE', KEYS[2], '-inf', now, 'BYSCORE', 'LIMIT', 0, most)) do
    drop(member)
  end
end
local tally = {{}}
for k = 1, tools do
  local count = redis.call('ZCARD', KEYS[3 + k])
  if count == 0 then
    redis.call('SREM', KEYS[3], ARGV[1 + k])
  else
    local oldest = redis.call('ZRANGE', KEYS[3 + k], 0, 0, 'WITHSCORES')
    tally[#tally + 1] = ARGV[1 + k]
    tally[#tally + 1] = count
    tally[#tally + 1] = oldest[2]
  end
end
return tally
"
    ))
});
