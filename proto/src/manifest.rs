//! What a worker announces about each tool it serves.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The description of a tool: what the model sees (name, description, JSON
/// Schema) and how the fleet treats its calls.
///
/// Read from the wire through `Announced`, which also takes what a worker
/// from before [`Effects`] wrote; written with `side_effects` beside
/// `effects` for the orchestrators from before it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(from = "Announced")]
pub struct ToolManifest {
    /// `verb_object`, matching `^[a-zA-Z0-9_-]{1,64}$` (the OpenAI function name rule).
    pub name: String,
    /// When to use the tool and when not; shown to the model.
    pub description: String,
    /// JSON Schema of the arguments object.
    pub parameters: Value,
    /// Whether the schema is strict (OpenAI structured outputs): every property
    /// required and `additionalProperties: false`.
    pub strict: bool,
    /// How long one attempt may run, in milliseconds.
    pub timeout_ms: u64,
    /// How many attempts the orchestrator makes for a retryable failure.
    pub max_attempts: u32,
    /// What a call may do beyond answering, and so what running it twice
    /// would do (decision 0037). A manifest that does not say is
    /// [`Effects::NotIdempotent`].
    pub effects: Effects,
    /// Version of the tool's implementation, free-form.
    pub version: String,
    /// How retryable failures are retried. `None`: the orchestrator's
    /// `dispatch.retry_*` settings, with `max_attempts` above.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryPolicy>,
    /// Whether a person must approve each call before it runs. A manifest
    /// without the field (an older worker's) means [`Approval::Never`].
    #[serde(default, skip_serializing_if = "Approval::is_never")]
    pub approval: Approval,
    /// Above how many bytes of `data` (its JSON text) a result of the tool
    /// is shaped: stored whole with the job, and the model shown its head,
    /// its tail and a reference to page through it with `read_result`
    /// (docs/protection.md). `None`: the orchestrator's
    /// `results.shape_above_bytes`. Within [`MIN_SHAPE_ABOVE_BYTES`] and
    /// [`MAX_SHAPE_ABOVE_BYTES`] ([`check`](Self::check)).
    pub shape_above_bytes: Option<u64>,
    /// How long, in milliseconds, a successful result of the tool may
    /// answer a call of another job of the same tenant with the same
    /// arguments, without running it (the cross-run result cache,
    /// docs/protection.md). Only for a [`Effects::ReadOnly`] tool, within
    /// [`MIN_CACHE_TTL_MS`] and [`MAX_CACHE_TTL_MS`]
    /// ([`check`](Self::check)). `None`: never cached.
    pub cache_ttl_ms: Option<u64>,
    /// What one attempt of a call of the tool costs, in the cost units of
    /// budgets (docs/protection.md, "Budgets"): its price in whatever the
    /// tenant counts. At most [`MAX_TOOL_COST`]; 0 is a free tool. `None`:
    /// 1 ([`cost_units`](Self::cost_units)).
    pub cost: Option<u64>,
    /// The tool's own circuit breaker settings, over the orchestrator's
    /// `[breaker]` section (docs/protection.md). `None`: the orchestrator's.
    pub breaker: Option<BreakerOverride>,
}

/// A tool's own circuit breaker settings (docs/protection.md): each field
/// it gives replaces the orchestrator's `breaker.*` key of the same name
/// for this tool; the bounds are the orchestrator's
/// ([`check`](Self::check)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BreakerOverride {
    /// `false` turns the tool's breaker off (`true` cannot turn on what
    /// the orchestrator turned off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// How far back the tool's calls are counted, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_ms: Option<u64>,
    /// The fewest calls in the window before the breaker may open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_calls: Option<u32>,
    /// The share of failed calls at or above which it opens, in (0, 1].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_ratio: Option<f64>,
    /// How long it refuses calls once open, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cool_down_ms: Option<u64>,
}

/// The shortest breaker window or cool-down: one second.
pub const MIN_BREAKER_MS: u64 = 1000;
/// The longest breaker window or cool-down: one hour.
pub const MAX_BREAKER_MS: u64 = 3600 * 1000;
/// The most a breaker's `min_calls` may be.
pub const MAX_BREAKER_MIN_CALLS: u32 = 100_000;

impl BreakerOverride {
    /// Whether every field given is within its bounds, else the first that
    /// is not, named.
    ///
    /// # Errors
    ///
    /// A window or cool-down outside [`MIN_BREAKER_MS`] and
    /// [`MAX_BREAKER_MS`], a `min_calls` of 0 or above
    /// [`MAX_BREAKER_MIN_CALLS`], a ratio not above 0 and at most 1.
    pub fn check(&self) -> Result<(), String> {
        for (key, ms) in [
            ("window_ms", self.window_ms),
            ("cool_down_ms", self.cool_down_ms),
        ] {
            if let Some(ms) = ms.filter(|ms| !(MIN_BREAKER_MS..=MAX_BREAKER_MS).contains(ms)) {
                return Err(format!(
                    "{key}: {ms} ms is not within 1000 ms and 3600000 ms (1h)"
                ));
            }
        }
        if let Some(calls) = self
            .min_calls
            .filter(|calls| !(1..=MAX_BREAKER_MIN_CALLS).contains(calls))
        {
            return Err(format!(
                "min_calls: {calls} is not within 1 and {MAX_BREAKER_MIN_CALLS}"
            ));
        }
        // NaN fails both comparisons.
        if let Some(ratio) = self.failure_ratio.filter(|r| !(*r > 0.0 && *r <= 1.0)) {
            return Err(format!(
                "failure_ratio: {ratio} is not above 0 and at most 1"
            ));
        }
        Ok(())
    }
}

