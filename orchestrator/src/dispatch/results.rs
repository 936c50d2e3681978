//! Group commit of a round's results. A call that settles while another
//! call's result is being written joins the next commit instead of queueing
//! a commit of its own. And while some of a parallel round's calls have not
//! settled, a settled result lingers a little for them (`linger`, from the
//! first result waiting): the round's last result is committed at once,
//! with every result still waiting, so the round ends no later, and a round
//! of n calls that settle close together is one Redis commit (and one
//! wake-up of its watchers) instead of up to n. Each caller still returns
//! only once the commit that holds its result is stored: nothing is
//! answered before Redis has it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::{Notify, oneshot};
use toolfleet_proto::{Envelope, EventId, WireId};

use super::RoundError;
use crate::store::{self, SettledCall};

/// A call's final envelope, waiting for its commit.
pub(super) struct Settled {
    pub(super) event_id: EventId,
    pub(super) wire_id: WireId,
    pub(super) name: String,
    pub(super) attempts: u32,
    pub(super) round_trip: Option<Duration>,
    pub(super) worked: Option<Duration>,
    pub(super) ran_on: Option<Arc<str>>,
    pub(super) envelope: Envelope,
    /// Who produced the envelope when no worker did ([`SettledCall::source`]).
    pub(super) source: Option<&'static str>,
    /// The stored result as the worker's reply carried it, not read from
    /// Redis: the commit checks it ([`SettledCall::unchecked`]).
    pub(super) unchecked: Option<String>,
    /// The budget that refused the call ([`SettledCall::budget_exceeded`]).
    pub(super) budget_exceeded: Option<crate::budget::Limit>,
}

impl Settled {
    pub(super) fn as_call(&self) -> SettledCall<'_> {
        SettledCall {
            call_id: &self.event_id,
            wire_id: &self.wire_id,
            name: &self.name,
            attempts: self.attempts,
            round_trip: self.round_trip,
            worked: self.worked,
            ran_on: self.ran_on.as_deref(),
            envelope: &self.envelope,
            source: self.source,
            unchecked: self.unchecked.as_deref(),
            budget_exceeded: self.budget_exceeded,
        }
    }
}

type Waiting<T> = (T, oneshot::Sender<Result<(), store::Error>>);

/// Commits of one round's results (`T`), grouped.
pub(super) struct GroupCommit<T> {
    /// Results not yet taken by a commit, in the order they settled.
    queue: Mutex<Vec<Waiting<T>>>,
    /// Held while a commit is in flight or lingering: one at a time, so
    /// the next takes everything that settled meanwhile.
    writing: tokio::sync::Mutex<()>,
    /// Results still to come that are worth lingering for: the parallel
    /// calls being driven that have not recorded theirs yet.
    coming: AtomicUsize,
    /// Told of every result queued, for a commit that lingers.
    queued: Notify,
    /// Longest a queued result waits for the ones still coming.
    linger: Duration,
}

impl<T> GroupCommit<T> {
    /// A group whose results are committed as they settle, until
    /// [`expect`](Self::expect) says more are coming.
    pub(super) fn new(linger: Duration) -> Self {
        Self {
            queue: Mutex::new(Vec::new()),
            writing: tokio::sync::Mutex::new(()),
            coming: AtomicUsize::new(0),
            queued: Notify::new(),
            linger,
        }
    }

    /// Says that `results` more are coming, each to be recorded once: a
    /// parallel round's calls, driven at once. Calls driven one after the
    /// other are not worth waiting for, and are not counted.
    pub(super) fn expect(&self, results: usize) {
        self.coming.fetch_add(results, Ordering::Relaxed);
    }

    /// Says that one result [`expect`](Self::expect)ed will not come: its
    /// call waits for an operator's verdict. The others no longer linger
    /// for it.
    pub(super) fn not_coming(&self) {
        let _ = self
            .coming
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        self.queued.notify_one();
    }

