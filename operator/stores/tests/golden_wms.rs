#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Replays `tests/fixtures/upstream/drafting-table-wms-golden.jsonl` (the
//! upstream fixture copied byte for byte; provenance and SHA-256 in
//! `tests/fixtures/upstream/SOURCES`, checked before the replay) line for
//! line against every WorkStore backend (memory and SQLite) (procedure: contracts/lifecycle.md §19).
//!
//! Seeding, envelopes and the comparison live in `protobot_stores::golden`,
//! shared with the `protobot wms` binary replay.

use std::path::PathBuf;

use protobot_lifecycle::{Operation, Role, State};
use protobot_stores::{
    AdapterConfig, MemoryStore, SqliteStore, WorkStore,
    adapter::partition,
    golden::{FIXTURE, Fixture, listed_sha256, sha256_hex, verify_digest},
};
use serde_json::Value;

fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/upstream")
}

/// The fixture's bytes, after checking them against the digest in `SOURCES`.
fn fixture_bytes() -> Vec<u8> {
    let dir = fixtures_dir();
    let sources = std::fs::read_to_string(dir.join("SOURCES"))
        .unwrap_or_else(|e| panic!("{}/SOURCES is missing: {e}", dir.display()));
    let path = dir.join(FIXTURE);
    let raw = std::fs::read(&path)
        .unwrap_or_else(|e| panic!("golden fixture {} is missing: {e}", path.display()));
    if let Err(e) = verify_digest(&sources, FIXTURE, &raw) {
        panic!("{e}");
    }
    raw
}

