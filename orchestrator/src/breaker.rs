//! The per-tool circuit breaker (docs/protection.md, decision 0056): a tool
//! whose calls keep failing is left out of the models' tool lists for a
//! cool-down, and calls made to it anyway are answered `TOOL_UNAVAILABLE`
//! without being dispatched; after the cool-down one call, the probe, is
//! let through, and its outcome closes the breaker or opens it again.
//!
//! This module is the policy, pure functions of data with tables of cases:
//! which outcomes count as failures (`Failure::of`), the window of counts
//! (`Tally`), the breaker's `State` and its transitions
//! (`after_outcome`, `gate`), and what the model is told
//! (`Unavailable`). Redis keeps each tool's state for every orchestrator
//! (`store/breaker.rs`); dispatch and the runner call both.

use std::collections::HashMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use toolfleet_proto::manifest::BreakerOverride;
use toolfleet_proto::{Envelope, ErrorCode};

/// How many buckets a window is counted in: a failure leaves the window
/// at most a tenth of it late.
pub(crate) const BUCKETS: u64 = 10;

/// The orchestrator's `[breaker]` section: when a tool's breaker opens and
/// for how long.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BreakerOptions {
    /// Whether tools have breakers at all. Default: true.
    #[serde(deserialize_with = "figment::util::bool_from_str_or_int")]
    pub enabled: bool,
    /// How far back a tool's calls are counted. 1s to 1h. Default: 60s.
    #[serde(with = "toolfleet_service::config::duration")]
    pub window: Duration,
    /// The fewest calls in the window before the breaker may open.
    /// 1 to 100000. Default: 10.
    pub min_calls: u32,
    /// The share of the window's calls that failed at or above which the
    /// breaker opens: above 0, at most 1. Default: 0.5.
    pub failure_ratio: f64,
    /// How long an open breaker refuses calls before it lets a probe
    /// through. 1s to 1h. Default: 30s.
    #[serde(with = "toolfleet_service::config::duration")]
    pub cool_down: Duration,
    /// Which outcomes of a call count as failures. Default: all three,
    /// `["terminal", "timeout", "unknown"]`.
    pub count: Vec<Failure>,
}

impl Default for BreakerOptions {
    fn default() -> Self {
        Self {
            enabled: true,
            window: Duration::from_secs(60),
            min_calls: 10,
            failure_ratio: 0.5,
            cool_down: Duration::from_secs(30),
            count: vec![Failure::Terminal, Failure::Timeout, Failure::Unknown],
        }
    }
}

/// The shortest `breaker.window` and `breaker.cool_down`.
const MIN_DURATION: Duration = Duration::from_secs(1);
/// The longest `breaker.window` and `breaker.cool_down`: longer ones would
/// keep a recovered tool away for longer than anyone waits.
const MAX_DURATION: Duration = Duration::from_secs(3600);
/// The most `breaker.min_calls`.
const MAX_MIN_CALLS: u32 = 100_000;

impl BreakerOptions {
    /// Whether the options make sense; else what is wrong, naming the key
    /// under `section` (`breaker`, or a tool's manifest).
    ///
    /// # Errors
    ///
    /// The first key out of its bounds.
    pub fn check(&self, section: &str) -> Result<(), String> {
        for (key, value) in [("window", self.window), ("cool_down", self.cool_down)] {
            if !(MIN_DURATION..=MAX_DURATION).contains(&value) {
                let value = toolfleet_service::config::duration::format(value);
                return Err(format!("{section}.{key} is {value}; it must be 1s to 1h"));
            }
        }
        if !(1..=MAX_MIN_CALLS).contains(&self.min_calls) {
            return Err(format!(
                "{section}.min_calls is {}; it must be 1 to {MAX_MIN_CALLS}",
                self.min_calls
            ));
        }
        // NaN fails both comparisons.
        if !(self.failure_ratio > 0.0 && self.failure_ratio <= 1.0) {
            return Err(format!(
                "{section}.failure_ratio is {}; it must be above 0 and at most 1",
                self.failure_ratio
            ));
        }
        if self.count.is_empty() {
            return Err(format!(
                "{section}.count is empty; name at least one of \"terminal\", \"timeout\", \
                 \"unknown\" (or set {section}.enabled = false)"
            ));
        }
        Ok(())
    }

