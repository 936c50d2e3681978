//! Step 4: settle the delivery. An envelope is stored in the ledger and the
//! stored one published; an abandoned call's claim is released; and the
//! message is acked as [`ack_for`] decides.

use std::time::Duration;

use async_nats::jetstream::{AckKind, Message};
use async_nats::{HeaderMap, Subject};
use toolfleet_proto::envelope::StoredResult;
use toolfleet_proto::names::headers;
use toolfleet_proto::{Envelope, ToolCall, format};
use tracing::{error, warn};

use super::Executor;
use crate::ledger::Owner;

/// How a delivery ended, for the ack and the metrics.
#[derive(Debug)]
pub(super) enum Outcome {
    /// Answered (executed now, or from the stored result): ack.
    Answered,
    /// Not answered; JetStream should redeliver after `delay`.
    Retry(Duration),
    /// The message is not one this worker may ever answer (undecodable, not
    /// its tool's, or its stored result is another call's): terminate it.
    Rejected,
}

/// The one conversion from how a delivery ended to its JetStream ack.
pub(super) fn ack_for(outcome: Outcome) -> AckKind {
    match outcome {
        Outcome::Answered => AckKind::Ack,
        Outcome::Retry(delay) => AckKind::Nak(Some(delay)),
        Outcome::Rejected => AckKind::Term,
    }
}

/// Acks `message` as `outcome` says.
pub(super) async fn acknowledge(message: &Message, outcome: Outcome) {
    if let Err(err) = message.ack_with(ack_for(outcome)).await {
        // Without the ack JetStream redelivers, and the ledger answers the
        // redelivery from the stored result: nothing runs twice.
        warn!(error = %err, "ack failed; the call will be redelivered");
    }
}

impl Executor {
    /// Stores `envelope` as the attempt's result, with the time the worker
    /// `worked` on it and the version of its tool it `ran_on` (if it ran),
    /// and publishes what is stored.
    pub(super) async fn settle(
        &self,
        call: &ToolCall,
        owner: &Owner,
        envelope: &Envelope,
        (worked, ran_on): (Duration, Option<&str>),
    ) -> Outcome {
        let record = StoredResult::new(call, envelope.clone()).worked(worked);
        let record = match ran_on {
            Some(contract) => record.ran_on(contract),
            None => record,
        };
        let record = record.to_json();
        let stored = match self.ledger.complete(call, owner, &record).await {
            Ok(stored) => stored,
            Err(err) => {
                // The result is not durable: hand the call back rather than
                // answer with something a redelivery might contradict.
                warn!(error = %err, "could not store the result; call handed back");
                return Outcome::Retry(Duration::from_secs(1));
            }
        };
        // Another execution's result, stored first, is the answer.
        let dedup_hit = stored != record;
        self.reply_with(call, &stored, dedup_hit).await
    }

    /// Publishes the result the ledger already held for this attempt.
    pub(super) async fn reply_stored(&self, call: &ToolCall, stored: String) -> Outcome {
        self.reply_with(call, &stored, true).await
    }

    /// Replies with the stored record `stored`, as Redis holds it (the
    /// orchestrator may take it without a read, and checks it against Redis
    /// when it records the result), if it answers `call`. One that answers
    /// another call with the same ids (other tool or arguments: a forged
    /// call got there first) is never sent as this call's answer; the
    /// delivery ends, and the orchestrator, which checks the record too,
    /// tries another attempt.
    async fn reply_with(&self, call: &ToolCall, stored: &str, dedup_hit: bool) -> Outcome {
        match StoredResult::read(stored, &call.tool, &call.arguments) {
            Ok(record) if let Err(unreadable) = record.format() => {
                // Never answered as if this release knew it: a newer worker
                // stored it, and a newer worker answers from it.
                error!(error = %unreadable, "the stored result of this attempt is in a newer format; handed back");
                Outcome::Retry(super::pin::NEWER_FORMAT_WAIT)
            }
            Ok(record) if record.answers(&call.tool, &call.arguments) => {
                self.reply(call, stored.as_bytes().to_vec(), dedup_hit)
                    .await;
                Outcome::Answered
            }
            _ => {
                error!(
                    "the stored result of this attempt answers another call; not answered from it"
                );
                crate::metrics::call_rejected("stored_result");
                Outcome::Rejected
            }
        }
    }

    /// Releases the claim of a call handed back unfinished (the drain
    /// abandoned it, or its probe must ask again), so that its redelivery
    /// after `delay` can run it without waiting out the lease. A released
    /// claim is not a death: it does not count toward `max_deliveries`.
    pub(super) async fn hand_back(
        &self,
        call: &ToolCall,
        owner: &Owner,
        delay: Duration,
    ) -> Outcome {
        if let Err(err) = self.ledger.release(call, owner).await {
            warn!(error = %err, "could not release the claim; redelivery waits for its lease");
        }
        Outcome::Retry(delay)
    }

    async fn reply(&self, call: &ToolCall, stored: Vec<u8>, dedup_hit: bool) {
        let Some(reply_to) = &call.reply_to else {
            return;
        };
        let mut headers = HeaderMap::new();
        if let Some(format) = format::written() {
            headers.insert(headers::FORMAT, format);
        }
        headers.insert(headers::JOB_ID, call.job_id.as_str());
        headers.insert(headers::CALL_ID, call.call_id.as_str());
        headers.insert(headers::ATTEMPT, call.attempt.to_string().as_str());
        headers.insert(headers::TOOL, call.tool.as_str());
        if dedup_hit {
            headers.insert(headers::DEDUP_HIT, "true");
        }
        let subject = Subject::from(reply_to.as_str());
        if let Err(err) = self
            .nats
            .publish_with_headers(subject, headers, stored.into())
            .await
        {
            // Redis holds the result; the orchestrator reads it from there.
            warn!(error = %err, "could not publish the result");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_maps_to_its_ack() {
        // AckKind has no PartialEq; its Debug form names the kind and delay.
        let cases = [
            (Outcome::Answered, AckKind::Ack),
            (
                Outcome::Retry(Duration::from_secs(1)),
                AckKind::Nak(Some(Duration::from_secs(1))),
            ),
            (
                Outcome::Retry(Duration::ZERO),
                AckKind::Nak(Some(Duration::ZERO)),
            ),
            (Outcome::Rejected, AckKind::Term),
        ];
        for (outcome, expected) in cases {
            let what = format!("{outcome:?}");
            assert_eq!(
                format!("{:?}", ack_for(outcome)),
                format!("{expected:?}"),
                "{what}"
            );
        }
    }
}
