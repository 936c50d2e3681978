//! The tools a worker serves, while it serves them.
//!
//! Most are fixed: the toolbox's, loaded when the worker starts. Others
//! come from a source that changes them while the worker runs: an MCP
//! server starts late, dies, comes back, and adds, changes or removes tools
//! (`notifications/tools/list_changed`, decision 0038). Such a tool is
//! *declared* before the worker runs, so that it has its consumer and pull
//! loop from the start (under least privilege nothing else can be served:
//! docs/tools/mcp.md), and its source *offers* it (with its manifest, new or
//! changed) and *takes it down*.
//!
//! A tool that is down pulls no call: its calls wait in its queue, or go to
//! a worker that can run them. It is announced unavailable, so that no
//! model is offered it while no worker can run it. A tool taken down keeps
//! its last implementation: a call pulled just before goes to its source,
//! which answers what it answers.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use toolfleet_proto::ToolManifest;
use toolfleet_proto::manifest::is_valid_tool_name;

use crate::tool::{ErasedTool, Tool};

/// What the configuration makes of a tool's manifest (its timeout and
/// effects, `runtime.tool_timeouts` and `runtime.tool_effects`).
pub(crate) type Configure = dyn Fn(ToolManifest) -> ToolManifest + Send + Sync;

/// Why a tool cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum Unservable {
    /// Its name is not `^[a-zA-Z0-9_-]{1,64}$`.
    #[error("invalid tool name {0:?}: use 1 to 64 letters, digits, '_' or '-'")]
    Name(String),
    /// Its schema does not compile.
    #[error(transparent)]
    Schema(#[from] SchemaError),
    /// Its manifest, as configured, is one the orchestrators would ignore
    /// ([`ToolManifest::check`]): a limit out of its bounds, a cache TTL
    /// on a tool that changes things.
    #[error(
        "tool {tool}: {why} (check its runtime.tool_* keys and, for an MCP tool, its [[mcp.servers]] entry)"
    )]
    Manifest {
        /// The tool.
        tool: String,
        /// What is wrong.
        why: String,
    },
}

/// A tool ready to execute: its implementation, manifest and compiled schema.
pub(crate) struct LoadedTool {
    pub(crate) tool: Arc<dyn ErasedTool>,
    pub(crate) manifest: ToolManifest,
    pub(crate) validator: jsonschema::Validator,
    pub(crate) timeout: Duration,
    /// The manifest's contract hash: the version of the tool this worker
    /// runs, computed once; calls pinned to another are handed back.
    pub(crate) contract: String,
}

/// A manifest whose JSON Schema does not compile.
#[derive(Debug, thiserror::Error)]
#[error("the JSON Schema of tool {tool} is invalid: {message}")]
pub struct SchemaError {
    /// The tool.
    pub tool: String,
    /// What the validator said.
    pub message: String,
}

impl LoadedTool {
    /// `tool` with the overrides `configure` makes of its manifest, its
    /// schema compiled once, so each call only validates.
    pub(crate) fn load(
        tool: Arc<dyn ErasedTool>,
        configure: &Configure,
    ) -> Result<Self, SchemaError> {
        let manifest = configure(tool.manifest());
        let validator =
            jsonschema::validator_for(&manifest.parameters).map_err(|e| SchemaError {
                tool: manifest.name.clone(),
                message: e.to_string(),
            })?;
        let timeout = Duration::from_millis(manifest.timeout_ms.max(1));
        Ok(Self {
            tool,
            contract: manifest.contract_hash(),
            manifest,
            validator,
            timeout,
        })
    }
}

/// The tools of one worker process, shared by their sources, the pull
/// loops, the executor and the announcer. Cheap to clone.
#[derive(Clone)]
pub struct ToolSet {
    slots: watch::Sender<HashMap<String, Slot>>,
    /// Each tool's overrides.
    configure: Arc<Configure>,
}

/// One tool's place in the set.
#[derive(Clone, Default)]
pub(crate) struct Slot {
    /// Its implementation, once offered.
    tool: Option<Arc<LoadedTool>>,
    /// Whether it can run now.
    up: bool,
    /// The MCP server it comes from (its `[[mcp.servers]]` name); empty for
    /// the toolbox's.
    mcp_server: String,
}

