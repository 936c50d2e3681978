//! The temporal graph in memory: facts read from JSON Lines, indexed per
//! entity, per predicate and by time, so that a query reads only the facts it
//! returns (plus those of the same entity and predicate that began in time
//! but had ended before the window).

use std::collections::HashMap;
use std::io::BufRead;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::dates::{ACCEPTED_FORMATS, Day};
use super::entity::{self, EntityId, Names};
use super::predicate::Predicate;
use toolfleet_proto::envelope::excerpt;

/// Longest accepted line of a graph file. A fact is a few hundred bytes; this
/// bounds what one bad line can cost.
const MAX_LINE_BYTES: usize = 64 * 1024;

/// What a fact's source sentence claims to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum StatementType {
    /// Something that happened or is the case.
    Fact,
    /// Someone's judgement.
    Opinion,
    /// A forecast or guidance.
    Prediction,
}

impl StatementType {
    fn as_str(self) -> &'static str {
        match self {
            Self::Fact => "FACT",
            Self::Opinion => "OPINION",
            Self::Prediction => "PREDICTION",
        }
    }
}

impl std::fmt::Display for StatementType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A fact's optional value: an amount, a share, a role title.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum FactValue {
    /// A number, such as a revenue in dollars.
    Number(serde_json::Number),
    /// Text, such as `"35%"` or `"President and CEO"`.
    Text(String),
}

impl std::fmt::Display for FactValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Number(number) => write!(f, "{number}"),
            Self::Text(text) => f.write_str(text),
        }
    }
}

/// One temporal triplet.
#[derive(Debug, Clone)]
pub struct Fact {
    /// Who or what the fact is about.
    pub subject: EntityId,
    /// The relationship.
    pub predicate: Predicate,
    /// The other end of the relationship.
    pub object: EntityId,
    /// When it became true; `None` when unknown (treated as always).
    pub valid_at: Option<Day>,
    /// When it stopped being true; `None` when it still is.
    pub invalid_at: Option<Day>,
    /// The source sentence.
    pub statement: String,
    /// What the sentence claims to be.
    pub statement_type: StatementType,
    /// An amount, share or title, when the fact has one.
    pub value: Option<FactValue>,
}

impl Fact {
    /// Whether the fact was true at some point of `[start, end]`: it began
    /// on or before `end` and had not ended by `start`.
    pub fn overlaps(&self, start: Day, end: Day) -> bool {
        self.valid_at.is_none_or(|valid| valid <= end)
            && self.invalid_at.is_none_or(|invalid| invalid > start)
    }
}

/// A graph file that cannot be used. The message names the line and what to
/// fix; the worker keeps serving the graph it had.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read.
    #[error("cannot read the graph: {0}")]
    Read(#[from] std::io::Error),
    /// A line is not a valid fact.
    #[error("line {line}: {reason}")]
    Line {
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// The alias map is not a JSON object of names to entity names.
    #[error("the alias map: {0}")]
    Aliases(String),
}

/// One line of a graph file, as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FactLine {
    subject: String,
    predicate: String,
    object: String,
    #[serde(default)]
    valid_at: Option<String>,
    #[serde(default)]
    invalid_at: Option<String>,
    statement: String,
    statement_type: StatementType,
    #[serde(default)]
    value: Option<Value>,
}

/// The whole graph, read-only once built.
#[derive(Debug, Default)]
pub struct Graph {
    facts: Vec<Fact>,
    names: Names,
    /// Per entity, the facts it is the subject or object of, sorted by
    /// predicate, then by `valid_at` (unknown first).
    edges: Vec<Vec<u32>>,
}

