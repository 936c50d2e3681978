//! Connections to NATS and Redis, set up the same way by every service.
//!
//! A service that starts while NATS or Redis is down (a failover, pods
//! starting in any order) waits for them with backoff and says so in its
//! log, instead of exiting: in a cluster, exiting turns an outage into a
//! crash loop. Only a configuration error (an invalid URL, an unreadable
//! credentials file) ends start-up.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::jetstream;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::config::{NatsOptions, NatsTlsOptions, RedisOptions, redact_url, url_list};
pub use crate::redis_connection::{RedisConnection, ReplicaAcks, append_ignored};

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
    /// The NATS settings cannot work: a file is missing, or two ways of
    /// authenticating are set.
    #[error("nats: {0}")]
    NatsConfig(String),
    /// The Redis settings cannot work: a file is missing, TLS files
    /// without a `rediss://` URL, or two passwords.
    #[error("redis: {0}")]
    RedisConfig(String),
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

/// Whether NATS delivers a connection's own messages to that connection's
/// subscriptions (NATS's "echo").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnMessages {
    /// Delivered, as NATS does by default.
    Delivered,
    /// Not delivered: for a service that reaches its own subscribers
    /// without the bus, so that each of its messages is not sent back to
    /// it for nothing.
    Skipped,
}

/// JetStream over `client`, under `options.api_prefix` (`nats.api_prefix`):
/// the one way a service opens it.
pub fn jetstream(client: async_nats::Client, options: &NatsOptions) -> jetstream::Context {
    jetstream::with_prefix(client, &options.api_prefix)
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
    own_messages: OwnMessages,
) -> Result<async_nats::Client, ConnectError> {
    connect_nats(options, client_name, own_messages, None).await
}

/// What the NATS server refused a connection's user: it drops a publish
/// (a request too) that the user may not make, and says so only in an
/// `-ERR` of the connection, so a request it refused looks like one that
/// timed out. The last refusal, as the server worded it (cut to 200
/// characters, control characters blanked).
#[derive(Debug, Clone, Default)]
pub struct Refusals(Arc<Mutex<Option<String>>>);

impl Refusals {
    /// The server's words for the last publish or subscription it refused.
    pub fn last(&self) -> Option<String> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn note(&self, event: &async_nats::Event) {
        let async_nats::Event::ServerError(async_nats::ServerError::Other(said)) = event else {
            return;
        };
        if !said
            .to_ascii_lowercase()
            .starts_with("permissions violation")
        {
            return;
        }
        let said = said
            .chars()
            .take(200)
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(said);
    }
}

/// [`nats`], noting in `refusals` what the server refuses the user.
///
/// # Errors
///
/// As [`nats`].
pub async fn nats_noting_refusals(
    options: &NatsOptions,
    client_name: &str,
    own_messages: OwnMessages,
    refusals: &Refusals,
) -> Result<async_nats::Client, ConnectError> {
    connect_nats(options, client_name, own_messages, Some(refusals.clone())).await
}

async fn connect_nats(
    options: &NatsOptions,
    client_name: &str,
    own_messages: OwnMessages,
    refusals: Option<Refusals>,
) -> Result<async_nats::Client, ConnectError> {
    let error = |source| ConnectError::Nats {
        url: redact_url(&options.url),
        source,
    };
    let seeds = nats_seeds(&options.url)?;
    let mut connect = nats_options(options)
        .await?
        .name(client_name)
        .retry_on_initial_connect()
        .max_reconnects(None);
    if own_messages == OwnMessages::Skipped {
        connect = connect.no_echo();
    }
    if let Some(refusals) = refusals {
        connect = connect.event_callback(move |event| {
            refusals.note(&event);
            std::future::ready(())
        });
    }
    // Returns at once (`retry_on_initial_connect`) and connects behind, to
    // any seed; the servers tell it of the rest of their cluster.
    let client = connect.connect(seeds).await.map_err(error)?;
    let url = redact_url(&options.url);
    patiently(&format!("NATS at {url}"), || async {
        match client.connection_state() {
            async_nats::connection::State::Connected => Ok(()),
            state => Err(NotConnected(format!("{state:?}").to_lowercase())),
        }
    })
    .await;
    Ok(client)
}

/// A NATS client not connected yet, in its own words (`pending`).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct NotConnected(String);

