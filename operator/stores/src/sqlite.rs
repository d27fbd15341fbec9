//! The SQLite WorkStore: the durable backend of single-machine mode
//! (ARCHITECTURE.md §7). It decides exactly like the in-memory backend — the
//! same adapter, observation and import code runs over a [`WmsTxn`] — and only
//! supplies storage and atomicity.
//!
//! Every mutating call (`execute`, `observe`, `import`) is one `BEGIN IMMEDIATE`
//! transaction: the write lock is taken up front, so the reads the adapter
//! bases its decision on cannot be invalidated before the commit (the version
//! check of a compare-and-swap store comes for free). [`WmsTxn`] is infallible,
//! so the view records the first SQLite or decoding error, stops touching the
//! database, and the call rolls back and fails with the [`StoreError`] that
//! says what happened (a failed SQLite call, a stored record that does not
//! decode) instead of committing: a call writes everything or nothing.
//!
//! Layout: one table per WMS record family, each record stored whole as JSON
//! text beside the key columns it is looked up by (work items also carry their
//! state, so listing by state is an index scan). Named counters — fencing
//! tokens, minted ids, the finding ledger's global sequence — live in their own
//! table and never go backwards, across restarts included. The schema version
//! is SQLite's `user_version`; [`SqliteStore::open`] creates or migrates the
//! schema, and refuses a database written by a newer build or for another
//! project.

use std::{
    cell::RefCell,
    path::Path,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use jiff::Timestamp;
use protobot_lifecycle::{
    ApprovalRecord, AuditEvent, AuthorizationContext, IdempotencyEntry, OperationEnvelope,
    Readiness, Reservation, ResultEnvelope, Submission, WorkItemRecord,
};
use rusqlite::{
    Connection, OptionalExtension, TransactionBehavior, params, params_from_iter, types::ToSql,
};
use serde::{Serialize, de::DeserializeOwned};

use crate::{
    Import, ItemFilter, Observation, StoreError, WorkStore,
    adapter::{self, AdapterConfig},
    observe,
    txn::{ChangeSetRecord, FindingRecord, RequestRecord, WmsTxn},
};

/// The schema version this build writes (SQLite `user_version`).
pub const SCHEMA_VERSION: i64 = 1;

/// How long a call waits for another process's write lock before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Migrations by the version they start from: `MIGRATIONS[v]` takes a database
/// from `user_version` `v` to `v + 1`. Append only; never edit a shipped entry.
const MIGRATIONS: [&str; SCHEMA_VERSION as usize] = [SCHEMA_V1];

/// Version 1. Records are JSON text in `body`; the other columns are keys.
const SCHEMA_V1: &str = "
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) STRICT;
CREATE TABLE work_items (
    id    TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    body  TEXT NOT NULL
) STRICT;
CREATE INDEX work_items_by_state ON work_items (state, id);
CREATE TABLE idempotency_entries (
    key  TEXT PRIMARY KEY,
    body TEXT NOT NULL
) STRICT;
CREATE TABLE reservations (
    materialization_key TEXT PRIMARY KEY,
    body                TEXT NOT NULL
) STRICT;
CREATE TABLE observed_readiness (
    work_item_id TEXT PRIMARY KEY REFERENCES work_items (id),
    body         TEXT NOT NULL
) STRICT;
CREATE TABLE approvals (
    id   TEXT PRIMARY KEY,
    body TEXT NOT NULL
) STRICT;
CREATE TABLE submissions (
    id   TEXT PRIMARY KEY,
    body TEXT NOT NULL
) STRICT;
CREATE TABLE change_sets (
    id   TEXT PRIMARY KEY,
    body TEXT NOT NULL
) STRICT;
CREATE TABLE requests (
    request_id TEXT PRIMARY KEY,
    body       TEXT NOT NULL
) STRICT;
CREATE TABLE findings (
    producer_key      TEXT PRIMARY KEY,
    sequence          INTEGER NOT NULL UNIQUE,
    inspection_run_id TEXT NOT NULL,
    work_item_id      TEXT NOT NULL REFERENCES work_items (id),
    body              TEXT NOT NULL
) STRICT;
CREATE INDEX findings_by_run ON findings (inspection_run_id, sequence);
CREATE TABLE counters (
    name  TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) STRICT;
CREATE TABLE audit_log (
    position INTEGER PRIMARY KEY AUTOINCREMENT,
    body     TEXT NOT NULL
) STRICT;
";