/// What the registry is told of one tool.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Announced {
    /// Its manifest, as last offered.
    pub(crate) manifest: ToolManifest,
    /// Whether it can run now.
    pub(crate) available: bool,
    /// The MCP server it comes from; empty for the toolbox's.
    pub(crate) mcp_server: String,
}

impl ToolSet {
    /// An empty set, whose tools' manifests pass through `configure`.
    pub(crate) fn new(
        configure: impl Fn(ToolManifest) -> ToolManifest + Send + Sync + 'static,
    ) -> Self {
        Self {
            slots: watch::Sender::new(HashMap::new()),
            configure: Arc::new(configure),
        }
    }

    /// Declares `name`, a tool that its source offers later: down until
    /// then. Only a tool declared before the worker runs gets a consumer.
    pub fn declare(&self, name: &str) {
        self.declare_from(name, "");
    }

    /// Declares `name` as [`declare`](Self::declare) does, a tool of the
    /// MCP server `mcp_server` (its `[[mcp.servers]]` name), which its
    /// announcements name.
    pub(crate) fn declare_from(&self, name: &str, mcp_server: &str) {
        self.slots.send_if_modified(|slots| {
            if slots.contains_key(name) {
                return false;
            }
            let slot = Slot {
                mcp_server: mcp_server.to_owned(),
                ..Slot::default()
            };
            slots.insert(name.to_owned(), slot);
            true
        });
    }

    /// Serves `tool`, up, under its manifest's name: a tool offered for the
    /// first time, again after it was down, or with a new manifest (its
    /// source changed its schema). The same manifest again changes nothing.
    ///
    /// # Errors
    ///
    /// A name or schema the worker cannot serve; the set is unchanged.
    pub fn offer(&self, tool: impl Tool) -> Result<(), Unservable> {
        let manifest = (self.configure)(Tool::manifest(&tool));
        let unchanged = self.slots.borrow().get(&manifest.name).is_some_and(|slot| {
            slot.up && slot.tool.as_ref().is_some_and(|t| t.manifest == manifest)
        });
        if unchanged {
            return Ok(());
        }
        self.insert(self.load(Arc::new(tool))?);
        Ok(())
    }

    /// Serves the tools of a toolbox, each up; their names and schemas are
    /// checked first, and none is served when one cannot be.
    pub(crate) fn insert_all(&self, tools: Vec<Arc<dyn ErasedTool>>) -> Result<(), Unservable> {
        let loaded = tools
            .into_iter()
            .map(|tool| self.load(tool))
            .collect::<Result<Vec<_>, _>>()?;
        loaded.into_iter().for_each(|tool| self.insert(tool));
        Ok(())
    }

    /// `tool` with its configured overrides, its name and schema checked.
    fn load(&self, tool: Arc<dyn ErasedTool>) -> Result<LoadedTool, Unservable> {
        let loaded = LoadedTool::load(tool, &*self.configure)?;
        let name = &loaded.manifest.name;
        if !is_valid_tool_name(name) {
            return Err(Unservable::Name(loaded.manifest.name));
        }
        if let Err(why) = loaded.manifest.check(name) {
            return Err(Unservable::Manifest {
                tool: name.clone(),
                why,
            });
        }
        Ok(loaded)
    }

    fn insert(&self, tool: LoadedTool) {
        let name = tool.manifest.name.clone();
        self.slots.send_modify(|slots| {
            let slot = slots.entry(name).or_default();
            slot.tool = Some(Arc::new(tool));
            slot.up = true;
        });
    }

    /// Takes `names` down, until their source offers them again.
    pub fn take_down(&self, names: &[String]) {
        self.slots.send_if_modified(|slots| {
            let mut changed = false;
            for name in names {
                if let Some(slot) = slots.get_mut(name) {
                    changed |= std::mem::replace(&mut slot.up, false);
                }
            }
            changed
        });
    }

    /// Whether `name` can run now.
    pub fn is_up(&self, name: &str) -> bool {
        self.slots.borrow().get(name).is_some_and(|slot| slot.up)
    }

    /// Returns once `name` can run.
    pub async fn until_up(&self, name: &str) {
        let mut slots = self.slots.subscribe();
        // The sender lives as long as `self`: the wait ends only by the tool.
        let _ = slots
            .wait_for(|slots| slots.get(name).is_some_and(|slot| slot.up))
            .await;
    }