/// The servers of `nats.url`: one URL, or a cluster's seeds, comma separated.
fn nats_seeds(url: &str) -> Result<Vec<async_nats::ServerAddr>, ConnectError> {
    let seeds = url_list(url);
    if seeds.is_empty() {
        return Err(ConnectError::NatsConfig("nats.url names no server".into()));
    }
    seeds
        .into_iter()
        .map(|seed| {
            // The client's message names no part of the URL.
            seed.parse().map_err(|err| {
                ConnectError::NatsConfig(format!("nats.url {}: {err}", redact_url(seed)))
            })
        })
        .collect()
}

/// The client options `options` ask for: one way of authenticating at most,
/// and TLS. Every file is checked here, so that a missing one stops start-up
/// with its key and path instead of becoming an endless wait for a server.
async fn nats_options(options: &NatsOptions) -> Result<async_nats::ConnectOptions, ConnectError> {
    check_nats_options(options)?;
    let connect = nats_authentication(options)
        .await?
        .custom_inbox_prefix(&options.inbox_prefix);
    nats_tls(connect, &options.tls)
}

/// What `options` say that needs no file: one way of authenticating at
/// most, and subject prefixes that are prefixes.
fn check_nats_options(options: &NatsOptions) -> Result<(), ConnectError> {
    let config = |message: String| ConnectError::NatsConfig(message);
    let methods = [
        options.credentials_file.is_some(),
        options.nkey_seed_file.is_some(),
        options.user.is_some() || options.password.is_some(),
        options.token.is_some(),
    ];
    if methods.into_iter().filter(|set| *set).count() > 1 {
        return Err(config(
            "set one of credentials_file, nkey_seed_file, user and password, or token".into(),
        ));
    }
    for (key, prefix) in [
        ("inbox_prefix", &options.inbox_prefix),
        ("api_prefix", &options.api_prefix),
    ] {
        if !is_subject_prefix(prefix) {
            return Err(config(format!(
                "nats.{key} {prefix:?} is not a subject prefix (dot-separated tokens without spaces or wildcards)"
            )));
        }
    }
    Ok(())
}

/// The client options with the one way of authenticating `options` name
/// (credentials file, NKey seed, user and password, or token), if any.
async fn nats_authentication(
    options: &NatsOptions,
) -> Result<async_nats::ConnectOptions, ConnectError> {
    let config = |message: String| ConnectError::NatsConfig(message);
    let mut connect = async_nats::ConnectOptions::new();
    if let Some(path) = &options.credentials_file {
        readable("nats.credentials_file", path)?;
        connect = async_nats::ConnectOptions::with_credentials_file(path)
            .await
            .map_err(|err| config(format!("nats.credentials_file {path}: {err}")))?;
    }
    if let Some(path) = &options.nkey_seed_file {
        let seed = std::fs::read_to_string(path)
            .map_err(|err| config(format!("cannot read nats.nkey_seed_file {path}: {err}")))?;
        // Checked here, where the error can name the key; never echoed.
        if nkeys::KeyPair::from_seed(seed.trim()).is_err() {
            return Err(config(format!(
                "nats.nkey_seed_file {path} does not hold an NKey seed"
            )));
        }
        connect = connect.nkey(seed.trim().to_owned());
    }
    match (&options.user, &options.password) {
        (Some(user), Some(password)) => {
            connect = connect.user_and_password(user.clone(), password.clone());
        }
        (None, None) => {}
        _ => return Err(config("nats.user and nats.password go together".into())),
    }
    if let Some(token) = &options.token {
        connect = connect.token(token.clone());
    }
    Ok(connect)
}

/// `connect` with the TLS `tls` asks for: its CA, a client certificate,
/// TLS required.
fn nats_tls(
    mut connect: async_nats::ConnectOptions,
    tls: &NatsTlsOptions,
) -> Result<async_nats::ConnectOptions, ConnectError> {
    if let Some(path) = &tls.ca_file {
        readable("nats.tls.ca_file", path)?;
        connect = connect.add_root_certificates(path.into());
    }
    match (&tls.cert_file, &tls.key_file) {
        (Some(cert), Some(key)) => {
            readable("nats.tls.cert_file", cert)?;
            readable("nats.tls.key_file", key)?;
            connect = connect.add_client_certificate(cert.into(), key.into());
        }
        (None, None) => {}
        _ => {
            return Err(ConnectError::NatsConfig(
                "nats.tls.cert_file and nats.tls.key_file go together".into(),
            ));
        }
    }
    if tls.required || tls.ca_file.is_some() || tls.cert_file.is_some() {
        connect = connect.require_tls(true);
    }
    Ok(connect)
}

/// Whether the file `key` names at `path` can be read; the error names both.
fn readable(key: &str, path: &str) -> Result<(), ConnectError> {
    std::fs::File::open(path)
        .map(drop)
        .map_err(|err| ConnectError::NatsConfig(format!("cannot read {key} {path}: {err}")))
}

