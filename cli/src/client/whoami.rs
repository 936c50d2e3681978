//! `toolfleet whoami`: who the orchestrator takes this credential for.

use std::process::ExitCode;

use clap::Args;
use toolfleet_proto::v1;

use super::connection::{Server, rpc_error};
use crate::output::outln;

#[derive(Debug, Args)]
pub(crate) struct WhoamiArgs {
    #[command(flatten)]
    server: Server,
    /// Print the answer as JSON.
    #[arg(long)]
    json: bool,
}

/// `toolfleet whoami`.
pub(crate) async fn whoami(args: WhoamiArgs) -> anyhow::Result<ExitCode> {
    let mut client = args.server.connect().await?;
    let me = client
        .who_am_i(v1::WhoAmIRequest {})
        .await
        .map_err(|status| rpc_error("WhoAmI", &status))?
        .into_inner();
    if args.json {
        let json = serde_json::json!({
            "tenant": me.tenant,
            "person": (!me.person.is_empty()).then_some(&me.person),
            "roles": me.roles,
        });
        outln!("{json}")?;
    } else {
        outln!("tenant  {}", me.tenant)?;
        if !me.person.is_empty() {
            outln!("person  {}", me.person)?;
        }
        outln!("roles   {}", me.roles.join(", "))?;
    }
    Ok(ExitCode::SUCCESS)
}
