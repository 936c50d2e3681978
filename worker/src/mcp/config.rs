//! The `mcp` keys of a worker's configuration: the MCP servers whose tools
//! it serves, each checked before the worker connects (docs/tools/mcp.md).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use toolfleet_proto::manifest::{MAX_MCP_SERVER_NAME_LEN, is_valid_mcp_server_name};
use toolfleet_proto::{Approval, Effects};

use super::names::fleet_name;
use super::sandbox::SandboxMode;

/// MCP servers whose tools this worker serves (decision 0038).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct McpOptions {
    /// The servers, `[[mcp.servers]]` in TOML. Default: none.
    pub servers: Vec<McpServerOptions>,
    /// Whether stdio servers run in a sandbox that keeps them from the
    /// worker's files: `auto` (where the kernel has Landlock), `required`
    /// or `off`. Default: `auto`.
    pub sandbox: SandboxMode,
}

/// One MCP server and the tools of it this worker serves.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerOptions {
    /// Its name in logs, metrics and the default prefix: 1 to 32 ASCII
    /// letters, digits, `_` or `-`.
    pub name: String,
    /// The program to start, for a server over stdio (exclusive with
    /// `url`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// Its arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Environment variables of the program, beside the worker's own:
    /// each a text, or `{ env = "NAME" }` (the worker's variable) or
    /// `{ file = "/path" }` (a file's content) for a secret.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, EnvValue>,
    /// The program's working directory. Default: the worker's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<PathBuf>,
    /// The endpoint of a server over Streamable HTTP, `http://` or
    /// `https://` (exclusive with `command`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Headers sent to `url`, each from `{ env = "NAME" }` or `{ file =
    /// "/path" }`: never a value in clear in the file.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, Secret>,
    /// The server's tools to serve, by the names the server gives them.
    /// Required: each needs its queue and permissions before it is served.
    pub tools: Vec<String>,
    /// What the fleet names of its tools begin with. Default:
    /// `<name>__`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// Calls sent to the server at once. Default: 8.
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
    /// How long one call may run (the tools' manifest timeout). Default:
    /// 30s.
    #[serde(
        with = "toolfleet_service::config::duration",
        default = "default_call_timeout"
    )]
    pub call_timeout: Duration,
    /// How long starting or reaching the server and its handshake may
    /// take. Default: 10s.
    #[serde(
        with = "toolfleet_service::config::duration",
        default = "default_connect_timeout"
    )]
    pub connect_timeout: Duration,
    /// How often a Streamable HTTP server that answered is asked `ping`
    /// while it is up: a failed ping takes its tools down at once, as a
    /// stdio server's exit does. Default: 5s.
    #[serde(
        with = "toolfleet_service::config::duration",
        default = "default_probe_interval"
    )]
    pub probe_interval: Duration,
    /// How the connection starts: `auto` (the default) asks the server
    /// for the stateless 2026-07-28 protocol (`server/discover`) and falls
    /// back to the `initialize` handshake; `initialize` makes the
    /// handshake at once; `discover` insists on 2026-07-28.
    #[serde(default)]
    pub lifecycle: Lifecycle,
    /// What a tool's calls may do, by its MCP name, over the server's
    /// annotations (hints): `read_only`, `idempotent` or `not_idempotent`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub effects: BTreeMap<String, Effects>,
    /// How long a successful result of a tool may answer another job's
    /// call with the same arguments, by its MCP name, e.g. `{ "get.forecast"
    /// = "10m" }` (the result cache, docs/protection.md): from 1s to 7
    /// days, for a tool whose calls are `read_only` (by `effects`, else its
    /// `readOnlyHint`); a tool the server says is not is served uncached,
    /// with a warning.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub cache_ttl: BTreeMap<String, toolfleet_service::config::duration::Value>,
    /// When the server's tools need a person's approval: `never` (the
    /// default), `always`, `when_side_effects`, or `when_destructive` (a
    /// tool whose `destructiveHint` is not false, unless it is read-only).
    #[serde(default)]
    pub approval: McpApproval,
    /// Most pages of one `tools/list`; a server that pages on is down.
    /// Default: 100.
    #[serde(default = "default_max_listed_pages")]
    pub max_listed_pages: usize,
    /// Most tools of one `tools/list`, over all its pages (the server's,
    /// not only those in `tools`). Default: 10000.
    #[serde(default = "default_max_listed_tools")]
    pub max_listed_tools: usize,
    /// Most bytes of one `tools/list` (its tools' descriptions as JSON),
    /// over all its pages. Default: 16777216 (16 MiB).
    #[serde(default = "default_max_listed_bytes")]
    pub max_listed_bytes: usize,
}

