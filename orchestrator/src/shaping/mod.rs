//! Result shaping (docs/protection.md, decision 0054): a tool result whose
//! `data` is larger than its tool's limit is stored whole with the job, and
//! the model is shown a view of it within the limit: its head and tail, its
//! size and a reference, which `read_result` pages through.
//!
//! - this module: the limit (`results.shape_above_bytes`, or the tool's
//!   manifest), the reference ([`ResultRef`]) and the view ([`shape`]), a
//!   pure function of the envelope;
//! - `read`: `read_result`, the orchestrator's own tool: what the model is
//!   told of it, its request, and its answer (`read::answer`), a pure
//!   function of what the job holds.
//!
//! Only the JSON text of `data` is measured and cut, on character
//! boundaries; error envelopes are never shaped (their messages are the
//! tools' and the fleet's, short by design).

pub(crate) mod read;

use serde::{Deserialize, Serialize};
use serde_json::json;
use toolfleet_proto::manifest::{self, READ_RESULT_TOOL};
use toolfleet_proto::{EventId, JobId};

use crate::job::FullResult;

/// What the model is shown of results (`results.*`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ResultOptions {
    /// Above how many bytes of `data` (its JSON text) a result is shaped,
    /// for tools whose manifest says no `shape_above_bytes` of its own; and
    /// the most `data` a `read_result` page holds. From 1024 to 16777216.
    /// Default: 16384 (16 KiB).
    #[serde(with = "shape_above")]
    pub shape_above_bytes: u64,
}

impl Default for ResultOptions {
    fn default() -> Self {
        Self {
            shape_above_bytes: 16 * 1024,
        }
    }
}

/// `results.shape_above_bytes`: a number of bytes within
/// [`manifest::check_shape_above_bytes`]'s bounds.
mod shape_above {
    use serde::de::Error;
    use serde::{Deserialize, Deserializer, Serializer};
    use toolfleet_proto::manifest::check_shape_above_bytes;

    pub(super) fn serialize<S: Serializer>(bytes: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(*bytes)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        check_shape_above_bytes(u64::deserialize(d)?).map_err(D::Error::custom)
    }
}

/// What names a shaped result to `read_result`: `<job id>/<event id>`, the
/// job and the call as the job's events show it. Neither holds a `/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ResultRef<'a> {
    pub(crate) job: &'a JobId,
    pub(crate) call: &'a EventId,
}

impl std::fmt::Display for ResultRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.job, self.call.as_str())
    }
}

/// An envelope as the model sees it, and the whole data it stands for when
/// it is a shaped view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Shaped {
    /// The envelope JSON for the conversation.
    pub(crate) output: String,
    /// The whole data of a shaped result, to store with the view.
    pub(crate) full: Option<FullResult>,
}

/// How an ok envelope's JSON text begins and ends around its `data`
/// (`Envelope::to_json`).
const OK_HEAD: &str = r#"{"ok":true,"data":"#;
const OK_TAIL: &str = "}";

/// What the model is shown of `output`, an envelope's JSON text as
/// `Envelope::to_json` wrote it, answering the call `reference`: the
/// envelope itself when it is an error or its `data` is at most `limit`
/// bytes, else a view of it within `limit` ([`view`]) and its whole data to
/// store. `None` for `limit`: never shaped (a call job, whose client gets
/// the whole envelope as the job's answer).
pub(crate) fn shape(output: String, limit: Option<u64>, reference: &ResultRef<'_>) -> Shaped {
    let data_len = output.len().saturating_sub(OK_HEAD.len() + OK_TAIL.len());
    let over = limit.is_some_and(|limit| data_len as u64 > limit);
    let Some(limit) = limit.filter(|_| over && output.starts_with(OK_HEAD)) else {
        return Shaped { output, full: None };
    };
    let data = &output[OK_HEAD.len()..output.len() - OK_TAIL.len()];
    let view = view(data, limit, reference);
    Shaped {
        output: toolfleet_proto::Envelope::Ok(view).to_json(),
        full: Some(FullResult {
            call: reference.call.clone(),
            data: data.to_owned(),
        }),
    }
}

