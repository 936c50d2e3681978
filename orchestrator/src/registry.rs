//! The tool registry: what workers announce in the registry KV bucket, kept
//! current by a watch. A tool is live while at least one worker's
//! announcement of it was received less than the registry TTL ago.
//!
//! A tool stays available with no live worker while its queue (its durable
//! consumer) exists: its calls wait there for the next worker, as when KEDA
//! has scaled its pool to zero. But a tool whose live workers all announce
//! that they cannot run it now (`available: false`: its MCP server is
//! down) is withdrawn: the model is never offered a tool nobody can run
//! ([`standing`]). Its manifest then comes from the tool
//! catalog in Redis, where this registry keeps the newest manifest of every
//! tool announced, so that it outlives the announcements and this process.
//!
//! For those who watch the fleet (`ListTools` to an operator or a reader,
//! decision 0052) it also keeps what the live workers say of each tool
//! (their pools and MCP servers, and those that cannot run it) and the
//! calls waiting in its queue as the backlog poll last read them
//! ([`RegistryHandle::fleet_tools`]).
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
    /// The manifest of the version offered to new turns (see
    /// [`Entry::offered`]). Shared: every turn and call reads the registry,
    /// and a manifest (with its schema) is too big to copy each time.
    pub manifest: Arc<ToolManifest>,
    /// The manifest's schema, compiled once.
    pub validator: Arc<jsonschema::Validator>,
    /// The manifest's [`contract_hash`](ToolManifest::contract_hash): its
    /// version, to which the calls of a turn that offered it are pinned
    /// (decision 0058). Computed once.
    pub contract: Arc<str>,
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
                contract: manifest.contract_hash().into(),
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

/// A tool as those who watch the fleet see it: [`LiveTool`] and what the
/// live workers and the backlog poll say of it.
pub(crate) struct FleetTool {
    /// The tool; `workers` counts the live workers that can run it.
    pub tool: LiveTool,
    /// Whether jobs are offered it ([`Standing::Offered`]); false for a
    /// withdrawn tool.
    pub available: bool,
    /// The live workers' pools, sorted, each once; empty when none says.
    pub pools: Vec<String>,
    /// Live workers that serve it but cannot run it now.
    pub workers_unavailable: usize,
    /// Calls waiting in its queue, as last read; `None` until read or when
    /// it could not be.
    pub calls_waiting: Option<u64>,
    /// The MCP server it comes from, as its live workers say (the first
    /// by name, should they differ); empty for a native tool.
    pub mcp_server: String,
    /// Its live versions ([`Entry::versions_live`]).
    pub versions: Vec<LiveVersion>,
}

/// A version of a tool that is live: a live worker announces it, or it is
/// the one offered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LiveVersion {
    /// Its contract hash.
    pub contract: Arc<str>,
    /// The live workers that announce it and can run it now.
    pub workers: usize,
    /// Whether new turns are offered it.
    pub offered: bool,
}

/// Where a tool stands, from its live workers and its queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Standing {
    /// Offered to jobs: a live worker can run it, or none is live and its
    /// calls wait in its queue for one.
    Offered,
    /// Live workers serve it, but none can run it now: offered to no job.
    Withdrawn,
    /// No live worker and no queue: nothing to offer.
    Gone,
}

/// Where a tool with `able` live workers that can run it, `unable` that
/// cannot, and a queue or not, stands.
pub(crate) fn standing(able: usize, unable: usize, queued: bool) -> Standing {
    match (able, unable, queued) {
        (1.., _, _) | (0, 0, true) => Standing::Offered,
        (0, 1.., _) => Standing::Withdrawn,
        (0, 0, false) => Standing::Gone,
    }
}

/// What the backlog poll read of a tool's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QueueRead {
    /// Its queue exists, with this many calls waiting for a worker.
    Waiting(u64),
    /// It has no queue (no durable consumer).
    NoQueue,
    /// It could not be read (an outage, a NATS user without the right).
    Unreadable,
}

