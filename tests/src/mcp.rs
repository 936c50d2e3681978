//! What the MCP tests share: a fleet whose worker serves MCP servers, the
//! test server over Streamable HTTP, and waits on what `ListTools` offers.

use std::path::Path;
use std::time::Duration;

use toolfleet_proto::v1;

use crate::fleet::{ApiClient, Fleet, test_fleet};
use crate::{repo_root, venv_python, wait_until};

/// The test server (tests/mcp/server.py) over Streamable HTTP at
/// `address`, writing its traces in `scratch`; killed when dropped.
pub fn start_http_server(scratch: &Path, address: &str) -> anyhow::Result<tokio::process::Child> {
    let port = address.rsplit(':').next().unwrap_or_default().to_owned();
    let server = repo_root().join("tests/mcp/server.py");
    Ok(tokio::process::Command::new(venv_python()?)
        .args([server.display().to_string(), "http".into(), port])
        .env("MCP_TEST_DIR", scratch)
        .kill_on_drop(true)
        .spawn()?)
}

/// A worker's table for the test server over HTTP at `address`, as `name`
/// serving `add`, with `extra` lines.
pub fn http_config(name: &str, address: &str, extra: &str) -> anyhow::Result<String> {
    Ok(format!(
        "[[mcp.servers]]\nname = {name:?}\nurl = \"http://{address}/mcp\"\ntools = [\"add\"]\n{extra}\n"
    ))
}

/// Where a worker's configuration file goes: a directory of its own, not
/// the servers' `MCP_TEST_DIR`. The worker's sandbox keeps its servers from
/// the file, and so lets them add no file beside it (docs/tools/mcp.md,
/// "Sandbox"). Kept after the test (a few bytes): the worker reads it
/// until the test ends.
pub fn worker_config_path() -> anyhow::Result<std::path::PathBuf> {
    Ok(tempfile::tempdir()?.keep().join("worker.toml"))
}

/// A fleet of one worker (with the test tools) and one orchestrator, the
/// worker configured by `config`, once it serves `tools`.
pub async fn fleet_with(config: &str, tools: &[&str]) -> anyhow::Result<Fleet> {
    fleet_with_env(config, tools, &[]).await
}

/// [`fleet_with`], the worker's environment with `env` too.
pub async fn fleet_with_env(
    config: &str,
    tools: &[&str],
    env: &[(&str, &str)],
) -> anyhow::Result<Fleet> {
    let file = worker_config_path()?;
    std::fs::write(&file, config)?;
    let file = file.display().to_string();
    let env = [env, &[("TOOLFLEET_CONFIG", file.as_str())]].concat();
    let mut fleet = Fleet::start(test_fleet(1).worker_env(&env)).await?;
    fleet.spawn_orchestrator(&[]).await?;
    fleet.wait_for_tools(0, tools, 1).await?;
    Ok(fleet)
}

/// The tools `ListTools` offers.
pub async fn listed_tools(api: &ApiClient) -> anyhow::Result<Vec<v1::Tool>> {
    let listed = api
        .clone()
        .list_tools(v1::ListToolsRequest::default())
        .await?;
    Ok(listed.into_inner().tools)
}

/// Waits until `ListTools` offers `tool` (`offered`), or does not.
pub async fn wait_offered(
    api: &ApiClient,
    tool: &str,
    offered: bool,
    within: Duration,
) -> anyhow::Result<()> {
    let what = format!("{tool} {}", if offered { "offered" } else { "withdrawn" });
    wait_until(&what, within, || async move {
        let listed = listed_tools(api).await.ok()?;
        (listed.iter().any(|t| t.name == tool) == offered).then_some(())
    })
    .await
}
