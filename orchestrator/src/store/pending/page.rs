//! A page of a tenant's pending calls, each checked against its job,
//! what no longer waits dropped as it is met.

use std::collections::HashMap;

use crate::job::{JobStatus, now_ms};

use super::super::approvals::{DECIDED, decided_field};
use super::*;

impl JobStore {
    /// The tenant's calls waiting for a decision that the caller
    /// `wants` (a role sees approvals, verdicts or both), oldest first, at
    /// most `limit`, after `cursor`; and where the next page starts, if
    /// one may follow. Entries of calls decided, expired, or of ended jobs
    /// are dropped from the indexes as they are met; at most `10 x limit`
    /// entries are read a page, so a page is full unless the caller wants
    /// few of them.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn pending(
        &self,
        tenant: &str,
        cursor: Option<&PendingCursor>,
        limit: usize,
        wants: impl Fn(&Pending) -> bool,
    ) -> Result<(Vec<Pending>, Option<PendingCursor>), Error> {
        let from = cursor.map_or(0, |c| c.held_at_ms);
        let read = limit.saturating_mul(10).max(1);
        let entries: Vec<(String, u64)> = redis::cmd("ZRANGE")
            .arg(self.keys.tenant_approvals(tenant))
            .arg(from)
            .arg("+inf")
            .arg("BYSCORE")
            .arg("LIMIT")
            .arg(0)
            .arg(read + 1)
            .arg("WITHSCORES")
            .query_async(&mut self.conn())
            .await?;
        let after = |(member, score): &(String, u64)| {
            cursor.is_none_or(|c| (*score, member.as_str()) > (c.held_at_ms, c.member.as_str()))
        };
        let more = entries.len() > read;
        let entries: Vec<(String, u64)> = entries.into_iter().filter(after).take(read).collect();
        let now = now_ms();
        let mut page = Vec::new();
        let mut last = None;
        let mut stale = Vec::new();
        // Checked a page's worth at a time, each batch in one round trip.
        'entries: for batch in entries.chunks(limit.max(1)) {
            let checked = self.still_pending(batch, now).await?;
            for (entry, pending) in batch.iter().zip(checked) {
                last = Some(PendingCursor {
                    held_at_ms: entry.1,
                    member: entry.0.clone(),
                });
                match pending {
                    Some(pending) if wants(&pending) => page.push(pending),
                    Some(_) => {}
                    None => stale.push(entry.clone()),
                }
                if page.len() == limit {
                    break 'entries;
                }
            }
        }
        if !stale.is_empty() {
            self.forget(tenant, &stale).await?;
        }
        let next = if page.len() == limit || more {
            last
        } else {
            None
        };
        Ok((page, next))
    }

    /// The calls that index `entries` name, each if it still waits for a
    /// decision, read in one round trip.
    async fn still_pending(
        &self,
        entries: &[(String, u64)],
        now: u64,
    ) -> Result<Vec<Option<Pending>>, Error> {
        let named: Vec<Option<(JobId, &str)>> = entries
            .iter()
            .map(|(member, _)| {
                member
                    .split_once('/')
                    .and_then(|(job, call)| Some((JobId::parse(job)?, call)))
            })
            .collect();
        let mut reads = redis::pipe();
        for (job_id, _) in named.iter().flatten() {
            reads
                .hget(self.keys.job(job_id), "status")
                .hgetall(self.keys.job_approvals(job_id));
        }
        let replies: Vec<redis::Value> = reads.query_async(&mut self.conn()).await?;
        let mut replies = replies.into_iter();
        let mut checked = Vec::with_capacity(entries.len());
        for named in named {
            let Some((job_id, call_id)) = named else {
                checked.push(None);
                continue;
            };
            let (Some(status), Some(fields)) = (replies.next(), replies.next()) else {
                checked.push(None);
                continue;
            };
            // A key of another type (not this store's) is not pending.
            let status: Option<String> = redis::from_redis_value(status).ok().flatten();
            let fields: HashMap<String, String> =
                redis::from_redis_value(fields).unwrap_or_default();
            checked.push(pending_call(job_id, call_id, status, &fields, now));
        }
        Ok(checked)
    }
}

/// The call `call_id` of `job_id`, if it still waits for a decision, from
/// the job's `status` and approvals hash `fields`.
fn pending_call(
    job_id: JobId,
    call_id: &str,
    status: Option<String>,
    fields: &HashMap<String, String>,
    now: u64,
) -> Option<Pending> {
    let ended = status
        .and_then(|s| s.parse::<JobStatus>().ok())
        .is_none_or(JobStatus::is_final);
    if ended {
        return None;
    }
    // A job holds few calls: its requests are read whole. A call may have
    // been held more than once (approved, then its outcome unknown): the
    // hold that waits is the one pending.
    let request = fields.iter().find_map(|(key, text)| {
        if key.starts_with(DECIDED) {
            return None;
        }
        let request: ApprovalRequest = serde_json::from_str(text).ok()?;
        (request.call_id == call_id
            && !fields.contains_key(&decided_field(key))
            && request.expires_at_ms > now)
            .then_some(request)
    })?;
    Some(Pending { job_id, request })
}