/// One worker's latest announcement of a tool.
struct Announced {
    /// When it arrived, on this process's clock.
    arrived: Instant,
    /// When this worker first announced this version: a newer worker's
    /// version wins a tie ([`Entry::offered`]).
    since: Instant,
    /// The contract hash of the manifest it announced: its version.
    version: Arc<str>,
    /// Whether the worker said it can run the tool.
    available: bool,
    /// Its pool; empty when it said none.
    pool: String,
    /// The MCP server the tool comes from; empty for a native tool.
    mcp_server: String,
    /// Whether the worker hands back calls pinned to another version (not
    /// one of the release before).
    pins: bool,
}

/// One version of a tool: its newest manifest, its schema compiled once.
struct Version {
    manifest: Arc<ToolManifest>,
    validator: Arc<jsonschema::Validator>,
}

#[derive(Default)]
struct Entry {
    /// Every version a worker of the tool announces, and the one learned
    /// last: contract hash -> its newest manifest.
    versions: HashMap<Arc<str>, Version>,
    /// The version learned last: the one a worker announced when it first
    /// came (a new worker, or one that changed its manifest), or the
    /// catalog's. Offered when no live worker can say.
    newest: Option<Arc<str>>,
    /// worker id -> its latest announcement of the tool
    workers: HashMap<String, Announced>,
    /// Its queue (durable consumer) exists: a worker announced the tool, or
    /// the backlog poll last saw it. With no live worker, its calls wait there.
    queued: bool,
    /// Calls waiting in its queue, as the backlog poll last read them.
    waiting: Option<u64>,
    /// Until when each version was last known live: its latest
    /// announcement's arrival plus the TTL, or its last worker's
    /// withdrawal. At most [`REMEMBERED_VERSIONS`], the oldest forgotten.
    live_until: HashMap<Arc<str>, Instant>,
}

/// The versions of a tool whose end of life a registry remembers: a call
/// pinned to one it forgot counts as gone since this process started.
const REMEMBERED_VERSIONS: usize = 32;

impl Entry {
    /// The workers whose announcement arrived less than `ttl` ago.
    fn live(&self, ttl: Duration) -> impl Iterator<Item = &Announced> {
        // The clock is read once, not once per worker: this runs several
        // times for every call a job makes.
        let now = Instant::now();
        self.workers
            .values()
            .filter(move |seen| now.saturating_duration_since(seen.arrived) < ttl)
    }

    /// The version new turns are offered: the one the most live workers
    /// that can run it announce (a rolling upgrade moves over when half its
    /// workers have), the newest worker's on a tie; with none, the version
    /// learned last.
    ///
    /// A worker of the release before does not pin: it runs every call of
    /// the tool, whatever version the call was made for. While one can run
    /// the tool, only such workers count, so that what they run is the
    /// version its model was shown; workers of this release that serve
    /// another version hand those calls back.
    fn offered(&self, ttl: Duration) -> Option<(&Arc<str>, &Version)> {
        let able = || self.live(ttl).filter(|seen| seen.available);
        let unpinned = able().any(|seen| !seen.pins);
        // A tool has one or two versions live (three during an unusual
        // roll): a list scanned in place costs less than a map, and this
        // runs several times for every call a job makes.
        let mut counts: Vec<(&Arc<str>, (usize, Instant))> = Vec::new();
        for seen in able().filter(|seen| !(unpinned && seen.pins)) {
            match counts
                .iter_mut()
                .find(|(version, _)| **version == seen.version)
            {
                Some((_, count)) => *count = (count.0 + 1, count.1.max(seen.since)),
                None => counts.push((&seen.version, (1, seen.since))),
            }
        }
        let chosen = counts
            .into_iter()
            .max_by(|(a, x), (b, y)| x.cmp(y).then_with(|| a.cmp(b)))
            .map(|(version, _)| version)
            .or(self.newest.as_ref())?;
        self.versions.get_key_value(chosen)
    }