/// A value from the worker's environment or a file, never from the
/// configuration itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Secret {
    /// The worker's environment variable of this name.
    Env(String),
    /// The content of this file (a mounted Secret), without a trailing
    /// newline.
    File(PathBuf),
}

impl Secret {
    /// Its value, read now.
    ///
    /// # Errors
    ///
    /// What is missing, naming the variable or file (never the value).
    pub fn read(&self) -> Result<String, String> {
        match self {
            Self::Env(name) => std::env::var(name)
                .map_err(|_| format!("the environment variable {name} is not set")),
            Self::File(path) => std::fs::read_to_string(path)
                .map(|text| text.trim_end_matches(['\n', '\r']).to_owned())
                .map_err(|err| format!("cannot read {}: {err}", path.display())),
        }
    }
}

impl<'de> Deserialize<'de> for Secret {
    /// Refuses a value in clear without repeating it: the error may be
    /// logged.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "snake_case")]
        enum Source {
            Env(String),
            File(PathBuf),
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Wire {
            Source(Source),
            Other(serde::de::IgnoredAny),
        }
        match Wire::deserialize(deserializer)? {
            Wire::Source(Source::Env(name)) => Ok(Self::Env(name)),
            Wire::Source(Source::File(path)) => Ok(Self::File(path)),
            Wire::Other(_) => Err(serde::de::Error::custom(
                "a secret is read from { env = \"NAME\" } or { file = \"/path\" }, never written in clear",
            )),
        }
    }
}

/// A stdio server's environment variable: a text, or a [`Secret`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EnvValue {
    /// The text itself.
    Text(String),
    /// From the worker's environment or a file.
    From(Secret),
}

impl EnvValue {
    /// Its value, read now.
    ///
    /// # Errors
    ///
    /// As [`Secret::read`].
    pub fn read(&self) -> Result<String, String> {
        match self {
            Self::Text(text) => Ok(text.clone()),
            Self::From(secret) => secret.read(),
        }
    }
}

/// How a connection to an MCP server starts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Lifecycle {
    /// `server/discover` for 2026-07-28, else the `initialize` handshake.
    /// A server that does not answer the discovery at all is given 10 s
    /// (rmcp's wait) before the handshake is tried.
    #[default]
    Auto,
    /// The `initialize` handshake, offering 2025-11-25.
    Initialize,
    /// `server/discover` only: a server without 2026-07-28 is not served.
    Discover,
}

/// When an MCP server's tools need a person's approval.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum McpApproval {
    /// Not by this worker's word (a tenant or job may still ask).
    #[default]
    Never,
    /// Every call.
    Always,
    /// Every call of a tool whose effects are not `read_only`.
    WhenSideEffects,
    /// Every call of a tool the server calls destructive
    /// (`destructiveHint`, true unless said otherwise) and not read-only.
    WhenDestructive,
}

impl McpApproval {
    /// The manifest's approval for a tool with `effects` that the server
    /// calls destructive or not.
    pub fn for_tool(self, effects: Effects, destructive: bool) -> Approval {
        match self {
            Self::Never => Approval::Never,
            Self::Always => Approval::Always,
            Self::WhenSideEffects => Approval::WhenSideEffects,
            Self::WhenDestructive if destructive && effects.changes_things() => Approval::Always,
            Self::WhenDestructive => Approval::Never,
        }
    }
}

fn default_concurrency() -> usize {
    8
}

fn default_call_timeout() -> Duration {
    Duration::from_secs(30)
}

fn default_connect_timeout() -> Duration {
    Duration::from_secs(10)
}

fn default_probe_interval() -> Duration {
    Duration::from_secs(5)
}

fn default_max_listed_pages() -> usize {
    100
}

fn default_max_listed_tools() -> usize {
    10_000
}

/// How much of one `tools/list` the worker reads: pages, tools and bytes
/// (each tool's description as JSON), over all its pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Bounds {
    /// `max_listed_pages`.
    pub(super) pages: usize,
    /// `max_listed_tools`.
    pub(super) tools: usize,
    /// `max_listed_bytes`.
    pub(super) bytes: usize,
}

