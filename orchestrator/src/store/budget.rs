//! The tenants' period budgets (`tf:budget:{<tenant>}`): a hash of
//! counters per minute and per hour of each kind (`<kind>:m:<minute>`,
//! `<kind>:h:<hour>`), added to and checked by one script, so that every
//! replica's jobs take from the same budget and two calls can never both
//! take its last unit (`crate::budget::tenant` says what is counted).

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;

use crate::budget::tenant::{Entry, Kind, TenantExceeded, Window};
use crate::job::now_ms;

use super::*;

impl JobStore {
    /// Adds each entry's `add` to `tenant`'s counters, then checks every
    /// entry that asks: with a `take`, that it fits within each window's
    /// limit; without, that the window is below it. When all pass, the
    /// takes are added too; else nothing of them is, and the first refusal
    /// is returned. `entries` are in [`Kind::ALL`]'s order.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub(crate) async fn spend_tenant(
        &self,
        tenant: &str,
        entries: &[Entry; 4],
    ) -> Result<Option<TenantExceeded>, Error> {
        self.spend_tenant_at(tenant, entries, now_ms()).await
    }

    /// Adds to `tenant`'s counters and checks them as the runs do before
    /// every turn and call (each entry's `add`, then its `take` if every
    /// checked window has room), at `now_ms` (milliseconds since the
    /// epoch) rather than now: the windows move with it. Returns the first
    /// refusal, if any.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn spend_tenant_at(
        &self,
        tenant: &str,
        entries: &[Entry; 4],
        now_ms: u64,
    ) -> Result<Option<TenantExceeded>, Error> {
        let mut invocation = SPEND.prepare_invoke();
        invocation.key(self.keys.tenant_budget(tenant)).arg(now_ms);
        for (kind, entry) in Kind::ALL.iter().zip(entries) {
            invocation
                .arg(kind.counter())
                .arg(entry.add)
                .arg(entry.take)
                .arg(entry.hour.unwrap_or(0))
                .arg(entry.day.unwrap_or(0))
                .arg(u8::from(entry.check));
        }
        let refusal: Vec<u64> = invocation.invoke_async(&mut self.conn()).await?;
        let [kind, window, spent, limit, retry_ms] = refusal[..] else {
            return Ok(None);
        };
        let kind = usize::try_from(kind)
            .ok()
            .and_then(|k| Kind::ALL.get(k.checked_sub(1)?));
        Ok(kind.map(|kind| TenantExceeded {
            tenant: tenant.to_owned(),
            kind: *kind,
            window: if window == 1 {
                Window::Hour
            } else {
                Window::Day
            },
            spent,
            limit,
            retry_after: Duration::from_millis(retry_ms),
        }))
    }
}

