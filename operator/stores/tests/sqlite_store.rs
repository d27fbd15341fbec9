#![allow(clippy::unwrap_used, clippy::expect_used)]
//! What the SQLite backend promises beyond the conformance suite:
//!
//! - restart: records, counters (fencing tokens, the finding sequence) and
//!   idempotency replays survive closing and reopening the file;
//! - refusal: a file that is not a database (`StoreError::Undecodable`), an
//!   unreachable path (`StoreError::Backend`), a newer schema or another
//!   project's database (`StoreError::Foreign`) fails `open` with a clear
//!   `StoreError` and leaves the file alone;
//! - atomicity: a call whose write or read fails mid-transaction rolls back
//!   whole (no record, counter, audit or idempotency row survives) and fails
//!   with `StoreError::Backend` (a failed SQLite call) or
//!   `StoreError::Undecodable` (a stored body that does not decode);
//! - concurrency: two stores on one file (two processes) race claims and
//!   exactly one wins;
//! - `list` filters by state exactly like the in-memory backend.
//!
//! Faults are injected from a second connection to the same file, the way an
//! operator or a damaged disk would meet the store: triggers that `RAISE(ABORT)`
//! make a table refuse writes, and a raw `UPDATE` corrupts a stored body.

use std::{path::Path, sync::Arc};

use jiff::{SignedDuration, Timestamp};
use protobot_lifecycle::{
    ApprovalRecord, Code, Command, EnvelopeOutcome, OperationEnvelope, Reconciliation,
    ResultEnvelope, Role, State,
};
use protobot_stores::{
    Import, ItemFilter, MemoryStore, Observation, SqliteStore, StoreError, WorkStore,
    conformance::{self, Harness, cmd, item},
    sqlite::SCHEMA_VERSION,
};
use rusqlite::Connection;
use serde_json::json;
use tempfile::TempDir;

// === helpers ===

fn open(path: &Path) -> SqliteStore {
    SqliteStore::open(path, conformance::PROJECT, conformance::config()).unwrap()
}

fn db_path(dir: &TempDir) -> std::path::PathBuf {
    dir.path().join("wms.sqlite3")
}

/// A second connection to the store's file: the fault injector and inspector.
fn raw(path: &Path) -> Connection {
    let conn = Connection::open(path).unwrap();
    conn.busy_timeout(std::time::Duration::from_secs(5))
        .unwrap();
    conn
}

fn count(conn: &Connection, table: &str) -> i64 {
    conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
        .unwrap()
}

/// Row counts of every table a command can write.
fn row_counts(conn: &Connection) -> Vec<(&'static str, i64)> {
    [
        "work_items",
        "idempotency_entries",
        "reservations",
        "observed_readiness",
        "approvals",
        "submissions",
        "change_sets",
        "requests",
        "findings",
        "counters",
        "audit_log",
    ]
    .into_iter()
    .map(|t| (t, count(conn, t)))
    .collect()
}

fn fence_of(r: &ResultEnvelope) -> String {
    r.decision
        .as_ref()
        .and_then(|d| d.fencing_token_issued.clone())
        .map(String::from)
        .unwrap_or_else(|| panic!("no fence issued: {r:?}"))
}

fn finding(key: &str, producer_key: &str) -> OperationEnvelope {
    OperationEnvelope {
        operation: "finding.create".into(),
        actor_context_ref: "ref".into(),
        work_item_id: "wi-1".into(),
        idempotency_key: key.into(),
        payload: Some(json!({
            "producer_key": producer_key,
            "producer": "inspector-1",
            "inspection_run_id": "run-1",
            "body": {"summary": producer_key},
        })),
        ..OperationEnvelope::default()
    }
}

/// The message of a failed SQLite call ([`StoreError::Backend`], transient).
fn backend_failure(result: Result<impl std::fmt::Debug, StoreError>) -> String {
    match result {
        Err(err @ StoreError::Backend { .. }) => {
            assert!(err.is_transient(), "{err}");
            let source = std::error::Error::source(&err).expect("a backend failure has a cause");
            assert!(
                source.downcast_ref::<rusqlite::Error>().is_some(),
                "the cause is SQLite's: {source:?}"
            );
            err.to_string()
        }
        other => panic!("expected StoreError::Backend, got {other:?}"),
    }
}

/// The message of a stored record that does not decode ([`StoreError::Undecodable`],
/// for a person).
fn undecodable(result: Result<impl std::fmt::Debug, StoreError>) -> String {
    match result {
        Err(err @ StoreError::Undecodable { .. }) => {
            assert!(!err.is_transient(), "{err}");
            err.to_string()
        }
        other => panic!("expected StoreError::Undecodable, got {other:?}"),
    }
}

