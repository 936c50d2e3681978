//! `trend_analysis`: `factual_qa` for every (company, topic) pair at once,
//! assembled into sections, with a summary of the trend.
//!
//! A section that fails (an unknown company, a topic that is no predicate)
//! shows its error in place; the others still answer. The summary comes from
//! `kg.model` when one is configured, told to use only the facts given; without
//! a model, or when it fails, a summary is computed from the facts: counts per
//! year and predicate, the first and last events, and notable values.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};
use toolfleet_proto::{Effects, ToolManifest};
use tracing::warn;

use super::{Answer, KnowledgeBase, Window};
use crate::tool::{Tool, ToolContext, ToolError};

const NAME: &str = "trend_analysis";
/// Most companies and topics one call may name: at most 100 sections.
const MAX_ITEMS: usize = 10;

/// Above how many bytes of `data` a report is shown to the model shaped
/// (docs/protection.md): 64 KiB.
const REPORT_SHOWN_BYTES: u64 = 64 * 1024;

/// Longest question accepted.
const MAX_QUESTION_CHARS: usize = 2000;
/// Most characters of sections sent to the model for the summary.
const MAX_SUMMARY_INPUT_CHARS: usize = 60_000;
/// Most notable values the computed summary lists.
const MAX_NOTABLE: usize = 10;
/// Most facts one answer lists over all its sections, shared evenly: with a
/// statement of up to 1,000 characters each, the answer stays well inside
/// the worker's default output limit (1 MiB).
const MAX_TREND_FACTS: usize = 300;
/// Longest model summary kept.
const MAX_SUMMARY_CHARS: usize = 20_000;

/// The `trend_analysis` tool.
#[derive(Debug, Clone)]
pub struct TrendAnalysis {
    base: Arc<KnowledgeBase>,
}

impl TrendAnalysis {
    /// The tool over a knowledge base (shared with `factual_qa`).
    pub fn new(base: Arc<KnowledgeBase>) -> Self {
        Self { base }
    }
}

#[derive(Deserialize)]
struct Args {
    question: String,
    companies: Vec<String>,
    start_date_range: String,
    end_date_range: String,
    topic_filter: Vec<String>,
}

/// One (company, topic) pair's outcome: the facts, or the code and message
/// of the error its own `factual_qa` call would have answered.
struct Section {
    company: String,
    topic: String,
    outcome: Result<Answer, (String, String)>,
}

impl Tool for TrendAnalysis {
    fn manifest(&self) -> ToolManifest {
        let model_time = self.base.model().map_or(Duration::ZERO, |m| m.timeout());
        let list = |what: &str| {
            json!({
                "type": "array",
                "items": {"type": "string"},
                "minItems": 1,
                "maxItems": MAX_ITEMS,
                "description": what,
            })
        };
        ToolManifest::new(
            NAME,
            "Analyse how something changed over time for one or more companies: looks up the \
             facts of every company and topic in the temporal knowledge graph between two dates \
             and summarises the trend from those facts only. Use it for questions such as \"How \
             have AMD's research priorities changed over time?\" or to compare companies.",
            json!({
                "type": "object",
                "properties": {
                    "question": {
                        "type": "string",
                        "description": "The user's question, which the summary answers."
                    },
                    "companies": list("The companies to analyse, e.g. [\"AMD\", \"NVIDIA\"]."),
                    "start_date_range": {
                        "type": "string",
                        "description": "First day of the period, YYYY-MM-DD (included)."
                    },
                    "end_date_range": {
                        "type": "string",
                        "description": "Last day of the period, YYYY-MM-DD (included)."
                    },
                    "topic_filter": list(
                        "The relationships to look at, as predicates such as DEVELOPED, LAUNCHED, INVESTS_IN, HAS_REVENUE."
                    )
                },
                "required": ["question", "companies", "start_date_range", "end_date_range", "topic_filter"],
                "additionalProperties": false
            }),
        )
        // Predicate words and the summary may each take a model request.
        .with_timeout(Duration::from_secs(10) + model_time * 2)
        .with_max_attempts(3)
        .with_effects(Effects::ReadOnly)
        // A report is meant to be read whole: three companies by three
        // topics take about 25 KiB, over the orchestrator's default of 16
        // KiB. Ten by ten (up to 50 facts a section) would be shaped.
        .with_shape_above_bytes(REPORT_SHOWN_BYTES)
    }

