//! The OpenAI providers end to end: an orchestrator process whose model is a
//! local fake server speaking the OpenAI wire format, and real workers.

use std::time::Duration;

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

/// Claude through the fleet: the `anthropic-messages` provider against a
/// fake Messages API that refuses what the real one refuses. An overloaded
/// answer (529) is retried; the model's two parallel calls run, and their
/// envelopes go back as `tool_result` blocks in the calls' order, the
/// failed one with `is_error`; the key comes from a file (a mounted
/// Secret) and the usage, cache tokens included, reaches the turn's event.
#[tokio::test]
async fn anthropic_messages_two_round_loop_through_the_fleet() -> anyhow::Result<()> {
    use toolfleet_tests::messages::{MessagesServer, Reply};
    let claude = MessagesServer::start("sk-ant-test").await?;
    claude.push(Reply::Error {
        status: 529,
        kind: "overloaded_error",
        message: "Overloaded".into(),
        retry_after: Some(1),
    });
    claude.push(Reply::Message(json!({
        "content": [
            {"type": "text", "text": "Let me work both out."},
            {"type": "tool_use", "id": "toolu_a", "name": "calculate",
             "input": {"expression": "23*19"}},
            {"type": "tool_use", "id": "toolu_b", "name": "fail",
             "input": {"mode": "terminal", "code": "NOPE"}}
        ],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 50, "output_tokens": 20,
                  "cache_read_input_tokens": 100, "cache_creation_input_tokens": 7}
    })));
    claude.push(Reply::message(
        json!([{"type": "text", "text": "23*19 is 437; the other one failed."}]),
        "end_turn",
    ));
    let scratch = tempfile::tempdir()?;
    let key_file = scratch.path().join("anthropic-key");
    std::fs::write(&key_file, "sk-ant-test\n")?;
    let key_file = key_file.display().to_string();
    let base_url = claude.base_url();
    let mut fleet = Fleet::start(test_fleet(1)).await?;
    fleet
        .spawn_orchestrator(&[
            ("TOOLFLEET_ANTHROPIC__API_KEY_FILE", key_file.as_str()),
            ("TOOLFLEET_ANTHROPIC__BASE_URL", base_url.as_str()),
            ("TOOLFLEET_ANTHROPIC__INITIAL_BACKOFF", "10ms"),
            ("TOOLFLEET_ANTHROPIC__MAX_BACKOFF", "100ms"),
        ])
        .await?;
    fleet.wait_for_tools(0, &["calculate", "fail"], 1).await?;
    let api = fleet.api(0).await?;
    let job = run_job(
        &api,
        v1::SubmitJobRequest {
            input: "What is 23*19? And try the failing tool.".into(),
            instructions: "Use the tools.".into(),
            model: Some(v1::ModelSpec {
                provider: "anthropic-messages".into(),
                name: "claude-test".into(),
                max_tokens: 300,
                ..Default::default()
            }),
            tools: vec!["calculate".into(), "fail".into()],
            ..Default::default()
        },
    )
    .await?;
    assert_eq!(job.status, v1::JobStatus::Succeeded as i32, "{job:?}");
    assert_eq!(job.output_text, "23*19 is 437; the other one failed.");
    assert_eq!(claude.refusals(), Vec::<String>::new());

    let requests = claude.requests();
    assert_eq!(requests.len(), 3, "529, the call turn, the final turn");
    assert_eq!(requests[0], requests[1], "a retry resends the same body");
    let last = &requests[2];
    assert_eq!(last["system"], "Use the tools.");
    assert_eq!(last["max_tokens"], 300);
    assert_eq!(last["tool_choice"]["disable_parallel_tool_use"], false);
    // Automatic prompt caching, by default: the next turn reads this one's
    // prefix from the cache.
    assert_eq!(last["cache_control"], json!({"type": "ephemeral"}));
    assert_eq!(last["tools"][0]["name"], "calculate");
    assert_eq!(last["tools"][0]["input_schema"]["type"], "object");
    let messages = last["messages"].as_array().expect("messages");
    assert_eq!(messages.len(), 3, "{messages:?}");
    let calls = messages[1]["content"].as_array().expect("blocks");
    assert_eq!(calls[1]["input"], json!({"expression": "23*19"}));
    let results = messages[2]["content"].as_array().expect("blocks");
    assert_eq!(results[0]["tool_use_id"], "toolu_a");
    assert_eq!(results[0]["is_error"], false);
    let envelope: Value = serde_json::from_str(results[0]["content"].as_str().expect("text"))?;
    assert_eq!(envelope["data"]["result"], 437);
    assert_eq!(results[1]["tool_use_id"], "toolu_b");
    assert_eq!(results[1]["is_error"], true);

    let events = toolfleet_tests::fleet::events(&api, &job.job_id).await?;
    let turn = events
        .iter()
        .find(|(kind, _)| kind == "model_turn")
        .map(|(_, data)| data)
        .expect("a model_turn event");
    assert_eq!(
        turn["usage"],
        json!({"cache_read_tokens": 100, "cache_write_tokens": 7,
               "input_tokens": 157, "output_tokens": 20})
    );
    Ok(())
}

