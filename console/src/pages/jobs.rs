//! The jobs page: the tenant's jobs (or, for an agent, its own), newest
//! first, filtered by status, a page at a time.

use askama::Template;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use toolfleet_proto::v1;

use super::{Chrome, html, query_value, status_name, utc};
use crate::session::Session;
use crate::{Console, as_person, web};

/// Jobs on a page.
const PAGE_SIZE: u32 = 50;

/// The statuses a filter may name, as the pages name them.
const STATUSES: [v1::JobStatus; 6] = [
    v1::JobStatus::Queued,
    v1::JobStatus::Running,
    v1::JobStatus::WaitingForApproval,
    v1::JobStatus::Succeeded,
    v1::JobStatus::Failed,
    v1::JobStatus::Cancelled,
];

#[derive(Deserialize)]
pub(crate) struct Filter {
    #[serde(default)]
    status: String,
    /// `1h`, `24h` or `7d`: only jobs created that recently.
    #[serde(default)]
    since: String,
    /// `key=value`: only jobs whose metadata has it.
    #[serde(default)]
    meta: String,
    #[serde(default)]
    page: String,
}

/// The windows the page offers, as a filter names them.
const WINDOWS: [(&str, &str, u64); 3] = [
    ("1h", "the last hour", 3_600_000),
    ("24h", "the last day", 86_400_000),
    ("7d", "the last week", 604_800_000),
];

/// Now, in Unix milliseconds.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// One line of the table.
struct Row {
    id: String,
    status: String,
    created: String,
    submitter: String,
    rounds: u32,
    error: String,
}

#[derive(Template)]
#[template(path = "jobs.html")]
struct Jobs<'a> {
    chrome: Chrome<'a>,
    statuses: Vec<(String, bool)>,
    windows: Vec<(&'static str, &'static str, bool)>,
    meta: String,
    filtered: bool,
    /// How many of the jobs the person sees are in each status.
    counts: Vec<(String, u64)>,
    jobs: Vec<Row>,
    next: Option<String>,
}

pub(crate) async fn jobs(
    State(console): State<Console>,
    session: Session,
    Query(filter): Query<Filter>,
) -> Response {
    // A status the page does not offer is no filter.
    let status = STATUSES
        .into_iter()
        .find(|s| status_name(*s) == filter.status);
    let window = WINDOWS.iter().find(|(name, _, _)| *name == filter.since);
    let metadata = filter
        .meta
        .split_once('=')
        .filter(|_| filter.meta.len() <= 1024)
        .map(|(key, value)| (key.trim().to_owned(), value.trim().to_owned()));
    let request = v1::ListJobsRequest {
        page_size: PAGE_SIZE,
        page_token: filter.page.chars().take(512).collect(),
        status: status.unwrap_or(v1::JobStatus::Unspecified).into(),
        metadata: metadata.clone().into_iter().collect(),
        created_after_ms: window.map_or(0, |(_, _, ms)| now_ms().saturating_sub(*ms)),
        with_counts: true,
        ..v1::ListJobsRequest::default()
    };
    let listed = match console.api().list_jobs(as_person(&session, request)).await {
        Ok(listed) => listed.into_inner(),
        Err(failed) => return web::api_failed(&failed),
    };
    let status_filter = status.map(status_name).unwrap_or_default();
    let since = window.map_or("", |(name, _, _)| name);
    let meta = metadata
        .map(|(k, v)| format!("{k}={v}"))
        .unwrap_or_default();
    let next = (!listed.next_page_token.is_empty()).then(|| {
        format!(
            "/jobs?status={}&since={since}&meta={}&page={}",
            query_value(&status_filter),
            query_value(&meta),
            query_value(&listed.next_page_token)
        )
    });
    let page = Jobs {
        chrome: Chrome {
            who: Some(&session),
            open: console.open,
        },
        statuses: STATUSES
            .iter()
            .map(|s| (status_name(*s), Some(*s) == status))
            .collect(),
        windows: WINDOWS
            .iter()
            .map(|(name, label, _)| (*name, *label, *name == since))
            .collect(),
        filtered: status.is_some() || window.is_some() || !meta.is_empty(),
        meta,
        counts: listed
            .counts
            .iter()
            .map(|count| (status_name(count.status()), count.jobs))
            .collect(),
        jobs: listed.jobs.iter().map(row).collect(),
        next,
    };
    html(&page).into_response()
}

fn row(job: &v1::Job) -> Row {
    Row {
        id: job.job_id.clone(),
        status: status_name(job.status()),
        created: utc(job.created_at_ms),
        submitter: job.submitter.clone(),
        rounds: job.rounds,
        error: job
            .error
            .as_ref()
            .map(|e| e.code.clone())
            .unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(query_value("abc-1_2.3~"), "abc-1_2.3~");
        assert_eq!(query_value("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
    }
}
