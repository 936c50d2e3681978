//! `toolfleet jobs`: your jobs, a page at a time.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, ValueEnum};
use toolfleet_proto::v1;

use super::connection::{Server, rpc_error};
use super::submit::parse_meta;
use crate::output::{out, outln};
use crate::transcript;

#[derive(Debug, Args)]
pub(crate) struct JobsArgs {
    #[command(flatten)]
    server: Server,
    /// Only jobs in this status.
    #[arg(long, value_enum)]
    status: Option<StatusFilter>,
    /// Only jobs with this metadata pair (repeat: all must match).
    #[arg(long = "meta", value_name = "KEY=VALUE", value_parser = parse_meta)]
    metadata: Vec<(String, String)>,
    /// Only jobs submitted in the last DURATION (`90s`, `15m`, `2h`, `7d`).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    since: Option<Duration>,
    /// Most jobs to list (1-500).
    #[arg(long, value_name = "N", default_value_t = 20,
          value_parser = clap::value_parser!(u32).range(1..=500))]
    limit: u32,
    /// Continue after an earlier page (the token it printed).
    #[arg(long, value_name = "TOKEN")]
    page_token: Option<String>,
    /// Also print how many of the jobs you see are in each status, whatever
    /// the filters: exact counts, kept with every change of status.
    #[arg(long)]
    counts: bool,
    /// Print the page as JSON.
    #[arg(long)]
    json: bool,
}

/// A job status to filter on.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum StatusFilter {
    Queued,
    Running,
    /// Parked until a person decides a held call.
    #[value(name = "waiting_for_approval", alias = "waiting-for-approval")]
    WaitingForApproval,
    Succeeded,
    Failed,
    Cancelled,
}

impl From<StatusFilter> for v1::JobStatus {
    fn from(status: StatusFilter) -> Self {
        match status {
            StatusFilter::Queued => Self::Queued,
            StatusFilter::Running => Self::Running,
            StatusFilter::WaitingForApproval => Self::WaitingForApproval,
            StatusFilter::Succeeded => Self::Succeeded,
            StatusFilter::Failed => Self::Failed,
            StatusFilter::Cancelled => Self::Cancelled,
        }
    }
}

/// `toolfleet jobs`.
pub(crate) async fn jobs(args: JobsArgs) -> anyhow::Result<ExitCode> {
    let mut client = args.server.connect().await?;
    let now = toolfleet_service::clock::now_ms();
    let page = client
        .list_jobs(v1::ListJobsRequest {
            page_size: args.limit,
            page_token: args.page_token.clone().unwrap_or_default(),
            status: args.status.map_or(0, |s| v1::JobStatus::from(s).into()),
            metadata: args.metadata.iter().cloned().collect(),
            created_after_ms: args.since.map_or(0, |since| created_after(now, since)),
            with_counts: args.counts,
            ..Default::default()
        })
        .await
        .map_err(|status| rpc_error("ListJobs", &status))?
        .into_inner();
    if args.json {
        let mut json = transcript::jobs_json(&page.jobs, &page.next_page_token);
        if args.counts {
            json["counts"] = transcript::counts_json(&page.counts);
        }
        outln!("{json}")?;
        return Ok(ExitCode::SUCCESS);
    }
    if args.counts {
        outln!("{}", transcript::counts_line(&page.counts))?;
    }
    if page.jobs.is_empty() {
        eprintln!("no jobs match (finished jobs are kept for store.job_retention, 24h by default)");
    } else {
        out!("{}", transcript::jobs_table(&page.jobs, now))?;
    }
    if !page.next_page_token.is_empty() {
        eprintln!("more: {}", args.next_page(&page.next_page_token));
    }
    Ok(ExitCode::SUCCESS)
}

impl JobsArgs {
    /// The command that lists the page after this one: the same filters and
    /// page size (a token continues a listing only with the filters it was
    /// made for), and `token`. The server flags are left out: they come from
    /// the environment or are typed again.
    fn next_page(&self, token: &str) -> String {
        let mut command = String::from("toolfleet jobs");
        if let Some(status) = self.status
            && let Some(value) = status.to_possible_value()
        {
            command.push_str(&format!(" --status {}", value.get_name()));
        }
        for (key, value) in &self.metadata {
            command.push_str(&format!(
                " --meta {}",
                shell_word(&format!("{key}={value}"))
            ));
        }
        // The same duration: the next page of the jobs of the last DURATION
        // as of when it is asked for.
        if let Some(since) = self.since {
            let since = humantime::format_duration(since).to_string();
            command.push_str(&format!(" --since {}", shell_word(&since)));
        }
        command.push_str(&format!(
            " --limit {} --page-token {}",
            self.limit,
            shell_word(token)
        ));
        command
    }
}

/// The `created_after_ms` of the jobs of the last `since` at `now_ms`: the
/// epoch when `since` reaches back further (a job at 1 ms is listed; 0
/// would ask for no bound, which is the same).
fn created_after(now_ms: u64, since: Duration) -> u64 {
    let since_ms = u64::try_from(since.as_millis()).unwrap_or(u64::MAX);
    now_ms.saturating_sub(since_ms).max(1)
}

/// `word` as one word of a POSIX shell command line: as it is when it is
/// plain, else in single quotes.
fn shell_word(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_=.,:/@%+".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Jobs {
        #[command(flatten)]
        args: JobsArgs,
    }

    #[test]
    fn the_next_page_command_keeps_the_filters() {
        let parse = |args: &[&str]| {
            let args = std::iter::once("jobs").chain(args.iter().copied());
            Jobs::try_parse_from(args).unwrap().args
        };
        let args = parse(&["--meta", "team=ux", "--status", "succeeded", "--limit", "1"]);
        assert_eq!(
            args.next_page("abc"),
            "toolfleet jobs --status succeeded --meta team=ux --limit 1 --page-token abc"
        );
        let args = parse(&["--meta", "note=it's mine", "--meta", "a=b"]);
        assert_eq!(
            args.next_page("t"),
            r"toolfleet jobs --meta 'note=it'\''s mine' --meta a=b --limit 20 --page-token t"
        );
        // Parsed back as the same words by a shell.
        let line = args.next_page("t");
        let output = std::process::Command::new("sh")
            .args([
                "-c",
                &format!("printf '%s\\n' {}", &line["toolfleet ".len()..]),
            ])
            .output()
            .unwrap();
        let words: Vec<_> = String::from_utf8(output.stdout)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect();
        assert_eq!(words[2], "note=it's mine");
        let args = parse(&["--since", "90m", "--status", "failed"]);
        assert_eq!(args.since, Some(Duration::from_secs(5_400)));
        assert_eq!(
            args.next_page("t"),
            "toolfleet jobs --status failed --since '1h 30m' --limit 20 --page-token t"
        );
    }

    #[test]
    fn since_reaches_back_from_now_and_never_below_the_first_millisecond() {
        let hour = Duration::from_secs(3_600);
        assert_eq!(created_after(10_000_000, hour), 10_000_000 - 3_600_000);
        assert_eq!(created_after(1_000, hour), 1, "before the epoch: every job");
        assert_eq!(created_after(5, Duration::MAX), 1);
        assert!(
            Jobs::try_parse_from(["jobs", "--since", "soon"]).is_err(),
            "not a duration"
        );
    }
}
