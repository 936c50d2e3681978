//! Fault tests: processes die at any moment, and still no job or call is lost
//! and no side effect happens twice. Each test prints its counts at the end.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};
use toolfleet_proto::names;
use toolfleet_proto::v1;
use toolfleet_tests::fleet::{
    ApiClient, FAST_REDELIVERY, Fleet, on_clusters, scripted_job, test_fleet, wait_finished,
};
use toolfleet_tests::tally::{Tally, answer_of};
use toolfleet_tests::{RedisConfig, wait_until};

fn scripted(script: Value) -> v1::SubmitJobRequest {
    scripted_job("fault test", &script)
}

/// The NATS a fault test runs on. The durability tests run on both; a
/// test on a cluster has `cluster` in its name.
#[derive(Debug, Clone, Copy)]
enum On {
    /// One nats-server.
    Server,
    /// Three NATS nodes, each stream kept on all three (`nats.replicas =
    /// 3`), and a Redis Cluster of three primaries with a replica each.
    Cluster,
}

impl On {
    /// A fleet with `workers` workers (`worker_env` on each) on this NATS.
    async fn fleet(
        self,
        workers: usize,
        worker_env: &[(&str, &str)],
        redis: RedisConfig,
    ) -> anyhow::Result<Fleet> {
        match self {
            Self::Server => {
                Fleet::start(test_fleet(workers).worker_env(worker_env).redis(redis)).await
            }
            Self::Cluster => {
                Fleet::start(on_clusters(
                    test_fleet(workers).worker_env(worker_env).redis(redis),
                    1,
                ))
                .await
            }
        }
    }
}

#[tokio::test]
async fn a_poison_call_ends_its_job_with_max_deliveries_exceeded() -> anyhow::Result<()> {
    // Declared idempotent: every delivery claims, and each death counts.
    let crashes =
        poison_crashes(&[("TOOLFLEET_RUNTIME__TOOL_EFFECTS__CRASH", "idempotent")]).await?;
    assert_eq!(
        crashes, 2,
        "each of the allowed deliveries crashed once, then no more"
    );
    Ok(())
}

#[tokio::test]
async fn a_read_only_poison_call_runs_once_more_than_max_deliveries() -> anyhow::Result<()> {
    // Read-only, as `crash` declares: its first delivery runs without a
    // claim (decision 0060), so its death is not counted; the next ones
    // claim, and count.
    let crashes = poison_crashes(&[]).await?;
    assert_eq!(
        crashes, 3,
        "the unclaimed first delivery, then each of the allowed claimed ones"
    );
    Ok(())
}

/// Runs a job whose `crash` call kills its worker at each delivery (with
/// `env` on the worker), restarting the dead workers until the job ends
/// with `MAX_DELIVERIES_EXCEEDED`; returns how many times it crashed.
async fn poison_crashes(env: &[(&str, &str)]) -> anyhow::Result<usize> {
    let builder = test_fleet(1).worker_env(FAST_REDELIVERY).worker_env(env);
    let mut fleet = Fleet::start(builder).await?;
    fleet.spawn_orchestrator(&[]).await?;
    fleet.wait_for_tools(0, &["crash", "echo"], 1).await?;
    let api = fleet.api(0).await?;
    let job_id = api
        .clone()
        .submit_job(scripted(json!([
            {"tool_calls": [{"name": "crash", "arguments": {}}, {"name": "echo", "arguments": {"fine": true}}]},
            {"message": "{{call_0_0.error.code}}"}
        ])))
        .await?
        .into_inner()
        .job_id;
    let job = tokio::select! {
        job = wait_finished(&api, &job_id) => job?,
        () = fleet.restart_dead_workers() => unreachable!("the restarter never ends"),
    };
    assert_eq!(job.status, v1::JobStatus::Succeeded as i32, "{job:?}");
    assert_eq!(job.output_text, "MAX_DELIVERIES_EXCEEDED");
    // The echo call shared the worker with the poison call and died with it
    // each time, so it may be answered MAX_DELIVERIES_EXCEEDED too; it must
    // be answered either way.
    let crashes = fleet.count_in_worker_logs("crash tool: aborting");
    println!("poison call: jobs 1, calls 2, worker crashes {crashes}, duplicates found 0");
    Ok(crashes)
}

/// The workers and the orchestrator run single-threaded (`threads = 1`), as
/// `toolfleet bench --processes` runs them: the guarantees hold in that
/// shape too (the other fault tests run the default one).
#[tokio::test]
async fn killing_workers_in_a_loop_loses_no_call_and_repeats_no_effect() -> anyhow::Result<()> {
    worker_chaos(On::Server).await
}

#[tokio::test]
async fn cluster_killing_workers_in_a_loop_loses_no_call_and_repeats_no_effect()
-> anyhow::Result<()> {
    worker_chaos(On::Cluster).await
}

