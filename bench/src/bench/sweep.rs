//! `--sweep`: the load run again with one dimension of the work grown step
//! by step, everything else as the flags say, each step on a fresh fleet of
//! processes; then, per dimension, a table, the runs' reports as JSON and a
//! chart. What should stay flat must be seen flat, and what grows must be
//! seen growing as it should (docs/benchmarks.md, "Growth curves").

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context as _;
use serde::Serialize;
use toolfleet_cli::output::outln;

use super::args::{BenchArgs, Dimension};
use super::plot::{Chart, Panel, Series};
use super::report::Report;
use super::run::measured_load;

/// What each dimension is and how a run is given its value.
impl Dimension {
    /// The dimensions a `--sweep` list names, `all` expanded, each once.
    fn expand(named: &[Self]) -> Vec<Self> {
        let every = [
            Self::StoredJobs,
            Self::Rounds,
            Self::Width,
            Self::AwaitingApproval,
            Self::Tenants,
            Self::Tools,
        ];
        let mut dimensions: Vec<Self> = named
            .iter()
            .flat_map(|d| {
                if *d == Self::All {
                    every.to_vec()
                } else {
                    vec![*d]
                }
            })
            .collect();
        dimensions.sort();
        dimensions.dedup();
        dimensions
    }

    /// Its values when `--sweep-values` does not say: the issue's.
    fn values(self) -> &'static [usize] {
        match self {
            Self::StoredJobs => &[1_000, 100_000, 1_000_000],
            Self::Rounds => &[1, 10, 50],
            Self::Width => &[1, 8, 64],
            Self::AwaitingApproval => &[0, 10_000, 100_000],
            Self::Tenants => &[1, 1_000, 10_000],
            // 900, not 1,000: nats-server 2.15 allows a stream 1,000
            // consumers unless configured otherwise, and the default set
            // has its own (docs/capacity.md).
            Self::Tools => &[0, 100, 900],
            Self::All => &[],
        }
    }

    /// Its name in files and on the command line.
    fn name(self) -> &'static str {
        match self {
            Self::StoredJobs => "stored-jobs",
            Self::Rounds => "rounds",
            Self::Width => "width",
            Self::AwaitingApproval => "awaiting-approval",
            Self::Tenants => "tenants",
            Self::Tools => "tools",
            Self::All => "all",
        }
    }

    /// What the chart's x axis says.
    fn axis(self) -> &'static str {
        match self {
            Self::StoredJobs => "finished jobs stored in Redis",
            Self::Rounds => "tool rounds per job",
            Self::Width => "parallel calls per round",
            Self::AwaitingApproval => "jobs parked waiting for approval",
            Self::Tenants => "tenants with quotas and budgets",
            Self::Tools => "tools registered besides the default set's",
            Self::All => "",
        }
    }

    /// Whether its costs are told per tool call rather than per job: a job
    /// of more rounds or wider rounds is more work, so only a call's cost
    /// can stay flat.
    fn per_call(self) -> bool {
        matches!(self, Self::Rounds | Self::Width)
    }

    /// `args` with this dimension at `value`.
    fn apply(self, args: &BenchArgs, value: usize) -> BenchArgs {
        let mut args = args.clone();
        match self {
            Self::StoredJobs => args.stored_jobs = Some(value),
            Self::Rounds => args.rounds = value,
            Self::Width => args.calls = value,
            Self::AwaitingApproval => args.awaiting_approval = Some(value),
            Self::Tenants => args.tenants = Some(u32::try_from(value).unwrap_or(u32::MAX)),
            Self::Tools => args.idle_tools = Some(u32::try_from(value).unwrap_or(u32::MAX)),
            Self::All => {}
        }
        args
    }
}

/// One step of a sweep: the dimension's value and what the run measured,
/// per job or per call as the dimension tells it.
#[derive(Debug, Serialize)]
struct Step {
    value: usize,
    jobs_per_sec: f64,
    cpu_ms_by_process: BTreeMap<String, f64>,
    cpu_ms_total: f64,
    redis_commands: Option<f64>,
    nats_messages_in: Option<f64>,
    one_call_job_p50_ms: f64,
    one_call_job_p99_ms: f64,
    tool_call_round_trip_p50_ms: f64,
    tool_call_round_trip_p99_ms: f64,
    rss_mb_by_process: BTreeMap<String, f64>,
    /// Runs at this value (`--sweep-runs`), and the least and the most
    /// CPU per job or call among them; the rest is the median run's.
    runs: usize,
    cpu_ms_total_range: (f64, f64),
    /// The median run's whole report.
    report: Report,
}

