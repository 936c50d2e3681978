//! A fleet of two releases (issue 56): processes of this release side by
//! side with processes that play the release before
//! (`toolfleet_proto::release`: format 1, no pinning), as during an upgrade
//! or a rollback. Every job finishes, no call is lost or run twice, and no
//! call runs on a version of its tool its model was not shown.
//!
//! The golden records and messages the release before really wrote are in
//! `previous_release.rs`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use toolfleet_proto::release::PREVIOUS_RELEASE_ENV;
use toolfleet_proto::v1;
use toolfleet_tests::fleet::{
    ApiClient, Fleet, approval, events, pending_approvals, scripted_job, test_fleet, wait_finished,
};
use toolfleet_tests::wait_until;

/// How long a test waits for the fleet to reach a state.
const WAIT: Duration = Duration::from_secs(60);

/// The environment of a process that plays the release before.
const PREVIOUS: (&str, &str) = (PREVIOUS_RELEASE_ENV, "1");

/// What a process that plays the release before says as it starts.
const PLAYS_PREVIOUS: &str = "playing the release before";

/// Checks that `process` plays the release before: a build without the
/// switch (`--all-features` builds have it) would play this one, and the
/// tests would prove nothing of the release before.
fn plays_previous(process: &toolfleet_tests::ChildProcess) {
    assert!(
        process.log_tail(100_000).contains(PLAYS_PREVIOUS),
        "{} does not play the release before: build with --all-features",
        process.name()
    );
}

/// Fast takeover of a killed orchestrator's jobs.
const FAST_TAKEOVER: [(&str, &str); 3] = [
    ("TOOLFLEET_RUNNER__JOB_ACK_WAIT", "2s"),
    ("TOOLFLEET_RUNNER__LEASE_TTL", "1s"),
    ("TOOLFLEET_RUNNER__DRAIN_TIMEOUT", "1s"),
];

/// An orchestrator's environment: fast takeover, a call whose version is
/// gone retired after 2 s, and the release before when `previous`.
fn orchestrator_env(previous: bool) -> Vec<(&'static str, &'static str)> {
    let mut env = FAST_TAKEOVER.to_vec();
    env.push(("TOOLFLEET_DISPATCH__VERSION_GONE_AFTER", "2s"));
    env.extend(previous.then_some(PREVIOUS));
    env
}

/// Job `n` of `batch`: `rounds` rounds of `increment_counter`, the first
/// with three parallel calls, each call its own counter and taking a
/// little while, so that calls are in flight as processes come and go.
fn counting_job(batch: &str, n: usize, rounds: usize) -> v1::SubmitJobRequest {
    let call = |id: String| {
        json!({"id": id, "name": "increment_counter",
               "arguments": {"key": format!("{batch}:{n}:{id}"), "delay_ms": 400}})
    };
    let mut script: Vec<Value> =
        vec![json!({"tool_calls": [call("a".into()), call("b".into()), call("c".into())]})];
    for round in 1..rounds {
        script.push(json!({"tool_calls": [call(format!("r{round}"))]}));
    }
    script.push(json!({"message": "counted"}));
    scripted_job("count", &Value::Array(script))
}

/// The counters job `n` of `batch` increments.
fn counters(batch: &str, n: usize, rounds: usize) -> Vec<String> {
    let ids = ["a", "b", "c"].map(str::to_owned).into_iter();
    ids.chain((1..rounds).map(|round| format!("r{round}")))
        .map(|id| format!("{batch}:{n}:{id}"))
        .collect()
}

/// Submits `count` counting jobs of `batch` through `api`.
async fn submit(
    api: &ApiClient,
    batch: &str,
    count: usize,
    rounds: usize,
) -> anyhow::Result<Vec<String>> {
    let mut jobs = Vec::new();
    for n in 0..count {
        let request = counting_job(batch, n, rounds);
        jobs.push(api.clone().submit_job(request).await?.into_inner().job_id);
    }
    Ok(jobs)
}

