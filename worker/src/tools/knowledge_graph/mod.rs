//! The temporal knowledge-graph tools of the OpenAI cookbook's temporal agent:
//! `factual_qa` (the facts of one entity and predicate in a date window) and
//! `trend_analysis` (those facts for several companies and topics, with a
//! summary).
//!
//! - [`graph`]: the facts in memory, indexed per entity, predicate and time.
//! - [`entity`], [`predicate`], [`dates`]: how a caller's names, words and
//!   dates are understood.
//! - [`model`]: the optional OpenAI-compatible model (`kg.model`).
//! - [`factual_qa`], [`trend_analysis`]: the two tools, sharing one
//!   [`KnowledgeBase`].
//!
//! The graph is read-only reference data: each worker loads the JSON Lines
//! file at `kg.graph_path` (or the sample graph built into the binary) and
//! reloads it when the file changes, so workers stay stateless.

pub mod dates;
pub mod entity;
pub mod factual_qa;
pub mod graph;
pub mod model;
pub mod predicate;
pub mod trend_analysis;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use toolfleet_proto::ErrorCode;
use toolfleet_service::reload::{self, Fingerprint};
use tracing::{info, warn};

use crate::tool::ToolError;
use dates::{ACCEPTED_FORMATS, Day};
use entity::Resolution;
use graph::{Fact, Graph, LoadError};
use model::{Model, ModelOptions};
use predicate::Predicate;
use toolfleet_proto::envelope::excerpt;

pub use factual_qa::FactualQa;
pub use trend_analysis::TrendAnalysis;

/// The start of the window is after its end. Terminal.
pub const INVALID_DATE_RANGE: ErrorCode = ErrorCode::from_static("INVALID_DATE_RANGE");
/// The predicate matches none of the 20; the message lists them. Terminal.
pub const INVALID_PREDICATE: ErrorCode = ErrorCode::from_static("INVALID_PREDICATE");
/// Several entities match the name equally well; the message lists them.
/// Terminal.
pub const AMBIGUOUS_ENTITY: ErrorCode = ErrorCode::from_static("AMBIGUOUS_ENTITY");
/// No entity matches the name. Terminal.
pub const ENTITY_NOT_FOUND: ErrorCode = ErrorCode::from_static("ENTITY_NOT_FOUND");

/// The sample graph built into the binary: test and demo data.
const SAMPLE_GRAPH: &str = include_str!("../../../data/kg/sample-graph.jsonl");
/// The alias map of the sample graph.
const SAMPLE_ALIASES: &str = include_str!("../../../data/kg/sample-aliases.json");

/// Longest entity name or predicate word a caller may send.
const MAX_NAME_CHARS: usize = 200;
/// How much of a statement the text shows, as in the cookbook.
const STATEMENT_TEXT_CHARS: usize = 200;
/// How much of a statement the JSON carries: enough for any real sentence,
/// bounded so that a few odd lines cannot blow the output limit.
const STATEMENT_JSON_CHARS: usize = 1000;
/// Model answers remembered per word, so a trend over many companies asks
/// once per topic.
const MAX_REMEMBERED_WORDS: usize = 1024;

/// Settings of the knowledge-graph tools (`kg.*`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KgOptions {
    /// The graph, a JSON Lines file of facts (docs/tools/knowledge-graph.md).
    /// Default: none, which serves the sample graph built into the binary.
    /// `--kg-graph FILE` or `TOOLFLEET_KG__GRAPH_PATH` set it.
    pub graph_path: Option<PathBuf>,
    /// An alias map, a JSON object of alias to entity name ("Advanced Micro
    /// Devices": "AMD"). Default: none (the sample graph's own map with the
    /// sample graph).
    pub aliases_path: Option<PathBuf>,
    /// How often the files are checked for changes; a changed file is
    /// reloaded, and a file that fails to load leaves the previous graph in
    /// service. Default: 2s.
    #[serde(with = "toolfleet_service::config::duration")]
    pub reload_interval: Duration,
    /// Most facts one `factual_qa` answer (or one trend section) lists,
    /// oldest first; the answer says how many there were. Default: 50.
    pub max_facts: usize,
    /// The optional model for predicate words no rule knows, and for trend
    /// summaries.
    pub model: ModelOptions,
}

