//! The questions the scripted model can answer without a script, each with
//! the turns it plays: `toolfleet dev` and `toolfleet submit` pick the
//! script of the question asked, so a demo answers what it was asked.
//!
//! The scripts call real tools and quote their answers; only the model's
//! choice of calls is scripted.

/// A question and the script the scripted model plays for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Demo {
    /// The user message.
    pub question: &'static str,
    /// The scripted model's turns (the format of `toolfleet submit --script`).
    pub script: &'static str,
}

/// Parallel `get_current_weather` and `calculate` calls, then a message
/// quoting both: the default demo.
pub const WEATHER_AND_MATH: Demo = Demo {
    question: "What's the weather in Boston in celsius, and what is 23*19?",
    script: r#"[{"tool_calls":[{"name":"get_current_weather","arguments":{"location":"Boston, MA","unit":"celsius"}},{"name":"calculate","arguments":{"expression":"23 * 19"}}]},{"message":"In Boston it is {{call_0_0.data.temperature}} °C ({{call_0_0.data.conditions}}), and 23 * 19 = {{call_0_1.data.result}}."}]"#,
};

/// The OpenAI cookbook's first temporal-agent question: one `factual_qa`.
pub const AMD_LAUNCHES: Demo = Demo {
    question: "What did AMD launch between 2016 and 2020?",
    script: r#"[{"tool_calls":[{"name":"factual_qa","arguments":{"entity":"AMD","start_date_range":"2016-01-01","end_date_range":"2020-12-31","predicate":"LAUNCHED"}}]},{"message":"From the knowledge graph, AMD launched these between 2016 and 2020:\n{{call_0_0.data.text}}"}]"#,
};

/// The cookbook's second question: one `trend_analysis` of three research
/// topics, its sections and summary quoted.
pub const AMD_RESEARCH: Demo = Demo {
    question: "How have AMD's research priorities changed over time?",
    script: r#"[{"tool_calls":[{"name":"trend_analysis","arguments":{"question":"How have AMD's research priorities changed over time?","companies":["AMD"],"start_date_range":"2016-01-01","end_date_range":"2020-12-31","topic_filter":["DEVELOPED","INVESTS_IN","TARGETS"]}}]},{"message":"AMD's research priorities over time, from the knowledge graph (the facts per topic, then a summary):\n\n{{call_0_0.data.text}}"}]"#,
};

/// Every demo, the default first.
pub const ALL: [Demo; 3] = [WEATHER_AND_MATH, AMD_LAUNCHES, AMD_RESEARCH];

/// The demo for `question`, compared without case, spacing or trailing
/// punctuation; `None` when it is none of them.
pub fn for_question(question: &str) -> Option<Demo> {
    let key = comparable(question);
    ALL.into_iter()
        .find(|demo| comparable(demo.question) == key)
}

/// The questions the scripted model knows, one per line, for messages.
pub fn questions() -> String {
    ALL.map(|demo| format!("  {:?}", demo.question)).join("\n")
}

fn comparable(question: &str) -> String {
    question
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .trim_end_matches(['?', '.', '!'])
        .to_lowercase()
        .replace('’', "'")
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolfleet_orchestrator::Scripted;

    #[test]
    fn every_script_parses_and_questions_match_loosely() {
        for demo in ALL {
            assert!(Scripted::parse(demo.script).is_ok(), "{}", demo.question);
            assert_eq!(for_question(demo.question), Some(demo));
        }
        assert_eq!(
            for_question("  what did AMD launch between 2016 and 2020 "),
            Some(AMD_LAUNCHES)
        );
        assert_eq!(
            for_question("How have AMD’s research priorities changed over time?"),
            Some(AMD_RESEARCH)
        );
        assert_eq!(for_question("What is 2+2?"), None);
        assert!(questions().contains("What did AMD launch"));
    }
}
