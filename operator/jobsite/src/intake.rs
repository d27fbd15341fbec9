//! Durable true-bug intakes.
//!
//! A change set's contract can always be rebuilt from the repository (the
//! manifest at its merge commit). A bug report has no such record: its
//! violated requirements and scopes come from the reporter. So the facts of
//! every bug intake are written here, atomically, *before* it is
//! materialized, one JSON file per work item; a restarted Job Site rebuilds
//! the same contract from them. Recording is idempotent: the same facts again
//! are a no-op, different facts for the same work item are refused.
//!
//! The Job Site reads recorded intakes through [`BugIntakes`]: on one machine
//! from [`IntakeFiles`], in the cluster from the facts each `BugReport` status
//! records, handed over per pass as [`RecordedIntakes`].

use std::{
    collections::BTreeMap,
    io::Write,
    path::{Path, PathBuf},
};

use crate::contract::{BugFacts, BuildContract, ContractError, Intake, build};

/// Why an intake could not be recorded or read.
#[derive(Debug, thiserror::Error)]
pub enum IntakeError {
    /// The facts do not make a contract.
    #[error(transparent)]
    Contract(#[from] ContractError),
    /// The work item was recorded with other facts.
    #[error(
        "work item {work_item_id} was already registered from different bug facts ({path}); register the new facts under another bug id"
    )]
    Conflict {
        /// Work item.
        work_item_id: String,
        /// The recorded file.
        path: PathBuf,
    },
    /// Two recorded intakes materialize as the same work item with different facts.
    #[error(
        "work item {work_item_id} is recorded twice with different bug facts; keep one report per bug id"
    )]
    Duplicate {
        /// Work item.
        work_item_id: String,
    },
    /// The intake directory could not be read or written.
    #[error("failed to {what} {path}: {source}")]
    Io {
        /// What was attempted.
        what: &'static str,
        /// Path.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// A recorded file is not valid bug facts.
    #[error("the recorded bug intake {path} is corrupt: {reason}; restore it from a backup")]
    Corrupt {
        /// Path.
        path: PathBuf,
        /// Decoder message.
        reason: String,
    },
}

/// Where a Job Site finds the facts recorded for bug intakes, to rebuild their
/// contracts (a bug's facts cannot be read again from the repository).
pub trait BugIntakes: Send + Sync + std::fmt::Debug {
    /// The facts recorded for a work item, if any.
    fn recorded(&self, work_item_id: &str) -> Result<Option<BugFacts>, IntakeError>;
}

impl BugIntakes for IntakeFiles {
    fn recorded(&self, work_item_id: &str) -> Result<Option<BugFacts>, IntakeError> {
        self.load(work_item_id)
    }
}

/// Bug intakes recorded elsewhere (in the cluster: `BugReport` statuses),
/// handed to the Job Site in memory, keyed by the work item they materialize as.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecordedIntakes(BTreeMap<String, BugFacts>);

impl RecordedIntakes {
    /// No intakes.
    pub fn new() -> RecordedIntakes {
        RecordedIntakes::default()
    }

    /// Adds `facts` under the work item they materialize as and returns their
    /// contract. The same facts twice are a no-op; other facts for the same
    /// work item are refused.
    pub fn insert(&mut self, facts: BugFacts) -> Result<BuildContract, IntakeError> {
        let contract = build(&Intake::Bug(facts.clone()))?;
        match self.0.get(&contract.work_item_id) {
            Some(existing) if existing == &facts => {}
            Some(_) => {
                return Err(IntakeError::Duplicate {
                    work_item_id: contract.work_item_id,
                });
            }
            None => {
                self.0.insert(contract.work_item_id.clone(), facts);
            }
        }
        Ok(contract)
    }

    /// How many work items have recorded facts.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no facts are recorded.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl BugIntakes for RecordedIntakes {
    fn recorded(&self, work_item_id: &str) -> Result<Option<BugFacts>, IntakeError> {
        Ok(self.0.get(work_item_id).cloned())
    }
}

/// Bug intakes recorded in a directory.
#[derive(Clone, Debug)]
pub struct IntakeFiles {
    dir: PathBuf,
}

impl IntakeFiles {
    /// Intakes under `dir` (created on first record).
    pub fn new(dir: impl Into<PathBuf>) -> IntakeFiles {
        IntakeFiles { dir: dir.into() }
    }

    fn path(&self, work_item_id: &str) -> PathBuf {
        self.dir.join(format!("{work_item_id}.json"))
    }