    /// Learns `manifest` as the newest of its version `contract`; returns
    /// it when it is new to this entry (for the catalog). `Err` when its
    /// schema does not compile (logged).
    fn learn(
        &mut self,
        contract: &Arc<str>,
        manifest: ToolManifest,
    ) -> Result<Option<ToolManifest>, ()> {
        if self
            .versions
            .get(contract)
            .is_some_and(|known| *known.manifest == manifest)
        {
            return Ok(None);
        }
        let validator = jsonschema::validator_for(&manifest.parameters).map_err(|err| {
            warn!(tool = %manifest.name, error = %err, "ignoring a tool whose schema does not compile");
        })?;
        let version = Version {
            manifest: Arc::new(manifest.clone()),
            validator: Arc::new(validator),
        };
        self.versions.insert(contract.clone(), version);
        Ok(Some(manifest))
    }

    /// Every version a live worker announces, and the offered one, by
    /// contract hash: more than one while a rolling upgrade changes the
    /// tool's schema.
    /// `offered` is what [`offered`](Self::offered) says, which the caller
    /// has at hand.
    fn versions_live(&self, ttl: Duration, offered: Option<&Arc<str>>) -> Vec<LiveVersion> {
        let mut versions: Vec<LiveVersion> = Vec::new();
        let announced = self.live(ttl).map(|seen| (&seen.version, seen.available));
        let chosen = offered.into_iter().map(|contract| (contract, false));
        for (contract, able) in announced.chain(chosen) {
            let index = match versions.iter().position(|v| v.contract == *contract) {
                Some(index) => index,
                None => {
                    versions.push(LiveVersion {
                        contract: contract.clone(),
                        workers: 0,
                        offered: offered == Some(contract),
                    });
                    versions.len() - 1
                }
            };
            versions[index].workers += usize::from(able);
        }
        versions.sort_by(|a, b| a.contract.cmp(&b.contract));
        versions
    }

    /// How long `version` has had no live worker, or `None` while it has
    /// one, or while it is the version learned last and the tool's queue
    /// exists (a pool scaled to zero; decision 0016). A version this entry
    /// never saw, or forgot, is gone since `known_from`.
    fn gone_for(&self, version: &str, ttl: Duration, known_from: Instant) -> Option<Duration> {
        let announced = self.live(ttl).any(|seen| &*seen.version == version);
        if announced || (self.queued && self.newest.as_deref() == Some(version)) {
            return None;
        }
        let until = self.live_until.get(version).copied().unwrap_or(known_from);
        Some(until.elapsed())
    }

    /// Keeps that `version` is live until `until`, forgetting the oldest
    /// version beyond [`REMEMBERED_VERSIONS`].
    fn live_until(&mut self, version: &Arc<str>, until: Instant) {
        self.live_until.insert(version.clone(), until);
        if self.live_until.len() > REMEMBERED_VERSIONS
            && let Some(oldest) = self
                .live_until
                .iter()
                .min_by_key(|(_, until)| **until)
                .map(|(version, _)| version.clone())
        {
            self.live_until.remove(&oldest);
        }
    }

    /// Removes `worker`'s announcement (it withdrew): its version stops
    /// being live now, unless another worker's announcement keeps it.
    fn withdraw(&mut self, worker: &str, ttl: Duration) {
        let Some(gone) = self.workers.remove(worker) else {
            return;
        };
        let now = Instant::now();
        let until = self
            .workers
            .values()
            .filter(|seen| seen.version == gone.version)
            .map(|seen| seen.arrived + ttl)
            .fold(now, Instant::max);
        self.live_until(&gone.version, until);
        self.forget_unannounced();
    }

