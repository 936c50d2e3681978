//! The architecture as a test: which workspace crate may depend on which.
//! `docs/ARCHITECTURE.md` draws the same graph; a new edge is a design
//! decision, made here and there together.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use anyhow::Context as _;
use serde_json::Value;

/// Every allowed dependency between workspace crates, for normal and build
/// dependencies (dev-dependencies are the tests' business).
const ALLOWED: &[(&str, &[&str])] = &[
    ("toolfleet-proto", &[]),
    ("toolfleet-service", &["toolfleet-proto"]),
    (
        "toolfleet-worker",
        &["toolfleet-proto", "toolfleet-service"],
    ),
    // Never the worker: the orchestrator links no tool.
    (
        "toolfleet-orchestrator",
        &["toolfleet-proto", "toolfleet-service"],
    ),
    (
        "toolfleet-cli",
        &[
            "toolfleet-proto",
            "toolfleet-service",
            "toolfleet-orchestrator",
            "toolfleet-worker",
        ],
    ),
    ("toolfleet-tests", &["toolfleet-proto", "toolfleet-cli"]),
];

/// The workspace crates and their normal and build dependencies on each other.
fn crate_graph() -> anyhow::Result<BTreeMap<String, BTreeSet<String>>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .context("cannot run cargo metadata")?;
    anyhow::ensure!(
        output.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: Value = serde_json::from_slice(&output.stdout)?;
    let packages = metadata["packages"].as_array().context("no packages")?;
    let members: BTreeSet<String> = packages
        .iter()
        .filter_map(|p| p["name"].as_str().map(str::to_owned))
        .collect();
    let mut graph = BTreeMap::new();
    for package in packages {
        let name = package["name"]
            .as_str()
            .context("a package without a name")?;
        let deps = package["dependencies"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|d| d["kind"].as_str() != Some("dev"))
            .filter_map(|d| d["name"].as_str())
            .filter(|d| members.contains(*d))
            .map(str::to_owned)
            .collect();
        graph.insert(name.to_owned(), deps);
    }
    Ok(graph)
}

#[test]
fn crates_depend_only_along_the_documented_edges() -> anyhow::Result<()> {
    let graph = crate_graph()?;
    let allowed: BTreeMap<&str, BTreeSet<&str>> = ALLOWED
        .iter()
        .map(|(name, deps)| (*name, deps.iter().copied().collect()))
        .collect();
    assert_eq!(
        graph.keys().map(String::as_str).collect::<BTreeSet<_>>(),
        allowed.keys().copied().collect::<BTreeSet<_>>(),
        "a crate was added or removed: update ALLOWED and docs/ARCHITECTURE.md"
    );
    for (name, deps) in &graph {
        let extra: Vec<&str> = deps
            .iter()
            .map(String::as_str)
            .filter(|d| !allowed[name.as_str()].contains(d))
            .collect();
        assert!(
            extra.is_empty(),
            "{name} depends on {extra:?}, which the architecture does not allow"
        );
    }
    assert!(
        !graph["toolfleet-orchestrator"].contains("toolfleet-worker"),
        "the orchestrator must not depend on the worker crate"
    );
    Ok(())
}
