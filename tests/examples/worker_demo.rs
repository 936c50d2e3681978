//! The worker fleet on its own, before the orchestrator exists: starts NATS,
//! Redis and two `toolfleet-worker` processes, publishes one turn's worth of
//! parallel calls the way the orchestrator will, and prints each envelope.
//!
//! Run it with `scripts/demo`.

use std::time::Duration;

use toolfleet_tests::fleet::{Fleet, call};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    println!("starting nats-server, redis-server and 2 workers...");
    let fleet =
        Fleet::start_with(2, &[("RUST_LOG", "warn,toolfleet_worker::runtime=info")]).await?;
    let mut results = fleet.results("demo").await?;
    let turn = [
        (
            "call_weather",
            "get_current_weather",
            r#"{"location": "Boston, MA", "unit": "celsius"}"#,
        ),
        (
            "call_math",
            "calculate",
            r#"{"expression": "(72 - 32) * 5 / 9"}"#,
        ),
        (
            "call_bad_args",
            "get_current_weather",
            r#"{"location": "Paris", "unit": "kelvin"}"#,
        ),
        ("call_div_zero", "calculate", r#"{"expression": "1 / 0"}"#),
        (
            "call_unknown_place",
            "get_current_weather",
            r#"{"location": "Atlantis", "unit": "celsius"}"#,
        ),
    ];
    for (id, tool, args) in turn {
        println!("-> {id:<20} {tool}({args})");
        fleet.publish_call(&call("demo", id, tool, args)).await?;
    }
    for _ in turn {
        let received = results.next(Duration::from_secs(20)).await?;
        println!("<- {:<20} {}", received.call_id, received.body);
    }
    println!("done: every call answered with an envelope; the servers stop now");
    Ok(())
}