    /// Records `worker`'s announcement (checked), live for `ttl`; returns
    /// its manifest when that is new to this entry (for the catalog).
    fn announce(
        &mut self,
        worker: &str,
        announcement: WorkerAnnouncement,
        ttl: Duration,
    ) -> Option<ToolManifest> {
        let earlier = self.workers.get(worker);
        // A heartbeat repeats its manifest: its hash is not computed again.
        let contract: Arc<str> = match earlier {
            Some(seen)
                if self
                    .versions
                    .get(&seen.version)
                    .is_some_and(|known| *known.manifest == announcement.manifest) =>
            {
                seen.version.clone()
            }
            _ => announcement.manifest.contract_hash().into(),
        };
        let since = earlier
            .filter(|seen| seen.version == contract)
            .map(|seen| seen.since);
        let new = self.learn(&contract, announcement.manifest).ok()?;
        let now = Instant::now();
        if since.is_none() {
            self.newest = Some(contract.clone());
        }
        self.live_until(&contract, now + ttl);
        let seen = Announced {
            arrived: now,
            since: since.unwrap_or(now),
            version: contract,
            available: announcement.available,
            pool: announcement.pool,
            mcp_server: announcement.mcp_server,
            pins: announcement.pins,
        };
        self.workers.insert(worker.to_owned(), seen);
        self.forget_unannounced();
        // A worker pulls from the tool's queue, so it exists (until
        // the backlog poll sees otherwise).
        self.queued = true;
        new
    }

    /// Forgets the versions no worker announced and that were not learned
    /// last: a pool that announces ever new schemas costs this registry
    /// one version per worker, never more.
    fn forget_unannounced(&mut self) {
        let Self {
            versions,
            workers,
            newest,
            ..
        } = self;
        versions.retain(|version, _| {
            newest.as_ref() == Some(version) || workers.values().any(|w| w.version == *version)
        });
    }
}

/// Cheap handle to the registry; the only way other code reads it.
#[derive(Clone)]
pub(crate) struct RegistryHandle {
    tools: Arc<RwLock<HashMap<String, Entry>>>,
    ttl: Duration,
    /// When this registry began to watch: what it cannot know of a
    /// version's life is counted from here.
    started: Instant,
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

    /// The available tools among `names`, or every available tool when
    /// `names` is empty; by name. A job that names its tools costs a lookup
    /// per name, however many tools the fleet serves (docs/performance.md).
    pub(crate) fn available_tools(&self, names: &[String]) -> Vec<LiveTool> {
        let tools = self
            .tools
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut live: Vec<_> = if names.is_empty() {
            tools.values().filter_map(|e| self.available(e)).collect()
        } else {
            names
                .iter()
                .filter_map(|name| tools.get(name))
                .filter_map(|e| self.available(e))
                .collect()
        };
        live.sort_by(|a, b| a.manifest.name.cmp(&b.manifest.name));
        live.dedup_by(|a, b| a.manifest.name == b.manifest.name);
        live
    }

    /// The live versions of `tool` ([`Entry::versions_live`]); empty for
    /// a tool this registry does not know.
    pub(crate) fn versions_live(&self, tool: &str) -> Vec<LiveVersion> {
        let tools = self
            .tools
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        tools
            .get(tool)
            .map(|entry| {
                let offered = entry.offered(self.ttl).map(|(contract, _)| contract);
                entry.versions_live(self.ttl, offered)
            })
            .unwrap_or_default()
    }

    /// How long the version `version` of `tool` (a contract hash) has had
    /// no live worker; `None` while it has one, or while it is the version
    /// a pool scaled to zero comes back with ([`Entry::gone_for`]).
    pub(crate) fn version_gone_for(&self, tool: &str, version: &str) -> Option<Duration> {
        let tools = self
            .tools
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match tools.get(tool) {
            Some(entry) => entry.gone_for(version, self.ttl, self.started),
            None => Some(self.started.elapsed()),
        }
    }

