//! Entity names, and how a caller's name for an entity finds it.
//!
//! The cookbook took the first entity whose name contained the query, so
//! "AMD" could land on "AMD Radeon" and "Intel" on "Intel Capital" depending
//! on the order of the data. Here names are normalized (case, punctuation,
//! legal suffixes such as Inc., Corp., AG, SE), and matches are ranked: the
//! exact name, then an alias from the alias map, then the largest share of
//! common words, then a substring. A tie at the best rank is reported as
//! ambiguous with its candidates, never guessed.

use std::collections::{BTreeSet, HashMap, HashSet};

/// An entity of the graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EntityId(u32);

impl EntityId {
    pub(crate) fn index(self) -> usize {
        self.0 as usize
    }
}

/// Longest entity name in a graph file, in characters.
pub(crate) const MAX_NAME_CHARS: usize = 500;
/// How many candidates an ambiguous answer lists.
const MAX_CANDIDATES: usize = 10;
/// A word shared by more entities than this nominates no candidate by itself.
const COMMON_WORD_ENTITIES: usize = 256;
/// Shorter queries never match as a substring: "a" would match everything.
const MIN_SUBSTRING_CHARS: usize = 3;
/// Words at the end of a name that say what kind of company it is, not which.
const LEGAL_SUFFIXES: &[&str] = &[
    "inc",
    "incorporated",
    "corp",
    "corporation",
    "co",
    "company",
    "ltd",
    "limited",
    "llc",
    "plc",
    "ag",
    "se",
    "sa",
    "nv",
    "bv",
    "gmbh",
];
/// Words that never make two names similar.
const STOP_WORDS: &[&str] = &["the", "of", "and", "for", "a", "an"];

/// The outcome of resolving a caller's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// One entity is the best match.
    Entity(EntityId),
    /// Several entities match equally well: their names, sorted, at most ten.
    Ambiguous(Vec<String>),
    /// Nothing matches.
    NotFound,
}

#[cfg(test)]
impl Resolution {
    pub(crate) fn unwrap_entity(self) -> EntityId {
        match self {
            Self::Entity(id) => id,
            other => panic!("expected one entity, got {other:?}"),
        }
    }
}

/// The names of a graph's entities.
#[derive(Debug, Default)]
pub struct Names {
    /// Display name per entity: the first spelling in the file.
    names: Vec<String>,
    /// Normalized name to entity; spellings that normalize alike ("AMD",
    /// "AMD Inc.") are one entity.
    keys: HashMap<String, EntityId>,
    /// Normalized alias to entity.
    aliases: HashMap<String, EntityId>,
    /// Word to the entities whose name or alias has it.
    words: HashMap<String, Vec<EntityId>>,
    /// Normalized name per entity, and its aliases, for scoring candidates.
    spellings: Vec<Vec<String>>,
}

impl Names {
    pub(crate) fn len(&self) -> usize {
        self.names.len()
    }

    pub(crate) fn name(&self, entity: EntityId) -> &str {
        &self.names[entity.index()]
    }

    /// The entity named `name`, added if new; `None` when the name has no
    /// letter or digit, or is longer than [`MAX_NAME_CHARS`].
    pub(crate) fn intern(&mut self, name: &str) -> Option<EntityId> {
        if name.chars().count() > MAX_NAME_CHARS {
            return None;
        }
        let key = normalize(name);
        if key.is_empty() {
            return None;
        }
        if let Some(&id) = self.keys.get(&key) {
            return Some(id);
        }
        let id = EntityId(u32::try_from(self.names.len()).ok()?);
        self.names.push(name.trim().to_owned());
        self.keys.insert(key, id);
        Some(id)
    }

    /// Makes `alias` another name of the entity `name`.
    pub(crate) fn alias(&mut self, alias: &str, name: &str) -> Result<(), String> {
        let key = normalize(alias);
        if key.is_empty() {
            return Err(format!("alias {alias:?} has no letter or digit"));
        }
        let Some(&id) = self.keys.get(&normalize(name)) else {
            return Err(format!(
                "alias {alias:?} names {name:?}, which is not an entity of the graph"
            ));
        };
        self.aliases.insert(key, id);
        Ok(())
    }