    /// These options with `tool`'s manifest's own values put in, when it
    /// has some.
    pub(crate) fn for_tool(&self, own: Option<&BreakerOverride>) -> Self {
        let mut options = self.clone();
        let Some(own) = own else {
            return options;
        };
        if let Some(enabled) = own.enabled {
            options.enabled &= enabled;
        }
        if let Some(ms) = own.window_ms {
            options.window = Duration::from_millis(ms);
        }
        if let Some(calls) = own.min_calls {
            options.min_calls = calls;
        }
        if let Some(ratio) = own.failure_ratio {
            options.failure_ratio = ratio;
        }
        if let Some(ms) = own.cool_down_ms {
            options.cool_down = Duration::from_millis(ms);
        }
        options
    }

    /// How long a bucket of the window is, in ms (at least 1).
    pub(crate) fn bucket_ms(&self) -> u64 {
        (millis(self.window) / BUCKETS).max(1)
    }

    /// How long a tool's key outlives its last write: the window and a
    /// cool-down twice, so that an idle tool's key goes away.
    pub(crate) fn key_ttl_ms(&self) -> u64 {
        millis(self.window) + 2 * millis(self.cool_down)
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// An outcome of a call that may count against its tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Failure {
    /// The tool failed, or its retries ran out: any error but those that
    /// say the call, its job or a person was at fault (see `Failure::of`).
    Terminal,
    /// `TOOL_TIMEOUT`.
    Timeout,
    /// `OUTCOME_UNKNOWN`: a worker died after a side-effecting call started.
    Unknown,
}

/// Codes that say nothing of the tool's health: the model's arguments, the
/// job, a person or the fleet's own refusal decided them.
const NOT_THE_TOOLS: [ErrorCode; 13] = [
    ErrorCode::INVALID_TOOL_ARGUMENTS,
    ErrorCode::UNKNOWN_TOOL,
    ErrorCode::DEADLINE_EXCEEDED,
    ErrorCode::REJECTED_BY_APPROVER,
    ErrorCode::APPROVAL_EXPIRED,
    ErrorCode::FAILED_BY_OPERATOR,
    ErrorCode::CANCELLED,
    ErrorCode::PAYLOAD_TOO_LARGE,
    ErrorCode::DUPLICATE_CALL_ID,
    ErrorCode::TOO_MANY_CALLS,
    ErrorCode::FOREIGN_RESULT,
    ErrorCode::TOOL_UNAVAILABLE,
    ErrorCode::TOOL_VERSION_GONE,
];

impl Failure {
    /// What kind of failure a call's final envelope is, if any.
    pub(crate) fn of(envelope: &Envelope) -> Option<Self> {
        let error = envelope.error()?;
        if error.code == ErrorCode::TOOL_TIMEOUT {
            Some(Self::Timeout)
        } else if error.code == ErrorCode::OUTCOME_UNKNOWN {
            Some(Self::Unknown)
        } else if NOT_THE_TOOLS.contains(&error.code) {
            None
        } else {
            Some(Self::Terminal)
        }
    }
}

/// A tool's calls in the window: how many settled, how many failed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Tally {
    pub calls: u64,
    pub failed: u64,
}

impl Tally {
    /// The window ending in bucket `now_bucket`, from the buckets' counts
    /// (`calls` and `failed` by bucket index): older buckets are left out.
    pub(crate) fn of(
        calls: &HashMap<u64, u64>,
        failed: &HashMap<u64, u64>,
        now_bucket: u64,
    ) -> Self {
        let oldest = now_bucket.saturating_sub(BUCKETS - 1);
        let sum = |counts: &HashMap<u64, u64>| -> u64 {
            counts
                .iter()
                .filter(|(bucket, _)| (oldest..=now_bucket).contains(*bucket))
                .map(|(_, n)| n)
                .sum()
        };
        Self {
            calls: sum(calls),
            failed: sum(failed),
        }
    }

