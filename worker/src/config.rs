//! Worker configuration, loaded in layers: defaults < TOML file <
//! `TOOLFLEET_*` environment variables (`__` for nesting, e.g.
//! `TOOLFLEET_RUNTIME__MAX_IN_FLIGHT=32`) < command-line flags.
//!
//! Every key is documented in `docs/configuration.md`.

use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use toolfleet_proto::manifest::BreakerOverride;
use toolfleet_proto::{Effects, ToolManifest};
pub use toolfleet_service::config::{
    ConfigError, LogFormat, LogOptions, MetricsOptions, NatsOptions, RedisOptions,
    TelemetryOptions, redact_url,
};
use toolfleet_service::config::{duration, load_layered};
use toolfleet_service::queue;

use crate::mcp::{McpHost, McpOptions, Sandbox};
use crate::tools::knowledge_graph::KgOptions;
use crate::tools::weather::WeatherOptions;

/// Everything a worker process needs to run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkerOptions {
    /// Identity of this process in the registry and in claims. Default: empty,
    /// which means `<hostname>-<pid>-<random>`.
    pub worker_id: String,
    /// Threads that run this process's tasks; 0 means one per CPU the
    /// process may use (its cgroup's CPU limit included), and 1 a
    /// single-threaded runtime, the cheapest where several busy processes
    /// share few cores. Default: 0.
    pub threads: usize,
    /// The pool this worker belongs to, announced with each of its tools
    /// so that `ListTools` and the console say which pools serve a tool: 1
    /// to 64 letters, digits, `_`, `-` or `.`. Default: empty (none said).
    pub pool: String,
    /// NATS connection.
    pub nats: NatsOptions,
    /// Redis connection and key layout.
    pub redis: RedisOptions,
    /// How calls are pulled and executed.
    pub runtime: RuntimeOptions,
    /// How this worker announces its tools.
    pub registry: RegistryOptions,
    /// Tools to serve: empty means every tool of the worker (the built-in
    /// tools, or a worker of your own's toolbox). Default: empty.
    pub tools: Vec<String>,
    /// Also serve the test tools (`tools::testing`), in a build with the
    /// `test-tools` feature; a build without it refuses to start. Never
    /// enable in production. Default: false.
    /// `TOOLFLEET_TEST_TOOLS=1` or `--test-tools` enable it.
    #[serde(deserialize_with = "figment::util::bool_from_str_or_int")]
    pub test_tools: bool,
    /// Settings of the `get_current_weather` tool.
    pub weather: WeatherOptions,
    /// Settings of the knowledge-graph tools (`factual_qa`, `trend_analysis`).
    pub kg: KgOptions,
    /// MCP servers whose tools this worker serves (`[[mcp.servers]]`,
    /// docs/tools/mcp.md). Default: none.
    pub mcp: McpOptions,
    /// Prometheus metrics endpoint.
    pub metrics: MetricsOptions,
    /// OpenTelemetry export (traces and metrics).
    pub telemetry: TelemetryOptions,
    /// Log output.
    pub log: LogOptions,
    /// The tools of a worker of your own ([`WorkerOptions::serving`]);
    /// `None`: the built-in tools. Not a key: the binary's code sets it.
    #[serde(skip)]
    toolbox: Option<Vec<String>>,
    /// The file it was read from (`--config`, `TOOLFLEET_CONFIG`). Not a
    /// key.
    #[serde(skip)]
    config_file: Option<PathBuf>,
}