impl Default for KgOptions {
    fn default() -> Self {
        Self {
            graph_path: None,
            aliases_path: None,
            reload_interval: Duration::from_secs(2),
            max_facts: 50,
            model: ModelOptions::default(),
        }
    }
}

/// Why the knowledge-graph tools could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A graph or alias file is missing or invalid; the message names it.
    // The cause is in the message, not a source: the message is what the
    // reload watch logs, and a chain printed as a whole says it once.
    #[error("cannot load the knowledge graph {path}: {cause}")]
    Load {
        /// The file, or `the sample graph`.
        path: String,
        /// What is wrong.
        cause: LoadError,
    },
    /// `kg.max_facts` is 0.
    #[error("kg.max_facts must be at least 1")]
    NoFacts,
    /// The `kg.model` settings are wrong.
    #[error(transparent)]
    Model(#[from] model::SetupError),
}

/// Where the graph comes from.
#[derive(Debug, Clone)]
enum Source {
    Sample {
        aliases: Option<PathBuf>,
    },
    File {
        graph: PathBuf,
        aliases: Option<PathBuf>,
    },
}

impl Source {
    fn of(options: &KgOptions) -> Self {
        let set = |path: &Option<PathBuf>| path.clone().filter(|p| !p.as_os_str().is_empty());
        let aliases = set(&options.aliases_path);
        match set(&options.graph_path) {
            Some(graph) => Self::File { graph, aliases },
            None => Self::Sample { aliases },
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::Sample { .. } => "the sample graph".into(),
            Self::File { graph, .. } => graph.display().to_string(),
        }
    }

    fn load(&self) -> Result<Graph, Error> {
        let fail = |path: &Path, cause| Error::Load {
            path: path.display().to_string(),
            cause,
        };
        let aliases = |path: &Option<PathBuf>, default: Option<&str>| match path {
            Some(path) => std::fs::read_to_string(path)
                .map(Some)
                .map_err(|e| fail(path, LoadError::Read(e))),
            None => Ok(default.map(str::to_owned)),
        };
        match self {
            Self::Sample { aliases: path } => {
                let aliases = aliases(path, Some(SAMPLE_ALIASES))?;
                Graph::load(SAMPLE_GRAPH.as_bytes(), aliases.as_deref()).map_err(|cause| {
                    Error::Load {
                        path: self.describe(),
                        cause,
                    }
                })
            }
            Self::File {
                graph,
                aliases: path,
            } => {
                let aliases = aliases(path, None)?;
                let file =
                    std::fs::File::open(graph).map_err(|e| fail(graph, LoadError::Read(e)))?;
                Graph::load(std::io::BufReader::new(file), aliases.as_deref())
                    .map_err(|source| fail(graph, source))
            }
        }
    }

    /// The files whose changes reload the graph.
    fn paths(&self) -> Vec<PathBuf> {
        match self {
            Self::Sample { aliases } => aliases.iter().cloned().collect(),
            Self::File { graph, aliases } => std::iter::once(graph.clone())
                .chain(aliases.clone())
                .collect(),
        }
    }
}

/// The graph and model that both tools share.
#[derive(Debug)]
pub struct KnowledgeBase {
    graph: Arc<ArcSwap<Graph>>,
    model: Option<Model>,
    max_facts: usize,
    /// The model's answers per word: `None` when it found no predicate.
    remembered: Mutex<HashMap<String, Option<Predicate>>>,
}

