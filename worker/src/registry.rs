//! Announces this worker's tools in the registry (a NATS KV bucket whose
//! entries expire): one key per tool and worker, refreshed by a heartbeat, so
//! the orchestrator sees which tools are live and how many workers serve them.
//!
//! A worker writes its keys as plain JetStream publishes to the keys'
//! subjects, not through a KV handle: opening one reads the bucket's stream
//! state, which can list every key (every pool's tools and workers), and a
//! pool's NATS account may only write its own tools' keys (decision 0029).

use std::time::Duration;

use async_nats::connection::State;
use async_nats::jetstream;
use tokio_util::sync::CancellationToken;
use toolfleet_proto::WorkerAnnouncement;
use toolfleet_proto::names;
use toolfleet_service::clock::now_ms;
use toolfleet_service::drain;
use tracing::{debug, info, warn};

use crate::config::RegistryOptions;
use crate::tool_set::ToolSet;

/// How often the connection state is looked at for a reconnect.
const RECONNECT_CHECK: Duration = Duration::from_millis(250);

/// Keeps the announcements of one worker alive.
pub(crate) struct Announcer {
    pub(crate) js: jetstream::Context,
    /// The connection, watched so that a reconnect announces at once.
    pub(crate) nats: async_nats::Client,
    pub(crate) worker_id: String,
    /// Its pool (the `pool` key), announced with each tool; empty: none.
    pub(crate) pool: String,
    /// The tools, each announced with whether it can run now; a change (a
    /// tool down or back, a new manifest) is announced at once.
    pub(crate) tools: ToolSet,
    pub(crate) options: RegistryOptions,
}

impl Announcer {
    /// Announces at once, then on every heartbeat and as soon as NATS is
    /// back after an outage (the announcements may have expired meanwhile,
    /// and until they are back the orchestrator offers these tools to no new
    /// job); on `shutdown`, withdraws them so the orchestrator stops routing
    /// here.
    pub(crate) async fn run(self, shutdown: CancellationToken) {
        let mut ticker = tokio::time::interval(self.options.heartbeat_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut connection = tokio::time::interval(RECONNECT_CHECK);
        let mut was_connected = true;
        let mut changes = self.tools.changes();
        loop {
            let announced = tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                _ = ticker.tick() => shutdown.run_until_cancelled(self.announce()).await,
                // A tool went down, came back or changed: said at once.
                Ok(()) = changes.changed() => {
                    ticker.reset();
                    shutdown.run_until_cancelled(self.announce()).await
                }
                _ = connection.tick() => {
                    let connected = self.nats.connection_state() == State::Connected;
                    let back = connected && !was_connected;
                    was_connected = connected;
                    if !back {
                        continue;
                    }
                    info!("reconnected to NATS; announcing the tools at once");
                    ticker.reset();
                    shutdown.run_until_cancelled(self.announce()).await
                }
            };
            if announced.is_none() {
                break;
            }
        }
        self.withdraw().await;
    }

    /// Deletes this worker's announcements, all at once and for
    /// [`drain::LAST_STEP`] at most: one not deleted expires with its TTL.
    async fn withdraw(&self) {
        let announced = self.tools.announced();
        let deletes = announced.iter().map(|tool| async move {
            let key = names::registry_key(&tool.manifest.name, &self.worker_id);
            // A delete marker, not a purge: a purge is a rollup, which the
            // registry's stream refuses (toolfleet_service::queue).
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(names::headers::KV_OPERATION, names::headers::KV_DELETE);
            if let Err(err) = self.write(&key, Some(headers), Vec::new()).await {
                warn!(error = %err, key, "could not withdraw the announcement; it expires with its TTL");
            }
        });
        let withdrawn = futures::future::join_all(deletes);
        let what = "withdrawing the announcements (they expire with their TTL)";
        if drain::bounded(what, drain::LAST_STEP, withdrawn)
            .await
            .is_some()
        {
            info!("tools withdrawn from the registry");
        }
    }

    async fn announce(&self) {
        let heartbeat_ms = now_ms();
        for tool in self.tools.announced() {
            let key = names::registry_key(&tool.manifest.name, &self.worker_id);
            let announcement = WorkerAnnouncement {
                worker_id: self.worker_id.clone(),
                manifest: tool.manifest,
                heartbeat_ms,
                available: tool.available,
                pool: self.pool.clone(),
                mcp_server: tool.mcp_server,
                pins: !toolfleet_proto::release::is_previous(),
            };
            // A manifest is plain data; serializing it cannot fail.
            let value = serde_json::to_vec(&announcement).expect("announcement serializes");
            match self.write(&key, None, value).await {
                Ok(()) => debug!(key, "announced"),
                Err(err) => warn!(error = %err, key, "heartbeat failed; retrying at the next one"),
            }
        }
    }

    /// Writes `key` of the registry and waits for JetStream to store it.
    async fn write(
        &self,
        key: &str,
        headers: Option<async_nats::HeaderMap>,
        value: Vec<u8>,
    ) -> Result<(), async_nats::Error> {
        let subject = format!("{}{key}", names::REGISTRY_KEY_PREFIX);
        let published = match headers {
            Some(headers) => {
                self.js
                    .publish_with_headers(subject, headers, value.into())
                    .await?
            }
            None => self.js.publish(subject, value.into()).await?,
        };
        published.await?;
        Ok(())
    }
}
