//! A job's page: its facts, its answer and its transcript, every call with
//! its arguments and its envelope; and cancelling it.

use askama::Template;
use axum::extract::{Form, Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;
use toolfleet_proto::{JobId, v1};

use super::{Chrome, html, pretty, status_name, utc};
use crate::session::Session;
use crate::{Console, JobPath, as_person, web};

/// Most bytes of one transcript entry shown in the page; the rest is said
/// to be there (a tool's output may be megabytes).
const SHOWN_BYTES: usize = 64 * 1024;

struct Facts {
    id: String,
    status: String,
    created: String,
    finished: String,
    submitter: String,
    rounds: u32,
    trace_id: String,
    error: String,
    error_message: String,
    output: String,
    metadata: Vec<(String, String)>,
}

/// One entry of the transcript, as shown.
struct Entry {
    /// Its place in the transcript, for the download of the whole.
    index: usize,
    kind: &'static str,
    label: String,
    body: String,
    truncated: bool,
    size: usize,
}

#[derive(Template)]
#[template(path = "job.html")]
struct JobPage<'a> {
    chrome: Chrome<'a>,
    job: Facts,
    transcript: Vec<Entry>,
    /// Queued, running or held: the page follows it live.
    running: bool,
    /// A finished job's turns and calls on one time axis.
    waterfall: Option<super::waterfall::Waterfall>,
    /// The job's trace in the tracing UI, when one is configured.
    trace_link: Option<String>,
    can_cancel: bool,
    csrf: &'a str,
}

pub(crate) async fn job(
    State(console): State<Console>,
    session: Session,
    JobPath(id): JobPath,
) -> Response {
    let request = v1::GetJobRequest {
        job_id: id.as_str().to_owned(),
    };
    let job = match console.api().get_job(as_person(&session, request)).await {
        Ok(job) => job.into_inner(),
        Err(failed) => return web::api_failed(&failed),
    };
    let running = matches!(
        job.status(),
        v1::JobStatus::Queued | v1::JobStatus::Running | v1::JobStatus::WaitingForApproval
    );
    let waterfall = if running {
        None
    } else {
        super::waterfall::of(&console, &session, &job.job_id).await
    };
    // A trace id is 32 hex digits (the API's), so it is safe in a URL.
    let trace_link = console
        .trace_url
        .as_ref()
        .filter(|_| job.trace_id.len() == 32 && job.trace_id.bytes().all(|b| b.is_ascii_hexdigit()))
        .map(|url| url.replace("{trace_id}", &job.trace_id));
    let page = JobPage {
        chrome: Chrome {
            who: Some(&session),
            open: console.open,
        },
        transcript: job
            .items
            .iter()
            .enumerate()
            .filter_map(|(index, item)| entry(index, item))
            .collect(),
        job: facts(&job),
        running,
        waterfall,
        trace_link,
        can_cancel: running && (session.has("agent") || session.has("operator")),
        csrf: &session.csrf,
    };
    html(&page).into_response()
}

fn facts(job: &v1::Job) -> Facts {
    let mut metadata: Vec<(String, String)> = job
        .metadata
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    metadata.sort();
    let error = job.error.clone().unwrap_or_default();
    Facts {
        id: job.job_id.clone(),
        status: status_name(job.status()),
        created: utc(job.created_at_ms),
        finished: utc(job.finished_at_ms),
        submitter: job.submitter.clone(),
        rounds: job.rounds,
        trace_id: job.trace_id.clone(),
        error: error.code,
        error_message: error.message,
        output: job.output_text.clone(),
        metadata,
    }
}

/// What an item says, whole: its kind, its label and its text.
fn said(item: &v1::Item) -> Option<(&'static str, String, String)> {
    Some(match item.kind.as_ref()? {
        v1::item::Kind::User(user) => ("user", "Input".to_owned(), user.text.clone()),
        v1::item::Kind::Assistant(said) => ("assistant", "Model".to_owned(), said.text.clone()),
        v1::item::Kind::ToolCall(call) => (
            "call",
            format!("Call {} ({})", call.name, call.call_id),
            pretty(&call.arguments),
        ),
        v1::item::Kind::ToolResult(result) => (
            "result",
            format!(
                "Result of {} ({}), after {} attempt(s)",
                result.name, result.call_id, result.attempts
            ),
            pretty(&result.output),
        ),
    })
}

fn entry(index: usize, item: &v1::Item) -> Option<Entry> {
    let (kind, label, body) = said(item)?;
    let size = body.len();
    let (body, truncated) = shown(body);
    Some(Entry {
        index,
        kind,
        label,
        body,
        truncated,
        size,
    })
}

/// At most [`SHOWN_BYTES`] of `text`, cut at a character's boundary.
fn shown(mut text: String) -> (String, bool) {
    if text.len() <= SHOWN_BYTES {
        return (text, false);
    }
    let mut end = SHOWN_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    (text, true)
}

/// The whole of the transcript's entry `index`, as a text file to save: a
/// tool's output may be megabytes, the page shows its start.
pub(crate) async fn item(
    State(console): State<Console>,
    session: Session,
    Path((id, index)): Path<(String, usize)>,
) -> Response {
    let Some(id) = JobId::parse(&id) else {
        return web::problem(axum::http::StatusCode::NOT_FOUND, "No such job.");
    };
    let request = v1::GetJobRequest {
        job_id: id.as_str().to_owned(),
    };
    let job = match console.api().get_job(as_person(&session, request)).await {
        Ok(job) => job.into_inner(),
        Err(failed) => return web::api_failed(&failed),
    };
    let Some((_, _, body)) = job.items.get(index).and_then(said) else {
        return web::problem(axum::http::StatusCode::NOT_FOUND, "No such entry.");
    };
    // Plain text, to save: never a page the browser would render.
    let file = format!("attachment; filename=\"{}-{index}.txt\"", id.as_str());
    (
        [
            (
                axum::http::header::CONTENT_TYPE,
                "text/plain; charset=utf-8".to_owned(),
            ),
            (axum::http::header::CONTENT_DISPOSITION, file),
        ],
        body,
    )
        .into_response()
}

#[derive(Deserialize)]
pub(crate) struct Checked {
    csrf: String,
}

/// Cancels the job, as the signed-in person.
pub(crate) async fn cancel(
    State(console): State<Console>,
    session: Session,
    // A job id is letters, digits and `-`: safe in the redirect's header.
    JobPath(id): JobPath,
    headers: HeaderMap,
    Form(sent): Form<Checked>,
) -> Response {
    if let Err(refused) = web::check_form(&headers, &sent.csrf, &session.csrf) {
        return refused.into_response();
    }
    let request = v1::CancelJobRequest {
        job_id: id.as_str().to_owned(),
    };
    match console.api().cancel_job(as_person(&session, request)).await {
        Ok(_) => Redirect::to(&format!("/jobs/{}", id.as_str())).into_response(),
        Err(failed) => web::api_failed(&failed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_entries_are_cut_at_a_character() {
        let (short, cut) = shown("ok".to_owned());
        assert_eq!((short.as_str(), cut), ("ok", false));
        let long = "é".repeat(SHOWN_BYTES);
        let (part, cut) = shown(long);
        assert!(cut && part.len() <= SHOWN_BYTES && part.chars().all(|c| c == 'é'));
        assert_eq!(pretty("{\"a\":1}"), "{\n  \"a\": 1\n}");
        assert_eq!(pretty("not json"), "not json");
    }
}
