//! Connections to NATS and Redis, set up the same way by every service.
//!
//! A service that starts while NATS or Redis is down (a failover, pods
//! starting in any order) waits for them with backoff and says so in its
//! log, instead of exiting: in a cluster, exiting turns an outage into a
//! crash loop. Only a configuration error (an invalid URL, an unreadable
//! credentials file) ends start-up.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::config::{NatsOptions, RedisOptions, redact_url};

/// Longest pause between two attempts while waiting for a server.
const MAX_PATIENCE_STEP: Duration = Duration::from_secs(5);

/// Redis commands get 5 s to answer, not the client's 500 ms default: a busy
/// server or a long Lua script can exceed that under load, and a timed-out
/// write costs a retry (or a redelivery) for nothing.
const REDIS_RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// A server could not be reached at start-up.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// NATS is unreachable or refused the credentials: check `nats.url` and
    /// `nats.credentials_file`.
    #[error("cannot connect to NATS at {url}")]
    Nats {
        /// The configured URL, without its password.
        url: String,
        /// What the client said.
        #[source]
        source: async_nats::ConnectError,
    },
    /// Redis is unreachable: check `redis.url`.
    #[error("cannot connect to Redis at {url}")]
    Redis {
        /// The configured URL, without its password.
        url: String,
        /// What the client said.
        #[source]
        source: redis::RedisError,
    },
}

/// Connects to NATS as `client_name`, with the credentials file if one is
/// configured, and waits until the connection is up. The client reconnects
/// for ever after that.
///
/// # Errors
///
/// [`ConnectError::Nats`] for a URL or credentials file that cannot work.
pub async fn nats(
    options: &NatsOptions,
    client_name: &str,
) -> Result<async_nats::Client, ConnectError> {
    let error = |source| ConnectError::Nats {
        url: redact_url(&options.url),
        source,
    };
    let mut connect = async_nats::ConnectOptions::new()
        .name(client_name)
        .retry_on_initial_connect()
        .max_reconnects(None);
    if let Some(path) = &options.credentials_file {
        connect = connect
            .credentials_file(path)
            .await
            .map_err(|e| error(e.into()))?;
    }
    // Returns at once (`retry_on_initial_connect`) and connects behind.
    let client = connect.connect(options.url.as_str()).await.map_err(error)?;
    let url = redact_url(&options.url);
    patiently(&format!("NATS at {url}"), || async {
        match client.connection_state() {
            async_nats::connection::State::Connected => Ok(()),
            state => Err(format!("{state:?}").to_lowercase()),
        }
    })
    .await;
    Ok(client)
}

/// Calls `attempt` until it succeeds, pausing with exponential backoff and
/// jitter (up to 5 s) between attempts, and logging each failure as "waiting
/// for `what`". For start-up steps that must outlast an outage; the caller
/// cancels it by dropping the future (on shutdown).
pub async fn patiently<T, E, F, Fut>(what: &str, attempt: F) -> T
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    use backon::{ExponentialBuilder, Retryable};
    let backoff = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(MAX_PATIENCE_STEP)
        .with_jitter()
        .without_max_times();
    let waited = attempt
        .retry(backoff)
        .notify(|err: &E, pause| {
            tracing::warn!(error = %err, retry_in = ?pause, "waiting for {what}");
        })
        .await;
    match waited {
        Ok(value) => value,
        // Without a limit on attempts, a retry only ends in success.
        Err(_) => unreachable!("retried without a limit"),
    }
}

/// The connection settings of every Redis client of the fleet.
pub fn redis_config() -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_response_timeout(Some(REDIS_RESPONSE_TIMEOUT))
        .set_connection_timeout(Some(REDIS_RESPONSE_TIMEOUT))
}

/// Connects to Redis with a connection that reconnects by itself, waiting
/// with backoff while Redis is unreachable.
///
/// # Errors
///
/// [`ConnectError::Redis`] for a URL that cannot work.
pub async fn redis(options: &RedisOptions) -> Result<ConnectionManager, ConnectError> {
    let url = redact_url(&options.url);
    let client =
        redis::Client::open(options.url.as_str()).map_err(|source| ConnectError::Redis {
            url: url.clone(),
            source,
        })?;
    let what = format!("Redis at {url}");
    Ok(patiently(&what, || {
        ConnectionManager::new_with_config(client.clone(), redis_config())
    })
    .await)
}

/// Opens the registry bucket (workers announce their tools there), creating
/// it with `ttl` as the entries' max age if it does not exist yet. Both sides
/// open it the same way: whoever comes first creates it.
///
/// # Errors
///
/// JetStream is unavailable or refuses the bucket.
pub async fn registry_bucket(
    js: &async_nats::jetstream::Context,
    ttl: Duration,
) -> Result<async_nats::jetstream::kv::Store, async_nats::jetstream::context::CreateKeyValueError> {
    use toolfleet_proto::names::REGISTRY_BUCKET;
    if let Ok(store) = js.get_key_value(REGISTRY_BUCKET).await {
        return Ok(store);
    }
    js.create_key_value(async_nats::jetstream::kv::Config {
        bucket: REGISTRY_BUCKET.to_owned(),
        description: "toolfleet: live tool announcements of workers".to_owned(),
        history: 1,
        max_age: ttl,
        ..Default::default()
    })
    .await
}