    /// Builds the word index, once every name and alias is in.
    pub(crate) fn index_tokens(&mut self) {
        let mut words: HashMap<String, Vec<EntityId>> = HashMap::new();
        let named = self.keys.iter().chain(self.aliases.iter());
        for (key, &id) in named {
            for word in significant_words(key) {
                words.entry(word.to_owned()).or_default().push(id);
            }
        }
        for ids in words.values_mut() {
            ids.sort_unstable();
            ids.dedup();
        }
        self.words = words;
        let mut spellings = vec![Vec::new(); self.names.len()];
        for (key, &id) in self.keys.iter().chain(self.aliases.iter()) {
            spellings[id.index()].push(key.clone());
        }
        self.spellings = spellings;
    }

    /// The entity a caller means by `query`.
    pub fn resolve(&self, query: &str) -> Resolution {
        let key = normalize(query);
        if key.is_empty() {
            return Resolution::NotFound;
        }
        if let Some(&id) = self.keys.get(&key).or_else(|| self.aliases.get(&key)) {
            return Resolution::Entity(id);
        }
        let by_words = self.best_word_overlap(&key);
        if by_words != Resolution::NotFound {
            return by_words;
        }
        self.best_substring(&key)
    }

    /// The entities sharing the largest fraction of words with `key`
    /// (common words over all words of both names). Candidates are the
    /// entities that share a word with `key`, except that a word shared by
    /// more than [`COMMON_WORD_ENTITIES`] entities ("company", "group")
    /// nominates none on its own, so a query costs what its rare words cost;
    /// common words still count in the score.
    fn best_word_overlap(&self, key: &str) -> Resolution {
        let query: HashSet<&str> = significant_words(key).collect();
        let mut lists: Vec<&Vec<EntityId>> = query
            .iter()
            .filter_map(|word| self.words.get(*word))
            .collect();
        lists.sort_by_key(|ids| ids.len());
        let rare = lists
            .iter()
            .take_while(|ids| ids.len() <= COMMON_WORD_ENTITIES)
            .count()
            .max(1.min(lists.len()));
        let candidates: BTreeSet<EntityId> = lists[..rare]
            .iter()
            .flat_map(|ids| ids.iter().copied())
            .collect();
        let mut best = 0.0_f64;
        let mut winners = Vec::new();
        for id in candidates {
            let score = self.spellings[id.index()]
                .iter()
                .map(|name| word_overlap(&query, name))
                .fold(0.0, f64::max);
            if score > best + f64::EPSILON {
                best = score;
                winners.clear();
            }
            if (score - best).abs() <= f64::EPSILON && score > 0.0 {
                winners.push(id);
            }
        }
        self.verdict(winners)
    }

    /// The entities whose name contains `key` or is contained in it, the
    /// nearest in length first.
    fn best_substring(&self, key: &str) -> Resolution {
        if key.chars().count() < MIN_SUBSTRING_CHARS {
            return Resolution::NotFound;
        }
        let mut best = usize::MAX;
        let mut winners = Vec::new();
        let named = self.keys.iter().chain(self.aliases.iter());
        for (name, &id) in named {
            let contains = name.contains(key)
                || (name.chars().count() >= MIN_SUBSTRING_CHARS && key.contains(name.as_str()));
            if !contains {
                continue;
            }
            let distance = name.len().abs_diff(key.len());
            if distance < best {
                best = distance;
                winners.clear();
            }
            if distance == best {
                winners.push(id);
            }
        }
        winners.sort_unstable();
        winners.dedup();
        self.verdict(winners)
    }

    fn verdict(&self, winners: Vec<EntityId>) -> Resolution {
        match winners.as_slice() {
            [] => Resolution::NotFound,
            [one] => Resolution::Entity(*one),
            many => {
                let mut names: Vec<String> =
                    many.iter().map(|id| self.name(*id).to_owned()).collect();
                names.sort();
                names.truncate(MAX_CANDIDATES);
                Resolution::Ambiguous(names)
            }
        }
    }
}

/// Common words over all words of both names (Jaccard). Counted without
/// building a set: this runs once per candidate.
fn word_overlap(query: &HashSet<&str>, name: &str) -> f64 {
    let (mut words, mut common) = (0usize, 0usize);
    for word in significant_words(name) {
        words += 1;
        common += usize::from(query.contains(word));
    }
    let all = query.len() + words - common;
    if all == 0 {
        0.0
    } else {
        common as f64 / all as f64
    }
}

fn significant_words(key: &str) -> impl Iterator<Item = &str> {
    key.split(' ').filter(|w| !STOP_WORDS.contains(w))
}