/// How the runtime pulls and executes calls.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeOptions {
    /// Calls this process executes at once, over all its tools. Default: 16.
    pub max_in_flight: NonZeroUsize,
    /// How long SIGTERM waits for in-flight calls before naking the rest.
    /// Keep it below the pod's terminationGracePeriodSeconds. Default: 25s.
    #[serde(with = "toolfleet_service::config::duration")]
    pub drain_timeout: Duration,
    /// JetStream AckWait of the tool consumers this worker creates: a call
    /// not acked (nor kept alive) within it is redelivered. Long calls are
    /// kept alive automatically, against the consumer's own AckWait where
    /// the consumer already existed. Default: 30s.
    #[serde(with = "toolfleet_service::config::duration")]
    pub ack_wait: Duration,
    /// Executions of one call attempt that may die without an answer (each
    /// took the claim, then the worker crashed or could not store the
    /// result); the next delivery answers instead of running the call again
    /// (decision 0004). Hand-backs without a claim never count. Default: 5.
    pub max_deliveries: i64,
    /// Lease of a call's claim in Redis; renewed while the call runs, so it only
    /// expires when the worker died. Default: 15s.
    #[serde(with = "toolfleet_service::config::duration")]
    pub claim_lease: Duration,
    /// How long results are kept for deduplication. Default: 24h.
    #[serde(with = "toolfleet_service::config::duration")]
    pub result_retention: Duration,
    /// How long calls wait in the stream for a worker before they are
    /// dropped, if this worker creates the stream. Default: 24h.
    #[serde(with = "toolfleet_service::config::duration")]
    pub call_max_age: Duration,
    /// Per-tool timeout overrides, e.g. `{ sleep = "500ms" }`; the announced
    /// manifest carries the override. Default: none (each tool's own).
    pub tool_timeouts: BTreeMap<String, duration::Value>,
    /// Per-tool overrides of what a tool's calls may do, e.g. `{ fetch_page
    /// = "read_only" }` (`read_only`, `idempotent` or `not_idempotent`,
    /// decision 0037); the announced manifest carries the override.
    /// Default: none (each tool's own).
    pub tool_effects: BTreeMap<String, Effects>,
    /// Per-tool overrides of the size of `data` (as JSON, in bytes) above
    /// which the orchestrator shapes a tool's results, e.g. `{ fetch_page
    /// = 65536 }`, from 1024 to 16777216 (docs/protection.md); the
    /// announced manifest carries the override. Default: none (the
    /// orchestrator's `results.shape_above_bytes`).
    #[serde(deserialize_with = "shape_above_bytes")]
    pub tool_shape_above_bytes: BTreeMap<String, u64>,
    /// Per-tool cache TTLs, e.g. `{ get_current_weather = "10m" }`: how
    /// long a successful result of the tool may answer another job's call
    /// with the same arguments, without running it (the result cache,
    /// docs/protection.md), from 1s to 7 days, for `read_only` tools only
    /// (a worker that would announce another with one refuses to start);
    /// the announced manifest carries it. Default: none (each tool's own;
    /// none of the built-in tools caches).
    #[serde(deserialize_with = "cache_ttls")]
    pub tool_cache_ttl: BTreeMap<String, duration::Value>,
    /// Per-tool costs, e.g. `{ search_web = 5 }`: what one attempt of a
    /// call of the tool costs in the cost units of budgets
    /// (docs/protection.md, "Budgets"), from 0 to 1000000; the announced
    /// manifest carries it. Default: none (each tool's own; 1 when its
    /// manifest says none).
    #[serde(deserialize_with = "costs")]
    pub tool_cost: BTreeMap<String, u64>,
    /// Per-tool circuit breaker settings over each tool's own, e.g.
    /// `[runtime.tool_breaker.fetch_page]` `min_calls = 5`,
    /// `cool_down_ms = 60000` (`enabled`, `window_ms`, `min_calls`,
    /// `failure_ratio`, `cool_down_ms`; docs/protection.md), each within the
    /// orchestrator's bounds; the announced manifest carries them. Default:
    /// none (each tool's own, else the orchestrator's `[breaker]`).
    #[serde(deserialize_with = "breakers")]
    pub tool_breaker: BTreeMap<String, BreakerOverride>,
    /// Largest accepted arguments text, in bytes. Default: 262144 (256 KiB).
    pub max_argument_bytes: usize,
    /// Largest tool output (`data` JSON), in bytes; a larger one becomes a
    /// `PAYLOAD_TOO_LARGE` envelope. Default: 1048576 (1 MiB).
    pub max_output_bytes: usize,
}