    /// Every tool's name, declared or served, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.slots.borrow().keys().cloned().collect();
        names.sort();
        names
    }

    /// The implementation of `name`, if it was ever offered.
    pub(crate) fn get(&self, name: &str) -> Option<Arc<LoadedTool>> {
        self.slots.borrow().get(name)?.tool.clone()
    }

    /// What the registry is told: the manifest of every tool ever offered,
    /// whether it can run now and where it comes from, by name.
    pub(crate) fn announced(&self) -> Vec<Announced> {
        let slots = self.slots.borrow();
        let mut announced: Vec<_> = slots
            .values()
            .filter_map(|slot| {
                Some(Announced {
                    manifest: slot.tool.as_ref()?.manifest.clone(),
                    available: slot.up,
                    mcp_server: slot.mcp_server.clone(),
                })
            })
            .collect();
        announced.sort_by(|a, b| a.manifest.name.cmp(&b.manifest.name));
        announced
    }

    /// A receiver that sees each change.
    pub(crate) fn changes(&self) -> watch::Receiver<HashMap<String, Slot>> {
        self.slots.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::tool::{ToolContext, ToolError};

    /// A tool whose description says which version of it this is.
    struct Versioned(&'static str);

    impl Tool for Versioned {
        fn manifest(&self) -> ToolManifest {
            ToolManifest::new("crm__find", self.0, json!({"type": "object"}))
        }

        async fn call(&self, _args: Value, _ctx: ToolContext) -> Result<Value, ToolError> {
            Ok(json!(self.0))
        }
    }

    #[tokio::test]
    async fn a_declared_tool_is_down_until_offered_and_keeps_its_last_version_when_taken_down() {
        let set = ToolSet::new(|manifest| manifest);
        set.declare_from("crm__find", "crm");
        assert_eq!(set.names(), ["crm__find"]);
        assert!(!set.is_up("crm__find"));
        assert!(set.get("crm__find").is_none());
        assert!(set.announced().is_empty(), "nothing to announce yet");

        let waiting = tokio::spawn({
            let set = set.clone();
            async move { set.until_up("crm__find").await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        let mut changes = set.changes();
        changes.mark_unchanged();
        set.offer(Versioned("v1")).unwrap();
        waiting.await.unwrap();
        assert!(changes.has_changed().unwrap());
        assert_eq!(set.announced()[0].manifest.description, "v1");
        assert!(set.announced()[0].available);
        assert_eq!(
            set.announced()[0].mcp_server,
            "crm",
            "its server, as declared"
        );

        // The same manifest again is no change (no announcement).
        changes.mark_unchanged();
        set.offer(Versioned("v1")).unwrap();
        assert!(!changes.has_changed().unwrap());
        // A changed one is.
        set.offer(Versioned("v2")).unwrap();
        assert!(changes.has_changed().unwrap());
        assert_eq!(set.get("crm__find").unwrap().manifest.description, "v2");

        changes.mark_unchanged();
        set.take_down(&["crm__find".to_owned(), "unknown".to_owned()]);
        assert!(changes.has_changed().unwrap());
        assert!(!set.is_up("crm__find"));
        assert_eq!(
            set.announced(),
            [Announced {
                manifest: set.get("crm__find").unwrap().manifest.clone(),
                available: false,
                mcp_server: "crm".into(),
            }]
        );
        // Again down: no change.
        changes.mark_unchanged();
        set.take_down(&["crm__find".to_owned()]);
        assert!(!changes.has_changed().unwrap());
        // Offered again, the same manifest: up.
        set.offer(Versioned("v2")).unwrap();
        assert!(set.is_up("crm__find"));
    }

    #[test]
    fn a_manifest_the_orchestrators_would_ignore_is_not_served() {
        use std::time::Duration;
        // A cache TTL on a tool that is not read-only (`Versioned` says
        // nothing of its effects: not_idempotent).
        let cached = ToolSet::new(|manifest| manifest.with_cache_ttl(Duration::from_secs(60)));
        let refused = cached.offer(Versioned("v1")).unwrap_err().to_string();
        assert!(
            refused.contains("tool crm__find: cache_ttl_ms: only a read_only tool's results"),
            "{refused}"
        );
        assert!(cached.get("crm__find").is_none());
        let read_only = ToolSet::new(|manifest| {
            manifest
                .with_effects(toolfleet_proto::Effects::ReadOnly)
                .with_cache_ttl(Duration::from_secs(60))
        });
        read_only
            .offer(Versioned("v1"))
            .expect("a read-only tool may be cached");
    }
}
