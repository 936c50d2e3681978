//! The dashboard and alert rules in `deploy/observability/`: the rules are
//! valid (`promtool check rules`), and every metric a dashboard panel or a
//! rule names is exported by a running fleet, to Prometheus and over OTLP.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Value, json};
use toolfleet_proto::v1;
use toolfleet_tests::fleet::{ApiClient, Fleet, run_job, scripted_job, test_fleet};
use toolfleet_tests::otlp::Collector;
use toolfleet_tests::wait_until;

const DEPLOY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/observability");

/// The toolfleet metric names in `text` (`toolfleet_..._bucket` included:
/// that is the series a histogram quantile reads).
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(start) = rest.find("toolfleet_") {
        let name: String = rest[start..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
            .collect();
        rest = &rest[start + name.len()..];
        names.insert(name);
    }
    names
}

/// Every query of the dashboard's panels.
fn dashboard_queries() -> anyhow::Result<String> {
    let text = std::fs::read_to_string(format!("{DEPLOY}/grafana-dashboard.json"))?;
    let dashboard: Value = serde_json::from_str(&text)?;
    let panels = dashboard["panels"]
        .as_array()
        .ok_or_else(|| anyhow::anyhow!("the dashboard has no panels"))?;
    let mut queries = String::new();
    for panel in panels {
        for target in panel["targets"].as_array().into_iter().flatten() {
            queries.push_str(target["expr"].as_str().unwrap_or_default());
            queries.push('\n');
        }
    }
    anyhow::ensure!(!queries.is_empty(), "the dashboard queries nothing");
    Ok(queries)
}

/// Runs the promtool that scripts/setup extracts (it installs no
/// Prometheus server) with `args`, from `deploy/observability`; what it
/// said, or why it failed.
fn promtool(args: &[&str]) -> anyhow::Result<String> {
    let promtool = toolfleet_tests::repo_root().join(".tools/bin/promtool");
    let ran = std::process::Command::new(&promtool)
        .args(args)
        .current_dir(DEPLOY)
        .output()
        .map_err(|err| {
            anyhow::anyhow!(
                "cannot run {} ({err}); scripts/setup installs it",
                promtool.display()
            )
        })?;
    let said =
        String::from_utf8_lossy(&ran.stdout).into_owned() + &String::from_utf8_lossy(&ran.stderr);
    anyhow::ensure!(ran.status.success(), "promtool {args:?}: {said}");
    Ok(said)
}

#[test]
fn the_alert_rules_are_valid() -> anyhow::Result<()> {
    let said = promtool(&["check", "rules", "alerts.yml"])?;
    assert!(said.contains("SUCCESS: 8 rules found"), "{said}");
    Ok(())
}

#[test]
fn the_alerts_fire_on_what_they_are_meant_for_and_only_then() -> anyhow::Result<()> {
    // alerts.test.yml: series in, alerts (labels, annotations) out.
    let said = promtool(&["test", "rules", "alerts.test.yml"])?;
    assert!(said.contains("SUCCESS"), "{said}");
    Ok(())
}

/// A fleet of one worker and one orchestrator, each exporting metrics on
/// its own address and to `collector` over OTLP every 300 ms.
async fn fleet_exporting_metrics(
    collector: &Collector,
    worker_metrics: &str,
    orchestrator_metrics: &str,
) -> anyhow::Result<Fleet> {
    let otlp = [
        (
            "TOOLFLEET_TELEMETRY__OTLP_ENDPOINT",
            collector.endpoint.as_str(),
        ),
        ("OTEL_METRIC_EXPORT_INTERVAL", "300"),
    ];
    let mut worker_env = vec![("TOOLFLEET_METRICS__LISTEN", worker_metrics)];
    worker_env.extend(otlp);
    let mut fleet = Fleet::start(test_fleet(1).worker_env(&worker_env)).await?;
    let mut orchestrator_env = vec![("TOOLFLEET_METRICS__LISTEN", orchestrator_metrics)];
    orchestrator_env.extend(otlp);
    fleet.spawn_orchestrator(&orchestrator_env).await?;
    fleet.wait_for_tools(0, &["echo", "fail"], 1).await?;
    Ok(fleet)
}