impl RuntimeOptions {
    /// `manifest` with this configuration's overrides of its timeout and
    /// effects.
    #[must_use]
    pub fn configured(&self, mut manifest: ToolManifest) -> ToolManifest {
        if let Some(timeout) = self.tool_timeouts.get(&manifest.name) {
            manifest = manifest.with_timeout(timeout.0);
        }
        if let Some(effects) = self.tool_effects.get(&manifest.name) {
            manifest.effects = *effects;
        }
        if let Some(bytes) = self.tool_shape_above_bytes.get(&manifest.name) {
            manifest.shape_above_bytes = Some(*bytes);
        }
        if let Some(ttl) = self.tool_cache_ttl.get(&manifest.name) {
            manifest = manifest.with_cache_ttl(ttl.0);
        }
        if let Some(cost) = self.tool_cost.get(&manifest.name) {
            manifest = manifest.with_cost(*cost);
        }
        if let Some(breaker) = self.tool_breaker.get(&manifest.name) {
            manifest = manifest.with_breaker(*breaker);
        }
        manifest
    }
}

/// `runtime.tool_shape_above_bytes`: each tool's within the bounds of
/// [`check_shape_above_bytes`](toolfleet_proto::manifest::check_shape_above_bytes).
fn shape_above_bytes<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, u64>, D::Error> {
    use serde::de::Error;
    let limits = BTreeMap::<String, u64>::deserialize(d)?;
    for (tool, bytes) in &limits {
        toolfleet_proto::manifest::check_shape_above_bytes(*bytes)
            .map_err(|why| D::Error::custom(format!("{tool}: {why}")))?;
    }
    Ok(limits)
}

/// `runtime.tool_cost`: each tool's within the bounds of
/// [`check_tool_cost`](toolfleet_proto::manifest::check_tool_cost).
fn costs<'de, D: serde::Deserializer<'de>>(d: D) -> Result<BTreeMap<String, u64>, D::Error> {
    use serde::de::Error;
    let costs = BTreeMap::<String, u64>::deserialize(d)?;
    for (tool, cost) in &costs {
        toolfleet_proto::manifest::check_tool_cost(*cost)
            .map_err(|why| D::Error::custom(format!("{tool}: {why}")))?;
    }
    Ok(costs)
}
/// `runtime.tool_breaker`: each tool's within the bounds of
/// [`BreakerOverride::check`].
fn breakers<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, BreakerOverride>, D::Error> {
    use serde::de::Error;
    let breakers = BTreeMap::<String, BreakerOverride>::deserialize(d)?;
    for (tool, breaker) in &breakers {
        breaker
            .check()
            .map_err(|why| D::Error::custom(format!("{tool}: {why}")))?;
    }
    Ok(breakers)
}

/// `runtime.tool_cache_ttl`: each tool's within the bounds of
/// [`check_cache_ttl_ms`](toolfleet_proto::manifest::check_cache_ttl_ms)
/// (whether the tool is read-only is checked when it is loaded, with its
/// effects as configured).
fn cache_ttls<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, duration::Value>, D::Error> {
    use serde::de::Error;
    use toolfleet_proto::manifest::{MAX_CACHE_TTL_MS, MIN_CACHE_TTL_MS};
    let ttls = BTreeMap::<String, duration::Value>::deserialize(d)?;
    for (tool, ttl) in &ttls {
        let ms = ttl.0.as_millis();
        if ms < u128::from(MIN_CACHE_TTL_MS) || ms > u128::from(MAX_CACHE_TTL_MS) {
            return Err(D::Error::custom(format!(
                "{tool}: {} is not between 1s and 7 days",
                duration::format(ttl.0)
            )));
        }
    }
    Ok(ttls)
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        Self {
            max_in_flight: NonZeroUsize::new(16).expect("16 is not zero"),
            drain_timeout: Duration::from_secs(25),
            ack_wait: queue::DEFAULT_CALL_ACK_WAIT,
            max_deliveries: 5,
            claim_lease: Duration::from_secs(15),
            result_retention: Duration::from_secs(24 * 3600),
            call_max_age: queue::DEFAULT_CALL_MAX_AGE,
            tool_timeouts: BTreeMap::new(),
            tool_effects: BTreeMap::new(),
            tool_shape_above_bytes: BTreeMap::new(),
            tool_cache_ttl: BTreeMap::new(),
            tool_cost: BTreeMap::new(),
            tool_breaker: BTreeMap::new(),
            max_argument_bytes: 256 * 1024,
            max_output_bytes: 1024 * 1024,
        }
    }
}

/// How a worker announces its tools in the registry.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RegistryOptions {
    /// How often the announcements are refreshed. Default: 5s.
    #[serde(with = "toolfleet_service::config::duration")]
    pub heartbeat_interval: Duration,
    /// How long an announcement lives without a refresh (the KV bucket's max
    /// age; all workers must agree on it). Default: 15s.
    #[serde(with = "toolfleet_service::config::duration")]
    pub ttl: Duration,
}

