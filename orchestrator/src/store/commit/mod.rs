//! The commits of a run, each one Lua script fenced by the lease, one
//! module per verb: a turn and a dispatch (`turn`: [`JobStore::record_turn`],
//! [`JobStore::record_dispatch`], and a call's progress), held calls
//! (`hold`), a round's results (`results`), the end (`finish`). Each says
//! what happened; `write` turns it into the one script that stores it.

mod finish;
mod hold;
mod results;
mod turn;
mod write;

use super::*;

pub use finish::Unstored;
pub use results::SettledCall;
pub use turn::DispatchedCall;
use write::Commit;
