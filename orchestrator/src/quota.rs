//! Tenants' limits, in one place: what each tenant may use at once, where
//! each limit is checked and what it refuses. The API asks [`TenantLimits`]
//! to admit a submission, dispatch asks it for a call slot; the counters
//! live in Redis (`store/quota.rs`), shared by every replica.
//!
//! | Limit (tokens file; default `api.default_*`) | Counts | Checked | Over it |
//! |---|---|---|---|
//! | `submissions_per_second` | submissions, in a token bucket holding one second's worth (at least one) | `SubmitJob`, first | `RESOURCE_EXHAUSTED`, retry after the next token |
//! | `max_active_jobs` | jobs queued or running | `SubmitJob` | `RESOURCE_EXHAUSTED`, retry after 1 s |
//! | `max_calls_in_flight` | tool calls published and not settled | `SubmitJob`; each call before its first attempt | `RESOURCE_EXHAUSTED`, retry after 1 s; a call waits unpublished for a slot, never failed for it |
//!
//! A refused submission stores nothing. A call waiting for a slot ends only
//! with its job's deadline or a stop. A slot whose runner died expires with
//! the job's deadline, and a resumed round takes the slot its call held.

use std::fmt;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::budget::tenant::{TenantBudget, TenantExceeded};
use crate::job::now_ms;
use crate::store::{self, JobStore};

/// A tenant's limits (from its entry in the tokens file, else the
/// `api.default_*` keys); `None`: no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Quotas {
    /// Jobs queued or running at once.
    pub max_active_jobs: Option<u32>,
    /// Sustained submissions per second (a token bucket holding one
    /// second's worth, at least one).
    pub submissions_per_second: Option<f64>,
    /// Tool calls of its jobs published and not yet settled, at once.
    pub max_calls_in_flight: Option<u32>,
    /// What its jobs together may spend per rolling hour and day (its
    /// `[tenants.<name>.budget]`; no defaults).
    pub budget: TenantBudget,
}

impl Quotas {
    /// The defaults as the `api.default_*` keys give them, where 0 means no
    /// limit.
    pub(crate) fn from_defaults(
        max_active_jobs: u32,
        submissions_per_second: f64,
        max_calls_in_flight: u32,
    ) -> Self {
        Self {
            max_active_jobs: Some(max_active_jobs).filter(|n| *n > 0),
            submissions_per_second: Some(submissions_per_second).filter(|rate| *rate > 0.0),
            max_calls_in_flight: Some(max_calls_in_flight).filter(|n| *n > 0),
            budget: TenantBudget::default(),
        }
    }

    /// These quotas with `own`'s where it sets them: a tenant's entry over
    /// the defaults.
    pub(crate) fn overridden_by(self, own: Self) -> Self {
        Self {
            max_active_jobs: own.max_active_jobs.or(self.max_active_jobs),
            submissions_per_second: own.submissions_per_second.or(self.submissions_per_second),
            max_calls_in_flight: own.max_calls_in_flight.or(self.max_calls_in_flight),
            budget: own.budget,
        }
    }

    /// Why these quotas, as a tenant's own entry sets them, are not valid.
    pub(crate) fn problem(&self) -> Option<&'static str> {
        if self
            .submissions_per_second
            .is_some_and(|rate| !(rate.is_finite() && rate > 0.0))
        {
            Some("submissions_per_second must be a number above 0")
        } else if self.max_calls_in_flight == Some(0) {
            Some("max_calls_in_flight must be at least 1")
        } else {
            None
        }
    }
}

/// A submission a tenant's limits refuse, and when to try again.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Refusal {
    /// Faster than `submissions_per_second`; the next token is `wait` away.
    SubmissionRate {
        /// The tenant.
        tenant: String,
        /// Its rate.
        rate: f64,
        /// Until the bucket holds a token.
        wait: Duration,
    },
    /// `max_active_jobs` jobs are queued or running.
    ActiveJobs {
        /// The tenant.
        tenant: String,
        /// Its jobs queued or running.
        active: u32,
    },
    /// `max_calls_in_flight` calls are in flight.
    CallsInFlight {
        /// The tenant.
        tenant: String,
        /// Its calls in flight.
        in_flight: u32,
    },
    /// Its jobs spent one of its period budgets; there is room again
    /// after the refusal's `retry_after`.
    Budget(TenantExceeded),
}

/// How long a client waits before retrying a submission refused for its
/// active jobs or calls in flight: they free up as jobs and calls finish,
/// which no counter can predict.
const RETRY_WHEN_BUSY: Duration = Duration::from_secs(1);

