//! The publisher of a streamed turn's deltas: the provider's sink fills a
//! queue without waiting, and a task of its own passes each delta to the
//! job's watchers ([`Live`]: in this process directly, in the others over
//! NATS), numbered, and answers the asks of other replicas'
//! watchers that joined in the middle of the turn with the turn so far.
//! Only a streamed job's turns have one, so a job that does not stream
//! costs nothing here.

use tokio::sync::mpsc;

use crate::job::{DeltaPiece, JobId, TurnDelta};
use crate::live::Live;
use crate::model::Delta;

/// Deltas of one turn waiting to be passed on; past it, a delta is dropped
/// (the checkpointed turn still says everything).
const QUEUED: usize = 1024;

/// The next message of the asks' subscription; pending without one.
async fn next_ask(asks: &mut Option<async_nats::Subscriber>) -> Option<async_nats::Message> {
    use futures::StreamExt as _;
    match asks {
        Some(asks) => asks.next().await,
        None => std::future::pending().await,
    }
}

/// Publishes one streamed turn's deltas until finished.
pub(super) struct TurnDeltas {
    queue: mpsc::Sender<Delta>,
    /// Done once the queue is closed and every delta was passed on.
    publishing: tokio::task::JoinHandle<()>,
}

impl TurnDeltas {
    /// Publishes the deltas of `turn` of `job_id`, asked by the run of
    /// lease `epoch`.
    pub(super) fn start(live: Live, job_id: &JobId, turn: u32, epoch: u64) -> Self {
        let (queue, mut deltas) = mpsc::channel::<Delta>(QUEUED);
        let job_id = job_id.to_owned();
        let publishing = tokio::spawn(async move {
            // Without it, joiners elsewhere get the live deltas only.
            let mut asks = live.asks(&job_id).await.ok();
            let mut seq = 0;
            loop {
                let delta = tokio::select! {
                    biased;
                    delta = deltas.recv() => delta,
                    Some(ask) = next_ask(&mut asks) => {
                        live.answer_ask(&job_id, &ask).await;
                        continue;
                    }
                };
                let Some(delta) = delta else { break };
                let piece = match delta {
                    Delta::Text(text) => DeltaPiece::Text(text),
                    Delta::ToolCall { index, name } => DeltaPiece::ToolCall { index, name },
                    Delta::Restart => DeltaPiece::Restart,
                };
                let delta = TurnDelta {
                    turn,
                    epoch,
                    seq,
                    piece,
                };
                seq += 1;
                live.pass_on_delta(&job_id, &delta).await;
            }
            live.end_stream(&job_id);
        });
        Self { queue, publishing }
    }

    /// Hands `delta` over without waiting; dropped when the queue is full.
    pub(super) fn send(&self, delta: Delta) {
        let _ = self.queue.try_send(delta);
    }

    /// Waits, for at most a second, until every delta was passed on: the
    /// turn's checkpoint, which makes them stale, comes after them.
    pub(super) async fn finish(self) {
        let Self { queue, publishing } = self;
        drop(queue);
        let _ = tokio::time::timeout(std::time::Duration::from_secs(1), publishing).await;
    }
}