/// A call held for approval, decided only once the gauge has seen it wait
/// (refreshed every 5 s): the approvals' families.
async fn approve_a_call_the_gauge_saw_wait(
    api: &ApiClient,
    orchestrator_metrics: &str,
) -> anyhow::Result<()> {
    let mut held = scripted_job(
        "held",
        &json!([{"tool_calls": [{"id": "c", "name": "echo", "arguments": {}}]}, {"message": "ok"}]),
    );
    held.require_approval = vec!["echo".into()];
    let held = api.clone().submit_job(held).await?.into_inner().job_id;
    wait_until("the held job to park", Duration::from_secs(30), || {
        let mut api = api.clone();
        let request = v1::GetJobRequest {
            job_id: held.clone(),
        };
        async move {
            api.get_job(request)
                .await
                .is_ok_and(|job| job.get_ref().status() == v1::JobStatus::WaitingForApproval)
        }
    })
    .await?;
    let waiting = r#"toolfleet_approvals_pending{tenant="default",tool="echo"} 1"#;
    wait_until(
        "the held call in the gauge",
        Duration::from_secs(30),
        || async {
            scrape(orchestrator_metrics)
                .await
                .lines()
                .any(|line| line == waiting)
        },
    )
    .await?;
    api.clone()
        .decide_call(v1::DecideCallRequest {
            job_id: held.clone(),
            call_id: "c".into(),
            decision: v1::Decision::Approve.into(),
            reason: String::new(),
            arguments: None,
            result: None,
        })
        .await?;
    Ok(())
}

/// Every metric in `queried` is in a scrape of the two services (the
/// fleet's gauges are refreshed every 5 s).
async fn every_metric_is_scraped(
    queried: &BTreeSet<String>,
    scraped: [&str; 2],
) -> anyhow::Result<()> {
    let missing = || async {
        let exported = scrape(scraped[0]).await + &scrape(scraped[1]).await;
        queried
            .iter()
            .filter(|name| !exported.lines().any(|l| is_series_of(l, name)))
            .cloned()
            .collect::<Vec<_>>()
    };
    let exported = wait_until(
        "every queried metric in a scrape",
        Duration::from_secs(30),
        || async { missing().await.is_empty() },
    )
    .await;
    if let Err(err) = exported {
        anyhow::bail!("{err}: never exported: {:?}", missing().await);
    }
    Ok(())
}

/// The same metrics over OTLP, under their family names.
async fn every_family_is_pushed(
    queried: &BTreeSet<String>,
    collector: &Collector,
) -> anyhow::Result<()> {
    let families: BTreeSet<String> = queried
        .iter()
        .map(|name| name.strip_suffix("_bucket").unwrap_or(name).to_owned())
        .collect();
    let pushed = wait_until(
        "every queried metric over OTLP",
        Duration::from_secs(30),
        || async { families.is_subset(&collector.metric_names()) },
    )
    .await;
    if let Err(err) = pushed {
        let received = collector.metric_names();
        anyhow::bail!(
            "{err}: never pushed: {:?}",
            families.difference(&received).collect::<Vec<_>>()
        );
    }
    Ok(())
}

/// Every metric a dashboard panel or an alert rule queries is exported by
/// a running fleet that ran a retried call, a failed one and an approved
/// one, to Prometheus and over OTLP.
#[tokio::test]
async fn every_metric_a_panel_or_rule_queries_is_exported_by_a_running_fleet() -> anyhow::Result<()>
{
    let mut queried = metric_names(&dashboard_queries()?);
    queried.extend(metric_names(&std::fs::read_to_string(format!(
        "{DEPLOY}/alerts.yml"
    ))?));
    assert!(queried.len() > 10, "{queried:?}");

    let (worker_metrics, orchestrator_metrics) = (
        toolfleet_tests::free_loopback_address()?,
        toolfleet_tests::free_loopback_address()?,
    );
    let collector = Collector::start().await?;
    let fleet = fleet_exporting_metrics(&collector, &worker_metrics, &orchestrator_metrics).await?;
    let api = fleet.api(0).await?;
    // A retried call, a failed one, a job that fails: every family has a
    // series. Takeovers and redeliveries are counters that start at 0.
    let script = json!([
        {"tool_calls": [
            {"name": "echo", "arguments": {}},
            {"name": "fail", "arguments": {"mode": "retryable", "fail_attempts": 1}},
            {"name": "fail", "arguments": {"mode": "terminal"}}]},
        {"message": "done"}
    ]);
    let job = run_job(&api, scripted_job("metrics", &script)).await?;
    assert_eq!(job.status, v1::JobStatus::Succeeded as i32, "{job:?}");
    approve_a_call_the_gauge_saw_wait(&api, &orchestrator_metrics).await?;
    every_metric_is_scraped(&queried, [&orchestrator_metrics, &worker_metrics]).await?;
    every_family_is_pushed(&queried, &collector).await
}

/// Whether an exposition line is a sample of metric `name` (of a
/// histogram's buckets, for a histogram's own name).
fn is_series_of(line: &str, name: &str) -> bool {
    let sample_of = |name: &str| {
        line.strip_prefix(name)
            .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
    };
    sample_of(name) || sample_of(&format!("{name}_bucket"))
}

async fn scrape(address: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut stream) = tokio::net::TcpStream::connect(address).await else {
        return String::new();
    };
    let request = format!("GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n");
    let mut response = String::new();
    if stream.write_all(request.as_bytes()).await.is_err()
        || stream.read_to_string(&mut response).await.is_err()
    {
        return String::new();
    }
    response
}