impl Step {
    fn of(value: usize, report: Report, per_call: bool) -> Self {
        let units = if per_call {
            (report.rounds * report.calls_per_round).max(1) as f64
        } else {
            1.0
        };
        let cost = &report.accounting;
        Self {
            value,
            jobs_per_sec: report.jobs_per_sec,
            cpu_ms_by_process: workers_summed(&cost.cpu_ms_per_job_by_process, |sum, x| {
                sum + x / units
            }),
            cpu_ms_total: cost.cpu_ms_per_job_total / units,
            redis_commands: cost.redis_commands_per_job.map(|n| n / units),
            nats_messages_in: cost.nats_messages_in_per_job.map(|n| n / units),
            one_call_job_p50_ms: report.sequential_job_latency.p50_ms,
            one_call_job_p99_ms: report.sequential_job_latency.p99_ms,
            tool_call_round_trip_p50_ms: report.tool_call_round_trip.p50_ms,
            tool_call_round_trip_p99_ms: report.tool_call_round_trip.p99_ms,
            rss_mb_by_process: workers_summed(&cost.rss_mb_by_process, |sum, x| sum + x),
            runs: 1,
            cpu_ms_total_range: (
                cost.cpu_ms_per_job_total / units,
                cost.cpu_ms_per_job_total / units,
            ),
            report,
        }
    }

    /// The run of median CPU among `runs` of one value, with their range.
    fn median(mut runs: Vec<Self>) -> Option<Self> {
        runs.sort_by(|a, b| a.cpu_ms_total.total_cmp(&b.cpu_ms_total));
        let range = (runs.first()?.cpu_ms_total, runs.last()?.cpu_ms_total);
        let count = runs.len();
        let mut median = runs.swap_remove(count / 2);
        median.runs = count;
        median.cpu_ms_total_range = range;
        Some(median)
    }
}

/// `by_process` with every `worker-N` folded into one `workers` by `fold`
/// (from 0), so that a chart has one line for them whatever their number.
fn workers_summed(
    by_process: &BTreeMap<String, f64>,
    fold: impl Fn(f64, f64) -> f64,
) -> BTreeMap<String, f64> {
    let mut summed = BTreeMap::new();
    for (name, value) in by_process {
        let name = if name.starts_with("worker-") {
            "workers"
        } else {
            name.as_str()
        };
        let sum = summed.entry(name.to_owned()).or_insert(0.0);
        *sum = fold(*sum, *value);
    }
    summed
}

/// What a sweep of one dimension writes beside its chart.
#[derive(Debug, Serialize)]
struct Sweep {
    dimension: &'static str,
    /// `job` or `tool call`: what every cost is per.
    per: &'static str,
    steps: Vec<Step>,
}

/// Runs every dimension `args.sweep` names, writing each one's files as
/// soon as it is done.
pub(super) async fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let dimensions = Dimension::expand(&args.sweep);
    anyhow::ensure!(
        args.sweep_values.is_empty() || dimensions.len() == 1,
        "--sweep-values needs exactly one dimension in --sweep"
    );
    std::fs::create_dir_all(&args.sweep_dir)
        .with_context(|| format!("cannot create {}", args.sweep_dir.display()))?;
    let mut base = args.clone();
    base.processes = true;
    base.raw_requests = 0;
    base.raw_calls = 0;
    base.json = false;
    base.json_file = None;
    for dimension in dimensions {
        let values = match args.sweep_values.as_slice() {
            [] => dimension.values(),
            given => given,
        };
        // Each value's runs, the values in turn, so that a drift of the
        // machine falls on all of them alike.
        let mut runs: Vec<Vec<Step>> = values.iter().map(|_| Vec::new()).collect();
        let total = values.len() * usize::from(args.sweep_runs);
        for run in 0..usize::from(args.sweep_runs) {
            for (n, value) in values.iter().enumerate() {
                eprintln!(
                    "sweep {}: run {}/{total} at {value}...",
                    dimension.name(),
                    run * values.len() + n + 1,
                );
                let report = measured_load(&dimension.apply(&base, *value)).await?;
                runs[n].push(Step::of(*value, report, dimension.per_call()));
            }
        }
        let steps = runs.into_iter().filter_map(Step::median).collect();
        let sweep = Sweep {
            dimension: dimension.name(),
            per: if dimension.per_call() {
                "tool call"
            } else {
                "job"
            },
            steps,
        };
        write(&args.sweep_dir, dimension, &sweep)?;
    }
    Ok(())
}

