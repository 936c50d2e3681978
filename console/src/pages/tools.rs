//! The tools page: what the tenant's jobs may use, and the live workers
//! behind each (`ListTools`, as the person's token sees it).

use askama::Template;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use toolfleet_proto::v1;

use super::{Chrome, html, pretty};
use crate::session::Session;
use crate::{Console, as_person, web};

/// One tool, as shown.
struct Shown {
    name: String,
    description: String,
    version: String,
    workers: u32,
    effects: String,
    approval: String,
    timeout: String,
    attempts: u32,
    strict: bool,
    parameters: String,
}

#[derive(Template)]
#[template(path = "tools.html")]
struct Tools<'a> {
    chrome: Chrome<'a>,
    tools: Vec<Shown>,
}

pub(crate) async fn tools(State(console): State<Console>, session: Session) -> Response {
    let request = as_person(&session, v1::ListToolsRequest::default());
    let listed = match console.api().list_tools(request).await {
        Ok(listed) => listed.into_inner(),
        Err(failed) => return web::api_failed(&failed),
    };
    let mut tools: Vec<Shown> = listed.tools.iter().map(shown).collect();
    tools.sort_by(|a, b| a.name.cmp(&b.name));
    let page = Tools {
        chrome: Chrome {
            who: Some(&session),
            open: console.open,
        },
        tools,
    };
    html(&page).into_response()
}

fn shown(tool: &v1::Tool) -> Shown {
    Shown {
        name: tool.name.clone(),
        description: tool.description.clone(),
        version: tool.version.clone(),
        workers: tool.workers,
        effects: tool.effects.clone(),
        approval: tool.approval.clone(),
        timeout: format!("{} s", tool.timeout_ms as f64 / 1000.0),
        attempts: tool.max_attempts,
        strict: tool.strict,
        parameters: pretty(&tool.parameters),
    }
}