/// Whether `prefix` can start a subject: dot-separated, non-empty tokens of
/// printable ASCII without wildcards.
fn is_subject_prefix(prefix: &str) -> bool {
    prefix.len() <= 128
        && prefix.split('.').all(|token| {
            !token.is_empty()
                && token
                    .bytes()
                    .all(|b| b.is_ascii_graphic() && b != b'*' && b != b'>')
        })
}

/// Calls `attempt` until it succeeds, pausing with exponential backoff and
/// jitter (up to 5 s) between attempts, and logging each failure as "waiting
/// for `what`". For start-up steps that must outlast an outage; the caller
/// cancels it by dropping the future (on shutdown).
pub async fn patiently<T, E, F, Fut>(what: &str, attempt: F) -> T
where
    E: std::error::Error,
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
            // With its causes: JetStream's own words are in the source
            // ("maximum consumers limit reached"), and they say what to do.
            let error = std::iter::successors(Some(err as &dyn std::error::Error), |e| e.source())
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(": ");
            tracing::warn!(error, retry_in = ?pause, "waiting for {what}");
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

/// A Redis client whose settings have been checked, not yet connected.
#[derive(Clone)]
pub struct RedisClient {
    target: Target,
    /// The URL without its password, for log lines.
    url: String,
    /// Replicas that must confirm each write (`redis.wait_replicas`).
    acks: Option<ReplicaAcks>,
}

/// One server, or a cluster (`redis.cluster`).
// One per process, made once at start-up: its size costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
enum Target {
    Server(redis::Client),
    Cluster(redis::cluster::ClusterClient),
}

impl RedisClient {
    /// The client `options` ask for. Every file is read here, before any
    /// server is waited for, so that a setting that cannot work stops
    /// start-up at once with its key.
    ///
    /// # Errors
    ///
    /// [`ConnectError::Redis`] for a URL that cannot work,
    /// [`ConnectError::RedisConfig`] for settings that cannot.
    pub fn new(options: &RedisOptions) -> Result<Self, ConnectError> {
        let url = redact_url(&options.url);
        let error = |err| match err {
            RedisSetupError::Config(message) => ConnectError::RedisConfig(message),
            RedisSetupError::Client(source) => ConnectError::Redis {
                url: url.clone(),
                source,
            },
        };
        if options.key_prefix.contains(['{', '}']) {
            // A tag in the prefix would be every key's hash tag: one slot
            // for all of them on a Redis Cluster.
            return Err(ConnectError::RedisConfig(format!(
                "redis.key_prefix {:?} holds a brace: use letters, digits, ':', '-' or '_'",
                options.key_prefix
            )));
        }
        let acks = replica_acks(options)?;
        let target = if options.cluster {
            Target::Cluster(cluster_client(options).map_err(error)?)
        } else {
            Target::Server(redis_client(options).map_err(error)?)
        };
        Ok(Self { target, url, acks })
    }

    /// A connection that reconnects by itself, once Redis answers: waits
    /// with backoff while it is unreachable (while no seed of a cluster
    /// answers).
    pub async fn connect(&self) -> RedisConnection {
        let what = format!("Redis at {}", self.url);
        let connection: RedisConnection = match &self.target {
            Target::Server(client) => patiently(&what, || {
                ConnectionManager::new_with_config(client.clone(), redis_config())
            })
            .await
            .into(),
            Target::Cluster(client) => patiently(&what, || client.get_async_connection())
                .await
                .into(),
        };
        connection.with_replica_acks(self.acks)
    }
}

/// The most replicas a write may wait for (the chart's schema has the same
/// bound).
const MAX_WAIT_REPLICAS: u32 = 5;

/// What `redis.wait_replicas` and `redis.wait_timeout` ask for: none with
/// 0 replicas.
fn replica_acks(options: &RedisOptions) -> Result<Option<ReplicaAcks>, ConnectError> {
    if options.wait_replicas == 0 {
        return Ok(None);
    }
    if options.wait_replicas > MAX_WAIT_REPLICAS {
        // More than any deployment keeps per primary: every write would
        // fail, so say it now.
        return Err(ConnectError::RedisConfig(format!(
            "redis.wait_replicas {}: at most {MAX_WAIT_REPLICAS} (the replicas each primary keeps, \
             or fewer)",
            options.wait_replicas
        )));
    }
    let timeout = options.wait_timeout;
    if timeout.is_zero() || timeout >= REDIS_RESPONSE_TIMEOUT {
        // WAIT with 0 blocks for ever; one longer than the client waits
        // for any answer would time out as a lost connection.
        return Err(ConnectError::RedisConfig(format!(
            "redis.wait_timeout {} with redis.wait_replicas: give it more than 0s and less than \
             {} (500ms, say)",
            crate::config::duration::format(timeout),
            crate::config::duration::format(REDIS_RESPONSE_TIMEOUT)
        )));
    }
    Ok(Some(ReplicaAcks {
        replicas: options.wait_replicas,
        timeout,
    }))
}

