//! The call ledger in Redis: the claim and result records that make a
//! redelivered call harmless.
//!
//! For each `(job_id, call_id, attempt)` there is at most one result, and while
//! a worker executes the attempt it holds a claim with a lease that it renews.
//! A delivery that finds a result answers with it; one that finds a live claim
//! waits; one that finds neither claims and executes. Each check-and-set is one
//! Lua script, so two workers can never both win.

use std::time::Duration;

use redis::Script;
use toolfleet_proto::ToolCall;
use toolfleet_proto::names::RedisKeys;
use toolfleet_service::connect::RedisConnection;

/// Who runs one delivery of a call: an id unique to the delivery, and
/// whether it holds the attempt's claim. A `read_only` call's first
/// delivery runs without one (decision 0060): nothing it does can be
/// harmed by another execution, so its only write is its result, stored
/// once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Owner {
    /// Unique per delivery: a redelivery to the same process while the
    /// first still runs is another owner.
    pub(crate) id: String,
    /// Whether the delivery took the attempt's claim.
    pub(crate) claimed: bool,
}

/// What a delivery found when it tried to claim its call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Claim {
    /// The attempt already has a result (this JSON envelope): answer with it.
    Stored(String),
    /// This delivery now owns the attempt and must execute it.
    /// `previously_started`: an earlier delivery of a side-effecting call
    /// claimed it and died without a result, so its effect may have happened.
    Acquired {
        /// An earlier execution started and left no result.
        previously_started: bool,
        /// Earlier executions of this attempt that took the claim and ended
        /// with neither a result nor a release: the ones that died (or could
        /// not store their result). Hand-backs that never claimed, because
        /// Redis was down or another worker held the claim, do not count.
        died: u32,
        /// What an earlier execution saved to be resumed from (JSON).
        checkpoint: Option<String>,
        /// The call's job was cancelled: answer without running it.
        cancelled: bool,
    },
    /// Another execution holds a live claim (`owner`): try again later.
    HeldBy(String),
}

/// KEYS: result, claim, started, claims, checkpoint, cancelled. ARGV: owner, lease_ms,
/// mark_start (0/1), retention_ms. For tools that are not idempotent the
/// `started` marker outlives the claim, so the next delivery knows an
/// execution began. Every claim taken counts in `claims`, and a release
/// uncounts it, so the count before this claim is how many executions died.
/// Returns {kind, value, died, checkpoint, cancelled}: the checkpoint and
/// the cancel mark come with the claim, in the same round trip.
const CLAIM: &str = r"
local result = redis.call('GET', KEYS[1])
if result then return {1, result, 0, '', 0} end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local started = 0
  if ARGV[3] == '1' then
    started = redis.call('EXISTS', KEYS[3])
    redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[4])
  end
  local died = redis.call('INCR', KEYS[4]) - 1
  redis.call('PEXPIRE', KEYS[4], ARGV[4])
  return {2, tostring(started), died, redis.call('GET', KEYS[5]) or '', redis.call('EXISTS', KEYS[6])}
end
return {3, redis.call('GET', KEYS[2]) or '', 0, '', 0}
";

/// KEYS: claim, checkpoint. ARGV: owner, checkpoint, retention_ms. Saved
/// only by the claim's owner: an execution that lost its claim must not
/// overwrite the checkpoint of the one that took it over.
const SAVE_CHECKPOINT: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
";

const COMPLETE: &str = r"
local existing = redis.call('GET', KEYS[1])
if existing then return existing end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
if redis.call('GET', KEYS[2]) == ARGV[3] then redis.call('DEL', KEYS[2]) end
return ARGV[1]
";

/// KEYS: claim, cancelled. Returns 0 (the claim is lost), 1 (renewed) or
/// 2 (renewed, and the call's job was cancelled).
const RENEW: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1 + redis.call('EXISTS', KEYS[2])
end
return 0
";

/// KEYS: claim, claims. A released claim did not die: uncount it.
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if tonumber(redis.call('GET', KEYS[2]) or '0') > 0 then redis.call('DECR', KEYS[2]) end
  return 1
end
return 0
";