    /// Whether the window opens the breaker: enough calls, and failures at
    /// or above the ratio.
    fn opens(self, options: &BreakerOptions) -> bool {
        self.calls >= u64::from(options.min_calls)
            && self.failed as f64 >= options.failure_ratio * self.calls as f64
    }
}

/// Where a tool's breaker stands.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) enum State {
    /// Calls run.
    #[default]
    Closed,
    /// Calls are refused until `until_ms`: `failed` of the window's
    /// `calls` had failed when it opened.
    Open {
        since_ms: u64,
        until_ms: u64,
        failed: u64,
        calls: u64,
    },
    /// One call, `probe` (`<job>/<wire id>`), runs; the others are refused
    /// until its outcome is known, or until `until_ms`, when another call
    /// may probe.
    HalfOpen {
        since_ms: u64,
        until_ms: u64,
        probe: String,
        failed: u64,
        calls: u64,
    },
}

impl State {
    /// The state as the store keeps it, in one field:
    /// `open:<since>:<until>:<failed>:<calls>` or
    /// `half_open:<since>:<until>:<failed>:<calls>:<probe>`; empty when closed.
    pub(crate) fn to_field(&self) -> String {
        match self {
            Self::Closed => String::new(),
            Self::Open {
                since_ms,
                until_ms,
                failed,
                calls,
            } => format!("open:{since_ms}:{until_ms}:{failed}:{calls}"),
            Self::HalfOpen {
                since_ms,
                until_ms,
                probe,
                failed,
                calls,
            } => format!("half_open:{since_ms}:{until_ms}:{failed}:{calls}:{probe}"),
        }
    }

    /// The state a field holds; anything unreadable is closed (a breaker
    /// that fails open lets calls run, as if it were not there).
    pub(crate) fn from_field(field: &str) -> Self {
        let mut parts = field.splitn(6, ':');
        let kind = parts.next().unwrap_or_default();
        let mut number = || parts.next().and_then(|n| n.parse::<u64>().ok());
        let (Some(since_ms), Some(until_ms), Some(failed), Some(calls)) =
            (number(), number(), number(), number())
        else {
            return Self::Closed;
        };
        match (kind, parts.next()) {
            ("open", None) => Self::Open {
                since_ms,
                until_ms,
                failed,
                calls,
            },
            ("half_open", Some(probe)) if !probe.is_empty() => Self::HalfOpen {
                since_ms,
                until_ms,
                probe: probe.to_owned(),
                failed,
                calls,
            },
            _ => Self::Closed,
        }
    }

    /// Its name as ListTools, the CLI and the console show it.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Open { .. } => "open",
            Self::HalfOpen { .. } => "half_open",
        }
    }

    /// Since when it is in this state (Unix ms); none when closed.
    pub(crate) fn since_ms(&self) -> Option<u64> {
        match self {
            Self::Closed => None,
            Self::Open { since_ms, .. } | Self::HalfOpen { since_ms, .. } => Some(*since_ms),
        }
    }

    /// Why a call of the tool may not run at `now_ms`, if it may not:
    /// open within its cool-down, or half-open with its probe out. A tool
    /// whose cool-down or probe has run out may be offered: its next call
    /// probes.
    pub(crate) fn unavailable(&self, now_ms: u64) -> Option<Unavailable> {
        match self {
            Self::Open {
                until_ms,
                failed,
                calls,
                ..
            }
            | Self::HalfOpen {
                until_ms,
                failed,
                calls,
                ..
            } if now_ms < *until_ms => Some(Unavailable {
                failed: *failed,
                calls: *calls,
            }),
            _ => None,
        }
    }
}

/// Why a tool is unavailable: `failed` of its last `calls` failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unavailable {
    pub failed: u64,
    pub calls: u64,
}

impl Unavailable {
    /// The reason, as the model's line, the envelope and the job's event
    /// say it.
    pub(crate) fn reason(self) -> String {
        format!("{} of its last {} calls failed", self.failed, self.calls)
    }

    /// The line the model's instructions carry while `tool` is left out.
    pub(crate) fn instruction(self, tool: &str) -> String {
        format!(
            "The tool {tool} is unavailable for now ({}); do not call it.",
            self.reason()
        )
    }

