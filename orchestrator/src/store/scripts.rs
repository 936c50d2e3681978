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
    let ended = JobStatus::ALL
        .into_iter()
        .filter(|s| s.is_final())
        .map(|s| format!("status == '{s}'"))
        .collect::<Vec<_>>()
        .join(" or ");
    Script::new(
        &template
            .replace("$ENDED", &ended)
            .replace("$QUEUED", JobStatus::Queued.as_str())
            .replace("$RUNNING", JobStatus::Running.as_str())
            .replace("$FAILED", JobStatus::Failed.as_str())
            .replace("$CANCELLED", JobStatus::Cancelled.as_str()),
    )
}
