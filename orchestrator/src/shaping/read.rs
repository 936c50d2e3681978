//! `read_result(ref, offset, limit)`: the orchestrator's own tool that
//! pages through a shaped result of the job that calls it. Offered only in
//! the turns of a job that holds one, answered by the orchestrator from the
//! job's keys (never published: no worker pool may read a job), and
//! recorded as any call is, with no attempt.
//!
//! A page is the bytes `[offset, offset + limit)` of the result's `data`
//! as JSON text, cut on character boundaries and within
//! `results.shape_above_bytes` as JSON: following `next_offset` from 0 and
//! joining the pages gives that text byte for byte.

use serde::Deserialize;
use serde_json::json;
use toolfleet_proto::envelope::excerpt;
use toolfleet_proto::manifest::READ_RESULT_TOOL;
use toolfleet_proto::{Envelope, ErrorCode, EventId, JobId};

use super::{escaped_char_len, fit_head};
use crate::model::ToolSpec;

/// Who produced a `read_result` answer, on its `tool_call_result` event
/// and its call span: the orchestrator, as a built-in tool.
pub(crate) const BUILT_IN: &str = "built_in";

/// What the model is told of `read_result`.
pub(crate) fn tool_spec() -> ToolSpec {
    ToolSpec {
        name: READ_RESULT_TOOL.to_owned(),
        description: "Reads part of a tool result that was too large to show whole (one \
                      with \"shaped\": true): the bytes of its JSON text from offset, at most \
                      limit of them. Pass the ref it gave; start at 0 and follow next_offset \
                      to read it all."
            .to_owned(),
        parameters: json!({
            "type": "object",
            "additionalProperties": false,
            "required": ["ref", "offset", "limit"],
            "properties": {
                "ref": {"type": "string", "description": "The ref of the shaped result."},
                "offset": {"type": "integer", "minimum": 0,
                           "description": "The first byte to read, from 0."},
                "limit": {"type": "integer", "minimum": 1,
                          "description": "The most bytes to read."}
            }
        }),
        strict: true,
    }
}

/// The arguments of a call, as the model wrote them.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Arguments {
    #[serde(rename = "ref")]
    reference: String,
    #[serde(default)]
    offset: u64,
    #[serde(default)]
    limit: Option<u64>,
}

/// A `read_result` call whose arguments and reference were read: which
/// call's result of the job, from where, and how much at most.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Request {
    /// The call whose result it reads (a field of the job's `shaped` hash).
    pub(crate) call: EventId,
    pub(crate) offset: u64,
    pub(crate) limit: Option<u64>,
}

impl Request {
    /// Reads the `arguments` of a call of job `asking`. A reference must
    /// name a call of `asking` itself: one of another job (of its tenant or
    /// another) is refused, whatever that job holds, before anything is
    /// read.
    ///
    /// # Errors
    ///
    /// The envelope that answers the call: arguments that are not an
    /// object with `ref` (`INVALID_TOOL_ARGUMENTS`), a reference that is
    /// not one (`NO_SUCH_RESULT`) or names another job's result
    /// (`RESULT_OF_ANOTHER_JOB`).
    pub(crate) fn parse(arguments: &str, asking: &JobId) -> Result<Self, Envelope> {
        let arguments: Arguments = serde_json::from_str(arguments).map_err(|err| {
            Envelope::terminal(
                ErrorCode::INVALID_TOOL_ARGUMENTS,
                format!(
                    "{READ_RESULT_TOOL} takes {{\"ref\": string, \"offset\": integer >= 0, \
                     \"limit\": integer >= 1}}: {}",
                    excerpt(&err.to_string(), 200)
                ),
            )
        })?;
        let shown = excerpt(&arguments.reference, 200);
        let not_a_reference = || {
            Envelope::terminal(
                ErrorCode::NO_SUCH_RESULT,
                format!(
                    "{shown:?} is not the ref of a shaped result; pass the \"ref\" a shaped \
                     result gave"
                ),
            )
        };
        let (job, call) = arguments
            .reference
            .rsplit_once('/')
            .ok_or_else(not_a_reference)?;
        let job = JobId::parse(job).ok_or_else(not_a_reference)?;
        let call = EventId::parse(call).ok_or_else(not_a_reference)?;
        if &job != asking {
            let whose = if job.tenant() == asking.tenant() {
                "another job"
            } else {
                "another tenant's job"
            };
            return Err(Envelope::terminal(
                ErrorCode::RESULT_OF_ANOTHER_JOB,
                format!(
                    "{shown:?} is a result of {whose}; a job reads only its own shaped results"
                ),
            ));
        }
        Ok(Self {
            call,
            offset: arguments.offset,
            limit: arguments.limit,
        })
    }
}

