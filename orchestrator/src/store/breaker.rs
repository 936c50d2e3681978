//! Each tool's circuit breaker (`tf:breaker:<tool>`), shared by every
//! orchestrator: a hash of its `state` ([`State::to_field`]) and the
//! calls and failures of each bucket of its window, `c:<bucket>` and
//! `f:<bucket>`. A recorded outcome adds to its bucket and drops the
//! buckets that left the window, in one script, so the hash holds at most
//! a window's buckets; the key expires when the tool is idle
//! (`BreakerOptions::key_ttl_ms`). What the counts and the state mean is
//! `crate::breaker`'s: a move of the state is written only if the state is
//! still the one it was decided from.

use std::collections::HashMap;
use std::sync::LazyLock;

use redis::{AsyncCommands, Script};

use crate::breaker::{BUCKETS, State};

use super::*;

/// A tool's window, as a recorded outcome left it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Window {
    /// The breaker's state.
    pub state: State,
    /// Calls settled, by bucket.
    pub calls: HashMap<u64, u64>,
    /// Of which failed, by bucket.
    pub failed: HashMap<u64, u64>,
}

impl JobStore {
    /// The breakers of `tools`; a tool without one is closed.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub(crate) async fn breakers(&self, tools: &[&str]) -> Result<HashMap<String, State>, Error> {
        let keys: Vec<String> = tools
            .iter()
            .map(|tool| self.keys.tool_breaker(tool))
            .collect();
        let fields: Vec<Option<String>> = if self.redis.is_cluster() {
            // One key per tool, each in its own slot: all at once.
            let reads = keys.into_iter().map(|key| {
                let mut conn = self.conn();
                async move { conn.hget::<_, _, Option<String>>(key, "state").await }
            });
            futures::future::try_join_all(reads).await?
        } else {
            // One round trip for a turn's every tool.
            let mut pipe = redis::pipe();
            for key in &keys {
                pipe.hget(key, "state");
            }
            pipe.query_async(&mut self.conn()).await?
        };
        Ok(tools
            .iter()
            .zip(fields)
            .map(|(tool, field)| {
                let state = field.as_deref().map_or(State::Closed, State::from_field);
                ((*tool).to_owned(), state)
            })
            .collect())
    }

    /// Adds a settled call of `tool` to bucket `bucket` of its window (and
    /// to its failures when `failed`), drops the buckets older than the
    /// window, and returns the window; the key lives `ttl_ms` more.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub(crate) async fn record_breaker_outcome(
        &self,
        tool: &str,
        bucket: u64,
        failed: bool,
        ttl_ms: u64,
    ) -> Result<Window, Error> {
        let fields: HashMap<String, String> = RECORD_OUTCOME
            .key(self.keys.tool_breaker(tool))
            .arg(bucket)
            .arg(bucket.saturating_sub(BUCKETS - 1))
            .arg(u8::from(failed))
            .arg(ttl_ms)
            .invoke_async(&mut self.conn())
            .await?;
        Ok(window_of(fields))
    }

    /// Moves `tool`'s breaker from `from` to `to`, if it is still `from`;
    /// `false` when another replica moved it first. Closing it empties its
    /// window, so that the failures that opened it do not open it again.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub(crate) async fn move_breaker(
        &self,
        tool: &str,
        from: &State,
        to: &State,
        ttl_ms: u64,
    ) -> Result<bool, Error> {
        let moved: i64 = MOVE_BREAKER
            .key(self.keys.tool_breaker(tool))
            .arg(from.to_field())
            .arg(to.to_field())
            .arg(ttl_ms)
            .invoke_async(&mut self.conn())
            .await?;
        Ok(moved == 1)
    }
}

/// The window a hash's fields hold.
fn window_of(fields: HashMap<String, String>) -> Window {
    let mut window = Window::default();
    for (field, value) in fields {
        let count = || value.parse::<u64>().ok();
        if field == "state" {
            window.state = State::from_field(&value);
        } else if let Some((bucket, n)) = field
            .strip_prefix("c:")
            .and_then(|b| b.parse::<u64>().ok().zip(count()))
        {
            window.calls.insert(bucket, n);
        } else if let Some((bucket, n)) = field
            .strip_prefix("f:")
            .and_then(|b| b.parse::<u64>().ok().zip(count()))
        {
            window.failed.insert(bucket, n);
        }
    }
    window
}

/// KEYS: the breaker. ARGV: the bucket, the oldest bucket kept, 1 if the
/// call failed, the key's TTL (ms). Returns the hash's fields.
static RECORD_OUTCOME: LazyLock<Script> = LazyLock::new(|| {
    scripts::script(
        r"
local key = KEYS[1]
local bucket = ARGV[1]
local oldest = tonumber(ARGV[2])
redis.call('HINCRBY', key, 'c:' .. bucket, 1)
if ARGV[3] == '1' then
  redis.call('HINCRBY', key, 'f:' .. bucket, 1)
end
for _, field in ipairs(redis.call('HKEYS', key)) do
  local n = tonumber(string.match(field, '^[cf]:(%d+)$'))
  if n and n < oldest then
    redis.call('HDEL', key, field)
  end
end
redis.call('PEXPIRE', key, ARGV[4])
return redis.call('HGETALL', key)
",
    )
});

/// KEYS: the breaker. ARGV: the state it must hold (empty: closed), the
/// state to write (empty: closed, and the window emptied), the key's TTL
/// (ms). Returns 1 when written, 0 when the state was another.
static MOVE_BREAKER: LazyLock<Script> = LazyLock::new(|| {
    scripts::script(
        r"
local key = KEYS[1]
local state = redis.call('HGET', key, 'state') or ''
if state ~= ARGV[1] then
  return 0
end
if ARGV[2] == '' then
  redis.call('DEL', key)
  return 1
end
redis.call('HSET', key, 'state', ARGV[2])
redis.call('PEXPIRE', key, ARGV[3])
return 1
",
    )
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scripts_are_filled() {
        scripts::tests::assert_filled("record_outcome", &RECORD_OUTCOME);
        scripts::tests::assert_filled("move_breaker", &MOVE_BREAKER);
    }

    #[test]
    fn a_window_is_read_from_its_fields() {
        let fields = [
            ("state", "open:1:2:3:4"),
            ("c:7", "5"),
            ("f:7", "3"),
            ("c:8", "1"),
            ("c:x", "1"),
            ("f:9", "many"),
        ];
        let window = window_of(
            fields
                .iter()
                .map(|(f, v)| ((*f).to_owned(), (*v).to_owned()))
                .collect(),
        );
        assert_eq!(window.state.name(), "open");
        assert_eq!(window.calls, HashMap::from([(7, 5), (8, 1)]));
        assert_eq!(window.failed, HashMap::from([(7, 3)]));
    }
}
