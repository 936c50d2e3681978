//! Upgrades without a pause (issue 56), with real processes: a call runs
//! only on workers of the version of its tool that its model was shown
//! (decision 0058), while two versions of the tool are live and when its
//! own version comes back after a while with none.
//!
//! Two versions of `echo` differ in their contract: one declares it
//! `read_only` (its manifest), the other `idempotent`
//! (`runtime.tool_effects`), which changes its contract hash as a new
//! schema would.

use std::time::Duration;

use serde_json::json;
use toolfleet_proto::v1;
use toolfleet_tests::fleet::{
    ApiClient, Fleet, approval, pending_approvals, scripted_job, test_fleet, wait_finished,
};
use toolfleet_tests::wait_until;

/// How long a test waits for the fleet to reach a state.
const WAIT: Duration = Duration::from_secs(30);

/// The environment of a worker of the second version of `echo`.
const SECOND_VERSION: &[(&str, &str)] = &[("TOOLFLEET_RUNTIME__TOOL_EFFECTS__ECHO", "idempotent")];

/// One call of `echo` (held for approval when `held`), then an answer.
fn echo_job(held: bool) -> v1::SubmitJobRequest {
    let script = json!([
        {"tool_calls": [{"id": "say", "name": "echo", "arguments": {"text": "hi"}}]},
        {"message": "{{say.data.text}}"}
    ]);
    let mut request = scripted_job("say hi", &script);
    if held {
        request.require_approval = vec!["echo".to_owned()];
    }
    request
}

/// The version (contract hash) of `echo` that new turns are offered, once
/// `workers` live workers serve it.
async fn offered_echo(api: &ApiClient, workers: u32) -> anyhow::Result<String> {
    let what = format!("echo on {workers} workers");
    wait_until(&what, WAIT, || {
        let mut api = api.clone();
        async move {
            let tools = api
                .list_tools(v1::ListToolsRequest::default())
                .await
                .ok()?
                .into_inner()
                .tools;
            let echo = tools.into_iter().find(|tool| tool.name == "echo")?;
            (echo.workers == workers).then_some(echo.contract_hash)
        }
    })
    .await
}

/// Waits until the job `job_id` is parked, its call held.
async fn parked(api: &ApiClient, job_id: &str) -> anyhow::Result<()> {
    wait_until("the call to be held", WAIT, || {
        let mut api = api.clone();
        let job_id = job_id.to_owned();
        async move {
            let job = api.get_job(v1::GetJobRequest { job_id }).await.ok()?;
            (job.into_inner().status() == v1::JobStatus::WaitingForApproval).then_some(())
        }
    })
    .await
}

/// How many times worker `index` began to run a call of `echo`.
fn echoes_run(fleet: &Fleet, index: usize) -> usize {
    fleet
        .worker(index)
        .log_tail(100_000)
        .lines()
        .filter(|line| line.contains("executing call") && line.contains("tool=echo"))
        .count()
}