/// The answer to a `read_result` call: `holds`, whether the job holds any
/// shaped result (none: the tool is not offered, and is unknown as any
/// tool that is not); the call's `request`, read; and the `stored` data of
/// the result it names. A page is at most `budget` bytes as JSON
/// (`results.shape_above_bytes`).
pub(crate) fn answer(
    holds: bool,
    request: Result<Request, Envelope>,
    stored: Option<&str>,
    budget: u64,
) -> Envelope {
    if !holds {
        return Envelope::terminal(
            ErrorCode::UNKNOWN_TOOL,
            format!(
                "no tool named {READ_RESULT_TOOL:?} is available to this job: it holds no \
                 shaped result"
            ),
        );
    }
    let request = match request {
        Ok(request) => request,
        Err(refused) => return refused,
    };
    let Some(data) = stored else {
        return Envelope::terminal(
            ErrorCode::NO_SUCH_RESULT,
            format!(
                "this job has no shaped result of call {:?}; pass the \"ref\" a shaped result \
                 gave",
                request.call.as_str()
            ),
        );
    };
    page(data, &request, budget)
}

/// The page of `data` that `request` asks for, as the `data` of an ok
/// envelope (fields in the order written): `next_offset`, where the next
/// page starts (`null` after the last); `offset`, where this one starts
/// (an offset inside a character starts at that character); `text`, its
/// bytes; `total_bytes`, the size of `data`. A page ends on a character
/// boundary, after at most `limit` bytes (at least one character) and
/// within `budget` bytes as JSON. An offset past the end is refused.
fn page(data: &str, request: &Request, budget: u64) -> Envelope {
    let total = data.len();
    let Some(offset) = usize::try_from(request.offset)
        .ok()
        .filter(|offset| *offset <= total)
    else {
        return Envelope::terminal(
            ErrorCode::OFFSET_OUT_OF_RANGE,
            format!(
                "offset {} is past the end of the result, which is {total} bytes; read from an \
                 offset below {total}",
                request.offset
            ),
        );
    };
    let start = (0..=offset)
        .rev()
        .find(|at| data.is_char_boundary(*at))
        .unwrap_or(0);
    let fields = |text: &str, next: Option<usize>| json!({"next_offset": next, "offset": start, "text": text, "total_bytes": total});
    let skeleton = fields("", Some(total)).to_string().len() as u64;
    let room = usize::try_from(budget.saturating_sub(skeleton)).unwrap_or(usize::MAX);
    let rest = &data[start..];
    let asked = request
        .limit
        .and_then(|limit| usize::try_from(limit).ok())
        .unwrap_or(usize::MAX);
    let mut text = fit_head(rest, room);
    if text.len() > asked {
        text = fit_bytes(text, asked);
    }
    if text.is_empty()
        && let Some(first) = rest.chars().next()
        && escaped_char_len(first) <= room
    {
        // A limit inside the first character still reads that character.
        text = &rest[..first.len_utf8()];
    }
    let end = start + text.len();
    Envelope::Ok(fields(text, (end < total).then_some(end)))
}

