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
//! An entry is written after the commit that held its call ([`INDEX`]), so
//! it always names a held call, and leaves all four indexes at once
//! ([`FORGET`]) where its call stops waiting: when it is decided
//! ([`JobStore::decide`]), when it expires (the gauge's refresh,
//! [`TALLY`]), and when its job ends holding it ([`JobStore::forget_held`]).
//! What a crash in between leaves is dropped by a slow heal
//! ([`JobStore::heal_pending`]) that checks a few entries against their
//! jobs at each refresh, and by `ListPendingApprovals` as it meets them.
//!
//! The tenants that ever held a call are in the set `tf:approvals:tenants`,
//! which the gauge's refresh reads.

use std::collections::HashMap;
use std::sync::LazyLock;

use redis::Script;

use crate::job::{JobStatus, now_ms};

use super::approvals::{ApprovalRequest, DECIDED, HeldCall, decided_field};
use super::scripts::script;
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

/// Entries the heal checks against their jobs per step: with a step every
/// 5 s, 10,000 pending calls are all checked within 17 minutes, at the
/// cost of 100 commands a step however many wait.
const HEAL_PAGE: usize = 50;

/// Expired entries one refresh of the gauge drops, per tenant: a bound on
/// one script's run; a burst of more expiries is dropped over a few
/// refreshes.
const EXPIRED_PER_REFRESH: usize = 1_000;

/// What [`FORGET`] answers when the tenant's set of tools holds one that
/// was not passed: read the set again and retry.
const TOOLS_CHANGED: i64 = -1;

impl JobStore {
    /// Adds the calls `held` of `job_id`, held at `now`, to their tenant's
    /// indexes of pending approvals, after the commit that held them: an
    /// entry always names a held call. The tenant joins the set of tenants
    /// the pending gauge reads.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub(super) async fn index_held(
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

