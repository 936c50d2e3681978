//! Shutdown within the drain time, whatever NATS and Redis do: each service,
//! with slow calls in flight, gets SIGTERM while NATS is killed, while NATS
//! is frozen (SIGSTOP: requests hang rather than fail), or while Redis is
//! killed, and exits within its `drain_timeout` and the margin
//! docs/configuration.md states (`SHUTDOWN_MARGIN`, 5 s); on a 3-node NATS
//! cluster (the cluster suite), the same with a node killed. It exits with
//! status 0: its drain ended by itself, each step bounded, rather than being
//! cut by the watchdog (status 1). An open `WatchJob` stream ends with
//! `UNAVAILABLE` at the signal and holds no drain.

use std::process::ExitStatus;
use std::time::{Duration, Instant};

use serde_json::json;
use toolfleet_proto::v1;
use toolfleet_service::binary::SHUTDOWN_MARGIN;
use toolfleet_tests::ChildProcess;
use toolfleet_tests::fleet::{Fleet, on_clusters, scripted_job, test_fleet};

/// Both services' drain time in these tests.
const DRAIN: Duration = Duration::from_secs(2);
/// What the test allows on top of the stated bound: the process's own exit
/// and the test's polling.
const SLACK: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Copy)]
enum Fault {
    NatsKilled,
    NatsFrozen,
    RedisKilled,
    /// On a cluster: the node of the three that leads the call stream.
    NatsNodeKilled,
}

#[derive(Debug, Clone, Copy)]
enum Service {
    Orchestrator,
    Worker,
}

/// Runs slow jobs, applies `fault`, sends SIGTERM to `service` and returns
/// how long it took to exit, and its status.
async fn exit_time(service: Service, fault: Fault) -> anyhow::Result<(Duration, ExitStatus)> {
    let drain = format!("{}s", DRAIN.as_secs());
    let builder = test_fleet(1)
        .worker_env(&[("TOOLFLEET_RUNTIME__DRAIN_TIMEOUT", &drain)])
        .orchestrator_env(&[("TOOLFLEET_RUNNER__DRAIN_TIMEOUT", &drain)]);
    let mut fleet = match fault {
        Fault::NatsNodeKilled => Fleet::start(on_clusters(builder, 1)).await?,
        _ => Fleet::start(builder).await?,
    };
    fleet.spawn_orchestrator(&[]).await?;
    fleet.wait_for_tools(0, &["sleep"], 1).await?;
    let api = fleet.api(0).await?;
    let script = json!([
        {"tool_calls": [{"name": "sleep", "arguments": {"ms": 20000}}]},
        {"message": "slept"}
    ]);
    let mut jobs = Vec::new();
    for n in 0..3 {
        let submitted = api
            .clone()
            .submit_job(scripted_job(&format!("slow {n}"), &script))
            .await?;
        jobs.push(submitted.into_inner().job_id);
    }
    // Every job's call published (the worker takes it at once).
    for job in &jobs {
        toolfleet_tests::wait_until(
            "the slow call dispatched",
            Duration::from_secs(30),
            || async {
                fleet
                    .dispatched_wire_ids(job)
                    .await
                    .is_ok_and(|ids| !ids.is_empty())
            },
        )
        .await?;
    }
    match fault {
        Fault::NatsKilled => fleet.nats.server().process().kill(),
        Fault::NatsFrozen => fleet.nats.server().process().freeze()?,
        Fault::RedisKilled => fleet.redis.server().process().kill(),
        Fault::NatsNodeKilled => {
            let js = async_nats::jetstream::new(fleet.client.clone());
            let cluster = fleet.nats.cluster();
            let leader = cluster
                .stream_copies(&js, toolfleet_proto::names::CALL_STREAM)
                .await?
                .leader;
            cluster.node(leader).kill();
        }
    }
    let process: &ChildProcess = match service {
        Service::Orchestrator => fleet.orchestrator(0),
        Service::Worker => fleet.worker(0),
    };
    let started = Instant::now();
    process.terminate()?;
    let bound = DRAIN + SHUTDOWN_MARGIN + SLACK;
    let exited = process.wait_exit(bound + Duration::from_secs(30)).await;
    let took = started.elapsed();
    if let Fault::NatsFrozen = fault {
        fleet.nats.server().process().thaw()?;
    }
    Ok((took, exited?))
}