/// Waits until some of `jobs` have had a call answered: work is in flight.
async fn under_way(api: &ApiClient, jobs: &[String]) -> anyhow::Result<()> {
    wait_until("a call of the jobs to be answered", WAIT, || {
        let (api, job_id) = (api.clone(), jobs[jobs.len() / 2].clone());
        async move {
            let seen = events(&api, &job_id).await.ok()?;
            seen.iter()
                .any(|(kind, _)| kind == "tool_call_result")
                .then_some(())
        }
    })
    .await
}

/// Checks that every one of `jobs` of `batch` succeeded and incremented
/// each of its counters exactly once.
async fn all_counted_once(
    fleet: &Fleet,
    api: &ApiClient,
    (batch, jobs, rounds): (&str, &[String], usize),
) -> anyhow::Result<()> {
    for (n, job_id) in jobs.iter().enumerate() {
        let job = wait_finished(api, job_id).await?;
        assert_eq!(
            job.status(),
            v1::JobStatus::Succeeded,
            "{batch} {n}: {job:?}"
        );
        for key in counters(batch, n, rounds) {
            assert_eq!(fleet.counter(&key).await?, 1, "{key}");
        }
    }
    Ok(())
}

/// The `format` field of the hash of job `job_id`, if it has one.
async fn job_format(fleet: &Fleet, job_id: &str) -> anyhow::Result<Option<String>> {
    let key =
        toolfleet_proto::names::RedisKeys::default().job(&toolfleet_tests::fleet::job_id(job_id));
    let mut redis = fleet.redis.connection().await?;
    Ok(redis::cmd("HGET")
        .arg(&key)
        .arg("format")
        .query_async(&mut redis)
        .await?)
}

/// Waits until orchestrator `index` has resumed one of `jobs`.
async fn resumed_by(api: &ApiClient, jobs: &[String], index: usize) -> anyhow::Result<()> {
    let owner = format!("orchestrator-{index}");
    wait_until("the next orchestrator to resume a job", WAIT, || {
        let (api, jobs, owner) = (api.clone(), jobs.to_vec(), owner.clone());
        async move {
            for job_id in jobs {
                let seen = events(&api, &job_id).await.ok()?;
                let resumed = seen.iter().any(|(kind, data)| {
                    kind == "job_resumed"
                        && data["owner"]
                            .as_str()
                            .is_some_and(|o| o.starts_with(&owner))
                });
                if resumed {
                    return Some(());
                }
            }
            None
        }
    })
    .await
}

#[tokio::test]
async fn orchestrators_of_both_releases_resume_each_others_jobs_after_kill_9() -> anyhow::Result<()>
{
    const JOBS: usize = 6;
    const ROUNDS: usize = 4;
    let mut fleet = Fleet::start(test_fleet(2)).await?;
    // An orchestrator of the release before runs the first jobs, and dies.
    let before = fleet.spawn_orchestrator(&orchestrator_env(true)).await?;
    plays_previous(fleet.orchestrator(before));
    fleet
        .wait_for_tools(before, &["increment_counter"], 2)
        .await?;
    let api = fleet.api(before).await?;
    let first = submit(&api, "first", JOBS, ROUNDS).await?;
    assert_eq!(job_format(&fleet, &first[0]).await?, None, "format 1");
    under_way(&api, &first).await?;
    fleet.orchestrator(before).kill();

    // One of this release resumes them, runs more, and dies in turn.
    let now = fleet.spawn_orchestrator(&orchestrator_env(false)).await?;
    let api = fleet.api(now).await?;
    resumed_by(&api, &first, now).await?;
    let second = submit(&api, "second", JOBS, ROUNDS).await?;
    assert_eq!(job_format(&fleet, &second[0]).await?.as_deref(), Some("2"));
    under_way(&api, &second).await?;
    fleet.orchestrator(now).kill();

    // One of the release before again: it reads what this release wrote.
    let again = fleet.spawn_orchestrator(&orchestrator_env(true)).await?;
    plays_previous(fleet.orchestrator(again));
    let api = fleet.api(again).await?;
    resumed_by(&api, &second, again).await?;
    all_counted_once(&fleet, &api, ("first", &first, ROUNDS)).await?;
    all_counted_once(&fleet, &api, ("second", &second, ROUNDS)).await?;
    Ok(())
}

