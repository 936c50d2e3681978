//! The knowledge-graph tools through the real fleet: a worker process serving
//! the sample graph, an orchestrator playing scripts, NATS and Redis.

use serde_json::{Value, json};
use toolfleet_cli::demo::{self, Demo};
use toolfleet_proto::v1;
use toolfleet_proto::v1::item::Kind;
use toolfleet_tests::fleet::{Fleet, run_scripted, test_fleet};
use wiremock::matchers::{body_string_contains, header, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

const KG_TOOLS: &[&str] = &["factual_qa", "trend_analysis"];

async fn fleet(worker_env: &[(&str, &str)]) -> anyhow::Result<Fleet> {
    let mut fleet = Fleet::start(test_fleet(1).worker_env(worker_env)).await?;
    fleet.spawn_orchestrator(&[]).await?;
    fleet.wait_for_tools(0, KG_TOOLS, 1).await?;
    Ok(fleet)
}

/// The envelope of the job's first tool result.
fn first_result(job: &v1::Job) -> Value {
    job.items
        .iter()
        .find_map(|item| match &item.kind {
            Some(Kind::ToolResult(result)) => {
                Some(serde_json::from_str(&result.output).expect("tool outputs are envelopes"))
            }
            _ => None,
        })
        .expect("the job has a tool result")
}

fn three_by_three() -> Value {
    json!([
        {"tool_calls": [{"name": "trend_analysis", "arguments": {
            "question": "How did launches, research and revenue change?",
            "companies": ["AMD", "Nokiaa", "NVIDIA"],
            "start_date_range": "2016-01-01",
            "end_date_range": "2020-12-31",
            "topic_filter": ["LAUNCHED", "researched", "revenue"]}}]},
        {"message": "{{call_0_0.data.summary}}"}
    ])
}

#[tokio::test]
async fn a_trend_over_three_companies_and_topics_keeps_going_past_a_failed_section()
-> anyhow::Result<()> {
    let fleet = fleet(&[]).await?;
    let api = fleet.api(0).await?;
    let job = run_scripted(&api, "trend", &three_by_three()).await?;
    assert_eq!(job.status, v1::JobStatus::Succeeded as i32, "{job:?}");
    let envelope = first_result(&job);
    let data = &envelope["data"];
    let sections = data["sections"].as_array().expect("sections");
    assert_eq!(sections.len(), 9, "{data}");
    for (n, section) in sections.iter().enumerate() {
        let company = ["AMD", "Nokiaa", "NVIDIA"][n / 3];
        let topic = ["LAUNCHED", "researched", "revenue"][n % 3];
        assert_eq!(
            (section["company"].as_str(), section["topic"].as_str()),
            (Some(company), Some(topic))
        );
        if company == "Nokiaa" {
            assert_eq!(section["error"]["code"], "ENTITY_NOT_FOUND", "{section}");
        } else {
            assert!(
                !section["facts"].as_array().expect("facts").is_empty(),
                "{section}"
            );
        }
    }
    assert_eq!(sections[1]["predicate"], "DEVELOPED");
    assert_eq!(data["summary_source"], "computed");
    assert_eq!(
        job.output_text,
        data["summary"].as_str().unwrap_or_default()
    );
    assert!(
        job.output_text.contains("9 sections (3 without data"),
        "{}",
        job.output_text
    );
    Ok(())
}

#[tokio::test]
async fn trend_summaries_come_from_the_configured_openai_compatible_model() -> anyhow::Result<()> {
    let model = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .and(header("authorization", "Bearer sk-kg-test"))
        .and(body_string_contains("Question: How did launches, research and revenue change?"))
        .and(body_string_contains("AMD – LAUNCHED – Ryzen"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "id": "c1", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant",
                                     "content": "AMD shifted from graphics to Zen CPUs and data centers."}}]
        })))
        .expect(1)
        .mount(&model)
        .await;
    let base_url = format!("{}/v1", model.uri());
    let fleet = fleet(&[
        ("TOOLFLEET_KG__MODEL__BASE_URL", base_url.as_str()),
        ("TOOLFLEET_KG__MODEL__API_KEY_ENV", "KG_TEST_KEY"),
        ("KG_TEST_KEY", "sk-kg-test"),
    ])
    .await?;
    let api = fleet.api(0).await?;
    let job = run_scripted(&api, "trend", &three_by_three()).await?;
    let data = &first_result(&job)["data"];
    assert_eq!(data["summary_source"], "model", "{data}");
    assert_eq!(
        job.output_text,
        "AMD shifted from graphics to Zen CPUs and data centers."
    );
    assert_eq!(
        fleet.count_in_worker_logs("sk-kg-test"),
        0,
        "the key never reaches a log"
    );
    Ok(())
}

