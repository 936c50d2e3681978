//! A running job, live: its events as server-sent events, read from
//! `WatchJob` with the person's token, for the job's page to show as they
//! come (assets/console.js). The stream ends with the job's final event; a
//! browser that lost it reconnects with `Last-Event-ID` and goes on from
//! there.

use std::convert::Infallible;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use toolfleet_proto::v1;

use super::utc;
use crate::session::Session;
use crate::{Console, JobPath, as_person, web};

/// Most bytes of one event's data sent to the page: enough to read, not a
/// tool's whole output.
const MAX_EVENT_BYTES: usize = 4096;

pub(crate) async fn events(
    State(console): State<Console>,
    session: Session,
    JobPath(id): JobPath,
    headers: HeaderMap,
) -> Response {
    // Where a reconnecting browser left off.
    let from_offset = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        .map_or(0, |last| last + 1);
    let request = v1::WatchJobRequest {
        job_id: id.as_str().to_owned(),
        from_offset,
    };
    let mut stream = match console.api().watch_job(as_person(&session, request)).await {
        Ok(stream) => stream.into_inner(),
        Err(failed) => return web::api_failed(&failed),
    };
    let events = async_stream(move |sender| async move {
        while let Ok(Some(event)) = stream.message().await {
            let last = event.r#final;
            if sender.send(Ok(sse(&event))).await.is_err() || last {
                break;
            }
        }
    });
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// One job event as the page reads it: `delta` for more of a streamed
/// answer, `job` for the rest, its data cut to [`MAX_EVENT_BYTES`].
fn sse(event: &v1::JobEvent) -> Event {
    let name = if event.kind == "model_output_delta" {
        "delta"
    } else {
        "job"
    };
    let mut data = event.data.clone();
    if data.len() > MAX_EVENT_BYTES {
        let mut end = MAX_EVENT_BYTES;
        while !data.is_char_boundary(end) {
            end -= 1;
        }
        data.truncate(end);
        data.push('…');
    }
    let body = json!({
        "offset": event.offset,
        "kind": event.kind,
        "at": utc(event.timestamp_ms),
        "data": data,
        "final": event.r#final,
    });
    let event_out = Event::default().event(name).data(body.to_string());
    // A delta is not stored: its offset is the next stored event's, not
    // one to resume after.
    if name == "job" {
        event_out.id(event.offset.to_string())
    } else {
        event_out
    }
}

/// A stream fed by `produce` through a small channel: the body of an SSE
/// answer that ends when `produce` returns or the browser goes away.
pub(super) fn async_stream<F, Fut>(
    produce: F,
) -> impl futures::Stream<Item = Result<Event, Infallible>> + Send + 'static
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<Event, Infallible>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (sender, receiver) = tokio::sync::mpsc::channel(16);
    tokio::spawn(produce(sender));
    tokio_stream::wrappers::ReceiverStream::new(receiver)
}
