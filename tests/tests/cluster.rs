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
use toolfleet_tests::RedisConfig;
use toolfleet_tests::fleet::{Fleet, run_job, scripted_job};

#[tokio::test]
async fn cluster_smoke_a_job_runs_on_a_nats_cluster_and_a_redis_cluster() -> anyhow::Result<()> {
    let mut fleet = Fleet::start_on_clusters(2, &[], RedisConfig::default()).await?;
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
    let bucket_stream = format!("KV_{}", names::REGISTRY_BUCKET);
    for stream in [names::JOB_STREAM, names::CALL_STREAM, &bucket_stream] {
        let copies = fleet.nats.cluster().stream_copies(&js, stream).await?;
        assert_eq!(copies.copies, 3, "{stream} keeps a copy on every node");
    }
    // The job's keys share a slot, on one primary; the sweeper's index is
    // spread over every primary.
    let redis = fleet.redis.cluster();
    let keys = RedisKeys::default();
    let job_node = redis.primary_of(&keys.job(&job.job_id)).await?;
    for key in [keys.job_events(&job.job_id), keys.job_items(&job.job_id)] {
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
        .hget(keys.job(&job.job_id), "status")
        .await?;
    assert_eq!(status, "succeeded");
    Ok(())
}
