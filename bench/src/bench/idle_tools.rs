//! `--tools N`: every worker also serves N tools of an MCP server the bench
//! runs, each with its queue and consumer, announced and listed as any
//! tool is, and none of them called. The tools a fleet has registered must
//! cost a job nothing: a call names its own tool's queue, and a worker
//! waits on every queue at once (decision 0016).

use tokio_util::sync::{CancellationToken, DropGuard};

use super::mcp::serve_echoes;

/// The server's name in the workers' configuration: its tools' fleet
/// names are `idle__t<n>`.
const SERVER: &str = "idle";

/// The MCP server of idle tools, served until this is dropped.
pub(super) struct IdleTools {
    url: String,
    names: Vec<String>,
    _serving: DropGuard,
}

impl IdleTools {
    /// Serves `count` tools on a free loopback port.
    pub(super) async fn serve(count: usize) -> anyhow::Result<Self> {
        let names: Vec<String> = (0..count).map(|n| format!("t{n:05}")).collect();
        let stop = CancellationToken::new();
        let url = serve_echoes(names.clone(), stop.clone()).await?;
        Ok(Self {
            url,
            names,
            _serving: stop.drop_guard(),
        })
    }

    /// The workers' configuration file: the server and every tool of it.
    pub(super) fn worker_config(&self) -> String {
        let tools: Vec<String> = self.names.iter().map(|n| format!("\"{n}\"")).collect();
        format!(
            "[[mcp.servers]]\nname = \"{SERVER}\"\nurl = \"{}\"\ntools = [{}]\n",
            self.url,
            tools.join(", ")
        )
    }

    /// The fleet name of its last tool, which a worker serves once it
    /// serves them all.
    pub(super) fn last(&self) -> Option<String> {
        self.names.last().map(|name| format!("{SERVER}__{name}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_workers_config_names_the_server_and_each_tool() -> anyhow::Result<()> {
        let tools = IdleTools::serve(3).await?;
        let config: toml::Value = toml::from_str(&tools.worker_config())?;
        let server = &config["mcp"]["servers"][0];
        assert_eq!(server["name"].as_str(), Some(SERVER));
        assert!(
            server["url"]
                .as_str()
                .is_some_and(|url| url.starts_with("http://127.0.0.1:"))
        );
        let names: Vec<&str> = (server["tools"].as_array().into_iter().flatten())
            .filter_map(toml::Value::as_str)
            .collect();
        assert_eq!(names, ["t00000", "t00001", "t00002"]);
        assert_eq!(tools.last().as_deref(), Some("idle__t00002"));
        Ok(())
    }
}
