//! The runs' state in SQLite: one row per run with its request, plan,
//! status, who submitted and canceled it, timestamps and run directory. A
//! single connection behind a mutex: every statement is short, and the
//! service writes a handful of rows per run.

use std::path::Path;
use std::sync::Mutex;

use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;

/// Where a run is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Waiting for its target (or for a free slot).
    Queued,
    Running,
    /// Stopped on congestion: the sweep found where the server congests.
    Stopped,
    Completed,
    Failed,
    Canceled,
    /// Its process died while the service was down.
    Interrupted,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Queued => "queued",
            Status::Running => "running",
            Status::Stopped => "stopped",
            Status::Completed => "completed",
            Status::Failed => "failed",
            Status::Canceled => "canceled",
            Status::Interrupted => "interrupted",
        }
    }

    fn parse(text: &str) -> Option<Status> {
        [
            Status::Queued,
            Status::Running,
            Status::Stopped,
            Status::Completed,
            Status::Failed,
            Status::Canceled,
            Status::Interrupted,
        ]
        .into_iter()
        .find(|s| s.as_str() == text)
    }

    /// Whether the run is over.
    pub fn is_final(self) -> bool {
        !matches!(self, Status::Queued | Status::Running)
    }
}

/// One run as stored.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct RunRow {
    pub id: String,
    pub target: String,
    pub label: Option<String>,
    pub policy: String,
    pub status: Status,
    pub submitted_by: String,
    pub canceled_by: Option<String>,
    /// Unix milliseconds.
    pub created_ms: i64,
    pub started_ms: Option<i64>,
    pub finished_ms: Option<i64>,
    /// The run directory (the child's `--output-dir`).
    #[serde(skip)]
    pub dir: String,
    #[serde(skip)]
    pub pid: Option<u32>,
    pub exit_code: Option<i32>,
    /// Why it failed or was interrupted.
    pub message: Option<String>,
    /// The request and the plan, as JSON.
    #[serde(skip)]
    pub request: String,
    #[serde(skip)]
    pub plan: String,
    /// What the run found, kept when it ended (a list reads no run files).
    pub brief: Option<crate::report::Brief>,
}

/// A new run to insert.
pub struct NewRun<'a> {
    pub id: &'a str,
    pub target: &'a str,
    pub label: Option<&'a str>,
    pub policy: &'a str,
    pub submitted_by: &'a str,
    pub dir: &'a str,
    pub request: &'a str,
    pub plan: &'a str,
}

/// The database could not be used.
#[derive(Debug, thiserror::Error)]
#[error("the run database: {0}")]
pub struct StoreError(#[from] rusqlite::Error);

pub struct Store {
    db: Mutex<Connection>,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS runs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    target TEXT NOT NULL,
    label TEXT,
    policy TEXT NOT NULL,
    status TEXT NOT NULL,
    submitted_by TEXT NOT NULL,
    canceled_by TEXT,
    created_ms INTEGER NOT NULL,
    started_ms INTEGER,
    finished_ms INTEGER,
    dir TEXT NOT NULL,
    pid INTEGER,
    exit_code INTEGER,
    message TEXT,
    request TEXT NOT NULL,
    plan TEXT NOT NULL,
    brief TEXT
);
CREATE INDEX IF NOT EXISTS runs_status ON runs (status, seq);
";

const COLUMNS: &str = "id, target, label, policy, status, submitted_by, canceled_by, created_ms, \
    started_ms, finished_ms, dir, pid, exit_code, message, request, plan, brief";

impl Store {
    /// Opens (or creates) the database at `path`.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        let db = Connection::open(path)?;
        // WAL: readers (the API) do not wait for the scheduler's writes.
        db.pragma_update(None, "journal_mode", "WAL")?;
        db.pragma_update(None, "busy_timeout", 5000)?;
        db.execute_batch(SCHEMA)?;
        // A database of a service from before the brief column.
        let has_brief = db
            .prepare("SELECT 1 FROM pragma_table_info('runs') WHERE name = 'brief'")?
            .exists([])?;
        if !has_brief {
            db.execute_batch("ALTER TABLE runs ADD COLUMN brief TEXT")?;
        }
        Ok(Store { db: Mutex::new(db) })
    }

    fn db(&self) -> std::sync::MutexGuard<'_, Connection> {
        // A panic while holding it leaves SQLite consistent (each statement
        // is atomic): go on with the connection.
        self.db.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Inserts a queued run.
    pub fn insert(&self, run: &NewRun<'_>) -> Result<(), StoreError> {
        self.db().execute(
            "INSERT INTO runs (id, target, label, policy, status, submitted_by, created_ms, dir, request, plan)
             VALUES (?1, ?2, ?3, ?4, 'queued', ?5, ?6, ?7, ?8, ?9)",
            params![
                run.id,
                run.target,
                run.label,
                run.policy,
                run.submitted_by,
                now_ms(),
                run.dir,
                run.request,
                run.plan
            ],
        )?;
        Ok(())
    }

    pub fn get(&self, id: &str) -> Result<Option<RunRow>, StoreError> {
        let db = self.db();
        let mut statement =
            db.prepare_cached(&format!("SELECT {COLUMNS} FROM runs WHERE id = ?1"))?;
        Ok(statement.query_row([id], row).optional()?)
    }

    /// Runs, newest first, at most `limit`.
    pub fn list(&self, limit: usize) -> Result<Vec<RunRow>, StoreError> {
        let db = self.db();
        let mut statement = db.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM runs ORDER BY seq DESC LIMIT ?1"
        ))?;
        let rows = statement.query_map([limit as i64], row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Runs with `status`, oldest first.
    pub fn with_status(&self, status: Status) -> Result<Vec<RunRow>, StoreError> {
        let db = self.db();
        let mut statement = db.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM runs WHERE status = ?1 ORDER BY seq"
        ))?;
        let rows = statement.query_map([status.as_str()], row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// `queued` to `running`, with the child's pid when it is a local
    /// process (none: a Job in the cluster).
    pub fn started(&self, id: &str, pid: Option<u32>) -> Result<(), StoreError> {
        self.db().execute(
            "UPDATE runs SET status = 'running', pid = ?2, started_ms = ?3 WHERE id = ?1",
            params![id, pid, now_ms()],
        )?;
        Ok(())
    }

    /// The run is over, with `status` and what it found.
    pub fn finished(
        &self,
        id: &str,
        status: Status,
        exit_code: Option<i32>,
        message: Option<&str>,
        brief: Option<&crate::report::Brief>,
    ) -> Result<(), StoreError> {
        let brief = brief.and_then(|b| serde_json::to_string(b).ok());
        self.db().execute(
            "UPDATE runs SET status = ?2, exit_code = ?3, message = ?4, finished_ms = ?5, brief = ?6 WHERE id = ?1",
            params![id, status.as_str(), exit_code, message, now_ms(), brief],
        )?;
        Ok(())
    }

    /// Records who asked for the cancel (the run may still be draining).
    /// False if the run was already over.
    pub fn cancel_requested(&self, id: &str, by: &str) -> Result<bool, StoreError> {
        let changed = self.db().execute(
            "UPDATE runs SET canceled_by = ?2 WHERE id = ?1 AND status IN ('queued', 'running')",
            params![id, by],
        )?;
        Ok(changed == 1)
    }

    /// A queued run canceled before it started: over at once. False if it
    /// had started meanwhile.
    pub fn cancel_queued(&self, id: &str) -> Result<bool, StoreError> {
        let changed = self.db().execute(
            "UPDATE runs SET status = 'canceled', finished_ms = ?2 WHERE id = ?1 AND status = 'queued'",
            params![id, now_ms()],
        )?;
        Ok(changed == 1)
    }
}