/// A keyed record family: its table, key column and the name used in errors.
#[derive(Clone, Copy)]
struct Family {
    table: &'static str,
    key: &'static str,
    what: &'static str,
}

const WORK_ITEMS: Family = Family {
    table: "work_items",
    key: "id",
    what: "work item",
};
const IDEMPOTENCY: Family = Family {
    table: "idempotency_entries",
    key: "key",
    what: "idempotency entry",
};
const RESERVATIONS: Family = Family {
    table: "reservations",
    key: "materialization_key",
    what: "reservation",
};
const OBSERVED_READINESS: Family = Family {
    table: "observed_readiness",
    key: "work_item_id",
    what: "observed readiness of",
};
const APPROVALS: Family = Family {
    table: "approvals",
    key: "id",
    what: "approval",
};
const SUBMISSIONS: Family = Family {
    table: "submissions",
    key: "id",
    what: "submission",
};
const CHANGE_SETS: Family = Family {
    table: "change_sets",
    key: "id",
    what: "change set",
};
const REQUESTS: Family = Family {
    table: "requests",
    key: "request_id",
    what: "request",
};
const FINDINGS: Family = Family {
    table: "findings",
    key: "producer_key",
    what: "finding",
};

/// Why a SQLite operation failed; every variant names what was being done.
/// Callers see it as the [`StoreError`] variant that says what happened
/// (`From<SqliteError> for StoreError`), its source kept.
#[derive(Debug, thiserror::Error)]
enum SqliteError {
    #[error("failed to open the work store database {location}")]
    Open {
        location: String,
        #[source]
        source: rusqlite::Error,
    },
    #[error(
        "failed to open the work store database {location}: its schema version {found} is newer than this build supports ({SCHEMA_VERSION})"
    )]
    SchemaTooNew { location: String, found: i64 },
    #[error(
        "failed to open the work store database {location}: it belongs to project {found:?}, not {expected:?}"
    )]
    WrongProject {
        location: String,
        found: String,
        expected: String,
    },
    #[error("failed to {action}")]
    Sql {
        action: String,
        #[source]
        source: rusqlite::Error,
    },
    #[error("failed to decode the stored {what} {key:?}")]
    Decode {
        what: &'static str,
        key: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("failed to encode the {what} {key:?}")]
    Encode {
        what: &'static str,
        key: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("failed to {action}: value {value} is out of range")]
    OutOfRange {
        action: String,
        value: String,
        #[source]
        source: std::num::TryFromIntError,
    },
}

impl SqliteError {
    fn sql(action: impl Into<String>) -> impl FnOnce(rusqlite::Error) -> SqliteError {
        let action = action.into();
        move |source| SqliteError::Sql { action, source }
    }
}

impl From<SqliteError> for StoreError {
    /// A failed SQLite call is [`StoreError::Backend`], unless SQLite found the file
    /// damaged or not a database at all ([`StoreError::Undecodable`]); a record that does
    /// not decode is [`StoreError::Undecodable`]; a database of another project or of a
    /// newer build is [`StoreError::Foreign`].
    fn from(err: SqliteError) -> StoreError {
        match err {
            SqliteError::Open { location, source } => {
                if is_damaged(&source) {
                    StoreError::undecodable(format!("the work store database {location}"), source)
                } else {
                    StoreError::backend(format!("open the work store database {location}"), source)
                }
            }
            SqliteError::Sql { action, source } => {
                if is_damaged(&source) {
                    StoreError::undecodable(
                        format!("the work store database (while trying to {action})"),
                        source,
                    )
                } else {
                    StoreError::backend(action, source)
                }
            }
            SqliteError::SchemaTooNew { location, found } => StoreError::Foreign {
                object: format!("the work store database {location}"),
                conflict: format!(
                    "has schema version {found}, newer than this build supports ({SCHEMA_VERSION})"
                ),
                remedy: "it was written by a newer build of protobot: open it with that build or a newer one",
            },
            SqliteError::WrongProject {
                location,
                found,
                expected,
            } => StoreError::Foreign {
                object: format!("the work store database {location}"),
                conflict: format!("belongs to project {found:?}, not {expected:?}"),
                remedy: "it is another project's work store: open this project's own database, or name the project it belongs to",
            },
            SqliteError::Decode { what, key, source } => {
                StoreError::undecodable(format!("the stored {what} {key:?}"), source)
            }
            // Encoding the store's own records does not fail; if it ever did, nothing
            // was written (the transaction rolls back).
            SqliteError::Encode { what, key, source } => {
                StoreError::backend(format!("encode the {what} {key:?}"), source)
            }
            SqliteError::OutOfRange {
                action,
                value,
                source,
            } => StoreError::undecodable(format!("the number {value} (to {action})"), source),
        }
    }
}

