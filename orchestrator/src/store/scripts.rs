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
//! `$CANCELLED`, `$FAILED`, `$WAITING` (for approval), and `$ENDED` for "the
//! job has ended").

use redis::Script;

use crate::job::JobStatus;

/// A script with the status placeholders filled in.
pub(super) fn script(template: &str) -> Script {
    Script::new(&fill(template))
}

/// The placeholders a template may hold.
const PLACEHOLDERS: [&str; 6] = [
    "$ENDED",
    "$QUEUED",
    "$RUNNING",
    "$FAILED",
    "$CANCELLED",
    "$WAITING",
];

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
        JobStatus::WaitingForApproval.as_str(),
    ];
    PLACEHOLDERS
        .into_iter()
        .zip(values)
        .fold(template.to_owned(), |text, (placeholder, value)| {
            text.replace(placeholder, value)
        })
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// The source `script` runs, as redis-rs shows it: `Script` exposes its
    /// code only through `Debug`. Asserts that the source is there and that
    /// no placeholder (`$` and capitals) was left unfilled, naming the
    /// script.
    pub(in crate::store) fn assert_filled(name: &str, script: &Script) -> String {
        let shown = format!("{script:?}");
        assert!(
            shown.contains("redis.call"),
            "{name}: redis-rs no longer shows a script's source: {shown:.200}"
        );
        let unfilled: Vec<&str> = shown
            .match_indices('$')
            .map(|(at, _)| {
                let end = shown[at + 1..]
                    .find(|c: char| !(c.is_ascii_uppercase() || c == '_'))
                    .map_or(shown.len(), |n| at + 1 + n);
                &shown[at..end]
            })
            .filter(|placeholder| placeholder.len() > 1)
            .collect();
        assert!(unfilled.is_empty(), "{name} left {unfilled:?} unfilled");
        shown
    }

    /// `$ENDED` becomes a condition on a Lua `status`: a script whose
    /// `status` is not read before it would test a nil global, never true,
    /// and so write to a finished job. Asserts the script reads the job's
    /// status into a local first.
    pub(in crate::store) fn assert_ended_reads_status(name: &str, shown: &str) {
        let condition = fill("$ENDED");
        let tested = shown.find(&condition).unwrap_or_else(|| {
            panic!("{name} does not test whether the job ended");
        });
        let read = shown.find("local status =").unwrap_or_else(|| {
            panic!("{name} does not read the job's status");
        });
        assert!(read < tested, "{name} tests the status before reading it");
    }

    #[test]
    fn every_placeholder_is_filled_with_the_statuses_spelling() {
        let filled = fill(&PLACEHOLDERS.join(" | "));
        assert_eq!(
            filled,
            "status == 'succeeded' or status == 'failed' or status == 'cancelled' \
             | queued | running | failed | cancelled | waiting_for_approval"
        );
    }

    /// A misspelt placeholder would reach Redis as Lua that never matches a
    /// status: every `$NAME` in the store's scripts is one `fill` knows.
    #[test]
    fn the_stores_scripts_use_only_known_placeholders() {
        let sources = [
            include_str!("submit.rs"),
            include_str!("lease.rs"),
            include_str!("commit/write.rs"),
            include_str!("cancel.rs"),
            include_str!("quota.rs"),
            include_str!("read.rs"),
            include_str!("index.rs"),
            include_str!("catalog.rs"),
            include_str!("approvals.rs"),
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
        assert!(!fill(include_str!("commit/write.rs")).contains("$ENDED"));
    }

    #[test]
    fn a_built_script_runs_its_template_filled() {
        let built = script("return redis.call('HSET', KEYS[1], 'status', '$RUNNING')");
        let shown = assert_filled("built", &built);
        assert!(shown.contains("'status', 'running'"), "{shown}");
    }

    /// The check the store's modules run on their scripts catches a
    /// script built without `script()`.
    #[test]
    #[should_panic(expected = "unbuilt left [\"$QUEUED\"] unfilled")]
    fn a_script_not_built_from_its_template_is_caught() {
        assert_filled(
            "unbuilt",
            &Script::new("return redis.call('GET', '$QUEUED')"),
        );
    }
}
