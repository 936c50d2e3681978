//! The deployment files under `deploy/` against the binaries they run. No
//! container engine runs here, so each check runs what a file configures
//! with the workspace's own binaries (tests/deploy/*.py, in the venv that
//! scripts/setup makes).

use toolfleet_tests::{NatsServer, cargo_bin, repo_root, venv_python};

/// Runs `tests/deploy/<script>` with `args`, then the binaries' dir and a
/// test NATS server's URL; returns what it said, failing if it failed.
async fn check(script: &str, args: &[&str]) -> anyhow::Result<String> {
    let nats = NatsServer::start().await?;
    let bin_dir = cargo_bin("toolfleet-worker")?
        .parent()
        .expect("a binary is in a dir")
        .to_owned();
    let output = tokio::process::Command::new(venv_python()?)
        .arg(repo_root().join("tests/deploy").join(script))
        .args(args.iter().map(|a| repo_root().join(a)))
        .arg(bin_dir)
        .arg(nats.url())
        .output()
        .await?;
    let said = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    anyhow::ensure!(output.status.success(), "{script} failed:\n{said}");
    Ok(said)
}

/// `deploy/docker-compose.yml`: the one-off setup creates what the workers
/// need, every service's command and environment load in its binary, and
/// every healthcheck is a subcommand of it.
#[tokio::test]
async fn the_compose_file_runs_with_the_binaries_it_names() -> anyhow::Result<()> {
    let said = check(
        "compose.py",
        &["deploy/docker-compose.yml", "deploy/Dockerfile"],
    )
    .await?;
    assert!(
        said.contains("compose: 4 toolfleet containers checked"),
        "{said}"
    );
    Ok(())
}

/// `deploy/helm/toolfleet`: lint without errors or warnings, every manifest
/// of every value set valid for a current Kubernetes (KEDA's ScaledObjects
/// against KEDA's CRD schema, each scaling its pool on its tools'
/// consumers), bad values refused, and every container's command,
/// environment and probes run by the binary it names (the setup Job for
/// real).
#[tokio::test]
async fn the_helm_chart_lints_validates_and_runs_with_the_binaries_it_names() -> anyhow::Result<()>
{
    let said = check("chart.py", &["deploy/helm/toolfleet"]).await?;
    assert!(said.contains("chart: 7 value sets"), "{said}");
    assert!(said.contains("10 bad value sets refused"), "{said}");
    Ok(())
}