/// The longest start of `text` of at most `bytes` bytes, on a character
/// boundary.
fn fit_bytes(text: &str, bytes: usize) -> &str {
    let end = (0..=bytes.min(text.len()))
        .rev()
        .find(|at| text.is_char_boundary(*at))
        .unwrap_or(0);
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> JobId {
        JobId::new("acme", 1, 2)
    }

    fn request(offset: u64, limit: Option<u64>) -> Request {
        Request {
            call: EventId::parse("call_0_0").unwrap(),
            offset,
            limit,
        }
    }

    fn data_of(envelope: &Envelope) -> &serde_json::Value {
        match envelope {
            Envelope::Ok(data) => data,
            Envelope::Err(error) => panic!("refused: {error:?}"),
        }
    }

    fn code(envelope: &Envelope) -> &str {
        envelope.error().map_or("ok", |error| error.code.as_str())
    }

    #[test]
    fn a_reference_names_a_call_of_the_asking_job_only() {
        let job = job();
        let other_job = JobId::new("acme", 3, 4);
        let other_tenant = JobId::new("globex", 1, 2);
        let arguments = |reference: &str| json!({"ref": reference, "offset": 5, "limit": 9});
        let ok = Request::parse(&arguments(&format!("{job}/call_0_0")).to_string(), &job);
        assert_eq!(ok, Ok(request(5, Some(9))));
        // Offset and limit may be left out.
        let bare = json!({"ref": format!("{job}/x.3")}).to_string();
        let bare = Request::parse(&bare, &job).unwrap();
        assert_eq!(
            (bare.call.as_str(), bare.offset, bare.limit),
            ("x.3", 0, None)
        );
        for (arguments, code_wanted, says) in [
            (
                arguments(&format!("{other_job}/call_0_0")),
                "RESULT_OF_ANOTHER_JOB",
                "a result of another job;",
            ),
            (
                arguments(&format!("{other_tenant}/call_0_0")),
                "RESULT_OF_ANOTHER_JOB",
                "a result of another tenant's job;",
            ),
            (arguments("call_0_0"), "NO_SUCH_RESULT", "is not the ref"),
            (
                arguments(&format!("{job}/")),
                "NO_SUCH_RESULT",
                "is not the ref",
            ),
            (
                arguments("not-a-job/call_0_0"),
                "NO_SUCH_RESULT",
                "is not the ref",
            ),
            (
                arguments(&format!("{job}/call 0")),
                "NO_SUCH_RESULT",
                "is not the ref",
            ),
            (
                json!({"offset": 1}),
                "INVALID_TOOL_ARGUMENTS",
                "missing field `ref`",
            ),
            (
                json!({"ref": format!("{job}/c"), "offset": -1}),
                "INVALID_TOOL_ARGUMENTS",
                "takes",
            ),
            (
                json!({"ref": format!("{job}/c"), "path": "/etc"}),
                "INVALID_TOOL_ARGUMENTS",
                "unknown field",
            ),
        ] {
            let refused = Request::parse(&arguments.to_string(), &job).unwrap_err();
            assert_eq!(code(&refused), code_wanted, "{arguments}");
            let message = &refused.error().unwrap().message;
            assert!(message.contains(says), "{arguments}: {message}");
            assert!(!refused.error().unwrap().retryable);
        }
    }

    #[test]
    fn a_job_without_a_shaped_result_knows_no_such_tool_and_a_missing_one_is_said() {
        let refused = answer(false, Ok(request(0, None)), Some("x"), 16_384);
        assert_eq!(code(&refused), "UNKNOWN_TOOL");
        let refused = answer(true, Ok(request(0, None)), None, 16_384);
        assert_eq!(code(&refused), "NO_SUCH_RESULT");
        let forwarded = Envelope::terminal(ErrorCode::RESULT_OF_ANOTHER_JOB, "no");
        assert_eq!(
            answer(true, Err(forwarded.clone()), None, 16_384),
            forwarded
        );
    }

    #[test]
    fn pages_start_and_end_on_characters_and_say_where_the_next_starts() {
        // "é" is bytes 1..3, "😀" bytes 4..8.
        let data = "aé\"😀b";
        type Case = (u64, Option<u64>, u64, &'static str, Option<usize>);
        let cases: [Case; 8] = [
            (0, None, 0, data, None),
            (0, Some(2), 0, "a", Some(1)),
            (1, Some(1), 1, "é", Some(3)),
            (2, Some(3), 1, "é\"", Some(4)),
            (4, Some(100), 4, "😀b", None),
            (5, Some(4), 4, "😀", Some(8)),
            (8, Some(4), 8, "b", None),
            (9, Some(4), 9, "", None),
        ];
        for (offset, limit, start, text, next) in cases {
            let page = answer(true, Ok(request(offset, limit)), Some(data), 16_384);
            let page = data_of(&page);
            assert_eq!(page["offset"], start, "{offset} {limit:?}");
            assert_eq!(page["text"], text, "{offset} {limit:?}");
            assert_eq!(page["next_offset"], json!(next), "{offset} {limit:?}");
            assert_eq!(page["total_bytes"], 9);
        }
        let refused = answer(true, Ok(request(10, None)), Some(data), 16_384);
        assert_eq!(code(&refused), "OFFSET_OUT_OF_RANGE");
        assert!(
            refused
                .error()
                .unwrap()
                .message
                .contains("offset 10 is past the end"),
            "{refused:?}"
        );
        let refused = answer(true, Ok(request(u64::MAX, None)), Some(data), 16_384);
        assert_eq!(code(&refused), "OFFSET_OUT_OF_RANGE");
    }

    /// Following `next_offset` from 0 gives the whole text back, each page
    /// within the budget as JSON, escapes and all.
    #[test]
    fn pages_joined_are_the_whole_and_each_fits_the_budget() {
        let unit = "{\"k\":\"a\\n\\\"é😀\\u0001\"},";
        let data = unit.repeat(3000);
        for (limit, budget) in [(None, 1024), (Some(777), 16_384), (Some(1), 1024)] {
            let (mut joined, mut offset, mut pages) = (String::new(), 0, 0);
            loop {
                let page = answer(true, Ok(request(offset, limit)), Some(&data), budget);
                let page = data_of(&page);
                assert!(page.to_string().len() as u64 <= budget);
                assert_eq!(page["offset"], offset);
                joined.push_str(page["text"].as_str().unwrap());
                pages += 1;
                match page["next_offset"].as_u64() {
                    Some(next) => offset = next,
                    None => break,
                }
            }
            assert_eq!(joined, data, "limit {limit:?}, budget {budget}");
            assert!(pages > 1);
        }
    }
}
