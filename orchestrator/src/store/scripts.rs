//! How the job store's Lua scripts are built; each script lives with the
//! verb that runs it (`submit`, `lease`, `commit`, `cancel`, `quota`).
//! Every script touches only keys of one job (one hash tag), or of one
//! tenant, so each is atomic, also on Redis Cluster.
//!
//! Fencing: a runner writes with its lease token `<owner>:<epoch>`. Every
//! runner write first checks that the lease key still holds that token; a
//! zombie replica whose lease expired and was taken over gets `LEASE_LOST`
//! and stops instead of corrupting the job.
//!
//! Each script is hashed once; redis-rs runs it by hash (EVALSHA) and loads
//! it on a cache miss.
//!
//! The scripts spell no event kind, error code or status of their own: event
//! kinds, their data and codes come in as arguments, and statuses are filled
//! in from [`JobStatus`] when a script is built (`$QUEUED`, `$RUNNING`,
//! `$CANCELLED`, `$FAILED`, and `$ENDED` for "the job has ended").

use redis::Script;

use crate::job::JobStatus;

/// A script with the status placeholders filled in.
pub(super) fn script(template: &str) -> Script {
    Script::new(&fill(template))
}

/// The placeholders a template may hold.
const PLACEHOLDERS: [&str; 5] = ["$ENDED", "$QUEUED", "$RUNNING", "$FAILED", "$CANCELLED"];

/// `template` with its placeholders filled in.
fn fill(template: &str) -> String {
    let ended = JobStatus::ALL
        .into_iter()
        .filter(|s| s.is_final())
        .map(|s| format!("status == '{s}'"))
        .collect::<Vec<_>>()
        .join(" or ");
    let values = [
        ended.as_str(),
        JobStatus::Queued.as_str(),
        JobStatus::Running.as_str(),
        JobStatus::Failed.as_str(),
        JobStatus::Cancelled.as_str(),
    ];
    PLACEHOLDERS
        .into_iter()
        .zip(values)
        .fold(template.to_owned(), |text, (placeholder, value)| {
            text.replace(placeholder, value)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_placeholder_is_filled_with_the_statuses_spelling() {
        let filled = fill(&PLACEHOLDERS.join(" | "));
        assert_eq!(
            filled,
            "status == 'succeeded' or status == 'failed' or status == 'cancelled' \
             | queued | running | failed | cancelled"
        );
    }

    /// A misspelt placeholder would reach Redis as Lua that never matches a
    /// status: every `$NAME` in the store's scripts is one `fill` knows.
    #[test]
    fn the_stores_scripts_use_only_known_placeholders() {
        let sources = [
            include_str!("submit.rs"),
            include_str!("lease.rs"),
            include_str!("commit.rs"),
            include_str!("cancel.rs"),
            include_str!("quota.rs"),
            include_str!("read.rs"),
            include_str!("index.rs"),
            include_str!("catalog.rs"),
        ];
        let mut used = 0;
        for source in sources {
            for (at, _) in source.match_indices('$') {
                let name: String = source[at + 1..]
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase() || *c == '_')
                    .collect();
                if name.is_empty() {
                    continue;
                }
                used += 1;
                let placeholder = format!("${name}");
                assert!(
                    PLACEHOLDERS.contains(&placeholder.as_str()),
                    "{placeholder}"
                );
            }
        }
        assert!(used > 0, "the scripts use placeholders");
        assert!(!fill(include_str!("commit.rs")).contains("$ENDED"));
    }
}
