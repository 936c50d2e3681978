//! Layered configuration: defaults < TOML file < `TOOLFLEET_*` environment
//! variables (`__` for nesting, e.g. `TOOLFLEET_NATS__URL`) < command-line
//! flags; and the sections every service has (NATS, Redis, metrics, log).
//!
//! Every key is documented in `docs/configuration.md`.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use toolfleet_proto::names::RedisKeys;

/// NATS connection settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NatsOptions {
    /// Server URL(s), comma separated: the seeds of a cluster, of which
    /// the client learns the rest. Default: `nats://127.0.0.1:4222`.
    pub url: String,
    /// Copies JetStream keeps of each stream and of the registry bucket
    /// this service creates (`nats.create_missing`), 1 to 5; more than one
    /// needs a NATS cluster. `toolfleet-orchestrator setup` applies it to
    /// existing ones too. Default: 1.
    #[serde(deserialize_with = "replicas")]
    pub replicas: usize,
    /// Path of a NATS credentials file (a user JWT and its NKey seed), if
    /// the server runs in operator mode. Default: none.
    pub credentials_file: Option<String>,
    /// Path of a file holding an NKey seed (`SU...`). Default: none.
    pub nkey_seed_file: Option<String>,
    /// User name, with `password`. Default: none.
    pub user: Option<String>,
    /// Password of `user`; never printed or logged (set it through
    /// `TOOLFLEET_NATS__PASSWORD`). Default: none.
    #[serde(skip_serializing)]
    pub password: Option<String>,
    /// Authentication token; never printed or logged (set it through
    /// `TOOLFLEET_NATS__TOKEN`). Default: none.
    #[serde(skip_serializing)]
    pub token: Option<String>,
    /// TLS to the server.
    pub tls: NatsTlsOptions,
    /// Prefix of the subjects this client receives replies on (its
    /// requests' inboxes, its pull consumers' deliveries). Give each NATS
    /// user its own (`_INBOX.<user>`) and let it subscribe only there, so
    /// that no one reads another's deliveries (`deploy/nats/`). Default:
    /// `_INBOX`.
    pub inbox_prefix: String,
    /// Prefix of the JetStream API subjects. `$JS.API` where toolfleet's
    /// streams are in this service's own NATS account; a worker pool whose
    /// account imports the API (`deploy/nats/toolfleet-users.conf`, decision
    /// 0029) uses `JS.toolfleet.API`. Default: `$JS.API`.
    pub api_prefix: String,
    /// Create the streams, consumers and registry bucket this service needs
    /// when they do not exist. Turn it off where `toolfleet-orchestrator
    /// setup` creates them and this service's NATS user may not: a missing
    /// one is then waited for, and logged with the step that creates it.
    /// Default: true.
    #[serde(deserialize_with = "figment::util::bool_from_str_or_int")]
    pub create_missing: bool,
}

impl Default for NatsOptions {
    fn default() -> Self {
        Self {
            url: "nats://127.0.0.1:4222".into(),
            replicas: 1,
            credentials_file: None,
            nkey_seed_file: None,
            user: None,
            password: None,
            token: None,
            tls: NatsTlsOptions::default(),
            inbox_prefix: "_INBOX".into(),
            api_prefix: "$JS.API".into(),
            create_missing: true,
        }
    }
}

/// TLS to the NATS server.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NatsTlsOptions {
    /// Require TLS even without the files below (a `tls://` URL does too).
    /// Default: false.
    #[serde(deserialize_with = "figment::util::bool_from_str_or_int")]
    pub required: bool,
    /// CA certificates (PEM) the server's certificate chains to; TLS is then
    /// required. Default: none (the system's roots).
    pub ca_file: Option<String>,
    /// Client certificate (PEM), for a server that verifies clients.
    /// Default: none.
    pub cert_file: Option<String>,
    /// The client certificate's private key (PEM). Default: none.
    pub key_file: Option<String>,
}