/// Whether SQLite reports the file itself as damaged or not a database: a person's
/// matter, not a passing failure.
fn is_damaged(err: &rusqlite::Error) -> bool {
    matches!(
        err.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseCorrupt | rusqlite::ErrorCode::NotADatabase)
    )
}

// === impl SqliteStore ===

/// The SQLite backend: one connection, used by one call at a time. Clones share
/// it. The async methods run their transaction on tokio's blocking pool, so
/// they need a tokio runtime; a call whose future is dropped still finishes
/// (commits or rolls back) on that pool, like a request already sent to a
/// remote store.
#[derive(Clone, Debug)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    project_id: String,
    cfg: AdapterConfig,
    /// rusqlite's `Connection` is `Send` but not `Sync`. Calls are short local
    /// transactions, so one mutex-guarded connection serializes them without a
    /// pool; other processes are kept out by SQLite's own locking.
    conn: Mutex<Connection>,
}

impl SqliteStore {
    /// Opens (creating if needed) the database file at `path` for `project_id`,
    /// creating or migrating its schema. Fails if the file is not a database,
    /// was written by a newer build, or belongs to another project.
    pub fn open(
        path: impl AsRef<Path>,
        project_id: &str,
        cfg: AdapterConfig,
    ) -> Result<SqliteStore, StoreError> {
        let location = path.as_ref().display().to_string();
        let conn = Connection::open(path.as_ref()).map_err(|source| SqliteError::Open {
            location: location.clone(),
            source,
        })?;
        SqliteStore::setup(conn, &location, project_id, cfg)
    }

    /// A private, non-durable database in memory (tests, dry runs).
    pub fn open_in_memory(project_id: &str, cfg: AdapterConfig) -> Result<SqliteStore, StoreError> {
        let location = ":memory:".to_string();
        let conn = Connection::open_in_memory().map_err(|source| SqliteError::Open {
            location: location.clone(),
            source,
        })?;
        SqliteStore::setup(conn, &location, project_id, cfg)
    }

    fn setup(
        mut conn: Connection,
        location: &str,
        project_id: &str,
        cfg: AdapterConfig,
    ) -> Result<SqliteStore, StoreError> {
        configure(&mut conn, location, project_id)?;
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                project_id: project_id.to_string(),
                cfg,
                conn: Mutex::new(conn),
            }),
        })
    }

    /// Runs `f` on the blocking pool. A transaction can wait on the disk
    /// (`synchronous = FULL` syncs the WAL on every commit) or on another
    /// process's lock (up to the busy timeout), which must not stall the async
    /// worker threads. A panic inside `f` resumes in the caller, as it would
    /// with an inline call.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Inner) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let inner = Arc::clone(&self.inner);
        match tokio::task::spawn_blocking(move || f(&inner)).await {
            Ok(out) => out,
            Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
            Err(join) => Err(StoreError::backend("run the work store call", join)),
        }
    }
}

/// Sets the connection up and brings the schema to [`SCHEMA_VERSION`].
fn configure(conn: &mut Connection, location: &str, project_id: &str) -> Result<(), SqliteError> {
    let open = |source| SqliteError::Open {
        location: location.to_string(),
        source,
    };
    conn.busy_timeout(BUSY_TIMEOUT).map_err(open)?;
    // Read first: a file that is not a database fails here, before anything
    // below could write to it.
    let found = user_version(conn).map_err(open)?;
    if found > SCHEMA_VERSION {
        return Err(SqliteError::SchemaTooNew {
            location: location.to_string(),
            found,
        });
    }
    // WAL: readers (`protobot status`) never block the engine's writer. FULL:
    // a committed fencing token survives a power cut, so none is ever reissued.
    let _mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
        .map_err(open)?;
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(open)?;
    conn.pragma_update(None, "foreign_keys", true)
        .map_err(open)?;

    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(open)?;
    // Again under the write lock: another process may have migrated meanwhile.
    let from = user_version(&tx).map_err(open)?;
    if from > SCHEMA_VERSION {
        return Err(SqliteError::SchemaTooNew {
            location: location.to_string(),
            found: from,
        });
    }
    for (version, migration) in MIGRATIONS.iter().enumerate().skip(usize_of(from)) {
        tx.execute_batch(migration)
            .map_err(SqliteError::sql(format!(
                "migrate the work store database {location} from schema version {version}"
            )))?;
    }
    if from < SCHEMA_VERSION {
        tx.pragma_update(None, "user_version", SCHEMA_VERSION)
            .map_err(open)?;
    }
    tx.execute(
        "INSERT INTO meta (key, value) VALUES ('project_id', ?1) ON CONFLICT (key) DO NOTHING",
        params![project_id],
    )
    .map_err(open)?;
    let owner: String = tx
        .query_row(
            "SELECT value FROM meta WHERE key = 'project_id'",
            [],
            |row| row.get(0),
        )
        .map_err(open)?;
    if owner != project_id {
        return Err(SqliteError::WrongProject {
            location: location.to_string(),
            found: owner,
            expected: project_id.to_string(),
        });
    }
    tx.commit().map_err(open)
}

