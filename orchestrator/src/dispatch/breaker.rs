//! The tools' circuit breakers as dispatch and the runner meet them
//! (`crate::breaker` is the policy, `store/breaker.rs` the state): which
//! tools a turn leaves out, which calls are refused before their first
//! attempt (and which one probes), and what a settled call teaches its
//! tool's breaker.
//!
//! A breaker that cannot be read or written lets calls run: it protects
//! the fleet from a failing tool, and must not become a way for Redis
//! trouble to refuse every tool. Such a failure is logged.

use std::collections::{BTreeMap, HashMap};

use toolfleet_proto::manifest::READ_RESULT_TOOL;
use toolfleet_proto::{Envelope, JobEvent, WireId};
use tracing::{info, warn};

use crate::breaker::{self, BreakerOptions, Failure, Gate, Outcome, State, Tally, Unavailable};
use crate::job::{JobId, Lease, now_ms};
use crate::registry::LiveTool;
use crate::store::Attempts;

use super::{Dispatcher, PlannedCall};

/// The calls of a round its tools' breakers refuse, and why.
#[derive(Debug, Clone, Default)]
pub(crate) struct Refused(HashMap<WireId, Unavailable>);

impl Refused {
    /// Why `call`'s breaker refused it, if it did.
    pub(crate) fn why(&self, call: &PlannedCall) -> Option<Unavailable> {
        self.0.get(&call.wire_id).copied()
    }

    /// The envelope that answers `call`, if its breaker refused it.
    pub(crate) fn envelope(&self, call: &PlannedCall) -> Option<Envelope> {
        self.0
            .get(&call.wire_id)
            .map(|why| why.envelope(&call.name))
    }
}

/// A tool a job is told is unavailable ([`Dispatcher::tell_unavailable`]).
pub(crate) struct Told {
    pub tool: String,
    pub why: Unavailable,
    /// The call refused, as the job's events name it; none when a turn
    /// left the tool out.
    pub call_id: Option<String>,
}

/// The tools a turn leaves out, by name, and why.
pub(crate) type LeftOut = BTreeMap<String, Unavailable>;

/// The job's instructions with one line per tool left out, after them.
pub(crate) fn instructions(own: &str, left_out: &LeftOut) -> String {
    let lines: Vec<String> = left_out
        .iter()
        .map(|(tool, why)| why.instruction(tool))
        .collect();
    match (own.is_empty(), lines.is_empty()) {
        (_, true) => own.to_owned(),
        (true, false) => lines.join("\n"),
        (false, false) => format!("{own}\n\n{}", lines.join("\n")),
    }
}

/// The id a probe names its call by in the breaker: `<job>/<wire id>`.
fn probe_id(job_id: &JobId, call: &WireId) -> String {
    format!("{job_id}/{call}")
}

impl Dispatcher {
    /// The breaker settings of `tool` (the orchestrator's, with its live
    /// or offered manifest's own put in), if it has a breaker: never the
    /// orchestrator's own `read_result`.
    pub(crate) fn breaker_of(
        &self,
        tool: &str,
        offered: &HashMap<String, LiveTool>,
    ) -> Option<BreakerOptions> {
        if tool == READ_RESULT_TOOL || !self.breaker.enabled {
            return None;
        }
        let live = self
            .registry
            .get(tool)
            .or_else(|| offered.get(tool).cloned());
        let own = live.and_then(|tool| tool.manifest.breaker);
        Some(self.breaker.for_tool(own.as_ref())).filter(|options| options.enabled)
    }

    /// Which of `tools` their breakers keep out of a turn played now.
    pub(crate) async fn left_out(
        &self,
        tools: &[&str],
        offered: &HashMap<String, LiveTool>,
    ) -> LeftOut {
        let guarded: Vec<&str> = tools
            .iter()
            .copied()
            .filter(|tool| self.breaker_of(tool, offered).is_some())
            .collect();
        if guarded.is_empty() {
            return LeftOut::new();
        }
        let states = match self.store.breakers(&guarded).await {
            Ok(states) => states,
            Err(err) => {
                warn!(error = %err, "could not read the tools' breakers; every tool is offered");
                return LeftOut::new();
            }
        };
        let now = now_ms();
        states
            .into_iter()
            .filter_map(|(tool, state)| {
                let unavailable = state.unavailable(now);
                crate::metrics::tool_breaker(&tool, unavailable.is_some());
                unavailable.map(|why| (tool, why))
            })
            .collect()
    }

    /// Which of `calls` their tools' breakers refuse, decided before their
    /// first attempt: a call with an attempt recorded runs on under its
    /// retry policy whatever its breaker says. Where a breaker's cool-down
    /// has passed, the first call of its tool probes (the breaker goes
    /// half-open naming it) and the others are refused.
    pub(crate) async fn gate_calls(
        &self,
        job_id: &JobId,
        calls: &[PlannedCall],
        attempts: &Attempts,
        offered: &HashMap<String, LiveTool>,
    ) -> Refused {
        let fresh: Vec<(&PlannedCall, BreakerOptions)> = calls
            .iter()
            .filter(|call| !call.duplicate && attempts.last(&call.wire_id).is_none())
            .filter_map(|call| Some((call, self.breaker_of(&call.name, offered)?)))
            .collect();
        let mut tools: Vec<&str> = fresh.iter().map(|(call, _)| call.name.as_str()).collect();
        tools.sort_unstable();
        tools.dedup();
        if tools.is_empty() {
            return Refused::default();
        }
        let mut states = match self.store.breakers(&tools).await {
            Ok(states) => states,
            Err(err) => {
                warn!(error = %err, "could not read the tools' breakers; the calls run");
                return Refused::default();
            }
        };
        let now = now_ms();
        let mut refused = Refused::default();
        for (call, options) in fresh {
            let state = states.get(&call.name).cloned().unwrap_or_default();
            let probe = probe_id(job_id, &call.wire_id);
            let why = match breaker::gate(&state, &probe, now, &options) {
                Gate::Pass => None,
                Gate::Refuse(why) => Some(why),
                Gate::Probe(to) => {
                    let after = self.claim_probe(&call.name, &state, to, &options).await;
                    let why = after.unavailable(now).filter(
                        |_| !matches!(&after, State::HalfOpen { probe: p, .. } if *p == probe),
                    );
                    states.insert(call.name.clone(), after);
                    why
                }
            };
            if let Some(why) = why {
                refused.0.insert(call.wire_id.clone(), why);
            }
        }
        refused
    }