impl Refusal {
    /// When the client may try again.
    pub(crate) fn retry_after(&self) -> Duration {
        match self {
            Self::SubmissionRate { wait, .. } => *wait,
            Self::ActiveJobs { .. } | Self::CallsInFlight { .. } => RETRY_WHEN_BUSY,
            Self::Budget(over) => over.retry_after,
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::SubmissionRate { tenant, rate, wait } => write!(
                f,
                "tenant {tenant:?} submits faster than its quota of {rate} jobs per second \
                 (submissions_per_second); retry after {} ms",
                wait.as_millis()
            ),
            Self::ActiveJobs { tenant, active } => write!(
                f,
                "tenant {tenant:?} has {active} jobs queued or running, its quota \
                 (max_active_jobs); retry when one has finished"
            ),
            Self::CallsInFlight { tenant, in_flight } => write!(
                f,
                "tenant {tenant:?} has {in_flight} tool calls in flight, its quota \
                 (max_calls_in_flight); retry when some have finished"
            ),
            Self::Budget(over) => write!(f, "{over}"),
        }
    }
}

/// Why a submission was not admitted.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AdmitError {
    /// A limit refused it.
    #[error("{0}")]
    Refused(Refusal),
    /// The counters could not be read.
    #[error(transparent)]
    Store(#[from] store::Error),
}

/// Why a call got no slot.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SlotError {
    /// The job's deadline passes before a slot would be polled again.
    #[error("the job's deadline passed while its call waited for a slot")]
    DeadlineExceeded,
    /// The round was stopped while the call waited.
    #[error("the wait for a call slot was interrupted")]
    Interrupted,
    /// The counters could not be read.
    #[error(transparent)]
    Store(#[from] store::Error),
}

/// The one place tenants' limits are asked: by the API before it stores a
/// submission, by dispatch before it publishes a call.
#[derive(Clone)]
pub(crate) struct TenantLimits {
    store: JobStore,
}

/// One call asking for a slot in its tenant's calls in flight.
pub(crate) struct SlotRequest<'a> {
    /// The tenant whose calls in flight it counts toward.
    pub tenant: &'a str,
    /// The call, `<job>/<wire id>`: the same for every attempt of it, so a
    /// resumed round finds the slot it held.
    pub call: String,
    /// The tool (for the throttling metric).
    pub tool: &'a str,
    /// The tenant's `max_calls_in_flight`.
    pub limit: u32,
    /// The job's deadline (Unix ms): the wait's end, and the slot's expiry.
    pub deadline_ms: u64,
}

/// The first pause of a call waiting for a slot; doubled up to
/// [`LONGEST_PAUSE`]. Slots are polled rather than announced: a freed one
/// is found within a pause, which only matters at the quota.
const FIRST_PAUSE: Duration = Duration::from_millis(20);
const LONGEST_PAUSE: Duration = Duration::from_millis(500);

impl TenantLimits {
    /// The limits kept in `store`.
    pub(crate) fn new(store: JobStore) -> Self {
        Self { store }
    }

    /// Whether `tenant` may submit one more job under `quotas`: its
    /// submissions per second, its active jobs and its calls in flight, in
    /// that order. Admission takes a token from the submissions' bucket.
    ///
    /// # Errors
    ///
    /// [`AdmitError::Refused`] with the limit that refused it;
    /// [`AdmitError::Store`] when Redis failed.
    pub(crate) async fn admit(&self, tenant: &str, quotas: &Quotas) -> Result<(), AdmitError> {
        // The rate first: it is one cheap script, and it bounds how often
        // the active-jobs count (a scan when at the quota) runs.
        if let Some(rate) = quotas.submissions_per_second
            && let Some(wait) = self.store.take_submission(tenant, rate).await?
        {
            return Err(AdmitError::Refused(Refusal::SubmissionRate {
                tenant: tenant.to_owned(),
                rate,
                wait,
            }));
        }
        if let Some(limit) = quotas.max_active_jobs {
            let active = self.store.active_jobs(tenant, limit).await?;
            if active >= limit {
                return Err(AdmitError::Refused(Refusal::ActiveJobs {
                    tenant: tenant.to_owned(),
                    active,
                }));
            }
        }
        if let Some(limit) = quotas.max_calls_in_flight {
            let in_flight = self.store.calls_in_flight(tenant).await?;
            if in_flight >= limit {
                return Err(AdmitError::Refused(Refusal::CallsInFlight {
                    tenant: tenant.to_owned(),
                    in_flight,
                }));
            }
        }
        // A tenant whose jobs spent a period budget: a new job could do
        // nothing before the window has room again.
        if !quotas.budget.is_empty()
            && let Err(over) = crate::spend::admits(&self.store, tenant, quotas.budget).await?
        {
            return Err(AdmitError::Refused(Refusal::Budget(over)));
        }
        Ok(())
    }

