//! Budgets: what a job may spend on model tokens, tool cost units and tool
//! calls (`SubmitJobRequest.budget`, this module), what its tenant's jobs
//! together may spend per rolling hour and day ([`tenant`]), and the pure
//! checks of both (docs/protection.md, "Budgets"; decision 0055). A run
//! asks them through the `spend` module, which keeps the tenant's counters.
//!
//! | spent on | counted | checked | over it |
//! |---|---|---|---|
//! | `max_tokens` | each turn's input and output tokens, as the provider reports them; a turn without usage counts the job's `max_tokens`, else the rest of the budget | before every turn | the job ends `BUDGET_EXCEEDED`; at most one turn over |
//! | `max_tool_calls` | each call a worker runs, once however many attempts | before its first attempt | the call is answered `BUDGET_EXCEEDED` unrun; never over |
//! | `max_cost_units` | each attempt's tool `cost` (default 1) | before every attempt | that attempt is not made: `BUDGET_EXCEEDED`; never over |
//!
//! A run keeps the job's spend in a `JobBudget`, shared by the calls of a
//! round; the commits that record a turn or an attempt add to the job's
//! stored spend in Redis, so a resumed run starts from what was spent.
//! Once a call is refused, every later one is too and the job gets no more
//! turns: the refusal is stored with the call's result (the job's
//! `budget_exceeded` field) for a run that resumes the job.

pub mod tenant;

use std::fmt;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use toolfleet_proto::{Envelope, ErrorCode};

pub use toolfleet_proto::job::Spend;
use toolfleet_proto::job::Usage;

use tenant::TenantExceeded;

/// The largest budget of any kind: 10^12 (a trillion tokens is more than any
/// job spends; anything larger is a mistake, not a limit).
pub(crate) const MAX_BUDGET: u64 = 1_000_000_000_000;

/// What `tool_call_result` events and spans say produced the answer of a
/// call that a budget refused.
pub(crate) const BUDGET: &str = "budget";

/// A job's own limits; `None`: no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Budget {
    /// Model tokens, input (cached included) and output.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Tool cost units: each attempt costs its tool's `cost`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_cost_units: Option<u64>,
    /// Calls run by workers, each once.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tool_calls: Option<u64>,
}

impl Budget {
    /// Whether no limit is set.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// The first limit out of bounds, as `(field, problem)`: 0 (a job that
    /// may spend nothing cannot run) or above [`MAX_BUDGET`].
    pub(crate) fn problem(&self) -> Option<(&'static str, String)> {
        [
            (Limit::Tokens, self.max_tokens),
            (Limit::CostUnits, self.max_cost_units),
            (Limit::ToolCalls, self.max_tool_calls),
        ]
        .into_iter()
        .find_map(|(limit, max)| {
            let problem = match max? {
                0 => "must be at least 1; leave it unset for no limit".to_owned(),
                n if n > MAX_BUDGET => format!("{n} is above the largest budget, {MAX_BUDGET}"),
                _ => return None,
            };
            Some((limit.field(), problem))
        })
    }
}

/// One of a budget's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// `max_tokens`.
    Tokens,
    /// `max_cost_units`.
    CostUnits,
    /// `max_tool_calls`.
    ToolCalls,
}

impl Limit {
    /// Its field in `SubmitJobRequest.budget`, which messages name.
    pub fn field(self) -> &'static str {
        match self {
            Self::Tokens => "max_tokens",
            Self::CostUnits => "max_cost_units",
            Self::ToolCalls => "max_tool_calls",
        }
    }

    /// The limit whose field is `field`.
    pub fn parse(field: &str) -> Option<Self> {
        [Self::Tokens, Self::CostUnits, Self::ToolCalls]
            .into_iter()
            .find(|limit| limit.field() == field)
    }

    /// Its `kind` in the spend metrics, and its field in `Spend`.
    pub(crate) fn kind(self) -> &'static str {
        match self {
            Self::Tokens => "tokens",
            Self::CostUnits => "cost_units",
            Self::ToolCalls => "tool_calls",
        }
    }

    fn unit(self) -> &'static str {
        match self {
            Self::Tokens => "model tokens",
            Self::CostUnits => "tool cost units",
            Self::ToolCalls => "tool calls",
        }
    }
}

