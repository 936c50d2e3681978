//! What the fleet has to do, as gauges an operator can alert on, refreshed
//! every [`INTERVAL`]: for each tool, the workers with a fresh heartbeat
//! and the calls waiting in its JetStream consumer.
//!
//! Every replica reports the same numbers (they are the fleet's, not the
//! replica's): take `max` over replicas, never `sum`.

use std::collections::BTreeSet;
use std::time::Duration;

use async_nats::jetstream;
use tokio_util::sync::CancellationToken;
use toolfleet_proto::names;
use tracing::debug;

use crate::metrics;
use crate::registry::RegistryHandle;

/// How often the gauges are refreshed.
pub(crate) const INTERVAL: Duration = Duration::from_secs(5);

/// Refreshes the gauges until `stop`.
pub(crate) async fn run(js: jetstream::Context, registry: RegistryHandle, stop: CancellationToken) {
    // Tools seen once stay reported, with 0 workers once theirs are gone:
    // "no live worker for a tool" is a series at 0, not a missing series.
    let mut seen = BTreeSet::new();
    let mut tick = tokio::time::interval(INTERVAL);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let live = registry.live_tools();
        for tool in &live {
            seen.insert(tool.manifest.name.clone());
        }
        for name in &seen {
            let workers = live
                .iter()
                .find(|t| &t.manifest.name == name)
                .map_or(0, |t| t.workers);
            metrics::tool_workers(name, workers);
            match waiting_calls(&js, name).await {
                Ok(waiting) => metrics::tool_calls_waiting(name, waiting),
                // A consumer not set up yet, or a NATS user without
                // CONSUMER.INFO on it: the gauge keeps its last value.
                Err(err) => debug!(tool = %name, error = %err, "cannot read the tool's backlog"),
            }
        }
    }
}

/// Calls published for `tool` and not yet delivered to any worker.
async fn waiting_calls(js: &jetstream::Context, tool: &str) -> anyhow::Result<u64> {
    let mut consumer: jetstream::consumer::PullConsumer = js
        .get_consumer_from_stream(names::call_consumer(tool), names::CALL_STREAM)
        .await?;
    Ok(consumer.info().await?.num_pending)
}
