//! A tenant's period budgets: what all its jobs together may spend in a
//! rolling hour and a rolling day (`[tenants.<name>.budget]` in the tokens
//! file), shared by every replica through Redis (`store/budget.rs`).
//!
//! | kind | counted | checked | over it |
//! |---|---|---|---|
//! | tokens | each turn's tokens, as a job's budget counts them, added at the job's next check | before every turn and every call | the job ends `BUDGET_EXCEEDED`; `SubmitJob` answers `RESOURCE_EXHAUSTED` |
//! | cost units | each attempt's cost | before every attempt, taken atomically | that call (or retry) is not made: `BUDGET_EXCEEDED` |
//! | tool calls | each call's first attempt | before it, taken atomically | the call is answered `BUDGET_EXCEEDED` unrun |
//! | job seconds | the time runs hold the job, parked time excluded, added at each check | before every turn and every call | as tokens |
//!
//! A rolling hour is the last 60 whole minutes and the current one; a
//! rolling day, the last 24 whole hours and the current one (the counters
//! are per minute and per hour: decision 0055).

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use toolfleet_proto::{Envelope, ErrorCode};

use super::MAX_BUDGET;

/// A tenant's period budgets; `None`: no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TenantBudget {
    /// Model tokens per rolling hour.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_per_hour: Option<u64>,
    /// Model tokens per rolling day.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_per_day: Option<u64>,
    /// Tool cost units per rolling hour.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_units_per_hour: Option<u64>,
    /// Tool cost units per rolling day.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_units_per_day: Option<u64>,
    /// Tool calls per rolling hour.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls_per_hour: Option<u64>,
    /// Tool calls per rolling day.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls_per_day: Option<u64>,
    /// Seconds of job time (runs holding its jobs) per rolling hour.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job_seconds_per_hour: Option<u64>,
    /// Seconds of job time per rolling day.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job_seconds_per_day: Option<u64>,
}

/// What a tenant's period budgets count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Model tokens.
    Tokens,
    /// Tool cost units.
    CostUnits,
    /// Tool calls.
    ToolCalls,
    /// Job time, counted in milliseconds, budgeted in seconds.
    JobTime,
}

impl Kind {
    /// Every kind, in the order the store's script is given them.
    pub const ALL: [Self; 4] = [
        Self::Tokens,
        Self::CostUnits,
        Self::ToolCalls,
        Self::JobTime,
    ];

    /// Its counters' prefix in the tenant's budget hash.
    pub(crate) fn counter(self) -> &'static str {
        match self {
            Self::Tokens => "tokens",
            Self::CostUnits => "cost_units",
            Self::ToolCalls => "tool_calls",
            Self::JobTime => "job_ms",
        }
    }

    /// Its keys' stem in the tokens file (`<stem>_per_hour`).
    fn stem(self) -> &'static str {
        match self {
            Self::Tokens => "tokens",
            Self::CostUnits => "cost_units",
            Self::ToolCalls => "tool_calls",
            Self::JobTime => "job_seconds",
        }
    }

    fn unit(self) -> &'static str {
        match self {
            Self::Tokens => "model tokens",
            Self::CostUnits => "tool cost units",
            Self::ToolCalls => "tool calls",
            Self::JobTime => "ms of job time",
        }
    }
}

/// A rolling period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// The last 60 whole minutes and the current one.
    Hour,
    /// The last 24 whole hours and the current one.
    Day,
}

impl Window {
    fn name(self) -> &'static str {
        match self {
            Self::Hour => "hour",
            Self::Day => "day",
        }
    }
}

impl TenantBudget {
    /// Whether no limit is set.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// `kind`'s keys per hour and per day, as the tokens file gives them.
    fn keys(&self, kind: Kind) -> (Option<u64>, Option<u64>) {
        match kind {
            Kind::Tokens => (self.tokens_per_hour, self.tokens_per_day),
            Kind::CostUnits => (self.cost_units_per_hour, self.cost_units_per_day),
            Kind::ToolCalls => (self.tool_calls_per_hour, self.tool_calls_per_day),
            Kind::JobTime => (self.job_seconds_per_hour, self.job_seconds_per_day),
        }
    }

    /// `kind`'s limits per hour and per day, in its counter's unit (job
    /// time in milliseconds).
    pub(crate) fn limits(&self, kind: Kind) -> (Option<u64>, Option<u64>) {
        let (hour, day) = self.keys(kind);
        let unit = if kind == Kind::JobTime { 1000 } else { 1 };
        (
            hour.map(|n| n.saturating_mul(unit)),
            day.map(|n| n.saturating_mul(unit)),
        )
    }

