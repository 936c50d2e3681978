//! The commands that talk to an orchestrator over gRPC, a module each:
//! `submit`, `get`, `watch`, `trace`, `cancel`, `jobs`, `tools` and `whoami`.
//!
//! - `connection`: the `--addr`, `--token` and TLS flags, the client they
//!   make, and a failed call in words.
//! - `events`: following a job to its end, and the exit code of how it
//!   ended.

mod cancel;
mod connection;
mod events;
mod get;
mod jobs;
mod submit;
mod tools;
mod trace;
mod watch;
mod whoami;

pub(crate) use cancel::{CancelArgs, cancel};
pub(crate) use connection::{ApiClient, Server, TlsArgs, connect, rpc_error, with_token};
pub(crate) use events::{each_event, exit_code, follow, get_job};
pub(crate) use get::{GetArgs, get};
pub(crate) use jobs::{JobsArgs, jobs};
pub(crate) use submit::{
    DEFAULT_OPENAI_MODEL, Provider, SubmitArgs, scripted_demo, submit, submit_job,
};
pub(crate) use tools::{ToolsArgs, tools};
pub(crate) use trace::{TraceArgs, trace};
pub(crate) use watch::{WatchArgs, watch};
pub(crate) use whoami::{WhoamiArgs, whoami};
