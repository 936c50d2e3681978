//! The deployment files under `deploy/` against the binaries they run. No
//! container engine runs here, so each check runs what a file configures
//! with the workspace's own binaries (tests/deploy/*.py, in the venv that
//! scripts/setup makes).

use std::path::{Path, PathBuf};

use toolfleet_tests::{NatsServer, cargo_bin};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is in the repository")
        .to_owned()
}

/// The venv's Python, where scripts/setup installed the checks' packages.
fn python() -> anyhow::Result<PathBuf> {
    let python = repo().join(".tools/venv/bin/python");
    anyhow::ensure!(
        python.exists(),
        "{} is missing: run scripts/setup",
        python.display()
    );
    Ok(python)
}

/// `deploy/docker-compose.yml`: the one-off setup creates what the workers
/// need, every service's command and environment load in its binary, and
/// every healthcheck is a subcommand of it.
#[tokio::test]
async fn the_compose_file_runs_with_the_binaries_it_names() -> anyhow::Result<()> {
    let nats = NatsServer::start().await?;
    let bin_dir = cargo_bin("toolfleet-worker")?
        .parent()
        .expect("a binary is in a dir")
        .to_owned();
    let output = tokio::process::Command::new(python()?)
        .arg(repo().join("tests/deploy/compose.py"))
        .arg(repo().join("deploy/docker-compose.yml"))
        .arg(repo().join("deploy/Dockerfile"))
        .arg(bin_dir)
        .arg(nats.url())
        .output()
        .await?;
    let said = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{said}");
    assert!(
        said.contains("compose: 4 toolfleet services checked"),
        "{said}"
    );
    Ok(())
}