    /// The name of every tool with a known manifest, available or not.
    pub(crate) fn known_tools(&self) -> Vec<String> {
        let tools = self
            .tools
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut names: Vec<_> = tools
            .iter()
            .filter(|(_, entry)| !entry.versions.is_empty())
            .map(|(name, _)| name.clone())
            .collect();
        names.sort();
        names
    }

    /// Records what the backlog poll read of `tool`'s queue: whether it
    /// exists (so its calls can wait for a worker; unchanged when it could
    /// not be read), and its calls waiting (unknown when not read).
    pub(crate) fn read_queue(&self, tool: &str, read: QueueRead) {
        let mut tools = self
            .tools
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(entry) = tools.get_mut(tool) else {
            return;
        };
        match read {
            QueueRead::Waiting(calls) => (entry.queued, entry.waiting) = (true, Some(calls)),
            QueueRead::NoQueue => (entry.queued, entry.waiting) = (false, None),
            QueueRead::Unreadable => entry.waiting = None,
        }
    }

    /// Every tool jobs are offered, by name, as those who watch the fleet
    /// see it; with `include_unavailable`, the withdrawn ones too.
    pub(crate) fn fleet_tools(&self, include_unavailable: bool) -> Vec<FleetTool> {
        let tools = self
            .tools
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut listed: Vec<FleetTool> = tools
            .values()
            .filter_map(|entry| self.fleet_tool(entry))
            .filter(|tool| include_unavailable || tool.available)
            .collect();
        listed.sort_by(|a, b| a.tool.manifest.name.cmp(&b.tool.manifest.name));
        listed
    }

    fn available(&self, entry: &Entry) -> Option<LiveTool> {
        let (able, unable) =
            entry
                .live(self.ttl)
                .fold((0, 0), |(able, unable), seen| match seen.available {
                    true => (able + 1, unable),
                    false => (able, unable + 1),
                });
        if standing(able, unable, entry.queued) != Standing::Offered {
            return None;
        }
        let (contract, version) = entry.offered(self.ttl)?;
        Some(LiveTool {
            manifest: version.manifest.clone(),
            validator: version.validator.clone(),
            contract: contract.clone(),
            workers: able,
        })
    }

    /// `entry` for those who watch the fleet; `None` when it is gone.
    fn fleet_tool(&self, entry: &Entry) -> Option<FleetTool> {
        let (contract, version) = entry.offered(self.ttl)?;
        let live: Vec<&Announced> = entry.live(self.ttl).collect();
        let able = live.iter().filter(|seen| seen.available).count();
        let unable = live.len() - able;
        let available = match standing(able, unable, entry.queued) {
            Standing::Gone => return None,
            standing => standing == Standing::Offered,
        };
        let named = |name: fn(&Announced) -> &str| {
            let mut names: Vec<String> = live
                .iter()
                .map(|seen| name(seen))
                .filter(|name| !name.is_empty())
                .map(str::to_owned)
                .collect();
            names.sort();
            names.dedup();
            names
        };
        Some(FleetTool {
            tool: LiveTool {
                manifest: version.manifest.clone(),
                validator: version.validator.clone(),
                contract: contract.clone(),
                workers: able,
            },
            available,
            pools: named(|seen| seen.pool.as_str()),
            workers_unavailable: unable,
            calls_waiting: entry.waiting,
            mcp_server: named(|seen| seen.mcp_server.as_str())
                .into_iter()
                .next()
                .unwrap_or_default(),
            versions: entry.versions_live(self.ttl, Some(contract)),
        })
    }

