//! Connections to NATS and Redis, set up the same way by every service.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::config::{NatsOptions, RedisOptions, redact_url};

/// How long the first connection to a server may take before start-up fails.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

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
/// configured. The client reconnects for ever after the first connection;
/// the first one gets 30 s.
///
/// # Errors
///
/// [`ConnectError::Nats`].
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
    tokio::time::timeout(CONNECT_TIMEOUT, connect.connect(options.url.as_str()))
        .await
        .map_err(|_| error(std::io::Error::from(std::io::ErrorKind::TimedOut).into()))?
        .map_err(error)
}

/// The connection settings of every Redis client of the fleet.
pub fn redis_config() -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_response_timeout(Some(REDIS_RESPONSE_TIMEOUT))
        .set_connection_timeout(Some(REDIS_RESPONSE_TIMEOUT))
}

/// Connects to Redis with a connection that reconnects by itself.
///
/// # Errors
///
/// [`ConnectError::Redis`].
pub async fn redis(options: &RedisOptions) -> Result<ConnectionManager, ConnectError> {
    let error = |source| ConnectError::Redis {
        url: redact_url(&options.url),
        source,
    };
    let client = redis::Client::open(options.url.as_str()).map_err(error)?;
    ConnectionManager::new_with_config(client, redis_config())
        .await
        .map_err(error)
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