impl KnowledgeBase {
    /// Loads the graph these options name, sets up the model, and (inside a
    /// tokio runtime) starts watching the files for changes.
    ///
    /// # Errors
    ///
    /// [`Error`] naming the file and line, or the setting, to fix.
    pub fn start(options: &KgOptions) -> Result<Arc<Self>, Error> {
        if options.max_facts == 0 {
            return Err(Error::NoFacts);
        }
        let source = Source::of(options);
        let paths = source.paths();
        let seen = Fingerprint::of(&paths);
        let graph = source.load()?;
        info!(graph = %source.describe(), facts = graph.len(), "knowledge graph loaded");
        let base = Arc::new(Self {
            graph: Arc::new(ArcSwap::from_pointee(graph)),
            model: Model::new(&options.model)?,
            max_facts: options.max_facts,
            remembered: Mutex::new(HashMap::new()),
        });
        reload::watch(
            &base.graph,
            paths,
            seen,
            options.reload_interval,
            "the knowledge graph",
            move || source.load(),
        );
        Ok(base)
    }

    /// A knowledge base over an already built graph, without a model or
    /// reloading: for tests and benchmarks.
    pub fn from_graph(graph: Graph, max_facts: usize) -> Arc<Self> {
        Arc::new(Self {
            graph: Arc::new(ArcSwap::from_pointee(graph)),
            model: None,
            max_facts: max_facts.max(1),
            remembered: Mutex::new(HashMap::new()),
        })
    }

    /// The graph in service now.
    pub fn graph(&self) -> Arc<Graph> {
        self.graph.load_full()
    }

    fn model(&self) -> Option<&Model> {
        self.model.as_ref()
    }

    /// The facts of `entity` with the predicate `word` means, in the window.
    ///
    /// # Errors
    ///
    /// A terminal [`ToolError`]: `INVALID_PREDICATE`, `AMBIGUOUS_ENTITY` or
    /// `ENTITY_NOT_FOUND`, with a message that tells the caller what to send.
    pub async fn lookup(
        &self,
        entity: &str,
        word: &str,
        window: Window,
    ) -> Result<Answer, ToolError> {
        let predicate = self.predicate(word).await?;
        self.facts(entity, predicate, window, self.max_facts)
    }

    /// The facts of `entity` with `predicate` in the window, at most `limit`
    /// of them (and at most `kg.max_facts`).
    ///
    /// # Errors
    ///
    /// A terminal [`ToolError`]: `AMBIGUOUS_ENTITY` or `ENTITY_NOT_FOUND`.
    pub fn facts(
        &self,
        entity: &str,
        predicate: Predicate,
        window: Window,
        limit: usize,
    ) -> Result<Answer, ToolError> {
        let graph = self.graph();
        let id = match graph.names().resolve(&excerpt(entity, MAX_NAME_CHARS)) {
            Resolution::Entity(id) => id,
            Resolution::Ambiguous(candidates) => {
                return Err(ToolError::terminal(
                    AMBIGUOUS_ENTITY,
                    format!(
                        "{:?} matches several entities equally well: {}; call again with one of these names",
                        excerpt(entity, 60),
                        candidates.join(", ")
                    ),
                ));
            }
            Resolution::NotFound => {
                return Err(ToolError::terminal(
                    ENTITY_NOT_FOUND,
                    format!(
                        "no entity named {:?} is in the knowledge graph; check the spelling or try the company's short name",
                        excerpt(entity, 60)
                    ),
                ));
            }
        };
        let mut matched = graph.query(id, predicate, window.start, window.end);
        let limit = limit.clamp(1, self.max_facts);
        let shown: Vec<&Fact> = matched.by_ref().take(limit).collect();
        let total = shown.len() + matched.count();
        Ok(Answer::new(
            &graph,
            graph.name(id),
            predicate,
            window,
            &shown,
            total,
        ))
    }

