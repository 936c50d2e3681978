//! What the fleet has to do, as gauges an operator can alert on: for each
//! tool, the workers with a fresh heartbeat and the calls waiting in its
//! JetStream consumer (every [`INTERVAL`]); for each tenant and tool, the
//! calls waiting for a person's approval and the age of the oldest (every
//! [`APPROVALS_INTERVAL`], from the tenants' indexes in Redis: a parked job
//! is in no process's memory). The tools' poll also tells the registry
//! which tools have a queue, so that a tool with no live worker (a pool
//! scaled to zero) stays available while its calls can wait, and how many
//! calls wait in it, which `ListTools` tells operators and readers.
//!
//! Each tool's circuit breaker is read from Redis as often, for its gauge.
//!
//! Every replica reports the same numbers (they are the fleet's, not the
//! replica's): take `max` over replicas, never `sum`.

use std::collections::HashSet;
use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::stream::ConsumerErrorKind;
use tokio_util::sync::CancellationToken;
use toolfleet_proto::names;
use tracing::debug;

use crate::job::now_ms;
use crate::metrics;
use crate::registry::{QueueRead, RegistryHandle};
use crate::store::JobStore;

/// How often the tools' gauges are refreshed.
pub(crate) const INTERVAL: Duration = Duration::from_secs(5);

/// How often the approvals' gauges are refreshed. A refresh costs a few
/// commands per tenant, however many calls wait (docs/performance.md), and
/// one step of the slow heal of their indexes.
pub(crate) const APPROVALS_INTERVAL: Duration = Duration::from_secs(5);

/// Refreshes the gauges until `stop`.
pub(crate) async fn run(js: jetstream::Context, registry: RegistryHandle, stop: CancellationToken) {
    let mut tick = tokio::time::interval(INTERVAL);
    // The (tool, version) series reported last time: one no longer live is
    // set to 0 once, so that a version that left reads 0, not its last count.
    let mut versions_reported: HashSet<(String, String)> = HashSet::new();
    loop {
        // Biased: a stop seen with a tick due still stops.
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        // Every tool ever announced stays reported, with 0 workers once
        // theirs are gone: "no live worker for a tool" is a series at 0,
        // not a missing series.
        for name in registry.known_tools() {
            // Each request raced with the stop: with NATS gone or hung, one
            // waits out its request timeout, which must not hold the drain.
            let read = tokio::select! {
                biased;
                () = stop.cancelled() => return,
                read = waiting_calls(&js, &name) => read,
            };
            let queue = match read {
                Ok(waiting) => {
                    metrics::tool_calls_waiting(&name, waiting);
                    QueueRead::Waiting(waiting)
                }
                Err(Backlog::NoQueue) => QueueRead::NoQueue,
                // A NATS user without CONSUMER.INFO on it, or an outage:
                // the gauge and whether the queue exists stay as they
                // were; ListTools says the count is unknown.
                Err(Backlog::Unknown(err)) => {
                    debug!(tool = %name, error = %err, "cannot read the tool's backlog");
                    QueueRead::Unreadable
                }
            };
            registry.read_queue(&name, queue);
            let workers = registry.get(&name).map_or(0, |t| t.workers);
            metrics::tool_workers(&name, workers);
        }
        report_versions(&registry, &mut versions_reported);
    }
}

/// Sets `toolfleet_tool_version_workers` of every live version of every
/// known tool, and to 0 those `reported` last time that are no longer
/// live; `reported` becomes this time's.
fn report_versions(registry: &RegistryHandle, reported: &mut HashSet<(String, String)>) {
    let mut now = HashSet::new();
    for name in registry.known_tools() {
        for version in registry.versions_live(&name) {
            let label = metrics::version_label(&version.contract).to_owned();
            metrics::tool_version_workers(&name, &label, version.workers);
            now.insert((name.clone(), label));
        }
    }
    for (tool, version) in reported.difference(&now) {
        metrics::tool_version_workers(tool, version, 0);
    }
    *reported = now;
}

/// Refreshes the tools' breaker gauges until `stop`, every [`INTERVAL`],
/// from Redis: 1 while a tool's breaker refuses its calls. The fleet's
/// state, so every replica reports the same, also one that plays no turn.
pub(crate) async fn run_breakers(
    store: JobStore,
    registry: RegistryHandle,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(INTERVAL);
    loop {
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let names = registry.known_tools();
        let tools: Vec<&str> = names.iter().map(String::as_str).collect();
        let read = tokio::select! {
            biased;
            () = stop.cancelled() => return,
            read = store.breakers(&tools) => read,
        };
        match read {
            Ok(states) => {
                let now = now_ms();
                for (tool, state) in states {
                    metrics::tool_breaker(&tool, state.unavailable(now).is_some());
                }
            }
            Err(err) => debug!(error = %err, "cannot read the tools' breakers"),
        }
    }
}

/// Refreshes the approvals' gauges until `stop`.
pub(crate) async fn run_approvals(store: JobStore, stop: CancellationToken) {
    let mut tick = tokio::time::interval(APPROVALS_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Every tenant and tool reported once stays reported, at 0 once its
    // calls are decided: "nothing pending" is a series at 0.
    let mut reported: HashSet<(String, String)> = HashSet::new();
    let mut heal = None;
    loop {
        if stop.run_until_cancelled(tick.tick()).await.is_none() {
            return;
        }
        match stop
            .run_until_cancelled(store.heal_pending(heal.clone()))
            .await
        {
            None => return,
            Some(Ok(next)) => heal = next,
            Some(Err(err)) => debug!(error = %err, "cannot heal the pending approvals' indexes"),
        }
        let tally = match stop.run_until_cancelled(store.pending_tally()).await {
            None => return,
            Some(Ok(tally)) => tally,
            // An outage: the gauges stay as they were.
            Some(Err(err)) => {
                debug!(error = %err, "cannot read the pending approvals");
                continue;
            }
        };
        let now = now_ms();
        let mut zero = reported.clone();
        for pending in tally {
            let age = Duration::from_millis(now.saturating_sub(pending.oldest_held_at_ms));
            metrics::approvals_pending(&pending.tenant, &pending.tool, pending.calls, age);
            let series = (pending.tenant, pending.tool);
            zero.remove(&series);
            reported.insert(series);
        }
        for (tenant, tool) in zero {
            metrics::approvals_pending(&tenant, &tool, 0, Duration::ZERO);
        }
    }
}

enum Backlog {
    /// The tool has no consumer: no setup made one, or it was deleted.
    NoQueue,
    Unknown(anyhow::Error),
}

/// Calls published for `tool` and not yet delivered to any worker.
async fn waiting_calls(js: &jetstream::Context, tool: &str) -> Result<u64, Backlog> {
    let mut consumer: jetstream::consumer::PullConsumer = js
        .get_consumer_from_stream(names::call_consumer(tool), names::CALL_STREAM)
        .await
        .map_err(|err| match err.kind() {
            ConsumerErrorKind::JetStream(e) if e.error_code() == ErrorCode::CONSUMER_NOT_FOUND => {
                Backlog::NoQueue
            }
            _ => Backlog::Unknown(err.into()),
        })?;
    let info = consumer
        .info()
        .await
        .map_err(|e| Backlog::Unknown(e.into()))?;
    Ok(info.num_pending)
}
