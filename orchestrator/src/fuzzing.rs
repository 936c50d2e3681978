//! Entry points for the fuzz targets in `tests/fuzz`: the parsers of what a
//! model endpoint or a client's script sends, which are private to their
//! modules. Built only with `--cfg fuzzing` (cargo fuzz sets it); not an API.
//!
//! Each function takes raw bytes, as they arrive, and may return anything
//! but a panic, a hang or an unbounded allocation.

use serde_json::Value;

use crate::job::{Item, WireIds};
use crate::model::http::ErrorDetails;
use crate::model::mask::Mask;
use crate::model::scripted::Scripted;
use crate::model::{TurnRequest, chat_completions, openai_responses};
use crate::runner::step::pending_calls;

/// A Responses API body: parsed as a success and as an error body, and the
/// calls it makes planned onto the wire as the runner would.
pub fn openai_responses(body: &[u8]) {
    let _ = ErrorDetails::parse(body, &Mask::of(Some("sk-fuzz".into())));
    if let Ok(json) = serde_json::from_slice::<Value>(body)
        && let Ok(turn) = openai_responses::parse_response(&json)
    {
        plan(turn.items);
    }
}

/// A Chat Completions body, as [`openai_responses`].
pub fn openai_chat(body: &[u8]) {
    let _ = ErrorDetails::parse(body, &Mask::default());
    if let Ok(json) = serde_json::from_slice::<Value>(body)
        && let Ok(turn) = chat_completions::parse_response(&json, 3)
    {
        plan(turn.items);
    }
}

/// A scripted model's script, played turn by turn with every call answered
/// by an output that itself quotes a call (`{{...}}` inside a quote), under
/// the API's default answer limit.
pub fn scripted(script: &[u8]) {
    let Ok(text) = std::str::from_utf8(script) else {
        return;
    };
    let Ok(model) = Scripted::parse(text) else {
        return;
    };
    let model = model.with_answer_limit(1024 * 1024);
    let mut items = vec![Item::User {
        text: "fuzz".into(),
    }];
    for turn in 0..16 {
        let request = TurnRequest {
            model: "scripted",
            instructions: "",
            items: &items,
            tools: &[],
            parallel_tool_calls: true,
            turn,
        };
        let Ok(played) = model.play(&request) else {
            return;
        };
        items.extend(played.items);
        for call in pending_calls(&items, &WireIds::Legacy) {
            items.push(Item::ToolResult {
                output: format!(
                    r#"{{"ok":true,"data":{{"a":[1,{{"b":"{{{{{id}}}}}"}}]}},"text":"{{{{{id}.data}}}}"}}"#,
                    id = call.wire_id
                ),
                call_id: call.call_id,
                name: call.name,
                attempts: 1,
            });
        }
    }
}

fn plan(mut items: Vec<Item>) {
    items.insert(
        0,
        Item::User {
            text: "fuzz".into(),
        },
    );
    let secret = WireIds::Secret("fuzz".into());
    for wire_ids in [&WireIds::Legacy, &secret] {
        for call in pending_calls(&items, wire_ids) {
            assert!(
                toolfleet_proto::call::is_valid_wire_id(&call.wire_id),
                "an unchecked wire id: {:?}",
                call.wire_id
            );
        }
    }
}