/// The keys a call's checkpoint is saved under: the attempt's claim, which
/// the saver must still hold, and the checkpoint itself.
pub(crate) struct CheckpointKeys {
    pub(crate) claim: String,
    pub(crate) checkpoint: String,
}

/// What renewing a claim found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewed {
    /// Still this execution's.
    Held,
    /// Lost: another execution may run the call.
    Lost,
    /// Still this execution's, but the call's job was cancelled.
    Cancelled,
}

/// Claims and results of call attempts, for one worker process.
#[derive(Clone)]
pub(crate) struct Ledger {
    redis: RedisConnection,
    keys: RedisKeys,
    lease: Duration,
    retention: Duration,
    scripts: std::sync::Arc<Scripts>,
}

struct Scripts {
    claim: Script,
    complete: Script,
    renew: Script,
    release: Script,
    save_checkpoint: Script,
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

impl Ledger {
    pub(crate) fn new(
        redis: RedisConnection,
        keys: RedisKeys,
        lease: Duration,
        retention: Duration,
    ) -> Self {
        Self {
            redis,
            keys,
            lease,
            retention,
            scripts: std::sync::Arc::new(Scripts {
                claim: Script::new(CLAIM),
                complete: Script::new(COMPLETE),
                renew: Script::new(RENEW),
                release: Script::new(RELEASE),
                save_checkpoint: Script::new(SAVE_CHECKPOINT),
            }),
        }
    }

    /// How long a claim lives without renewal.
    pub(crate) fn lease(&self) -> Duration {
        self.lease
    }

    /// Claims `call` for the execution `owner` (unique per delivery), unless it
    /// already has a result or a live claim.
    pub(crate) async fn claim(
        &self,
        call: &ToolCall,
        owner: &str,
        mark_start: bool,
    ) -> redis::RedisResult<Claim> {
        let (kind, value, died, checkpoint, cancelled): (u8, String, u32, String, u8) = self
            .scripts
            .claim
            .key(self.result_key(call))
            .key(self.claim_key(call))
            .key(
                self.keys
                    .call_started(&call.job_id, &call.tool, &call.call_id, call.attempt),
            )
            .key(self.claims_key(call))
            .key(self.checkpoint_key(call))
            .key(self.cancelled_key(call))
            .arg(owner)
            .arg(millis(self.lease))
            .arg(if mark_start { "1" } else { "0" })
            .arg(millis(self.retention))
            .invoke_async(&mut self.redis.clone())
            .await?;
        Ok(match kind {
            1 => Claim::Stored(value),
            2 => Claim::Acquired {
                previously_started: value == "1",
                died,
                checkpoint: (!checkpoint.is_empty()).then_some(checkpoint),
                cancelled: cancelled == 1,
            },
            _ => Claim::HeldBy(value),
        })
    }

    /// Extends `owner`'s claim by one lease, and says whether the call's
    /// job was cancelled meanwhile; for an owner without a claim, only the
    /// latter.
    pub(crate) async fn renew(
        &self,
        call: &ToolCall,
        owner: &Owner,
    ) -> redis::RedisResult<Renewed> {
        if !owner.claimed {
            let cancelled: bool = redis::cmd("EXISTS")
                .arg(self.cancelled_key(call))
                .query_async(&mut self.redis.clone())
                .await?;
            return Ok(if cancelled {
                Renewed::Cancelled
            } else {
                Renewed::Held
            });
        }
        let owner = owner.id.as_str();
        let renewed: i64 = self
            .scripts
            .renew
            .key(self.claim_key(call))
            .key(self.cancelled_key(call))
            .arg(owner)
            .arg(millis(self.lease))
            .invoke_async(&mut self.redis.clone())
            .await?;
        Ok(match renewed {
            0 => Renewed::Lost,
            1 => Renewed::Held,
            _ => Renewed::Cancelled,
        })
    }

    /// Marks `call` as its job's cancel asks: the execution that holds it
    /// stops at its next renewal, and one yet to claim it does not run it.
    pub(crate) async fn cancel(&self, call: &ToolCall) -> redis::RedisResult<()> {
        let _: () = redis::cmd("SET")
            .arg(self.cancelled_key(call))
            .arg(1)
            .arg("PX")
            .arg(millis(self.retention))
            .query_async(&mut self.redis.clone())
            .await?;
        Ok(())
    }

