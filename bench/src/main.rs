//! `toolfleet-bench`: end-to-end load through the whole system, with raw
//! NATS request/reply and raw JetStream calls through the same server
//! measured in the same run as the floors. `toolfleet bench` runs this
//! binary with its arguments, so the command line's client commands carry
//! neither the bench nor its collector and certificates.
//! docs/benchmarks.md says how to read the numbers.

use std::process::ExitCode;

use clap::Parser as _;

/// mimalloc, not glibc's allocator, as in the services: the in-process bench
/// runs a whole fleet in this process, and the bench's client spent about a
/// quarter of its CPU in glibc's `malloc` and `free` (decision 0027).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod bench;

fn main() -> ExitCode {
    let args = bench::BenchArgs::parse();
    let threads = args.client_threads();
    toolfleet_service::binary::block_on("toolfleet-bench", threads, async move {
        match bench::run(args).await {
            Ok(()) => ExitCode::SUCCESS,
            // The reader of our output went away (`| head -1`): not an error.
            Err(err) if toolfleet_cli::output::is_broken_pipe(&err) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("toolfleet bench: {err:#}");
                ExitCode::FAILURE
            }
        }
    })
}
