//! The built-in tools, one module each, and the toolbox a worker binary serves.
//!
//! Generic escape hatches (`run_shell`, `execute_sql`, `send_http_request`) are
//! never shipped: a model that asks for one gets `UNKNOWN_TOOL`.

pub mod calculate;
pub mod knowledge_graph;
#[cfg(feature = "test-tools")]
pub mod testing;
pub mod weather;

/// The help of the `--test-tools` flags, naming every test tool (a test
/// keeps the two in step).
pub const TEST_TOOLS_HELP: &str = "Also serve the test tools: echo, sleep, fail, panic, crash, \
set_flag, increment_counter and measure_concurrency (test_tools). Never in production; only \
in builds with the test-tools feature (toolfleet dev and the tests).";

use toolfleet_service::connect::RedisConnection;

use crate::mcp::McpOptions;
use crate::tool::Toolbox;
use knowledge_graph::{FactualQa, KgOptions, KnowledgeBase, TrendAnalysis};
use weather::WeatherOptions;

/// The configured tools could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// `tools` names a tool this binary does not have.
    #[error("unknown tool {name:?} in `tools`; available: {available}")]
    UnknownTool {
        /// The configured name.
        name: String,
        /// Every tool this binary can serve.
        available: String,
    },
    /// The weather tool's HTTP client could not be built.
    #[error("cannot build the get_current_weather tool")]
    Weather(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The knowledge graph or its model settings are invalid; the message
    /// names the file and line, or the `kg.*` key, to fix.
    #[error(transparent)]
    KnowledgeGraph(#[from] knowledge_graph::Error),
    /// `test_tools` is set in a build without them.
    #[error(
        "test_tools is set, but this toolfleet-worker was built without the test tools \
         (release builds leave them out); unset test_tools, or build with \
         `--features test-tools` for development"
    )]
    TestToolsNotBuilt,
}

/// Which built-in tools a worker serves (the `tools`, `test_tools` and
/// `weather` keys of its options).
#[derive(Debug, Clone, Copy)]
pub struct Selection<'a> {
    /// Tools to serve; empty means every built-in tool. It may also name
    /// the tools of `mcp`'s servers, which are served beside these.
    pub names: &'a [String],
    /// The MCP servers the worker serves tools of.
    pub mcp: &'a McpOptions,
    /// Also serve the test pack.
    pub test_tools: bool,
    /// Settings of `get_current_weather`.
    pub weather: &'a WeatherOptions,
    /// Settings of `factual_qa` and `trend_analysis`.
    pub kg: &'a KgOptions,
}

/// Whether `selection` can be served by this build: the test pack only in
/// a build with the `test-tools` feature. Release builds leave it out, so
/// that tools such as `crash` and `set_flag` are not one setting away in
/// production.
///
/// # Errors
///
/// [`BuildError::TestToolsNotBuilt`].
pub fn check_selection(selection: &Selection<'_>) -> Result<(), BuildError> {
    if selection.test_tools && !cfg!(feature = "test-tools") {
        return Err(BuildError::TestToolsNotBuilt);
    }
    Ok(())
}

#[cfg(feature = "test-tools")]
fn test_tools(redis: RedisConnection) -> Toolbox {
    testing::toolbox(redis)
}

/// None in a build without them (`check_selection` refused the setting
/// already).
#[cfg(not(feature = "test-tools"))]
fn test_tools(_redis: RedisConnection) -> Toolbox {
    Toolbox::new()
}

/// The knowledge-graph tools, which share one graph.
const KNOWLEDGE_GRAPH_TOOLS: [&str; 2] = ["factual_qa", "trend_analysis"];

/// The names of the built-in tools, those of the test pack aside.
pub const BUILTIN_NAMES: [&str; 4] = [
    "calculate",
    "get_current_weather",
    "factual_qa",
    "trend_analysis",
];

/// The names of the test pack (`test_tools`).
pub const TEST_TOOL_NAMES: [&str; 8] = [
    "echo",
    "sleep",
    "fail",
    "panic",
    "crash",
    "set_flag",
    "increment_counter",
    "measure_concurrency",
];