/// Redis connection settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedisOptions {
    /// Server URL (`redis://`, or `rediss://` for TLS; may carry a user and
    /// password); with `cluster`, the seeds of a Redis Cluster, comma
    /// separated. Default: `redis://127.0.0.1:6379/`.
    pub url: String,
    /// `url` names the seeds of a Redis Cluster: each command goes to the
    /// primary of its key's slot. Default: false.
    #[serde(deserialize_with = "figment::util::bool_from_str_or_int")]
    pub cluster: bool,
    /// Prefix of every key. Default: `tf`.
    pub key_prefix: String,
    /// ACL user name; wins over one in the URL. Default: none.
    pub user: Option<String>,
    /// Password; wins over one in the URL; never printed or logged (set it
    /// through `TOOLFLEET_REDIS__PASSWORD`). Default: none.
    #[serde(skip_serializing)]
    pub password: Option<String>,
    /// A file holding the password (a mounted Secret); not with `password`.
    /// Default: none.
    pub password_file: Option<String>,
    /// TLS to the server, with a `rediss://` URL.
    pub tls: RedisTlsOptions,
    /// Replicas that must hold a write before it counts as written (Redis
    /// `WAIT` after each write); 0 acknowledges a write once the primary
    /// has it, which a failover can lose. Default: 0.
    pub wait_replicas: u32,
    /// How long a write waits for `wait_replicas` replicas before it fails
    /// as not written; more than 0s and less than 5s. Default: 500ms.
    #[serde(with = "crate::config::duration")]
    pub wait_timeout: Duration,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            url: "redis://127.0.0.1:6379/".into(),
            cluster: false,
            key_prefix: RedisKeys::DEFAULT_PREFIX.into(),
            user: None,
            password: None,
            password_file: None,
            tls: RedisTlsOptions::default(),
            wait_replicas: 0,
            wait_timeout: Duration::from_millis(500),
        }
    }
}

/// TLS to the Redis server (the URL must be `rediss://`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedisTlsOptions {
    /// CA certificates (PEM) the server's certificate chains to. Default:
    /// none (the system's roots).
    pub ca_file: Option<String>,
    /// Client certificate (PEM), for a server that verifies clients
    /// (`tls-auth-clients yes`). Default: none.
    pub cert_file: Option<String>,
    /// The client certificate's private key (PEM). Default: none.
    pub key_file: Option<String>,
}

/// Prometheus metrics endpoint.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsOptions {
    /// Address to serve `/metrics` on, e.g. `0.0.0.0:9090`. Default: none (off).
    pub listen: Option<SocketAddr>,
}

/// Log output settings. `RUST_LOG` overrides `level`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogOptions {
    /// `text` or `json` (production). Default: `text`.
    pub format: LogFormat,
    /// Filter directive, e.g. `info` or `toolfleet_worker=debug`. Default: `info`.
    pub level: String,
}

impl Default for LogOptions {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            level: "info".into(),
        }
    }
}

/// OpenTelemetry export of traces and metrics (see `docs/observability.md`).
/// Off unless an endpoint is set here or in `OTEL_EXPORTER_OTLP_ENDPOINT`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryOptions {
    /// The OTLP collector, e.g. `http://otel-collector:4317`. Default: none
    /// (the standard variables, else tracing off).
    pub otlp_endpoint: Option<String>,
    /// `grpc` or `http/protobuf`. Default: `OTEL_EXPORTER_OTLP_PROTOCOL`,
    /// else `grpc`.
    pub otlp_protocol: Option<OtlpProtocol>,
    /// The share of jobs traced, 0.0 to 1.0; a job's spans in every process
    /// follow its decision. Default: `OTEL_TRACES_SAMPLER(_ARG)`, else 1.0.
    #[serde(deserialize_with = "ratio")]
    pub sample_ratio: Option<f64>,
    /// Whether the span of each tool call carries the call's arguments and
    /// the data of its result (`gen_ai.tool.call.arguments`,
    /// `gen_ai.tool.call.result`), each cut to 8 KiB. They may hold
    /// whatever a user told the model: opt-in, as the GenAI conventions
    /// ask. Read by the orchestrator, whose spans these are; a worker's
    /// spans never carry them. Default: false.
    pub capture_tool_content: bool,
}

/// The transport of OTLP exports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum OtlpProtocol {
    /// OTLP over gRPC (port 4317 by convention).
    #[serde(rename = "grpc")]
    Grpc,
    /// OTLP over HTTP with protobuf bodies (port 4318 by convention).
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
}

fn ratio<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<f64>, D::Error> {
    let ratio = Option::<f64>::deserialize(deserializer)?;
    match ratio {
        Some(r) if !(0.0..=1.0).contains(&r) => Err(serde::de::Error::custom(format!(
            "{r} is not a ratio between 0.0 and 1.0"
        ))),
        other => Ok(other),
    }
}

/// The most copies of a stream JetStream keeps.
const MAX_REPLICAS: usize = 5;

