//! Step 0, second half: is the call pinned to the version of its tool that
//! this worker runs? A call carries the contract hash of the manifest its
//! model was shown ([`TOOL_VERSION`](names::headers::TOOL_VERSION)); a
//! worker that runs another version hands it back, unclaimed and
//! unanswered, for a worker of its version (decision 0058). The ledger is
//! not touched, so a hand-back is never a death that counts toward
//! `runtime.max_deliveries`.
//!
//! All of a tool's workers pull from its one queue, so while two versions
//! are live a call may reach a worker of the other first. Each hand-back
//! waits twice as long as the one before, up to [`LONGEST`]: a call whose
//! version has a live worker reaches it in a few tens of milliseconds, and
//! one whose version has none costs one delivery every [`LONGEST`], until
//! the orchestrator retires it: a notice marked
//! [`VERSION_GONE`](names::headers::VERSION_GONE), pinned to no version,
//! which the worker that gets it answers [`version_gone`] in the ledger.
//! From its [`ASK_LEDGER_FROM`]th delivery on, a call pinned elsewhere is
//! looked up in the ledger before it is handed back again, and dropped
//! once it has a result.
//!
//! A worker that plays the release before
//! ([`release`](toolfleet_proto::release)) knows neither pins nor notices:
//! it runs every call of its tool, as that release did.

use std::time::Duration;

use async_nats::jetstream::Message;
use toolfleet_proto::{Envelope, ErrorCode, format, names};

use super::LoadedTool;

/// The `reason` of `toolfleet_worker_calls_handed_back_total` for a call
/// pinned to another version of its tool.
pub(super) const OTHER_VERSION: &str = "other_version";

/// The `reason` of `toolfleet_worker_calls_handed_back_total` for a call
/// message in a format this release does not read (decision 0059).
pub(super) const NEWER_FORMAT: &str = "newer_format";

/// How long a call in a format this worker does not read waits before it
/// is delivered again, to a worker that may read it.
pub(super) const NEWER_FORMAT_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether this worker reads `message`'s format
/// ([`FORMAT`](names::headers::FORMAT)).
///
/// # Errors
///
/// The format it says, when this release does not read it.
pub(super) fn readable(message: &Message) -> Result<u32, format::Unreadable> {
    let marker = message
        .headers
        .as_ref()
        .and_then(|headers| headers.get(names::headers::FORMAT))
        .map(|value| value.as_str());
    format::read("a call", marker)
}

/// The wait after a first delivery to a worker of another version.
const FIRST: Duration = Duration::from_millis(10);
/// The longest wait between two deliveries of a call pinned elsewhere.
const LONGEST: Duration = Duration::from_secs(2);

/// The delivery of a call pinned elsewhere from which the ledger is asked
/// whether it has a result: a few hand-backs in, when it has waited about
/// 70 ms (a call whose version is live has found a worker of it by then).
const ASK_LEDGER_FROM: i64 = 4;

/// How long to wait before `message`'s call, of `tool`, is delivered
/// again, when it is pinned to a version of `tool` this worker does not
/// run; `None` when it is this worker's to run.
pub(super) fn hand_back(tool: &LoadedTool, message: &Message) -> Option<Duration> {
    let pinned = message
        .headers
        .as_ref()
        .and_then(|headers| headers.get(names::headers::TOOL_VERSION))
        .map(|value| value.as_str());
    if toolfleet_proto::release::is_previous() || !pinned_elsewhere(&tool.contract, pinned) {
        return None;
    }
    let delivered = message.info().map_or(1, |info| info.delivered);
    Some(wait_after(delivered))
}

/// Whether `message`, pinned elsewhere, has been delivered often enough
/// that its call may have been answered meanwhile (retired, or run by a
/// worker of its version): the ledger is asked before it is handed back.
pub(super) fn ask_ledger(message: &Message) -> bool {
    message
        .info()
        .is_ok_and(|info| info.delivered >= ASK_LEDGER_FROM)
}

/// Whether `message` retires its call: its version is gone.
pub(super) fn is_version_gone(message: &Message) -> bool {
    !toolfleet_proto::release::is_previous()
        && message
            .headers
            .as_ref()
            .and_then(|headers| headers.get(names::headers::VERSION_GONE))
            .is_some_and(|value| value.as_str() == "1")
}

/// The answer to a call retired because the version of its tool it was
/// made for is gone; `started`: an earlier execution of it began (on a
/// worker of its version: it marked its start, or saved a checkpoint) and
/// left no result, so its effect may have happened.
pub(super) fn version_gone(tool: &str, started: bool) -> Envelope {
    let mut envelope = Envelope::terminal(
        ErrorCode::TOOL_VERSION_GONE,
        format!(
            "the version of the tool {tool} this call was made for is no longer served, \
             so the call was not run; the tool's current version is in your tool list: \
             call it again if you still need it"
        ),
    );
    if started && let Envelope::Err(body) = &mut envelope {
        body.side_effect = Some("unknown".to_owned());
        body.message = format!(
            "the version of the tool {tool} this call was made for is no longer served; an \
             earlier attempt to run it began and did not finish, so its effect may have \
             happened. Check before you call the tool again"
        );
    }
    envelope
}

/// Whether a call pinned to `pinned` (absent: not pinned) is for a worker
/// of another version than `ours`.
fn pinned_elsewhere(ours: &str, pinned: Option<&str>) -> bool {
    pinned.is_some_and(|pinned| pinned != ours)
}

/// The wait before the next delivery of a call delivered `delivered` times:
/// [`FIRST`], doubled with each delivery, at most [`LONGEST`].
fn wait_after(delivered: i64) -> Duration {
    let doublings = u32::try_from(delivered.saturating_sub(1).clamp(0, 16)).unwrap_or(16);
    FIRST.saturating_mul(1 << doublings).min(LONGEST)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_call_pinned_to_another_version_is_handed_back() {
        // (ours, the call's pin, handed back)
        let cases = [
            ("aaa", Some("aaa"), false),
            ("aaa", Some("bbb"), true),
            ("aaa", None, false), // from an orchestrator that does not pin
            ("aaa", Some(""), true),
        ];
        for (ours, pinned, want) in cases {
            assert_eq!(pinned_elsewhere(ours, pinned), want, "{ours} {pinned:?}");
        }
    }

    #[test]
    fn a_retired_call_says_whether_its_effect_may_have_happened() {
        let never_ran = version_gone("crm__update", false);
        let error = never_ran.error().expect("an error");
        assert_eq!(error.code, ErrorCode::TOOL_VERSION_GONE);
        assert!(!error.retryable);
        assert_eq!(error.side_effect, None);
        assert!(error.message.contains("was not run"), "{}", error.message);
        let began = version_gone("crm__update", true);
        let error = began.error().expect("an error");
        assert_eq!(error.side_effect.as_deref(), Some("unknown"));
        assert!(!error.message.contains("was not run"), "{}", error.message);
    }

    #[test]
    fn each_hand_back_waits_twice_as_long_up_to_two_seconds() {
        let ms = |delivered| wait_after(delivered).as_millis();
        assert_eq!(
            [0, 1, 2, 3, 8, 9, 100, i64::MAX].map(ms),
            [10, 10, 20, 40, 1280, 2000, 2000, 2000]
        );
    }
}