impl Graph {
    /// Reads a graph file (JSON Lines; blank lines are skipped) and an
    /// optional alias map (a JSON object of alias to entity name).
    ///
    /// # Errors
    ///
    /// [`LoadError`] naming the first bad line, or what is wrong with the
    /// alias map.
    pub fn load(facts: impl BufRead, aliases: Option<&str>) -> Result<Self, LoadError> {
        let mut graph = Self::default();
        let mut lines = facts;
        // `take` needs a reader it can consume: a mutable borrow is one.
        let lines = &mut lines;
        let mut buffer = Vec::new();
        let mut number = 0;
        loop {
            buffer.clear();
            number += 1;
            // Read at most one byte past the limit, so a huge line costs no
            // more than the limit.
            let read = std::io::Read::take(&mut *lines, MAX_LINE_BYTES as u64 + 1)
                .read_until(b'\n', &mut buffer)?;
            if read == 0 {
                break;
            }
            if buffer.len() > MAX_LINE_BYTES {
                return Err(LoadError::Line {
                    line: number,
                    reason: format!("longer than {MAX_LINE_BYTES} bytes"),
                });
            }
            let text = std::str::from_utf8(&buffer).map_err(|_| LoadError::Line {
                line: number,
                reason: "not UTF-8".into(),
            })?;
            if text.trim().is_empty() {
                continue;
            }
            let line: FactLine = serde_json::from_str(text).map_err(|err| LoadError::Line {
                line: number,
                reason: format!("not a fact object: {err}"),
            })?;
            let fact = graph.fact_from(line).map_err(|reason| LoadError::Line {
                line: number,
                reason,
            })?;
            if graph.facts.len() >= u32::MAX as usize {
                return Err(LoadError::Line {
                    line: number,
                    reason: "more than 4294967295 facts".into(),
                });
            }
            graph.facts.push(fact);
        }
        if let Some(aliases) = aliases {
            graph.read_aliases(aliases)?;
        }
        graph.index();
        Ok(graph)
    }

    fn fact_from(&mut self, line: FactLine) -> Result<Fact, String> {
        let predicate = Predicate::from_name(&line.predicate).ok_or_else(|| {
            format!(
                "unknown predicate {:?}; use one of {}",
                excerpt(&line.predicate, 40),
                Predicate::names()
            )
        })?;
        let bad_name = |key: &str| {
            format!(
                "the {key} has no letter or digit, or is longer than {} characters; name an entity",
                entity::MAX_NAME_CHARS
            )
        };
        let subject = self
            .names
            .intern(&line.subject)
            .ok_or_else(|| bad_name("subject"))?;
        let object = self
            .names
            .intern(&line.object)
            .ok_or_else(|| bad_name("object"))?;
        let day = |key: &str, text: Option<String>| match text {
            None => Ok(None),
            Some(text) if text.is_empty() => Ok(None),
            Some(text) => Day::parse(&text).map(Some).ok_or_else(|| {
                format!(
                    "{key} {:?} is not a date; use {ACCEPTED_FORMATS}, or null",
                    excerpt(&text, 40)
                )
            }),
        };
        let valid_at = day("valid_at", line.valid_at)?;
        let invalid_at = day("invalid_at", line.invalid_at)?;
        if let (Some(valid), Some(invalid)) = (valid_at, invalid_at)
            && invalid < valid
        {
            return Err(format!("invalid_at {invalid} is before valid_at {valid}"));
        }
        let value = match line.value {
            None | Some(Value::Null) => None,
            Some(Value::Number(number)) => Some(FactValue::Number(number)),
            Some(Value::String(text)) => Some(FactValue::Text(text)),
            Some(_) => return Err("value must be a string, a number or null".into()),
        };
        Ok(Fact {
            subject,
            predicate,
            object,
            valid_at,
            invalid_at,
            statement: line.statement,
            statement_type: line.statement_type,
            value,
        })
    }