    async fn call(&self, args: Value, _ctx: ToolContext) -> Result<Value, ToolError> {
        let args: Args = serde_json::from_value(args)
            .map_err(|err| ToolError::InvalidArguments(err.to_string()))?;
        check(&args)?;
        let window = Window::of(&args.start_date_range, &args.end_date_range)?;
        // Each topic's word is mapped once (the model may be asked), then
        // every section is an indexed lookup.
        let predicates = futures::future::join_all(
            args.topic_filter
                .iter()
                .map(|topic| self.base.predicate(topic)),
        )
        .await
        .into_iter()
        .map(|predicate| predicate.map_err(|err| error_parts(&err)))
        .collect::<Vec<_>>();
        let per_section = MAX_TREND_FACTS / (args.companies.len() * args.topic_filter.len());
        let mut sections = Vec::new();
        for company in &args.companies {
            for (topic, predicate) in args.topic_filter.iter().zip(&predicates) {
                let outcome = match predicate {
                    Ok(predicate) => self
                        .base
                        .facts(company, *predicate, window, per_section)
                        .map_err(|err| error_parts(&err)),
                    Err(parts) => Err(parts.clone()),
                };
                sections.push(Section {
                    company: company.clone(),
                    topic: topic.clone(),
                    outcome,
                });
            }
        }
        let mut text = String::new();
        for section in &sections {
            text.push_str(&section_text(section));
        }
        let (summary, source) = self.summary(&args.question, &text, &sections, window).await;
        let _ = write!(text, "=== Summary ===\n{summary}\n");
        Ok(json!({
            "text": text,
            "sections": sections.iter().map(section_json).collect::<Vec<_>>(),
            "summary": summary,
            "summary_source": source,
        }))
    }
}

impl TrendAnalysis {
    /// The model's summary, or the computed one; and which it is.
    async fn summary(
        &self,
        question: &str,
        sections_text: &str,
        sections: &[Section],
        window: Window,
    ) -> (String, &'static str) {
        let computed = || computed_summary(sections, window);
        let Some(model) = self.base.model() else {
            return (computed(), "computed");
        };
        let instructions = "You are an analyst who answers questions about how companies changed \
            over time, using only the facts of a temporal knowledge graph given to you. Every \
            claim must come from those facts; do not add knowledge of your own. Describe the \
            trend in chronological order, name dates, compare the companies where the question \
            asks for it, and say plainly where the facts are too few to tell. Sections marked \
            Error had no facts. Answer in at most three short paragraphs.";
        let input = format!(
            "Question: {}\n\nFacts from {} to {}:\n\n{}",
            question,
            window.start,
            window.end,
            super::excerpt(sections_text, MAX_SUMMARY_INPUT_CHARS)
        );
        match model.complete(instructions, &input).await {
            Ok(summary) => (super::excerpt(summary.trim(), MAX_SUMMARY_CHARS), "model"),
            Err(err) => {
                warn!(error = %err, "kg.model could not summarise a trend; using the computed summary");
                (computed(), "computed")
            }
        }
    }
}

fn check(args: &Args) -> Result<(), ToolError> {
    let invalid = |message: String| Err(ToolError::InvalidArguments(message));
    if args.question.chars().count() > MAX_QUESTION_CHARS {
        return invalid(format!(
            "question is longer than {MAX_QUESTION_CHARS} characters"
        ));
    }
    for (key, list) in [
        ("companies", &args.companies),
        ("topic_filter", &args.topic_filter),
    ] {
        if list.is_empty() || list.len() > MAX_ITEMS {
            return invalid(format!("{key} must list 1 to {MAX_ITEMS} names"));
        }
    }
    Ok(())
}

fn section_text(section: &Section) -> String {
    let body = match &section.outcome {
        Ok(answer) => answer.text.clone(),
        Err((code, message)) => format!("Error ({code}): {message}\n"),
    };
    format!("=== {} · {} ===\n{body}\n", section.company, section.topic)
}

fn section_json(section: &Section) -> Value {
    match &section.outcome {
        Ok(answer) => json!({
            "company": section.company,
            "topic": section.topic,
            "resolved_entity": answer.resolved_entity,
            "predicate": answer.predicate,
            "facts": answer.facts,
            "total": answer.total,
        }),
        Err((code, message)) => json!({
            "company": section.company,
            "topic": section.topic,
            "error": {"code": code, "message": message},
        }),
    }
}

