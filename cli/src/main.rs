//! `toolfleet`: the command line of toolfleet. `toolfleet --help` lists the
//! commands; the `toolfleet_cli` library implements them.

use std::process::ExitCode;

/// mimalloc, not glibc's allocator, as in the services: `toolfleet dev`
/// runs a whole fleet in this process, and the bench's client spent about a
/// quarter of its CPU in glibc's `malloc` and `free` (decision 0027).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::Parser;
use toolfleet_cli::Cli;

fn main() -> ExitCode {
    let cli = Cli::parse();
    toolfleet_service::binary::block_on("toolfleet", cli.threads(), async move {
        match cli.run().await {
            Ok(code) => code,
            // The reader of our output went away (`| head -1`): not an error.
            Err(err) if toolfleet_cli::output::is_broken_pipe(&err) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("toolfleet: {err:#}");
                ExitCode::FAILURE
            }
        }
    })
}
