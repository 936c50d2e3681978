//! Fault tests, part two: after any fault, the model is told the truth about
//! every call. An effect that happened must never be reported as a failure
//! ("no such tool", "not run"), because a real model would call again. Each
//! test replays a sequence that once produced a wrong answer.

use std::time::Duration;

use serde_json::json;
use toolfleet_proto::v1::{self, item::Kind};
use toolfleet_tests::RedisConfig;
use toolfleet_tests::fleet::{Fleet, call, run_job, scripted_job, test_fleet, wait_finished};
use toolfleet_tests::tally::answer_of;

/// Short runner timers: a dead orchestrator's jobs move within seconds.
const FAST_TAKEOVER: &[(&str, &str)] = &[
    ("TOOLFLEET_RUNNER__JOB_ACK_WAIT", "2s"),
    ("TOOLFLEET_RUNNER__LEASE_TTL", "1s"),
    ("TOOLFLEET_RUNNER__DRAIN_TIMEOUT", "1s"),
];

const WAIT: Duration = Duration::from_secs(60);

/// An orchestrator dies while a call runs; the worker stores the call's ok
/// result and stops (so no worker announces the tool any more); then an
/// orchestrator resumes the job. The call was dispatched and applied: the
/// model must get its stored result, not `UNKNOWN_TOOL`.
#[tokio::test]
async fn a_resumed_round_answers_a_dispatched_call_from_its_stored_result() -> anyhow::Result<()> {
    let mut fleet = Fleet::start(test_fleet(1)).await?;
    fleet.spawn_orchestrator(FAST_TAKEOVER).await?;
    fleet.wait_for_tools(0, &["increment_counter"], 1).await?;
    let api = fleet.api(0).await?;
    let script = json!([
        {"tool_calls": [{"name": "increment_counter",
                         "arguments": {"key": "resumed:1", "delay_ms": 3000}}]},
        {"message": "done"}
    ]);
    let job_id = api
        .clone()
        .submit_job(scripted_job("resume", &script))
        .await?
        .into_inner()
        .job_id;
    toolfleet_tests::wait_until("the effect", WAIT, || async {
        fleet.counter("resumed:1").await.is_ok_and(|n| n == 1)
    })
    .await?;
    fleet.orchestrator(0).kill();
    // The first attempt of the model's first call, as dispatched.
    let wire_ids = fleet.dispatched_wire_ids(&job_id).await?;
    let [wire_id] = wire_ids.as_slice() else {
        anyhow::bail!("one call was dispatched, not {wire_ids:?}");
    };
    let dispatched = call(&job_id, wire_id, "increment_counter", "{}");
    let stored = toolfleet_tests::wait_until("the worker to store its result", WAIT, || async {
        fleet.stored_result(&dispatched).await.ok().flatten()
    })
    .await?;
    assert!(stored.is_ok(), "{stored:?}");
    fleet.worker(0).stop(Duration::from_secs(30)).await?;
    fleet.orchestrator(0).respawn()?;
    let api = fleet.api(0).await?;
    let job = wait_finished(&api, &job_id).await?;
    assert_eq!(job.status, v1::JobStatus::Succeeded as i32, "{job:?}");
    let answered = answer_of(&job, "call_0_0");
    assert!(
        answered.is_ok(),
        "the effect happened, so the model must be told so: {answered:?}"
    );
    assert_eq!(fleet.counter("resumed:1").await?, 1);
    println!(
        "resumed round: jobs 1, calls 1, orchestrator kills 1, answered from the stored result 1"
    );
    Ok(())
}

