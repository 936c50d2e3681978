//! Test tools, for tests and benchmarks only: they are off unless the worker
//! runs with `--test-tools` (or `TOOLFLEET_TEST_TOOLS=1`).
//!
//! - `echo`: returns its arguments.
//! - `sleep`: waits `ms` milliseconds (cancellable), then returns.
//! - `fail`: fails as asked: `{"mode": "retryable" | "terminal"}`, and with
//!   `"fail_attempts": N` only attempts 1..=N fail and later ones succeed.
//! - `panic`: panics, to show a panic becomes `TOOL_EXECUTION_FAILED`.
//! - `set_flag`: sets a Redis key, then waits `delay_ms`: a side effect
//!   without a probe, so a worker killed meanwhile leaves an unknown outcome.
//! - `crash`: aborts the whole worker process, like a segfault or an OOM kill
//!   (a poison call).
//! - `increment_counter`: `INCR`s the Redis key in its arguments and records
//!   the call's idempotency key beside it, so a test can see whether a call
//!   ran twice.
//! - `measure_concurrency`: waits `ms` while counting in Redis how many of
//!   its calls run at once, and the most that ever did, so a test can see
//!   how many slots a busy tool really gets.

use std::time::Duration;

use serde_json::{Value, json};
use toolfleet_proto::{Effects, ErrorCode, ToolManifest};
use toolfleet_service::connect::RedisConnection;

use crate::tool::{Applied, Tool, ToolContext, ToolError, Toolbox};

/// The code `fail` answers with unless the arguments name another.
pub const TEST_FAILURE: ErrorCode = ErrorCode::from_static("TEST_FAILURE");

/// The test tool pack. `redis` backs the tools that record what they did.
pub fn toolbox(redis: RedisConnection) -> Toolbox {
    Toolbox::new()
        .with(Echo)
        .with(Sleep)
        .with(Fail)
        .with(Panic)
        .with(Crash)
        .with(SetFlag {
            redis: redis.clone(),
        })
        .with(IncrementCounter {
            redis: redis.clone(),
        })
        .with(MeasureConcurrency { redis })
}

/// Returns its arguments.
pub struct Echo;

impl Tool for Echo {
    fn manifest(&self) -> ToolManifest {
        ToolManifest::new(
            "echo",
            "Test tool: returns its arguments unchanged.",
            json!({"type": "object"}),
        )
        .non_strict()
        .with_timeout(Duration::from_secs(5))
        .with_effects(Effects::ReadOnly)
    }

    async fn call(&self, args: Value, _ctx: ToolContext) -> Result<Value, ToolError> {
        Ok(args)
    }
}

/// Waits, then returns.
pub struct Sleep;

impl Tool for Sleep {
    fn manifest(&self) -> ToolManifest {
        ToolManifest::new(
            "sleep",
            "Test tool: waits `ms` milliseconds, then returns.",
            json!({"type": "object", "additionalProperties": false, "required": ["ms"],
                   "properties": {"ms": {"type": "integer", "minimum": 0, "maximum": 600_000}}}),
        )
        .with_timeout(Duration::from_secs(30))
        .with_effects(Effects::ReadOnly)
    }

    async fn call(&self, args: Value, ctx: ToolContext) -> Result<Value, ToolError> {
        let ms = args["ms"].as_u64().unwrap_or_default(); // the schema made it an integer
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(ms)) => Ok(json!({"slept_ms": ms})),
            () = ctx.cancelled.cancelled() => Err(ToolError::terminal(ErrorCode::CANCELLED, "sleep cancelled")),
        }
    }
}

/// Fails on request.
pub struct Fail;

impl Tool for Fail {
    fn manifest(&self) -> ToolManifest {
        ToolManifest::new(
            "fail",
            "Test tool: fails with a retryable or terminal error, optionally only for the first attempts.",
            json!({"type": "object", "additionalProperties": false, "required": ["mode"],
                   "properties": {
                       "mode": {"type": "string", "enum": ["retryable", "terminal"]},
                       "fail_attempts": {"type": "integer", "minimum": 0},
                       "code": {"type": "string", "pattern": "^[A-Z][A-Z0-9_]*$"}}}),
        )
        .non_strict()
        .with_max_attempts(5)
        .with_effects(Effects::ReadOnly)
    }

