//! The end of a job, with what its run had not stored yet.

use crate::job::{Ending, FullResult, Item, Lease, TurnCheckpoint};

use super::*;

impl JobStore {
    /// Ends the job: its final status, answer or error, final event (with
    /// what the job `spent`, when the run knows), and the
    /// expiry of all its keys after the retention, with what the run had not
    /// stored yet (`unstored`) before them, in one commit. Nothing is written
    /// after. Then its end is counted, and the job leaves the sweeper's
    /// unfinished index.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] when another runner took the job (or it had
    /// already ended); [`Error::Redis`].
    pub async fn finish(
        &self,
        lease: &Lease,
        ending: &Ending,
        unstored: Unstored<'_>,
        spent: Option<Spend>,
    ) -> Result<(), Error> {
        let mut commit = match unstored {
            Unstored::Nothing => Commit::default(),
            Unstored::Results { items, full } => Commit {
                results: items,
                full,
                ..Commit::default()
            },
            Unstored::Turn(turn) => Commit::of_turn(turn),
        };
        commit.events.push(ending.event(spent));
        commit.status = Some(ending.status());
        commit.ending = Some(ending);
        self.commit(lease, commit).await?;
        // Only a job that did not succeed can end with calls held: a
        // model's answer comes after every call of its round was settled.
        if !matches!(ending, Ending::Succeeded(_)) {
            self.forget_held(&lease.job_id).await;
        }
        Ok(())
    }
}

/// What a run did but has not stored when it ends the job: stored by
/// [`JobStore::finish`] in the commit that ends it.
#[derive(Debug, Clone, Copy)]
pub enum Unstored<'a> {
    /// Everything is stored.
    Nothing,
    /// The results of the run's last round (no turn followed them).
    Results {
        /// Their items.
        items: &'a [Item],
        /// The whole data of those that are shaped views.
        full: &'a [FullResult],
    },
    /// The turn that ended the job, with the results before it.
    Turn(TurnCheckpoint<'a>),
}
