//! The long fault suite: worker chaos through 30-second outages of NATS and
//! of Redis, under the default timers (AckWait 30 s, claim lease 15 s,
//! registry TTL 15 s, `max_deliveries` 5); and parked jobs decided through
//! kill -9 of orchestrators and restarts of NATS and Redis. It takes a few
//! minutes, so the README's test command leaves it out and `.ci/run` runs
//! it after.
//!
//! What it holds: every job ends, no effect runs twice, no call's answer
//! disagrees with its effect, and every approved call runs once.

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

/// Polls every job until it ended, `within` from now, then returns them
/// all.
async fn wait_all(
    api: &ApiClient,
    ids: &[String],
    within: Duration,
) -> anyhow::Result<Vec<v1::Job>> {
    let deadline = std::time::Instant::now() + within;
    let mut done = Vec::new();
    for id in ids {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let job = toolfleet_tests::wait_until(&format!("job {id} to end"), left, || {
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
            wait_all(&api, &ids, FINISH).await
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

/// Jobs of three held calls each, in the approvals chaos.
const PARKED_JOBS: usize = 16;
const HELD: usize = 3;
/// Each held call is approved, rejected, or left to expire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    Approve,
    Reject,
    Expire,
}

/// A fixed pseudo-random plan: about half approved, a third rejected, the
/// rest left to expire.
fn plan(job: usize, call: usize) -> Plan {
    match (job * 7 + call * 13 + job * call) % 10 {
        0..=4 => Plan::Approve,
        5..=7 => Plan::Reject,
        _ => Plan::Expire,
    }
}

/// The order a client decides in: every decided call, shuffled by `seed`
/// (xorshift, so that a failure names its order).
fn order(seed: u64) -> Vec<(usize, usize)> {
    let mut calls: Vec<(usize, usize)> = (0..PARKED_JOBS)
        .flat_map(|job| (0..HELD).map(move |call| (job, call)))
        .filter(|(job, call)| plan(*job, *call) != Plan::Expire)
        .collect();
    let mut state = seed | 1;
    for i in (1..calls.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        calls.swap(i, (state % (i as u64 + 1)) as usize);
    }
    calls
}

/// Short timers: a dead orchestrator's jobs move within seconds, and the
/// sweeper's bound (sweep_after + sweep_interval) is 3 s.
const APPROVAL_TIMERS: &[(&str, &str)] = &[
    ("TOOLFLEET_RUNNER__JOB_ACK_WAIT", "2s"),
    ("TOOLFLEET_RUNNER__LEASE_TTL", "1s"),
    ("TOOLFLEET_RUNNER__DRAIN_TIMEOUT", "1s"),
    ("TOOLFLEET_RUNNER__SWEEP_AFTER", "2s"),
    ("TOOLFLEET_RUNNER__SWEEP_INTERVAL", "1s"),
    ("TOOLFLEET_APPROVAL__TIMEOUT", "60s"),
];

/// The replicas' API clients, a new one for each replica the chaos starts
/// (a replica listens on a port of its own).
type Replicas = std::sync::Mutex<Vec<ApiClient>>;

/// Submits the parked jobs, alternately through `apis`, each holding three
/// `increment_counter` calls for approval; returns their ids once each is
/// waiting for approval.
async fn park_jobs(apis: &[ApiClient; 2]) -> anyhow::Result<Vec<String>> {
    let mut ids = Vec::new();
    for job in 0..PARKED_JOBS {
        let calls: Vec<Value> = (0..HELD)
            .map(|call| {
                json!({"id": format!("c{call}"), "name": "increment_counter",
                       "arguments": {"key": format!("approval:{job}:{call}")}})
            })
            .collect();
        let script = json!([{"tool_calls": calls}, {"message": "done"}]);
        let mut request = scripted_job("three held calls", &script);
        request.require_approval = vec!["increment_counter".into()];
        let submitted = apis[job % 2].clone().submit_job(request).await?;
        ids.push(submitted.into_inner().job_id);
    }
    for id in &ids {
        toolfleet_tests::wait_until(&format!("job {id} to park"), FINISH, || {
            let mut api = apis[0].clone();
            let request = v1::GetJobRequest { job_id: id.clone() };
            async move {
                let job = api.get_job(request).await.ok()?.into_inner();
                (job.status() == v1::JobStatus::WaitingForApproval).then_some(())
            }
        })
        .await?;
    }
    Ok(ids)
}

/// A client deciding every call of its `order(seed)` by the plan, turn by
/// turn through every replica, retrying what could not be answered (a dead
/// replica, Redis down) on the next, and counting those retries.
async fn decide(
    seed: u64,
    ids: &[String],
    live: &Replicas,
    retried: &AtomicUsize,
) -> anyhow::Result<()> {
    let client = |n: usize| {
        let live = live.lock().expect("not poisoned");
        live[n % live.len()].clone()
    };
    let mut turn = seed as usize;
    for (job, call) in order(seed) {
        let decision = match plan(job, call) {
            Plan::Approve => v1::Decision::Approve,
            _ => v1::Decision::Reject,
        };
        let request = v1::DecideCallRequest {
            job_id: ids[job].clone(),
            call_id: format!("c{call}"),
            decision: decision as i32,
            reason: format!("plan of client {seed}"),
            ..Default::default()
        };
        let what = format!("job {job} call c{call} to be decided");
        // A person's pace, so that the chaos falls among decisions.
        tokio::time::sleep(Duration::from_millis(120)).await;
        toolfleet_tests::wait_until(&what, FINISH, || {
            turn += 1;
            let mut api = client(turn);
            let request = request.clone();
            async move {
                match api.decide_call(request).await {
                    Ok(_) => Some(Ok(())),
                    // A replica killed mid-request closes the connection
                    // under it, which tonic reports as `Cancelled`.
                    Err(status)
                        if matches!(
                            status.code(),
                            tonic::Code::Unavailable
                                | tonic::Code::Unknown
                                | tonic::Code::Cancelled
                        ) =>
                    {
                        retried.fetch_add(1, Ordering::SeqCst);
                        None
                    }
                    Err(status) => Some(Err(status)),
                }
            }
        })
        .await?
        .map_err(|status| anyhow::anyhow!("{what}: {status:?}"))?;
    }
    Ok(())
}

/// kill -9 of the oldest replica, then a new one (added to `live`), three
/// times; then NATS and Redis restarted.
async fn kill_and_restart(fleet: &mut Fleet, live: &Replicas) -> anyhow::Result<()> {
    let pause = || tokio::time::sleep(Duration::from_millis(400));
    for victim in 0..3 {
        pause().await;
        fleet.orchestrator(victim).kill();
        pause().await;
        let started = fleet.spawn_orchestrator(APPROVAL_TIMERS).await?;
        let api = fleet.api(started).await?;
        live.lock().expect("not poisoned").push(api);
    }
    fleet.nats.server().kill();
    pause().await;
    fleet.nats.server().restart().await?;
    fleet.redis.server().kill();
    pause().await;
    fleet.redis.server().restart().await?;
    Ok(())
}

/// Every approved call runs by `bound`.
async fn approved_calls_run_by(
    fleet: &Fleet,
    ids: &[String],
    bound: std::time::Instant,
) -> anyhow::Result<()> {
    for (job, id) in ids.iter().enumerate() {
        for call in (0..HELD).filter(|call| plan(job, *call) == Plan::Approve) {
            let key = format!("approval:{job}:{call}");
            let what = format!("job {id} to run {key} within the bound");
            let left = bound.saturating_duration_since(std::time::Instant::now());
            toolfleet_tests::wait_until(&what, left, || {
                let key = key.clone();
                async move { (fleet.counter(&key).await.ok()? == 1).then_some(()) }
            })
            .await?;
        }
    }
    Ok(())
}

/// Every job once ended (the undecided calls expire 60 s after they were
/// held), or each job's status and events printed and the error.
async fn all_ended(api: &ApiClient, ids: &[String]) -> anyhow::Result<Vec<v1::Job>> {
    match wait_all(api, ids, Duration::from_secs(120)).await {
        Ok(jobs) => Ok(jobs),
        Err(err) => {
            for id in ids {
                let request = v1::GetJobRequest { job_id: id.clone() };
                let job = api.clone().get_job(request).await?.into_inner();
                let events = toolfleet_tests::fleet::events(api, id).await?;
                println!("{id}: {:?} {events:?}", job.status());
            }
            Err(err)
        }
    }
}

/// Every job succeeded, and each call's effect and answer follow its plan:
/// approved ran once and answered ok, rejected and expired never ran and
/// say so. Returns how many calls ran.
async fn effects_follow_the_plan(fleet: &Fleet, jobs: &[v1::Job]) -> anyhow::Result<i64> {
    let mut ran = 0;
    for (job, finished) in jobs.iter().enumerate() {
        assert_eq!(
            finished.status(),
            v1::JobStatus::Succeeded,
            "job {job}: {finished:?}"
        );
        for call in 0..HELD {
            let effect = fleet.counter(&format!("approval:{job}:{call}")).await?;
            let answer = answer_of(finished, &format!("c{call}"));
            let (runs, code) = match plan(job, call) {
                Plan::Approve => (1, None),
                Plan::Reject => (0, Some("REJECTED_BY_APPROVER")),
                Plan::Expire => (0, Some("APPROVAL_EXPIRED")),
            };
            assert_eq!(effect, runs, "job {job} call c{call}: {answer:?}");
            let error = answer.error().map(|e| e.code.to_string());
            assert_eq!(error.as_deref(), code, "job {job} call c{call}: {answer:?}");
            ran += effect;
        }
    }
    Ok(ran)
}

/// Approvals through chaos (decision 0036): parked jobs holding three
/// calls each are decided by two clients through both orchestrators, each
/// in its own random order, with the same plan (so each decision races its
/// double, as a retry on another replica would), while orchestrators are
/// killed with kill -9 and NATS and Redis restart. Every decision is
/// answered OK once the fleet is back (a retry is told the first); every
/// approved call runs exactly once, within the sweeper's bound once the
/// chaos is over; no rejected or expired call ever runs.
#[tokio::test]
async fn approvals_through_kills_and_restarts_run_each_approved_call_once() -> anyhow::Result<()> {
    let redis = RedisConfig {
        append_only: true,
        ..Default::default()
    };
    let mut fleet = Fleet::start(test_fleet(1).redis(redis)).await?;
    for _ in 0..2 {
        fleet.spawn_orchestrator(APPROVAL_TIMERS).await?;
    }
    fleet.wait_for_tools(0, &["increment_counter"], 1).await?;
    let apis = [fleet.api(0).await?, fleet.api(1).await?];
    let ids = park_jobs(&apis).await?;
    let live = Replicas::new(apis.to_vec());
    let retried = AtomicUsize::new(0);
    let (first, second, chaos) = tokio::join!(
        decide(0x9e37_79b9, &ids, &live, &retried),
        decide(0x85eb_ca6b, &ids, &live, &retried),
        kill_and_restart(&mut fleet, &live)
    );
    first?;
    second?;
    chaos?;
    // Every approved call runs within the sweeper's bound of the last
    // decision (3 s here, and a generous allowance for the replicas that
    // just restarted), long before any expiry (60 s).
    let decided_at = std::time::Instant::now();
    approved_calls_run_by(&fleet, &ids, decided_at + Duration::from_secs(30)).await?;
    let ran_within = decided_at.elapsed();
    let api = fleet.api(fleet.orchestrators().count() - 1).await?;
    let jobs = all_ended(&api, &ids).await?;
    let ran = effects_follow_the_plan(&fleet, &jobs).await?;
    let retried = retried.load(Ordering::SeqCst);
    println!(
        "approvals through kills and restarts: jobs {PARKED_JOBS}, held calls {}, approved calls run {ran} \
         (each once), every one within {ran_within:?} of the last decision; decisions tried again \
         after no answer: {retried}",
        PARKED_JOBS * HELD
    );
    assert!(retried > 0, "the chaos fell among the decisions");
    Ok(())
}