/// What a tool's calls may do beyond answering, and so what running one
/// twice would do: the one field the fleet reads for what happens to a
/// call after a crash, a retry or a timeout, for `when_side_effects`
/// approval, and for anything that would skip or repeat a call (decision
/// 0037; docs/tools/effects.md has the table).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Effects {
    /// Changes nothing outside the worker: a call may run again at any
    /// time (redelivered after a crash, retried after a timeout).
    ReadOnly,
    /// Changes something, but running a call again with the same arguments
    /// changes nothing more (setting a value, a PUT): it runs again like a
    /// read-only call, and it has effects (a person may be asked first).
    Idempotent,
    /// Changes something that running a call again would change again (a
    /// payment, a message, an append). The worker marks its start, asks the
    /// tool's probe before running it again, and answers `OUTCOME_UNKNOWN`
    /// when nothing can tell (decision 0004). What a tool that does not say
    /// is taken to be.
    #[default]
    NotIdempotent,
}

impl Effects {
    /// Every value, mildest first.
    pub const ALL: [Self; 3] = [Self::ReadOnly, Self::Idempotent, Self::NotIdempotent];

    /// Its name in manifests, configuration and the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ReadOnly => "read_only",
            Self::Idempotent => "idempotent",
            Self::NotIdempotent => "not_idempotent",
        }
    }

    /// Whether a call may change something outside the worker: what
    /// `when_side_effects` approval asks about.
    pub fn changes_things(self) -> bool {
        self != Self::ReadOnly
    }

    /// Whether running a call again could repeat an effect: its start is
    /// marked, and it is probed before it runs again.
    pub fn repeats_harm(self) -> bool {
        self == Self::NotIdempotent
    }
}

impl std::fmt::Display for Effects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Effects {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|effects| effects.as_str() == text)
            .ok_or_else(|| {
                format!("{text:?} is not an effect: read_only, idempotent or not_idempotent")
            })
    }
}

/// A manifest as the wire carries it, to read one written before
/// [`Effects`]: a worker that said only `side_effects` meant
/// [`Effects::NotIdempotent`] by `true` and [`Effects::ReadOnly`] by
/// `false`. Taken apart into a [`ToolManifest`] by moves, at no cost.
#[derive(Deserialize)]
struct Announced {
    name: String,
    description: String,
    parameters: Value,
    strict: bool,
    timeout_ms: u64,
    max_attempts: u32,
    #[serde(default)]
    effects: Option<Effects>,
    #[serde(default)]
    side_effects: Option<bool>,
    version: String,
    #[serde(default)]
    retry: Option<RetryPolicy>,
    #[serde(default)]
    approval: Approval,
    #[serde(default)]
    shape_above_bytes: Option<u64>,
    #[serde(default)]
    cache_ttl_ms: Option<u64>,
    #[serde(default)]
    cost: Option<u64>,
    breaker: Option<BreakerOverride>,
}

impl From<Announced> for ToolManifest {
    fn from(wire: Announced) -> Self {
        let effects = match (wire.effects, wire.side_effects) {
            (Some(effects), _) => effects,
            (None, Some(false)) => Effects::ReadOnly,
            (None, _) => Effects::NotIdempotent,
        };
        Self {
            name: wire.name,
            description: wire.description,
            parameters: wire.parameters,
            strict: wire.strict,
            timeout_ms: wire.timeout_ms,
            max_attempts: wire.max_attempts,
            effects,
            version: wire.version,
            retry: wire.retry,
            approval: wire.approval,
            shape_above_bytes: wire.shape_above_bytes,
            cache_ttl_ms: wire.cache_ttl_ms,
            cost: wire.cost,
            breaker: wire.breaker,
        }
    }
}

impl Serialize for ToolManifest {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut fields = 9 + usize::from(self.retry.is_some());
        fields += usize::from(!self.approval.is_never());
        fields += usize::from(self.shape_above_bytes.is_some());
        fields += usize::from(self.cache_ttl_ms.is_some());
        fields += usize::from(self.cost.is_some());
        fields += usize::from(self.breaker.is_some());
        let mut out = serializer.serialize_struct("ToolManifest", fields)?;
        out.serialize_field("name", &self.name)?;
        out.serialize_field("description", &self.description)?;
        out.serialize_field("parameters", &self.parameters)?;
        out.serialize_field("strict", &self.strict)?;
        out.serialize_field("timeout_ms", &self.timeout_ms)?;
        out.serialize_field("max_attempts", &self.max_attempts)?;
        out.serialize_field("effects", &self.effects)?;
        // For orchestrators from before `effects`, which require it.
        out.serialize_field("side_effects", &self.effects.changes_things())?;
        out.serialize_field("version", &self.version)?;
        if let Some(retry) = &self.retry {
            out.serialize_field("retry", retry)?;
        }
        if !self.approval.is_never() {
            out.serialize_field("approval", &self.approval)?;
        }
        if let Some(bytes) = self.shape_above_bytes {
            out.serialize_field("shape_above_bytes", &bytes)?;
        }
        if let Some(ttl_ms) = self.cache_ttl_ms {
            out.serialize_field("cache_ttl_ms", &ttl_ms)?;
        }
        if let Some(cost) = self.cost {
            out.serialize_field("cost", &cost)?;
        }
        if let Some(breaker) = &self.breaker {
            out.serialize_field("breaker", breaker)?;
        }
        out.end()
    }
}

/// Whether a tool's calls wait for a person's approval before they run
/// (docs/approvals.md). The tenant and the job can ask for approval too;
/// the strictest wins.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Approval {
    /// The tool's calls run without one (unless the tenant or job asks).
    #[default]
    Never,
    /// Every call of the tool needs one.
    Always,
    /// Every call needs one when the tool's calls change something (its
    /// [`Effects`] are not `read_only`).
    WhenSideEffects,
}

impl Approval {
    /// Its name in manifests and in the API (`when_side_effects`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Never => "never",
            Self::Always => "always",
            Self::WhenSideEffects => "when_side_effects",
        }
    }

    fn is_never(&self) -> bool {
        *self == Self::Never
    }
}

impl ToolManifest {
    /// A manifest with the defaults: strict schema, 10 s timeout, 3 attempts,
    /// effects [`Effects::NotIdempotent`] (until the tool says otherwise),
    /// version "1".
    pub fn new(name: impl Into<String>, description: impl Into<String>, parameters: Value) -> Self {
        Self {
            name: name.into(),
            description: description.into(),
            parameters,
            strict: true,
            timeout_ms: 10_000,
            max_attempts: 3,
            effects: Effects::NotIdempotent,
            version: "1".into(),
            retry: None,
            approval: Approval::Never,
            shape_above_bytes: None,
            cache_ttl_ms: None,
            cost: None,
            breaker: None,
        }
    }