    /// The envelope a call of `tool` gets instead of running.
    pub(crate) fn envelope(self, tool: &str) -> Envelope {
        Envelope::terminal(
            ErrorCode::TOOL_UNAVAILABLE,
            format!(
                "the tool {tool} is unavailable for now ({}); this call was not run. \
                 Do without it, or try again later",
                self.reason()
            ),
        )
    }
}

/// What a call of a tool may do, decided before its first attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Gate {
    /// It runs.
    Pass,
    /// It runs as the probe: the breaker goes to this state (half-open,
    /// naming the call) if nobody changed it first.
    Probe(State),
    /// It is refused.
    Refuse(Unavailable),
}

/// What `call` (`<job>/<wire id>`) of a tool whose breaker is `state` may
/// do at `now_ms`.
pub(crate) fn gate(state: &State, call: &str, now_ms: u64, options: &BreakerOptions) -> Gate {
    if let Some(unavailable) = state.unavailable(now_ms) {
        return Gate::Refuse(unavailable);
    }
    match state {
        State::Closed => Gate::Pass,
        State::Open { failed, calls, .. } | State::HalfOpen { failed, calls, .. } => {
            Gate::Probe(State::HalfOpen {
                since_ms: now_ms,
                until_ms: now_ms.saturating_add(millis(options.cool_down)),
                probe: call.to_owned(),
                failed: *failed,
                calls: *calls,
            })
        }
    }
}

/// A call's outcome, as its breaker learns it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Outcome<'a> {
    /// `<job>/<wire id>`.
    pub call: &'a str,
    /// Whether it counts as a failure (`BreakerOptions::count`).
    pub failed: bool,
}

