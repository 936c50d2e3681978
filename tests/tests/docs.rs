//! The documentation keeps up with the code: every configuration key of both
//! services has its row in `docs/configuration.md`, and every default the
//! docs state is the code's.

use serde_json::Value;
use toolfleet_tests::markdown;

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

/// The value at dotted `path` of `options`.
fn at<'a>(options: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.')
        .try_fold(options, |value, key| value.get(key))
}

/// A default as the docs write it: a string bare, anything else as JSON.
fn as_written(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// Each `(key, stated default)` of `text`: a configuration guide row
/// ``| `key` | `default` |`` and a prose ``` `key` (default `value`) ```.
fn stated_defaults(text: &str) -> Vec<(String, String)> {
    let row = regex::Regex::new(r"(?m)^\| `([a-z_.]+)` \| `([^`]*)` \|").unwrap();
    let prose = regex::Regex::new(r"`([a-z_]+\.[a-z_.]+)` \(default `([^`]*)`\)").unwrap();
    row.captures_iter(text)
        .chain(prose.captures_iter(text))
        .map(|found| (found[1].to_owned(), found[2].to_owned()))
        .collect()
}

/// Whether two writings of a default are the same value: `100` and
/// `100.0`, `120s` and `2m` are.
fn same(actual: &str, stated: &str) -> bool {
    if actual == stated {
        return true;
    }
    if let (Ok(a), Ok(b)) = (actual.parse::<f64>(), stated.parse::<f64>()) {
        return a == b;
    }
    matches!(
        (humantime::parse_duration(actual), humantime::parse_duration(stated)),
        (Ok(a), Ok(b)) if a == b
    )
}

fn read(path: &str) -> String {
    std::fs::read_to_string(format!("{}/../{path}", env!("CARGO_MANIFEST_DIR")))
        .unwrap_or_else(|err| panic!("{path}: {err}"))
}

#[test]
fn every_stated_default_is_the_codes() {
    let worker = serde_json::to_value(toolfleet_worker::WorkerOptions::default()).unwrap();
    let orchestrator =
        serde_json::to_value(toolfleet_orchestrator::config::OrchestratorOptions::default())
            .unwrap();
    let guide = read("docs/configuration.md");
    let (mut wrong, mut checked) = (Vec::new(), 0);
    let mut check = |source: &str, text: &str, options: &[&Value]| {
        for (key, stated) in stated_defaults(text) {
            checked += 1;
            let actual: Vec<String> = options
                .iter()
                .filter_map(|options| at(options, &key))
                .map(as_written)
                .collect();
            // A computed default (`<hostname>-<pid>`) is said, not shown.
            let computed = stated.contains('<');
            if !computed && !actual.is_empty() && !actual.iter().any(|a| same(a, &stated)) {
                wrong.push(format!(
                    "{source}: {key} is stated as {stated:?}, is {actual:?}"
                ));
            }
        }
    };
    check(
        "configuration.md (worker)",
        section(&guide, "## toolfleet-worker"),
        &[&worker],
    );
    check(
        "configuration.md (orchestrator)",
        section(&guide, "## toolfleet-orchestrator"),
        &[&orchestrator],
    );
    for doc in [
        "README.md",
        "docs/api.md",
        "docs/deploy.md",
        "docs/observability.md",
        "docs/security.md",
        "orchestrator/README.md",
        "worker/README.md",
        "clients/python/README.md",
    ] {
        check(doc, &read(doc), &[&worker, &orchestrator]);
    }
    assert!(
        wrong.is_empty(),
        "defaults the docs get wrong:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn every_rpc_is_named_where_the_api_is_described() {
    let proto = read("proto/toolfleet/v1/agent.proto");
    let rpcs: Vec<&str> = proto
        .lines()
        .filter_map(|line| line.trim().strip_prefix("rpc "))
        .filter_map(|rest| rest.split('(').next())
        .collect();
    assert!(rpcs.len() >= 6, "{rpcs:?}");
    for doc in ["docs/api.md", "orchestrator/README.md"] {
        let text = read(doc);
        let missing: Vec<_> = rpcs
            .iter()
            .filter(|rpc| !text.contains(&format!("`{rpc}`")))
            .collect();
        assert!(missing.is_empty(), "{doc} does not name {missing:?}");
    }
}

/// The rule of `toolfleet_tests::markdown`: each command of the docs' shell
/// blocks is one a test runs, or its block says why it is not run.
#[test]
fn every_command_a_reader_copies_is_run_or_says_why_not() {
    let mut run = 0;
    let mut unrunnable = Vec::new();
    for doc in markdown::RUN_DOCS {
        for block in markdown::blocks(&read(doc)) {
            if let Some(why) = &block.not_run {
                assert!(
                    !why.is_empty(),
                    "{doc}:{}: `not run:` with no reason",
                    block.line
                );
                continue;
            }
            if !block.is_shell() {
                continue;
            }
            for command in block.commands() {
                match markdown::runner(&command) {
                    Some(_) => run += 1,
                    None => unrunnable.push(format!("{doc}:{}: {command}", block.line)),
                }
            }
        }
    }
    assert!(
        unrunnable.is_empty(),
        "no test runs these; make them toolfleet, grpcurl, python or pip \
         commands, or mark their block `<!-- not run: why -->`:\n{}",
        unrunnable.join("\n")
    );
    assert!(run >= 15, "commands run: {run}");
}

#[test]
fn a_block_is_read_with_its_marker_indentation_and_continuations() {
    let text = "1. Start:\n\n   <!-- not run: needs a cluster -->\n   ```sh\n   helm install tf \\\n     chart\n   ```\n\n```sh\n# a comment\ntoolfleet tools\n\ngrpcurl -plaintext 127.0.0.1:PORT list\n```\n";
    let blocks = markdown::blocks(text);
    assert_eq!(blocks.len(), 2);
    assert_eq!(blocks[0].not_run.as_deref(), Some("needs a cluster"));
    assert_eq!(blocks[0].commands(), ["helm install tf chart"]);
    assert_eq!(blocks[1].line, 9);
    assert_eq!(blocks[1].not_run, None);
    assert_eq!(
        blocks[1].commands(),
        ["toolfleet tools", "grpcurl -plaintext 127.0.0.1:PORT list"]
    );
    assert_eq!(
        markdown::commands_for(text, markdown::Runner::Python, "127.0.0.1:4"),
        ["grpcurl -plaintext 127.0.0.1:4 list"]
    );
}