    /// The hash of the tool's contract with its callers: lowercase hex
    /// SHA-256 of `toolfleet.contract.v1` and a newline, then the
    /// [canonical JSON](crate::canonical) of `{"effects", "name",
    /// "parameters", "strict"}`. Two manifests have the same hash exactly
    /// when they take the same arguments under the same name and a call
    /// does the same kind of thing: the same schema however its JSON is
    /// written (key order, whitespace, `1` or `1.0`), the same strictness
    /// and the same [`Effects`]. What does not change the meaning of a
    /// call is left out: the description, the timeout, the attempts and
    /// the retry policy, the version and the approval. Stored data (a
    /// result cached under it) depends on it: the form never changes
    /// within `v1`.
    pub fn contract_hash(&self) -> String {
        use sha2::{Digest, Sha256};
        let contract = serde_json::json!({
            "effects": self.effects.as_str(),
            "name": self.name,
            "parameters": self.parameters,
            "strict": self.strict,
        });
        let mut hasher = Sha256::new();
        hasher.update(b"toolfleet.contract.v1\n");
        hasher.update(crate::canonical::to_string(&contract).as_bytes());
        format!("{:x}", hasher.finalize())
    }

    /// Whether `text` has the form of a contract hash: 64 lowercase hex
    /// digits. What a record from outside says a version is (a ledger
    /// record's `tool_version`) is taken only in this form.
    pub fn is_contract_hash(text: &str) -> bool {
        text.len() == 64 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    }

    /// The retry policy of this tool's calls: its own, or `default` with the
    /// manifest's `max_attempts`.
    pub fn retry_policy(&self, default: RetryPolicy) -> RetryPolicy {
        self.retry.unwrap_or(RetryPolicy {
            max_attempts: self.max_attempts,
            ..default
        })
    }

    /// Declares the tool's own retry policy (its attempt limit included).
    #[must_use]
    pub fn with_retry(mut self, policy: RetryPolicy) -> Self {
        self.max_attempts = policy.max_attempts.max(1);
        self.retry = Some(policy);
        self
    }

    /// Sets the per-attempt timeout.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        self
    }

    /// Sets how many attempts a retryable failure gets.
    #[must_use]
    pub fn with_max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = max_attempts.max(1);
        self
    }

    /// Says what the tool's calls may do beyond answering.
    #[must_use]
    pub fn with_effects(mut self, effects: Effects) -> Self {
        self.effects = effects;
        self
    }

    /// Says when the tool's calls need a person's approval.
    #[must_use]
    pub fn with_approval(mut self, approval: Approval) -> Self {
        self.approval = approval;
        self
    }

    /// Says above how many bytes of `data` the tool's results are shaped
    /// (docs/protection.md), instead of the orchestrator's default.
    #[must_use]
    pub fn with_shape_above_bytes(mut self, bytes: u64) -> Self {
        self.shape_above_bytes = Some(bytes);
        self
    }

    /// Lets a successful result of this tool answer the same tenant's
    /// calls with the same arguments for `ttl`, without running them (the
    /// cross-run result cache, docs/protection.md). Only a
    /// [`Effects::ReadOnly`] tool's results may be cached: a manifest that
    /// says otherwise fails [`check`](Self::check).
    #[must_use]
    pub fn with_cache_ttl(mut self, ttl: Duration) -> Self {
        self.cache_ttl_ms = Some(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX));
        self
    }

    /// Whether a result of this tool may answer another call, and for how
    /// long: its `cache_ttl_ms` when its effects are `read_only`, never
    /// otherwise (whatever the manifest says).
    pub fn cache_ttl(&self) -> Option<Duration> {
        self.cache_ttl_ms
            .filter(|_| self.effects == Effects::ReadOnly)
            .map(Duration::from_millis)
    }

    /// Says what one attempt of a call of the tool costs, in budgets' cost
    /// units (docs/protection.md, "Budgets"), instead of 1.
    #[must_use]
    pub fn with_cost(mut self, cost: u64) -> Self {
        self.cost = Some(cost);
        self
    }

    /// What one attempt of a call of the tool costs in budgets' cost
    /// units: its `cost`, else 1.
    pub fn cost_units(&self) -> u64 {
        self.cost.unwrap_or(DEFAULT_TOOL_COST)
    }

    /// Gives this tool circuit breaker settings of its own
    /// (docs/protection.md), checked by [`check`](Self::check).
    #[must_use]
    pub fn with_breaker(mut self, breaker: BreakerOverride) -> Self {
        self.breaker = Some(breaker);
        self
    }

    /// Marks the schema as not strict (optional properties allowed).
    #[must_use]
    pub fn non_strict(mut self) -> Self {
        self.strict = false;
        self
    }
}

/// How the orchestrator retries a call whose envelope is retryable: an
/// exponential backoff with jitter, bounded by an attempt limit. Plain data,
/// so that it can travel in the manifest; [`next_delay`](Self::next_delay)
/// is the whole policy.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryPolicy {
    /// Delay after the first failed attempt, in milliseconds.
    pub initial_backoff_ms: u64,
    /// Longest delay before jitter, in milliseconds.
    pub max_backoff_ms: u64,
    /// Growth of the delay per attempt: 2.0 doubles it. Values below 1 count as 1.
    pub multiplier: f64,
    /// Share of the delay added at random: 0 for none, 1 for up to as much
    /// again (clamped to 0..=1). Spreads the retries of many calls that
    /// failed together.
    pub jitter: f64,
    /// Attempts in all, the first included.
    pub max_attempts: u32,
}