fn row(row: &rusqlite::Row<'_>) -> rusqlite::Result<RunRow> {
    let status: String = row.get(4)?;
    let status = Status::parse(&status).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(
            4,
            rusqlite::types::Type::Text,
            format!("unknown status {status:?}").into(),
        )
    })?;
    Ok(RunRow {
        id: row.get(0)?,
        target: row.get(1)?,
        label: row.get(2)?,
        policy: row.get(3)?,
        status,
        submitted_by: row.get(5)?,
        canceled_by: row.get(6)?,
        created_ms: row.get(7)?,
        started_ms: row.get(8)?,
        finished_ms: row.get(9)?,
        dir: row.get(10)?,
        pid: row.get(11)?,
        exit_code: row.get(12)?,
        message: row.get(13)?,
        request: row.get(14)?,
        plan: row.get(15)?,
        brief: row
            .get::<_, Option<String>>(16)?
            .and_then(|text| serde_json::from_str(&text).ok()),
    })
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_run_through_its_statuses_survives_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runs.db");
        let store = Store::open(&path).unwrap();
        let new = NewRun {
            id: "r1",
            target: "sim",
            label: Some("first"),
            policy: "builtin",
            submitted_by: "ci",
            dir: "/tmp/r1",
            request: "{}",
            plan: "{}",
        };
        store.insert(&new).unwrap();
        assert!(store.insert(&new).is_err(), "ids are unique");
        assert_eq!(store.with_status(Status::Queued).unwrap().len(), 1);
        store.started("r1", Some(42)).unwrap();
        assert!(store.cancel_requested("r1", "alice").unwrap());
        assert!(!store.cancel_queued("r1").unwrap(), "it is running");
        store
            .finished("r1", Status::Canceled, Some(130), None, None)
            .unwrap();
        assert!(!store.cancel_requested("r1", "bob").unwrap(), "it is over");
        drop(store);
        let store = Store::open(&path).unwrap();
        let run = store.get("r1").unwrap().unwrap();
        assert_eq!(run.status, Status::Canceled);
        assert_eq!(run.canceled_by.as_deref(), Some("alice"));
        assert_eq!(run.pid, Some(42));
        assert!(store.get("r2").unwrap().is_none());
    }

    /// A database written before runs kept their brief opens, its runs
    /// without one; a brief given at the end is read back.
    #[test]
    fn an_older_database_gains_the_brief_column() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runs.db");
        let old = SCHEMA.replace(",\n    brief TEXT", "");
        assert_ne!(old, SCHEMA);
        let db = Connection::open(&path).unwrap();
        db.execute_batch(&old).unwrap();
        db.execute_batch(
            "INSERT INTO runs (id, target, policy, status, submitted_by, created_ms, dir, request, plan)
             VALUES ('r0', 'sim', 'builtin', 'completed', 'ci', 1, '/tmp/r0', '{}', '{}')",
        )
        .unwrap();
        drop(db);
        let store = Store::open(&path).unwrap();
        assert_eq!(store.get("r0").unwrap().unwrap().brief, None);
        let brief = crate::report::Brief {
            stages_run: 3,
            stages_skipped: 1,
            stopped_at: Some("#2 c=16".into()),
            capacity: vec!["#1 c=8".into()],
            report_html: None,
        };
        store
            .finished("r0", Status::Stopped, Some(0), None, Some(&brief))
            .unwrap();
        assert_eq!(store.get("r0").unwrap().unwrap().brief, Some(brief));
    }
}