impl Default for RegistryOptions {
    fn default() -> Self {
        Self {
            heartbeat_interval: Duration::from_secs(5),
            ttl: Duration::from_secs(15),
        }
    }
}

/// Top-level keys that `TOOLFLEET_*` variables may set. Other `TOOLFLEET_*`
/// variables (the orchestrator's, the test harness's) are ignored.
const ENV_KEYS: &[&str] = &[
    "threads",
    "worker_id",
    "pool",
    "nats",
    "redis",
    "runtime",
    "registry",
    "tools",
    "test_tools",
    "weather",
    "kg",
    "mcp",
    "metrics",
    "telemetry",
    "log",
];

impl WorkerOptions {
    /// The built-in tools these options select.
    pub fn tool_selection(&self) -> crate::tools::Selection<'_> {
        crate::tools::Selection {
            names: &self.tools,
            mcp: &self.mcp,
            test_tools: self.test_tools,
            weather: &self.weather,
            kg: &self.kg,
        }
    }

    /// Loads defaults, then the TOML file at `path` (if any), then the
    /// `TOOLFLEET_*` environment, then `overrides` (the command-line flags,
    /// as a partial document).
    ///
    /// # Errors
    ///
    /// A file that cannot be read or parsed, or a value of the wrong type; the
    /// error names the key and where it came from.
    pub fn load(path: Option<&Path>, overrides: serde_json::Value) -> Result<Self, ConfigError> {
        let mut options: Self = load_layered(path, overrides, ENV_KEYS)?;
        options.config_file = path.map(Path::to_owned);
        // Resolved once, so that `--print-config` shows the id in use.
        options.worker_id = options.resolved_worker_id();
        Ok(options)
    }

    /// What its MCP servers get of it: the bound of their calls' answers
    /// (`runtime.max_output_bytes`), and the sandbox of its stdio servers.
    pub fn mcp_host(&self) -> McpHost {
        McpHost {
            sandbox: self.mcp_sandbox(),
            max_output_bytes: self.runtime.max_output_bytes,
        }
    }

    /// The sandbox of its stdio MCP servers (`mcp.sandbox`), which keeps
    /// them from its own files: its configuration file, and every file its
    /// credentials and its MCP servers' secrets are read from.
    fn mcp_sandbox(&self) -> Sandbox {
        let credentials = [
            &self.nats.credentials_file,
            &self.nats.nkey_seed_file,
            &self.nats.tls.key_file,
            &self.redis.password_file,
            &self.redis.tls.key_file,
        ];
        let secrets = self
            .mcp
            .servers
            .iter()
            .flat_map(|server| server.secret_files());
        let own = (self.config_file.iter().cloned())
            .chain(credentials.into_iter().flatten().map(PathBuf::from))
            .chain(secrets.map(Path::to_owned));
        Sandbox::new(self.mcp.sandbox, own)
    }

    /// The checks of this worker's own keys ([`ServiceOptions::check`]):
    /// its pool's name, the MCP servers' settings, the tools it is to serve exist in this
    /// build or its MCP servers, and the graph file, if one is named, can
    /// be read. The graph's content is read before the
    /// worker connects.
    ///
    /// [`ServiceOptions::check`]: toolfleet_service::binary::ServiceOptions::check
    ///
    /// # Errors
    ///
    /// What is wrong, naming the key.
    pub fn check_own(&self) -> Result<(), String> {
        if !self.pool.is_empty() && !toolfleet_proto::manifest::is_valid_pool_name(&self.pool) {
            return Err(format!(
                "pool {:?}: 1 to {} letters, digits, `_`, `-` or `.`",
                self.pool,
                toolfleet_proto::manifest::MAX_POOL_NAME_LEN
            ));
        }
        self.mcp.fleet_names()?;
        match &self.toolbox {
            None => {
                crate::tools::check_names(&self.tool_selection()).map_err(|err| err.to_string())?
            }
            Some(served) => {
                let mcp = self.mcp.fleet_names()?;
                let unknown = self
                    .tools
                    .iter()
                    .find(|name| !served.contains(name) && !mcp.contains_key(*name));
                if let Some(unknown) = unknown {
                    return Err(format!(
                        "unknown tool {unknown:?} in `tools`; this worker serves: {}",
                        served.join(", ")
                    ));
                }
            }
        }
        if let Some(path) = &self.kg.graph_path {
            std::fs::metadata(path)
                .map_err(|err| format!("kg.graph_path {}: {err}", path.display()))?;
        }
        Ok(())
    }

    /// The names of the tools this configuration serves, sorted, without
    /// building or connecting anything: the worker's own tools that `tools`
    /// selects, and the MCP tools (by their fleet names) that it selects
    /// and that are not one of the worker's own. What the setup step
    /// (`setup.tools`) and a pool's NATS and Redis users must cover.
    pub fn served_tools(&self) -> Vec<String> {
        let own: Vec<String> = match &self.toolbox {
            Some(names) => names.clone(),
            None => {
                let test = crate::tools::TEST_TOOL_NAMES
                    .iter()
                    .filter(|_| self.test_tools);
                crate::tools::BUILTIN_NAMES
                    .iter()
                    .chain(test)
                    .map(|&n| n.to_owned())
                    .collect()
            }
        };
        let selected = |name: &String| self.tools.is_empty() || self.tools.contains(name);
        let mcp = self.mcp.fleet_names().unwrap_or_default().into_keys();
        let mut served: Vec<String> = own.iter().filter(|n| selected(n)).cloned().collect();
        served.extend(mcp.filter(|n| selected(n) && !own.contains(n)));
        served.sort();
        served.dedup();
        served
    }

    /// The options of a worker of your own that serves `toolbox` instead of
    /// the built-in tools: `tools` then selects among its tools, and
    /// [`check_own`](Self::check_own) refuses a name it does not have.
    #[must_use]
    pub fn serving(mut self, toolbox: &crate::Toolbox) -> Self {
        let names = toolbox.manifests().into_iter().map(|m| m.name);
        self.toolbox = Some(names.collect());
        self
    }

    /// This worker's id: the configured one, or `<hostname>-<pid>-<random>`.
    pub fn resolved_worker_id(&self) -> String {
        toolfleet_service::identity::replica_id(&self.worker_id)
    }
}

