//! The deployment files under `deploy/` against the binaries they run. No
//! container engine runs here, so each check runs what a file configures
//! with the workspace's own binaries (tests/deploy/*.py, in the venv that
//! scripts/setup makes).

use toolfleet_tests::{NatsCluster, NatsServer, cargo_bin, repo_root, venv_python};

/// The NATS a check's setup steps run against.
enum Nats {
    /// The check starts its own servers.
    None,
    /// One server, as `deploy/docker-compose.yml` has.
    Server,
    /// Three nodes, since the chart's default keeps three copies of each
    /// stream (`nats.replicas`).
    Cluster,
}

/// Runs `tests/deploy/<script>` with `args` (paths in the repository), the
/// binaries' dir and the URL of the test NATS `nats` asks for; returns what
/// it said, failing if it failed.
async fn check(script: &str, args: &[&str], nats: Nats) -> anyhow::Result<String> {
    let (server, cluster) = match nats {
        Nats::None => (None, None),
        Nats::Server => (Some(NatsServer::start().await?), None),
        Nats::Cluster => (None, Some(NatsCluster::start(3).await?)),
    };
    let url = server
        .as_ref()
        .map(NatsServer::url)
        .or_else(|| cluster.as_ref().map(NatsCluster::url));
    let bin_dir = cargo_bin("toolfleet-worker")?
        .parent()
        .expect("a binary is in a dir")
        .to_owned();
    let output = tokio::process::Command::new(venv_python()?)
        .arg(repo_root().join("tests/deploy").join(script))
        .args(args.iter().map(|a| repo_root().join(a)))
        .arg(bin_dir)
        .args(url)
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
        Nats::Server,
    )
    .await?;
    assert!(
        said.contains("compose: 4 toolfleet containers checked"),
        "{said}"
    );
    Ok(())
}

/// `deploy/helm/toolfleet`: lint without errors or warnings, every manifest
/// of every value set valid for a current Kubernetes (KEDA's ScaledObjects,
/// the ServiceMonitor and the PrometheusRule against their CRDs' schemas,
/// each ScaledObject scaling its pool on its tools' consumers), bad values
/// refused, the NATS and Redis users generated from the pools equal to
/// deploy/'s files (one pool more adds exactly its users), names DNS labels
/// under a 53-character release name, NetworkPolicies that select this
/// chart's pods only, and every container's configuration, environment
/// (over its image's), mounted files and ports run by the binary it names,
/// its probes HTTP on the port it serves metrics on (the setup Job for
/// real, on a NATS cluster: the defaults keep three copies of each stream);
/// the console's command line loads (`--print-config`) with its files, its
/// orchestrators' Service and its Redis user, its probes on its own port.
#[tokio::test]
async fn the_helm_chart_lints_validates_and_runs_with_the_binaries_it_names() -> anyhow::Result<()>
{
    // A value set runs the template of a worker of your own in a pool.
    toolfleet_tests::build_worker_template().await?;
    let said = check("chart.py", &["deploy/helm/toolfleet"], Nats::Cluster).await?;
    assert!(said.contains("chart: 12 value sets"), "{said}");
    assert!(said.contains("23 bad value sets refused"), "{said}");
    Ok(())
}

/// `k8s/`: exactly what the chart renders for users without Helm; kustomize
/// builds its base and its dev and prod overlays, every manifest is valid
/// for a current Kubernetes, and every container runs with the binary it
/// names (the setup Job for real).
#[tokio::test]
async fn the_kustomize_base_and_overlays_are_rendered_from_the_chart_and_build()
-> anyhow::Result<()> {
    let said = check(
        "kustomize.py",
        &["deploy/helm/toolfleet", "k8s"],
        Nats::Cluster,
    )
    .await?;
    assert!(said.contains("k8s: 3 kustomize builds"), "{said}");
    Ok(())
}

/// What the chart renders runs: its dev NATS and Redis with the users it
/// generates from the pools, the setup Job, the orchestrator and three
/// pools, as local processes with the rendered configuration, environment
/// and files. With two KEDA-scaled pools at zero, each ScaledObject's
/// trigger read against the live `/jsz` as KEDA reads it gives exactly the
/// calls waiting for that pool's tools; scaled up again, every job
/// succeeds, and so does `helm test`'s pod (a scripted job, and the
/// model-free check that every pool's tools are served).
#[tokio::test]
async fn the_rendered_chart_runs_a_fleet_and_keda_reads_its_backlog() -> anyhow::Result<()> {
    let said = check("pods.py", &["deploy/helm/toolfleet"], Nats::None).await?;
    assert!(
        said.contains("KEDA reads the lags {'tool_calculate': 3, 'tool_get_current_weather': 6}"),
        "{said}"
    );
    assert!(said.contains("pods: 3 jobs succeeded"), "{said}");
    assert!(
        said.contains("pods: helm test passed, a scripted job and every pool's tools served"),
        "{said}"
    );
    Ok(())
}

/// The chart's NATS users under GitOps (`credentials.existingSecret` and
/// `credentials.passwordHashes`): the same render every time with no
/// password in it; against a running nats-server, a pool's password
/// rotated by a reload of the rendered users file, and a new pool's
/// worker, refused at first, serving once the server restarts with it
/// (a reload does not bring in a new account's imports).
#[tokio::test]
async fn the_nats_users_render_the_same_rotate_by_reload_and_add_a_pool_by_restart()
-> anyhow::Result<()> {
    let said = check("reload.py", &["deploy/helm/toolfleet"], Nats::None).await?;
    assert!(
        said.contains("a password rotated by a reload, a pool added by a restart"),
        "{said}"
    );
    Ok(())
}

/// A simulated install (`tests/deploy/install.py`): what Helm, Argo CD and
/// a kubelet would do with the rendered chart, in order, with its pods as
/// processes (image environment, mounted files, probes as the kubelet
/// calls them). The defaults (on a NATS and a Redis outside the chart,
/// plain and over TLS) under `helm install --wait`, an upgrade adding a
/// pool with a new tool (GitOps credentials; the NATS restart and Redis
/// ACL an operator applies), and the dev values under an Argo CD sync
/// and under `--wait`, each reach Ready with no hook to deadlock on, and
/// their `helm test` pod runs a job through the queues to its end. The
/// console, on in the first two, signs a person in and out as a browser
/// would, its session in Redis as its own user (over TLS in the second).
#[tokio::test]
async fn a_simulated_install_reaches_ready_and_passes_helm_test() -> anyhow::Result<()> {
    let said = check("install.py", &["deploy/helm/toolfleet"], Nats::None).await?;
    for scenario in [
        "the defaults with helm install --wait",
        "NATS and Redis over TLS with helm install --wait",
        "a pool added by helm upgrade --wait",
        "the dev values with an Argo CD sync",
        "the dev values with helm install --wait",
    ] {
        assert!(
            said.contains(&format!("install: {scenario}: Ready, and helm test passed")),
            "{said}"
        );
    }
    for scenario in [
        "the defaults with helm install --wait",
        "NATS and Redis over TLS with helm install --wait",
    ] {
        assert!(
            said.contains(&format!(
                "install: {scenario}: the console signed a person in and out, its session in Redis"
            )),
            "{said}"
        );
    }
    Ok(())
}