/// A side-effecting call runs, and Redis dies before its result is stored;
/// while Redis is down, every delivery is handed back, more times than
/// `max_deliveries` allows. Hand-backs are not crashes: once Redis is back,
/// the call is settled by its probe (the effect happened once), not answered
/// `MAX_DELIVERIES_EXCEEDED`.
#[tokio::test]
async fn hand_backs_during_a_redis_outage_do_not_make_a_call_poison() -> anyhow::Result<()> {
    let env = [
        ("TOOLFLEET_RUNTIME__ACK_WAIT", "1s"),
        ("TOOLFLEET_RUNTIME__CLAIM_LEASE", "500ms"),
        ("TOOLFLEET_RUNTIME__MAX_DELIVERIES", "2"),
    ];
    let redis = RedisConfig {
        append_only: true,
        ..Default::default()
    };
    let fleet = Fleet::start(test_fleet(1).worker_env(&env).redis(redis)).await?;
    let mut results = fleet.results("job-outage").await?;
    let applied = call(
        "job-outage",
        "call_1",
        "increment_counter",
        r#"{"key": "outage:1", "delay_ms": 2000}"#,
    );
    fleet.publish_call(&applied).await?;
    toolfleet_tests::wait_until("the effect", WAIT, || async {
        fleet.counter("outage:1").await.is_ok_and(|n| n == 1)
    })
    .await?;
    // Down before the tool returns: its result cannot be stored. Every Redis
    // command now waits out the client's reconnect attempts (seconds), so
    // the execution gives up late: it fails to store its result or, if a
    // redelivery took over meanwhile, to release the claim.
    fleet.redis.server().kill();
    toolfleet_tests::wait_until("the execution to give up", 2 * WAIT, || async {
        let log = fleet.worker(0).log_tail(1_000_000);
        log.contains("could not store the result") || log.contains("could not release the claim")
    })
    .await?;
    // Then more hand-backs than max_deliveries allows, while Redis stays down.
    let before = fleet.count_in_worker_logs("redis unavailable");
    toolfleet_tests::wait_until("hand-backs past max_deliveries", WAIT, || async {
        fleet.count_in_worker_logs("redis unavailable") >= before + 3
    })
    .await?;
    fleet.redis.server().restart().await?;
    let answer = results.next(WAIT).await?;
    assert!(
        answer.envelope.is_ok(),
        "the effect happened once, so the answer must say so: {}",
        answer.body
    );
    assert_eq!(fleet.counter("outage:1").await?, 1, "applied once");
    assert_eq!(fleet.count_in_worker_logs("executing call"), 1, "run once");
    let hand_backs = fleet.count_in_worker_logs("redis unavailable");
    println!("redis outage: calls 1, hand-backs {hand_backs}, executions 1, answered ok 1");
    Ok(())
}

/// NATS is down for longer than the registry TTL, so every announcement has
/// expired when the job's next turn calls a tool the model was offered in
/// its first turn. No worker serves it at that moment, but the tool is not
/// unknown: the call waits in the stream for its workers and is answered by
/// them once NATS is back.
#[tokio::test]
async fn a_tool_unannounced_during_a_nats_outage_is_not_unknown() -> anyhow::Result<()> {
    let registry = [
        ("TOOLFLEET_REGISTRY__TTL", "2s"),
        ("TOOLFLEET_REGISTRY__HEARTBEAT_INTERVAL", "500ms"),
    ];
    let mut fleet = Fleet::start(test_fleet(1).worker_env(&registry)).await?;
    fleet.spawn_orchestrator(&registry[..1]).await?;
    fleet.wait_for_tools(0, &["echo"], 1).await?;
    let api = fleet.api(0).await?;
    let script = json!([
        {"tool_calls": [{"name": "echo", "arguments": {"turn": 0}}]},
        // Long enough for every announcement to expire while NATS is down.
        {"delay_ms": 4000, "tool_calls": [{"name": "echo", "arguments": {"turn": 1}}]},
        {"message": "done"}
    ]);
    let job_id = api
        .clone()
        .submit_job(scripted_job("outage", &script))
        .await?
        .into_inner()
        .job_id;
    let get = |api: &toolfleet_tests::fleet::ApiClient| {
        let (mut api, job_id) = (api.clone(), job_id.clone());
        async move {
            let request = v1::GetJobRequest { job_id };
            anyhow::Ok(api.get_job(request).await?.into_inner())
        }
    };
    toolfleet_tests::wait_until("the first call's answer", WAIT, || async {
        get(&api).await.is_ok_and(|job| results(&job) >= 1)
    })
    .await?;
    fleet.nats.server().kill();
    // The second turn's call is checked while NATS is down and no tool is
    // live: it is either published (and waits) or, wrongly, answered.
    let orchestrator = fleet.orchestrator(0);
    toolfleet_tests::wait_until(
        "the second call to be dispatched or answered",
        WAIT,
        || async {
            orchestrator
                .log_tail(10_000)
                .contains("publishing the call failed")
                || get(&api).await.is_ok_and(|job| results(&job) >= 2)
        },
    )
    .await?;
    fleet.nats.server().restart().await?;
    let job = wait_finished(&api, &job_id).await?;
    assert_eq!(job.status, v1::JobStatus::Succeeded as i32, "{job:?}");
    let second = answer_of(&job, "call_1_0");
    assert!(
        second.is_ok(),
        "the tool was offered and its worker came back: {second:?}"
    );
    println!("nats outage: jobs 1, calls 2, answered by the worker after the outage 1");
    Ok(())
}

/// How many calls of `job` have their answer.
fn results(job: &v1::Job) -> usize {
    job.items
        .iter()
        .filter(|item| matches!(item.kind, Some(Kind::ToolResult(_))))
        .count()
}

/// The services' health endpoints, asked as exec probes ask them.
struct Probes {
    worker: String,
    orchestrator: String,
}