async fn worker_chaos(on: On) -> anyhow::Result<()> {
    const JOBS: usize = 100;
    const SINGLE_THREADED: (&str, &str) = ("TOOLFLEET_THREADS", "1");
    let mut worker_env = FAST_REDELIVERY.to_vec();
    worker_env.push(SINGLE_THREADED);
    let mut fleet = on.fleet(3, &worker_env, RedisConfig::default()).await?;
    fleet.spawn_orchestrator(&[SINGLE_THREADED]).await?;
    fleet.wait_for_tools(0, &["increment_counter"], 3).await?;
    let api = fleet.api(0).await?;
    let jobs = submit_rounds(&api, JOBS, "chaos").await?;

    let kills = Arc::new(AtomicUsize::new(0));
    let chaos = async {
        let mut n = 0usize;
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            n += 1;
            let victim = &fleet.workers()[n % fleet.workers().len()];
            if victim.is_running() {
                victim.kill();
                kills.fetch_add(1, Ordering::SeqCst);
            }
        }
    };
    let all = futures::future::join_all(jobs);
    let finished = tokio::select! {
        finished = all => finished,
        () = chaos => unreachable!(),
        () = fleet.restart_dead_workers() => unreachable!(),
    };
    let (calls, tally) = tally_rounds(&fleet, finished, "chaos").await?;
    let recovered = fleet.count_in_worker_logs("earlier execution was applied");
    let dedup_hits = fleet.count_in_worker_logs("answered from the stored result");
    println!(
        "worker chaos ({on:?}): jobs {JOBS}, calls {calls}, kills {}, recovered by probe {recovered}, \
         dedup hits {dedup_hits}, {tally}",
        kills.load(Ordering::SeqCst)
    );
    tally.assert_truthful();
    assert_eq!(calls, JOBS * 6);
    Ok(())
}

/// Submits `jobs` jobs of two rounds of three side-effecting calls (300 ms
/// each), counted under `<tag>:<job>:<round>:<call>`; each handle ends with
/// its job finished.
async fn submit_rounds(
    api: &ApiClient,
    jobs: usize,
    tag: &str,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<anyhow::Result<v1::Job>>>> {
    let mut handles = Vec::new();
    for job in 0..jobs {
        let round = |r: usize| {
            let calls: Vec<Value> = (0..3)
                .map(|k| {
                    json!({"name": "increment_counter",
                             "arguments": {"key": format!("{tag}:{job}:{r}:{k}"), "delay_ms": 300}})
                })
                .collect();
            json!({"tool_calls": calls})
        };
        let script = json!([round(0), round(1), {"message": "done"}]);
        let job_id = api
            .clone()
            .submit_job(scripted(script))
            .await?
            .into_inner()
            .job_id;
        handles.push(tokio::spawn({
            let api = api.clone();
            async move { wait_finished(&api, &job_id).await }
        }));
    }
    Ok(handles)
}

/// The jobs of [`submit_rounds`], each of which must have succeeded, as
/// finished: how many calls they made, and each call's answer held against
/// its effect.
async fn tally_rounds(
    fleet: &Fleet,
    finished: Vec<Result<anyhow::Result<v1::Job>, tokio::task::JoinError>>,
    tag: &str,
) -> anyhow::Result<(usize, Tally)> {
    let mut calls = 0;
    let mut tally = Tally::default();
    for (i, job) in finished.into_iter().enumerate() {
        let job = job??;
        assert_eq!(
            job.status,
            v1::JobStatus::Succeeded as i32,
            "job {i}: {job:?}"
        );
        for r in 0..2 {
            for k in 0..3 {
                let call_id = format!("call_{r}_{k}");
                let answer = answer_of(&job, &call_id);
                let effect = fleet.counter(&format!("{tag}:{i}:{r}:{k}")).await?;
                tally.add(&format!("job {i} {call_id}"), &answer, effect);
                calls += 1;
            }
        }
    }
    Ok((calls, tally))
}

/// Short runner timers: a dead orchestrator's jobs move within seconds.
const FAST_TAKEOVER: &[(&str, &str)] = &[
    ("TOOLFLEET_RUNNER__JOB_ACK_WAIT", "2s"),
    ("TOOLFLEET_RUNNER__LEASE_TTL", "1s"),
    ("TOOLFLEET_RUNNER__DRAIN_TIMEOUT", "1s"),
];

/// Per job, the `turn` values of the "scripted turn played" lines of every
/// orchestrator log (killed runs included: a respawn appends to the log).
fn turns_played(fleet: &Fleet) -> std::collections::HashMap<(String, String), usize> {
    let mut played = std::collections::HashMap::new();
    for orchestrator in fleet.orchestrators() {
        let log = std::fs::read_to_string(orchestrator.log_path()).unwrap_or_default();
        for line in log.lines().filter(|l| l.contains("scripted turn played")) {
            let field = |name: &str| {
                line.split(&format!("{name}="))
                    .nth(1)
                    .and_then(|rest| rest.split([' ', '}', ':']).next())
                    .unwrap_or_default()
                    .trim_matches('"')
                    .to_owned()
            };
            *played.entry((field("job_id"), field("turn"))).or_insert(0) += 1;
        }
    }
    played
}

async fn wait_all(api: &ApiClient, ids: &[String]) -> anyhow::Result<Vec<v1::Job>> {
    let waits = ids.iter().map(|id| wait_finished(api, id));
    futures::future::try_join_all(waits).await
}

#[tokio::test]
async fn a_second_orchestrator_finishes_jobs_whose_orchestrator_was_killed_twice()
-> anyhow::Result<()> {
    orchestrator_kills(On::Server).await
}

#[tokio::test]
async fn cluster_a_second_orchestrator_finishes_jobs_whose_orchestrator_was_killed_twice()
-> anyhow::Result<()> {
    orchestrator_kills(On::Cluster).await
}

async fn orchestrator_kills(on: On) -> anyhow::Result<()> {
    const JOBS: usize = 20;
    let mut fleet = on.fleet(2, FAST_REDELIVERY, RedisConfig::default()).await?;
    fleet.spawn_orchestrator(FAST_TAKEOVER).await?;
    fleet.wait_for_tools(0, &["increment_counter"], 2).await?;
    let api = fleet.api(0).await?;
    let mut ids = Vec::new();
    for job in 0..JOBS {
        let script = json!([
            {"delay_ms": 400, "tool_calls": [
                {"name": "increment_counter", "arguments": {"key": format!("resume:{job}:a")}},
                {"name": "increment_counter", "arguments": {"key": format!("resume:{job}:b")}}]},
            {"delay_ms": 400, "tool_calls": [
                {"name": "increment_counter", "arguments": {"key": format!("resume:{job}:c"), "delay_ms": 300}}]},
            {"delay_ms": 400, "message": "done"}
        ]);
        ids.push(
            api.clone()
                .submit_job(scripted(script))
                .await?
                .into_inner()
                .job_id,
        );
    }
    let first = fleet.orchestrator(0);
    first
        .wait_until("first turns played", Duration::from_secs(30), || async {
            std::fs::read_to_string(first.log_path())
                .unwrap_or_default()
                .matches("scripted turn played")
                .count()
                >= JOBS
        })
        .await?;
    // A turn is logged when the model answers, one round trip before it
    // is stored: wait until every job's first turn is stored too, so that
    // the kill falls in a round, not between an answer and its commit
    // (a turn never stored is asked again, by design).
    wait_until("first turns stored", Duration::from_secs(30), || {
        let (api, ids) = (api.clone(), ids.clone());
        async move {
            for job_id in ids {
                let job = api
                    .clone()
                    .get_job(v1::GetJobRequest { job_id })
                    .await
                    .ok()?
                    .into_inner();
                let stored = job
                    .items
                    .iter()
                    .any(|item| matches!(item.kind, Some(v1::item::Kind::ToolCall(_))));
                if !stored {
                    return None;
                }
            }
            Some(())
        }
    })
    .await?;
    first.kill();
    first.respawn()?;
    first
        .wait_for_log("job_resumed", Duration::from_secs(30))
        .await?;
    first.kill();
    let second = fleet.spawn_orchestrator(FAST_TAKEOVER).await?;
    let api = fleet.api(second).await?;
    let jobs = wait_all(&api, &ids).await?;
    for job in &jobs {
        assert_eq!(job.status, v1::JobStatus::Succeeded as i32, "{job:?}");
    }
    let played = turns_played(&fleet);
    let twice: Vec<_> = played.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "turns played twice: {twice:?}");
    assert_eq!(
        played.len(),
        JOBS * 3,
        "every turn of every job played once"
    );
    for job in 0..JOBS {
        for key in ["a", "b", "c"] {
            assert_eq!(
                fleet.counter(&format!("resume:{job}:{key}")).await?,
                1,
                "resume:{job}:{key}"
            );
        }
    }
    let resumed: usize = fleet
        .orchestrators()
        .map(|o| {
            std::fs::read_to_string(o.log_path())
                .unwrap_or_default()
                .matches("job_resumed")
                .count()
        })
        .sum();
    println!(
        "orchestrator kills ({on:?}): jobs {JOBS}, calls {}, kills 2, resumptions {resumed}, turns played {}, \
         turns played twice 0, duplicates found 0",
        JOBS * 3,
        played.len()
    );
    Ok(())
}

