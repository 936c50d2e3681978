//! The 20 predicates of the graph, and how a caller's word for one (`launched`,
//! `released`, `Launch`, `LAUNCHD`) becomes a predicate without a model.

use std::fmt;

use serde::Serialize;

/// A relationship between a fact's subject and object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[allow(missing_docs)] // each variant's meaning is in `definition`
pub enum Predicate {
    IsA,
    HasA,
    LocatedIn,
    HoldsRole,
    Produces,
    Sells,
    Launched,
    Developed,
    AdoptedBy,
    InvestsIn,
    CollaboratesWith,
    Supplies,
    HasRevenue,
    Increased,
    Decreased,
    ResultedIn,
    Targets,
    PartOf,
    Discontinued,
    Secured,
}

impl Predicate {
    /// Every predicate, in the order of the documentation.
    pub const ALL: [Self; 20] = [
        Self::IsA,
        Self::HasA,
        Self::LocatedIn,
        Self::HoldsRole,
        Self::Produces,
        Self::Sells,
        Self::Launched,
        Self::Developed,
        Self::AdoptedBy,
        Self::InvestsIn,
        Self::CollaboratesWith,
        Self::Supplies,
        Self::HasRevenue,
        Self::Increased,
        Self::Decreased,
        Self::ResultedIn,
        Self::Targets,
        Self::PartOf,
        Self::Discontinued,
        Self::Secured,
    ];

    /// The name in files and tool arguments, such as `LAUNCHED`.
    pub fn name(self) -> &'static str {
        match self {
            Self::IsA => "IS_A",
            Self::HasA => "HAS_A",
            Self::LocatedIn => "LOCATED_IN",
            Self::HoldsRole => "HOLDS_ROLE",
            Self::Produces => "PRODUCES",
            Self::Sells => "SELLS",
            Self::Launched => "LAUNCHED",
            Self::Developed => "DEVELOPED",
            Self::AdoptedBy => "ADOPTED_BY",
            Self::InvestsIn => "INVESTS_IN",
            Self::CollaboratesWith => "COLLABORATES_WITH",
            Self::Supplies => "SUPPLIES",
            Self::HasRevenue => "HAS_REVENUE",
            Self::Increased => "INCREASED",
            Self::Decreased => "DECREASED",
            Self::ResultedIn => "RESULTED_IN",
            Self::Targets => "TARGETS",
            Self::PartOf => "PART_OF",
            Self::Discontinued => "DISCONTINUED",
            Self::Secured => "SECURED",
        }
    }

    /// What a fact with this predicate says, in one sentence.
    pub fn definition(self) -> &'static str {
        match self {
            Self::IsA => "the subject is a kind or an instance of the object (a category or type)",
            Self::HasA => {
                "the subject has, owns or contains the object as a part, feature or asset"
            }
            Self::LocatedIn => {
                "the subject is based, headquartered or situated in the object place"
            }
            Self::HoldsRole => {
                "the subject, a person, holds a position at the object organisation; the value names the role"
            }
            Self::Produces => "the subject makes or manufactures the object",
            Self::Sells => "the subject sells or distributes the object to its customers",
            Self::Launched => {
                "the subject released, introduced or brought the object to market on the date"
            }
            Self::Developed => {
                "the subject researched, designed or built the object (a technology, architecture or product)"
            }
            Self::AdoptedBy => {
                "the subject, a product or technology, was taken up or deployed by the object"
            }
            Self::InvestsIn => "the subject put money into, or agreed to acquire, the object",
            Self::CollaboratesWith => "the subject works or partners with the object",
            Self::Supplies => "the subject provides components, products or services to the object",
            Self::HasRevenue => {
                "the subject reported the revenue in the value for the period that ends on the date"
            }
            Self::Increased => "a measure of the subject, named by the object, grew (by the value)",
            Self::Decreased => "a measure of the subject, named by the object, fell (by the value)",
            Self::ResultedIn => "the subject, an event or action, caused or led to the object",
            Self::Targets => "the subject aims at the object market, segment or customer group",
            Self::PartOf => "the subject belongs to, or is a unit of, the object",
            Self::Discontinued => "the subject stopped making, selling or supporting the object",
            Self::Secured => {
                "the subject won or obtained the object (a contract, a deal, funding, an approval)"
            }
        }
    }

    /// The predicate with exactly this name.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }

    /// Every name, comma separated, for error messages.
    pub fn names() -> String {
        Self::ALL.map(Self::name).join(", ")
    }

    /// The caller's word for a predicate, matched without a model: the exact
    /// name; the name in other case or with other separators (`has revenue`,
    /// `Has-Revenue`); a synonym (`released`, `researched`); or the one name or
    /// synonym within a small edit distance (`LAUNCHD`). `None` when nothing
    /// matches, or when two predicates match a misspelling equally well.
    pub fn coerce(word: &str) -> Option<Self> {
        if let Some(exact) = Self::from_name(word) {
            return Some(exact);
        }
        let key = normalize(word);
        if key.is_empty() || key.len() > 64 {
            return None;
        }
        if let Some(named) = Self::from_name(&key.to_ascii_uppercase()) {
            return Some(named);
        }
        if let Some(&(_, predicate)) = SYNONYMS.iter().find(|(synonym, _)| *synonym == key) {
            return Some(predicate);
        }
        closest_spelling(&key)
    }
}

