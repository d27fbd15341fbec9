#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The admin server over real HTTP on loopback: readiness flips, health, and
//! the metric families with the scrape-time work-item collector.

use std::sync::{Arc, Mutex};

use protobot_controller::{
    admin::{Readiness, serve},
    metrics::{JobSiteMetrics, StateCounts},
};
use protobot_lifecycle::State;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Counts(Mutex<Vec<(State, u64)>>);

impl StateCounts for Counts {
    fn counts(&self) -> Vec<(State, u64)> {
        self.0.lock().unwrap().clone()
    }
}

async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(req.as_bytes()).await.unwrap();
    let mut buf = String::new();
    stream.read_to_string(&mut buf).await.unwrap();
    let status = buf.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = buf.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

#[tokio::test]
async fn readiness_turns_true_only_when_set() {
    let registry = prometheus::Registry::new();
    let readiness = Readiness::default();
    let (addr, task) = serve("127.0.0.1:0".parse().unwrap(), registry, readiness.clone())
        .await
        .unwrap();
    assert_eq!(get(addr, "/healthz").await.0, 200);
    assert_eq!(get(addr, "/readyz").await.0, 503);
    readiness.set_ready();
    assert_eq!(get(addr, "/readyz").await.0, 200);
    readiness.set_not_ready();
    assert_eq!(get(addr, "/readyz").await.0, 503);
    assert_eq!(get(addr, "/nope").await.0, 404);
    task.abort();
}

#[tokio::test]
async fn metrics_expose_every_family_and_live_state_counts() {
    let registry = prometheus::Registry::new();
    let counts = Arc::new(Counts(Mutex::new(vec![
        (State::Building, 2),
        (State::Blocked, 1),
    ])));
    let metrics = JobSiteMetrics::register(&registry, counts.clone()).unwrap();
    metrics.claims.with_label_values(&["allowed"]).inc();
    metrics.claims.with_label_values(&["duplicate"]).inc_by(3);
    {
        let timer = metrics.reconcile("buildworkitem");
        timer.fail("stale-fencing-token");
    }
    let (addr, task) = serve(
        "127.0.0.1:0".parse().unwrap(),
        registry,
        Readiness::default(),
    )
    .await
    .unwrap();
    let (status, body) = get(addr, "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        body.contains("protobot_work_items{state=\"building\"} 2"),
        "{body}"
    );
    assert!(
        body.contains("protobot_work_items{state=\"waiting\"} 0"),
        "every state is reported"
    );
    assert!(
        !body.contains("state=\"initial\""),
        "initial is never stored"
    );
    assert!(body.contains("protobot_claims_total{outcome=\"duplicate\"} 3"));
    assert!(
        body.contains("protobot_claims_total{outcome=\"stale\"} 0"),
        "known outcomes start at zero"
    );
    assert!(body.contains("protobot_merges_total{outcome=\"verify-failed\"} 0"));
    assert!(body.contains("protobot_reconcile_errors_total{category=\"stale-fencing-token\",controller=\"buildworkitem\"} 1"));
    assert!(
        body.contains("protobot_reconcile_duration_seconds_count{controller=\"buildworkitem\"} 1")
    );
    // The collector reads the source at scrape time.
    *counts.0.lock().unwrap() = vec![(State::Completed, 5)];
    let (_, body) = get(addr, "/metrics").await;
    assert!(
        body.contains("protobot_work_items{state=\"completed\"} 5"),
        "{body}"
    );
    assert!(
        body.contains("protobot_work_items{state=\"building\"} 0"),
        "stale samples are not kept"
    );
    // Every family the operator records is exposed from the first scrape (egress decisions
    // are the egress proxy's, sandbox pod phases the cluster's: see metrics.rs).
    for family in [
        "protobot_work_items",
        "protobot_claims_total",
        "protobot_lease_renewals_total",
        "protobot_lease_expiries_total",
        "protobot_triage_cycles",
        "protobot_escalations_total",
        "protobot_inspection_runs_total",
        "protobot_inspection_findings_total",
        "protobot_merges_total",
        "protobot_reconciler_repairs_total",
        "protobot_reconcile_duration_seconds",
        "protobot_reconcile_errors_total",
        "protobot_registration_to_completion_seconds",
    ] {
        assert!(
            body.contains(&format!("# TYPE {family} ")),
            "{family} missing"
        );
    }
    task.abort();
}

#[tokio::test]
async fn a_busy_port_is_a_clear_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let err = serve(addr, prometheus::Registry::new(), Readiness::default())
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("failed to bind the admin server"),
        "{err}"
    );
}