fn fixture() -> Vec<Value> {
    let raw = fixture_bytes();
    std::str::from_utf8(&raw)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn the_fixture_is_in_the_repository_and_matches_its_recorded_digest() {
    let raw = fixture_bytes();
    assert_eq!(raw.len(), 29_721, "the upstream file is 29,721 bytes");
    assert_eq!(fixture().len(), 48, "the upstream file has 48 lines");
}

#[test]
fn a_changed_fixture_byte_fails_the_digest_check() {
    let sources = std::fs::read_to_string(fixtures_dir().join("SOURCES")).unwrap();
    let listed = listed_sha256(&sources, FIXTURE).unwrap();
    let mut raw = fixture_bytes();
    raw[0] ^= 1;
    assert_ne!(sha256_hex(&raw), listed);
    assert_eq!(listed_sha256(&sources, "not-listed.jsonl"), None);
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn drafting_table_wms_golden_replays_line_for_line_on_memory() {
    replay(MemoryStore::new).await;
}

#[tokio::test]
async fn drafting_table_wms_golden_replays_line_for_line_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wms.sqlite");
    replay(|project, cfg| SqliteStore::open(&path, project, cfg).unwrap()).await;
}

async fn replay<S: WorkStore>(make: impl FnOnce(&str, AdapterConfig) -> S) {
    let lines = fixture();
    assert_eq!(lines.len(), 48, "the fixture has 48 records");
    let golden = Fixture::parse(&fixture_bytes()).unwrap();
    assert_eq!(golden.lines[1]["replaces_base_approval_records"], true);
    let (project, now) = (golden.project_id.as_str(), golden.now);

    // 1. Trusted contexts from the fake Gate; 2. seeds.
    let store = make(project, golden.adapter_config());
    golden.seed(&store).await.unwrap();

    // 3. Declarations: tool manifest and operation partition.
    let manifest = &lines[2];
    assert_eq!(manifest["step"], "wms-tool-manifest");
    let drafting: Vec<String> = partition(Role::DraftingTable)
        .iter()
        .map(|o| o.tool_name())
        .collect();
    assert_eq!(strings(&manifest["wms_tools"]), drafting);
    for (op, tool) in manifest["assert"]["canonical_separator_mapping"]
        .as_object()
        .unwrap()
    {
        assert_eq!(
            Operation::parse(op).unwrap().tool_name(),
            tool.as_str().unwrap()
        );
    }
    let part = &lines[3];
    assert_eq!(part["step"], "operation-partition");
    let api: Vec<String> = Operation::ALL
        .iter()
        .map(|o| o.as_str().to_string())
        .collect();
    assert_eq!(
        strings(&part["adapter_api"]),
        api,
        "adapter API is exactly the 30 operations in order"
    );
    let names = |r: Role| -> Vec<String> {
        partition(r)
            .iter()
            .map(|o| o.as_str().to_string())
            .collect()
    };
    assert_eq!(strings(&part["drafting_table"]), names(Role::DraftingTable));
    // Newer code also lets a human maintainer link change sets; the stored fixture predates it.
    assert!(names(Role::HumanMaintainer).starts_with(&strings(&part["human_maintainer"])));
    assert_eq!(part["assert"]["drafting_table_subset_of_adapter"], true);
    assert_eq!(
        part["assert"]["drafting_table_job_site_intersection"],
        serde_json::json!([])
    );
    for op in strings(&part["drafting_table"]) {
        assert!(
            Operation::parse(&op).is_some(),
            "{op} is in the adapter API"
        );
    }
    let rules = protobot_lifecycle::Ruleset::v1().unwrap();
    let family = |r: Role| -> Vec<String> {
        rules
            .family(r)
            .iter()
            .map(|c| c.as_str().to_string())
            .collect()
    };
    let mut job_site = family(Role::JobSite);
    job_site.push(Operation::FindingCreate.as_str().to_string());
    assert_eq!(
        strings(&part["job_site"]),
        job_site,
        "job-site family + finding.create"
    );
    assert_eq!(strings(&part["materializer"]), family(Role::Materializer));
    assert_eq!(strings(&part["reconciler"]), family(Role::Reconciler));
    for unknown in strings(&part["assert"]["unknown_operations"]) {
        assert!(
            Operation::parse(&unknown).is_none(),
            "{unknown} must not be an operation"
        );
    }
    for op in strings(&part["drafting_table"]) {
        assert!(
            !strings(&part["job_site"]).contains(&op),
            "drafting table ∩ job site = ∅"
        );
    }

    // 4. Operation records, in order.
    let mut replayed = 0;
    for step in golden.steps().unwrap() {
        let (Some(env), Some(expected)) = (&step.envelope, &step.expected) else {
            continue;
        };
        let ctx = golden.contexts.get(&env.actor_context_ref);
        let got = store.execute(ctx, env, now).await.unwrap();
        let actual = serde_json::to_value(&got).unwrap();
        if let Err(diffs) = protobot_stores::golden::compare(&step.step, expected, &actual) {
            panic!("{}\n({actual})", diffs.join("\n"));
        }
        replayed += 1;
    }
    assert_eq!(
        replayed, 43,
        "every operation record with a result was replayed"
    );

    // 5. Final state.
    let request = store.request("request-001").await.unwrap().unwrap();
    assert_eq!(request.request_revision, 6);
    assert_eq!(request.business_priority, "urgent");
    assert_eq!(request.change_set_id, "CS-00001");
    assert_eq!(request.build_work_item_id, "wi-001");
    let status = |s: Option<protobot_lifecycle::Submission>| s.unwrap().status;
    assert_eq!(
        status(store.submission("resolution-submission-001").await.unwrap()),
        "superseded"
    );
    assert_eq!(
        status(store.submission("acknowledgement-001").await.unwrap()),
        "consumed"
    );
    let approval = |id: &'static str| {
        let store = &store;
        async move { store.approval(id).await.unwrap().unwrap().status }
    };
    assert_eq!(approval("refine-approval-001").await, "consumed");
    assert_eq!(approval("resolution-approval-001").await, "revoked");
    assert_eq!(approval("ack-approval-001").await, "consumed");
    let wi = store.get("wi-001").await.unwrap().unwrap();
    assert_eq!(
        (wi.state, wi.contract_version),
        (State::Blocked, 7),
        "no command moved wi-001"
    );
}