#[tokio::test]
async fn a_call_runs_only_on_workers_of_the_version_its_model_was_shown() -> anyhow::Result<()> {
    let mut fleet = Fleet::start(test_fleet(1)).await?;
    fleet.spawn_orchestrator(&[]).await?;
    let mut api = fleet.api(0).await?;
    let first = offered_echo(&api, 1).await?;

    // A call made while only the first version was live waits for an
    // approval; meanwhile its only worker leaves and two of the second
    // version come.
    let held = api.submit_job(echo_job(true)).await?.into_inner().job_id;
    parked(&api, &held).await?;
    // The approver sees which version the arguments are for.
    let pending = pending_approvals(&api).await?;
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(pending[0].tool_version, first);
    fleet.worker(0).stop(WAIT).await?;
    let (second_a, second_b) = (
        fleet.spawn_worker_with(SECOND_VERSION).await?,
        fleet.spawn_worker_with(SECOND_VERSION).await?,
    );
    let second = offered_echo(&api, 2).await?;
    assert_ne!(first, second, "the two versions' contracts differ");
    api.decide_call(approval(&held, "say")).await?;

    // Pinned to the first version: the second's workers hand it back,
    // never run it, and the job waits.
    wait_until(
        "a worker of the second version to hand the call back",
        WAIT,
        || {
            let handed = [second_a, second_b].iter().any(|&index| {
                fleet
                    .worker(index)
                    .log_tail(100_000)
                    .contains("call pinned to another version")
            });
            async move { handed.then_some(()) }
        },
    )
    .await?;
    let job = api
        .get_job(v1::GetJobRequest {
            job_id: held.clone(),
        })
        .await?
        .into_inner();
    assert_eq!(job.status(), v1::JobStatus::Running, "{job:?}");
    assert_eq!(
        echoes_run(&fleet, second_a) + echoes_run(&fleet, second_b),
        0
    );

    // A worker of the first version comes back: the call runs there, once.
    let first_again = fleet.spawn_worker().await?;
    let job = wait_finished(&api, &held).await?;
    assert_eq!(job.status(), v1::JobStatus::Succeeded, "{job:?}");
    assert_eq!(job.output_text, "hi");
    assert_eq!(echoes_run(&fleet, first_again), 1);
    assert_eq!(
        echoes_run(&fleet, second_a) + echoes_run(&fleet, second_b),
        0
    );

    // With both live, new turns see the version most workers serve (the
    // second, 2 to 1), and their calls never run on the first's worker.
    assert_eq!(offered_echo(&api, 3).await?, second);
    let tools = api
        .list_tools(v1::ListToolsRequest::default())
        .await?
        .into_inner()
        .tools;
    let echo = tools.iter().find(|tool| tool.name == "echo").expect("echo");
    let versions: Vec<(&str, u32, bool)> = echo
        .versions
        .iter()
        .map(|v| (v.contract_hash.as_str(), v.workers, v.offered))
        .collect();
    let mut want = vec![(first.as_str(), 1, false), (second.as_str(), 2, true)];
    want.sort();
    assert_eq!(versions, want, "every live version, to an operator");
    for _ in 0..6 {
        let job_id = api.submit_job(echo_job(false)).await?.into_inner().job_id;
        let job = wait_finished(&api, &job_id).await?;
        assert_eq!(job.status(), v1::JobStatus::Succeeded, "{job:?}");
    }
    assert_eq!(echoes_run(&fleet, first_again), 1, "only the pinned call");
    assert_eq!(
        echoes_run(&fleet, second_a) + echoes_run(&fleet, second_b),
        6
    );
    Ok(())
}

#[tokio::test]
async fn a_call_whose_version_has_no_worker_past_the_limit_is_answered_version_gone()
-> anyhow::Result<()> {
    let mut fleet = Fleet::start(test_fleet(1)).await?;
    fleet
        .spawn_orchestrator(&[("TOOLFLEET_DISPATCH__VERSION_GONE_AFTER", "2s")])
        .await?;
    let mut api = fleet.api(0).await?;
    offered_echo(&api, 1).await?;
    let script = json!([
        {"tool_calls": [{"id": "say", "name": "echo", "arguments": {"text": "hi"}}]},
        {"message": "{{say}}"}
    ]);
    let mut request = scripted_job("say hi", &script);
    request.require_approval = vec!["echo".to_owned()];
    let held = api.submit_job(request).await?.into_inner().job_id;
    parked(&api, &held).await?;
    // Its version's only worker leaves for good; the other version's come.
    fleet.worker(0).stop(WAIT).await?;
    let second = fleet.spawn_worker_with(SECOND_VERSION).await?;
    offered_echo(&api, 1).await?;
    api.decide_call(approval(&held, "say")).await?;

    // Retired once its version had no worker for 2 s: answered, not run,
    // and the model reads why.
    let job = wait_finished(&api, &held).await?;
    assert_eq!(job.status(), v1::JobStatus::Succeeded, "{job:?}");
    let answer: serde_json::Value = serde_json::from_str(&job.output_text)?;
    assert_eq!(answer["ok"], false, "{answer}");
    assert_eq!(answer["error"]["code"], "TOOL_VERSION_GONE", "{answer}");
    assert_eq!(answer["error"]["retryable"], false, "{answer}");
    assert!(answer["error"].get("side_effect").is_none(), "{answer}");
    assert_eq!(echoes_run(&fleet, second), 0);
    let log = fleet.orchestrator(0).log_tail(100_000);
    assert!(
        log.contains("retiring the call"),
        "the orchestrator retired it"
    );
    Ok(())
}

