//! `toolfleet bench`: runs the bench's own binary, `toolfleet-bench` (crate
//! `toolfleet-bench`), with the arguments given, so that this command line
//! carries neither the bench nor its collector and certificates.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

use anyhow::Context as _;
use clap::Args;

/// The bench's binary.
const BINARY: &str = "toolfleet-bench";

/// Every argument, `--help` included, goes to `toolfleet-bench`.
#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
    args: Vec<OsString>,
}

/// The bench's binary: beside this one (as cargo and the release archives
/// put them), else the one on PATH.
fn binary() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join(BINARY)))
        .filter(|path| path.is_file())
        .unwrap_or_else(|| PathBuf::from(BINARY))
}

/// Runs the bench in place of this process (its signals, its output and its
/// exit status are the bench's own).
pub(crate) fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    let program = binary();
    let mut command = Command::new(&program);
    command.args(&args.args);
    let not_found = || {
        format!(
            "cannot run {}: `toolfleet bench` runs the bench's own binary; build it with \
             `cargo build --release -p toolfleet-bench` and keep it beside `toolfleet` or on PATH",
            program.display()
        )
    };
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt as _;
        // Only returns if the bench could not be started.
        Err(command.exec()).with_context(not_found)
    }
    #[cfg(not(unix))]
    {
        let status = command.status().with_context(not_found)?;
        Ok(ExitCode::from(
            u8::try_from(status.code().unwrap_or(1)).unwrap_or(1),
        ))
    }
}
