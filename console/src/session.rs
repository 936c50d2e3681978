//! Sessions: who is signed in, kept in Redis so that any console replica
//! serves any request and a sign-out revokes at once.
//!
//! The browser holds only the session's id, in an `HttpOnly`, `Secure`,
//! `SameSite=Strict` cookie. Redis holds the credential the console calls
//! the API with, under the SHA-256 of the id (a copy of Redis names no
//! cookie), with the session's time to live.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use redis::AsyncCommands as _;
use redis::aio::ConnectionManager;
use sha2::{Digest, Sha256};

/// Where sessions are kept: `<prefix>console:session:<sha256 of the id>`.
const SESSION_KEYS: &str = "console:session:";

/// TLS to the sessions' Redis: files of PEM, each read at start-up.
#[derive(Debug, Clone, Default)]
pub struct RedisTls {
    /// The CA the server's certificate chains to (default: the system's
    /// roots).
    pub ca_file: Option<PathBuf>,
    /// A client certificate, for a Redis that verifies clients; with
    /// `key_file`.
    pub cert_file: Option<PathBuf>,
    /// The client certificate's private key.
    pub key_file: Option<PathBuf>,
}

/// The client of the Redis `options` name: the URL, the password if it
/// is given apart, and TLS with the files given.
///
/// # Errors
///
/// The URL is not a Redis URL, a file cannot be read, or TLS files are
/// given for a URL that is not `rediss://`.
pub(crate) fn client(options: &crate::ConsoleOptions) -> anyhow::Result<redis::Client> {
    use redis::IntoConnectionInfo as _;
    let mut info = options
        .redis_url
        .as_str()
        .into_connection_info()
        .context("--redis-url is not a Redis URL")?;
    if let Some(password) = &options.redis_password {
        let settings = info.redis_settings().clone().set_password(password);
        info = info.set_redis_settings(settings);
    }
    let tls = &options.redis_tls;
    if tls.ca_file.is_none() && tls.cert_file.is_none() && tls.key_file.is_none() {
        return redis::Client::open(info).context("--redis-url is not a Redis URL");
    }
    anyhow::ensure!(
        matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. }),
        "the --redis-*-file flags need a rediss:// URL"
    );
    let read = |flag: &str, path: &Path| {
        std::fs::read(path).with_context(|| format!("cannot read {flag} {}", path.display()))
    };
    let client_tls = match (&tls.cert_file, &tls.key_file) {
        (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
            client_cert: read("--redis-cert-file", cert)?,
            client_key: read("--redis-key-file", key)?,
        }),
        (None, None) => None,
        _ => anyhow::bail!("--redis-cert-file and --redis-key-file go together"),
    };
    let root_cert = tls
        .ca_file
        .as_deref()
        .map(|ca| read("--redis-ca-file", ca))
        .transpose()?;
    let certificates = redis::TlsCertificates {
        client_tls,
        root_cert,
    };
    redis::Client::build_with_tls(info, certificates).context("cannot set up TLS to Redis")
}

/// A signed-in person, as the API told the console at sign-in (`WhoAmI`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Session {
    /// The bearer token every API call of the session carries.
    pub token: String,
    pub tenant: String,
    pub person: String,
    pub roles: Vec<String>,
    /// The token each form of the session carries back (CSRF).
    pub csrf: String,
}

impl Session {
    /// Whether the person has `role`.
    pub(crate) fn has(&self, role: &str) -> bool {
        self.roles.iter().any(|r| r == role)
    }
}

/// The sessions in Redis.
#[derive(Clone)]
pub(crate) struct Sessions {
    redis: ConnectionManager,
    prefix: String,
    ttl: Duration,
}

/// A random value, as hex: 256 bits, for a session id or a CSRF token.
pub(crate) fn random_hex() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Sessions {
    pub(crate) fn new(redis: ConnectionManager, prefix: &str, ttl: Duration) -> Self {
        Self {
            redis,
            prefix: prefix.to_owned(),
            ttl,
        }
    }

    /// How long a session lasts at most.
    pub(crate) fn ttl(&self) -> std::time::Duration {
        self.ttl
    }

    fn key(&self, id: &str) -> String {
        let hash = Sha256::digest(id.as_bytes());
        let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
        format!("{}{SESSION_KEYS}{hex}", self.prefix)
    }

    /// Stores a new session of `session` for `ttl`, and returns its id.
    ///
    /// # Errors
    ///
    /// Redis failed.
    pub(crate) async fn create(
        &self,
        session: &Session,
        ttl: Duration,
    ) -> redis::RedisResult<String> {
        let id = random_hex();
        let key = self.key(&id);
        let fields = [
            ("token", session.token.as_str()),
            ("tenant", session.tenant.as_str()),
            ("person", session.person.as_str()),
            ("roles", &session.roles.join(" ")),
            ("csrf", session.csrf.as_str()),
        ];
        redis::pipe()
            .atomic()
            .hset_multiple(&key, &fields)
            .ignore()
            .expire(
                &key,
                i64::try_from(ttl.as_secs().max(1)).unwrap_or(i64::MAX),
            )
            .ignore()
            .query_async::<()>(&mut self.redis.clone())
            .await?;
        Ok(id)
    }

    /// The session of `id`, if it exists (not expired, not signed out).
    ///
    /// # Errors
    ///
    /// Redis failed.
    pub(crate) async fn find(&self, id: &str) -> redis::RedisResult<Option<Session>> {
        if id.len() != 64 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Ok(None);
        }
        let fields: std::collections::HashMap<String, String> =
            self.redis.clone().hgetall(self.key(id)).await?;
        let field = |name: &str| fields.get(name).cloned();
        Ok(field("token")
            .zip(field("csrf"))
            .map(|(token, csrf)| Session {
                token,
                tenant: field("tenant").unwrap_or_default(),
                person: field("person").unwrap_or_default(),
                roles: field("roles")
                    .unwrap_or_default()
                    .split_whitespace()
                    .map(str::to_owned)
                    .collect(),
                csrf,
            }))
    }

    /// Ends the session of `id`: every replica refuses it from now on.
    ///
    /// # Errors
    ///
    /// Redis failed.
    pub(crate) async fn end(&self, id: &str) -> redis::RedisResult<()> {
        self.redis.clone().del::<_, ()>(self.key(id)).await
    }
}