    async fn call(&self, args: Value, ctx: ToolContext) -> Result<Value, ToolError> {
        let fail_attempts = args["fail_attempts"].as_u64().unwrap_or(u64::MAX);
        if u64::from(ctx.attempt) > fail_attempts {
            return Ok(json!({"attempt": ctx.attempt}));
        }
        let code = args["code"]
            .as_str()
            .map_or(TEST_FAILURE, ErrorCode::custom);
        let message = format!("failing attempt {} as requested", ctx.attempt);
        Err(match args["mode"].as_str() {
            Some("retryable") => ToolError::retryable(code, message),
            _ => ToolError::terminal(code, message),
        })
    }
}

/// Panics.
pub struct Panic;

impl Tool for Panic {
    fn manifest(&self) -> ToolManifest {
        ToolManifest::new("panic", "Test tool: panics.", json!({"type": "object"}))
            .non_strict()
            .with_max_attempts(1)
            .with_effects(Effects::ReadOnly)
    }

    async fn call(&self, _args: Value, _ctx: ToolContext) -> Result<Value, ToolError> {
        panic!("test tool panicked with secret internals at /srv/secret.rs:42");
    }
}

/// Sets a Redis key: a side effect the runtime cannot probe.
pub struct SetFlag {
    redis: RedisConnection,
}

impl Tool for SetFlag {
    fn manifest(&self) -> ToolManifest {
        ToolManifest::new(
            "set_flag",
            "Test tool: sets the Redis key `key` to 1, then waits `delay_ms`.",
            json!({"type": "object", "additionalProperties": false, "required": ["key"],
                   "properties": {"key": {"type": "string", "minLength": 1, "maxLength": 200, "pattern": "^[^{}]+$"},
                                  "delay_ms": {"type": "integer", "minimum": 0, "maximum": 10_000}}}),
        )
        .non_strict()
        // Setting a key twice is harmless, but the tests use it as the
        // effect whose outcome a crash leaves unknown.
        .with_effects(Effects::NotIdempotent)
    }

    async fn call(&self, args: Value, _ctx: ToolContext) -> Result<Value, ToolError> {
        let key = args["key"].as_str().unwrap_or_default(); // the schema made it a string
        let set: redis::RedisResult<()> = redis::cmd("SET")
            .arg(key)
            .arg(1)
            .query_async(&mut self.redis.clone())
            .await;
        set.map_err(|err| {
            tracing::warn!(error = %err, "set_flag failed");
            ToolError::retryable(
                ErrorCode::from_static("FLAG_UNAVAILABLE"),
                "the flag store is unavailable",
            )
        })?;
        let delay = args["delay_ms"].as_u64().unwrap_or(0);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        Ok(json!({"key": key}))
    }
}

/// Aborts the worker process.
pub struct Crash;

impl Tool for Crash {
    fn manifest(&self) -> ToolManifest {
        ToolManifest::new(
            "crash",
            "Test tool: kills the worker process.",
            json!({"type": "object"}),
        )
        .non_strict()
        .with_max_attempts(1)
        .with_effects(Effects::ReadOnly)
    }

    async fn call(&self, _args: Value, _ctx: ToolContext) -> Result<Value, ToolError> {
        tracing::error!("crash tool: aborting the worker process");
        std::process::abort();
    }
}

/// Increments a Redis counter: a side effect whose repetitions are visible.
pub struct IncrementCounter {
    redis: RedisConnection,
}

/// `INCR` the counter and count the idempotency key beside it, atomically.
const INCREMENT: &str = r"
local value = redis.call('INCR', KEYS[1])
redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
return value
";

impl IncrementCounter {
    /// The hash beside `key` that counts executions per idempotency key,
    /// in `key`'s hash slot (the script touches both on a Redis Cluster).
    pub fn executions_key(key: &str) -> String {
        format!("{{{key}}}:executions")
    }
}

impl Tool for IncrementCounter {
    fn manifest(&self) -> ToolManifest {
        ToolManifest::new(
            "increment_counter",
            "Test tool: increments the Redis counter `key` by one and returns the new value; \
             with `delay_ms` it then waits, so a worker killed meanwhile leaves the effect \
             applied and no result; with `probe_delay_ms` its probe answers that much later \
             than it read (a slow store).",
            json!({"type": "object", "additionalProperties": false, "required": ["key"],
                   "properties": {"key": {"type": "string", "minLength": 1, "maxLength": 200, "pattern": "^[^{}]+$"},
                                  "delay_ms": {"type": "integer", "minimum": 0, "maximum": 10_000},
                                  "probe_delay_ms": {"type": "integer", "minimum": 0, "maximum": 10_000}}}),
        )
        .non_strict()
        .with_effects(Effects::NotIdempotent)
    }

