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
/// evenly over the `spread` before it, newest last. Returns once Redis has
/// settled ([`settle`]).
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
    settle(redis_url).await
}

/// Redis grows a hash table of its key space (and of its keys' expiry
/// times) when the keys reach its size, and moves the entries to the new
/// table a bucket at a time, one step with every command that touches the
/// table and a millisecond of every `serverCron`. A fill that ends just
/// after such a growth leaves a move of millions of cold buckets, which
/// doubles what every command of the load costs for a minute: Redis's
/// cost, not one that stored jobs add to a job's (docs/benchmarks.md,
/// "Growth curves"). So the load waits for the move to end, with
/// `serverCron` run every 2 ms meanwhile (`hz` 500, then put back).
pub(super) async fn settle(redis_url: &str) -> anyhow::Result<()> {
    let client = redis::Client::open(redis_url)?;
    let mut redis = client.get_multiplexed_async_connection().await?;
    let started = std::time::Instant::now();
    let hz: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("hz")
        .query_async(&mut redis)
        .await?;
    let hz = hz.get(1).cloned().unwrap_or_else(|| "10".to_owned());
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("hz")
        .arg("500")
        .query_async(&mut redis)
        .await?;
    let mut told = false;
    let waited = async {
        while Tables::read(&mut redis).await?.moving() {
            if !told {
                eprintln!("waiting for Redis to finish growing its key space's hash tables...");
                told = true;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        anyhow::Ok(())
    }
    .await;
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("hz")
        .arg(&hz)
        .query_async(&mut redis)
        .await?;
    waited?;
    if told {
        eprintln!("  done in {:.1}s", started.elapsed().as_secs_f64());
    }
    Ok(())
}

/// What `MEMORY STATS` says of database 0's two hash tables.
struct Tables {
    /// The key space's and the expiry times' overhead, in bytes, and
    /// their entries.
    main: (i64, i64),
    expires: (i64, i64),
    /// What one more entry adds to each overhead: an entry's size.
    entry: (i64, i64),
}

/// The bench's probe key, set for a moment to learn an entry's size.
const PROBE: &str = "toolfleet-bench:probe";

impl Tables {
    /// Reads the overheads, adds one key with an expiry time, reads them
    /// again, and removes it.
    async fn read(redis: &mut redis::aio::MultiplexedConnection) -> anyhow::Result<Self> {
        let before = overheads(redis).await?;
        let () = redis::cmd("SET")
            .arg(PROBE)
            .arg(1)
            .arg("PX")
            .arg(60_000)
            .query_async(redis)
            .await?;
        let after = overheads(redis).await?;
        let () = redis::cmd("DEL")
            .arg(PROBE)
            .query_async(redis)
            .await
            .map(|_: i64| ())?;
        let info: String = redis::cmd("INFO")
            .arg("keyspace")
            .query_async(redis)
            .await?;
        let (keys, expires) = keyspace(&info).unwrap_or((0, 0));
        Ok(Self {
            main: (before.0, keys),
            expires: (before.1, expires),
            entry: (after.0 - before.0, after.1 - before.1),
        })
    }

    /// Whether either table is being moved: its buckets (its overhead
    /// less its entries', 8 bytes each) are then those of two tables, a
    /// sum of two powers of two, not one.
    fn moving(&self) -> bool {
        let buckets =
            |(overhead, entries): (i64, i64), entry: i64| (overhead - entries * entry) / 8;
        let one_table = |buckets: i64| buckets <= 0 || (buckets as u64).is_power_of_two();
        !one_table(buckets(self.main, self.entry.0))
            || !one_table(buckets(self.expires, self.entry.1))
    }
}

/// `overhead.hashtable.main` and `overhead.hashtable.expires` of db 0 in
/// `MEMORY STATS`.
async fn overheads(redis: &mut redis::aio::MultiplexedConnection) -> anyhow::Result<(i64, i64)> {
    let stats: redis::Value = redis::cmd("MEMORY").arg("STATS").query_async(redis).await?;
    let field = |map: &redis::Value, name: &str| -> Option<redis::Value> {
        let redis::Value::Array(items) = map else {
            return None;
        };
        items.chunks(2).find_map(|pair| match pair {
            [redis::Value::BulkString(key), value] if key == name.as_bytes() => Some(value.clone()),
            [redis::Value::SimpleString(key), value] if key == name => Some(value.clone()),
            _ => None,
        })
    };
    let Some(db) = field(&stats, "db.0") else {
        return Ok((0, 0));
    };
    let number = |name: &str| match field(&db, name) {
        Some(redis::Value::Int(n)) => Ok(n),
        other => Err(anyhow::anyhow!(
            "MEMORY STATS has {other:?} for db.0's {name}"
        )),
    };
    Ok((
        number("overhead.hashtable.main")?,
        number("overhead.hashtable.expires")?,
    ))
}

/// `keys` and `expires` of db0 in `INFO keyspace`.
fn keyspace(info: &str) -> Option<(i64, i64)> {
    let db = info.lines().find_map(|line| line.strip_prefix("db0:"))?;
    let field = |name: &str| -> Option<i64> {
        db.split(',')
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))?
            .trim()
            .parse()
            .ok()
    };
    Some((field("keys")?, field("expires")?))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_is_moving_while_its_buckets_are_two_tables() {
        // Redis 7.0's key space: 40 bytes an entry, 8 a bucket.
        let keys = 1_192_739;
        let tables = |main_buckets: i64, expires_buckets: i64| Tables {
            main: (keys * 40 + main_buckets * 8, keys),
            expires: (keys * 24 + expires_buckets * 8, keys),
            entry: (40, 24),
        };
        assert!(tables((1 << 20) + (1 << 21), 1 << 21).moving());
        assert!(tables(1 << 21, (1 << 20) + (1 << 21)).moving());
        assert!(!tables(1 << 21, 1 << 21).moving());
        let empty = Tables {
            main: (0, 0),
            expires: (0, 0),
            entry: (0, 0),
        };
        assert!(!empty.moving());
    }

    #[test]
    fn the_keyspace_line_gives_keys_and_expiries() {
        let info = "# Keyspace\r\ndb0:keys=1100012,expires=1100003,avg_ttl=86000000\r\n";
        assert_eq!(keyspace(info), Some((1_100_012, 1_100_003)));
        assert_eq!(keyspace("# Keyspace\r\n"), None);
    }
}
