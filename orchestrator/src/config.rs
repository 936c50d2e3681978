//! Orchestrator configuration, loaded in layers like the worker's: defaults <
//! TOML file < `TOOLFLEET_*` environment (`__` for nesting) < flags. Every key
//! is documented in `docs/configuration.md`.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tonic::transport::{Certificate, Identity, ServerTlsConfig};
use toolfleet_service::config::{
    ConfigError, LogOptions, MetricsOptions, NatsOptions, RedisOptions, TelemetryOptions,
    load_layered,
};
use toolfleet_service::queue;

use crate::api::ApiOptions;
use crate::approval::ApprovalOptions;
use crate::breaker::BreakerOptions;
use crate::dispatch::DispatchOptions;
use crate::model::{AnthropicOptions, OpenAiOptions};
use crate::runner::RunnerOptions;
use crate::shaping::ResultOptions;

/// Everything an orchestrator process needs.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OrchestratorOptions {
    /// Identity of this replica in job leases. Default: empty, which means
    /// `<hostname>-<pid>-<random>`.
    pub instance_id: String,
    /// Threads that run this process's tasks; 0 means one per CPU the
    /// process may use (its cgroup's CPU limit included), and 1 a
    /// single-threaded runtime, the cheapest where several busy processes
    /// share few cores. Default: 0.
    pub threads: usize,
    /// NATS connection.
    pub nats: NatsOptions,
    /// Redis connection and key layout.
    pub redis: RedisOptions,
    /// gRPC server.
    pub grpc: GrpcOptions,
    /// API limits and defaults.
    pub api: ApiOptions,
    /// Job runner.
    pub runner: RunnerOptions,
    /// Tool call dispatch.
    pub dispatch: DispatchOptions,
    /// Calls held for a person's approval (docs/approvals.md).
    pub approval: ApprovalOptions,
    /// What the model is shown of large tool results (docs/protection.md).
    pub results: ResultOptions,
    /// The per-tool circuit breaker (docs/protection.md).
    pub breaker: BreakerOptions,
    /// Job store retention.
    pub store: StoreOptions,
    /// Tool registry.
    pub registry: RegistryOptions,
    /// OpenAI-compatible model providers.
    pub openai: OpenAiOptions,
    /// Anthropic's Messages API (provider `anthropic-messages`).
    pub anthropic: AnthropicOptions,
    /// What `toolfleet-orchestrator setup` creates in JetStream.
    pub setup: SetupOptions,
    /// Prometheus metrics endpoint.
    pub metrics: MetricsOptions,
    /// OpenTelemetry export (traces and metrics).
    pub telemetry: TelemetryOptions,
    /// Log output.
    pub log: LogOptions,
}

/// gRPC server settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GrpcOptions {
    /// Address to serve on. Default: `127.0.0.1:50051`.
    pub listen: SocketAddr,
    /// Serve gRPC server reflection (v1 and v1alpha), which lists every
    /// service and message to whoever connects. Default: false (on in
    /// `toolfleet dev`).
    #[serde(deserialize_with = "figment::util::bool_from_str_or_int")]
    pub reflection: bool,
    /// TLS for the gRPC port. Default: off (plaintext).
    pub tls: TlsOptions,
    /// Largest request message the server reads, in bytes. Requests up to
    /// it are checked field by field (`api.max_*`), with an error naming
    /// the field; a larger one is refused unread with `OUT_OF_RANGE`.
    /// Default: 16777216 (16 MiB; gRPC's usual 4 MiB would refuse an input
    /// of a few MB unread, with no word of `api.max_input_bytes`).
    pub max_request_bytes: usize,
}

impl Default for GrpcOptions {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
            reflection: false,
            tls: TlsOptions::default(),
            max_request_bytes: 16 * 1024 * 1024,
        }
    }
}

/// TLS, and mutual TLS, for the gRPC port (`grpc.tls.*`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsOptions {
    /// The server's certificate chain (PEM). With `key_file`, the port
    /// speaks TLS only. Default: none.
    pub cert_file: Option<std::path::PathBuf>,
    /// The server's private key (PEM). Default: none.
    pub key_file: Option<std::path::PathBuf>,
    /// CA certificates (PEM) that client certificates must chain to: with
    /// it, every client must present one (mutual TLS), and a client whose
    /// certificate names a tenant's `client_names` is that tenant. Default:
    /// none.
    pub client_ca_file: Option<std::path::PathBuf>,
}

impl TlsOptions {
    /// The server's TLS settings; `None` without a certificate. Reads the
    /// files.
    ///
    /// # Errors
    ///
    /// A file that cannot be read, or settings that do not go together.
    pub(crate) fn server_config(&self) -> Result<Option<ServerTlsConfig>, String> {
        let read = |key: &str, path: &std::path::Path| {
            std::fs::read(path)
                .map_err(|err| format!("cannot read {key} {}: {err}", path.display()))
        };
        let (cert, key) = match (&self.cert_file, &self.key_file) {
            (None, None) => {
                if self.client_ca_file.is_some() {
                    return Err(
                        "client_ca_file needs cert_file and key_file: mutual TLS is TLS first"
                            .into(),
                    );
                }
                return Ok(None);
            }
            (Some(cert), Some(key)) => (read("cert_file", cert)?, read("key_file", key)?),
            _ => return Err("set both cert_file and key_file, or neither".into()),
        };
        let mut config = ServerTlsConfig::new().identity(Identity::from_pem(cert, key));
        if let Some(ca) = &self.client_ca_file {
            config = config.client_ca_root(Certificate::from_pem(read("client_ca_file", ca)?));
        }
        Ok(Some(config))
    }
}