/// The message of a database that is not this store's ([`StoreError::Foreign`], for a
/// person).
fn foreign(result: Result<impl std::fmt::Debug, StoreError>) -> String {
    match result {
        Err(err @ StoreError::Foreign { .. }) => {
            assert!(!err.is_transient(), "{err}");
            err.to_string()
        }
        other => panic!("expected StoreError::Foreign, got {other:?}"),
    }
}

fn claim(version: u64, key: &str) -> OperationEnvelope {
    cmd(
        Command::Claim,
        "wi-1",
        State::ReadyForBuilding,
        version,
        key,
    )
}

// === restart ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_counters_and_replays_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);

    // First life: claim, let the lease expire, recover it, append a finding.
    let mut h = Harness::new(open(&path));
    h.seed(item("wi-1", State::ReadyForBuilding, 1)).await;
    let a = h.ctx_as(Role::JobSite, "job-site-a");
    let first_claim = h.run(&a, claim(1, "a-claim")).await;
    let first_token = fence_of(&first_claim);
    h.now += SignedDuration::from_mins(16);
    h.observe(
        "wi-1",
        Observation::Reconciliation(Reconciliation {
            status: "lease-recovered".into(),
            git_mutation: "none".into(),
            merge_envelope: None,
        }),
    )
    .await;
    let recovered = h
        .as_role(
            Role::Reconciler,
            cmd(Command::RecoverLease, "wi-1", State::Building, 2, "recover"),
        )
        .await;
    assert!(recovered.ok, "recover: {:?}", recovered.error);
    let f1 = h
        .as_role(Role::JobSite, finding("f-1", "inspector-1/f-1"))
        .await;
    assert_eq!(f1.fields["sequence"], 1, "{:?}", f1.error);
    let record_before = h.record("wi-1").await;
    let audit_before = h.store.audit_events().await.unwrap();
    let later = h.now;
    drop(h);

    // Second life: same file, fresh process state.
    let mut h = Harness::new(open(&path));
    h.now = later;
    assert_eq!(h.record("wi-1").await, record_before, "the record survives");
    assert_eq!(h.store.audit_events().await.unwrap(), audit_before);
    assert_eq!(record_before.state, State::ReadyForBuilding);

    let replay = h.run(&a, claim(1, "a-claim")).await;
    assert_eq!(
        replay,
        first_claim.as_replay(),
        "the stored claim result replays after the restart"
    );
    assert_eq!(replay.outcome, EnvelopeOutcome::Replayed);

    let b = h.ctx_as(Role::JobSite, "job-site-b");
    let second_claim = h.run(&b, claim(3, "b-claim")).await;
    let second_token = fence_of(&second_claim);
    assert_ne!(second_token, first_token, "fencing tokens never repeat");
    assert_eq!(
        (first_token.as_str(), second_token.as_str()),
        ("fence-1", "fence-2")
    );

    let f2 = h
        .as_role(Role::JobSite, finding("f-2", "inspector-1/f-2"))
        .await;
    assert_eq!(
        f2.fields["sequence"], 2,
        "the ledger sequence continues: {:?}",
        f2.error
    );
    let findings = h.store.findings("run-1").await.unwrap();
    assert_eq!(
        findings.iter().map(|f| f.sequence).collect::<Vec<_>>(),
        [1, 2]
    );
}

// === refusal ===

#[tokio::test]
async fn a_file_that_is_not_a_database_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let garbage = b"this is not a SQLite database, just some bytes\n".repeat(200);
    std::fs::write(&path, &garbage).unwrap();

    let message = undecodable(SqliteStore::open(
        &path,
        conformance::PROJECT,
        conformance::config(),
    ));
    assert!(
        message.contains(&format!(
            "cannot decode the work store database {}",
            path.display()
        )) && message.contains("not a database")
            && message.contains("a person must fix it"),
        "{message}"
    );
    assert_eq!(
        std::fs::read(&path).unwrap(),
        garbage,
        "the file is untouched"
    );
}

#[tokio::test]
async fn a_path_in_a_missing_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing").join("wms.sqlite3");
    let message = backend_failure(SqliteStore::open(
        &path,
        conformance::PROJECT,
        conformance::config(),
    ));
    assert!(
        message.contains("failed to open the work store database")
            && message.contains("unable to open database file"),
        "{message}"
    );
    assert!(!path.exists());
}