    /// The predicate a caller's word means: by rule, else by the model.
    ///
    /// # Errors
    ///
    /// A terminal `INVALID_PREDICATE` that lists the valid names.
    pub async fn predicate(&self, word: &str) -> Result<Predicate, ToolError> {
        let invalid = || {
            ToolError::terminal(
                INVALID_PREDICATE,
                format!(
                    "{:?} is not a predicate of the knowledge graph; use one of: {}",
                    excerpt(word, 60),
                    Predicate::names()
                ),
            )
        };
        if word.chars().count() > MAX_NAME_CHARS {
            return Err(invalid());
        }
        if let Some(predicate) = Predicate::coerce(word) {
            return Ok(predicate);
        }
        let Some(model) = self.model() else {
            return Err(invalid());
        };
        let key = word.trim().to_lowercase();
        let remembered = self
            .remembered
            .lock()
            .ok()
            .and_then(|m| m.get(&key).copied());
        let predicate = match remembered {
            Some(known) => known,
            None => match ask_for_predicate(model, word).await {
                Ok(found) => {
                    if let Ok(mut memory) = self.remembered.lock() {
                        if memory.len() >= MAX_REMEMBERED_WORDS {
                            memory.clear();
                        }
                        memory.insert(key, found);
                    }
                    found
                }
                Err(err) => {
                    warn!(error = %err, "kg.model could not map a predicate word; answering INVALID_PREDICATE");
                    None
                }
            },
        };
        predicate.ok_or_else(invalid)
    }
}

/// Asks the model which predicate `word` means. Its answer is checked
/// against the 20 names, never trusted.
async fn ask_for_predicate(
    model: &Model,
    word: &str,
) -> Result<Option<Predicate>, model::CompletionError> {
    let mut instructions = String::from(
        "You map a word or phrase that describes a relationship to the one predicate of a \
         knowledge graph that means the same. The predicates are:\n",
    );
    for predicate in Predicate::ALL {
        instructions.push_str(&format!(
            "{}: {}\n",
            predicate.name(),
            predicate.definition()
        ));
    }
    instructions.push_str(
        "Answer with exactly one predicate name from this list and nothing else, or NONE when \
         no predicate fits.",
    );
    let answer = model.complete(&instructions, word).await?;
    let name = answer
        .trim()
        .trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != '_')
        .to_ascii_uppercase();
    Ok(Predicate::from_name(&name))
}

/// The days a query covers, both included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// First day.
    pub start: Day,
    /// Last day.
    pub end: Day,
}

impl Window {
    /// The window of two date arguments.
    ///
    /// # Errors
    ///
    /// `INVALID_TOOL_ARGUMENTS` when a date cannot be read, and a terminal
    /// `INVALID_DATE_RANGE` when the start is after the end; both messages
    /// say how to call correctly.
    pub fn of(start: &str, end: &str) -> Result<Self, ToolError> {
        let day = |key: &str, text: &str| {
            Day::parse(text).ok_or_else(|| {
                ToolError::InvalidArguments(format!(
                    "{key} {:?} is not a date; use {ACCEPTED_FORMATS}",
                    excerpt(text, 40)
                ))
            })
        };
        let window = Self {
            start: day("start_date_range", start)?,
            end: day("end_date_range", end)?,
        };
        if window.start > window.end {
            return Err(ToolError::terminal(
                INVALID_DATE_RANGE,
                format!(
                    "start_date_range {} is after end_date_range {}; call again with the earlier \
                     date as start_date_range and the later one as end_date_range, both as YYYY-MM-DD",
                    window.start, window.end
                ),
            ));
        }
        Ok(window)
    }
}

/// The facts found for one entity and predicate, as text and as JSON.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The cookbook's readable blocks, or a "no data" line.
    pub text: String,
    /// The entity's name in the graph.
    pub resolved_entity: String,
    /// The predicate the caller's word became.
    pub predicate: Predicate,
    /// The facts shown, as JSON objects.
    pub facts: Vec<Value>,
    /// How many facts matched, shown or not.
    pub total: usize,
}

