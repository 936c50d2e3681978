//! The code blocks of the docs a new user copies from, and the rule that
//! says which test runs each: a snippet that stops working fails the suite.
//!
//! - A `python` block runs whole (`tests/tests/python.rs`).
//! - A shell block (`sh`, `bash`, `shell`, `console`) runs line by line:
//!   `toolfleet` commands (also as `target/debug/toolfleet`) against
//!   `toolfleet dev --serve` (`tests/tests/first_hour.rs`); `grpcurl`,
//!   `python` and `pip` commands through the Python client
//!   (`tests/tests/python.rs`).
//! - A block that cannot run here (Helm, Docker, your own project) is marked
//!   on the line before its fence, `<!-- not run: why -->`, and skipped.
//!   An unmarked block with any other command fails `tests/tests/docs.rs`.
//!
//! Addresses are placeholders the tests replace: `127.0.0.1:50051` and
//! `127.0.0.1:PORT` by the fleet's gRPC address, `$TOOLFLEET_ADDR` set too.

/// The documents whose blocks run.
pub const RUN_DOCS: [&str; 5] = [
    "README.md",
    "docs/api.md",
    "clients/python/README.md",
    "worker/README.md",
    "docs/approvals.md",
];

/// The placeholders of the gRPC address in the docs' commands.
pub const ADDRESS_PLACEHOLDERS: [&str; 2] = ["127.0.0.1:50051", "127.0.0.1:PORT"];

/// A fenced code block.
#[derive(Debug, Clone)]
pub struct Block {
    /// The 1-based line of its opening fence.
    pub line: usize,
    /// The fence's language (`sh`, `python`; empty when none).
    pub language: String,
    /// Its lines, without the fence's indentation.
    pub lines: Vec<String>,
    /// Why it is not run, when the line before its fence says so.
    pub not_run: Option<String>,
}

impl Block {
    /// Whether it holds shell commands.
    pub fn is_shell(&self) -> bool {
        matches!(self.language.as_str(), "sh" | "bash" | "shell" | "console")
    }

    /// Its commands: the lines that are neither blank nor comments, a
    /// trailing `\` joining a line to the next.
    pub fn commands(&self) -> Vec<String> {
        let mut commands = Vec::new();
        let mut pending = String::new();
        for line in &self.lines {
            let line = line.trim();
            if pending.is_empty() && (line.is_empty() || line.starts_with('#')) {
                continue;
            }
            match line.strip_suffix('\\') {
                Some(start) => pending.push_str(start),
                None => {
                    pending.push_str(line);
                    commands.push(std::mem::take(&mut pending));
                }
            }
        }
        commands
    }
}

/// Which test runs a shell command, by its program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runner {
    /// `toolfleet ...`: `tests/tests/first_hour.rs`.
    Toolfleet,
    /// `grpcurl ...`, `python ...`, `pip ...`: `tests/tests/python.rs`.
    Python,
}

/// The runner of `command`, or `None` for a program no test runs.
pub fn runner(command: &str) -> Option<Runner> {
    let program = command.split_whitespace().next().unwrap_or_default();
    match program {
        "toolfleet" | "target/debug/toolfleet" => Some(Runner::Toolfleet),
        "grpcurl" | "python" | "python3" | "pip" => Some(Runner::Python),
        _ => None,
    }
}

/// The fenced blocks of `markdown`, indented ones (in a list) included.
pub fn blocks(markdown: &str) -> Vec<Block> {
    let lines: Vec<&str> = markdown.lines().collect();
    let mut blocks = Vec::new();
    let mut index = 0;
    while index < lines.len() {
        let opening = lines[index];
        let indent = opening.len() - opening.trim_start().len();
        let Some(language) = opening.trim_start().strip_prefix("```") else {
            index += 1;
            continue;
        };
        let not_run = index
            .checked_sub(1)
            .and_then(|before| lines[before].trim().strip_prefix("<!-- not run:"))
            .and_then(|rest| rest.strip_suffix("-->"))
            .map(|why| why.trim().to_owned());
        let body_start = index + 1;
        let mut end = body_start;
        while end < lines.len() && lines[end].trim() != "```" {
            end += 1;
        }
        blocks.push(Block {
            line: index + 1,
            language: language.trim().to_owned(),
            lines: lines[body_start..end.min(lines.len())]
                .iter()
                .map(|line| line.get(indent..).unwrap_or(line.trim_start()).to_owned())
                .collect(),
            not_run,
        });
        index = end + 1;
    }
    blocks
}

/// The commands of `markdown`'s unmarked shell blocks that `runner` runs,
/// with their placeholders replaced by `address` (`host:port`).
pub fn commands_for(markdown: &str, runner_of: Runner, address: &str) -> Vec<String> {
    blocks(markdown)
        .iter()
        .filter(|block| block.is_shell() && block.not_run.is_none())
        .flat_map(Block::commands)
        .filter(|command| runner(command) == Some(runner_of))
        .map(|command| {
            ADDRESS_PLACEHOLDERS
                .iter()
                .fold(command, |command, placeholder| {
                    command.replace(placeholder, address)
                })
        })
        .collect()
}