/// The code and message a failed lookup would carry in its own envelope.
fn error_parts(err: &ToolError) -> (String, String) {
    match crate::envelope::from_error(err) {
        toolfleet_proto::Envelope::Err(body) => (body.code.to_string(), body.message),
        toolfleet_proto::Envelope::Ok(_) => (String::new(), String::new()),
    }
}

/// A summary from the facts alone: how many per year and predicate, the
/// first and last events, and the values that changed.
fn computed_summary(sections: &[Section], window: Window) -> String {
    let answered: Vec<(&Section, &Answer)> = sections
        .iter()
        .filter_map(|s| s.outcome.as_ref().ok().map(|a| (s, a)))
        .collect();
    let failed = sections.len() - answered.len();
    let facts: Vec<&Value> = answered.iter().flat_map(|(_, a)| &a.facts).collect();
    let mut summary = format!(
        "{} facts from {} to {} in {} sections{}.",
        facts.len(),
        window.start,
        window.end,
        sections.len(),
        if failed > 0 {
            format!(" ({failed} without data because of an error)")
        } else {
            String::new()
        }
    );
    if facts.is_empty() {
        summary.push_str(
            " The knowledge graph has nothing on these companies and topics in this period.",
        );
        return summary;
    }
    let mut per_year: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    for fact in &facts {
        let year = fact["valid_at"]
            .as_str()
            .map_or_else(|| "undated".to_owned(), |d| d[..4].to_owned());
        let predicate = fact["predicate"].as_str().unwrap_or_default().to_owned();
        *per_year
            .entry(year)
            .or_default()
            .entry(predicate)
            .or_default() += 1;
    }
    summary.push_str("\nPer year: ");
    let years: Vec<String> = per_year
        .iter()
        .map(|(year, counts)| {
            let total: usize = counts.values().sum();
            let detail: Vec<String> = counts.iter().map(|(p, n)| format!("{p} {n}")).collect();
            format!("{year}: {total} ({})", detail.join(", "))
        })
        .collect();
    summary.push_str(&years.join("; "));
    let mut dated: Vec<&Value> = facts
        .iter()
        .copied()
        .filter(|f| f["valid_at"].is_string())
        .collect();
    dated.sort_by(|a, b| a["valid_at"].as_str().cmp(&b["valid_at"].as_str()));
    if let (Some(first), Some(last)) = (dated.first(), dated.last()) {
        let _ = write!(
            summary,
            "\nFirst: {}.\nLast: {}.",
            event(first),
            event(last)
        );
    }
    let notable = notable_values(&answered);
    if !notable.is_empty() {
        let _ = write!(summary, "\nNotable values: {}.", notable.join("; "));
    }
    summary
}

fn event(fact: &Value) -> String {
    let text = |key: &str| fact[key].as_str().unwrap_or_default().to_owned();
    format!(
        "{} {} – {} – {}",
        text("valid_at"),
        text("subject"),
        text("predicate"),
        text("object")
    )
}

