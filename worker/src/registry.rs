//! Announces this worker's tools in the registry (a NATS KV bucket whose
//! entries expire): one key per tool and worker, refreshed by a heartbeat, so
//! the orchestrator sees which tools are live and how many workers serve them.

use async_nats::jetstream::kv;
use tokio_util::sync::CancellationToken;
use toolfleet_proto::names::{self, REGISTRY_BUCKET};
use toolfleet_proto::{ToolManifest, WorkerAnnouncement};
use toolfleet_service::clock::now_ms;
use tracing::{debug, info, warn};

use crate::config::RegistryOptions;

/// The registry bucket could not be opened or created.
#[derive(Debug, thiserror::Error)]
#[error("cannot open the registry bucket {REGISTRY_BUCKET}")]
pub struct RegistryError(#[source] pub(crate) Box<dyn std::error::Error + Send + Sync>);

/// Keeps the announcements of one worker alive.
pub(crate) struct Announcer {
    pub(crate) store: kv::Store,
    pub(crate) worker_id: String,
    pub(crate) manifests: Vec<ToolManifest>,
    pub(crate) options: RegistryOptions,
}

impl Announcer {
    /// Announces at once, then on every heartbeat until `shutdown`; then
    /// withdraws the announcements so the orchestrator stops routing here.
    pub(crate) async fn run(self, shutdown: CancellationToken) {
        let mut ticker = tokio::time::interval(self.options.heartbeat_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                _ = ticker.tick() => self.announce().await,
            }
        }
        for manifest in &self.manifests {
            let key = names::registry_key(&manifest.name, &self.worker_id);
            if let Err(err) = self.store.purge(&key).await {
                warn!(error = %err, key, "could not withdraw the announcement; it expires with its TTL");
            }
        }
        info!("tools withdrawn from the registry");
    }

    async fn announce(&self) {
        let heartbeat_ms = now_ms();
        for manifest in &self.manifests {
            let announcement = WorkerAnnouncement {
                worker_id: self.worker_id.clone(),
                manifest: manifest.clone(),
                heartbeat_ms,
            };
            let key = names::registry_key(&manifest.name, &self.worker_id);
            // A manifest is plain data; serializing it cannot fail.
            let value = serde_json::to_vec(&announcement).expect("announcement serializes");
            match self.store.put(&key, value.into()).await {
                Ok(_) => debug!(key, "announced"),
                Err(err) => warn!(error = %err, key, "heartbeat failed; retrying at the next one"),
            }
        }
    }
}