    fn read_aliases(&mut self, text: &str) -> Result<(), LoadError> {
        let map: HashMap<String, String> = serde_json::from_str(text).map_err(|err| {
            LoadError::Aliases(format!(
                "not a JSON object of alias names to entity names: {err}"
            ))
        })?;
        let mut pairs: Vec<_> = map.into_iter().collect();
        pairs.sort(); // deterministic errors
        for (alias, name) in pairs {
            self.names
                .alias(&alias, &name)
                .map_err(LoadError::Aliases)?;
        }
        Ok(())
    }

    fn index(&mut self) {
        let mut edges = vec![Vec::new(); self.names.len()];
        for (position, fact) in self.facts.iter().enumerate() {
            // Fits: `load` stops at u32::MAX facts.
            let position = position as u32;
            edges[fact.subject.index()].push(position);
            if fact.object != fact.subject {
                edges[fact.object.index()].push(position);
            }
        }
        for list in &mut edges {
            list.sort_by_key(|&position| {
                let fact = &self.facts[position as usize];
                (fact.predicate, fact.valid_at, position)
            });
        }
        self.edges = edges;
        self.names.index_tokens();
    }

    /// How many facts the graph holds.
    pub fn len(&self) -> usize {
        self.facts.len()
    }

    /// Whether the graph holds no fact.
    pub fn is_empty(&self) -> bool {
        self.facts.is_empty()
    }

    /// The entity names and how a caller's name resolves to one.
    pub fn names(&self) -> &Names {
        &self.names
    }

    /// The facts of `entity` (as subject or object) with `predicate` that
    /// were true at some point of `[start, end]`, oldest first.
    pub fn query(
        &self,
        entity: EntityId,
        predicate: Predicate,
        start: Day,
        end: Day,
    ) -> impl Iterator<Item = &Fact> + '_ {
        let edges = self
            .edges
            .get(entity.index())
            .map_or(&[][..], Vec::as_slice);
        let fact = |position: &u32| &self.facts[*position as usize];
        let first = edges.partition_point(|p| fact(p).predicate < predicate);
        let same = &edges[first..];
        let count = same.partition_point(|p| fact(p).predicate == predicate);
        let same = &same[..count];
        // Sorted by valid_at: everything after this began after the window.
        let begun = same.partition_point(|p| fact(p).valid_at.is_none_or(|v| v <= end));
        same[..begun]
            .iter()
            .map(fact)
            .filter(move |f| f.overlaps(start, end))
    }

    /// The name of an entity, as first written in the file.
    pub fn name(&self, entity: EntityId) -> &str {
        self.names.name(entity)
    }
}