#[tokio::test]
async fn jobs_finish_across_a_nats_restart_and_a_redis_restart() -> anyhow::Result<()> {
    const JOBS: usize = 20;
    let redis = toolfleet_tests::RedisConfig {
        append_only: true,
        ..Default::default()
    };
    let mut fleet = Fleet::start(test_fleet(2).worker_env(FAST_REDELIVERY).redis(redis)).await?;
    fleet.spawn_orchestrator(FAST_TAKEOVER).await?;
    fleet.wait_for_tools(0, &["increment_counter"], 2).await?;
    let api = fleet.api(0).await?;
    let submit = |tag: &'static str| {
        let api = api.clone();
        async move {
            let mut ids = Vec::new();
            for job in 0..JOBS {
                let script = json!([
                    {"tool_calls": [{"name": "increment_counter",
                                     "arguments": {"key": format!("{tag}:{job}"), "delay_ms": 500}}]},
                    {"delay_ms": 300, "message": "done"}
                ]);
                ids.push(
                    api.clone()
                        .submit_job(scripted(script))
                        .await?
                        .into_inner()
                        .job_id,
                );
            }
            anyhow::Ok(ids)
        }
    };

    let ids = submit("nats").await?;
    fleet.workers()[0]
        .wait_for_log("executing call", Duration::from_secs(30))
        .await?;
    fleet.nats.server().restart().await?;
    let jobs = wait_all(&fleet.api(0).await?, &ids).await?;
    assert!(
        jobs.iter()
            .all(|j| j.status == v1::JobStatus::Succeeded as i32),
        "{jobs:?}"
    );

    // The marks come before the submissions: a worker may start every call
    // it gets before the last job is submitted.
    let marks: Vec<_> = fleet.workers().iter().map(|w| w.log_mark()).collect();
    let ids = submit("redis").await?;
    let executing = fleet.workers().iter().zip(marks).map(|(worker, mark)| {
        Box::pin(worker.wait_for_log_after(mark, "executing call", Duration::from_secs(30)))
    });
    futures::future::select_ok(executing).await?;
    fleet.redis.server().restart().await?;
    let jobs = wait_all(&fleet.api(0).await?, &ids).await?;
    assert!(
        jobs.iter()
            .all(|j| j.status == v1::JobStatus::Succeeded as i32),
        "{jobs:?}"
    );

    let mut duplicates = 0;
    for tag in ["nats", "redis"] {
        for job in 0..JOBS {
            let value = fleet.counter(&format!("{tag}:{job}")).await?;
            assert_eq!(value, 1, "{tag}:{job}");
            duplicates += usize::from(value > 1);
        }
    }
    println!(
        "infrastructure restarts: jobs {}, calls {}, nats restarts 1, redis restarts 1, duplicates found {duplicates}",
        2 * JOBS,
        2 * JOBS
    );
    Ok(())
}