/// A budget the job spent: which, what it had spent, and its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exceeded {
    /// The limit.
    pub limit: Limit,
    /// What the job had spent of it when the check refused.
    pub spent: u64,
    /// The limit's value.
    pub max: u64,
}

impl fmt::Display for Exceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the job spent {} of its budget of {} {} (budget.{})",
            self.spent,
            self.max,
            self.limit.unit(),
            self.limit.field()
        )
    }
}

impl Exceeded {
    /// The terminal envelope of a call the budget did not let run (or run
    /// again): the model is told why, in case it answers.
    pub(crate) fn envelope(&self) -> Envelope {
        Envelope::terminal(
            ErrorCode::BUDGET_EXCEEDED,
            format!("this call was not run: {self}"),
        )
    }
}

/// A run's view of its job's budget and spend, shared by the calls of its
/// rounds: every check takes what it allows at once (compare-and-swap), so
/// parallel calls never overspend between them.
#[derive(Debug, Default)]
pub(crate) struct JobBudget {
    budget: Budget,
    tokens: AtomicU64,
    cost_units: AtomicU64,
    tool_calls: AtomicU64,
    /// The first refusal: every later check refuses too.
    exceeded: OnceLock<Exceeded>,
}

impl JobBudget {
    /// The budget of a job that spent `spent` so far, and whose earlier run
    /// refused a call for `exceeded` (its stored `budget_exceeded`).
    pub(crate) fn resumed(budget: Budget, spent: Spend, exceeded: Option<Limit>) -> Self {
        let this = Self {
            budget,
            tokens: AtomicU64::new(spent.tokens),
            cost_units: AtomicU64::new(spent.cost_units),
            tool_calls: AtomicU64::new(spent.tool_calls),
            exceeded: OnceLock::new(),
        };
        if let Some(limit) = exceeded {
            let spent = this.spent_of(limit);
            let max = this.max_of(limit).unwrap_or(spent);
            let _ = this.exceeded.set(Exceeded { limit, spent, max });
        }
        this
    }

    /// What the job spent so far.
    pub(crate) fn spent(&self) -> Spend {
        Spend {
            tokens: self.tokens.load(Ordering::Relaxed),
            cost_units: self.cost_units.load(Ordering::Relaxed),
            tool_calls: self.tool_calls.load(Ordering::Relaxed),
        }
    }

    /// Whether the job may play another model turn: no call was refused,
    /// and its tokens are below `max_tokens`.
    pub(crate) fn before_turn(&self) -> Result<(), Exceeded> {
        if let Some(exceeded) = self.exceeded.get() {
            return Err(*exceeded);
        }
        match self.budget.max_tokens {
            Some(max) if self.tokens.load(Ordering::Relaxed) >= max => Err(Exceeded {
                limit: Limit::Tokens,
                spent: self.tokens.load(Ordering::Relaxed),
                max,
            }),
            _ => Ok(()),
        }
    }

    /// The tokens a turn counts: its usage, input and output; without one,
    /// the job's `max_tokens` per turn, else what is left of the token
    /// budget (so that a provider that says nothing cannot overspend it).
    /// A provider's usage counts at most [`MAX_BUDGET`] a turn: a server
    /// that reports absurd numbers cannot wrap the job's counters around.
    pub(crate) fn turn_tokens(&self, usage: Option<Usage>, max_tokens: Option<u32>) -> u64 {
        let tokens = match (usage, max_tokens) {
            (Some(usage), _) => usage.input_tokens.saturating_add(usage.output_tokens),
            (None, Some(max)) => u64::from(max),
            (None, None) => self.budget.max_tokens.map_or(0, |max| {
                max.saturating_sub(self.tokens.load(Ordering::Relaxed))
            }),
        };
        tokens.min(MAX_BUDGET)
    }

