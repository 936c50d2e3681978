//! `--stored-jobs N`: a store that already holds `N` finished jobs when the
//! load starts, so that runs with few and with many show whether a job's
//! Redis cost depends on what else is stored (it must not: every command of
//! a job names the job's own keys, or its tenant's index by score). Also
//! what `--jobs-page N` reads from.

use std::time::Duration;

use anyhow::Context as _;
use redis::AsyncCommands as _;
use toolfleet_orchestrator::job::{JobSpec, JobStatus, new_job_id, now_ms};
use toolfleet_proto::JobId;
use toolfleet_proto::names::RedisKeys;

/// Copies written per pipeline: big enough to fill 100,000 jobs in seconds,
/// small enough to keep each reply in a few MB.
const BATCH: usize = 500;

/// Fills the Redis at `redis_url` with `count` finished jobs: copies of
/// every key of the newest job of the first tenant index found (a job the
/// warm-up ran), under new ids of that tenant, each added to the index as
/// its submission would have added it, and counted as its end would have
/// counted it (decision 0051). The copies keep the original's time to live.
/// Their index entries are the original's time, or with `spread`, spread
/// evenly over the `spread` before it, newest last.
pub(super) async fn fill(
    redis_url: &str,
    keys: &RedisKeys,
    count: usize,
    spread: Option<Duration>,
) -> anyhow::Result<()> {
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
    let ended = Ended::of(&mut redis, keys, &tenant, &model).await?;
    eprintln!(
        "storing {count} finished jobs (copies of job {model}'s {} keys)...",
        originals.len()
    );
    let spread_ms = spread.map_or(0.0, |spread| spread.as_secs_f64() * 1000.0);
    let mut stored = 0;
    while stored < count {
        let batch = BATCH.min(count - stored);
        let mut pipe = redis::pipe();
        for n in stored..stored + batch {
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
            let before = spread_ms * (count - 1 - n) as f64 / count.max(1) as f64;
            pipe.zadd(index, copy.as_str(), (score - before).floor())
                .ignore();
            for set in &ended.sets {
                pipe.zadd(set, copy.as_str(), ended.expires_at_ms).ignore();
            }
        }
        let () = pipe.query_async(&mut redis).await?;
        stored += batch;
        if stored % (count / 10).max(BATCH) < BATCH || stored == count {
            eprintln!("  {stored}/{count} stored");
        }
    }
    Ok(())
}

/// Where a copy of a finished job is counted: the ended sets of its
/// status (its tenant's, and its submitter's if it has one), scored by
/// when its keys expire.
struct Ended {
    sets: Vec<String>,
    expires_at_ms: u64,
}

impl Ended {
    /// Where copies of the finished job `model` of `tenant` are counted.
    async fn of(
        redis: &mut redis::aio::MultiplexedConnection,
        keys: &RedisKeys,
        tenant: &str,
        model: &JobId,
    ) -> anyhow::Result<Self> {
        let (status, spec): (String, String) = redis::cmd("HMGET")
            .arg(keys.job(model))
            .arg("status")
            .arg("spec")
            .query_async(redis)
            .await?;
        let status: JobStatus = status.parse()?;
        anyhow::ensure!(status.is_final(), "job {model} is {status}, not finished");
        let spec: JobSpec = serde_json::from_str(&spec)?;
        let ttl_ms: i64 = redis.pttl(keys.job(model)).await?;
        let sets = std::iter::once(None)
            .chain(spec.submitter.as_deref().map(Some))
            .map(|submitter| keys.ended_jobs(tenant, submitter, status))
            .collect();
        Ok(Self {
            sets,
            expires_at_ms: now_ms() + u64::try_from(ttl_ms.max(0))?,
        })
    }
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