#[tokio::test]
async fn jobs_whose_redis_state_is_lost_fail_with_a_clear_code() -> anyhow::Result<()> {
    let mut fleet = Fleet::start(test_fleet(1).worker_env(FAST_REDELIVERY)).await?;
    fleet.spawn_orchestrator(FAST_TAKEOVER).await?;
    fleet.wait_for_tools(0, &["sleep"], 1).await?;
    let mut api = fleet.api(0).await?;
    let job_id = api
        .submit_job(scripted(json!([
            {"tool_calls": [{"name": "sleep", "arguments": {"ms": 1500}}]},
            {"message": "never"}
        ])))
        .await?
        .into_inner()
        .job_id;
    fleet.workers()[0]
        .wait_for_log("executing call", Duration::from_secs(30))
        .await?;
    fleet.redis.server().flush_all().await?;
    let job = toolfleet_tests::wait_until("the lost job to fail", Duration::from_secs(60), || {
        let mut api = api.clone();
        let job_id = job_id.clone();
        async move {
            let job = api
                .get_job(v1::GetJobRequest { job_id })
                .await
                .ok()?
                .into_inner();
            (job.status == v1::JobStatus::Failed as i32).then_some(job)
        }
    })
    .await?;
    assert_eq!(
        job.error.as_ref().map(|e| e.code.as_str()),
        Some("JOB_STATE_LOST")
    );
    // The fleet keeps serving.
    let next = api
        .submit_job(scripted(json!([{"message": "fine"}])))
        .await?
        .into_inner()
        .job_id;
    assert_eq!(wait_finished(&api, &next).await?.output_text, "fine");
    println!("redis lost: jobs 1, failed with JOB_STATE_LOST 1, hung 0");
    Ok(())
}

#[tokio::test]
async fn a_rolling_restart_of_every_process_fails_no_job() -> anyhow::Result<()> {
    rolling_restart(On::Server).await
}

/// On a cluster, the NATS nodes restart in turn too, as an upgrade of the
/// cluster does.
#[tokio::test]
async fn cluster_a_rolling_restart_of_every_process_and_nats_node_fails_no_job()
-> anyhow::Result<()> {
    rolling_restart(On::Cluster).await
}

async fn rolling_restart(on: On) -> anyhow::Result<()> {
    const JOBS: usize = 200;
    // Workers stop by SIGTERM here, draining: the claim lease only has to
    // outlast a busy moment of a loaded machine, which 500 ms (the kill
    // tests' setting) did not always do: a claim that lapses under a
    // running call lets a redelivery run it too (decision 0002).
    let drained = [
        ("TOOLFLEET_RUNTIME__ACK_WAIT", "4s"),
        ("TOOLFLEET_RUNTIME__CLAIM_LEASE", "2s"),
        ("TOOLFLEET_RUNTIME__MAX_DELIVERIES", "2"),
    ];
    let mut fleet = on.fleet(3, &drained, RedisConfig::default()).await?;
    fleet.spawn_orchestrator(FAST_TAKEOVER).await?;
    fleet.spawn_orchestrator(FAST_TAKEOVER).await?;
    fleet.wait_for_tools(0, &["increment_counter"], 3).await?;
    let api = fleet.api(0).await?;
    let api_b = fleet.api(1).await?;
    let mut ids = Vec::new();
    for job in 0..JOBS {
        let script = json!([
            {"tool_calls": [{"name": "increment_counter", "arguments": {"key": format!("roll:{job}"), "delay_ms": 200}}]},
            {"delay_ms": 100, "message": "done"}
        ]);
        let client = if job % 2 == 0 { &api } else { &api_b };
        ids.push(
            client
                .clone()
                .submit_job(scripted(script))
                .await?
                .into_inner()
                .job_id,
        );
    }
    // SIGTERM each process in turn, wait until it is back, then the next one:
    // on a cluster, each NATS node first, back and caught up before the next.
    let mut restarts = 0;
    if let On::Cluster = on {
        let cluster = fleet.nats.cluster();
        let js = async_nats::jetstream::new(fleet.client.clone());
        for node in cluster.nodes() {
            let status = node.stop().await?;
            assert!(status.success(), "a NATS node exited with {status:?}");
            node.restart().await?;
            for stream in [names::JOB_STREAM, names::CALL_STREAM] {
                let what = format!("every copy of {stream} to catch up");
                wait_until(&what, Duration::from_secs(30), || async {
                    cluster
                        .stream_copies(&js, stream)
                        .await
                        .is_ok_and(|copies| copies.current)
                })
                .await?;
            }
            restarts += 1;
        }
    }
    let processes: Vec<_> = fleet
        .orchestrators()
        .chain(fleet.workers().iter())
        .collect();
    for process in processes {
        process.terminate()?;
        let status = process.wait_exit(Duration::from_secs(30)).await?;
        assert!(
            status.success(),
            "{} exited with {status:?}",
            process.name()
        );
        process.respawn()?;
        let ready = if process.name().starts_with("orchestrator") {
            "orchestrator ready"
        } else {
            "worker ready"
        };
        process.wait_for_log(ready, Duration::from_secs(30)).await?;
        restarts += 1;
    }

    // The orchestrators listen on new ports since their restart.
    let api = fleet.api(0).await?;
    let jobs = wait_all(&api, &ids).await?;
    let failures: Vec<_> = jobs
        .iter()
        .filter(|j| j.status != v1::JobStatus::Succeeded as i32)
        .map(|j| (&j.job_id, &j.error, j.items.last()))
        .collect();
    let failed = failures.len();
    // Each call's effect, where it is not exactly once: (job index, job id,
    // counter, the call's answer).
    let mut wrong = Vec::new();
    for (job, record) in jobs.iter().enumerate() {
        let count = fleet.counter(&format!("roll:{job}")).await?;
        if count != 1 {
            wrong.push((job, &record.job_id, count, record.items.get(2)));
        }
    }
    let duplicates = wrong.len();
    println!(
        "rolling restart ({on:?}): jobs {JOBS}, calls {JOBS}, restarts {restarts}, failed {failed}, duplicates found {duplicates}"
    );
    assert_eq!(failed, 0, "{failures:#?}");
    assert_eq!(duplicates, 0, "{wrong:#?}");
    Ok(())
}

