//! The indexes of jobs: a tenant's jobs, and each of its submitters' jobs,
//! newest first, paged by a cursor ([`JobStore::list`]); and the unfinished
//! jobs the sweeper looks at.

use redis::AsyncCommands;

use crate::job::{JobId, JobRecord};

use super::*;

/// Whose jobs a page of `ListJobs` reads (a tenant's index, or one of its
/// submitters'), and whose jobs [`JobStore::counts`] counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobIndex<'a> {
    /// Every job of the tenant.
    Tenant(&'a str),
    /// The jobs of the tenant that `submitter` submitted
    /// (`JobSpec::submitter`), written with the tenant's entries
    /// (decision 0049).
    Submitter {
        /// The tenant.
        tenant: &'a str,
        /// Its submitter.
        submitter: &'a str,
    },
}

impl JobStore {
    /// A page of the jobs in `index`, newest first: those created in
    /// `window` and submitted before `before` (a cursor from an earlier
    /// page; `None` starts at the newest) that `keep` accepts, at most
    /// `limit`, reading at most `scan` index entries. Returns the jobs and
    /// the cursor of the next page, `None` at the end. Entries whose job has
    /// expired are dropped from the index.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`], or [`Error::Corrupt`] for a record that does not
    /// parse.
    pub(crate) async fn list(
        &self,
        index: JobIndex<'_>,
        page: Page,
        keep: impl Fn(&JobRecord) -> bool,
    ) -> Result<(Vec<JobRecord>, Option<ListCursor>), Error> {
        let index = match index {
            JobIndex::Tenant(tenant) => self.keys.tenant_jobs(tenant),
            JobIndex::Submitter { tenant, submitter } => {
                self.keys.submitter_jobs(tenant, submitter)
            }
        };
        let Page {
            before,
            window,
            limit,
            scan,
        } = page;
        let mut jobs = Vec::new();
        let mut cursor = before;
        let mut scanned = 0;
        while jobs.len() < limit && scanned < scan {
            let batch = (scan - scanned).min(100);
            let (max, min) = score_range(cursor.as_ref(), window);
            // Entries of the cursor's own millisecond are read again and
            // skipped by id below, so jobs submitted in one ms are not lost.
            let entries: Vec<(String, u64)> = read_with_retry(|| async {
                redis::cmd("ZREVRANGEBYSCORE")
                    .arg(&index)
                    .arg(&max)
                    .arg(&min)
                    .arg("WITHSCORES")
                    .arg("LIMIT")
                    .arg(0)
                    .arg(batch + 64)
                    .query_async(&mut self.conn())
                    .await
            })
            .await?;
            let fresh: Vec<(JobId, u64)> = entries
                .into_iter()
                // An entry that is not a job id was not written here:
                // skipped, as an expired job's is.
                .filter_map(|(id, ms)| Some((JobId::parse(&id)?, ms)))
                .filter(|(id, ms)| cursor.as_ref().is_none_or(|c| c.is_after(id, *ms)))
                .take(batch)
                .collect();
            if fresh.is_empty() {
                return Ok((jobs, None));
            }
            let mut rest = &fresh[..];
            while !rest.is_empty() && jobs.len() < limit {
                // As many records in one round trip as the page still
                // needs: a page with no filter reads no job it does not
                // list, one with a filter a few round trips.
                let (chunk, after) = rest.split_at((limit - jobs.len()).min(rest.len()));
                rest = after;
                let ids: Vec<JobId> = chunk.iter().map(|(id, _)| id.clone()).collect();
                let mut expired = Vec::new();
                for ((job_id, submitted_ms), record) in chunk.iter().zip(self.records(&ids).await?)
                {
                    scanned += 1;
                    cursor = Some(ListCursor {
                        submitted_ms: *submitted_ms,
                        job_id: job_id.clone(),
                    });
                    match record {
                        Some(record) if keep(&record) => jobs.push(record),
                        Some(_) => {}
                        None => expired.push(job_id.as_str()),
                    }
                }
                if !expired.is_empty() {
                    let _: i64 = self.conn().zrem(&index, expired).await?;
                }
            }
        }
        Ok((jobs, cursor))
    }

    /// Unfinished jobs submitted before `before_ms` (at most `limit`), oldest
    /// first: the sweeper's candidates, from every shard of the index.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn unfinished_before(
        &self,
        before_ms: u64,
        limit: usize,
    ) -> Result<Vec<JobId>, Error> {
        let mut oldest: Vec<(String, u64)> = Vec::new();
        // One shard at a time: a sweep runs every 30 s, and each shard may
        // live on another node of a cluster.
        for shard in self.keys.unfinished_shards() {
            let found: Vec<(String, u64)> = redis::cmd("ZRANGEBYSCORE")
                .arg(shard)
                .arg(0)
                .arg(before_ms)
                .arg("WITHSCORES")
                .arg("LIMIT")
                .arg(0)
                .arg(limit)
                .query_async(&mut self.conn())
                .await?;
            oldest.extend(found);
        }
        oldest.sort_by_key(|(_, submitted)| *submitted);
        oldest.truncate(limit);
        // An entry that is not a job id was not written here: nothing to
        // sweep.
        Ok(oldest
            .into_iter()
            .filter_map(|(job_id, _)| JobId::parse(&job_id))
            .collect())
    }
}

