//! `factual_qa`: the facts of one entity and one predicate that were true at
//! some point of a date window, both its outgoing and incoming edges.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};
use toolfleet_proto::{Effects, ToolManifest};

use super::{KnowledgeBase, Window};
use crate::tool::{Tool, ToolContext, ToolError};
use crate::tools::knowledge_graph::predicate::Predicate;

const NAME: &str = "factual_qa";

/// Time for the work itself: an indexed lookup takes microseconds, and a
/// graph being swapped in never blocks a reader.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// The `factual_qa` tool.
#[derive(Debug, Clone)]
pub struct FactualQa {
    base: Arc<KnowledgeBase>,
}

impl FactualQa {
    /// The tool over a knowledge base (shared with `trend_analysis`).
    pub fn new(base: Arc<KnowledgeBase>) -> Self {
        Self { base }
    }
}

#[derive(Deserialize)]
struct Args {
    entity: String,
    start_date_range: String,
    end_date_range: String,
    predicate: String,
}

impl Tool for FactualQa {
    fn manifest(&self) -> ToolManifest {
        let description = format!(
            "Query the temporal knowledge graph for the facts about one entity (a company, \
             person or product) with one kind of relationship that were true at some point \
             between two dates. Use it for questions such as \"What did AMD launch between 2016 \
             and 2020?\". Returns each fact with its dates, its source statement and whether \
             the statement is a FACT, OPINION or PREDICTION. The predicate is one of: {}.",
            Predicate::names()
        );
        let model_time = self.base.model().map_or(Duration::ZERO, |m| m.timeout());
        ToolManifest::new(
            NAME,
            description,
            json!({
                "type": "object",
                "properties": {
                    "entity": {
                        "type": "string",
                        "description": "The entity's name, e.g. \"AMD\" or \"Lisa Su\"."
                    },
                    "start_date_range": {
                        "type": "string",
                        "description": "First day of the window, YYYY-MM-DD (included)."
                    },
                    "end_date_range": {
                        "type": "string",
                        "description": "Last day of the window, YYYY-MM-DD (included)."
                    },
                    "predicate": {
                        "type": "string",
                        "description": "The relationship, e.g. LAUNCHED, DEVELOPED, HAS_REVENUE, HOLDS_ROLE."
                    }
                },
                "required": ["entity", "start_date_range", "end_date_range", "predicate"],
                "additionalProperties": false
            }),
        )
        .with_timeout(LOOKUP_TIMEOUT + model_time)
        .with_max_attempts(3)
        .with_effects(Effects::ReadOnly)
    }