    /// Stores `envelope` as the attempt's result and drops `owner`'s claim.
    /// The first stored result wins: returns the envelope that is now stored,
    /// which is another execution's if it finished first.
    pub(crate) async fn complete(
        &self,
        call: &ToolCall,
        owner: &Owner,
        envelope: &str,
    ) -> redis::RedisResult<String> {
        if !owner.claimed {
            // No claim to drop: stored unless a result is, in one command
            // that answers the result it found (`NX GET`; Redis 7.0).
            let earlier: Option<String> = redis::cmd("SET")
                .arg(self.result_key(call))
                .arg(envelope)
                .arg("NX")
                .arg("PX")
                .arg(millis(self.retention))
                .arg("GET")
                .query_async(&mut self.redis.clone())
                .await?;
            return Ok(earlier.unwrap_or_else(|| envelope.to_owned()));
        }
        let owner = owner.id.as_str();
        self.scripts
            .complete
            .key(self.result_key(call))
            .key(self.claim_key(call))
            .arg(envelope)
            .arg(millis(self.retention))
            .arg(owner)
            .invoke_async(&mut self.redis.clone())
            .await
    }

    /// Drops `owner`'s claim without a result, so that a redelivery can run
    /// the call at once (used when a call is handed back during shutdown).
    pub(crate) async fn release(&self, call: &ToolCall, owner: &Owner) -> redis::RedisResult<()> {
        if !owner.claimed {
            return Ok(());
        }
        let owner = owner.id.as_str();
        let _: i64 = self
            .scripts
            .release
            .key(self.claim_key(call))
            .key(self.claims_key(call))
            .arg(owner)
            .invoke_async(&mut self.redis.clone())
            .await?;
        Ok(())
    }

    /// Saves `checkpoint` (JSON) under `keys` while `owner` holds the
    /// claim; false when it no longer does.
    pub(crate) async fn save_checkpoint(
        &self,
        keys: &CheckpointKeys,
        owner: &str,
        checkpoint: &str,
    ) -> redis::RedisResult<bool> {
        let saved: i64 = self
            .scripts
            .save_checkpoint
            .key(&keys.claim)
            .key(&keys.checkpoint)
            .arg(owner)
            .arg(checkpoint)
            .arg(millis(self.retention))
            .invoke_async(&mut self.redis.clone())
            .await?;
        Ok(saved == 1)
    }

    /// Whether `call`'s attempt has a result: a delivery of a call pinned
    /// to another version asks it before handing the call back again, so a
    /// call another worker answered meanwhile is dropped, not bounced on.
    pub(crate) async fn has_result(&self, call: &ToolCall) -> redis::RedisResult<bool> {
        redis::cmd("EXISTS")
            .arg(self.result_key(call))
            .query_async(&mut self.redis.clone())
            .await
    }

    /// Where an execution of `call` saves its checkpoint.
    pub(crate) fn checkpoint_keys(&self, call: &ToolCall) -> CheckpointKeys {
        CheckpointKeys {
            claim: self.claim_key(call),
            checkpoint: self.checkpoint_key(call),
        }
    }

    fn cancelled_key(&self, call: &ToolCall) -> String {
        self.keys
            .call_cancelled(&call.job_id, &call.tool, &call.call_id, call.attempt)
    }

    fn checkpoint_key(&self, call: &ToolCall) -> String {
        self.keys
            .call_checkpoint(&call.job_id, &call.tool, &call.call_id, call.attempt)
    }

    fn claim_key(&self, call: &ToolCall) -> String {
        self.keys
            .call_claim(&call.job_id, &call.tool, &call.call_id, call.attempt)
    }

    fn claims_key(&self, call: &ToolCall) -> String {
        self.keys
            .call_claims(&call.job_id, &call.tool, &call.call_id, call.attempt)
    }

    fn result_key(&self, call: &ToolCall) -> String {
        self.keys
            .call_result(&call.job_id, &call.tool, &call.call_id, call.attempt)
    }
}