impl fmt::Display for Predicate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Lowercase, with runs of anything but letters and digits as one `_`.
fn normalize(word: &str) -> String {
    let mut key = String::with_capacity(word.len());
    for part in word
        .split(|c: char| !c.is_alphanumeric())
        .filter(|p| !p.is_empty())
    {
        if !key.is_empty() {
            key.push('_');
        }
        key.extend(part.chars().flat_map(char::to_lowercase));
    }
    key
}

/// The predicate whose name or synonym is nearest to `key`, if it is near
/// enough (one edit per four letters, at most two) and no other predicate is
/// as near.
fn closest_spelling(key: &str) -> Option<Predicate> {
    let allowed = (key.chars().count() / 4).clamp(1, 2);
    let names = Predicate::ALL
        .iter()
        .map(|p| (p.name().to_ascii_lowercase(), *p));
    let synonyms = SYNONYMS.iter().map(|&(s, p)| (s.to_owned(), p));
    let mut best: Option<(usize, Predicate)> = None;
    let mut tied = false;
    for (spelling, predicate) in names.chain(synonyms) {
        let distance = strsim::levenshtein(key, &spelling);
        if distance > allowed {
            continue;
        }
        match best {
            Some((nearest, _)) if distance > nearest => {}
            Some((nearest, chosen)) if distance == nearest => tied |= chosen != predicate,
            _ => {
                best = Some((distance, predicate));
                tied = false;
            }
        }
    }
    best.filter(|_| !tied).map(|(_, predicate)| predicate)
}

