//! What the release before really wrote, read and finished by this one
//! (issue 56, decision 0059): golden Redis records and NATS messages of
//! format 1, in `tests/fixtures/previous-release/`, which that release's
//! own build wrote (its README says how). Four jobs, as an upgrade finds
//! them:
//! - `held`: parked, its one call of `echo` held for an approval;
//! - `finished`: two rounds, succeeded;
//! - `stored`: its call's result in the ledger, the round never committed
//!   (its orchestrator died);
//! - `queued`: its call's message in the queue, never taken.

use std::time::{SystemTime, UNIX_EPOCH};

use async_nats::jetstream;
use toolfleet_proto::v1;
use toolfleet_tests::fleet::{
    ApiClient, Fleet, approval, events, pending_approvals, test_fleet, wait_finished,
};
use toolfleet_tests::{repo_root, snapshot};

/// Fast takeover of the jobs whose orchestrator is gone.
const FAST_TAKEOVER: &[(&str, &str)] = &[
    ("TOOLFLEET_RUNNER__JOB_ACK_WAIT", "2s"),
    ("TOOLFLEET_RUNNER__LEASE_TTL", "1s"),
];

/// The job `job_id` once finished: its status and answer.
async fn outcome(api: &ApiClient, job_id: &str) -> anyhow::Result<(v1::JobStatus, String)> {
    let job = wait_finished(api, job_id).await?;
    Ok((job.status(), job.output_text))
}

#[tokio::test]
async fn what_the_release_before_wrote_is_read_and_finished_by_this_one() -> anyhow::Result<()> {
    let dir = repo_root().join("tests/fixtures/previous-release");
    let now_ms = u64::try_from(SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis())?;
    let scenarios = snapshot::read(&dir, "scenarios.json", (0, 0))?;
    let taken_ms = scenarios["captured_at_ms"]
        .as_u64()
        .expect("captured_at_ms");
    let in_time = (taken_ms, now_ms);
    let job = |name: &str| scenarios[name].as_str().expect(name).to_owned();
    let (held, stored, queued) = (job("held"), job("stored"), job("queued"));
    let finished = scenarios["finished"]["job_id"].as_str().expect("finished");

    // Redis as the release before left it; then this release's fleet, and
    // the messages that release left on NATS.
    let mut fleet = Fleet::start(test_fleet(1)).await?;
    let mut redis = fleet.redis.connection().await?;
    snapshot::restore_redis(&mut redis, &snapshot::read(&dir, "redis.json", in_time)?).await?;
    fleet.spawn_orchestrator(FAST_TAKEOVER).await?;
    let mut api = fleet.api(0).await?;
    let js = jetstream::new(fleet.client.clone());
    let messages = snapshot::read(&dir, "nats.json", in_time)?;
    // The registry's entries are the old workers' heartbeats: long dead.
    let published = snapshot::restore_nats(&js, &messages, |stream| !stream.starts_with("KV_"));
    assert_eq!(published.await?, 3, "a call and two jobs' messages");

    // A finished job reads as it ended, events and all.
    assert_eq!(
        outcome(&api, finished).await?,
        (v1::JobStatus::Succeeded, "one done".to_owned())
    );
    let seen = events(&api, finished).await?;
    let results = seen.iter().filter(|(kind, _)| kind == "tool_call_result");
    assert_eq!(results.count(), 2, "{seen:?}");

    // A call held for an approval: listed, approved, run once.
    let pending = pending_approvals(&api).await?;
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(
        (pending[0].job_id.as_str(), pending[0].tool_version.as_str()),
        (held.as_str(), "")
    );
    api.decide_call(approval(&held, "say")).await?;
    assert_eq!(
        outcome(&api, &held).await?,
        (v1::JobStatus::Succeeded, "hi".to_owned())
    );

    // A result the release before stored is the answer: never run again.
    assert_eq!(
        outcome(&api, &stored).await?,
        (v1::JobStatus::Succeeded, "counted".to_owned())
    );
    assert_eq!(fleet.counter("golden:stored").await?, 1);

    // A call message the release before queued runs once, here.
    assert_eq!(
        outcome(&api, &queued).await?,
        (v1::JobStatus::Succeeded, "queued done".to_owned())
    );
    assert_eq!(fleet.counter("golden:queued").await?, 1);
    Ok(())
}