    /// The first limit out of bounds, named as its key: 0 (a tenant that
    /// may spend nothing has no use for a token) or above [`MAX_BUDGET`].
    pub(crate) fn problem(&self) -> Option<String> {
        Kind::ALL.into_iter().find_map(|kind| {
            let (hour, day) = self.keys(kind);
            [(Window::Hour, hour), (Window::Day, day)]
                .into_iter()
                .find_map(|(window, limit)| {
                    let key = format!("budget.{}_per_{}", kind.stem(), window.name());
                    match limit? {
                        0 => Some(format!(
                            "{key} must be at least 1; leave it out for no limit"
                        )),
                        n if n > MAX_BUDGET => Some(format!(
                            "{key} is {n}, above the largest budget, {MAX_BUDGET}"
                        )),
                        _ => None,
                    }
                })
        })
    }
}

/// A period budget the tenant spent: which, what its jobs had spent of it
/// in the window, and when there is room again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantExceeded {
    /// The tenant.
    pub tenant: String,
    /// What it counts.
    pub kind: Kind,
    /// Its period.
    pub window: Window,
    /// What the tenant's jobs spent in the window.
    pub spent: u64,
    /// The limit, in the counter's unit.
    pub limit: u64,
    /// Until the window's oldest counters leave it and the check would
    /// pass, as the store computed it.
    pub retry_after: Duration,
}

impl fmt::Display for TenantExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tenant {:?} spent {} of its {} {} per rolling {} (budget.{}_per_{} in the tokens \
             file); there is room again in {} s",
            self.tenant,
            self.spent,
            self.limit,
            self.kind.unit(),
            self.window.name(),
            self.kind.stem(),
            self.window.name(),
            self.retry_after.as_secs().max(1)
        )
    }
}

impl TenantExceeded {
    /// The field of the budget, for metrics: `tool_calls_per_hour`.
    pub(crate) fn field(&self) -> &'static str {
        match (self.kind, self.window) {
            (Kind::Tokens, Window::Hour) => "tokens_per_hour",
            (Kind::Tokens, Window::Day) => "tokens_per_day",
            (Kind::CostUnits, Window::Hour) => "cost_units_per_hour",
            (Kind::CostUnits, Window::Day) => "cost_units_per_day",
            (Kind::ToolCalls, Window::Hour) => "tool_calls_per_hour",
            (Kind::ToolCalls, Window::Day) => "tool_calls_per_day",
            (Kind::JobTime, Window::Hour) => "job_seconds_per_hour",
            (Kind::JobTime, Window::Day) => "job_seconds_per_day",
        }
    }

    /// The envelope of a call it did not let run.
    pub(crate) fn envelope(&self) -> Envelope {
        Envelope::terminal(
            ErrorCode::BUDGET_EXCEEDED,
            format!("this call was not run: {self}"),
        )
    }
}

/// One kind in a request to the tenant's counters (the store's
/// `spend_tenant`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Entry {
    /// Added whatever the check says: spent already (a turn's tokens, job
    /// time).
    pub add: u64,
    /// Added only if every check passes: about to be spent (a call, its
    /// cost); refused when it would take the window over its limit.
    pub take: u64,
    /// The limits, per hour and per day (the counter's unit).
    pub hour: Option<u64>,
    pub day: Option<u64>,
    /// Whether to check this kind at all: with no take, the check refuses
    /// once the window is at its limit.
    pub check: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_in_the_counters_units_and_checked_by_key() {
        let budget = TenantBudget {
            tool_calls_per_hour: Some(10),
            job_seconds_per_day: Some(60),
            ..TenantBudget::default()
        };
        assert_eq!(budget.limits(Kind::ToolCalls), (Some(10), None));
        assert_eq!(budget.limits(Kind::JobTime), (None, Some(60_000)));
        assert_eq!(budget.problem(), None);
        let zero = TenantBudget {
            cost_units_per_day: Some(0),
            ..budget
        };
        assert_eq!(
            zero.problem().as_deref(),
            Some("budget.cost_units_per_day must be at least 1; leave it out for no limit")
        );
        let huge = TenantBudget {
            tokens_per_hour: Some(MAX_BUDGET + 1),
            ..budget
        };
        assert!(
            huge.problem()
                .unwrap()
                .starts_with("budget.tokens_per_hour is 1000000000001")
        );
    }

    #[test]
    fn a_refusal_names_its_key_and_when_to_come_back() {
        let over = TenantExceeded {
            tenant: "acme".into(),
            kind: Kind::ToolCalls,
            window: Window::Hour,
            spent: 10,
            limit: 10,
            retry_after: Duration::from_millis(41_500),
        };
        assert_eq!(
            over.to_string(),
            "tenant \"acme\" spent 10 of its 10 tool calls per rolling hour \
             (budget.tool_calls_per_hour in the tokens file); there is room again in 41 s"
        );
        assert_eq!(over.field(), "tool_calls_per_hour");
        assert_eq!(
            over.envelope().error().map(|e| e.code.to_string()),
            Some("BUDGET_EXCEEDED".into())
        );
    }
}