    /// Adds a played turn's `tokens`.
    pub(crate) fn add_tokens(&self, tokens: u64) {
        let _ = self
            .tokens
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |spent| {
                Some(spent.saturating_add(tokens))
            });
    }

    /// Takes a call's first attempt, which costs `cost`: one tool call and
    /// its cost units, or the refusal that answers it.
    pub(crate) fn take_call(&self, cost: u64) -> Result<(), Exceeded> {
        self.take(Limit::ToolCalls, 1)?;
        if let Err(exceeded) = self.take(Limit::CostUnits, cost) {
            self.tool_calls.fetch_sub(1, Ordering::Relaxed);
            return Err(exceeded);
        }
        Ok(())
    }

    /// Gives back what a call took that was not spent after all: its
    /// tenant refused it.
    pub(crate) fn give_back(&self, calls: u64, cost: u64) {
        self.tool_calls.fetch_sub(calls, Ordering::Relaxed);
        self.cost_units.fetch_sub(cost, Ordering::Relaxed);
    }

    /// Takes a retry's cost, or the refusal that ends its call.
    pub(crate) fn take_attempt(&self, cost: u64) -> Result<(), Exceeded> {
        self.take(Limit::CostUnits, cost)
    }

    /// Adds `amount` to `limit`'s spend if it stays within it; else the
    /// refusal, which every later check repeats.
    fn take(&self, limit: Limit, amount: u64) -> Result<(), Exceeded> {
        if let Some(exceeded) = self.exceeded.get() {
            return Err(*exceeded);
        }
        let counter = self.counter(limit);
        let Some(max) = self.max_of(limit) else {
            counter.fetch_add(amount, Ordering::Relaxed);
            return Ok(());
        };
        let taken = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |spent| {
            spent.checked_add(amount).filter(|total| *total <= max)
        });
        match taken {
            Ok(_) => Ok(()),
            Err(spent) => {
                let exceeded = Exceeded { limit, spent, max };
                Err(*self.exceeded.get_or_init(|| exceeded))
            }
        }
    }

    fn counter(&self, limit: Limit) -> &AtomicU64 {
        match limit {
            Limit::Tokens => &self.tokens,
            Limit::CostUnits => &self.cost_units,
            Limit::ToolCalls => &self.tool_calls,
        }
    }

    fn spent_of(&self, limit: Limit) -> u64 {
        self.counter(limit).load(Ordering::Relaxed)
    }

    fn max_of(&self, limit: Limit) -> Option<u64> {
        match limit {
            Limit::Tokens => self.budget.max_tokens,
            Limit::CostUnits => self.budget.max_cost_units,
            Limit::ToolCalls => self.budget.max_tool_calls,
        }
    }
}

/// A budget a job or its tenant spent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Over {
    /// One of the job's own.
    Job(Exceeded),
    /// One of its tenant's period budgets.
    Tenant(TenantExceeded),
}

impl fmt::Display for Over {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Job(over) => write!(f, "{over}"),
            Self::Tenant(over) => write!(f, "{over}"),
        }
    }
}

impl Over {
    /// Why the job ends `BUDGET_EXCEEDED`: the budget and what was spent.
    pub(crate) fn reason(&self) -> String {
        match self {
            Self::Job(over) => format!("{over}; it gets no more model turns"),
            Self::Tenant(over) => format!("{over}; the job gets no more model turns"),
        }
    }

    /// The envelope of a call it did not let run (or run again).
    pub(crate) fn envelope(&self) -> Envelope {
        match self {
            Self::Job(over) => over.envelope(),
            Self::Tenant(over) => over.envelope(),
        }
    }

    /// The job's own limit, which the store keeps with a refused call.
    pub(crate) fn limit(&self) -> Option<Limit> {
        match self {
            Self::Job(over) => Some(over.limit),
            Self::Tenant(_) => None,
        }
    }