// URL passwords are hidden when the options are printed or logged.
toolfleet_service::service_options!(WorkerOptions, runtime.drain_timeout);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn configuration_overrides_a_tools_timeout_effects_shaping_limit_cache_and_cost() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("worker.toml");
        std::fs::write(
            &file,
            "[runtime.tool_timeouts]\necho = \"2s\"\n[runtime.tool_effects]\necho = \"idempotent\"\n\
             [runtime.tool_shape_above_bytes]\necho = 4096\n[runtime.tool_cache_ttl]\necho = \"90s\"\n\
             [runtime.tool_cost]\necho = 7\n[runtime.tool_breaker.echo]\nmin_calls = 5\n",
        )
        .unwrap();
        let options = WorkerOptions::load(Some(&file), json!({})).unwrap();
        let echo = ToolManifest::new("echo", "d", json!({})).with_effects(Effects::ReadOnly);
        let configured = options.runtime.configured(echo.clone());
        assert_eq!(configured.effects, Effects::Idempotent);
        assert_eq!(configured.timeout_ms, 2_000);
        assert_eq!(configured.shape_above_bytes, Some(4096));
        assert_eq!(configured.cache_ttl_ms, Some(90_000));
        assert_eq!(configured.cost_units(), 7);
        let breaker = configured.breaker.expect("the tool's breaker");
        assert_eq!((breaker.min_calls, breaker.window_ms), (Some(5), None));
        let other = options.runtime.configured(ToolManifest {
            name: "other".into(),
            ..echo
        });
        assert_eq!(other.effects, Effects::ReadOnly, "only the tool named");
        assert_eq!(other.cost_units(), 1, "a manifest without a cost costs 1");
        std::fs::write(&file, "[runtime.tool_effects]\necho = \"destructive\"\n").unwrap();
        let refused = WorkerOptions::load(Some(&file), json!({})).unwrap_err();
        assert!(refused.to_string().contains("tool_effects"), "{refused}");
        for (bytes, why) in [("0", "echo: 0 is below"), ("99999999", "above"), ("-5", "")] {
            let text = format!("[runtime.tool_shape_above_bytes]\necho = {bytes}\n");
            std::fs::write(&file, text).unwrap();
            let refused = WorkerOptions::load(Some(&file), json!({})).unwrap_err();
            let refused = refused.to_string();
            assert!(refused.contains("tool_shape_above_bytes"), "{refused}");
            assert!(refused.contains(why), "{refused}");
        }
        for (ttl, why) in [
            ("\"999ms\"", "echo: 999ms is not between"),
            ("\"8d\"", "echo: 192h is not between"),
        ] {
            let text = format!("[runtime.tool_cache_ttl]\necho = {ttl}\n");
            std::fs::write(&file, text).unwrap();
            let refused = WorkerOptions::load(Some(&file), json!({})).unwrap_err();
            let refused = refused.to_string();
            assert!(refused.contains("tool_cache_ttl"), "{refused}");
            assert!(refused.contains(why), "{refused}");
        }
        for (cost, why) in [("1000001", "echo: 1000001 is above"), ("-1", "")] {
            std::fs::write(&file, format!("[runtime.tool_cost]\necho = {cost}\n")).unwrap();
            let refused = WorkerOptions::load(Some(&file), json!({})).unwrap_err();
            let refused = refused.to_string();
            assert!(refused.contains("tool_cost"), "{refused}");
            assert!(refused.contains(why), "{refused}");
        }
        for (breaker, why) in [
            (
                "failure_ratio = 0.0",
                "echo: failure_ratio: 0 is not above 0",
            ),
            ("cool_down_ms = 0", "echo: cool_down_ms: 0 ms"),
            ("open = true", "unknown field"),
        ] {
            let text = format!("[runtime.tool_breaker.echo]\n{breaker}\n");
            std::fs::write(&file, text).unwrap();
            let refused = WorkerOptions::load(Some(&file), json!({})).unwrap_err();
            let refused = refused.to_string();
            assert!(refused.contains("tool_breaker"), "{refused}");
            assert!(refused.contains(why), "{refused}");
        }
    }

    #[test]
    fn layers_override_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("worker.toml");
        std::fs::write(
            &file,
            "test_tools = true\n[runtime]\nmax_in_flight = 4\ndrain_timeout = \"3s\"\n[nats]\nurl = \"nats://file:4222\"\n",
        )
        .unwrap();
        let options =
            WorkerOptions::load(Some(&file), json!({"nats": {"url": "nats://flag:4222"}})).unwrap();
        assert_eq!(options.runtime.max_in_flight.get(), 4);
        assert_eq!(options.runtime.drain_timeout, Duration::from_secs(3));
        assert_eq!(options.nats.url, "nats://flag:4222");
        assert!(options.test_tools);
        assert_eq!(options.redis.key_prefix, "tf");
    }

    #[test]
    fn the_worker_id_is_resolved_once_at_load() {
        let options = WorkerOptions::load(None, json!({})).unwrap();
        assert!(!options.worker_id.is_empty());
        assert_eq!(
            options.resolved_worker_id(),
            options.worker_id,
            "stable once resolved"
        );
        let named = WorkerOptions::load(None, json!({"worker_id": "w-7"})).unwrap();
        assert_eq!(named.worker_id, "w-7");
        let printed = serde_json::to_value(&named).unwrap();
        assert_eq!(printed["runtime"]["result_retention"], "24h");
        assert_eq!(printed["registry"]["heartbeat_interval"], "5s");
    }

    #[test]
    fn a_bad_value_names_its_key() {
        let err = WorkerOptions::load(None, json!({"runtime": {"max_in_flight": 0}})).unwrap_err();
        assert!(err.to_string().contains("max_in_flight"), "{err}");
        let err = WorkerOptions::load(None, json!({"runtime": {"bogus": 1}})).unwrap_err();
        assert!(err.to_string().contains("bogus"), "{err}");
        // The pool is shown to people: only a name passes the check.
        let pool = |name: &str| WorkerOptions::load(None, json!({"pool": name})).unwrap();
        assert_eq!(pool("general").check_own(), Ok(()));
        assert_eq!(pool("").check_own(), Ok(()));
        let err = pool("<b>general</b>").check_own().unwrap_err();
        assert!(err.starts_with("pool "), "{err}");
    }
}
