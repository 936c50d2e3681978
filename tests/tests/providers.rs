//! The OpenAI providers end to end: an orchestrator process whose model is a
//! local fake server speaking the OpenAI wire format, and real workers.

use serde_json::{Value, json};
use toolfleet_proto::v1;
use toolfleet_tests::fleet::{Fleet, run_job, test_fleet};
use wiremock::matchers::{body_string_contains, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

#[tokio::test]
async fn chat_completions_two_round_loop_through_the_fleet() -> anyhow::Result<()> {
    let model = MockServer::start().await;
    // Second request (it carries the tool result): the final answer.
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .and(body_string_contains("\"role\":\"tool\""))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "id": "c2", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "23*19 is 437."}}]
        })))
        .with_priority(1)
        .mount(&model)
        .await;
    // First request: rate limited once, then a call with object arguments
    // (as some compatible servers send them).
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(ResponseTemplate::new(429).insert_header("retry-after-ms", "50"))
        .up_to_n_times(1)
        .with_priority(2)
        .mount(&model)
        .await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "id": "c1", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "finish_reason": "tool_calls",
                         "message": {"role": "assistant", "content": null, "tool_calls": [
                             {"id": "call_abc", "type": "function",
                              "function": {"name": "calculate", "arguments": {"expression": "23*19"}}}]}}]
        })))
        .with_priority(3)
        .mount(&model)
        .await;

    let mut fleet = Fleet::start(test_fleet(1)).await?;
    let base_url = format!("{}/v1", model.uri());
    fleet
        .spawn_orchestrator(&[
            ("OPENAI_API_KEY", "sk-test"),
            ("TOOLFLEET_OPENAI__BASE_URL", base_url.as_str()),
            ("TOOLFLEET_OPENAI__INITIAL_BACKOFF", "10ms"),
        ])
        .await?;
    fleet.wait_for_tools(0, &["calculate"], 1).await?;
    let api = fleet.api(0).await?;
    let job = run_job(
        &api,
        v1::SubmitJobRequest {
            input: "What is 23*19?".into(),
            model: Some(v1::ModelSpec {
                provider: "openai-chat".into(),
                name: "gpt-test".into(),
                ..Default::default()
            }),
            tools: vec!["calculate".into()],
            ..Default::default()
        },
    )
    .await?;
    assert_eq!(job.status, v1::JobStatus::Succeeded as i32, "{job:?}");
    assert_eq!(job.output_text, "23*19 is 437.");

    let requests = model.received_requests().await.expect("recording is on");
    assert_eq!(requests.len(), 3, "429, the call turn, the final turn");
    let last: Value = serde_json::from_slice(&requests[2].body)?;
    let messages = last["messages"].as_array().expect("messages");
    let tool = messages
        .iter()
        .find(|m| m["role"] == "tool")
        .expect("a tool message");
    assert_eq!(tool["tool_call_id"], "call_abc");
    let output: Value = serde_json::from_str(tool["content"].as_str().expect("content"))?;
    assert_eq!(
        output,
        json!({"ok": true, "data": {"expression": "23*19", "result": 437}})
    );
    let assistant = messages
        .iter()
        .find(|m| m["role"] == "assistant")
        .expect("the call message");
    assert_eq!(
        assistant["tool_calls"][0]["function"]["arguments"],
        r#"{"expression":"23*19"}"#
    );
    assert_eq!(last["tools"][0]["function"]["name"], "calculate");
    assert_eq!(last["tools"][0]["function"]["strict"], true);
    Ok(())
}

#[tokio::test]
async fn a_request_without_a_model_runs_on_the_configured_default_model() -> anyhow::Result<()> {
    let model = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .and(body_string_contains("\"model\":\"default-m\""))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "id": "c1", "object": "chat.completion", "created": 1, "model": "default-m",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "4"}}]
        })))
        .mount(&model)
        .await;
    let mut fleet = Fleet::start(test_fleet(1)).await?;
    let base_url = format!("{}/v1", model.uri());
    fleet
        .spawn_orchestrator(&[
            ("OPENAI_API_KEY", "sk-test"),
            ("TOOLFLEET_OPENAI__BASE_URL", base_url.as_str()),
            ("TOOLFLEET_API__DEFAULT_MODEL__PROVIDER", "openai-chat"),
            ("TOOLFLEET_API__DEFAULT_MODEL__NAME", "default-m"),
        ])
        .await?;
    let api = fleet.api(0).await?;
    let job = run_job(
        &api,
        v1::SubmitJobRequest {
            input: "What is 2+2?".into(),
            ..Default::default()
        },
    )
    .await?;
    assert_eq!(job.status, v1::JobStatus::Succeeded as i32, "{job:?}");
    assert_eq!(job.output_text, "4");
    Ok(())
}