/// KEYS: the tenant's budget hash. ARGV: now_ms, then four entries of six:
/// counter prefix, add, take, hour limit, day limit (0: none), check (1/0).
/// Returns `{}` when every check passed (the takes are added), else
/// `{entry (1-based), window (1 hour, 2 day), spent, limit, retry_ms}`.
///
/// A window's sum is its minutes' (the current one and the 59 before) or
/// its hours' (the current one and the 23 before) counters. Summing them
/// (84 fields a kind) on every check cost Redis about 0.1 ms a call, five
/// times a whole job's other commands, so each window's sum is kept
/// beside its counters (`<kind>:hsum`, `<kind>:dsum`), added to with the
/// counters. When the minute changes (field `sums_at`) within the hour,
/// only the counters of the minutes that left the hour leave its sum, and
/// the hash; when the hour changes, both sums are summed again from the
/// counters and the counters that left are pruned. So a tenant's first
/// check in a minute costs what its absence moved, not 84 fields a kind
/// and a scan of the hash: with 10,000 tenants every check can be a first
/// one. A replica of the release before adds to the counters only; the
/// sums take its spending in at the next hour, which is what a budget may
/// be passed by while both run (decision 0055).
///
/// A refusal reads the counters: the retry is when enough of the oldest
/// have left the window for the check to pass (a whole window when nothing
/// would). The hash holds at most 61 + 25 counters and two sums per kind;
/// it expires a day after its last write.
static SPEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local now = tonumber(ARGV[1])
local minute = math.floor(now / 60000)
local hour = math.floor(now / 3600000)
local windows = {
  {tag = 'm', sum = 'hsum', now = minute, span = 60, length = 60000},
  {tag = 'h', sum = 'dsum', now = hour, span = 24, length = 3600000},
}
local function counters(prefix, w)
  local fields = {}
  for i = 0, w.span - 1 do fields[#fields + 1] = prefix .. ':' .. w.tag .. ':' .. (w.now - w.span + 1 + i) end
  local values = redis.call('HMGET', KEYS[1], unpack(fields))
  local sum = 0
  for i = 1, #values do values[i] = tonumber(values[i]) or 0; sum = sum + values[i] end
  return values, sum
end
local entries = {}
for k = 0, 3 do
  local i = 2 + 6 * k
  entries[#entries + 1] = {prefix = ARGV[i], add = tonumber(ARGV[i + 1]), take = tonumber(ARGV[i + 2]),
    limits = {tonumber(ARGV[i + 3]), tonumber(ARGV[i + 4])}, check = ARGV[i + 5] == '1'}
end
local function resum()
  for _, e in ipairs(entries) do
    for _, w in ipairs(windows) do
      local _, sum = counters(e.prefix, w)
      redis.call('HSET', KEYS[1], e.prefix .. ':' .. w.sum, sum)
    end
  end
  for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
    local tag, at = string.match(field, ':(%a):(%d+)$')
    at = tonumber(at)
    if (tag == 'm' and at <= minute - 60) or (tag == 'h' and at <= hour - 24) then
      redis.call('HDEL', KEYS[1], field)
    end
  end
end
local function move(at)
  for _, e in ipairs(entries) do
    local fields = {}
    for m = at - 59, minute - 60 do fields[#fields + 1] = e.prefix .. ':m:' .. m end
    local gone = 0
    for _, value in ipairs(redis.call('HMGET', KEYS[1], unpack(fields))) do gone = gone + (tonumber(value) or 0) end
    if gone > 0 then
      if redis.call('HINCRBY', KEYS[1], e.prefix .. ':hsum', -gone) < 0 then
        redis.call('HSET', KEYS[1], e.prefix .. ':hsum', 0)
      end
      redis.call('HDEL', KEYS[1], unpack(fields))
    end
  end
end
local at = tonumber(redis.call('HGET', KEYS[1], 'sums_at'))
if at ~= minute then
  if at and at < minute and math.floor(at / 60) == hour then
    move(at)
  elseif redis.call('EXISTS', KEYS[1]) == 1 then
    resum()
  end
  redis.call('HSET', KEYS[1], 'sums_at', minute)
end
local function add(prefix, amount)
  if amount > 0 then
    redis.call('HINCRBY', KEYS[1], prefix .. ':m:' .. minute, amount)
    redis.call('HINCRBY', KEYS[1], prefix .. ':h:' .. hour, amount)
    redis.call('HINCRBY', KEYS[1], prefix .. ':hsum', amount)
    redis.call('HINCRBY', KEYS[1], prefix .. ':dsum', amount)
  end
end
for _, e in ipairs(entries) do add(e.prefix, e.add) end
redis.call('PEXPIRE', KEYS[1], 90000000)
local function passes(sum, take, limit)
  if take > 0 then return sum + take <= limit end
  return sum < limit
end
local checked = {}
for _, e in ipairs(entries) do
  for _, w in ipairs(windows) do checked[#checked + 1] = e.prefix .. ':' .. w.sum end
end
local sums = redis.call('HMGET', KEYS[1], unpack(checked))
for k, e in ipairs(entries) do
  for j, w in ipairs(windows) do
    local limit = e.limits[j]
    if e.check and limit > 0 then
      local sum = tonumber(sums[2 * (k - 1) + j]) or 0
      if not passes(sum, e.take, limit) then
        local values
        values, sum = counters(e.prefix, w)
        local spent, retry = sum, w.span * w.length
        for i = 1, #values do
          sum = sum - values[i]
          if passes(sum, e.take, limit) then
            retry = (w.now - w.span + i + w.span) * w.length - now
            break
          end
        end
        return {k, j, spent, limit, math.max(retry, 0)}
      end
    end
  end
end
for _, e in ipairs(entries) do add(e.prefix, e.take) end
return {}
",
    )
});