    /// Learns `manifest` from the catalog, unless an announcement came first.
    fn remember(&self, manifest: ToolManifest) {
        let mut tools = self
            .tools
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let entry = tools.entry(manifest.name.clone()).or_default();
        if entry.newest.is_some() {
            return;
        }
        let contract: Arc<str> = manifest.contract_hash().into();
        if entry.learn(&contract, manifest).is_ok() {
            entry.newest = Some(contract);
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
                tools
                    .entry(tool.to_owned())
                    .or_default()
                    .announce(worker, announcement, self.ttl)
            }
            kv::Operation::Delete | kv::Operation::Purge => {
                if let Some(entry) = tools.get_mut(tool) {
                    entry.withdraw(worker, self.ttl);
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
                started: Instant::now(),
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
        announcement_from(worker, available, "", "")
    }

    fn announcement_from(worker: &str, available: bool, pool: &str, mcp_server: &str) -> Vec<u8> {
        serde_json::to_vec(&WorkerAnnouncement {
            worker_id: worker.to_owned(),
            manifest: ToolManifest::new(
                "crm__find",
                "Finds.",
                serde_json::json!({"type": "object"}),
            ),
            heartbeat_ms: now_ms(),
            available,
            pool: pool.to_owned(),
            mcp_server: mcp_server.to_owned(),
            pins: true,
        })
        .unwrap()
    }

    fn registry() -> RegistryHandle {
        RegistryHandle {
            tools: Arc::default(),
            ttl: Duration::from_secs(15),
            started: Instant::now(),
        }
    }

    /// An announcement of `crm__find` by `worker`, whose schema has the
    /// property `field`: each field is a version of the tool.
    fn version(worker: &str, field: &str) -> Vec<u8> {
        let mut announced: WorkerAnnouncement =
            serde_json::from_slice(&announcement(worker, true)).unwrap();
        announced.manifest.parameters =
            serde_json::json!({"type": "object", "properties": {field: {"type": "string"}}});
        serde_json::to_vec(&announced).unwrap()
    }

    #[test]
    fn a_rolling_upgrade_offers_the_version_most_live_workers_announce() {
        let registry = registry();
        let key = |worker: &str| names::registry_key("crm__find", worker);
        let put = |worker: &str, field: &str| {
            registry
                .apply(&key(worker), kv::Operation::Put, &version(worker, field))
                .map(|manifest| manifest.contract_hash())
        };
        let delete = |worker: &str| registry.apply(&key(worker), kv::Operation::Delete, &[]);
        let offered = || {
            registry
                .get("crm__find")
                .map(|tool| tool.contract.to_string())
        };
        let (old, new) = (put("w1", "old").unwrap(), put("w3", "new").unwrap());
        assert_ne!(old, new);
        assert_eq!(put("w2", "old"), None, "a known version is not new");
        assert_eq!(offered().as_deref(), Some(old.as_str()), "2 workers to 1");
        assert_eq!(put("w4", "new"), None);
        assert_eq!(
            offered().as_deref(),
            Some(new.as_str()),
            "a tie: the newest worker's"
        );
        let versions = registry.versions_live("crm__find");
        let counted: Vec<(&str, usize, bool)> = versions
            .iter()
            .map(|v| (&*v.contract, v.workers, v.offered))
            .collect();
        let mut want = vec![(old.as_str(), 2, false), (new.as_str(), 2, true)];
        want.sort();
        assert_eq!(counted, want);
        assert_eq!(registry.fleet_tools(false)[0].versions, versions);
        // Heartbeats of both versions change nothing, and keep nothing new
        // for the catalog.
        for worker in ["w1", "w2"] {
            assert_eq!(put(worker, "old"), None);
        }
        assert_eq!(put("w3", "new"), None);
        assert_eq!(offered().as_deref(), Some(new.as_str()));
        assert_eq!(registry.get("crm__find").map(|tool| tool.workers), Some(4));
        delete("w1");
        delete("w2");
        assert_eq!(offered().as_deref(), Some(new.as_str()));
        // The old version is forgotten once no worker announces it.
        let tools = registry.tools.read().unwrap();
        assert_eq!(tools["crm__find"].versions.len(), 1);
        drop(tools);
        // All gone, its queue kept: the version learned last, live with no
        // worker; the other has had none since its last worker withdrew.
        delete("w3");
        delete("w4");
        assert_eq!(offered().as_deref(), Some(new.as_str()));
        let versions = registry.versions_live("crm__find");
        assert_eq!(versions.len(), 1);
        assert_eq!(
            (&*versions[0].contract, versions[0].workers),
            (new.as_str(), 0)
        );
        assert!(versions[0].offered);
        assert_eq!(registry.version_gone_for("crm__find", &new), None);
        let gone = registry.version_gone_for("crm__find", &old).expect("gone");
        assert!(
            gone < Duration::from_secs(15),
            "since w2 withdrew: {gone:?}"
        );
        assert!(
            registry
                .version_gone_for("crm__find", "never-seen")
                .is_some()
        );
        registry.read_queue("crm__find", QueueRead::NoQueue);
        assert!(
            registry.version_gone_for("crm__find", &new).is_some(),
            "no queue"
        );
        registry.read_queue("crm__find", QueueRead::Waiting(0));
        // A rollback: the old version's workers come again, and win.
        assert_eq!(put("w5", "old"), Some(old.clone()));
        assert_eq!(offered().as_deref(), Some(old.as_str()));
        // A worker whose manifest changes is that version's newest worker.
        assert!(put("w5", "newer").is_some());
        assert_ne!(offered().as_deref(), Some(old.as_str()));
    }

    #[test]
    fn while_a_worker_that_does_not_pin_serves_a_tool_its_version_is_offered() {
        let registry = registry();
        let key = |worker: &str| names::registry_key("crm__find", worker);
        let put = |worker: &str, field: &str, pins: bool| {
            let mut announced: WorkerAnnouncement =
                serde_json::from_slice(&version(worker, field)).unwrap();
            announced.pins = pins;
            let value = serde_json::to_vec(&announced).unwrap();
            registry.apply(&key(worker), kv::Operation::Put, &value);
            announced.manifest.contract_hash()
        };
        let offered = || {
            registry
                .get("crm__find")
                .map(|tool| tool.contract.to_string())
        };
        // A worker of the release before, then three of this release with
        // a new schema: the old one runs whatever it gets, so its version
        // is the one offered.
        let old = put("w1", "old", false);
        let new = put("w2", "new", true);
        put("w3", "new", true);
        put("w4", "new", true);
        assert_eq!(offered(), Some(old));
        // It leaves: the version most workers serve.
        registry.apply(&key("w1"), kv::Operation::Delete, &[]);
        assert_eq!(offered(), Some(new));
    }

    #[test]
    fn the_catalog_version_is_offered_until_a_worker_announces_one() {
        let registry = registry();
        let remembered: WorkerAnnouncement =
            serde_json::from_slice(&version("w0", "remembered")).unwrap();
        let remembered = remembered.manifest;
        registry.remember(remembered.clone());
        registry.read_queue("crm__find", QueueRead::Waiting(0));
        let offered = || {
            registry
                .get("crm__find")
                .map(|tool| tool.contract.to_string())
        };
        assert_eq!(offered(), Some(remembered.contract_hash()));
        let key = names::registry_key("crm__find", "w1");
        registry.apply(&key, kv::Operation::Put, &version("w1", "announced"));
        assert_ne!(offered(), Some(remembered.contract_hash()));
        // The catalog, read late, does not undo an announcement.
        registry.remember(remembered.clone());
        assert_ne!(offered(), Some(remembered.contract_hash()));
    }

    #[test]
    fn a_tool_stands_by_its_live_workers_then_its_queue() {
        use Standing::{Gone, Offered, Withdrawn};
        // (able, unable, queued) -> standing
        let cases = [
            ((1, 0, false), Offered),
            ((1, 3, false), Offered),
            ((2, 0, true), Offered),
            ((0, 0, true), Offered), // a pool scaled to zero
            ((0, 1, true), Withdrawn),
            ((0, 2, false), Withdrawn),
            ((0, 0, false), Gone),
        ];
        for ((able, unable, queued), want) in cases {
            assert_eq!(
                standing(able, unable, queued),
                want,
                "{able} {unable} {queued}"
            );
        }
    }

    #[test]
    fn the_fleet_sees_pools_servers_unavailable_workers_and_waiting_calls() {
        let registry = registry();
        let put = |worker: &str, available: bool, pool: &str| {
            let key = names::registry_key("crm__find", worker);
            let value = announcement_from(worker, available, pool, "crm");
            registry.apply(&key, kv::Operation::Put, &value);
        };
        put("w1", true, "mcp");
        put("w2", false, "mcp");
        put("w3", false, "crm-pool");
        let listed = registry.fleet_tools(false);
        let [tool] = listed.as_slice() else {
            panic!("one tool")
        };
        assert!(tool.available);
        assert_eq!((tool.tool.workers, tool.workers_unavailable), (1, 2));
        assert_eq!(tool.pools, ["crm-pool", "mcp"]);
        assert_eq!(tool.mcp_server, "crm");
        assert_eq!(tool.calls_waiting, None, "unknown until read");

        registry.read_queue("crm__find", QueueRead::Waiting(7));
        assert_eq!(registry.fleet_tools(false)[0].calls_waiting, Some(7));
        registry.read_queue("crm__find", QueueRead::Unreadable);
        assert_eq!(registry.fleet_tools(false)[0].calls_waiting, None);
        registry.read_queue("unknown_tool", QueueRead::Waiting(1));

        // Its server down on w1 too: withdrawn, listed only when asked.
        put("w1", false, "mcp");
        assert!(registry.fleet_tools(false).is_empty());
        let withdrawn = registry.fleet_tools(true);
        assert!(!withdrawn[0].available);
        assert_eq!(
            (withdrawn[0].tool.workers, withdrawn[0].workers_unavailable),
            (0, 3)
        );
        assert!(registry.get("crm__find").is_none());

        // No live worker and no queue: gone, even when asked.
        for worker in ["w1", "w2", "w3"] {
            let key = names::registry_key("crm__find", worker);
            registry.apply(&key, kv::Operation::Delete, &[]);
        }
        registry.read_queue("crm__find", QueueRead::NoQueue);
        assert!(registry.fleet_tools(true).is_empty());
        // Its queue back (a pool scaled to zero): offered, no pool said.
        registry.read_queue("crm__find", QueueRead::Waiting(3));
        let queued = registry.fleet_tools(false);
        assert_eq!(
            (queued[0].tool.workers, queued[0].calls_waiting),
            (0, Some(3))
        );
        assert!(queued[0].pools.is_empty() && queued[0].mcp_server.is_empty());
    }

    #[test]
    fn a_job_that_names_its_tools_is_given_those_available_by_name() {
        let registry = registry();
        for tool in ["web__search", "crm__find", "crm__update"] {
            let mut announced: WorkerAnnouncement =
                serde_json::from_slice(&announcement("w1", true)).unwrap();
            announced.manifest.name = tool.to_owned();
            let value = serde_json::to_vec(&announced).unwrap();
            registry.apply(&names::registry_key(tool, "w1"), kv::Operation::Put, &value);
        }
        let named = |names: &[&str]| {
            let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
            let tools = registry.available_tools(&names);
            tools
                .iter()
                .map(|t| t.manifest.name.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            named(&["web__search", "crm__find", "unknown", "crm__find"]),
            ["crm__find", "web__search"],
            "the named ones, by name, once each; one the fleet lacks is not there"
        );
        assert_eq!(named(&[]), ["crm__find", "crm__update", "web__search"]);
    }

    #[test]
    fn a_tool_no_live_worker_can_run_is_withdrawn_though_its_queue_exists() {
        let registry = registry();
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
        assert!(registry.available_tools(&[]).is_empty());
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
