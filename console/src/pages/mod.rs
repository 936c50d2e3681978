//! The pages, each a compiled template (console/templates) whose every
//! printed value is escaped, and the handler that fills it.

mod approvals;
mod diff;
mod job;
mod jobs;
mod live;
mod sign_in;
mod tools;
mod waterfall;

pub(crate) use approvals::{approvals, decide};
pub(crate) use job::{cancel, item, job};
pub(crate) use jobs::{jobs, jobs_live};
pub(crate) use live::events;
pub(crate) use sign_in::{oidc_callback, oidc_start, sign_in, sign_in_form, sign_out};
pub(crate) use tools::tools;

use askama::Template;
use axum::response::Html;
use toolfleet_proto::v1;

use crate::session::Session;

/// What the frame of every page shows: who is signed in, and whether
/// authentication is off.
#[derive(Default)]
pub(crate) struct Chrome<'a> {
    pub who: Option<&'a Session>,
    pub open: bool,
}

/// A template, rendered; a failure (which a template compiled against its
/// struct does not have) is a line saying so, never a panic.
pub(crate) fn html(page: &impl Template) -> Html<String> {
    Html(
        page.render()
            .unwrap_or_else(|err| format!("<p>the page could not be drawn: {err}</p>")),
    )
}

/// A page that says what went wrong. Its frame names no one: it may
/// answer a request whose session is unknown.
#[derive(Template)]
#[template(path = "problem.html")]
pub(crate) struct Problem<'a> {
    pub chrome: Chrome<'a>,
    pub status: u16,
    pub message: &'a str,
}

/// JSON indented, or the text as it is when it is not JSON.
pub(crate) fn pretty(text: &str) -> String {
    serde_json::from_str::<serde_json::Value>(text)
        .and_then(|value| serde_json::to_string_pretty(&value))
        .unwrap_or_else(|_| text.to_owned())
}

/// `value` percent-encoded for a query string: letters, digits and `-._~`
/// as they are, every other byte as `%XX`.
pub(crate) fn query_value(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A status as the pages name it: `running`, `waiting_for_approval`.
pub(crate) fn status_name(status: v1::JobStatus) -> String {
    status
        .as_str_name()
        .trim_start_matches("JOB_STATUS_")
        .to_ascii_lowercase()
}

/// Epoch milliseconds as `2026-12-07 01:02:03` (UTC); empty for 0.
pub(crate) fn utc(ms: u64) -> String {
    if ms == 0 {
        return String::new();
    }
    let secs = ms / 1000;
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(i64::try_from(days).unwrap_or(0));
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// The proleptic Gregorian date `days` after 1970-01-01 (Howard Hinnant's
/// `civil_from_days`): a page's only date arithmetic, not worth a crate.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = u32::try_from(doy - (153 * mp + 2) / 5 + 1).unwrap_or(1);
    let month = u32::try_from(if mp < 10 { mp + 3 } else { mp - 9 }).unwrap_or(1);
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_print_in_utc() {
        assert_eq!(utc(0), "");
        assert_eq!(utc(1), "1970-01-01 00:00:00");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00");
        assert_eq!(utc(1_796_605_323_000), "2026-12-07 01:02:03");
        assert_eq!(
            status_name(v1::JobStatus::WaitingForApproval),
            "waiting_for_approval"
        );
    }
}