fn default_max_listed_bytes() -> usize {
    16 * 1024 * 1024
}

/// The shortest `probe_interval`: a ping a tenth of a second is already
/// more than a server needs to be known alive.
const MIN_PROBE_INTERVAL: Duration = Duration::from_millis(100);

impl McpServerOptions {
    /// What its tools' fleet names begin with.
    pub fn prefix(&self) -> String {
        self.prefix
            .clone()
            .unwrap_or_else(|| format!("{}__", self.name))
    }

    /// How much of one `tools/list` the worker reads.
    pub(super) fn listing_bounds(&self) -> Bounds {
        Bounds {
            pages: self.max_listed_pages,
            tools: self.max_listed_tools,
            bytes: self.max_listed_bytes,
        }
    }

    /// Its allow-listed tools: MCP name -> fleet name.
    ///
    /// # Errors
    ///
    /// A tool whose name cannot be mapped, naming it.
    pub fn fleet_names(&self) -> Result<BTreeMap<String, String>, String> {
        let prefix = self.prefix();
        let mut names = BTreeMap::new();
        for tool in &self.tools {
            let fleet = fleet_name(&prefix, tool).ok_or_else(|| {
                format!(
                    "mcp server {}: tool {tool:?} cannot be given a fleet name under the \
                     prefix {prefix:?} (empty, or the prefix leaves no room)",
                    self.name
                )
            })?;
            names.insert(tool.clone(), fleet);
        }
        Ok(names)
    }

    /// Whether the server's settings can be served.
    fn check(&self) -> Result<(), String> {
        let server = &self.name;
        // The registry's rule: the name is announced with each of its tools.
        if !is_valid_mcp_server_name(&self.name) {
            return Err(format!(
                "mcp server name {:?}: 1 to {MAX_MCP_SERVER_NAME_LEN} letters, digits, `_` or `-`",
                self.name
            ));
        }
        match (&self.command, &self.url) {
            (Some(_), None) => {}
            (None, Some(url)) => {
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(format!(
                        "mcp server {server}: url must be http:// or https://"
                    ));
                }
            }
            _ => {
                return Err(format!(
                    "mcp server {server}: give `command` (stdio) or `url` (Streamable HTTP), one of them"
                ));
            }
        }
        let valid = |name: &str| {
            name.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        };
        if let Some(prefix) = &self.prefix
            && !valid(prefix)
        {
            return Err(format!(
                "mcp server {server}: prefix {prefix:?} may hold only letters, digits, `_` or `-`"
            ));
        }
        if self.tools.is_empty() {
            return Err(format!(
                "mcp server {server}: `tools` is empty; list the server's tools to serve"
            ));
        }
        if self.concurrency == 0 {
            return Err(format!(
                "mcp server {server}: concurrency must be at least 1"
            ));
        }
        if self.probe_interval < MIN_PROBE_INTERVAL {
            return Err(format!(
                "mcp server {server}: probe_interval must be at least {}",
                humantime::format_duration(MIN_PROBE_INTERVAL)
            ));
        }
        let bounds = self.listing_bounds();
        if bounds.pages == 0 || bounds.tools == 0 || bounds.bytes == 0 {
            return Err(format!(
                "mcp server {server}: max_listed_pages, max_listed_tools and max_listed_bytes \
                 must be at least 1"
            ));
        }
        if let Some(unknown) = self.effects.keys().find(|tool| !self.tools.contains(tool)) {
            return Err(format!(
                "mcp server {server}: effects names {unknown:?}, which is not in `tools`"
            ));
        }
        self.check_cache_ttls()?;
        for header in self.headers.keys() {
            if reqwest::header::HeaderName::from_bytes(header.as_bytes()).is_err() {
                return Err(format!(
                    "mcp server {server}: {header:?} is not a header name"
                ));
            }
        }
        self.check_secrets()
    }

    /// Each `cache_ttl` names a tool of `tools`, within the bounds of a
    /// cache TTL, whose configured `effects` (if any) are `read_only`.
    fn check_cache_ttls(&self) -> Result<(), String> {
        use toolfleet_proto::manifest::{MAX_CACHE_TTL_MS, MIN_CACHE_TTL_MS};
        let server = &self.name;
        for (tool, ttl) in &self.cache_ttl {
            if !self.tools.contains(tool) {
                return Err(format!(
                    "mcp server {server}: cache_ttl names {tool:?}, which is not in `tools`"
                ));
            }
            let ms = ttl.0.as_millis();
            if ms < u128::from(MIN_CACHE_TTL_MS) || ms > u128::from(MAX_CACHE_TTL_MS) {
                return Err(format!(
                    "mcp server {server}: cache_ttl of {tool:?}: {} is not between 1s and 7 days",
                    humantime::format_duration(ttl.0)
                ));
            }
            if let Some(effects) = self.effects.get(tool).filter(|e| **e != Effects::ReadOnly) {
                return Err(format!(
                    "mcp server {server}: cache_ttl of {tool:?}: only a read_only tool's \
                     results may be cached; its effects are {effects}"
                ));
            }
        }
        Ok(())
    }

    /// The files its secrets are read from.
    pub fn secret_files(&self) -> impl Iterator<Item = &Path> {
        let env = self.env.values().filter_map(|value| match value {
            EnvValue::From(secret) => Some(secret),
            EnvValue::Text(_) => None,
        });
        self.headers
            .values()
            .chain(env)
            .filter_map(|secret| match secret {
                Secret::File(path) => Some(path.as_path()),
                Secret::Env(_) => None,
            })
    }

    /// Whether every secret can be read now: a missing variable or file
    /// stops the worker at start rather than at each connection. The
    /// error names the variable or file, never a value.
    fn check_secrets(&self) -> Result<(), String> {
        let server = &self.name;
        for (name, secret) in &self.headers {
            secret
                .read()
                .map_err(|why| format!("mcp server {server}: header {name}: {why}"))?;
        }
        for (name, value) in &self.env {
            value
                .read()
                .map_err(|why| format!("mcp server {server}: env {name}: {why}"))?;
        }
        Ok(())
    }
}

