//! The jobs page: the tenant's jobs (or, for an agent, its own), newest
//! first, filtered by status, creation time and a metadata pair, a page at
//! a time, with the counts by status; the first page live.

use std::hash::{Hash, Hasher};
use std::time::Duration;

use askama::Template;
use axum::extract::{Query, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use toolfleet_proto::v1;

use super::{Chrome, html, query_value, status_name, utc};
use crate::session::Session;
use crate::{Console, as_person, web};

/// Jobs on a page.
const PAGE_SIZE: u32 = 50;

/// How often a jobs page's live stream asks the API again.
const LIVE_INTERVAL: Duration = Duration::from_secs(2);

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
    /// For the live stream: the digest of the listing the page shows, so
    /// that only a change is sent.
    #[serde(default)]
    shown: String,
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

/// What the live part of the page shows: the counts and the table.
struct Listing {
    filtered: bool,
    /// How many of the jobs the person sees are in each status.
    counts: Vec<(String, u64)>,
    jobs: Vec<Row>,
}

/// The live part alone (`jobs_listing.html`, which the page includes), as
/// each live update draws it.
#[derive(Template)]
#[template(path = "jobs_listing.html")]
struct ListingPart<'a> {
    listing: &'a Listing,
}

impl Listing {
    fn drawn(&self) -> String {
        super::html(&ListingPart { listing: self }).0
    }
}

#[derive(Template)]
#[template(path = "jobs.html")]
struct Jobs<'a> {
    chrome: Chrome<'a>,
    statuses: Vec<(String, bool)>,
    windows: Vec<(&'static str, &'static str, bool)>,
    meta: String,
    listing: Listing,
    /// Where the first page's live updates come from; none on a later page,
    /// whose jobs are older than anything that changes at the top.
    live: Option<String>,
    next: Option<String>,
}

/// A filter as the API reads it: a status the page does not offer, a
/// window it does not name or a malformed pair is no filter.
struct Chosen {
    status: Option<v1::JobStatus>,
    window: Option<&'static (&'static str, &'static str, u64)>,
    metadata: Option<(String, String)>,
}

impl Chosen {
    fn of(filter: &Filter) -> Self {
        Self {
            status: STATUSES
                .into_iter()
                .find(|s| status_name(*s) == filter.status),
            window: WINDOWS.iter().find(|(name, _, _)| *name == filter.since),
            metadata: filter
                .meta
                .split_once('=')
                .filter(|_| filter.meta.len() <= 1024)
                .map(|(key, value)| (key.trim().to_owned(), value.trim().to_owned())),
        }
    }

    /// The page of jobs after `page_token` (as of now, for a window), with
    /// the counts.
    fn request(&self, page_token: &str) -> v1::ListJobsRequest {
        v1::ListJobsRequest {
            page_size: PAGE_SIZE,
            page_token: page_token.chars().take(512).collect(),
            status: self.status.unwrap_or(v1::JobStatus::Unspecified).into(),
            metadata: self.metadata.clone().into_iter().collect(),
            created_after_ms: self
                .window
                .map_or(0, |(_, _, ms)| now_ms().saturating_sub(*ms)),
            with_counts: true,
            ..v1::ListJobsRequest::default()
        }
    }

    fn since(&self) -> &'static str {
        self.window.map_or("", |(name, _, _)| name)
    }

    fn meta(&self) -> String {
        self.metadata
            .as_ref()
            .map(|(k, v)| format!("{k}={v}"))
            .unwrap_or_default()
    }

    /// The filter as a query string, for a link that keeps it.
    fn query(&self) -> String {
        format!(
            "status={}&since={}&meta={}",
            query_value(&self.status.map(status_name).unwrap_or_default()),
            self.since(),
            query_value(&self.meta())
        )
    }

    /// The live part of the page, from what `ListJobs` answered.
    fn listing(&self, listed: &v1::ListJobsResponse) -> Listing {
        Listing {
            filtered: self.status.is_some() || self.window.is_some() || self.metadata.is_some(),
            counts: listed
                .counts
                .iter()
                .map(|count| (status_name(count.status()), count.jobs))
                .collect(),
            jobs: listed.jobs.iter().map(row).collect(),
        }
    }
}

pub(crate) async fn jobs(
    State(console): State<Console>,
    session: Session,
    Query(filter): Query<Filter>,
) -> Response {
    let chosen = Chosen::of(&filter);
    let request = chosen.request(&filter.page);
    let listed = match console.api().list_jobs(as_person(&session, request)).await {
        Ok(listed) => listed.into_inner(),
        Err(failed) => return web::api_failed(&failed),
    };
    let next = (!listed.next_page_token.is_empty()).then(|| {
        format!(
            "/jobs?{}&page={}",
            chosen.query(),
            query_value(&listed.next_page_token)
        )
    });
    let listing = chosen.listing(&listed);
    let shown = listing.drawn();
    let page = Jobs {
        chrome: Chrome {
            who: Some(&session),
            open: console.open,
        },
        statuses: STATUSES
            .iter()
            .map(|s| (status_name(*s), Some(*s) == chosen.status))
            .collect(),
        windows: WINDOWS
            .iter()
            .map(|(name, label, _)| (*name, *label, *name == chosen.since()))
            .collect(),
        meta: chosen.meta(),
        listing,
        live: filter
            .page
            .is_empty()
            .then(|| format!("/jobs/live?{}&shown={:x}", chosen.query(), digest(&shown))),
        next,
    };
    html(&page).into_response()
}

/// The first page's counts and table, live: `ListJobs` asked again every
/// [`LIVE_INTERVAL`] with the person's token, and the part drawn anew sent
/// as a server-sent event (`jobs`) whenever it changed. The stream ends
/// when the browser goes away or the API refuses (a session signed out);
/// a browser reconnects to a stream that ended, and is asked who it is
/// again.
pub(crate) async fn jobs_live(
    State(console): State<Console>,
    session: Session,
    Query(filter): Query<Filter>,
) -> Response {
    let chosen = Chosen::of(&filter);
    let mut shown = u64::from_str_radix(&filter.shown, 16).unwrap_or(0);
    let events = super::live::async_stream(move |sender| async move {
        let mut tick = tokio::time::interval(LIVE_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let request = as_person(&session, chosen.request(""));
            let Ok(listed) = console.api().list_jobs(request).await else {
                return;
            };
            let drawn = chosen.listing(&listed.into_inner()).drawn();
            if digest(&drawn) != shown {
                shown = digest(&drawn);
                let event = Event::default().event("jobs").data(drawn);
                if sender.send(Ok(event)).await.is_err() {
                    return;
                }
            } else if sender.is_closed() {
                return;
            }
        }
    });
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// A digest of a drawn listing, to tell a change: not a secret, so the
/// standard library's hasher does.
fn digest(drawn: &str) -> u64 {
    let mut hasher = std::hash::DefaultHasher::new();
    drawn.hash(&mut hasher);
    hasher.finish()
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