/// One call of `echo`, held for approval, then its answer.
fn held_echo() -> v1::SubmitJobRequest {
    let script = json!([
        {"tool_calls": [{"id": "say", "name": "echo", "arguments": {"text": "hi"}}]},
        {"message": "{{say.data.text}}"}
    ]);
    let mut request = scripted_job("say hi", &script);
    request.require_approval = vec!["echo".to_owned()];
    request
}

#[tokio::test]
async fn a_rollback_to_the_release_before_finishes_every_job_in_flight() -> anyhow::Result<()> {
    const JOBS: usize = 6;
    const ROUNDS: usize = 4;
    let mut fleet = Fleet::start(test_fleet(2)).await?;
    let now = fleet.spawn_orchestrator(&orchestrator_env(false)).await?;
    fleet
        .wait_for_tools(now, &["echo", "increment_counter"], 2)
        .await?;
    let mut api = fleet.api(now).await?;
    // A call held for an approver, pinned, and jobs in flight.
    let held = api.submit_job(held_echo()).await?.into_inner().job_id;
    wait_until("the call to be held", WAIT, || {
        let (mut api, job_id) = (api.clone(), held.clone());
        async move {
            let job = api.get_job(v1::GetJobRequest { job_id }).await.ok()?;
            (job.into_inner().status() == v1::JobStatus::WaitingForApproval).then_some(())
        }
    })
    .await?;
    let jobs = submit(&api, "rollback", JOBS, ROUNDS).await?;
    under_way(&api, &jobs).await?;

    // The rollback rolls each Deployment as an upgrade would: a pod of the
    // release before starts, then one of this release stops.
    for worker in 0..2 {
        let previous = fleet.spawn_worker_with(&[PREVIOUS]).await?;
        plays_previous(fleet.worker(previous));
        fleet.worker(worker).stop(WAIT).await?;
    }
    let before = fleet.spawn_orchestrator(&orchestrator_env(true)).await?;
    plays_previous(fleet.orchestrator(before));
    fleet.orchestrator(now).stop(WAIT).await?;
    let mut api = fleet.api(before).await?;

    // The release before lists the held call this release wrote, and runs
    // it once approved.
    let pending = pending_approvals(&api).await?;
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(pending[0].job_id, held);
    api.decide_call(approval(&held, "say")).await?;
    let job = wait_finished(&api, &held).await?;
    assert_eq!(
        (job.status(), job.output_text.as_str()),
        (v1::JobStatus::Succeeded, "hi")
    );
    all_counted_once(&fleet, &api, ("rollback", &jobs, ROUNDS)).await?;
    Ok(())
}

/// The environment of a worker of this release that serves a second
/// version of `increment_counter` (its effects, hence its contract,
/// change, as a new schema's would).
const SECOND_COUNTER: (&str, &str) = (
    "TOOLFLEET_RUNTIME__TOOL_EFFECTS__INCREMENT_COUNTER",
    "idempotent",
);

