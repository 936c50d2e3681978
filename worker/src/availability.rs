//! Which of a worker's tools can run now. A tool can, unless its source
//! says otherwise: an MCP server that died takes its tools down until it is
//! back (decision 0038). A tool that is down pulls no call (its calls wait
//! in its queue, or go to another worker), and is announced unavailable,
//! so that no model is offered it while no worker can run it.

use std::collections::BTreeSet;

use tokio::sync::watch;

/// The tools of this worker that are down; shared by their sources, the
/// pull loops and the announcer.
#[derive(Debug, Clone)]
pub struct Availability {
    down: watch::Sender<BTreeSet<String>>,
}

impl Default for Availability {
    fn default() -> Self {
        Self {
            down: watch::Sender::new(BTreeSet::new()),
        }
    }
}

impl Availability {
    /// Says that `tools` can run (`true`) or cannot (`false`).
    pub fn set(&self, tools: &[String], available: bool) {
        self.down.send_if_modified(|down| {
            let mut changed = false;
            for tool in tools {
                changed |= if available {
                    down.remove(tool)
                } else {
                    down.insert(tool.clone())
                };
            }
            changed
        });
    }

    /// Whether `tool` can run now.
    pub fn is_available(&self, tool: &str) -> bool {
        !self.down.borrow().contains(tool)
    }

    /// Returns once `tool` can run.
    pub async fn until_available(&self, tool: &str) {
        let mut down = self.down.subscribe();
        // The sender lives as long as `self`: the wait ends only by the tool.
        let _ = down.wait_for(|down| !down.contains(tool)).await;
    }

    /// A receiver that sees each change.
    pub(crate) fn changes(&self) -> watch::Receiver<BTreeSet<String>> {
        self.down.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_tool_is_down_until_its_source_says_it_is_back() {
        let availability = Availability::default();
        let tools = vec!["crm__find".to_owned()];
        assert!(availability.is_available("crm__find"));
        let changes = availability.changes();
        availability.set(&tools, false);
        assert!(changes.has_changed().unwrap());
        assert!(!availability.is_available("crm__find"));
        assert!(availability.is_available("calculate"));
        let waiting = tokio::spawn({
            let availability = availability.clone();
            async move { availability.until_available("crm__find").await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        availability.set(&tools, true);
        waiting.await.unwrap();
    }
}