    async fn call(&self, args: Value, _ctx: ToolContext) -> Result<Value, ToolError> {
        let args: Args = serde_json::from_value(args)
            .map_err(|err| ToolError::InvalidArguments(err.to_string()))?;
        let window = Window::of(&args.start_date_range, &args.end_date_range)?;
        let answer = self
            .base
            .lookup(&args.entity, &args.predicate, window)
            .await?;
        Ok(answer.to_json())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::knowledge_graph::{KgOptions, KnowledgeBase};

    fn sample() -> FactualQa {
        FactualQa::new(KnowledgeBase::start(&KgOptions::default()).expect("the sample graph loads"))
    }

    async fn ask(
        tool: &FactualQa,
        entity: &str,
        start: &str,
        end: &str,
        predicate: &str,
    ) -> Result<Value, ToolError> {
        tool.call(
            json!({"entity": entity, "start_date_range": start, "end_date_range": end, "predicate": predicate}),
            ToolContext::for_test(),
        )
        .await
    }

    fn objects(data: &Value) -> Vec<String> {
        data["facts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["object"].as_str().unwrap().to_owned())
            .collect()
    }

    fn code(err: &ToolError) -> String {
        match err {
            ToolError::Coded { code, .. } => code.to_string(),
            ToolError::InvalidArguments(_) => "INVALID_TOOL_ARGUMENTS".into(),
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn manifest_is_strict_and_valid() {
        let manifest = sample().manifest();
        assert_eq!(manifest.name, "factual_qa");
        assert!(manifest.strict);
        assert_eq!(manifest.effects, Effects::ReadOnly);
        assert!(toolfleet_proto::manifest::is_valid_tool_name(
            &manifest.name
        ));
        let schema = &manifest.parameters;
        assert_eq!(schema["additionalProperties"], false);
        assert_eq!(schema["required"].as_array().unwrap().len(), 4);
        assert!(jsonschema::validator_for(schema).is_ok());
    }

    #[tokio::test]
    async fn what_amd_launched_between_2016_and_2020() {
        let tool = sample();
        let data = ask(&tool, "AMD", "2016-01-01", "2020-12-31", "LAUNCHED")
            .await
            .unwrap();
        assert_eq!(data["resolved_entity"], "AMD");
        assert_eq!(data["predicate"], "LAUNCHED");
        let launched = objects(&data);
        assert!(launched.len() >= 12, "{launched:?}");
        for product in ["Ryzen", "EPYC", "Radeon RX 6000"] {
            assert!(
                launched.iter().any(|o| o.contains(product)),
                "{product} in {launched:?}"
            );
        }
        let text = data["text"].as_str().unwrap();
        assert!(text.starts_with("1. AMD – LAUNCHED – "), "{text}");
        assert!(text.contains("[Valid-from: 2017-"), "{text}");
        assert!(
            text.contains("\n   Statement: ") && text.contains("\n   Type: FACT"),
            "{text}"
        );
        let dates: Vec<&str> = data["facts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["valid_at"].as_str().unwrap())
            .collect();
        assert!(
            dates.windows(2).all(|w| w[0] <= w[1]),
            "oldest first: {dates:?}"
        );
        assert!(
            dates
                .iter()
                .all(|d| ("2016-01-01"..="2020-12-31").contains(d))
        );
    }

    #[tokio::test]
    async fn coerced_predicates_and_fuzzy_names_give_the_same_facts() {
        let tool = sample();
        let exact = ask(&tool, "AMD", "2016-01-01", "2020-12-31", "LAUNCHED")
            .await
            .unwrap();
        for (entity, predicate) in [
            ("amd", "launched"),
            ("AMD Inc.", "released"),
            ("Advanced Micro Devices", "introduced"),
            ("Advanced Micro Devices, Inc.", "Launched"),
            ("AMD", "LAUNCHD"),
        ] {
            let data = ask(
                &tool,
                entity,
                "2016/01/01",
                "2020-12-31T23:59:59Z",
                predicate,
            )
            .await
            .unwrap();
            assert_eq!(data["resolved_entity"], "AMD", "{entity}");
            assert_eq!(data["facts"], exact["facts"], "{entity} / {predicate}");
        }
        let research = ask(&tool, "AMD", "2016-01-01", "2020-12-31", "researched")
            .await
            .unwrap();
        assert_eq!(research["predicate"], "DEVELOPED");
        assert!(!objects(&research).is_empty());
    }

    #[tokio::test]
    async fn window_edges_are_inclusive_and_open_intervals_stay_valid() {
        let tool = sample();
        // One launch, found on exactly its day and not a day before.
        let all = ask(&tool, "AMD", "2016-01-01", "2020-12-31", "LAUNCHED")
            .await
            .unwrap();
        let first = &all["facts"][0];
        let day = first["valid_at"].as_str().unwrap();
        let on_the_day = ask(&tool, "AMD", day, day, "LAUNCHED").await.unwrap();
        assert!(on_the_day["facts"].as_array().unwrap().contains(first));
        let before = ask(&tool, "AMD", "2015-01-01", "2015-12-31", "LAUNCHED")
            .await
            .unwrap();
        assert!(!before["facts"].as_array().unwrap().contains(first));
        // Lisa Su's role has no end: it is still valid long after it began.
        let later = ask(&tool, "Lisa Su", "2020-06-01", "2020-06-01", "HOLDS_ROLE")
            .await
            .unwrap();
        assert_eq!(objects(&later), ["AMD"], "{later}");
        assert!(later["facts"][0]["invalid_at"].is_null());
    }

    #[tokio::test]
    async fn a_role_that_ended_is_not_valid_after_its_end() {
        let tool = sample();
        let data = ask(&tool, "Intel", "2016-01-01", "2020-12-31", "HOLDS_ROLE")
            .await
            .unwrap();
        let ended: Vec<&Value> = data["facts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["invalid_at"].is_string())
            .collect();
        let fact = ended
            .first()
            .expect("the sample graph has an Intel role that ended");
        let end = fact["invalid_at"].as_str().unwrap();
        let after = ask(&tool, "Intel", end, "2020-12-31", "HOLDS_ROLE")
            .await
            .unwrap();
        assert!(
            !after["facts"].as_array().unwrap().contains(fact),
            "a fact is not valid on its invalid_at day"
        );
    }

    #[tokio::test]
    async fn incoming_edges_are_found() {
        let tool = sample();
        let data = ask(&tool, "AMD", "2016-01-01", "2020-12-31", "SUPPLIES")
            .await
            .unwrap();
        assert!(
            data["facts"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f["subject"] == "TSMC" && f["object"] == "AMD"),
            "{data}"
        );
    }

    #[tokio::test]
    async fn mistakes_get_terminal_errors_that_say_what_to_send() {
        let tool = sample();
        let err = ask(&tool, "AMD", "2020-12-31", "2016-01-01", "LAUNCHED")
            .await
            .unwrap_err();
        assert_eq!(code(&err), "INVALID_DATE_RANGE");
        assert!(!err.is_retryable());
        assert!(
            err.to_string().contains("call again with the earlier date"),
            "{err}"
        );

        let err = ask(&tool, "AMD", "2016-01-01", "2020-12-31", "weather")
            .await
            .unwrap_err();
        assert_eq!(code(&err), "INVALID_PREDICATE");
        assert!(
            err.to_string().contains("LAUNCHED") && err.to_string().contains("SECURED"),
            "{err}"
        );

        let err = ask(&tool, "Nokiaa Oyj", "2016-01-01", "2020-12-31", "LAUNCHED")
            .await
            .unwrap_err();
        assert_eq!(code(&err), "ENTITY_NOT_FOUND");

        let err = ask(&tool, "Samsung", "2016-01-01", "2020-12-31", "LAUNCHED")
            .await
            .unwrap_err();
        assert_eq!(code(&err), "AMBIGUOUS_ENTITY");
        let message = err.to_string();
        assert!(
            message.contains("Samsung Electronics") && message.contains("Samsung SDI"),
            "{message}"
        );

        let err = ask(&tool, "AMD", "last year", "2020-12-31", "LAUNCHED")
            .await
            .unwrap_err();
        assert_eq!(code(&err), "INVALID_TOOL_ARGUMENTS");
        assert!(err.to_string().contains("YYYY-MM-DD"), "{err}");
    }

    #[tokio::test]
    async fn no_data_is_an_answer_that_names_what_was_asked() {
        let tool = sample();
        let data = ask(&tool, "AMD", "2016-01-01", "2016-01-02", "DISCONTINUED")
            .await
            .unwrap();
        assert_eq!(data["facts"], json!([]));
        assert_eq!(
            data["text"],
            "No data found for AMD with predicate DISCONTINUED between 2016-01-01 and 2016-01-02."
        );
    }
}