#[tokio::test]
async fn workers_roll_from_the_release_before_under_load_with_a_schema_change() -> anyhow::Result<()>
{
    const ROUNDS: usize = 2;
    let mut fleet = Fleet::start(test_fleet(0)).await?;
    for _ in 0..3 {
        let previous = fleet.spawn_worker_with(&[PREVIOUS]).await?;
        plays_previous(fleet.worker(previous));
    }
    fleet.spawn_orchestrator(&orchestrator_env(false)).await?;
    fleet.spawn_orchestrator(&orchestrator_env(false)).await?;
    fleet.wait_for_tools(0, &["increment_counter"], 3).await?;
    let api = fleet.api(0).await?;
    let old = api
        .clone()
        .list_tools(v1::ListToolsRequest::default())
        .await?
        .into_inner()
        .tools
        .into_iter()
        .find(|tool| tool.name == "increment_counter")
        .map(|tool| tool.contract_hash)
        .expect("increment_counter");
    // Jobs come one every 100 ms while the workers roll, one pod at a
    // time, to this release and a new schema of `increment_counter`, and
    // for a while after.
    // The submitter stops at `stop_at` jobs, set once the roll is over.
    let submitted = std::sync::Arc::new(AtomicUsize::new(0));
    let stop_at = std::sync::Arc::new(AtomicUsize::new(usize::MAX));
    let submitter = {
        let (api, submitted, stop_at) = (api.clone(), submitted.clone(), stop_at.clone());
        tokio::spawn(async move {
            let mut jobs = Vec::new();
            while jobs.len() < stop_at.load(Ordering::SeqCst) {
                let n = jobs.len();
                let job = api
                    .clone()
                    .submit_job(counting_job("roll", n, ROUNDS))
                    .await;
                jobs.push(job.map(|r| r.into_inner().job_id));
                submitted.store(jobs.len(), Ordering::SeqCst);
                // The load's pace, not a wait for anything.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            jobs
        })
    };
    // The roll's pace: a few jobs come before it and between its pods, as
    // minReadySeconds spaces them (by jobs submitted, not by the clock).
    let jobs_submitted = |more: usize| {
        let target = submitted.load(Ordering::SeqCst) + more;
        let submitted = submitted.clone();
        wait_until("more jobs to be submitted", WAIT, move || {
            let done = submitted.load(Ordering::SeqCst) >= target;
            async move { done.then_some(()) }
        })
    };
    jobs_submitted(3).await?;
    for old in 0..3 {
        fleet.spawn_worker_with(&[SECOND_COUNTER]).await?;
        fleet.worker(old).stop(WAIT).await?;
        jobs_submitted(4).await?;
    }
    // Once the offer has moved to the new version, eight more jobs.
    wait_until("the new version to be offered", WAIT, || {
        let api = api.clone();
        let old = old.clone();
        async move {
            let tools = api
                .clone()
                .list_tools(v1::ListToolsRequest::default())
                .await
                .ok()?
                .into_inner()
                .tools;
            let counter = tools
                .into_iter()
                .find(|tool| tool.name == "increment_counter")?;
            (counter.contract_hash != old).then_some(())
        }
    })
    .await?;
    stop_at.store(submitted.load(Ordering::SeqCst) + 8, Ordering::SeqCst);
    let jobs = submitter.await?;

    let mut ran = std::collections::BTreeMap::<String, usize>::new();
    for (n, job_id) in jobs.into_iter().enumerate() {
        let job_id = job_id?;
        let job = wait_finished(&api, &job_id).await?;
        assert_eq!(job.status(), v1::JobStatus::Succeeded, "job {n}: {job:?}");
        let seen = events(&api, &job_id).await?;
        for (kind, data) in &seen {
            if kind != "tool_call_result" {
                continue;
            }
            let key = format!("roll:{n}:{}", data["call_id"].as_str().unwrap_or_default());
            let counted = fleet.counter(&key).await?;
            if data["code"] == "TOOL_VERSION_GONE" {
                // Queued for the old version when its last worker left:
                // answered, never run.
                assert_eq!(counted, 0, "{key}");
                *ran.entry("gone".to_owned()).or_default() += 1;
                continue;
            }
            assert_eq!(
                (data["ok"].as_bool(), counted),
                (Some(true), 1),
                "{key}: {data}"
            );
            // A worker of the release before names no version: it runs the
            // old one, and only calls pinned to it ran there.
            let ran_on = data["tool_version"].as_str().unwrap_or(&old).to_owned();
            let pinned = seen
                .iter()
                .rev()
                .find(|(kind, d)| kind == "tool_call_dispatched" && d["call_id"] == data["call_id"])
                .map(|(_, d)| d["tool_version"].as_str().unwrap_or_default().to_owned());
            assert_eq!(pinned.as_ref(), Some(&ran_on), "job {n}: {data}");
            *ran.entry(ran_on).or_default() += 1;
        }
    }
    // Both versions ran calls.
    assert!(ran.len() >= 2 && ran.contains_key(&old), "{ran:?}");
    Ok(())
}