#[tokio::test]
async fn the_cookbook_questions_are_answered_from_the_graph() -> anyhow::Result<()> {
    let fleet = fleet(&[]).await?;
    let api = fleet.api(0).await?;
    let answer = |demo: Demo| {
        let api = api.clone();
        async move {
            let script: Value = serde_json::from_str(demo.script)?;
            let job = run_scripted(&api, demo.question, &script).await?;
            anyhow::ensure!(
                job.status == v1::JobStatus::Succeeded as i32,
                "{}: {job:?}",
                demo.question
            );
            anyhow::Ok(job.output_text)
        }
    };
    let launches = answer(demo::AMD_LAUNCHES).await?;
    for product in [
        "Radeon RX 480",
        "Ryzen",
        "EPYC",
        "Radeon RX 6000",
        "Instinct MI100",
    ] {
        assert!(launches.contains(product), "{product} in {launches}");
    }
    assert!(!launches.contains("{{"), "every quote resolved: {launches}");

    let research = answer(demo::AMD_RESEARCH).await?;
    for topic in [
        "Zen microarchitecture",
        "RDNA graphics architecture",
        "CDNA compute architecture",
        "Xilinx",
        "data center",
        "=== AMD · DEVELOPED ===",
        "Per year: 2016: ",
    ] {
        assert!(research.contains(topic), "{topic} in {research}");
    }
    Ok(())
}

#[tokio::test]
async fn a_worker_serves_the_graph_file_its_configuration_names() -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("toolfleet-kg-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let graph = dir.join("graph.jsonl");
    let aliases = dir.join("aliases.json");
    std::fs::write(
        &graph,
        concat!(
            r#"{"subject":"Initech","predicate":"LAUNCHED","object":"TPS Reports 2.0","valid_at":"2019-02-01","statement":"Initech launched TPS Reports 2.0.","statement_type":"FACT"}"#,
            "\n"
        ),
    )?;
    std::fs::write(&aliases, r#"{"Office Space Corp": "Initech"}"#)?;
    let fleet = fleet(&[
        (
            "TOOLFLEET_KG__GRAPH_PATH",
            graph.to_str().unwrap_or_default(),
        ),
        (
            "TOOLFLEET_KG__ALIASES_PATH",
            aliases.to_str().unwrap_or_default(),
        ),
    ])
    .await?;
    let api = fleet.api(0).await?;
    let ask = |entity: &str| {
        json!([
            {"tool_calls": [{"name": "factual_qa", "arguments": {
                "entity": entity, "start_date_range": "2019-01-01",
                "end_date_range": "2019-12-31", "predicate": "released"}}]},
            {"message": "{{call_0_0.data.text}}"}
        ])
    };
    let job = run_scripted(&api, "initech", &ask("Office Space Corp")).await?;
    assert!(
        job.output_text
            .starts_with("1. Initech – LAUNCHED – TPS Reports 2.0 [Valid-from: 2019-02-01]"),
        "{}",
        job.output_text
    );
    let job = run_scripted(&api, "amd", &ask("AMD")).await?;
    assert_eq!(
        first_result(&job)["error"]["code"],
        "ENTITY_NOT_FOUND",
        "the sample graph is not served alongside"
    );
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