    /// A slot for a call in its tenant's calls in flight, waiting while the
    /// tenant is at its quota, until `stop` or the job's deadline.
    ///
    /// # Errors
    ///
    /// [`SlotError`]: the deadline, the stop, or Redis.
    pub(crate) async fn call_slot(
        &self,
        request: SlotRequest<'_>,
        stop: &CancellationToken,
    ) -> Result<CallSlot, SlotError> {
        let mut pause = FIRST_PAUSE;
        let mut waited = false;
        loop {
            let taken = self
                .store
                .take_call_slot(
                    request.tenant,
                    &request.call,
                    request.limit,
                    request.deadline_ms,
                )
                .await?;
            if taken {
                return Ok(CallSlot {
                    store: self.store.clone(),
                    tenant: request.tenant.to_owned(),
                    call: request.call,
                });
            }
            if !waited {
                waited = true;
                crate::metrics::tool_call_throttled(request.tool);
                debug!(call = %request.call, limit = request.limit, "tenant at its calls in flight; the call waits");
            }
            if now_ms().saturating_add(toolfleet_service::clock::millis(pause))
                >= request.deadline_ms
            {
                return Err(SlotError::DeadlineExceeded);
            }
            tokio::select! {
                () = stop.cancelled() => return Err(SlotError::Interrupted),
                () = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).min(LONGEST_PAUSE);
        }
    }
}

/// A slot held by one call; freed when dropped (the call settled, or its
/// round ended any other way).
pub(crate) struct CallSlot {
    store: JobStore,
    tenant: String,
    call: String,
}

impl Drop for CallSlot {
    fn drop(&mut self) {
        let (store, tenant, call) = (
            self.store.clone(),
            std::mem::take(&mut self.tenant),
            std::mem::take(&mut self.call),
        );
        // Dropped inside the runtime (a round's future); if the release is
        // lost, the entry expires with the job's deadline.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(err) = store.release_call_slot(&tenant, &call).await {
                    debug!(error = %err, "could not free a call slot; it expires with its job");
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_defaults_mean_no_limit() {
        let quotas = Quotas::from_defaults(0, 0.0, 0);
        assert_eq!(quotas, Quotas::default());
        let quotas = Quotas::from_defaults(10, 2.5, 3);
        assert_eq!(quotas.max_active_jobs, Some(10));
        assert_eq!(quotas.submissions_per_second, Some(2.5));
        assert_eq!(quotas.max_calls_in_flight, Some(3));
    }

    #[test]
    fn a_tenants_own_quotas_win_over_the_defaults() {
        let defaults = Quotas::from_defaults(10, 5.0, 100);
        let own = Quotas {
            max_active_jobs: Some(2),
            submissions_per_second: None,
            max_calls_in_flight: Some(3),
            budget: Default::default(),
        };
        let quotas = defaults.overridden_by(own);
        assert_eq!(quotas.max_active_jobs, Some(2));
        assert_eq!(quotas.submissions_per_second, Some(5.0));
        assert_eq!(quotas.max_calls_in_flight, Some(3));
    }

    #[test]
    fn a_tenants_entry_may_not_set_an_impossible_quota() {
        for (rate, calls, problem) in [
            (Some(0.0), None, Some("submissions_per_second")),
            (Some(-1.0), None, Some("submissions_per_second")),
            (Some(f64::NAN), None, Some("submissions_per_second")),
            (Some(f64::INFINITY), None, Some("submissions_per_second")),
            (None, Some(0), Some("max_calls_in_flight")),
            (Some(0.5), Some(1), None),
        ] {
            let quotas = Quotas {
                max_active_jobs: Some(0),
                submissions_per_second: rate,
                max_calls_in_flight: calls,
                budget: Default::default(),
            };
            let got = quotas.problem();
            assert_eq!(
                got.map(|p| p.split(' ').next().unwrap()),
                problem,
                "{rate:?} {calls:?}"
            );
        }
    }

    /// Every refusal names its limit's key and the tenant, and says when to
    /// come back.
    #[test]
    fn every_refusal_names_its_limit_and_when_to_retry() {
        let tenant = "acme".to_owned();
        for (refusal, key, retry) in [
            (
                Refusal::SubmissionRate {
                    tenant: tenant.clone(),
                    rate: 2.0,
                    wait: Duration::from_millis(350),
                },
                "submissions_per_second",
                Duration::from_millis(350),
            ),
            (
                Refusal::ActiveJobs {
                    tenant: tenant.clone(),
                    active: 7,
                },
                "max_active_jobs",
                RETRY_WHEN_BUSY,
            ),
            (
                Refusal::CallsInFlight {
                    tenant: tenant.clone(),
                    in_flight: 9,
                },
                "max_calls_in_flight",
                RETRY_WHEN_BUSY,
            ),
        ] {
            let message = refusal.to_string();
            assert!(message.contains(key), "{message}");
            assert!(message.contains("\"acme\""), "{message}");
            assert!(message.contains("retry"), "{message}");
            assert_eq!(refusal.retry_after(), retry);
        }
    }
}