/// Whether `selection` names only tools this build can serve.
///
/// # Errors
///
/// [`BuildError::TestToolsNotBuilt`], or [`BuildError::UnknownTool`]
/// listing every tool that could be named.
pub fn check_names(selection: &Selection<'_>) -> Result<(), BuildError> {
    check_selection(selection)?;
    let test_names = TEST_TOOL_NAMES.iter().filter(|_| selection.test_tools);
    // Their servers' settings are checked with the other keys: here only
    // the names count.
    let mcp_names = selection.mcp.fleet_names().unwrap_or_default();
    let mut available: Vec<&str> = BUILTIN_NAMES.iter().chain(test_names).copied().collect();
    available.extend(mcp_names.keys().map(String::as_str));
    if let Some(name) = selection
        .names
        .iter()
        .find(|name| !available.contains(&name.as_str()))
    {
        let test_pack = if selection.test_tools {
            ""
        } else {
            "; with test_tools (--test-tools), also the test tools"
        };
        return Err(BuildError::UnknownTool {
            name: name.clone(),
            available: format!("{}{test_pack}", available.join(", ")),
        });
    }
    Ok(())
}

/// The built-in tools of a selection, built (the graph loaded) but for the
/// test pack, whose tools record in Redis: a worker builds them before it
/// connects, so that a bad name or graph fails at once.
pub struct Prepared {
    all: Toolbox,
    names: Vec<String>,
    test_tools: bool,
}

/// Builds what `selection` serves, but for the test pack (see [`Prepared`]).
///
/// # Errors
///
/// [`BuildError`] when `selection` names an unknown tool or a tool cannot be
/// built.
pub fn prepare(selection: Selection<'_>) -> Result<Prepared, BuildError> {
    check_names(&selection)?;
    let weather = weather::GetCurrentWeather::new(selection.weather)
        .map_err(|e| BuildError::Weather(Box::new(e)))?;
    let mut all = Toolbox::new().with(calculate::Calculate).with(weather);
    // The graph is loaded only by workers that serve it: a large one takes
    // memory and seconds to read.
    let serves_graph = selection.names.is_empty()
        || selection
            .names
            .iter()
            .any(|name| KNOWLEDGE_GRAPH_TOOLS.contains(&name.as_str()));
    if serves_graph {
        let base = KnowledgeBase::start(selection.kg)?;
        all = all
            .with(FactualQa::new(base.clone()))
            .with(TrendAnalysis::new(base));
    }
    Ok(Prepared {
        all,
        names: selection.names.to_vec(),
        test_tools: selection.test_tools,
    })
}

impl Prepared {
    /// The toolbox, with the test pack recording in `redis` if selected.
    pub fn with_redis(self, redis: RedisConnection) -> Toolbox {
        let mut all = self.all;
        if self.test_tools {
            all = all.merge(test_tools(redis));
        }
        if self.names.is_empty() {
            all
        } else {
            all.only(&self.names)
        }
    }
}

/// The tools the `toolfleet-worker` binary serves: the built-in ones (or the
/// subset `selection` names), plus the test pack if enabled.
///
/// # Errors
///
/// [`BuildError`] when `selection` names an unknown tool or a tool cannot be
/// built.
pub fn builtin(selection: Selection<'_>, redis: RedisConnection) -> Result<Toolbox, BuildError> {
    Ok(prepare(selection)?.with_redis(redis))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_test_pack_is_served_only_by_builds_that_have_it() {
        let (weather, kg) = (WeatherOptions::default(), KgOptions::default());
        let mcp = McpOptions::default();
        let selection = |test_tools| Selection {
            names: &[],
            mcp: &mcp,
            test_tools,
            weather: &weather,
            kg: &kg,
        };
        assert!(check_selection(&selection(false)).is_ok());
        let with_test_tools = check_selection(&selection(true));
        if cfg!(feature = "test-tools") {
            assert!(with_test_tools.is_ok());
        } else {
            let err = with_test_tools.unwrap_err().to_string();
            assert!(err.contains("built without the test tools"), "{err}");
        }
    }
}
