//! The tenants' counts of their jobs by status (decision 0051), against a
//! real Redis: each verb that changes a job's status counts it, once and
//! in order, for the tenant and the job's submitter; a finished job counts
//! until its keys expire; and what a lost count step leaves behind is put
//! right by counting the jobs again from their records.

use std::time::Duration;

use toolfleet_orchestrator::job::{Ending, JobErrorCode, JobSpec, JobStatus};
use toolfleet_orchestrator::live::Live;
use toolfleet_orchestrator::store::{Change, JobIndex, JobStore, Unstored};
use toolfleet_proto::JobId;
use toolfleet_proto::names::RedisKeys;
use toolfleet_tests::{NatsServer, RedisServer, wait_until};

use super::{held, lease, spec};

use JobStatus::{Cancelled, Failed, Queued, Running, Succeeded, WaitingForApproval};

/// How long the test's store keeps a finished job.
const RETENTION: Duration = Duration::from_secs(3);

/// The counts of `index` that are not 0, in status order.
async fn counts(store: &JobStore, index: JobIndex<'_>) -> anyhow::Result<Vec<(JobStatus, u64)>> {
    let counts = store.counts(index).await?;
    let statuses: Vec<JobStatus> = counts.by_status.iter().map(|(s, _)| *s).collect();
    assert_eq!(statuses, JobStatus::ALL, "every status, in order");
    Ok(counts
        .by_status
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .collect())
}

/// A job `submitter` submitted.
fn by(submitter: Option<&str>) -> JobSpec {
    JobSpec {
        submitter: submitter.map(str::to_owned),
        ..spec()
    }
}

/// Every change of status a job can go through, each counted once, for
/// its tenant and its submitter: submitted, run, parked, run again,
/// ended; cancelled while queued; failed; and a late or repeated count
/// (another process's, or a retry's) changes nothing, before or after the
/// job's end. Finished jobs count until they expire, with no write.
#[tokio::test]
async fn each_change_of_status_is_counted_once_for_the_tenant_and_the_submitter()
-> anyhow::Result<()> {
    let (redis, nats) = (RedisServer::start().await?, NatsServer::start().await?);
    let store = JobStore::new(
        redis.connection().await?.into(),
        Live::new(nats.client().await?),
        RedisKeys::default(),
        RETENTION,
        Duration::from_secs(60),
    );
    let tenant = JobIndex::Tenant("default");
    let ana = JobIndex::Submitter {
        tenant: "default",
        submitter: "Ana",
    };
    let bo = JobIndex::Submitter {
        tenant: "default",
        submitter: "token:00000000000000bb",
    };
    assert_eq!(counts(&store, tenant).await?, []);

    let (a, _) = store.submit(&by(Some("Ana")), None, None).await?;
    let (b, _) = store
        .submit(&by(Some("token:00000000000000bb")), None, None)
        .await?;
    let (c, _) = store.submit(&by(None), None, None).await?;
    assert_eq!(counts(&store, tenant).await?, [(Queued, 3)]);
    assert_eq!(counts(&store, ana).await?, [(Queued, 1)]);
    assert_eq!(counts(&store, bo).await?, [(Queued, 1)]);

    // A: run, park, run again, end.
    let run = lease(&store, &a, "r1", Duration::from_secs(60)).await?;
    assert_eq!(run.submitter.as_deref(), Some("Ana"), "read with the lease");
    assert_eq!(counts(&store, tenant).await?, [(Queued, 2), (Running, 1)]);
    assert_eq!(counts(&store, ana).await?, [(Running, 1)]);
    let day = Duration::from_secs(86_400);
    store
        .hold(&run, "default", &[held("pay", "transfer", day)])
        .await?;
    store.park(&run, &[("pay", "pay")], u64::MAX / 4).await?;
    assert_eq!(
        counts(&store, tenant).await?,
        [(Queued, 2), (WaitingForApproval, 1)]
    );
    assert_eq!(counts(&store, ana).await?, [(WaitingForApproval, 1)]);
    // The run's own count, late (its park was counted after it), or again.
    let parked = store.get(&a).await?.expect("the job");
    let late = Change::Live {
        status: Running,
        events: parked.events - 1,
    };
    assert!(!store.count(&a, Some("Ana"), late).await?);
    assert!(!store.recount(&parked).await?, "the same change again");
    assert_eq!(counts(&store, ana).await?, [(WaitingForApproval, 1)]);
    let resumed = lease(&store, &a, "r2", Duration::from_secs(60)).await?;
    assert!(resumed.resumed);
    assert_eq!(counts(&store, ana).await?, [(Running, 1)]);
    store
        .finish(
            &resumed,
            &Ending::Succeeded("done".into()),
            Unstored::Nothing,
            None,
        )
        .await?;
    assert_eq!(counts(&store, tenant).await?, [(Queued, 2), (Succeeded, 1)]);
    assert_eq!(counts(&store, ana).await?, [(Succeeded, 1)]);
    // After its end, a late change of its run, or another end, counts
    // nothing.
    let ended = store.get(&a).await?.expect("the job");
    for change in [
        Change::Live {
            status: Running,
            events: ended.events + 10,
        },
        Change::Ended {
            status: Failed,
            expires_at_ms: u64::MAX / 4,
        },
    ] {
        assert!(!store.count(&a, Some("Ana"), change).await?, "{change:?}");
    }
    assert!(!store.recount(&ended).await?);

    // B: cancelled while queued, for its submitter too; C: fails.
    store.cancel(&b).await?;
    let run = lease(&store, &c, "r1", Duration::from_secs(60)).await?;
    store
        .finish(
            &run,
            &Ending::failed(JobErrorCode::ModelRejected, "no"),
            Unstored::Nothing,
            None,
        )
        .await?;
    let finished = [(Succeeded, 1), (Failed, 1), (Cancelled, 1)];
    assert_eq!(counts(&store, tenant).await?, finished);
    assert_eq!(counts(&store, bo).await?, [(Cancelled, 1)]);
    assert_eq!(counts(&store, ana).await?, [(Succeeded, 1)]);
    let nobody = JobIndex::Submitter {
        tenant: "default",
        submitter: "Cy",
    };
    assert_eq!(counts(&store, nobody).await?, []);
    assert_eq!(
        counts(&store, JobIndex::Tenant("other")).await?,
        [],
        "another tenant's"
    );

    // They expire with their jobs, and nothing is left counted.
    wait_until(
        "the finished jobs to expire",
        Duration::from_secs(15),
        || {
            let store = store.clone();
            async move { counts(&store, tenant).await.is_ok_and(|c| c.is_empty()) }
        },
    )
    .await?;
    assert_eq!(counts(&store, ana).await?, []);
    for job in [&a, &b, &c] {
        assert!(store.get(job).await?.is_none(), "{job} expired too");
    }
    Ok(())
}

