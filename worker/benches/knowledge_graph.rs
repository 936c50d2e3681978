//! `factual_qa` on generated graphs of 10k, 100k and 1M facts: how many
//! queries per second one core answers, and how that grows with the graph.
//!
//! `cargo bench -p toolfleet-worker --bench knowledge_graph`
//!
//! Each graph has one company per 100 facts, so every company has about five
//! facts per predicate, spread over 2000-2020, and one distinct product per
//! fact (the entity table grows with the graph). A query names a random
//! company in a different spelling ("company 17 inc"), a predicate word
//! ("launched") and a five-year window, and goes through the tool's whole
//! call: argument parsing, entity and predicate resolution, the indexed
//! lookup, and the text and JSON of the answer.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use toolfleet_worker::tools::knowledge_graph::graph::Graph;
use toolfleet_worker::tools::knowledge_graph::predicate::Predicate;
use toolfleet_worker::tools::knowledge_graph::{FactualQa, KnowledgeBase};
use toolfleet_worker::{Tool, ToolContext};

const FACTS_PER_COMPANY: usize = 100;

/// A graph of `facts` facts in the file format, built in memory.
fn generated_graph(facts: usize) -> Graph {
    let companies = (facts / FACTS_PER_COMPANY).max(1);
    let mut file = String::with_capacity(facts * 220);
    for n in 0..facts {
        let predicate = Predicate::ALL[n % Predicate::ALL.len()];
        let year = 2000 + (n / Predicate::ALL.len()) % 21;
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
    Graph::load(file.as_bytes(), None).expect("the generated graph loads")
}

fn context() -> ToolContext {
    ToolContext {
        job_id: "bench".into(),
        call_id: "call".into(),
        attempt: 1,
        idempotency_key: "bench".into(),
        deadline: None,
        cancelled: CancellationToken::new(),
    }
}

fn factual_qa(c: &mut Criterion) {
    let mut group = c.benchmark_group("factual_qa");
    group.throughput(Throughput::Elements(1));
    for facts in [10_000, 100_000, 1_000_000] {
        let companies = facts / FACTS_PER_COMPANY;
        let tool = FactualQa::new(KnowledgeBase::from_graph(generated_graph(facts), 50));
        let mut n = 0usize;
        group.bench_with_input(BenchmarkId::from_parameter(facts), &facts, |b, _| {
            b.iter(|| {
                n = n.wrapping_mul(31).wrapping_add(17);
                let args = json!({
                    "entity": format!("company {} inc", n % companies),
                    "start_date_range": "2016-01-01",
                    "end_date_range": "2020-12-31",
                    "predicate": "launched",
                });
                let answer = futures::executor::block_on(tool.call(args, context()));
                black_box(answer.expect("every generated company answers"));
            });
        });
    }
    group.finish();
}

criterion_group!(benches, factual_qa);
criterion_main!(benches);
