//! The slow heal: a few entries at a time checked against their jobs.

use super::*;

/// Entries the heal checks against their jobs per step: with a step every
/// 5 s, 10,000 pending calls are all checked within 17 minutes, at the
/// cost of 100 commands a step however many wait.
const HEAL_PAGE: usize = 50;

impl JobStore {
    /// One step of the slow heal: checks the next 50 entries (`HEAL_PAGE`) of
    /// the tenants' indexes from `at` against their jobs, dropping those
    /// whose call no longer waits (a crash between a call's end and its
    /// entry's removal left them). Returns where the next step goes on:
    /// tenant after tenant in name order, and round again from the first
    /// (`None`).
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn heal_pending(
        &self,
        at: Option<HealPosition>,
    ) -> Result<Option<HealPosition>, Error> {
        let at = match at {
            Some(at) => at,
            None => match self.approval_tenants().await?.into_iter().next() {
                Some(tenant) => HealPosition {
                    tenant,
                    cursor: None,
                },
                None => return Ok(None),
            },
        };
        let (_, next) = self
            .pending(&at.tenant, at.cursor.as_ref(), HEAL_PAGE, |_| true)
            .await?;
        if let Some(cursor) = next {
            return Ok(Some(HealPosition {
                tenant: at.tenant,
                cursor: Some(cursor),
            }));
        }
        let tenants = self.approval_tenants().await?;
        Ok(tenants
            .into_iter()
            .find(|tenant| *tenant > at.tenant)
            .map(|tenant| HealPosition {
                tenant,
                cursor: None,
            }))
    }
}
