//! The architecture as a test: which workspace crate may depend on which.
//! `docs/ARCHITECTURE.md` draws the same graph; a new edge is a design
//! decision, made here and there together.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
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
    // The local fleet: the servers as supervised processes, the services
    // in-process or as processes.
    (
        "toolfleet-fleet",
        &[
            "toolfleet-proto",
            "toolfleet-service",
            "toolfleet-orchestrator",
            "toolfleet-worker",
        ],
    ),
    (
        "toolfleet-cli",
        &[
            "toolfleet-proto",
            "toolfleet-service",
            "toolfleet-orchestrator",
            "toolfleet-worker",
            "toolfleet-fleet",
        ],
    ),
    // The bench's own binary, which `toolfleet bench` runs.
    (
        "toolfleet-bench",
        &[
            "toolfleet-proto",
            "toolfleet-service",
            "toolfleet-orchestrator",
            "toolfleet-cli",
            "toolfleet-fleet",
        ],
    ),
    (
        "toolfleet-tests",
        &[
            "toolfleet-proto",
            "toolfleet-service",
            "toolfleet-cli",
            "toolfleet-fleet",
        ],
    ),
    // scripts/longest-functions: reads the others' source, links none.
    ("toolfleet-function-lengths", &[]),
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

/// The `src/` folders whose modules must not depend on each other in a circle.
const CRATE_SOURCES: &[&str] = &[
    "proto/src",
    "proto/service/src",
    "worker/src",
    "orchestrator/src",
    "orchestrator/cli/src",
    "fleet/src",
    "bench/src",
    "tests/src",
];

/// The top-level modules of a crate and the other top-level modules each one
/// names as `crate::<module>` outside its tests. Read from the text, which is
/// enough for a crate that spells its paths that way (ours do).
fn module_graph(src: &Path) -> anyhow::Result<BTreeMap<String, BTreeSet<String>>> {
    let mut files = Vec::new();
    let mut dirs = vec![src.to_owned()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    let module_of = |path: &PathBuf| -> String {
        let relative = path.strip_prefix(src).expect("below src");
        let first = relative.components().next().expect("a file");
        first
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_owned()
    };
    let modules: BTreeSet<String> = files
        .iter()
        .map(module_of)
        .filter(|m| m != "lib" && m != "main")
        .collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let module = module_of(file);
        if !modules.contains(&module) {
            continue;
        }
        let text = std::fs::read_to_string(file)?;
        let product = text.split("#[cfg(test)]").next().unwrap_or_default();
        let uses = product
            .match_indices("crate::")
            .map(|(at, _)| {
                product[at + "crate::".len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect::<String>()
            })
            .filter(|used| *used != module && modules.contains(used))
            .collect::<Vec<_>>();
        graph.entry(module).or_default().extend(uses);
    }
    Ok(graph)
}

/// A cycle in `graph`, if it has one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|n| n == node) {
            let mut cycle = path[start..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

#[test]
fn no_crate_has_a_cycle_between_its_modules() -> anyhow::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("the tests crate sits in the workspace root")?;
    for src in CRATE_SOURCES {
        let graph = module_graph(&root.join(src))?;
        assert!(!graph.is_empty(), "no modules read in {src}");
        if let Some(cycle) = find_cycle(&graph) {
            panic!(
                "{src}: the modules {} depend on each other in a circle",
                cycle.join(" -> ")
            );
        }
    }
    // The checker itself finds a circle where there is one.
    let circle: BTreeMap<String, BTreeSet<String>> = [
        ("model".to_owned(), BTreeSet::from(["store".to_owned()])),
        ("store".to_owned(), BTreeSet::from(["model".to_owned()])),
    ]
    .into();
    assert!(find_cycle(&circle).is_some());
    Ok(())
}
