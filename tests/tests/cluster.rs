//! toolfleet on clusters: a NATS cluster of three nodes, every stream kept
//! on each (`nats.replicas = 3`), and a Redis Cluster of three primaries
//! with a replica each (`redis.cluster`). The fault tests that kill cluster
//! members under load are in `faults.rs`; every test of a cluster has `cluster` in its
//! name (`cargo nextest run -E 'test(/cluster/)'`), and the README's test
//! command runs only the smoke test below.

use async_nats::jetstream;
use redis::AsyncCommands;
use serde_json::json;
use toolfleet_proto::names::{self, RedisKeys};
use toolfleet_proto::v1;
use toolfleet_tests::fleet::{Fleet, on_clusters, run_job, scripted_job, test_fleet};
use toolfleet_tests::{RedisCluster, RedisConfig};

#[tokio::test]
async fn cluster_smoke_a_job_runs_on_a_nats_cluster_and_a_redis_cluster() -> anyhow::Result<()> {
    let mut fleet = Fleet::start(on_clusters(test_fleet(2), 1)).await?;
    fleet.spawn_orchestrator(&[]).await?;
    fleet.wait_for_tools(0, &["echo"], 2).await?;
    let api = fleet.api(0).await?;
    let script = json!([
        {"tool_calls": [
            {"name": "echo", "arguments": {"n": 1}},
            {"name": "echo", "arguments": {"n": 2}},
            {"name": "echo", "arguments": {"n": 3}}
        ]},
        {"message": "{{call_0_0.data.n}} {{call_0_1.data.n}} {{call_0_2.data.n}}"}
    ]);
    let job = run_job(&api, scripted_job("cluster smoke", &script)).await?;
    assert_eq!(job.status, v1::JobStatus::Succeeded as i32, "{job:?}");
    assert_eq!(job.output_text, "1 2 3");

    let js = jetstream::new(fleet.client.clone());
    for stream in [
        names::JOB_STREAM,
        names::CALL_STREAM,
        names::REGISTRY_STREAM,
    ] {
        let copies = fleet.nats.cluster().stream_copies(&js, stream).await?;
        assert_eq!(copies.copies, 3, "{stream} keeps a copy on every node");
    }
    // The job's keys share a slot, on one primary; the sweeper's index is
    // spread over every primary.
    let redis = fleet.redis.cluster();
    let keys = RedisKeys::default();
    let job_id = toolfleet_tests::fleet::job_id(&job.job_id);
    let job_node = redis.primary_of(&keys.job(&job_id)).await?;
    for key in [keys.job_events(&job_id), keys.job_items(&job_id)] {
        assert_eq!(redis.primary_of(&key).await?, job_node, "{key}");
    }
    let mut shard_nodes = std::collections::HashSet::new();
    for shard in keys.unfinished_shards() {
        shard_nodes.insert(redis.primary_of(&shard).await?);
    }
    assert_eq!(
        shard_nodes.len(),
        3,
        "the unfinished index is on every primary"
    );
    let status: String = fleet
        .redis
        .connection()
        .await?
        .hget(keys.job(&job_id), "status")
        .await?;
    assert_eq!(status, "succeeded");
    Ok(())
}