fn replicas<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<usize, D::Error> {
    let replicas = usize::deserialize(deserializer)?;
    if (1..=MAX_REPLICAS).contains(&replicas) {
        Ok(replicas)
    } else {
        Err(serde::de::Error::custom(format!(
            "{replicas} replicas: JetStream keeps 1 to {MAX_REPLICAS} copies of a stream"
        )))
    }
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Durations in configuration: read as humantime reads them (`30s`,
/// `1h 30m`, `500ms`), written the way the docs write them (`24h`, `1h30m`,
/// `500ms`; humantime would print `1day`). Use with
/// `#[serde(with = "toolfleet_service::config::duration")]`.
pub mod duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    /// `24h`, `1h30m`, `2s`, `1s500ms`, `0s`: hours, minutes, seconds,
    /// milliseconds, microseconds and nanoseconds, the zero ones left out.
    pub fn format(duration: Duration) -> String {
        if duration.is_zero() {
            return "0s".into();
        }
        let secs = duration.as_secs();
        let nanos = duration.subsec_nanos();
        let parts = [
            (secs / 3600, "h"),
            (secs / 60 % 60, "m"),
            (secs % 60, "s"),
            (u64::from(nanos / 1_000_000), "ms"),
            (u64::from(nanos / 1_000 % 1_000), "us"),
            (u64::from(nanos % 1_000), "ns"),
        ];
        parts
            .iter()
            .filter(|(amount, _)| *amount > 0)
            .map(|(amount, unit)| format!("{amount}{unit}"))
            .collect()
    }

    /// Serializes as [`format()`] writes it.
    ///
    /// # Errors
    ///
    /// Those of the serializer.
    pub fn serialize<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&format(*duration))
    }

    /// Deserializes what humantime parses.
    ///
    /// # Errors
    ///
    /// A text humantime cannot read, with its reason.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        humantime_serde::deserialize(deserializer)
    }

    /// A duration as a map value (`tool_timeouts = { sleep = "500ms" }`),
    /// read and written like the fields.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Value(pub Duration);

    impl serde::Serialize for Value {
        fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            serialize(&self.0, serializer)
        }
    }

    impl<'de> Deserialize<'de> for Value {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            deserialize(deserializer).map(Self)
        }
    }
}

/// `url` without its password, for messages and logs:
/// `redis://:secret@host:6379/0` becomes `redis://***@host:6379/0`; each URL
/// of a comma-separated list ([`url_list`]) is redacted on its own.
pub fn redact_url(url: &str) -> String {
    url_list(url)
        .into_iter()
        .map(redact_one)
        .collect::<Vec<_>>()
        .join(",")
}

/// Everything between the scheme (if any) and the last `@` is a user and a
/// password.
fn redact_one(url: &str) -> String {
    let Some(at) = url.rfind('@') else {
        return url.to_owned();
    };
    let start = url.find("://").map_or(0, |scheme| scheme + 3);
    if at < start {
        return url.to_owned();
    }
    format!("{}***{}", &url[..start], &url[at..])
}

/// The URLs of a comma-separated list (`nats.url`'s seeds), trimmed. A
/// password may hold a comma too: a piece whose `@` has no scheme before it
/// continues the URL before it when that one has a scheme and no `@` yet.
pub fn url_list(urls: &str) -> Vec<&str> {
    let mut list: Vec<(usize, usize)> = Vec::new();
    let mut start = 0;
    for piece in urls.split(',') {
        let end = start + piece.len();
        let continues = piece
            .find('@')
            .is_some_and(|at| !piece[..at].contains("://"));
        match list.last_mut() {
            Some(last)
                if continues
                    && urls[last.0..last.1].contains("://")
                    && !urls[last.0..last.1].contains('@') =>
            {
                last.1 = end;
            }
            _ => list.push((start, end)),
        }
        start = end + 1;
    }
    list.into_iter()
        .map(|(start, end)| urls[start..end].trim())
        .filter(|url| !url.is_empty())
        .collect()
}

/// A configuration that could not be loaded; the message names the key.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct ConfigError(#[source] Box<figment::Error>);

/// Loads an options tree in layers: `T::default()`, then the TOML file at
/// `path` (if any), then the `TOOLFLEET_*` environment variables whose first
/// level is one of `env_keys` (other `TOOLFLEET_*` variables belong to
/// another binary or to the test harness), then `overrides` (the
/// command-line flags, as a partial document; see [`Overrides`]).
///
/// # Errors
///
/// A file that cannot be read or parsed, or a value of the wrong type; the
/// error names the key and where it came from.
pub fn load_layered<T>(
    path: Option<&Path>,
    overrides: Value,
    env_keys: &'static [&'static str],
) -> Result<T, ConfigError>
where
    T: Default + Serialize + serde::de::DeserializeOwned,
{
    let mut figment = Figment::from(Serialized::defaults(T::default()));
    if let Some(path) = path {
        figment = figment.merge(Toml::file_exact(path));
    }
    let env = Env::prefixed("TOOLFLEET_").split("__").filter(move |key| {
        // Seen in its original case, after `split` (`RUNTIME.MAX_IN_FLIGHT`).
        let key = key.as_str().to_ascii_lowercase();
        let top = key.split('.').next().unwrap_or_default();
        env_keys.contains(&top)
    });
    figment
        .merge(env)
        .merge(Serialized::defaults(overrides))
        .extract()
        .map_err(|e| ConfigError(Box::new(e)))
}