/// Writes `<dimension>.json`, `.md` and `.svg` into `dir`, and prints the
/// table.
fn write(dir: &Path, dimension: Dimension, sweep: &Sweep) -> anyhow::Result<()> {
    let path = |extension: &str| dir.join(format!("{}.{extension}", dimension.name()));
    let json = path("json");
    std::fs::write(&json, serde_json::to_vec_pretty(sweep)?)
        .with_context(|| format!("cannot write {}", json.display()))?;
    let table = table(dimension, sweep);
    let markdown = path("md");
    std::fs::write(&markdown, &table)
        .with_context(|| format!("cannot write {}", markdown.display()))?;
    let svg = path("svg");
    chart(dimension, sweep).render(&svg)?;
    outln!("{table}")?;
    eprintln!(
        "wrote {}, {} and {}",
        svg.display(),
        markdown.display(),
        json.display()
    );
    Ok(())
}

/// The processes a sweep's steps measured, in a stable order.
fn processes(sweep: &Sweep, of: impl Fn(&Step) -> &BTreeMap<String, f64>) -> Vec<String> {
    let mut names: Vec<String> = sweep
        .steps
        .iter()
        .flat_map(|step| of(step).keys().cloned())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The sweep as a Markdown table.
fn table(dimension: Dimension, sweep: &Sweep) -> String {
    let names = processes(sweep, |step| &step.cpu_ms_by_process);
    let per = sweep.per;
    let mut header = format!("| {} | jobs/s | CPU ms per {per} |", dimension.axis());
    for name in &names {
        header.push_str(&format!(" {name} |"));
    }
    header.push_str(&format!(
        " Redis commands per {per} | NATS messages in per {per} | one-call job p50 / p99 ms \
         | tool call round trip p50 / p99 ms | RSS MB ({}) |\n",
        processes(sweep, |step| &step.rss_mb_by_process).join(", ")
    ));
    let columns = header.matches('|').count() - 1;
    let mut text = header;
    text.push_str(&"|---".repeat(columns));
    text.push_str("|\n");
    let optional = |x: Option<f64>| x.map_or_else(|| "-".to_owned(), |x| format!("{x:.1}"));
    for step in &sweep.steps {
        let (least, most) = step.cpu_ms_total_range;
        let spread = match step.runs {
            1 => String::new(),
            runs => format!(" ({least:.3} to {most:.3}, {runs} runs)"),
        };
        let mut row = format!(
            "| {} | {:.0} | {:.3}{spread} |",
            step.value, step.jobs_per_sec, step.cpu_ms_total
        );
        for name in &names {
            let cpu = step.cpu_ms_by_process.get(name).copied().unwrap_or(0.0);
            row.push_str(&format!(" {cpu:.3} |"));
        }
        let rss: Vec<String> = step
            .rss_mb_by_process
            .values()
            .map(|mb| format!("{mb:.0}"))
            .collect();
        row.push_str(&format!(
            " {} | {} | {:.2} / {:.2} | {:.2} / {:.2} | {} |\n",
            optional(step.redis_commands),
            optional(step.nats_messages_in),
            step.one_call_job_p50_ms,
            step.one_call_job_p99_ms,
            step.tool_call_round_trip_p50_ms,
            step.tool_call_round_trip_p99_ms,
            rss.join(", ")
        ));
        text.push_str(&row);
    }
    text
}

/// The sweep as four panels: CPU by process, Redis commands and NATS
/// messages, latency, memory by process.
fn chart(dimension: Dimension, sweep: &Sweep) -> Chart {
    let per = sweep.per;
    let by_process = |of: &dyn Fn(&Step) -> &BTreeMap<String, f64>| -> Vec<Series> {
        processes(sweep, of)
            .into_iter()
            .map(|name| Series {
                values: sweep
                    .steps
                    .iter()
                    .map(|step| of(step).get(&name).copied().unwrap_or(0.0))
                    .collect(),
                name,
            })
            .collect()
    };
    let series = |name: &str, of: &dyn Fn(&Step) -> f64| Series {
        name: name.to_owned(),
        values: sweep.steps.iter().map(of).collect(),
    };
    let mut cpu = by_process(&|step| &step.cpu_ms_by_process);
    cpu.push(series("total", &|step| step.cpu_ms_total));
    let panel = |title: String, series: Vec<Series>| Panel {
        title,
        x_axis: dimension.axis().to_owned(),
        x_labels: sweep.steps.iter().map(|s| thousands(s.value)).collect(),
        bars: false,
        series,
    };
    Chart {
        title: format!("toolfleet bench --sweep {}", dimension.name()),
        panels: vec![
            panel(format!("CPU ms per {per}"), cpu),
            panel(
                format!("per {per}"),
                vec![
                    series("Redis commands", &|s| s.redis_commands.unwrap_or(f64::NAN)),
                    series("NATS messages in", &|s| {
                        s.nats_messages_in.unwrap_or(f64::NAN)
                    }),
                ],
            ),
            panel(
                "latency, ms".to_owned(),
                vec![
                    series("one-call job p50", &|s| s.one_call_job_p50_ms),
                    series("one-call job p99", &|s| s.one_call_job_p99_ms),
                    series("tool call round trip p50", &|s| {
                        s.tool_call_round_trip_p50_ms
                    }),
                    series("tool call round trip p99", &|s| {
                        s.tool_call_round_trip_p99_ms
                    }),
                ],
            ),
            panel(
                "resident memory at the load's end, MB".to_owned(),
                by_process(&|step| &step.rss_mb_by_process),
            ),
        ],
    }
}

/// 100000 as "100k", 1000000 as "1M".
fn thousands(n: usize) -> String {
    match n {
        n if n >= 1_000_000 && n.is_multiple_of(1_000_000) => format!("{}M", n / 1_000_000),
        n if n >= 1_000 && n.is_multiple_of(1_000) => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_is_every_dimension_once_and_values_read_as_the_axis_says() {
        let dimensions = Dimension::expand(&[Dimension::Width, Dimension::All]);
        assert_eq!(
            dimensions,
            [
                Dimension::StoredJobs,
                Dimension::Rounds,
                Dimension::Width,
                Dimension::AwaitingApproval,
                Dimension::Tenants,
                Dimension::Tools
            ]
        );
        assert_eq!(thousands(1_000_000), "1M");
        assert_eq!(thousands(100_000), "100k");
        assert_eq!(thousands(1_500), "1500");
        assert_eq!(thousands(50), "50");
    }

    #[test]
    fn workers_are_one_line_and_wide_rounds_are_told_per_call() {
        let mut report = Report {
            rounds: 2,
            calls_per_round: 8,
            ..Report::default()
        };
        report.accounting.cpu_ms_per_job_by_process = BTreeMap::from([
            ("orchestrator".to_owned(), 3.2),
            ("worker-0".to_owned(), 1.6),
            ("worker-1".to_owned(), 1.6),
        ]);
        report.accounting.cpu_ms_per_job_total = 6.4;
        report.accounting.redis_commands_per_job = Some(160.0);
        let step = Step::of(8, report, true);
        assert_eq!(step.runs, 1);
        assert_eq!(step.cpu_ms_by_process["orchestrator"], 0.2);
        assert_eq!(step.cpu_ms_by_process["workers"], 0.2);
        assert_eq!(step.cpu_ms_by_process.len(), 2);
        assert_eq!(step.cpu_ms_total, 0.4);
        assert_eq!(step.redis_commands, Some(10.0));
    }

    #[test]
    fn a_value_of_several_runs_is_its_median_run_with_the_range() {
        let run = |total: f64, jobs_per_sec: f64| {
            let mut report = Report {
                jobs_per_sec,
                ..Report::default()
            };
            report.accounting.cpu_ms_per_job_total = total;
            Step::of(1_000, report, false)
        };
        let median = Step::median(vec![run(2.0, 900.0), run(1.5, 1_100.0), run(1.8, 1_000.0)])
            .expect("three runs");
        assert_eq!(median.cpu_ms_total, 1.8);
        assert_eq!(median.jobs_per_sec, 1_000.0);
        assert_eq!(median.cpu_ms_total_range, (1.5, 2.0));
        assert_eq!(median.runs, 3);
        assert!(Step::median(Vec::new()).is_none());
    }
}