/// What the tenant's counts hold if every count step a crash could lose
/// was lost (here, all of them: the counts emptied): counting each job
/// again from its record, as the sweeper does with the jobs it looks at,
/// gives exactly the counts the steps would have given; and a job gone
/// from Redis is counted no more.
#[tokio::test]
async fn counting_the_records_again_repairs_what_lost_steps_left() -> anyhow::Result<()> {
    let (redis, nats) = (RedisServer::start().await?, NatsServer::start().await?);
    let store = super::store(&redis, &nats).await?;
    let tenant = JobIndex::Tenant("default");
    let mut jobs: Vec<JobId> = Vec::new();
    for submitter in [Some("Ana"), Some("Ana"), None, Some("Bo")] {
        jobs.push(store.submit(&by(submitter), None, None).await?.0);
    }
    lease(&store, &jobs[1], "r", Duration::from_secs(60)).await?;
    let ended = lease(&store, &jobs[2], "r", Duration::from_secs(60)).await?;
    store
        .finish(&ended, &Ending::Cancelled, Unstored::Nothing, None)
        .await?;
    let before = (
        counts(&store, tenant).await?,
        counts(
            &store,
            JobIndex::Submitter {
                tenant: "default",
                submitter: "Ana",
            },
        )
        .await?,
    );
    assert_eq!(before.0, [(Queued, 2), (Running, 1), (Cancelled, 1)]);
    assert_eq!(before.1, [(Queued, 1), (Running, 1)]);

    let keys = RedisKeys::default();
    let mut raw = redis.connection().await?;
    let mut lost = redis::cmd("DEL");
    lost.arg(keys.tenant_job_counts("default"))
        .arg(keys.tenant_live_jobs("default"));
    for status in [Succeeded, Failed, Cancelled] {
        lost.arg(keys.ended_jobs("default", None, status));
    }
    let _: i64 = lost.query_async(&mut raw).await?;
    assert_eq!(counts(&store, tenant).await?, []);
    for job in &jobs {
        let record = store.get(job).await?.expect("stored");
        assert!(store.recount(&record).await?, "{job}");
    }
    let after = (
        counts(&store, tenant).await?,
        counts(
            &store,
            JobIndex::Submitter {
                tenant: "default",
                submitter: "Ana",
            },
        )
        .await?,
    );
    assert_eq!(after, before);

    // A job whose keys vanished (Redis lost them): gone from the counts.
    let _: i64 = redis::cmd("DEL")
        .arg(keys.job(&jobs[0]))
        .query_async(&mut raw)
        .await?;
    assert!(store.count(&jobs[0], None, Change::Gone).await?);
    assert_eq!(
        counts(&store, tenant).await?,
        [(Queued, 1), (Running, 1), (Cancelled, 1)]
    );
    Ok(())
}
