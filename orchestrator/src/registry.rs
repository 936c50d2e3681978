//! The tool registry: what workers announce in the registry KV bucket, kept
//! current by a watch. A tool is live while at least one worker's
//! announcement of it was received less than the registry TTL ago.
//!
//! A tool stays available with no live worker while its queue (its durable
//! consumer) exists: its calls wait there for the next worker, as when KEDA
//! has scaled its pool to zero. But a tool whose live workers all announce
//! that they cannot run it now (`available: false`: its MCP server is
//! down) is withdrawn: the model is never offered a tool nobody can run. Its manifest then comes from the tool
//! catalog in Redis, where this registry keeps the newest manifest of every
//! tool announced, so that it outlives the announcements and this process.
//!
//! Liveness is measured on this process's own monotonic clock, from when an
//! announcement arrived, never by comparing a worker's clock with ours; the
//! bucket's `max_age` (the TTL) keeps what the watch replays at start at
//! most one TTL old. Every announcement is checked
//! ([`WorkerAnnouncement::check`]): anyone who can write to the bucket can
//! write anything, and what fails is ignored and logged.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use async_nats::jetstream::kv;
use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use toolfleet_proto::envelope::excerpt;
use toolfleet_proto::names;
use toolfleet_proto::{ToolManifest, WorkerAnnouncement};
use tracing::{debug, warn};

use crate::job::now_ms;
use crate::store::JobStore;

/// Manifests waiting for the catalog's writer; more are dropped (logged).
const CATALOG_BACKLOG: usize = 64;

/// A tool jobs may use: its manifest, compiled schema and how many workers
/// serve it.
#[derive(Clone)]
pub(crate) struct LiveTool {
    /// The newest manifest announced. Shared: every turn and call reads
    /// the registry, and a manifest (with its schema) is too big to copy
    /// each time.
    pub manifest: Arc<ToolManifest>,
    /// The manifest's schema, compiled once.
    pub validator: Arc<jsonschema::Validator>,
    /// Workers with a fresh heartbeat: 0 for a tool whose calls wait in its
    /// queue for a worker, or one known only because a job was offered it.
    pub workers: usize,
}

impl LiveTool {
    /// A tool known from `manifest` alone (one a job's model was offered),
    /// with no worker counted; `None` when its schema does not compile.
    pub(crate) fn known(manifest: ToolManifest) -> Option<Self> {
        match jsonschema::validator_for(&manifest.parameters) {
            Ok(validator) => Some(Self {
                manifest: Arc::new(manifest),
                validator: Arc::new(validator),
                workers: 0,
            }),
            Err(err) => {
                warn!(tool = %manifest.name, error = %err, "ignoring a tool whose schema does not compile");
                None
            }
        }
    }
}

#[derive(Default)]
struct Entry {
    manifest: Option<(Arc<ToolManifest>, Arc<jsonschema::Validator>)>,
    /// worker id -> when its last announcement arrived, and whether it
    /// said it can run the tool
    workers: HashMap<String, (Instant, bool)>,
    /// Its queue (durable consumer) exists: a worker announced the tool, or
    /// the backlog poll last saw it. With no live worker, its calls wait there.
    queued: bool,
}

/// Cheap handle to the registry; the only way other code reads it.
#[derive(Clone)]
pub(crate) struct RegistryHandle {
    tools: Arc<RwLock<HashMap<String, Entry>>>,
    ttl: Duration,
}

impl RegistryHandle {
    /// An available tool by name: live, or queued with no live worker.
    pub(crate) fn get(&self, name: &str) -> Option<LiveTool> {
        let tools = self
            .tools
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        tools.get(name).and_then(|entry| self.available(entry))
    }

    /// Every available tool, by name.
    pub(crate) fn available_tools(&self) -> Vec<LiveTool> {
        let tools = self
            .tools
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut live: Vec<_> = tools.values().filter_map(|e| self.available(e)).collect();
        live.sort_by(|a, b| a.manifest.name.cmp(&b.manifest.name));
        live
    }