    /// Records `result` and returns once it is stored: by `commit` of a
    /// batch that starts with it, or by another caller's commit that took
    /// it along. `commit` gets the batch in the order the results came.
    ///
    /// # Errors
    ///
    /// The error of the commit that took `result`; or
    /// [`RoundError::Interrupted`] when that commit's caller was dropped
    /// before it finished (the round ended).
    pub(super) async fn record<F, Fut>(&self, result: T, commit: F) -> Result<(), RoundError>
    where
        F: FnOnce(Vec<T>) -> Fut,
        Fut: Future<Output = Result<(), store::Error>>,
    {
        let (done, stored) = oneshot::channel();
        self.lock_queue().push((result, done));
        // Saturating: a result recorded again (its first commit was refused)
        // was counted once.
        let _ = self
            .coming
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        self.queued.notify_one();
        {
            let _writing = self.writing.lock().await;
            self.linger().await;
            // Empty when an earlier commit already took this result.
            let batch = std::mem::take(&mut *self.lock_queue());
            if !batch.is_empty() {
                let (results, waiting): (Vec<T>, Vec<_>) = batch.into_iter().unzip();
                let outcome = commit(results).await;
                for done in waiting {
                    let _ = done.send(outcome.clone());
                }
            }
        }
        match stored.await {
            Ok(outcome) => Ok(outcome?),
            Err(_) => Err(RoundError::Interrupted),
        }
    }

    /// Waits, up to `linger`, while results are queued and more are
    /// coming; returns at once when none are, or when `linger` is zero
    /// (a timer, even an expired one, would wait for the timer wheel's
    /// next tick, about a millisecond).
    async fn linger(&self) {
        if self.linger.is_zero() {
            return;
        }
        let until = tokio::time::Instant::now() + self.linger;
        while self.coming.load(Ordering::Relaxed) > 0 && !self.lock_queue().is_empty() {
            // `notify_one` keeps a permit when nobody waits: a result
            // queued between the check and this wait is not missed.
            if tokio::time::timeout_at(until, self.queued.notified())
                .await
                .is_err()
            {
                return;
            }
        }
    }

