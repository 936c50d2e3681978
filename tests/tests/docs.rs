//! The documentation keeps up with the code: every configuration key of both
//! services has its row in `docs/configuration.md`.

use serde_json::Value;

/// The dotted paths of every leaf of a serialized options value; an empty
/// map (such as `runtime.tool_timeouts`) is a leaf.
fn keys(value: &Value, prefix: &str, out: &mut Vec<String>) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (key, child) in map {
                let path = if prefix.is_empty() {
                    key.clone()
                } else {
                    format!("{prefix}.{key}")
                };
                keys(child, &path, out);
            }
        }
        _ => out.push(prefix.to_owned()),
    }
}

/// The section of the configuration guide that starts with `heading`.
fn section<'a>(guide: &'a str, heading: &str) -> &'a str {
    let start = guide
        .find(heading)
        .unwrap_or_else(|| panic!("{heading} is in docs/configuration.md"));
    let rest = &guide[start + heading.len()..];
    &rest[..rest.find("\n## ").unwrap_or(rest.len())]
}

fn undocumented(options: &Value, documented: impl Fn(&str) -> bool) -> Vec<String> {
    let mut all = Vec::new();
    keys(options, "", &mut all);
    all.into_iter().filter(|key| !documented(key)).collect()
}

fn has_row(section: &str, key: &str) -> bool {
    section.contains(&format!("| `{key}` |"))
}

/// The sections both services share; the guide documents them once, with
/// the worker.
const SHARED: [&str; 5] = ["nats.", "redis.", "metrics.", "telemetry.", "log."];

#[test]
fn every_configuration_key_is_documented() {
    let guide = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/configuration.md"
    ))
    .expect("docs/configuration.md is readable");
    let worker = serde_json::to_value(toolfleet_worker::WorkerOptions::default()).unwrap();
    let worker_section = section(&guide, "## toolfleet-worker");
    let missing = undocumented(&worker, |key| has_row(worker_section, key));
    assert!(missing.is_empty(), "worker keys without a row: {missing:?}");
    let orchestrator =
        serde_json::to_value(toolfleet_orchestrator::config::OrchestratorOptions::default())
            .unwrap();
    let own = section(&guide, "## toolfleet-orchestrator");
    assert!(own.contains(
        "`nats.*`, `redis.*`, `metrics.*`, `telemetry.*` and `log.*` are the same keys as the worker's"
    ));
    let missing = undocumented(&orchestrator, |key| {
        has_row(own, key)
            || (SHARED.iter().any(|prefix| key.starts_with(prefix)) && has_row(worker_section, key))
    });
    assert!(
        missing.is_empty(),
        "orchestrator keys without a row: {missing:?}"
    );
}

/// Every metric a service exports has a row in its README's table.
#[test]
fn every_metric_is_documented() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    for service in ["orchestrator", "worker"] {
        let source = std::fs::read_to_string(format!("{root}/{service}/src/metrics.rs"))
            .expect("the metrics module is readable");
        let readme = std::fs::read_to_string(format!("{root}/{service}/README.md"))
            .expect("the README is readable");
        let names: Vec<&str> = source
            .split('"')
            .filter(|part| part.starts_with("toolfleet_") && !part.contains(' '))
            .collect();
        assert!(names.len() >= 5, "{service}: {names:?}");
        let missing: Vec<_> = names
            .iter()
            .filter(|name| !readme.contains(&format!("| `{name}` |")))
            .collect();
        assert!(missing.is_empty(), "{service}/README.md lacks {missing:?}");
    }
}