    async fn call(&self, args: Value, ctx: ToolContext) -> Result<Value, ToolError> {
        let key = args["key"].as_str().unwrap_or_default(); // the schema made it a string
        let value: i64 = redis::Script::new(INCREMENT)
            .key(key)
            .key(Self::executions_key(key))
            .arg(&ctx.idempotency_key)
            .invoke_async(&mut self.redis.clone())
            .await
            .map_err(|err| {
                tracing::warn!(error = %err, "counter update failed");
                ToolError::retryable(
                    ErrorCode::from_static("COUNTER_UNAVAILABLE"),
                    "the counter store is unavailable",
                )
            })?;
        let delay = args["delay_ms"].as_u64().unwrap_or(0);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        Ok(json!({"key": key, "value": value}))
    }

    /// Applied when the executions hash has the idempotency key.
    async fn probe(&self, args: Value, ctx: ToolContext) -> Applied {
        let key = args["key"].as_str().unwrap_or_default();
        let mut redis = self.redis.clone();
        let count: redis::RedisResult<Option<i64>> = redis::cmd("HGET")
            .arg(Self::executions_key(key))
            .arg(&ctx.idempotency_key)
            .query_async(&mut redis)
            .await;
        let delay = args["probe_delay_ms"].as_u64().unwrap_or(0);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        match count {
            Ok(Some(n)) if n > 0 => {
                let value: Option<i64> = redis::cmd("GET")
                    .arg(key)
                    .query_async(&mut redis)
                    .await
                    .ok()
                    .flatten();
                Applied::Yes(json!({"key": key, "value": value, "recovered": true}))
            }
            Ok(_) => Applied::No,
            // The executions hash knows; it just cannot be read right now.
            Err(err) => {
                tracing::warn!(error = %err, "counter probe failed");
                Applied::Unavailable
            }
        }
    }
}

/// Waits while counting how many of its calls run at once.
pub struct MeasureConcurrency {
    redis: RedisConnection,
}

/// KEYS: running, most. One more call runs; `most` keeps the highest count.
const STARTED: &str = r"
local running = redis.call('INCR', KEYS[1])
if running > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], running) end
return running
";

impl MeasureConcurrency {
    /// The key that holds the most calls of `key` that ever ran at once,
    /// in `key`'s hash slot (the script touches both on a Redis Cluster).
    pub fn most_key(key: &str) -> String {
        format!("{{{key}}}:most")
    }
}

impl Tool for MeasureConcurrency {
    fn manifest(&self) -> ToolManifest {
        ToolManifest::new(
            "measure_concurrency",
            "Test tool: waits `ms` milliseconds while counting, in the Redis key `key`, how \
             many of its calls run at once; `{key}:most` keeps the highest count.",
            json!({"type": "object", "additionalProperties": false, "required": ["key", "ms"],
                   "properties": {"key": {"type": "string", "minLength": 1, "maxLength": 200, "pattern": "^[^{}]+$"},
                                  "ms": {"type": "integer", "minimum": 0, "maximum": 60_000}}}),
        )
        .with_timeout(Duration::from_secs(90))
        .with_effects(Effects::ReadOnly)
    }

    async fn call(&self, args: Value, _ctx: ToolContext) -> Result<Value, ToolError> {
        let key = args["key"].as_str().unwrap_or_default(); // the schema made it a string
        let ms = args["ms"].as_u64().unwrap_or_default();
        let unavailable = |err: redis::RedisError| {
            tracing::warn!(error = %err, "concurrency count failed");
            ToolError::retryable(
                ErrorCode::from_static("COUNTER_UNAVAILABLE"),
                "the counter store is unavailable",
            )
        };
        let mut redis = self.redis.clone();
        let running: i64 = redis::Script::new(STARTED)
            .key(key)
            .key(Self::most_key(key))
            .invoke_async(&mut redis)
            .await
            .map_err(unavailable)?;
        tokio::time::sleep(Duration::from_millis(ms)).await;
        let _: i64 = redis::cmd("DECR")
            .arg(key)
            .query_async(&mut redis)
            .await
            .map_err(unavailable)?;
        Ok(json!({"running_with": running}))
    }
}