impl RetryPolicy {
    /// The pause before the attempt after `attempt` (1-based) failed
    /// retryably, or `None` when that was the last attempt allowed.
    ///
    /// The tool's own `retry_after` wins over the computed delay. Otherwise
    /// the delay is `initial * multiplier^(attempt-1)`, capped at the max,
    /// plus `jitter * jitter_sample` of itself, where `jitter_sample` is a
    /// uniform draw from `0..1` (the caller's, so this stays pure). A
    /// manifest from the bus may hold any numbers: nothing here can panic or
    /// overflow.
    pub fn next_delay(
        &self,
        attempt: u32,
        retry_after: Option<Duration>,
        jitter_sample: f64,
    ) -> Option<Duration> {
        if attempt >= self.max_attempts {
            return None;
        }
        if let Some(retry_after) = retry_after {
            return Some(retry_after);
        }
        let max = self.max_backoff_ms as f64;
        let growth = self
            .multiplier
            .max(1.0)
            .powi(attempt.saturating_sub(1).min(1024) as i32);
        let base = (self.initial_backoff_ms as f64 * growth).min(max);
        let unit = |x: f64| if x.is_nan() { 0.0 } else { x.clamp(0.0, 1.0) };
        let jitter = unit(self.jitter) * unit(jitter_sample);
        // `as` from f64 saturates (and NaN becomes 0): no overflow.
        Some(Duration::from_millis((base + base * jitter) as u64))
    }
}