/// The environment of a worker of the second version of
/// `increment_counter` (its effects, hence its contract, change).
const SECOND_COUNTER: &[(&str, &str)] = &[(
    "TOOLFLEET_RUNTIME__TOOL_EFFECTS__INCREMENT_COUNTER",
    "idempotent",
)];

/// Job `n` of the rolling upgrade: two rounds of `increment_counter` (three
/// parallel calls, then one), each call its own counter, each taking a
/// little while so that calls are in flight as workers come and go.
fn counting_job(n: usize) -> v1::SubmitJobRequest {
    let call = |id: &str| {
        json!({"id": id, "name": "increment_counter",
               "arguments": {"key": format!("roll:{n}:{id}"), "delay_ms": 150}})
    };
    let script = json!([
        {"tool_calls": [call("a"), call("b"), call("c")]},
        {"tool_calls": [call("d")]},
        {"message": "counted"}
    ]);
    scripted_job("count", &script)
}

#[tokio::test]
async fn a_rolling_upgrade_under_load_changes_a_schema_and_loses_repeats_and_misroutes_nothing()
-> anyhow::Result<()> {
    const JOBS: usize = 24;
    let mut fleet = Fleet::start(test_fleet(3)).await?;
    fleet.spawn_orchestrator(&[]).await?;
    fleet.spawn_orchestrator(&[]).await?;
    fleet.wait_for_tools(0, &["increment_counter"], 3).await?;
    let api = fleet.api(0).await?;
    // Jobs come one every 100 ms while the workers roll.
    let submitter = {
        let api = api.clone();
        tokio::spawn(async move {
            let mut jobs = Vec::new();
            for n in 0..JOBS {
                let submitted = api.clone().submit_job(counting_job(n)).await;
                jobs.push(submitted.map(|r| r.into_inner().job_id));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            jobs
        })
    };
    // One pod at a time: a worker of the new version starts (maxSurge 1),
    // then one of the old stops, draining its calls.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for old in 0..3 {
        fleet.spawn_worker_with(SECOND_COUNTER).await?;
        fleet.worker(old).stop(WAIT).await?;
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    let jobs = submitter.await?;

    let mut versions_ran = std::collections::BTreeSet::new();
    for (n, job_id) in jobs.into_iter().enumerate() {
        let job_id = job_id?;
        let job = wait_finished(&api, &job_id).await?;
        assert_eq!(job.status(), v1::JobStatus::Succeeded, "job {n}: {job:?}");
        // Every call ran exactly once: no call lost, none run twice.
        for id in ["a", "b", "c", "d"] {
            let key = format!("roll:{n}:{id}");
            assert_eq!(fleet.counter(&key).await?, 1, "{key}");
        }
        // Each call ran on the version its attempt was pinned to, the one
        // its model was shown.
        let seen = toolfleet_tests::fleet::events(&api, &job_id).await?;
        for (kind, data) in &seen {
            if kind != "tool_call_result" {
                continue;
            }
            let call = &data["call_id"];
            let pinned: Vec<&serde_json::Value> = seen
                .iter()
                .filter(|(kind, d)| kind == "tool_call_dispatched" && d["call_id"] == *call)
                .map(|(_, d)| &d["tool_version"])
                .collect();
            let ran_on = &data["tool_version"];
            assert!(ran_on.is_string(), "job {n}: {data}");
            assert_eq!(pinned.last(), Some(&ran_on), "job {n} call {call}");
            versions_ran.insert(ran_on.as_str().unwrap_or_default().to_owned());
        }
    }
    // The schema changed in the middle: both versions ran calls.
    assert_eq!(versions_ran.len(), 2, "{versions_ran:?}");
    for index in 0..2 {
        let log = fleet.orchestrator(index).log_tail(100_000);
        assert!(
            !log.contains("ran on another version"),
            "orchestrator {index}"
        );
    }
    Ok(())
}

/// Fast takeover of a killed orchestrator's jobs.
const FAST_TAKEOVER: &[(&str, &str)] = &[
    ("TOOLFLEET_RUNNER__JOB_ACK_WAIT", "2s"),
    ("TOOLFLEET_RUNNER__LEASE_TTL", "1s"),
    ("TOOLFLEET_RUNNER__DRAIN_TIMEOUT", "1s"),
];

#[tokio::test]
async fn an_orchestrator_killed_while_a_pinned_call_waits_leaves_its_pin_to_the_next()
-> anyhow::Result<()> {
    let mut fleet = Fleet::start(test_fleet(1)).await?;
    fleet.spawn_orchestrator(FAST_TAKEOVER).await?;
    let mut api = fleet.api(0).await?;
    let first = offered_echo(&api, 1).await?;
    let held = api.submit_job(echo_job(true)).await?.into_inner().job_id;
    parked(&api, &held).await?;
    fleet.worker(0).stop(WAIT).await?;
    let second = fleet.spawn_worker_with(SECOND_VERSION).await?;
    offered_echo(&api, 1).await?;
    api.decide_call(approval(&held, "say")).await?;
    wait_until(
        "the other version's worker to hand the call back",
        WAIT,
        || {
            let handed = fleet
                .worker(second)
                .log_tail(100_000)
                .contains("call pinned to another version");
            async move { handed.then_some(()) }
        },
    )
    .await?;

    // The runner dies with the call queued; another orchestrator, which
    // never saw the first version, resumes the job from Redis.
    fleet.orchestrator(0).kill();
    let next = fleet.spawn_orchestrator(FAST_TAKEOVER).await?;
    let api = fleet.api(next).await?;
    let next_owner = format!("orchestrator-{next}");
    wait_until("the next orchestrator to resume the job", WAIT, || {
        let (api, job_id, owner) = (api.clone(), held.clone(), next_owner.clone());
        async move {
            let seen = toolfleet_tests::fleet::events(&api, &job_id).await.ok()?;
            seen.iter()
                .any(|(kind, data)| {
                    kind == "job_resumed"
                        && data["owner"]
                            .as_str()
                            .is_some_and(|o| o.starts_with(&owner))
                })
                .then_some(())
        }
    })
    .await?;
    assert_eq!(echoes_run(&fleet, second), 0, "still pinned to the first");
    let first_again = fleet.spawn_worker().await?;
    let job = wait_finished(&api, &held).await?;
    assert_eq!(job.status(), v1::JobStatus::Succeeded, "{job:?}");
    assert_eq!(job.output_text, "hi");
    assert_eq!(echoes_run(&fleet, first_again), 1, "once, on its version");
    assert_eq!(echoes_run(&fleet, second), 0);
    let seen = toolfleet_tests::fleet::events(&api, &held).await?;
    let ran_on: Vec<&serde_json::Value> = seen
        .iter()
        .filter(|(kind, _)| kind == "tool_call_result")
        .map(|(_, data)| &data["tool_version"])
        .collect();
    assert_eq!(ran_on, [&json!(first)]);
    let pinned: Vec<&serde_json::Value> = seen
        .iter()
        .filter(|(kind, _)| kind == "tool_call_dispatched")
        .map(|(_, data)| &data["tool_version"])
        .collect();
    assert!(
        !pinned.is_empty() && pinned.iter().all(|v| **v == json!(first)),
        "{pinned:?}"
    );
    Ok(())
}

/// What a process logs when it leaves a job or a call to a newer release.
const LEFT_FOR_NEWER: [&str; 3] = [
    "a call this worker cannot read handed back",
    "the stored result of this attempt is in a newer format; handed back",
    "a job this orchestrator cannot read is left for a newer one",
];

#[tokio::test]
async fn what_a_newer_release_wrote_is_never_misread_and_never_lost() -> anyhow::Result<()> {
    use async_nats::jetstream;
    use toolfleet_proto::names::{self, RedisKeys};

    let mut fleet = Fleet::start(test_fleet(1)).await?;
    let js = jetstream::new(fleet.client.clone());
    let mut redis = fleet.redis.connection().await?;

    // A call message in format 3: handed back unread, not run, not answered.
    let future = toolfleet_tests::fleet::call(
        "job-future",
        "c1",
        "increment_counter",
        r#"{"key":"future"}"#,
    );
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(names::headers::MSG_ID, future.msg_id().as_str());
    headers.insert(names::headers::FORMAT, "3");
    js.publish_with_headers(
        names::call_subject(&future.tool),
        headers,
        serde_json::to_vec(&future)?.into(),
    )
    .await?
    .await?;
    fleet
        .worker(0)
        .wait_for_log(LEFT_FOR_NEWER[0], WAIT)
        .await?;
    assert!(
        fleet
            .worker(0)
            .log_tail(1000)
            .contains(r#"a call is in format "3""#)
    );
    assert_eq!(fleet.counter("future").await?, 0, "not run");
    assert_eq!(fleet.stored_result(&future).await?, None, "not claimed");

    // A result a newer worker stored: never answered from, by this worker.
    let mut results = fleet.results("job-stored").await?;
    let stored = toolfleet_tests::fleet::call("job-stored", "c1", "echo", r#"{"text":"hi"}"#);
    let record = json!({
        "tool": "echo",
        "arguments_sha256": toolfleet_proto::envelope::arguments_sha256(&stored.arguments),
        "envelope": {"ok": true, "data": {"text": "read as format 2"}},
        "format": 3,
    });
    let key = RedisKeys::default().call_result(
        &stored.job_id,
        &stored.tool,
        &stored.call_id,
        stored.attempt,
    );
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg(record.to_string())
        .query_async(&mut redis)
        .await?;
    fleet.publish_call(&stored).await?;
    fleet
        .worker(0)
        .wait_for_log(LEFT_FOR_NEWER[1], WAIT)
        .await?;
    assert!(
        results.next(Duration::from_millis(500)).await.is_err(),
        "answered from a record of a newer format"
    );

    // A job a newer orchestrator stored: refused by GetJob, left as it is
    // by the runner, and whole for the release that reads it.
    fleet.spawn_orchestrator(&[]).await?;
    let mut api = fleet.api(0).await?;
    offered_echo(&api, 1).await?;
    let held = api.submit_job(echo_job(true)).await?.into_inner().job_id;
    parked(&api, &held).await?;
    let job_key = RedisKeys::default().job(&toolfleet_tests::fleet::job_id(&held));
    let format: String = redis::cmd("HGET")
        .arg(&job_key)
        .arg("format")
        .query_async(&mut redis)
        .await?;
    assert_eq!(format, "2", "this release writes format 2");
    let _: () = redis::cmd("HSET")
        .arg(&job_key)
        .arg("format")
        .arg("3")
        .query_async(&mut redis)
        .await?;
    // What a run that took the job would change.
    let state = || {
        let mut redis = redis.clone();
        let job_key = job_key.clone();
        async move {
            redis::cmd("HMGET")
                .arg(&job_key)
                .arg(&["status", "epoch", "events"][..])
                .query_async::<Vec<String>>(&mut redis)
                .await
        }
    };
    let before = state().await?;
    let refused = api
        .get_job(v1::GetJobRequest {
            job_id: held.clone(),
        })
        .await
        .expect_err("a job of a newer format");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(
        refused.message().contains(r#"format "3""#),
        "{}",
        refused.message()
    );
    js.publish(names::JOB_SUBJECT, held.clone().into())
        .await?
        .await?;
    fleet
        .orchestrator(0)
        .wait_for_log(LEFT_FOR_NEWER[2], WAIT)
        .await?;
    let after = state().await?;
    assert_eq!(before, after, "nothing read, nothing written");
    // Once a release that reads it has it, nothing is missing.
    let _: () = redis::cmd("HSET")
        .arg(&job_key)
        .arg("format")
        .arg("2")
        .query_async(&mut redis)
        .await?;
    api.decide_call(approval(&held, "say")).await?;
    let job = wait_finished(&api, &held).await?;
    assert_eq!(job.status(), v1::JobStatus::Succeeded, "{job:?}");
    assert_eq!(job.output_text, "hi");
    Ok(())
}