impl Answer {
    fn new(
        graph: &Graph,
        entity: &str,
        predicate: Predicate,
        window: Window,
        shown: &[&Fact],
        total: usize,
    ) -> Self {
        let text = if shown.is_empty() {
            format!(
                "No data found for {entity} with predicate {predicate} between {} and {}.",
                window.start, window.end
            )
        } else {
            let mut text = String::new();
            for (n, fact) in shown.iter().enumerate() {
                text.push_str(&block(graph, n + 1, fact));
            }
            if total > shown.len() {
                text.push_str(&format!(
                    "Showing the first {} of {total} facts, oldest first; narrow the date range to see the others.\n",
                    shown.len()
                ));
            }
            text
        };
        Self {
            text,
            resolved_entity: entity.to_owned(),
            predicate,
            facts: shown.iter().map(|f| fact_json(graph, f)).collect(),
            total,
        }
    }

    /// The envelope data of `factual_qa`.
    pub fn to_json(&self) -> Value {
        json!({
            "text": self.text,
            "resolved_entity": self.resolved_entity,
            "predicate": self.predicate,
            "facts": self.facts,
            "total": self.total,
        })
    }
}

/// One relationship, as the cookbook printed it:
/// `1. AMD – LAUNCHED – Ryzen [Valid-from: 2017-03-02] (Value: v)`, then the
/// statement and its type.
fn block(graph: &Graph, n: usize, fact: &Fact) -> String {
    let mut line = format!(
        "{n}. {} – {} – {}",
        graph.name(fact.subject),
        fact.predicate,
        graph.name(fact.object)
    );
    if let Some(valid) = fact.valid_at {
        line.push_str(&format!(" [Valid-from: {valid}]"));
    }
    if let Some(invalid) = fact.invalid_at {
        line.push_str(&format!(" [Valid-until: {invalid}]"));
    }
    if let Some(value) = &fact.value {
        line.push_str(&format!(" (Value: {value})"));
    }
    format!(
        "{line}\n   Statement: {}\n   Type: {}\n",
        excerpt(&fact.statement, STATEMENT_TEXT_CHARS),
        fact.statement_type
    )
}