#[tokio::test]
async fn a_side_effect_whose_worker_died_is_not_run_again_blindly() -> anyhow::Result<()> {
    let (answer, executions) = kill_after_the_effect(&[]).await?;
    let error = answer.envelope.error().expect("an error envelope");
    assert_eq!(error.code.as_str(), "OUTCOME_UNKNOWN", "{}", answer.body);
    assert_eq!(error.side_effect.as_deref(), Some("unknown"));
    assert!(!error.retryable);
    assert_eq!(executions, 1, "the call was not run a second time");
    println!("outcome unknown: calls 1, kills 1, executions 1, answered OUTCOME_UNKNOWN 1");
    Ok(())
}

/// The same crash for a tool that configuration says is idempotent
/// (`runtime.tool_effects`, decision 0037): running it again is harmless,
/// so the next delivery does, and the call succeeds.
#[tokio::test]
async fn an_idempotent_tool_whose_worker_died_runs_again() -> anyhow::Result<()> {
    let idempotent = [("TOOLFLEET_RUNTIME__TOOL_EFFECTS__SET_FLAG", "idempotent")];
    let (answer, executions) = kill_after_the_effect(&idempotent).await?;
    assert!(answer.envelope.is_ok(), "{}", answer.body);
    assert_eq!(executions, 2, "run again after the crash");
    Ok(())
}

/// Publishes one `set_flag` call to two workers (with `env` beside
/// [`FAST_REDELIVERY`]), kills the worker that runs it after its effect and
/// before its result, and returns the call's answer and how many times it
/// was executed.
async fn kill_after_the_effect(
    env: &[(&str, &str)],
) -> anyhow::Result<(toolfleet_tests::fleet::Received, usize)> {
    let env: Vec<(&str, &str)> = FAST_REDELIVERY.iter().chain(env).copied().collect();
    let mut fleet = Fleet::start(test_fleet(1).worker_env(&env)).await?;
    fleet.spawn_worker().await?;
    let mut results = fleet.results("job-unknown-outcome").await?;
    let call = toolfleet_tests::fleet::call(
        "job-unknown-outcome",
        "flag_1",
        "set_flag",
        r#"{"key": "flag:1", "delay_ms": 5000}"#,
    );
    fleet.publish_call(&call).await?;
    // Whichever worker took it: kill it after the effect, before the result.
    let runner = toolfleet_tests::wait_until(
        "a worker to execute the call",
        Duration::from_secs(30),
        || async {
            fleet
                .workers()
                .iter()
                .position(|w| w.log_tail(1000).contains("executing call"))
        },
    )
    .await?;
    toolfleet_tests::wait_until("the flag to be set", Duration::from_secs(30), || async {
        fleet.counter("flag:1").await.is_ok_and(|v| v == 1)
    })
    .await?;
    fleet.worker(runner).kill();
    let answer = results.next(Duration::from_secs(30)).await?;
    Ok((answer, fleet.count_in_worker_logs("executing call")))
}

#[tokio::test]
async fn a_tool_call_longer_than_ack_wait_keeps_its_job() -> anyhow::Result<()> {
    let mut fleet = Fleet::start(test_fleet(1).worker_env(FAST_REDELIVERY)).await?;
    fleet.spawn_orchestrator(FAST_TAKEOVER).await?;
    fleet.spawn_orchestrator(FAST_TAKEOVER).await?;
    fleet.wait_for_tools(0, &["sleep"], 1).await?;
    let api = fleet.api(0).await?;
    // 5 s: longer than the job AckWait (2 s), the lease (1 s) and the call
    // AckWait (1 s) together.
    let job_id = api
        .clone()
        .submit_job(scripted(json!([
            {"tool_calls": [{"name": "sleep", "arguments": {"ms": 5000}}]},
            {"message": "done"}
        ])))
        .await?
        .into_inner()
        .job_id;
    let job = wait_finished(&api, &job_id.clone()).await?;
    assert_eq!(job.status, v1::JobStatus::Succeeded as i32);
    let events: Vec<v1::JobEvent> = api
        .clone()
        .watch_job(v1::WatchJobRequest {
            job_id,
            from_offset: 0,
        })
        .await?
        .into_inner()
        .map(|e| e.expect("an event"))
        .collect()
        .await;
    let kinds: Vec<_> = events.iter().map(|e| e.kind.as_str()).collect();
    assert!(
        !kinds.contains(&"job_resumed"),
        "the job changed hands: {kinds:?}"
    );
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == "tool_call_dispatched")
            .count(),
        1,
        "{kinds:?}"
    );
    assert_eq!(fleet.count_in_worker_logs("executing call"), 1);
    Ok(())
}