/// The view of `data` (a JSON text over `limit` bytes) the model is shown,
/// as the `data` of an ok envelope: at most `limit` bytes as JSON. Its
/// fields, in the order they are written:
/// - `head`, `tail`: the first and the last bytes of `data` (as strings,
///   cut on character boundaries), as many as fit, half the room each;
/// - `note`: what happened, in one sentence for the model;
/// - `read_with`: `read_result`; `ref`: its reference;
/// - `shaped`: `true`; `tail_offset`: where `tail` starts in `data`;
///   `total_bytes`: the size of `data`.
fn view(data: &str, limit: u64, reference: &ResultRef<'_>) -> serde_json::Value {
    let total = data.len();
    let note = format!(
        "This result is {total} bytes of JSON, more than the {limit} bytes shown at once: head \
         and tail are its first and last bytes (tail from byte tail_offset). Call {READ_RESULT_TOOL} \
         with ref, an offset and a limit to read any part of it."
    );
    let fields = |head: &str, tail: &str, tail_offset: usize| {
        json!({
            "head": head,
            "note": note,
            "read_with": READ_RESULT_TOOL,
            "ref": reference.to_string(),
            "shaped": true,
            "tail": tail,
            "tail_offset": tail_offset,
            "total_bytes": total,
        })
    };
    // The room left for head and tail once everything else is written
    // (`tail_offset` at its widest).
    let skeleton = fields("", "", total).to_string().len() as u64;
    let room = usize::try_from(limit.saturating_sub(skeleton)).unwrap_or(usize::MAX);
    let head = fit_head(data, room / 2);
    let tail = fit_tail(&data[head.len()..], room - escaped_len(head));
    fields(head, tail, total - tail.len())
}

/// How many bytes `c` takes inside a JSON string as serde_json writes it.
fn escaped_char_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\u{8}' | '\u{c}' | '\n' | '\r' | '\t' => 2,
        c if (c as u32) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

/// How many bytes `text` takes inside a JSON string.
fn escaped_len(text: &str) -> usize {
    text.chars().map(escaped_char_len).sum()
}

/// The longest start of `text`, on a character boundary, that takes at
/// most `room` bytes inside a JSON string.
fn fit_head(text: &str, room: usize) -> &str {
    let mut used = 0;
    for (at, c) in text.char_indices() {
        used += escaped_char_len(c);
        if used > room {
            return &text[..at];
        }
    }
    text
}

/// The longest end of `text`, on a character boundary, that takes at most
/// `room` bytes inside a JSON string.
fn fit_tail(text: &str, room: usize) -> &str {
    let mut used = 0;
    for (at, c) in text.char_indices().rev() {
        used += escaped_char_len(c);
        if used > room {
            return &text[at + c.len_utf8()..];
        }
    }
    text
}