#[tokio::test]
async fn a_database_written_by_a_newer_build_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    drop(open(&path));
    let newer = SCHEMA_VERSION + 1;
    raw(&path)
        .pragma_update(None, "user_version", newer)
        .unwrap();

    let message = foreign(SqliteStore::open(
        &path,
        conformance::PROJECT,
        conformance::config(),
    ));
    assert!(
        message.contains(&format!(
            "has schema version {newer}, newer than this build supports ({SCHEMA_VERSION})"
        )) && message.contains("open it with that build or a newer one"),
        "{message}"
    );
}

#[tokio::test]
async fn a_database_of_another_project_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    drop(open(&path));
    let message = foreign(SqliteStore::open(
        &path,
        "another-project",
        conformance::config(),
    ));
    assert!(
        message.contains("belongs to project \"fixture-project\", not \"another-project\"")
            && message.contains("it is another project's work store"),
        "{message}"
    );
}

#[tokio::test]
async fn reopening_a_current_database_keeps_its_schema_version() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    drop(open(&path));
    drop(open(&path));
    let version: i64 = raw(&path)
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(version, SCHEMA_VERSION);
    let mode: String = raw(&path)
        .pragma_query_value(None, "journal_mode", |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
}

// === atomicity ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_write_rolls_back_the_whole_call() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let h = Harness::new(open(&path));
    h.seed(item("wi-1", State::ReadyForBuilding, 1)).await;
    let db = raw(&path);
    let before = row_counts(&db);

    // The claim advances the fence counter and rewrites the record before it
    // appends its audit event, which this trigger refuses.
    db.execute_batch(
        "CREATE TRIGGER audit_refuses BEFORE INSERT ON audit_log \
         BEGIN SELECT RAISE(ABORT, 'audit log refuses writes'); END;",
    )
    .unwrap();
    let ctx = h.ctx(Role::JobSite);
    let message = backend_failure(
        h.store
            .execute(Some(&ctx), &claim(1, "claim-1"), h.now)
            .await,
    );
    assert!(
        message.contains("failed to append the audit event of claim")
            && message.contains("audit log refuses writes"),
        "{message}"
    );
    assert_eq!(row_counts(&db), before, "nothing of the call was written");
    assert_eq!(
        h.record("wi-1").await,
        item("wi-1", State::ReadyForBuilding, 1)
    );

    // Once the table accepts writes the same command runs as if the failed
    // attempt never happened: same key, first fencing token.
    db.execute_batch("DROP TRIGGER audit_refuses;").unwrap();
    let r = h.as_role(Role::JobSite, claim(1, "claim-1")).await;
    assert!(r.ok, "{:?}", r.error);
    assert_eq!(fence_of(&r), "fence-1");
    assert_eq!(r.outcome, EnvelopeOutcome::Applied);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_stored_record_fails_reads_and_commands_without_writing() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let h = Harness::new(open(&path));
    h.seed(item("wi-1", State::ReadyForBuilding, 1)).await;
    let db = raw(&path);
    db.execute(
        "UPDATE work_items SET body = '{\"id\": \"wi-1\", truncated' WHERE id = 'wi-1'",
        [],
    )
    .unwrap();
    let before = row_counts(&db);

    let message = undecodable(h.store.get("wi-1").await);
    assert!(
        message.contains("cannot decode the stored work item \"wi-1\""),
        "{message}"
    );
    let message = undecodable(h.store.list(&ItemFilter::default()).await);
    assert!(message.contains("\"wi-1\""), "{message}");

    let ctx = h.ctx(Role::JobSite);
    let message = undecodable(
        h.store
            .execute(Some(&ctx), &claim(1, "claim-1"), h.now)
            .await,
    );
    assert!(
        message.contains("cannot decode the stored work item \"wi-1\""),
        "{message}"
    );
    assert_eq!(
        row_counts(&db),
        before,
        "no rejection, audit or idempotency entry was frozen on a failed read"
    );
}

