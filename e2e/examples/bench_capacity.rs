//! `make bench`: Job Site throughput per replica at 1, 8 and 32 build slots. Thirty-two
//! ready items, scripted Workers A and B that each take a fixed time (default 1 s), no
//! Inspector, the in-memory work store (the store is not what is measured). Prints items
//! per minute, the speed-up over one slot, and this process's CPU seconds per item.
//!
//! Run: `cargo run --release -p protobot-e2e --example bench_capacity [-- ITEMS WORKER_MS]`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::{sync::Arc, time::Duration};

use protobot_jobsite::scripted::{SiteOptions, ids, merges_on_main, site, world};
use protobot_stores::{AdapterConfig, MemoryStore};

fn main() {
    let mut args = std::env::args().skip(1);
    let items: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(32);
    let worker_ms: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut baseline = None;
    println!("{items} items, Workers A and B {worker_ms} ms each, in-memory store");
    for slots in [1usize, 8, 32] {
        let (per_minute, cpu_per_item) = runtime.block_on(async {
            let store = Arc::new(MemoryStore::new(
                "demo",
                AdapterConfig {
                    materializer_subject: "m".into(),
                    lease_seconds: protobot_jobsite::scripted::LEASE,
                },
            ));
            let ids = ids(items);
            let w = world(store, &ids).await;
            let replica = Arc::new(site(
                &w,
                SiteOptions {
                    subject: "replica-1",
                    inspector: false,
                    worker_delay: Some(Duration::from_millis(worker_ms)),
                    capacity: Some(Arc::new(tokio::sync::Semaphore::new(slots))),
                    wip_limit: items,
                    ..SiteOptions::default()
                },
            ));
            let (cpu, started) = (
                protobot_e2e::bench::cpu_seconds(),
                std::time::Instant::now(),
            );
            tokio::spawn(async move { replica.run_until_idle().await })
                .await
                .unwrap()
                .unwrap();
            let took = started.elapsed().as_secs_f64();
            assert_eq!(
                merges_on_main(&w.origin).len(),
                items,
                "every item merged once"
            );
            (
                items as f64 * 60.0 / took,
                (protobot_e2e::bench::cpu_seconds() - cpu) / items as f64,
            )
        });
        let base = *baseline.get_or_insert(per_minute);
        println!(
            "capacity {slots:>2}: {per_minute:7.1} items/min ({:4.1}x capacity 1), operator CPU {cpu_per_item:.3} s/item",
            per_minute / base
        );
    }
}
