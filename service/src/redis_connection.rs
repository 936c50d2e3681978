//! The connection every part of both services talks to Redis through: to
//! one server or to a Redis Cluster, and, with `redis.wait_replicas`, no
//! write acknowledged before that many replicas hold it.
//!
//! Redis replicates asynchronously: a primary answers a write before any
//! replica has it, and a primary that dies then takes the write with it
//! when its replica is promoted, although the caller was told it was
//! stored. `WAIT n timeout` returns once `n` replicas hold every earlier
//! write of the connection. It goes in the same pipeline as the write (one
//! round trip; on a cluster, the pipeline goes to the write's primary).
//! A write that fewer replicas confirmed in time counts as failed with its
//! outcome unknown, as after a dropped connection, which every caller
//! already bears: a job's writes are fenced and replayed, a call's ledger
//! answers its redelivery. `WAIT` cannot run inside a Lua script or a
//! `MULTI`, which is why it is sent after them.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Arg, Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, Value};

/// Commands that write nothing (those toolfleet and its tools use, and
/// their kin): no `WAIT` follows them. Every other command, and every
/// script, counts as a write.
const READS: &[&str] = &[
    "DBSIZE",
    "ECHO",
    "EXISTS",
    "GET",
    "GETRANGE",
    "HEXISTS",
    "HGET",
    "HGETALL",
    "HKEYS",
    "HLEN",
    "HMGET",
    "HSCAN",
    "HVALS",
    "INFO",
    "LINDEX",
    "LLEN",
    "LRANGE",
    "MGET",
    "PING",
    "PTTL",
    "SCAN",
    "SCARD",
    "SCRIPT",
    "SISMEMBER",
    "SMEMBERS",
    "SMISMEMBER",
    "SSCAN",
    "STRLEN",
    "TIME",
    "TTL",
    "TYPE",
    "XINFO",
    "XLEN",
    "XRANGE",
    "XREAD",
    "XREVRANGE",
    "ZCARD",
    "ZCOUNT",
    "ZMSCORE",
    "ZRANGE",
    "ZRANGEBYSCORE",
    "ZRANK",
    "ZREVRANGE",
    "ZREVRANGEBYSCORE",
    "ZREVRANK",
    "ZSCAN",
    "ZSCORE",
];

/// A connection to Redis that reconnects by itself: to one server, or to
/// a Redis Cluster, where each command goes to the primary of its key's
/// hash slot and follows the cluster's redirections when slots move.
/// Every command, pipeline and script of toolfleet runs on either: those
/// with several keys keep them in one slot (`{...}` hash tags,
/// `toolfleet_proto::names::RedisKeys`).
#[derive(Clone)]
pub struct RedisConnection {
    link: Link,
    acks: Option<ReplicaAcks>,
}

#[derive(Clone)]
enum Link {
    /// One server (or a primary behind a stable address).
    Server(ConnectionManager),
    /// A Redis Cluster.
    Cluster(ClusterConnection),
}

/// How many replicas must hold a write before it counts as written, and
/// how long to wait for them (`redis.wait_replicas`, `redis.wait_timeout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaAcks {
    /// Replicas that must confirm; at least 1.
    pub replicas: u32,
    /// How long `WAIT` blocks for them; more than zero (`WAIT` with 0
    /// would block for ever).
    pub timeout: Duration,
}

impl ReplicaAcks {
    /// `WAIT replicas timeout_ms`.
    fn command(self) -> Cmd {
        let mut wait = redis::cmd("WAIT");
        wait.arg(self.replicas).arg(
            u64::try_from(self.timeout.as_millis())
                .unwrap_or(u64::MAX)
                .max(1),
        );
        wait
    }

    /// Whether `WAIT`'s answer says enough replicas hold the writes.
    fn check(self, answer: Option<Value>) -> RedisResult<()> {
        match answer {
            Some(Value::Int(confirmed)) if confirmed >= i64::from(self.replicas) => Ok(()),
            Some(Value::Int(confirmed)) => Err(RedisError::from((
                ErrorKind::Io,
                "a write is not on enough replicas",
                format!(
                    "{confirmed} of the {} replicas redis.wait_replicas asks for confirmed it \
                     within redis.wait_timeout ({} ms), so it counts as not written: is a \
                     replica down or lagging?",
                    self.replicas,
                    self.timeout.as_millis()
                ),
            ))),
            Some(Value::ServerError(err)) => Err(err.into()),
            other => Err(RedisError::from((
                ErrorKind::UnexpectedReturnType,
                "WAIT answered something else than a count of replicas",
                format!("{other:?}"),
            ))),
        }
    }
}

