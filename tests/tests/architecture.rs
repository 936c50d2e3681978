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
    // The console is a client of the public API and nothing more: never
    // the orchestrator's store, so it cannot show what the API would not.
    ("toolfleet-console", &["toolfleet-proto"]),
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
            "toolfleet-console",
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
    "service/src",
    "worker/src",
    "orchestrator/src",
    "cli/src",
    "fleet/src",
    "bench/src",
    "tests/src",
];

/// The top-level modules of a crate and the other top-level modules each one
/// names as `crate::<module>` outside its tests. Read from the text, which is
/// enough for a crate that spells its paths that way (ours do).
fn module_graph(src: &Path) -> anyhow::Result<Graph> {
    let (_, files) = tree(src)?;
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

/// The modules of each folder below a crate's top level (its files but
/// `mod.rs`, and its subfolders), each with the others it names as
/// `super::<module>` outside its tests: from a file directly in the
/// folder or a subfolder's `mod.rs` (`super::`), or from deeper in a
/// subfolder (`super::super::`, one more a level down).
fn folder_graphs(src: &Path) -> anyhow::Result<Vec<(PathBuf, Graph)>> {
    let (folders, _) = tree(src)?;
    let mut graphs = Vec::new();
    for folder in folders {
        let mut graph = Graph::new();
        let siblings = sibling_modules(&folder)?;
        for sibling in &siblings {
            for (file, depth) in module_files(&folder, sibling)? {
                let text = std::fs::read_to_string(&file)?;
                let product = text.split("#[cfg(test)]").next().unwrap_or_default();
                let named = names_after(product, &"super::".repeat(depth));
                graph.entry(sibling.clone()).or_default().extend(
                    named
                        .into_iter()
                        .filter(|name| name != sibling && siblings.contains(name)),
                );
            }
        }
        graphs.push((folder, graph));
    }
    Ok(graphs)
}

/// The folders below `src` and the `.rs` files in it, at any depth.
fn tree(src: &Path) -> anyhow::Result<(Vec<PathBuf>, Vec<PathBuf>)> {
    let (mut folders, mut files) = (Vec::new(), Vec::new());
    let mut dirs = vec![src.to_owned()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.is_dir() {
                folders.push(path.clone());
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    Ok((folders, files))
}

/// The modules a folder holds: its `.rs` files but `mod.rs`, and its
/// subfolders.
fn sibling_modules(folder: &Path) -> anyhow::Result<BTreeSet<String>> {
    let mut modules = BTreeSet::new();
    for entry in std::fs::read_dir(folder)? {
        let path = entry?.path();
        let name = path.file_stem().unwrap_or_default().to_string_lossy();
        if path.is_dir() || (path.extension().is_some_and(|e| e == "rs") && name != "mod") {
            modules.insert(name.into_owned());
        }
    }
    Ok(modules)
}

/// The files of the module `module` of `folder`, each with how many
/// `super::` reach the folder from it: its file (and its folder's
/// `mod.rs`) one, each level deeper one more.
fn module_files(folder: &Path, module: &str) -> anyhow::Result<Vec<(PathBuf, usize)>> {
    let mut files = Vec::new();
    let file = folder.join(format!("{module}.rs"));
    if file.exists() {
        files.push((file, 1));
    }
    let mut dirs = vec![(folder.join(module), 1)];
    while let Some((dir, depth)) = dirs.pop() {
        if !dir.is_dir() {
            continue;
        }
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.is_dir() {
                dirs.push((path, depth + 1));
            } else if path.file_name().is_some_and(|n| n == "mod.rs") {
                files.push((path, depth));
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push((path, depth + 1));
            }
        }
    }
    Ok(files)
}

/// The names `text` puts right after `prefix` (`super::name`, or each
/// name of `super::{a, b::c}`), where `prefix` is not itself the tail of a
/// longer one.
fn names_after(text: &str, prefix: &str) -> BTreeSet<String> {
    let word = |rest: &str| -> String {
        rest.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut names = BTreeSet::new();
    for (at, _) in text.match_indices(prefix) {
        if text[..at].ends_with("super::") {
            continue;
        }
        let rest = &text[at + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            names.extend(group.split(',').map(|item| word(item.trim())));
        } else {
            names.insert(word(rest));
        }
    }
    names.remove("");
    names.remove("super");
    names
}

/// A graph of modules: each with the modules it names.
type Graph = BTreeMap<String, BTreeSet<String>>;

/// A cycle in `graph`, if it has one.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
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
        for (folder, graph) in folder_graphs(&root.join(src))? {
            if let Some(cycle) = find_cycle(&graph) {
                panic!(
                    "{}: the modules {} depend on each other in a circle",
                    folder.display(),
                    cycle.join(" -> ")
                );
            }
        }
    }
    // The folders are read: the MCP modules of the worker name each other.
    let mcp = folder_graphs(&root.join("worker/src"))?
        .into_iter()
        .find(|(folder, _)| folder.ends_with("mcp"))
        .map(|(_, graph)| graph)
        .unwrap_or_default();
    assert!(mcp["supervisor"].contains("listing"), "{mcp:?}");
    assert!(mcp["listing"].contains("tool"), "{mcp:?}");
    // The checker itself finds a circle where there is one.
    let circle: BTreeMap<String, BTreeSet<String>> = [
        ("model".to_owned(), BTreeSet::from(["store".to_owned()])),
        ("store".to_owned(), BTreeSet::from(["model".to_owned()])),
    ]
    .into();
    assert!(find_cycle(&circle).is_some());
    Ok(())
}