/// The breaker's next state after `outcome`, with `tally` the window
/// counted with it; `None` when it stays as it is. Only the probe's
/// outcome moves a half-open breaker; an open one waits for its cool-down
/// (the outcomes of calls that ran before it opened change nothing).
pub(crate) fn after_outcome(
    state: &State,
    tally: Tally,
    outcome: Outcome<'_>,
    now_ms: u64,
    options: &BreakerOptions,
) -> Option<State> {
    let open = |failed, calls| State::Open {
        since_ms: now_ms,
        until_ms: now_ms.saturating_add(millis(options.cool_down)),
        failed,
        calls,
    };
    match state {
        State::Closed if tally.opens(options) => Some(open(tally.failed, tally.calls)),
        State::HalfOpen {
            probe,
            failed,
            calls,
            ..
        } if probe == outcome.call => Some(if outcome.failed {
            open(*failed, *calls)
        } else {
            State::Closed
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn options() -> BreakerOptions {
        BreakerOptions {
            min_calls: 4,
            failure_ratio: 0.5,
            cool_down: Duration::from_secs(10),
            ..BreakerOptions::default()
        }
    }

    fn open(since_ms: u64) -> State {
        State::Open {
            since_ms,
            until_ms: since_ms + 10_000,
            failed: 3,
            calls: 4,
        }
    }

    fn half_open(since_ms: u64, probe: &str) -> State {
        State::HalfOpen {
            since_ms,
            until_ms: since_ms + 10_000,
            probe: probe.into(),
            failed: 3,
            calls: 4,
        }
    }

    #[test]
    fn what_counts_as_a_failure() {
        let error = |code: ErrorCode| Envelope::terminal(code, "no");
        let cases = [
            (Envelope::Ok(json!(1)), None),
            (error(ErrorCode::TOOL_TIMEOUT), Some(Failure::Timeout)),
            (error(ErrorCode::OUTCOME_UNKNOWN), Some(Failure::Unknown)),
            (
                error(ErrorCode::TOOL_EXECUTION_FAILED),
                Some(Failure::Terminal),
            ),
            (
                error(ErrorCode::MAX_ATTEMPTS_EXCEEDED),
                Some(Failure::Terminal),
            ),
            (
                error(ErrorCode::MAX_DELIVERIES_EXCEEDED),
                Some(Failure::Terminal),
            ),
            (
                error(ErrorCode::custom("UPSTREAM_DOWN")),
                Some(Failure::Terminal),
            ),
            (error(ErrorCode::INVALID_TOOL_ARGUMENTS), None),
            (error(ErrorCode::CANCELLED), None),
            (error(ErrorCode::REJECTED_BY_APPROVER), None),
            (error(ErrorCode::DEADLINE_EXCEEDED), None),
            (error(ErrorCode::TOOL_UNAVAILABLE), None),
        ];
        for (envelope, expected) in cases {
            assert_eq!(Failure::of(&envelope), expected, "{envelope:?}");
        }
    }

    #[test]
    fn the_window_counts_its_last_ten_buckets() {
        let counts = |pairs: &[(u64, u64)]| pairs.iter().copied().collect::<HashMap<_, _>>();
        let calls = counts(&[(1, 5), (5, 2), (10, 3), (11, 1)]);
        let failed = counts(&[(1, 5), (10, 1)]);
        assert_eq!(
            Tally::of(&calls, &failed, 10),
            Tally {
                calls: 10,
                failed: 6
            }
        );
        // Bucket 1 has left the window of bucket 11.
        assert_eq!(
            Tally::of(&calls, &failed, 11),
            Tally {
                calls: 6,
                failed: 1
            }
        );
        assert_eq!(Tally::of(&calls, &failed, 100), Tally::default());
    }

    #[test]
    fn transitions_after_an_outcome() {
        let o = options();
        let tally = |calls, failed| Tally { calls, failed };
        let failed = |call| Outcome { call, failed: true };
        let ok = |call| Outcome {
            call,
            failed: false,
        };
        let cases = [
            // Closed: opens at the ratio with enough calls, not before.
            (State::Closed, tally(3, 3), failed("j/c"), None),
            (State::Closed, tally(4, 1), failed("j/c"), None),
            (
                State::Closed,
                tally(4, 2),
                failed("j/c"),
                Some(State::Open {
                    since_ms: 1000,
                    until_ms: 11_000,
                    failed: 2,
                    calls: 4,
                }),
            ),
            (
                State::Closed,
                tally(4, 4),
                ok("j/c"),
                Some(State::Open {
                    since_ms: 1000,
                    until_ms: 11_000,
                    failed: 4,
                    calls: 4,
                }),
            ),
            // Open: the late outcomes of earlier calls change nothing.
            (open(0), tally(9, 9), failed("j/c"), None),
            (open(0), tally(9, 0), ok("j/c"), None),
            // Half-open: the probe's outcome decides; nobody else's.
            (half_open(0, "j/p"), tally(0, 0), ok("j/c"), None),
            (half_open(0, "j/p"), tally(0, 0), failed("j/c"), None),
            (
                half_open(0, "j/p"),
                tally(9, 9),
                ok("j/p"),
                Some(State::Closed),
            ),
            (
                half_open(0, "j/p"),
                tally(0, 0),
                failed("j/p"),
                Some(State::Open {
                    since_ms: 1000,
                    until_ms: 11_000,
                    failed: 3,
                    calls: 4,
                }),
            ),
        ];
        for (state, tally, outcome, expected) in cases {
            assert_eq!(
                after_outcome(&state, tally, outcome, 1000, &o),
                expected,
                "{state:?} {tally:?} {outcome:?}"
            );
        }
    }

    #[test]
    fn the_gate_before_a_calls_first_attempt() {
        let o = options();
        let refused = Gate::Refuse(Unavailable {
            failed: 3,
            calls: 4,
        });
        let probe = Gate::Probe(State::HalfOpen {
            since_ms: 10_000,
            until_ms: 20_000,
            probe: "j/c".into(),
            failed: 3,
            calls: 4,
        });
        let cases = [
            (State::Closed, Gate::Pass),
            (open(0), probe.clone()),
            (open(5_000), refused.clone()),
            (half_open(5_000, "j/p"), refused),
            // A probe that never told its outcome gives way to another.
            (half_open(0, "j/p"), probe),
        ];
        for (state, expected) in cases {
            assert_eq!(gate(&state, "j/c", 10_000, &o), expected, "{state:?}");
        }
    }

    #[test]
    fn a_state_survives_its_field_and_garbage_is_closed() {
        for state in [State::Closed, open(7), half_open(7, "acme-1/call_0_0")] {
            assert_eq!(State::from_field(&state.to_field()), state);
        }
        for garbage in [
            "",
            "open",
            "open:1:2:3",
            "open:1:2:3:4:x",
            "half_open:1:2:3:4",
            "shut:1:2:3:4",
        ] {
            assert_eq!(State::from_field(garbage), State::Closed, "{garbage}");
        }
    }

    #[test]
    fn the_model_is_told_in_one_line() {
        let unavailable = Unavailable {
            failed: 10,
            calls: 12,
        };
        assert_eq!(
            unavailable.instruction("fail"),
            "The tool fail is unavailable for now (10 of its last 12 calls failed); do not call it."
        );
        let envelope = unavailable.envelope("fail");
        let error = envelope.error().expect("an error");
        assert_eq!(error.code, ErrorCode::TOOL_UNAVAILABLE);
        assert!(!error.retryable);
    }

    #[test]
    fn the_section_loads_and_start_up_refuses_a_bad_one() {
        use crate::config::OrchestratorOptions;
        let load = |section: serde_json::Value| {
            OrchestratorOptions::load(None, json!({ "breaker": section }))
                .map_err(|err| err.to_string())
                .and_then(|options| options.check_own().map(|()| options))
        };
        let options = load(json!({"window": "5s", "cool_down": "1s", "count": ["timeout"]}))
            .expect("a good section loads");
        assert_eq!(options.breaker.window, Duration::from_secs(5));
        assert_eq!(options.breaker.count, vec![Failure::Timeout]);
        assert_eq!(options.breaker.min_calls, 10, "the default");
        for (section, key) in [
            (json!({"failure_ratio": 0}), "breaker.failure_ratio"),
            (json!({"cool_down": "0s"}), "breaker.cool_down"),
            (json!({"min_calls": 0}), "breaker.min_calls"),
            (json!({"count": ["sometimes"]}), "count"),
            (json!({"min_calls": -1}), "min_calls"),
        ] {
            let error = load(section.clone()).expect_err("refused");
            assert!(error.contains(key), "{section}: {error}");
        }
    }

    #[test]
    fn a_manifest_replaces_the_keys_it_gives() {
        let own = BreakerOverride {
            enabled: Some(true),
            min_calls: Some(2),
            cool_down_ms: Some(1500),
            ..BreakerOverride::default()
        };
        let options = BreakerOptions::default().for_tool(Some(&own));
        assert_eq!(options.min_calls, 2);
        assert_eq!(options.cool_down, Duration::from_millis(1500));
        assert_eq!(options.window, Duration::from_secs(60));
        let off = BreakerOptions {
            enabled: false,
            ..BreakerOptions::default()
        };
        assert!(
            !off.for_tool(Some(&own)).enabled,
            "a tool cannot turn it on"
        );
        let mut refused = own;
        refused.failure_ratio = Some(0.0);
        assert!(refused.check().expect_err("0").starts_with("failure_ratio"));
    }

    #[test]
    fn hostile_options_are_refused_naming_the_key() {
        let with = |change: fn(&mut BreakerOptions)| {
            let mut options = BreakerOptions::default();
            change(&mut options);
            options.check("breaker")
        };
        assert_eq!(with(|_| {}), Ok(()));
        type Change = fn(&mut BreakerOptions);
        let cases: [(Change, &str); 9] = [
            (|o| o.failure_ratio = 0.0, "breaker.failure_ratio"),
            (|o| o.failure_ratio = 1.5, "breaker.failure_ratio"),
            (|o| o.failure_ratio = f64::NAN, "breaker.failure_ratio"),
            (|o| o.window = Duration::ZERO, "breaker.window"),
            (|o| o.window = Duration::from_secs(86_400), "breaker.window"),
            (|o| o.cool_down = Duration::ZERO, "breaker.cool_down"),
            (|o| o.min_calls = 0, "breaker.min_calls"),
            (|o| o.min_calls = u32::MAX, "breaker.min_calls"),
            (|o| o.count.clear(), "breaker.count"),
        ];
        for (change, key) in cases {
            let error = with(change).expect_err(key);
            assert!(error.starts_with(key), "{error}");
        }
    }
}
