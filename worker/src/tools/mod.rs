//! The built-in tools, one module each, and the toolbox a worker binary serves.
//!
//! Generic escape hatches (`run_shell`, `execute_sql`, `send_http_request`) are
//! never shipped: a model that asks for one gets `UNKNOWN_TOOL`.

pub mod calculate;
pub mod testing;
pub mod weather;

use redis::aio::ConnectionManager;

use crate::config::WorkerOptions;
use crate::tool::Toolbox;

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
}

/// The tools the `toolfleet-worker` binary serves with `options`: the built-in
/// ones (or the subset named in `tools`), plus the test pack if enabled.
///
/// # Errors
///
/// [`BuildError`] when `tools` names an unknown tool or a tool cannot be built.
pub fn builtin(options: &WorkerOptions, redis: ConnectionManager) -> Result<Toolbox, BuildError> {
    let weather = weather::GetCurrentWeather::new(&options.weather)
        .map_err(|e| BuildError::Weather(Box::new(e)))?;
    let mut all = Toolbox::new().with(calculate::Calculate).with(weather);
    if options.test_tools {
        all = all.merge(testing::toolbox(redis));
    }
    if options.tools.is_empty() {
        return Ok(all);
    }
    let available: Vec<String> = all.manifests().into_iter().map(|m| m.name).collect();
    for name in &options.tools {
        if !available.contains(name) {
            return Err(BuildError::UnknownTool {
                name: name.clone(),
                available: available.join(", "),
            });
        }
    }
    Ok(all.only(&options.tools))
}