/// Per section, the first and last value when it changed (`HAS_REVENUE
/// 4272000000 (2016-12-31) → 9763000000 (2020-12-31)`).
fn notable_values(answered: &[(&Section, &Answer)]) -> Vec<String> {
    let mut notable = Vec::new();
    for (_, answer) in answered {
        let valued: Vec<&Value> = answer
            .facts
            .iter()
            .filter(|f| !f["value"].is_null() && f["valid_at"].is_string())
            .collect();
        let (Some(first), Some(last)) = (valued.first(), valued.last()) else {
            continue;
        };
        let show = |fact: &Value| {
            let value = match &fact["value"] {
                Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            format!(
                "{value} ({})",
                fact["valid_at"].as_str().unwrap_or_default()
            )
        };
        let line = if valued.len() == 1 {
            show(first)
        } else {
            format!("{} → {}", show(first), show(last))
        };
        notable.push(format!(
            "{} {}: {line}",
            answer.resolved_entity, answer.predicate
        ));
        if notable.len() == MAX_NOTABLE {
            break;
        }
    }
    notable
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::knowledge_graph::KgOptions;
    use crate::tools::knowledge_graph::model::ModelOptions;
    use wiremock::matchers::{body_string_contains, method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    fn tool(options: &KgOptions) -> TrendAnalysis {
        TrendAnalysis::new(KnowledgeBase::start(options).expect("the sample graph loads"))
    }

    fn with_model(base_url: String) -> KgOptions {
        KgOptions {
            model: ModelOptions {
                base_url,
                api_key_env: String::new(),
                timeout: Duration::from_secs(2),
                ..ModelOptions::default()
            },
            ..KgOptions::default()
        }
    }

    fn three_by_three() -> Value {
        json!({
            "question": "How did their launches, research and revenue change?",
            "companies": ["AMD", "NVIDIA", "Nokiaa"],
            "start_date_range": "2016-01-01",
            "end_date_range": "2020-12-31",
            "topic_filter": ["LAUNCHED", "research", "revenue"],
        })
    }

    #[test]
    fn manifest_is_strict_with_bounded_lists() {
        let manifest = tool(&KgOptions::default()).manifest();
        assert_eq!(manifest.name, "trend_analysis");
        assert!(manifest.strict);
        let schema = &manifest.parameters;
        assert_eq!(schema["additionalProperties"], false);
        assert_eq!(schema["required"].as_array().unwrap().len(), 5);
        assert_eq!(schema["properties"]["companies"]["maxItems"], MAX_ITEMS);
        assert!(jsonschema::validator_for(schema).is_ok());
        assert_eq!(
            manifest.shape_above_bytes,
            Some(65_536),
            "read whole, mostly"
        );
    }

    #[tokio::test]
    async fn sections_come_in_argument_order_and_a_failed_one_shows_its_error() {
        let data = tool(&KgOptions::default())
            .call(three_by_three(), ToolContext::for_test())
            .await
            .unwrap();
        let sections = data["sections"].as_array().unwrap();
        let order: Vec<(&str, &str)> = sections
            .iter()
            .map(|s| (s["company"].as_str().unwrap(), s["topic"].as_str().unwrap()))
            .collect();
        assert_eq!(
            order,
            [
                ("AMD", "LAUNCHED"),
                ("AMD", "research"),
                ("AMD", "revenue"),
                ("NVIDIA", "LAUNCHED"),
                ("NVIDIA", "research"),
                ("NVIDIA", "revenue"),
                ("Nokiaa", "LAUNCHED"),
                ("Nokiaa", "research"),
                ("Nokiaa", "revenue"),
            ]
        );
        for section in &sections[..6] {
            assert!(
                !section["facts"].as_array().unwrap().is_empty(),
                "{section}"
            );
        }
        assert_eq!(sections[1]["predicate"], "DEVELOPED");
        assert_eq!(sections[2]["predicate"], "HAS_REVENUE");
        for section in &sections[6..] {
            assert_eq!(section["error"]["code"], "ENTITY_NOT_FOUND", "{section}");
            assert!(section.get("facts").is_none());
        }
        let text = data["text"].as_str().unwrap();
        assert!(
            text.starts_with("=== AMD · LAUNCHED ===\n1. AMD – LAUNCHED – "),
            "{text}"
        );
        assert!(
            text.contains("=== Nokiaa · revenue ===\nError (ENTITY_NOT_FOUND): "),
            "{text}"
        );
        assert_eq!(data["summary_source"], "computed");
        let summary = data["summary"].as_str().unwrap();
        assert!(
            summary.contains("in 9 sections (3 without data because of an error)"),
            "{summary}"
        );
        assert!(summary.contains("Per year: 2016: "), "{summary}");
        assert!(summary.contains("\nFirst: 2016-"), "{summary}");
        assert!(
            summary.contains("AMD HAS_REVENUE: 4272000000 (2016-12-31) → 9763000000 (2020-12-31)"),
            "{summary}"
        );
        assert!(text.ends_with(&format!("=== Summary ===\n{summary}\n")));
    }

    #[tokio::test]
    async fn the_model_summarises_from_the_facts_and_its_failure_is_not_the_tools() {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path("/good/chat/completions"))
            .and(body_string_contains("Question: How did their launches"))
            .and(body_string_contains("=== AMD · LAUNCHED ==="))
            .and(body_string_contains("only the facts"))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({
                "choices": [{"message": {"content": " AMD moved from Polaris to Zen. "}}]
            })))
            .mount(&server)
            .await;
        Mock::given(path("/down/chat/completions"))
            .respond_with(ResponseTemplate::new(500))
            .mount(&server)
            .await;
        let data = tool(&with_model(format!("{}/good", server.uri())))
            .call(three_by_three(), ToolContext::for_test())
            .await
            .unwrap();
        assert_eq!(data["summary_source"], "model");
        assert_eq!(data["summary"], "AMD moved from Polaris to Zen.");

        let data = tool(&with_model(format!("{}/down", server.uri())))
            .call(three_by_three(), ToolContext::for_test())
            .await
            .unwrap();
        assert_eq!(data["summary_source"], "computed");
        assert_eq!(data["sections"].as_array().unwrap().len(), 9);
    }

    #[tokio::test]
    async fn the_model_maps_unknown_words_once_and_is_never_trusted() {
        let server = MockServer::start().await;
        Mock::given(body_string_contains("\"content\":\"tech bets\""))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({
                "choices": [{"message": {"content": "INVESTS_IN."}}]
            })))
            .expect(1)
            .mount(&server)
            .await;
        Mock::given(body_string_contains("\"content\":\"vibes\""))
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({
                "choices": [{"message": {"content": "DROP TABLE; use EVERYTHING"}}]
            })))
            .mount(&server)
            .await;
        let mut options = with_model(server.uri());
        options.model.timeout = Duration::from_secs(2);
        let tool = tool(&options);
        let args = |topics: Value| {
            json!({
                "question": "q",
                "companies": ["AMD", "Intel"],
                "start_date_range": "2016-01-01",
                "end_date_range": "2020-12-31",
                "topic_filter": topics,
            })
        };
        let data = tool
            .call(args(json!(["tech bets", "vibes"])), ToolContext::for_test())
            .await
            .unwrap();
        let sections = data["sections"].as_array().unwrap();
        assert_eq!(sections[0]["predicate"], "INVESTS_IN", "{data}");
        assert_eq!(
            sections[2]["predicate"], "INVESTS_IN",
            "remembered for Intel"
        );
        assert_eq!(sections[1]["error"]["code"], "INVALID_PREDICATE");
        assert!(
            sections[1]["error"]["message"]
                .as_str()
                .unwrap()
                .contains("LAUNCHED"),
            "lists the valid names"
        );
    }

    #[tokio::test]
    async fn the_largest_call_shares_a_fact_budget_and_fits_the_output_limit() {
        let companies = [
            "AMD",
            "NVIDIA",
            "Intel",
            "Apple",
            "Microsoft",
            "Google",
            "Amazon",
            "Facebook",
            "TSMC",
            "Qualcomm",
        ];
        let topics = [
            "LAUNCHED",
            "HAS_REVENUE",
            "DEVELOPED",
            "TARGETS",
            "INVESTS_IN",
            "HOLDS_ROLE",
            "INCREASED",
            "DECREASED",
            "SUPPLIES",
            "DISCONTINUED",
        ];
        let data = tool(&KgOptions::default())
            .call(
                json!({"question": "everything", "companies": companies,
                       "start_date_range": "2000-01-01", "end_date_range": "2030-12-31",
                       "topic_filter": topics}),
                ToolContext::for_test(),
            )
            .await
            .unwrap();
        let sections = data["sections"].as_array().unwrap();
        assert_eq!(sections.len(), 100);
        let per_section = MAX_TREND_FACTS / 100;
        assert!(
            sections
                .iter()
                .all(|s| s["facts"].as_array().is_none_or(|f| f.len() <= per_section))
        );
        assert!(
            sections
                .iter()
                .any(|s| s["total"].as_u64().unwrap_or(0) > per_section as u64),
            "the budget cut some section short"
        );
        let size = serde_json::to_vec(&data).unwrap().len();
        assert!(size < 1024 * 1024 / 2, "{size} bytes");
    }

    #[tokio::test]
    async fn bad_arguments_are_terminal_and_bounded() {
        let tool = tool(&KgOptions::default());
        let mut args = three_by_three();
        args["start_date_range"] = json!("2021-01-01");
        let err = tool.call(args, ToolContext::for_test()).await.unwrap_err();
        assert!(
            matches!(&err, ToolError::Coded { code, .. } if code.to_string() == "INVALID_DATE_RANGE"),
            "{err}"
        );
        for (key, value) in [
            ("companies", json!([])),
            ("topic_filter", json!(vec!["LAUNCHED"; 11])),
            ("question", json!("?".repeat(MAX_QUESTION_CHARS + 1))),
        ] {
            let mut args = three_by_three();
            args[key] = value;
            let err = tool.call(args, ToolContext::for_test()).await.unwrap_err();
            assert!(
                matches!(err, ToolError::InvalidArguments(_)),
                "{key}: {err}"
            );
        }
    }
}