/// Re-exported for the tools: how names resolve.
pub use entity::Resolution;

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(lines: &[&str]) -> Result<Graph, LoadError> {
        Graph::load(lines.join("\n").as_bytes(), None)
    }

    const AMD_RYZEN: &str = r#"{"subject":"AMD","predicate":"LAUNCHED","object":"Ryzen","valid_at":"2017-03-02","invalid_at":null,"statement":"AMD launched Ryzen.","statement_type":"FACT"}"#;

    #[test]
    fn bad_lines_are_named_with_what_to_fix() {
        let cases = [
            ("not json", "not a fact object: expected ident"),
            (
                r#"{"subject":"AMD","predicate":"BOUGHT","object":"X","statement":"s","statement_type":"FACT"}"#,
                "unknown predicate \"BOUGHT\"; use one of IS_A",
            ),
            (
                r#"{"subject":"AMD","predicate":"LAUNCHED","object":"X","valid_at":"2017-13-01","statement":"s","statement_type":"FACT"}"#,
                "valid_at \"2017-13-01\" is not a date",
            ),
            (
                r#"{"subject":"AMD","predicate":"LAUNCHED","object":"X","valid_at":"2018-01-01","invalid_at":"2017-01-01","statement":"s","statement_type":"FACT"}"#,
                "invalid_at 2017-01-01 is before valid_at 2018-01-01",
            ),
            (
                r#"{"subject":"--","predicate":"LAUNCHED","object":"X","statement":"s","statement_type":"FACT"}"#,
                "the subject has no letter or digit",
            ),
            (
                r#"{"subject":"AMD","predicate":"LAUNCHED","object":"X","statement":"s","statement_type":"RUMOUR"}"#,
                "not a fact object",
            ),
            (
                r#"{"subject":"AMD","predicate":"LAUNCHED","object":"X","statement":"s","statement_type":"FACT","value":[1]}"#,
                "value must be a string, a number or null",
            ),
            (
                r#"{"subject":"AMD","predicate":"LAUNCHED","object":"X","statement":"s","statement_type":"FACT","extra":1}"#,
                "unknown field `extra`",
            ),
        ];
        for (line, expected) in cases {
            let err = graph(&[AMD_RYZEN, "", line]).unwrap_err().to_string();
            assert!(err.starts_with("line 3: "), "{err}");
            assert!(err.contains(expected), "{line}: {err}");
        }
        let long_name = format!(
            r#"{{"subject":"{}","predicate":"LAUNCHED","object":"X","statement":"s","statement_type":"FACT"}}"#,
            "A".repeat(entity::MAX_NAME_CHARS + 1)
        );
        let err = graph(&[&long_name]).unwrap_err().to_string();
        assert!(err.contains("longer than 500 characters"), "{err}");
        let huge = format!("{}\n", "x".repeat(MAX_LINE_BYTES + 10));
        let err = Graph::load(huge.as_bytes(), None).unwrap_err().to_string();
        assert!(err.contains("longer than 65536 bytes"), "{err}");
        let err = Graph::load(&b"\xff\xfe\n"[..], None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 1: not UTF-8"), "{err}");
    }

    #[test]
    fn queries_see_outgoing_and_incoming_edges_within_the_window() {
        let lines = [
            AMD_RYZEN,
            r#"{"subject":"TSMC","predicate":"SUPPLIES","object":"AMD","valid_at":"2018-07-01","statement":"TSMC makes AMD's 7nm chips.","statement_type":"FACT"}"#,
            r#"{"subject":"Raja Koduri","predicate":"HOLDS_ROLE","object":"AMD","valid_at":"2015-09-09","invalid_at":"2017-11-07","statement":"Raja Koduri led Radeon.","statement_type":"FACT","value":"Chief Architect"}"#,
            r#"{"subject":"AMD","predicate":"IS_A","object":"chip designer","statement":"AMD designs chips.","statement_type":"FACT"}"#,
        ];
        let graph = graph(&lines).unwrap();
        assert_eq!(graph.len(), 4);
        let amd = graph.names().resolve("AMD").unwrap_entity();
        let day = |text| Day::parse(text).unwrap();
        let objects = |predicate, start, end| -> Vec<String> {
            graph
                .query(amd, predicate, day(start), day(end))
                .map(|f| format!("{}>{}", graph.name(f.subject), graph.name(f.object)))
                .collect()
        };
        assert_eq!(
            objects(Predicate::Launched, "2017-03-02", "2017-03-02"),
            ["AMD>Ryzen"],
            "boundaries are inclusive of valid_at"
        );
        assert!(objects(Predicate::Launched, "2016-01-01", "2017-03-01").is_empty());
        assert_eq!(
            objects(Predicate::Supplies, "2020-01-01", "2020-12-31"),
            ["TSMC>AMD"],
            "incoming edge, still valid (no invalid_at)"
        );
        assert_eq!(
            objects(Predicate::HoldsRole, "2017-11-06", "2018-01-01"),
            ["Raja Koduri>AMD"]
        );
        assert!(
            objects(Predicate::HoldsRole, "2017-11-07", "2018-01-01").is_empty(),
            "a fact that ended on the window's first day was not true in it"
        );
        assert_eq!(
            objects(Predicate::IsA, "1990-01-01", "1990-01-01"),
            ["AMD>chip designer"],
            "an undated fact is always true"
        );
    }
}
