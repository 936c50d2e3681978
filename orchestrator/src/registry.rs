//! The live tool registry: what workers announce in the registry KV bucket,
//! kept current by a watch. A tool is live while at least one worker's
//! announcement of it was received less than the registry TTL ago.
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
use tokio_util::sync::CancellationToken;
use toolfleet_proto::envelope::excerpt;
use toolfleet_proto::names;
use toolfleet_proto::{ToolManifest, WorkerAnnouncement};
use tracing::{debug, warn};

use crate::job::now_ms;

/// A live tool: its manifest, compiled schema and how many workers serve it.
#[derive(Clone)]
pub struct LiveTool {
    /// The newest manifest announced.
    pub manifest: ToolManifest,
    /// The manifest's schema, compiled once.
    pub validator: Arc<jsonschema::Validator>,
    /// Workers with a fresh heartbeat (0 for a tool known only because a
    /// job was offered it).
    pub workers: usize,
}

impl LiveTool {
    /// A tool known from `manifest` alone (one a job's model was offered),
    /// with no worker counted; `None` when its schema does not compile.
    pub fn known(manifest: ToolManifest) -> Option<Self> {
        match jsonschema::validator_for(&manifest.parameters) {
            Ok(validator) => Some(Self {
                manifest,
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
    manifest: Option<(ToolManifest, Arc<jsonschema::Validator>)>,
    /// worker id -> when its last announcement arrived
    workers: HashMap<String, Instant>,
}

/// Cheap handle to the registry; the only way other code reads it.
#[derive(Clone)]
pub struct RegistryHandle {
    tools: Arc<RwLock<HashMap<String, Entry>>>,
    ttl: Duration,
}

impl RegistryHandle {
    /// A live tool by name.
    pub fn get(&self, name: &str) -> Option<LiveTool> {
        let tools = self
            .tools
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        tools.get(name).and_then(|entry| self.live(entry))
    }

    /// Every live tool, by name.
    pub fn live_tools(&self) -> Vec<LiveTool> {
        let tools = self
            .tools
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut live: Vec<_> = tools.values().filter_map(|e| self.live(e)).collect();
        live.sort_by(|a, b| a.manifest.name.cmp(&b.manifest.name));
        live
    }

    fn live(&self, entry: &Entry) -> Option<LiveTool> {
        let workers = entry
            .workers
            .values()
            .filter(|arrived| arrived.elapsed() < self.ttl)
            .count();
        let (manifest, validator) = entry.manifest.clone()?;
        (workers > 0).then_some(LiveTool {
            manifest,
            validator,
            workers,
        })
    }

    fn apply(&self, key: &str, operation: kv::Operation, value: &[u8]) {
        let Some((tool, worker)) = names::parse_registry_key(key) else {
            return;
        };
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
                        return;
                    }
                };
                if let Err(why) = announcement.check(tool, worker, now_ms()) {
                    warn!(
                        key = excerpt(key, 200),
                        error = why,
                        "ignoring an invalid announcement"
                    );
                    return;
                }
                let entry = tools.entry(tool.to_owned()).or_default();
                let changed = entry
                    .manifest
                    .as_ref()
                    .is_none_or(|(m, _)| *m != announcement.manifest);
                if changed {
                    match jsonschema::validator_for(&announcement.manifest.parameters) {
                        Ok(validator) => {
                            entry.manifest = Some((announcement.manifest, Arc::new(validator)));
                        }
                        Err(err) => {
                            warn!(tool, error = %err, "ignoring a tool whose schema does not compile");
                            return;
                        }
                    }
                }
                entry.workers.insert(worker.to_owned(), Instant::now());
            }
            kv::Operation::Delete | kv::Operation::Purge => {
                if let Some(entry) = tools.get_mut(tool) {
                    entry.workers.remove(worker);
                }
            }
        }
    }
}

/// Watches the registry bucket and keeps a [`RegistryHandle`] current.
pub struct Registry {
    store: kv::Store,
    handle: RegistryHandle,
}

impl Registry {
    /// A registry fed from `store`; announcements expire after `ttl`.
    pub fn new(store: kv::Store, ttl: Duration) -> Self {
        Self {
            store,
            handle: RegistryHandle {
                tools: Arc::default(),
                ttl,
            },
        }
    }

    /// The handle.
    pub fn handle(&self) -> RegistryHandle {
        self.handle.clone()
    }

    /// Follows the bucket until `shutdown`, re-watching after errors.
    pub async fn run(self, shutdown: CancellationToken) {
        loop {
            match self.store.watch_with_history(">").await {
                Ok(mut watch) => loop {
                    tokio::select! {
                        biased;
                        () = shutdown.cancelled() => return,
                        entry = watch.next() => match entry {
                            Some(Ok(entry)) => {
                                debug!(key = %entry.key, "registry update");
                                self.handle.apply(&entry.key, entry.operation, &entry.value);
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