    /// Records `facts` (atomically, durably) and returns their contract.
    pub fn record(&self, facts: &BugFacts) -> Result<BuildContract, IntakeError> {
        let contract = build(&Intake::Bug(facts.clone()))?;
        let path = self.path(&contract.work_item_id);
        if let Some(existing) = self.load(&contract.work_item_id)? {
            if &existing == facts {
                return Ok(contract);
            }
            return Err(IntakeError::Conflict {
                work_item_id: contract.work_item_id,
                path,
            });
        }
        let io = |what, path: &Path| {
            let path = path.to_path_buf();
            move |source| IntakeError::Io { what, path, source }
        };
        std::fs::create_dir_all(&self.dir).map_err(io("create", &self.dir))?;
        let body = serde_json::to_vec_pretty(facts).map_err(|e| IntakeError::Corrupt {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        let tmp = self.dir.join(format!(".{}.tmp", contract.work_item_id));
        {
            let mut f = std::fs::File::create(&tmp).map_err(io("create", &tmp))?;
            f.write_all(&body).map_err(io("write", &tmp))?;
            f.sync_all().map_err(io("sync", &tmp))?;
        }
        std::fs::rename(&tmp, &path).map_err(io("rename into place", &path))?;
        std::fs::File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io("sync", &self.dir))?;
        Ok(contract)
    }

    /// The facts recorded for a work item, if any.
    pub fn load(&self, work_item_id: &str) -> Result<Option<BugFacts>, IntakeError> {
        let path = self.path(work_item_id);
        match std::fs::read(&path) {
            Ok(bytes) => {
                serde_json::from_slice(&bytes)
                    .map(Some)
                    .map_err(|e| IntakeError::Corrupt {
                        path,
                        reason: e.to_string(),
                    })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(IntakeError::Io {
                what: "read",
                path,
                source,
            }),
        }
    }

    /// The intake recorded for a bug of a project, whatever its spec commit (a
    /// bug is registered once: re-registering it later, when the default branch
    /// has moved, must find the first registration rather than start another).
    pub fn find(&self, project_id: &str, bug_id: &str) -> Result<Option<BugFacts>, IntakeError> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(IntakeError::Io {
                    what: "list",
                    path: self.dir.clone(),
                    source,
                });
            }
        };
        for entry in entries {
            let entry = entry.map_err(|source| IntakeError::Io {
                what: "list",
                path: self.dir.clone(),
                source,
            })?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(id) = name
                .strip_suffix(".json")
                .filter(|_| !name.starts_with('.'))
            else {
                continue;
            };
            if let Some(facts) = self.load(id)?
                && facts.project_id == project_id
                && facts.bug_id == bug_id
            {
                return Ok(Some(facts));
            }
        }
        Ok(None)
    }

    /// The contract of a recorded work item, if any.
    pub fn contract(&self, work_item_id: &str) -> Result<Option<BuildContract>, IntakeError> {
        match self.load(work_item_id)? {
            Some(facts) => Ok(Some(build(&Intake::Bug(facts))?)),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn facts() -> BugFacts {
        BugFacts {
            touched_paths: vec![],
            project_id: "cli-sync".into(),
            bug_id: "GH-17".into(),
            spec_commit: "1a2b3c4d5e6f7a8b9c0d1a2b3c4d5e6f7a8b9c0d".into(),
            violated_requirement_ids: vec!["REQ-CLI-00001".into()],
            scopes: vec![],
            priority: "high".into(),
            impact: vec![],
        }
    }

    #[test]
    fn a_recorded_intake_rebuilds_its_contract_and_refuses_other_facts() {
        let tmp = tempfile::tempdir().unwrap();
        let files = IntakeFiles::new(tmp.path().join("intakes"));
        let contract = files.record(&facts()).unwrap();
        assert_eq!(
            files.contract(&contract.work_item_id).unwrap(),
            Some(contract.clone())
        );
        // Again: a no-op.
        assert_eq!(files.record(&facts()).unwrap(), contract);
        // Same bug and spec commit, other requirements: refused, file unchanged.
        let mut other = facts();
        other.violated_requirement_ids = vec!["REQ-CLI-00002".into()];
        let err = files.record(&other).unwrap_err();
        assert!(matches!(err, IntakeError::Conflict { .. }), "{err}");
        assert_eq!(files.load(&contract.work_item_id).unwrap(), Some(facts()));
        assert_eq!(files.contract("wi-unknown").unwrap(), None);
        assert_eq!(files.find("cli-sync", "GH-17").unwrap(), Some(facts()));
        assert_eq!(files.find("cli-sync", "GH-18").unwrap(), None);
        assert_eq!(files.find("other", "GH-17").unwrap(), None);
        // Bad facts never reach the disk.
        let mut bad = facts();
        bad.violated_requirement_ids.clear();
        assert!(matches!(
            files.record(&bad).unwrap_err(),
            IntakeError::Contract(_)
        ));
        let names: Vec<_> = std::fs::read_dir(tmp.path().join("intakes"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        // A corrupt file is reported, not guessed around.
        std::fs::write(files.path(&contract.work_item_id), b"{").unwrap();
        assert!(matches!(
            files.contract(&contract.work_item_id).unwrap_err(),
            IntakeError::Corrupt { .. }
        ));
    }

    #[test]
    fn recorded_intakes_key_facts_by_work_item_and_refuse_a_second_version() {
        let mut recorded = RecordedIntakes::new();
        let contract = recorded.insert(facts()).unwrap();
        assert_eq!(
            recorded.insert(facts()).unwrap(),
            contract,
            "same facts: no-op"
        );
        assert_eq!(
            recorded.recorded(&contract.work_item_id).unwrap(),
            Some(facts())
        );
        assert_eq!(recorded.recorded("wi-unknown").unwrap(), None);
        let mut other = facts();
        other.scopes = vec!["cli".into()];
        assert!(matches!(
            recorded.insert(other).unwrap_err(),
            IntakeError::Duplicate { work_item_id } if work_item_id == contract.work_item_id
        ));
        let mut bad = facts();
        bad.bug_id = "GH-18".into();
        bad.spec_commit = "main".into();
        assert!(matches!(
            recorded.insert(bad).unwrap_err(),
            IntakeError::Contract(_)
        ));
        assert_eq!(recorded.len(), 1);
    }
}
