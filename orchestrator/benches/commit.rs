//! What a commit sends Redis, built the way `store/` builds it, so that a
//! regression in the script's inputs shows up here before it drowns in the
//! noise of `toolfleet bench`: every conversation item a commit appends is
//! one JSON argument of the script, and a round of the bench's workload
//! appends three calls (with the turn) and their three results.
//!
//! `cargo bench -p toolfleet-orchestrator --bench commit`
//! (the events' data is in `toolfleet-proto`'s `hot_path` bench).

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use toolfleet_orchestrator::job::Item;

/// A turn's three parallel calls, as a provider answers them.
fn calls() -> Vec<Item> {
    (0..3)
        .map(|n| Item::ToolCall {
            call_id: format!("call_0_{n}"),
            name: "get_current_weather".into(),
            arguments: r#"{"location":"Boston, MA","unit":"celsius"}"#.into(),
            raw: None,
        })
        .collect()
}

/// Their results, each an envelope as the model sees it.
fn results() -> Vec<Item> {
    (0..3)
        .map(|n| Item::ToolResult {
            call_id: format!("call_0_{n}"),
            name: "get_current_weather".into(),
            output:
                r#"{"ok":true,"data":{"location":"Boston, MA","temperature":22,"unit":"celsius"}}"#
                    .into(),
            attempts: 1,
        })
        .collect()
}

/// The script's item arguments, as `JobStore::commit` writes them.
fn item_arguments(items: &[Item]) -> Vec<String> {
    items.iter().map(Item::stored_json).collect()
}

fn commit(c: &mut Criterion) {
    let (calls, results) = (calls(), results());
    c.bench_function("commit/turn_of_3_calls", |b| {
        b.iter(|| item_arguments(black_box(&calls)))
    });
    c.bench_function("commit/round_of_3_results", |b| {
        b.iter(|| item_arguments(black_box(&results)))
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = commit
}
criterion_main!(benches);