/// The cluster client `options` ask for: every seed of `redis.url`, each
/// with the user, password and TLS settings one server would get.
fn cluster_client(
    options: &RedisOptions,
) -> Result<redis::cluster::ClusterClient, RedisSetupError> {
    let seeds = url_list(&options.url);
    if seeds.is_empty() {
        return Err(RedisSetupError::Config("redis.url names no server".into()));
    }
    let mut nodes = Vec::new();
    let mut certificates = None;
    for seed in seeds {
        let one = RedisOptions {
            url: seed.to_owned(),
            ..options.clone()
        };
        let (info, tls) = connection_info(&one)?;
        let db = info.redis_settings().db();
        if db != 0 {
            return Err(RedisSetupError::Config(format!(
                "redis.url {} selects database {db}: a Redis Cluster has only database 0",
                redact_url(seed)
            )));
        }
        nodes.push(info);
        certificates = tls;
    }
    // No retries of its own: it would send again a request whose
    // connection dropped after it was sent (RedisConnection sends again
    // only what a node refused unrun).
    let mut builder = redis::cluster::ClusterClientBuilder::new(nodes)
        .retries(0)
        .connection_timeout(REDIS_RESPONSE_TIMEOUT)
        .response_timeout(REDIS_RESPONSE_TIMEOUT);
    if let Some(certificates) = certificates {
        builder = builder.certs(certificates);
    }
    builder.build().map_err(RedisSetupError::Client)
}

enum RedisSetupError {
    Config(String),
    Client(redis::RedisError),
}

/// The client `options` ask for: the URL, with the user and the password
/// (from the options, the file, or the URL), and TLS with the files given.
fn redis_client(options: &RedisOptions) -> Result<redis::Client, RedisSetupError> {
    match connection_info(options)? {
        (info, None) => redis::Client::open(info),
        (info, Some(certificates)) => redis::Client::build_with_tls(info, certificates),
    }
    .map_err(RedisSetupError::Client)
}