#[tokio::test]
async fn failed_imports_and_observations_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let store = open(&path);
    store
        .import(Import::Record(item("wi-1", State::Building, 2)))
        .await
        .unwrap();
    let db = raw(&path);
    db.execute_batch(
        "CREATE TRIGGER approvals_refuse BEFORE INSERT ON approvals \
         BEGIN SELECT RAISE(ABORT, 'approvals refuse writes'); END;
         CREATE TRIGGER items_refuse BEFORE UPDATE ON work_items \
         BEGIN SELECT RAISE(ABORT, 'work items refuse writes'); END;",
    )
    .unwrap();
    let before = row_counts(&db);

    let approval = ApprovalRecord {
        id: "approval-1".into(),
        ..ApprovalRecord::default()
    };
    let message = backend_failure(store.import(Import::Approval(approval)).await);
    assert!(
        message.contains("failed to write approval \"approval-1\"")
            && message.contains("approvals refuse writes"),
        "{message}"
    );
    let message = backend_failure(
        store
            .observe(
                "wi-1",
                Observation::Reconciliation(Reconciliation {
                    status: "lease-recovered".into(),
                    git_mutation: "none".into(),
                    merge_envelope: None,
                }),
            )
            .await,
    );
    assert!(message.contains("work items refuse writes"), "{message}");
    assert_eq!(row_counts(&db), before);
    assert_eq!(store.approval("approval-1").await.unwrap(), None);
    assert_eq!(
        store.get("wi-1").await.unwrap().unwrap().reconciliation,
        None
    );

    // A rejected observation is the store's answer, not a storage failure.
    let rejected = store
        .observe(
            "wi-1",
            Observation::Inspection {
                inspection_run_sealed: true,
                findings_terminal: true,
                final_tests_passed: true,
            },
        )
        .await;
    assert!(
        matches!(rejected, Err(StoreError::ObservationRejected(_))),
        "{rejected:?}"
    );
    assert!(matches!(
        store
            .observe("wi-404", Observation::Readiness(Default::default()))
            .await,
        Err(StoreError::NotFound(_))
    ));
    assert_eq!(row_counts(&db), before);
}

// === concurrency ===

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_stores_on_one_file_race_claims_with_one_winner() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let first = Arc::new(open(&path));
    let second = Arc::new(open(&path));
    first
        .import(Import::Record(item("wi-1", State::ReadyForBuilding, 1)))
        .await
        .unwrap();
    let h = Harness::new(MemoryStore::new(
        conformance::PROJECT,
        conformance::config(),
    ));
    let now: Timestamp = h.now;
    let mut tasks = Vec::new();
    for n in 0..8 {
        let store = Arc::clone(if n % 2 == 0 { &first } else { &second });
        let ctx = h.ctx_as(Role::JobSite, &format!("job-site-{n}"));
        tasks.push(tokio::spawn(async move {
            store
                .execute(Some(&ctx), &claim(1, &format!("race-{n}")), now)
                .await
                .unwrap()
        }));
    }
    let mut winners = 0;
    for task in tasks {
        let r = task.await.unwrap();
        if r.ok {
            winners += 1;
            assert_eq!(fence_of(&r), "fence-1");
        } else {
            assert!(
                matches!(r.code(), Some(Code::DuplicateClaim | Code::StaleState)),
                "{r:?}"
            );
        }
    }
    assert_eq!(winners, 1);
    let record = second.get("wi-1").await.unwrap().unwrap();
    assert_eq!(
        (record.state, record.contract_version),
        (State::Building, 2)
    );
    assert_eq!(first.audit_events().await.unwrap().len(), 1);
}

// === list ===

#[tokio::test]
async fn list_filters_by_state_like_the_memory_backend() {
    let memory = MemoryStore::new(conformance::PROJECT, conformance::config());
    let dir = tempfile::tempdir().unwrap();
    let sqlite = open(&db_path(&dir));
    let items = [
        item("wi-3", State::Blocked, 1),
        item("wi-1", State::ReadyForBuilding, 1),
        item("wi-10", State::ReadyForBuilding, 4),
        item("wi-2", State::Completed, 9),
        item("wi-2b", State::Blocked, 2),
    ];
    for record in items {
        memory.import(Import::Record(record.clone())).await.unwrap();
        sqlite.import(Import::Record(record)).await.unwrap();
    }
    // Moving an item to another state moves it between filters.
    let moved = item("wi-3", State::Waiting, 2);
    memory.import(Import::Record(moved.clone())).await.unwrap();
    sqlite.import(Import::Record(moved)).await.unwrap();

    let filters = [
        ItemFilter::default(),
        ItemFilter::state(State::ReadyForBuilding),
        ItemFilter::state(State::Blocked),
        ItemFilter::state(State::Waiting),
        ItemFilter::state(State::Merging),
        ItemFilter {
            states: vec![State::Completed, State::Blocked, State::Completed],
        },
    ];
    for filter in filters {
        let expected = memory.list(&filter).await.unwrap();
        assert_eq!(sqlite.list(&filter).await.unwrap(), expected, "{filter:?}");
    }
    let ids: Vec<String> = sqlite
        .list(&ItemFilter::default())
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(ids, ["wi-1", "wi-10", "wi-2", "wi-2b", "wi-3"]);
}