async fn check(service: Service, fault: Fault) -> anyhow::Result<()> {
    let (took, status) = exit_time(service, fault).await?;
    let bound = DRAIN + SHUTDOWN_MARGIN + SLACK;
    assert!(
        took <= bound,
        "{service:?} with {fault:?}: exited {took:?} after SIGTERM, over {bound:?}"
    );
    assert!(
        status.success(),
        "{service:?} with {fault:?}: exited with {status} after {took:?}: the drain did not end by itself"
    );
    Ok(())
}

#[tokio::test]
async fn the_orchestrator_stops_in_time_with_nats_killed() -> anyhow::Result<()> {
    check(Service::Orchestrator, Fault::NatsKilled).await
}

#[tokio::test]
async fn the_orchestrator_stops_in_time_with_nats_frozen() -> anyhow::Result<()> {
    check(Service::Orchestrator, Fault::NatsFrozen).await
}

#[tokio::test]
async fn the_orchestrator_stops_in_time_with_redis_killed() -> anyhow::Result<()> {
    check(Service::Orchestrator, Fault::RedisKilled).await
}

#[tokio::test]
async fn the_worker_stops_in_time_with_nats_killed() -> anyhow::Result<()> {
    check(Service::Worker, Fault::NatsKilled).await
}

#[tokio::test]
async fn the_worker_stops_in_time_with_nats_frozen() -> anyhow::Result<()> {
    check(Service::Worker, Fault::NatsFrozen).await
}

#[tokio::test]
async fn the_worker_stops_in_time_with_redis_killed() -> anyhow::Result<()> {
    check(Service::Worker, Fault::RedisKilled).await
}

#[tokio::test]
async fn cluster_the_orchestrator_stops_in_time_with_a_nats_node_killed() -> anyhow::Result<()> {
    check(Service::Orchestrator, Fault::NatsNodeKilled).await
}

#[tokio::test]
async fn cluster_the_worker_stops_in_time_with_a_nats_node_killed() -> anyhow::Result<()> {
    check(Service::Worker, Fault::NatsNodeKilled).await
}

#[tokio::test]
async fn an_open_watch_ends_with_unavailable_and_holds_no_drain() -> anyhow::Result<()> {
    let drain = format!("{}s", DRAIN.as_secs());
    let mut fleet = Fleet::start(
        test_fleet(1).orchestrator_env(&[("TOOLFLEET_RUNNER__DRAIN_TIMEOUT", &drain)]),
    )
    .await?;
    fleet.spawn_orchestrator(&[]).await?;
    fleet.wait_for_tools(0, &["sleep"], 1).await?;
    let mut api = fleet.api(0).await?;
    let script = json!([
        {"tool_calls": [{"name": "sleep", "arguments": {"ms": 20000}}]},
        {"message": "slept"}
    ]);
    let job_id = api
        .submit_job(scripted_job("watched", &script))
        .await?
        .into_inner()
        .job_id;
    let mut events = api
        .watch_job(v1::WatchJobRequest {
            job_id: job_id.clone(),
            from_offset: 0,
        })
        .await?
        .into_inner();
    // Watching: the first event has arrived.
    let first = events
        .message()
        .await?
        .expect("a job's stream starts with an event");
    assert!(!first.r#final);
    let started = Instant::now();
    fleet.orchestrator(0).terminate()?;
    let ended = loop {
        match tokio::time::timeout(DRAIN + SHUTDOWN_MARGIN, events.message()).await? {
            Ok(Some(event)) => assert!(!event.r#final, "the slow job cannot have finished"),
            Ok(None) => anyhow::bail!("the watch ended without a status"),
            Err(status) => break status,
        }
    };
    assert_eq!(ended.code(), tonic::Code::Unavailable, "{ended:?}");
    assert!(ended.message().contains("watch again"), "{ended:?}");
    assert!(
        started.elapsed() < DRAIN,
        "the watch ended {:?} after SIGTERM, not at once",
        started.elapsed()
    );
    let status = fleet
        .orchestrator(0)
        .wait_exit(DRAIN + SHUTDOWN_MARGIN + SLACK)
        .await?;
    assert!(status.success(), "exited with {status}");
    Ok(())
}
