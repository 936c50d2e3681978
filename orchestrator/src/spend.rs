//! What a run spends: its job's budget, kept by the run ([`JobBudget`]),
//! and its tenant's period budgets, kept in Redis ([`TenantMeter`]), asked
//! before every model turn and every attempt ([`RunBudget`]). What the
//! budgets are and how they are checked is `crate::budget`'s; this module
//! asks the store.

use std::fmt;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::budget::tenant::{Entry, Kind, TenantBudget, TenantExceeded};
use crate::budget::{JobBudget, Limit, Over, Spend};
use crate::job::{Ending, JobErrorCode, Usage};
use crate::store::{self, JobStore};

/// Whether `tenant`'s period `budget` has room for a new job: every kind
/// below its limits, nothing added.
///
/// # Errors
///
/// [`store::Error`] when Redis failed.
pub(crate) async fn admits(
    store: &JobStore,
    tenant: &str,
    budget: TenantBudget,
) -> Result<Result<(), TenantExceeded>, store::Error> {
    let entries = entries(budget, |_| (0, 0), true);
    Ok(store
        .spend_tenant(tenant, &entries)
        .await?
        .map_or(Ok(()), Err))
}

/// A request to the tenant's counters: each kind's `(add, take)` from
/// `amounts`, within `budget`'s limits, checked when `check`.
fn entries(budget: TenantBudget, amounts: impl Fn(Kind) -> (u64, u64), check: bool) -> [Entry; 4] {
    Kind::ALL.map(|kind| {
        let (add, take) = amounts(kind);
        let (hour, day) = budget.limits(kind);
        Entry {
            add,
            take,
            hour,
            day,
            check,
        }
    })
}

/// How a job over a budget ends: failed, `BUDGET_EXCEEDED`, naming it.
pub(crate) fn ending(over: &Over) -> Ending {
    Ending::failed(JobErrorCode::BudgetExceeded, over.reason())
}

/// A run's budgets: the job's own, kept by the run ([`JobBudget`]), and
/// its tenant's period budgets, kept in Redis ([`TenantMeter`]). A call
/// takes from the job's first, then from the tenant's; once either refuses
/// one, every later call is refused too and the job gets no more turns.
pub(crate) struct RunBudget {
    /// The job's tenant, whose metrics count what the job spends.
    tenant_name: String,
    job: JobBudget,
    tenant: TenantMeter,
    /// The first refusal by the tenant's budgets.
    refused: OnceLock<TenantExceeded>,
}

impl RunBudget {
    /// The budgets of a run of a job that spent `spent` so far, whose
    /// earlier run refused a call for its own `exceeded` limit, and whose
    /// tenant's period budgets it keeps.
    pub(crate) fn new(
        job: JobBudget,
        tenant: &str,
        periods: TenantBudget,
        store: JobStore,
    ) -> Self {
        Self {
            tenant_name: tenant.to_owned(),
            job,
            tenant: TenantMeter::new(tenant, periods, store),
            refused: OnceLock::new(),
        }
    }

    /// The budget a call was refused for, or the job's tokens spent: the
    /// job gets no more turns. The tenant's period budgets are asked by
    /// [`before_turn`](Self::before_turn).
    pub(crate) fn over(&self) -> Option<Over> {
        if let Some(refused) = self.refused.get() {
            return Some(Over::Tenant(refused.clone()));
        }
        self.job.before_turn().err().map(Over::Job)
    }

    /// Whether the tenant's period budgets let the job play another turn.
    ///
    /// # Errors
    ///
    /// [`store::Error`] when Redis failed.
    pub(crate) async fn before_turn(&self) -> Result<Option<Over>, store::Error> {
        Ok(self.tenant.before_turn().await?.err().map(Over::Tenant))
    }

    /// Counts a played turn's tokens (`turn_tokens`), returned.
    pub(crate) fn add_turn(&self, usage: Option<Usage>, max_tokens: Option<u32>) -> u64 {
        let tokens = self.job.turn_tokens(usage, max_tokens);
        self.job.add_tokens(tokens);
        self.tenant.add_tokens(tokens);
        crate::metrics::budget_spent(&self.tenant_name, Limit::Tokens.kind(), tokens);
        tokens
    }

    /// Takes a call's first attempt, which costs `cost`, from the job's
    /// budget and its tenant's; or the refusal that answers it.
    ///
    /// # Errors
    ///
    /// [`store::Error`] when Redis failed (nothing was taken).
    pub(crate) async fn take_call(&self, cost: u64) -> Result<Result<(), Over>, store::Error> {
        if let Some(refused) = self.refused.get() {
            return Ok(Err(Over::Tenant(refused.clone())));
        }
        if let Err(over) = self.job.take_call(cost) {
            return Ok(Err(Over::Job(over)));
        }
        let taken = self.tenant.take_call(cost).await;
        if matches!(taken, Ok(Ok(()))) {
            crate::metrics::budget_spent(&self.tenant_name, Limit::ToolCalls.kind(), 1);
            crate::metrics::budget_spent(&self.tenant_name, Limit::CostUnits.kind(), cost);
        } else {
            self.job.give_back(1, cost);
        }
        Ok(taken?.map_err(|refused| Over::Tenant(self.refuse(refused))))
    }

