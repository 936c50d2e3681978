//! The tool catalog: the manifests of tools that were offered, kept so that
//! a tool with no live worker stays available while its queue exists.

use std::collections::HashMap;

use redis::AsyncCommands;
use toolfleet_proto::envelope::excerpt;
use tracing::warn;

use crate::job::ToolManifest;

use super::*;

impl JobStore {
    /// Keeps `manifest` in the tool catalog (the newest one a worker
    /// announced), for when no worker of the tool is live.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub(crate) async fn remember_tool(&self, manifest: &ToolManifest) -> Result<(), Error> {
        // A manifest is plain data; serializing it cannot fail.
        let text = serde_json::to_string(manifest).expect("a manifest serializes");
        let () = self
            .conn()
            .hset(self.keys.tool_catalog(), &manifest.name, text)
            .await?;
        Ok(())
    }

    /// Every manifest of the tool catalog that parses and passes
    /// [`ToolManifest::check`] (one that does not is logged and left out: the
    /// catalog is only a cache of announcements).
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub(crate) async fn tool_catalog(&self) -> Result<Vec<ToolManifest>, Error> {
        let key = self.keys.tool_catalog();
        let stored: HashMap<String, String> =
            read_with_retry(|| async { self.conn().hgetall(&key).await }).await?;
        Ok(stored
            .into_iter()
            .filter_map(|(tool, text)| {
                let checked = serde_json::from_str::<ToolManifest>(&text)
                    .map_err(|err| err.to_string())
                    .and_then(|manifest| manifest.check(&tool).map(|()| manifest));
                checked
                    .inspect_err(|why| {
                        warn!(tool = excerpt(&tool, 64), error = %why, "ignoring a catalog entry");
                    })
                    .ok()
            })
            .collect())
    }
}
