//! `--stored-jobs N`: a store that already holds `N` finished jobs when the
//! load starts, so that runs with few and with many show whether a job's
//! Redis cost depends on what else is stored (it must not: every command of
//! a job names the job's own keys, or its tenant's index by score).

use anyhow::Context as _;
use redis::AsyncCommands as _;
use toolfleet_orchestrator::job::new_job_id;
use toolfleet_proto::JobId;
use toolfleet_proto::names::RedisKeys;

/// Copies written per pipeline: big enough to fill 100,000 jobs in seconds,
/// small enough to keep each reply in a few MB.
const BATCH: usize = 500;

/// Fills the Redis at `redis_url` with `count` finished jobs: copies of
/// every key of the newest job of the first tenant index found (a job the
/// warm-up ran), under new ids of that tenant, each added to the index as
/// its submission would have added it. The copies keep the original's time
/// to live.
pub(super) async fn fill(redis_url: &str, keys: &RedisKeys, count: usize) -> anyhow::Result<()> {
    let client = redis::Client::open(redis_url)?;
    let mut redis = client.get_multiplexed_async_connection().await?;
    let indexes = scan(&mut redis, &keys.tenant_jobs_pattern()).await?;
    let index = indexes
        .first()
        .context("the warm-up left no tenant job index to copy a job from")?;
    let tenant = keys
        .tenant_of_jobs_index(index)
        .with_context(|| format!("{index} is not a tenant job index"))?
        .to_owned();
    let newest: Vec<(String, f64)> = redis.zrange_withscores(index, -1, -1).await?;
    let (model, score) = newest
        .into_iter()
        .next()
        .with_context(|| format!("{index} is empty"))?;
    let model = JobId::parse(&model).with_context(|| format!("{index} holds {model:?}"))?;
    let mut originals = Vec::new();
    for key in scan(&mut redis, &keys.job_keys_pattern(&model)).await? {
        let dump: Vec<u8> = redis::cmd("DUMP").arg(&key).query_async(&mut redis).await?;
        let ttl_ms: i64 = redis.pttl(&key).await?;
        originals.push((key, dump, ttl_ms.max(0)));
    }
    anyhow::ensure!(!originals.is_empty(), "job {model} has no keys to copy");
    eprintln!(
        "storing {count} finished jobs (copies of job {model}'s {} keys)...",
        originals.len()
    );
    let mut stored = 0;
    while stored < count {
        let batch = BATCH.min(count - stored);
        let mut pipe = redis::pipe();
        for _ in 0..batch {
            let copy = new_job_id(&tenant);
            for (key, dump, ttl_ms) in &originals {
                let copied = keys
                    .retag_job_key(key, &model, &copy)
                    .with_context(|| format!("{key} is not a key of job {model}"))?;
                pipe.cmd("RESTORE")
                    .arg(copied)
                    .arg(*ttl_ms)
                    .arg(dump.as_slice())
                    .ignore();
            }
            pipe.zadd(index, copy.as_str(), score).ignore();
        }
        let () = pipe.query_async(&mut redis).await?;
        stored += batch;
        if stored % (count / 10).max(BATCH) < BATCH || stored == count {
            eprintln!("  {stored}/{count} stored");
        }
    }
    Ok(())
}

/// Every key matching `pattern`.
async fn scan(
    redis: &mut redis::aio::MultiplexedConnection,
    pattern: &str,
) -> anyhow::Result<Vec<String>> {
    let mut keys: Vec<String> = Vec::new();
    let mut found = redis.scan_match::<_, String>(pattern).await?;
    while let Some(key) = futures::StreamExt::next(&mut found).await {
        keys.push(key?);
    }
    Ok(keys)
}