/// Whether `cmd` may write: anything but a known read.
fn writes(cmd: &Cmd) -> bool {
    match cmd.args_iter().next() {
        Some(Arg::Simple(name)) => !READS
            .iter()
            .any(|read| read.as_bytes().eq_ignore_ascii_case(name)),
        _ => true,
    }
}

impl RedisConnection {
    /// Whether this is a Redis Cluster, where a pipeline's keys must share
    /// one slot.
    pub fn is_cluster(&self) -> bool {
        matches!(self.link, Link::Cluster(_))
    }

    /// This connection, acknowledging a write only once `acks` say so
    /// (none: as soon as the primary answers).
    #[must_use]
    pub fn with_replica_acks(mut self, acks: Option<ReplicaAcks>) -> Self {
        self.acks = acks;
        self
    }

    /// Runs `groups` in order, each a pipeline whose keys share one hash
    /// slot: as one pipeline (one round trip) on one server, and one round
    /// trip per group on a cluster, whose client refuses a pipeline that
    /// spans slots.
    ///
    /// # Errors
    ///
    /// The first error Redis answers; the groups before it have run.
    pub async fn run_in_order(&mut self, groups: Vec<Pipeline>) -> RedisResult<()> {
        if self.is_cluster() {
            for group in groups {
                let () = group.query_async(self).await?;
            }
            return Ok(());
        }
        let mut all = redis::pipe();
        append_ignored(&mut all, &groups);
        all.query_async(self).await
    }
}

/// Appends every command of `groups` to `pipe`, their answers ignored: one
/// server's single round trip for writes that a cluster runs group by
/// group ([`RedisConnection::run_in_order`]).
pub fn append_ignored(pipe: &mut Pipeline, groups: &[Pipeline]) {
    for group in groups {
        for command in group.cmd_iter() {
            pipe.add_command(command.clone()).ignore();
        }
    }
}

impl From<ConnectionManager> for RedisConnection {
    fn from(connection: ConnectionManager) -> Self {
        Self {
            link: Link::Server(connection),
            acks: None,
        }
    }
}

impl From<ClusterConnection> for RedisConnection {
    fn from(connection: ClusterConnection) -> Self {
        Self {
            link: Link::Cluster(connection),
            acks: None,
        }
    }
}

/// Whether a Redis Cluster node refused `err`'s request without running it:
/// the slot is served elsewhere (`MOVED`, `ASK`, a primary demoted to
/// replica), or not served right now (a failover, a node loading its
/// data). Sending it again cannot apply it twice.
fn refused_unrun(err: &RedisError) -> bool {
    use redis::ServerErrorKind::{
        Ask, BusyLoading, ClusterDown, MasterDown, Moved, ReadOnly, TryAgain,
    };
    matches!(
        err.kind(),
        ErrorKind::Server(
            Moved | Ask | TryAgain | ClusterDown | MasterDown | BusyLoading | ReadOnly
        )
    )
}

/// Sends again what a cluster node refused unrun, after the client has
/// refreshed its map of the slots: a few times within about a second (a
/// failover takes the cluster's node timeout, longer than that: callers
/// get the error and retry as after any Redis failure).
///
/// redis-rs' own retries are off (`cluster_client`'s `retries(0)`): it
/// would also send again a request whose connection dropped after it was
/// sent, which a failover does to every request in flight, and a script
/// that had run would run twice (a test tool's counter counted one call
/// twice in the failover test before this).
async fn unless_refused<T, F, Fut>(attempt: F) -> RedisResult<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = RedisResult<T>>,
{
    use backon::{ExponentialBuilder, Retryable};
    attempt
        .retry(
            ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(20))
                .with_max_delay(Duration::from_millis(400))
                .with_max_times(5)
                .with_jitter(),
        )
        .when(refused_unrun)
        .await
}

