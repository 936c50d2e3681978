//! The held calls: the approvals an approver decides and the unknown
//! outcomes an operator resolves, each decided as the signed-in person
//! (the API records them as the decider).

use askama::Template;
use axum::extract::{Form, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;
use toolfleet_proto::{JobId, v1};

use super::{Chrome, html, pretty, utc};
use crate::session::Session;
use crate::{Console, as_person, web};

/// Held calls on a page.
const PAGE_SIZE: u32 = 50;

/// One held call, as shown.
struct Held {
    job_id: String,
    call_id: String,
    tool: String,
    /// The version of the tool the call was made for (its contract hash),
    /// and its first 12 digits; empty for a call held before pinning.
    version: String,
    version_short: String,
    reason: String,
    rule: String,
    requested: String,
    expires: String,
    arguments: String,
    outcome_kind: bool,
    attempt: u32,
    outcome: String,
}

#[derive(Template)]
#[template(path = "approvals.html")]
struct Approvals<'a> {
    chrome: Chrome<'a>,
    csrf: &'a str,
    approver: bool,
    operator: bool,
    /// Whether the person may open a job's page (an approver alone may
    /// not: its calls' jobs are named, not linked).
    reads_jobs: bool,
    calls: Vec<Held>,
    next: Option<String>,
    decided: Option<String>,
    refused: Option<String>,
}

#[derive(Deserialize)]
pub(crate) struct Shown {
    #[serde(default)]
    page: String,
    #[serde(default)]
    decided: String,
}

pub(crate) async fn approvals(
    State(console): State<Console>,
    session: Session,
    Query(shown): Query<Shown>,
) -> Response {
    let decided = JobId::parse(&shown.decided).map(|_| format!("a call of {}", shown.decided));
    page(&console, &session, &shown.page, decided, None).await
}

/// The page of held calls from `page_token`, with what was just decided
/// or refused.
async fn page(
    console: &Console,
    session: &Session,
    page_token: &str,
    decided: Option<String>,
    refused: Option<(StatusCode, String)>,
) -> Response {
    let request = v1::ListPendingApprovalsRequest {
        page_size: PAGE_SIZE,
        page_token: page_token.chars().take(512).collect(),
    };
    let listed = match console
        .api()
        .list_pending_approvals(as_person(session, request))
        .await
    {
        Ok(listed) => listed.into_inner(),
        Err(failed) => return web::api_failed(&failed),
    };
    let next = (!listed.next_page_token.is_empty()).then(|| {
        format!(
            "/approvals?page={}",
            super::query_value(&listed.next_page_token)
        )
    });
    let status = refused
        .as_ref()
        .map_or(StatusCode::OK, |(status, _)| *status);
    let page = Approvals {
        chrome: Chrome {
            who: Some(session),
            open: console.open,
        },
        csrf: &session.csrf,
        approver: session.has("approver"),
        operator: session.has("operator"),
        reads_jobs: ["agent", "operator", "reader"]
            .iter()
            .any(|role| session.has(role)),
        calls: listed.approvals.iter().map(held).collect(),
        next,
        decided,
        refused: refused.map(|(_, why)| why),
    };
    (status, html(&page)).into_response()
}

fn held(call: &v1::PendingApproval) -> Held {
    Held {
        job_id: call.job_id.clone(),
        call_id: call.call_id.clone(),
        tool: call.tool.clone(),
        version: call.tool_version.clone(),
        version_short: call.tool_version.chars().take(12).collect(),
        reason: call.reason.clone(),
        rule: call.rule.clone(),
        requested: utc(call.requested_at_ms),
        expires: utc(call.expires_at_ms),
        arguments: pretty(&call.arguments),
        outcome_kind: call.kind == "outcome",
        attempt: call.attempt,
        outcome: pretty(&call.outcome),
    }
}

/// A decision, as a form sends it.
#[derive(Deserialize)]
pub(crate) struct Decided {
    csrf: String,
    job_id: String,
    call_id: String,
    decision: String,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    arguments: Option<String>,
    #[serde(default)]
    original: Option<String>,
    #[serde(default)]
    result: Option<String>,
    /// `yes` once the approver saw the diff of an edit.
    #[serde(default)]
    confirmed: String,
    /// The tool's name, for the review's title.
    #[serde(default)]
    tool: String,
}

#[derive(Template)]
#[template(path = "review.html")]
struct Review<'a> {
    chrome: Chrome<'a>,
    csrf: &'a str,
    job_id: &'a str,
    call_id: &'a str,
    tool: &'a str,
    original: String,
    edited: String,
    edited_raw: &'a str,
    diff: Option<Vec<super::diff::Line>>,
}