/// The latest submission time a job id can carry (48 bits of milliseconds,
/// the year 10889).
pub(crate) const MAX_SUBMITTED_MS: u64 = 0xffff_ffff_ffff;

/// What a page of [`JobStore::list`] reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Page {
    /// Where it starts: after the previous page's last job (`None`: at the
    /// newest).
    pub(crate) before: Option<ListCursor>,
    /// When its jobs were created.
    pub(crate) window: CreatedWindow,
    /// Jobs on the page, at most.
    pub(crate) limit: usize,
    /// Index entries it reads, at most.
    pub(crate) scan: usize,
}

/// When the jobs a page lists were created: from `after_ms` (inclusive)
/// to `before_ms` (exclusive), Unix ms; `None` is no bound.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CreatedWindow {
    /// The earliest creation time listed.
    pub(crate) after_ms: Option<u64>,
    /// The first creation time past the window.
    pub(crate) before_ms: Option<u64>,
}

/// The scores `ZREVRANGEBYSCORE` reads of an index (max, then min) for the
/// entries after `cursor` (from its own millisecond, which the caller
/// skips by id) that were created in `window`.
fn score_range(cursor: Option<&ListCursor>, window: CreatedWindow) -> (String, String) {
    let below = [
        cursor.map(|c| c.submitted_ms.saturating_add(1)),
        window.before_ms,
    ]
    .into_iter()
    .flatten()
    .min();
    let max = below.map_or_else(|| "+inf".to_owned(), |ms| format!("({ms}"));
    let min = window
        .after_ms
        .map_or_else(|| "-inf".to_owned(), |ms| ms.to_string());
    (max, min)
}

/// Where a page of `JobStore::list` ended: the last job it read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListCursor {
    /// When that job was submitted (Unix ms).
    pub submitted_ms: u64,
    /// Its id.
    pub job_id: JobId,
}

impl ListCursor {
    /// Whether the entry (`job_id`, submitted at `ms`) comes after the
    /// cursor in newest-first order (ties ordered by id, descending).
    fn is_after(&self, job_id: &JobId, ms: u64) -> bool {
        ms < self.submitted_ms || (ms == self.submitted_ms && *job_id < self.job_id)
    }

    /// The page token a client sends back: `<ms>.<job id>`.
    pub(crate) fn to_token(&self) -> String {
        format!("{}.{}", self.submitted_ms, self.job_id)
    }