    /// The tenant's calls waiting for a decision, oldest first, at most
    /// `limit`, after `cursor`; and where the next page starts, if one may
    /// follow. Entries of calls decided, expired, or of ended jobs are
    /// dropped from the indexes as they are met (at most `10 x limit` a
    /// page).
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn pending(
        &self,
        tenant: &str,
        cursor: Option<&PendingCursor>,
        limit: usize,
    ) -> Result<(Vec<Pending>, Option<PendingCursor>), Error> {
        let from = cursor.map_or(0, |c| c.held_at_ms);
        let read = limit.saturating_mul(10).max(1);
        let entries: Vec<(String, u64)> = redis::cmd("ZRANGE")
            .arg(self.keys.tenant_approvals(tenant))
            .arg(from)
            .arg("+inf")
            .arg("BYSCORE")
            .arg("LIMIT")
            .arg(0)
            .arg(read + 1)
            .arg("WITHSCORES")
            .query_async(&mut self.conn())
            .await?;
        let after = |(member, score): &(String, u64)| {
            cursor.is_none_or(|c| (*score, member.as_str()) > (c.held_at_ms, c.member.as_str()))
        };
        let more = entries.len() > read;
        let entries: Vec<(String, u64)> = entries.into_iter().filter(after).take(read).collect();
        let now = now_ms();
        let mut page = Vec::new();
        let mut last = None;
        let mut stale = Vec::new();
        // Checked a page's worth at a time, each batch in one round trip.
        'entries: for batch in entries.chunks(limit.max(1)) {
            let checked = self.still_pending(batch, now).await?;
            for (entry, pending) in batch.iter().zip(checked) {
                last = Some(PendingCursor {
                    held_at_ms: entry.1,
                    member: entry.0.clone(),
                });
                match pending {
                    Some(pending) => page.push(pending),
                    None => stale.push(entry.clone()),
                }
                if page.len() == limit {
                    break 'entries;
                }
            }
        }
        if !stale.is_empty() {
            self.forget(tenant, &stale).await?;
        }
        let next = if page.len() == limit || more {
            last
        } else {
            None
        };
        Ok((page, next))
    }

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

    /// One step of the slow heal: checks the next 50 entries (`HEAL_PAGE`) of
    /// the tenants' indexes from `at` against their jobs, dropping those
    /// whose call no longer waits (a crash between a call's end and its
    /// entry's removal left them). Returns where the next step goes on:
    /// tenant after tenant in name order, and round again from the first
    /// (`None`).
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn heal_pending(
        &self,
        at: Option<HealPosition>,
    ) -> Result<Option<HealPosition>, Error> {
        let at = match at {
            Some(at) => at,
            None => match self.approval_tenants().await?.into_iter().next() {
                Some(tenant) => HealPosition {
                    tenant,
                    cursor: None,
                },
                None => return Ok(None),
            },
        };
        let (_, next) = self
            .pending(&at.tenant, at.cursor.as_ref(), HEAL_PAGE)
            .await?;
        if let Some(cursor) = next {
            return Ok(Some(HealPosition {
                tenant: at.tenant,
                cursor: Some(cursor),
            }));
        }
        let tenants = self.approval_tenants().await?;
        Ok(tenants
            .into_iter()
            .find(|tenant| *tenant > at.tenant)
            .map(|tenant| HealPosition {
                tenant,
                cursor: None,
            }))
    }

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
    pub(super) async fn forget_pending(&self, job_id: &JobId, held: &[&ApprovalRequest]) {
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
    async fn forget(&self, tenant: &str, entries: &[(String, u64)]) -> Result<(), Error> {
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

    /// `script` on the indexes of `tenant`, [`FORGET`] or [`TALLY`]: KEYS
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

    /// The calls that index `entries` name, each if it still waits for a
    /// decision, read in one round trip.
    async fn still_pending(
        &self,
        entries: &[(String, u64)],
        now: u64,
    ) -> Result<Vec<Option<Pending>>, Error> {
        let named: Vec<Option<(JobId, &str)>> = entries
            .iter()
            .map(|(member, _)| {
                member
                    .split_once('/')
                    .and_then(|(job, call)| Some((JobId::parse(job)?, call)))
            })
            .collect();
        let mut reads = redis::pipe();
        for (job_id, _) in named.iter().flatten() {
            reads
                .hget(self.keys.job(job_id), "status")
                .hgetall(self.keys.job_approvals(job_id));
        }
        let replies: Vec<redis::Value> = reads.query_async(&mut self.conn()).await?;
        let mut replies = replies.into_iter();
        let mut checked = Vec::with_capacity(entries.len());
        for named in named {
            let Some((job_id, call_id)) = named else {
                checked.push(None);
                continue;
            };
            let (Some(status), Some(fields)) = (replies.next(), replies.next()) else {
                checked.push(None);
                continue;
            };
            // A key of another type (not this store's) is not pending.
            let status: Option<String> = redis::from_redis_value(status).ok().flatten();
            let fields: HashMap<String, String> =
                redis::from_redis_value(fields).unwrap_or_default();
            checked.push(pending_call(job_id, call_id, status, &fields, now));
        }
        Ok(checked)
    }
}

/// The call `call_id` of `job_id`, if it still waits for a decision, from
/// the job's `status` and approvals hash `fields`.
fn pending_call(
    job_id: JobId,
    call_id: &str,
    status: Option<String>,
    fields: &HashMap<String, String>,
    now: u64,
) -> Option<Pending> {
    let ended = status
        .and_then(|s| s.parse::<JobStatus>().ok())
        .is_none_or(JobStatus::is_final);
    if ended {
        return None;
    }
    // A job holds few calls: its requests are read whole. A call may have
    // been held more than once (approved, then its outcome unknown): the
    // hold that waits is the one pending.
    let request = fields.iter().find_map(|(key, text)| {
        if key.starts_with(DECIDED) {
            return None;
        }
        let request: ApprovalRequest = serde_json::from_str(text).ok()?;
        (request.call_id == call_id
            && !fields.contains_key(&decided_field(key))
            && request.expires_at_ms > now)
            .then_some(request)
    })?;
    Some(Pending { job_id, request })
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

/// KEYS: the tenant's index, expiry index, set of tools, then each held
/// call's tool index. ARGV: now_ms, then for each call its tool, member
/// and expiry (Unix ms). Indexes the calls in all four at once.
static INDEX: LazyLock<Script> = LazyLock::new(|| {
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

/// What [`FORGET`] and [`TALLY`] begin with (KEYS and ARGV as
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

/// ARGV after the tools: pairs of member and when it was held (Unix ms).
/// Drops each entry whose score in the tenant's index is still that time.
/// Returns the count dropped, or -1 ([`TOOLS_CHANGED`]) when the set of
/// tools holds one not passed: nothing is written then.
static FORGET: LazyLock<Script> = LazyLock::new(|| {
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

/// ARGV after the tools: now_ms, and how many expired entries to drop at
/// most. Drops entries expired by now (unless a tool index was not
/// passed), forgets tools left without entries, and returns a flat list
/// of tool, count and when its oldest was held, for each other tool.
static TALLY: LazyLock<Script> = LazyLock::new(|| {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::scripts::tests::assert_filled;

    #[test]
    fn the_index_scripts_are_filled() {
        for (name, script) in [("INDEX", &*INDEX), ("FORGET", &*FORGET), ("TALLY", &*TALLY)] {
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