#[tokio::test]
async fn a_job_whose_queue_message_was_lost_is_swept_and_finishes() -> anyhow::Result<()> {
    use toolfleet_orchestrator::live::Live;
    use toolfleet_orchestrator::store::JobStore;
    use toolfleet_proto::names::RedisKeys;

    let mut fleet = Fleet::start(test_fleet(1)).await?;
    // A job stored without its queue message: as if the NATS store was lost
    // (or the publish failed) after the job was written.
    let store = JobStore::new(
        fleet.redis.connection().await?,
        Live::new(fleet.client.clone()),
        RedisKeys::default(),
        Duration::from_secs(60),
        Duration::from_secs(60),
    );
    let script =
        json!([{"tool_calls": [{"name": "echo", "arguments": {"n": 1}}]}, {"message": "found"}]);
    let request = scripted(script);
    let spec = toolfleet_orchestrator::job::JobSpec {
        input: request.input,
        instructions: String::new(),
        provider: toolfleet_orchestrator::job::ProviderKind::Scripted,
        model: String::new(),
        script: request.model.map(|m| m.script),
        max_tokens: None,
        stream: false,
        no_result_cache: false,
        call: None,
        tools: Vec::new(),
        max_tool_rounds: 8,
        parallel_tool_calls: true,
        deadline_ms: u64::MAX / 2,
        metadata: Default::default(),
        tenant: "default".into(),
        submitter: None,
        approval: Default::default(),
        limits: Default::default(),
        budget: Default::default(),
    };
    let (job_id, _) = store.submit(&spec, None, None).await?;

    fleet
        .spawn_orchestrator(&[
            ("TOOLFLEET_RUNNER__SWEEP_INTERVAL", "200ms"),
            ("TOOLFLEET_RUNNER__SWEEP_AFTER", "500ms"),
        ])
        .await?;
    let api = fleet.api(0).await?;
    let job = wait_finished(&api, &job_id).await?;
    assert_eq!(job.status, v1::JobStatus::Succeeded as i32, "{job:?}");
    assert_eq!(job.output_text, "found");
    fleet
        .orchestrator(0)
        .wait_for_log("re-queueing an unfinished job", Duration::from_secs(5))
        .await?;
    // Finished jobs leave the index, so they are never swept again.
    assert!(store.unfinished_before(u64::MAX, 10).await?.is_empty());
    println!("lost queue message: jobs 1, swept 1, finished 1");
    Ok(())
}

/// How long a cluster node killed under load stays down before it is
/// restarted: the shape of the fault (the others carry on without it
/// meanwhile), not a wait for anything to be ready.
const NODE_DOWN_FOR: Duration = Duration::from_secs(2);

/// kill -9 the NATS node that leads the call stream while jobs run: the
/// other two elect a new leader, every service moves to a node that is up,
/// and no call is lost or run twice. The node comes back and catches up.
#[tokio::test]
async fn cluster_killing_the_nats_node_that_leads_the_calls_stream_loses_no_call_and_repeats_no_effect()
-> anyhow::Result<()> {
    const JOBS: usize = 60;
    let mut fleet = On::Cluster
        .fleet(3, FAST_REDELIVERY, RedisConfig::default())
        .await?;
    fleet.spawn_orchestrator(FAST_TAKEOVER).await?;
    fleet.wait_for_tools(0, &["increment_counter"], 3).await?;
    let api = fleet.api(0).await?;
    let jobs = submit_rounds(&api, JOBS, "leader").await?;
    let cluster = fleet.nats.cluster();
    let js = async_nats::jetstream::new(fleet.client.clone());
    // Under load: once the first effects are done, while most calls wait.
    wait_until(
        "the first calls to run",
        Duration::from_secs(30),
        || async { fleet.counter("leader:0:0:0").await.is_ok_and(|n| n > 0) },
    )
    .await?;
    let before = cluster.stream_copies(&js, names::CALL_STREAM).await?;
    let victim = cluster.node(before.leader);
    let killed_at = std::time::Instant::now();
    victim.kill();
    let after = wait_until(
        "another node to lead the calls stream",
        Duration::from_secs(30),
        || async {
            cluster
                .stream_copies(&js, names::CALL_STREAM)
                .await
                .ok()
                .filter(|copies| copies.leader != before.leader)
        },
    )
    .await?;
    // As the test's client sees it: its own requests wait out the dead node.
    let seen_after = killed_at.elapsed();
    // A crashed server comes back after a while, with its store.
    tokio::time::sleep(NODE_DOWN_FOR).await;
    victim.restart().await?;
    let finished = futures::future::join_all(jobs).await;
    let (calls, tally) = tally_rounds(&fleet, finished, "leader").await?;
    wait_until(
        "the restarted node's copy to catch up",
        Duration::from_secs(30),
        || async {
            cluster
                .stream_copies(&js, names::CALL_STREAM)
                .await
                .is_ok_and(|copies| copies.current)
        },
    )
    .await?;
    println!(
        "calls stream leader killed (Cluster): jobs {JOBS}, calls {calls}, leader node {} killed, \
         node {} seen leading after {seen_after:.1?}, {tally}",
        before.leader, after.leader
    );
    tally.assert_truthful();
    assert_eq!(calls, JOBS * 6);
    Ok(())
}