impl McpOptions {
    /// Every server's tools: fleet name -> (server index, MCP name).
    ///
    /// # Errors
    ///
    /// A server whose settings cannot be served, or two tools with one
    /// fleet name, naming them.
    pub fn fleet_names(&self) -> Result<HashMap<String, (usize, String)>, String> {
        let mut all: HashMap<String, (usize, String)> = HashMap::new();
        let mut servers = std::collections::HashSet::new();
        for (index, server) in self.servers.iter().enumerate() {
            server.check()?;
            if !servers.insert(server.name.as_str()) {
                return Err(format!("mcp server {} is configured twice", server.name));
            }
            for (tool, fleet) in server.fleet_names()? {
                if let Some((other, other_tool)) = all.get(&fleet) {
                    return Err(format!(
                        "mcp server {}: tool {tool:?} and tool {other_tool:?} of server {} \
                         both map to {fleet:?}; give one server another prefix",
                        server.name, self.servers[*other].name
                    ));
                }
                all.insert(fleet, (index, tool));
            }
        }
        Ok(all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Read as the worker reads its configuration file.
    fn server(toml_text: &str) -> Result<McpOptions, String> {
        use figment::providers::{Format, Toml};
        let options: McpOptions = figment::Figment::from(Toml::string(toml_text))
            .extract()
            .map_err(|e| e.to_string())?;
        options.fleet_names().map(|_| options)
    }

    #[test]
    fn the_lifecycle_is_one_of_three() {
        let text = |lifecycle: &str| {
            format!(
                "[[servers]]\nname = \"s\"\ncommand = \"s\"\ntools = [\"t\"]\nlifecycle = {lifecycle:?}\n"
            )
        };
        let discover = server(&text("discover")).unwrap();
        assert_eq!(discover.servers[0].lifecycle, Lifecycle::Discover);
        let initialize = server(&text("initialize")).unwrap();
        assert_eq!(initialize.servers[0].lifecycle, Lifecycle::Initialize);
        let wrong = server(&text("2026-07-28")).unwrap_err();
        assert!(wrong.contains("auto"), "{wrong}");
    }

    #[test]
    fn a_server_is_stdio_or_http_with_secrets_never_in_clear() {
        let stdio = server(
            r#"[[servers]]
name = "weather"
command = "python"
args = ["-m", "weather"]
env = { LOG_LEVEL = "debug", API_KEY = { env = "PATH" } }
tools = ["get.forecast"]
effects = { "get.forecast" = "read_only" }
"#,
        )
        .unwrap();
        let weather = &stdio.servers[0];
        assert_eq!(weather.env["LOG_LEVEL"], EnvValue::Text("debug".into()));
        assert_eq!(
            weather.env["API_KEY"],
            EnvValue::From(Secret::Env("PATH".into()))
        );
        assert_eq!(
            stdio.fleet_names().unwrap()["weather__get_forecast"],
            (0, "get.forecast".into())
        );
        assert_eq!(weather.call_timeout, Duration::from_secs(30));
        assert_eq!(weather.lifecycle, Lifecycle::Auto);

        let clear = server(
            r#"[[servers]]
name = "crm"
url = "https://crm.example/mcp"
headers = { Authorization = "Bearer s3cret" }
tools = ["find"]
"#,
        )
        .unwrap_err();
        assert!(clear.contains("never written in clear"), "{clear}");
        assert!(!clear.contains("s3cret"), "{clear}");
        let missing = server(
            r#"[[servers]]
name = "crm"
url = "https://crm.example/mcp"
headers = { Authorization = { file = "/nonexistent/token" } }
tools = ["find"]
"#,
        )
        .unwrap_err();
        assert!(
            missing.contains("header Authorization: cannot read /nonexistent/token"),
            "{missing}"
        );
        for (bad, says) in [
            ("name = \"crm\"\ntools = [\"a\"]", "one of them"),
            (
                "name = \"crm\"\ncommand = \"x\"\nurl = \"http://a\"\ntools = [\"a\"]",
                "one of them",
            ),
            (
                "name = \"crm\"\nurl = \"ftp://a\"\ntools = [\"a\"]",
                "http://",
            ),
            (
                "name = \"crm\"\ncommand = \"x\"\ntools = []",
                "`tools` is empty",
            ),
            (
                "name = \"c.r.m\"\ncommand = \"x\"\ntools = [\"a\"]",
                "mcp server name",
            ),
            (
                "name = \"crm\"\ncommand = \"x\"\ntools = [\"a\"]\neffects = { b = \"read_only\" }",
                "not in `tools`",
            ),
            (
                "name = \"crm\"\ncommand = \"x\"\ntools = [\"a\"]\ncache_ttl = { b = \"1m\" }",
                "cache_ttl names \"b\", which is not in `tools`",
            ),
            (
                "name = \"crm\"\ncommand = \"x\"\ntools = [\"a\"]\ncache_ttl = { a = \"10ms\" }",
                "cache_ttl of \"a\": 10ms is not between 1s and 7 days",
            ),
            (
                "name = \"crm\"\ncommand = \"x\"\ntools = [\"a\"]\neffects = { a = \"idempotent\" }\n\
                 cache_ttl = { a = \"1m\" }",
                "only a read_only tool's results may be cached; its effects are idempotent",
            ),
            (
                "name = \"crm\"\ncommand = \"x\"\ntools = [\"a\"]\nconcurrency = 0",
                "at least 1",
            ),
            (
                "name = \"crm\"\nurl = \"http://a\"\ntools = [\"a\"]\nprobe_interval = \"10ms\"",
                "probe_interval must be at least 100ms",
            ),
        ] {
            let err = server(&format!("[[servers]]\n{bad}\n")).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn two_tools_with_one_fleet_name_are_refused_naming_both() {
        let err = server(
            r#"[[servers]]
name = "a"
command = "x"
tools = ["get.x", "get_x"]
"#,
        )
        .unwrap_err();
        assert!(
            err.contains("\"get.x\"") && err.contains("\"get_x\""),
            "{err}"
        );
        let err = server(
            r#"[[servers]]
name = "a"
command = "x"
prefix = "p__"
tools = ["t"]
[[servers]]
name = "b"
command = "x"
prefix = "p__"
tools = ["t"]
"#,
        )
        .unwrap_err();
        assert!(err.contains("another prefix"), "{err}");
    }

    #[test]
    fn destructive_tools_need_approval_when_the_server_says_so() {
        use McpApproval::*;
        assert_eq!(
            WhenDestructive.for_tool(Effects::NotIdempotent, true),
            Approval::Always
        );
        assert_eq!(
            WhenDestructive.for_tool(Effects::ReadOnly, true),
            Approval::Never
        );
        assert_eq!(
            WhenDestructive.for_tool(Effects::Idempotent, false),
            Approval::Never
        );
        assert_eq!(
            Never.for_tool(Effects::NotIdempotent, true),
            Approval::Never
        );
    }
}
