//! Git work off the async runtime.
//!
//! libgit2 handles are neither `Sync` nor cheap to block on: a handle held across an
//! `.await` makes the whole future `!Send`, and a fetch or push run on a runtime thread
//! stalls every task scheduled there. So the engine never holds one across an await:
//! each piece of git work is a closure that runs on Tokio's blocking pool with the
//! repository opened there ([`RepoFolder::repo`]), and the builds of one process that
//! share an integration repository take turns on it through one async lock per folder.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, LazyLock, Mutex, PoisonError, Weak},
};

use git2::Repository;

/// The async locks of the repository folders this process works in, by canonical path.
/// Entries whose every holder is gone are pruned when a folder is added.
type Locks = Mutex<HashMap<PathBuf, Weak<tokio::sync::Mutex<()>>>>;

static LOCKS: LazyLock<Locks> = LazyLock::new(Locks::default);

/// The lock of `dir`: every [`RepoFolder`] of the same folder in this process shares it.
fn folder_lock(dir: &Path) -> Arc<tokio::sync::Mutex<()>> {
    let key = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let mut locks = LOCKS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(lock) = locks.get(&key).and_then(Weak::upgrade) {
        return lock;
    }
    locks.retain(|_, lock| lock.strong_count() > 0);
    let lock = Arc::new(tokio::sync::Mutex::new(()));
    locks.insert(key, Arc::downgrade(&lock));
    lock
}

/// Why git work could not run (the work's own failures are its result).
#[derive(Debug, thiserror::Error)]
pub enum FolderError {
    /// The repository could not be opened.
    #[error(
        "failed to open the repository {dir}: {source}; check that it is a git repository this process can read"
    )]
    Open {
        /// The folder.
        dir: PathBuf,
        /// Cause.
        #[source]
        source: git2::Error,
    },
    /// The blocking task running the work panicked or was cancelled (runtime shutdown).
    #[error("the git work on {dir} stopped before it finished: {source}")]
    Stopped {
        /// The folder.
        dir: PathBuf,
        /// Cause.
        #[source]
        source: tokio::task::JoinError,
    },
}

/// One repository folder: its git work runs on the blocking pool, one piece at a time
/// across this process.
#[derive(Clone, Debug)]
pub struct RepoFolder {
    dir: PathBuf,
    lock: Arc<tokio::sync::Mutex<()>>,
}

impl RepoFolder {
    /// The folder `dir` (a repository, or where one is exported from).
    pub fn new(dir: &Path) -> RepoFolder {
        RepoFolder {
            dir: dir.to_path_buf(),
            lock: folder_lock(dir),
        }
    }

    /// Its path.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Runs `work` with the folder's path on the blocking pool while no other task of
    /// this process works in the folder (for work that opens the repository itself,
    /// like a projection export).
    pub async fn path<T, F>(&self, work: F) -> Result<T, FolderError>
    where
        T: Send + 'static,
        F: FnOnce(&Path) -> T + Send + 'static,
    {
        let _turn = self.lock.lock().await;
        let dir = self.dir.clone();
        tokio::task::spawn_blocking(move || work(&dir))
            .await
            .map_err(|source| FolderError::Stopped {
                dir: self.dir.clone(),
                source,
            })
    }

    /// Runs `work` on the repository, opened on the blocking pool, while no other task
    /// of this process works in the folder.
    pub async fn repo<T, F>(&self, work: F) -> Result<T, FolderError>
    where
        T: Send + 'static,
        F: FnOnce(&Repository) -> T + Send + 'static,
    {
        self.path(move |dir| {
            Repository::open(dir)
                .map(|repo| work(&repo))
                .map_err(|source| FolderError::Open {
                    dir: dir.to_path_buf(),
                    source,
                })
        })
        .await?
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn folders_of_the_same_path_share_one_lock_and_others_do_not() {
        let dir = tempfile_dir();
        let other = tempfile_dir();
        let a = RepoFolder::new(&dir);
        let b = RepoFolder::new(&dir.join(".").join("."));
        let c = RepoFolder::new(&other);
        assert!(Arc::ptr_eq(&a.lock, &b.lock));
        assert!(!Arc::ptr_eq(&a.lock, &c.lock));
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::remove_dir_all(&other).unwrap();
    }

    #[tokio::test]
    async fn work_waits_for_the_folder_and_an_unopenable_repository_names_the_folder() {
        let dir = tempfile_dir();
        let folder = RepoFolder::new(&dir);
        let turn = folder.lock.clone().lock_owned().await;
        let waiting = tokio::spawn({
            let folder = folder.clone();
            async move { folder.path(|_| 7).await.unwrap() }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "work ran while the folder was held");
        drop(turn);
        assert_eq!(waiting.await.unwrap(), 7);
        let refused = folder.repo(|_| ()).await.unwrap_err();
        assert!(matches!(refused, FolderError::Open { .. }), "{refused}");
        assert!(refused.to_string().contains(&dir.display().to_string()));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn tempfile_dir() -> PathBuf {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("repo-folder-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