/// A tool name is valid when it is 1 to 64 ASCII letters, digits, `_` or `-`.
/// The same rule keeps it safe as a NATS subject token and a consumer name.
pub fn is_valid_tool_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Whether `name` is a pool name: 1 to [`MAX_POOL_NAME_LEN`] ASCII
/// letters, digits, `_`, `-` or `.`.
pub fn is_valid_pool_name(name: &str) -> bool {
    (1..=MAX_POOL_NAME_LEN).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// Whether `name` is an MCP server's name: 1 to
/// [`MAX_MCP_SERVER_NAME_LEN`] ASCII letters, digits, `_` or `-`.
pub fn is_valid_mcp_server_name(name: &str) -> bool {
    (1..=MAX_MCP_SERVER_NAME_LEN).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The orchestrator's own tool that pages through a shaped result
/// (docs/protection.md): offered to a job that holds one, answered by the
/// orchestrator, never published. No worker may announce a tool of this
/// name ([`ToolManifest::check`]).
pub const READ_RESULT_TOOL: &str = "read_result";

/// The least `shape_above_bytes` (a manifest's, or the orchestrator's
/// `results.shape_above_bytes`): below it the view of a shaped result, its
/// reference and fields, would leave no room for its head and tail.
pub const MIN_SHAPE_ABOVE_BYTES: u64 = 1024;

/// The most `shape_above_bytes` may be: 16 MiB. Past it nothing is ever
/// shaped (a worker's `runtime.max_output_bytes` is 1 MiB by default, and a
/// NATS message at most 64 MiB), and no model's context holds it.
pub const MAX_SHAPE_ABOVE_BYTES: u64 = 16 * 1024 * 1024;

/// Whether `bytes` is a `shape_above_bytes` within its bounds, else what is
/// wrong with it (for a message that names the key).
///
/// # Errors
///
/// Below [`MIN_SHAPE_ABOVE_BYTES`] or above [`MAX_SHAPE_ABOVE_BYTES`].
pub fn check_shape_above_bytes(bytes: u64) -> Result<u64, String> {
    if bytes < MIN_SHAPE_ABOVE_BYTES {
        return Err(format!(
            "{bytes} is below {MIN_SHAPE_ABOVE_BYTES} bytes: a shaped result's view \
             would have no room for its head and tail"
        ));
    }
    if bytes > MAX_SHAPE_ABOVE_BYTES {
        return Err(format!(
            "{bytes} is above {MAX_SHAPE_ABOVE_BYTES} bytes (16 MiB): no result that large \
             reaches a model"
        ));
    }
    Ok(bytes)
}

/// The shortest `cache_ttl_ms`: one second. A shorter one would cost a
/// write per result and answer almost nothing.
pub const MIN_CACHE_TTL_MS: u64 = 1000;

/// The longest `cache_ttl_ms`: seven days, as long as anything the fleet
/// keeps of a job. Past it a result is not a cache's but a database's.
pub const MAX_CACHE_TTL_MS: u64 = 7 * 24 * 3600 * 1000;

/// Whether `ttl_ms` is a `cache_ttl_ms` within its bounds for a tool whose
/// calls have `effects`, else what is wrong with it (for a message that
/// names the key).
///
/// # Errors
///
/// Outside [`MIN_CACHE_TTL_MS`] and [`MAX_CACHE_TTL_MS`], or for a tool
/// that is not [`Effects::ReadOnly`]: a cached result answers a call
/// without running it, which only a call that changes nothing may be.
pub fn check_cache_ttl_ms(ttl_ms: u64, effects: Effects) -> Result<u64, String> {
    if effects != Effects::ReadOnly {
        return Err(format!(
            "only a read_only tool's results may be cached; this tool's effects are {effects}"
        ));
    }
    if ttl_ms < MIN_CACHE_TTL_MS {
        return Err(format!("{ttl_ms} ms is below {MIN_CACHE_TTL_MS} ms (1s)"));
    }
    if ttl_ms > MAX_CACHE_TTL_MS {
        return Err(format!(
            "{ttl_ms} ms is above {MAX_CACHE_TTL_MS} ms (7 days)"
        ));
    }
    Ok(ttl_ms)
}

/// What an attempt of a tool whose manifest gives no `cost` costs.
pub const DEFAULT_TOOL_COST: u64 = 1;

/// The most one attempt of a tool may cost: a million units. A budget is
/// at most 10^12 units, so no single call can take more than a millionth
/// of the largest.
pub const MAX_TOOL_COST: u64 = 1_000_000;

/// Whether `cost` is a tool's `cost` within its bounds, else what is
/// wrong with it (for a message that names the key).
///
/// # Errors
///
/// Above [`MAX_TOOL_COST`].
pub fn check_tool_cost(cost: u64) -> Result<u64, String> {
    if cost > MAX_TOOL_COST {
        return Err(format!("{cost} is above {MAX_TOOL_COST} cost units"));
    }
    Ok(cost)
}

/// Every tool, where a list of tools may say so (`require_approval`).
pub const EVERY_TOOL: &str = "*";

/// A tool name, or [`EVERY_TOOL`].
pub fn is_tool_pattern(pattern: &str) -> bool {
    pattern == EVERY_TOOL || is_valid_tool_name(pattern)
}

/// Whether the list `patterns` names `tool`, or every tool.
pub fn names_tool(patterns: &[String], tool: &str) -> bool {
    patterns.iter().any(|p| p == EVERY_TOOL || p == tool)
}

/// The registry entry a worker keeps alive for each tool it serves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerAnnouncement {
    /// The announcing worker process.
    pub worker_id: String,
    /// The tool it serves.
    pub manifest: ToolManifest,
    /// Unix epoch milliseconds of the heartbeat that wrote this entry.
    pub heartbeat_ms: u64,
    /// Whether the worker can run the tool now. `false`: it serves the
    /// tool but cannot run it (its MCP server is down), so no model is
    /// offered it while no other worker can. Absent (an older worker's):
    /// `true`.
    #[serde(default = "available", skip_serializing_if = "is_available")]
    pub available: bool,
    /// The worker's pool (its `pool` key), for those who watch the fleet;
    /// empty when it says none. Absent (an older worker's): empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pool: String,
    /// The `[[mcp.servers]]` name of the MCP server the tool comes from;
    /// empty for a native tool. Absent (an older worker's): empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mcp_server: String,
    /// Whether the worker runs only calls pinned to its version of the
    /// tool and hands back the others (decision 0058). Absent (a worker of
    /// the release before, which runs every call of the tool): `false`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pins: bool,
}

fn available() -> bool {
    true
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's signature
fn is_available(available: &bool) -> bool {
    *available
}

/// Longest tool description an announcement may carry (it goes to the
/// model with every turn).
pub const MAX_DESCRIPTION_BYTES: usize = 8 * 1024;
/// Largest parameters schema an announcement may carry, as JSON text.
pub const MAX_SCHEMA_BYTES: usize = 64 * 1024;
/// Longest worker id.
pub const MAX_WORKER_ID_LEN: usize = 128;
/// Longest pool name.
pub const MAX_POOL_NAME_LEN: usize = 64;
/// Longest MCP server name (`[[mcp.servers]]`'s `name`).
pub const MAX_MCP_SERVER_NAME_LEN: usize = 32;
/// How far an announcement's heartbeat may be from the reader's clock: a
/// sanity bound on what a worker writes, not a liveness check.
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(600);

impl ToolManifest {
    /// Checks a manifest filed under `tool` (a registry key, the tool
    /// catalog): its name is valid and is `tool`, and its description and
    /// schema are within their bounds, its `shape_above_bytes`, `cost` and
    /// `cache_ttl_ms` too (the latter only for a read-only tool), and it is
    /// not [`READ_RESULT_TOOL`], the orchestrator's own. (Whether the schema
    /// compiles is the reader's check: it compiles it anyway.)
    ///
    /// # Errors
    ///
    /// What is wrong, for the log.
    pub fn check(&self, tool: &str) -> Result<(), String> {
        if !is_valid_tool_name(tool) || self.name != tool {
            return Err("the manifest's name is not the tool of its key".into());
        }
        if tool == READ_RESULT_TOOL {
            return Err(format!(
                "{READ_RESULT_TOOL} is the orchestrator's own tool; no worker may serve it"
            ));
        }
        if let Some(bytes) = self.shape_above_bytes {
            check_shape_above_bytes(bytes).map_err(|why| format!("shape_above_bytes: {why}"))?;
        }
        if let Some(ttl_ms) = self.cache_ttl_ms {
            check_cache_ttl_ms(ttl_ms, self.effects)
                .map_err(|why| format!("cache_ttl_ms: {why}"))?;
        }
        if let Some(cost) = self.cost {
            check_tool_cost(cost).map_err(|why| format!("cost: {why}"))?;
        }
        if let Some(breaker) = &self.breaker {
            breaker.check().map_err(|why| format!("breaker.{why}"))?;
        }
        if self.description.len() > MAX_DESCRIPTION_BYTES {
            return Err(format!(
                "the description is over {MAX_DESCRIPTION_BYTES} bytes"
            ));
        }
        if !self.parameters.is_object() {
            return Err("the parameters schema is not a JSON object".into());
        }
        if self.parameters.to_string().len() > MAX_SCHEMA_BYTES {
            return Err(format!(
                "the parameters schema is over {MAX_SCHEMA_BYTES} bytes"
            ));
        }
        Ok(())
    }
}

impl WorkerAnnouncement {
    /// Checks an announcement read from registry key `tool.worker` at
    /// `now_ms`: its manifest passes [`ToolManifest::check`], the worker id
    /// agrees with the key and is valid, the heartbeat is within
    /// [`MAX_CLOCK_SKEW`] of `now_ms`, and its pool and MCP server, when
    /// given, are names ([`is_valid_pool_name`],
    /// [`is_valid_mcp_server_name`]): they are shown to people. Anyone who can write to the bucket
    /// can write anything, so the orchestrator ignores what fails.
    ///
    /// # Errors
    ///
    /// What is wrong, for the log.
    pub fn check(&self, tool: &str, worker: &str, now_ms: u64) -> Result<(), String> {
        self.manifest.check(tool)?;
        let valid_worker = (1..=MAX_WORKER_ID_LEN).contains(&worker.len())
            && worker.bytes().all(|b| b.is_ascii_graphic());
        if !valid_worker || self.worker_id != worker {
            return Err("the worker id is not the worker of its key".into());
        }
        let skew_ms = u64::try_from(MAX_CLOCK_SKEW.as_millis()).unwrap_or(u64::MAX);
        if self.heartbeat_ms.abs_diff(now_ms) > skew_ms {
            return Err(format!(
                "the heartbeat is {} s from this clock (at most {} s)",
                self.heartbeat_ms.abs_diff(now_ms) / 1000,
                MAX_CLOCK_SKEW.as_secs()
            ));
        }
        if !self.pool.is_empty() && !is_valid_pool_name(&self.pool) {
            return Err("the pool is not a pool name".into());
        }
        if !self.mcp_server.is_empty() && !is_valid_mcp_server_name(&self.mcp_server) {
            return Err("the mcp server is not an MCP server's name".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_contract_hash_is_the_name_schema_strictness_and_effects() {
        let schema = r#"{"type": "object", "properties": {"x": {"type": "number", "minimum": 0}},
                        "required": ["x"], "additionalProperties": false}"#;
        let base = ToolManifest::new(
            "measure_x",
            "measures x",
            serde_json::from_str(schema).expect("json"),
        );
        let hash = base.contract_hash();
        assert_eq!(hash.len(), 64);
        assert!(
            hash.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        // The same schema written otherwise: keys reordered, no spaces,
        // 0 as 0.0.
        let respelled = r#"{"additionalProperties":false,"required":["x"],
            "properties":{"x":{"minimum":0.0,"type":"number"}},"type":"object"}"#;
        let same = [
            ToolManifest {
                parameters: serde_json::from_str(respelled).expect("json"),
                ..base.clone()
            },
            ToolManifest {
                description: "another description".into(),
                version: "2".into(),
                approval: Approval::Always,
                ..base.clone()
            }
            .with_timeout(Duration::from_secs(99))
            .with_retry(RetryPolicy {
                initial_backoff_ms: 5,
                max_backoff_ms: 50,
                multiplier: 3.0,
                jitter: 0.0,
                max_attempts: 7,
            }),
        ];
        for manifest in same {
            assert_eq!(manifest.contract_hash(), hash, "{manifest:?}");
        }
        let mut required_y = base.parameters.clone();
        required_y["required"] = serde_json::json!(["y"]);
        let different = [
            ToolManifest {
                name: "measure_y".into(),
                ..base.clone()
            },
            ToolManifest {
                parameters: required_y,
                ..base.clone()
            },
            ToolManifest {
                strict: false,
                ..base.clone()
            },
            ToolManifest {
                effects: Effects::ReadOnly,
                ..base.clone()
            },
            ToolManifest {
                effects: Effects::Idempotent,
                ..base.clone()
            },
        ];
        let mut seen = std::collections::BTreeSet::from([hash]);
        for manifest in different {
            assert!(seen.insert(manifest.contract_hash()), "{manifest:?}");
        }
    }

    #[test]
    fn a_breaker_of_its_own_travels_and_is_checked() {
        let own = BreakerOverride {
            min_calls: Some(3),
            cool_down_ms: Some(5000),
            ..BreakerOverride::default()
        };
        let manifest = ToolManifest::new("fetch", "fetches", serde_json::json!({"type": "object"}))
            .with_breaker(own);
        let json = serde_json::to_value(&manifest).expect("serializes");
        assert_eq!(
            json["breaker"],
            serde_json::json!({"min_calls": 3, "cool_down_ms": 5000})
        );
        let back: ToolManifest = serde_json::from_value(json).expect("reads back");
        assert_eq!(back.breaker, Some(own));
        assert_eq!(manifest.check("fetch"), Ok(()));
        // The contract is what a call means: a breaker is not part of it.
        let plain = ToolManifest::new("fetch", "fetches", serde_json::json!({"type": "object"}));
        assert_eq!(manifest.contract_hash(), plain.contract_hash());
        let cases = [
            (
                BreakerOverride {
                    window_ms: Some(999),
                    ..own
                },
                "breaker.window_ms: 999 ms",
            ),
            (
                BreakerOverride {
                    cool_down_ms: Some(3_600_001),
                    ..own
                },
                "breaker.cool_down_ms",
            ),
            (
                BreakerOverride {
                    min_calls: Some(0),
                    ..own
                },
                "breaker.min_calls: 0",
            ),
            (
                BreakerOverride {
                    failure_ratio: Some(1.01),
                    ..own
                },
                "breaker.failure_ratio",
            ),
            (
                BreakerOverride {
                    failure_ratio: Some(f64::NAN),
                    ..own
                },
                "breaker.failure_ratio",
            ),
        ];
        for (breaker, error) in cases {
            let refused = manifest.clone().with_breaker(breaker).check("fetch");
            let refused = refused.expect_err(error);
            assert!(refused.starts_with(error), "{refused}");
        }
    }

    #[test]
    fn the_contract_hash_never_changes() {
        // Stored data depends on it: a change here is a new `v1`.
        let manifest = ToolManifest::new(
            "calculate",
            "math",
            serde_json::json!({"type": "object", "properties": {"expression": {"type": "string"}}}),
        );
        assert_eq!(manifest.contract_hash(), GOLDEN_CONTRACT_HASH);
        assert!(ToolManifest::is_contract_hash(GOLDEN_CONTRACT_HASH));
        for not_one in [
            "",
            "c0ffee",
            &GOLDEN_CONTRACT_HASH.to_uppercase(),
            &format!("{GOLDEN_CONTRACT_HASH}0"),
        ] {
            assert!(!ToolManifest::is_contract_hash(not_one), "{not_one}");
        }
    }

    const GOLDEN_CONTRACT_HASH: &str =
        "53e40dfede8b92559886dd2e94119bce23834c3fcede22a2d096507aec97a840";

    #[test]
    fn announcements_agree_with_their_key_and_stay_in_bounds() {
        let now = 1_760_000_000_000;
        let good = WorkerAnnouncement {
            worker_id: "w-1.example".into(),
            manifest: ToolManifest::new("calculate", "math", serde_json::json!({"type": "object"})),
            heartbeat_ms: now - 599_000,
            available: true,
            pool: "general".into(),
            mcp_server: "crm".into(),
            pins: true,
        };
        assert_eq!(good.check("calculate", "w-1.example", now), Ok(()));
        let native = WorkerAnnouncement {
            pool: String::new(),
            mcp_server: String::new(),
            ..good.clone()
        };
        assert_eq!(native.check("calculate", "w-1.example", now), Ok(()));
        type Spoil = (fn(&mut WorkerAnnouncement), &'static str);
        let spoiled: [Spoil; 19] = [
            (|a| a.manifest.name = "run_shell".into(), "name"),
            (|a| a.worker_id = "w-2".into(), "worker id"),
            (|a| a.manifest.description = "d".repeat(8193), "description"),
            (
                |a| a.manifest.parameters = serde_json::json!(true),
                "not a JSON object",
            ),
            (
                |a| a.manifest.parameters = serde_json::json!({"enum": ["x".repeat(70_000)]}),
                "schema is over",
            ),
            (
                |a| a.heartbeat_ms = 1_760_000_601_000 + 3_600_000,
                "heartbeat",
            ),
            // Shown to people: markup, controls and floods are refused.
            (|a| a.pool = "<script>alert(1)</script>".into(), "pool"),
            (|a| a.pool = "general\n".into(), "pool"),
            (|a| a.pool = "p".repeat(65), "pool"),
            (|a| a.mcp_server = "crm\"><b>".into(), "mcp server"),
            (|a| a.mcp_server = "crm.example".into(), "mcp server"),
            (|a| a.mcp_server = "c".repeat(33), "mcp server"),
            (
                |a| a.manifest.shape_above_bytes = Some(0),
                "shape_above_bytes: 0 is below",
            ),
            (
                |a| a.manifest.shape_above_bytes = Some(1023),
                "shape_above_bytes",
            ),
            (
                |a| a.manifest.shape_above_bytes = Some(u64::MAX),
                "shape_above_bytes: 18446744073709551615 is above",
            ),
            (
                |a| {
                    a.manifest.effects = Effects::ReadOnly;
                    a.manifest.cache_ttl_ms = Some(999);
                },
                "cache_ttl_ms: 999 ms is below",
            ),
            (
                |a| {
                    a.manifest.effects = Effects::ReadOnly;
                    a.manifest.cache_ttl_ms = Some(u64::MAX);
                },
                "cache_ttl_ms: 18446744073709551615 ms is above",
            ),
            // Never for a tool whose calls change something.
            (
                |a| {
                    a.manifest.effects = Effects::Idempotent;
                    a.manifest.cache_ttl_ms = Some(60_000);
                },
                "cache_ttl_ms: only a read_only tool's results may be cached",
            ),
            (
                |a| a.manifest.cache_ttl_ms = Some(60_000),
                "effects are not_idempotent",
            ),
        ];
        for (spoil, expected) in spoiled {
            let mut bad = good.clone();
            spoil(&mut bad);
            let err = bad.check("calculate", "w-1.example", now).unwrap_err();
            assert!(err.contains(expected), "{err}");
        }
        assert!(good.check("calculate", "w\n1", now).is_err());
        assert!(good.check("calc.ulate", "w-1.example", now).is_err());
        // The orchestrator's own tool is no worker's, under its own key too.
        let mut reserved = good.clone();
        reserved.manifest.name = READ_RESULT_TOOL.into();
        let err = reserved.check(READ_RESULT_TOOL, "w-1.example", now);
        assert!(err.unwrap_err().contains("orchestrator's own"));
        // Within its bounds, a tool's shaping limit is its own.
        let mut shaped = good.clone();
        for bytes in [MIN_SHAPE_ABOVE_BYTES, 65_536, MAX_SHAPE_ABOVE_BYTES] {
            shaped.manifest = shaped.manifest.with_shape_above_bytes(bytes);
            assert_eq!(shaped.check("calculate", "w-1.example", now), Ok(()));
        }
        // A read-only tool's cache lasts within its bounds.
        let mut cached = good.clone();
        cached.manifest = cached.manifest.with_effects(Effects::ReadOnly);
        for ttl_ms in [MIN_CACHE_TTL_MS, 600_000, MAX_CACHE_TTL_MS] {
            cached.manifest = cached
                .manifest
                .with_cache_ttl(Duration::from_millis(ttl_ms));
            assert_eq!(cached.check("calculate", "w-1.example", now), Ok(()));
            assert_eq!(
                cached.manifest.cache_ttl(),
                Some(Duration::from_millis(ttl_ms))
            );
        }
        // Whatever a manifest says, a tool that changes things is never cached.
        cached.manifest.effects = Effects::Idempotent;
        assert_eq!(cached.manifest.cache_ttl(), None);
    }

    #[test]
    fn an_older_workers_announcement_parses_and_empty_fields_are_not_written() {
        let old = serde_json::json!({
            "worker_id": "w-1",
            "manifest": ToolManifest::new("calculate", "math", serde_json::json!({"type": "object"})),
            "heartbeat_ms": 1,
        });
        let old: WorkerAnnouncement = serde_json::from_value(old).unwrap();
        assert!(old.available);
        assert_eq!((old.pool.as_str(), old.mcp_server.as_str()), ("", ""));
        assert!(!old.pins, "a worker of the release before runs every call");
        let written = serde_json::to_value(&old).unwrap();
        for field in ["available", "pool", "mcp_server", "pins"] {
            assert!(written.get(field).is_none(), "{field}: {written}");
        }
        let new = WorkerAnnouncement {
            pool: "general".into(),
            mcp_server: "crm".into(),
            pins: true,
            ..old
        };
        let written = serde_json::to_value(&new).unwrap();
        assert_eq!(
            (&written["pool"], &written["mcp_server"], &written["pins"]),
            (&"general".into(), &"crm".into(), &true.into())
        );
        let back: WorkerAnnouncement = serde_json::from_value(written).unwrap();
        assert_eq!(back, new);
    }

    const POLICY: RetryPolicy = RetryPolicy {
        initial_backoff_ms: 200,
        max_backoff_ms: 1_000,
        multiplier: 2.0,
        jitter: 1.0,
        max_attempts: 5,
    };

    #[test]
    fn next_delay_grows_caps_jitters_and_stops() {
        let ms = Duration::from_millis;
        /// (policy, failed attempt, retry_after, jitter sample) -> delay
        type Case = (RetryPolicy, u32, Option<Duration>, f64, Option<Duration>);
        let cases: Vec<Case> = vec![
            (POLICY, 1, None, 0.0, Some(ms(200))),
            (POLICY, 2, None, 0.0, Some(ms(400))),
            (POLICY, 3, None, 0.0, Some(ms(800))),
            (POLICY, 4, None, 0.0, Some(ms(1_000))), // capped
            (POLICY, 5, None, 0.0, None),            // no attempt left
            (POLICY, 9, None, 0.0, None),
            (POLICY, 1, None, 0.5, Some(ms(300))), // half of the full jitter
            (POLICY, 4, None, 0.999, Some(ms(1_999))),
            (POLICY, 2, Some(ms(1_500)), 0.9, Some(ms(1_500))), // the tool knows best
            (POLICY, 5, Some(ms(1_500)), 0.0, None),            // ...but not past the limit
            (
                RetryPolicy {
                    jitter: 0.0,
                    ..POLICY
                },
                1,
                None,
                0.9,
                Some(ms(200)),
            ),
            (
                RetryPolicy {
                    multiplier: 1.0,
                    ..POLICY
                },
                4,
                None,
                0.0,
                Some(ms(200)),
            ),
            // Hostile numbers: clamped, never a panic.
            (
                RetryPolicy {
                    multiplier: -3.0,
                    jitter: 7.0,
                    ..POLICY
                },
                2,
                None,
                2.0,
                Some(ms(400)),
            ),
            (
                RetryPolicy {
                    multiplier: f64::NAN,
                    jitter: f64::NAN,
                    ..POLICY
                },
                3,
                None,
                f64::NAN,
                Some(ms(200)),
            ),
            (
                RetryPolicy {
                    multiplier: 1e300,
                    max_backoff_ms: u64::MAX,
                    max_attempts: u32::MAX,
                    ..POLICY
                },
                u32::MAX - 1,
                None,
                1.0,
                Some(Duration::from_millis(u64::MAX)),
            ),
            (
                RetryPolicy {
                    max_attempts: 0,
                    ..POLICY
                },
                1,
                None,
                0.0,
                None,
            ),
        ];
        for (policy, attempt, retry_after, sample, expected) in cases {
            assert_eq!(
                policy.next_delay(attempt, retry_after, sample),
                expected,
                "{policy:?} attempt {attempt} retry_after {retry_after:?} sample {sample}"
            );
        }
    }

    #[test]
    fn a_manifest_without_a_policy_takes_the_default_with_its_attempt_limit() {
        let manifest = ToolManifest::new("echo", "d", serde_json::json!({})).with_max_attempts(2);
        assert_eq!(
            manifest.retry_policy(POLICY),
            RetryPolicy {
                max_attempts: 2,
                ..POLICY
            }
        );
        let own = RetryPolicy {
            initial_backoff_ms: 5,
            ..POLICY
        };
        let manifest = manifest.with_retry(own);
        assert_eq!(manifest.retry_policy(POLICY), own);
        assert_eq!(manifest.max_attempts, 5);
        // Additive on the wire: an old manifest without "retry" still parses.
        let mut json = serde_json::to_value(&manifest).unwrap();
        json.as_object_mut().unwrap().remove("retry");
        let old: ToolManifest = serde_json::from_value(json).unwrap();
        assert_eq!(old.retry, None);
    }

    #[test]
    fn a_shaping_limit_travels_only_when_set() {
        let manifest = ToolManifest::new("echo", "d", serde_json::json!({}));
        let json = serde_json::to_value(&manifest).unwrap();
        assert!(json.get("shape_above_bytes").is_none(), "{json}");
        let manifest = manifest.with_shape_above_bytes(4096);
        let json = serde_json::to_value(&manifest).unwrap();
        assert_eq!(json["shape_above_bytes"], 4096);
        let back: ToolManifest = serde_json::from_value(json).unwrap();
        assert_eq!(back, manifest);
    }

    #[test]
    fn a_cache_ttl_travels_only_when_set() {
        let manifest =
            ToolManifest::new("echo", "d", serde_json::json!({})).with_effects(Effects::ReadOnly);
        let json = serde_json::to_value(&manifest).unwrap();
        assert!(json.get("cache_ttl_ms").is_none(), "{json}");
        let manifest = manifest.with_cache_ttl(Duration::from_secs(90));
        let json = serde_json::to_value(&manifest).unwrap();
        assert_eq!(json["cache_ttl_ms"], 90_000);
        let back: ToolManifest = serde_json::from_value(json).unwrap();
        assert_eq!(back, manifest);
    }

    #[test]
    fn effects_travel_with_the_flag_older_orchestrators_read_and_older_workers_are_understood() {
        for effects in Effects::ALL {
            let manifest =
                ToolManifest::new("echo", "d", serde_json::json!({})).with_effects(effects);
            let json = serde_json::to_value(&manifest).unwrap();
            assert_eq!(json["effects"], effects.as_str());
            assert_eq!(json["side_effects"], effects != Effects::ReadOnly);
            let back: ToolManifest = serde_json::from_value(json).unwrap();
            assert_eq!(back, manifest);
            assert_eq!(effects.as_str().parse::<Effects>(), Ok(effects));
        }
        // A worker from before `effects` said only `side_effects`; one that
        // said neither is taken at its strictest.
        let mut json =
            serde_json::to_value(ToolManifest::new("echo", "d", serde_json::json!({}))).unwrap();
        let fields = json.as_object_mut().unwrap();
        fields.remove("effects");
        for (side_effects, want) in [
            (Some(false), Effects::ReadOnly),
            (Some(true), Effects::NotIdempotent),
            (None, Effects::NotIdempotent),
        ] {
            match side_effects {
                Some(flag) => fields.insert("side_effects".into(), flag.into()),
                None => fields.remove("side_effects"),
            };
            let old: ToolManifest =
                serde_json::from_value(serde_json::Value::Object(fields.clone())).unwrap();
            assert_eq!(old.effects, want, "side_effects {side_effects:?}");
        }
        assert!(
            "destructive"
                .parse::<Effects>()
                .unwrap_err()
                .contains("read_only")
        );
    }

    #[test]
    fn tool_names_follow_the_openai_rule() {
        assert!(is_valid_tool_name("get_current_weather"));
        assert!(is_valid_tool_name("a-b_9"));
        for bad in ["", "run.shell", "x>", "a b", "é", &"x".repeat(65)] {
            assert!(!is_valid_tool_name(bad), "{bad:?}");
        }
    }
}