/// A rotated key file (a mounted Secret updated in place) is used from
/// the next request on, without a restart: the old key is revoked between
/// two jobs, and the second job is answered with the new one.
#[tokio::test]
async fn a_rotated_key_file_is_used_without_a_restart() -> anyhow::Result<()> {
    use toolfleet_tests::messages::{MessagesServer, Reply};
    let claude = MessagesServer::start("sk-ant-one").await?;
    let scratch = tempfile::tempdir()?;
    let key_file = scratch.path().join("anthropic-key");
    std::fs::write(&key_file, "sk-ant-one\n")?;
    let (key_path, base_url) = (key_file.display().to_string(), claude.base_url());
    let mut fleet = Fleet::start(test_fleet(0)).await?;
    fleet
        .spawn_orchestrator(&[
            ("TOOLFLEET_ANTHROPIC__API_KEY_FILE", key_path.as_str()),
            ("TOOLFLEET_ANTHROPIC__BASE_URL", base_url.as_str()),
        ])
        .await?;
    let api = fleet.api(0).await?;
    let job = v1::SubmitJobRequest {
        input: "Hello".into(),
        model: Some(v1::ModelSpec {
            provider: "anthropic-messages".into(),
            name: "claude-test".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    // Keys of two lengths: the file's change is told whatever the clock.
    for (round, key) in ["sk-ant-one", "sk-ant-rotated"].into_iter().enumerate() {
        if round > 0 {
            std::fs::write(&key_file, format!("{key}\n"))?;
            claude.set_key(key);
        }
        claude.push(Reply::message(
            json!([{"type": "text", "text": "Hi!"}]),
            "end_turn",
        ));
        let done = run_job(&api, job.clone()).await?;
        assert_eq!(done.status, v1::JobStatus::Succeeded as i32, "{done:?}");
    }
    assert_eq!(claude.refusals(), Vec::<String>::new());
    let log = std::fs::read_to_string(fleet.orchestrator(0).log_path())?;
    assert!(log.contains("anthropic.api_key_file changed"), "{log}");
    assert!(!log.contains("sk-ant-"), "no key in the log");
    Ok(())
}

/// A streamed job (`stream = true`): while Claude writes the answer, its
/// watcher gets `model_output_delta` events that spell it, before the
/// checkpointed turn; they are never stored, so a watch of the finished
/// job has none.
#[tokio::test]
async fn a_streamed_answer_reaches_the_watcher_as_it_is_written() -> anyhow::Result<()> {
    use toolfleet_tests::messages::{MessagesServer, Reply};
    let claude = MessagesServer::start("sk-ant-test").await?;
    let stream = toolfleet_tests::messages::hello_stream()?;
    claude.push(Reply::Stream(stream));
    let base_url = claude.base_url();
    // Two replicas: whichever runs the job, one watcher hears its deltas in
    // the same process and the other over NATS.
    let mut fleet = Fleet::start(test_fleet(0)).await?;
    let env = [
        ("ANTHROPIC_API_KEY", "sk-ant-test"),
        ("TOOLFLEET_ANTHROPIC__BASE_URL", base_url.as_str()),
    ];
    fleet.spawn_orchestrator(&env).await?;
    fleet.spawn_orchestrator(&env).await?;
    let api = fleet.api(0).await?;
    let job_id = api
        .clone()
        .submit_job(toolfleet_tests::messages::streamed_job("Hello"))
        .await?
        .into_inner()
        .job_id;
    let mut watches = Vec::new();
    for replica in 0..2 {
        let api = fleet.api(replica).await?;
        watches.push(toolfleet_tests::fleet::watch(&api, &job_id).await?);
    }
    // The model answers once both watches listen.
    toolfleet_tests::wait_until("the model to be asked", Duration::from_secs(30), || async {
        (!claude.requests().is_empty()).then_some(())
    })
    .await?;
    claude.release_stream();
    let mut streamed = Vec::new();
    for mut watch in watches {
        let mut seen = Vec::new();
        while let Some(event) = watch.message().await? {
            let done = event.r#final;
            seen.push((event.kind, serde_json::from_str::<Value>(&event.data)?));
            if done {
                break;
            }
        }
        let kinds: Vec<&str> = seen.iter().map(|(kind, _)| kind.as_str()).collect();
        let first_delta = kinds.iter().position(|k| *k == "model_output_delta");
        let turn = kinds.iter().position(|k| *k == "model_turn");
        assert!(first_delta.is_some() && first_delta < turn, "{kinds:?}");
        let text: String = seen
            .iter()
            .filter(|(kind, _)| kind == "model_output_delta")
            .map(|(_, data)| {
                assert_eq!(data["turn"], 0, "{data}");
                data["text"].as_str().unwrap_or_default().to_owned()
            })
            .collect();
        streamed.push(text);
    }
    let job = toolfleet_tests::fleet::wait_finished(&api, &job_id).await?;
    assert_eq!(job.status, v1::JobStatus::Succeeded as i32, "{job:?}");
    assert!(!job.output_text.is_empty());
    assert_eq!(streamed, [job.output_text.clone(), job.output_text.clone()]);
    assert_eq!(claude.requests()[0]["stream"], true);
    assert_eq!(claude.refusals(), Vec::<String>::new());

    let stored = toolfleet_tests::fleet::events(&api, &job_id).await?;
    assert!(
        stored.iter().all(|(kind, _)| kind != "model_output_delta"),
        "{stored:?}"
    );
    Ok(())
}

/// `toolfleet submit --stream --watch` prints a streamed answer as it is
/// written: one line that grows with each delta, before the turn's event.
#[tokio::test]
async fn the_cli_prints_a_streamed_answer_as_it_is_written() -> anyhow::Result<()> {
    use tokio::io::AsyncBufReadExt;
    use toolfleet_tests::messages::{MessagesServer, Reply};
    let claude = MessagesServer::start("sk-ant-test").await?;
    let stream = toolfleet_tests::messages::hello_stream()?;
    claude.push(Reply::Stream(stream));
    let base_url = claude.base_url();
    let mut fleet = Fleet::start(test_fleet(0)).await?;
    fleet
        .spawn_orchestrator(&[
            ("ANTHROPIC_API_KEY", "sk-ant-test"),
            ("TOOLFLEET_ANTHROPIC__BASE_URL", base_url.as_str()),
        ])
        .await?;
    let addr = fleet.grpc_url(0).await?;
    let mut cli = tokio::process::Command::new(toolfleet_tests::cargo_bin("toolfleet")?)
        .args([
            "submit",
            "--addr",
            &addr,
            "--provider",
            "anthropic-messages",
        ])
        .args(["--model", "claude-test", "--stream", "--watch", "Hello"])
        .env_remove("TOOLFLEET_ADDR")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut lines = tokio::io::BufReader::new(cli.stdout.take().expect("piped")).lines();
    let mut printed = Vec::new();
    // The watch prints the job's first event once it listens: then the
    // model may answer.
    while let Some(line) = lines.next_line().await? {
        let started = line.contains("job_queued");
        printed.push(line);
        if started {
            break;
        }
    }
    claude.release_stream();
    while let Some(line) = lines.next_line().await? {
        printed.push(line);
    }
    assert!(cli.wait().await?.success(), "{printed:#?}");
    let streamed = printed
        .iter()
        .position(|line| line.trim_start().starts_with("turn 1 > "))
        .unwrap_or_else(|| panic!("no streamed line: {printed:#?}"));
    let turn = printed
        .iter()
        .position(|line| line.contains("model_turn"))
        .expect("the turn's event");
    assert!(streamed < turn, "{printed:#?}");
    let job_text = printed[turn].split("model_turn").nth(1).unwrap_or_default();
    let text = printed[streamed]
        .trim_start()
        .trim_start_matches("turn 1 > ");
    assert!(!text.is_empty() && job_text.contains(text), "{printed:#?}");
    Ok(())
}

/// Watches that join in the middle of a streamed turn, one on the replica
/// that streams it and one on the other: each gets the turn so far as one
/// delta (`so_far`), then the live ones, and together they spell the
/// answer.
#[tokio::test]
async fn a_watch_that_joins_mid_turn_gets_the_turn_so_far() -> anyhow::Result<()> {
    use toolfleet_tests::messages::{MessagesServer, PAUSE, Reply};
    let claude = MessagesServer::start("sk-ant-test").await?;
    let whole = toolfleet_tests::messages::hello_stream()?;
    // Held after "Hello", and again after "!", before the end.
    let second = whole.find("event: content_block_delta\ndata: {\"type\": \"content_block_delta\", \"index\": 0, \"delta\": {\"type\": \"text_delta\", \"text\": \"!\"}}").expect("the second delta");
    let end = whole
        .find("event: content_block_stop")
        .expect("the block's end");
    claude.push(Reply::Stream(format!(
        "{}{PAUSE}{}{PAUSE}{}",
        &whole[..second],
        &whole[second..end],
        &whole[end..]
    )));
    let base_url = claude.base_url();
    let mut fleet = Fleet::start(test_fleet(0)).await?;
    let env = [
        ("ANTHROPIC_API_KEY", "sk-ant-test"),
        ("TOOLFLEET_ANTHROPIC__BASE_URL", base_url.as_str()),
    ];
    fleet.spawn_orchestrator(&env).await?;
    fleet.spawn_orchestrator(&env).await?;
    let api = fleet.api(0).await?;
    let job_id = api
        .clone()
        .submit_job(toolfleet_tests::messages::streamed_job("Hello"))
        .await?
        .into_inner()
        .job_id;
    let watch = |replica: usize| {
        let (job_id, fleet) = (&job_id, &fleet);
        async move { toolfleet_tests::fleet::watch(&fleet.api(replica).await?, job_id).await }
    };
    // A watch from the start sees "Hello" once the first part is out.
    let mut early = watch(0).await?;
    toolfleet_tests::wait_until("the model to be asked", Duration::from_secs(30), || async {
        (!claude.requests().is_empty()).then_some(())
    })
    .await?;
    claude.release_stream();
    while let Some(event) = early.message().await? {
        if event.kind == "model_output_delta" {
            break;
        }
    }
    // Two watches join now, each on one replica; their stored events say
    // they listen.
    let mut late = Vec::new();
    for replica in 0..2 {
        let mut stream = watch(replica).await?;
        while let Some(event) = stream.message().await? {
            if event.kind == "job_started" {
                break;
            }
        }
        late.push(stream);
    }
    // "!" comes while the turn still streams: each late watch joins, asks
    // and is answered.
    claude.release_stream();
    let mut joined = Vec::new();
    for mut stream in late {
        let mut deltas = Vec::new();
        while let Some(event) = stream.message().await? {
            if event.kind == "model_output_delta" {
                deltas.push(serde_json::from_str::<Value>(&event.data)?);
                break;
            }
        }
        joined.push((stream, deltas));
    }
    claude.release_stream();
    let job = toolfleet_tests::fleet::wait_finished(&api, &job_id).await?;
    assert_eq!(job.status, v1::JobStatus::Succeeded as i32, "{job:?}");
    for (mut stream, mut deltas) in joined {
        while let Some(event) = stream.message().await? {
            if event.kind == "model_output_delta" {
                deltas.push(serde_json::from_str::<Value>(&event.data)?);
            }
            if event.r#final {
                break;
            }
        }
        assert_eq!(
            deltas.first().map(|d| d["so_far"].clone()),
            Some(json!(true)),
            "{deltas:?}"
        );
        let text: String = deltas
            .iter()
            .map(|d| d["text"].as_str().unwrap_or_default().to_owned())
            .collect();
        assert_eq!(text, job.output_text, "{deltas:?}");
    }
    Ok(())
}