/// A stream leader's death costs callers nothing they can see: for the job
/// stream and then the call stream, its leader is killed while jobs are
/// submitted every 50 ms; every submission is accepted (the orchestrator
/// retries the refused publishes of the election, docs/configuration.md
/// `nats.replicas`), every job succeeds, and the pauses the orchestrator
/// measured (`toolfleet_publish_pause_seconds`) are each within the bound
/// it states (`publish::RETRY_FOR`).
#[tokio::test]
async fn cluster_a_stream_leaders_death_pauses_publishes_within_the_bound_and_fails_no_caller()
-> anyhow::Result<()> {
    let metrics = toolfleet_tests::free_loopback_address()?;
    let mut fleet = On::Cluster.fleet(1, &[], RedisConfig::default()).await?;
    fleet
        .spawn_orchestrator(&[("TOOLFLEET_METRICS__LISTEN", &metrics)])
        .await?;
    fleet.wait_for_tools(0, &["echo"], 1).await?;
    let api = fleet.api(0).await?;
    let js = async_nats::jetstream::new(fleet.client.clone());
    let cluster = fleet.nats.cluster();
    let script = json!([
        {"tool_calls": [{"name": "echo", "arguments": {"n": 1}}]},
        {"message": "done"}
    ]);
    let mut jobs = Vec::new();
    for stream in [names::JOB_STREAM, names::CALL_STREAM] {
        let before = cluster.stream_copies(&js, stream).await?;
        let answered = Arc::new(AtomicUsize::new(0));
        let submitting = {
            let (api, script, answered) = (api.clone(), script.clone(), answered.clone());
            tokio::spawn(async move {
                let mut submitted = Vec::new();
                for n in 0..60 {
                    let request = scripted_job(&format!("{stream} {n}"), &script);
                    submitted.push(api.clone().submit_job(request).await);
                    answered.fetch_add(1, Ordering::SeqCst);
                    // The pace of the load, not a wait for anything.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                submitted
            })
        };
        // The leader dies with submissions on both sides of it: once ten
        // were answered, while fifty are still to come.
        wait_until("ten submissions", Duration::from_secs(30), || async {
            answered.load(Ordering::SeqCst) >= 10
        })
        .await?;
        let victim = cluster.node(before.leader);
        victim.kill();
        wait_until("a new leader", Duration::from_secs(30), || async {
            cluster
                .stream_copies(&js, stream)
                .await
                .is_ok_and(|copies| copies.leader != before.leader)
        })
        .await?;
        for submitted in submitting.await? {
            let status = submitted.map_err(|status| {
                anyhow::anyhow!("a submission failed while {stream} elected a leader: {status:?}")
            })?;
            jobs.push(status.into_inner().job_id);
        }
        tokio::time::sleep(NODE_DOWN_FOR).await;
        victim.restart().await?;
        wait_until("the node to catch up", Duration::from_secs(60), || async {
            cluster
                .stream_copies(&js, stream)
                .await
                .is_ok_and(|copies| copies.current)
        })
        .await?;
    }
    for job_id in &jobs {
        let job = wait_finished(&api, job_id).await?;
        assert_eq!(job.status, v1::JobStatus::Succeeded as i32, "{job:?}");
    }
    // Each measured pause within the stated bound: every observation is
    // in the bucket of 10 s (or under).
    let text = toolfleet_tests::http_get(&metrics, "/metrics").await?.1;
    let value = |name: &str| -> f64 {
        text.lines()
            .find(|line| line.starts_with(name))
            .and_then(|line| line.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    let mut paused = 0.0;
    for what in ["job", "call"] {
        let count = value(&format!(
            "toolfleet_publish_pause_seconds_count{{what=\"{what}\"}}"
        ));
        let within = value(&format!(
            "toolfleet_publish_pause_seconds_bucket{{what=\"{what}\",le=\"10\"}}"
        ));
        assert_eq!(within, count, "{what}: a pause over 10 s:\n{text}");
        paused += count;
    }
    assert!(paused > 0.0, "no publish waited for an election:\n{text}");
    println!(
        "stream leaders killed: {} jobs, {paused} publishes paused, each within 10 s",
        jobs.len()
    );
    Ok(())
}

/// kill -9 the Redis primary that holds the first calls' counters while
/// jobs run, on a cluster set up as docs/deploy.md asks: two replicas per
/// primary, services that wait for one after every write
/// (`redis.wait_replicas = 1`), nodes that fsync every write (`appendfsync
/// always`). A replica is promoted with every write its primary
/// acknowledged, keeps the other replica, so writes go on; every service
/// follows the cluster's new map, and no job or call is lost or run twice.
/// The killed node comes back 2 s later as a replica.
#[tokio::test]
async fn cluster_failing_over_a_redis_primary_loses_no_call_and_repeats_no_effect()
-> anyhow::Result<()> {
    const JOBS: usize = 60;
    let persistent = RedisConfig {
        append_only: true,
        ..RedisConfig::default()
    };
    // Quick redeliveries, and as many of them as a production worker gets.
    let worker_env = [
        ("TOOLFLEET_RUNTIME__ACK_WAIT", "1s"),
        ("TOOLFLEET_RUNTIME__CLAIM_LEASE", "500ms"),
    ];
    let mut fleet = Fleet::start(on_clusters(
        test_fleet(3).worker_env(&worker_env).redis(persistent),
        2,
    ))
    .await?;
    fleet.spawn_orchestrator(FAST_TAKEOVER).await?;
    fleet.wait_for_tools(0, &["increment_counter"], 3).await?;
    let api = fleet.api(0).await?;
    let jobs = submit_rounds(&api, JOBS, "failover").await?;
    let redis = fleet.redis.cluster();
    // Under load: once the first effects are done, while most calls wait.
    wait_until(
        "the first calls to run",
        Duration::from_secs(30),
        || async { fleet.counter("failover:0:0:0").await.is_ok_and(|n| n > 0) },
    )
    .await?;
    let key = "failover:0:0:0";
    let victim = redis.primary_of(key).await?;
    let killed_at = std::time::Instant::now();
    redis.node(victim).kill();
    wait_until(
        "the replica to be promoted",
        Duration::from_secs(30),
        || async { redis.primary_of(key).await.is_ok_and(|node| node != victim) },
    )
    .await?;
    let promoted_after = killed_at.elapsed();
    // A crashed server comes back after a while.
    tokio::time::sleep(NODE_DOWN_FOR).await;
    redis.node(victim).restart().await?;
    let finished = futures::future::join_all(jobs).await;
    let (calls, tally) = tally_rounds(&fleet, finished, "failover").await?;
    // The killed node back as a replica, linked.
    redis.wait_replicas_linked(Duration::from_secs(30)).await?;
    let unconfirmed = fleet.count_in_worker_logs("redis.wait_replicas")
        + fleet
            .orchestrators()
            .map(|orchestrator| {
                orchestrator
                    .log_tail(1_000_000)
                    .matches("redis.wait_replicas")
                    .count()
            })
            .sum::<usize>();
    println!(
        "Redis primary failed over (Cluster): jobs {JOBS}, calls {calls}, primary node {victim} \
         killed, replica serving after {promoted_after:.1?}, {unconfirmed} log lines of writes \
         no replica confirmed, {tally}"
    );
    tally.assert_truthful();
    assert_eq!(calls, JOBS * 6);
    assert_eq!(
        tally.ok_applied, calls,
        "every call answered ok and applied"
    );
    Ok(())
}

/// The fake Claude's two answers: the first is held after "Hello" until
/// the kill; the second, asked by the replica that takes over, says "Hello
/// again!".
fn script_a_held_hello_then_hello_again(
    claude: &toolfleet_tests::messages::MessagesServer,
) -> anyhow::Result<()> {
    use toolfleet_tests::messages::{PAUSE, Reply};
    let whole = toolfleet_tests::messages::hello_stream()?;
    let second = whole
        .find("event: content_block_delta\ndata: {\"type\": \"content_block_delta\", \"index\": 0, \"delta\": {\"type\": \"text_delta\", \"text\": \"!\"}}")
        .expect("the second delta");
    claude.push(Reply::Stream(format!(
        "{}{PAUSE}{}",
        &whole[..second],
        &whole[second..]
    )));
    claude.push(Reply::Stream(
        whole.replace(r#""text": "!""#, r#""text": " again!""#),
    ));
    Ok(())
}

/// The watched deltas: "Hello" first, unmarked; the next marked
/// `restarted`, and from it on the new answer, `output`; all of turn 0.
fn the_second_runs_deltas_say_restarted(deltas: &[Value], output: &str) {
    assert_eq!(
        deltas
            .first()
            .map(|d| (d["text"].clone(), d.get("restarted").cloned())),
        Some((json!("Hello"), None)),
        "{deltas:?}"
    );
    let restart = deltas
        .iter()
        .position(|d| d["restarted"] == true)
        .unwrap_or_else(|| panic!("no delta says restarted: {deltas:?}"));
    assert_eq!(restart, 1, "the new run's first delta says so: {deltas:?}");
    let again: String = deltas[restart..]
        .iter()
        .map(|d| d["text"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(again, output, "{deltas:?}");
    assert!(deltas.iter().all(|d| d["turn"] == 0), "{deltas:?}");
}

/// kill -9 of the orchestrator that streams a turn: the turn was not
/// checkpointed, so the replica that takes the job over asks the model
/// again, as after any crash, and a client watching on that replica sees
/// the new answer's first delta marked `restarted` (what it had of the
/// turn is void), then the new answer, then the one stored turn.
#[tokio::test]
async fn a_streamed_turn_whose_orchestrator_died_is_asked_again_and_marked_restarted()
-> anyhow::Result<()> {
    use toolfleet_tests::messages::MessagesServer;
    let claude = MessagesServer::start("sk-ant-test").await?;
    script_a_held_hello_then_hello_again(&claude)?;
    let base_url = claude.base_url();
    let env: Vec<(&str, &str)> = FAST_TAKEOVER
        .iter()
        .copied()
        .chain([
            ("ANTHROPIC_API_KEY", "sk-ant-test"),
            ("TOOLFLEET_ANTHROPIC__BASE_URL", base_url.as_str()),
        ])
        .collect();
    let mut fleet = Fleet::start(test_fleet(0)).await?;
    // The first replica alone takes the job; the second watches it.
    let first = fleet.spawn_orchestrator(&env).await?;
    let job_id = fleet
        .api(first)
        .await?
        .submit_job(toolfleet_tests::messages::streamed_job("Hello"))
        .await?
        .into_inner()
        .job_id;
    wait_until("the model to be asked", Duration::from_secs(30), || async {
        (claude.requests().len() == 1).then_some(())
    })
    .await?;
    let survivor = fleet.spawn_orchestrator(&env).await?;
    let api = fleet.api(survivor).await?;
    let mut watch = toolfleet_tests::fleet::watch(&api, &job_id).await?;
    while let Some(event) = watch.message().await? {
        if event.kind == "job_started" {
            break;
        }
    }
    claude.release_stream();
    let mut deltas = Vec::new();
    while let Some(event) = watch.message().await? {
        if event.kind == "model_output_delta" {
            deltas.push(serde_json::from_str::<Value>(&event.data)?);
            break;
        }
    }
    fleet.orchestrator(first).kill();
    wait_until(
        "the model to be asked again",
        Duration::from_secs(60),
        || async { (claude.requests().len() == 2).then_some(()) },
    )
    .await?;
    // The killed run's held stream may still wait for a release: enough
    // for both.
    for _ in 0..2 {
        claude.release_stream();
    }
    let mut kinds = Vec::new();
    while let Some(event) = watch.message().await? {
        if event.kind == "model_output_delta" {
            deltas.push(serde_json::from_str::<Value>(&event.data)?);
        }
        kinds.push(event.kind.clone());
        if event.r#final {
            break;
        }
    }
    let job = wait_finished(&api, &job_id).await?;
    assert_eq!(job.status, v1::JobStatus::Succeeded as i32, "{job:?}");
    assert_eq!(job.output_text, "Hello again!");
    the_second_runs_deltas_say_restarted(&deltas, &job.output_text);
    let turns = kinds.iter().filter(|k| *k == "model_turn").count();
    assert_eq!(turns, 1, "one stored turn: {kinds:?}");
    assert_eq!(claude.refusals(), Vec::<String>::new());
    println!(
        "streamed turn restarted: kills 1, model asked 2, deltas {}",
        deltas.len()
    );
    Ok(())
}
