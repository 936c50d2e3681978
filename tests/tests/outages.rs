//! The long fault suite: worker chaos through 30-second outages of NATS and
//! of Redis, under the default timers (AckWait 30 s, claim lease 15 s,
//! registry TTL 15 s, `max_deliveries` 5). It takes a few minutes, so the
//! README's test command leaves it out and `.ci/run` runs it after.
//!
//! What it holds: every job ends, no effect runs twice, and no call's answer
//! disagrees with its effect.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use toolfleet_proto::v1;
use toolfleet_tests::RedisConfig;
use toolfleet_tests::fleet::{ApiClient, Fleet, scripted_job, test_fleet};
use toolfleet_tests::tally::{Tally, answer_of};

const JOBS: usize = 60;
/// Rounds of one side-effecting call per job.
const ROUNDS: usize = 6;
const OUTAGE: Duration = Duration::from_secs(30);
/// Jobs outlive both outages and the redeliveries after them.
const FINISH: Duration = Duration::from_secs(600);

/// Polls every job until it ended, then returns them all.
async fn wait_all(api: &ApiClient, ids: &[String]) -> anyhow::Result<Vec<v1::Job>> {
    let mut done = Vec::new();
    for id in ids {
        let job = toolfleet_tests::wait_until(&format!("job {id} to end"), FINISH, || {
            let mut api = api.clone();
            let request = v1::GetJobRequest { job_id: id.clone() };
            async move {
                let job = api.get_job(request).await.ok()?.into_inner();
                let ended = [
                    v1::JobStatus::Succeeded,
                    v1::JobStatus::Failed,
                    v1::JobStatus::Cancelled,
                ]
                .iter()
                .any(|s| *s as i32 == job.status);
                ended.then_some(job)
            }
        })
        .await?;
        done.push(job);
    }
    Ok(done)
}

#[tokio::test]
async fn worker_chaos_through_nats_and_redis_outages_tells_the_truth() -> anyhow::Result<()> {
    let redis = RedisConfig {
        append_only: true,
        ..Default::default()
    };
    let mut fleet = Fleet::start(test_fleet(3).redis(redis)).await?;
    fleet.spawn_orchestrator(&[]).await?;
    fleet.wait_for_tools(0, &["increment_counter"], 3).await?;
    let api = fleet.api(0).await?;
    let mut ids = Vec::new();
    for job in 0..JOBS {
        // Each job thinks 10-14 s before each of its rounds, so that its six
        // calls spread over both outages.
        let round = |r: usize| {
            let think = 10_000 + (job * 173 + r * 611) % 4_000;
            json!({"delay_ms": think, "tool_calls": [{"name": "increment_counter",
                   "arguments": {"key": format!("outage:{job}:{r}"), "delay_ms": 300}}]})
        };
        let mut script: Vec<Value> = (0..ROUNDS).map(round).collect();
        script.push(json!({"message": "done"}));
        let script = Value::Array(script);
        let submitted = api
            .clone()
            .submit_job(scripted_job("outages", &script))
            .await?;
        ids.push(submitted.into_inner().job_id);
    }
    let kills = Arc::new(AtomicUsize::new(0));
    // Workers die and come back all along: kill -9 one every 0.3-1.5 s.
    let chaos = async {
        let mut n = 0usize;
        loop {
            let pause = 300 + (n * 397) % 1200;
            tokio::time::sleep(Duration::from_millis(pause as u64)).await;
            n += 1;
            let victim = &fleet.workers()[n % fleet.workers().len()];
            if victim.is_running() {
                victim.kill();
                kills.fetch_add(1, Ordering::SeqCst);
            }
            for worker in fleet.workers() {
                if !worker.is_running() {
                    let _ = worker.respawn();
                }
            }
        }
    };
    // NATS, then Redis, each down for 30 s while the jobs run.
    let outages = async {
        tokio::time::sleep(Duration::from_secs(5)).await;
        fleet.nats.server().kill();
        tokio::time::sleep(OUTAGE).await;
        fleet.nats.server().restart().await?;
        tokio::time::sleep(Duration::from_secs(5)).await;
        fleet.redis.server().kill();
        tokio::time::sleep(OUTAGE).await;
        fleet.redis.server().restart().await?;
        anyhow::Ok(())
    };
    let jobs = tokio::select! {
        jobs = async {
            outages.await?;
            wait_all(&api, &ids).await
        } => jobs?,
        () = chaos => unreachable!("the chaos never ends"),
    };
    let mut tally = Tally::default();
    for (i, job) in jobs.iter().enumerate() {
        assert_eq!(
            job.status,
            v1::JobStatus::Succeeded as i32,
            "job {i}: {job:?}"
        );
        for r in 0..ROUNDS {
            let call_id = format!("call_{r}_0");
            let effect = fleet.counter(&format!("outage:{i}:{r}")).await?;
            tally.add(
                &format!("job {i} {call_id}"),
                &answer_of(job, &call_id),
                effect,
            );
        }
    }
    println!(
        "worker chaos with 30 s NATS and Redis outages: jobs {JOBS}, calls {}, worker kills {}, {tally}",
        JOBS * ROUNDS,
        kills.load(Ordering::SeqCst)
    );
    tally.assert_truthful();
    Ok(())
}