/// The shaping limit of a tool whose manifest says `own` (none: the
/// orchestrator's `default`).
pub(crate) fn limit_of(own: Option<u64>, default: u64) -> u64 {
    // A manifest's was checked where it was read (`ToolManifest::check`).
    own.map_or(default, |own| {
        own.clamp(
            manifest::MIN_SHAPE_ABOVE_BYTES,
            manifest::MAX_SHAPE_ABOVE_BYTES,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolfleet_proto::Envelope;

    fn job() -> JobId {
        JobId::new("acme", 1, 2)
    }

    fn call() -> EventId {
        EventId::parse("call_0_0").unwrap()
    }

    /// A data text of exactly `bytes` bytes: a JSON string of ASCII with
    /// quotes, newlines, controls, two-byte and four-byte characters, so
    /// that cuts fall inside characters and escapes.
    fn data_of(bytes: usize) -> serde_json::Value {
        let pattern: Vec<char> = "ab\"c\\d\ne\u{1}fé😀g".chars().collect();
        let (mut text, mut len) = (String::new(), 2);
        for c in pattern.iter().cycle() {
            if len + escaped_char_len(*c) > bytes {
                break;
            }
            text.push(*c);
            len += escaped_char_len(*c);
        }
        // Pad with ASCII to land on `bytes` exactly.
        text.extend(std::iter::repeat_n('z', bytes - len));
        assert_eq!(serde_json::to_string(&text).unwrap().len(), bytes);
        serde_json::Value::String(text)
    }

    #[test]
    fn a_result_within_the_limit_an_error_and_a_call_jobs_result_are_shown_whole() {
        let (job, call) = (job(), call());
        let reference = ResultRef {
            job: &job,
            call: &call,
        };
        let small = Envelope::Ok(data_of(1024)).to_json();
        let error = Envelope::terminal(toolfleet_proto::ErrorCode::UNKNOWN_TOOL, "x".repeat(5000))
            .to_json();
        let large = Envelope::Ok(data_of(5000)).to_json();
        for (output, limit) in [
            (small.clone(), Some(1024)),
            (error, Some(1024)),
            (large, None),
        ] {
            let shaped = shape(output.clone(), limit, &reference);
            assert_eq!(shaped, Shaped { output, full: None });
        }
        assert!(
            shape(small, Some(1023), &reference).full.is_some(),
            "1 over"
        );
    }

    /// Whatever the data and the limit, the view is within the limit,
    /// keeps the whole data to store, and shows its first and last bytes.
    #[test]
    fn a_view_fits_its_limit_and_shows_the_ends_of_the_whole() {
        let (job, call) = (job(), call());
        let reference = ResultRef {
            job: &job,
            call: &call,
        };
        for (size, limit) in [
            (1025, 1024),
            (20_000, 1024),
            (20_000, 16_384),
            (1_048_576, 16_384),
            (100_000, 99_999),
        ] {
            let data = data_of(size);
            let whole = serde_json::to_string(&data).unwrap();
            assert_eq!(whole.len(), size);
            let shaped = shape(Envelope::Ok(data).to_json(), Some(limit), &reference);
            let full = shaped.full.expect("over the limit");
            assert_eq!(
                (full.call.as_str(), full.data.as_str()),
                ("call_0_0", &*whole)
            );
            let envelope: Envelope = serde_json::from_str(&shaped.output).unwrap();
            let Envelope::Ok(view) = envelope else {
                panic!("a view is ok")
            };
            let shown = view.to_string().len() as u64;
            assert!(shown <= limit, "{shown} > {limit}");
            assert!(
                shown + 16 > limit / 2,
                "{shown} leaves most of {limit} unused"
            );
            let (head, tail) = (
                view["head"].as_str().unwrap(),
                view["tail"].as_str().unwrap(),
            );
            assert!(whole.starts_with(head) && whole.ends_with(tail));
            assert!(!head.is_empty() && !tail.is_empty());
            assert_eq!(view["tail_offset"], whole.len() - tail.len());
            assert_eq!(view["total_bytes"], size);
            assert_eq!(view["ref"], format!("{job}/call_0_0"));
            assert_eq!(view["read_with"], "read_result");
            assert_eq!(view["shaped"], true);
        }
    }

    #[test]
    fn cuts_fall_on_character_boundaries_and_count_escapes() {
        // "é" is 2 bytes, "😀" 4, a quote 2 once escaped, a control 6.
        let text = "é😀\"\u{1}x";
        for (room, head) in [
            (0, ""),
            (1, ""),
            (2, "é"),
            (5, "é"),
            (6, "é😀"),
            (8, "é😀\""),
            (13, "é😀\""),
            (14, "é😀\"\u{1}"),
            (15, text),
        ] {
            assert_eq!(fit_head(text, room), head, "room {room}");
        }
        for (room, tail) in [
            (0, ""),
            (1, "x"),
            (6, "x"),
            (7, "\u{1}x"),
            (9, "\"\u{1}x"),
            (12, "\"\u{1}x"),
            (13, "😀\"\u{1}x"),
            (15, text),
        ] {
            assert_eq!(fit_tail(text, room), tail, "room {room}");
        }
        assert_eq!(
            escaped_len(text),
            serde_json::to_string(text).unwrap().len() - 2
        );
    }

    /// docs/protection.md shows a view and a page byte for byte: these are
    /// the code's.
    #[test]
    fn the_view_and_the_page_in_the_docs_are_the_codes() {
        let docs = include_str!("../../../docs/protection.md");
        let job = JobId::new("acme", 0x0193_9c1e_5f2a, 0x7d3b_91c4_0e6a_2f58);
        assert_eq!(job.as_str(), "acme-01939c1e5f2a7d3b91c40e6a2f58");
        let call = call();
        let reference = ResultRef {
            job: &job,
            call: &call,
        };
        let data = json!((0..300).collect::<Vec<u32>>());
        let shaped = shape(Envelope::Ok(data).to_json(), Some(1024), &reference);
        assert!(
            docs.contains(&format!("\n{}\n", shaped.output)),
            "{}",
            shaped.output
        );
        let request = json!({"ref": reference.to_string(), "offset": 0, "limit": 100});
        let request = read::Request::parse(&request.to_string(), &job);
        let whole = shaped.full.expect("shaped").data;
        let page = read::answer(true, request, Some(&whole), 16_384).to_json();
        assert!(docs.contains(&format!("\n{page}\n")), "{page}");
    }

    #[test]
    fn a_tools_own_limit_wins_within_the_bounds() {
        assert_eq!(limit_of(None, 16_384), 16_384);
        assert_eq!(limit_of(Some(4096), 16_384), 4096);
        assert_eq!(limit_of(Some(1), 16_384), 1024);
        assert_eq!(limit_of(Some(u64::MAX), 16_384), 16 * 1024 * 1024);
    }

    #[test]
    fn start_up_refuses_a_limit_out_of_bounds_naming_the_key() {
        use crate::config::OrchestratorOptions;
        let load = |bytes: serde_json::Value| {
            let overrides = json!({"results": {"shape_above_bytes": bytes}});
            OrchestratorOptions::load(None, overrides)
        };
        let options = load(json!(1024)).expect("the least loads");
        assert_eq!(options.results.shape_above_bytes, 1024);
        assert_eq!(
            OrchestratorOptions::default().results.shape_above_bytes,
            16_384
        );
        for (bytes, why) in [
            (json!(0), "0 is below 1024"),
            (json!(1023), "1023 is below 1024"),
            (json!(16_777_217), "16777217 is above 16777216"),
            (json!(-1), "shape_above_bytes"),
        ] {
            let error = load(bytes).expect_err("out of bounds").to_string();
            assert!(error.contains("shape_above_bytes"), "{error}");
            assert!(error.contains(why), "{error}");
        }
    }
}
