//! `factual_qa` on generated graphs of 10k, 100k and 1M facts: how many
//! queries per second one core answers, and how that grows with the graph.
//!
//! `cargo bench -p toolfleet-worker --bench knowledge_graph`
//!
//! Each graph has one company per 100 facts, so every company has about five
//! facts per predicate, spread over 2000-2020, and one distinct product per
//! fact (the entity table grows with the graph). A query names a random
//! company in a different spelling ("company 17 inc", or with an extra word:
//! "The Company 17 Holdings"), a predicate word ("launched") and an
//! eleven-year window (two or three facts match), and goes through the tool's whole
//! call: argument parsing, entity and predicate resolution, the indexed
//! lookup, and the text and JSON of the answer.

use std::hint::black_box;
use std::time::Instant;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use toolfleet_worker::tools::knowledge_graph::graph::Graph;
use toolfleet_worker::tools::knowledge_graph::predicate::Predicate;
use toolfleet_worker::tools::knowledge_graph::{FactualQa, KnowledgeBase};
use toolfleet_worker::{Tool, ToolContext};

const FACTS_PER_COMPANY: usize = 100;

/// A graph file of `facts` facts, built in memory: company
/// `n % companies` is the subject of fact `n`, and its `k`-th fact has
/// predicate `k % 20` and a year that grows with `k` from 2000 to 2020.
fn generated_file(facts: usize) -> String {
    let companies = (facts / FACTS_PER_COMPANY).max(1);
    let mut file = String::with_capacity(facts * 220);
    for n in 0..facts {
        let k = n / companies;
        let predicate = Predicate::ALL[k % Predicate::ALL.len()];
        let year = 2000 + (k * 21 / FACTS_PER_COMPANY).min(20);
        let month = 1 + n % 12;
        let day = 1 + n % 28;
        let ended = if n % 7 == 0 {
            format!("\"{}-12-31\"", year + 2)
        } else {
            "null".into()
        };
        file.push_str(&format!(
            "{{\"subject\":\"Company {c}\",\"predicate\":\"{p}\",\"object\":\"Product {n}\",\
             \"valid_at\":\"{year}-{month:02}-{day:02}\",\"invalid_at\":{ended},\
             \"statement\":\"Company {c} and product {n} are related by {p} since {year}.\",\
             \"statement_type\":\"FACT\",\"value\":{n}}}\n",
            c = n % companies,
            p = predicate.name(),
        ));
    }
    file
}

/// The generated graph, loaded from its file text, with the load time and
/// the memory it takes printed (what a worker's start-up and reload cost).
fn loaded_graph(facts: usize) -> Graph {
    let text = generated_file(facts);
    let before = resident_bytes();
    let started = Instant::now();
    let graph = Graph::load(text.as_bytes(), None).expect("the generated graph loads");
    let took = started.elapsed();
    drop(text);
    let grown = resident_bytes().saturating_sub(before);
    eprintln!(
        "graph of {facts} facts: loaded in {took:.2?}, {} MB resident",
        grown / 1_000_000
    );
    graph
}

/// This process's resident memory (Linux), 0 where unknown.
fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|statm| statm.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

fn context() -> ToolContext {
    ToolContext {
        job_id: "bench".into(),
        call_id: "call".into(),
        model_call_id: None,
        attempt: 1,
        idempotency_key: "bench".into(),
        deadline: None,
        cancelled: CancellationToken::new(),
        handed_back: CancellationToken::new(),
        checkpoint: Default::default(),
        progress: Default::default(),
    }
}

/// `name(n)` is how query `n` names its company.
fn bench_queries(c: &mut Criterion, group: &str, name: fn(usize) -> String) {
    let mut group = c.benchmark_group(group);
    group.throughput(Throughput::Elements(1));
    for facts in [10_000, 100_000, 1_000_000] {
        let companies = facts / FACTS_PER_COMPANY;
        let tool = FactualQa::new(KnowledgeBase::from_graph(loaded_graph(facts), 50));
        let mut n = 0usize;
        group.bench_with_input(BenchmarkId::from_parameter(facts), &facts, |b, _| {
            b.iter(|| {
                n = n.wrapping_mul(31).wrapping_add(17);
                let args = json!({
                    "entity": name(n % companies),
                    "start_date_range": "2010-01-01",
                    "end_date_range": "2020-12-31",
                    "predicate": "launched",
                });
                let answer = futures::executor::block_on(tool.call(args, context()))
                    .expect("every generated company answers");
                assert!(answer["total"].as_u64() > Some(0), "{answer}");
                black_box(answer);
            });
        });
    }
    group.finish();
}

/// The company named as in the graph, but with a legal suffix: a hash lookup.
fn factual_qa(c: &mut Criterion) {
    bench_queries(c, "factual_qa", |n| format!("company {n} inc"));
}

/// The company named with an extra word: found by word overlap, where
/// "company" is shared by every company and only the number is rare.
fn factual_qa_fuzzy_name(c: &mut Criterion) {
    bench_queries(c, "factual_qa_fuzzy_name", |n| {
        format!("The Company {n} Holdings")
    });
}

criterion_group!(benches, factual_qa, factual_qa_fuzzy_name);
criterion_main!(benches);
