//! The formats of what toolfleet stores in Redis and sends on NATS
//! (decision 0059), so that two releases can run side by side.
//!
//! Each release writes [`CURRENT`] and reads every format from [`UNMARKED`]
//! up to it. A format says what a reader may expect, not how it is
//! encoded: format 2 is format 1 with its markers and with optional fields
//! that a reader of format 1 ignores (unknown JSON fields, hash fields and
//! headers), so the release before reads it. A future format that the
//! release before could not read waits behind a switch that is turned on
//! once the whole fleet runs the release that writes it.
//!
//! Where the format is said:
//! - a message on NATS: the header [`FORMAT`](crate::names::headers::FORMAT)
//!   (a call, a reply, a job's queue message);
//! - a job's records in Redis: the `format` field of its hash, which says
//!   it for every key under the job's hash tag (its items, events, offered
//!   tools, held calls, attempts);
//! - a call's result in the ledger: the `format` field of its record
//!   (`StoredResult`).
//!
//! What says no format was written before formats were marked: format 1.
//! What says a format above [`CURRENT`] is never read as if it were one
//! this release knows: [`read`] refuses it, and the reader leaves it to a
//! newer process, with a log line naming the format.

/// The format this release writes.
pub const CURRENT: u32 = 2;

/// The format of records and messages that say none: those of the
/// release before formats were marked.
pub const UNMARKED: u32 = 1;

/// A format marker this release cannot read: a newer release's, or not a
/// format at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{what} is in format {found:?}; this release reads formats {UNMARKED} to {CURRENT}, so a newer \
     release wrote it: it is left for a process of that release"
)]
pub struct Unreadable {
    /// What carried it: a call, a job, a result.
    pub what: &'static str,
    /// The marker as found (at most 16 characters of it).
    pub found: String,
}

/// The format `marker` says, of `what`: [`UNMARKED`] when there is none,
/// the format when this release reads it.
///
/// # Errors
///
/// [`Unreadable`]: a format above [`CURRENT`], or a marker that is not a
/// format (it is never guessed at).
pub fn read(what: &'static str, marker: Option<&str>) -> Result<u32, Unreadable> {
    // The release before knew no formats: it read whatever it found.
    let Some(marker) = marker.filter(|_| !crate::release::is_previous()) else {
        return Ok(UNMARKED);
    };
    match marker.parse::<u32>() {
        Ok(format) if (UNMARKED..=CURRENT).contains(&format) => Ok(format),
        _ => Err(Unreadable {
            what,
            found: first_chars(marker, 16),
        }),
    }
}

/// At most `max` characters of `text`, with `…` when cut: what a log line
/// shows of a marker that may be anything. The envelope's excerpt does the
/// same, but the envelope reads formats, and modules never depend on each
/// other in a circle.
fn first_chars(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

/// [`CURRENT`] as a marker.
const CURRENT_MARKER: &str = "2";

/// The marker of what this process writes: [`CURRENT`]'s, or none from a
/// process that plays the release before (format 1,
/// [`release`](crate::release)).
pub fn written() -> Option<&'static str> {
    (!crate::release::is_previous()).then_some(CURRENT_MARKER)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marker_written_is_the_current_format() {
        assert_eq!(written(), Some(CURRENT.to_string().as_str()));
    }

    #[test]
    fn a_format_is_read_only_when_this_release_knows_it() {
        // (marker, what it reads as)
        let cases = [
            (None, Ok(1)),
            (Some("1"), Ok(1)),
            (Some("2"), Ok(2)),
            (Some("3"), Err("3")),
            (Some("0"), Err("0")),
            (Some("-1"), Err("-1")),
            (Some("two"), Err("two")),
            (Some(""), Err("")),
            (Some("99999999999999999999"), Err("9999999999999999…")),
        ];
        for (marker, want) in cases {
            let read = read("a call", marker).map_err(|unreadable| unreadable.found);
            assert_eq!(read, want.map_err(str::to_owned), "{marker:?}");
        }
        let message = read("a job", Some("3")).unwrap_err().to_string();
        assert!(message.contains("a job is in format \"3\""), "{message}");
        assert!(message.contains("reads formats 1 to 2"), "{message}");
    }
}