/// Words that callers (and models) use for a predicate, normalized.
const SYNONYMS: &[(&str, Predicate)] = &[
    ("is", Predicate::IsA),
    ("is_an", Predicate::IsA),
    ("type", Predicate::IsA),
    ("type_of", Predicate::IsA),
    ("kind_of", Predicate::IsA),
    ("instance_of", Predicate::IsA),
    ("has", Predicate::HasA),
    ("has_an", Predicate::HasA),
    ("owns", Predicate::HasA),
    ("contains", Predicate::HasA),
    ("located", Predicate::LocatedIn),
    ("location", Predicate::LocatedIn),
    ("headquartered_in", Predicate::LocatedIn),
    ("headquarters", Predicate::LocatedIn),
    ("based_in", Predicate::LocatedIn),
    ("role", Predicate::HoldsRole),
    ("roles", Predicate::HoldsRole),
    ("holds_a_role", Predicate::HoldsRole),
    ("executive", Predicate::HoldsRole),
    ("executives", Predicate::HoldsRole),
    ("leadership", Predicate::HoldsRole),
    ("ceo", Predicate::HoldsRole),
    ("works_for", Predicate::HoldsRole),
    ("employed_by", Predicate::HoldsRole),
    ("produce", Predicate::Produces),
    ("produced", Predicate::Produces),
    ("makes", Predicate::Produces),
    ("manufactures", Predicate::Produces),
    ("manufactured", Predicate::Produces),
    ("manufacturing", Predicate::Produces),
    ("sell", Predicate::Sells),
    ("sold", Predicate::Sells),
    ("distributes", Predicate::Sells),
    ("launch", Predicate::Launched),
    ("launches", Predicate::Launched),
    ("launching", Predicate::Launched),
    ("release", Predicate::Launched),
    ("released", Predicate::Launched),
    ("releases", Predicate::Launched),
    ("introduce", Predicate::Launched),
    ("introduced", Predicate::Launched),
    ("introduces", Predicate::Launched),
    ("unveiled", Predicate::Launched),
    ("debuted", Predicate::Launched),
    ("product_launch", Predicate::Launched),
    ("product_launches", Predicate::Launched),
    ("develop", Predicate::Developed),
    ("develops", Predicate::Developed),
    ("development", Predicate::Developed),
    ("research", Predicate::Developed),
    ("researched", Predicate::Developed),
    ("research_and_development", Predicate::Developed),
    ("r_d", Predicate::Developed),
    ("designed", Predicate::Developed),
    ("built", Predicate::Developed),
    ("created", Predicate::Developed),
    ("invented", Predicate::Developed),
    ("innovation", Predicate::Developed),
    ("adopted", Predicate::AdoptedBy),
    ("adoption", Predicate::AdoptedBy),
    ("used_by", Predicate::AdoptedBy),
    ("deployed_by", Predicate::AdoptedBy),
    ("invest", Predicate::InvestsIn),
    ("invested", Predicate::InvestsIn),
    ("invested_in", Predicate::InvestsIn),
    ("investment", Predicate::InvestsIn),
    ("investments", Predicate::InvestsIn),
    ("acquired", Predicate::InvestsIn),
    ("acquisition", Predicate::InvestsIn),
    ("acquisitions", Predicate::InvestsIn),
    ("funds", Predicate::InvestsIn),
    ("funded", Predicate::InvestsIn),
    ("collaborates", Predicate::CollaboratesWith),
    ("collaborated_with", Predicate::CollaboratesWith),
    ("collaboration", Predicate::CollaboratesWith),
    ("partner", Predicate::CollaboratesWith),
    ("partners", Predicate::CollaboratesWith),
    ("partnered_with", Predicate::CollaboratesWith),
    ("partners_with", Predicate::CollaboratesWith),
    ("partnership", Predicate::CollaboratesWith),
    ("partnerships", Predicate::CollaboratesWith),
    ("supply", Predicate::Supplies),
    ("supplied", Predicate::Supplies),
    ("supplier", Predicate::Supplies),
    ("supplier_of", Predicate::Supplies),
    ("provides", Predicate::Supplies),
    ("revenue", Predicate::HasRevenue),
    ("revenues", Predicate::HasRevenue),
    ("earned", Predicate::HasRevenue),
    ("earnings", Predicate::HasRevenue),
    ("financials", Predicate::HasRevenue),
    ("increase", Predicate::Increased),
    ("increases", Predicate::Increased),
    ("grew", Predicate::Increased),
    ("growth", Predicate::Increased),
    ("rose", Predicate::Increased),
    ("decrease", Predicate::Decreased),
    ("decreases", Predicate::Decreased),
    ("declined", Predicate::Decreased),
    ("decline", Predicate::Decreased),
    ("fell", Predicate::Decreased),
    ("dropped", Predicate::Decreased),
    ("result", Predicate::ResultedIn),
    ("results_in", Predicate::ResultedIn),
    ("led_to", Predicate::ResultedIn),
    ("caused", Predicate::ResultedIn),
    ("target", Predicate::Targets),
    ("targeted", Predicate::Targets),
    ("aims_at", Predicate::Targets),
    ("focus", Predicate::Targets),
    ("focuses_on", Predicate::Targets),
    ("market", Predicate::Targets),
    ("markets", Predicate::Targets),
    ("strategy", Predicate::Targets),
    ("member_of", Predicate::PartOf),
    ("subsidiary_of", Predicate::PartOf),
    ("belongs_to", Predicate::PartOf),
    ("division_of", Predicate::PartOf),
    ("discontinue", Predicate::Discontinued),
    ("discontinues", Predicate::Discontinued),
    ("stopped", Predicate::Discontinued),
    ("retired", Predicate::Discontinued),
    ("cancelled", Predicate::Discontinued),
    ("canceled", Predicate::Discontinued),
    ("ended", Predicate::Discontinued),
    ("secure", Predicate::Secured),
    ("secures", Predicate::Secured),
    ("won", Predicate::Secured),
    ("wins", Predicate::Secured),
    ("obtained", Predicate::Secured),
    ("awarded", Predicate::Secured),
    ("contract", Predicate::Secured),
    ("contracts", Predicate::Secured),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_every_predicate_has_a_definition() {
        for predicate in Predicate::ALL {
            assert_eq!(Predicate::from_name(predicate.name()), Some(predicate));
            assert_eq!(
                serde_json::to_value(predicate).unwrap(),
                predicate.name(),
                "serde and name() agree"
            );
            assert!(predicate.definition().len() > 20);
        }
        assert_eq!(Predicate::names().split(", ").count(), 20);
    }

    #[test]
    fn coerces_case_separators_synonyms_and_misspellings() {
        for (word, expected) in [
            ("LAUNCHED", Predicate::Launched),
            ("launched", Predicate::Launched),
            ("Launched ", Predicate::Launched),
            ("released", Predicate::Launched),
            ("introduced", Predicate::Launched),
            ("researched", Predicate::Developed),
            ("has revenue", Predicate::HasRevenue),
            ("Has-Revenue", Predicate::HasRevenue),
            ("collaborates with", Predicate::CollaboratesWith),
            ("LAUNCHD", Predicate::Launched),
            ("devloped", Predicate::Developed),
            ("investsin", Predicate::InvestsIn),
            ("partnerships", Predicate::CollaboratesWith),
        ] {
            assert_eq!(Predicate::coerce(word), Some(expected), "{word}");
        }
    }

    #[test]
    fn unknown_words_and_hostile_input_match_nothing() {
        for word in [
            "",
            "   ",
            "weather",
            "xyz",
            "🙂",
            "drop table facts",
            &"a".repeat(10_000),
        ] {
            assert_eq!(Predicate::coerce(word), None, "{word}");
        }
    }

    #[test]
    fn synonyms_are_normalized_and_never_shadow_a_name() {
        for (synonym, _) in SYNONYMS {
            assert_eq!(normalize(synonym), *synonym, "{synonym} is normalized");
            assert!(
                Predicate::from_name(&synonym.to_ascii_uppercase()).is_none(),
                "{synonym} is a name"
            );
        }
    }
}