impl Probes {
    /// `toolfleet-worker healthcheck` and `toolfleet-orchestrator
    /// healthcheck` (`--live` if `live`): both must answer alike.
    fn probe(&self, live: bool) -> anyhow::Result<bool> {
        let ask = |binary: &str, listen: &str| {
            let mut command = std::process::Command::new(toolfleet_tests::cargo_bin(binary)?);
            command.args(["healthcheck", "--metrics-listen", listen]);
            if live {
                command.arg("--live");
            }
            anyhow::Ok(command.output()?.status.success())
        };
        let worker = ask("toolfleet-worker", &self.worker)?;
        let orchestrator = ask("toolfleet-orchestrator", &self.orchestrator)?;
        anyhow::ensure!(
            worker == orchestrator,
            "the worker says {worker}, the orchestrator {orchestrator} (live: {live})"
        );
        Ok(worker)
    }
}

type HealthClient = tonic_health::pb::health_client::HealthClient<tonic::transport::Channel>;

/// The gRPC health of `service`.
async fn health_of(health: &HealthClient, service: &str) -> anyhow::Result<i32> {
    let request = tonic_health::pb::HealthCheckRequest {
        service: service.to_owned(),
    };
    Ok(health.clone().check(request).await?.into_inner().status)
}

/// The orchestrator listens at once: its gRPC health says it is not
/// serving yet, and its API asks to retry. Returns its health client.
async fn not_serving_yet(fleet: &Fleet, orchestrator: usize) -> anyhow::Result<HealthClient> {
    let listening = fleet
        .orchestrator(orchestrator)
        .wait_for_log("grpc listening", WAIT)
        .await?;
    let address = toolfleet_fleet::supervisor::logged_grpc_url(&listening)
        .expect("the line names the address");
    let channel = tonic::transport::Endpoint::from_shared(address.clone())?
        .connect()
        .await?;
    let health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let not_serving = tonic_health::pb::health_check_response::ServingStatus::NotServing as i32;
    for service in ["", "toolfleet.v1.AgentService"] {
        assert_eq!(
            health_of(&health, service).await?,
            not_serving,
            "health of {service:?}"
        );
    }
    let mut early = v1::agent_service_client::AgentServiceClient::new(channel);
    let refused = early
        .list_tools(v1::ListToolsRequest::default())
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    Ok(health)
}

/// An orchestrator and a worker start while NATS and Redis are down (a
/// failover, pods starting in any order). They wait for each, saying so,
/// instead of exiting; once both are up they serve, and a job runs end to end.
#[tokio::test]
async fn services_started_while_nats_and_redis_are_down_wait_for_them() -> anyhow::Result<()> {
    // The services' health endpoints, on ports free right now.
    let (health, orchestrator_health) = (
        toolfleet_tests::free_loopback_address()?,
        toolfleet_tests::free_loopback_address()?,
    );
    let mut fleet =
        Fleet::start(test_fleet(0).worker_env(&[("TOOLFLEET_METRICS__LISTEN", &health)])).await?;
    fleet.nats.server().kill();
    fleet.redis.server().kill();
    let worker = fleet.start_worker()?;
    let orchestrator =
        fleet.start_orchestrator(&[("TOOLFLEET_METRICS__LISTEN", &orchestrator_health)])?;
    let probes = Probes {
        worker: health,
        orchestrator: orchestrator_health,
    };
    let probe = |live| probes.probe(live);
    let health = not_serving_yet(&fleet, orchestrator).await?;
    for (server, waiting) in [("NATS", "waiting for NATS"), ("Redis", "waiting for Redis")] {
        for process in [fleet.worker(worker), fleet.orchestrator(orchestrator)] {
            process.wait_for_log(waiting, WAIT).await?;
            assert!(
                process.is_running(),
                "{} gave up on {server}",
                process.name()
            );
        }
        // Alive, not ready: an orchestrator would not route to it, and a
        // liveness probe must not restart it.
        toolfleet_tests::wait_until("the worker to answer its liveness probe", WAIT, || async {
            probe(true).unwrap_or(false)
        })
        .await?;
        assert!(!probe(false)?, "not ready while waiting for {server}");
        match server {
            "NATS" => fleet.nats.server().restart().await?,
            _ => fleet.redis.server().restart().await?,
        }
    }
    fleet
        .worker(worker)
        .wait_for_log("worker ready", WAIT)
        .await?;
    toolfleet_tests::wait_until("the worker to answer its readiness probe", WAIT, || async {
        probe(false).unwrap_or(false)
    })
    .await?;
    fleet
        .wait_for_tools(orchestrator, &["calculate"], 1)
        .await?;
    let serving_now = tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
    assert_eq!(health_of(&health, "").await?, serving_now);
    let api = fleet.api(orchestrator).await?;
    let script = json!([
        {"tool_calls": [{"name": "calculate", "arguments": {"expression": "2+2"}}]},
        {"message": "{{call_0_0.data.result}}"}
    ]);
    let job = run_job(&api, scripted_job("late redis", &script)).await?;
    assert_eq!(job.status, v1::JobStatus::Succeeded as i32, "{job:?}");
    assert_eq!(job.output_text, "4");
    println!("late redis: processes 2, exits 0, jobs 1 succeeded");
    Ok(())
}