    /// The name of every tool with a known manifest, available or not.
    pub(crate) fn known_tools(&self) -> Vec<String> {
        let tools = self
            .tools
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut names: Vec<_> = tools
            .iter()
            .filter(|(_, entry)| entry.manifest.is_some())
            .map(|(name, _)| name.clone())
            .collect();
        names.sort();
        names
    }

    /// Whether `tool`'s queue exists (so its calls can wait for a worker).
    pub(crate) fn set_queued(&self, tool: &str, queued: bool) {
        let mut tools = self
            .tools
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(entry) = tools.get_mut(tool) {
            entry.queued = queued;
        }
    }

    fn available(&self, entry: &Entry) -> Option<LiveTool> {
        let live = || {
            entry
                .workers
                .values()
                .filter(|(arrived, _)| arrived.elapsed() < self.ttl)
        };
        let workers = live().filter(|(_, available)| *available).count();
        let withdrawn = workers == 0 && live().next().is_some();
        if withdrawn || (workers == 0 && !entry.queued) {
            return None;
        }
        let (manifest, validator) = entry.manifest.clone()?;
        Some(LiveTool {
            manifest,
            validator,
            workers,
        })
    }

    /// Learns `manifest` from the catalog, unless an announcement came first.
    fn remember(&self, manifest: ToolManifest) {
        let Some(known) = LiveTool::known(manifest) else {
            return;
        };
        let mut tools = self
            .tools
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let entry = tools.entry(known.manifest.name.clone()).or_default();
        if entry.manifest.is_none() {
            entry.manifest = Some((known.manifest, known.validator));
        }
    }

    /// Applies one registry update; returns the manifest it announced when
    /// that is new to this registry (for the catalog).
    fn apply(&self, key: &str, operation: kv::Operation, value: &[u8]) -> Option<ToolManifest> {
        let (tool, worker) = names::parse_registry_key(key)?;
        let mut tools = self
            .tools
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match operation {
            kv::Operation::Put => {
                let announcement: WorkerAnnouncement = match serde_json::from_slice(value) {
                    Ok(a) => a,
                    Err(err) => {
                        warn!(key = excerpt(key, 200), error = %err, "ignoring an unreadable announcement");
                        return None;
                    }
                };
                if let Err(why) = announcement.check(tool, worker, now_ms()) {
                    warn!(
                        key = excerpt(key, 200),
                        error = why,
                        "ignoring an invalid announcement"
                    );
                    return None;
                }
                let entry = tools.entry(tool.to_owned()).or_default();
                let changed = entry
                    .manifest
                    .as_ref()
                    .is_none_or(|(m, _)| **m != announcement.manifest);
                let mut new = None;
                if changed {
                    match jsonschema::validator_for(&announcement.manifest.parameters) {
                        Ok(validator) => {
                            new = Some(announcement.manifest.clone());
                            let manifest = Arc::new(announcement.manifest);
                            entry.manifest = Some((manifest, Arc::new(validator)));
                        }
                        Err(err) => {
                            warn!(tool, error = %err, "ignoring a tool whose schema does not compile");
                            return None;
                        }
                    }
                }
                entry
                    .workers
                    .insert(worker.to_owned(), (Instant::now(), announcement.available));
                // A worker pulls from the tool's queue, so it exists (until
                // the backlog poll sees otherwise).
                entry.queued = true;
                new
            }
            kv::Operation::Delete | kv::Operation::Purge => {
                if let Some(entry) = tools.get_mut(tool) {
                    entry.workers.remove(worker);
                }
                None
            }
        }
    }
}

/// Watches the registry bucket and keeps a [`RegistryHandle`] current.
pub(crate) struct Registry {
    bucket: kv::Store,
    catalog: JobStore,
    handle: RegistryHandle,
}

impl Registry {
    /// A registry fed from `bucket`, whose announcements expire after
    /// `ttl`, keeping its tool catalog in `catalog`.
    pub(crate) fn new(bucket: kv::Store, ttl: Duration, catalog: JobStore) -> Self {
        Self {
            bucket,
            catalog,
            handle: RegistryHandle {
                tools: Arc::default(),
                ttl,
            },
        }
    }

