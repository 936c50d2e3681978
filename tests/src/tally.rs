//! Whether the model was told the truth: each side-effecting call's answer
//! held against its effect, for the fault tests.

use toolfleet_proto::{Envelope, v1};
use v1::item::Kind;

/// The envelope the model got for `call_id`.
pub fn answer_of(job: &v1::Job, call_id: &str) -> Envelope {
    job.items
        .iter()
        .find_map(|item| match &item.kind {
            Some(Kind::ToolResult(r)) if r.call_id == call_id => {
                serde_json::from_str(&r.output).ok()
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("no readable answer for {call_id} in {job:?}"))
}

/// How the answers of side-effecting calls compare with their effects (a
/// counter that each call increments once at most).
#[derive(Debug, Default)]
pub struct Tally {
    /// Answered ok, and applied once.
    pub ok_applied: usize,
    /// Answered with an error (a poison call not run again), and not applied.
    pub error_not_applied: usize,
    /// The codes of those errors, and how many of each.
    pub error_codes: std::collections::BTreeMap<String, usize>,
    /// The answer says something other than what happened: an error over an
    /// applied effect, ok over none, or `OUTCOME_UNKNOWN` from a tool whose
    /// probe can know. Each one is a duplicate effect waiting to happen.
    pub mismatches: Vec<String>,
    /// Applied more than once.
    pub duplicates: Vec<String>,
}

impl Tally {
    /// Counts `call`, answered `answer`, whose effect was applied `effect` times.
    pub fn add(&mut self, call: &str, answer: &Envelope, effect: i64) {
        match (answer.is_ok(), effect) {
            (_, n) if n > 1 => self.duplicates.push(format!("{call}: applied {n} times")),
            (true, 1) => self.ok_applied += 1,
            (false, 0) => {
                self.error_not_applied += 1;
                let code = answer
                    .error()
                    .map_or_else(|| "no code".to_owned(), |e| e.code.to_string());
                *self.error_codes.entry(code).or_default() += 1;
            }
            (ok, n) => self.mismatches.push(format!(
                "{call}: answered {} with the effect applied {n} times",
                if ok {
                    "ok".to_owned()
                } else {
                    answer
                        .error()
                        .map_or_else(String::new, |e| e.code.to_string())
                }
            )),
        }
    }

    /// Fails on any duplicate or any answer that disagrees with its effect.
    pub fn assert_truthful(&self) {
        assert!(
            self.duplicates.is_empty(),
            "effects ran twice: {:?}",
            self.duplicates
        );
        assert!(
            self.mismatches.is_empty(),
            "answers that disagree with what happened: {:?}",
            self.mismatches
        );
    }
}

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "answered ok and applied once {}, answered an error and not applied {}, \
             answers disagreeing with the effect {}, duplicates found {}",
            self.ok_applied,
            self.error_not_applied,
            self.mismatches.len(),
            self.duplicates.len()
        )?;
        if !self.error_codes.is_empty() {
            write!(f, " (errors: {:?})", self.error_codes)?;
        }
        Ok(())
    }
}