    /// Moves `tool`'s breaker from `from` to `to`, half-open with a probe;
    /// returns the state it is in then: `to`, or another replica's state
    /// (read again) when it moved first, or one that lets the call run
    /// when Redis failed.
    async fn claim_probe(
        &self,
        tool: &str,
        from: &State,
        to: State,
        options: &BreakerOptions,
    ) -> State {
        match self
            .store
            .move_breaker(tool, from, &to, options.key_ttl_ms())
            .await
        {
            Ok(true) => {
                crate::metrics::tool_breaker_moved(tool, to.name());
                info!(tool, "tool breaker half-open: one call probes");
                to
            }
            Ok(false) => match self.store.breakers(&[tool]).await {
                Ok(mut states) => states.remove(tool).unwrap_or_default(),
                Err(_) => from.clone(),
            },
            Err(err) => {
                warn!(tool, error = %err, "could not claim a tool breaker's probe; the call runs");
                State::Closed
            }
        }
    }

    /// Which calls of a round of the job of `lease` their breakers refuse
    /// ([`gate_calls`](Self::gate_calls)), each told in a
    /// `tool_unavailable` event.
    pub(super) async fn refused(
        &self,
        lease: &Lease,
        calls: &[PlannedCall],
        attempts: &Attempts,
        offered: &HashMap<String, LiveTool>,
    ) -> Refused {
        let refused = self
            .gate_calls(&lease.job_id, calls, attempts, offered)
            .await;
        let told = calls
            .iter()
            .filter_map(|call| {
                Some(Told {
                    tool: call.name.clone(),
                    why: refused.why(call)?,
                    call_id: Some(call.event_id.to_string()),
                })
            })
            .collect();
        self.tell_unavailable(lease, told).await;
        refused
    }

    /// Records a `tool_unavailable` event in the job of `lease` for each
    /// of `tools` (and the call refused, if any), in one commit. Advisory:
    /// a failure is logged.
    pub(crate) async fn tell_unavailable(&self, lease: &Lease, tools: Vec<Told>) {
        if tools.is_empty() {
            return;
        }
        let events = tools
            .into_iter()
            .map(|Told { tool, why, call_id }| JobEvent::ToolUnavailable {
                tool,
                reason: why.reason(),
                call_id,
            })
            .collect();
        if let Err(err) = self.store.record_events(lease, events).await {
            warn!(error = %err, "could not record tool_unavailable events");
        }
    }

    /// Teaches the breaker of `tool` the final `envelope` of the call
    /// `wire_id` of `job_id`, which ran (a call answered without an attempt
    /// says nothing of its tool), and moves it if the window or the probe
    /// says so.
    pub(super) async fn learn(
        &self,
        job_id: &JobId,
        (tool, wire_id): (&str, &WireId),
        envelope: &Envelope,
    ) {
        let Some(options) = self.breaker_of(tool, &HashMap::new()) else {
            return;
        };
        let failed = Failure::of(envelope).is_some_and(|kind| options.count.contains(&kind));
        let now = now_ms();
        let bucket = now / options.bucket_ms();
        let ttl_ms = options.key_ttl_ms();
        let window = match self
            .store
            .record_breaker_outcome(tool, bucket, failed, ttl_ms)
            .await
        {
            Ok(window) => window,
            Err(err) => {
                warn!(tool, error = %err, "could not record a call's outcome in its tool's breaker");
                return;
            }
        };
        let tally = Tally::of(&window.calls, &window.failed, bucket);
        let call = probe_id(job_id, wire_id);
        let outcome = Outcome {
            call: &call,
            failed,
        };
        let Some(to) = breaker::after_outcome(&window.state, tally, outcome, now, &options) else {
            return;
        };
        match self
            .store
            .move_breaker(tool, &window.state, &to, ttl_ms)
            .await
        {
            Ok(true) => {
                crate::metrics::tool_breaker_moved(tool, to.name());
                crate::metrics::tool_breaker(tool, to.unavailable(now).is_some());
                info!(
                    tool,
                    to = to.name(),
                    failed = tally.failed,
                    calls = tally.calls,
                    "tool breaker moved"
                );
            }
            // Another replica moved it first: its move stands.
            Ok(false) => {}
            Err(err) => warn!(tool, error = %err, "could not move a tool's breaker"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_instructions_end_with_a_line_per_tool_left_out() {
        let why = Unavailable {
            failed: 10,
            calls: 10,
        };
        let left_out = LeftOut::from([("fail".to_owned(), why), ("b".to_owned(), why)]);
        assert_eq!(instructions("Be brief.", &LeftOut::new()), "Be brief.");
        assert_eq!(
            instructions("Be brief.", &left_out),
            "Be brief.\n\n\
             The tool b is unavailable for now (10 of its last 10 calls failed); do not call it.\n\
             The tool fail is unavailable for now (10 of its last 10 calls failed); do not call it."
        );
        assert!(instructions("", &left_out).starts_with("The tool b "));
    }
}