    fn lock_queue(&self) -> MutexGuard<'_, Vec<Waiting<T>>> {
        // No code panics while holding it; a poisoned queue is still whole.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// Records `results` at once (as a round's parallel calls do) through a
    /// commit that takes 10 ms; returns the batches committed and what each
    /// caller got.
    async fn record_together(
        results: &[u32],
        fail: bool,
    ) -> (Vec<Vec<u32>>, Vec<Result<(), RoundError>>) {
        let group = GroupCommit::new(Duration::from_millis(100));
        let batches = Arc::new(Mutex::new(Vec::new()));
        let calls = results.iter().map(|&result| {
            let batches = Arc::clone(&batches);
            group.record(result, move |batch| async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                batches.lock().unwrap().push(batch);
                if fail {
                    Err(store::Error::LeaseLost(crate::job::JobId::new("t", 1, 2)))
                } else {
                    Ok(())
                }
            })
        });
        let outcomes = futures::future::join_all(calls).await;
        let batches = batches.lock().unwrap().clone();
        (batches, outcomes)
    }

    #[tokio::test(start_paused = true)]
    async fn results_that_settle_during_a_commit_share_the_next_one() {
        let (batches, outcomes) = record_together(&[1, 2, 3, 4], false).await;
        assert_eq!(batches, [vec![1], vec![2, 3, 4]]);
        assert!(outcomes.iter().all(Result::is_ok));
        // One result alone is one commit of one.
        assert_eq!(record_together(&[7], false).await.0, [vec![7]]);
    }

    #[tokio::test(start_paused = true)]
    async fn every_result_of_a_failed_commit_gets_its_error() {
        let (batches, outcomes) = record_together(&[1, 2, 3], true).await;
        assert_eq!(batches, [vec![1], vec![2, 3]]);
        for outcome in outcomes {
            assert!(matches!(
                outcome,
                Err(RoundError::Store(store::Error::LeaseLost(_)))
            ));
        }
    }

    /// Records `(result, after_ms)` pairs, each that long after the start,
    /// with `expected` of them announced, through a commit that takes 1 ms;
    /// returns each batch with the time (ms) its commit started.
    async fn record_at(
        results: &[(u32, u64)],
        expected: usize,
        linger_ms: u64,
    ) -> Vec<(Vec<u32>, u64)> {
        let group = GroupCommit::new(Duration::from_millis(linger_ms));
        group.expect(expected);
        let start = tokio::time::Instant::now();
        let batches = Arc::new(Mutex::new(Vec::new()));
        let calls = results.iter().map(|&(result, after_ms)| {
            let (group, batches) = (&group, Arc::clone(&batches));
            async move {
                tokio::time::sleep(Duration::from_millis(after_ms)).await;
                group
                    .record(result, move |batch| async move {
                        let at = u64::try_from(start.elapsed().as_millis()).unwrap();
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        batches.lock().unwrap().push((batch, at));
                        Ok(())
                    })
                    .await
            }
        });
        let outcomes = futures::future::join_all(calls).await;
        assert!(outcomes.iter().all(Result::is_ok));
        batches.lock().unwrap().clone()
    }

    #[tokio::test(start_paused = true)]
    async fn a_parallel_round_settling_close_together_is_one_commit_made_by_its_last_result() {
        // Three calls settle at 0, 2 and 3 ms; they linger up to 5 ms.
        let batches = record_at(&[(1, 0), (2, 2), (3, 3)], 3, 5).await;
        assert_eq!(
            batches,
            [(vec![1, 2, 3], 3)],
            "committed when the last came"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_result_lingers_no_longer_than_its_bound() {
        // The third call settles long after: the first two go without it,
        // 5 ms after the first came.
        let batches = record_at(&[(1, 0), (2, 2), (3, 50)], 3, 5).await;
        assert_eq!(batches, [(vec![1, 2], 5), (vec![3], 50)]);
    }

    #[tokio::test(start_paused = true)]
    async fn results_nobody_expects_are_committed_as_they_settle() {
        // Serial calls, and calls refused before a round is driven: no
        // lingering, whatever the bound.
        let batches = record_at(&[(1, 0), (2, 2)], 0, 100).await;
        assert_eq!(batches, [(vec![1], 0), (vec![2], 2)]);
        // Nor with a zero bound.
        let batches = record_at(&[(1, 0), (2, 2)], 2, 0).await;
        assert_eq!(batches, [(vec![1], 0), (vec![2], 2)]);
        // No lingering once every expected result came either.
        let batches = record_at(&[(1, 0), (2, 2), (3, 4)], 2, 100).await;
        assert_eq!(batches, [(vec![1, 2], 2), (vec![3], 4)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_result_whose_commit_was_dropped_is_interrupted() {
        let group = GroupCommit::new(Duration::ZERO);
        let after = |delay: Duration| {
            move |_| async move {
                tokio::time::sleep(delay).await;
                Ok(())
            }
        };
        // Boxed, so that the timeout below owns (and drops) the second.
        let mut first = Box::pin(group.record(1, after(Duration::from_millis(10))));
        let mut second = Box::pin(group.record(2, after(Duration::from_secs(60))));
        let mut third = Box::pin(group.record(3, after(Duration::ZERO)));
        // The first commits alone; the second and third wait for it.
        assert!(futures::poll!(first.as_mut()).is_pending());
        assert!(futures::poll!(second.as_mut()).is_pending());
        assert!(futures::poll!(third.as_mut()).is_pending());
        // The second's commit takes the third along, and is dropped a
        // second in: the third was never stored, and is told so.
        let second = tokio::time::timeout(Duration::from_secs(1), second);
        let (first, second, third) = tokio::join!(first, second, third);
        assert!(first.is_ok());
        assert!(second.is_err(), "the slow commit was dropped");
        assert!(matches!(third, Err(RoundError::Interrupted)));
    }
}