    /// The budget's name in metrics: the job's `max_*` field, or the
    /// tenant's `*_per_hour` or `*_per_day` key.
    pub(crate) fn field(&self) -> &'static str {
        match self {
            Self::Job(over) => over.limit.field(),
            Self::Tenant(over) => over.field(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(tokens: Option<u64>, cost: Option<u64>, calls: Option<u64>) -> Budget {
        Budget {
            max_tokens: tokens,
            max_cost_units: cost,
            max_tool_calls: calls,
        }
    }

    #[test]
    fn calls_are_taken_up_to_the_limit_and_a_refusal_sticks() {
        let job = JobBudget::resumed(budget(None, None, Some(2)), Spend::default(), None);
        assert_eq!(job.take_call(1), Ok(()));
        assert_eq!(job.take_call(1), Ok(()));
        assert_eq!(job.before_turn(), Ok(()), "at the limit, not over it");
        let refused = job.take_call(1).unwrap_err();
        assert_eq!(
            (refused.limit, refused.spent, refused.max),
            (Limit::ToolCalls, 2, 2)
        );
        assert_eq!(job.spent().tool_calls, 2, "a refused call is not counted");
        assert_eq!(job.before_turn(), Err(refused), "no more turns");
        assert_eq!(job.take_attempt(0), Err(refused), "nor attempts");
        assert_eq!(
            refused.to_string(),
            "the job spent 2 of its budget of 2 tool calls (budget.max_tool_calls)"
        );
    }

    #[test]
    fn a_call_whose_cost_does_not_fit_is_not_counted() {
        let job = JobBudget::resumed(budget(None, Some(5), None), Spend::default(), None);
        assert_eq!(job.take_call(3), Ok(()));
        assert_eq!(job.take_attempt(2), Ok(()), "a retry fits exactly");
        let refused = job.take_call(1).unwrap_err();
        assert_eq!(refused.limit, Limit::CostUnits);
        assert_eq!(
            job.spent(),
            Spend {
                tokens: 0,
                cost_units: 5,
                tool_calls: 1
            }
        );
    }

    #[test]
    fn tokens_stop_the_next_turn_once_they_reach_the_budget() {
        let job = JobBudget::resumed(budget(Some(250), None, None), Spend::default(), None);
        let usage = Usage {
            input_tokens: 100,
            output_tokens: 20,
            ..Usage::default()
        };
        assert_eq!(job.turn_tokens(Some(usage), Some(7)), 120, "usage wins");
        assert_eq!(job.turn_tokens(None, Some(7)), 7, "else max_tokens");
        let absurd = Usage {
            input_tokens: u64::MAX,
            output_tokens: u64::MAX,
            ..Usage::default()
        };
        assert_eq!(job.turn_tokens(Some(absurd), None), MAX_BUDGET, "bounded");
        job.add_tokens(200);
        assert_eq!(
            job.turn_tokens(None, None),
            50,
            "else the rest of the budget"
        );
        assert_eq!(job.before_turn(), Ok(()));
        job.add_tokens(120);
        let over = job.before_turn().unwrap_err();
        assert_eq!(
            (over.limit, over.spent, over.max),
            (Limit::Tokens, 320, 250)
        );
        let unlimited = JobBudget::resumed(Budget::default(), Spend::default(), None);
        assert_eq!(unlimited.turn_tokens(None, None), 0);
        assert_eq!(unlimited.take_call(1_000_000), Ok(()));
    }

    #[test]
    fn a_resumed_run_keeps_the_spend_and_the_refusal_of_the_one_before() {
        let spent = Spend {
            tokens: 10,
            cost_units: 4,
            tool_calls: 4,
        };
        let job = JobBudget::resumed(budget(None, None, Some(4)), spent, Some(Limit::ToolCalls));
        assert_eq!(job.spent(), spent);
        let over = job.before_turn().unwrap_err();
        assert_eq!((over.limit, over.spent, over.max), (Limit::ToolCalls, 4, 4));
        assert_eq!(Limit::parse("max_tool_calls"), Some(Limit::ToolCalls));
        assert_eq!(Limit::parse("tokens"), None);
    }

    #[test]
    fn limits_out_of_bounds_are_named() {
        assert_eq!(budget(None, None, None).problem(), None);
        assert_eq!(budget(Some(MAX_BUDGET), Some(1), None).problem(), None);
        let (field, why) = budget(None, Some(0), None).problem().unwrap();
        assert_eq!(field, "max_cost_units");
        assert!(why.starts_with("must be at least 1"), "{why}");
        let (field, why) = budget(Some(MAX_BUDGET + 1), None, None).problem().unwrap();
        assert_eq!(field, "max_tokens");
        assert!(why.contains("above the largest budget"), "{why}");
    }

    #[test]
    fn parallel_calls_never_take_more_than_the_budget() {
        let job = std::sync::Arc::new(JobBudget::resumed(
            budget(None, None, Some(100)),
            Spend::default(),
            None,
        ));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let job = job.clone();
                std::thread::spawn(move || (0..50).filter(|_| job.take_call(1).is_ok()).count())
            })
            .collect();
        let taken: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(taken, 100);
        assert_eq!(job.spent().tool_calls, 100);
    }
}