fn user_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.pragma_query_value(None, "user_version", |row| row.get(0))
}

/// A non-negative schema version as an index (negative versions count as 0).
fn usize_of(version: i64) -> usize {
    usize::try_from(version).unwrap_or(0)
}

// === impl Inner ===

impl Inner {
    /// The connection. A panic while it was held unwound through the
    /// transaction guard, which rolled back, so the connection is still sound
    /// and the poison is cleared rather than reported.
    fn conn(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` in one `BEGIN IMMEDIATE` transaction and commits only if `f`
    /// succeeded and touched the database without error.
    fn transact<T>(
        &self,
        action: &str,
        f: impl FnOnce(&mut SqlTxn<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut conn = self.conn();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(SqliteError::sql(format!("begin the {action} transaction")))?;
        let mut view = SqlTxn::new(&tx, &self.project_id);
        let out = f(&mut view);
        // A storage failure wins over the call's own answer: that answer may
        // rest on a read that failed.
        let out = match view.finish() {
            Err(failure) => Err(StoreError::from(failure)),
            Ok(()) => out,
        };
        match out {
            Ok(value) => {
                tx.commit()
                    .map_err(SqliteError::sql(format!("commit the {action} transaction")))?;
                Ok(value)
            }
            Err(err) => match tx.rollback() {
                Ok(()) => Err(err),
                // The call failed, and the connection may still hold its
                // transaction: the backend failure is the one to report.
                Err(source) => Err(StoreError::backend(
                    format!("roll back the {action} transaction (after: {err})"),
                    source,
                )),
            },
        }
    }

    /// Runs one read outside any explicit transaction (a single statement
    /// reads one consistent snapshot).
    fn read<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, SqliteError>,
    ) -> Result<T, StoreError> {
        let conn = self.conn();
        Ok(f(&conn)?)
    }
}

impl crate::trace::TracedStore for SqliteStore {
    async fn execute_traced(
        &self,
        ctx: Option<&AuthorizationContext>,
        env: &OperationEnvelope,
        now: Timestamp,
        mode: crate::trace::Mode,
    ) -> Result<crate::trace::Traced, StoreError> {
        let ctx = ctx.cloned();
        let env = env.clone();
        self.blocking(move |inner| {
            let action = format!("execute {}", env.operation);
            // A dry run's tap writes nothing through the view, so the
            // transaction commits no change.
            inner.transact(&action, |txn| {
                Ok(crate::trace::handle(
                    txn,
                    &inner.cfg,
                    ctx.as_ref(),
                    &env,
                    now,
                    mode,
                ))
            })
        })
        .await
    }
}

impl WorkStore for SqliteStore {
    fn project_id(&self) -> String {
        self.inner.project_id.clone()
    }

    async fn execute(
        &self,
        ctx: Option<&AuthorizationContext>,
        env: &OperationEnvelope,
        now: Timestamp,
    ) -> Result<ResultEnvelope, StoreError> {
        let ctx = ctx.cloned();
        let env = env.clone();
        self.blocking(move |inner| {
            let action = format!("execute {}", env.operation);
            inner.transact(&action, |txn| {
                Ok(adapter::handle(txn, &inner.cfg, ctx.as_ref(), &env, now))
            })
        })
        .await
    }

    async fn get(&self, id: &str) -> Result<Option<WorkItemRecord>, StoreError> {
        let id = id.to_string();
        self.blocking(move |inner| inner.read(|conn| get_json(conn, WORK_ITEMS, &id)))
            .await
    }

    async fn list(&self, filter: &ItemFilter) -> Result<Vec<WorkItemRecord>, StoreError> {
        let states: Vec<&'static str> = filter.states.iter().map(|s| s.as_str()).collect();
        self.blocking(move |inner| inner.read(|conn| list_work_items(conn, &states)))
            .await
    }

    async fn observe(&self, id: &str, observation: Observation) -> Result<(), StoreError> {
        let id = id.to_string();
        self.blocking(move |inner| {
            inner.transact("record an observation", |txn| {
                observe::apply(txn, &id, observation)
            })
        })
        .await
    }

    async fn import(&self, import: Import) -> Result<(), StoreError> {
        self.blocking(move |inner| {
            inner.transact("import a record", |txn| {
                crate::import::apply(txn, import);
                Ok(())
            })
        })
        .await
    }

    async fn findings(&self, inspection_run_id: &str) -> Result<Vec<FindingRecord>, StoreError> {
        let run = inspection_run_id.to_string();
        self.blocking(move |inner| {
            inner.read(|conn| {
                query_json(
                    conn,
                    FINDINGS,
                    &format!("findings of inspection run {run:?}"),
                    "SELECT producer_key, body FROM findings \
                     WHERE inspection_run_id = ?1 ORDER BY sequence",
                    &[&run],
                )
            })
        })
        .await
    }

    async fn audit_events(&self) -> Result<Vec<AuditEvent>, StoreError> {
        self.blocking(|inner| inner.read(audit_log)).await
    }

    async fn approval(&self, id: &str) -> Result<Option<ApprovalRecord>, StoreError> {
        let id = id.to_string();
        self.blocking(move |inner| inner.read(|conn| get_json(conn, APPROVALS, &id)))
            .await
    }

    async fn submission(&self, id: &str) -> Result<Option<Submission>, StoreError> {
        let id = id.to_string();
        self.blocking(move |inner| inner.read(|conn| get_json(conn, SUBMISSIONS, &id)))
            .await
    }

    async fn request(&self, id: &str) -> Result<Option<RequestRecord>, StoreError> {
        let id = id.to_string();
        self.blocking(move |inner| inner.read(|conn| get_json(conn, REQUESTS, &id)))
            .await
    }
}

// === queries ===

fn decode<T: DeserializeOwned>(family: Family, key: &str, body: &str) -> Result<T, SqliteError> {
    serde_json::from_str(body).map_err(|source| SqliteError::Decode {
        what: family.what,
        key: key.to_string(),
        source,
    })
}

fn encode<T: Serialize>(family: Family, key: &str, value: &T) -> Result<String, SqliteError> {
    serde_json::to_string(value).map_err(|source| SqliteError::Encode {
        what: family.what,
        key: key.to_string(),
        source,
    })
}

/// One record by key.
fn get_json<T: DeserializeOwned>(
    conn: &Connection,
    family: Family,
    key: &str,
) -> Result<Option<T>, SqliteError> {
    let sql = format!(
        "SELECT body FROM {} WHERE {} = ?1",
        family.table, family.key
    );
    let body: Option<String> = conn
        .query_row(&sql, params![key], |row| row.get(0))
        .optional()
        .map_err(SqliteError::sql(format!("read {} {key:?}", family.what)))?;
    body.map(|b| decode(family, key, &b)).transpose()
}

/// Records selected by `sql`, which yields `(key, body)` rows.
fn query_json<T: DeserializeOwned>(
    conn: &Connection,
    family: Family,
    what: &str,
    sql: &str,
    args: &[&dyn ToSql],
) -> Result<Vec<T>, SqliteError> {
    let action = || format!("read the {what}");
    let mut stmt = conn.prepare(sql).map_err(SqliteError::sql(action()))?;
    let rows = stmt
        .query_map(args, |row| {
            Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
        })
        .map_err(SqliteError::sql(action()))?;
    let mut out = Vec::new();
    for row in rows {
        let (key, body) = row.map_err(SqliteError::sql(action()))?;
        out.push(decode(family, &key, &body)?);
    }
    Ok(out)
}

/// Every record of a family, by key (the in-memory backend's map order: both
/// compare keys bytewise).
fn all_json<T: DeserializeOwned>(conn: &Connection, family: Family) -> Result<Vec<T>, SqliteError> {
    let sql = format!(
        "SELECT {key}, body FROM {table} ORDER BY {key}",
        key = family.key,
        table = family.table
    );
    query_json(conn, family, &format!("{} records", family.what), &sql, &[])
}

/// Work items in any of `states` (all when empty), by id.
fn list_work_items(
    conn: &Connection,
    states: &[&'static str],
) -> Result<Vec<WorkItemRecord>, SqliteError> {
    if states.is_empty() {
        return all_json(conn, WORK_ITEMS);
    }
    let sql = list_by_state_sql(states.len());
    let action = format!("work items in states {}", states.join(", "));
    let mut stmt = conn
        .prepare(&sql)
        .map_err(SqliteError::sql(format!("read the {action}")))?;
    let rows = stmt
        .query_map(params_from_iter(states.iter()), |row| {
            Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
        })
        .map_err(SqliteError::sql(format!("read the {action}")))?;
    let mut out = Vec::new();
    for row in rows {
        let (id, body) = row.map_err(SqliteError::sql(format!("read the {action}")))?;
        out.push(decode(WORK_ITEMS, &id, &body)?);
    }
    Ok(out)
}

/// The query of work items in one of `n` states, by id.
fn list_by_state_sql(n: usize) -> String {
    let placeholders = vec!["?"; n].join(", ");
    format!("SELECT id, body FROM work_items WHERE state IN ({placeholders}) ORDER BY id")
}

/// The audit log in append order.
fn audit_log(conn: &Connection) -> Result<Vec<AuditEvent>, SqliteError> {
    let action = || "read the audit log".to_string();
    let mut stmt = conn
        .prepare("SELECT position, body FROM audit_log ORDER BY position")
        .map_err(SqliteError::sql(action()))?;
    let rows = stmt
        .query_map([], |row| {
            Ok((row.get::<_, i64>(0)?, row.get::<_, String>(1)?))
        })
        .map_err(SqliteError::sql(action()))?;
    let mut out = Vec::new();
    for row in rows {
        let (position, body) = row.map_err(SqliteError::sql(action()))?;
        let event = serde_json::from_str(&body).map_err(|source| SqliteError::Decode {
            what: "audit event",
            key: position.to_string(),
            source,
        })?;
        out.push(event);
    }
    Ok(out)
}

/// Inserts or updates one record (an upsert, never `REPLACE`, which would
/// delete the row first and trip the foreign keys that point at it).
fn put_json<T: Serialize>(
    conn: &Connection,
    family: Family,
    key: &str,
    value: &T,
) -> Result<(), SqliteError> {
    let body = encode(family, key, value)?;
    let sql = format!(
        "INSERT INTO {table} ({key_col}, body) VALUES (?1, ?2) \
         ON CONFLICT ({key_col}) DO UPDATE SET body = excluded.body",
        table = family.table,
        key_col = family.key
    );
    conn.execute(&sql, params![key, body])
        .map_err(SqliteError::sql(format!("write {} {key:?}", family.what)))?;
    Ok(())
}

fn counter_value(action: &str, value: i64) -> Result<u64, SqliteError> {
    u64::try_from(value).map_err(|source| SqliteError::OutOfRange {
        action: action.to_string(),
        value: value.to_string(),
        source,
    })
}

// === impl SqlTxn ===

/// The adapter's view of one open transaction. Reads see the transaction's
/// own writes. After the first failure it stops touching the database (reads
/// answer "absent", writes are skipped) and [`SqlTxn::finish`] reports it, so
/// the caller rolls back instead of committing a decision built on it.
struct SqlTxn<'c> {
    conn: &'c Connection,
    project_id: &'c str,
    failure: RefCell<Option<SqliteError>>,
}

impl<'c> SqlTxn<'c> {
    fn new(conn: &'c Connection, project_id: &'c str) -> SqlTxn<'c> {
        SqlTxn {
            conn,
            project_id,
            failure: RefCell::new(None),
        }
    }

    /// The first failure, if any.
    fn finish(self) -> Result<(), SqliteError> {
        match self.failure.into_inner() {
            Some(failure) => Err(failure),
            None => Ok(()),
        }
    }

    fn failed(&self) -> bool {
        self.failure.borrow().is_some()
    }

    fn fail(&self, err: SqliteError) {
        let mut failure = self.failure.borrow_mut();
        if failure.is_none() {
            *failure = Some(err);
        }
    }

    /// Runs a statement unless an earlier one failed; `T::default()` on failure.
    fn run<T: Default>(&self, f: impl FnOnce(&Connection) -> Result<T, SqliteError>) -> T {
        if self.failed() {
            return T::default();
        }
        f(self.conn).unwrap_or_else(|err| {
            self.fail(err);
            T::default()
        })
    }
}

impl WmsTxn for SqlTxn<'_> {
    fn project_id(&self) -> &str {
        self.project_id
    }
    fn record(&self, id: &str) -> Option<WorkItemRecord> {
        self.run(|c| get_json(c, WORK_ITEMS, id))
    }
    fn records(&self) -> Vec<WorkItemRecord> {
        self.run(|c| all_json(c, WORK_ITEMS))
    }
    fn idempotency(&self, key: &str) -> Option<IdempotencyEntry> {
        self.run(|c| get_json(c, IDEMPOTENCY, key))
    }
    fn reservation(&self, key: &str) -> Option<Reservation> {
        self.run(|c| get_json(c, RESERVATIONS, key))
    }
    fn observed_readiness(&self, id: &str) -> Option<Readiness> {
        self.run(|c| get_json(c, OBSERVED_READINESS, id))
    }
    fn approval(&self, id: &str) -> Option<ApprovalRecord> {
        self.run(|c| get_json(c, APPROVALS, id))
    }
    fn submission(&self, id: &str) -> Option<Submission> {
        self.run(|c| get_json(c, SUBMISSIONS, id))
    }
    fn submissions(&self) -> Vec<Submission> {
        self.run(|c| all_json(c, SUBMISSIONS))
    }
    fn change_set(&self, id: &str) -> Option<ChangeSetRecord> {
        self.run(|c| get_json(c, CHANGE_SETS, id))
    }
    fn request(&self, id: &str) -> Option<RequestRecord> {
        self.run(|c| get_json(c, REQUESTS, id))
    }
    fn requests(&self) -> Vec<RequestRecord> {
        self.run(|c| all_json(c, REQUESTS))
    }
    fn finding(&self, producer_key: &str) -> Option<FindingRecord> {
        self.run(|c| get_json(c, FINDINGS, producer_key))
    }
    fn next(&mut self, counter: &str) -> u64 {
        self.run(|c| {
            let action = format!("advance counter {counter:?}");
            let value: i64 = c
                .query_row(
                    "INSERT INTO counters (name, value) VALUES (?1, 1) \
                     ON CONFLICT (name) DO UPDATE SET value = value + 1 RETURNING value",
                    params![counter],
                    |row| row.get(0),
                )
                .map_err(SqliteError::sql(action.clone()))?;
            counter_value(&action, value)
        })
    }
    fn peek(&self, counter: &str) -> u64 {
        self.run(|c| {
            let action = format!("read counter {counter:?}");
            let value: Option<i64> = c
                .query_row(
                    "SELECT value FROM counters WHERE name = ?1",
                    params![counter],
                    |row| row.get(0),
                )
                .optional()
                .map_err(SqliteError::sql(action.clone()))?;
            Ok(counter_value(&action, value.unwrap_or(0))? + 1)
        })
    }

    fn put_record(&mut self, record: WorkItemRecord) {
        self.run(|c| {
            let body = encode(WORK_ITEMS, &record.id, &record)?;
            c.execute(
                "INSERT INTO work_items (id, state, body) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (id) DO UPDATE SET state = excluded.state, body = excluded.body",
                params![record.id, record.state.as_str(), body],
            )
            .map_err(SqliteError::sql(format!("write work item {:?}", record.id)))?;
            Ok(())
        })
    }
    fn put_idempotency(&mut self, entry: IdempotencyEntry) {
        self.run(|c| put_json(c, IDEMPOTENCY, &entry.key, &entry))
    }
    fn put_reservation(&mut self, reservation: Reservation) {
        self.run(|c| {
            put_json(
                c,
                RESERVATIONS,
                &reservation.materialization_key,
                &reservation,
            )
        })
    }
    fn put_observed_readiness(&mut self, id: &str, readiness: Option<Readiness>) {
        self.run(|c| match readiness {
            Some(r) => put_json(c, OBSERVED_READINESS, id, &r),
            None => c
                .execute(
                    "DELETE FROM observed_readiness WHERE work_item_id = ?1",
                    params![id],
                )
                .map(drop)
                .map_err(SqliteError::sql(format!(
                    "clear observed readiness of {id:?}"
                ))),
        })
    }
    fn put_approval(&mut self, approval: ApprovalRecord) {
        self.run(|c| put_json(c, APPROVALS, &approval.id, &approval))
    }
    fn put_submission(&mut self, submission: Submission) {
        self.run(|c| put_json(c, SUBMISSIONS, &submission.id, &submission))
    }
    fn put_change_set(&mut self, change_set: ChangeSetRecord) {
        self.run(|c| put_json(c, CHANGE_SETS, &change_set.id, &change_set))
    }
    fn put_request(&mut self, request: RequestRecord) {
        self.run(|c| put_json(c, REQUESTS, &request.request_id, &request))
    }
    fn put_finding(&mut self, finding: FindingRecord) {
        self.run(|c| {
            let key = &finding.producer_key;
            let action = || format!("write finding {key:?}");
            let body = encode(FINDINGS, key, &finding)?;
            let sequence =
                i64::try_from(finding.sequence).map_err(|source| SqliteError::OutOfRange {
                    action: action(),
                    value: finding.sequence.to_string(),
                    source,
                })?;
            c.execute(
                "INSERT INTO findings \
                 (producer_key, sequence, inspection_run_id, work_item_id, body) \
                 VALUES (?1, ?2, ?3, ?4, ?5) \
                 ON CONFLICT (producer_key) DO UPDATE SET sequence = excluded.sequence, \
                 inspection_run_id = excluded.inspection_run_id, \
                 work_item_id = excluded.work_item_id, body = excluded.body",
                params![
                    key,
                    sequence,
                    finding.inspection_run_id,
                    finding.work_item_id,
                    body
                ],
            )
            .map_err(SqliteError::sql(action()))?;
            Ok(())
        })
    }
    fn append_audit(&mut self, event: AuditEvent) {
        self.run(|c| {
            let body = serde_json::to_string(&event).map_err(|source| SqliteError::Encode {
                what: "audit event of",
                key: event.operation.clone(),
                source,
            })?;
            c.execute("INSERT INTO audit_log (body) VALUES (?1)", params![body])
                .map_err(SqliteError::sql(format!(
                    "append the audit event of {}",
                    event.operation
                )))?;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    //! Schema-level checks the public API cannot see.

    use super::*;

    fn store() -> SqliteStore {
        SqliteStore::open_in_memory("p", AdapterConfig::default()).unwrap()
    }

    #[test]
    fn listing_by_state_is_an_index_scan() {
        let store = store();
        let conn = store.inner.conn();
        for n in [1, 3] {
            let plan: Vec<String> = conn
                .prepare(&format!("EXPLAIN QUERY PLAN {}", list_by_state_sql(n)))
                .unwrap()
                .query_map(params_from_iter(vec!["blocked"; n]), |row| row.get(3))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            assert!(
                plan.iter()
                    .any(|step| step.contains("INDEX work_items_by_state")),
                "{n} states: {plan:?}"
            );
        }
    }

    #[test]
    fn the_schema_has_one_table_per_record_family() {
        let store = store();
        let conn = store.inner.conn();
        let tables: Vec<String> = conn
            .prepare("SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name")
            .unwrap()
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let mut expected: Vec<&str> = [
            WORK_ITEMS,
            IDEMPOTENCY,
            RESERVATIONS,
            OBSERVED_READINESS,
            APPROVALS,
            SUBMISSIONS,
            CHANGE_SETS,
            REQUESTS,
            FINDINGS,
        ]
        .iter()
        .map(|f| f.table)
        .chain(["audit_log", "counters", "meta", "sqlite_sequence"])
        .collect();
        expected.sort_unstable();
        assert_eq!(tables, expected);
        let foreign_keys: i64 = conn
            .pragma_query_value(None, "foreign_keys", |row| row.get(0))
            .unwrap();
        assert_eq!(foreign_keys, 1);
    }

    #[test]
    fn a_failed_statement_stops_the_view_and_is_reported_once() {
        let store = store();
        let mut conn = store.inner.conn();
        let tx = conn.transaction().unwrap();
        tx.execute_batch("DROP TABLE approvals;").unwrap();
        let mut view = SqlTxn::new(&tx, "p");
        assert_eq!(view.approval("a-1"), None);
        assert_eq!(view.next("fence"), 0, "no statement runs after a failure");
        view.put_record(WorkItemRecord::new(
            "wi-1",
            "p",
            protobot_lifecycle::State::Waiting,
            1,
        ));
        let err = StoreError::from(view.finish().unwrap_err());
        match &err {
            StoreError::Backend { action, source } => {
                assert_eq!(action, "read approval \"a-1\"");
                assert!(
                    source
                        .downcast_ref::<rusqlite::Error>()
                        .is_some_and(|e| e.to_string().starts_with("no such table")),
                    "{err}"
                );
            }
            other => panic!("expected a backend failure, got {other:?}"),
        }
        let counters: i64 = tx
            .query_row("SELECT count(*) FROM counters", [], |row| row.get(0))
            .unwrap();
        assert_eq!(counters, 0);
    }
}
