//! The credential store: downstream secrets the broker injects, read once at
//! startup from a directory with one file per credential (a mounted
//! Kubernetes Secret works as is: its `..data` links are skipped).
//!
//! A [`Credential`] never prints its value (`Debug` is redacted) and the
//! store is the only place the values live in the proxy.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use crate::{decide::CredentialPresence, policy::is_credential_name};

/// Why the credentials directory could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    /// The directory or a file in it could not be read.
    #[error("failed to read credentials from {path}")]
    Read {
        /// The directory or file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A credential file is empty or has characters a header cannot carry.
    #[error(
        "credential {name:?} in {dir} is {problem}; write the bare token (one line, printable ASCII)"
    )]
    Unusable {
        /// The credential's name (the file name).
        name: String,
        /// The directory.
        dir: PathBuf,
        /// `empty` or `not a single printable line`.
        problem: &'static str,
    },
}

/// One secret value.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential(String);

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credential(<redacted>)")
    }
}

impl Credential {
    /// A credential from a value (tests, or callers with their own source).
    pub fn new(value: impl Into<String>) -> Credential {
        Credential(value.into())
    }

    /// The value, for building the upstream `Authorization` header only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

/// Credentials by name.
#[derive(Clone, Debug, Default)]
pub struct CredentialStore {
    by_name: BTreeMap<String, Credential>,
}

impl CredentialStore {
    /// A store holding `pairs`.
    pub fn from_pairs<I, N>(pairs: I) -> CredentialStore
    where
        I: IntoIterator<Item = (N, Credential)>,
        N: Into<String>,
    {
        CredentialStore {
            by_name: pairs.into_iter().map(|(n, c)| (n.into(), c)).collect(),
        }
    }

    /// This store with `credential` under `name` (replacing one of that name).
    pub fn with(mut self, name: &str, credential: Credential) -> CredentialStore {
        self.by_name.insert(name.to_owned(), credential);
        self
    }

    /// Reads every regular file (following symlinks) of `dir` whose name is a
    /// credential name; hidden entries and directories are skipped. Trailing
    /// whitespace is trimmed.
    pub fn load_dir(dir: &Path) -> Result<CredentialStore, CredentialError> {
        let read_err = |path: &Path| {
            let path = path.to_owned();
            move |source| CredentialError::Read { path, source }
        };
        let mut by_name = BTreeMap::new();
        for entry in std::fs::read_dir(dir).map_err(read_err(dir))? {
            let entry = entry.map_err(read_err(dir))?;
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if !is_credential_name(&name) {
                continue;
            }
            let path = entry.path();
            let meta = std::fs::metadata(&path).map_err(read_err(&path))?;
            if !meta.is_file() {
                continue;
            }
            let text = std::fs::read(&path).map_err(read_err(&path))?;
            let value = text.trim_ascii();
            let problem = if value.is_empty() {
                Some("empty")
            } else if !value.iter().all(|b| b.is_ascii_graphic() || *b == b' ') {
                Some("not a single printable line")
            } else {
                None
            };
            if let Some(problem) = problem {
                return Err(CredentialError::Unusable {
                    name,
                    dir: dir.to_owned(),
                    problem,
                });
            }
            // Checked above: ASCII only.
            let value = String::from_utf8_lossy(value).into_owned();
            by_name.insert(name, Credential(value));
        }
        Ok(CredentialStore { by_name })
    }

    /// The credential called `name`.
    pub fn get(&self, name: &str) -> Option<&Credential> {
        self.by_name.get(name)
    }

    /// The names held.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }

    /// Every value (for stripping responses).
    pub fn values(&self) -> impl Iterator<Item = &Credential> {
        self.by_name.values()
    }
}

impl CredentialPresence for CredentialStore {
    fn has(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_mount_loads_by_file_name_and_skips_kubernetes_links() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("..2026_01_01");
        std::fs::create_dir(&data).unwrap();
        std::fs::write(data.join("anthropic"), "sk-ant-123\n").unwrap();
        std::os::unix::fs::symlink("..2026_01_01", dir.path().join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/anthropic", dir.path().join("anthropic")).unwrap();
        std::fs::write(dir.path().join("registry"), "  reg-token  ").unwrap();
        let store = CredentialStore::load_dir(dir.path()).unwrap();
        assert_eq!(store.names().collect::<Vec<_>>(), ["anthropic", "registry"]);
        assert_eq!(store.get("anthropic").unwrap().expose(), "sk-ant-123");
        assert_eq!(store.get("registry").unwrap().expose(), "reg-token");
        assert!(store.has("registry") && !store.has("..data"));
        assert!(!format!("{store:?}").contains("reg-token"));
    }

    #[test]
    fn empty_or_multiline_credentials_are_refused_without_echoing_them() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("x"), "\n").unwrap();
        let err = CredentialStore::load_dir(dir.path()).unwrap_err();
        assert!(err.to_string().contains("\"x\"") && err.to_string().contains("empty"));
        std::fs::write(dir.path().join("x"), "line-one\nline-two-secret").unwrap();
        let err = CredentialStore::load_dir(dir.path())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("printable") && !err.contains("line-two-secret"),
            "{err}"
        );
    }

    #[test]
    fn a_missing_directory_is_a_read_error() {
        let err = CredentialStore::load_dir(Path::new("/nonexistent/creds")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/creds"));
    }
}