    /// Takes a retry's `cost`; or the refusal that ends its call.
    ///
    /// # Errors
    ///
    /// [`store::Error`] when Redis failed (nothing was taken).
    pub(crate) async fn take_attempt(&self, cost: u64) -> Result<Result<(), Over>, store::Error> {
        if let Some(refused) = self.refused.get() {
            return Ok(Err(Over::Tenant(refused.clone())));
        }
        if let Err(over) = self.job.take_attempt(cost) {
            return Ok(Err(Over::Job(over)));
        }
        let taken = self.tenant.take_attempt(cost).await;
        if matches!(taken, Ok(Ok(()))) {
            crate::metrics::budget_spent(&self.tenant_name, Limit::CostUnits.kind(), cost);
        } else {
            self.job.give_back(0, cost);
        }
        Ok(taken?.map_err(|refused| Over::Tenant(self.refuse(refused))))
    }

    /// What the job spent so far.
    pub(crate) fn spent(&self) -> Spend {
        self.job.spent()
    }

    /// Tells the tenant's counters what the run spent and has not said:
    /// when the run stops.
    pub(crate) async fn flush(&self) {
        self.tenant.flush().await;
    }

    /// The tenant's first refusal, kept: every later call is refused too.
    fn refuse(&self, refused: TenantExceeded) -> TenantExceeded {
        self.refused.get_or_init(|| refused).clone()
    }
}

/// What a run has spent and not yet told the tenant's counters.
#[derive(Debug)]
struct Unsaid {
    tokens: u64,
    /// When the run's job time was last counted.
    since: Instant,
}

/// A run's meter of its tenant's period budgets: it counts what the job
/// spends into the tenant's counters, and asks them before every turn and
/// every attempt. A tenant without period budgets costs nothing: no
/// counter is kept or asked.
pub(crate) struct TenantMeter {
    tenant: String,
    budget: TenantBudget,
    store: JobStore,
    unsaid: Mutex<Unsaid>,
}

impl fmt::Debug for TenantMeter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TenantMeter")
            .field("tenant", &self.tenant)
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

impl TenantMeter {
    /// The meter of a run of one of `tenant`'s jobs, whose period budgets
    /// the job keeps.
    pub(crate) fn new(tenant: &str, budget: TenantBudget, store: JobStore) -> Self {
        Self {
            tenant: tenant.to_owned(),
            budget,
            store,
            unsaid: Mutex::new(Unsaid {
                tokens: 0,
                since: Instant::now(),
            }),
        }
    }

    /// Notes a played turn's tokens, told with the next check.
    pub(crate) fn add_tokens(&self, tokens: u64) {
        if !self.budget.is_empty() {
            self.unsaid.lock().expect("not poisoned").tokens += tokens;
        }
    }

    /// Whether the tenant may play another turn of the job (every kind
    /// below its limits), telling its counters what the run spent since.
    pub(crate) async fn before_turn(&self) -> Result<Result<(), TenantExceeded>, store::Error> {
        self.ask(0, 0, true).await
    }

    /// Takes a call's first attempt, which costs `cost`, from the tenant's
    /// budgets; or the refusal that answers it.
    pub(crate) async fn take_call(
        &self,
        cost: u64,
    ) -> Result<Result<(), TenantExceeded>, store::Error> {
        self.ask(1, cost, true).await
    }

    /// Takes a retry's `cost`; or the refusal that ends its call.
    pub(crate) async fn take_attempt(
        &self,
        cost: u64,
    ) -> Result<Result<(), TenantExceeded>, store::Error> {
        self.ask(0, cost, true).await
    }

    /// Tells the tenant's counters what the run spent and has not said,
    /// without a check: when the run stops. A failure is logged: the
    /// tenant's counters miss it, the job loses nothing.
    pub(crate) async fn flush(&self) {
        if let Err(err) = self.ask(0, 0, false).await {
            tracing::warn!(error = %err, "could not count the run's spend in its tenant's budgets");
        }
    }

    async fn ask(
        &self,
        calls: u64,
        cost: u64,
        check: bool,
    ) -> Result<Result<(), TenantExceeded>, store::Error> {
        if self.budget.is_empty() {
            return Ok(Ok(()));
        }
        let (tokens, job_ms) = self.unsaid();
        let entries = entries(
            self.budget,
            |kind| match kind {
                Kind::Tokens => (tokens, 0),
                Kind::CostUnits => (0, cost),
                Kind::ToolCalls => (0, calls),
                Kind::JobTime => (job_ms, 0),
            },
            check,
        );
        let answer = self.store.spend_tenant(&self.tenant, &entries).await;
        if answer.is_err() {
            // Not counted: said again with the next check.
            let mut unsaid = self.unsaid.lock().expect("not poisoned");
            unsaid.tokens += tokens;
            let since = unsaid.since.checked_sub(Duration::from_millis(job_ms));
            unsaid.since = since.unwrap_or(unsaid.since);
        }
        Ok(answer?.map_or(Ok(()), Err))
    }

    /// What the run spent since it last told the counters, now said.
    fn unsaid(&self) -> (u64, u64) {
        let mut unsaid = self.unsaid.lock().expect("not poisoned");
        let now = Instant::now();
        let job_ms = u64::try_from(now.duration_since(unsaid.since).as_millis()).unwrap_or(0);
        let tokens = std::mem::take(&mut unsaid.tokens);
        unsaid.since = now;
        (tokens, job_ms)
    }
}