impl ConnectionLike for Link {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Server(connection) => connection.req_packed_command(cmd),
            Self::Cluster(connection) => Box::pin(unless_refused(move || {
                let mut connection = connection.clone();
                async move { connection.req_packed_command(cmd).await }
            })),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Server(connection) => connection.req_packed_commands(cmd, offset, count),
            Self::Cluster(connection) => Box::pin(unless_refused(move || {
                let mut connection = connection.clone();
                async move { connection.req_packed_commands(cmd, offset, count).await }
            })),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Server(connection) => connection.get_db(),
            Self::Cluster(connection) => connection.get_db(),
        }
    }
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self.acks {
            Some(acks) if writes(cmd) => Box::pin(async move {
                let mut pipe = redis::pipe();
                pipe.add_command(cmd.clone()).add_command(acks.command());
                let mut values = self.link.req_packed_commands(&pipe, 0, 2).await?;
                let confirmed = values.pop();
                // A write Redis refused (a script not cached, say) is its
                // own error, whatever the replicas hold.
                let value = values.pop().unwrap_or(Value::Nil).extract_error()?;
                acks.check(confirmed)?;
                Ok(value)
            }),
            _ => self.link.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self.acks {
            Some(acks) if cmd.cmd_iter().any(writes) => Box::pin(async move {
                if cmd.is_transaction() {
                    // Nothing in toolfleet sends one: say so rather than
                    // acknowledge it unconfirmed.
                    return Err(RedisError::from((
                        ErrorKind::Client,
                        "a MULTI transaction cannot be confirmed by replicas here",
                    )));
                }
                let mut pipe = cmd.clone();
                pipe.add_command(acks.command());
                let mut values = self
                    .link
                    .req_packed_commands(&pipe, offset, count + 1)
                    .await?;
                acks.check(values.pop())?;
                Ok(values)
            }),
            _ => self.link.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        self.link.get_db()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_but_a_known_read_is_a_write() {
        let is_write = |name: &str| writes(&redis::cmd(name));
        for write in [
            "SET", "EVALSHA", "eval", "HSET", "ZADD", "XADD", "INCRBY", "DEL",
        ] {
            assert!(is_write(write), "{write}");
        }
        for read in ["GET", "hgetall", "ZRANGEBYSCORE", "XRANGE", "PING", "TIME"] {
            assert!(!is_write(read), "{read}");
        }
        assert!(
            writes(&Cmd::new()),
            "a command without a name is not known to read"
        );
    }

    #[test]
    fn only_what_a_node_refused_unrun_is_sent_again() {
        use redis::ServerErrorKind;
        let error = |kind| RedisError::from((kind, "test"));
        for refused in [
            ServerErrorKind::Moved,
            ServerErrorKind::Ask,
            ServerErrorKind::TryAgain,
            ServerErrorKind::ClusterDown,
            ServerErrorKind::ReadOnly,
        ] {
            assert!(
                refused_unrun(&error(ErrorKind::Server(refused))),
                "{refused:?}"
            );
        }
        // A dropped connection may have run it; a script error ran part.
        for unknown in [
            ErrorKind::Io,
            ErrorKind::Server(ServerErrorKind::ResponseError),
            ErrorKind::Server(ServerErrorKind::NoScript),
        ] {
            assert!(!refused_unrun(&error(unknown)), "{unknown:?}");
        }
    }

    #[test]
    fn too_few_confirmations_fail_the_write_and_say_which_keys_to_look_at() {
        let acks = ReplicaAcks {
            replicas: 2,
            timeout: Duration::from_millis(250),
        };
        assert!(acks.check(Some(Value::Int(2))).is_ok());
        assert!(acks.check(Some(Value::Int(3))).is_ok());
        let short = acks.check(Some(Value::Int(1))).unwrap_err();
        assert!(short.is_io_error(), "its outcome is unknown: {short}");
        let text = short.to_string();
        for part in [
            "1 of the 2",
            "redis.wait_replicas",
            "redis.wait_timeout (250 ms)",
        ] {
            assert!(text.contains(part), "{text}");
        }
        assert!(acks.check(None).is_err());
        assert!(acks.check(Some(Value::Okay)).is_err());
        let wait = acks.command();
        let args: Vec<_> = wait
            .args_iter()
            .map(|arg| match arg {
                Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => "not a plain argument".into(),
            })
            .collect();
        assert_eq!(args, ["WAIT", "2", "250"]);
    }
}