/// The command-line flags that were given, as the partial document
/// [`load_layered`] takes last.
#[derive(Debug, Clone)]
pub struct Overrides(Value);

impl Default for Overrides {
    fn default() -> Self {
        Self(json!({}))
    }
}

impl Overrides {
    /// Sets the dotted `key` (`runtime.max_in_flight`) when `value` is given.
    #[must_use]
    pub fn set(mut self, key: &str, value: Option<impl Serialize>) -> Self {
        let Some(value) = value else { return self };
        // A flag's value is a string, number, bool or list: always serializable.
        let value = serde_json::to_value(value).unwrap_or(Value::Null);
        let mut node = &mut self.0;
        let mut path = key.split('.').peekable();
        while let Some(part) = path.next() {
            if !node.is_object() {
                *node = json!({});
            }
            let object = node.as_object_mut().expect("made an object above");
            if path.peek().is_none() {
                object.insert(part.to_owned(), value);
                break;
            }
            node = object.entry(part).or_insert_with(|| json!({}));
        }
        self
    }

    /// The document.
    pub fn into_value(self) -> Value {
        self.0
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn durations_print_as_the_docs_write_them_and_read_back() {
        use std::time::Duration;
        for (duration, text) in [
            (Duration::from_secs(24 * 3600), "24h"),
            (Duration::from_secs(5400), "1h30m"),
            (Duration::from_secs(30), "30s"),
            (Duration::from_millis(500), "500ms"),
            (Duration::from_millis(1500), "1s500ms"),
            (Duration::from_nanos(1_001_001), "1ms1us1ns"),
            (Duration::ZERO, "0s"),
        ] {
            assert_eq!(super::duration::format(duration), text);
            assert_eq!(humantime::parse_duration(text).unwrap(), duration, "{text}");
        }
    }

    use super::*;

    #[test]
    fn passwords_never_reach_messages() {
        assert_eq!(
            redact_url("redis://:s3cret@host:6379/0"),
            "redis://***@host:6379/0"
        );
        assert_eq!(redact_url("nats://user:pw@a:4222"), "nats://***@a:4222");
        assert_eq!(redact_url("user:pw@a:4222"), "***@a:4222");
        assert_eq!(
            redact_url("nats://u:p@a:4222, nats://b:4222,nats://v:q,w@c"),
            "nats://***@a:4222,nats://b:4222,nats://***@c"
        );
        assert_eq!(
            redact_url("redis://127.0.0.1:6379/"),
            "redis://127.0.0.1:6379/"
        );
    }

    #[test]
    fn url_lists_split_at_commas_outside_passwords() {
        assert_eq!(url_list("nats://a:4222"), ["nats://a:4222"]);
        assert_eq!(
            url_list("nats://a:4222, b:4223,,nats://u:p,w@c"),
            ["nats://a:4222", "b:4223", "nats://u:p,w@c"]
        );
        assert_eq!(url_list("a:1,u@b"), ["a:1", "u@b"]);
        assert!(url_list(" , ").is_empty());
    }

    #[test]
    fn replicas_are_one_to_five() {
        let load = |replicas: usize| {
            load_layered::<NatsSection>(None, json!({"nats": {"replicas": replicas}}), &[])
        };
        assert_eq!(load(3).unwrap().nats.replicas, 3);
        for wrong in [0, 6] {
            let err = load(wrong).unwrap_err().to_string();
            assert!(err.contains("nats.replicas"), "{err}");
            assert!(err.contains("1 to 5"), "{err}");
        }
    }

    #[derive(Debug, Default, Serialize, Deserialize)]
    struct NatsSection {
        nats: NatsOptions,
    }

    #[test]
    fn overrides_build_nested_documents_and_skip_unset_flags() {
        let doc = Overrides::default()
            .set("nats.url", Some("nats://flag:4222"))
            .set("redis.url", None::<String>)
            .set("runtime.max_in_flight", Some(4))
            .set("test_tools", Some(true))
            .set("tools", Some(vec!["echo"]))
            .into_value();
        assert_eq!(
            doc,
            json!({"nats": {"url": "nats://flag:4222"}, "runtime": {"max_in_flight": 4},
                   "test_tools": true, "tools": ["echo"]})
        );
    }
}
