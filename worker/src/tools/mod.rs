//! The built-in tools, one module each, and the toolbox a worker binary serves.
//!
//! Generic escape hatches (`run_shell`, `execute_sql`, `send_http_request`) are
//! never shipped: a model that asks for one gets `UNKNOWN_TOOL`.

pub mod calculate;
pub mod knowledge_graph;
pub mod testing;
pub mod weather;

use redis::aio::ConnectionManager;

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
    #[error("cannot build the knowledge-graph tools: {0}")]
    KnowledgeGraph(#[from] knowledge_graph::Error),
}

/// Which built-in tools a worker serves (the `tools`, `test_tools` and
/// `weather` keys of its options).
#[derive(Debug, Clone, Copy)]
pub struct Selection<'a> {
    /// Tools to serve; empty means every built-in tool.
    pub names: &'a [String],
    /// Also serve the test pack.
    pub test_tools: bool,
    /// Settings of `get_current_weather`.
    pub weather: &'a WeatherOptions,
    /// Settings of `factual_qa` and `trend_analysis`.
    pub kg: &'a KgOptions,
}

/// The knowledge-graph tools, which share one graph.
const KNOWLEDGE_GRAPH_TOOLS: [&str; 2] = ["factual_qa", "trend_analysis"];

/// The tools the `toolfleet-worker` binary serves: the built-in ones (or the
/// subset `selection` names), plus the test pack if enabled.
///
/// # Errors
///
/// [`BuildError`] when `selection` names an unknown tool or a tool cannot be
/// built.
pub fn builtin(selection: Selection<'_>, redis: ConnectionManager) -> Result<Toolbox, BuildError> {
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
    if selection.test_tools {
        all = all.merge(testing::toolbox(redis));
    }
    if selection.names.is_empty() {
        return Ok(all);
    }
    let available: Vec<String> = all.manifests().into_iter().map(|m| m.name).collect();
    for name in selection.names {
        if !available.contains(name) {
            return Err(BuildError::UnknownTool {
                name: name.clone(),
                available: available.join(", "),
            });
        }
    }
    Ok(all.only(selection.names))
}
