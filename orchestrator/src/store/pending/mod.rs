//! The tenants' indexes of calls waiting for a decision (decision 0036):
//! what `ListPendingApprovals` pages through, and what the pending gauges
//! count without reading a single parked job.
//!
//! Per tenant, under its hash tag (so each script is atomic on a cluster
//! too), every entry `<job id>/<call id>` ([`pending_member`]):
//! - `tf:approvals:{<tenant>}`: scored by when the call was held, oldest
//!   first for `ListPendingApprovals`;
//! - `tf:approvals:{<tenant>}:expiry`: scored by when it expires;
//! - `tf:approvals:{<tenant>}:by-tool:<tool>`: scored by when held, one per
//!   tool: its size and first entry are the gauges, in O(1);
//! - `tf:approvals:{<tenant>}:tools`: the tools that have one.
//!
//! An entry is written after the commit that held its call (`add`), so
//! it always names a held call, and leaves all four indexes at once
//! (`forget`) where its call stops waiting: when it is decided
//! ([`JobStore::decide`]), when it expires (the gauge's refresh,
//! `tally`), and when its job ends holding it ([`JobStore::forget_held`]).
//! What a crash in between leaves is dropped by a slow heal
//! (`heal`, [`JobStore::heal_pending`]) that checks a few entries against their
//! jobs at each refresh, and by `ListPendingApprovals` as it meets them.
//!
//! The tenants that ever held a call are in the set `tf:approvals:tenants`,
//! which the gauge's refresh reads.

mod add;
mod forget;
mod heal;
mod page;
mod tally;

use redis::Script;

use super::approvals::ApprovalRequest;
use super::*;

/// A call waiting for a decision, as `ListPendingApprovals` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Pending {
    /// Its job.
    pub job_id: JobId,
    /// The held call.
    pub request: ApprovalRequest,
}

/// Where a page of pending approvals starts: after the entry held at
/// `held_at_ms` with this member (`<job id>/<call id>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingCursor {
    /// When the last entry of the previous page was held (Unix ms).
    pub held_at_ms: u64,
    /// Its member of the tenant's index.
    pub member: String,
}

/// Calls of one tenant and tool waiting for a decision, for the gauge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingTally {
    /// The tenant whose jobs hold them.
    pub tenant: String,
    /// Their tool.
    pub tool: String,
    /// How many wait.
    pub calls: u64,
    /// When the oldest was held (Unix ms).
    pub oldest_held_at_ms: u64,
}

/// Where the slow heal of the pending indexes goes on
/// ([`JobStore::heal_pending`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealPosition {
    /// The tenant whose index it walks.
    tenant: String,
    /// The last entry it checked there.
    cursor: Option<PendingCursor>,
}

impl JobStore {
    /// Every tenant that ever held a call, in name order.
    async fn approval_tenants(&self) -> Result<Vec<String>, Error> {
        let mut tenants: Vec<String> = redis::cmd("SMEMBERS")
            .arg(self.keys.approval_tenants())
            .query_async(&mut self.conn())
            .await?;
        tenants.sort_unstable();
        Ok(tenants)
    }

    /// The tools with an index of pending calls for `tenant`.
    async fn approval_tools(&self, tenant: &str) -> Result<Vec<String>, Error> {
        let tools: Vec<String> = redis::cmd("SMEMBERS")
            .arg(self.keys.tenant_approval_tools(tenant))
            .query_async(&mut self.conn())
            .await?;
        Ok(tools)
    }

    /// `script` on the indexes of `tenant`, `FORGET` or `TALLY`: KEYS
    /// its index, expiry index, set of tools and the index of each of
    /// `tools`; ARGV the count of tools and their names, before the
    /// script's own arguments.
    fn on_tenant_indexes<'a>(
        &self,
        script: &'a Script,
        tenant: &str,
        tools: &[String],
    ) -> redis::ScriptInvocation<'a> {
        let mut invocation = script.prepare_invoke();
        invocation
            .key(self.keys.tenant_approvals(tenant))
            .key(self.keys.tenant_approvals_expiry(tenant))
            .key(self.keys.tenant_approval_tools(tenant))
            .arg(tools.len());
        for tool in tools {
            invocation.key(self.keys.tenant_tool_approvals(tenant, tool));
        }
        for tool in tools {
            invocation.arg(tool);
        }
        invocation
    }
}

/// A held call's member of its tenant's indexes: `<job id>/<call id>`, the
/// id its events show (a job id holds no `/`); never its wire id, which
/// only the job's own processes may know.
fn pending_member(job_id: &JobId, call_id: &str) -> String {
    format!("{job_id}/{call_id}")
}

/// A sorted-set score as Redis writes it (`1733300000000`, or in exponent
/// form for a foreign writer's), in whole ms.
fn score_ms(score: &str) -> u64 {
    score.parse::<u64>().unwrap_or_else(|_| {
        // Saturating: a score out of range or not a number reads as 0.
        score.parse::<f64>().map_or(0, |ms| ms.max(0.0) as u64)
    })
}

/// What `FORGET` and `TALLY` begin with (KEYS and ARGV as
/// [`JobStore::on_tenant_indexes`] passes them): `tools`, the count of
/// tool indexes passed; `complete`, whether they are all the tenant has;
/// and `drop(member)`, which removes an entry from every index passed.
const TENANT_INDEXES: &str = r"
local tools = tonumber(ARGV[1])
local complete = true
do
  local passed = {}
  for k = 1, tools do passed[ARGV[1 + k]] = true end
  for _, tool in ipairs(redis.call('SMEMBERS', KEYS[3])) do
    if not passed[tool] then complete = false end
  end
end
local function drop(member)
  redis.call('ZREM', KEYS[1], member)
  redis.call('ZREM', KEYS[2], member)
  for k = 4, 3 + tools do redis.call('ZREM', KEYS[k], member) end
end
";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::scripts::tests::assert_filled;

    #[test]
    fn the_index_scripts_are_filled() {
        let scripts = [
            ("INDEX", &*add::INDEX),
            ("FORGET", &*forget::FORGET),
            ("TALLY", &*tally::TALLY),
        ];
        for (name, script) in scripts {
            assert_filled(name, script);
        }
    }

    #[test]
    fn scores_read_in_whole_ms() {
        assert_eq!(score_ms("1733300000000"), 1_733_300_000_000);
        assert_eq!(score_ms("1.7333e12"), 1_733_300_000_000);
        assert_eq!(score_ms("nonsense"), 0);
        assert_eq!(score_ms("-5"), 0);
    }
}