fn fact_json(graph: &Graph, fact: &Fact) -> Value {
    json!({
        "subject": graph.name(fact.subject),
        "predicate": fact.predicate,
        "object": graph.name(fact.object),
        "valid_at": fact.valid_at,
        "invalid_at": fact.invalid_at,
        "statement": excerpt(&fact.statement, STATEMENT_JSON_CHARS),
        "statement_type": fact.statement_type,
        "value": fact.value,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};
    use std::io::Write as _;

    use super::*;

    #[test]
    fn the_sample_graph_is_rich_enough_for_the_demo_and_the_tests() {
        let graph = Graph::load(SAMPLE_GRAPH.as_bytes(), Some(SAMPLE_ALIASES)).unwrap();
        assert!(graph.len() >= 300, "{} facts", graph.len());
        let mut per_company: HashMap<String, usize> = HashMap::new();
        let mut predicates = HashSet::new();
        let mut years = HashSet::new();
        for line in SAMPLE_GRAPH.lines() {
            let fact: Value = serde_json::from_str(line).unwrap();
            *per_company
                .entry(fact["subject"].as_str().unwrap().to_owned())
                .or_default() += 1;
            predicates.insert(fact["predicate"].as_str().unwrap().to_owned());
            if let Some(day) = fact["valid_at"].as_str() {
                years.insert(day[..4].to_owned());
            }
            let statement = fact["statement"].as_str().unwrap();
            assert!(!statement.is_empty(), "{line}");
        }
        let companies = [
            "AMD",
            "NVIDIA",
            "Intel",
            "Apple",
            "Microsoft",
            "Google",
            "Amazon",
            "TSMC",
        ];
        for company in companies {
            assert!(
                per_company.get(company).copied().unwrap_or(0) >= 20,
                "{company}"
            );
        }
        assert_eq!(predicates.len(), 20, "every predicate is used");
        for year in 2016..=2020 {
            assert!(years.contains(&year.to_string()), "{year}");
        }
    }

    fn write(file: &mut tempfile::NamedTempFile, text: &str) {
        file.as_file().set_len(0).unwrap();
        let mut handle = file.reopen().unwrap();
        handle.write_all(text.as_bytes()).unwrap();
        handle.sync_all().unwrap();
    }

    fn fact(subject: &str) -> String {
        format!(
            r#"{{"subject":"{subject}","predicate":"LAUNCHED","object":"Widget","valid_at":"2018-01-01","statement":"{subject} launched Widget.","statement_type":"FACT"}}"#
        )
    }

    #[tokio::test]
    async fn a_changed_file_is_reloaded_and_a_broken_one_keeps_the_old_graph() {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        write(&mut file, &fact("Acme"));
        let options = KgOptions {
            graph_path: Some(file.path().to_owned()),
            reload_interval: Duration::from_millis(100),
            ..KgOptions::default()
        };
        let base = KnowledgeBase::start(&options).unwrap();
        assert_eq!(base.graph().len(), 1);
        let window = Window::of("2016-01-01", "2020-12-31").unwrap();
        assert!(base.lookup("Globex", "LAUNCHED", window).await.is_err());

        write(
            &mut file,
            &format!("{}\n{}\n", fact("Acme"), fact("Globex")),
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while base.graph().len() != 2 {
            assert!(tokio::time::Instant::now() < deadline, "never reloaded");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let answer = base.lookup("Globex", "LAUNCHED", window).await.unwrap();
        assert_eq!(answer.total, 1);

        write(&mut file, "{ not a fact\n");
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(base.graph().len(), 2, "the broken file was not swapped in");
    }

    #[test]
    fn start_up_errors_name_the_file_line_and_setting() {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        write(
            &mut file,
            &format!("{}\n{{\"subject\": 1}}\n", fact("Acme")),
        );
        let options = |graph: &Path| KgOptions {
            graph_path: Some(graph.to_owned()),
            ..KgOptions::default()
        };
        let err = KnowledgeBase::start(&options(file.path()))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&file.path().display().to_string()) && err.contains("line 2: "),
            "{err}"
        );

        let err = KnowledgeBase::start(&options(Path::new("/nonexistent/graph.jsonl")))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("/nonexistent/graph.jsonl") && err.contains("No such file"),
            "{err}"
        );

        let mut aliases = tempfile::NamedTempFile::new().unwrap();
        write(&mut aliases, r#"{"Team Red": "Advanced Micro"}"#);
        let err = KnowledgeBase::start(&KgOptions {
            aliases_path: Some(aliases.path().to_owned()),
            ..KgOptions::default()
        })
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("the sample graph") && err.contains("not an entity of the graph"),
            "{err}"
        );

        let err = KnowledgeBase::start(&KgOptions {
            max_facts: 0,
            ..KgOptions::default()
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains("kg.max_facts"), "{err}");
    }

    #[tokio::test]
    async fn answers_list_at_most_max_facts_and_say_how_many_there_were() {
        let lines: Vec<String> = (0..30)
            .map(|n| {
                format!(
                    r#"{{"subject":"Acme","predicate":"LAUNCHED","object":"Widget {n}","valid_at":"2018-01-{:02}","statement":"Acme launched Widget {n}.","statement_type":"FACT"}}"#,
                    n % 28 + 1
                )
            })
            .collect();
        let graph = Graph::load(lines.join("\n").as_bytes(), None).unwrap();
        let base = KnowledgeBase::from_graph(graph, 5);
        let window = Window::of("2018-01-01", "2018-12-31").unwrap();
        let answer = base.lookup("acme", "launched", window).await.unwrap();
        assert_eq!((answer.facts.len(), answer.total), (5, 30));
        assert!(
            answer
                .text
                .ends_with("Showing the first 5 of 30 facts, oldest first; narrow the date range to see the others.\n"),
            "{}",
            answer.text
        );
    }
}