/// Job store retention.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreOptions {
    /// How long a finished job (record, items, events) is kept. Default: 24h.
    #[serde(with = "toolfleet_service::config::duration")]
    pub job_retention: Duration,
    /// How long a submission's idempotency key maps to its job. Default: 24h.
    #[serde(with = "toolfleet_service::config::duration")]
    pub idempotency_ttl: Duration,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            job_retention: Duration::from_secs(24 * 3600),
            idempotency_ttl: Duration::from_secs(24 * 3600),
        }
    }
}

/// What `toolfleet-orchestrator setup` creates: the job and call streams,
/// the orchestrators' consumer, one consumer per tool listed here, and the
/// registry bucket (decision 0012).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SetupOptions {
    /// The tools whose consumers to create, over every worker pool (the
    /// `--tools` flag of `setup` sets it). Default: none.
    pub tools: Vec<String>,
    /// AckWait of every tool's consumer: a call not acked (nor kept alive by
    /// its worker) within it is redelivered. Default: 30s.
    #[serde(with = "toolfleet_service::config::duration")]
    pub call_ack_wait: Duration,
    /// How long a call may wait in the stream for a worker. Default: 24h.
    #[serde(with = "toolfleet_service::config::duration")]
    pub call_max_age: Duration,
}

impl Default for SetupOptions {
    fn default() -> Self {
        Self {
            tools: Vec::new(),
            call_ack_wait: queue::DEFAULT_CALL_ACK_WAIT,
            call_max_age: queue::DEFAULT_CALL_MAX_AGE,
        }
    }
}

/// Tool registry settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RegistryOptions {
    /// A worker's announcement older than this no longer counts. Must match
    /// the workers' `registry.ttl`. Default: 15s.
    #[serde(with = "toolfleet_service::config::duration")]
    pub ttl: Duration,
}

impl Default for RegistryOptions {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(15),
        }
    }
}

const ENV_KEYS: &[&str] = &[
    "threads",
    "instance_id",
    "nats",
    "redis",
    "grpc",
    "api",
    "runner",
    "dispatch",
    "approval",
    "results",
    "breaker",
    "store",
    "registry",
    "openai",
    "anthropic",
    "setup",
    "metrics",
    "telemetry",
    "log",
];

impl OrchestratorOptions {
    /// Loads the layers (see the module docs).
    ///
    /// # Errors
    ///
    /// A bad file or value; the error names the key.
    pub fn load(path: Option<&Path>, overrides: serde_json::Value) -> Result<Self, ConfigError> {
        let mut options: Self = load_layered(path, overrides, ENV_KEYS)?;
        // Resolved once, so that `--print-config` shows the id in use.
        options.instance_id = options.resolved_instance_id();
        Ok(options)
    }

    /// The checks of this orchestrator's own keys
    /// (`toolfleet_service::binary::ServiceOptions::check`): the gRPC TLS
    /// files, read as the server will. The tokens file is read when the
    /// replica starts, before it connects.
    ///
    /// # Errors
    ///
    /// What is wrong, naming the key.
    pub fn check_own(&self) -> Result<(), String> {
        let api = &self.api;
        // A request with its input, instructions and script at their limits
        // must be read, so that its errors name the field.
        let least = api.max_script_bytes + 2 * api.max_input_bytes;
        if self.grpc.max_request_bytes < least {
            return Err(format!(
                "grpc.max_request_bytes is {}; it must be at least {least} (api.max_script_bytes \
                 and twice api.max_input_bytes), so that a request within the api limits is read",
                self.grpc.max_request_bytes
            ));
        }
        // A key file that cannot be read stops the replica now, not its
        // first job.
        self.openai.check()?;
        self.anthropic.check()?;
        if self.approval.timeout.is_zero() {
            return Err(
                "approval.timeout is 0s: every held call would expire at once; \
                        give it a duration (default 24h)"
                    .to_owned(),
            );
        }
        if self.dispatch.version_gone_after.is_zero() {
            return Err(
                "dispatch.version_gone_after is 0s: a call would be answered \
                        TOOL_VERSION_GONE as soon as its version's last worker left; give it a \
                        duration (default 2m)"
                    .to_owned(),
            );
        }
        self.breaker.check("breaker")?;
        self.grpc
            .tls
            .server_config()
            .map(drop)
            .map_err(|err| format!("grpc.tls: {err}"))
    }

    /// The JetStream objects `setup` creates, with these options.
    pub fn layout(&self) -> queue::Layout {
        queue::Layout {
            job_ack_wait: self.runner.job_ack_wait,
            call_max_age: self.setup.call_max_age,
            call_ack_wait: self.setup.call_ack_wait,
            registry_ttl: self.registry.ttl,
            tools: self.setup.tools.clone(),
            replicas: self.nats.replicas,
        }
    }

    /// This replica's id: the configured one or `<hostname>-<pid>-<random>`.
    pub fn resolved_instance_id(&self) -> String {
        toolfleet_service::identity::replica_id(&self.instance_id)
    }
}

// Secrets are never serialized (the OpenAI key is `skip_serializing`); URL
// passwords are hidden when the options are printed or logged.
toolfleet_service::service_options!(OrchestratorOptions, runner.drain_timeout);