    /// The handle.
    pub(crate) fn handle(&self) -> RegistryHandle {
        self.handle.clone()
    }

    /// Starts the catalog's own task: it loads the catalog into the
    /// handle, then writes each manifest sent to it. Redis is never awaited
    /// on the watch's path, so an outage of Redis cannot stall liveness.
    fn catalog_keeper(&self) -> mpsc::Sender<ToolManifest> {
        let (remember, mut to_remember) = mpsc::channel::<ToolManifest>(CATALOG_BACKLOG);
        let (catalog, handle) = (self.catalog.clone(), self.handle.clone());
        tokio::spawn(async move {
            match catalog.tool_catalog().await {
                Ok(manifests) => manifests.into_iter().for_each(|m| handle.remember(m)),
                // The tools still live are announced again within a heartbeat.
                Err(err) => {
                    warn!(error = %err, "cannot read the tool catalog; knowing only the live tools")
                }
            }
            while let Some(manifest) = to_remember.recv().await {
                if let Err(err) = catalog.remember_tool(&manifest).await {
                    warn!(tool = %manifest.name, error = %err, "cannot keep the tool in the catalog");
                }
            }
        });
        remember
    }

    /// Follows the bucket until `shutdown`, re-watching after errors, and
    /// keeps each manifest new to this registry in the catalog.
    pub(crate) async fn run(self, shutdown: CancellationToken) {
        let catalog = self.catalog_keeper();
        loop {
            let Some(watching) = shutdown
                .run_until_cancelled(self.bucket.watch_with_history(">"))
                .await
            else {
                return;
            };
            match watching {
                Ok(mut watch) => loop {
                    tokio::select! {
                        biased;
                        () = shutdown.cancelled() => return,
                        entry = watch.next() => match entry {
                            Some(Ok(entry)) => {
                                debug!(key = %entry.key, "registry update");
                                if let Some(manifest) = self.handle.apply(&entry.key, entry.operation, &entry.value)
                                    && catalog.try_send(manifest).is_err()
                                {
                                    // Only a cache: the next start reads what
                                    // the live workers announce again.
                                    warn!("the tool catalog is behind; a manifest was not kept");
                                }
                            }
                            Some(Err(err)) => {
                                warn!(error = %err, "registry watch failed; re-watching");
                                break;
                            }
                            None => break,
                        },
                    }
                },
                Err(err) => warn!(error = %err, "cannot watch the registry; retrying"),
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn announcement(worker: &str, available: bool) -> Vec<u8> {
        serde_json::to_vec(&WorkerAnnouncement {
            worker_id: worker.to_owned(),
            manifest: ToolManifest::new(
                "crm__find",
                "Finds.",
                serde_json::json!({"type": "object"}),
            ),
            heartbeat_ms: now_ms(),
            available,
            pool: String::new(),
            mcp_server: String::new(),
        })
        .unwrap()
    }

    #[test]
    fn a_tool_no_live_worker_can_run_is_withdrawn_though_its_queue_exists() {
        let registry = RegistryHandle {
            tools: Arc::default(),
            ttl: Duration::from_secs(15),
        };
        let key = |worker: &str| names::registry_key("crm__find", worker);
        let put = |worker: &str, available: bool| {
            registry.apply(
                &key(worker),
                kv::Operation::Put,
                &announcement(worker, available),
            );
        };
        put("w1", true);
        assert_eq!(registry.get("crm__find").map(|t| t.workers), Some(1));
        // Its MCP server died: the one worker says it cannot run it.
        put("w1", false);
        assert!(registry.get("crm__find").is_none(), "withdrawn");
        assert!(registry.available_tools().is_empty());
        // Another worker can: offered again, with that one worker counted.
        put("w2", true);
        assert_eq!(registry.get("crm__find").map(|t| t.workers), Some(1));
        // Both gone (no live announcement at all): its calls wait in its
        // queue, as for a pool scaled to zero.
        for worker in ["w1", "w2"] {
            registry.apply(&key(worker), kv::Operation::Delete, &[]);
        }
        assert_eq!(registry.get("crm__find").map(|t| t.workers), Some(0));
    }
}