    /// A page token read back; `None` when it is not one this server made.
    pub(crate) fn from_token(token: &str) -> Option<Self> {
        let (ms_text, job_id) = token.split_once('.')?;
        let ms: u64 = ms_text.parse().ok()?;
        // Only what `to_token` writes: no sign, no leading zero, and a time
        // a job id can carry (48 bits of milliseconds).
        if ms.to_string() != ms_text || ms > MAX_SUBMITTED_MS {
            return None;
        }
        Some(Self {
            submitted_ms: ms,
            job_id: JobId::parse(job_id)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cursor(ms: u64, job: &JobId) -> ListCursor {
        ListCursor {
            submitted_ms: ms,
            job_id: job.clone(),
        }
    }

    /// The scores a page reads: below the cursor's next millisecond and
    /// the window's end, whichever is lower, and from the window's start.
    #[test]
    fn a_page_reads_the_scores_of_its_window_after_its_cursor() {
        let job = JobId::new("acme", 5, 6);
        let window = |after_ms, before_ms| CreatedWindow {
            after_ms,
            before_ms,
        };
        let at = cursor(100, &job);
        let rows = [
            (None, window(None, None), ("+inf", "-inf")),
            (Some(&at), window(None, None), ("(101", "-inf")),
            (None, window(Some(50), None), ("+inf", "50")),
            (None, window(None, Some(80)), ("(80", "-inf")),
            (Some(&at), window(Some(50), Some(80)), ("(80", "50")),
            (Some(&at), window(Some(50), Some(500)), ("(101", "50")),
            (Some(&at), window(None, Some(101)), ("(101", "-inf")),
            (None, window(Some(7), Some(7)), ("(7", "7")),
            (
                Some(&cursor(u64::MAX, &job)),
                window(None, None),
                ("(18446744073709551615", "-inf"),
            ),
        ];
        for (cursor, window, (max, min)) in rows {
            assert_eq!(
                score_range(cursor, window),
                (max.to_owned(), min.to_owned()),
                "{cursor:?} {window:?}"
            );
        }
    }

    #[test]
    fn a_page_token_reads_back_as_its_cursor() {
        let at = cursor(1_700_000_000_123, &JobId::new("acme", 5, 6));
        let token = at.to_token();
        assert_eq!(token, format!("1700000000123.{}", JobId::new("acme", 5, 6)));
        assert_eq!(ListCursor::from_token(&token), Some(at));
    }

    #[test]
    fn a_token_this_server_did_not_make_is_refused() {
        let job = JobId::new("acme", 5, 6);
        for token in [
            String::new(),
            ".".into(),
            job.to_string(),
            format!("12.{job}.x"),
            format!("-1.{job}"),
            format!("99999999999999999999999.{job}"),
            format!("12.{}", "x".repeat(100_000)),
            "12.acme-nothing".into(),
            "12.acme-{0190000000010000000000001234}".into(),
            format!("١٢.{job}"),
            // What no page of this server ends with: a sign, a leading
            // zero, a time no job id carries (whose next millisecond
            // would overflow).
            format!("+12.{job}"),
            format!("012.{job}"),
            format!("{}.{job}", u64::MAX),
            format!("{}.{job}", MAX_SUBMITTED_MS + 1),
        ] {
            assert_eq!(ListCursor::from_token(&token), None, "{token:.80}");
        }
    }

    #[test]
    fn entries_after_a_cursor_are_older_or_of_its_millisecond_and_a_lower_id() {
        let (low, high) = (JobId::new("a", 1, 1), JobId::new("a", 1, 2));
        let at = cursor(100, &high);
        assert!(at.is_after(&high, 99), "older");
        assert!(!at.is_after(&high, 101), "newer");
        assert!(at.is_after(&low, 100), "same ms, lower id");
        assert!(!at.is_after(&high, 100), "the cursor's own entry");
        let at = cursor(100, &low);
        assert!(!at.is_after(&high, 100), "same ms, higher id");
    }

    #[test]
    fn every_cursor_reads_back_from_its_token() {
        let legacy = JobId::parse("0190000000010000000000001234").unwrap();
        let jobs = [
            JobId::new("acme", 5, 6),
            JobId::new("a", 0, 0),
            JobId::new("t_1-x", 0xffff_ffff_ffff, u64::MAX),
            legacy,
        ];
        for job in &jobs {
            for ms in [0, 1, 1_700_000_000_123, 0xffff_ffff_ffff] {
                let at = cursor(ms, job);
                assert_eq!(ListCursor::from_token(&at.to_token()), Some(at));
            }
        }
    }

    /// A client's token can be anything: whatever this server did not
    /// make is refused, and nothing in it panics.
    #[test]
    fn a_malformed_token_is_refused() {
        let job = JobId::new("acme", 5, 6);
        for token in [
            format!("12,{job}"),
            format!("12:{job}"),
            format!("12 {job}"),
            format!("12{job}"),
            format!(" 12.{job}"),
            format!("12.{job} "),
            format!("12..{job}"),
            format!(".12.{job}"),
            format!("0x12.{job}"),
            format!("1e3.{job}"),
            format!("1.5.{job}"),
            format!("{}.{job}", u128::from(u64::MAX) + 1),
            format!("{}.{job}", "9".repeat(10_000)),
            "12.".into(),
            format!(".{job}"),
            format!("12.{job}\0"),
            format!("12.{}", job.to_uppercase()),
            "\u{0}.\u{0}".into(),
            "\u{fffd}\u{fffd}.\u{202e}".into(),
            "🦀.🦀".into(),
        ] {
            assert_eq!(ListCursor::from_token(&token), None, "{token:.80}");
        }
    }

    /// Paging by cursor loses and repeats nothing: in the index's order
    /// (newest first, ties by id descending, as `ZREVRANGEBYSCORE` reads
    /// them), the entries after a cursor are exactly those after its own.
    #[test]
    fn the_entries_after_a_cursor_are_exactly_the_rest_of_the_index() {
        let ids: Vec<JobId> = (0..4).map(|n| JobId::new("acme", 9, n)).collect();
        let mut index: Vec<(u64, JobId)> = [100, 50, 0]
            .into_iter()
            .flat_map(|ms| ids.iter().map(move |id| (ms, id.clone())))
            .collect();
        // Redis's order: by score, then by member bytes, both descending.
        index.sort_by(|a, b| {
            b.0.cmp(&a.0)
                .then_with(|| b.1.as_bytes().cmp(a.1.as_bytes()))
        });
        for (at, (ms, id)) in index.iter().enumerate() {
            let page_end = cursor(*ms, id);
            let rest: Vec<&(u64, JobId)> = index
                .iter()
                .filter(|(ms, id)| page_end.is_after(id, *ms))
                .collect();
            let expected: Vec<&(u64, JobId)> = index[at + 1..].iter().collect();
            assert_eq!(rest, expected, "after entry {at}");
        }
    }
}