/// Decides a held call as the signed-in person; the API checks the role,
/// the arguments against the tool's schema, and that it is still held.
pub(crate) async fn decide(
    State(console): State<Console>,
    session: Session,
    headers: HeaderMap,
    Form(sent): Form<Decided>,
) -> Response {
    if let Err(refused) = web::check_form(&headers, &sent.csrf, &session.csrf) {
        return refused.into_response();
    }
    let Some(job_id) = JobId::parse(&sent.job_id) else {
        return web::problem(StatusCode::NOT_FOUND, "No such job.");
    };
    let Some(request) = request(&sent, &job_id) else {
        return web::problem(StatusCode::BAD_REQUEST, "That is not a decision.");
    };
    // An edit is shown as a diff before it is sent: a decision is final.
    if let Some(edited) = request.arguments.as_deref()
        && sent.confirmed != "yes"
    {
        let original = pretty(sent.original.as_deref().unwrap_or_default());
        let edited_pretty = pretty(edited);
        let page = Review {
            chrome: Chrome {
                who: Some(&session),
                open: console.open,
            },
            csrf: &session.csrf,
            job_id: job_id.as_str(),
            call_id: &request.call_id,
            tool: &sent.tool,
            diff: super::diff::lines(&original, &edited_pretty),
            original,
            edited: edited_pretty,
            edited_raw: edited,
        };
        return html(&page).into_response();
    }
    match console
        .api()
        .decide_call(as_person(&session, request))
        .await
    {
        Ok(_) => Redirect::to(&format!("/approvals?decided={}", job_id.as_str())).into_response(),
        // What the API refused is said on the page it came from.
        Err(failed)
            if matches!(
                failed.code(),
                tonic::Code::InvalidArgument | tonic::Code::FailedPrecondition
            ) =>
        {
            let why = format!("Not decided: {}", failed.message());
            page(
                &console,
                &session,
                "",
                None,
                Some((StatusCode::UNPROCESSABLE_ENTITY, why)),
            )
            .await
        }
        Err(failed) => web::api_failed(&failed),
    }
}

/// The `DecideCall` a form asks for; `None` for a decision it does not
/// name. Approved arguments are sent only when they differ from the
/// model's (as JSON, not as text: re-indenting is no edit).
fn request(sent: &Decided, job_id: &JobId) -> Option<v1::DecideCallRequest> {
    let decision = match sent.decision.as_str() {
        "approve" => v1::Decision::Approve,
        "reject" => v1::Decision::Reject,
        "applied" => v1::Decision::Applied,
        "not_applied" => v1::Decision::NotApplied,
        "fail" => v1::Decision::Fail,
        _ => return None,
    };
    let as_json = |text: &str| serde_json::from_str::<serde_json::Value>(text).ok();
    let arguments = sent.arguments.as_deref().filter(|edited| {
        decision == v1::Decision::Approve
            && (as_json(edited).is_none()
                || as_json(edited) != sent.original.as_deref().and_then(as_json))
    });
    let result = sent
        .result
        .as_deref()
        .filter(|result| decision == v1::Decision::Applied && !result.trim().is_empty());
    Some(v1::DecideCallRequest {
        job_id: job_id.as_str().to_owned(),
        call_id: sent.call_id.chars().take(256).collect(),
        decision: decision.into(),
        reason: sent.reason.clone(),
        arguments: arguments.map(str::to_owned),
        result: result.map(str::to_owned),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(decision: &str, arguments: Option<&str>) -> Decided {
        Decided {
            csrf: String::new(),
            job_id: String::new(),
            call_id: "math".into(),
            decision: decision.into(),
            reason: String::new(),
            arguments: arguments.map(str::to_owned),
            original: Some("{\n  \"a\": 1\n}".into()),
            result: Some(" ".into()),
            confirmed: String::new(),
            tool: String::new(),
        }
    }

    #[test]
    fn only_an_edit_is_sent_as_the_arguments() {
        let job = JobId::parse("ops-0123456789abcdef0123456789ab").unwrap();
        let sent = |decision, arguments| request(&form(decision, arguments), &job).unwrap();
        assert_eq!(
            sent("approve", Some("{\"a\":1}")).arguments,
            None,
            "re-indented"
        );
        assert_eq!(
            sent("approve", Some("{\"a\": 2}")).arguments.as_deref(),
            Some("{\"a\": 2}")
        );
        assert_eq!(
            sent("approve", Some("not json")).arguments.as_deref(),
            Some("not json"),
            "the API says what is wrong with it"
        );
        assert_eq!(sent("reject", Some("{\"a\": 2}")).arguments, None);
        assert_eq!(sent("applied", None).result, None, "blank: null");
        assert_eq!(
            sent("not_applied", None).decision,
            v1::Decision::NotApplied as i32
        );
        assert!(request(&form("delete", None), &job).is_none());
    }
}