/// The server `options.url` names, with the user and the password (from the
/// options, the file, or the URL), and the TLS files, if any. Every file is
/// read here, so that a missing one stops start-up naming its key.
fn connection_info(
    options: &RedisOptions,
) -> Result<(redis::ConnectionInfo, Option<redis::TlsCertificates>), RedisSetupError> {
    use redis::IntoConnectionInfo;
    let config = RedisSetupError::Config;
    let read = |key: &str, path: &str| {
        std::fs::read(path).map_err(|err| config(format!("cannot read {key} {path}: {err}")))
    };
    let mut info = options
        .url
        .as_str()
        .into_connection_info()
        .map_err(RedisSetupError::Client)?;
    let password = match (&options.password, &options.password_file) {
        (Some(_), Some(_)) => {
            return Err(config(
                "set redis.password or redis.password_file, not both".into(),
            ));
        }
        (Some(password), None) => Some(password.clone()),
        (None, Some(path)) => {
            let text = String::from_utf8(read("redis.password_file", path)?)
                .map_err(|_| config(format!("redis.password_file {path} is not text")))?;
            // A Secret mounted as a file often ends with a newline.
            Some(text.trim_end_matches(['\r', '\n']).to_owned())
        }
        (None, None) => None,
    };
    let mut settings = info.redis_settings().clone();
    if let Some(user) = &options.user {
        settings = settings.set_username(user);
    }
    if let Some(password) = password {
        settings = settings.set_password(password);
    }
    info = info.set_redis_settings(settings);
    let tls = &options.tls;
    if tls.ca_file.is_none() && tls.cert_file.is_none() && tls.key_file.is_none() {
        return Ok((info, None));
    }
    if !matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. }) {
        return Err(config("redis.tls.* needs a rediss:// URL".into()));
    }
    let client_tls = match (&tls.cert_file, &tls.key_file) {
        (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
            client_cert: read("redis.tls.cert_file", cert)?,
            client_key: read("redis.tls.key_file", key)?,
        }),
        (None, None) => None,
        _ => {
            return Err(config(
                "redis.tls.cert_file and redis.tls.key_file go together".into(),
            ));
        }
    };
    let root_cert = match &tls.ca_file {
        Some(path) => Some(read("redis.tls.ca_file", path)?),
        None => None,
    };
    let certificates = redis::TlsCertificates {
        client_tls,
        root_cert,
    };
    Ok((info, Some(certificates)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_settings_that_cannot_work_on_a_cluster_stop_start_up() {
        let options = |url: &str, prefix: &str| RedisOptions {
            url: url.into(),
            cluster: true,
            key_prefix: prefix.into(),
            ..RedisOptions::default()
        };
        let error = |options: RedisOptions| match RedisClient::new(&options) {
            Err(err) => err.to_string(),
            Ok(_) => panic!("{} accepted", options.url),
        };
        assert!(RedisClient::new(&options("redis://a:7000,redis://b:7001", "tf")).is_ok());
        let braced = error(options("redis://a:7000", "tf{x}"));
        assert!(braced.contains("redis.key_prefix"), "{braced}");
        let db = error(options("redis://a:7000,redis://:secret@b:7001/2", "tf"));
        assert!(db.contains("database 2"), "{db}");
        assert!(!db.contains("secret"), "{db}");
        assert!(error(options(" , ", "tf")).contains("names no server"));
    }

    #[test]
    fn waiting_for_replicas_needs_a_timeout_that_ends_before_the_client_gives_up() {
        let client = |replicas: u32, timeout: Duration| {
            RedisClient::new(&RedisOptions {
                wait_replicas: replicas,
                wait_timeout: timeout,
                ..RedisOptions::default()
            })
        };
        let acks = |replicas, timeout| client(replicas, timeout).map(|client| client.acks);
        assert_eq!(
            acks(0, Duration::ZERO).ok(),
            Some(None),
            "0 replicas: no WAIT"
        );
        assert_eq!(
            acks(1, Duration::from_millis(500)).ok(),
            Some(Some(ReplicaAcks {
                replicas: 1,
                timeout: Duration::from_millis(500)
            }))
        );
        let Err(too_many) = client(MAX_WAIT_REPLICAS + 1, Duration::from_millis(500)) else {
            panic!("{} replicas accepted", MAX_WAIT_REPLICAS + 1);
        };
        assert!(
            too_many.to_string().contains("redis.wait_replicas 6"),
            "{too_many}"
        );
        assert!(client(MAX_WAIT_REPLICAS, Duration::from_millis(500)).is_ok());
        for wrong in [Duration::ZERO, REDIS_RESPONSE_TIMEOUT] {
            let Err(err) = client(1, wrong) else {
                panic!("{wrong:?} accepted");
            };
            let message = err.to_string();
            assert!(message.contains("redis.wait_timeout"), "{message}");
        }
    }

    #[test]
    fn nats_url_is_a_list_of_seeds() {
        let seeds = nats_seeds("nats://127.0.0.1:4222, tls://u:p@b:4223,c").unwrap();
        let hosts: Vec<_> = seeds.iter().map(|s| (s.host(), s.port())).collect();
        assert_eq!(
            hosts,
            [("127.0.0.1", 4222), ("b", 4223), ("c", 4222)],
            "a seed without a port gets NATS' default"
        );
        let err = nats_seeds("nats://a:4222,nats://u:secret@b:port").unwrap_err();
        let message = err.to_string();
        assert!(message.contains("nats.url nats://***@b:port"), "{message}");
        assert!(!message.contains("secret"), "{message}");
        assert!(nats_seeds(" ,").is_err());
    }

    #[test]
    fn only_a_permissions_violation_is_noted_and_bounded() {
        use async_nats::{Event, ServerError};
        let refusals = Refusals::default();
        for event in [
            Event::Connected,
            Event::ServerError(ServerError::AuthorizationViolation),
            Event::ServerError(ServerError::Other("maximum payload violation".into())),
        ] {
            refusals.note(&event);
        }
        assert_eq!(refusals.last(), None);
        let hostile = format!(
            "Permissions Violation for Publish to \"$JS.API.STREAM.UPDATE.x\"\r\n{}",
            "y".repeat(10_000)
        );
        refusals.note(&Event::ServerError(ServerError::Other(hostile)));
        let said = refusals.last().expect("noted");
        assert_eq!(said.chars().count(), 200);
        assert!(said.starts_with("Permissions Violation for Publish to \"$JS.API"));
        assert!(!said.contains(['\r', '\n']), "{said:?}");
    }
}