/// Redis replicates asynchronously: a primary answers a write before its
/// replica has it. Cuts every replica off its primary (frozen, its link
/// closed by the primary, as a partition or a stalled replica would), then:
/// without `redis.wait_replicas`, a submission is acknowledged, its
/// primary is killed, its replica promoted, and the acknowledged job is
/// gone; with `redis.wait_replicas = 1`, the same submission fails as not
/// written, and the client's retry with its idempotency key, once the
/// replicas are back, creates a job that outlives the next failover.
#[tokio::test]
async fn cluster_a_failover_loses_an_acknowledged_write_unless_a_replica_confirmed_it()
-> anyhow::Result<()> {
    use std::time::Duration;
    use toolfleet_orchestrator::job::{JobSpec, ProviderKind};
    use toolfleet_orchestrator::live::Live;
    use toolfleet_orchestrator::store::{Idempotency, JobStore};
    use toolfleet_service::connect::{RedisConnection, ReplicaAcks};
    use toolfleet_tests::NatsServer;

    let redis = RedisCluster::start(3, 1, RedisConfig::default()).await?;
    redis.wait_replicas_linked(HEAL).await?;
    let nats = NatsServer::start().await?;
    let connection: RedisConnection = redis.client()?.get_async_connection().await?.into();
    let store = |acks: Option<ReplicaAcks>| {
        let redis = connection.clone().with_replica_acks(acks);
        let nats = nats.client();
        async move {
            anyhow::Ok(JobStore::new(
                redis,
                Live::new(nats.await?),
                RedisKeys::default(),
                Duration::from_secs(60),
                Duration::from_secs(60),
            ))
        }
    };
    let spec = JobSpec {
        input: "keep me".into(),
        instructions: String::new(),
        provider: ProviderKind::Scripted,
        model: String::new(),
        script: Some(r#"[{"message":"kept"}]"#.into()),
        max_tokens: None,
        stream: false,
        no_result_cache: false,
        call: None,
        tools: Vec::new(),
        max_tool_rounds: 8,
        parallel_tool_calls: true,
        deadline_ms: 60_000,
        metadata: Default::default(),
        tenant: "default".into(),
        submitter: None,
        approval: Default::default(),
        limits: Default::default(),
        budget: Default::default(),
    };
    let keys = RedisKeys::default();
    // Acknowledged by the primary alone, and lost with it.
    let unconfirmed = store(None).await?;
    let frozen = cut_off_replicas(&redis).await?;
    assert_eq!(frozen.len(), 3, "one replica per primary");
    let (lost, _) = unconfirmed.submit(&spec, None, None).await?;
    assert!(unconfirmed.get(&lost).await?.is_some(), "acknowledged");
    let killed = fail_over(&redis, &keys.job(&lost), &frozen).await?;
    assert!(
        unconfirmed.get(&lost).await?.is_none(),
        "the promoted replica never had the acknowledged job {lost}"
    );
    // Back, as the replica of the node that took its place.
    redis.node(killed).restart().await?;
    redis.wait_healthy(HEAL).await?;
    redis.wait_replicas_linked(HEAL).await?;

    // Confirmed by a replica, or not acknowledged at all.
    let confirmed = store(Some(ReplicaAcks {
        replicas: 1,
        timeout: Duration::from_millis(300),
    }))
    .await?;
    let idempotency = || {
        Some(Idempotency {
            key: "order-1",
            fingerprint: "print",
        })
    };
    let frozen = cut_off_replicas(&redis).await?;
    assert_eq!(frozen.len(), 3, "the restarted node is a replica again");
    let refused = confirmed.submit(&spec, idempotency(), None).await;
    thaw(&redis, &frozen)?;
    let Err(err) = refused else {
        anyhow::bail!("a write no replica holds was acknowledged");
    };
    let err = format!("{:#}", anyhow::Error::new(err));
    assert!(err.contains("redis.wait_replicas"), "{err}");
    redis.wait_replicas_linked(HEAL).await?;
    let (kept, _) = confirmed.submit(&spec, idempotency(), None).await?;
    let killed = fail_over(&redis, &keys.job(&kept), &[]).await?;
    let record = confirmed.get(&kept).await?;
    assert!(record.is_some(), "the promoted replica has job {kept}");
    // A write waits for a replica again: the promoted node needs one.
    redis.node(killed).restart().await?;
    redis.wait_healthy(HEAL).await?;
    redis.wait_replicas_linked(HEAL).await?;
    assert_eq!(
        confirmed.submit(&spec, idempotency(), None).await?,
        (kept, true),
        "the idempotency record survived too"
    );
    Ok(())
}

/// How long a Redis Cluster may take to heal: promote a replica, take a
/// node back.
const HEAL: std::time::Duration = std::time::Duration::from_secs(30);

/// Freezes every replica of `redis` and has every primary drop its link:
/// no write from now on reaches a replica. Returns the frozen nodes.
async fn cut_off_replicas(redis: &RedisCluster) -> anyhow::Result<Vec<usize>> {
    let replicas = redis.replicas().await?;
    for &replica in &replicas {
        redis.node(replica).process().freeze()?;
    }
    for (index, node) in redis.nodes().iter().enumerate() {
        if replicas.contains(&index) || !node.process().is_running() {
            continue;
        }
        let mut primary = node.client().get_multiplexed_async_connection().await?;
        let _dropped: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("replica")
            .query_async(&mut primary)
            .await?;
    }
    Ok(replicas)
}

/// Lets the `frozen` nodes of `redis` go on.
fn thaw(redis: &RedisCluster, frozen: &[usize]) -> anyhow::Result<()> {
    for &node in frozen {
        redis.node(node).process().thaw()?;
    }
    Ok(())
}

/// Kills the primary of `key`, thaws the `frozen` nodes, and waits until
/// the killed primary's replica serves `key`; returns the killed node.
async fn fail_over(redis: &RedisCluster, key: &str, frozen: &[usize]) -> anyhow::Result<usize> {
    let primary = redis.primary_of(key).await?;
    redis.node(primary).kill();
    thaw(redis, frozen)?;
    toolfleet_tests::wait_until("the replica to be promoted", HEAL, || async {
        anyhow::ensure!(redis.primary_of(key).await? != primary);
        anyhow::Ok(())
    })
    .await?;
    redis.wait_healthy(HEAL).await?;
    Ok(primary)
}

/// `toolfleet-orchestrator setup` run while its NATS cluster has lost its
/// quorum (two of three servers down, as when a node restarts during a
/// rolling upgrade of the others) waits it out instead of failing the
/// install: it says it will try again, and once the servers are back it
/// sets up every stream with a copy on each.
#[tokio::test]
async fn cluster_setup_waits_for_a_cluster_that_lost_its_quorum() -> anyhow::Result<()> {
    use std::process::Stdio;
    use tokio::io::{AsyncBufReadExt, BufReader};
    use toolfleet_tests::{NatsCluster, cargo_bin};

    let nats = NatsCluster::start(3).await?;
    nats.node(1).kill();
    nats.node(2).kill();
    let mut setup = tokio::process::Command::new(cargo_bin("toolfleet-orchestrator")?)
        .args([
            "setup",
            "--nats-url",
            &nats.node(0).url(),
            "--tools",
            "echo",
        ])
        .env("TOOLFLEET_NATS__REPLICAS", "3")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut log = BufReader::new(setup.stderr.take().expect("piped")).lines();
    let waited = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        while let Some(line) = log.next_line().await? {
            if line.contains("trying again") {
                return anyhow::Ok(line);
            }
        }
        anyhow::bail!("setup ended without trying again")
    })
    .await??;
    println!("setup said: {waited}");
    // Its later lines too, or a full pipe would stop it.
    tokio::spawn(async move { while let Ok(Some(_)) = log.next_line().await {} });
    assert!(setup.try_wait()?.is_none(), "setup gave up");

    nats.node(1).restart().await?;
    nats.node(2).restart().await?;
    let output = tokio::time::timeout(
        toolfleet_orchestrator::setup::PATIENCE,
        setup.wait_with_output(),
    )
    .await??;
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    for object in [
        "bucket",
        "stream TOOLFLEET_JOBS",
        "stream TOOLFLEET_CALLS",
        "consumer",
    ] {
        assert!(printed.contains(&format!("set up {object}")), "{printed}");
    }
    let js = jetstream::new(nats.client().await?);
    for stream in [
        names::JOB_STREAM,
        names::CALL_STREAM,
        names::REGISTRY_STREAM,
    ] {
        let copies = nats.stream_copies(&js, stream).await?;
        assert_eq!(copies.copies, 3, "{stream} keeps a copy on every node");
    }
    Ok(())
}