/// Lowercase words of letters and digits, one space apart, without a
/// trailing legal suffix: "Advanced Micro Devices, Inc." is
/// "advanced micro devices". `+` and `#` belong to words, so that "Zen+",
/// "Google+" and "C#" stay apart from "Zen", "Google" and "C".
pub(crate) fn normalize(name: &str) -> String {
    let mut words: Vec<String> = name
        .split(|c: char| !(c.is_alphanumeric() || c == '+' || c == '#'))
        .filter(|w| w.chars().any(char::is_alphanumeric))
        .map(|w| w.chars().flat_map(char::to_lowercase).collect())
        .collect();
    while words.len() > 1
        && words
            .last()
            .is_some_and(|w| LEGAL_SUFFIXES.contains(&w.as_str()))
    {
        words.pop();
    }
    words.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(entities: &[&str], aliases: &[(&str, &str)]) -> Names {
        let mut names = Names::default();
        for entity in entities {
            names.intern(entity).unwrap();
        }
        for (alias, name) in aliases {
            names.alias(alias, name).unwrap();
        }
        names.index_tokens();
        names
    }

    fn resolved(names: &Names, query: &str) -> String {
        match names.resolve(query) {
            Resolution::Entity(id) => names.name(id).to_owned(),
            Resolution::Ambiguous(candidates) => format!("ambiguous: {}", candidates.join(" | ")),
            Resolution::NotFound => "not found".into(),
        }
    }

    #[test]
    fn normalizes_case_punctuation_and_legal_suffixes() {
        assert_eq!(
            normalize("Advanced Micro Devices, Inc."),
            "advanced micro devices"
        );
        assert_eq!(normalize("  AMD  "), "amd");
        assert_eq!(normalize("SAP SE"), "sap");
        assert_eq!(normalize("SE"), "se", "a name is never emptied");
        assert_eq!(
            normalize("Taiwan Semiconductor Mfg. Co., Ltd."),
            "taiwan semiconductor mfg"
        );
        assert_eq!(normalize("Ünïcode GmbH"), "ünïcode");
        assert_eq!(normalize("?!"), "");
        assert_eq!(normalize("Zen+"), "zen+");
        assert_eq!(normalize("+ #"), "");
        assert_ne!(normalize("Google+"), normalize("Google"));
    }

    #[test]
    fn ranks_exact_then_alias_then_words_then_substring() {
        let names = names(
            &[
                "AMD",
                "AMD Radeon",
                "Intel",
                "Intel Capital",
                "Samsung Electronics",
                "Samsung SDI",
                "Qualcomm",
                "Apple Watch",
            ],
            &[("Advanced Micro Devices", "AMD")],
        );
        for (query, expected) in [
            ("AMD", "AMD"),
            ("amd", "AMD"),
            ("AMD Inc.", "AMD"),
            ("Advanced Micro Devices", "AMD"),
            ("Advanced Micro Devices, Inc.", "AMD"),
            ("Intel", "Intel"),
            ("Intel Capital Corp", "Intel Capital"),
            ("Samsung", "ambiguous: Samsung Electronics | Samsung SDI"),
            ("Samsung Electronics Co., Ltd.", "Samsung Electronics"),
            ("Radeon", "AMD Radeon"),
            ("qualcom", "Qualcomm"),
            ("the Apple Watch Series 5", "Apple Watch"),
            ("Nokia", "not found"),
            ("", "not found"),
            ("--", "not found"),
            ("of the", "not found"),
            ("xy", "not found"),
        ] {
            assert_eq!(resolved(&names, query), expected, "{query}");
        }
    }

    #[test]
    fn aliases_must_name_an_entity() {
        let mut names = names(&["AMD"], &[]);
        let err = names.alias("Team Red", "Advanced Micro").unwrap_err();
        assert!(err.contains("not an entity of the graph"), "{err}");
        assert!(names.alias("!!", "AMD").is_err());
    }

    #[test]
    fn common_words_count_in_the_score_but_nominate_no_candidates() {
        let many: Vec<String> = (0..COMMON_WORD_ENTITIES + 500)
            .map(|n| format!("Acme Unit {n}"))
            .collect();
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        let names = names(&refs, &[]);
        assert_eq!(resolved(&names, "the Acme Unit 7 Holdings"), "Acme Unit 7");
        match names.resolve("acme") {
            Resolution::Ambiguous(candidates) => assert_eq!(candidates.len(), MAX_CANDIDATES),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn ambiguity_lists_at_most_ten_candidates() {
        let many: Vec<String> = (0..30).map(|n| format!("Acme Unit {n}")).collect();
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        let names = names(&refs, &[]);
        match names.resolve("acme") {
            Resolution::Ambiguous(candidates) => assert_eq!(candidates.len(), MAX_CANDIDATES),
            other => panic!("{other:?}"),
        }
    }
}
