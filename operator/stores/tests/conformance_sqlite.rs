#![allow(clippy::expect_used)] // test support: a failed setup is a failed test
//! The WorkStore conformance suite against the SQLite backend, each scenario on
//! its own database file in a fresh temporary directory, so every call goes
//! through the real file, WAL and locking path.

use jiff::Timestamp;
use protobot_lifecycle::{
    ApprovalRecord, AuditEvent, AuthorizationContext, OperationEnvelope, ResultEnvelope,
    Submission, WorkItemRecord,
};
use protobot_stores::{
    AdapterConfig, FindingRecord, Import, ItemFilter, Observation, RequestRecord, SqliteStore,
    StoreError, WorkStore,
};
use tempfile::TempDir;

/// A file-backed store that deletes its directory when the scenario ends.
struct TempSqlite {
    store: SqliteStore,
    _dir: TempDir,
}

impl TempSqlite {
    fn new(project: &str, cfg: AdapterConfig) -> TempSqlite {
        let dir = tempfile::tempdir().expect("temporary directory");
        let store = SqliteStore::open(dir.path().join("wms.sqlite3"), project, cfg)
            .expect("open the scenario database");
        TempSqlite { store, _dir: dir }
    }
}

impl WorkStore for TempSqlite {
    fn project_id(&self) -> String {
        self.store.project_id()
    }
    async fn execute(
        &self,
        ctx: Option<&AuthorizationContext>,
        env: &OperationEnvelope,
        now: Timestamp,
    ) -> Result<ResultEnvelope, StoreError> {
        self.store.execute(ctx, env, now).await
    }
    async fn get(&self, id: &str) -> Result<Option<WorkItemRecord>, StoreError> {
        self.store.get(id).await
    }
    async fn list(&self, filter: &ItemFilter) -> Result<Vec<WorkItemRecord>, StoreError> {
        self.store.list(filter).await
    }
    async fn observe(&self, id: &str, observation: Observation) -> Result<(), StoreError> {
        self.store.observe(id, observation).await
    }
    async fn import(&self, import: Import) -> Result<(), StoreError> {
        self.store.import(import).await
    }
    async fn findings(&self, inspection_run_id: &str) -> Result<Vec<FindingRecord>, StoreError> {
        self.store.findings(inspection_run_id).await
    }
    async fn audit_events(&self) -> Result<Vec<AuditEvent>, StoreError> {
        self.store.audit_events().await
    }
    async fn approval(&self, id: &str) -> Result<Option<ApprovalRecord>, StoreError> {
        self.store.approval(id).await
    }
    async fn submission(&self, id: &str) -> Result<Option<Submission>, StoreError> {
        self.store.submission(id).await
    }
    async fn request(&self, id: &str) -> Result<Option<RequestRecord>, StoreError> {
        self.store.request(id).await
    }
}

protobot_stores::workstore_conformance!(|project: String, cfg: AdapterConfig| async move {
    TempSqlite::new(&project, cfg)
});

/// The same suite on an in-memory SQLite database (no file I/O), so a failure
/// here but not above points at the file path rather than the SQL.
mod in_memory {
    use protobot_stores::{AdapterConfig, SqliteStore};

    protobot_stores::workstore_conformance!(|project: String, cfg: AdapterConfig| async move {
        SqliteStore::open_in_memory(&project, cfg).expect("open an in-memory database")
    });
}
